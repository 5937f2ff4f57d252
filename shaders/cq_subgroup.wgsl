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
        xbase = mp.x_off + tok * mp.x_tstride;
        let r = matvec_setup(li);
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
    for (var tok = 0u; tok < mp.tokens; tok++) {
        xbase = mp.x_off + tok * mp.x_tstride;
        let ncb = 1u << BITS;
        let per = 32u / BITS;
        let wg = wid.x + wid.y * mp.grid_x;
        let r = input_rms(li);
        let padded = mp.row_words * per;
        // An input of one chunk is staged once, before the rows' setup.
        let single = padded <= XW;
        if (single) {
            stage_chunk(li, 0u, padded, r);
        }
        let first = (wg * 64u + li) * ROWS_PER_INV;
        // Rows past the last read the last row and write nothing; a subgroup
        // with no row at all skips the sums (subgroup-uniform, so the broadcasts
        // inside still see every lane).
        let live = subgroupAny(first < mp.total_rows);
        var rr: array<RowRef, 4>;
        var cb: array<array<f32, 16>, 4>;
        for (var k = 0u; k < ROWS_PER_INV; k++) {
            rr[k] = row_ref(min(first + k, mp.total_rows - 1u));
            for (var i = 0u; i < min(ncb, 16u); i++) {
                cb[k][i] = bitcast<f32>(arena[rr[k].cb + i]);
            }
        }
        var acc = vec4<f32>(0.0);
        var xv: array<f32, 32>;
        for (var c0 = 0u; c0 < padded; c0 += XW) {
            let len = min(XW, padded - c0);
            if (!single) {
                stage_chunk(li, c0, len, r);
            }
            let g0 = c0 / (mp.group_words * per);
            let g_end = select(g0, g0 + len / (mp.group_words * per), live);
            for (var g = g0; g < g_end; g++) {
                var gacc = vec4<f32>(0.0);
                // Four words at a time where a group holds whole fours (packed rows
                // start 16-byte aligned): one vec4<u32> gather per row instead of four.
                if ((BITS == 4u || BITS == 2u) && mp.group_words % 4u == 0u && sg >= 8u) {
                    for (var w = 0u; w < mp.group_words; w += 4u) {
                        let wi = g * mp.group_words + w;
                        let xb = (wi - g0 * mp.group_words) * per;
                        if (BITS == 4u) {
                            let l0 = xw[xb + 0u + (sl & 7u)];
                            let l1 = xw[xb + 8u + (sl & 7u)];
                            let l2 = xw[xb + 16u + (sl & 7u)];
                            let l3 = xw[xb + 24u + (sl & 7u)];
                            let x0 = vec4<f32>(subgroupBroadcast(l0, 0u), subgroupBroadcast(l0, 1u), subgroupBroadcast(l0, 2u), subgroupBroadcast(l0, 3u));
                            let x1 = vec4<f32>(subgroupBroadcast(l0, 4u), subgroupBroadcast(l0, 5u), subgroupBroadcast(l0, 6u), subgroupBroadcast(l0, 7u));
                            let x2 = vec4<f32>(subgroupBroadcast(l1, 0u), subgroupBroadcast(l1, 1u), subgroupBroadcast(l1, 2u), subgroupBroadcast(l1, 3u));
                            let x3 = vec4<f32>(subgroupBroadcast(l1, 4u), subgroupBroadcast(l1, 5u), subgroupBroadcast(l1, 6u), subgroupBroadcast(l1, 7u));
                            let x4 = vec4<f32>(subgroupBroadcast(l2, 0u), subgroupBroadcast(l2, 1u), subgroupBroadcast(l2, 2u), subgroupBroadcast(l2, 3u));
                            let x5 = vec4<f32>(subgroupBroadcast(l2, 4u), subgroupBroadcast(l2, 5u), subgroupBroadcast(l2, 6u), subgroupBroadcast(l2, 7u));
                            let x6 = vec4<f32>(subgroupBroadcast(l3, 0u), subgroupBroadcast(l3, 1u), subgroupBroadcast(l3, 2u), subgroupBroadcast(l3, 3u));
                            let x7 = vec4<f32>(subgroupBroadcast(l3, 4u), subgroupBroadcast(l3, 5u), subgroupBroadcast(l3, 6u), subgroupBroadcast(l3, 7u));
                            for (var k = 0u; k < ROWS_PER_INV; k++) {
                                let q = arena4[(rr[k].pbase + wi) >> 2u];
                                let d0 = dot(vec4<f32>(cb[k][q.x & 15u], cb[k][(q.x >> 4u) & 15u], cb[k][(q.x >> 8u) & 15u], cb[k][(q.x >> 12u) & 15u]), x0)
                                    + dot(vec4<f32>(cb[k][(q.x >> 16u) & 15u], cb[k][(q.x >> 20u) & 15u], cb[k][(q.x >> 24u) & 15u], cb[k][q.x >> 28u]), x1);
                                let d1 = dot(vec4<f32>(cb[k][q.y & 15u], cb[k][(q.y >> 4u) & 15u], cb[k][(q.y >> 8u) & 15u], cb[k][(q.y >> 12u) & 15u]), x2)
                                    + dot(vec4<f32>(cb[k][(q.y >> 16u) & 15u], cb[k][(q.y >> 20u) & 15u], cb[k][(q.y >> 24u) & 15u], cb[k][q.y >> 28u]), x3);
                                let d2 = dot(vec4<f32>(cb[k][q.z & 15u], cb[k][(q.z >> 4u) & 15u], cb[k][(q.z >> 8u) & 15u], cb[k][(q.z >> 12u) & 15u]), x4)
                                    + dot(vec4<f32>(cb[k][(q.z >> 16u) & 15u], cb[k][(q.z >> 20u) & 15u], cb[k][(q.z >> 24u) & 15u], cb[k][q.z >> 28u]), x5);
                                let d3 = dot(vec4<f32>(cb[k][q.w & 15u], cb[k][(q.w >> 4u) & 15u], cb[k][(q.w >> 8u) & 15u], cb[k][(q.w >> 12u) & 15u]), x6)
                                    + dot(vec4<f32>(cb[k][(q.w >> 16u) & 15u], cb[k][(q.w >> 20u) & 15u], cb[k][(q.w >> 24u) & 15u], cb[k][q.w >> 28u]), x7);
                                gacc[k] += (d0 + d1) + (d2 + d3);
                            }
                        } else {
                            let l0 = xw[xb + 0u + (sl & 7u)];
                            let l1 = xw[xb + 8u + (sl & 7u)];
                            let l2 = xw[xb + 16u + (sl & 7u)];
                            let l3 = xw[xb + 24u + (sl & 7u)];
                            let l4 = xw[xb + 32u + (sl & 7u)];
                            let l5 = xw[xb + 40u + (sl & 7u)];
                            let l6 = xw[xb + 48u + (sl & 7u)];
                            let l7 = xw[xb + 56u + (sl & 7u)];
                            let x0 = vec4<f32>(subgroupBroadcast(l0, 0u), subgroupBroadcast(l0, 1u), subgroupBroadcast(l0, 2u), subgroupBroadcast(l0, 3u));
                            let x1 = vec4<f32>(subgroupBroadcast(l0, 4u), subgroupBroadcast(l0, 5u), subgroupBroadcast(l0, 6u), subgroupBroadcast(l0, 7u));
                            let x2 = vec4<f32>(subgroupBroadcast(l1, 0u), subgroupBroadcast(l1, 1u), subgroupBroadcast(l1, 2u), subgroupBroadcast(l1, 3u));
                            let x3 = vec4<f32>(subgroupBroadcast(l1, 4u), subgroupBroadcast(l1, 5u), subgroupBroadcast(l1, 6u), subgroupBroadcast(l1, 7u));
                            let x4 = vec4<f32>(subgroupBroadcast(l2, 0u), subgroupBroadcast(l2, 1u), subgroupBroadcast(l2, 2u), subgroupBroadcast(l2, 3u));
                            let x5 = vec4<f32>(subgroupBroadcast(l2, 4u), subgroupBroadcast(l2, 5u), subgroupBroadcast(l2, 6u), subgroupBroadcast(l2, 7u));
                            let x6 = vec4<f32>(subgroupBroadcast(l3, 0u), subgroupBroadcast(l3, 1u), subgroupBroadcast(l3, 2u), subgroupBroadcast(l3, 3u));
                            let x7 = vec4<f32>(subgroupBroadcast(l3, 4u), subgroupBroadcast(l3, 5u), subgroupBroadcast(l3, 6u), subgroupBroadcast(l3, 7u));
                            let x8 = vec4<f32>(subgroupBroadcast(l4, 0u), subgroupBroadcast(l4, 1u), subgroupBroadcast(l4, 2u), subgroupBroadcast(l4, 3u));
                            let x9 = vec4<f32>(subgroupBroadcast(l4, 4u), subgroupBroadcast(l4, 5u), subgroupBroadcast(l4, 6u), subgroupBroadcast(l4, 7u));
                            let x10 = vec4<f32>(subgroupBroadcast(l5, 0u), subgroupBroadcast(l5, 1u), subgroupBroadcast(l5, 2u), subgroupBroadcast(l5, 3u));
                            let x11 = vec4<f32>(subgroupBroadcast(l5, 4u), subgroupBroadcast(l5, 5u), subgroupBroadcast(l5, 6u), subgroupBroadcast(l5, 7u));
                            let x12 = vec4<f32>(subgroupBroadcast(l6, 0u), subgroupBroadcast(l6, 1u), subgroupBroadcast(l6, 2u), subgroupBroadcast(l6, 3u));
                            let x13 = vec4<f32>(subgroupBroadcast(l6, 4u), subgroupBroadcast(l6, 5u), subgroupBroadcast(l6, 6u), subgroupBroadcast(l6, 7u));
                            let x14 = vec4<f32>(subgroupBroadcast(l7, 0u), subgroupBroadcast(l7, 1u), subgroupBroadcast(l7, 2u), subgroupBroadcast(l7, 3u));
                            let x15 = vec4<f32>(subgroupBroadcast(l7, 4u), subgroupBroadcast(l7, 5u), subgroupBroadcast(l7, 6u), subgroupBroadcast(l7, 7u));
                            for (var k = 0u; k < ROWS_PER_INV; k++) {
                                let q = arena4[(rr[k].pbase + wi) >> 2u];
                                let d0 = (dot(vec4<f32>(cb[k][q.x & 3u], cb[k][(q.x >> 2u) & 3u], cb[k][(q.x >> 4u) & 3u], cb[k][(q.x >> 6u) & 3u]), x0)
                                    + dot(vec4<f32>(cb[k][(q.x >> 8u) & 3u], cb[k][(q.x >> 10u) & 3u], cb[k][(q.x >> 12u) & 3u], cb[k][(q.x >> 14u) & 3u]), x1))
                                    + (dot(vec4<f32>(cb[k][(q.x >> 16u) & 3u], cb[k][(q.x >> 18u) & 3u], cb[k][(q.x >> 20u) & 3u], cb[k][(q.x >> 22u) & 3u]), x2)
                                    + dot(vec4<f32>(cb[k][(q.x >> 24u) & 3u], cb[k][(q.x >> 26u) & 3u], cb[k][(q.x >> 28u) & 3u], cb[k][q.x >> 30u]), x3));
                                let d1 = (dot(vec4<f32>(cb[k][q.y & 3u], cb[k][(q.y >> 2u) & 3u], cb[k][(q.y >> 4u) & 3u], cb[k][(q.y >> 6u) & 3u]), x4)
                                    + dot(vec4<f32>(cb[k][(q.y >> 8u) & 3u], cb[k][(q.y >> 10u) & 3u], cb[k][(q.y >> 12u) & 3u], cb[k][(q.y >> 14u) & 3u]), x5))
                                    + (dot(vec4<f32>(cb[k][(q.y >> 16u) & 3u], cb[k][(q.y >> 18u) & 3u], cb[k][(q.y >> 20u) & 3u], cb[k][(q.y >> 22u) & 3u]), x6)
                                    + dot(vec4<f32>(cb[k][(q.y >> 24u) & 3u], cb[k][(q.y >> 26u) & 3u], cb[k][(q.y >> 28u) & 3u], cb[k][q.y >> 30u]), x7));
                                let d2 = (dot(vec4<f32>(cb[k][q.z & 3u], cb[k][(q.z >> 2u) & 3u], cb[k][(q.z >> 4u) & 3u], cb[k][(q.z >> 6u) & 3u]), x8)
                                    + dot(vec4<f32>(cb[k][(q.z >> 8u) & 3u], cb[k][(q.z >> 10u) & 3u], cb[k][(q.z >> 12u) & 3u], cb[k][(q.z >> 14u) & 3u]), x9))
                                    + (dot(vec4<f32>(cb[k][(q.z >> 16u) & 3u], cb[k][(q.z >> 18u) & 3u], cb[k][(q.z >> 20u) & 3u], cb[k][(q.z >> 22u) & 3u]), x10)
                                    + dot(vec4<f32>(cb[k][(q.z >> 24u) & 3u], cb[k][(q.z >> 26u) & 3u], cb[k][(q.z >> 28u) & 3u], cb[k][q.z >> 30u]), x11));
                                let d3 = (dot(vec4<f32>(cb[k][q.w & 3u], cb[k][(q.w >> 2u) & 3u], cb[k][(q.w >> 4u) & 3u], cb[k][(q.w >> 6u) & 3u]), x12)
                                    + dot(vec4<f32>(cb[k][(q.w >> 8u) & 3u], cb[k][(q.w >> 10u) & 3u], cb[k][(q.w >> 12u) & 3u], cb[k][(q.w >> 14u) & 3u]), x13))
                                    + (dot(vec4<f32>(cb[k][(q.w >> 16u) & 3u], cb[k][(q.w >> 18u) & 3u], cb[k][(q.w >> 20u) & 3u], cb[k][(q.w >> 22u) & 3u]), x14)
                                    + dot(vec4<f32>(cb[k][(q.w >> 24u) & 3u], cb[k][(q.w >> 26u) & 3u], cb[k][(q.w >> 28u) & 3u], cb[k][q.w >> 30u]), x15));
                                gacc[k] += (d0 + d1) + (d2 + d3);
                            }
                        }
                    }
                } else {
                    for (var w = 0u; w < mp.group_words; w++) {
                        let wi = g * mp.group_words + w;
                        let xb = (wi - g0 * mp.group_words) * per;
                        // 4 and 2 bits: the word's activations as vec4s and its codes taken
                        // with constant shifts, so no private array is indexed by a loop
                        // variable (lavapipe keeps such arrays in memory: loading x through
                        // one cost ~38% of these matvecs).
                        if (BITS == 4u) {
                            var x0: vec4<f32>;
                            var x1: vec4<f32>;
                            if (sg >= 8u) {
                                // One load per lane, then broadcasts (no per-lane gathers
                                // of the same 8 values).
                                let xl = xw[xb + (sl & 7u)];
                                x0 = vec4<f32>(subgroupBroadcast(xl, 0u), subgroupBroadcast(xl, 1u),
                                               subgroupBroadcast(xl, 2u), subgroupBroadcast(xl, 3u));
                                x1 = vec4<f32>(subgroupBroadcast(xl, 4u), subgroupBroadcast(xl, 5u),
                                               subgroupBroadcast(xl, 6u), subgroupBroadcast(xl, 7u));
                            } else {
                                x0 = vec4<f32>(xw[xb], xw[xb + 1u], xw[xb + 2u], xw[xb + 3u]);
                                x1 = vec4<f32>(xw[xb + 4u], xw[xb + 5u], xw[xb + 6u], xw[xb + 7u]);
                            }
                            for (var k = 0u; k < ROWS_PER_INV; k++) {
                                let wd = arena[rr[k].pbase + wi];
                                let a = vec4<f32>(cb[k][wd & 15u], cb[k][(wd >> 4u) & 15u],
                                                  cb[k][(wd >> 8u) & 15u], cb[k][(wd >> 12u) & 15u]);
                                let b = vec4<f32>(cb[k][(wd >> 16u) & 15u], cb[k][(wd >> 20u) & 15u],
                                                  cb[k][(wd >> 24u) & 15u], cb[k][wd >> 28u]);
                                gacc[k] += dot(a, x0) + dot(b, x1);
                            }
                            continue;
                        }
                        if (BITS == 2u) {
                            var x0: vec4<f32>;
                            var x1: vec4<f32>;
                            var x2: vec4<f32>;
                            var x3: vec4<f32>;
                            if (sg >= 8u) {
                                let xl = xw[xb + (sl & 7u)];
                                let xh = xw[xb + 8u + (sl & 7u)];
                                x0 = vec4<f32>(subgroupBroadcast(xl, 0u), subgroupBroadcast(xl, 1u),
                                               subgroupBroadcast(xl, 2u), subgroupBroadcast(xl, 3u));
                                x1 = vec4<f32>(subgroupBroadcast(xl, 4u), subgroupBroadcast(xl, 5u),
                                               subgroupBroadcast(xl, 6u), subgroupBroadcast(xl, 7u));
                                x2 = vec4<f32>(subgroupBroadcast(xh, 0u), subgroupBroadcast(xh, 1u),
                                               subgroupBroadcast(xh, 2u), subgroupBroadcast(xh, 3u));
                                x3 = vec4<f32>(subgroupBroadcast(xh, 4u), subgroupBroadcast(xh, 5u),
                                               subgroupBroadcast(xh, 6u), subgroupBroadcast(xh, 7u));
                            } else {
                                x0 = vec4<f32>(xw[xb], xw[xb + 1u], xw[xb + 2u], xw[xb + 3u]);
                                x1 = vec4<f32>(xw[xb + 4u], xw[xb + 5u], xw[xb + 6u], xw[xb + 7u]);
                                x2 = vec4<f32>(xw[xb + 8u], xw[xb + 9u], xw[xb + 10u], xw[xb + 11u]);
                                x3 = vec4<f32>(xw[xb + 12u], xw[xb + 13u], xw[xb + 14u], xw[xb + 15u]);
                            }
                            for (var k = 0u; k < ROWS_PER_INV; k++) {
                                let wd = arena[rr[k].pbase + wi];
                                let a = vec4<f32>(cb[k][wd & 3u], cb[k][(wd >> 2u) & 3u],
                                                  cb[k][(wd >> 4u) & 3u], cb[k][(wd >> 6u) & 3u]);
                                let b = vec4<f32>(cb[k][(wd >> 8u) & 3u], cb[k][(wd >> 10u) & 3u],
                                                  cb[k][(wd >> 12u) & 3u], cb[k][(wd >> 14u) & 3u]);
                                let c = vec4<f32>(cb[k][(wd >> 16u) & 3u], cb[k][(wd >> 18u) & 3u],
                                                  cb[k][(wd >> 20u) & 3u], cb[k][(wd >> 22u) & 3u]);
                                let e = vec4<f32>(cb[k][(wd >> 24u) & 3u], cb[k][(wd >> 26u) & 3u],
                                                  cb[k][(wd >> 28u) & 3u], cb[k][wd >> 30u]);
                                gacc[k] += (dot(a, x0) + dot(b, x1)) + (dot(c, x2) + dot(e, x3));
                            }
                            continue;
                        }
                        for (var j = 0u; j < per; j++) {
                            xv[j] = xw[xb + j];
                        }
                        for (var k = 0u; k < ROWS_PER_INV; k++) {
                            let word = arena[rr[k].pbase + wi];
                            var d = 0.0;
                            for (var j = 0u; j < per; j++) {
                                let idx = (word >> (j * BITS)) & (ncb - 1u);
                                var level: f32;
                                if (BITS <= 4u) {
                                    level = cb[k][idx & 15u];
                                } else {
                                    level = bitcast<f32>(arena[rr[k].cb + idx]);
                                }
                                d += level * xv[j];
                            }
                            gacc[k] += d;
                        }
                    }
                }
                for (var k = 0u; k < ROWS_PER_INV; k++) {
                    acc[k] += norm_at(rr[k].nbase + g) * gacc[k];
                }
            }
            if (!single) {
                workgroupBarrier();
            }
        }
        for (var k = 0u; k < ROWS_PER_INV; k++) {
            if (first + k < mp.total_rows) {
                yout[rr[k].out_at + tok * mp.y_tstride] = acc[k];
            }
        }
        if (tok + 1u < mp.tokens) {
            workgroupBarrier();
        }
    }
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
    let ncb = 1u << BITS;
    let per = 32u / BITS;
    let wg = wid.x + wid.y * mp.grid_x;
    let first = (wg * 64u + li) * ROWS_PER_INV;
    // As in matvec_rows_sg: a subgroup with no row of its own skips the sums.
    let live = subgroupAny(first < mp.total_rows);
    var rr: array<RowRef, 4>;
    var cb: array<array<f32, 16>, 4>;
    for (var k = 0u; k < ROWS_PER_INV; k++) {
        rr[k] = row_ref(min(first + k, mp.total_rows - 1u));
        for (var i = 0u; i < min(ncb, 16u); i++) {
            cb[k][i] = bitcast<f32>(arena[rr[k].cb + i]);
        }
    }
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
                        lv[k * 8u + 0u] = vec4<f32>(cb[k][q.x & 15u], cb[k][(q.x >> 4u) & 15u], cb[k][(q.x >> 8u) & 15u], cb[k][(q.x >> 12u) & 15u]);
                        lv[k * 8u + 1u] = vec4<f32>(cb[k][(q.x >> 16u) & 15u], cb[k][(q.x >> 20u) & 15u], cb[k][(q.x >> 24u) & 15u], cb[k][q.x >> 28u]);
                        lv[k * 8u + 2u] = vec4<f32>(cb[k][q.y & 15u], cb[k][(q.y >> 4u) & 15u], cb[k][(q.y >> 8u) & 15u], cb[k][(q.y >> 12u) & 15u]);
                        lv[k * 8u + 3u] = vec4<f32>(cb[k][(q.y >> 16u) & 15u], cb[k][(q.y >> 20u) & 15u], cb[k][(q.y >> 24u) & 15u], cb[k][q.y >> 28u]);
                        lv[k * 8u + 4u] = vec4<f32>(cb[k][q.z & 15u], cb[k][(q.z >> 4u) & 15u], cb[k][(q.z >> 8u) & 15u], cb[k][(q.z >> 12u) & 15u]);
                        lv[k * 8u + 5u] = vec4<f32>(cb[k][(q.z >> 16u) & 15u], cb[k][(q.z >> 20u) & 15u], cb[k][(q.z >> 24u) & 15u], cb[k][q.z >> 28u]);
                        lv[k * 8u + 6u] = vec4<f32>(cb[k][q.w & 15u], cb[k][(q.w >> 4u) & 15u], cb[k][(q.w >> 8u) & 15u], cb[k][(q.w >> 12u) & 15u]);
                        lv[k * 8u + 7u] = vec4<f32>(cb[k][(q.w >> 16u) & 15u], cb[k][(q.w >> 20u) & 15u], cb[k][(q.w >> 24u) & 15u], cb[k][q.w >> 28u]);
                    } else {
                        lv[k * 16u + 0u] = vec4<f32>(cb[k][q.x & 3u], cb[k][(q.x >> 2u) & 3u], cb[k][(q.x >> 4u) & 3u], cb[k][(q.x >> 6u) & 3u]);
                        lv[k * 16u + 1u] = vec4<f32>(cb[k][(q.x >> 8u) & 3u], cb[k][(q.x >> 10u) & 3u], cb[k][(q.x >> 12u) & 3u], cb[k][(q.x >> 14u) & 3u]);
                        lv[k * 16u + 2u] = vec4<f32>(cb[k][(q.x >> 16u) & 3u], cb[k][(q.x >> 18u) & 3u], cb[k][(q.x >> 20u) & 3u], cb[k][(q.x >> 22u) & 3u]);
                        lv[k * 16u + 3u] = vec4<f32>(cb[k][(q.x >> 24u) & 3u], cb[k][(q.x >> 26u) & 3u], cb[k][(q.x >> 28u) & 3u], cb[k][q.x >> 30u]);
                        lv[k * 16u + 4u] = vec4<f32>(cb[k][q.y & 3u], cb[k][(q.y >> 2u) & 3u], cb[k][(q.y >> 4u) & 3u], cb[k][(q.y >> 6u) & 3u]);
                        lv[k * 16u + 5u] = vec4<f32>(cb[k][(q.y >> 8u) & 3u], cb[k][(q.y >> 10u) & 3u], cb[k][(q.y >> 12u) & 3u], cb[k][(q.y >> 14u) & 3u]);
                        lv[k * 16u + 6u] = vec4<f32>(cb[k][(q.y >> 16u) & 3u], cb[k][(q.y >> 18u) & 3u], cb[k][(q.y >> 20u) & 3u], cb[k][(q.y >> 22u) & 3u]);
                        lv[k * 16u + 7u] = vec4<f32>(cb[k][(q.y >> 24u) & 3u], cb[k][(q.y >> 26u) & 3u], cb[k][(q.y >> 28u) & 3u], cb[k][q.y >> 30u]);
                        lv[k * 16u + 8u] = vec4<f32>(cb[k][q.z & 3u], cb[k][(q.z >> 2u) & 3u], cb[k][(q.z >> 4u) & 3u], cb[k][(q.z >> 6u) & 3u]);
                        lv[k * 16u + 9u] = vec4<f32>(cb[k][(q.z >> 8u) & 3u], cb[k][(q.z >> 10u) & 3u], cb[k][(q.z >> 12u) & 3u], cb[k][(q.z >> 14u) & 3u]);
                        lv[k * 16u + 10u] = vec4<f32>(cb[k][(q.z >> 16u) & 3u], cb[k][(q.z >> 18u) & 3u], cb[k][(q.z >> 20u) & 3u], cb[k][(q.z >> 22u) & 3u]);
                        lv[k * 16u + 11u] = vec4<f32>(cb[k][(q.z >> 24u) & 3u], cb[k][(q.z >> 26u) & 3u], cb[k][(q.z >> 28u) & 3u], cb[k][q.z >> 30u]);
                        lv[k * 16u + 12u] = vec4<f32>(cb[k][q.w & 3u], cb[k][(q.w >> 2u) & 3u], cb[k][(q.w >> 4u) & 3u], cb[k][(q.w >> 6u) & 3u]);
                        lv[k * 16u + 13u] = vec4<f32>(cb[k][(q.w >> 8u) & 3u], cb[k][(q.w >> 10u) & 3u], cb[k][(q.w >> 12u) & 3u], cb[k][(q.w >> 14u) & 3u]);
                        lv[k * 16u + 14u] = vec4<f32>(cb[k][(q.w >> 16u) & 3u], cb[k][(q.w >> 18u) & 3u], cb[k][(q.w >> 20u) & 3u], cb[k][(q.w >> 22u) & 3u]);
                        lv[k * 16u + 15u] = vec4<f32>(cb[k][(q.w >> 24u) & 3u], cb[k][(q.w >> 26u) & 3u], cb[k][(q.w >> 28u) & 3u], cb[k][q.w >> 30u]);
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
            for (var k = 0u; k < ROWS_PER_INV; k++) {
                if (first + k < mp.total_rows) {
                    yout[rr[k].out_at + (t0 + t) * mp.y_tstride] = acc[t][k];
                }
            }
        }
    }
}
