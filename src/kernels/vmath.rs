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
    //! One implementation of each function for both register widths: the
    //! [`Lanes`] trait gives the operations, [`exp`], [`ln`] and [`sigmoid`]
    //! are written once over it, so the 8- and 16-lane forms do the same
    //! operations lane by lane (the same bits, by construction).
    use std::arch::x86_64::*;

    /// A register of f32 lanes (8 or 16) and the operations the vector math
    /// needs; every operation is IEEE per lane, the same on both widths.
    pub(crate) trait Lanes: Copy {
        /// A per-lane condition.
        type Mask: Copy;
        const N: usize;
        unsafe fn splat(v: f32) -> Self;
        unsafe fn load(p: *const f32) -> Self;
        unsafe fn store(self, p: *mut f32);
        unsafe fn add(self, o: Self) -> Self;
        unsafe fn sub(self, o: Self) -> Self;
        unsafe fn mul(self, o: Self) -> Self;
        unsafe fn div(self, o: Self) -> Self;
        /// `self · b + c`, rounded once.
        unsafe fn fma(self, b: Self, c: Self) -> Self;
        /// `c − self · b`, rounded once.
        unsafe fn fnma(self, b: Self, c: Self) -> Self;
        /// `o` when either is NaN (x86's `max`).
        unsafe fn max(self, o: Self) -> Self;
        /// `o` when either is NaN (x86's `min`).
        unsafe fn min(self, o: Self) -> Self;
        /// To the nearest integer, ties to even.
        unsafe fn round(self) -> Self;
        /// `2^self` for an integral `self` in the normal exponent range.
        unsafe fn pow2(self) -> Self;
        /// Each lane's bits and `m`, or `o`.
        unsafe fn bits_and_or(self, m: u32, o: u32) -> Self;
        /// Each lane's biased exponent field minus 126, as a float.
        unsafe fn exponent(self) -> Self;
        unsafe fn gt(self, o: Self) -> Self::Mask;
        unsafe fn lt(self, o: Self) -> Self::Mask;
        unsafe fn eq(self, o: Self) -> Self::Mask;
        /// Not greater or equal (true for NaN).
        unsafe fn nge(self, o: Self) -> Self::Mask;
        unsafe fn nan(self) -> Self::Mask;
        unsafe fn or(a: Self::Mask, b: Self::Mask) -> Self::Mask;
        unsafe fn any(m: Self::Mask) -> bool;
        /// `b` in the lanes of `m`, else `a`.
        unsafe fn select(m: Self::Mask, a: Self, b: Self) -> Self;
    }

    impl Lanes for __m256 {
        type Mask = __m256;
        const N: usize = 8;
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            _mm256_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm256_storeu_ps(p, self) }
        }
        #[inline(always)]
        unsafe fn add(self, o: Self) -> Self {
            _mm256_add_ps(self, o)
        }
        #[inline(always)]
        unsafe fn sub(self, o: Self) -> Self {
            _mm256_sub_ps(self, o)
        }
        #[inline(always)]
        unsafe fn mul(self, o: Self) -> Self {
            _mm256_mul_ps(self, o)
        }
        #[inline(always)]
        unsafe fn div(self, o: Self) -> Self {
            _mm256_div_ps(self, o)
        }
        #[inline(always)]
        unsafe fn fma(self, b: Self, c: Self) -> Self {
            _mm256_fmadd_ps(self, b, c)
        }
        #[inline(always)]
        unsafe fn fnma(self, b: Self, c: Self) -> Self {
            _mm256_fnmadd_ps(self, b, c)
        }
        #[inline(always)]
        unsafe fn max(self, o: Self) -> Self {
            _mm256_max_ps(self, o)
        }
        #[inline(always)]
        unsafe fn min(self, o: Self) -> Self {
            _mm256_min_ps(self, o)
        }
        #[inline(always)]
        unsafe fn round(self) -> Self {
            _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self)
        }
        #[inline(always)]
        unsafe fn pow2(self) -> Self {
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(self),
                _mm256_set1_epi32(127),
            )))
        }
        #[inline(always)]
        unsafe fn bits_and_or(self, m: u32, o: u32) -> Self {
            _mm256_castsi256_ps(_mm256_or_si256(
                _mm256_and_si256(_mm256_castps_si256(self), _mm256_set1_epi32(m as i32)),
                _mm256_set1_epi32(o as i32),
            ))
        }
        #[inline(always)]
        unsafe fn exponent(self) -> Self {
            let e = _mm256_srli_epi32::<23>(_mm256_and_si256(
                _mm256_castps_si256(self),
                _mm256_set1_epi32(0x7f80_0000),
            ));
            _mm256_cvtepi32_ps(_mm256_sub_epi32(e, _mm256_set1_epi32(126)))
        }
        #[inline(always)]
        unsafe fn gt(self, o: Self) -> Self::Mask {
            _mm256_cmp_ps::<_CMP_GT_OQ>(self, o)
        }
        #[inline(always)]
        unsafe fn lt(self, o: Self) -> Self::Mask {
            _mm256_cmp_ps::<_CMP_LT_OQ>(self, o)
        }
        #[inline(always)]
        unsafe fn eq(self, o: Self) -> Self::Mask {
            _mm256_cmp_ps::<_CMP_EQ_OQ>(self, o)
        }
        #[inline(always)]
        unsafe fn nge(self, o: Self) -> Self::Mask {
            _mm256_cmp_ps::<_CMP_NGE_UQ>(self, o)
        }
        #[inline(always)]
        unsafe fn nan(self) -> Self::Mask {
            _mm256_cmp_ps::<_CMP_UNORD_Q>(self, self)
        }
        #[inline(always)]
        unsafe fn or(a: Self::Mask, b: Self::Mask) -> Self::Mask {
            _mm256_or_ps(a, b)
        }
        #[inline(always)]
        unsafe fn any(m: Self::Mask) -> bool {
            _mm256_movemask_ps(m) != 0
        }
        #[inline(always)]
        unsafe fn select(m: Self::Mask, a: Self, b: Self) -> Self {
            _mm256_blendv_ps(a, b, m)
        }
    }

    impl Lanes for __m512 {
        type Mask = __mmask16;
        const N: usize = 16;
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            _mm512_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm512_storeu_ps(p, self) }
        }
        #[inline(always)]
        unsafe fn add(self, o: Self) -> Self {
            _mm512_add_ps(self, o)
        }
        #[inline(always)]
        unsafe fn sub(self, o: Self) -> Self {
            _mm512_sub_ps(self, o)
        }
        #[inline(always)]
        unsafe fn mul(self, o: Self) -> Self {
            _mm512_mul_ps(self, o)
        }
        #[inline(always)]
        unsafe fn div(self, o: Self) -> Self {
            _mm512_div_ps(self, o)
        }
        #[inline(always)]
        unsafe fn fma(self, b: Self, c: Self) -> Self {
            _mm512_fmadd_ps(self, b, c)
        }
        #[inline(always)]
        unsafe fn fnma(self, b: Self, c: Self) -> Self {
            _mm512_fnmadd_ps(self, b, c)
        }
        #[inline(always)]
        unsafe fn max(self, o: Self) -> Self {
            _mm512_max_ps(self, o)
        }
        #[inline(always)]
        unsafe fn min(self, o: Self) -> Self {
            _mm512_min_ps(self, o)
        }
        #[inline(always)]
        unsafe fn round(self) -> Self {
            _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self)
        }
        #[inline(always)]
        unsafe fn pow2(self) -> Self {
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
                _mm512_cvtps_epi32(self),
                _mm512_set1_epi32(127),
            )))
        }
        #[inline(always)]
        unsafe fn bits_and_or(self, m: u32, o: u32) -> Self {
            _mm512_castsi512_ps(_mm512_or_si512(
                _mm512_and_si512(_mm512_castps_si512(self), _mm512_set1_epi32(m as i32)),
                _mm512_set1_epi32(o as i32),
            ))
        }
        #[inline(always)]
        unsafe fn exponent(self) -> Self {
            let e = _mm512_srli_epi32::<23>(_mm512_and_si512(
                _mm512_castps_si512(self),
                _mm512_set1_epi32(0x7f80_0000),
            ));
            _mm512_cvtepi32_ps(_mm512_sub_epi32(e, _mm512_set1_epi32(126)))
        }
        #[inline(always)]
        unsafe fn gt(self, o: Self) -> Self::Mask {
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(self, o)
        }
        #[inline(always)]
        unsafe fn lt(self, o: Self) -> Self::Mask {
            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self, o)
        }
        #[inline(always)]
        unsafe fn eq(self, o: Self) -> Self::Mask {
            _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(self, o)
        }
        #[inline(always)]
        unsafe fn nge(self, o: Self) -> Self::Mask {
            _mm512_cmp_ps_mask::<_CMP_NGE_UQ>(self, o)
        }
        #[inline(always)]
        unsafe fn nan(self) -> Self::Mask {
            _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(self, self)
        }
        #[inline(always)]
        unsafe fn or(a: Self::Mask, b: Self::Mask) -> Self::Mask {
            a | b
        }
        #[inline(always)]
        unsafe fn any(m: Self::Mask) -> bool {
            m != 0
        }
        #[inline(always)]
        unsafe fn select(m: Self::Mask, a: Self, b: Self) -> Self {
            _mm512_mask_blend_ps(m, a, b)
        }
    }

    /// `exp` of every lane: the Cephes single-precision scheme (module note of
    /// [`super`]): `n = round(x·log2 e)`, `r = x − n·ln 2` in two parts, a
    /// degree-6 polynomial, times `2ⁿ`; `+∞` above 88.72, 0 below −103.97, the
    /// scalar `exp` between the clamp and those edges, NaN for NaN.
    #[inline(always)]
    pub(crate) unsafe fn exp<V: Lanes>(x: V) -> V {
        unsafe {
            // Clamp to where 2ⁿ stays a normal float; the edges are patched below.
            let xc = x.max(V::splat(-87.336_55)).min(V::splat(88.376_26));
            let n = xc.mul(V::splat(std::f32::consts::LOG2_E)).round();
            let r = n.fnma(V::splat(0.693_359_4), xc);
            let r = n.fnma(V::splat(-2.121_944_4e-4), r);
            let mut y = V::splat(1.987_569_1e-4);
            for c in [
                1.398_199_9e-3,
                8.333_452e-3,
                4.166_579_6e-2,
                0.166_666_65,
                0.5,
            ] {
                y = y.fma(r, V::splat(c));
            }
            let y = y.fma(r.mul(r), r.add(V::splat(1.0)));
            let mut out = y.mul(n.pow2());
            let outside = V::or(xc.lt(x), x.lt(xc));
            if V::any(outside) {
                // Rare (|x| > 87): the scalar exp there.
                let mut lanes = [0.0f32; 16];
                x.store(lanes.as_mut_ptr());
                lanes[..V::N].iter_mut().for_each(|v| *v = v.exp());
                out = V::select(outside, out, V::load(lanes.as_ptr()));
            }
            let out = V::select(x.gt(V::splat(88.722_84)), out, V::splat(f32::INFINITY));
            let out = V::select(x.lt(V::splat(-103.972_08)), out, V::splat(0.0));
            V::select(x.nan(), out, x)
        }
    }

    /// `σ(x) = 1 / (1 + exp(−x))` of every lane.
    #[inline(always)]
    pub(crate) unsafe fn sigmoid<V: Lanes>(x: V) -> V {
        unsafe {
            let one = V::splat(1.0);
            one.div(one.add(exp(V::splat(0.0).sub(x))))
        }
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

    /// `ln` of every lane: `x = m · 2^e` with `m` in `[√½, √2)` (subnormals
    /// scaled by 2²³ first), `ln x = e·ln 2 + ln m` by the Cephes polynomial;
    /// `−∞` at 0, NaN below 0 and for NaN, `+∞` at `+∞`.
    #[inline(always)]
    pub(crate) unsafe fn ln<V: Lanes>(x: V) -> V {
        unsafe {
            let tiny = x.lt(V::splat(f32::MIN_POSITIVE));
            let xs = V::select(tiny, x, x.mul(V::splat(8_388_608.0)));
            let e = xs.exponent();
            let e = V::select(tiny, e, e.sub(V::splat(23.0)));
            // The mantissa in [0.5, 1).
            let m = xs.bits_and_or(0x007f_ffff, 0x3f00_0000);
            let small = m.lt(V::splat(std::f32::consts::FRAC_1_SQRT_2));
            let e = V::select(small, e, e.sub(V::splat(1.0)));
            let m = V::select(small, m, m.add(m)).sub(V::splat(1.0));
            let z = m.mul(m);
            let mut y = V::splat(LN_POLY[0]);
            for &c in &LN_POLY[1..] {
                y = y.fma(m, V::splat(c));
            }
            let y = y.mul(m).mul(z);
            let y = e.fma(V::splat(-2.121_944_4e-4), y);
            let y = V::splat(0.5).fnma(z, y);
            let r = e.fma(V::splat(0.693_359_4), m.add(y));
            let r = V::select(x.eq(V::splat(0.0)), r, V::splat(f32::NEG_INFINITY));
            let r = V::select(x.nge(V::splat(0.0)), r, V::splat(f32::NAN));
            V::select(x.eq(V::splat(f32::INFINITY)), r, x)
        }
    }

    /// [`sigmoid`] of 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn sigmoid16(x: __m512) -> __m512 {
        unsafe { sigmoid(x) }
    }

    /// `x ← f(x)` for every value, `V::N` at a time, the tail through a
    /// register padded with `pad` (the same lane arithmetic).
    #[inline(always)]
    unsafe fn map<V: Lanes>(x: &mut [f32], pad: f32, f: impl Fn(V) -> V) {
        let n = x.len() / V::N * V::N;
        let p = x.as_mut_ptr();
        for i in (0..n).step_by(V::N) {
            // SAFETY: V::N values at i < n.
            unsafe { f(V::load(p.add(i))).store(p.add(i)) };
        }
        let tail = &mut x[n..];
        if !tail.is_empty() {
            let mut lanes = [pad; 16];
            lanes[..tail.len()].copy_from_slice(tail);
            // SAFETY: `lanes` holds 16 ≥ V::N values.
            unsafe { f(V::load(lanes.as_ptr())).store(lanes.as_mut_ptr()) };
            let k = tail.len();
            tail.copy_from_slice(&lanes[..k]);
        }
    }

    /// `z[i] ← f(d[i], z[i])` for every value, as [`map`].
    #[inline(always)]
    unsafe fn zip_map<V: Lanes>(z: &mut [f32], d: &[f32], f: impl Fn(V, V) -> V) {
        let n = z.len() / V::N * V::N;
        let p = z.as_mut_ptr();
        for i in (0..n).step_by(V::N) {
            // SAFETY: V::N values at i < n in both.
            unsafe { f(V::load(d.as_ptr().add(i)), V::load(p.add(i))).store(p.add(i)) };
        }
        let k = z.len() - n;
        if k > 0 {
            let (mut a, mut b) = ([0.0f32; 16], [0.0f32; 16]);
            a[..k].copy_from_slice(&d[n..]);
            b[..k].copy_from_slice(&z[n..]);
            // SAFETY: 16 ≥ V::N values each.
            unsafe { f(V::load(a.as_ptr()), V::load(b.as_ptr())).store(b.as_mut_ptr()) };
            z[n..].copy_from_slice(&b[..k]);
        }
    }

    /// `x[i] ← exp(x[i])`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp_slice(x: &mut [f32]) {
        unsafe { map(x, 0.0, |v: __m256| exp(v)) }
    }

    /// `x[i] ← exp(x[i])`, 16 lanes at a time.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(crate) unsafe fn exp_slice_512(x: &mut [f32]) {
        unsafe { map(x, 0.0, |v: __m512| exp(v)) }
    }

    /// `x[i] ← ln(x[i])`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn ln_slice(x: &mut [f32]) {
        unsafe { map(x, 1.0, |v: __m256| ln(v)) }
    }

    /// `x[i] ← ln(x[i])`, 16 lanes at a time.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(crate) unsafe fn ln_slice_512(x: &mut [f32]) {
        unsafe { map(x, 1.0, |v: __m512| ln(v)) }
    }

    /// `z[i] ← silu(d[i] · z[i])`; `d.len() == z.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn silu_of_product(z: &mut [f32], d: &[f32]) {
        unsafe {
            zip_map(z, d, |d: __m256, z| {
                let v = d.mul(z);
                v.mul(sigmoid(v))
            })
        }
    }

    /// `z[i] ← silu(d[i] · z[i])`, 16 lanes at a time.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(crate) unsafe fn silu_of_product_512(z: &mut [f32], d: &[f32]) {
        unsafe {
            zip_map(z, d, |d: __m512, z| {
                let v = d.mul(z);
                v.mul(sigmoid(v))
            })
        }
    }

    /// `o[i] ← o[i] · σ(g[i])`; `g.len() == o.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn gate(o: &mut [f32], g: &[f32]) {
        unsafe { zip_map(o, g, |g: __m256, o| o.mul(sigmoid(g))) }
    }

    /// `o[i] ← o[i] · σ(g[i])`, 16 lanes at a time.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(crate) unsafe fn gate_512(o: &mut [f32], g: &[f32]) {
        unsafe { zip_map(o, g, |g: __m512, o| o.mul(sigmoid(g))) }
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
