// mhc.wgsl: mHC lane pre-mix with the engram gate, and lane routing (SPEC §4.3 steps 3, 4, 8, 9).
// CPU twins: kernels::mhc::premix and kernels::mhc::route (src/kernels/mhc.rs).
//
// All activations live in one f32 buffer `act` and all F32 model tensors in one
// f32 buffer `vectors`, addressed by element offsets in the params. The 4 lanes
// are one f32 buffer of 4 * hidden values, lane i at i * hidden.
//
// Prefixed by common.wgsl (wg_sum, sigm, scratch) at pipeline build.
//
// Both entry points run token slot `wid.y` of a dispatch (1 slot in a decode step,
// every slot of a prefill chunk or batch pass in one dispatch): its lanes start at
// wid.y * lanes_stride and its act offsets count from wid.y * act_stride.
//
// Entry points and bindings (group 0):
//   premix  bindings 0..3  dispatch (1, slots, 1), workgroup WG (ONE workgroup a slot):
//           params, lanes (read), act (read_write), vectors (read).
//           hpre[i] = σ(a_pre·p_pre[i] + b_pre[i] + off(i)), u = Σ_i hpre[i]·lanes[i]
//           (i ascending from 0.0), b = u; at an engram site
//           α = σ(<zcrms(u, norm_u), zcrms(key, norm_k)> / sqrt(hidden)), b = u + α·value.
//           Writes u and b.
//   route   bindings 4..7  dispatch (ceil(hidden / WG), slots, 1), workgroup WG:
//           params, lanes (read_write), act (read_write: reads p and update,
//           workgroup 0 writes the route weights), vectors (read).
//           Invocation 0 of every workgroup computes hpost = 2σ(a_post·p_post + b_post + off)
//           and route = exp(Sinkhorn(L)) into workgroup memory; then one invocation per
//           column c: lanes'[i][c] = Σ_j route[i][j]·lanes[j][c] + hpost[i]·update[c].
//           Each invocation reads all 4 lanes of its column before writing them, so the
//           update is in place.

// Invocations per workgroup: a pipeline override, 256 or 128 (the host's
// Capabilities::wide_workgroup: 128 where the device allows fewer than 256, as
// GLES 3.1 and WebGPU's compatibility mode may).
override WG: u32 = 256u;
const EPS: f32 = 1e-6;
// wg_sum's scratch, at the widest WG (1 KiB).
const SCRATCH_LEN: u32 = 256u;

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
@group(0) @binding(0) var<uniform> pm: PremixParams;
@group(0) @binding(1) var<storage, read> pm_lanes: array<f32>;
@group(0) @binding(2) var<storage, read_write> pm_act: array<f32>;
@group(0) @binding(3) var<storage, read> pm_vec: array<f32>;

@compute @workgroup_size(WG)
fn premix(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = pm.hidden;
    let lb = wid.y * pm.lanes_stride;
    let ab = wid.y * pm.act_stride;
    let p_pre = ab + pm.p_pre;
    let u_at = ab + pm.u;
    let b_at = ab + pm.b;
    let key = ab + pm.key;
    let value = ab + pm.value;
    let a = pm_vec[pm.a_pre];
    var g: array<f32, 4>;
    for (var i = 0u; i < 4u; i++) {
        g[i] = sigm(a * pm_act[p_pre + i] + pm_vec[pm.b_pre + i] + lane_off(pm.layer, i));
    }
    var usq = 0.0;
    for (var c = li; c < h; c += WG) {
        var u = 0.0;
        for (var i = 0u; i < 4u; i++) {
            u += g[i] * pm_lanes[lb + i * h + c];
        }
        pm_act[u_at + c] = u;
        pm_act[b_at + c] = u;
        usq += u * u;
    }
    if (pm.site != 0u) {
        // Every invocation re-reads only the columns it wrote itself.
        var ksq = 0.0;
        for (var c = li; c < h; c += WG) {
            let k = pm_act[key + c];
            ksq += k * k;
        }
        let ru = 1.0 / sqrt(wg_sum(usq, li) / f32(h) + EPS);
        let rk = 1.0 / sqrt(wg_sum(ksq, li) / f32(h) + EPS);
        var d = 0.0;
        for (var c = li; c < h; c += WG) {
            let zu = pm_act[u_at + c] * ru * (1.0 + pm_vec[pm.norm_u + c]);
            let zk = pm_act[key + c] * rk * (1.0 + pm_vec[pm.norm_k + c]);
            d += zu * zk;
        }
        let dot = wg_sum(d, li);
        let alpha = sigm(dot * (1.0 / sqrt(f32(h))));
        for (var c = li; c < h; c += WG) {
            pm_act[b_at + c] = pm_act[u_at + c] + alpha * pm_act[value + c];
        }
    }
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
@group(0) @binding(4) var<uniform> rp: RouteParams;
@group(0) @binding(5) var<storage, read_write> rt_lanes: array<f32>;
@group(0) @binding(6) var<storage, read_write> rt_act: array<f32>;
@group(0) @binding(7) var<storage, read> rt_vec: array<f32>;

// route[4i + j] at 0..16, hpost[i] at 16..20.
var<workgroup> gates: array<f32, 20>;

fn lse4(v: vec4<f32>) -> f32 {
    let m = max(max(max(v.x, v.y), v.z), v.w);
    return m + log(exp(v.x - m) + exp(v.y - m) + exp(v.z - m) + exp(v.w - m));
}

@compute @workgroup_size(WG)
fn route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lb = wid.y * rp.lanes_stride;
    let ab = wid.y * rp.act_stride;
    if (li == 0u) {
        var l: array<vec4<f32>, 4>;
        let a = rt_vec[rp.a_res];
        for (var i = 0u; i < 4u; i++) {
            for (var j = 0u; j < 4u; j++) {
                l[i][j] = a * rt_act[ab + rp.p_res + 4u * i + j] + rt_vec[rp.b_res + 4u * i + j];
            }
        }
        for (var it = 0u; it < rp.iters; it++) {
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
                gates[4u * i + j] = exp(l[i][j]);
            }
        }
        let ap = rt_vec[rp.a_post];
        for (var i = 0u; i < 4u; i++) {
            gates[16u + i] = 2.0 * sigm(ap * rt_act[ab + rp.p_post + i] + rt_vec[rp.b_post + i] + lane_off(rp.layer, i));
        }
        if (wid.x == 0u) {
            for (var k = 0u; k < 16u; k++) {
                rt_act[ab + rp.route_out + k] = gates[k];
            }
        }
    }
    workgroupBarrier();
    let h = rp.hidden;
    let c = wid.x * WG + li;
    if (c < h) {
        let at = lb + c;
        var x = array<f32, 4>(rt_lanes[at], rt_lanes[at + h], rt_lanes[at + 2u * h], rt_lanes[at + 3u * h]);
        let up = rt_act[ab + rp.update + c];
        for (var i = 0u; i < 4u; i++) {
            var acc = 0.0;
            for (var j = 0u; j < 4u; j++) {
                acc += gates[4u * i + j] * x[j];
            }
            rt_lanes[at + i * h] = acc + gates[16u + i] * up;
        }
    }
}
