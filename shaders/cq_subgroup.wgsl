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
