// engram.wgsl: the engram site's causal dilated convolution over its value ring (SPEC §4.2).
// CPU twin: kernels::engram::conv (src/kernels/engram.rs).
//
// `v = cq_matvec(wv, e)` is already in act; this stores it in the site's ring and
// forms the site value. All activations live in one f32 buffer `act`, all F32 model
// tensors in one f32 buffer `vectors`, every site's ring ([ring, hidden] row-major)
// in one f32 buffer `rings`, addressed by element offsets in the params. The
// logical position t is word 1 of the per-step u32 buffer.
//
// Prefixed by common.wgsl (silu), layer_io.wgsl (act, vecs, rings, step_words)
// and, compiled on its own, wide.wgsl (WG) at pipeline build.
//
// Entry point and bindings (group 0):
//   conv  bindings 11 (params), 1 (act, read_write), 2 (vecs), 8 (step_words),
//         7 (rings, read_write) (layer_io.wgsl's, but for the params);
//         dispatch (ceil(hidden / WG), slots, 1), workgroup WG.
//         Workgroup y is token slot y: its step words from y · step_stride, its act
//         offsets from y · act_stride, and its sequence s = step[seq_at] owns the
//         ring from s · ring_seq_stride on (0 where the rings binding is already
//         that sequence's window; a batch pass's decode tokens, one per sequence,
//         run as one dispatch with the stride). One invocation per column c
//         (conv_column, which layer.wgsl's layer_step calls too):
//         ring[t mod ring][c] = v[c];
//         m = Σ_{j = 0}^{taps−1} [t ≥ j·dilation] conv[j][c] · ring[(t − j·dilation) mod ring][c]
//         (j ascending from 0.0); value[c] = v[c] + silu(m).

struct EngramConvParams {
    hidden: u32,
    taps: u32,
    dilation: u32,
    ring: u32,     // rows of the ring: (taps − 1)·dilation + 1
    v: u32,        // act: v = wv·e
    value: u32,    // act: out
    ring_off: u32, // rings: first element of this site's ring
    conv: u32,     // vectors: conv[taps, hidden]
    step_stride: u32,     // step words from one token slot to the next
    act_stride: u32,      // act elements from one token slot to the next
    seq_at: u32,          // step word of the slot's sequence
    ring_seq_stride: u32, // rings elements from one sequence's to the next's (or 0)
}
@group(0) @binding(11) var<uniform> cp: EngramConvParams;

// Column c of one site at position t: the ring write and the site value
// (ring0: the site's ring; a0: where the slot's act offsets count from).
fn conv_column(p: EngramConvParams, t: u32, ring0: u32, a0: u32, c: u32) {
    let h = p.hidden;
    let vv = act[a0 + p.v + c];
    rings[ring0 + (t % p.ring) * h + c] = vv;
    var m = 0.0;
    for (var j = 0u; j < p.taps; j++) {
        let back = j * p.dilation;
        if (back > t) {
            break;
        }
        let r = (t - back) % p.ring;
        m += vecs[p.conv + j * h + c] * rings[ring0 + r * h + c];
    }
    act[a0 + p.value + c] = vv + silu(m);
}

@compute @workgroup_size(WG)
fn conv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let c = wid.x * WG + li;
    if (c >= cp.hidden) {
        return;
    }
    let sw = wid.y * cp.step_stride;
    let ring0 = cp.ring_off + step_words[sw + cp.seq_at] * cp.ring_seq_stride;
    conv_column(cp, step_words[sw + 1u], ring0, wid.y * cp.act_stride, c);
}
