// sample.wgsl: sampling help on the device, so a decode step reads back 8 bytes
// (greedy) or the top-k candidates instead of the vocabulary's logits.
// Prefixed by common.wgsl (finite, wg_sum, wg_max, scratch) at pipeline build.
// CPU twins: sample::argmax and sample::top_k_into (src/sample.rs).
//
// Entry points and bindings (group 0), both dispatch (1, 1, 1), workgroup WG (ONE
// workgroup; WG a pipeline override, 256 or 128: the host's
// Capabilities::wide_workgroup). Both take a token mask (bit i & 31 of word i >> 5 set: id i allowed);
// with `masked` != 0 in their params, disallowed ids are skipped everywhere (never
// chosen, never candidates, not in the flag or the denominator), as the host's
// masked readout (engine::host_readout_masked) does.
//   argmax  bindings 0..3: params (uniform ArgmaxParams), logits (read),
//           out (read_write, 2 u32), amask (read, ceil(n / 32) u32).
//           out[0] = the lowest index of the largest finite-or-infinite logit
//           (as sample::argmax: NaN never wins; 0 when nothing beats −∞),
//           out[1] = 1 if any logit is NaN or ±∞, else 0 (the step then fails
//           like the logits path does).
//           Each invocation scans a strided share (index li, li + WG, ...), keeping
//           its first maximum; a shared-memory tree then keeps the larger value,
//           or the lower index on ties.
//   topk    bindings 4..7: params (uniform TopkParams), logits (read),
//           tout (read_write, 3 + 2·MAX_K u32), tmask (read, ceil(n / 32) u32);
//           the m = min(k, allowed ids, MAX_K) largest
//           logits, the non-finite flag and, at temperature > 0, the softmax
//           denominator (layout in the top-k section below).
//
// Workgroup memory: argmax 3072 bytes (best_v, best_i, bad); topk 2096 bytes
// (hist, taken, flag, sel, scratch; each variable rounded up to 16 bytes as WebGPU
// counts it).

override WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
const SCRATCH_LEN: u32 = 256u;

struct ArgmaxParams {
    n: u32,      // logits to scan
    off: u32,    // first logit in the buffer
    masked: u32, // != 0: only ids that amask allows
    _pad1: u32,
}
@group(0) @binding(0) var<uniform> ap: ArgmaxParams;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<storage, read> amask: array<u32>;

fn allowed_a(i: u32) -> bool {
    return ap.masked == 0u || ((amask[i >> 5u] >> (i & 31u)) & 1u) == 1u;
}

// Sized for the widest WG; a narrower one uses the first WG entries.
var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;
var<workgroup> bad: array<u32, 256>;

@compute @workgroup_size(WG)
fn argmax(@builtin(local_invocation_index) li: u32) {
    var v = -3.40282346638528859812e38; // f32::MIN exactly
    var bi = NONE;
    var nf = 0u;
    for (var i = li; i < ap.n; i += WG) {
        if (!allowed_a(i)) {
            continue;
        }
        let x = logits[ap.off + i];
        if (!finite(x)) {
            nf = 1u;
        }
        // Strictly greater, so the first (lowest) index of a maximum stays.
        if (x > v || (bi == NONE && x == v)) {
            v = x;
            bi = i;
        }
    }
    best_v[li] = v;
    best_i[li] = bi;
    bad[li] = nf;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (li < s) {
            let ov = best_v[li + s];
            let oi = best_i[li + s];
            let mine = best_i[li];
            if (oi != NONE && (mine == NONE || ov > best_v[li] || (ov == best_v[li] && oi < mine))) {
                best_v[li] = ov;
                best_i[li] = oi;
            }
            bad[li] = bad[li] | bad[li + s];
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        out[0] = select(best_i[0], 0u, best_i[0] == NONE);
        out[1] = bad[0];
    }
}

// ---------------------------------------------------------------- top-k
//   topk's output tout (3 + 2·MAX_K u32; geometry and bindings in the header):
//         tout[0] = 1 if any logit is NaN or ±∞ (then nothing else is meaningful),
//         tout[1] = m = min(k, allowed ids, MAX_K), and tout[2 + i], bitcast<f32>(tout[2 + MAX_K + i])
//         for i < m = the ids and logits of the m largest logits, in no particular
//         order, ties at the cut resolved toward lower ids (as a stable sort by
//         logit, best first, would keep them).
//         tout[2 + 2·MAX_K] = bitcast<u32>(Σ_i exp((logit_i − max) / temperature))
//         over the allowed logits when temperature > 0 (the softmax denominator a top-p
//         cut needs; f32, strided partial sums and a shared-memory tree), else 0.
//         The m-th largest key is found by a 4-pass radix select over the logits'
//         order-preserving u32 keys (shared-memory histograms), then everything
//         above it and enough of the keys equal to it are gathered with an atomic
//         counter; only when equal keys straddle the cut does invocation 0 take
//         them in id order.

const MAX_K: u32 = 256u;

struct TopkParams {
    n: u32,
    off: u32,
    k: u32,
    temperature: f32, // > 0: also the softmax denominator at this temperature
    masked: u32,      // != 0: only ids that tmask allows
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}
@group(0) @binding(4) var<uniform> tp: TopkParams;
@group(0) @binding(5) var<storage, read> tlogits: array<f32>;
@group(0) @binding(6) var<storage, read_write> tout: array<u32>;
@group(0) @binding(7) var<storage, read> tmask: array<u32>;

fn allowed_t(i: u32) -> bool {
    return tp.masked == 0u || ((tmask[i >> 5u] >> (i & 31u)) & 1u) == 1u;
}

// One bin per value of a key's byte (256, whatever WG is).
var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> taken: atomic<u32>;
var<workgroup> flag: atomic<u32>;
var<workgroup> sel: array<u32, 4>; // prefix, mask, remaining, count equal

// Order-preserving key: a larger float gives a larger u32.
fn key_of(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

@compute @workgroup_size(WG)
fn topk(@builtin(local_invocation_index) li: u32) {
    var nf = 0u;
    var vmax = -3.40282346638528859812e38; // f32::MIN exactly
    var count = 0.0;
    for (var i = li; i < tp.n; i += WG) {
        if (!allowed_t(i)) {
            continue;
        }
        count += 1.0;
        let x = tlogits[tp.off + i];
        if (!finite(x)) {
            nf = 1u;
        }
        vmax = max(vmax, x);
    }
    // The allowed ids (an f32 count is exact to 2^24 ids).
    let m = min(tp.k, min(u32(wg_sum(count, li)), MAX_K));
    if (li == 0u) {
        sel[0] = 0u;
        sel[1] = 0u;
        sel[2] = m;
        sel[3] = 0u;
        atomicStore(&taken, 0u);
        atomicStore(&flag, 0u);
    }
    // The softmax denominator at the temperature (finite logits only matter:
    // otherwise the flag makes the host refuse the step).
    var total = 0.0;
    if (tp.temperature > 0.0) {
        let top = wg_max(vmax, li);
        var part = 0.0;
        for (var i = li; i < tp.n; i += WG) {
            if (allowed_t(i)) {
                part += exp((tlogits[tp.off + i] - top) / tp.temperature);
            }
        }
        total = wg_sum(part, li);
    }
    workgroupBarrier();
    // Set only after a barrier that follows invocation 0's clear (no race).
    if (nf != 0u) {
        atomicStore(&flag, 1u);
    }
    for (var round = 0u; round < 4u; round++) {
        let shift = 24u - 8u * round;
        for (var b = li; b < 256u; b += WG) {
            atomicStore(&hist[b], 0u);
        }
        workgroupBarrier();
        let prefix = sel[0];
        let mask = sel[1];
        for (var i = li; i < tp.n; i += WG) {
            let key = key_of(tlogits[tp.off + i]);
            if ((key & mask) == prefix && allowed_t(i)) {
                atomicAdd(&hist[(key >> shift) & 255u], 1u);
            }
        }
        workgroupBarrier();
        if (li == 0u && m > 0u) {
            var need = sel[2];
            var b = 255u;
            loop {
                let c = atomicLoad(&hist[b]);
                if (c >= need || b == 0u) {
                    sel[3] = c;
                    break;
                }
                need -= c;
                b -= 1u;
            }
            sel[0] = prefix | (b << shift);
            sel[1] = mask | (255u << shift);
            sel[2] = need;
        }
        workgroupBarrier();
    }
    // The cut: keys above `cut` all go; `need` of the `equal` keys equal to it go.
    let cut = sel[0];
    let need = sel[2];
    let equal = sel[3];
    let all_equal = need >= equal;
    for (var i = li; i < tp.n; i += WG) {
        let x = tlogits[tp.off + i];
        let key = key_of(x);
        if (m > 0u && allowed_t(i) && (key > cut || (key == cut && all_equal))) {
            let slot = atomicAdd(&taken, 1u);
            if (slot < m) {
                tout[2u + slot] = i;
                tout[2u + MAX_K + slot] = bitcast<u32>(x);
            }
        }
    }
    workgroupBarrier();
    if (li == 0u) {
        if (m > 0u && !all_equal) {
            // Equal keys straddle the cut: take the lowest ids (rare, sequential).
            var slot = atomicLoad(&taken);
            var left = need;
            for (var i = 0u; i < tp.n && left > 0u; i++) {
                let x = tlogits[tp.off + i];
                if (key_of(x) == cut && allowed_t(i)) {
                    tout[2u + slot] = i;
                    tout[2u + MAX_K + slot] = bitcast<u32>(x);
                    slot += 1u;
                    left -= 1u;
                }
            }
        }
        tout[0] = atomicLoad(&flag);
        tout[1] = m;
        tout[2u + 2u * MAX_K] = bitcast<u32>(total);
    }
}
