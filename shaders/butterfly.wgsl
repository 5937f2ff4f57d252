// butterfly.wgsl: the butterflies of the radix-8 Walsh–Hadamard passes that hold
// a run of values in registers (mlp.wgsl's fwht_shared, cq.wgsl's fwht_groups).
// The host prefixes it to those files' sources (gpu::kernels::{mlp, layer, cq}).
// Every stage pairs the values of SEED §1's stage-by-stage order with the same
// additions in the same order, so a pass is bit-identical to its stages.
//
// Each including module declares `scratch`, the workgroup array the passes run
// in (common.wgsl's for mlp and layer, cq.wgsl's staging array for cq), which
// put8, put4 and put2 store a run back to.

// One butterfly: (a, b) <- (a + b, a - b).
fn bfly(a: ptr<function, f32>, b: ptr<function, f32>) {
    let t = *a;
    *a = t + *b;
    *b = t - *b;
}

// Stages h0 and 2·h0 of a run of 4 values h0 apart.
fn bfly4(v0: ptr<function, f32>, v1: ptr<function, f32>, v2: ptr<function, f32>, v3: ptr<function, f32>) {
    bfly(v0, v1);
    bfly(v2, v3);
    bfly(v0, v2);
    bfly(v1, v3);
}

// Stages h0, 2·h0 and 4·h0 of a run of 8 values h0 apart.
fn bfly8(
    v0: ptr<function, f32>, v1: ptr<function, f32>, v2: ptr<function, f32>, v3: ptr<function, f32>,
    v4: ptr<function, f32>, v5: ptr<function, f32>, v6: ptr<function, f32>, v7: ptr<function, f32>,
) {
    bfly4(v0, v1, v2, v3);
    bfly4(v4, v5, v6, v7);
    bfly(v0, v4);
    bfly(v1, v5);
    bfly(v2, v6);
    bfly(v3, v7);
}

// Butterfly stages on the values a0.. of one run (elements e + j·h) in
// registers, stored back to scratch: a pass's step for one run, its values
// loaded by the caller (from scratch, or staged from a raw input). Arguments are
// values, so the run stays in registers (the compiler inlines these).
fn put8(e: u32, h: u32, a0: f32, a1: f32, a2: f32, a3: f32, a4: f32, a5: f32, a6: f32, a7: f32) {
    var v0 = a0;
    var v1 = a1;
    var v2 = a2;
    var v3 = a3;
    var v4 = a4;
    var v5 = a5;
    var v6 = a6;
    var v7 = a7;
    bfly8(&v0, &v1, &v2, &v3, &v4, &v5, &v6, &v7);
    scratch[e] = v0;
    scratch[e + h] = v1;
    scratch[e + 2u * h] = v2;
    scratch[e + 3u * h] = v3;
    scratch[e + 4u * h] = v4;
    scratch[e + 5u * h] = v5;
    scratch[e + 6u * h] = v6;
    scratch[e + 7u * h] = v7;
}

// The run of 8 values scratch[e + j·h] (j < 8) after stages h, 2·h and 4·h,
// in registers.
fn run8(e: u32, h: u32) -> array<f32, 8> {
    var v0 = scratch[e];
    var v1 = scratch[e + h];
    var v2 = scratch[e + 2u * h];
    var v3 = scratch[e + 3u * h];
    var v4 = scratch[e + 4u * h];
    var v5 = scratch[e + 5u * h];
    var v6 = scratch[e + 6u * h];
    var v7 = scratch[e + 7u * h];
    bfly8(&v0, &v1, &v2, &v3, &v4, &v5, &v6, &v7);
    return array<f32, 8>(v0, v1, v2, v3, v4, v5, v6, v7);
}

fn put4(e: u32, h: u32, a0: f32, a1: f32, a2: f32, a3: f32) {
    var v0 = a0;
    var v1 = a1;
    var v2 = a2;
    var v3 = a3;
    bfly4(&v0, &v1, &v2, &v3);
    scratch[e] = v0;
    scratch[e + h] = v1;
    scratch[e + 2u * h] = v2;
    scratch[e + 3u * h] = v3;
}

fn put2(e: u32, h: u32, a0: f32, a1: f32) {
    var v0 = a0;
    var v1 = a1;
    bfly(&v0, &v1);
    scratch[e] = v0;
    scratch[e + h] = v1;
}
