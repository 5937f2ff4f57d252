//! The Hadamard MLP (SPEC §4.3 step 6) and [`block`], the CPU twin of
//! shaders/mlp.wgsl's `mlp` entry point (`crate::gpu::kernels::mlp`): attention
//! output norm and residual, the MLP and the lane update.

use super::norm::{inv_rms_wide, zcrms_into};
use super::vmath::silu_of_product;
use crate::cq::nfwht;

/// `out = after + (d3 ⊙ nfwht(silu(d2 ⊙ nfwht(d1 ⊙ pad(zcrms(after, norm))))))[..hidden]`.
/// `z` is scratch of `hadamard_dim = d1.len()` entries.
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
    let h = after.len();
    assert!(z.len() == d1.len() && d2.len() == d1.len() && d3.len() == d1.len() && out.len() == h);
    assert!(h <= z.len() && norm.len() == h, "hadamard_mlp: lengths");
    #[cfg(target_arch = "x86_64")]
    if z.len() >= 16 && crate::simd::CpuSimd::selected() == crate::simd::CpuSimd::Avx512 {
        // SAFETY: the selection implies AVX-512F; lengths checked above.
        unsafe { x86::hadamard_mlp_512(after, norm, [d1, d2, d3], z, out) };
        return;
    }
    zcrms_into(after, norm, &mut z[..h]);
    z[h..].fill(0.0);
    for (v, w) in z.iter_mut().zip(d1) {
        *v *= w;
    }
    nfwht(z);
    silu_of_product(z, d2);
    nfwht(z);
    for (v, w) in z.iter_mut().zip(d3) {
        *v *= w;
    }
    for ((o, a), v) in out.iter_mut().zip(after).zip(z.iter()) {
        *o = a + v;
    }
}

crate::simd::simd_fn! {
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
/// transforms' first and last passes: the same operations on every value as
/// the separate loops, so the same bits.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::norm::inv_rms_wide;
    use crate::cq::fwht_x86::fwht_hooked;
    use crate::kernels::vmath::x86::sigmoid16;
    use std::arch::x86_64::*;

    /// Lanes `c .. c + 16` of `v` below `len` (0 above).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn head(v: &[f32], c: usize, len: usize) -> __m512 {
        let k = len.saturating_sub(c).min(16);
        let mask = ((1u32 << k) - 1) as u16;
        // SAFETY: the mask covers `v[c .. len]` only.
        unsafe { _mm512_maskz_loadu_ps(mask, v.as_ptr().add(c.min(len))) }
    }

    /// See [`super::hadamard_mlp`]; `z.len() ≥ 16` a power of two, `after`,
    /// `norm` and `out` of `hidden ≤ z.len()`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn hadamard_mlp_512(
        after: &[f32],
        norm: &[f32],
        [d1, d2, d3]: [&[f32]; 3],
        z: &mut [f32],
        out: &mut [f32],
    ) {
        let (h, n) = (after.len(), z.len());
        let r = _mm512_set1_ps(inv_rms_wide(after));
        let s = _mm512_set1_ps(1.0 / (n as f32).sqrt());
        let one = _mm512_set1_ps(1.0);
        let zp = z.as_mut_ptr();
        unsafe {
            // z = pad(zcrms(after, norm)) ⊙ d1; H; ⊙ s; silu(d2 ⊙ ·).
            fwht_hooked(
                n / 16,
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
                    let t = _mm512_mul_ps(_mm512_loadu_ps(d2.as_ptr().add(c)), _mm512_mul_ps(v, s));
                    _mm512_storeu_ps(zp.add(c), _mm512_mul_ps(t, sigmoid16(t)));
                },
            );
            // H; ⊙ s; ⊙ d3; out = after + the first `hidden` values.
            fwht_hooked(
                n / 16,
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
    use crate::kernels::vmath::silu_of_product;

    /// SPEC §4.3 step 6 one loop at a time, with this process's kernels.
    fn step_by_step(after: &[f32], norm: &[f32], d: [&[f32]; 3]) -> Vec<f32> {
        let (h, n) = (after.len(), d[0].len());
        let mut z = vec![0.0f32; n];
        zcrms_into(after, norm, &mut z[..h]);
        for (v, w) in z.iter_mut().zip(d[0]) {
            *v *= w;
        }
        nfwht(&mut z);
        silu_of_product(&mut z, d[1]);
        nfwht(&mut z);
        (0..h).map(|i| after[i] + z[i] * d[2][i]).collect()
    }

    #[test]
    fn the_fused_mlp_gives_the_bits_of_its_steps() {
        for (h, n) in [
            (16usize, 16usize),
            (300, 512),
            (512, 2048),
            (512, 4096),
            (100, 128),
        ] {
            let f = |k: usize, i: usize| ((i * (7 + k) % 97) as f32 - 48.0) * 0.021;
            let after: Vec<f32> = (0..h).map(|i| f(0, i) * 3.0).collect();
            let norm: Vec<f32> = (0..h).map(|i| f(1, i)).collect();
            let d: Vec<Vec<f32>> = (2..5)
                .map(|k| (0..n).map(|i| 1.0 + f(k, i)).collect())
                .collect();
            let want = step_by_step(&after, &norm, [&d[0], &d[1], &d[2]]);
            let mut z = vec![f32::NAN; n];
            let mut out = vec![f32::NAN; h];
            hadamard_mlp(&after, &norm, &d[0], &d[1], &d[2], &mut z, &mut out);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&want), "hidden {h}, hadamard {n}");
        }
    }
}
