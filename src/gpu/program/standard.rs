//! The standard program: the token step as 8 dispatches per layer, each kernel
//! on its own, and beside them the plans a pass of several tokens batches
//! (every model has it, and every such pass runs it; `lean.rs` builds other
//! one-token lists beside it where it fits).

use super::params::{attn_params, mlp_params, Fault, Parts};
use super::plan::{LayerPlan, StepLists, StepProgram};
use crate::error::Result;
use crate::gpu::arena::GpuCq;
use crate::gpu::capture::{CapturePoint, Source};
use crate::gpu::kernels::cq::PrepareMode;
use crate::gpu::kernels::engram::EngramConvParams;
use crate::gpu::kernels::mhc::{PremixParams, RouteParams};
use crate::gpu::matvec_plan::MatvecPlan;
use crate::gpu::step_input::StepLayout;
use crate::gpu::Dispatch;

/// Build every dispatch of the standard program.
///
/// # Errors
/// [`crate::Error::Gpu`] for a matrix the gather kernel can't run.
pub(super) fn build(p: &Parts<'_>) -> Result<StepProgram> {
    let (ctx, c, k, w, a, s) = (p.ctx, p.config, p.kernels, p.weights, p.act, p.state);
    let h = c.hidden;
    // ---- head: embedding and engram. The gathers `(matrix, step word of the
    // row, scale, output (0: lanes, 1: act), offset, copies, copy stride)`:
    // the embedding into the 4 lanes, then each engram table's row.
    let mut gathers = vec![(&w.embed, StepLayout::TOKEN, (h as f32).sqrt(), 0, 0, 4, h)];
    if let Some(e) = &c.engram {
        for (t, table) in w.tables.iter().enumerate() {
            gathers.push((table, p.step.rows_at() + t, 1.0, 1, a.e + t * e.dim, 1, 0));
        }
    }
    let outs = [&s.lanes, &s.act];
    let gather = |&(m, idx_at, scale, to, off, copies, stride): &(_, _, _, usize, _, _, _)| {
        let out = (outs[to], off);
        k.cq.gather(
            ctx,
            &w.arenas,
            m,
            (&s.step, idx_at),
            scale,
            out,
            copies,
            stride,
        )
    };
    let mut head = gather(&gathers[0])?;
    let cap = |after: usize, name: String, layer, source, offset, len| CapturePoint {
        after,
        name,
        layer,
        source,
        offset,
        len,
    };
    let mut head_caps = vec![cap(head.len(), "x0".into(), None, Source::Lanes, 0, h)];
    let (mut conv_from, mut conv_to) = (head.len(), head.len());
    let mut sites_from = head.len();
    let mut site_plans = Vec::new();
    let mut conv_params = Vec::new();
    if let Some(e) = &c.engram {
        let e_dim = e.e_dim();
        for g in &gathers[1..] {
            head.extend(gather(g)?);
        }
        sites_from = head.len();
        for (site, at) in w.sites.iter().zip(&a.sites) {
            let plan = MatvecPlan {
                items: vec![
                    (site.wv.clone(), 0, h, at.v),
                    (site.wk.clone(), 0, h, at.key),
                ],
                mode: PrepareMode::Copy,
                n: e_dim,
                src: (s.act.clone(), a.e),
                lane_stride: h,
                gains: (w.vectors.clone(), 0),
                out: s.act.clone(),
                x_stride: p.slots.act,
                y_stride: p.slots.act,
                scratch: p.scratch(),
            };
            head.extend(plan.dispatches(&k.cq, ctx, &w.arenas, 1));
            site_plans.push(plan);
        }
        let ring = e.ring();
        conv_from = head.len();
        for (i, (site, at)) in w.sites.iter().zip(&a.sites).enumerate() {
            let cp = EngramConvParams {
                hidden: h as u32,
                taps: e.taps as u32,
                dilation: e.dilation as u32,
                ring: ring as u32,
                v: at.v as u32,
                value: at.value as u32,
                ring_off: (i * ring * h) as u32,
                conv: site.conv as u32,
                step_stride: p.slots.step as u32,
                act_stride: p.slots.act as u32,
                seq_at: p.step.seq_at() as u32,
                // Rebound per sequence (its rings window) or one sequence.
                ring_seq_stride: 0,
            };
            head.push(
                k.engram
                    .conv(ctx, &cp, &s.act, &w.vectors, &s.step, &s.rings),
            );
            conv_params.push(cp);
        }
        conv_to = head.len();
        let after = head.len();
        head_caps.push(cap(after, "engram.e".into(), None, Source::Act, a.e, e_dim));
        for (at, &layer) in a.sites.iter().zip(&e.sites) {
            for (name, off) in [("key", at.key), ("value", at.value)] {
                let name = format!("engram.{name}.{layer}");
                head_caps.push(cap(after, name, None, Source::Act, off, h));
            }
        }
    }
    if p.fault == Some(Fault::InvalidDispatch) {
        if let Some(first) = head.first() {
            let mut bad = first.clone();
            bad.groups = [ctx.caps.max_workgroups_per_dim.saturating_add(1), 1, 1];
            head.push(bad);
        }
    }

    // ---- layers.
    let mut layers = Vec::with_capacity(c.layers);
    let mut layer_caps = Vec::with_capacity(c.layers);
    let mut plan = Vec::with_capacity(c.layers);
    for l in 0..c.layers {
        let (lp, d, caps) = layer(p, l)?;
        layers.push(d);
        layer_caps.push(caps);
        plan.push(lp);
    }

    // ---- tail: the vocabulary projection.
    let tail_plan = MatvecPlan {
        items: vec![(w.embed.clone(), 0, c.vocab, 0)],
        mode: PrepareMode::MeanLanesZcrms,
        n: h,
        src: (s.lanes.clone(), 0),
        lane_stride: h,
        gains: (w.vectors.clone(), w.final_norm),
        out: s.logits.clone(),
        x_stride: p.slots.lanes,
        y_stride: s.logits_stride(),
        scratch: p.scratch(),
    };
    let tail = tail_plan.dispatches(&k.cq, ctx, &w.arenas, 1);
    let head_gathers = k.cq.gather_many(
        ctx,
        &w.arenas,
        &gathers,
        &s.step,
        outs,
        (p.slots.step, [p.slots.lanes, p.slots.act]),
    );
    let program = StepProgram {
        standard: StepLists {
            head,
            layers,
            tail,
            head_caps,
            layer_caps,
            tail_caps: Vec::new(),
        },
        lean: None,
        head_conv: conv_from..conv_to,
        head_conv_params: conv_params,
        head_sites: sites_from..conv_from,
        head_site_plans: site_plans,
        head_gathers,
        plan,
        tail_plan,
    };
    Ok(program)
}

/// Layer `l`: its prefill plan, its decode dispatches and capture points.
fn layer(p: &Parts<'_>, l: usize) -> Result<(LayerPlan, Vec<Dispatch>, Vec<CapturePoint>)> {
    let (ctx, c, k, w, a, s) = (p.ctx, p.config, p.kernels, p.weights, p.act, p.state);
    let h = c.hidden;
    let lv = &w.layer_vecs[l];
    let lw = &w.layers[l];
    let mv_plan = |items: Vec<(GpuCq, usize, usize, usize)>,
                   mode: PrepareMode,
                   n: usize,
                   src: (&wgpu::Buffer, usize),
                   gains: (&wgpu::Buffer, usize)| {
        let from_lanes = src.0 == &s.lanes;
        MatvecPlan {
            items,
            mode,
            n,
            src: (src.0.clone(), src.1),
            lane_stride: h,
            gains: (gains.0.clone(), gains.1),
            out: s.act.clone(),
            x_stride: if from_lanes {
                p.slots.lanes
            } else {
                p.slots.act
            },
            y_stride: p.slots.act,
            scratch: p.scratch(),
        }
    };
    let mut caps = Vec::new();
    let mut cap = |after: usize, name: &str, source, offset, len| {
        caps.push(CapturePoint {
            after,
            name: name.into(),
            layer: Some(l),
            source,
            offset,
            len,
        })
    };
    let phi = mv_plan(
        vec![
            (w.phi_pre.clone(), 4 * l, 4, a.p),
            (w.phi_post.clone(), 4 * l, 4, a.p + 4),
            (w.phi_res.clone(), 16 * l, 16, a.p + 8),
        ],
        PrepareMode::RmsUnit,
        4 * h,
        (&s.lanes, 0),
        (&w.vectors, 0),
    );
    let mut d = phi.dispatches(&k.cq, ctx, &w.arenas, 1);
    let site = c
        .engram
        .as_ref()
        .and_then(|e| e.sites.iter().position(|&layer| layer == l));
    let (key, value, nu, nk) = match site {
        Some(i) => (
            a.sites[i].key,
            a.sites[i].value,
            w.sites[i].norm_u,
            w.sites[i].norm_k,
        ),
        None => (0, 0, 0, 0),
    };
    let m = &w.mhc;
    let pm = PremixParams {
        hidden: h as u32,
        layer: l as u32,
        site: site.is_some() as u32,
        p_pre: a.p as u32,
        u: a.u as u32,
        b: a.b as u32,
        key: key as u32,
        value: value as u32,
        a_pre: (m.a_pre + l) as u32,
        b_pre: (m.b_pre + 4 * l) as u32,
        norm_u: nu as u32,
        norm_k: nk as u32,
        lanes_stride: p.slots.lanes as u32,
        act_stride: p.slots.act as u32,
        _pad: [0; 2],
    };
    d.push(k.mhc.premix(ctx, &pm, &s.lanes, &s.act, &w.vectors));
    cap(d.len(), "u", Source::Act, a.u, h);
    cap(d.len(), "block_in", Source::Act, a.b, h);
    let qkvg = mv_plan(
        vec![
            (lw.wq.clone(), 0, c.q_dim(), a.q),
            (lw.wk.clone(), 0, c.kv_dim(), a.k),
            (lw.wv.clone(), 0, c.kv_dim(), a.v),
            (lw.wg.clone(), 0, c.q_dim(), a.g),
        ],
        PrepareMode::Zcrms,
        h,
        (&s.act, a.b),
        (&w.vectors, lv.attn_norm),
    );
    d.extend(qkvg.dispatches(&k.cq, ctx, &w.arenas, 1));
    let ap = attn_params(p, l);
    let att = &k.attention;
    let qk_store = att.qk_store(ctx, &ap, &s.act, &w.vectors, &s.step, &s.cache);
    d.push(qk_store.clone());
    cap(d.len(), "q", Source::Act, a.q, c.q_dim());
    cap(d.len(), "k", Source::Act, a.k, c.kv_dim());
    cap(d.len(), "v", Source::Act, a.v, c.kv_dim());
    let attend = att.attend(ctx, &ap, &s.act, &s.step, &s.cache, &s.scores);
    d.push(attend.clone());
    cap(d.len(), "attn_o", Source::Act, a.o, c.q_dim());
    let wo = mv_plan(
        vec![(lw.wo.clone(), 0, h, a.attn)],
        PrepareMode::Copy,
        c.q_dim(),
        (&s.act, a.o),
        (&w.vectors, 0),
    );
    d.extend(wo.dispatches(&k.cq, ctx, &w.arenas, 1));
    let mp = mlp_params(p, l);
    d.push(k.mlp.mlp(ctx, &mp, &s.act, &w.vectors));
    cap(d.len(), "after_attn", Source::Act, a.after, h);
    cap(d.len(), "mlp_out", Source::Act, a.out, h);
    cap(d.len(), "update", Source::Act, a.update, h);
    let rp = RouteParams {
        hidden: h as u32,
        layer: l as u32,
        iters: c.sinkhorn_iters as u32,
        p_post: (a.p + 4) as u32,
        p_res: (a.p + 8) as u32,
        update: a.update as u32,
        a_post: (m.a_post + l) as u32,
        b_post: (m.b_post + 4 * l) as u32,
        a_res: (m.a_res + l) as u32,
        b_res: (m.b_res + 16 * l) as u32,
        route_out: a.route as u32,
        lanes_stride: p.slots.lanes as u32,
        act_stride: p.slots.act as u32,
        _pad: [0; 3],
    };
    let route = k.mhc.route(ctx, &rp, &s.lanes, &s.act, &w.vectors);
    d.push(route);
    cap(d.len(), "route", Source::Act, a.route, 16);
    cap(d.len(), "lanes", Source::Lanes, 0, 4 * h);
    let lp = LayerPlan {
        phi,
        premix: pm,
        qkvg,
        qk_store,
        attend,
        wo,
        mlp: mp,
        route: rp,
    };
    Ok((lp, d, caps))
}
