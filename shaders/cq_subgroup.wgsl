// cq_subgroup.wgsl: the subgroup variant of cq.wgsl's matvec reduction.
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
    let r = matvec_setup(li);
    let lane = li % 16u;
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
            yout[part.out_at] = total;
        }
        workgroupBarrier();
    }
}

// ---------------------------------------------------------------- matvec_rows_sg
// `matvec_rows` (cq.wgsl) for CPU adapters with subgroups: the same geometry,
// bindings and sums, except that at 4 and 2 bits a word's activations reach the
// lanes as one load per lane and subgroup broadcasts (subgroups of at least 8),
// instead of every lane loading the same 8 or 16 values from workgroup memory
// (on lavapipe each such load is a per-lane gather). The subgroup broadcasts sit
// in uniform control flow (BITS and the subgroup size are uniform).
@compute @workgroup_size(64)
fn matvec_rows_sg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) sl: u32,
    @builtin(subgroup_size) sg: u32,
) {
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
    // Rows past the last compute on the last row and write nothing.
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
        for (var g = g0; g < g0 + len / (mp.group_words * per); g++) {
            var gacc = vec4<f32>(0.0);
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
            yout[rr[k].out_at] = acc[k];
        }
    }
}

