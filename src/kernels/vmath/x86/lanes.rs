//! [`Lanes`]: a register of 8 (`__m256`) or 16 (`__m512`) f32 lanes and the
//! operations the vector math of [`super`] is written over, each IEEE per lane.

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
