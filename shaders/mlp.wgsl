// mlp.wgsl: attention output norm and residual, Hadamard MLP and the lane update
// (SPEC §4.3 end of step 5, steps 6 and 7).
// CPU twin: kernels::mlp::block (src/kernels/mlp.rs).
//
// All activations live in one f32 buffer `act` and all F32 model tensors in one
// f32 buffer `vectors`, addressed by element offsets in the params.
//
// Prefixed by common.wgsl (wg_sum, silu, scratch), butterfly.wgsl (bfly4, bfly8)
// and layer_io.wgsl (act, vecs, EPS) at pipeline build.
//
// Entry point and bindings (group 0):
//   mlp  bindings 0..2  dispatch (1, tokens, 1), workgroup WG (ONE workgroup per
//        token; a decode step has one, a prefill chunk one per token slot, slot y
//        at act offsets + y·tstride): params, act (read_write), vectors (read).
//        after  = b + out_scale·zcrms(attn, post_norm)
//        z      = zcrms(after, mlp_norm) zero-padded to hd; z ⊙= d1; z = nfwht(z);
//        z      = silu(d2 ⊙ z); z = nfwht(z); z ⊙= d3
//        update = (after + z[..hidden]) − u
//        Writes `after`, `out` and `update`. The FWHT runs in workgroup memory when
//        hd <= 4096; above that, every 4096-chunk runs its first 12 stages in
//        workgroup memory and the remaining stages run in place on the `z`
//        scratch region of act (hd values), separated by storage barriers (one
//        workgroup, so that is a full synchronisation). Stages run in the order
//        of SEED §1 (h = 1, 2, 4, ...), each element seeing the same additions
//        as on the CPU; the nfwht scale 1/sqrt(hd) is applied after the butterfly.
//        For 16 <= hd <= 4096 the z_init, silu and output loops run inside the
//        transforms' first and last passes (fwht_first_z, fwht_last_*): the same
//        values with three workgroup-memory round trips and barriers fewer.

// Invocations per workgroup: a pipeline override (gpu::kernels::mlp::MlpKernels
// sets it from Capabilities::mlp_workgroup: 256 on GPUs, 64 on CPU adapters,
// where each barrier runs a loop over the workgroup's subgroups; never above
// Capabilities::wide_workgroup). A power of two, at most SCRATCH_LEN. layer.wgsl's
// layer_step is built at Capabilities::wide_workgroup.
override WG: u32 = 256u;
const CHUNK: u32 = 4096u;
const SCRATCH_LEN: u32 = CHUNK;

struct MlpParams {
    hidden: u32,
    hd: u32,        // hadamard_dim, a power of two >= hidden
    b: u32,         // act: block input
    u: u32,         // act: pre-mix output
    attn: u32,      // act: wo output
    after: u32,     // act: out
    update: u32,    // act: out
    z: u32,         // act: hd values of scratch (used when hd > 4096)
    post_norm: u32, // vectors: attn_post_norm
    mlp_norm: u32,  // vectors
    d1: u32,        // vectors
    d2: u32,        // vectors
    d3: u32,        // vectors
    out_scale: u32, // vectors: attn_out_scale (one value)
    out: u32,       // act: out = after + z[..hidden] (the MLP output, for parity captures)
    tstride: u32,   // act elements between token slots (workgroup y of a prefill chunk)
}
@group(0) @binding(0) var<uniform> mp: MlpParams;
// act and vecs (bindings 1, 2) and EPS come from layer_io.wgsl.

// First act element of this workgroup's token slot: workgroup_id.y · tstride.
var<private> ta: u32;

// common.wgsl's `scratch` (SCRATCH_LEN = CHUNK floats) is the FWHT buffer; reductions
// use scratch[0..256] before the transforms use all of it.

// Unnormalised butterfly stages h = 1 .. n/2 on scratch[0..n], in place: passes
// p0 .. p1 of fwht_passes(n) (0 and 32 for all). Call in uniform control flow
// after a barrier that follows the loads; ends with a barrier.
//
// Up to three stages per pass (radix 8): a pass starting at stage h0 gives each
// invocation runs of m elements base + j·h0 (j < m), which it loads into
// registers, runs stages h0 .. (m/2)·h0 on and stores back; one barrier per pass
// instead of one per stage, and 2 loads and stores per element per pass instead
// of per stage (workgroup memory accesses with per-invocation indices are
// gathers on CPU adapters). The first pass runs the 1, 2 or 3 stages that
// 3-stage passes leave over (m = first_run(n)), every later one 3 (m = 8), so
// a fused last pass (below) has one form. Every stage pairs the same elements
// with the same additions as the stage-by-stage order of SEED §1, in the same
// order, so the result is bit-identical however the stages are grouped.
fn fwht_shared(n: u32, li: u32, p0: u32, p1: u32) {
    let m = first_run(n);
    if (p0 == 0u && p1 > 0u && n > 1u) {
        for (var grp = li; grp < n / m; grp += WG) {
            let e = grp * m;
            if (m == 8u) {
                put8(e, 1u, scratch[e], scratch[e + 1u], scratch[e + 2u], scratch[e + 3u],
                     scratch[e + 4u], scratch[e + 5u], scratch[e + 6u], scratch[e + 7u]);
            } else if (m == 4u) {
                put4(e, 1u, scratch[e], scratch[e + 1u], scratch[e + 2u], scratch[e + 3u]);
            } else {
                put2(e, 1u, scratch[e], scratch[e + 1u]);
            }
        }
        workgroupBarrier();
    }
    // The 3-stage passes (one form: no branch around the loads).
    var h0 = m;
    for (var p = 1u; p < p0; p++) {
        h0 = h0 * 8u;
    }
    for (var p = max(p0, 1u); h0 < n && p < p1; p++) {
        for (var grp = li; grp < n / 8u; grp += WG) {
            let e = (grp / h0) * (8u * h0) + grp % h0;
            put8(e, h0, scratch[e], scratch[e + h0], scratch[e + 2u * h0], scratch[e + 3u * h0],
                 scratch[e + 4u * h0], scratch[e + 5u * h0], scratch[e + 6u * h0], scratch[e + 7u * h0]);
        }
        workgroupBarrier();
        h0 = h0 * 8u;
    }
}

// Values a run of the first pass: 2, 4 or 8 (n >= 2), the stages that 3-stage
// passes leave over.
fn first_run(n: u32) -> u32 {
    return 1u << (((countTrailingZeros(n) + 2u) % 3u) + 1u);
}

// Passes of the transform of n >= 2 values.
fn fwht_passes(n: u32) -> u32 {
    return 1u + (countTrailingZeros(n) - countTrailingZeros(first_run(n))) / 3u;
}

// The ends of mlp_body's transforms for CHUNK >= n >= 16 (fwht_shared's passes
// between them), each fused with the step before or after it: the first
// transform's first pass reads z_init, the last passes write silu(d2 · v · sc)
// into scratch or the output (each value the same expression as in a loop of
// its own: the same bits, with one workgroup-memory round trip and one barrier
// fewer at each end). Uniform control flow; each ends with a barrier.

// The first pass of the first transform, its values z_init(i, rf).
fn fwht_first_z(n: u32, li: u32, rf: f32) {
    let m = first_run(n);
    for (var grp = li; grp < n / m; grp += WG) {
        let e = grp * m;
        if (m == 8u) {
            put8(e, 1u, z_init(e, rf), z_init(e + 1u, rf), z_init(e + 2u, rf), z_init(e + 3u, rf),
                 z_init(e + 4u, rf), z_init(e + 5u, rf), z_init(e + 6u, rf), z_init(e + 7u, rf));
        } else if (m == 4u) {
            put4(e, 1u, z_init(e, rf), z_init(e + 1u, rf), z_init(e + 2u, rf), z_init(e + 3u, rf));
        } else {
            put2(e, 1u, z_init(e, rf), z_init(e + 1u, rf));
        }
    }
    workgroupBarrier();
}

// Run grp of the last pass (stage n / 8 on) in registers, into v.
fn last_run(n: u32, grp: u32, v: ptr<function, array<f32, 8>>) -> u32 {
    let h0 = n / 8u;
    *v = run8(grp, h0);
    return h0;
}

// The first transform's last pass: scratch[i] = silu(d2[i] · (v · sc)).
fn fwht_last_silu(n: u32, li: u32, sc: f32) {
    for (var grp = li; grp < n / 8u; grp += WG) {
        var v: array<f32, 8>;
        let h0 = last_run(n, grp, &v);
        scratch[grp] = silu(vecs[mp.d2 + grp] * (v[0] * sc));
        scratch[grp + h0] = silu(vecs[mp.d2 + grp + h0] * (v[1] * sc));
        scratch[grp + 2u * h0] = silu(vecs[mp.d2 + grp + 2u * h0] * (v[2] * sc));
        scratch[grp + 3u * h0] = silu(vecs[mp.d2 + grp + 3u * h0] * (v[3] * sc));
        scratch[grp + 4u * h0] = silu(vecs[mp.d2 + grp + 4u * h0] * (v[4] * sc));
        scratch[grp + 5u * h0] = silu(vecs[mp.d2 + grp + 5u * h0] * (v[5] * sc));
        scratch[grp + 6u * h0] = silu(vecs[mp.d2 + grp + 6u * h0] * (v[6] * sc));
        scratch[grp + 7u * h0] = silu(vecs[mp.d2 + grp + 7u * h0] * (v[7] * sc));
    }
    workgroupBarrier();
}

// Output column c from z[c] = v.
fn put_out(c: u32, v: f32, sc: f32) {
    let o = act[ta + mp.after + c] + (v * sc) * vecs[mp.d3 + c];
    act[ta + mp.out + c] = o;
    act[ta + mp.update + c] = o - act[ta + mp.u + c];
}

// The second transform's last pass, straight to the output columns < hidden
// (z above hidden is never read).
fn fwht_last_out(n: u32, li: u32, sc: f32) {
    let h = mp.hidden;
    for (var grp = li; grp < n / 8u; grp += WG) {
        var v: array<f32, 8>;
        let h0 = last_run(n, grp, &v);
        // Column grp + j·h0 is below hidden for j < k.
        var k = 0u;
        if (grp < h) {
            k = min(8u, (h - grp + h0 - 1u) / h0);
        }
        if (k > 0u) {
            put_out(grp, v[0], sc);
        }
        if (k > 1u) {
            put_out(grp + h0, v[1], sc);
        }
        if (k > 2u) {
            put_out(grp + 2u * h0, v[2], sc);
        }
        if (k > 3u) {
            put_out(grp + 3u * h0, v[3], sc);
        }
        if (k > 4u) {
            put_out(grp + 4u * h0, v[4], sc);
        }
        if (k > 5u) {
            put_out(grp + 5u * h0, v[5], sc);
        }
        if (k > 6u) {
            put_out(grp + 6u * h0, v[6], sc);
        }
        if (k > 7u) {
            put_out(grp + 7u * h0, v[7], sc);
        }
    }
    workgroupBarrier();
}

// Stages h = CHUNK .. hd/2 on act[ta + z .. z + hd], in place. Call in uniform control
// flow after a storage barrier that follows the stores; ends with a storage barrier.
fn fwht_global(li: u32) {
    let n = mp.hd;
    let z = mp.z;
    for (var h = CHUNK; h < n; h = h << 1u) {
        for (var p = li; p < n / 2u; p += WG) {
            let i = z + (p / h) * 2u * h + (p % h);
            let j = i + h;
            let a = act[ta + i];
            let b = act[ta + j];
            act[ta + i] = a + b;
            act[ta + j] = a - b;
        }
        storageBarrier();
        workgroupBarrier();
    }
}

// z before the first transform: zcrms(after, mlp_norm)[i] (0 past hidden) times d1[i].
fn z_init(i: u32, r: f32) -> f32 {
    var v = 0.0;
    if (i < mp.hidden) {
        v = act[ta + mp.after + i] * r * (1.0 + vecs[mp.mlp_norm + i]);
    }
    return v * vecs[mp.d1 + i];
}

@compute @workgroup_size(WG)
fn mlp(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    ta = wid.y * mp.tstride;
    mlp_body(li);
}

// The MLP of the token slot at `ta` by the 256 invocations of one workgroup (also
// layer.wgsl's, which is compiled after this file). Uniform control flow.
fn mlp_body(li: u32) {
    let h = mp.hidden;
    let hd = mp.hd;
    // after = b + s·zcrms(attn, post_norm).
    var asq = 0.0;
    for (var c = li; c < h; c += WG) {
        let x = act[ta + mp.attn + c];
        asq += x * x;
    }
    let ra = 1.0 / sqrt(wg_sum(asq, li) / f32(h) + EPS);
    let s = vecs[mp.out_scale];
    var fsq = 0.0;
    for (var c = li; c < h; c += WG) {
        let x = act[ta + mp.attn + c] * ra * (1.0 + vecs[mp.post_norm + c]);
        let f = act[ta + mp.b + c] + s * x;
        act[ta + mp.after + c] = f;
        fsq += f * f;
    }
    let rf = 1.0 / sqrt(wg_sum(fsq, li) / f32(h) + EPS);
    storageBarrier();
    let sc = 1.0 / sqrt(f32(hd));
    if (hd <= CHUNK && hd >= 16u) {
        let last = fwht_passes(hd) - 1u;
        fwht_first_z(hd, li, rf);
        fwht_shared(hd, li, 1u, last);
        fwht_last_silu(hd, li, sc);
        fwht_shared(hd, li, 0u, last);
        fwht_last_out(hd, li, sc);
    } else if (hd <= CHUNK) {
        for (var c = li; c < hd; c += WG) {
            scratch[c] = z_init(c, rf);
        }
        workgroupBarrier();
        fwht_shared(hd, li, 0u, 32u);
        for (var c = li; c < hd; c += WG) {
            scratch[c] = silu(vecs[mp.d2 + c] * (scratch[c] * sc));
        }
        workgroupBarrier();
        fwht_shared(hd, li, 0u, 32u);
        for (var c = li; c < h; c += WG) {
            let o = act[ta + mp.after + c] + (scratch[c] * sc) * vecs[mp.d3 + c];
            act[ta + mp.out + c] = o;
            act[ta + mp.update + c] = o - act[ta + mp.u + c];
        }
    } else {
        // First transform: chunk stages in workgroup memory, then global stages.
        for (var base = 0u; base < hd; base += CHUNK) {
            for (var c = li; c < CHUNK; c += WG) {
                scratch[c] = z_init(base + c, rf);
            }
            workgroupBarrier();
            fwht_shared(CHUNK, li, 0u, 32u);
            for (var c = li; c < CHUNK; c += WG) {
                act[ta + mp.z + base + c] = scratch[c];
            }
            workgroupBarrier();
        }
        storageBarrier();
        fwht_global(li);
        for (var c = li; c < hd; c += WG) {
            act[ta + mp.z + c] = silu(vecs[mp.d2 + c] * (act[ta + mp.z + c] * sc));
        }
        storageBarrier();
        // Second transform.
        for (var base = 0u; base < hd; base += CHUNK) {
            for (var c = li; c < CHUNK; c += WG) {
                scratch[c] = act[ta + mp.z + base + c];
            }
            workgroupBarrier();
            fwht_shared(CHUNK, li, 0u, 32u);
            for (var c = li; c < CHUNK; c += WG) {
                act[ta + mp.z + base + c] = scratch[c];
            }
            workgroupBarrier();
        }
        storageBarrier();
        fwht_global(li);
        for (var c = li; c < h; c += WG) {
            let o = act[ta + mp.after + c] + (act[ta + mp.z + c] * sc) * vecs[mp.d3 + c];
            act[ta + mp.out + c] = o;
            act[ta + mp.update + c] = o - act[ta + mp.u + c];
        }
    }
}
