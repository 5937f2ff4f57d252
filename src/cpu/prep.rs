//! [`BatchPrep`], the prepared-input cache of a forward pass: its tokens'
//! activation prepared for each distinct CQ group width (and laid out for the
//! batched kernels when they run), so matrices that share an input and a group
//! (e.g. `wq wk wv wg`) prepare it once; and [`matmul`], which runs them.

use super::par::{per_token, row};
use crate::cq::{prepare_into, BatchIn, BatchLayout, CqMatrix};
use crate::error::Result;
use crate::kernels::kv::grow;
use crate::pool::{Pool, SharedSlice};
use crate::simd::CpuSimd;

/// The forward's inputs prepared for each distinct (group, padded, batched-kernel
/// layout), once per activation: `wq wk wv wg` (and the three Φ) share one.
#[derive(Debug, Default)]
pub(super) struct BatchPrep {
    slots: Vec<PrepSlot>,
    used: usize,
    /// One prepared input per pool part, before it is laid out.
    tmp: Vec<f32>,
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

/// `m`'s rows `first .. first + count` for the `n` inputs of `input` (from
/// [`BatchPrep::get`]) into `out` (`[n, count]`).
pub(super) fn matmul(
    m: &CqMatrix,
    (input, lay): (BatchIn<'_>, Option<BatchLayout>),
    n: usize,
    first: usize,
    count: usize,
    out: &mut [f32],
) {
    m.matmul_rows_in(CpuSimd::selected(), input, lay, n, first, count, out);
}
