//! `rms_unit` and `zcrms` (SPEC §0).

/// SPEC §0 `ε`.
pub const EPS: f32 = 1e-6;

/// `1 / sqrt(mean(x²) + ε)` in f32 (eight partial sums, then added in order):
/// the order the GPU reproduces bit for bit for the per-head q/k norms, whose
/// result decides int8 KV codes (shaders/common.wgsl). Long vectors use
/// [`inv_rms_wide`].
#[inline(always)]
pub fn inv_rms(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for k in 0..8 {
            acc[k] += c[k] * c[k];
        }
    }
    for (k, v) in chunks.remainder().iter().enumerate() {
        acc[k] += v * v;
    }
    let sum: f32 = acc.iter().sum();
    1.0 / (sum / x.len() as f32 + EPS).sqrt()
}

/// Partial sums of [`inv_rms_wide`]: one per SIMD lane of four 512-bit
/// registers.
const WIDE: usize = 64;

/// `1 / sqrt(mean(x²) + ε)` in f32 for the long vectors (the lanes, a hidden
/// state), whose sum the GPU does not reproduce bit for bit: 64 partial sums
/// (partial `k` over the indices `i ≡ k (mod 64)` in ascending `i`, each term
/// `x·x` rounded, then added), combined as a tree (`p[k] += p[k + h]` for
/// `h` = 32, 16, … 1). The same bits with scalar, AVX2 and AVX-512 kernels.
/// [`inv_rms`]'s eight partials are one dependency chain of `n / 8` additions;
/// these are independent enough to run at the adders' throughput.
pub fn inv_rms_wide(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::host::simd::CpuSimd;
        match CpuSimd::selected() {
            // SAFETY: the selected level implies the features.
            CpuSimd::Avx512 => return unsafe { x86::inv_rms_wide_512(x) },
            CpuSimd::Avx2 => return unsafe { x86::inv_rms_wide_avx2(x) },
            CpuSimd::Scalar => {}
        }
    }
    let mut p = [0.0f32; WIDE];
    for (i, v) in x.iter().enumerate() {
        p[i % WIDE] += v * v;
    }
    let mut h = WIDE / 2;
    while h > 0 {
        for k in 0..h {
            p[k] += p[k + h];
        }
        h /= 2;
    }
    1.0 / (p[0] / x.len() as f32 + EPS).sqrt()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{EPS, WIDE};
    use std::arch::x86_64::*;

    /// The 64 partials in four registers, combined as the scalar tree.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn inv_rms_wide_512(x: &[f32]) -> f32 {
        let mut p = [_mm512_setzero_ps(); 4];
        for c in x.chunks(WIDE) {
            for (j, pj) in p.iter_mut().enumerate() {
                let lo = (16 * j).min(c.len());
                let hi = (16 * j + 16).min(c.len());
                let mask = ((1u32 << (hi - lo)) - 1) as u16;
                // SAFETY: the mask covers `c[lo..hi]` only.
                let v = unsafe { _mm512_maskz_loadu_ps(mask, c.as_ptr().add(lo)) };
                *pj = _mm512_add_ps(*pj, _mm512_mul_ps(v, v));
            }
        }
        // h = 32 and 16: whole registers; then 8, 4, 2, 1 inside one.
        let q = _mm512_add_ps(_mm512_add_ps(p[0], p[2]), _mm512_add_ps(p[1], p[3]));
        let mut lanes = [0.0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), q);
        let mut h = 8;
        while h > 0 {
            for k in 0..h {
                lanes[k] += lanes[k + h];
            }
            h /= 2;
        }
        1.0 / (lanes[0] / x.len() as f32 + EPS).sqrt()
    }

    /// The 64 partials in eight registers, combined as the scalar tree.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn inv_rms_wide_avx2(x: &[f32]) -> f32 {
        let mut p = [_mm256_setzero_ps(); 8];
        let whole = x.len() / WIDE * WIDE;
        for c in x[..whole].chunks_exact(WIDE) {
            for (j, pj) in p.iter_mut().enumerate() {
                // SAFETY: 8 values at 8j of a chunk of 64.
                let v = unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * j)) };
                *pj = _mm256_add_ps(*pj, _mm256_mul_ps(v, v));
            }
        }
        let mut acc = [0.0f32; WIDE];
        for (j, pj) in p.iter().enumerate() {
            // SAFETY: 8 values into acc[8j..].
            unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(8 * j), *pj) };
        }
        for (i, v) in x[whole..].iter().enumerate() {
            acc[i] += v * v;
        }
        let mut h = WIDE / 2;
        while h > 0 {
            for k in 0..h {
                acc[k] += acc[k + h];
            }
            h /= 2;
        }
        1.0 / (acc[0] / x.len() as f32 + EPS).sqrt()
    }
}

crate::host::simd::simd_fn! {
    /// `out = rms_unit(x) = x / sqrt(mean(x²) + ε)` (the sum of [`inv_rms_wide`]).
    ///
    /// # Panics
    /// If `out.len() != x.len()`.
    pub fn rms_unit_into(x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), out.len());
        let r = inv_rms_wide(x);
        for (o, v) in out.iter_mut().zip(x) {
            *o = v * r;
        }
    }
}

crate::host::simd::simd_fn! {
    /// `out = zcrms(x, w) = rms_unit(x) ⊙ (1 + w)` (the sum of [`inv_rms_wide`]).
    ///
    /// # Panics
    /// If the three lengths differ.
    pub fn zcrms_into(x: &[f32], w: &[f32], out: &mut [f32]) {
        assert!(x.len() == out.len() && w.len() == x.len());
        let r = inv_rms_wide(x);
        for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
            *o = v * r * (1.0 + g);
        }
    }
}

/// In place: `x ← zcrms(x, w)` (the sum of [`inv_rms`]: the q/k heads' rule).
///
/// # Panics
/// If the lengths differ.
#[inline(always)]
pub fn zcrms_in_place(x: &mut [f32], w: &[f32]) {
    assert_eq!(x.len(), w.len());
    let r = inv_rms(x);
    for (v, g) in x.iter_mut().zip(w) {
        *v = *v * r * (1.0 + g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wide_sum_is_one_order_for_every_kernel_and_close_to_f64() {
        for n in [1usize, 7, 63, 64, 65, 200, 512, 2048, 2049] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.031)
                .collect();
            let got = inv_rms_wide(&x);
            let ms: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / n as f64;
            let want = 1.0 / (ms + EPS as f64).sqrt();
            assert!(
                (got as f64 - want).abs() <= 1e-6 * want,
                "n {n}: {got} vs {want}"
            );
            // The scalar order, here in plain code, is every path's order.
            let mut p = [0.0f32; WIDE];
            for (i, v) in x.iter().enumerate() {
                p[i % WIDE] += v * v;
            }
            let mut h = WIDE / 2;
            while h > 0 {
                for k in 0..h {
                    p[k] += p[k + h];
                }
                h /= 2;
            }
            let scalar = 1.0 / (p[0] / n as f32 + EPS).sqrt();
            assert_eq!(
                got.to_bits(),
                scalar.to_bits(),
                "n {n}: the selected kernel"
            );
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                if has!("avx2") {
                    // SAFETY: detected.
                    let v = unsafe { x86::inv_rms_wide_avx2(&x) };
                    assert_eq!(v.to_bits(), scalar.to_bits(), "n {n}: AVX2");
                }
                if has!("avx512f") {
                    // SAFETY: detected.
                    let v = unsafe { x86::inv_rms_wide_512(&x) };
                    assert_eq!(v.to_bits(), scalar.to_bits(), "n {n}: AVX-512");
                }
            }
        }
    }
}
