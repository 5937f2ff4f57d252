// cq.wgsl: codebook-quantized matrix kernels (SPEC §2, SEED §1–3).
// CPU twins: kernels::prepare::pre_op (matvec modes 0..3) + cq::prepare + CqMatrix::matvec_rows_prepared; kernels::gather::gather.
//
// Weights live in a u32 "arena" storage buffer: packed indices as u32 words (LSB
// first, SPEC §2), norms as f16 pairs (read with unpack2x16float), codebooks as
// f32 bit patterns. Offsets in the params are in u32 words (packed, codebook) or
// in f16 units from the arena's start (norms).
//
// Prefixed by butterfly.wgsl (bfly, bfly4, bfly8) at pipeline build.
//
// Entry points and bindings (group 0):
//   matvec   bindings 4..8  dispatch (ceil(total_rows / (4·team_rows))) as a 2-D
//            grid of width grid_x, workgroup 64 = 4 teams x 16 lanes, each team
//            computing team_rows rows in turn (the host picks 1..16, more for
//            taller matrices, so the input each workgroup prepares serves many rows
//            while small matrices still spread over many workgroups). Up to 4 parts (matrices that
//            share bits, group, arena and input) in one dispatch. Every workgroup
//            prepares the raw input itself, XW (4096 or 2048) columns at a time (input_rms +
//            stage_chunk: the `prepare` of SPEC §2 with its pre-op, so no separate
//            prepare dispatch), or copies one prepared earlier (mode 4); codebooks
//            staged in workgroup memory; shared-memory tree reduction per row.
//            Binding 8 holds the gains of modes 2 and 3.
//            Specialised per bit width by the override BITS. A subgroup variant of
//            the reduction, `matvec_sg`, lives in cq_subgroup.wgsl (appended to this
//            file when the adapter has subgroups).
//   matvec_rows  the same bindings and params for CPU adapters: one invocation per
//            4 rows, no reduction (see its comment for the geometry).
//            Every matvec entry takes mp.tokens inputs (a prefill chunk; 1 for a
//            decode step), input t at x_off + t·x_tstride and its outputs at
//            out_off + t·y_tstride, one after another with the same arithmetic;
//            cq_subgroup.wgsl's matvec_rows_sgb shares each decoded word among
//            up to 8 of them (prepared inputs only, read from binding 10).
//   prepare_inputs  bindings 4, 6..8 (no arena), dispatch (ceil(tokens / tb), 1, 1), workgroup
//            64: workgroup w prepares inputs w·tb .. w·tb + tb (input t at x_off +
//            t·x_tstride; tb = mp.tb, 1 for inputs over the staging array)
//            exactly as each matvec workgroup stages a raw input (input_rms +
//            stage_chunk: the same operations, so the same values; with tb > 1 the
//            inputs side by side in scratch, one barrier a reduction level and one a
//            transform pass for all, the first pass run in the staging and the
//            last one writing the output) and writes input t's prep_len columns
//            to yout[prep_out + t·y_tstride ..].
//            A batched matvec whose rows span several workgroups, or that runs
//            matvec_rows_sgb, then reads them with mode 4 instead of every
//            workgroup preparing every input again.
//   gather   bindings 12..15 dispatch (groups, 1, 1), workgroup WG:
//            dequantize_row of the row whose index is idx[idx_at], times `scale`,
//            written `copies` times `copy_stride` apart. group <= 4096. A matrix
//            split over arenas gets one dispatch per part; only the part holding
//            the row writes.

// gather's and gather_many's invocations per workgroup: a pipeline override,
// 256 or 128 (the host's Capabilities::wide_workgroup).
override WG: u32 = 256u;
const MAX_GROUP: u32 = 4096u;

// Staging array of every entry point: the prepared input of a matvec (XW columns
// at a time) or the row a gather transforms. The host compiles XW = 4096 where
// the adapter's workgroup memory holds it, else 2048 (kernels::cq::staging_columns:
// WebGPU's default 16,384 bytes), and groups are then at most XW columns.
const XW: u32 = 4096u;
var<workgroup> scratch: array<f32, XW>;

// In-place unnormalised Walsh–Hadamard butterflies on scratch[0..len], every group of
// `group` values (a power of two dividing len) transformed alone, in the stage
// order of SEED §1, by `threads` invocations (li < threads). Call in uniform
// control flow; ends with a barrier. (naga takes no workgroup pointers as
// arguments, so it works on scratch, the one staging array of the file.)
//
// Three stages a pass (radix 8, as mlp.wgsl's fwht_shared): a pass from stage h0
// gives each invocation runs of m = min(8, group / h0) values base + j·h0, which
// it loads into registers, runs stages h0, 2·h0, 4·h0 on (those below group) and
// stores back: one barrier a pass instead of one a stage, and two workgroup
// accesses a value a pass instead of a stage (per-lane gathers on CPU adapters).
// A run never crosses a group (m·h0 divides group), every value sees the same
// additions in the same order as stage by stage, so the result is bit-identical.
// Indices by shifts and masks: h0 = 2^sh, m = 2^msh.
// Only the passes from stage 2^sh0 to before stage 2^sh_end run (multiples of
// 3; prepare_inputs runs the first pass in its staging and the last in its
// output): 0 and 32 for all.
fn fwht_groups(len: u32, group: u32, li: u32, threads: u32, sh0: u32, sh_end: u32) {
    var sh = sh0;
    for (var h0 = 1u << sh0; h0 < group && sh < sh_end; h0 = h0 << 3u) {
        let m = min(8u, group >> sh);
        let msh = countTrailingZeros(m);
        for (var r = li; r < (len >> msh); r += threads) {
            let e = (((r >> sh) << msh) << sh) + (r & (h0 - 1u));
            if (m == 8u) {
                put8(e, h0, scratch[e], scratch[e + h0], scratch[e + 2u * h0], scratch[e + 3u * h0], scratch[e + 4u * h0],
                        scratch[e + 5u * h0], scratch[e + 6u * h0], scratch[e + 7u * h0]);
            } else if (m == 4u) {
                put4(e, h0, scratch[e], scratch[e + h0], scratch[e + 2u * h0], scratch[e + 3u * h0]);
            } else {
                put2(e, h0, scratch[e], scratch[e + h0]);
            }
        }
        workgroupBarrier();
        sh += 3u;
    }
}

// ---------------------------------------------------------------- matvec
override BITS: u32 = 4u;

struct MatvecParams {
    n_parts: u32,
    group_words: u32, // u32 words per (row, group): group * BITS / 32
    row_words: u32,   // u32 words per row: groups * group_words
    total_rows: u32,  // rows of all parts together
    x_off: u32,       // first input element in xin (prepared for mode 4, raw otherwise)
    grid_x: u32,      // workgroups per grid row (2-D dispatch)
    mode: u32,        // 0..3: prepare the raw input as `prepare` does (copy, rms_unit,
                      // zcrms, zcrms of the mean of 4 lanes); 4: xin is already prepared
    n: u32,           // logical input length (cols) for modes 0..3
    w_off: u32,       // first gain in gains (modes 2, 3)
    lane_stride: u32, // distance between lanes in xin (mode 3)
    group: u32,       // group width
    team_rows: u32,   // `matvec`: rows each 16-lane team computes in turn
    tokens: u32,      // inputs in this dispatch (1 for a decode step): input t starts
                      // at x_off + t·x_tstride, its outputs at out_off + t·y_tstride
    tb: u32,          // `matvec_rows_sgb`: inputs a block; `prepare_inputs`: inputs a
                      // workgroup stages together (tb·prep_len <= XW)
    x_tstride: u32,
    y_tstride: u32,
    in_out: u32,      // bit 0: the input lives in the output buffer (read through
                      // yout); bit 1: the gains do (see x_at)
    prep_len: u32,    // `prepare_inputs`: columns prepared (groups · group)
    prep_out: u32,    // `prepare_inputs`: first output element of input 0
    _pad0: u32,
    // Per part p: parts[2p] = (packed_off, norms_off, cb_off, row_first),
    //             parts[2p+1] = (rows, out_off, 0, 0).
    parts: array<vec4<u32>, 8>,
}
@group(0) @binding(4) var<uniform> mp: MatvecParams;
@group(0) @binding(5) var<storage, read> arena: array<u32>;
// The input and the gains when they are not in the output buffer. A buffer bound
// writable must not be bound again (WebGPU forbids overlapping bindings where one
// is writable), so an input or gains in yout's buffer are read through yout
// (mp.in_out) and the host binds any read-only buffer here instead.
@group(0) @binding(6) var<storage, read> xin: array<f32>;
@group(0) @binding(7) var<storage, read_write> yout: array<f32>;
@group(0) @binding(8) var<storage, read> gains: array<f32>;


var<workgroup> lut: array<f32, 1024>;
var<workgroup> red: array<f32, 64>;

// First element of the input being prepared (token t of a batched dispatch:
// mp.x_off + t·mp.x_tstride; set by each entry point before staging).
var<private> xbase: u32;

// Element i of the input's buffer (xin, or yout where the input is in the output buffer).
fn x_at(i: u32) -> f32 {
    if ((mp.in_out & 1u) != 0u) {
        return yout[i];
    }
    return xin[i];
}

// Element i of the gains' buffer (gains, or yout where the gains are in the output buffer).
fn gain_at(i: u32) -> f32 {
    if ((mp.in_out & 2u) != 0u) {
        return yout[i];
    }
    return gains[i];
}

fn x_raw(i: u32) -> f32 {
    if (mp.mode == 3u) {
        let o = xbase + i;
        let s = mp.lane_stride;
        return (x_at(o) + x_at(o + s) + x_at(o + 2u * s) + x_at(o + 3u * s)) / 4.0;
    }
    return x_at(xbase + i);
}

// Column c (< padded) of the input at xbase after the pre-op with RMS factor r,
// before the transform (0 in the padding).
fn pre_op(c: u32, r: f32) -> f32 {
    var v = 0.0;
    if (c < mp.n) {
        v = x_raw(c);
        if (mp.mode != 0u) {
            v = v * r;
            if (mp.mode >= 2u) {
                v = v * (1.0 + gain_at(mp.w_off + c));
            }
        }
    }
    return v;
}

// 1 / sqrt(mean(x²) + ε) over the raw input at xbase for modes 1..3 (1
// otherwise), by the 64 invocations of the workgroup. Uniform control flow.
fn input_rms(li: u32) -> f32 {
    if (mp.mode == 0u || mp.mode == 4u) {
        return 1.0;
    }
    var acc = 0.0;
    for (var i = li; i < mp.n; i += 64u) {
        let v = x_raw(i);
        acc += v * v;
    }
    red[li] = acc;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (li < s) {
            red[li] += red[li + s];
        }
        workgroupBarrier();
    }
    let r = 1.0 / sqrt(red[0] / f32(mp.n) + 1e-6);
    workgroupBarrier();
    return r;
}

// scratch[0 .. len] = columns c0 .. c0 + len of prepare(input) (SPEC §2), computed by the
// 64 invocations as the `prepare` entry point does (pre-op with the RMS `r`, zero
// padding, butterfly stages h = 1 .. group/2 within each group, then 1/sqrt(group));
// mode 4 copies an input prepared earlier. `c0` and `len` are multiples of the group
// (chunks of XW columns). Ends with a barrier; uniform control flow.
fn stage_chunk(li: u32, c0: u32, len: u32, r: f32) {
    if (mp.mode == 4u) {
        for (var i = li; i < len; i += 64u) {
            scratch[i] = x_at(xbase + c0 + i);
        }
        workgroupBarrier();
        return;
    }
    for (var i = li; i < len; i += 64u) {
        scratch[i] = pre_op(c0 + i, r);
    }
    workgroupBarrier();
    fwht_groups(len, mp.group, li, 64u, 0u, 32u);
    let sc = 1.0 / sqrt(f32(mp.group));
    for (var i = li; i < len; i += 64u) {
        scratch[i] = scratch[i] * sc;
    }
    workgroupBarrier();
}

// ---------------------------------------------------------------- prepare_inputs
// prepare_inputs' last transform pass over scratch[0 .. len] (inputs t0 .. side by
// side, prep_len columns each), from stage 2^sh (m = group >> sh values a run,
// 2 to 8): fwht_groups's pass, its values scaled by 1/sqrt(group) and written
// to the destination where the staging would have stored them for the output
// loop to copy (the same values: the same bits).
fn fwht_last_out(len: u32, li: u32, sh: u32, t0: u32) {
    let h0 = 1u << sh;
    let m = mp.group >> sh;
    let msh = countTrailingZeros(m);
    let sc = 1.0 / sqrt(f32(mp.group));
    for (var r = li; r < (len >> msh); r += 64u) {
        let e = (((r >> sh) << msh) << sh) + (r & (h0 - 1u));
        let t = e / mp.prep_len;
        let o = mp.prep_out + (t0 + t) * mp.y_tstride + e - t * mp.prep_len;
        if (m == 8u) {
            let v = run8(e, h0);
            yout[o] = v[0] * sc;
            yout[o + h0] = v[1] * sc;
            yout[o + 2u * h0] = v[2] * sc;
            yout[o + 3u * h0] = v[3] * sc;
            yout[o + 4u * h0] = v[4] * sc;
            yout[o + 5u * h0] = v[5] * sc;
            yout[o + 6u * h0] = v[6] * sc;
            yout[o + 7u * h0] = v[7] * sc;
        } else if (m == 4u) {
            var v0 = scratch[e];
            var v1 = scratch[e + h0];
            var v2 = scratch[e + 2u * h0];
            var v3 = scratch[e + 3u * h0];
            bfly4(&v0, &v1, &v2, &v3);
            yout[o] = v0 * sc;
            yout[o + h0] = v1 * sc;
            yout[o + 2u * h0] = v2 * sc;
            yout[o + 3u * h0] = v3 * sc;
        } else {
            var v0 = scratch[e];
            var v1 = scratch[e + h0];
            bfly(&v0, &v1);
            yout[o] = v0 * sc;
            yout[o + h0] = v1 * sc;
        }
    }
}

// Inputs a prepare_inputs workgroup stages together, at most (the host's MAX_TB).
const MAX_TB: u32 = 8u;
var<workgroup> red_tb: array<f32, 512>; // 64 · MAX_TB

// input_rms of inputs t0 .. t0 + tb (tb <= MAX_TB) side by side: each input's
// sums in input_rms's order (the same bits), one barrier a tree level for all
// of them instead of one per input and level. Uniform control flow.
fn inputs_rms(li: u32, t0: u32, tb: u32) -> array<f32, 8> {
    var rs: array<f32, 8>;
    if (mp.mode == 0u || mp.mode == 4u) {
        for (var t = 0u; t < MAX_TB; t++) {
            rs[t] = 1.0;
        }
        return rs;
    }
    for (var t = 0u; t < tb; t++) {
        xbase = mp.x_off + (t0 + t) * mp.x_tstride;
        var acc = 0.0;
        for (var i = li; i < mp.n; i += 64u) {
            let v = x_raw(i);
            acc += v * v;
        }
        red_tb[t * 64u + li] = acc;
    }
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (li < s) {
            for (var t = 0u; t < tb; t++) {
                red_tb[t * 64u + li] += red_tb[t * 64u + li + s];
            }
        }
        workgroupBarrier();
    }
    for (var t = 0u; t < tb; t++) {
        rs[t] = 1.0 / sqrt(red_tb[t * 64u] / f32(mp.n) + 1e-6);
    }
    return rs;
}

// See the header. Each workgroup's input is uniform (workgroup_id), so the
// barriers inside input_rms and stage_chunk are in uniform control flow.
@compute @workgroup_size(64)
fn prepare_inputs(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    if (mp.prep_len <= XW) {
        // Inputs t0 .. t0 + tb side by side (the host keeps tb · prep_len <= XW):
        // one transform's barriers for all of them.
        let t0 = wid.x * mp.tb;
        let tb = min(mp.tb, mp.tokens - t0);
        let len = mp.prep_len;
        let rs = inputs_rms(li, t0, tb);
        // The staging and the transform's first pass in one: each invocation
        // runs stages 1, 2, 4 (those below the group) on m consecutive columns
        // in registers, as fwht_groups's first pass would after the staging.
        let m = min(8u, mp.group);
        let msh = countTrailingZeros(m);
        for (var r = li; r < ((tb * len) >> msh); r += 64u) {
            let e = r << msh;
            let t = e / len;
            let i = e - t * len;
            xbase = mp.x_off + (t0 + t) * mp.x_tstride;
            let rt = rs[t];
            if (m == 8u) {
                put8(e, 1u, pre_op(i, rt), pre_op(i + 1u, rt), pre_op(i + 2u, rt), pre_op(i + 3u, rt),
                        pre_op(i + 4u, rt), pre_op(i + 5u, rt), pre_op(i + 6u, rt), pre_op(i + 7u, rt));
            } else {
                // Groups of fewer than 8 columns: staged, then transformed below.
                for (var j = 0u; j < m; j++) {
                    scratch[e + j] = pre_op(i + j, rt);
                }
            }
        }
        workgroupBarrier();
        if (mp.group > 8u) {
            // The middle passes, then the last one straight to the destination.
            let sh_last = 3u * ((countTrailingZeros(mp.group) - 1u) / 3u);
            fwht_groups(tb * len, mp.group, li, 64u, 3u, sh_last);
            fwht_last_out(tb * len, li, sh_last, t0);
            return;
        }
        fwht_groups(tb * len, mp.group, li, 64u, select(0u, 3u, m == 8u), 32u);
        let sc = 1.0 / sqrt(f32(mp.group));
        for (var t = 0u; t < tb; t++) {
            let dst = mp.prep_out + (t0 + t) * mp.y_tstride;
            for (var i = li; i < len; i += 64u) {
                yout[dst + i] = scratch[t * len + i] * sc;
            }
        }
        return;
    }
    // An input over the staging array: alone (tb = 1), XW columns at a time.
    let t = wid.x;
    xbase = mp.x_off + t * mp.x_tstride;
    let r = input_rms(li);
    let dst = mp.prep_out + t * mp.y_tstride;
    for (var c0 = 0u; c0 < mp.prep_len; c0 += XW) {
        let len = min(XW, mp.prep_len - c0);
        stage_chunk(li, c0, len, r);
        for (var i = li; i < len; i += 64u) {
            yout[dst + c0 + i] = scratch[i];
        }
        // The next chunk's staging must not overwrite values still being written out.
        workgroupBarrier();
    }
}

fn norm_at(i: u32) -> f32 {
    let w = unpack2x16float(arena[i >> 1u]);
    return select(w.x, w.y, (i & 1u) == 1u);
}

struct Partial {
    acc: f32,      // this invocation's share of its row's dot product
    out_at: u32,   // output index of its row, or 0xffffffff past the last row
}

struct RowRef {
    pbase: u32,   // first packed word of the row
    nbase: u32,   // first norm (f16 index) of the row
    cb: u32,      // codebook offset
    out_at: u32,  // output index
    part: u32,    // which of the fused parts
}

// Where row `gr` (< total_rows) of the fused parts lives.
fn row_ref(gr: u32) -> RowRef {
    var p = 0u;
    var start = 0u;
    loop {
        if (p + 1u >= mp.n_parts || gr < start + mp.parts[2u * p + 1u].x) {
            break;
        }
        start += mp.parts[2u * p + 1u].x;
        p += 1u;
    }
    let a = mp.parts[2u * p];
    let row = a.w + (gr - start);
    return RowRef(
        a.x + row * mp.row_words,
        a.y + row * (mp.row_words / mp.group_words),
        a.z,
        mp.parts[2u * p + 1u].y + (gr - start),
        p,
    );
}

// Start input tok of a matvec: xbase, and the input staged whole when it fits
// one chunk. Returns its RMS factor. Uniform control flow.
fn input_start(li: u32, tok: u32) -> f32 {
    xbase = mp.x_off + tok * mp.x_tstride;
    let r = input_rms(li);
    let padded = mp.row_words * (32u / BITS);
    if (padded <= XW) {
        stage_chunk(li, 0u, padded, r);
    }
    return r;
}

// Stage the codebooks, then start input tok (input_start); return the input's
// RMS factor. Uniform control flow.
fn matvec_setup(li: u32, tok: u32) -> f32 {
    let ncb = 1u << BITS;
    for (var i = li; i < mp.n_parts * ncb; i += 64u) {
        lut[i] = bitcast<f32>(arena[mp.parts[2u * (i / ncb)].z + i % ncb]);
    }
    return input_start(li, tok);
}

// This invocation's share (lane li % 16) of row gr_raw, chunk by chunk of the
// staged input (staged here when the input is longer than one chunk). Rows past
// the last compute on the last row and report out_at = 0xffffffff (control flow
// stays uniform for the barriers).
fn matvec_partial(gr_raw: u32, li: u32, r: f32) -> Partial {
    let ncb = 1u << BITS;
    let per = 32u / BITS;
    let lane = li % 16u;
    let rf = row_ref(min(gr_raw, mp.total_rows - 1u));
    var res = Partial(0.0, 0xffffffffu);
    if (gr_raw < mp.total_rows) {
        res.out_at = rf.out_at;
    }
    let cb = rf.part * ncb;
    let padded = mp.row_words * per;
    let single = padded <= XW;
    for (var c0 = 0u; c0 < padded; c0 += XW) {
        let len = min(XW, padded - c0);
        if (!single) {
            stage_chunk(li, c0, len, r);
        }
        let w0 = c0 / per;
        for (var w = w0 + lane; w < w0 + len / per; w += 16u) {
            let word = arena[rf.pbase + w];
            let xb = (w - w0) * per;
            var d = 0.0;
            for (var j = 0u; j < per; j++) {
                let idx = (word >> (j * BITS)) & (ncb - 1u);
                d += lut[cb + idx] * scratch[xb + j];
            }
            res.acc += norm_at(rf.nbase + w / mp.group_words) * d;
        }
        if (!single) {
            workgroupBarrier();
        }
    }
    return res;
}

// Row of team li / 16 in turn t of workgroup wid: a workgroup of 4 teams covers
// 4·team_rows consecutive rows, so the input it prepares serves them all.
fn team_row(wid: vec3<u32>, t: u32, li: u32) -> u32 {
    let wg = wid.x + wid.y * mp.grid_x;
    return (wg * mp.team_rows + t) * 4u + li / 16u;
}

// Portable variant: shared-memory tree reduction of each row's 16 partial sums.
@compute @workgroup_size(64)
fn matvec(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % 16u;
    // The inputs one after another (each team turn ends with a barrier, so the
    // next input's staging never overwrites values still being read).
    for (var tok = 0u; tok < mp.tokens; tok++) {
        let r = matvec_setup(li, tok);
        for (var t = 0u; t < mp.team_rows; t++) {
            let part = matvec_partial(team_row(wid, t, li), li, r);
            red[li] = part.acc;
            workgroupBarrier();
            for (var s = 8u; s > 0u; s = s >> 1u) {
                if (lane < s) {
                    red[li] += red[li + s];
                }
                workgroupBarrier();
            }
            if (lane == 0u && part.out_at != 0xffffffffu) {
                yout[part.out_at + tok * mp.y_tstride] = red[li];
            }
            workgroupBarrier();
        }
    }
}

// Row-per-invocation variant for CPU adapters (lavapipe): dispatch
// (ceil(total_rows / 256)) as a 2-D grid of width grid_x, workgroup 64, invocation
// li computing the 4 rows 4·(wg·64 + li) + k alone, same bindings (4..7) and params.
// Apart from staging the input (stage_chunk), no workgroup memory and no barrier (a
// CPU driver runs a barrier as a coroutine switch); each activation value is loaded once per word for all 4 rows (on
// lavapipe every load in the lane loop costs a scalar load per lane: loading x
// once per word instead of once per code made the matvecs ~3x faster), and
// codebooks of up to 16 levels sit in private arrays. On a GPU the 16-lane
// `matvec` coalesces better.
const ROWS_PER_INV: u32 = 4u;

// The 4 rows of a row-kernel invocation (matvec_rows; matvec_rows_sg and
// matvec_rows_sgb in cq_subgroup.wgsl): their refs, and their codebooks of up to
// 16 levels in registers. Module-scope private, so the helpers below read them;
// the compiler inlines the helpers, and a constant `j` folds their shifts.
var<private> rr: array<RowRef, 4>;
var<private> cb: array<array<f32, 16>, 4>;

// The first of the 4 rows of invocation li of workgroup wid.
fn rows_first(wid: vec3<u32>, li: u32) -> u32 {
    return ((wid.x + wid.y * mp.grid_x) * 64u + li) * ROWS_PER_INV;
}

// Load rows first .. first + 3 into rr and cb (a row past the last loads the
// last row again: rows_store writes nothing for it).
fn rows_load(first: u32) {
    for (var k = 0u; k < ROWS_PER_INV; k++) {
        rr[k] = row_ref(min(first + k, mp.total_rows - 1u));
        for (var i = 0u; i < min(1u << BITS, 16u); i++) {
            cb[k][i] = bitcast<f32>(arena[rr[k].cb + i]);
        }
    }
}

// Row k's levels of codes 4j .. 4j + 3 of the 4-bit word wd (j < 2).
fn levels4(k: u32, wd: u32, j: u32) -> vec4<f32> {
    let s = wd >> (16u * j);
    return vec4<f32>(cb[k][s & 15u], cb[k][(s >> 4u) & 15u], cb[k][(s >> 8u) & 15u], cb[k][(s >> 12u) & 15u]);
}

// Row k's levels of codes 4j .. 4j + 3 of the 2-bit word wd (j < 4).
fn levels2(k: u32, wd: u32, j: u32) -> vec4<f32> {
    let s = wd >> (8u * j);
    return vec4<f32>(cb[k][s & 3u], cb[k][(s >> 2u) & 3u], cb[k][(s >> 4u) & 3u], cb[k][(s >> 6u) & 3u]);
}

// Row k's 4-bit word wd against its 8 activations.
fn word4(k: u32, wd: u32, x0: vec4<f32>, x1: vec4<f32>) -> f32 {
    return dot(levels4(k, wd, 0u), x0) + dot(levels4(k, wd, 1u), x1);
}

// Row k's 2-bit word wd against its 16 activations.
fn word2(k: u32, wd: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> f32 {
    return (dot(levels2(k, wd, 0u), x0) + dot(levels2(k, wd, 1u), x1))
        + (dot(levels2(k, wd, 2u), x2) + dot(levels2(k, wd, 3u), x3));
}

// scratch[i .. i + 4] as a vec4.
fn scratch4(i: u32) -> vec4<f32> {
    return vec4<f32>(scratch[i], scratch[i + 1u], scratch[i + 2u], scratch[i + 3u]);
}

// The 4 rows' word wi (4 bits) against its activations x0, x1.
fn rows_word4(wi: u32, x0: vec4<f32>, x1: vec4<f32>) -> vec4<f32> {
    var d = vec4<f32>(0.0);
    for (var k = 0u; k < ROWS_PER_INV; k++) {
        d[k] = word4(k, arena[rr[k].pbase + wi], x0, x1);
    }
    return d;
}

// The 4 rows' word wi (2 bits) against its activations x0 .. x3.
fn rows_word2(wi: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> vec4<f32> {
    var d = vec4<f32>(0.0);
    for (var k = 0u; k < ROWS_PER_INV; k++) {
        d[k] = word2(k, arena[rr[k].pbase + wi], x0, x1, x2, x3);
    }
    return d;
}

// The 4 rows' word wi at any width against its activations scratch[xb ..]
// (loaded once for the 4 rows): loops over a private array, for widths other
// than 4 and 2 bits.
fn rows_word_any(wi: u32, xb: u32) -> vec4<f32> {
    let per = 32u / BITS;
    var xv: array<f32, 32>;
    for (var j = 0u; j < per; j++) {
        xv[j] = scratch[xb + j];
    }
    var d4 = vec4<f32>(0.0);
    for (var k = 0u; k < ROWS_PER_INV; k++) {
        let word = arena[rr[k].pbase + wi];
        var d = 0.0;
        for (var j = 0u; j < per; j++) {
            let idx = (word >> (j * BITS)) & ((1u << BITS) - 1u);
            var level: f32;
            if (BITS <= 4u) {
                level = cb[k][idx & 15u];
            } else {
                level = bitcast<f32>(arena[rr[k].cb + idx]);
            }
            d += level * xv[j];
        }
        d4[k] = d;
    }
    return d4;
}

// acc plus the 4 rows' sums of group g (gacc) times their norms.
fn rows_scaled(acc: vec4<f32>, g: u32, gacc: vec4<f32>) -> vec4<f32> {
    var a = acc;
    for (var k = 0u; k < ROWS_PER_INV; k++) {
        a[k] += norm_at(rr[k].nbase + g) * gacc[k];
    }
    return a;
}

// The 4 rows' word wi against its activations scratch[xb ..]. At 4 and 2 bits
// the activations come as vec4s and the codes with constant shifts, so no
// private array is indexed by a loop variable (lavapipe keeps such arrays in
// memory: loading x through one cost ~38% of these matvecs).
fn rows_word(wi: u32, xb: u32) -> vec4<f32> {
    if (BITS == 4u) {
        return rows_word4(wi, scratch4(xb), scratch4(xb + 4u));
    }
    if (BITS == 2u) {
        let lo = scratch4(xb);
        let hi = scratch4(xb + 4u);
        return rows_word2(wi, lo, hi, scratch4(xb + 8u), scratch4(xb + 12u));
    }
    return rows_word_any(wi, xb);
}

// Write the 4 rows' sums of input tok (none for rows past the last).
fn rows_store(first: u32, tok: u32, acc: vec4<f32>) {
    for (var k = 0u; k < ROWS_PER_INV; k++) {
        if (first + k < mp.total_rows) {
            yout[rr[k].out_at + tok * mp.y_tstride] = acc[k];
        }
    }
}

// The groups (first, end) of the input's chunk from column c0, staged here when
// the input spans several (after a barrier from the second on: the last
// chunk's values may still be read); none where !live. Uniform control flow.
fn rows_chunk(li: u32, c0: u32, r: f32, live: bool) -> vec2<u32> {
    let per = 32u / BITS;
    let padded = mp.row_words * per;
    let len = min(XW, padded - c0);
    if (padded > XW) {
        if (c0 > 0u) {
            workgroupBarrier();
        }
        stage_chunk(li, c0, len, r);
    }
    let g0 = c0 / (mp.group_words * per);
    return vec2<u32>(g0, select(g0, g0 + len / (mp.group_words * per), live));
}

// Write input tok's sums, then, before the next input, a barrier (its staging
// must not overwrite values still being read).
fn rows_done(first: u32, tok: u32, acc: vec4<f32>) {
    rows_store(first, tok, acc);
    if (tok + 1u < mp.tokens) {
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn matvec_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    // The inputs one after another, each as a decode step computes it.
    let per = 32u / BITS;
    let first = rows_first(wid, li);
    // An invocation with no row of its own skips the sums (a matrix of few
    // rows, such as the 24 of Φ, leaves most of the workgroup idle).
    let live = first < mp.total_rows;
    rows_load(first);
    for (var tok = 0u; tok < mp.tokens; tok++) {
        let r = input_start(li, tok);
        var acc = vec4<f32>(0.0);
        for (var c0 = 0u; c0 < mp.row_words * per; c0 += XW) {
            let gs = rows_chunk(li, c0, r, live);
            for (var g = gs.x; g < gs.y; g++) {
                var gacc = vec4<f32>(0.0);
                for (var w = 0u; w < mp.group_words; w++) {
                    let wi = g * mp.group_words + w;
                    let xb = (wi - gs.x * mp.group_words) * per;
                    gacc += rows_word(wi, (wi - gs.x * mp.group_words) * per);
                }
                acc = rows_scaled(acc, g, gacc);
            }
        }
        rows_done(first, tok, acc);
    }
}

// ---------------------------------------------------------------- gather
struct GatherParams {
    packed_off: u32,
    norms_off: u32,
    cb_off: u32,
    row_words: u32,
    group: u32,
    groups: u32,
    cols: u32,
    bits: u32,
    idx_at: u32,      // the row index is idx[idx_at]
    out_off: u32,
    copies: u32,
    copy_stride: u32,
    scale: f32,
    row_first: u32,   // this dispatch holds rows row_first .. row_first + rows of the
    rows: u32,        // matrix (one arena part); other rows write nothing
    _pad0: u32,
}
@group(0) @binding(12) var<uniform> gp: GatherParams;
@group(0) @binding(13) var<storage, read> garena: array<u32>;
@group(0) @binding(14) var<storage, read> gidx: array<u32>;
@group(0) @binding(15) var<storage, read_write> gout: array<f32>;

@compute @workgroup_size(WG)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let k = wid.x;
    let want = gidx[gp.idx_at];
    // Rows outside this part compute on row 0 of the part and write nothing
    // (no early return: the barriers below need uniform control flow).
    let mine = want >= gp.row_first && want - gp.row_first < gp.rows;
    let row = select(0u, want - gp.row_first, mine);
    let ni = gp.norms_off + row * gp.groups + k;
    let nw = unpack2x16float(garena[ni >> 1u]);
    let norm = select(nw.x, nw.y, (ni & 1u) == 1u);
    let mask = (1u << gp.bits) - 1u;
    for (var c = li; c < gp.group; c += WG) {
        let bit = (k * gp.group + c) * gp.bits;
        let word = garena[gp.packed_off + row * gp.row_words + bit / 32u];
        let idx = (word >> (bit % 32u)) & mask;
        scratch[c] = norm * bitcast<f32>(garena[gp.cb_off + idx]);
    }
    workgroupBarrier();
    fwht_groups(gp.group, gp.group, li, WG, 0u, 32u);
    let s = 1.0 / sqrt(f32(gp.group));
    for (var c = li; c < gp.group; c += WG) {
        let col = k * gp.group + c;
        if (mine && col < gp.cols) {
            let v = scratch[c] * s * gp.scale;
            for (var q = 0u; q < gp.copies; q++) {
                gout[gp.out_off + q * gp.copy_stride + col] = v;
            }
        }
    }
}


// ---------------------------------------------------------------- gather_many
// gather_many  bindings 16..21  dispatch (Σ groups of the entries, slots, 1),
//   workgroup WG: every `gather` of the step (the embedding and the engram
//   tables) in one dispatch, for each token slot y of a pass (the lean
//   program's head: one slot). Workgroup (w, y) runs group w − gm.start[i] of
//   entry i (gm.start ascending) for slot y: the row index at idx_at + y ·
//   idx_stride, the output from y · out_stride (binding 20) or y ·
//   out_stride_b (binding 21) on. An entry is a GatherParams whose _pad0 names
//   its arena binding (bit 0: 17 or 18) and its output binding (bit 1: 20 or
//   21). Same arithmetic as gather.
struct GatherMany {
    n: u32,
    idx_stride: u32,
    out_stride: u32,
    out_stride_b: u32,
    start: array<vec4<u32>, 3>, // start[i] at start[i / 4][i % 4]; start[n] = total
    e: array<GatherParams, 8>,
}
@group(0) @binding(16) var<uniform> gm: GatherMany;
@group(0) @binding(17) var<storage, read> gm_arena_a: array<u32>;
@group(0) @binding(18) var<storage, read> gm_arena_b: array<u32>;
@group(0) @binding(19) var<storage, read> gm_idx: array<u32>;
@group(0) @binding(20) var<storage, read_write> gm_out: array<f32>;
@group(0) @binding(21) var<storage, read_write> gm_out_b: array<f32>;

fn gm_start(i: u32) -> u32 {
    return gm.start[i / 4u][i % 4u];
}

fn gm_word(sel: u32, i: u32) -> u32 {
    if (sel == 0u) {
        return gm_arena_a[i];
    }
    return gm_arena_b[i];
}

@compute @workgroup_size(WG)
fn gather_many(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    var i = 0u;
    for (var q = 1u; q < gm.n; q++) {
        if (wid.x >= gm_start(q)) {
            i = q;
        }
    }
    let p = gm.e[i];
    let k = wid.x - gm_start(i);
    let want = gm_idx[p.idx_at + wid.y * gm.idx_stride];
    let mine = want >= p.row_first && want - p.row_first < p.rows;
    let row = select(0u, want - p.row_first, mine);
    let ni = p.norms_off + row * p.groups + k;
    let sel = p._pad0 & 1u;
    let to_b = (p._pad0 & 2u) != 0u;
    let nw = unpack2x16float(gm_word(sel, ni >> 1u));
    let norm = select(nw.x, nw.y, (ni & 1u) == 1u);
    let mask = (1u << p.bits) - 1u;
    for (var c = li; c < p.group; c += WG) {
        let bit = (k * p.group + c) * p.bits;
        let word = gm_word(sel, p.packed_off + row * p.row_words + bit / 32u);
        let idx = (word >> (bit % 32u)) & mask;
        scratch[c] = norm * bitcast<f32>(gm_word(sel, p.cb_off + idx));
    }
    workgroupBarrier();
    fwht_groups(p.group, p.group, li, WG, 0u, 32u);
    let s = 1.0 / sqrt(f32(p.group));
    let base = p.out_off + wid.y * select(gm.out_stride, gm.out_stride_b, to_b);
    for (var c = li; c < p.group; c += WG) {
        let col = k * p.group + c;
        if (mine && col < p.cols) {
            let v = scratch[c] * s * p.scale;
            for (var q = 0u; q < p.copies; q++) {
                if (to_b) {
                    gm_out_b[base + q * p.copy_stride + col] = v;
                } else {
                    gm_out[base + q * p.copy_stride + col] = v;
                }
            }
        }
    }
}
