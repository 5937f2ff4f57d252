//! Token-parallel helpers of the batched prefill: [`per_token`] splits a chunk's
//! tokens over the pool, [`row`] hands each its row of a shared buffer.

use crate::pool::{Pool, SharedSlice};

/// Below this many floats of work in all, [`per_token`] runs on the caller alone
/// (a hand-out to the pool costs more than small models' per-token work).
const PARALLEL_FLOATS: usize = 1 << 15;

/// Call `f(part, t)` for every token `t < n`, the tokens split over the pool in
/// contiguous runs (`part` is the pool part running it) when the work is worth
/// it: `work` floats touched per token.
pub(super) fn per_token(n: usize, work: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    let pool = Pool::global();
    let parts = pool.threads();
    if n < 2 || parts == 1 || n.saturating_mul(work) < PARALLEL_FLOATS {
        (0..n).for_each(|t| f(0, t));
        return;
    }
    pool.run(&|part| {
        for t in n * part / parts..n * (part + 1) / parts {
            f(part, t);
        }
    });
}

/// Row `t` (of width `w`) of a shared token-major buffer.
///
/// # Safety
/// No other part may touch that row meanwhile.
#[allow(clippy::mut_from_ref)]
pub(super) unsafe fn row<'a>(s: &'a SharedSlice<'_, f32>, t: usize, w: usize) -> &'a mut [f32] {
    // SAFETY: forwarded to the caller.
    unsafe { s.range(t * w..(t + 1) * w) }
}
