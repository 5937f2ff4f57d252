// mhc.wgsl: mHC lane pre-mix with the engram gate, and lane routing (SPEC §4.3 steps 3, 4, 8, 9).
// CPU twins: kernels::mhc::premix and kernels::mhc::route (src/kernels/mhc.rs).
//
// All activations live in act and all F32 model tensors in vecs, addressed by
// element offsets in the params; the 4 lanes are one buffer of 4 * hidden
// values, lane i at i * hidden (layer_io.wgsl's bindings 1, 2, 3).
//
// Prefixed by common.wgsl (wg_sum, sigm, scratch), layer_io.wgsl (act, vecs,
// lanes, EPS) and wide.wgsl (WG, SCRATCH_LEN) at pipeline build. layer.wgsl's
// layer_step calls the same functions (premix_slot, route_gates, route_column)
// with params it forms from its own.
//
// Both entry points run token slot `wid.y` of a dispatch (1 slot in a decode step,
// every slot of a prefill chunk or batch pass in one dispatch): its lanes start at
// wid.y * lanes_stride and its act offsets count from wid.y * act_stride.
//
// Entry points and bindings (group 0):
//   premix  bindings 9 (params), 3 (lanes), 1 (act), 2 (vecs);
//           dispatch (1, slots, 1), workgroup WG (ONE workgroup a slot).
//           hpre[i] = σ(a_pre·p_pre[i] + b_pre[i] + off(i)), u = Σ_i hpre[i]·lanes[i]
//           (i ascending from 0.0), b = u; at an engram site
//           α = σ(<zcrms(u, norm_u), zcrms(key, norm_k)> / sqrt(hidden)), b = u + α·value.
//           Writes u and b; lanes are only read.
//   route   bindings 10 (params), 3 (lanes), 1 (act: reads p and update,
//           workgroup 0 writes the route weights), 2 (vecs);
//           dispatch (ceil(hidden / WG), slots, 1), workgroup WG.
//           Invocation 0 of every workgroup computes hpost = 2σ(a_post·p_post + b_post + off)
//           and route = exp(Sinkhorn(L)) into scratch[0..20]; then one invocation per
//           column c: lanes'[i][c] = Σ_j route[i][j]·lanes[j][c] + hpost[i]·update[c].
//           Each invocation reads all 4 lanes of its column before writing them, so the
//           update is in place.

// off(i): +4 for lane layer mod 4, −4 for the others.
fn lane_off(layer: u32, i: u32) -> f32 {
    return select(-4.0, 4.0, i == layer % 4u);
}

// ---------------------------------------------------------------- premix
struct PremixParams {
    hidden: u32,
    layer: u32,
    site: u32,   // 1 at an engram site
    p_pre: u32,  // act: 4 values
    u: u32,      // act: out
    b: u32,      // act: out
    key: u32,    // act: engram key (site only)
    value: u32,  // act: engram value (site only)
    a_pre: u32,  // vectors: a_pre[layer]
    b_pre: u32,  // vectors: b_pre[layer, 0]
    norm_u: u32, // vectors (site only)
    norm_k: u32, // vectors (site only)
    lanes_stride: u32, // elements from one slot's lanes to the next's
    act_stride: u32,   // elements from one slot's act to the next's
    _pad0: u32,
    _pad1: u32,
}
@group(0) @binding(9) var<uniform> pm: PremixParams;

// The pre-mix of one token slot (lanes from lb, act offsets from ab) by the
// whole workgroup: u and b written (see the header). Call in uniform control flow.
fn premix_slot(p: PremixParams, lb: u32, ab: u32, li: u32) {
    let h = p.hidden;
    let u_at = ab + p.u;
    let b_at = ab + p.b;
    let key = ab + p.key;
    let value = ab + p.value;
    let a = vecs[p.a_pre];
    var g: array<f32, 4>;
    for (var i = 0u; i < 4u; i++) {
        g[i] = sigm(a * act[ab + p.p_pre + i] + vecs[p.b_pre + i] + lane_off(p.layer, i));
    }
    var usq = 0.0;
    for (var c = li; c < h; c += WG) {
        var u = 0.0;
        for (var i = 0u; i < 4u; i++) {
            u += g[i] * lanes[lb + i * h + c];
        }
        act[u_at + c] = u;
        act[b_at + c] = u;
        usq += u * u;
    }
    if (p.site != 0u) {
        // Every invocation re-reads only the columns it wrote itself.
        var ksq = 0.0;
        for (var c = li; c < h; c += WG) {
            let k = act[key + c];
            ksq += k * k;
        }
        let ru = 1.0 / sqrt(wg_sum(usq, li) / f32(h) + EPS);
        let rk = 1.0 / sqrt(wg_sum(ksq, li) / f32(h) + EPS);
        var d = 0.0;
        for (var c = li; c < h; c += WG) {
            let zu = act[u_at + c] * ru * (1.0 + vecs[p.norm_u + c]);
            let zk = act[key + c] * rk * (1.0 + vecs[p.norm_k + c]);
            d += zu * zk;
        }
        let dot = wg_sum(d, li);
        let alpha = sigm(dot * (1.0 / sqrt(f32(h))));
        for (var c = li; c < h; c += WG) {
            act[b_at + c] = act[u_at + c] + alpha * act[value + c];
        }
    }
}

@compute @workgroup_size(WG)
fn premix(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    premix_slot(pm, wid.y * pm.lanes_stride, wid.y * pm.act_stride, li);
}

// ---------------------------------------------------------------- route
struct RouteParams {
    hidden: u32,
    layer: u32,
    iters: u32,
    p_post: u32, // act: 4 values
    p_res: u32,  // act: 16 values
    update: u32, // act
    a_post: u32, // vectors: a_post[layer]
    b_post: u32, // vectors: b_post[layer, 0]
    a_res: u32,  // vectors: a_res[layer]
    b_res: u32,  // vectors: b_res[layer, 0]
    route_out: u32, // act: the 16 route weights, written by workgroup x = 0 (parity captures)
    lanes_stride: u32, // elements from one slot's lanes to the next's
    act_stride: u32,   // elements from one slot's act to the next's
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}
@group(0) @binding(10) var<uniform> rp: RouteParams;

fn lse4(v: vec4<f32>) -> f32 {
    let m = max(max(max(v.x, v.y), v.z), v.w);
    return m + log(exp(v.x - m) + exp(v.y - m) + exp(v.z - m) + exp(v.w - m));
}

// One invocation: the route weights exp(Sinkhorn(L)) at scratch[0..16] (route[4i + j]
// at 4i + j) and hpost at scratch[16..20], for the slot whose act offsets count from ab.
fn route_gates(p: RouteParams, ab: u32) {
    var l: array<vec4<f32>, 4>;
    let a = vecs[p.a_res];
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            l[i][j] = a * act[ab + p.p_res + 4u * i + j] + vecs[p.b_res + 4u * i + j];
        }
    }
    for (var it = 0u; it < p.iters; it++) {
        for (var i = 0u; i < 4u; i++) {
            l[i] = l[i] - vec4<f32>(lse4(l[i]));
        }
        for (var j = 0u; j < 4u; j++) {
            let s = lse4(vec4<f32>(l[0][j], l[1][j], l[2][j], l[3][j]));
            for (var i = 0u; i < 4u; i++) {
                l[i][j] -= s;
            }
        }
    }
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            scratch[4u * i + j] = exp(l[i][j]);
        }
    }
    let ap = vecs[p.a_post];
    for (var i = 0u; i < 4u; i++) {
        scratch[16u + i] = 2.0 * sigm(ap * act[ab + p.p_post + i] + vecs[p.b_post + i] + lane_off(p.layer, i));
    }
}

// Column c of the slot (lanes from lb, act offsets from ab) routed in place with
// the gates route_gates left in scratch (after a barrier).
fn route_column(p: RouteParams, lb: u32, ab: u32, c: u32) {
    let h = p.hidden;
    let at = lb + c;
    var x = array<f32, 4>(lanes[at], lanes[at + h], lanes[at + 2u * h], lanes[at + 3u * h]);
    let up = act[ab + p.update + c];
    for (var i = 0u; i < 4u; i++) {
        var acc = 0.0;
        for (var j = 0u; j < 4u; j++) {
            acc += scratch[4u * i + j] * x[j];
        }
        lanes[at + i * h] = acc + scratch[16u + i] * up;
    }
}

@compute @workgroup_size(WG)
fn route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lb = wid.y * rp.lanes_stride;
    let ab = wid.y * rp.act_stride;
    if (li == 0u) {
        route_gates(rp, ab);
        if (wid.x == 0u) {
            for (var k = 0u; k < 16u; k++) {
                act[ab + rp.route_out + k] = scratch[k];
            }
        }
    }
    workgroupBarrier();
    let c = wid.x * WG + li;
    if (c < rp.hidden) {
        route_column(rp, lb, ab, c);
    }
}
