// cq_subgroup.wgsl: the subgroup variant of cq.wgsl's matvec reduction.
// CPU twin: as cq.wgsl's matvec (kernels::prepare::pre_op, then CqMatrix::matvec_rows_prepared).
// Built as cq.wgsl + this file, only when the adapter has SUBGROUP and
// CQLM_NO_SUBGROUPS is unset (naga takes subgroup builtins without an
// `enable subgroups;` directive, which it rejects). Same bindings (4..8) and dispatch
// geometry as `matvec`.
//
// Each row's 16 partial sums are added with subgroupShuffleXor over the offsets
// below the subgroup size (any power of two); when the subgroup is narrower than
// 16 (lavapipe: 8), the 16 / size subgroup sums of a row meet in workgroup memory.
// Assumes subgroups are contiguous runs of local_invocation_index, as every
// driver lays out one-dimensional workgroups.

@compute @workgroup_size(64)
fn matvec_sg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_size) sg: u32,
) {
    let lane = li % 16u;
    // The inputs one after another (as `matvec`).
    for (var tok = 0u; tok < mp.tokens; tok++) {
        let r = matvec_setup(li, tok);
        for (var t = 0u; t < mp.team_rows; t++) {
            let part = matvec_partial(team_row(wid, t, li), li, r);
            var v = part.acc;
            for (var off = 8u; off > 0u; off = off >> 1u) {
                if (off < sg) {
                    v += subgroupShuffleXor(v, off);
                }
            }
            // v now holds the sum over min(sg, 16) lanes of the row.
            red[li] = v;
            workgroupBarrier();
            if (lane == 0u && part.out_at != 0xffffffffu) {
                let step = min(sg, 16u);
                var total = 0.0;
                for (var k = 0u; k < 16u; k += step) {
                    total += red[li + k];
                }
                yout[part.out_at + tok * mp.y_tstride] = total;
            }
            workgroupBarrier();
        }
    }
}

// ---------------------------------------------------------------- matvec_rows_sg
// Binding 9: the arena again, as vec4<u32> (packed rows start 16-byte aligned).
@group(0) @binding(9) var<storage, read> arena4: array<vec4<u32>>;

// `matvec_rows` (cq.wgsl) for CPU adapters with subgroups: the same geometry,
// bindings and sums, except that at 4 and 2 bits a word's activations reach the
// lanes as one load per lane and subgroup broadcasts (subgroups of at least 8),
// instead of every lane loading the same 8 or 16 values from workgroup memory
// (on lavapipe each such load is a per-lane gather), and that a row's words come
// four per vec4<u32> load (binding 9) where a group holds whole fours. The
// subgroup broadcasts sit in uniform control flow (BITS and the subgroup size are
// uniform). Dispatch: as matvec_rows; bindings 4..9.
//
// A deliberate twin of matvec_rows rather than one body with the activation
// loads behind a function defined per variant: that version was measured 15%
// slower on lavapipe (matvec4 81-88 against 71-72 ms/token in interleaved
// profiles; the call and its struct result are not optimised away), and this
// kernel exists for lavapipe.
// WGSL's uniformity analysis cannot see that a loop bounded by subgroupAny is
// subgroup-uniform (every lane of a subgroup gets the same result), so Tint
// would reject the broadcasts inside; the filter below turns that rule off for
// this entry point only. Bounding the loop uniformly instead (every subgroup
// running every group, dead ones too) measured 10-15% slower decode on lavapipe.
@diagnostic(off, subgroup_uniformity)
@compute @workgroup_size(64)
fn matvec_rows_sg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) sl: u32,
    @builtin(subgroup_size) sg: u32,
) {
    // The inputs one after another, each as a decode step computes it
    // (`matvec_rows_sgb` shares each decoded word among several).
    let per = 32u / BITS;
    let first = rows_first(wid, li);
    rows_load(first);
    // A subgroup with no row at all skips the sums (subgroup-uniform, so the
    // broadcasts inside still see every lane).
    let live = subgroupAny(first < mp.total_rows);
    for (var tok = 0u; tok < mp.tokens; tok++) {
        let r = input_start(li, tok);
        var acc = vec4<f32>(0.0);
        for (var c0 = 0u; c0 < mp.row_words * per; c0 += XW) {
            let gs = rows_chunk(li, c0, r, live);
            let g0 = gs.x;
            for (var g = g0; g < gs.y; g++) {
                var gacc = vec4<f32>(0.0);
                // Four words at a time where a group holds whole fours (packed rows
                // start 16-byte aligned): one vec4<u32> gather per row instead of four.
                if ((BITS == 4u || BITS == 2u) && mp.group_words % 4u == 0u && sg >= 8u) {
                    for (var w = 0u; w < mp.group_words; w += 4u) {
                        let wi = g * mp.group_words + w;
                        let xb = (wi - g0 * mp.group_words) * per;
                        // The word's first 32 activations (all of a 4-bit quad's),
                        // one load per lane and broadcasts.
                        let l0 = scratch[xb + 0u + (sl & 7u)];
                        let l1 = scratch[xb + 8u + (sl & 7u)];
                        let l2 = scratch[xb + 16u + (sl & 7u)];
                        let l3 = scratch[xb + 24u + (sl & 7u)];
                        let x0 = bcast_lo(l0);
                        let x1 = bcast_hi(l0);
                        let x2 = bcast_lo(l1);
                        let x3 = bcast_hi(l1);
                        let x4 = bcast_lo(l2);
                        let x5 = bcast_hi(l2);
                        let x6 = bcast_lo(l3);
                        let x7 = bcast_hi(l3);
                        if (BITS == 4u) {
                            for (var k = 0u; k < ROWS_PER_INV; k++) {
                                let q = arena4[(rr[k].pbase + wi) >> 2u];
                                let d0 = word4(k, q.x, x0, x1);
                                let d1 = word4(k, q.y, x2, x3);
                                let d2 = word4(k, q.z, x4, x5);
                                let d3 = word4(k, q.w, x6, x7);
                                gacc[k] += (d0 + d1) + (d2 + d3);
                            }
                        } else {
                            // A 2-bit quad holds 64: the other 32.
                            let l4 = scratch[xb + 32u + (sl & 7u)];
                            let l5 = scratch[xb + 40u + (sl & 7u)];
                            let l6 = scratch[xb + 48u + (sl & 7u)];
                            let l7 = scratch[xb + 56u + (sl & 7u)];
                            let x8 = bcast_lo(l4);
                            let x9 = bcast_hi(l4);
                            let x10 = bcast_lo(l5);
                            let x11 = bcast_hi(l5);
                            let x12 = bcast_lo(l6);
                            let x13 = bcast_hi(l6);
                            let x14 = bcast_lo(l7);
                            let x15 = bcast_hi(l7);
                            for (var k = 0u; k < ROWS_PER_INV; k++) {
                                let q = arena4[(rr[k].pbase + wi) >> 2u];
                                let d0 = word2(k, q.x, x0, x1, x2, x3);
                                let d1 = word2(k, q.y, x4, x5, x6, x7);
                                let d2 = word2(k, q.z, x8, x9, x10, x11);
                                let d3 = word2(k, q.w, x12, x13, x14, x15);
                                gacc[k] += (d0 + d1) + (d2 + d3);
                            }
                        }
                    }
                } else {
                    for (var w = 0u; w < mp.group_words; w++) {
                        let wi = g * mp.group_words + w;
                        gacc += rows_word_sg(wi, (wi - g0 * mp.group_words) * per, sl, sg);
                    }
                }
                acc = rows_scaled(acc, g, gacc);
            }
        }
        rows_done(first, tok, acc);
    }
}

// rows_word with subgroups of at least 8 at 4 and 2 bits: the activations as one
// load per lane and broadcasts (no per-lane gathers of the same values).
// (Subgroup-uniform where matvec_rows_sg calls it: see its filter.)
@diagnostic(off, subgroup_uniformity)
fn rows_word_sg(wi: u32, xb: u32, sl: u32, sg: u32) -> vec4<f32> {
    if (sg < 8u || (BITS != 4u && BITS != 2u)) {
        return rows_word(wi, xb);
    }
    let xl = scratch[xb + (sl & 7u)];
    if (BITS == 4u) {
        return rows_word4(wi, bcast_lo(xl), bcast_hi(xl));
    }
    let xh = scratch[xb + 8u + (sl & 7u)];
    return rows_word2(wi, bcast_lo(xl), bcast_hi(xl), bcast_lo(xh), bcast_hi(xh));
}

// Lanes 0..3 and 4..7's values of `v`, broadcast to every lane.
@diagnostic(off, subgroup_uniformity)
fn bcast_lo(v: f32) -> vec4<f32> {
    return vec4<f32>(subgroupBroadcast(v, 0u), subgroupBroadcast(v, 1u), subgroupBroadcast(v, 2u), subgroupBroadcast(v, 3u));
}

@diagnostic(off, subgroup_uniformity)
fn bcast_hi(v: f32) -> vec4<f32> {
    return vec4<f32>(subgroupBroadcast(v, 4u), subgroupBroadcast(v, 5u), subgroupBroadcast(v, 6u), subgroupBroadcast(v, 7u));
}

// ---------------------------------------------------------------- matvec_rows_sgb
// Batched `matvec_rows_sg` (the prefill's and a batch pass's matvec on CPU
// adapters): the same geometry and per-input sums (each output is bit-identical
// to what `matvec_rows_sg` computes for that input alone), but each packed word is
// decoded once for a block of mp.tb <= 8 inputs, and each input's activations are
// broadcast once for the 4 rows, so the codebook lookups, word loads and
// activation gathers, which dominate that kernel on lavapipe, are shared. Its
// inputs are prepared already (mode 4, by `prepare_inputs`) and read as vec4s
// from binding 10 (a buffer other than the output; x_off and x_tstride multiples
// of 4): each lane loads one vec4 of a quad's 32 activations (64 at 2 bits: two)
// and a subgroup broadcast hands each vec4 to every lane. No workgroup memory and
// no barrier: lavapipe runs a workgroup with barriers as coroutines whose values
// live in memory, and this kernel without its staging measured 1.5x faster
// (768 and 4103 rows of 256 columns, 8 inputs). The host uses it only where
// `matvec_rows_sg` takes its four-word path: BITS 4 or 2, group_words % 4 == 0,
// subgroups of at least 8. Dispatch: as matvec_rows in x and y; in z, the blocks
// of mp.tb inputs (workgroup z takes blocks z, z + nz, …), so a matrix of few
// rows still spreads a pass's inputs over the device's threads. Bindings 4, 5, 7,
// 9, 10.
//
// Measured on lavapipe (2 Zen 3 cores, 32 inputs, 512 columns, group 128): 2.0-3.0x
// faster per input than one matvec_rows_sg per input at 4 bits (1280 and 32000
// rows), 1.3-1.5x at 2 bits; broadcasting per row instead of once for the 4
// rows gave 1.5-1.8x at 4 bits.
@group(0) @binding(10) var<storage, read> xin4: array<vec4<f32>>;

// WGSL's uniformity analysis cannot see that a loop bounded by subgroupAny is
// subgroup-uniform (every lane of a subgroup gets the same result), so Tint
// would reject the broadcasts inside; the filter below turns that rule off for
// this entry point only. Bounding the loop uniformly instead (every subgroup
// running every group, dead ones too) measured 10-15% slower decode on lavapipe.
@diagnostic(off, subgroup_uniformity)
@compute @workgroup_size(64)
fn matvec_rows_sgb(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) sl: u32,
) {
    let per = 32u / BITS;
    let first = rows_first(wid, li);
    // As in matvec_rows_sg: a subgroup with no row of its own skips the sums.
    let live = subgroupAny(first < mp.total_rows);
    rows_load(first);
    let groups = mp.row_words / mp.group_words;
    let s = sl & 7u;
    for (var t0 = wid.z * mp.tb; t0 < mp.tokens; t0 += mp.tb * nwg.z) {
        let tb = min(mp.tb, mp.tokens - t0);
        // acc[t][k]: input t0 + t, row first + k.
        var acc: array<vec4<f32>, 8>;
        for (var t = 0u; t < 8u; t++) {
            acc[t] = vec4<f32>(0.0);
        }
        for (var g = 0u; g < select(0u, groups, live); g++) {
            var gacc: array<vec4<f32>, 8>;
            for (var t = 0u; t < 8u; t++) {
                gacc[t] = vec4<f32>(0.0);
            }
            for (var w = 0u; w < mp.group_words; w += 4u) {
                let wi = g * mp.group_words + w;
                // The quad's levels of the 4 rows (each row's codes looked up once for all
                // inputs; a private array read at loop-uniform indices, so plain loads).
                var lv: array<vec4<f32>, 64>;
                for (var k = 0u; k < ROWS_PER_INV; k++) {
                    let q = arena4[(rr[k].pbase + wi) >> 2u];
                    if (BITS == 4u) {
                        lv[k * 8u + 0u] = levels4(k, q.x, 0u);
                        lv[k * 8u + 1u] = levels4(k, q.x, 1u);
                        lv[k * 8u + 2u] = levels4(k, q.y, 0u);
                        lv[k * 8u + 3u] = levels4(k, q.y, 1u);
                        lv[k * 8u + 4u] = levels4(k, q.z, 0u);
                        lv[k * 8u + 5u] = levels4(k, q.z, 1u);
                        lv[k * 8u + 6u] = levels4(k, q.w, 0u);
                        lv[k * 8u + 7u] = levels4(k, q.w, 1u);
                    } else {
                        lv[k * 16u + 0u] = levels2(k, q.x, 0u);
                        lv[k * 16u + 1u] = levels2(k, q.x, 1u);
                        lv[k * 16u + 2u] = levels2(k, q.x, 2u);
                        lv[k * 16u + 3u] = levels2(k, q.x, 3u);
                        lv[k * 16u + 4u] = levels2(k, q.y, 0u);
                        lv[k * 16u + 5u] = levels2(k, q.y, 1u);
                        lv[k * 16u + 6u] = levels2(k, q.y, 2u);
                        lv[k * 16u + 7u] = levels2(k, q.y, 3u);
                        lv[k * 16u + 8u] = levels2(k, q.z, 0u);
                        lv[k * 16u + 9u] = levels2(k, q.z, 1u);
                        lv[k * 16u + 10u] = levels2(k, q.z, 2u);
                        lv[k * 16u + 11u] = levels2(k, q.z, 3u);
                        lv[k * 16u + 12u] = levels2(k, q.w, 0u);
                        lv[k * 16u + 13u] = levels2(k, q.w, 1u);
                        lv[k * 16u + 14u] = levels2(k, q.w, 2u);
                        lv[k * 16u + 15u] = levels2(k, q.w, 3u);
                    }
                }
                // Each input's activations broadcast once for the 4 rows.
                for (var t = 0u; t < tb; t++) {
                    // Vec4 index of the quad's first activation of input t0 + t.
                    let xq = ((mp.x_off + (t0 + t) * mp.x_tstride) >> 2u) + wi * (per >> 2u);
                    // Activations 4j .. 4j + 3 of the quad: the vec4 lane j loaded.
                    let v0 = xin4[xq + s];
                    let x0 = subgroupBroadcast(v0, 0u);
                    let x1 = subgroupBroadcast(v0, 1u);
                    let x2 = subgroupBroadcast(v0, 2u);
                    let x3 = subgroupBroadcast(v0, 3u);
                    let x4 = subgroupBroadcast(v0, 4u);
                    let x5 = subgroupBroadcast(v0, 5u);
                    let x6 = subgroupBroadcast(v0, 6u);
                    let x7 = subgroupBroadcast(v0, 7u);
                    if (BITS == 4u) {
                        for (var k = 0u; k < ROWS_PER_INV; k++) {
                            let a = k * 8u;
                            let d0 = dot(lv[a], x0) + dot(lv[a + 1u], x1);
                            let d1 = dot(lv[a + 2u], x2) + dot(lv[a + 3u], x3);
                            let d2 = dot(lv[a + 4u], x4) + dot(lv[a + 5u], x5);
                            let d3 = dot(lv[a + 6u], x6) + dot(lv[a + 7u], x7);
                            gacc[t][k] += (d0 + d1) + (d2 + d3);
                        }
                    } else {
                        // At 2 bits a quad holds 64: the second 32 from lanes 0..7 again.
                        let v1 = xin4[xq + 8u + s];
                        let x8 = subgroupBroadcast(v1, 0u);
                        let x9 = subgroupBroadcast(v1, 1u);
                        let x10 = subgroupBroadcast(v1, 2u);
                        let x11 = subgroupBroadcast(v1, 3u);
                        let x12 = subgroupBroadcast(v1, 4u);
                        let x13 = subgroupBroadcast(v1, 5u);
                        let x14 = subgroupBroadcast(v1, 6u);
                        let x15 = subgroupBroadcast(v1, 7u);
                        for (var k = 0u; k < ROWS_PER_INV; k++) {
                            let a = k * 16u;
                            let d0 = (dot(lv[a], x0) + dot(lv[a + 1u], x1)) + (dot(lv[a + 2u], x2) + dot(lv[a + 3u], x3));
                            let d1 = (dot(lv[a + 4u], x4) + dot(lv[a + 5u], x5)) + (dot(lv[a + 6u], x6) + dot(lv[a + 7u], x7));
                            let d2 = (dot(lv[a + 8u], x8) + dot(lv[a + 9u], x9)) + (dot(lv[a + 10u], x10) + dot(lv[a + 11u], x11));
                            let d3 = (dot(lv[a + 12u], x12) + dot(lv[a + 13u], x13)) + (dot(lv[a + 14u], x14) + dot(lv[a + 15u], x15));
                            gacc[t][k] += (d0 + d1) + (d2 + d3);
                        }
                    }
                }
            }
            let nv = vec4<f32>(norm_at(rr[0].nbase + g), norm_at(rr[1].nbase + g),
                               norm_at(rr[2].nbase + g), norm_at(rr[3].nbase + g));
            for (var t = 0u; t < tb; t++) {
                acc[t] += nv * gacc[t];
            }
        }
        for (var t = 0u; t < tb; t++) {
            rows_store(first, t0 + t, acc[t]);
        }
    }
}
