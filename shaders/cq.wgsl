// cq.wgsl: codebook-quantized matrix kernels (SPEC §2, SEED §1–3).
//
// Weights live in a u32 "arena" storage buffer: packed indices as u32 words (LSB
// first, SPEC §2), norms as f16 pairs (read with unpack2x16float), codebooks as
// f32 bit patterns. Offsets in the params are in u32 words (packed, codebook) or
// in f16 units from the arena's start (norms).
//
// Entry points and bindings (group 0):
//   prepare  bindings 0..3  dispatch (groups, 1, 1), workgroup 256:
//            dst[dst_off + c] = nfwht per group of the zero-padded input, where the
//            input is src (mode 0), rms_unit(src) (1), zcrms(src, w) (2), or
//            zcrms(mean of 4 lanes of src, w) (3). Every workgroup recomputes the
//            RMS itself (no extra pass). group <= 4096.
//   matvec   bindings 4..7  dispatch (ceil(total_rows/4)) as a 2-D grid of width grid_x,
//            workgroup 64 = 4 rows x 16 lanes. Up to 4 parts (matrices that share
//            bits, group, arena and input) in one dispatch; codebooks staged in
//            workgroup memory; shared-memory tree reduction per row.
//            Specialised per bit width by the override BITS. A subgroup variant of
//            the reduction, `matvec_sg`, lives in cq_subgroup.wgsl (appended to this
//            file when the adapter has subgroups).
//   gather   bindings 8..11 dispatch (groups, 1, 1), workgroup 256:
//            dequantize_row of the row whose index is idx[idx_at], times `scale`,
//            written `copies` times `copy_stride` apart. group <= 4096. A matrix
//            split over arenas gets one dispatch per part; only the part holding
//            the row writes.

const WG: u32 = 256u;
const MAX_GROUP: u32 = 4096u;

var<workgroup> buf: array<f32, 4096>;

// In-place unnormalised Walsh–Hadamard butterfly on buf[0..n] (n a power of two),
// stage by stage in the order of SEED §1.
fn fwht_shared(n: u32, li: u32) {
    for (var h = 1u; h < n; h = h << 1u) {
        for (var p = li; p < n / 2u; p += WG) {
            let i = (p / h) * 2u * h + (p % h);
            let j = i + h;
            let a = buf[i];
            let b = buf[j];
            buf[i] = a + b;
            buf[j] = a - b;
        }
        workgroupBarrier();
    }
}

// ---------------------------------------------------------------- prepare
struct PrepareParams {
    n: u32,           // logical input length (cols)
    group: u32,       // group width (power of two <= 4096)
    mode: u32,        // 0 copy, 1 rms_unit, 2 zcrms(w), 3 zcrms(mean of 4 lanes, w)
    src_off: u32,     // first input element in src
    w_off: u32,       // first gain in wts (modes 2, 3)
    lane_stride: u32, // distance between lanes in src (mode 3)
    dst_off: u32,     // first output element in dst
    _pad: u32,
}
@group(0) @binding(0) var<uniform> pp: PrepareParams;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> wts: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

fn prep_load(i: u32) -> f32 {
    if (pp.mode == 3u) {
        let o = pp.src_off + i;
        let s = pp.lane_stride;
        return (src[o] + src[o + s] + src[o + 2u * s] + src[o + 3u * s]) / 4.0;
    }
    return src[pp.src_off + i];
}

@compute @workgroup_size(256)
fn prepare(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    var r = 1.0;
    if (pp.mode != 0u) {
        var acc = 0.0;
        for (var i = li; i < pp.n; i += WG) {
            let v = prep_load(i);
            acc += v * v;
        }
        buf[li] = acc;
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s = s >> 1u) {
            if (li < s) {
                buf[li] += buf[li + s];
            }
            workgroupBarrier();
        }
        r = 1.0 / sqrt(buf[0] / f32(pp.n) + 1e-6);
        workgroupBarrier();
    }
    let base = wid.x * pp.group;
    for (var c = li; c < pp.group; c += WG) {
        let i = base + c;
        var v = 0.0;
        if (i < pp.n) {
            v = prep_load(i);
            if (pp.mode != 0u) {
                v = v * r;
                if (pp.mode >= 2u) {
                    v = v * (1.0 + wts[pp.w_off + i]);
                }
            }
        }
        buf[c] = v;
    }
    workgroupBarrier();
    fwht_shared(pp.group, li);
    let s = 1.0 / sqrt(f32(pp.group));
    for (var c = li; c < pp.group; c += WG) {
        dst[pp.dst_off + base + c] = buf[c] * s;
    }
}

// ---------------------------------------------------------------- matvec
override BITS: u32 = 4u;

struct MatvecParams {
    n_parts: u32,
    group_words: u32, // u32 words per (row, group): group * BITS / 32
    row_words: u32,   // u32 words per row: groups * group_words
    total_rows: u32,  // rows of all parts together
    x_off: u32,       // first prepared input element
    grid_x: u32,      // workgroups per grid row (2-D dispatch)
    _pad0: u32,
    _pad1: u32,
    // Per part p: parts[2p] = (packed_off, norms_off, cb_off, row_first),
    //             parts[2p+1] = (rows, out_off, 0, 0).
    parts: array<vec4<u32>, 8>,
}
@group(0) @binding(4) var<uniform> mp: MatvecParams;
@group(0) @binding(5) var<storage, read> arena: array<u32>;
@group(0) @binding(6) var<storage, read> xin: array<f32>;
@group(0) @binding(7) var<storage, read_write> yout: array<f32>;

var<workgroup> lut: array<f32, 1024>;
var<workgroup> red: array<f32, 64>;

fn norm_at(i: u32) -> f32 {
    let w = unpack2x16float(arena[i >> 1u]);
    return select(w.x, w.y, (i & 1u) == 1u);
}

struct Partial {
    acc: f32,      // this invocation's share of its row's dot product
    out_at: u32,   // output index of its row, or 0xffffffff past the last row
}

// Stage the codebooks, then accumulate this invocation's words of its row.
// Invocation li works on row li / 16 of the workgroup's 4, lane li % 16.
fn matvec_partial(wid: vec3<u32>, li: u32) -> Partial {
    let ncb = 1u << BITS;
    let per = 32u / BITS;
    for (var i = li; i < mp.n_parts * ncb; i += 64u) {
        lut[i] = bitcast<f32>(arena[mp.parts[2u * (i / ncb)].z + i % ncb]);
    }
    workgroupBarrier();
    let wg = wid.x + wid.y * mp.grid_x;
    let lane = li % 16u;
    let gr = wg * 4u + li / 16u;
    var res = Partial(0.0, 0xffffffffu);
    if (gr < mp.total_rows) {
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
        res.out_at = mp.parts[2u * p + 1u].y + (gr - start);
        let row = a.w + (gr - start);
        let pbase = a.x + row * mp.row_words;
        let nbase = a.y + row * (mp.row_words / mp.group_words);
        let cb = p * ncb;
        for (var w = lane; w < mp.row_words; w += 16u) {
            let word = arena[pbase + w];
            let xb = mp.x_off + w * per;
            var d = 0.0;
            for (var j = 0u; j < per; j++) {
                let idx = (word >> (j * BITS)) & (ncb - 1u);
                d += lut[cb + idx] * xin[xb + j];
            }
            res.acc += norm_at(nbase + w / mp.group_words) * d;
        }
    }
    return res;
}

// Portable variant: shared-memory tree reduction of each row's 16 partial sums.
@compute @workgroup_size(64)
fn matvec(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let part = matvec_partial(wid, li);
    let lane = li % 16u;
    red[li] = part.acc;
    workgroupBarrier();
    for (var s = 8u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            red[li] += red[li + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && part.out_at != 0xffffffffu) {
        yout[part.out_at] = red[li];
    }
}

// Row-per-invocation variant for CPU adapters (lavapipe): dispatch
// (ceil(total_rows / 256)) as a 2-D grid of width grid_x, workgroup 64, invocation
// li computing the 4 rows 4·(wg·64 + li) + k alone, same bindings (4..7) and params.
// No workgroup memory and no barrier (a CPU driver runs a barrier as a coroutine
// switch); each activation value is loaded once per word for all 4 rows (on
// lavapipe every load in the lane loop costs a scalar load per lane: loading x
// once per word instead of once per code made the matvecs ~3x faster), and
// codebooks of up to 16 levels sit in private arrays. On a GPU the 16-lane
// `matvec` coalesces better.
const ROWS_PER_INV: u32 = 4u;

struct RowRef {
    pbase: u32,   // first packed word of the row
    nbase: u32,   // first norm (f16 index) of the row
    cb: u32,      // codebook offset
    out_at: u32,  // output index
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
    );
}

@compute @workgroup_size(64)
fn matvec_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let ncb = 1u << BITS;
    let per = 32u / BITS;
    let wg = wid.x + wid.y * mp.grid_x;
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
    let groups = mp.row_words / mp.group_words;
    var acc = vec4<f32>(0.0);
    var xv: array<f32, 32>;
    for (var g = 0u; g < groups; g++) {
        var gacc = vec4<f32>(0.0);
        for (var w = 0u; w < mp.group_words; w++) {
            let wi = g * mp.group_words + w;
            let xb = mp.x_off + wi * per;
            for (var j = 0u; j < per; j++) {
                xv[j] = xin[xb + j];
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
    for (var k = 0u; k < ROWS_PER_INV; k++) {
        if (first + k < mp.total_rows) {
            yout[rr[k].out_at] = acc[k];
        }
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
@group(0) @binding(8) var<uniform> gp: GatherParams;
@group(0) @binding(9) var<storage, read> garena: array<u32>;
@group(0) @binding(10) var<storage, read> gidx: array<u32>;
@group(0) @binding(11) var<storage, read_write> gout: array<f32>;

@compute @workgroup_size(256)
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
        buf[c] = norm * bitcast<f32>(garena[gp.cb_off + idx]);
    }
    workgroupBarrier();
    fwht_shared(gp.group, li);
    let s = 1.0 / sqrt(f32(gp.group));
    for (var c = li; c < gp.group; c += WG) {
        let col = k * gp.group + c;
        if (mine && col < gp.cols) {
            let v = buf[c] * s * gp.scale;
            for (var q = 0u; q < gp.copies; q++) {
                gout[gp.out_off + q * gp.copy_stride + col] = v;
            }
        }
    }
}
