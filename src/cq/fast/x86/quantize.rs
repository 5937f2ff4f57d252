//! The fast input's quantization to int8 blocks on AVX-512 and AVX2 (the
//! scalar loop of [`FastInput::quantize`](super::super::FastInput::quantize) is the reference).

use super::super::BLOCK;
use std::arch::x86_64::*;

/// [`FastInput::quantize`](super::super::FastInput::quantize)'s blocks with AVX-512 or AVX2 (the same maximum,
/// division, rounding to nearest even and clamp as the scalar loop, so the
/// same codes and scales); `false` if this CPU has neither.
pub(in crate::cq::fast) fn quantize(
    prep: &[f32],
    q: &mut [i8],
    scales: &mut [f32],
    bias: &mut [i32],
) -> bool {
    use crate::host::simd::CpuSimd;
    match CpuSimd::selected() {
        // SAFETY: the selected level implies the features.
        CpuSimd::Avx512 => unsafe { quantize_512(prep, q, scales, bias) },
        CpuSimd::Avx2 => unsafe { quantize_avx2(prep, q, scales, bias) },
        CpuSimd::Scalar => return false,
    }
    true
}

/// One block's scale from the maximum of its absolute values (no NaN: `max`
/// keeps its second operand, the running maximum, when the first is NaN), or
/// NaN when the block holds one.
#[inline(always)]
fn block_scale(max: f32, nan: bool) -> f32 {
    if nan {
        f32::NAN
    } else {
        max / 127.0
    }
}

/// Lane `j` of the result: the `MAX`imum (else the integer sum, `v` then
/// holding i32 lanes) of the 16 lanes of `v[j]`. A tree over the 16 registers
/// (each step halves the lanes per register and pairs the registers), then one
/// permutation to the natural order.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce16<const MAX: bool>(v: [__m512; 16]) -> __m512 {
    let op = |a: __m512, b: __m512| {
        if MAX {
            _mm512_max_ps(a, b)
        } else {
            _mm512_castsi512_ps(_mm512_add_epi32(
                _mm512_castps_si512(a),
                _mm512_castps_si512(b),
            ))
        }
    };
    // 128-bit lanes 0|2 and 1|3 of registers 2k and 2k+1.
    let mut x = [_mm512_setzero_ps(); 8];
    for (k, xk) in x.iter_mut().enumerate() {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        *xk = op(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        );
    }
    // 128-bit lane c of y[k] holds register 4k + c's 4 partials.
    let mut y = [_mm512_setzero_ps(); 4];
    for (k, yk) in y.iter_mut().enumerate() {
        let (a, b) = (x[2 * k], x[2 * k + 1]);
        *yk = op(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        );
    }
    let z0 = op(
        _mm512_unpacklo_ps(y[0], y[1]),
        _mm512_unpackhi_ps(y[0], y[1]),
    );
    let z1 = op(
        _mm512_unpacklo_ps(y[2], y[3]),
        _mm512_unpackhi_ps(y[2], y[3]),
    );
    let (z0, z1) = (_mm512_castps_pd(z0), _mm512_castps_pd(z1));
    // Lane 4c + j holds register c + 4j.
    let w = op(
        _mm512_castpd_ps(_mm512_unpacklo_pd(z0, z1)),
        _mm512_castpd_ps(_mm512_unpackhi_pd(z0, z1)),
    );
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, w)
}

/// `v / s`, correctly rounded as the division rounds it, from `y`, the
/// correctly rounded `1 / s`, in three multiply-adds instead of a division
/// (Markstein's theorem: `q = v·y` is within an ulp of `v / s`, the remainder
/// `r = v − s·q` is exact in one fused multiply-add, and `q + r·y` rounded
/// once is the correctly rounded quotient). Tiny quotients of subnormal `v`
/// may differ in their last bits; they round to code 0 alike.
#[inline]
#[target_feature(enable = "avx512f")]
fn quotient(v: __m512, s: __m512, y: __m512) -> __m512 {
    let q = _mm512_mul_ps(v, y);
    let r = _mm512_fnmadd_ps(s, q, v);
    _mm512_fmadd_ps(r, y, q)
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_512(prep: &[f32], q: &mut [i8], scales: &mut [f32], bias: &mut [i32]) {
    let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    let tiny = _mm512_set1_ps(1e-12);
    let blocks = prep.len() / BLOCK;
    // 16 blocks at a time: their maxima and sums reduced together.
    let whole = blocks / 16 * 16;
    for b0 in (0..whole).step_by(16) {
        // SAFETY (the block): 16 blocks of 32 values in, of codes out.
        unsafe {
            let x = prep.as_ptr().add(b0 * BLOCK);
            let mut m = [tiny; 16];
            let mut nan = 0u32;
            for (k, mk) in m.iter_mut().enumerate() {
                let v0 = _mm512_loadu_ps(x.add(k * BLOCK));
                let v1 = _mm512_loadu_ps(x.add(k * BLOCK + 16));
                // `max` keeps its second operand, the running maximum, on NaN.
                *mk = _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), tiny));
                let bad = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v0, v0)
                    | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v1, v1);
                nan |= u32::from(bad != 0) << k;
            }
            let max = reduce16::<true>(m);
            let scale = _mm512_div_ps(max, _mm512_set1_ps(127.0));
            _mm512_storeu_ps(scales.as_mut_ptr().add(b0), scale);
            // Every block's reciprocal scale, one division for 16 blocks.
            let inv = _mm512_div_ps(_mm512_set1_ps(1.0), scale);
            let mut invs = [0.0f32; 16];
            _mm512_storeu_ps(invs.as_mut_ptr(), inv);
            // Every block finite (the usual case): |v| ≤ max and the scale is
            // max / 127 correctly rounded, so every quotient rounds to at most
            // 127 in magnitude: the codes need neither the clamp nor the NaN
            // mask, and the conversion itself rounds to nearest even. The same
            // codes either way.
            let inf = _mm512_set1_ps(f32::INFINITY);
            let finite = nan == 0 && _mm512_cmp_ps_mask::<_CMP_LT_OQ>(max, inf) == u16::MAX;
            let mut sums = [_mm512_setzero_ps(); 16];
            for (k, sk) in sums.iter_mut().enumerate() {
                let s = _mm512_set1_ps(*scales.get_unchecked(b0 + k));
                let y = _mm512_set1_ps(invs[k]);
                let mut t = _mm512_setzero_si512();
                for h in 0..2 {
                    let v = _mm512_loadu_ps(x.add(k * BLOCK + 16 * h));
                    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
                    let c = if finite {
                        _mm512_cvt_roundps_epi32::<NEAREST>(quotient(v, s, y))
                    } else {
                        let r = _mm512_roundscale_ps::<NEAREST>(quotient(v, s, y));
                        let r = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
                        // A NaN's code is 0, as `as i8` gives.
                        let r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r), r);
                        _mm512_cvtps_epi32(r)
                    };
                    let dst = q.as_mut_ptr().add((b0 + k) * BLOCK + 16 * h);
                    _mm_storeu_si128(dst as *mut __m128i, _mm512_cvtepi32_epi8(c));
                    t = _mm512_add_epi32(t, c);
                }
                *sk = _mm512_castsi512_ps(t);
            }
            let sum = _mm512_castps_si512(reduce16::<false>(sums));
            let b = _mm512_mullo_epi32(sum, _mm512_set1_epi32(-128));
            _mm512_storeu_si512(bias.as_mut_ptr().add(b0) as *mut __m512i, b);
            if nan != 0 {
                for k in 0..16 {
                    if nan >> k & 1 == 1 {
                        scales[b0 + k] = f32::NAN;
                    }
                }
            }
        }
    }
    // The rest block by block.
    for (b, (x, c)) in prep
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .enumerate()
        .skip(whole)
    {
        // SAFETY: 32 values in, 32 codes out.
        unsafe {
            let v0 = _mm512_loadu_ps(x.as_ptr());
            let v1 = _mm512_loadu_ps(x.as_ptr().add(16));
            let m = _mm512_max_ps(_mm512_abs_ps(v0), tiny);
            let m = _mm512_max_ps(_mm512_abs_ps(v1), m);
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v0, v0)
                | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v1, v1);
            let max = _mm512_reduce_max_ps(m);
            let scale = max / 127.0;
            let s = _mm512_set1_ps(scale);
            let code = |v: __m512| {
                let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm512_div_ps(v, s),
                );
                // Operand order keeps a NaN; cvtps of NaN is i32::MIN, whose
                // low byte (what vpmovdb keeps) is 0, as `as i8` gives.
                _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, r))))
            };
            let (c0, c1) = (code(v0), code(v1));
            _mm_storeu_si128(c.as_mut_ptr() as *mut __m128i, c0);
            _mm_storeu_si128(c.as_mut_ptr().add(16) as *mut __m128i, c1);
            let sum = _mm512_add_epi32(_mm512_cvtepi8_epi32(c0), _mm512_cvtepi8_epi32(c1));
            bias[b] = -128 * _mm512_reduce_add_epi32(sum);
            scales[b] = block_scale(max, nan != 0);
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(prep: &[f32], q: &mut [i8], scales: &mut [f32], bias: &mut [i32]) {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    for (b, (x, c)) in prep
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        // SAFETY: 32 values in, 32 codes out.
        unsafe {
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
            let mut m = _mm256_set1_ps(1e-12);
            let mut nan = _mm256_setzero_ps();
            for &v in &v {
                m = _mm256_max_ps(_mm256_and_ps(v, abs), m);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let max = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
            let scale = max / 127.0;
            let s = _mm256_set1_ps(scale);
            let mut codes = [_mm256_setzero_si256(); 4];
            for (o, &v) in codes.iter_mut().zip(&v) {
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_div_ps(v, s),
                );
                let i = _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, r)));
                // NaN converts to i32::MIN: its code is 0, as `as i8` gives.
                let is_min = _mm256_cmpeq_epi32(i, _mm256_set1_epi32(i32::MIN));
                *o = _mm256_andnot_si256(is_min, i);
            }
            // 32 i32 in [-127, 127] → 32 i8 in order.
            let w0 = _mm256_packs_epi32(codes[0], codes[1]);
            let w1 = _mm256_packs_epi32(codes[2], codes[3]);
            let bytes = _mm256_packs_epi16(w0, w1);
            let bytes =
                _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(c.as_mut_ptr() as *mut __m256i, bytes);
            let sum = _mm256_add_epi32(
                _mm256_add_epi32(codes[0], codes[1]),
                _mm256_add_epi32(codes[2], codes[3]),
            );
            let s4 = _mm_add_epi32(
                _mm256_castsi256_si128(sum),
                _mm256_extracti128_si256::<1>(sum),
            );
            let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b01_00_11_10>(s4));
            let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<0b10_11_00_01>(s2));
            bias[b] = -128 * _mm_cvtsi128_si32(s1);
            scales[b] = block_scale(max, _mm256_movemask_ps(nan) != 0);
        }
    }
}
