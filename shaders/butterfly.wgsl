// butterfly.wgsl: the butterflies of the radix-8 Walsh–Hadamard passes that hold
// a run of values in registers (mlp.wgsl's fwht_shared, cq.wgsl's fwht_groups).
// The host prefixes it to those files' sources (gpu::kernels::{mlp, layer, cq}).
// Every stage pairs the values of SEED §1's stage-by-stage order with the same
// additions in the same order, so a pass is bit-identical to its stages.

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
