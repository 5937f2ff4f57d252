// sample.wgsl: greedy sampling on the device, so a greedy decode step reads back
// 8 bytes instead of the vocabulary's logits.
//
// Entry point and bindings (group 0):
//   argmax  bindings 0..2  dispatch (1, 1, 1), workgroup 256 (ONE workgroup):
//           params (uniform), logits (read), out (read_write, 2 u32).
//           out[0] = the lowest index of the largest finite-or-infinite logit
//           (as sample::argmax: NaN never wins; 0 when nothing beats −∞),
//           out[1] = 1 if any logit is NaN or ±∞, else 0 (the step then fails
//           like the logits path does).
//           Each invocation scans a strided share (index li, li + 256, ...), keeping
//           its first maximum; a shared-memory tree then keeps the larger value,
//           or the lower index on ties.

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

struct ArgmaxParams {
    n: u32,      // logits to scan
    off: u32,    // first logit in the buffer
    _pad0: u32,
    _pad1: u32,
}
@group(0) @binding(0) var<uniform> ap: ArgmaxParams;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;
var<workgroup> bad: array<u32, 256>;

fn finite(v: f32) -> bool {
    // NaN fails both comparisons; ±∞ fails the bound (3.4028235e38 = f32::MAX).
    return abs(v) <= 3.4028235e38;
}

@compute @workgroup_size(256)
fn argmax(@builtin(local_invocation_index) li: u32) {
    var v = -3.4028235e38;
    var bi = NONE;
    var nf = 0u;
    for (var i = li; i < ap.n; i += WG) {
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
