//! [`ChunkPrep`], the prepared-input cache of a forward pass: its tokens'
//! activation prepared for each distinct CQ group width (and laid out for the
//! batched kernels when they run), so matrices that share an input and a group
//! (e.g. `wq wk wv wg`) prepare it once; and [`ChunkPrep::project`], which runs
//! a product (several matrices of one input) in the engine's precision (SPEC
//! §6.1 fast: the input quantized once, the product's fused fast matrices).

use super::par::{per_token, row};
use crate::cq::{prepare_into, ChunkIn, ChunkLayout, CqMatrix, FastInput, FastKernel, FastProduct};
use crate::engine::precision::Precision;
use crate::error::Result;
use crate::host::pool::{Pool, SharedSlice};
use crate::host::simd::CpuSimd;
use crate::kernels::kv::grow;
use std::ops::Range;

/// How many floats of [`super::par::per_token`]'s work one value of a fast
/// input's preparation counts as (the transform and the int8 quantization),
/// so a pass of a few tokens splits it over the pool.
const FAST_PREP_WEIGHT: usize = 8;

/// The forward's inputs prepared for each distinct (group, padded, batched-kernel
/// layout), once per activation: `wq wk wv wg` (and the three Φ) share one.
#[derive(Debug, Default)]
pub(super) struct ChunkPrep {
    /// The arithmetic of [`ChunkPrep::matmul`].
    pub(super) precision: Precision,
    slots: Vec<PrepSlot>,
    used: usize,
    /// Fast precision: per (group, padded), every token's input quantized.
    fast: Vec<FastSlot>,
    fast_used: usize,
    /// One prepared input per pool part, before it is laid out.
    tmp: Vec<f32>,
}

#[derive(Debug, Default)]
struct FastSlot {
    key: (usize, usize),
    inputs: Vec<FastInput>,
}

#[derive(Debug, Default)]
struct PrepSlot {
    group: usize,
    padded: usize,
    lay: Option<ChunkLayout>,
    data: Vec<f32>,
}

impl ChunkPrep {
    /// Forget the current activation (keeps the allocations); the caller must
    /// clear whenever the inputs change.
    pub(super) fn clear(&mut self) {
        self.used = 0;
        self.fast_used = 0;
    }

    /// Prepare (and for fast precision quantize) `xs` for `m` now, as
    /// [`ChunkPrep::project`] would (the kernel clock times it apart).
    ///
    /// # Errors
    /// As [`ChunkPrep::get`].
    pub(super) fn prime(&mut self, xs: &[f32], n: usize, m: &CqMatrix) -> Result<()> {
        if self.precision == Precision::Fast && m.bits() <= 4 {
            self.fast_get(xs, n, m).map(|_| ())
        } else {
            self.get(xs, n, m).map(|_| ())
        }
    }

    /// The product of `parts` (matrices and their rows, sharing the input)
    /// for the `n` inputs `xs` (`[n, cols]`): part `i` into `outs[i]` (`[n,
    /// rows]`). In fast precision the parts that `fast` fuses run there (the
    /// input quantized once); the others, and all in exact precision, run
    /// exactly.
    ///
    /// # Errors
    /// [`crate::Error::Alloc`] if a buffer can't grow.
    pub(super) fn project(
        &mut self,
        fast: Option<&FastProduct>,
        parts: &[(&CqMatrix, Range<usize>)],
        xs: &[f32],
        n: usize,
        outs: &mut [&mut [f32]],
    ) -> Result<()> {
        let fast = fast.filter(|_| self.precision == Precision::Fast);
        for (i, (m, rows)) in parts.iter().enumerate() {
            if !fast.is_some_and(|f| f.covers(i)) {
                let out = &mut outs[i][..n * rows.len()];
                self.matmul_exact(m, xs, n, rows.start, rows.len(), out)?;
            }
        }
        let Some(fast) = fast else {
            return Ok(());
        };
        let kernel = FastKernel::for_simd(CpuSimd::selected());
        for (fm, ids) in &fast.fused {
            let slot = self.fast_get(xs, n, parts[ids[0]].0)?;
            let inputs = &self.fast[slot].inputs[..n];
            let outs = &mut *outs;
            for &i in ids {
                outs[i] = &mut std::mem::take(&mut outs[i])[..n * parts[i].1.len()];
            }
            fm.matmul_parts(kernel, inputs, outs, ids);
        }
        Ok(())
    }

    /// `m`'s rows `first .. first + count` for the `n` inputs `xs` (`[n,
    /// m.cols()]`) into `out` (`[n, count]`), exactly.
    ///
    /// # Errors
    /// [`crate::Error::Alloc`] if a buffer can't grow.
    fn matmul_exact(
        &mut self,
        m: &CqMatrix,
        xs: &[f32],
        n: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let simd = CpuSimd::selected();
        let (input, lay) = self.get(xs, n, m)?;
        m.matmul_rows_in(simd, input, lay, n, first, count, out);
        Ok(())
    }

    /// The slot holding every token's input prepared for `m` and quantized
    /// (§6.1), once per activation and (group, padded).
    fn fast_get(&mut self, xs: &[f32], n: usize, m: &CqMatrix) -> Result<usize> {
        let (group, padded, cols) = (m.group(), m.padded(), m.cols());
        let key = (group, padded);
        if let Some(i) = self.fast[..self.fast_used]
            .iter()
            .position(|s| s.key == key)
        {
            return Ok(i);
        }
        if self.fast_used == self.fast.len() {
            self.fast.push(FastSlot::default());
        }
        let parts = Pool::global().threads();
        grow(&mut self.tmp, parts * padded, "prepared inputs")?;
        let slot = &mut self.fast[self.fast_used];
        slot.key = key;
        if slot.inputs.len() < n {
            slot.inputs.resize_with(n, FastInput::default);
        }
        // Tokens split over the pool (each is a transform and a quantization).
        let inputs = SharedSlice::new(&mut slot.inputs[..n]);
        let tmp = SharedSlice::new(&mut self.tmp[..parts * padded]);
        per_token(n, FAST_PREP_WEIGHT * padded, &|part, t| {
            // SAFETY: token t owns its input, part `part` its scratch.
            let (x, scratch) = unsafe { (&mut inputs.range(t..t + 1)[0], row(&tmp, part, padded)) };
            prepare_into(&xs[t * cols..(t + 1) * cols], group, scratch);
            x.quantize(scratch);
        });
        self.fast_used += 1;
        Ok(self.fast_used - 1)
    }

    /// `prepare(x_t)` for `m`, every token `t` of `xs` (`[n, m.cols()]`), as
    /// `[n, padded]`, laid out for `m`'s batched kernel when it has one.
    pub(super) fn get(
        &mut self,
        xs: &[f32],
        n: usize,
        m: &CqMatrix,
    ) -> Result<(ChunkIn<'_>, Option<ChunkLayout>)> {
        let (group, padded, cols) = (m.group(), m.padded(), m.cols());
        let lay = m.chunk_layout(CpuSimd::selected(), n);
        let hit = self.slots[..self.used]
            .iter()
            .position(|s| s.group == group && s.padded == padded && s.lay == lay);
        let i = match hit {
            Some(i) => i,
            None => {
                if self.used == self.slots.len() {
                    self.slots.push(PrepSlot::default());
                }
                let parts = Pool::global().threads();
                grow(&mut self.tmp, parts * padded, "prepared inputs")?;
                let slot = &mut self.slots[self.used];
                (slot.group, slot.padded, slot.lay) = (group, padded, lay);
                grow(&mut slot.data, n * padded, "prepared inputs")?;
                let out = SharedSlice::new(&mut slot.data[..n * padded]);
                let tmp = SharedSlice::new(&mut self.tmp);
                per_token(n, padded, &|part, t| {
                    // SAFETY: token t owns its row of `out`, part `part` its scratch.
                    let (o, x) = unsafe { (row(&out, t, padded), row(&tmp, part, padded)) };
                    let src = &xs[t * cols..(t + 1) * cols];
                    match lay {
                        Some(lay) => {
                            prepare_into(src, group, x);
                            lay.lay_out(x, o);
                        }
                        None => prepare_into(src, group, o),
                    }
                });
                self.used += 1;
                self.used - 1
            }
        };
        let data = &self.slots[i].data[..n * padded];
        Ok(match lay {
            Some(_) => (ChunkIn::LaidOut(data), lay),
            None => (ChunkIn::Prepared(data), lay),
        })
    }
}
