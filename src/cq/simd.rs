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

use crate::host::simd::CpuSimd;

/// A SIMD kernel choice for one matrix: lanes per vector (8 or 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) lanes: usize,
}

impl Plan {
    /// The kernel `k` would use for `bits`-bit codes in groups of `group_bytes`
    /// packed bytes, or `None` for the scalar path.
    pub(crate) fn choose(k: CpuSimd, bits: u32, group_bytes: usize) -> Option<Plan> {
        if !matches!(bits, 1 | 2 | 4) {
            return None;
        }
        match k {
            CpuSimd::Avx512 if group_bytes.is_multiple_of(64) => Some(Plan { lanes: 16 }),
            CpuSimd::Avx512 | CpuSimd::Avx2 if group_bytes.is_multiple_of(32) => {
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
/// [`Plan::choose`] with a variant of [`CpuSimd::available`]) and the slice
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
mod x86;
