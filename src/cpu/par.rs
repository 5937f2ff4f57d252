//! Token-parallel helpers of the forward pass: [`per_token`] splits a chunk's
//! tokens over the pool, [`row`] hands each its row of a shared buffer, and
//! [`per_rows`] does both for a set of output buffers.

use crate::host::pool::{Pool, SharedSlice};

/// Below this many floats of work in all, [`per_token`] runs on the caller alone
/// (a hand-out to the pool costs more than small models' per-token work).
const PARALLEL_FLOATS: usize = 1 << 15;

/// From this many floats of work in all, [`per_token`]'s parts take tokens
/// from each other when done ([`Pool::steal_runs`]); below, each runs its
/// share (stealing's traffic between cores costs ~0.5 µs a job).
const STEAL_FLOATS: usize = 1 << 17;

/// Call `f(part, t)` for every token `t < n`, the tokens split over the pool in
/// contiguous runs (`part` is the pool part running it) when the work is worth
/// it: `work` floats touched per token.
pub(super) fn per_token(n: usize, work: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    let pool = Pool::global();
    let parts = pool.threads();
    if !splits(n, work) {
        (0..n).for_each(|t| f(0, t));
        return;
    }
    if n.saturating_mul(work) >= STEAL_FLOATS {
        pool.steal_runs(n, &|p| n * p / parts, &|part, run| {
            run.for_each(|t| f(part, t));
        });
    } else {
        pool.run(&|part| {
            for t in n * part / parts..n * (part + 1) / parts {
                f(part, t);
            }
        });
    }
}

/// Whether [`per_token`] splits `n` tokens of `work` floats each over the
/// pool (else they run on the caller, and the caller may run on a pool part).
pub(super) fn splits(n: usize, work: usize) -> bool {
    n >= 2 && Pool::global().threads() > 1 && n.saturating_mul(work) >= PARALLEL_FLOATS
}

/// Call `f(part, t)` for every token `t < n`, where token `t`'s work is
/// `at[t + 1] − at[t]` (`at`: `n + 1` ascending prefix sums), the tokens split
/// over the pool in contiguous runs of about equal work when the work is worth
/// it ([`PARALLEL_FLOATS`] units in all).
pub(super) fn per_token_weighted(at: &[usize], f: &(dyn Fn(usize, usize) + Sync)) {
    let pool = Pool::global();
    let parts = pool.threads();
    let n = at.len().saturating_sub(1);
    let total = at[n] - at[0];
    if n < 2 || parts == 1 || total < PARALLEL_FLOATS / 64 {
        (0..n).for_each(|t| f(0, t));
        return;
    }
    // Part p starts at the first token whose work begins at or after p/parts
    // of the total.
    let start = |p: usize| match p {
        p if p >= parts => n,
        p => at
            .partition_point(|&w| w - at[0] < total * p / parts)
            .min(n),
    };
    pool.steal_runs(n, &start, &|part, run| run.for_each(|t| f(part, t)));
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

/// The per-token body of [`per_rows`]: `(pool part, token, its output rows)`.
pub(super) type RowsFn<'a, const K: usize> = dyn Fn(usize, usize, [&mut [f32]; K]) + Sync + 'a;

/// Call `f(part, t, rows)` for every token `t < n` ([`per_token`]: split over
/// the pool when `work` floats per token are worth it; `part` is the pool part
/// running it), `rows[i]` being token `t`'s row of `outs[i]` (a buffer and its
/// row width).
pub(super) fn per_rows<const K: usize>(
    n: usize,
    work: usize,
    outs: [(&mut Vec<f32>, usize); K],
    f: &RowsFn<'_, K>,
) {
    let outs = outs.map(|(v, w)| (SharedSlice::new(&mut v[..]), w));
    per_token(n, work, &|part, t| {
        // SAFETY: token t owns its row of every buffer.
        let rows = std::array::from_fn(|i| unsafe { row(&outs[i].0, t, outs[i].1) });
        f(part, t, rows);
    });
}
