//! The batched prefill: a prompt goes through each layer in chunks of tokens,
//! layer by layer, so one pass over a CQ matrix serves the whole chunk (the
//! 8-lane kernels decode each weight vector once for four tokens, see
//! [`crate::cq::CqMatrix::matmul_rows_prepared`]; inputs that several matrices
//! share are prepared and laid out for that kernel once, [`BatchPrep`]) and the
//! per-token work between the matvecs (norms, MLP, routing) is split over the
//! pool by token. Causal attention inside the chunk is [`chunk_attention`].
//! Every value is computed by the same twins of [`crate::kernels`] as the step
//! ([`super::step`]) and the batched matvec is bit-identical to the single one,
//! so a prefill gives exactly the logits of one step per token.

use super::hooks::StepHooks;
use super::par::{per_token, row};
use super::prefill_attn::{chunk_attention, ChunkQkv, ChunkSlots};
use super::prep::{matmul, BatchPrep};
use super::state::State;
use super::step::{logits_into, Scratch};
use crate::config::Config;
use crate::engram::table_rows_for;
use crate::error::Result;
use crate::kernels::attention::qk_norm_rope;
use crate::kernels::engram::conv;
use crate::kernels::gather::gather;
use crate::kernels::kv::{grow, KvCache};
use crate::kernels::mhc::{premix, route, EngramGate};
use crate::kernels::mlp;
use crate::kernels::prepare::{pre_op, PrepareMode};
use crate::kernels::rope::rope_table;
use crate::pool::{Pool, SharedSlice};
use crate::weights::Model;

/// Tokens per prefill chunk unless `CpuEngine::set_prefill_chunk` says otherwise.
pub(super) const DEFAULT_CHUNK: usize = 64;

/// A chunk's per-token buffers hold at most about this many floats (the chunk is
/// shortened for very wide models).
const MAX_CHUNK_FLOATS: usize = 16 << 20;

/// Work buffers of a chunk, token-major (`[tokens, width]`), grown on demand.
#[derive(Debug, Default)]
pub(super) struct Batch {
    lanes: Vec<f32>,
    xhat: Vec<f32>,
    p_pre: Vec<f32>,
    p_post: Vec<f32>,
    p_res: Vec<f32>,
    u: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    o: Vec<f32>,
    attn: Vec<f32>,
    after: Vec<f32>,
    out: Vec<f32>,
    update: Vec<f32>,
    /// One MLP scratch of `hadamard_dim` per pool part.
    z: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    slots: ChunkSlots,
    /// The layer-local KV table of the chunk attention.
    table: KvCache,
    /// Attention scores, `heads · cache_rows` per pool part.
    scores: Vec<f32>,
    e: Vec<f32>,
    site_v: Vec<f32>,
    site_key: Vec<Vec<f32>>,
    site_value: Vec<Vec<f32>>,
    idx: Vec<usize>,
    prep: BatchPrep,
}

/// The chunk length the prefill uses for `c` when `chunk` is asked for (shortened
/// so a chunk's buffers stay within about 64 MiB).
pub(super) fn chunk_len(c: &Config, chunk: usize) -> usize {
    let e = c
        .engram
        .as_ref()
        .map_or(0, |e| e.e_dim() + 2 * e.sites.len() * c.hidden);
    let per_token = 16 * c.hidden + 5 * c.q_dim() + c.head_dim + e;
    chunk
        .max(1)
        .min((MAX_CHUNK_FLOATS / per_token.max(1)).max(1))
}

/// Append `ids` (all `< vocab`) in chunks of `chunk` tokens; with `logits`, the
/// logits after the last id into it.
///
/// # Errors
/// [`crate::Error::Alloc`] if a buffer can't grow; [`crate::Error::NonFinite`]
/// for the first non-finite tensor of a chunk, after the whole chunk.
pub(super) fn prefill(
    model: &Model,
    st: &mut State,
    bt: &mut Batch,
    s: &mut Scratch,
    ids: &[u32],
    chunk: usize,
    mut logits: Option<&mut [f32]>,
) -> Result<()> {
    let chunk = chunk_len(&model.config, chunk);
    for (i, part) in ids.chunks(chunk).enumerate() {
        let last = (i + 1) * chunk >= ids.len();
        let out = if last { logits.as_deref_mut() } else { None };
        prefill_chunk(model, st, bt, s, part, out)?;
    }
    Ok(())
}

/// Grow every per-token buffer of `bt` for `n` tokens of `c`.
fn grow_batch(c: &Config, bt: &mut Batch, n: usize) -> Result<()> {
    let (h, hd, qd, kvd) = (c.hidden, c.head_dim, c.q_dim(), c.kv_dim());
    for (v, len) in [
        (&mut bt.lanes, 4 * h),
        (&mut bt.xhat, 4 * h),
        (&mut bt.p_pre, 4),
        (&mut bt.p_post, 4),
        (&mut bt.p_res, 16),
        (&mut bt.u, h),
        (&mut bt.b, h),
        (&mut bt.a, h),
        (&mut bt.q, qd),
        (&mut bt.k, kvd),
        (&mut bt.v, kvd),
        (&mut bt.g, qd),
        (&mut bt.o, qd),
        (&mut bt.attn, h),
        (&mut bt.after, h),
        (&mut bt.out, h),
        (&mut bt.update, h),
        (&mut bt.cos, hd / 2),
        (&mut bt.sin, hd / 2),
    ] {
        grow(v, n * len, "prefill buffers")?;
    }
    let parts = Pool::global().threads();
    grow(&mut bt.z, parts * c.hadamard_dim, "prefill MLP scratch")?;
    grow(
        &mut bt.scores,
        parts * c.heads * c.cache_rows(),
        "prefill attention scores",
    )
}

/// One chunk of `ids` through every layer (see the module doc).
fn prefill_chunk(
    model: &Model,
    st: &mut State,
    bt: &mut Batch,
    s: &mut Scratch,
    ids: &[u32],
    logits: Option<&mut [f32]>,
) -> Result<()> {
    let c = &model.config;
    let w = &model.weights;
    let n = ids.len();
    let t0 = st.pos;
    let (h, hd) = (c.hidden, c.head_dim);
    let (qd, kvd) = (c.q_dim(), c.kv_dim());
    grow_batch(c, bt, n)?;
    let mut hooks = StepHooks::new(None, None);
    // 4.1 Embedding.
    for (t, &id) in ids.iter().enumerate() {
        let lanes = &mut bt.lanes[t * 4 * h..(t + 1) * 4 * h];
        gather(&w.embed, id as usize, (h as f32).sqrt(), 4, h, lanes);
    }
    hooks.rows(t0, "x0", None, &bt.lanes[..n * 4 * h], 4 * h);

    // 4.2 Engram: the rows of every token, then the site projections of the
    // chunk, then the rings and convolutions token by token.
    if let (Some(ec), Some(ew)) = (&c.engram, &w.engram) {
        let ed = ec.e_dim();
        grow(&mut bt.e, n * ed, "prefill engram rows")?;
        grow(&mut bt.site_v, n * h, "prefill engram values")?;
        bt.site_key.resize_with(ew.sites.len(), Vec::new);
        bt.site_value.resize_with(ew.sites.len(), Vec::new);
        for (t, &id) in ids.iter().enumerate() {
            st.history.push(id);
            table_rows_for(&st.history, ec, &st.table_rows, &mut bt.idx);
            let e = &mut bt.e[t * ed..(t + 1) * ed];
            for (k, (table, &r)) in ew.tables.iter().zip(&bt.idx).enumerate() {
                gather(
                    table,
                    r,
                    1.0,
                    1,
                    ec.dim,
                    &mut e[k * ec.dim..(k + 1) * ec.dim],
                );
            }
        }
        hooks.rows(t0, "engram.e", None, &bt.e[..n * ed], ed);
        bt.prep.clear();
        for (i, site) in ew.sites.iter().enumerate() {
            grow(&mut bt.site_key[i], n * h, "prefill engram keys")?;
            grow(&mut bt.site_value[i], n * h, "prefill engram values")?;
            let pv = bt.prep.get(&bt.e[..n * ed], n, &site.wv)?;
            matmul(&site.wv, pv, n, 0, h, &mut bt.site_v[..n * h]);
            let pk = bt.prep.get(&bt.e[..n * ed], n, &site.wk)?;
            matmul(&site.wk, pk, n, 0, h, &mut bt.site_key[i][..n * h]);
            for t in 0..n {
                let (v, value) = (
                    &bt.site_v[t * h..(t + 1) * h],
                    &mut bt.site_value[i][t * h..(t + 1) * h],
                );
                let pos = t0 + t as u64;
                conv(
                    pos,
                    ec.taps,
                    ec.dilation,
                    v,
                    &site.conv,
                    &mut st.rings[i],
                    value,
                );
            }
            let key = format!("engram.key.{}", site.layer);
            hooks.rows(t0, &key, None, &bt.site_key[i][..n * h], h);
            let value = format!("engram.value.{}", site.layer);
            hooks.rows(t0, &value, None, &bt.site_value[i][..n * h], h);
        }
    } else {
        for &id in ids {
            st.history.push(id);
        }
    }

    // RoPE tables and attended cache rows of every position of the chunk.
    let half = hd / 2;
    for t in 0..n {
        let (cos, sin) = (&mut bt.cos[t * half..], &mut bt.sin[t * half..]);
        rope_table(
            t0 + t as u64,
            c.rope_theta,
            hd,
            &mut cos[..half],
            &mut sin[..half],
        );
    }
    bt.slots.fill(c, t0, n);

    let m = &w.mhc;
    for (l, lw) in w.layers.iter().enumerate() {
        let lo = Some(l);
        // 1–2: mHC projections of the chunk.
        {
            let xh = SharedSlice::new(&mut bt.xhat[..n * 4 * h]);
            let lanes = &bt.lanes;
            per_token(n, 4 * h, &|_, t| {
                // SAFETY: token t owns its row.
                let x = unsafe { row(&xh, t, 4 * h) };
                let src = &lanes[t * 4 * h..(t + 1) * 4 * h];
                pre_op(PrepareMode::RmsUnit, src, 4 * h, 0, &[], x);
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
            let site = w
                .engram
                .as_ref()
                .and_then(|ew| Some((ew, ew.sites.iter().position(|s| s.layer == l)?)));
            let (u, b) = (SharedSlice::new(&mut bt.u), SharedSlice::new(&mut bt.b));
            let a = SharedSlice::new(&mut bt.a);
            let (lanes, p_pre) = (&bt.lanes, &bt.p_pre);
            let (keys, values) = (&bt.site_key, &bt.site_value);
            per_token(n, 4 * h, &|_, t| {
                // SAFETY: token t owns its rows.
                let (u, b, a) = unsafe { (row(&u, t, h), row(&b, t, h), row(&a, t, h)) };
                let lanes_t = &lanes[t * 4 * h..(t + 1) * 4 * h];
                let gate = site.map(|(ew, i)| EngramGate {
                    key: &keys[i][t * h..(t + 1) * h],
                    value: &values[i][t * h..(t + 1) * h],
                    norm_u: &ew.sites[i].norm_u,
                    norm_k: &ew.sites[i].norm_k,
                });
                let (b_pre, p) = (&m.b_pre[4 * l..4 * l + 4], &p_pre[t * 4..t * 4 + 4]);
                premix(l, m.a_pre[l], b_pre, p, lanes_t, gate, u, b);
                pre_op(PrepareMode::Zcrms, b, h, 0, &lw.attn_norm, a);
            });
        }
        hooks.rows(t0, "u", lo, &bt.u[..n * h], h);
        hooks.rows(t0, "block_in", lo, &bt.b[..n * h], h);

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
            per_token(n, qd, &|_, t| {
                // SAFETY: token t owns its rows.
                let (q, k) = unsafe { (row(&q, t, qd), row(&k, t, kvd)) };
                let (cs, sn) = (
                    &cos[t * half..(t + 1) * half],
                    &sin[t * half..(t + 1) * half],
                );
                qk_norm_rope(&lw.q_norm, &lw.k_norm, cs, sn, q, k);
            });
        }
        hooks.rows(t0, "q", lo, &bt.q[..n * qd], qd);
        hooks.rows(t0, "k", lo, &bt.k[..n * kvd], kvd);
        hooks.rows(t0, "v", lo, &bt.v[..n * kvd], kvd);

        let x = ChunkQkv {
            q: &bt.q[..n * qd],
            gate: &bt.g[..n * qd],
            k: &bt.k[..n * kvd],
            v: &bt.v[..n * kvd],
        };
        let (o, scores) = (&mut bt.o[..n * qd], &mut bt.scores);
        chunk_attention(c, &mut st.kv, &mut bt.table, l, t0, x, &bt.slots, o, scores)?;
        hooks.rows(t0, "attn_o", lo, &bt.o[..n * qd], qd);
        bt.prep.clear();
        let po = bt.prep.get(&bt.o[..n * qd], n, &lw.wo)?;
        matmul(&lw.wo, po, n, 0, h, &mut bt.attn[..n * h]);

        // 5 (end) – 9: residual, MLP, update and routing, per token.
        {
            let (after, out) = (
                SharedSlice::new(&mut bt.after),
                SharedSlice::new(&mut bt.out),
            );
            let update = SharedSlice::new(&mut bt.update);
            let (lanes, z) = (SharedSlice::new(&mut bt.lanes), SharedSlice::new(&mut bt.z));
            let (b, u, attn) = (&bt.b, &bt.u, &bt.attn);
            let (p_post, p_res) = (&bt.p_post, &bt.p_res);
            let hdim = c.hadamard_dim;
            per_token(n, c.hadamard_dim + 4 * h, &|part, t| {
                // SAFETY: token t owns its rows, pool part `part` its MLP scratch.
                let (after, out, update, lanes, z) = unsafe {
                    (
                        row(&after, t, h),
                        row(&out, t, h),
                        row(&update, t, h),
                        row(&lanes, t, 4 * h),
                        row(&z, part, hdim),
                    )
                };
                let tok = t * h..(t + 1) * h;
                mlp::block(
                    &b[tok.clone()],
                    &u[tok.clone()],
                    &attn[tok],
                    lw.attn_out_scale,
                    &lw.attn_post_norm,
                    &lw.mlp_norm,
                    [&lw.mlp_d1, &lw.mlp_d2, &lw.mlp_d3],
                    z,
                    after,
                    out,
                    update,
                );
                route(
                    l,
                    m.a_post[l],
                    &m.b_post[4 * l..4 * l + 4],
                    m.a_res[l],
                    &m.b_res[16 * l..16 * l + 16],
                    c.sinkhorn_iters,
                    &p_post[t * 4..t * 4 + 4],
                    &p_res[t * 16..t * 16 + 16],
                    update,
                    lanes,
                );
            });
        }
        hooks.rows(t0, "after_attn", lo, &bt.after[..n * h], h);
        hooks.rows(t0, "mlp_out", lo, &bt.out[..n * h], h);
        hooks.rows(t0, "update", lo, &bt.update[..n * h], h);
        hooks.rows(t0, "lanes", lo, &bt.lanes[..n * 4 * h], 4 * h);
    }
    st.pos += n as u64;
    hooks.check()?;
    if let Some(out) = logits {
        let last = &bt.lanes[(n - 1) * 4 * h..n * 4 * h];
        logits_into(model, last, &mut s.a, &mut s.prep, &mut hooks, out);
        hooks.rows(t0 + n as u64 - 1, "logits", None, out, out.len());
        hooks.check()?;
    }
    Ok(())
}
