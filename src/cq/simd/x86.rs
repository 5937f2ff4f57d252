//! The x86-64 row kernels (AVX2+FMA, AVX-512F) of the parent module.

// Index loops over small register arrays read clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]
use super::Rows;
use crate::host::simd::x86::hsum8;
use std::arch::x86_64::*;

/// The codebook repeated to `n` entries (`n` a multiple of its length).
fn repeated<const N: usize>(cb: &[f32]) -> [f32; N] {
    std::array::from_fn(|i| cb[i % cb.len()])
}

/// 16 lanes, `B ∈ {1, 2, 4}`: one `vpermps` per 16 codes.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn rows16<const B: u32>(r: &Rows<'_>, out: &mut [f32]) {
    let table = repeated::<16>(r.codebook);
    let cb = _mm512_loadu_ps(table.as_ptr());
    let c = 32 / B as usize;
    let gb = r.group * B as usize / 8;
    let blocks = gb / 64;
    let row_bytes = gb * r.groups;
    for (n, o) in out.iter_mut().enumerate() {
        let row = r.packed.as_ptr().add(n * row_bytes);
        let norms = &r.norms[n * r.groups..(n + 1) * r.groups];
        let mut acc = _mm512_setzero_ps();
        for (k, &norm) in norms.iter().enumerate() {
            let mut a0 = _mm512_setzero_ps();
            let mut a1 = _mm512_setzero_ps();
            for b in 0..blocks {
                let mut w = _mm512_loadu_si512(row.add(k * gb + b * 64) as *const _);
                let x = r.xp.as_ptr().add(k * r.group + b * 16 * c);
                let mut j = 0;
                while j < c {
                    let lv0 = _mm512_permutexvar_ps(w, cb);
                    a0 = _mm512_fmadd_ps(lv0, _mm512_loadu_ps(x.add(j * 16)), a0);
                    w = _mm512_srli_epi32::<B>(w);
                    let lv1 = _mm512_permutexvar_ps(w, cb);
                    a1 = _mm512_fmadd_ps(lv1, _mm512_loadu_ps(x.add(j * 16 + 16)), a1);
                    w = _mm512_srli_epi32::<B>(w);
                    j += 2;
                }
            }
            acc = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), _mm512_set1_ps(norm), acc);
        }
        *o = _mm512_reduce_add_ps(acc);
    }
}

/// Horizontal sums of four 8-lane vectors: `[Σa, Σb, Σc, Σd]`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum4x8(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    let t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t))
}

/// The permute tables of [`level8`] for a codebook of `2^B` levels: its two
/// halves for 16 levels, else the codebook repeated to 8 entries (twice).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn tables8<const B: i32>(codebook: &[f32]) -> (__m256, __m256) {
    if B == 4 {
        (
            _mm256_loadu_ps(codebook.as_ptr()),
            _mm256_loadu_ps(codebook.as_ptr().add(8)),
        )
    } else {
        let t = _mm256_loadu_ps(repeated::<8>(codebook).as_ptr());
        (t, t)
    }
}

/// Levels of the low bits of each lane: one permute for up to 8 entries
/// (`lo` holds the codebook repeated), two blended on bit 3 for 16 (`lo`, `hi`).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn level8<const B: i32>(lo: __m256, hi: __m256, w: __m256i) -> __m256 {
    if B == 4 {
        let sel = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(w));
        _mm256_blendv_ps(
            _mm256_permutevar8x32_ps(lo, w),
            _mm256_permutevar8x32_ps(hi, w),
            sel,
        )
    } else {
        _mm256_permutevar8x32_ps(lo, w)
    }
}

/// One group of `R` rows (`R` ∈ {1, 2}) against the permuted activation `x`:
/// the `R` unnormalised group dots, each in two FMA chains (even and odd codes)
/// so `2·R` independent chains hide the FMA latency, sharing each activation load.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn group8<const R: usize, const B: i32>(
    rows: [*const u8; R],
    x: *const f32,
    blocks: usize,
    lo: __m256,
    hi: __m256,
) -> [__m256; R] {
    let c = 32 / B as usize;
    let mut even = [_mm256_setzero_ps(); R];
    let mut odd = [_mm256_setzero_ps(); R];
    for b in 0..blocks {
        let mut w = [_mm256_setzero_si256(); R];
        for i in 0..R {
            w[i] = _mm256_loadu_si256(rows[i].add(b * 32) as *const __m256i);
        }
        let xb = x.add(b * 8 * c);
        for j in (0..c).step_by(2) {
            let x0 = _mm256_loadu_ps(xb.add(j * 8));
            let x1 = _mm256_loadu_ps(xb.add(j * 8 + 8));
            for i in 0..R {
                even[i] = _mm256_fmadd_ps(level8::<B>(lo, hi, w[i]), x0, even[i]);
                w[i] = _mm256_srli_epi32::<B>(w[i]);
                odd[i] = _mm256_fmadd_ps(level8::<B>(lo, hi, w[i]), x1, odd[i]);
                w[i] = _mm256_srli_epi32::<B>(w[i]);
            }
        }
    }
    for i in 0..R {
        even[i] = _mm256_add_ps(even[i], odd[i]);
    }
    even
}

/// One group of one row against `T` tokens' permuted activations: per token
/// exactly the even/odd FMA chains of [`group8`] (so the sums are the same
/// bits), each level vector decoded once for all `T` tokens.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn group8_tokens<const T: usize, const B: i32>(
    row: *const u8,
    xs: [*const f32; T],
    blocks: usize,
    lo: __m256,
    hi: __m256,
) -> [__m256; T] {
    let c = 32 / B as usize;
    let mut even = [_mm256_setzero_ps(); T];
    let mut odd = [_mm256_setzero_ps(); T];
    for b in 0..blocks {
        let mut w = _mm256_loadu_si256(row.add(b * 32) as *const __m256i);
        for j in (0..c).step_by(2) {
            let lv0 = level8::<B>(lo, hi, w);
            w = _mm256_srli_epi32::<B>(w);
            let lv1 = level8::<B>(lo, hi, w);
            w = _mm256_srli_epi32::<B>(w);
            let at = b * 8 * c + j * 8;
            for t in 0..T {
                even[t] = _mm256_fmadd_ps(lv0, _mm256_loadu_ps(xs[t].add(at)), even[t]);
                odd[t] = _mm256_fmadd_ps(lv1, _mm256_loadu_ps(xs[t].add(at + 8)), odd[t]);
            }
        }
    }
    for t in 0..T {
        even[t] = _mm256_add_ps(even[t], odd[t]);
    }
    even
}

/// The batched twin of [`rows8`]: rows `0 .. rows` for `T` tokens whose
/// activations start `padded` floats apart at `xp`, row `i` of token `t` going
/// to `out[t·stride + i]`. Every (row, token) gets the operations `rows8`
/// gives that row for that token alone (its block-of-4 or tail reduction),
/// so the values are the same bits.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows8_tokens<const B: i32, const T: usize>(
    r: &Rows<'_>,
    xp: &[f32],
    padded: usize,
    rows: usize,
    out: *mut f32,
    stride: usize,
) {
    let (lo, hi) = tables8::<B>(r.codebook);
    let gb = r.group * B as usize / 8;
    let blocks = gb / 32;
    let row_bytes = gb * r.groups;
    let g = r.groups;
    let base = r.packed.as_ptr();
    let x0 = xp.as_ptr();
    let mut n = 0;
    // Rows of whole blocks of 4: `rows8` reduces each row's group sum as lane
    // `i` of `hsum4x8` (a per-row order: ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7)))
    // and accumulates `fma(sum, norm, acc)`; here lane `t` holds token `t`, so
    // each row is finished before the next with the same operations.
    let zero = _mm256_setzero_ps();
    while n + 4 <= rows {
        for i in n..n + 4 {
            let mut acc = _mm_setzero_ps();
            for k in 0..g {
                let xs: [*const f32; T] = std::array::from_fn(|t| x0.add(t * padded + k * r.group));
                let v = group8_tokens::<T, B>(base.add(i * row_bytes + k * gb), xs, blocks, lo, hi);
                let at = |t: usize| if t < T { v[t] } else { zero };
                let sum = hsum4x8(at(0), at(1), at(2), at(3));
                acc = _mm_fmadd_ps(sum, _mm_set1_ps(r.norms[i * g + k]), acc);
            }
            let mut lanes = [0.0f32; 4];
            _mm_storeu_ps(lanes.as_mut_ptr(), acc);
            for (t, &v) in lanes.iter().enumerate().take(T) {
                *out.add(t * stride + i) = v;
            }
        }
        n += 4;
    }
    while n < rows {
        let mut acc = [_mm256_setzero_ps(); T];
        for k in 0..g {
            let xs: [*const f32; T] = std::array::from_fn(|t| x0.add(t * padded + k * r.group));
            let row = base.add(n * row_bytes + k * gb);
            let v = group8_tokens::<T, B>(row, xs, blocks, lo, hi);
            let nk = _mm256_set1_ps(r.norms[n * g + k]);
            for t in 0..T {
                acc[t] = _mm256_fmadd_ps(v[t], nk, acc[t]);
            }
        }
        for t in 0..T {
            *out.add(t * stride + n) = hsum8(acc[t]);
        }
        n += 1;
    }
}

/// 8 lanes, `B ∈ {1, 2, 4}`, four rows at a time (two pairs), then single rows.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows8<const B: i32>(r: &Rows<'_>, out: &mut [f32]) {
    let (lo, hi) = tables8::<B>(r.codebook);
    let gb = r.group * B as usize / 8;
    let blocks = gb / 32;
    let row_bytes = gb * r.groups;
    let g = r.groups;
    let base = r.packed.as_ptr();
    let mut n = 0;
    while n + 4 <= out.len() {
        let mut acc = _mm_setzero_ps();
        for k in 0..g {
            let x = r.xp.as_ptr().add(k * r.group);
            let at = |i: usize| base.add((n + i) * row_bytes + k * gb);
            let [a, b] = group8::<2, B>([at(0), at(1)], x, blocks, lo, hi);
            let [c, d] = group8::<2, B>([at(2), at(3)], x, blocks, lo, hi);
            let nr = _mm_setr_ps(
                r.norms[n * g + k],
                r.norms[(n + 1) * g + k],
                r.norms[(n + 2) * g + k],
                r.norms[(n + 3) * g + k],
            );
            acc = _mm_fmadd_ps(hsum4x8(a, b, c, d), nr, acc);
        }
        _mm_storeu_ps(out.as_mut_ptr().add(n), acc);
        n += 4;
    }
    while n < out.len() {
        let mut acc = _mm256_setzero_ps();
        for k in 0..g {
            let row = [base.add(n * row_bytes + k * gb)];
            let x = r.xp.as_ptr().add(k * r.group);
            let [a] = group8::<1, B>(row, x, blocks, lo, hi);
            acc = _mm256_fmadd_ps(a, _mm256_set1_ps(r.norms[n * g + k]), acc);
        }
        out[n] = hsum8(acc);
        n += 1;
    }
}
