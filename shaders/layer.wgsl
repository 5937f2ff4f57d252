// layer.wgsl: the lean program's single-workgroup kernel between two layers'
// attention: the output projection, MLP and routing of layer l − 1 and the mHC
// projections, pre-mix and engram gate of layer l (SPEC §4.3 steps 5 (end) – 9,
// then 1 – 4), so a hardware GPU runs a layer in 3 dispatches (this, the q/k/v/g
// matvec, the fused attention) instead of 8.
// CPU twins, phase by phase: kernels::engram::conv, cq::CqMatrix::matvec_rows_prepared
// (wo, the three Φ), kernels::mlp::block, kernels::mhc::route, kernels::mhc::premix,
// kernels::prepare::pre_op (the logits' MeanLanesZcrms input, prepared here once).
//
// Compiled after common.wgsl, butterfly.wgsl, layer_io.wgsl (act, vecs, lanes,
// rings, step_words), mlp.wgsl (mp, mlp_body, WG, scratch), mhc.wgsl
// (premix_slot, route_gates, route_column) and engram.wgsl (conv_column): each
// phase calls the standard kernels' own functions, with params formed from lp.
//
// Entry point and bindings (group 0):
//   layer_step  bindings 0..8  dispatch (1, 1, 1), workgroup WG (mlp.wgsl's override,
//   set to Capabilities::wide_workgroup: 256 or 128; ONE workgroup):
//     0 MlpParams (mlp.wgsl), 1 act (read_write), 2 vectors (read), 3 lanes
//     (read_write), 4 and 5 weight arenas (read; a matrix names which), 6
//     LayerParams, 7 rings (read_write), 8 step (read).
//     Phases by lp.flags, each ending with a storage + workgroup barrier:
//       CONV   every engram site's ring write and convolution (conv_column);
//       PREV   attn = wo · prepare(o); mlp_body (after, out, update); the route of
//              layer lp.prev (route_gates on invocation 0, route_column) in place;
//       NEXT   p = Φ · prepare(rms_unit(lanes)) for layer lp.next (24 rows); the
//              pre-mix (u, b) with the engram gate at a site (premix_slot);
//       LOGITS prepare(zcrms(mean of the lanes, final_norm)) written at lp.lprep
//              (the vocabulary matvec reads it prepared, mode 4).
//     A CQ row is one invocation's sequential dot over the prepared input staged in
//     `scratch` (padded <= 4096); codes are read at run-time bit widths.

const F_CONV: u32 = 1u;
const F_PREV: u32 = 2u;
const F_NEXT: u32 = 4u;
const F_LOGITS: u32 = 8u;
const MAX_SITES: u32 = 4u;

// A CQ matrix's rows as the arenas hold them: a.x packed word offset of row 0 of
// this range, a.y its first norm (f16 index), a.z codebook word offset, a.w arena
// (0: binding 4, 1: binding 5); b.x words per row, b.y words per (row, group),
// b.z group, b.w bits.
struct CqRef {
    a: vec4<u32>,
    b: vec4<u32>,
}

struct LayerParams {
    flags: u32,
    hidden: u32,
    prev: u32,        // layer of PREV
    next: u32,        // layer of NEXT
    // PREV: wo reads q_dim values at o, writes hidden at attn (= mp.attn).
    o: u32,
    q_dim: u32,
    iters: u32,
    route_out: u32,   // act: the 16 route weights
    p_prev: u32,      // act: layer prev's 24 Φ outputs (p_post at +4, p_res at +8)
    a_post: u32,      // vectors: a_post[prev], b_post[prev, 0], a_res[prev], b_res[prev, 0]
    b_post: u32,
    a_res: u32,
    b_res: u32,
    // NEXT: Φ outputs at p_next; premix.
    p_next: u32,
    a_pre: u32,       // vectors: a_pre[next], b_pre[next, 0]
    b_pre: u32,
    u: u32,           // act outputs
    b: u32,
    site: u32,        // 1 when layer next is an engram site
    key: u32,         // act
    value: u32,       // act
    norm_u: u32,      // vectors
    norm_k: u32,
    // LOGITS: final_norm (vectors) and where the prepared input goes (act).
    final_norm: u32,
    lprep: u32,
    lgroup: u32,
    lpadded: u32,
    // CONV: sites, taps, dilation, ring rows.
    n_sites: u32,
    taps: u32,
    dilation: u32,
    ring: u32,
    _pad0: u32,
    // Per site s: (v, value, ring_off, conv).
    sites: array<vec4<u32>, 4>,
    // wo, phi_pre, phi_post, phi_res (the Φ refs start at layer next's rows).
    wo: CqRef,
    phi: array<CqRef, 3>,
}

@group(0) @binding(4) var<storage, read> arena_a: array<u32>;
@group(0) @binding(5) var<storage, read> arena_b: array<u32>;
@group(0) @binding(6) var<uniform> lp: LayerParams;

// (No workgroup memory besides mlp.wgsl's 16 KiB `scratch`, the WebGPU default
// limit: the route's gates go through scratch[0..20] between two barriers.)

fn sync() {
    storageBarrier();
    workgroupBarrier();
}

fn arena_word(sel: u32, i: u32) -> u32 {
    if (sel == 0u) {
        return arena_a[i];
    }
    return arena_b[i];
}

fn arena_norm(sel: u32, i: u32) -> f32 {
    let w = unpack2x16float(arena_word(sel, i >> 1u));
    return select(w.x, w.y, (i & 1u) == 1u);
}

// Row `row` (relative to the ref's first row) of `m` against the prepared input
// in scratch[0 .. padded].
fn cq_dot(m: CqRef, row: u32) -> f32 {
    let sel = m.a.w;
    let row_words = m.b.x;
    let gw = m.b.y;
    let bits = m.b.w;
    let per = 32u / bits;
    let mask = (1u << bits) - 1u;
    let groups = row_words / gw;
    let pbase = m.a.x + row * row_words;
    let nbase = m.a.y + row * groups;
    var acc = 0.0;
    for (var g = 0u; g < groups; g++) {
        var gacc = 0.0;
        for (var w = 0u; w < gw; w++) {
            let wi = g * gw + w;
            let word = arena_word(sel, pbase + wi);
            var d = 0.0;
            for (var j = 0u; j < per; j++) {
                let idx = (word >> (j * bits)) & mask;
                d += bitcast<f32>(arena_word(sel, m.a.z + idx)) * scratch[wi * per + j];
            }
            gacc += d;
        }
        acc += arena_norm(sel, nbase + g) * gacc;
    }
    return acc;
}

// In-place unnormalised Walsh–Hadamard butterflies on scratch[0..len], every
// group of `group` values alone (SEED §1 stage order), then the 1/sqrt(group)
// scale: SPEC §2's `prepare` of the pre-op values already in scratch. Uniform
// control flow; ends with a barrier.
fn prepare_scratch(len: u32, group: u32, li: u32) {
    workgroupBarrier();
    for (var h = 1u; h < group; h = h << 1u) {
        for (var p = li; p < len / 2u; p += WG) {
            let i = (p / h) * 2u * h + (p % h);
            let j = i + h;
            let a = scratch[i];
            let b = scratch[j];
            scratch[i] = a + b;
            scratch[j] = a - b;
        }
        workgroupBarrier();
    }
    let sc = 1.0 / sqrt(f32(group));
    for (var i = li; i < len; i += WG) {
        scratch[i] = scratch[i] * sc;
    }
    workgroupBarrier();
}

fn padded(m: CqRef) -> u32 {
    return m.b.x * (32u / m.b.w);
}

// ---------------------------------------------------------------- phases
fn conv_sites(li: u32) {
    let t = step_words[1];
    for (var s = 0u; s < min(lp.n_sites, MAX_SITES); s++) {
        let site = lp.sites[s];
        let p = EngramConvParams(lp.hidden, lp.taps, lp.dilation, lp.ring, site.x, site.y,
                                 site.z, site.w, 0u, 0u, 0u, 0u);
        for (var c = li; c < lp.hidden; c += WG) {
            conv_column(p, t, site.z, 0u, c);
        }
    }
    sync();
}

fn wo_matvec(li: u32) {
    let n = padded(lp.wo);
    for (var c = li; c < n; c += WG) {
        scratch[c] = select(0.0, act[lp.o + c], c < lp.q_dim);
    }
    prepare_scratch(n, lp.wo.b.z, li);
    for (var r = li; r < lp.hidden; r += WG) {
        act[mp.attn + r] = cq_dot(lp.wo, r);
    }
    sync();
}

fn route_lanes(li: u32) {
    let p = RouteParams(lp.hidden, lp.prev, lp.iters, lp.p_prev + 4u, lp.p_prev + 8u, mp.update,
                        lp.a_post, lp.b_post, lp.a_res, lp.b_res, lp.route_out, 0u, 0u, 0u, 0u, 0u);
    if (li == 0u) {
        route_gates(p, 0u);
        for (var k = 0u; k < 16u; k++) {
            act[lp.route_out + k] = scratch[k];
        }
    }
    sync();
    for (var c = li; c < lp.hidden; c += WG) {
        route_column(p, 0u, 0u, c);
    }
    sync();
}

fn phi_matvec(li: u32) {
    let n = 4u * lp.hidden;
    var sq = 0.0;
    for (var c = li; c < n; c += WG) {
        sq += lanes[c] * lanes[c];
    }
    let r = 1.0 / sqrt(wg_sum(sq, li) / f32(n) + 1e-6);
    let len = padded(lp.phi[0]);
    for (var c = li; c < len; c += WG) {
        scratch[c] = select(0.0, lanes[c] * r, c < n);
    }
    prepare_scratch(len, lp.phi[0].b.z, li);
    // Rows: 4 of Φ_pre, 4 of Φ_post, 16 of Φ_res.
    if (li < 24u) {
        var m = lp.phi[2];
        var row = li - 8u;
        if (li < 4u) {
            m = lp.phi[0];
            row = li;
        } else if (li < 8u) {
            m = lp.phi[1];
            row = li - 4u;
        }
        act[lp.p_next + li] = cq_dot(m, row);
    }
    sync();
}

fn premix_next(li: u32) {
    let p = PremixParams(lp.hidden, lp.next, lp.site, lp.p_next, lp.u, lp.b, lp.key, lp.value,
                         lp.a_pre, lp.b_pre, lp.norm_u, lp.norm_k, 0u, 0u, 0u, 0u);
    premix_slot(p, 0u, 0u, li);
    sync();
}

fn logits_input(li: u32) {
    let h = lp.hidden;
    var sq = 0.0;
    for (var c = li; c < h; c += WG) {
        let m = (lanes[c] + lanes[h + c] + lanes[2u * h + c] + lanes[3u * h + c]) / 4.0;
        sq += m * m;
    }
    let r = 1.0 / sqrt(wg_sum(sq, li) / f32(h) + 1e-6);
    for (var c = li; c < lp.lpadded; c += WG) {
        var v = 0.0;
        if (c < h) {
            let m = (lanes[c] + lanes[h + c] + lanes[2u * h + c] + lanes[3u * h + c]) / 4.0;
            v = m * r * (1.0 + vecs[lp.final_norm + c]);
        }
        scratch[c] = v;
    }
    prepare_scratch(lp.lpadded, lp.lgroup, li);
    for (var c = li; c < lp.lpadded; c += WG) {
        act[lp.lprep + c] = scratch[c];
    }
    sync();
}

@compute @workgroup_size(WG)
fn layer_step(@builtin(local_invocation_index) li: u32) {
    ta = 0u;
    if ((lp.flags & F_CONV) != 0u) {
        conv_sites(li);
    }
    if ((lp.flags & F_PREV) != 0u) {
        wo_matvec(li);
        mlp_body(li);
        sync();
        route_lanes(li);
    }
    if ((lp.flags & F_NEXT) != 0u) {
        phi_matvec(li);
        premix_next(li);
    }
    if ((lp.flags & F_LOGITS) != 0u) {
        logits_input(li);
    }
}
