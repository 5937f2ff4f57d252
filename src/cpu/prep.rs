//! [`BatchPrep`], the prepared-input cache of a forward pass: its tokens'
//! activation prepared for each distinct CQ group width (and laid out for the
//! batched kernels when they run), so matrices that share an input and a group
//! (e.g. `wq wk wv wg`) prepare it once; and [`BatchPrep::matmul`], which runs
//! them in the engine's precision (SPEC §6.1 fast: the input quantized once too).

use super::par::{per_token, row};
use crate::cq::{prepare_into, BatchIn, BatchLayout, CqMatrix, FastInput, FastKernel};
use crate::error::Result;
use crate::kernels::kv::grow;
use crate::pool::{Pool, SharedSlice};
use crate::precision::Precision;
use crate::simd::CpuSimd;

/// How many floats of [`super::par::per_token`]'s work one value of a fast
/// input's preparation counts as (the transform, the int8 quantization and the
/// kernel order: several passes over each value), so a pass of a few tokens
/// splits it over the pool.
const FAST_PREP_WEIGHT: usize = 16;

/// The forward's inputs prepared for each distinct (group, padded, batched-kernel
/// layout), once per activation: `wq wk wv wg` (and the three Φ) share one.
#[derive(Debug, Default)]
pub(super) struct BatchPrep {
    /// The arithmetic of [`BatchPrep::matmul`].
    pub(super) precision: Precision,
    slots: Vec<PrepSlot>,
    used: usize,
    /// Fast precision: per (group, padded, bits), every token's input quantized.
    fast: Vec<FastSlot>,
    fast_used: usize,
    /// One prepared input per pool part, before it is laid out.
    tmp: Vec<f32>,
}

#[derive(Debug, Default)]
struct FastSlot {
    key: (usize, usize, u32),
    inputs: Vec<FastInput>,
}

#[derive(Debug, Default)]
struct PrepSlot {
    group: usize,
    padded: usize,
    lay: Option<BatchLayout>,
    data: Vec<f32>,
}

impl BatchPrep {
    /// Forget the current activation (keeps the allocations); the caller must
    /// clear whenever the inputs change.
    pub(super) fn clear(&mut self) {
        self.used = 0;
        self.fast_used = 0;
    }

    /// Whether `m`'s matvecs run in fast precision.
    fn fast_for(&self, m: &CqMatrix) -> bool {
        self.precision == Precision::Fast && m.has_fast()
    }

    /// Prepare (and for fast precision quantize) `xs` for `m` now, as
    /// [`BatchPrep::matmul`] would (the kernel clock times it apart).
    ///
    /// # Errors
    /// As [`BatchPrep::get`].
    pub(super) fn prime(&mut self, xs: &[f32], n: usize, m: &CqMatrix) -> Result<()> {
        if self.fast_for(m) {
            self.fast_get(xs, n, m).map(|_| ())
        } else {
            self.get(xs, n, m).map(|_| ())
        }
    }

    /// `m`'s rows `first .. first + count` for the `n` inputs `xs` (`[n,
    /// m.cols()]`) into `out` (`[n, count]`), in this cache's precision (exact
    /// for matrices without a fast form).
    ///
    /// # Errors
    /// [`crate::Error::Alloc`] if a buffer can't grow.
    pub(super) fn matmul(
        &mut self,
        m: &CqMatrix,
        xs: &[f32],
        n: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let simd = CpuSimd::selected();
        if self.fast_for(m) {
            let kernel = FastKernel::for_simd(simd);
            let inputs = self.fast_get(xs, n, m)?;
            // Four inputs per pass over the rows: each row leaves memory once.
            for (xs, o) in inputs.chunks(4).zip(out.chunks_mut(4 * count)) {
                m.matmul_rows_fast(kernel, xs, first, count, o);
            }
            return Ok(());
        }
        let (input, lay) = self.get(xs, n, m)?;
        m.matmul_rows_in(simd, input, lay, n, first, count, out);
        Ok(())
    }

    /// Every token's input prepared for `m` and quantized for its bits (§6.1),
    /// once per activation and (group, padded, bits).
    fn fast_get(&mut self, xs: &[f32], n: usize, m: &CqMatrix) -> Result<&[FastInput]> {
        let (group, padded, cols) = (m.group(), m.padded(), m.cols());
        let key = (group, padded, m.bits());
        let hit = self.fast[..self.fast_used]
            .iter()
            .position(|s| s.key == key);
        let i = match hit {
            Some(i) => i,
            None => {
                if self.fast_used == self.fast.len() {
                    self.fast.push(FastSlot::default());
                }
                let parts = Pool::global().threads();
                grow(&mut self.tmp, parts * padded, "prepared inputs")?;
                // Another width's slot of the same input and group already holds
                // the values and scales: only the kernel order differs.
                let same = self.fast[..self.fast_used]
                    .iter()
                    .position(|s| (s.key.0, s.key.1) == (group, padded));
                let (done, rest) = self.fast.split_at_mut(self.fast_used);
                let slot = &mut rest[0];
                slot.key = key;
                if slot.inputs.len() < n {
                    slot.inputs.resize_with(n, FastInput::default);
                }
                // Tokens split over the pool (each quantization is a transform,
                // a pass for the scales and one for the kernel order).
                let bits = m.bits();
                let inputs = SharedSlice::new(&mut slot.inputs[..n]);
                let tmp = SharedSlice::new(&mut self.tmp[..parts * padded]);
                let work = FAST_PREP_WEIGHT * padded;
                match same {
                    Some(j) => {
                        let from = &done[j].inputs;
                        per_token(n, work, &|_, t| {
                            // SAFETY: token t owns its input.
                            let x = unsafe { &mut inputs.range(t..t + 1)[0] };
                            x.relay(&from[t], bits);
                        });
                    }
                    None => per_token(n, work, &|part, t| {
                        // SAFETY: token t owns its input, part `part` its scratch.
                        let (x, scratch) =
                            unsafe { (&mut inputs.range(t..t + 1)[0], row(&tmp, part, padded)) };
                        prepare_into(&xs[t * cols..(t + 1) * cols], group, scratch);
                        x.quantize(scratch, bits);
                    }),
                }
                self.fast_used += 1;
                self.fast_used - 1
            }
        };
        Ok(&self.fast[i].inputs[..n])
    }

    /// `prepare(x_t)` for `m`, every token `t` of `xs` (`[n, m.cols()]`), as
    /// `[n, padded]`, laid out for `m`'s batched kernel when it has one.
    pub(super) fn get(
        &mut self,
        xs: &[f32],
        n: usize,
        m: &CqMatrix,
    ) -> Result<(BatchIn<'_>, Option<BatchLayout>)> {
        let (group, padded, cols) = (m.group(), m.padded(), m.cols());
        let lay = m.batch_layout(CpuSimd::selected(), n);
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
            Some(_) => (BatchIn::LaidOut(data), lay),
            None => (BatchIn::Prepared(data), lay),
        })
    }
}
