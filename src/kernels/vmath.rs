//! Slice-wide `exp`, `σ` and `silu` for the step's elementwise work, 8 lanes at a
//! time with AVX2+FMA (16 with AVX-512, the same arithmetic lane by lane) where
//! [`crate::simd::CpuSimd::selected`] allows, else the scalar functions of
//! [`super`] (the reference).
//!
//! The vector `exp` is the Cephes single-precision scheme: `n = round(x·log2 e)`,
//! `r = x − n·ln 2` in two parts, a degree-6 polynomial, times `2ⁿ`. Its error is
//! within 2 ulp of the true value on the normal range; beyond it, it returns what
//! `f32::exp` returns (`+∞` above 88.72, `0` below −103.97, NaN for NaN).

use super::{sigmoid, silu};
use crate::simd::CpuSimd;

fn vector() -> bool {
    cfg!(target_arch = "x86_64") && CpuSimd::selected() != CpuSimd::Scalar
}

/// Whether the 16-lane forms run (the same lane arithmetic as the 8-lane ones).
fn wide() -> bool {
    cfg!(target_arch = "x86_64") && CpuSimd::selected() == CpuSimd::Avx512
}

/// `x[i] ← exp(x[i])`.
pub fn exp_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: the AVX-512 selection implies AVX-512F (and AVX2, FMA).
        unsafe { x86::exp_slice_512(x) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if vector() {
        // SAFETY: a non-scalar selection implies AVX2 and FMA were detected.
        unsafe { x86::exp_slice(x) };
        return;
    }
    x.iter_mut().for_each(|v| *v = v.exp());
}

/// `x[i] ← ln(x[i])` (the vector form: the Cephes single-precision scheme,
/// within 2 ulp; `−∞` at 0, NaN below it and for NaN, `+∞` at `+∞`).
pub fn ln_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: the AVX-512 selection implies AVX-512F (and AVX2, FMA).
        unsafe { x86::ln_slice_512(x) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if vector() {
        // SAFETY: a non-scalar selection implies AVX2 and FMA were detected.
        unsafe { x86::ln_slice(x) };
        return;
    }
    x.iter_mut().for_each(|v| *v = v.ln());
}

/// `z[i] ← silu(d[i] · z[i])` (the Hadamard MLP's activation).
///
/// # Panics
/// If the lengths differ.
pub fn silu_of_product(z: &mut [f32], d: &[f32]) {
    assert_eq!(z.len(), d.len(), "silu_of_product: lengths");
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: as in exp_in_place.
        unsafe { x86::silu_of_product_512(z, d) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if vector() {
        // SAFETY: as in exp_in_place.
        unsafe { x86::silu_of_product(z, d) };
        return;
    }
    for (v, w) in z.iter_mut().zip(d) {
        *v = silu(w * *v);
    }
}

/// `x[i] ← silu(x[i])`: [`silu_of_product`] with every factor 1, so the same
/// values (`1 · x` is `x`).
pub fn silu_in_place(x: &mut [f32]) {
    const ONES: [f32; 64] = [1.0; 64];
    for c in x.chunks_mut(64) {
        let n = c.len();
        silu_of_product(c, &ONES[..n]);
    }
}

/// `o[i] ← o[i] · σ(g[i])` (the attention output gate).
///
/// # Panics
/// If the lengths differ.
pub fn gate_in_place(o: &mut [f32], g: &[f32]) {
    assert_eq!(o.len(), g.len(), "gate_in_place: lengths");
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: as in exp_in_place.
        unsafe { x86::gate_512(o, g) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if vector() {
        // SAFETY: as in exp_in_place.
        unsafe { x86::gate(o, g) };
        return;
    }
    for (v, w) in o.iter_mut().zip(g) {
        *v *= sigmoid(*w);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    // Index loops over small register arrays read clearer than iterator chains here.
    #![allow(clippy::needless_range_loop)]
    use std::arch::x86_64::*;

    use super::{sigmoid, silu};

    /// `x[i] ← exp(x[i])`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp_slice(x: &mut [f32]) {
        let n = x.len() / 8 * 8;
        let p = x.as_mut_ptr();
        for i in (0..n).step_by(8) {
            _mm256_storeu_ps(p.add(i), exp8(_mm256_loadu_ps(p.add(i))));
        }
        x[n..].iter_mut().for_each(|v| *v = v.exp());
    }

    /// `z[i] ← silu(d[i] · z[i])`; `d.len() == z.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn silu_of_product(z: &mut [f32], d: &[f32]) {
        let n = z.len() / 8 * 8;
        let p = z.as_mut_ptr();
        for i in (0..n).step_by(8) {
            let v = _mm256_mul_ps(
                _mm256_loadu_ps(d.as_ptr().add(i)),
                _mm256_loadu_ps(p.add(i)),
            );
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(v, sigmoid8(v)));
        }
        for i in n..z.len() {
            z[i] = silu(d[i] * z[i]);
        }
    }

    /// `o[i] ← o[i] · σ(g[i])`; `g.len() == o.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn gate(o: &mut [f32], g: &[f32]) {
        let n = o.len() / 8 * 8;
        let p = o.as_mut_ptr();
        for i in (0..n).step_by(8) {
            let s = sigmoid8(_mm256_loadu_ps(g.as_ptr().add(i)));
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), s));
        }
        for i in n..o.len() {
            o[i] *= sigmoid(g[i]);
        }
    }

    /// `exp` of 8 lanes (see the module note for its accuracy and edges).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
        let hi = _mm256_set1_ps(88.722_84);
        let lo = _mm256_set1_ps(-103.972_08);
        // Clamp to where 2ⁿ stays a normal float; the edges are patched below.
        let xc = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.336_55)),
            _mm256_set1_ps(88.376_26),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(xc, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
        }
        let y = _mm256_fmadd_ps(
            y,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        let mut out = _mm256_mul_ps(y, pow2);
        // Edges as f32::exp: +∞ above `hi`, 0 below `lo`, and a slow but exact
        // scalar path in between the clamp and the edge (rare: |x| > 87).
        let over = _mm256_cmp_ps::<_CMP_GT_OQ>(x, hi);
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo);
        let outside = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(88.376_26)),
            _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.336_55)),
        );
        if _mm256_movemask_ps(outside) != 0 {
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), x);
            lanes.iter_mut().for_each(|v| *v = v.exp());
            out = _mm256_blendv_ps(out, _mm256_loadu_ps(lanes.as_ptr()), outside);
        }
        out = _mm256_blendv_ps(out, _mm256_set1_ps(f32::INFINITY), over);
        out = _mm256_andnot_ps(under, out);
        // NaN in, NaN out.
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        _mm256_blendv_ps(out, x, nan)
    }

    /// `x[i] ← exp(x[i])`, 16 lanes at a time.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(crate) unsafe fn exp_slice_512(x: &mut [f32]) {
        let n = x.len() / 16 * 16;
        let p = x.as_mut_ptr();
        for i in (0..n).step_by(16) {
            _mm512_storeu_ps(p.add(i), exp16(_mm512_loadu_ps(p.add(i))));
        }
        // SAFETY: the same features.
        unsafe { exp_slice(&mut x[n..]) };
    }

    /// `z[i] ← silu(d[i] · z[i])`, 16 lanes at a time; `d.len() == z.len()`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(crate) unsafe fn silu_of_product_512(z: &mut [f32], d: &[f32]) {
        let n = z.len() / 16 * 16;
        let p = z.as_mut_ptr();
        for i in (0..n).step_by(16) {
            let v = _mm512_mul_ps(
                _mm512_loadu_ps(d.as_ptr().add(i)),
                _mm512_loadu_ps(p.add(i)),
            );
            _mm512_storeu_ps(p.add(i), _mm512_mul_ps(v, sigmoid16(v)));
        }
        // SAFETY: the same features.
        unsafe { silu_of_product(&mut z[n..], &d[n..]) };
    }

    /// `o[i] ← o[i] · σ(g[i])`, 16 lanes at a time; `g.len() == o.len()`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(crate) unsafe fn gate_512(o: &mut [f32], g: &[f32]) {
        let n = o.len() / 16 * 16;
        let p = o.as_mut_ptr();
        for i in (0..n).step_by(16) {
            let s = sigmoid16(_mm512_loadu_ps(g.as_ptr().add(i)));
            _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), s));
        }
        // SAFETY: the same features.
        unsafe { gate(&mut o[n..], &g[n..]) };
    }

    /// [`exp8`] of 16 lanes: the same operations lane by lane, so the same
    /// values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn exp16(x: __m512) -> __m512 {
        let xc = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(-87.336_55)),
            _mm512_set1_ps(88.376_26),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), xc);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut y = _mm512_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
        }
        let y = _mm512_fmadd_ps(
            y,
            _mm512_mul_ps(r, r),
            _mm512_add_ps(r, _mm512_set1_ps(1.0)),
        );
        let pow2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        )));
        let mut out = _mm512_mul_ps(y, pow2);
        let over = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(88.722_84));
        let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-103.972_08));
        let outside = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(88.376_26))
            | _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.336_55));
        if outside != 0 {
            let mut lanes = [0.0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), x);
            lanes.iter_mut().for_each(|v| *v = v.exp());
            out = _mm512_mask_blend_ps(outside, out, _mm512_loadu_ps(lanes.as_ptr()));
        }
        out = _mm512_mask_blend_ps(over, out, _mm512_set1_ps(f32::INFINITY));
        out = _mm512_mask_blend_ps(under, out, _mm512_setzero_ps());
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_blend_ps(nan, out, x)
    }

    /// [`sigmoid8`] of 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn sigmoid16(x: __m512) -> __m512 {
        let one = _mm512_set1_ps(1.0);
        let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_div_ps(one, _mm512_add_ps(one, e))
    }

    /// The coefficients of the Cephes `logf` polynomial, highest first.
    const LN_POLY: [f32; 9] = [
        7.037_683_6e-2,
        -1.151_461e-1,
        1.167_699_9e-1,
        -1.242_014_1e-1,
        1.424_932_3e-1,
        -1.666_805_8e-1,
        2.000_071_5e-1,
        -2.499_999_4e-1,
        0.333_333_3,
    ];

    /// `x[i] ← ln(x[i])`, 8 lanes at a time (the tail by the same lanes).
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn ln_slice(x: &mut [f32]) {
        for c in x.chunks_mut(8) {
            let mut lanes = [1.0f32; 8];
            lanes[..c.len()].copy_from_slice(c);
            let v = ln8(_mm256_loadu_ps(lanes.as_ptr()));
            _mm256_storeu_ps(lanes.as_mut_ptr(), v);
            c.copy_from_slice(&lanes[..c.len()]);
        }
    }

    /// `x[i] ← ln(x[i])`, 16 lanes at a time (the tail by the 8-lane form).
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(crate) unsafe fn ln_slice_512(x: &mut [f32]) {
        let n = x.len() / 16 * 16;
        let p = x.as_mut_ptr();
        for i in (0..n).step_by(16) {
            _mm512_storeu_ps(p.add(i), ln16(_mm512_loadu_ps(p.add(i))));
        }
        // SAFETY: the same features.
        unsafe { ln_slice(&mut x[n..]) };
    }

    /// `ln` of 8 lanes: `x = m · 2^e` with `m` in `[√½, √2)` (subnormals
    /// scaled by 2²³ first), `ln x = e·ln 2 + ln m` by the Cephes polynomial.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn ln8(x: __m256) -> __m256 {
        let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(f32::MIN_POSITIVE));
        let xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(8_388_608.0)), tiny);
        let bits = _mm256_castps_si256(xs);
        let e = _mm256_sub_epi32(
            _mm256_srli_epi32::<23>(_mm256_and_si256(bits, _mm256_set1_epi32(0x7f80_0000))),
            _mm256_set1_epi32(126),
        );
        let mut e = _mm256_sub_ps(
            _mm256_cvtepi32_ps(e),
            _mm256_and_ps(tiny, _mm256_set1_ps(23.0)),
        );
        // The mantissa in [0.5, 1).
        let m = _mm256_castsi256_ps(_mm256_or_si256(
            _mm256_and_si256(bits, _mm256_set1_epi32(0x007f_ffff)),
            _mm256_set1_epi32(0x3f00_0000),
        ));
        let small = _mm256_cmp_ps::<_CMP_LT_OQ>(m, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
        e = _mm256_sub_ps(e, _mm256_and_ps(small, _mm256_set1_ps(1.0)));
        let m = _mm256_sub_ps(
            _mm256_add_ps(m, _mm256_and_ps(small, m)),
            _mm256_set1_ps(1.0),
        );
        let z = _mm256_mul_ps(m, m);
        let mut y = _mm256_set1_ps(LN_POLY[0]);
        for &c in &LN_POLY[1..] {
            y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(c));
        }
        let y = _mm256_mul_ps(_mm256_mul_ps(y, m), z);
        let y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.121_944_4e-4), y);
        let y = _mm256_fnmadd_ps(_mm256_set1_ps(0.5), z, y);
        let r = _mm256_fmadd_ps(e, _mm256_set1_ps(0.693_359_4), _mm256_add_ps(m, y));
        // Edges: ln 0 = −∞, ln of a negative or NaN = NaN, ln ∞ = ∞.
        let r = _mm256_blendv_ps(
            r,
            _mm256_set1_ps(f32::NEG_INFINITY),
            _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_setzero_ps()),
        );
        let r = _mm256_blendv_ps(
            r,
            _mm256_set1_ps(f32::NAN),
            _mm256_cmp_ps::<_CMP_NGE_UQ>(x, _mm256_setzero_ps()),
        );
        _mm256_blendv_ps(
            r,
            x,
            _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_set1_ps(f32::INFINITY)),
        )
    }

    /// [`ln8`] of 16 lanes: the same operations lane by lane.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn ln16(x: __m512) -> __m512 {
        let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(f32::MIN_POSITIVE));
        let xs = _mm512_mask_blend_ps(tiny, x, _mm512_mul_ps(x, _mm512_set1_ps(8_388_608.0)));
        let bits = _mm512_castps_si512(xs);
        let e = _mm512_sub_epi32(
            _mm512_srli_epi32::<23>(_mm512_and_si512(bits, _mm512_set1_epi32(0x7f80_0000))),
            _mm512_set1_epi32(126),
        );
        let mut e = _mm512_mask_sub_ps(
            _mm512_cvtepi32_ps(e),
            tiny,
            _mm512_cvtepi32_ps(e),
            _mm512_set1_ps(23.0),
        );
        let m = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_and_si512(bits, _mm512_set1_epi32(0x007f_ffff)),
            _mm512_set1_epi32(0x3f00_0000),
        ));
        let small =
            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(m, _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
        e = _mm512_mask_sub_ps(e, small, e, _mm512_set1_ps(1.0));
        let m = _mm512_sub_ps(_mm512_mask_add_ps(m, small, m, m), _mm512_set1_ps(1.0));
        let z = _mm512_mul_ps(m, m);
        let mut y = _mm512_set1_ps(LN_POLY[0]);
        for &c in &LN_POLY[1..] {
            y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(c));
        }
        let y = _mm512_mul_ps(_mm512_mul_ps(y, m), z);
        let y = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.121_944_4e-4), y);
        let y = _mm512_fnmadd_ps(_mm512_set1_ps(0.5), z, y);
        let r = _mm512_fmadd_ps(e, _mm512_set1_ps(0.693_359_4), _mm512_add_ps(m, y));
        let zero = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_setzero_ps());
        let r = _mm512_mask_blend_ps(zero, r, _mm512_set1_ps(f32::NEG_INFINITY));
        let bad = _mm512_cmp_ps_mask::<_CMP_NGE_UQ>(x, _mm512_setzero_ps());
        let r = _mm512_mask_blend_ps(bad, r, _mm512_set1_ps(f32::NAN));
        let inf = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_set1_ps(f32::INFINITY));
        _mm512_mask_blend_ps(inf, r, x)
    }

    /// `σ(x) = 1 / (1 + exp(−x))` of 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn sigmoid8(x: __m256) -> __m256 {
        let one = _mm256_set1_ps(1.0);
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(one, _mm256_add_ps(one, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f64) -> f64 {
        let b32 = b as f32;
        if a == b32 {
            return 0.0;
        }
        let ulp = (b32.abs() * f32::EPSILON).max(f32::MIN_POSITIVE);
        (a as f64 - b).abs() / ulp as f64
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64_and_keeps_the_edges_of_f32_exp() {
        let mut xs: Vec<f32> = (0..20001).map(|i| -100.0 + i as f32 * 0.01).collect();
        xs.extend([
            88.5,
            88.72,
            88.73,
            100.0,
            -87.0,
            -87.5,
            -103.0,
            -104.0,
            -1000.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.0,
            -0.0,
        ]);
        let mut got = xs.clone();
        exp_in_place(&mut got);
        for (&x, &y) in xs.iter().zip(&got) {
            let want = x.exp();
            if !want.is_finite() || want == 0.0 || want < f32::MIN_POSITIVE {
                assert!(
                    (want.is_nan() && y.is_nan()) || y == want || (y - want).abs() <= 1e-44,
                    "exp({x}) = {y}, f32::exp gives {want}"
                );
                continue;
            }
            let u = ulps(y, (x as f64).exp());
            assert!(u <= 2.0, "exp({x}) = {y}: {u} ulp off");
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_16_lane_forms_equal_the_8_lane_ones_bit_for_bit() {
        if !(std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma"))
        {
            return;
        }
        let mut xs: Vec<f32> = (0..4001).map(|i| -110.0 + i as f32 * 0.05).collect();
        xs.extend([
            88.5,
            88.73,
            -87.5,
            -104.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        let d: Vec<f32> = (0..xs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // SAFETY: the features were detected above.
        unsafe {
            let (mut a, mut b) = (xs.clone(), xs.clone());
            x86::exp_slice(&mut a);
            x86::exp_slice_512(&mut b);
            assert_eq!(bits(&a), bits(&b), "exp");
            let (mut a, mut b) = (xs.clone(), xs.clone());
            x86::silu_of_product(&mut a, &d);
            x86::silu_of_product_512(&mut b, &d);
            assert_eq!(bits(&a), bits(&b), "silu");
            let (mut a, mut b) = (xs.clone(), xs.clone());
            x86::gate(&mut a, &d);
            x86::gate_512(&mut b, &d);
            assert_eq!(bits(&a), bits(&b), "gate");
        }
    }

    #[test]
    fn ln_is_within_two_ulp_of_f64_and_keeps_the_edges_of_f32_ln() {
        let mut xs: Vec<f32> = (0..20001).map(|i| 1e-3 + i as f32 * 0.0137).collect();
        xs.extend((1..200).map(|i| (i as f32 * 0.37).exp2() * 1e-30));
        xs.extend([
            1.0,
            2.0,
            4.0,
            f32::MIN_POSITIVE,
            1e-40,
            1e-45,
            f32::MAX,
            f32::INFINITY,
            0.0,
            -0.0,
            -1.0,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        let mut got = xs.clone();
        ln_in_place(&mut got);
        for (&x, &y) in xs.iter().zip(&got) {
            let want = x.ln();
            if !want.is_finite() {
                assert!(
                    (want.is_nan() && y.is_nan()) || y == want,
                    "ln({x}) = {y}, f32::ln gives {want}"
                );
                continue;
            }
            let u = ulps(y, (x as f64).ln());
            assert!(u <= 2.0, "ln({x}) = {y}: {u} ulp off");
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            let (mut a, mut b) = (xs.clone(), xs.clone());
            // SAFETY: the features were detected above.
            unsafe {
                x86::ln_slice(&mut a);
                x86::ln_slice_512(&mut b);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "the 16-lane ln equals the 8-lane one");
        }
    }

    #[test]
    fn silu_and_gate_match_the_scalar_functions() {
        let n = 1003; // not a multiple of 8: the tail runs the scalar path
        let z: Vec<f32> = (0..n)
            .map(|i| ((i * 37) % 201) as f32 * 0.1 - 10.0)
            .collect();
        let d: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let mut a = z.clone();
        silu_of_product(&mut a, &d);
        let mut b = z.clone();
        gate_in_place(&mut b, &d);
        for i in 0..n {
            let s = silu(d[i] * z[i]);
            assert!((a[i] - s).abs() <= 4e-7 * (1.0 + s.abs()), "silu {i}");
            let g = z[i] * sigmoid(d[i]);
            assert!((b[i] - g).abs() <= 4e-7 * (1.0 + g.abs()), "gate {i}");
        }
    }
}
