//! The SPEC §4 token step on the CPU: [`Scratch`] (its work buffers) and the free
//! function [`step`], which composes the twins of [`crate::kernels`] in the order
//! the GPU dispatches them, with the [`StepHooks`] watching.

use super::hooks::StepHooks;
use super::prep::PrepCache;
use super::state::{alloc, State};
use crate::config::Config;
use crate::cq::CqMatrix;
use crate::engram::table_rows_for;
use crate::error::{Error, Result};
use crate::kernels::attention::{attend, qk_store};
use crate::kernels::engram::conv;
use crate::kernels::gather::gather;
use crate::kernels::kv::{attended_slots, physical_slot};
use crate::kernels::mhc::{premix, route, EngramGate};
use crate::kernels::mlp;
use crate::kernels::prepare::{pre_op, PrepareMode};
use crate::kernels::rope::rope_table;
use crate::profile::bytes;
use crate::weights::Model;

/// Per-step work buffers, allocated once.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    lanes: Vec<f32>,
    xhat: Vec<f32>,
    u: Vec<f32>,
    b: Vec<f32>,
    /// The input of the next matvecs after its pre-op (also the final hidden state).
    pub(super) a: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    o: Vec<f32>,
    attn: Vec<f32>,
    after: Vec<f32>,
    out: Vec<f32>,
    update: Vec<f32>,
    z: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    scores: Vec<f32>,
    slots: Vec<usize>,
    e: Vec<f32>,
    site_v: Vec<f32>,
    table_idx: Vec<usize>,
    site_key: Vec<Vec<f32>>,
    site_value: Vec<Vec<f32>>,
    p: [f32; 24],
    /// Prepared inputs of the current activation.
    pub(super) prep: PrepCache,
}

impl Scratch {
    /// The buffers of a step of `c` with `sites` engram sites of `e_dim` rows.
    ///
    /// # Errors
    /// [`Error::Alloc`] if a large one can't be allocated.
    pub(super) fn new(c: &Config) -> Result<Scratch> {
        let h = c.hidden;
        let (e_dim, sites) = c
            .engram
            .as_ref()
            .map_or((0, 0), |e| (e.e_dim(), e.sites.len()));
        Ok(Scratch {
            lanes: alloc("lanes", 4 * h)?,
            xhat: alloc("lanes", 4 * h)?,
            u: vec![0.0; h],
            b: vec![0.0; h],
            a: vec![0.0; h],
            q: vec![0.0; c.q_dim()],
            k: vec![0.0; c.kv_dim()],
            v: vec![0.0; c.kv_dim()],
            g: vec![0.0; c.q_dim()],
            o: vec![0.0; c.q_dim()],
            attn: vec![0.0; h],
            after: vec![0.0; h],
            out: vec![0.0; h],
            update: vec![0.0; h],
            z: alloc("MLP scratch", c.hadamard_dim)?,
            cos: vec![0.0; c.head_dim / 2],
            sin: vec![0.0; c.head_dim / 2],
            scores: alloc("attention scores", c.heads * c.cache_rows())?,
            slots: Vec::with_capacity(c.cache_rows()),
            e: vec![0.0; e_dim],
            site_v: vec![0.0; if sites > 0 { h } else { 0 }],
            table_idx: Vec::with_capacity(c.engram.as_ref().map_or(0, |e| e.tables())),
            site_key: vec![vec![0.0; h]; sites],
            site_value: vec![vec![0.0; h]; sites],
            p: [0.0; 24],
            prep: PrepCache::default(),
        })
    }
}

/// One SPEC §4 step of `token` at position `st.pos`, advancing the state; with
/// `logits`, the logits into it (`vocab` values).
///
/// # Errors
/// [`Error::TokenOutOfRange`] if `token >= vocab` (the state is then unchanged);
/// [`Error::NonFinite`] naming the first non-finite tensor (the state has advanced).
pub(super) fn step(
    model: &Model,
    st: &mut State,
    s: &mut Scratch,
    token: u32,
    hooks: &mut StepHooks,
    logits: Option<&mut [f32]>,
) -> Result<()> {
    let c = &model.config;
    if token as usize >= c.vocab {
        return Err(Error::TokenOutOfRange {
            token,
            vocab: c.vocab,
        });
    }
    let t = st.pos;
    let (h, hd) = (c.hidden, c.head_dim);
    let w = &model.weights;
    st.history.push(token);

    // 4.1 Embedding.
    gather(
        &w.embed,
        token as usize,
        (h as f32).sqrt(),
        4,
        h,
        &mut s.lanes,
    );
    hooks.tensor(t, "x0", None, &s.lanes[..h]);
    hooks.clock.lap("gather", || bytes::gather(&w.embed, 4));

    // 4.2 Engram.
    if let (Some(ec), Some(ew)) = (&c.engram, &w.engram) {
        table_rows_for(&st.history, ec, &st.table_rows, &mut s.table_idx);
        for (k, (table, &row)) in ew.tables.iter().zip(&s.table_idx).enumerate() {
            gather(
                table,
                row,
                1.0,
                1,
                ec.dim,
                &mut s.e[k * ec.dim..(k + 1) * ec.dim],
            );
            hooks.clock.lap("gather", || bytes::gather(table, 1));
        }
        hooks.tensor(t, "engram.e", None, &s.e);
        s.prep.clear();
        let mats: Vec<&CqMatrix> = if hooks.is_timed() {
            ew.sites.iter().flat_map(|x| [&x.wv, &x.wk]).collect()
        } else {
            Vec::new()
        };
        hooks
            .clock
            .prepare(&mut s.prep, &s.e, &mats, (s.e.len(), 1, false));
        for (i, site) in ew.sites.iter().enumerate() {
            site.wv
                .matvec_rows_prepared(s.prep.get(&s.e, &site.wv), 0, &mut s.site_v);
            hooks.clock.lap_matvec(&site.wv, h);
            site.wk
                .matvec_rows_prepared(s.prep.get(&s.e, &site.wk), 0, &mut s.site_key[i]);
            hooks.clock.lap_matvec(&site.wk, h);
            let (taps, dil) = (ec.taps, ec.dilation);
            conv(
                t,
                taps,
                dil,
                &s.site_v,
                &site.conv,
                &mut st.rings[i],
                &mut s.site_value[i],
            );
            hooks
                .clock
                .lap("engram_conv", || bytes::engram_conv(h, ec.taps));
            if hooks.is_probed() {
                let key = format!("engram.key.{}", site.layer);
                hooks.tensor(t, &key, None, &s.site_key[i]);
                let value = format!("engram.value.{}", site.layer);
                hooks.tensor(t, &value, None, &s.site_value[i]);
            }
        }
    }

    // RoPE table of this position and its attended cache rows, shared by all layers.
    rope_table(t, c.rope_theta, hd, &mut s.cos, &mut s.sin);
    let slot = physical_slot(t, c.sink, c.window);
    attended_slots(t, c.sink, c.window, &mut s.slots);
    hooks.clock.mark();

    let m = &w.mhc;
    for (l, lw) in w.layers.iter().enumerate() {
        let lo = Some(l);
        // 1–3: mHC projections and pre-mix; 4: engram gate.
        pre_op(PrepareMode::RmsUnit, &s.lanes, 4 * h, 0, &[], &mut s.xhat);
        s.prep.clear();
        let mats = [&m.phi_pre, &m.phi_post, &m.phi_res];
        hooks
            .clock
            .prepare(&mut s.prep, &s.xhat, &mats, (4 * h, 1, false));
        let (pp, rest) = s.p.split_at_mut(4);
        let (pq, pr) = rest.split_at_mut(4);
        m.phi_pre
            .matvec_rows_prepared(s.prep.get(&s.xhat, &m.phi_pre), 4 * l, pp);
        hooks.clock.lap_matvec(&m.phi_pre, 4);
        m.phi_post
            .matvec_rows_prepared(s.prep.get(&s.xhat, &m.phi_post), 4 * l, pq);
        hooks.clock.lap_matvec(&m.phi_post, 4);
        m.phi_res
            .matvec_rows_prepared(s.prep.get(&s.xhat, &m.phi_res), 16 * l, pr);
        hooks.clock.lap_matvec(&m.phi_res, 16);
        let site = w.engram.as_ref().and_then(|ew| {
            let i = ew.sites.iter().position(|x| x.layer == l)?;
            Some(EngramGate {
                key: &s.site_key[i],
                value: &s.site_value[i],
                norm_u: &ew.sites[i].norm_u,
                norm_k: &ew.sites[i].norm_k,
            })
        });
        let site_here = site.is_some();
        let b_pre = &m.b_pre[4 * l..4 * l + 4];
        premix(l, m.a_pre[l], b_pre, pp, &s.lanes, site, &mut s.u, &mut s.b);
        hooks.tensor(t, "u", lo, &s.u);
        hooks.clock.lap("premix", || bytes::premix(h, site_here));
        hooks.tensor(t, "block_in", lo, &s.b);

        // 5: attention.
        pre_op(PrepareMode::Zcrms, &s.b, h, 0, &lw.attn_norm, &mut s.a);
        s.prep.clear();
        let mats = [&lw.wq, &lw.wk, &lw.wv, &lw.wg];
        hooks.clock.prepare(&mut s.prep, &s.a, &mats, (h, 1, true));
        lw.wq
            .matvec_rows_prepared(s.prep.get(&s.a, &lw.wq), 0, &mut s.q);
        hooks.clock.lap_matvec(&lw.wq, c.q_dim());
        lw.wk
            .matvec_rows_prepared(s.prep.get(&s.a, &lw.wk), 0, &mut s.k);
        hooks.clock.lap_matvec(&lw.wk, c.kv_dim());
        lw.wv
            .matvec_rows_prepared(s.prep.get(&s.a, &lw.wv), 0, &mut s.v);
        hooks.clock.lap_matvec(&lw.wv, c.kv_dim());
        lw.wg
            .matvec_rows_prepared(s.prep.get(&s.a, &lw.wg), 0, &mut s.g);
        hooks.clock.lap_matvec(&lw.wg, c.q_dim());
        let (cos, sin) = (&s.cos, &s.sin);
        qk_store(
            &lw.q_norm, &lw.k_norm, cos, sin, &mut s.q, &mut s.k, &s.v, &mut st.kv, l, slot,
        );
        hooks.tensor(t, "q", lo, &s.q);
        hooks.tensor(t, "k", lo, &s.k);
        hooks.tensor(t, "v", lo, &s.v);
        hooks
            .clock
            .lap("qk_store", || bytes::qk_store(c.heads, c.kv_heads, hd));
        attend(&st.kv, l, &s.q, &s.g, &s.slots, &mut s.o, &mut s.scores);
        hooks
            .clock
            .lap("attend", || bytes::attend(c.heads, hd, s.slots.len()));
        hooks.tensor(t, "attn_o", lo, &s.o);
        s.prep.clear();
        hooks
            .clock
            .prepare(&mut s.prep, &s.o, &[&lw.wo], (c.q_dim(), 1, false));
        lw.wo
            .matvec_rows_prepared(s.prep.get(&s.o, &lw.wo), 0, &mut s.attn);
        hooks.clock.lap_matvec(&lw.wo, h);

        // 5 (end)–7: residual, Hadamard MLP, update = out − u.
        mlp::block(
            &s.b,
            &s.u,
            &s.attn,
            lw.attn_out_scale,
            &lw.attn_post_norm,
            &lw.mlp_norm,
            [&lw.mlp_d1, &lw.mlp_d2, &lw.mlp_d3],
            &mut s.z,
            &mut s.after,
            &mut s.out,
            &mut s.update,
        );
        hooks.tensor(t, "after_attn", lo, &s.after);
        hooks.tensor(t, "mlp_out", lo, &s.out);
        hooks.clock.lap("mlp", || bytes::mlp(h, c.hadamard_dim));
        hooks.tensor(t, "update", lo, &s.update);

        // 8–9: routing, in place on the lanes.
        let r = route(
            l,
            m.a_post[l],
            &m.b_post[4 * l..4 * l + 4],
            m.a_res[l],
            &m.b_res[16 * l..16 * l + 16],
            c.sinkhorn_iters,
            pq,
            pr,
            &s.update,
            &mut s.lanes,
        );
        if hooks.is_probed() {
            let flat: Vec<f32> = r.iter().flatten().copied().collect();
            hooks.tensor(t, "route", lo, &flat);
        }
        hooks.clock.lap("route", || bytes::route(h));
        hooks.tensor(t, "lanes", lo, &s.lanes);
    }
    st.pos += 1;

    if let Some(out) = logits {
        logits_into(model, &s.lanes, &mut s.a, &mut s.prep, hooks, out);
        hooks.tensor(t, "logits", None, out);
    }
    hooks.check()
}

/// SPEC §4.4: the logits (`vocab` values) of the lanes (`4 · hidden`) after the
/// last layer, `embed · prepare(zcrms(mean of the lanes, final_norm))`; `a` is
/// scratch of `hidden`.
pub(super) fn logits_into(
    model: &Model,
    lanes: &[f32],
    a: &mut [f32],
    prep: &mut PrepCache,
    hooks: &mut StepHooks,
    logits: &mut [f32],
) {
    let (h, w) = (model.config.hidden, &model.weights);
    pre_op(PrepareMode::MeanLanesZcrms, lanes, h, h, &w.final_norm, a);
    prep.clear();
    hooks.clock.prepare(prep, a, &[&w.embed], (h, 4, true));
    w.embed
        .matvec_rows_prepared(prep.get(a, &w.embed), 0, logits);
    hooks.clock.lap_matvec(&w.embed, model.config.vocab);
}
