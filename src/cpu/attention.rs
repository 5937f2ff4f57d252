//! [`ChunkAttention`]: SPEC §4.3 step 5's KV store and attention for the `n`
//! tokens of one forward pass, each attending over exactly the rows one step per
//! token would show it, in the same order, so the outputs are bit-identical to
//! stepping.
//!
//! Two placements, chosen per chunk:
//! - **in place** (a decode step, or a chunk where no token after the first
//!   evicts a cache row): the chunk's keys and values go straight into the
//!   cache, then every token attends there; a single token splits its KV heads
//!   over the pool (the [`attend`] twin), a chunk its tokens;
//! - **through a table** (the ring wraps inside the chunk, so a later token
//!   overwrites a row an earlier one still reads): the rows are quantized into a
//!   layer-local table behind a copy of the layer's cache rows, every token
//!   attends over the table (earlier positions from the copy, chunk positions up
//!   to its own from the new rows), and [`ChunkAttention::finish`] then writes the
//!   new rows into the cache token by token, so the ring ends as stepping leaves it.
//!
//! A pass of several sequences attends all of them in one pool job
//! ([`attend_segments`]: every sequence's (token, KV head) pairs split by work).

use super::hooks::RowScan;
use super::par::per_token_weighted;
use crate::error::Result;
use crate::host::pool::SharedSlice;
use crate::kernels::attention::{attend, attend_kv_head, reads_wide_rows};
use crate::kernels::kv::{attended_ranges, grow, physical_slot, KvCache, WideRows};
use crate::model::config::Config;
use std::mem::take;

/// The placement and attended rows of one chunk; reused across chunks.
#[derive(Debug, Default)]
pub(super) struct ChunkAttention {
    /// Whether the rows go straight into the cache (see the module doc).
    in_place: bool,
    /// Position of the chunk's first token.
    t0: u64,
    /// Token `t`'s attended rows: `slots[slot_at[t]..slot_at[t + 1]]`, rows of
    /// the cache when in place, else of the table.
    slots: Vec<usize>,
    slot_at: Vec<usize>,
    /// Prefix sums of each token's work in attended rows: its rows plus
    /// [`TOKEN_WORK`] (how the pool splits the tokens).
    work_at: Vec<usize>,
    /// The layer-local table (one layer, `cache_rows + n` rows) when not in place.
    table: KvCache,
    /// The chunk's cache rows when in place.
    rows: Vec<usize>,
    /// The rows the chunk reads (up to its largest), widened to f32 per KV
    /// head (`[kv_heads, wide_rows, head_dim]`, keys then values) when the
    /// attention kernel reads them so: converted once here instead of at
    /// every token's read.
    wide_k: Vec<f32>,
    wide_v: Vec<f32>,
    /// Rows widened per KV head (0: none, the kernel reads the codes).
    wide_rows: usize,
}

/// A token's attention work besides its rows (its gate's sigmoids, each head's
/// softmax and output), in attended rows: the pool parts split the tokens by
/// rows plus this, as the early tokens of a chunk attend few rows each.
const TOKEN_WORK: usize = 24;

impl ChunkAttention {
    /// Plan the chunk of `n ≥ 1` tokens at positions `t0 ..` for `c`: the
    /// placement and every token's attended rows. In the table, a position before
    /// the chunk still sits at its cache row (a later position with the same row
    /// is more than a window after it, so after this token); chunk position
    /// `t0 + i` has row `cache_rows + i`, after those.
    pub(super) fn plan(&mut self, c: &Config, t0: u64, n: usize) {
        let rows = c.cache_rows();
        // Position p ≥ cache_rows reuses the row of p − window: only the first
        // token of the chunk may do that when the chunk works in place.
        self.in_place = n == 1 || t0 + n as u64 <= rows as u64;
        self.t0 = t0;
        self.slots.clear();
        self.slot_at.clear();
        self.slot_at.push(0);
        for t in 0..n as u64 {
            for range in attended_ranges(t0 + t, c.sink, c.window) {
                self.slots.extend(range.map(|p| {
                    if self.in_place || p < t0 {
                        physical_slot(p, c.sink, c.window)
                    } else {
                        rows + (p - t0) as usize
                    }
                }));
            }
            self.slot_at.push(self.slots.len());
        }
        self.work_at.clear();
        self.work_at.extend(
            self.slot_at
                .iter()
                .enumerate()
                .map(|(t, &a)| a + TOKEN_WORK * t),
        );
    }

    /// How many rows each token of the chunk attends.
    pub(super) fn attended(&self) -> impl Iterator<Item = usize> + '_ {
        self.slot_at.windows(2).map(|w| w[1] - w[0])
    }

    fn tokens(&self) -> usize {
        self.slot_at.len() - 1
    }

    /// Layer `l`'s keys and values of the chunk (`k`, `v`: `[n, kv_dim]`, after
    /// ZCRMS and RoPE) quantized into the cache, or into the table behind a copy
    /// of the layer's cache rows.
    ///
    /// # Errors
    /// [`crate::Error::Alloc`] if the table can't grow.
    pub(super) fn store(
        &mut self,
        c: &Config,
        kv: &mut KvCache,
        l: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<()> {
        let (n, rows, kvd) = (self.tokens(), c.cache_rows(), c.kv_dim());
        let kv_t = |t: usize| (&k[t * kvd..(t + 1) * kvd], &v[t * kvd..(t + 1) * kvd]);
        if self.in_place {
            // No token of the chunk after the first evicts a row: the chunk's
            // rows are distinct, and are stored side by side.
            self.rows.clear();
            let t0 = self.t0;
            self.rows
                .extend((0..n as u64).map(|t| physical_slot(t0 + t, c.sink, c.window)));
            kv.store_rows(l, &self.rows, &k[..n * kvd], &v[..n * kvd]);
        } else {
            self.table.reshape(1, c.kv_heads, rows + n, c.head_dim)?;
            for j in 0..c.kv_heads {
                self.table
                    .copy_cells(self.table.base(0, j), kv, kv.base(l, j), rows);
            }
            for t in 0..n {
                let (kt, vt) = kv_t(t);
                self.table.store(0, rows + t, kt, vt);
            }
        }
        self.widen(c, kv, l)
    }

    /// Widen the rows this chunk reads at layer `l` (see
    /// [`KvHeadView::wide`](crate::kernels::kv::KvHeadView::wide)) when
    /// several tokens read them and the kernel can use them.
    fn widen(&mut self, c: &Config, kv: &KvCache, l: usize) -> Result<()> {
        self.wide_rows = 0;
        let hd = c.head_dim;
        if self.tokens() < 2 || !reads_wide_rows(hd) {
            return Ok(());
        }
        let rows = self.slots.iter().max().map_or(0, |m| m + 1);
        let per = rows * hd;
        let (mut wk, mut wv) = (take(&mut self.wide_k), take(&mut self.wide_v));
        grow(&mut wk, c.kv_heads * per, "widened keys")?;
        grow(&mut wv, c.kv_heads * per, "widened values")?;
        let (cache, layer) = self.cache(kv, l);
        for j in 0..c.kv_heads {
            let range = j * per..(j + 1) * per;
            let (k, v) = (&mut wk[range.clone()], &mut wv[range]);
            cache.head(layer, j).widen_into(hd, k, v);
        }
        (self.wide_k, self.wide_v, self.wide_rows) = (wk, wv, rows);
        Ok(())
    }

    /// KV head `j`'s widened rows, if [`ChunkAttention::store`] widened them.
    fn wide(&self, c: &Config, j: usize) -> Option<WideRows<'_>> {
        let per = self.wide_rows * c.head_dim;
        (per > 0).then(|| WideRows {
            k: &self.wide_k[j * per..(j + 1) * per],
            v: &self.wide_v[j * per..(j + 1) * per],
        })
    }

    /// Every token's attention at layer `l` after [`ChunkAttention::store`]:
    /// `o = attention(q) ⊙ σ(gate)` (`q`, `gate`, `o`: `[n, q_dim]`); `scores` is
    /// scratch of `pool parts · heads · cache_rows`. Each token's row of `o` is
    /// noted in `scan` by the pool part that wrote it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend(
        &self,
        c: &Config,
        kv: &KvCache,
        l: usize,
        q: &[f32],
        gate: &[f32],
        o: &mut [f32],
        scores: &mut [f32],
        scan: &RowScan,
    ) {
        let n = self.tokens();
        if n == 1 {
            attend(kv, l, q, gate, &self.slots, o, scores);
            scan.note(0, o);
            return;
        }
        let cache = self.cache(kv, l);
        let qd = c.q_dim();
        let out = (&SharedSlice::new(o), &SharedSlice::new(scores));
        // Later tokens attend more rows: the pool parts take runs of tokens
        // of about equal work in all.
        per_token_weighted(&self.work_at, &|part, t| {
            let slots = &self.slots[self.slot_at[t]..self.slot_at[t + 1]];
            for j in 0..c.kv_heads {
                let kv = (cache, self.wide(c, j));
                // SAFETY: token t owns its row of `o`, part `part` its scores.
                unsafe { attend_piece(c, kv, j, (q, gate), t, slots, out, part) };
            }
            // SAFETY: token t owns its row of `o`, written above.
            scan.note(t, unsafe { out.0.range(t * qd..(t + 1) * qd) });
        });
    }

    /// The cache rows this plan's tokens attend at layer `l`: `kv`'s layer `l`
    /// in place, else the table's one layer.
    fn cache<'a>(&'a self, kv: &'a KvCache, l: usize) -> (&'a KvCache, usize) {
        if self.in_place {
            (kv, l)
        } else {
            (&self.table, 0)
        }
    }

    /// After [`ChunkAttention::attend`] through the table: the chunk's rows into
    /// layer `l` of the cache in token order (a later position overwrites an
    /// earlier one at the same row, as in stepping). Nothing to do in place.
    pub(super) fn finish(&self, c: &Config, kv: &mut KvCache, l: usize) {
        if self.in_place {
            return;
        }
        let rows = c.cache_rows();
        for t in 0..self.tokens() {
            let slot = physical_slot(self.t0 + t as u64, c.sink, c.window);
            for j in 0..c.kv_heads {
                let src = self.table.base(0, j) + rows + t;
                kv.copy_cells(kv.base(l, j) + slot, &self.table, src, 1);
            }
        }
    }
}

/// The (segment, token, KV head) pairs of a pass of several segments and the
/// prefix sums of their work, for [`attend_segments`]: planned once a pass
/// ([`SegmentWork::plan`]), the same at every layer.
#[derive(Debug, Default)]
pub(super) struct SegmentWork {
    items: Vec<(usize, usize, usize)>,
    at: Vec<usize>,
}

impl SegmentWork {
    /// The pairs of the segments planned in `plans`, `kv_heads` a token, each
    /// weighing its attended rows plus its share of [`TOKEN_WORK`].
    pub(super) fn plan(&mut self, plans: &[ChunkAttention], kv_heads: usize) {
        self.items.clear();
        self.at.clear();
        self.at.push(0);
        let mut total = 0;
        for (i, plan) in plans.iter().enumerate() {
            for (t, rows) in plan.attended().enumerate() {
                for j in 0..kv_heads {
                    self.items.push((i, t, j));
                    total += rows + TOKEN_WORK / kv_heads;
                    self.at.push(total);
                }
            }
        }
    }
}

/// Every segment's attention at layer `l` after its [`ChunkAttention::store`]
/// in one pool job, `work` planned from `plans`: segment `i` has the plan
/// `plans[i]` and the cache
/// `cache(i)`, and its tokens are rows `starts[i] ..` of `q`, `gate` and `o`
/// (`[tokens, q_dim]`). Its (token, KV head) pairs are split over the pool by
/// attended rows plus a fixed cost each, where one job per segment (a batch of
/// single-token sequences) would hand out a job of two small parts per
/// sequence. Values as [`ChunkAttention::attend`] of each segment (the same
/// [`attend_kv_head`] per head); each written piece of `o` is noted in `scan`
/// as its token's row. `scores` as there.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_segments<'k>(
    c: &Config,
    l: usize,
    plans: &[ChunkAttention],
    cache: &(dyn Fn(usize) -> &'k KvCache + Sync),
    starts: &[usize],
    (q, gate): (&[f32], &[f32]),
    o: &mut [f32],
    scores: &mut [f32],
    work: &SegmentWork,
    scan: &RowScan,
) {
    let out = (&SharedSlice::new(o), &SharedSlice::new(scores));
    let items = &work.items;
    per_token_weighted(&work.at, &|part, k| {
        let (i, t, j) = items[k];
        let plan = &plans[i];
        let slots = &plan.slots[plan.slot_at[t]..plan.slot_at[t + 1]];
        let row = starts[i] + t;
        let kv = (plan.cache(cache(i), l), plan.wide(c, j));
        // SAFETY: (token, KV head) owns its piece of `o`, part `part` its scores.
        let oj = unsafe { attend_piece(c, kv, j, (q, gate), row, slots, out, part) };
        scan.note(row, oj);
    });
}

/// Row `row`'s query heads of KV head `j` (of `q` and `gate`, `[rows, q_dim]`)
/// attending over `slots` of `(cache, layer)` ([`attend_kv_head`]) into their
/// piece of `o`, with pool part `part`'s scores (`heads · cache_rows` a part);
/// returns the piece.
///
/// # Safety
/// No other part touches that piece of `o`, or part `part`'s scores, meanwhile.
#[allow(clippy::too_many_arguments, clippy::mut_from_ref)]
unsafe fn attend_piece<'o>(
    c: &Config,
    ((cache, layer), wide): ((&KvCache, usize), Option<WideRows<'_>>),
    j: usize,
    (q, gate): (&[f32], &[f32]),
    row: usize,
    slots: &[usize],
    (o, scores): (&'o SharedSlice<'_, f32>, &SharedSlice<'_, f32>),
    part: usize,
) -> &'o mut [f32] {
    let (qd, hd) = (c.q_dim(), c.head_dim);
    let g = c.heads / c.kv_heads;
    let at = row * qd + j * g * hd;
    let sc = part * c.heads * c.cache_rows();
    // SAFETY: the caller's.
    let (oj, sj) = unsafe {
        (
            o.range(at..at + g * hd),
            scores.range(sc..sc + g * slots.len()),
        )
    };
    let rows = row * qd..(row + 1) * qd;
    attend_kv_head(
        cache,
        layer,
        j,
        wide,
        &q[rows.clone()],
        &gate[rows],
        slots,
        oj,
        sj,
    );
    oj
}
