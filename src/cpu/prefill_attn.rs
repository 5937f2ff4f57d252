//! Causal attention inside a prefill chunk, and the chunk's cache write-back.
//!
//! At each layer the chunk's keys and values are quantized into a layer-local
//! table behind a copy of the layer's cache rows, and every token attends, in
//! parallel, over exactly the rows repeated steps would show it (earlier
//! positions from the copy, which the chunk has not yet overwritten; chunk
//! positions up to its own from the new rows), in the same order. The new rows
//! then go into the cache token by token, so the ring ends as repeated steps
//! leave it, also when it wraps inside the chunk.

use super::par::per_token;
use crate::config::Config;
use crate::error::Result;
use crate::kernels::attention::attend_kv_head;
use crate::kernels::kv::{attended_ranges, physical_slot, KvCache};
use crate::pool::SharedSlice;

/// The attended rows of every token of a chunk, in the layer-local table of
/// [`chunk_attention`]: token `t`'s at `slots[slot_at[t]..slot_at[t + 1]]`.
#[derive(Debug, Default)]
pub(super) struct ChunkSlots {
    slots: Vec<usize>,
    slot_at: Vec<usize>,
}

impl ChunkSlots {
    /// The rows of positions `t0 .. t0 + n`: a position before the chunk still
    /// sits at its cache row (a later position with the same row is more than a
    /// window after it, so after this token); chunk position `t0 + i` has row
    /// `cache_rows + i`, after those.
    pub(super) fn fill(&mut self, c: &Config, t0: u64, n: usize) {
        let rows = c.cache_rows();
        self.slots.clear();
        self.slot_at.clear();
        self.slot_at.push(0);
        for t in 0..n {
            for range in attended_ranges(t0 + t as u64, c.sink, c.window) {
                self.slots.extend(range.map(|p| {
                    if p < t0 {
                        physical_slot(p, c.sink, c.window)
                    } else {
                        rows + (p - t0) as usize
                    }
                }));
            }
            self.slot_at.push(self.slots.len());
        }
    }
}

/// The inputs of [`chunk_attention`] for one layer: `n` tokens' `q`, `gate`
/// (`[n, q_dim]`) and `k`, `v` (`[n, kv_dim]`), after ZCRMS and RoPE.
pub(super) struct ChunkQkv<'a> {
    pub(super) q: &'a [f32],
    pub(super) gate: &'a [f32],
    pub(super) k: &'a [f32],
    pub(super) v: &'a [f32],
}

/// Layer `l`'s attention of the `n` chunk tokens at positions `t0..` into `o`
/// (`[n, q_dim]`), then their keys and values into `kv`. `table` is the
/// layer-local table (reshaped here), `scores` `pool parts · heads · cache_rows`
/// of scratch.
///
/// # Errors
/// [`crate::Error::Alloc`] if the table can't grow.
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_attention(
    c: &Config,
    kv: &mut KvCache,
    table: &mut KvCache,
    l: usize,
    t0: u64,
    x: ChunkQkv<'_>,
    slots: &ChunkSlots,
    o: &mut [f32],
    scores: &mut [f32],
) -> Result<()> {
    let n = slots.slot_at.len() - 1;
    let (rows, hd) = (c.cache_rows(), c.head_dim);
    let (qd, kvd) = (c.q_dim(), c.kv_dim());
    let vr = rows + n;
    // The layer's cache rows as they are before the chunk…
    table.reshape(1, c.kv_heads, vr, hd)?;
    for j in 0..c.kv_heads {
        table.copy_cells(table.base(0, j), kv, kv.base(l, j), rows);
    }
    // …then the chunk's keys and values behind them, quantized per token…
    for t in 0..n {
        table.store(
            0,
            rows + t,
            &x.k[t * kvd..(t + 1) * kvd],
            &x.v[t * kvd..(t + 1) * kvd],
        );
    }
    // …every token attending over its rows, in parallel…
    {
        let o = SharedSlice::new(o);
        let scores = SharedSlice::new(scores);
        let table = &*table;
        let g = c.heads / c.kv_heads;
        per_token(n, rows * kvd, &|part, t| {
            let tslots = &slots.slots[slots.slot_at[t]..slots.slot_at[t + 1]];
            let (qt, gt) = (&x.q[t * qd..(t + 1) * qd], &x.gate[t * qd..(t + 1) * qd]);
            for j in 0..c.kv_heads {
                let at = t * qd + j * g * hd;
                let sc = part * c.heads * rows;
                // SAFETY: token t owns its row of `o`, part `part` its scores.
                let (oj, sj) = unsafe {
                    (
                        o.range(at..at + g * hd),
                        scores.range(sc..sc + g * tslots.len()),
                    )
                };
                attend_kv_head(table, 0, j, qt, gt, tslots, oj, sj);
            }
        });
    }
    // …and the chunk's rows into the cache in token order (a later position
    // overwrites an earlier one at the same row, as in stepping).
    for t in 0..n {
        let slot = physical_slot(t0 + t as u64, c.sink, c.window);
        for j in 0..c.kv_heads {
            kv.copy_cells(kv.base(l, j) + slot, table, table.base(0, j) + rows + t, 1);
        }
    }
    Ok(())
}
