//! SIMD row kernels of the CQ matvec (x86-64 AVX2+FMA and AVX-512F), chosen at
//! run time, with the scalar LUT loops of `matrix.rs` as the fallback and check.
//!
//! # The idea
//!
//! A packed row is read as 32-bit words; word `i` of a block holds `C = 32 / bits`
//! codes, code `j` (bits `j·bits ..`) being column `C·i + j` of the block. With `L`
//! words in a vector register (8 for AVX2, 16 for AVX-512), shifting the whole
//! register right by `j·bits` puts code `j` of every word in the low bits of its
//! lane, and a *register permute* with the codebook as the table
//! (`vpermps`: lanes are indexed by the low 3 or 4 bits) turns those codes into
//! levels, with no per-code memory load. The prepared activation is permuted once
//! per call into the matching order (`xp[j·L + i] = prep[C·i + j]` inside each block
//! of `L·C` columns), so each level vector meets its activations with one FMA.
//!
//! Codebooks of 2 or 4 entries are repeated to fill the permute table (the upper
//! index bits of a lane then don't matter); 16-entry codebooks on AVX2 take two
//! 8-entry permutes and a blend on bit 3. 8-bit codebooks stay on the scalar path.
//!
//! A block must not straddle groups (norms are per group), so a kernel applies
//! when a group's packed bytes are a multiple of the block's (`4·L`): AVX-512
//! needs 64 bytes per group (4-bit group ≥ 128, 2-bit ≥ 256, 1-bit ≥ 512), AVX2
//! 32 bytes (4-bit ≥ 64, 2-bit ≥ 128, 1-bit ≥ 256); others use the scalar path.

use std::sync::OnceLock;

/// Which row kernels the CPU matvec uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuKernels {
    /// The portable loops (byte lookup tables for 2 and 4 bits): the reference.
    Scalar,
    /// 8-lane AVX2 + FMA permute kernels.
    Avx2,
    /// 16-lane AVX-512F permute kernels (8-lane AVX2 where a group is too narrow).
    Avx512,
}

impl CpuKernels {
    /// Every variant this CPU can run, the scalar one first (detected once per process).
    pub fn available() -> &'static [CpuKernels] {
        static AVAIL: OnceLock<Vec<CpuKernels>> = OnceLock::new();
        AVAIL.get_or_init(|| {
            let mut v = vec![CpuKernels::Scalar];
            #[cfg(target_arch = "x86_64")]
            {
                let avx2 = std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma");
                if avx2 {
                    v.push(CpuKernels::Avx2);
                    if std::arch::is_x86_feature_detected!("avx512f") {
                        v.push(CpuKernels::Avx512);
                    }
                }
            }
            v
        })
    }

    /// The variant the engines use: the best available, unless the environment
    /// variable `CQLM_CPU_KERNELS` names one (`scalar`, `avx2`, `avx512`; a variant
    /// this CPU lacks falls back to the best it has). Decided once per process.
    pub fn selected() -> CpuKernels {
        static SEL: OnceLock<CpuKernels> = OnceLock::new();
        *SEL.get_or_init(|| {
            let avail = CpuKernels::available();
            let best = *avail.last().unwrap_or(&CpuKernels::Scalar);
            let want = match std::env::var("CQLM_CPU_KERNELS").as_deref() {
                Ok("scalar") => Some(CpuKernels::Scalar),
                Ok("avx2") => Some(CpuKernels::Avx2),
                Ok("avx512") => Some(CpuKernels::Avx512),
                _ => None,
            };
            match want {
                Some(w) if avail.contains(&w) => w,
                _ => best,
            }
        })
    }

    /// Lowercase name (`scalar`, `avx2`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            CpuKernels::Scalar => "scalar",
            CpuKernels::Avx2 => "avx2",
            CpuKernels::Avx512 => "avx512",
        }
    }
}

/// A SIMD kernel choice for one matrix: lanes per vector (8 or 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) lanes: usize,
}

impl Plan {
    /// The kernel `k` would use for `bits`-bit codes in groups of `group_bytes`
    /// packed bytes, or `None` for the scalar path.
    pub(crate) fn choose(k: CpuKernels, bits: u32, group_bytes: usize) -> Option<Plan> {
        if !matches!(bits, 1 | 2 | 4) {
            return None;
        }
        match k {
            CpuKernels::Avx512 if group_bytes.is_multiple_of(64) => Some(Plan { lanes: 16 }),
            CpuKernels::Avx512 | CpuKernels::Avx2 if group_bytes.is_multiple_of(32) => {
                Some(Plan { lanes: 8 })
            }
            _ => None,
        }
    }

    /// Permute a prepared activation into this kernel's order: within each block of
    /// `lanes · C` columns (`C = 32 / bits`), `xp[j·lanes + i] = prep[C·i + j]`.
    pub(crate) fn permute(self, bits: u32, prep: &[f32], xp: &mut Vec<f32>) {
        xp.clear();
        xp.resize(prep.len(), 0.0);
        self.permute_into(bits, prep, xp);
    }

    /// [`Plan::permute`] into a slice of `prep.len()` values.
    pub(crate) fn permute_into(self, bits: u32, prep: &[f32], xp: &mut [f32]) {
        let c = 32 / bits as usize;
        let l = self.lanes;
        let block = l * c;
        debug_assert_eq!(prep.len(), xp.len());
        for (src, dst) in prep.chunks_exact(block).zip(xp.chunks_exact_mut(block)) {
            for i in 0..l {
                for j in 0..c {
                    dst[j * l + i] = src[c * i + j];
                }
            }
        }
    }
}

/// The inputs of one run of rows.
pub(crate) struct Rows<'a> {
    /// Codebook (2, 4 or 16 levels).
    pub(crate) codebook: &'a [f32],
    /// Packed rows, `row_bytes` each, starting at the first row to compute.
    pub(crate) packed: &'a [u8],
    /// Norms, `groups` per row, starting at the first row.
    pub(crate) norms: &'a [f32],
    /// Activation permuted by [`Plan::permute`].
    pub(crate) xp: &'a [f32],
    pub(crate) bits: u32,
    pub(crate) group: usize,
    pub(crate) groups: usize,
}

/// Compute `out.len()` consecutive rows with the kernel of `plan`.
///
/// The caller guarantees the CPU has the plan's features (a plan comes only from
/// [`Plan::choose`] with a variant of [`CpuKernels::available`]) and the slice
/// lengths (`packed`: `out.len()·groups·group·bits/8`, `norms`: `out.len()·groups`,
/// `xp`: `groups·group`).
pub(crate) fn rows(plan: Plan, r: &Rows<'_>, out: &mut [f32]) {
    let gb = r.group * r.bits as usize / 8;
    assert!(
        r.packed.len() >= out.len() * r.groups * gb,
        "simd rows: packed"
    );
    assert!(r.norms.len() >= out.len() * r.groups, "simd rows: norms");
    assert!(r.xp.len() >= r.groups * r.group, "simd rows: activation");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the plan was chosen for a variant whose features were detected at
    // run time, and the slice lengths were checked above.
    unsafe {
        match (plan.lanes, r.bits) {
            (16, 4) => x86::rows16::<4>(r, out),
            (16, 2) => x86::rows16::<2>(r, out),
            (16, 1) => x86::rows16::<1>(r, out),
            (8, 4) => x86::rows8::<4>(r, out),
            (8, 2) => x86::rows8::<2>(r, out),
            (8, 1) => x86::rows8::<1>(r, out),
            _ => unreachable!("no SIMD kernel for {plan:?} at {} bits", r.bits),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (plan, out);
        unreachable!("SIMD kernels exist only on x86-64");
    }
}

/// Compute rows `0 .. rows` of one run (as [`rows`]) for `tokens` activations at
/// once, each decoded weight vector serving up to four tokens: `xp` holds the
/// tokens' permuted activations one after another (`groups·group` each), and
/// row `i` of token `t` goes to `out[t·stride + i]`.
///
/// Every (row, token) result is **bit-identical** to what [`rows`] computes for
/// that token alone: each keeps its own pair of FMA chains and the same
/// reductions, so a batched prefill gives exactly the logits of repeated steps.
/// Only the 8-lane plan has a batched kernel; the caller runs others per token.
///
/// The caller guarantees what [`rows`] needs, for `rows` rows, plus
/// `xp.len() >= tokens·groups·group` and `out.len() >= (tokens−1)·stride + rows`.
pub(crate) fn rows_batch(
    plan: Plan,
    r: &Rows<'_>,
    rows: usize,
    tokens: usize,
    out: &mut [f32],
    stride: usize,
) {
    let gb = r.group * r.bits as usize / 8;
    let padded = r.groups * r.group;
    assert_eq!(plan.lanes, 8, "simd rows_batch: 8-lane plans only");
    assert!(
        r.packed.len() >= rows * r.groups * gb,
        "simd rows_batch: packed"
    );
    assert!(r.norms.len() >= rows * r.groups, "simd rows_batch: norms");
    assert!(
        r.xp.len() >= tokens * padded,
        "simd rows_batch: activations"
    );
    assert!(
        tokens == 0 || (rows <= stride && out.len() >= (tokens - 1) * stride + rows),
        "simd rows_batch: output"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `rows`; the output bounds were checked above.
    unsafe {
        let mut t = 0;
        while t < tokens {
            let n = (tokens - t).min(4);
            let xp = &r.xp[t * padded..];
            let o = out[t * stride..].as_mut_ptr();
            match (n, r.bits) {
                (4, 4) => x86::rows8_tokens::<4, 4>(r, xp, padded, rows, o, stride),
                (4, 2) => x86::rows8_tokens::<2, 4>(r, xp, padded, rows, o, stride),
                (4, 1) => x86::rows8_tokens::<1, 4>(r, xp, padded, rows, o, stride),
                (2 | 3, 4) => x86::rows8_tokens::<4, 2>(r, xp, padded, rows, o, stride),
                (2 | 3, 2) => x86::rows8_tokens::<2, 2>(r, xp, padded, rows, o, stride),
                (2 | 3, 1) => x86::rows8_tokens::<1, 2>(r, xp, padded, rows, o, stride),
                (_, 4) => x86::rows8_tokens::<4, 1>(r, xp, padded, rows, o, stride),
                (_, 2) => x86::rows8_tokens::<2, 1>(r, xp, padded, rows, o, stride),
                (_, 1) => x86::rows8_tokens::<1, 1>(r, xp, padded, rows, o, stride),
                _ => unreachable!("no batched SIMD kernel at {} bits", r.bits),
            }
            t += if n == 3 { 2 } else { n };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (out, stride, tokens, rows);
        unreachable!("SIMD kernels exist only on x86-64");
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    // Index loops over small register arrays read clearer than iterator chains here.
    #![allow(clippy::needless_range_loop)]
    use super::Rows;
    use crate::kernels::vmath::x86::hsum8;
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
                    let xs: [*const f32; T] =
                        std::array::from_fn(|t| x0.add(t * padded + k * r.group));
                    let v =
                        group8_tokens::<T, B>(base.add(i * row_bytes + k * gb), xs, blocks, lo, hi);
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
}
