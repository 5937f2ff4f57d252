//! The batched prefill of [`CpuEngine`]: a prompt goes through each layer in
//! chunks of tokens, layer by layer, so one pass over a CQ matrix serves the
//! whole chunk (the 8-lane kernels decode each weight vector once for four
//! tokens, see [`crate::cq::CqMatrix::matmul_rows_prepared`]; inputs that several
//! matrices share are prepared and laid out for that kernel once) and the per-token
//! work between the matvecs (norms, MLP, routing) is split over the pool by token.
//!
//! Causal attention inside a chunk: at each layer the chunk's keys and values are
//! quantized into a layer-local table behind a copy of the layer's cache rows,
//! and every token attends, in parallel, over exactly the rows repeated steps
//! would show it (earlier positions from the copy, which the chunk has not yet
//! overwritten; chunk positions up to its own from the new rows), in the same
//! order. The new rows then go into the cache token by token, so the ring ends as
//! repeated steps leave it, also when it wraps inside the chunk. Every value is
//! computed by the same functions as the step ([`super::block`]) and the batched
//! matvec is bit-identical to the single one, so a prefill gives exactly the
//! logits of one step per token.

use super::block;
use super::engine::CpuEngine;
use crate::cq::{prepare_into, BatchIn, BatchLayout, CqMatrix};
use crate::engram::table_rows_for;
use crate::error::{Error, Result};
use crate::kernels::attention::KvHeadView;
use crate::kernels::kv::{attended_ranges, physical_slot, quantize_int8};
use crate::kernels::mlp::hadamard_mlp;
use crate::kernels::norm::{rms_unit_into, zcrms_into};
use crate::kernels::rope::rope_table;
use crate::pool::{Pool, SharedSlice};
use crate::simd::CpuSimd;
use std::sync::Arc;

/// Tokens per prefill chunk unless [`CpuEngine::set_prefill_chunk`] says otherwise.
pub(super) const DEFAULT_CHUNK: usize = 64;

/// A chunk's per-token buffers hold at most about this many floats (the chunk is
/// shortened for very wide models).
const MAX_CHUNK_FLOATS: usize = 16 << 20;

/// Work buffers of a chunk, token-major (`[tokens, width]`), grown on demand.
#[derive(Debug, Default)]
pub(super) struct Batch {
    lanes: Vec<f32>,
    next: Vec<f32>,
    xhat: Vec<f32>,
    p_pre: Vec<f32>,
    p_post: Vec<f32>,
    p_res: Vec<f32>,
    u: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    tmp: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    o: Vec<f32>,
    attn: Vec<f32>,
    after: Vec<f32>,
    out: Vec<f32>,
    /// One MLP scratch of `hadamard_dim` per pool part.
    z: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// The attended cache rows of every token, flat, with `slot_at[i]..slot_at[i+1]`.
    slots: Vec<usize>,
    slot_at: Vec<usize>,
    /// Layer-local int8 keys and values: per KV head, the layer's `cache_rows`
    /// cache rows followed by one row per chunk token (`[kv_heads, rows + n, head_dim]`).
    kv_k: Vec<i8>,
    kv_v: Vec<i8>,
    /// Their scales, `[kv_heads, rows + n]`.
    kv_ks: Vec<f32>,
    kv_vs: Vec<f32>,
    /// Attention scores, `heads · cache_rows` per pool part.
    scores: Vec<f32>,
    e: Vec<f32>,
    site_v: Vec<f32>,
    site_key: Vec<Vec<f32>>,
    site_value: Vec<Vec<f32>>,
    idx: Vec<usize>,
    prep: BatchPrep,
}

/// The chunk's inputs prepared for each distinct (group, padded, batched-kernel
/// layout), once per activation: `wq wk wv wg` (and the three Φ) share one.
#[derive(Debug, Default)]
struct BatchPrep {
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
    fn clear(&mut self) {
        self.used = 0;
    }

    /// `prepare(x_t)` for `m`, every token `t` of `xs` (`[n, m.cols()]`), as
    /// `[n, padded]`, laid out for `m`'s batched kernel when it has one.
    fn get(
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
                grow(&mut self.tmp, parts * padded, "prefill prepared inputs")?;
                let slot = &mut self.slots[self.used];
                (slot.group, slot.padded, slot.lay) = (group, padded, lay);
                grow(&mut slot.data, n * padded, "prefill prepared inputs")?;
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
fn matmul(
    m: &CqMatrix,
    (input, lay): (BatchIn<'_>, Option<BatchLayout>),
    n: usize,
    first: usize,
    count: usize,
    out: &mut [f32],
) {
    m.matmul_rows_in(CpuSimd::selected(), input, lay, n, first, count, out);
}

/// Make `v` at least `n` values long (new ones zero; never shrinks, so later
/// chunks reuse it), reporting an allocation failure as an error.
fn grow<T: Clone + Default>(v: &mut Vec<T>, n: usize, what: &str) -> Result<()> {
    if v.len() < n {
        v.try_reserve_exact(n - v.len()).map_err(|_| Error::Alloc {
            what: what.to_string(),
            bytes: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        })?;
        v.resize(n, T::default());
    }
    Ok(())
}

/// Record in `bad` the first row (of width `w`) of `data` holding a NaN or an
/// infinity, as position `t0 + row` of tensor `name()`, unless an earlier
/// position is recorded. Called in the order the step checks its tensors, this
/// names what one step per token would name: the first bad tensor of the first
/// bad position.
fn note(
    bad: &mut Option<(u64, String)>,
    t0: u64,
    data: &[f32],
    w: usize,
    name: impl FnOnce() -> String,
) {
    let limit = bad
        .as_ref()
        .map_or(data.len() / w.max(1), |(p, _)| (p - t0) as usize);
    let rows = data.chunks_exact(w).take(limit);
    // A branch-free scan per row (vectorizes; rows are short).
    if let Some(t) = rows
        .into_iter()
        .position(|r| r.iter().fold(false, |bad, v| bad | !v.is_finite()))
    {
        *bad = Some((t0 + t as u64, name()));
    }
}

/// Below this many floats of work in all, [`per_token`] runs on the caller alone
/// (a hand-out to the pool costs more than small models' per-token work).
const PARALLEL_FLOATS: usize = 1 << 15;

/// Call `f(part, t)` for every token `t < n`, the tokens split over the pool in
/// contiguous runs (`part` is the pool part running it) when the work is worth
/// it: `work` floats touched per token.
fn per_token(n: usize, work: usize, f: &(dyn Fn(usize, usize) + Sync)) {
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
unsafe fn row<'a>(s: &'a SharedSlice<'_, f32>, t: usize, w: usize) -> &'a mut [f32] {
    // SAFETY: forwarded to the caller.
    unsafe { s.range(t * w..(t + 1) * w) }
}

impl CpuEngine {
    /// Tokens per chunk of the batched prefill ([`crate::Engine::step_many`]):
    /// `n ≥ 1` (0 is taken as 1). Any value gives the same logits; larger chunks
    /// share each weight pass among more tokens (default 64).
    pub fn set_prefill_chunk(&mut self, n: usize) {
        self.prefill_chunk = n.max(1);
    }

    /// The chunk length the prefill uses for this model (the set value, shortened
    /// so a chunk's buffers stay within about 64 MiB).
    fn chunk_len(&self) -> usize {
        let c = &self.model.config;
        let e = c
            .engram
            .as_ref()
            .map_or(0, |e| e.e_dim() + 2 * e.sites.len() * c.hidden);
        let per_token = 16 * c.hidden + 5 * c.q_dim() + c.head_dim + e;
        self.prefill_chunk
            .min((MAX_CHUNK_FLOATS / per_token.max(1)).max(1))
    }

    /// Append `ids` (all `< vocab`) in chunks; logits after the last one when asked.
    pub(super) fn prefill_ids(&mut self, ids: &[u32], want_logits: bool) -> Result<()> {
        let chunk = self.chunk_len();
        let mut batch = std::mem::take(&mut self.batch);
        let mut res = Ok(());
        for (i, part) in ids.chunks(chunk).enumerate() {
            let last = (i + 1) * chunk >= ids.len();
            res = self.prefill_chunk_ids(&mut batch, part, want_logits && last);
            if res.is_err() {
                break;
            }
        }
        self.batch = batch;
        res
    }

    fn prefill_chunk_ids(&mut self, bt: &mut Batch, ids: &[u32], want_logits: bool) -> Result<()> {
        let model = Arc::clone(&self.model);
        let c = &model.config;
        let w = &model.weights;
        let n = ids.len();
        let t0 = self.pos;
        let (h, hd) = (c.hidden, c.head_dim);
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        let pool_parts = Pool::global().threads();
        for (v, len) in [
            (&mut bt.lanes, 4 * h),
            (&mut bt.next, 4 * h),
            (&mut bt.xhat, 4 * h),
            (&mut bt.p_pre, 4),
            (&mut bt.p_post, 4),
            (&mut bt.p_res, 16),
            (&mut bt.u, h),
            (&mut bt.b, h),
            (&mut bt.a, h),
            (&mut bt.tmp, h),
            (&mut bt.q, qd),
            (&mut bt.k, kvd),
            (&mut bt.v, kvd),
            (&mut bt.g, qd),
            (&mut bt.o, qd),
            (&mut bt.attn, h),
            (&mut bt.after, h),
            (&mut bt.out, h),
            (&mut bt.cos, hd / 2),
            (&mut bt.sin, hd / 2),
        ] {
            grow(v, n * len, "prefill buffers")?;
        }
        grow(
            &mut bt.z,
            pool_parts * c.hadamard_dim,
            "prefill MLP scratch",
        )?;
        let rows = c.cache_rows();
        let vr = rows + n;
        grow(&mut bt.kv_k, c.kv_heads * vr * hd, "prefill keys")?;
        grow(&mut bt.kv_v, c.kv_heads * vr * hd, "prefill values")?;
        grow(&mut bt.kv_ks, c.kv_heads * vr, "prefill key scales")?;
        grow(&mut bt.kv_vs, c.kv_heads * vr, "prefill value scales")?;
        grow(
            &mut bt.scores,
            pool_parts * c.heads * rows,
            "prefill attention scores",
        )?;
        // The first non-finite tensor (position, name), as the step reports it.
        let mut bad: Option<(u64, String)> = None;
        // 4.1 Embedding.
        for (t, &id) in ids.iter().enumerate() {
            block::embed_lanes(&w.embed, id, &mut bt.lanes[t * 4 * h..(t + 1) * 4 * h]);
        }
        note(&mut bad, t0, &bt.lanes[..n * 4 * h], 4 * h, || "x0".into());

        // 4.2 Engram: the rows of every token, then the site projections of the
        // chunk, then the rings and convolutions token by token.
        let st = &mut self.state;
        if let (Some(ec), Some(ew)) = (&c.engram, &w.engram) {
            let ed = ec.e_dim();
            grow(&mut bt.e, n * ed, "prefill engram rows")?;
            grow(&mut bt.site_v, n * h, "prefill engram values")?;
            bt.site_key.resize_with(ew.sites.len(), Vec::new);
            bt.site_value.resize_with(ew.sites.len(), Vec::new);
            for (t, &id) in ids.iter().enumerate() {
                st.history.push(id);
                table_rows_for(&st.history, ec, &self.table_rows, &mut bt.idx);
                let e = &mut bt.e[t * ed..(t + 1) * ed];
                for (k, (table, &r)) in ew.tables.iter().zip(&bt.idx).enumerate() {
                    table.dequantize_row_into(r, &mut e[k * ec.dim..(k + 1) * ec.dim]);
                }
            }
            note(&mut bad, t0, &bt.e[..n * ed], ed, || "engram.e".into());
            let ring = ec.ring() as u64;
            bt.prep.clear();
            for (i, site) in ew.sites.iter().enumerate() {
                grow(&mut bt.site_key[i], n * h, "prefill engram keys")?;
                grow(&mut bt.site_value[i], n * h, "prefill engram values")?;
                let pv = bt.prep.get(&bt.e[..n * ed], n, &site.wv)?;
                matmul(&site.wv, pv, n, 0, h, &mut bt.site_v[..n * h]);
                let pk = bt.prep.get(&bt.e[..n * ed], n, &site.wk)?;
                matmul(&site.wk, pk, n, 0, h, &mut bt.site_key[i][..n * h]);
                for t in 0..n {
                    let pos = t0 + t as u64;
                    let slot = (pos % ring) as usize;
                    st.rings[i][slot * h..(slot + 1) * h]
                        .copy_from_slice(&bt.site_v[t * h..(t + 1) * h]);
                    block::engram_value(
                        pos,
                        ec,
                        &site.conv,
                        &st.rings[i],
                        &mut bt.tmp[..h],
                        &mut bt.site_value[i][t * h..(t + 1) * h],
                    );
                }
                note(&mut bad, t0, &bt.site_key[i][..n * h], h, || {
                    format!("engram.key.{}", site.layer)
                });
                note(&mut bad, t0, &bt.site_value[i][..n * h], h, || {
                    format!("engram.value.{}", site.layer)
                });
            }
        } else {
            for &id in ids {
                st.history.push(id);
            }
        }

        // RoPE tables and attended cache rows of every position of the chunk.
        bt.slots.clear();
        bt.slot_at.clear();
        bt.slot_at.push(0);
        for t in 0..n {
            let pos = t0 + t as u64;
            let half = hd / 2;
            rope_table(
                pos,
                c.rope_theta,
                hd,
                &mut bt.cos[t * half..(t + 1) * half],
                &mut bt.sin[t * half..(t + 1) * half],
            );
            // A position before the chunk still sits at its cache row (a later
            // position with the same row is more than a window after it, so
            // after this token); a chunk position has its own row after those.
            for range in attended_ranges(pos, c.sink, c.window) {
                bt.slots.extend(range.map(|p| {
                    if p < t0 {
                        physical_slot(p, c.sink, c.window)
                    } else {
                        rows + (p - t0) as usize
                    }
                }));
            }
            bt.slot_at.push(bt.slots.len());
        }

        let m = &w.mhc;
        let site_of = |l: usize| {
            w.engram
                .as_ref()
                .and_then(|ew| ew.sites.iter().position(|s| s.layer == l))
        };
        for (l, lw) in w.layers.iter().enumerate() {
            // 1–2: mHC projections of the chunk.
            {
                let xh = SharedSlice::new(&mut bt.xhat[..n * 4 * h]);
                let lanes = &bt.lanes;
                per_token(n, 4 * h, &|_, t| {
                    // SAFETY: token t owns its row.
                    let x = unsafe { row(&xh, t, 4 * h) };
                    rms_unit_into(&lanes[t * 4 * h..(t + 1) * 4 * h], x);
                });
            }
            bt.prep.clear();
            let px = bt.prep.get(&bt.xhat[..n * 4 * h], n, &m.phi_pre)?;
            matmul(&m.phi_pre, px, n, 4 * l, 4, &mut bt.p_pre[..n * 4]);
            let px = bt.prep.get(&bt.xhat[..n * 4 * h], n, &m.phi_post)?;
            matmul(&m.phi_post, px, n, 4 * l, 4, &mut bt.p_post[..n * 4]);
            let px = bt.prep.get(&bt.xhat[..n * 4 * h], n, &m.phi_res)?;
            matmul(&m.phi_res, px, n, 16 * l, 16, &mut bt.p_res[..n * 16]);

            // 3–5: pre-mix, engram gate, attention norm, per token.
            {
                let site = site_of(l);
                let (u, b) = (SharedSlice::new(&mut bt.u), SharedSlice::new(&mut bt.b));
                let (a, tmp) = (SharedSlice::new(&mut bt.a), SharedSlice::new(&mut bt.tmp));
                let (lanes, p_pre) = (&bt.lanes, &bt.p_pre);
                let (keys, values) = (&bt.site_key, &bt.site_value);
                per_token(n, 4 * h, &|_, t| {
                    // SAFETY: token t owns its rows.
                    let (u, b, a, tmp) =
                        unsafe { (row(&u, t, h), row(&b, t, h), row(&a, t, h), row(&tmp, t, h)) };
                    let lanes_t = &lanes[t * 4 * h..(t + 1) * 4 * h];
                    block::mix_pre(l, m, lanes_t, &p_pre[t * 4..t * 4 + 4], u);
                    b.copy_from_slice(u);
                    if let (Some(i), Some(ew)) = (site, &w.engram) {
                        let (key, value) =
                            (&keys[i][t * h..(t + 1) * h], &values[i][t * h..(t + 1) * h]);
                        block::engram_gate(&ew.sites[i], u, key, value, a, tmp, b);
                    }
                    zcrms_into(b, &lw.attn_norm, a);
                });
            }
            note(&mut bad, t0, &bt.u[..n * h], h, || format!("layer {l} u"));
            note(&mut bad, t0, &bt.b[..n * h], h, || {
                format!("layer {l} block_in")
            });

            bt.prep.clear();
            let pa = bt.prep.get(&bt.a[..n * h], n, &lw.wq)?;
            matmul(&lw.wq, pa, n, 0, qd, &mut bt.q[..n * qd]);
            let pa = bt.prep.get(&bt.a[..n * h], n, &lw.wk)?;
            matmul(&lw.wk, pa, n, 0, kvd, &mut bt.k[..n * kvd]);
            let pa = bt.prep.get(&bt.a[..n * h], n, &lw.wv)?;
            matmul(&lw.wv, pa, n, 0, kvd, &mut bt.v[..n * kvd]);
            let pa = bt.prep.get(&bt.a[..n * h], n, &lw.wg)?;
            matmul(&lw.wg, pa, n, 0, qd, &mut bt.g[..n * qd]);
            {
                let (q, k) = (SharedSlice::new(&mut bt.q), SharedSlice::new(&mut bt.k));
                let (cos, sin) = (&bt.cos, &bt.sin);
                let half = hd / 2;
                per_token(n, qd, &|_, t| {
                    // SAFETY: token t owns its rows.
                    let (q, k) = unsafe { (row(&q, t, qd), row(&k, t, kvd)) };
                    let (cs, sn) = (
                        &cos[t * half..(t + 1) * half],
                        &sin[t * half..(t + 1) * half],
                    );
                    block::qk_norm_rope(lw, hd, cs, sn, q, k);
                });
            }

            note(&mut bad, t0, &bt.q[..n * qd], qd, || format!("layer {l} q"));
            note(&mut bad, t0, &bt.k[..n * kvd], kvd, || {
                format!("layer {l} k")
            });
            note(&mut bad, t0, &bt.v[..n * kvd], kvd, || {
                format!("layer {l} v")
            });

            // Causal attention. The layer's cache rows as they are before the chunk…
            for j in 0..c.kv_heads {
                let (src, dst) = ((l * c.kv_heads + j) * rows, j * vr);
                bt.kv_k[dst * hd..(dst + rows) * hd]
                    .copy_from_slice(&st.k_codes[src * hd..(src + rows) * hd]);
                bt.kv_v[dst * hd..(dst + rows) * hd]
                    .copy_from_slice(&st.v_codes[src * hd..(src + rows) * hd]);
                bt.kv_ks[dst..dst + rows].copy_from_slice(&st.k_scale[src..src + rows]);
                bt.kv_vs[dst..dst + rows].copy_from_slice(&st.v_scale[src..src + rows]);
            }
            // …then the chunk's keys and values behind them, quantized per token…
            {
                let (kk, kv) = (
                    SharedSlice::new(&mut bt.kv_k),
                    SharedSlice::new(&mut bt.kv_v),
                );
                let (ks, vs) = (
                    SharedSlice::new(&mut bt.kv_ks),
                    SharedSlice::new(&mut bt.kv_vs),
                );
                let (k, v) = (&bt.k, &bt.v);
                per_token(n, kvd, &|_, t| {
                    for j in 0..c.kv_heads {
                        let r = j * vr + rows + t;
                        let head = t * kvd + j * hd..t * kvd + (j + 1) * hd;
                        // SAFETY: row r of every table belongs to token t alone.
                        unsafe {
                            ks.range(r..r + 1)[0] =
                                quantize_int8(&k[head.clone()], kk.range(r * hd..(r + 1) * hd));
                            vs.range(r..r + 1)[0] =
                                quantize_int8(&v[head], kv.range(r * hd..(r + 1) * hd));
                        }
                    }
                });
            }
            // …every token attending over its rows, in parallel…
            {
                let o = SharedSlice::new(&mut bt.o);
                let scores = SharedSlice::new(&mut bt.scores);
                let (q, gate) = (&bt.q, &bt.g);
                let (slots, slot_at) = (&bt.slots, &bt.slot_at);
                let (kk, kv, ks, vs) = (&bt.kv_k, &bt.kv_v, &bt.kv_ks, &bt.kv_vs);
                let g = c.heads / c.kv_heads;
                per_token(n, rows * kvd, &|part, t| {
                    let tslots = &slots[slot_at[t]..slot_at[t + 1]];
                    let (qt, gt) = (&q[t * qd..(t + 1) * qd], &gate[t * qd..(t + 1) * qd]);
                    for j in 0..c.kv_heads {
                        let view = KvHeadView {
                            k: &kk[j * vr * hd..(j + 1) * vr * hd],
                            v: &kv[j * vr * hd..(j + 1) * vr * hd],
                            k_scale: &ks[j * vr..(j + 1) * vr],
                            v_scale: &vs[j * vr..(j + 1) * vr],
                        };
                        let at = t * qd + j * g * hd;
                        let sc = part * c.heads * rows;
                        // SAFETY: token t owns its row of `o`, part `part` its scores.
                        let (oj, sj) = unsafe {
                            (
                                o.range(at..at + g * hd),
                                scores.range(sc..sc + g * tslots.len()),
                            )
                        };
                        block::attend_kv_head(c, j, &view, qt, gt, tslots, oj, sj);
                    }
                });
            }
            // …and the chunk's rows into the cache in token order (a later
            // position overwrites an earlier one at the same row, as in stepping).
            for t in 0..n {
                let slot = physical_slot(t0 + t as u64, c.sink, c.window);
                for j in 0..c.kv_heads {
                    let (src, dst) = (j * vr + rows + t, (l * c.kv_heads + j) * rows + slot);
                    st.k_codes[dst * hd..(dst + 1) * hd]
                        .copy_from_slice(&bt.kv_k[src * hd..(src + 1) * hd]);
                    st.v_codes[dst * hd..(dst + 1) * hd]
                        .copy_from_slice(&bt.kv_v[src * hd..(src + 1) * hd]);
                    st.k_scale[dst] = bt.kv_ks[src];
                    st.v_scale[dst] = bt.kv_vs[src];
                }
            }
            note(&mut bad, t0, &bt.o[..n * qd], qd, || {
                format!("layer {l} attn_o")
            });
            bt.prep.clear();
            let po = bt.prep.get(&bt.o[..n * qd], n, &lw.wo)?;
            matmul(&lw.wo, po, n, 0, h, &mut bt.attn[..n * h]);

            // 5 (end) – 9: residual, MLP, update and routing, per token.
            {
                let (attn, after) = (
                    SharedSlice::new(&mut bt.attn),
                    SharedSlice::new(&mut bt.after),
                );
                let (out, next) = (
                    SharedSlice::new(&mut bt.out),
                    SharedSlice::new(&mut bt.next),
                );
                let z = SharedSlice::new(&mut bt.z);
                let (b, u, lanes) = (&bt.b, &bt.u, &bt.lanes);
                let (p_post, p_res) = (&bt.p_post, &bt.p_res);
                let hdim = c.hadamard_dim;
                per_token(n, c.hadamard_dim + 4 * h, &|part, t| {
                    // SAFETY: token t owns its rows, pool part `part` its MLP scratch.
                    let (attn, after, out, next, z) = unsafe {
                        (
                            row(&attn, t, h),
                            row(&after, t, h),
                            row(&out, t, h),
                            row(&next, t, 4 * h),
                            row(&z, part, hdim),
                        )
                    };
                    let (b, u) = (&b[t * h..(t + 1) * h], &u[t * h..(t + 1) * h]);
                    block::after_attention(lw, b, attn, after);
                    hadamard_mlp(
                        after,
                        &lw.mlp_norm,
                        &lw.mlp_d1,
                        &lw.mlp_d2,
                        &lw.mlp_d3,
                        z,
                        out,
                    );
                    for (o, u) in out.iter_mut().zip(u) {
                        *o -= u;
                    }
                    block::route_lanes(
                        l,
                        m,
                        c.sinkhorn_iters,
                        &p_post[t * 4..t * 4 + 4],
                        &p_res[t * 16..t * 16 + 16],
                        &lanes[t * 4 * h..(t + 1) * 4 * h],
                        out,
                        next,
                    );
                });
            }
            note(&mut bad, t0, &bt.after[..n * h], h, || {
                format!("layer {l} after_attn")
            });
            // `out` now holds the update; with `u` finite it is non-finite exactly
            // where the MLP output is (the step checks that first).
            note(&mut bad, t0, &bt.out[..n * h], h, || {
                format!("layer {l} mlp_out")
            });
            std::mem::swap(&mut bt.lanes, &mut bt.next);
            note(&mut bad, t0, &bt.lanes[..n * 4 * h], 4 * h, || {
                format!("layer {l} lanes")
            });
        }
        self.pos += n as u64;
        self.logits_valid = false;
        if let Some((position, tensor)) = bad {
            return Err(Error::NonFinite { tensor, position });
        }
        if want_logits {
            let s = &mut self.s;
            block::final_hidden(
                &bt.lanes[(n - 1) * 4 * h..n * 4 * h],
                &w.final_norm,
                &mut s.a,
            );
            s.prep.clear();
            w.embed
                .matvec_rows_prepared(s.prep.get(&s.a, &w.embed), 0, &mut self.logits);
            if !self.logits.iter().all(|v| v.is_finite()) {
                return Err(Error::NonFinite {
                    tensor: "logits".into(),
                    position: t0 + n as u64 - 1,
                });
            }
            self.logits_valid = true;
        }
        Ok(())
    }
}
