//! The SPEC §4 program on the CPU, one driver for a decode step and a prefill
//! chunk alike, for one sequence or several: [`forward_many`] takes `n ≥ 1` tokens through the embedding, the
//! engram sites and every layer, layer by layer, composing the twins of
//! [`crate::kernels`] in the order the GPU dispatches them, with the
//! [`StepHooks`] watching.
//!
//! For one token this is the decode step (the matvecs and the attention split
//! their rows or heads over the pool). For a chunk, one pass over a CQ matrix
//! serves every token (the 8-lane kernels decode each weight vector once for
//! four tokens, see [`crate::cq::CqMatrix::matmul_rows_prepared`]; shared
//! inputs are prepared and laid out once, [`ChunkPrep`]), the per-token work
//! between the matvecs is split over the pool by token, and causal attention
//! inside the chunk is [`ChunkAttention`]. The batched matvec is bit-identical
//! to the single one, so a chunk gives exactly the values of one step per token.

use super::attention::attend_segments;
use super::fast::{fast_set as model_fast_set, Product};
use super::hooks::{RowScan, StepHooks};
use super::par::{per_rows, per_token, row, splits};
use super::prep::ChunkPrep;
use super::scratch::Scratch;
use super::state::State;
use crate::cq::FastSet;
use crate::engine::precision::Precision;
use crate::engine::profile::bytes;
use crate::error::Result;
use crate::host::pool::SharedSlice;
use crate::kernels::attention::qk_norm_rope;
use crate::kernels::engram::conv;
use crate::kernels::gather::gather;
use crate::kernels::mhc::{mix_lanes, post_gates, premix, sinkhorn_routes, EngramGate};
use crate::kernels::mlp;
use crate::kernels::prepare::{pre_op, PrepareMode};
use crate::kernels::rope::rope_table_at;
use crate::model::engram::table_rows_for;
use crate::model::weights::{LayerWeights, Model};

/// One sequence's part of a [`forward_many`] pass: its state and its ids.
pub(super) struct Segment<'a> {
    /// The sequence's state (positions, history, rings, KV cache).
    pub(super) st: &'a mut State,
    /// Its ids (at least one), appended at `st.pos ..`.
    pub(super) ids: &'a [u32],
    /// Whether the pass computes the logits after its last id.
    pub(super) logits: bool,
}

/// Append every segment's ids (`1 ≤ n` each, all `< vocab`, which the caller
/// has checked) to its own state in one pass, advancing the states: the CQ
/// matvecs serve the tokens of all of them at once (one pass over each matrix),
/// everything per sequence (engram history and rings, positions, KV cache,
/// attention) runs on its own state. With `logits`, the logits after the last
/// id of each segment that asks for them ([`Segment::logits`]), `[such
/// segments, vocab]` in segment order. Each segment's values are bit-identical
/// to a pass of it alone (the batched matvec is bit-identical to the single
/// one), whatever the number of its ids. Hooks see positions from the first
/// segment's; probes are meant for one segment.
///
/// # Errors
/// [`crate::Error::Alloc`] if a buffer can't grow; [`crate::Error::NonFinite`]
/// naming the first non-finite tensor of the first bad position (the states
/// have advanced over all the ids).
pub(super) fn forward_many(
    model: &Model,
    segs: &mut [Segment<'_>],
    s: &mut Scratch,
    hooks: &mut StepHooks,
    logits: Option<&mut [f32]>,
) -> Result<()> {
    let c = &model.config;
    let w = &model.weights;
    let n: usize = segs.iter().map(|g| g.ids.len()).sum();
    let t0 = segs[0].st.pos;
    let (h, half) = (c.hidden, c.head_dim / 2);
    debug_assert!(
        segs.iter().all(|g| !g.ids.is_empty()),
        "a segment of no tokens"
    );
    s.grow(c, n)?;
    s.seg_start.clear();
    s.seg_pos.clear();
    let mut at = 0;
    for g in segs.iter() {
        s.seg_start.push(at);
        s.seg_pos.push(g.st.pos);
        at += g.ids.len();
    }

    // 4.1 Embedding.
    s.ids.clear();
    s.ids.extend(segs.iter().flat_map(|g| g.ids.iter()));
    let ids = &s.ids;
    per_rows(n, 4 * h, [(&mut s.lanes, 4 * h)], &|_, t, [lanes]| {
        gather(&w.embed, ids[t] as usize, (h as f32).sqrt(), 4, h, lanes);
    });
    for t in 0..n {
        // The four lanes start equal: the probe sees one.
        hooks.rows(t0 + t as u64, "x0", None, &s.lanes[t * 4 * h..][..h], h);
    }
    hooks
        .clock
        .lap("gather", || n as u64 * bytes::gather(&w.embed, 4));

    // 4.2 Engram (or just the history without it).
    engram(model, segs, s, n, hooks)?;

    // RoPE tables and attended cache rows of every position, shared by all layers.
    if s.attention.len() < segs.len() {
        s.attention.resize_with(segs.len(), Default::default);
    }
    s.positions.clear();
    for (i, g) in segs.iter().enumerate() {
        let pos = s.seg_pos[i];
        s.positions.extend((0..g.ids.len() as u64).map(|j| pos + j));
        s.attention[i].plan(c, pos, g.ids.len());
    }
    if segs.len() > 1 {
        s.segment_work.plan(&s.attention[..segs.len()], c.kv_heads);
    }
    let (positions, freqs) = (&s.positions, &s.rope_freqs);
    // An f64 cosine and sine per entry: far more work than its floats say.
    per_rows(
        n,
        256 * half,
        [(&mut s.cos, half), (&mut s.sin, half)],
        &|_, t, [cos, sin]| {
            rope_table_at(positions[t], freqs, cos, sin);
        },
    );
    hooks.clock.mark();

    for l in 0..w.layers.len() {
        layer(model, l, segs, s, n, hooks)?;
    }
    for g in segs.iter_mut() {
        g.st.pos += g.ids.len() as u64;
    }

    if let Some(out) = logits {
        let k = segs.iter().filter(|g| g.logits).count();
        if k == 0 {
            return hooks.check();
        }
        // The wanted segments' last tokens' lanes, side by side (one segment: in place).
        let lanes = if segs.len() == 1 {
            &s.lanes[(n - 1) * 4 * h..n * 4 * h]
        } else {
            s.last_lanes.clear();
            for (i, g) in segs.iter().enumerate().filter(|(_, g)| g.logits) {
                let last = s.seg_start[i] + g.ids.len() - 1;
                s.last_lanes
                    .extend_from_slice(&s.lanes[last * 4 * h..(last + 1) * 4 * h]);
            }
            &s.last_lanes[..]
        };
        let a = &mut s.a[..k * h];
        logits_into(model, lanes, k, a, &mut s.prep, hooks, out)?;
        let vocab = c.vocab;
        for (i, g) in segs.iter().filter(|g| g.logits).enumerate() {
            let last = g.st.pos - 1; // advanced above
            hooks.rows(
                last,
                "logits",
                None,
                &out[i * vocab..(i + 1) * vocab],
                vocab,
            );
        }
    }
    hooks.check()
}

/// SPEC §4.2 for the pass: push every id to its sequence's history; with engram
/// sites, the table rows of every token, then each site's projections of all
/// tokens, then each sequence's rings and convolutions token by token.
fn engram(
    model: &Model,
    segs: &mut [Segment<'_>],
    s: &mut Scratch,
    n: usize,
    hooks: &mut StepHooks,
) -> Result<()> {
    let (c, w) = (&model.config, &model.weights);
    let (Some(ec), Some(ew)) = (&c.engram, &w.engram) else {
        for g in segs.iter_mut() {
            g.ids.iter().for_each(|&id| g.st.history.push(id));
        }
        return Ok(());
    };
    let (t0, h) = (segs[0].st.pos, c.hidden);
    let (ed, tables) = (ec.e_dim(), ec.tables());
    let mut t = 0;
    for g in segs.iter_mut() {
        for &id in g.ids {
            g.st.history.push(id);
            table_rows_for(&g.st.history, ec, &g.st.table_rows, &mut s.idx);
            s.table_idx[t * tables..(t + 1) * tables].copy_from_slice(&s.idx);
            t += 1;
        }
    }
    let table_idx = &s.table_idx;
    per_rows(n, ed, [(&mut s.e, ed)], &|_, t, [e]| {
        for (k, table) in ew.tables.iter().enumerate() {
            let row = table_idx[t * tables + k];
            gather(table, row, 1.0, 1, ec.dim, &mut e[k * ec.dim..][..ec.dim]);
        }
    });
    for table in &ew.tables {
        hooks
            .clock
            .lap("gather", || n as u64 * bytes::gather(table, 1));
    }
    let e = &s.e[..n * ed];
    hooks.rows(t0, "engram.e", None, e, ed);
    let fast = fast_set(model, &s.prep);
    s.prep.clear();
    let mats: Vec<_> = match hooks.is_timed() {
        true => ew.sites.iter().flat_map(|x| [&x.wv, &x.wk]).collect(),
        false => Vec::new(),
    };
    hooks
        .clock
        .prepare(&mut s.prep, (e, n), &mats, (ed, 1, false))?;
    for (i, site) in ew.sites.iter().enumerate() {
        let (keys, values) = (&mut s.site_key[i][..n * h], &mut s.site_value[i][..n * h]);
        let site_v = &mut s.site_v[..n * h];
        let product = Product::Site(i);
        let parts = product.parts(model);
        let fast = fast.map(|f| product.fast(model, f));
        s.prep
            .project(fast, &parts, e, n, &mut [&mut site_v[..], &mut keys[..]])?;
        hooks.clock.lap_product(&parts, n);
        let mut t = 0;
        for g in segs.iter_mut() {
            for j in 0..g.ids.len() {
                let (v, value) = (&site_v[t * h..][..h], &mut values[t * h..][..h]);
                let pos = g.st.pos + j as u64;
                let ring = &mut g.st.rings[i];
                conv(pos, ec.taps, ec.dilation, v, &site.conv, ring, value);
                t += 1;
            }
        }
        hooks
            .clock
            .lap("engram_conv", || n as u64 * bytes::engram_conv(h, ec.taps));
        let layer = site.layer;
        hooks.rows(t0, format_args!("engram.key.{layer}"), None, keys, h);
        hooks.rows(t0, format_args!("engram.value.{layer}"), None, values, h);
    }
    Ok(())
}

/// SPEC §4.3 layer `l` for the pass's `n` tokens (each segment at its
/// positions `st.pos ..`, not yet advanced), the lanes in place.
fn layer(
    model: &Model,
    l: usize,
    segs: &mut [Segment<'_>],
    s: &mut Scratch,
    n: usize,
    hooks: &mut StepHooks,
) -> Result<()> {
    let (c, w) = (&model.config, &model.weights);
    let (m, lw) = (&w.mhc, &w.layers[l]);
    let (t0, lo) = (segs[0].st.pos, Some(l));
    let (h, qd) = (c.hidden, c.q_dim());

    // 1–2: mHC projections.
    let lanes = &s.lanes;
    per_rows(n, 4 * h, [(&mut s.xhat, 4 * h)], &|_, t, [x]| {
        let src = &lanes[t * 4 * h..(t + 1) * 4 * h];
        pre_op(PrepareMode::RmsUnit, src, 4 * h, 0, &[], x);
    });
    s.prep.clear();
    let xhat = &s.xhat[..n * 4 * h];
    let phis = [&m.phi_pre, &m.phi_post, &m.phi_res];
    hooks
        .clock
        .prepare(&mut s.prep, (xhat, n), &phis, (4 * h, 1, false))?;
    let product = Product::Phi(l);
    let parts = product.parts(model);
    let outs = &mut [
        &mut s.p_pre[..n * 4],
        &mut s.p_post[..n * 4],
        &mut s.p_res[..n * 16],
    ];
    let fast = fast_set(model, &s.prep).map(|f| product.fast(model, f));
    s.prep.project(fast, &parts, xhat, n, outs)?;
    hooks.clock.lap_product(&parts, n);

    // 3–4: pre-mix and engram gate.
    let site = w
        .engram
        .as_ref()
        .and_then(|ew| Some((ew, ew.sites.iter().position(|x| x.layer == l)?)));
    let (lanes, p_pre) = (&s.lanes, &s.p_pre);
    let (keys, values) = (&s.site_key, &s.site_value);
    let scans = [RowScan::new(), RowScan::new()];
    per_rows(n, 4 * h, [(&mut s.u, h), (&mut s.b, h)], &|_, t, [u, b]| {
        let gate = site.map(|(ew, i)| EngramGate {
            key: &keys[i][t * h..(t + 1) * h],
            value: &values[i][t * h..(t + 1) * h],
            norm_u: &ew.sites[i].norm_u,
            norm_k: &ew.sites[i].norm_k,
        });
        let lanes_t = &lanes[t * 4 * h..(t + 1) * 4 * h];
        let (b_pre, p) = (&m.b_pre[4 * l..4 * l + 4], &p_pre[t * 4..t * 4 + 4]);
        premix(l, m.a_pre[l], b_pre, p, lanes_t, gate, u, b);
        scans[0].note(t, u);
        scans[1].note(t, b);
    });
    hooks.rows_scanned(t0, "u", lo, &s.u[..n * h], &scans[0]);
    let at_site = site.is_some();
    hooks
        .clock
        .lap("premix", || n as u64 * bytes::premix(h, at_site));
    hooks.rows_scanned(t0, "block_in", lo, &s.b[..n * h], &scans[1]);

    // 5: attention, and its output projection.
    attention(model, l, segs, s, n, hooks)?;
    s.prep.clear();
    let o = &s.o[..n * qd];
    hooks
        .clock
        .prepare(&mut s.prep, (o, n), &[&lw.wo], (qd, 1, false))?;
    let product = Product::Wo(l);
    let parts = product.parts(model);
    let fast = fast_set(model, &s.prep).map(|f| product.fast(model, f));
    s.prep
        .project(fast, &parts, o, n, &mut [&mut s.attn[..n * h]])?;
    hooks.clock.lap_product(&parts, n);

    // 5 (end)–7: residual, Hadamard MLP, update = out − u; and step 8's
    // Sinkhorn routes, which need only p_res: beside the MLP.
    let (b, u, attn) = (&s.b, &s.u, &s.attn);
    let (hd, z) = (c.hadamard_dim, SharedSlice::new(&mut s.z));
    let outs = [(&mut s.after, h), (&mut s.out, h), (&mut s.update, h)];
    let mlp_work = hd + 4 * h;
    let scans = [RowScan::new(), RowScan::new(), RowScan::new()];
    let mlp = || {
        per_rows(n, mlp_work, outs, &|part, t, [after, out, update]| {
            // SAFETY: pool part `part` owns its MLP scratch.
            let z = unsafe { row(&z, part, hd) };
            let tok = t * h..(t + 1) * h;
            let (b, u, attn) = (&b[tok.clone()], &u[tok.clone()], &attn[tok]);
            let norms = (lw.attn_out_scale, &lw.attn_post_norm, &lw.mlp_norm);
            let d = [&lw.mlp_d1[..], &lw.mlp_d2, &lw.mlp_d3];
            mlp::block(
                b, u, attn, norms.0, norms.1, norms.2, d, z, after, out, update,
            );
            scans[0].note(t, after);
            scans[1].note(t, out);
            scans[2].note(t, update);
        })
    };
    let (a_res, b_res) = (m.a_res[l], &m.b_res[16 * l..16 * l + 16]);
    let (p_res, iters) = (&s.p_res[..n * 16], c.sinkhorn_iters);
    let route_out = &mut s.route[..n * 16];
    // A pass whose MLP stays on one thread (a decode step, a batch of a few
    // sequences) routes its tokens at once on another, beside it.
    if splits(n, mlp_work) {
        mlp();
        routes_of(a_res, p_res, b_res, iters, route_out);
    } else {
        let routes = || sinkhorn_routes(a_res, p_res, b_res, iters, route_out);
        beside(mlp, routes);
    }
    hooks.rows_scanned(t0, "after_attn", lo, &s.after[..n * h], &scans[0]);
    hooks.rows_scanned(t0, "mlp_out", lo, &s.out[..n * h], &scans[1]);
    hooks.clock.lap("mlp", || n as u64 * bytes::mlp(h, hd));
    hooks.rows_scanned(t0, "update", lo, &s.update[..n * h], &scans[2]);

    // 8 (the gates)–9: routing, in place on the lanes.
    let (p_post, update, routes) = (&s.p_post, &s.update, &s.route);
    let scan = RowScan::new();
    per_rows(n, 5 * h, [(&mut s.lanes, 4 * h)], &|_, t, [lanes]| {
        let b_post = &m.b_post[4 * l..4 * l + 4];
        let hpost = post_gates(l, m.a_post[l], &p_post[t * 4..t * 4 + 4], b_post);
        let r = &routes[t * 16..t * 16 + 16];
        let r: [[f32; 4]; 4] = std::array::from_fn(|i| std::array::from_fn(|j| r[4 * i + j]));
        mix_lanes(&hpost, &r, &update[t * h..(t + 1) * h], lanes);
        scan.note(t, lanes);
    });
    if hooks.is_probed() {
        hooks.rows(t0, "route", lo, &s.route[..n * 16], 16);
    }
    hooks.clock.lap("route", || n as u64 * bytes::route(h));
    hooks.rows_scanned(t0, "lanes", lo, &s.lanes[..n * 4 * h], &scan);
    Ok(())
}

/// SPEC §4.3 step 5 of layer `l` up to the gated head outputs `o`: the attention
/// norm, the q k v g projections, Q/K norm and RoPE with the KV store, and the
/// attention of every token ([`super::attention::ChunkAttention`]).
fn attention(
    model: &Model,
    l: usize,
    segs: &mut [Segment<'_>],
    s: &mut Scratch,
    n: usize,
    hooks: &mut StepHooks,
) -> Result<()> {
    let c = &model.config;
    let lw: &LayerWeights = &model.weights.layers[l];
    let (t0, lo) = (segs[0].st.pos, Some(l));
    let (h, hd, qd, kvd, half) = (c.hidden, c.head_dim, c.q_dim(), c.kv_dim(), c.head_dim / 2);

    let b = &s.b;
    per_rows(n, 2 * h, [(&mut s.a, h)], &|_, t, [a]| {
        pre_op(
            PrepareMode::Zcrms,
            &b[t * h..(t + 1) * h],
            h,
            0,
            &lw.attn_norm,
            a,
        );
    });
    s.prep.clear();
    let a = &s.a[..n * h];
    let mats = [&lw.wq, &lw.wk, &lw.wv, &lw.wg];
    hooks
        .clock
        .prepare(&mut s.prep, (a, n), &mats, (h, 1, true))?;
    let product = Product::Qkvg(l);
    let parts = product.parts(model);
    let outs = &mut [
        &mut s.q[..n * qd],
        &mut s.k[..n * kvd],
        &mut s.v[..n * kvd],
        &mut s.g[..n * qd],
    ];
    let fast = fast_set(model, &s.prep).map(|f| product.fast(model, f));
    s.prep.project(fast, &parts, a, n, outs)?;
    hooks.clock.lap_product(&parts, n);

    let (cos, sin, v) = (&s.cos, &s.sin, &s.v);
    let scans = [RowScan::new(), RowScan::new(), RowScan::new()];
    per_rows(n, qd, [(&mut s.q, qd), (&mut s.k, kvd)], &|_, t, [q, k]| {
        let (cs, sn) = (
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
        );
        qk_norm_rope(&lw.q_norm, &lw.k_norm, cs, sn, q, k);
        scans[0].note(t, q);
        scans[1].note(t, k);
        scans[2].note(t, &v[t * kvd..(t + 1) * kvd]);
    });
    let (q, k, v) = (&s.q[..n * qd], &s.k[..n * kvd], &s.v[..n * kvd]);
    for (i, g) in segs.iter_mut().enumerate() {
        let r = s.seg_start[i]..s.seg_start[i] + g.ids.len();
        let (k, v) = (
            &k[r.start * kvd..r.end * kvd],
            &v[r.start * kvd..r.end * kvd],
        );
        s.attention[i].store(c, &mut g.st.kv, l, k, v)?;
    }
    hooks.rows_scanned(t0, "q", lo, q, &scans[0]);
    hooks.rows_scanned(t0, "k", lo, k, &scans[1]);
    hooks.rows_scanned(t0, "v", lo, v, &scans[2]);
    hooks.clock.lap("qk_store", || {
        n as u64 * bytes::qk_store(c.heads, c.kv_heads, hd)
    });

    let scan = RowScan::new();
    if segs.len() > 1 {
        // Several sequences: all their attention in one pool job.
        let plans = &s.attention[..segs.len()];
        let caches = &*segs;
        let qg = (&s.q[..n * qd], &s.g[..n * qd]);
        let (o, scores, work) = (&mut s.o[..n * qd], &mut s.scores, &s.segment_work);
        let cache = |i: usize| &caches[i].st.kv;
        attend_segments(
            c,
            l,
            plans,
            &cache,
            &s.seg_start,
            qg,
            o,
            scores,
            work,
            &scan,
        );
        for (i, seg) in segs.iter_mut().enumerate() {
            s.attention[i].finish(c, &mut seg.st.kv, l);
        }
    } else {
        let seg = &mut segs[0];
        let (q, g) = (&s.q[..n * qd], &s.g[..n * qd]);
        let (o, scores) = (&mut s.o[..n * qd], &mut s.scores);
        s.attention[0].attend(c, &seg.st.kv, l, q, g, o, scores, &scan);
        s.attention[0].finish(c, &mut seg.st.kv, l);
    }
    let plans = &s.attention[..segs.len()];
    hooks.clock.lap("attend", || {
        plans
            .iter()
            .flat_map(|p| p.attended())
            .map(|k| bytes::attend(c.heads, hd, k))
            .sum()
    });
    hooks.rows_scanned(t0, "attn_o", lo, &s.o[..n * qd], &scan);
    Ok(())
}

/// SPEC §4.4: the logits (`vocab` values each) of `k` tokens' lanes (`4 ·
/// hidden` each) after the last layer, `embed · prepare(zcrms(mean of the
/// lanes, final_norm))`, into `logits` (`[k, vocab]`); `a` is scratch of `k ·
/// hidden`. The vocabulary projection is one pass over `embed` for all `k`.
///
/// # Errors
/// [`crate::Error::Alloc`] if `prep` can't grow.
fn logits_into(
    model: &Model,
    lanes: &[f32],
    k: usize,
    a: &mut [f32],
    prep: &mut ChunkPrep,
    hooks: &mut StepHooks,
    logits: &mut [f32],
) -> Result<()> {
    let (h, w) = (model.config.hidden, &model.weights);
    for (x, a) in lanes.chunks_exact(4 * h).zip(a.chunks_exact_mut(h)).take(k) {
        pre_op(PrepareMode::MeanLanesZcrms, x, h, h, &w.final_norm, a);
    }
    prep.clear();
    let a = &a[..k * h];
    hooks
        .clock
        .prepare(prep, (a, k), &[&w.embed], (h, 4, true))?;
    let vocab = model.config.vocab;
    let product = Product::Logits;
    let parts = product.parts(model);
    let fast = fast_set(model, prep).map(|f| product.fast(model, f));
    prep.project(fast, &parts, a, k, &mut [&mut logits[..k * vocab]])?;
    hooks.clock.lap_product(&parts, k);
    Ok(())
}

/// The model's fast products when `prep` runs in fast precision.
fn fast_set<'m>(model: &'m Model, prep: &ChunkPrep) -> Option<&'m FastSet> {
    (prep.precision == Precision::Fast).then(|| &**model_fast_set(model))
}

/// Run two independent works that do not use the pool themselves on two pool
/// parts at once (one after the other without a second thread).
fn beside(a: impl FnOnce() + Send, b: impl FnOnce() + Send) {
    let pool = crate::host::pool::Pool::global();
    if pool.threads() < 2 {
        a();
        b();
        return;
    }
    let jobs = std::sync::Mutex::new((Some(a), Some(b)));
    pool.run(&|part| {
        let mut j = jobs.lock().unwrap_or_else(|e| e.into_inner());
        match part {
            0 => {
                let a = j.0.take();
                drop(j);
                a.into_iter().for_each(|a| a());
            }
            1 => {
                let b = j.1.take();
                drop(j);
                b.into_iter().for_each(|b| b());
            }
            _ => {}
        }
    });
}

/// SPEC §4.3 step 8's route of every token (`p_res`: `[n, 16]`) into `out`,
/// the tokens split over the pool: one at a time while few, else in runs of
/// 16 (the router puts tokens in SIMD lanes).
fn routes_of(a: f32, p_res: &[f32], b: &[f32], iters: usize, out: &mut [f32]) {
    let n = p_res.len() / 16;
    let per = if n < 16 { 1 } else { 16 };
    let out = SharedSlice::new(out);
    // A route is ~40 half-rounds of 16 exponentials: far more work than its
    // 16 values say.
    per_token(n.div_ceil(per), 1 << 15, &|_, g| {
        let r = g * per * 16..((g + 1) * per).min(n) * 16;
        // SAFETY: run g owns its tokens' routes.
        let o = unsafe { out.range(r.clone()) };
        sinkhorn_routes(a, &p_res[r], b, iters, o);
    });
}
