//! The CQ matvec's dispatch: the SIMD row kernels where the CPU has them (else
//! the scalar loops of `scalar.rs`), rows split across the pool's threads, and the
//! batched kernel's input layout for several tokens at once.

use super::matrix::CqMatrix;
use super::simd::{self, Plan};
use crate::host::pool::{Pool, SharedSlice};
use crate::host::simd::CpuSimd;

/// How the batched kernel wants a chunk's inputs (several tokens through one
/// pass over the rows): each prepared input permuted for an 8-lane plan at a
/// bit width (see [`CqMatrix::chunk_layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkLayout {
    plan: Plan,
    bits: u32,
}

impl ChunkLayout {
    /// Lay out prepared inputs (`[tokens, padded]`) into `dst` (the same length).
    pub(crate) fn lay_out(&self, preps: &[f32], dst: &mut [f32]) {
        self.plan.permute_into(self.bits, preps, dst);
    }
}

/// The inputs of a chunk's matvec (its tokens' prepared inputs, `[tokens, padded]`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum ChunkIn<'a> {
    /// Prepared inputs, `[tokens, padded]`.
    Prepared(&'a [f32]),
    /// Prepared inputs laid out by [`ChunkLayout::lay_out`].
    LaidOut(&'a [f32]),
}

thread_local! {
    /// The prepared activation in the SIMD kernels' order (reused between calls).
    static PERMUTED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Packed rows at or above this many bytes in one call are split across threads
/// (a hand-out costs about a microsecond; 16 KiB of 2-bit rows take several).
const PARALLEL_BYTES: usize = 1 << 14;

impl CqMatrix {
    /// Rows `first .. first + out.len()` of `P · x` for an input already prepared for
    /// this matrix's group (`prep.len() == padded`), with the CPU's best row
    /// kernels ([`CpuSimd::selected`]).
    ///
    /// # Panics
    /// If `prep.len() != padded` or the rows run past `rows`.
    pub fn matvec_rows_prepared(&self, prep: &[f32], first: usize, out: &mut [f32]) {
        self.matvec_rows_prepared_with(CpuSimd::selected(), prep, first, out);
    }

    /// [`CqMatrix::matvec_rows_prepared`] at the given SIMD level (for tests and
    /// benchmarks that compare them; a variant this CPU lacks runs the scalar path).
    ///
    /// # Panics
    /// As [`CqMatrix::matvec_rows_prepared`].
    pub fn matvec_rows_prepared_with(
        &self,
        simd: CpuSimd,
        prep: &[f32],
        first: usize,
        out: &mut [f32],
    ) {
        assert_eq!(prep.len(), self.padded(), "matvec: prepared input length");
        assert!(first + out.len() <= self.rows, "matvec: rows out of range");
        let simd = if CpuSimd::available().contains(&simd) {
            simd
        } else {
            CpuSimd::Scalar
        };
        let gb = self.group * self.bits as usize / 8;
        match Plan::choose(simd, self.bits, gb) {
            None => self.split_rows(first, out, |f, o| self.rows_into(prep, f, o)),
            Some(plan) => PERMUTED.with(|cell| {
                let mut own = Vec::new();
                let mut guard = cell.try_borrow_mut();
                let xp = match guard.as_mut() {
                    Ok(v) => &mut **v,
                    Err(_) => &mut own,
                };
                plan.permute(self.bits, prep, xp);
                let xp = &*xp;
                let rb = self.row_bytes();
                self.split_rows(first, out, |f, o| {
                    let r = simd::Rows {
                        codebook: &self.codebook,
                        packed: &self.packed[f * rb..(f + o.len()) * rb],
                        norms: &self.norms[f * self.groups..(f + o.len()) * self.groups],
                        xp,
                        bits: self.bits,
                        group: self.group,
                        groups: self.groups,
                    };
                    simd::rows(plan, &r, o);
                });
            }),
        }
    }

    /// Rows `first .. first + count` of `P · x_t` for `tokens` inputs at once, with
    /// the CPU's best row kernels: `preps` holds the prepared inputs one after
    /// another (`tokens × padded`), and `out` receives `tokens × count` values,
    /// token-major (`out[t·count + i]` is row `first + i` for input `t`).
    ///
    /// Each value is bit-identical to what [`CqMatrix::matvec_rows_prepared`]
    /// gives for that input alone; the chunk's tokens only share work (an 8-lane SIMD
    /// pass decodes each weight vector once for up to four inputs).
    ///
    /// # Panics
    /// If `preps.len() != tokens · padded`, `out.len() != tokens · count` or the
    /// rows run past `rows`.
    pub fn matmul_rows_prepared(
        &self,
        preps: &[f32],
        tokens: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    ) {
        self.matmul_rows_prepared_with(CpuSimd::selected(), preps, tokens, first, count, out);
    }

    /// [`CqMatrix::matmul_rows_prepared`] at the given SIMD level (bit-identical
    /// to [`CqMatrix::matvec_rows_prepared_with`] per input at the same SIMD level).
    ///
    /// # Panics
    /// As [`CqMatrix::matmul_rows_prepared`].
    pub fn matmul_rows_prepared_with(
        &self,
        simd: CpuSimd,
        preps: &[f32],
        tokens: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    ) {
        let lay = self.chunk_layout(simd, tokens);
        self.matmul_rows_in(
            simd,
            ChunkIn::Prepared(preps),
            lay,
            tokens,
            first,
            count,
            out,
        );
    }

    /// The activation layout of the batched kernel for `tokens` inputs under
    /// `simd`, or `None` when the inputs run one at a time: the batched kernel
    /// pays when every pool thread gets whole passes of 4 inputs.
    pub(crate) fn chunk_layout(&self, simd: CpuSimd, tokens: usize) -> Option<ChunkLayout> {
        if !CpuSimd::available().contains(&simd) {
            return None;
        }
        let gb = self.group * self.bits as usize / 8;
        let plan = Plan::choose(simd, self.bits, gb).filter(|p| p.lanes == 8)?;
        (tokens >= 4 * Pool::global().threads()).then_some(ChunkLayout {
            plan,
            bits: self.bits,
        })
    }

    /// The batched matvec of `tokens` inputs given prepared (`[tokens, padded]`)
    /// or already laid out for `lay` (the value of [`CqMatrix::chunk_layout`] for
    /// this SIMD level and these tokens, which the caller passes along).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul_rows_in(
        &self,
        simd: CpuSimd,
        input: ChunkIn<'_>,
        lay: Option<ChunkLayout>,
        tokens: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    ) {
        let padded = self.padded();
        let xs = match input {
            ChunkIn::Prepared(x) | ChunkIn::LaidOut(x) => x,
        };
        assert_eq!(xs.len(), tokens * padded, "matmul: inputs length");
        assert_eq!(out.len(), tokens * count, "matmul: output length");
        assert!(first + count <= self.rows, "matmul: rows out of range");
        assert_eq!(lay, self.chunk_layout(simd, tokens), "matmul: layout");
        let simd = if CpuSimd::available().contains(&simd) {
            simd
        } else {
            CpuSimd::Scalar
        };
        let Some(lay) = lay.filter(|_| count > 0) else {
            let ChunkIn::Prepared(preps) = input else {
                unreachable!("laid-out inputs come with a layout");
            };
            for (x, o) in preps
                .chunks_exact(padded)
                .zip(out.chunks_exact_mut(count.max(1)))
            {
                self.matvec_rows_prepared_with(simd, x, first, &mut o[..count]);
            }
            return;
        };
        PERMUTED.with(|cell| {
            let mut own = Vec::new();
            let mut guard = cell.try_borrow_mut();
            let xp = match guard.as_mut() {
                Ok(v) => &mut **v,
                Err(_) => &mut own,
            };
            // Every value is overwritten below; only grow (no clearing memset).
            let scratch = if matches!(input, ChunkIn::Prepared(_)) {
                tokens * padded
            } else {
                0
            };
            if xp.len() < scratch {
                xp.resize(scratch, 0.0);
            }
            let xp = SharedSlice::new(&mut xp[..scratch]);
            let shared = SharedSlice::new(out);
            let rb = self.row_bytes();
            // Inputs, not rows, are split over the threads: each thread lays out
            // its inputs and reads all the rows (from cache), decoding each weight
            // vector once per 4 inputs.
            Pool::global().for_ranges(tokens, 4, &|range| {
                let span = range.start * padded..range.end * padded;
                // SAFETY: the ranges of one for_ranges call are disjoint.
                let o = unsafe { shared.range(range.start * count..range.end * count) };
                let x: &[f32] = match input {
                    ChunkIn::LaidOut(x) => &x[span],
                    ChunkIn::Prepared(p) => {
                        // SAFETY: as above.
                        let d = unsafe { xp.range(span.clone()) };
                        lay.lay_out(&p[span], d);
                        d
                    }
                };
                let r = simd::Rows {
                    codebook: &self.codebook,
                    packed: &self.packed[first * rb..(first + count) * rb],
                    norms: &self.norms[first * self.groups..(first + count) * self.groups],
                    xp: x,
                    bits: self.bits,
                    group: self.group,
                    groups: self.groups,
                };
                simd::rows_batch(lay.plan, &r, count, range.len(), o, count);
            });
        });
    }

    /// Which row kernel [`CqMatrix::matvec_rows_prepared_with`] runs for this
    /// matrix under `simd`: `"scalar"`, `"simd8"` (8 lanes) or `"simd16"` (16 lanes).
    pub fn row_kernel(&self, simd: CpuSimd) -> &'static str {
        if !CpuSimd::available().contains(&simd) {
            return "scalar";
        }
        match Plan::choose(simd, self.bits, self.group * self.bits as usize / 8) {
            None => "scalar",
            Some(Plan { lanes: 8 }) => "simd8",
            Some(_) => "simd16",
        }
    }

    /// Run `rows(first_row, out_chunk)` over `out`, split across the CPU pool's
    /// threads when the rows hold at least [`PARALLEL_BYTES`].
    pub(super) fn split_rows(
        &self,
        first: usize,
        out: &mut [f32],
        rows: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        let pool = Pool::global();
        if out.len() * self.row_bytes() < PARALLEL_BYTES || pool.threads() == 1 {
            rows(first, out);
            return;
        }
        let n = out.len();
        let shared = SharedSlice::new(out);
        pool.for_ranges(n, 4, &|r| {
            // SAFETY: the ranges of one for_ranges call are disjoint.
            let o = unsafe { shared.range(r.clone()) };
            rows(first + r.start, o);
        });
    }
}
