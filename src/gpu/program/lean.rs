//! The lean program: the decode step in 3 dispatches per layer for hardware GPUs,
//! where a step is bound by the number of dependent dispatches, not by memory.
//!
//! Layer `l` is `layer_step` (one workgroup: layer `l − 1`'s output projection,
//! MLP and routing, then layer `l`'s Φ projections and pre-mix;
//! [`crate::gpu::kernels::layer`]), the q/k/v/g matvec, and `qk_attend` (the
//! KV store and attention of every head in one dispatch). The tail is a last
//! `layer_step` (the last layer's output projection, MLP and routing, and the
//! logits' input prepared once) and the vocabulary matvec reading it prepared.
//! The engram convolutions run in layer 0's `layer_step`.
//!
//! Passes of several tokens keep the standard program's kernels (their matvecs
//! batch the pass; [`crate::gpu::prefill`]); both leave the same cache and
//! rings. Which program a
//! step runs: [`ProgramKind::choose`](super::ProgramKind::choose).

use super::params::{attn_params, mlp_params, Fault, Parts};
use super::plan::{StepLists, StepProgram};
use crate::engine::profile::bytes;
use crate::gpu::arena::GpuCq;
use crate::gpu::capture::{CapturePoint, Source};
use crate::gpu::kernels::attention::AttnParams;
use crate::gpu::kernels::cq::{MatvecInput, PrepareMode, SlotStrides};
use crate::gpu::kernels::layer::{flags, CqRef, LayerBuffers, LayerParams, MAX_STAGED};
use crate::gpu::kernels::mlp::MlpParams;
use crate::gpu::Dispatch;

/// The lean program's lists over the standard program `prog` (whose q/k/v/g
/// matvecs and gathers it reuses), when the model fits it; `None` when it does
/// not: a matrix the kernel reads (wo, the Φ rows of a layer) split over arena
/// parts or spread over more than two arenas, Φ matrices of different groups,
/// or a prepared input over [`MAX_STAGED`] values.
pub(crate) fn build(p: &Parts<'_>, prog: &StepProgram) -> Option<StepLists> {
    let (layers, mut layer_caps, tail, tail_caps) = layer_lists(p, prog)?;
    let (head, head_caps, values) = head(p, prog);
    layer_caps[0].splice(0..0, values);
    debug_assert_eq!(layers.len(), p.config.layers);
    Some(StepLists {
        head,
        layers,
        tail,
        head_caps,
        layer_caps,
        tail_caps,
    })
}

/// The lean head: every gather in one dispatch (when they fit it) and the engram
/// projections of every site in one matvec; the convolutions run in layer 0's
/// layer_step, so the engram values are captured there (the third list).
fn head(
    p: &Parts<'_>,
    prog: &StepProgram,
) -> (Vec<Dispatch>, Vec<CapturePoint>, Vec<CapturePoint>) {
    let (ctx, c, k, w, a, s) = (p.ctx, p.config, p.kernels, p.weights, p.act, p.state);
    let h = c.hidden;
    let Some(gather) = prog.head_gathers.clone() else {
        // The standard head without its convolutions.
        let std = &prog.standard;
        let mut head = std.head.clone();
        head.drain(prog.head_conv.clone());
        let (mut caps, mut values) = (Vec::new(), Vec::new());
        for cp in &std.head_caps {
            let mut cp = cp.clone();
            if cp.name.starts_with("engram.value.") {
                cp.after = 1;
                values.push(cp);
            } else {
                cp.after = cp.after.min(head.len());
                caps.push(cp);
            }
        }
        return (head, caps, values);
    };
    let point = |after: usize, name: String, source, offset, len| CapturePoint {
        after,
        name,
        layer: None,
        source,
        offset,
        len,
    };
    let mut head = vec![gather];
    let mut caps = vec![point(1, "x0".into(), Source::Lanes, 0, h)];
    let mut values = Vec::new();
    if let Some(e) = &c.engram {
        let mut mats = Vec::new();
        for (site, at) in w.sites.iter().zip(&a.sites) {
            mats.push((&site.wv, 0, h, at.v));
            mats.push((&site.wk, 0, h, at.key));
        }
        head.extend(k.cq.matvec(
            ctx,
            &w.arenas,
            &mats,
            MatvecInput::Raw {
                mode: PrepareMode::Copy,
                n: e.e_dim(),
                src: (&s.act, a.e),
                lane_stride: h,
                gains: (&w.vectors, 0),
            },
            &s.act,
            SlotStrides::single(),
        ));
        let after = head.len();
        caps.push(point(after, "engram.e".into(), Source::Act, a.e, e.e_dim()));
        for (at, &layer) in a.sites.iter().zip(&e.sites) {
            let key = format!("engram.key.{layer}");
            caps.push(point(after, key, Source::Act, at.key, h));
            let value = format!("engram.value.{layer}");
            values.push(point(1, value, Source::Act, at.value, h));
        }
    }
    if p.fault == Some(Fault::InvalidDispatch) {
        let mut bad = head[0].clone();
        bad.groups = [ctx.caps.max_workgroups_per_dim.saturating_add(1), 1, 1];
        head.push(bad);
    }
    (head, caps, values)
}

type Lists = (
    Vec<Vec<Dispatch>>,
    Vec<Vec<CapturePoint>>,
    Vec<Dispatch>,
    Vec<CapturePoint>,
);

/// The layer lists with their capture points, and the tail with its own; the
/// q/k/v/g matvecs are the standard program's (`prog.plan`).
fn layer_lists(p: &Parts<'_>, prog: &StepProgram) -> Option<Lists> {
    let (ctx, c, k, w, a, s) = (p.ctx, p.config, p.kernels, p.weights, p.act, p.state);
    let h = c.hidden;
    let n_layers = c.layers;
    if 4 * h > MAX_STAGED || w.sites.len() > 4 || n_layers == 0 {
        return None;
    }
    // Arena bindings: the arenas of every wo and Φ, at most two.
    let mut arenas: Vec<usize> = Vec::new();
    let mut binding = |m: &GpuCq, first: usize, rows: usize| -> Option<CqRef> {
        let part = m.parts_for(first, rows).first()?.0;
        let b = match arenas.iter().position(|&x| x == part.arena) {
            Some(i) => i,
            None if arenas.len() < 2 => {
                arenas.push(part.arena);
                arenas.len() - 1
            }
            None => return None,
        };
        CqRef::of(m, first, rows, b as u32)
    };
    let mut wo = Vec::with_capacity(n_layers);
    let mut phi = Vec::with_capacity(n_layers);
    for l in 0..n_layers {
        let lw = &w.layers[l].wo;
        if lw.padded() > MAX_STAGED {
            return None;
        }
        wo.push(binding(lw, 0, h)?);
        phi.push([
            binding(&w.phi_pre, 4 * l, 4)?,
            binding(&w.phi_post, 4 * l, 4)?,
            binding(&w.phi_res, 16 * l, 16)?,
        ]);
    }
    let pm = [&w.phi_pre, &w.phi_post, &w.phi_res];
    if pm
        .iter()
        .any(|m| m.group != pm[0].group || m.padded() != pm[0].padded())
        || pm[0].padded() > MAX_STAGED
        || w.embed.padded() > MAX_STAGED
    {
        return None;
    }
    let bufs = LayerBuffers {
        act: &s.act,
        vectors: &w.vectors,
        lanes: &s.lanes,
        arenas: [
            &w.arenas[arenas[0]],
            &w.arenas[*arenas.get(1).unwrap_or(&arenas[0])],
        ],
        rings: &s.rings,
        step: &s.step,
    };
    let m = &w.mhc;
    let base = LayerParams {
        hidden: h as u32,
        o: a.o as u32,
        q_dim: c.q_dim() as u32,
        iters: c.sinkhorn_iters as u32,
        route_out: a.route as u32,
        p_prev: a.p as u32,
        p_next: a.p as u32,
        u: a.u as u32,
        b: a.b as u32,
        final_norm: w.final_norm as u32,
        lprep: a.lprep as u32,
        lgroup: w.embed.group as u32,
        lpadded: w.embed.padded() as u32,
        ..LayerParams::default()
    };
    // Layer `prev`'s output projection, MLP and routing.
    let with_prev = |lp: &mut LayerParams, prev: usize| {
        lp.flags |= flags::PREV;
        lp.prev = prev as u32;
        lp.a_post = (m.a_post + prev) as u32;
        lp.b_post = (m.b_post + 4 * prev) as u32;
        lp.a_res = (m.a_res + prev) as u32;
        lp.b_res = (m.b_res + 16 * prev) as u32;
        lp.wo = wo[prev];
    };
    let step_bytes = |lp: &LayerParams| -> u64 {
        let mut b = 0;
        let mv = |r: &CqRef, rows: usize| {
            let (row_words, gw, bits) = (r.b[0] as usize, r.b[1] as usize, r.b[3]);
            let input = (row_words * 32 / bits as usize) as u64 * 4;
            bytes::matvec_dispatch(rows, row_words * 4, row_words / gw, bits, 1, 1, input)
        };
        if lp.flags & flags::PREV != 0 {
            b += mv(&lp.wo, h) + bytes::mlp(h, c.hadamard_dim) + bytes::route(h);
        }
        if lp.flags & flags::NEXT != 0 {
            b += mv(&lp.phi[0], 4) + mv(&lp.phi[1], 4) + mv(&lp.phi[2], 16);
            b += bytes::premix(h, lp.site != 0);
        }
        if lp.flags & flags::CONV != 0 {
            let taps = c.engram.as_ref().map_or(0, |e| e.taps);
            b += lp.n_sites as u64 * bytes::engram_conv(h, taps);
        }
        b
    };
    let zero_mlp: MlpParams = bytemuck::Zeroable::zeroed();
    let mut lists = Vec::with_capacity(n_layers);
    let mut caps: Vec<Vec<CapturePoint>> = Vec::with_capacity(n_layers);
    let tail_point = |after: usize, name: &str, layer: usize, source, offset, len| CapturePoint {
        after,
        name: name.into(),
        layer: Some(layer),
        source,
        offset,
        len,
    };
    // Layer `prev`'s points after its routing (captured after the layer_step that
    // ran it).
    let prev_points = |after: usize, prev: usize| -> Vec<CapturePoint> {
        vec![
            tail_point(after, "after_attn", prev, Source::Act, a.after, h),
            tail_point(after, "mlp_out", prev, Source::Act, a.out, h),
            tail_point(after, "update", prev, Source::Act, a.update, h),
            tail_point(after, "route", prev, Source::Act, a.route, 16),
            tail_point(after, "lanes", prev, Source::Lanes, 0, 4 * h),
        ]
    };
    for (l, &phi_l) in phi.iter().enumerate() {
        let mut lp = base;
        lp.flags = flags::NEXT;
        lp.next = l as u32;
        lp.a_pre = (m.a_pre + l) as u32;
        lp.b_pre = (m.b_pre + 4 * l) as u32;
        lp.phi = phi_l;
        let site = c
            .engram
            .as_ref()
            .and_then(|e| e.sites.iter().position(|&layer| layer == l));
        if let Some(i) = site {
            lp.site = 1;
            lp.key = a.sites[i].key as u32;
            lp.value = a.sites[i].value as u32;
            lp.norm_u = w.sites[i].norm_u as u32;
            lp.norm_k = w.sites[i].norm_k as u32;
        }
        let mut mp = zero_mlp;
        if l == 0 {
            if let Some(e) = &c.engram {
                lp.flags |= flags::CONV;
                lp.n_sites = w.sites.len() as u32;
                lp.taps = e.taps as u32;
                lp.dilation = e.dilation as u32;
                lp.ring = e.ring() as u32;
                for (i, (sw, at)) in w.sites.iter().zip(&a.sites).enumerate() {
                    let ring_off = i * e.ring() * h;
                    lp.sites[i] = [
                        at.v as u32,
                        at.value as u32,
                        ring_off as u32,
                        sw.conv as u32,
                    ];
                }
            }
        } else {
            with_prev(&mut lp, l - 1);
            mp = mlp_params(p, l - 1);
        }
        let mut d = vec![k
            .layer
            .layer_step(ctx, &lp, &mp, &bufs)
            .with_bytes(step_bytes(&lp))];
        let mut cp = if l == 0 {
            Vec::new()
        } else {
            prev_points(1, l - 1)
        };
        cp.push(tail_point(1, "u", l, Source::Act, a.u, h));
        cp.push(tail_point(1, "block_in", l, Source::Act, a.b, h));
        d.extend(prog.plan[l].qkvg.dispatches(&k.cq, ctx, &w.arenas, 1));
        let ap = AttnParams {
            kn_off: a.kn as u32,
            ..attn_params(p, l)
        };
        d.push(
            k.attention
                .qk_attend(ctx, &ap, &s.act, &w.vectors, &s.step, &s.cache, &s.scores),
        );
        let after = d.len();
        cp.push(tail_point(after, "q", l, Source::Act, a.q, c.q_dim()));
        cp.push(tail_point(after, "k", l, Source::Act, a.kn, c.kv_dim()));
        cp.push(tail_point(after, "v", l, Source::Act, a.v, c.kv_dim()));
        cp.push(tail_point(after, "attn_o", l, Source::Act, a.o, c.q_dim()));
        lists.push(d);
        caps.push(cp);
    }
    // Tail: the last layer's output projection, MLP and routing, the logits' input.
    let last = n_layers - 1;
    let mut lp = base;
    with_prev(&mut lp, last);
    lp.flags |= flags::LOGITS;
    let mut tail = vec![k
        .layer
        .layer_step(ctx, &lp, &mlp_params(p, last), &bufs)
        .with_bytes(step_bytes(&lp))];
    let tail_caps = prev_points(1, last);
    tail.extend(k.cq.matvec(
        ctx,
        &w.arenas,
        &[(&w.embed, 0, c.vocab, 0)],
        MatvecInput::Prepared(&s.act, a.lprep),
        &s.logits,
        SlotStrides::single(),
    ));
    Some((lists, caps, tail, tail_caps))
}
