//! The Hadamard MLP (SPEC §4.3 step 6) and [`block`], the CPU twin of
//! shaders/mlp.wgsl's `mlp` entry point (`crate::gpu::kernels::mlp`): attention
//! output norm and residual, the MLP and the lane update.

use super::norm::{inv_rms_wide, zcrms_into};
use super::vmath::silu_of_product;
use crate::cq::fwht;

crate::host::simd::simd_fn! {
    /// `out = after + (d3 ⊙ nfwht(silu(d2 ⊙ nfwht(d1 ⊙ pad(zcrms(after, norm))))))[..hidden]`.
    /// `z` is scratch of `hadamard_dim = d1.len()` entries.
    ///
    /// The transforms are `n = hadamard_dim` wide, but their input is zero past
    /// `hidden` and only the first `hidden` outputs are used. With
    /// `m = max(16, hidden.next_power_of_two())` (at most `n`) and `H_n = H_{n/m} ⊗
    /// H_m` (Sylvester order, `H_{n/m}`'s first row and column all ones):
    /// - the first transform is `H_m` of the first `m` values, repeated `n/m`
    ///   times (zeros add nothing);
    /// - the first `m` outputs of the second are `H_m` of the sum of its input's
    ///   `n/m` blocks (summed by folding halves: block `b` plus block
    ///   `b + n/2m`, and so on).
    ///
    /// So both run `m` wide: the same function up to float rounding (the order of
    /// the second transform's additions, and the sign of an exact zero), the MLP's
    /// transforms `n/m` times cheaper.
    ///
    /// # Panics
    /// If the lengths disagree.
    pub fn hadamard_mlp(
        after: &[f32],
        norm: &[f32],
        d1: &[f32],
        d2: &[f32],
        d3: &[f32],
        z: &mut [f32],
        out: &mut [f32],
    ) {
        let (h, n) = (after.len(), z.len());
        assert!(d1.len() == n && d2.len() == n && d3.len() == n && out.len() == h);
        assert!(
            h <= n && norm.len() == h && n.is_power_of_two(),
            "hadamard_mlp: lengths"
        );
        let m = h.next_power_of_two().max(16).min(n);
        let s = 1.0 / (n as f32).sqrt();
        #[cfg(target_arch = "x86_64")]
        if m >= 16
            && n / m <= x86::MAX_COPIES
            && crate::host::simd::CpuSimd::selected() == crate::host::simd::CpuSimd::Avx512
        {
            // SAFETY: the selection implies AVX-512F; lengths checked above.
            unsafe { x86::hadamard_mlp_512(after, norm, [d1, d2, d3], m, z, out) };
            return;
        }
        let y = &mut z[..m];
        zcrms_into(after, norm, &mut y[..h]);
        y[h..].fill(0.0);
        for (v, w) in y.iter_mut().zip(d1) {
            *v *= w;
        }
        fwht(y);
        // The transformed input, scaled, in every block (block 0 last: it is the
        // source); then silu(d2 ⊙ ·).
        let (first, rest) = z.split_at_mut(m);
        for block in rest.chunks_exact_mut(m) {
            for (o, v) in block.iter_mut().zip(first.iter()) {
                *o = v * s;
            }
        }
        first.iter_mut().for_each(|v| *v *= s);
        silu_of_product(z, d2);
        fold_blocks(z, m);
        fwht(&mut z[..m]);
        for (((o, a), v), w) in out.iter_mut().zip(after).zip(z.iter()).zip(d3) {
            *o = a + (v * s) * w;
        }
    }
}

/// `z[..m]` ← the sum of `z`'s `z.len() / m` blocks of `m`, folding halves
/// (`z[i] += z[i + len/2]` for `len` = `z.len()`, `z.len()/2`, … `2m`).
/// Inlined into [`hadamard_mlp`]'s SIMD builds.
#[inline(always)]
fn fold_blocks(z: &mut [f32], m: usize) {
    let mut len = z.len();
    while len > m {
        let half = len / 2;
        let (lo, hi) = z[..len].split_at_mut(half);
        for (a, b) in lo.iter_mut().zip(hi.iter()) {
            *a += b;
        }
        len = half;
    }
}

crate::host::simd::simd_fn! {
    /// CPU twin of the GPU `mlp` entry point (shaders/mlp.wgsl, `MlpKernels::mlp`,
    /// inputs as `MlpParams`) for one token: SPEC §4.3 end of step 5,
    /// `after = b + out_scale · zcrms(attn, post_norm)`; step 6,
    /// `out = `[`hadamard_mlp`]`(after, mlp_norm, d1, d2, d3)`; step 7,
    /// `update = out − u`. `b`, `u`, `attn`, the norms and the outputs hold `hidden`
    /// values; `z` is scratch of `hadamard_dim = d1.len()`.
    ///
    /// # Panics
    /// If the lengths disagree.
    #[allow(clippy::too_many_arguments)]
    pub fn block(
        b: &[f32],
        u: &[f32],
        attn: &[f32],
        out_scale: f32,
        post_norm: &[f32],
        mlp_norm: &[f32],
        d: [&[f32]; 3],
        z: &mut [f32],
        after: &mut [f32],
        out: &mut [f32],
        update: &mut [f32],
    ) {
        let h = b.len();
        let [d1, d2, d3] = d;
        assert!(
            u.len() == h && attn.len() == h && post_norm.len() == h && after.len() == h,
            "mlp block: lengths"
        );
        assert_eq!(update.len(), h, "mlp block: update");
        // `zcrms(attn, post_norm)` element by element as `zcrms_into` forms it.
        let r = inv_rms_wide(attn);
        for ((a, b), (x, g)) in after.iter_mut().zip(b).zip(attn.iter().zip(post_norm)) {
            *a = b + out_scale * (x * r * (1.0 + g));
        }
        hadamard_mlp(after, mlp_norm, d1, d2, d3, z, out);
        for ((d, o), u) in update.iter_mut().zip(out.iter()).zip(u) {
            *d = o - u;
        }
    }
}

/// [`hadamard_mlp`] with AVX-512, every elementwise step inside the two
/// `m`-wide transforms' first and last passes: the same operations on every
/// value as the separate loops, so the same bits.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::norm::inv_rms_wide;
    use crate::cq::fwht_x86::fwht_hooked;
    use crate::kernels::vmath::x86::sigmoid16;
    use std::arch::x86_64::*;

    /// The most blocks (`hadamard_dim / m`) the fused form folds in registers.
    pub(super) const MAX_COPIES: usize = 16;

    /// Lanes `c .. c + 16` of `v` below `len` (0 above).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn head(v: &[f32], c: usize, len: usize) -> __m512 {
        let k = len.saturating_sub(c).min(16);
        let mask = ((1u32 << k) - 1) as u16;
        // SAFETY: the mask covers `v[c .. len]` only.
        unsafe { _mm512_maskz_loadu_ps(mask, v.as_ptr().add(c.min(len))) }
    }

    /// See [`super::hadamard_mlp`]; `16 ≤ m ≤ z.len()` powers of two, at most
    /// [`MAX_COPIES`] blocks, `after`, `norm` and `out` of `hidden ≤ m`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn hadamard_mlp_512(
        after: &[f32],
        norm: &[f32],
        [d1, d2, d3]: [&[f32]; 3],
        m: usize,
        z: &mut [f32],
        out: &mut [f32],
    ) {
        let (h, n) = (after.len(), z.len());
        let copies = n / m;
        let r = _mm512_set1_ps(inv_rms_wide(after));
        let s = _mm512_set1_ps(1.0 / (n as f32).sqrt());
        let one = _mm512_set1_ps(1.0);
        let zp = z.as_mut_ptr();
        unsafe {
            // y = H_m(pad(zcrms(after, norm)) ⊙ d1), then for every block b
            // silu(d2[b] ⊙ y·s), the blocks folded as `fold_blocks` does.
            fwht_hooked(
                m / 16,
                zp,
                |i| {
                    let c = 16 * i;
                    let x = _mm512_mul_ps(
                        _mm512_mul_ps(head(after, c, h), r),
                        _mm512_add_ps(one, head(norm, c, h)),
                    );
                    _mm512_mul_ps(x, _mm512_loadu_ps(d1.as_ptr().add(c)))
                },
                |i, v| {
                    let c = 16 * i;
                    let v = _mm512_mul_ps(v, s);
                    let mut b = [_mm512_setzero_ps(); MAX_COPIES];
                    for (k, bk) in b.iter_mut().enumerate().take(copies) {
                        let t = _mm512_mul_ps(_mm512_loadu_ps(d2.as_ptr().add(k * m + c)), v);
                        *bk = _mm512_mul_ps(t, sigmoid16(t));
                    }
                    let mut len = copies;
                    while len > 1 {
                        let half = len / 2;
                        for k in 0..half {
                            b[k] = _mm512_add_ps(b[k], b[k + half]);
                        }
                        len = half;
                    }
                    _mm512_storeu_ps(zp.add(c), b[0]);
                },
            );
            // H_m of the folded blocks; out = after + (· s) ⊙ d3, the first
            // `hidden` values.
            fwht_hooked(
                m / 16,
                zp,
                |i| _mm512_loadu_ps(zp.add(16 * i)),
                |i, v| {
                    let c = 16 * i;
                    if c < h {
                        let k = (h - c).min(16);
                        let mask = ((1u32 << k) - 1) as u16;
                        let y =
                            _mm512_mul_ps(_mm512_mul_ps(v, s), _mm512_loadu_ps(d3.as_ptr().add(c)));
                        let o = _mm512_add_ps(head(after, c, h), y);
                        _mm512_mask_storeu_ps(out.as_mut_ptr().add(c), mask, o);
                    }
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC §4.3 step 6 in f64, the transforms `n` wide by their definition.
    fn in_f64(after: &[f32], norm: &[f32], d: [&[f32]; 3]) -> Vec<f64> {
        let (h, n) = (after.len(), d[0].len());
        let ms: f64 = after.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / h as f64;
        let r = 1.0 / (ms + 1e-6).sqrt();
        let hadamard = |x: &[f64]| -> Vec<f64> {
            (0..n)
                .map(|i| {
                    (0..n)
                        .map(|j| {
                            if (i & j).count_ones() % 2 == 0 {
                                x[j]
                            } else {
                                -x[j]
                            }
                        })
                        .sum::<f64>()
                        / (n as f64).sqrt()
                })
                .collect()
        };
        let mut z: Vec<f64> = (0..n)
            .map(|i| {
                if i < h {
                    after[i] as f64 * r * (1.0 + norm[i] as f64)
                } else {
                    0.0
                }
            })
            .collect();
        z.iter_mut().zip(d[0]).for_each(|(v, w)| *v *= *w as f64);
        let z = hadamard(&z);
        let z: Vec<f64> = z
            .iter()
            .zip(d[1])
            .map(|(v, w)| {
                let t = v * *w as f64;
                t / (1.0 + (-t).exp())
            })
            .collect();
        let z = hadamard(&z);
        (0..h)
            .map(|i| after[i] as f64 + z[i] * d[2][i] as f64)
            .collect()
    }

    #[test]
    fn the_mlp_is_spec_step_6_and_every_kernel_gives_one_value() {
        for (h, n) in [
            (16usize, 16usize),
            (300, 512),
            (512, 2048),
            (256, 1024),
            (100, 128),
            (40, 2048),
        ] {
            let f = |k: usize, i: usize| ((i * (7 + k) % 97) as f32 - 48.0) * 0.021;
            let after: Vec<f32> = (0..h).map(|i| f(0, i) * 3.0).collect();
            let norm: Vec<f32> = (0..h).map(|i| f(1, i)).collect();
            let d: Vec<Vec<f32>> = (2..5)
                .map(|k| (0..n).map(|i| 1.0 + f(k, i)).collect())
                .collect();
            let dd = [&d[0][..], &d[1][..], &d[2][..]];
            let want = in_f64(&after, &norm, dd);
            let mut z = vec![f32::NAN; n];
            let mut out = vec![f32::NAN; h];
            hadamard_mlp(&after, &norm, &d[0], &d[1], &d[2], &mut z, &mut out);
            for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (o as f64 - w).abs() <= 2e-6 * (1.0 + w.abs()),
                    "hidden {h} hadamard {n} [{i}]: {o} vs {w}"
                );
            }
            // The AVX-512 fused form is the loops of the reference, bit for bit.
            let m = h.next_power_of_two().max(16).min(n);
            #[cfg(target_arch = "x86_64")]
            if n / m <= x86::MAX_COPIES
                && crate::host::simd::CpuSimd::selected() == crate::host::simd::CpuSimd::Avx512
            {
                let mut z2 = vec![f32::NAN; n];
                let mut fused = vec![f32::NAN; h];
                // SAFETY: detected above.
                unsafe { x86::hadamard_mlp_512(&after, &norm, dd, m, &mut z2, &mut fused) };
                let s = 1.0 / (n as f32).sqrt();
                let mut loops = vec![f32::NAN; h];
                {
                    // The reference's loops with this process's kernels.
                    let y = &mut z[..m];
                    zcrms_into(&after, &norm, &mut y[..h]);
                    y[h..].fill(0.0);
                    y.iter_mut().zip(&d[0]).for_each(|(v, w)| *v *= w);
                    fwht(y);
                    for i in (0..m).rev() {
                        let v = z[i] * s;
                        for b in 0..n / m {
                            z[b * m + i] = v;
                        }
                    }
                    silu_of_product(&mut z, &d[1]);
                    fold_blocks(&mut z, m);
                    fwht(&mut z[..m]);
                    for i in 0..h {
                        loops[i] = after[i] + (z[i] * s) * d[2][i];
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fused), bits(&loops), "hidden {h}, hadamard {n}");
            }
        }
    }
}
