// common.wgsl: helpers shared by attention, engram, mhc, mlp and sample.wgsl. The host
// concatenates this file IN FRONT of each of those sources when it builds their
// pipelines (gpu::kernels::<family>::SOURCE is `common.wgsl ++ <family>.wgsl`), so
// a helper lives here once; it is never compiled on its own.
//
// Each including shader defines (WGSL module-scope declarations may come in any order):
//   WG           its workgroup size (a power of two), the width of the tree reductions;
//   SCRATCH_LEN  the length of `scratch` (at least WG where wg_sum / wg_max are used).
// Only entry points that use `scratch` pay for it in workgroup memory.
//
// Summation order, the one shared convention:
//   - Sums the GPU must reproduce bit for bit against the CPU follow
//     kernels::norm::inv_rms: 8 partial sums, partial k over the indices i ≡ k (mod 8)
//     in ascending i, then the 8 partials added in order from 0.0 (attention.wgsl's
//     sum_sq8, the per-head q/k RMS, whose result decides int8 KV codes).
//   - Every other workgroup sum (wg_sum: strided per-invocation partials, then a
//     shared-memory tree) has its own order; its results are compared with the CPU
//     within a tolerance, and are bit-identical only between runs of one pipeline.

// Workgroup scratch for reductions; mlp.wgsl also runs its FWHT in it.
var<workgroup> scratch: array<f32, SCRATCH_LEN>;

// Workgroup sum of every invocation's `v` (tree over scratch[0..WG]; every invocation
// gets the result). Call in uniform control flow.
fn wg_sum(v: f32, li: u32) -> f32 {
    scratch[li] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (li < s) {
            scratch[li] += scratch[li + s];
        }
        workgroupBarrier();
    }
    let r = scratch[0];
    workgroupBarrier();
    return r;
}

// Workgroup maximum of every invocation's `v`, as wg_sum.
fn wg_max(v: f32, li: u32) -> f32 {
    scratch[li] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (li < s) {
            scratch[li] = max(scratch[li], scratch[li + s]);
        }
        workgroupBarrier();
    }
    let r = scratch[0];
    workgroupBarrier();
    return r;
}

// σ(x) = 1 / (1 + e^−x).
fn sigm(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// silu(x) = x · σ(x), in that order of operations.
fn silu(x: f32) -> f32 {
    return x * (1.0 / (1.0 + exp(-x)));
}

// Neither NaN nor ±∞: the exponent bits are not all ones. An integer test, so a
// compiler that assumes no NaN or ∞ (Metal fast math; WGSL allows it) can't fold it.
fn finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}
