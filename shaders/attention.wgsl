// attention.wgsl: per-head Q/K normalisation, RoPE, int8 KV store and attention
// over the int8 KV cache (SPEC §4.3 step 5).
// CPU twins: kernels::attention::qk_store and kernels::attention::attend (src/kernels/attention.rs).
//
// `act` is one f32 buffer holding q, k, v, g and o at the element offsets of the
// params; heads are contiguous `head_dim` slices. `step` is the per-step u32
// buffer (gpu::step::StepLayout): step[1] = logical position t, step[2] = its
// physical slot, RoPE cosines at cos_at and sines at sin_at (f32 bit patterns).
// The cache holds, per (layer, kv_head, row), `words = ceil(head_dim/4)` u32 words
// of codes (code i in byte i%4 of word i/4, little-endian, two's complement,
// padding bytes zero) and one f32 scale; rows = sink + window.
// Prefixed by common.wgsl (wg_sum, wg_max, sigm, scratch) at pipeline build.
// Arithmetic follows the CPU reference (kernels::{norm, rope, kv, attention})
// operation by operation; head_dim is even and at most 1024.
//
// Every entry point runs token slot y = wid.y of its dispatch (1 slot in a decode
// step; the decode tokens of a batch pass in one dispatch, each of another
// sequence): the slot's act offsets count from y * act_stride, its step words from
// y * step_stride, and its sequence s = step[seq_at] (0 for an engine of one
// sequence) owns the cache codes from s * code_stride words, the scales from
// s * scale_stride and the scores from s * scores_stride.
//
// Entry points and bindings (group 0), both workgroup 64:
//   qk_store  bindings 0..7  dispatch (heads + kv_heads, slots, 1):
//             workgroup w < heads: q head w <- RoPE(zcrms(q_w, q_norm)) in place;
//             w >= heads: KV head j = w - heads: k_j <- RoPE(zcrms(k_j, k_norm)) in
//             place, then k_j and v_j (v not normalised) are quantized to int8
//             (scale = max(1e-12, max|x|)/127, code = clamp(round(x/scale), ±127),
//             WGSL round() being round-half-to-even) and stored at cache row
//             (layer, j, step[2]). The RMS sum uses the CPU's 8 partial sums
//             (the convention in common.wgsl).
//   attend    bindings 8..15 dispatch (heads, slots, 1):
//             query head h, KV head j = h / (heads/kv_heads), over the positions
//             S = [0, min(sink, t+1)) ++ [max(sink, t-window+1), t] read at their
//             physical slots: scores (one position per invocation, sequential dot
//             over d as on the CPU) go to the `scores` scratch buffer at h*rows,
//             max and sum by shared-memory tree reductions, then the weighted
//             values (weights staged 64 at a time in workgroup memory): with
//             words > 32 each invocation owns up to 4 code words of o and
//             accumulates over S in order; with fewer, S is dealt to 64 / words
//             interleaved stripes, one invocation per (stripe, word), and the
//             stripes' partials are added in order; o_h ⊙= σ(g_h) is written at
//             o_off + h*head_dim.

const WG: u32 = 64u;
const MAX_HEAD_DIM: u32 = 1024u;
// Accumulator words per invocation in `attend`: MAX_HEAD_DIM / 4 / WG.
const ACC_WORDS: u32 = 4u;
const LOWEST: f32 = -3.40282346638528859812e38; // f32::MIN exactly (WGSL rejects a literal beyond f32)
const SCRATCH_LEN: u32 = WG;

struct AttnParams {
    layer: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    sink: u32,
    window: u32,
    rows: u32,        // sink + window
    words: u32,       // ceil(head_dim / 4)
    q_off: u32,       // element offsets in act
    k_off: u32,
    v_off: u32,
    g_off: u32,
    o_off: u32,
    q_norm_off: u32,  // element offsets in vectors
    k_norm_off: u32,
    cos_at: u32,      // word offsets in step
    sin_at: u32,
    kn_off: u32,      // qk_attend: act offset of the normalised keys (for captures)
    act_stride: u32,  // elements from one token slot's act to the next's
    step_stride: u32, // words from one token slot's step input to the next's
    seq_at: u32,      // step word of the slot's sequence
    code_stride: u32, // cache code words from one sequence's to the next's
    scale_stride: u32, // cache scales from one sequence's to the next's
    scores_stride: u32, // scores from one sequence's to the next's
}

// The bases of a workgroup's token slot and its sequence, in elements: of its
// act, its step input, its cache codes and scales and its scores. Computed from
// workgroup_id.y and uniforms, so uniform, and passed as a value: a private
// variable would make everything read through it non-uniform under WGSL's
// uniformity rules (Tint's), and with it the barriers that depend on it.
struct Bases {
    act: u32,
    step: u32,
    code: u32,
    scale: u32,
    score: u32,
}

var<workgroup> xs: array<f32, MAX_HEAD_DIM>;

// Signed byte b of a code word, as f32.
fn code_at(word: u32, b: u32) -> f32 {
    return f32(bitcast<i32>(word << (24u - 8u * b)) >> 24u);
}

// ---------------------------------------------------------------- qk_store
@group(0) @binding(0) var<uniform> sp: AttnParams;
@group(0) @binding(1) var<storage, read_write> s_act: array<f32>;
@group(0) @binding(2) var<storage, read> s_vec: array<f32>;
@group(0) @binding(3) var<storage, read> s_step: array<u32>;
@group(0) @binding(4) var<storage, read_write> s_kcodes: array<u32>;
@group(0) @binding(5) var<storage, read_write> s_vcodes: array<u32>;
@group(0) @binding(6) var<storage, read_write> s_kscale: array<f32>;
@group(0) @binding(7) var<storage, read_write> s_vscale: array<f32>;

// Σ xs[i]² for i < n in the order of kernels::norm::inv_rms (the 8-partial-sums
// convention of common.wgsl), partials in scratch[0..8].
fn sum_sq8(n: u32, li: u32) -> f32 {
    if (li < 8u) {
        var acc = 0.0;
        for (var i = li; i < n; i += 8u) {
            let v = xs[i];
            acc += v * v;
        }
        scratch[li] = acc;
    }
    workgroupBarrier();
    var s = 0.0;
    for (var k = 0u; k < 8u; k++) {
        s += scratch[k];
    }
    workgroupBarrier();
    return s;
}

// Quantize xs[0..head_dim] to int8 and store it with its scale at cache row `cell`
// of the V cache (is_v) or the K cache.
fn store_int8(sb: Bases, is_v: bool, cell: u32, li: u32) {
    let n = sp.head_dim;
    var m = 0.0;
    for (var i = li; i < n; i += WG) {
        m = max(m, abs(xs[i]));
    }
    let scale = max(1e-12, wg_max(m, li)) / 127.0;
    for (var w = li; w < sp.words; w += WG) {
        var word = 0u;
        for (var b = 0u; b < 4u; b++) {
            let d = 4u * w + b;
            if (d < n) {
                let c = i32(clamp(round(xs[d] / scale), -127.0, 127.0));
                word |= (bitcast<u32>(c) & 0xffu) << (8u * b);
            }
        }
        let at = sb.code + cell * sp.words + w;
        if (is_v) {
            s_vcodes[at] = word;
        } else {
            s_kcodes[at] = word;
        }
    }
    if (li == 0u) {
        if (is_v) {
            s_vscale[sb.scale + cell] = scale;
        } else {
            s_kscale[sb.scale + cell] = scale;
        }
    }
}

@compute @workgroup_size(64)
fn qk_store(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let step = wid.y * sp.step_stride;
    let seq = s_step[step + sp.seq_at];
    let sb = Bases(wid.y * sp.act_stride, step, seq * sp.code_stride, seq * sp.scale_stride, 0u);
    let n = sp.head_dim;
    let half = n / 2u;
    let is_kv = wid.x >= sp.heads;
    let j = wid.x - select(0u, sp.heads, is_kv);
    let base = sb.act + select(sp.q_off, sp.k_off, is_kv) + j * n;
    let w_off = select(sp.q_norm_off, sp.k_norm_off, is_kv);
    for (var i = li; i < n; i += WG) {
        xs[i] = s_act[base + i];
    }
    workgroupBarrier();
    let r = 1.0 / sqrt(sum_sq8(n, li) / f32(n) + 1e-6);
    // zcrms then RoPE; invocation li owns the pairs (i, i + half), i ≡ li (mod WG).
    for (var i = li; i < half; i += WG) {
        let a = xs[i] * r * (1.0 + s_vec[w_off + i]);
        let b = xs[i + half] * r * (1.0 + s_vec[w_off + i + half]);
        let c = bitcast<f32>(s_step[sb.step + sp.cos_at + i]);
        let s = bitcast<f32>(s_step[sb.step + sp.sin_at + i]);
        let x0 = a * c - b * s;
        let x1 = a * s + b * c;
        xs[i] = x0;
        xs[i + half] = x1;
        s_act[base + i] = x0;
        s_act[base + i + half] = x1;
    }
    if (is_kv) {
        workgroupBarrier();
        let cell = (sp.layer * sp.kv_heads + j) * sp.rows + s_step[sb.step + 2u];
        store_int8(sb, false, cell, li);
        workgroupBarrier();
        let vb = sb.act + sp.v_off + j * n;
        for (var i = li; i < n; i += WG) {
            xs[i] = s_act[vb + i];
        }
        workgroupBarrier();
        store_int8(sb, true, cell, li);
    }
}

// ---------------------------------------------------------------- attend
@group(0) @binding(8) var<uniform> ap: AttnParams;
@group(0) @binding(9) var<storage, read_write> a_act: array<f32>;
@group(0) @binding(10) var<storage, read> a_step: array<u32>;
@group(0) @binding(11) var<storage, read_write> a_kcodes: array<u32>;
@group(0) @binding(12) var<storage, read_write> a_vcodes: array<u32>;
@group(0) @binding(13) var<storage, read_write> a_kscale: array<f32>;
@group(0) @binding(14) var<storage, read_write> a_vscale: array<f32>;
@group(0) @binding(15) var<storage, read_write> a_scores: array<f32>;

var<workgroup> w_sh: array<f32, WG>;
var<workgroup> row_sh: array<u32, WG>;
// attend: each stripe's partial sum of its code word (when words <= WG / 2).
var<workgroup> part_sh: array<vec4<f32>, WG>;

// qk_attend: the current position's int8 key (words 0..) and value (words
// MAX_WORDS..) as this workgroup quantized them, and their scales.
const MAX_WORDS: u32 = MAX_HEAD_DIM / 4u;
const CUR_ROW: u32 = 0xffffffffu;
var<workgroup> cur_codes: array<u32, 512>;
var<workgroup> cur_scale: array<f32, 2>;
// attend: the query head as vec4 words (xs regrouped).
var<workgroup> q4: array<vec4<f32>, MAX_WORDS>;

// Cache row (within the head's rows) of the i-th attended position: the sink
// prefix [0, n1) first, then the window from `lo` on.
fn attended_slot(i: u32, n1: u32, lo: u32) -> u32 {
    var p = i;
    if (i >= n1) {
        p = lo + (i - n1);
    }
    if (p < ap.sink) {
        return p;
    }
    return ap.sink + (p - ap.sink) % ap.window;
}

@compute @workgroup_size(64)
fn attend(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let sb = attend_bases(wid.y);
    let qb = sb.act + ap.q_off + wid.x * ap.head_dim;
    for (var i = li; i < ap.head_dim; i += WG) {
        xs[i] = a_act[qb + i];
    }
    attend_body(sb, wid.x, li, false);
}

// The bases of slot y and its sequence, for attend and qk_attend.
fn attend_bases(y: u32) -> Bases {
    let step = y * ap.step_stride;
    let seq = a_step[step + ap.seq_at];
    return Bases(y * ap.act_stride, step, seq * ap.code_stride, seq * ap.scale_stride,
                 seq * ap.scores_stride);
}

// The 4 value codes of word w of the position staged at k (row_sh[k]: a cache
// row, or CUR_ROW for qk_attend's current position), as f32.
fn v_codes(sb: Bases, k: u32, w: u32) -> vec4<f32> {
    var word: u32;
    if (row_sh[k] == CUR_ROW) {
        word = cur_codes[MAX_WORDS + w];
    } else {
        word = a_vcodes[sb.code + row_sh[k] * ap.words + w];
    }
    return vec4<f32>(code_at(word, 0u), code_at(word, 1u), code_at(word, 2u), code_at(word, 3u));
}

// Query head h (already in xs, loaded before the call) attends over S; with `cur`,
// the current position's key and value come from cur_codes / cur_scale (this
// workgroup's own quantization, qk_attend) instead of the cache. Uniform control flow.
fn attend_body(sb: Bases, h: u32, li: u32, cur: bool) {
    let n = ap.head_dim;
    let j = h / (ap.heads / ap.kv_heads);
    let t = a_step[sb.step + 1u];
    // S = [0, n1) ++ [lo, t]; n2 = t + 1 - lo when lo <= t.
    let n1 = min(ap.sink, t + 1u);
    var lo = ap.sink;
    if (t + 1u > ap.window) {
        lo = max(ap.sink, t + 1u - ap.window);
    }
    var n2 = 0u;
    if (t + 1u > lo) {
        n2 = t + 1u - lo;
    }
    let count = n1 + n2;
    let row0 = (ap.layer * ap.kv_heads + j) * ap.rows;
    let sc0 = sb.score + h * ap.rows;

    workgroupBarrier();
    // The query as whole code words (zero past head_dim, where the codes are zero
    // padding): one workgroup load a word below instead of four.
    for (var w = li; w < ap.words; w += WG) {
        var v = vec4<f32>(0.0);
        for (var b = 0u; b < 4u; b++) {
            if (4u * w + b < n) {
                v[b] = xs[4u * w + b];
            }
        }
        q4[w] = v;
    }
    workgroupBarrier();

    // Scores, one position per invocation; position i is always handled by
    // invocation i % WG, so the scratch round trips below need no storage barrier.
    let sqrt_d = sqrt(f32(n));
    var m = LOWEST;
    for (var i = li; i < count; i += WG) {
        let row = row0 + attended_slot(i, n1, lo);
        let mine = cur && i + 1u == count;
        let kb = sb.code + row * ap.words;
        var dot = 0.0;
        for (var w = 0u; w < ap.words; w++) {
            var word: u32;
            if (mine) {
                word = cur_codes[w];
            } else {
                word = a_kcodes[kb + w];
            }
            // In the order of d, as on the CPU (a padding byte adds 0 · 0).
            let q = q4[w];
            dot += q.x * code_at(word, 0u);
            dot += q.y * code_at(word, 1u);
            dot += q.z * code_at(word, 2u);
            dot += q.w * code_at(word, 3u);
        }
        var ks: f32;
        if (mine) {
            ks = cur_scale[0];
        } else {
            ks = a_kscale[sb.scale + row];
        }
        let s = dot * ks / sqrt_d;
        a_scores[sc0 + i] = s;
        m = max(m, s);
    }
    let mx = wg_max(m, li);
    var part = 0.0;
    for (var i = li; i < count; i += WG) {
        let e = exp(a_scores[sc0 + i] - mx);
        a_scores[sc0 + i] = e;
        part += e;
    }
    let total = wg_sum(part, li);

    // o = Σ_i (e_i / total) · Vscale · Vcode. With few code words (words ≤ WG/2,
    // e.g. 16 for head_dim 64) the positions are dealt to `stripes = WG / words`
    // interleaved stripes so that every invocation works: invocation li owns word
    // li % words of stripe li / words, sums its stripe's positions in the order of
    // S, and the stripes' partials are added in stripe order at the end. With more
    // words, one stripe: each invocation owns up to ACC_WORDS words and sums every
    // position in the order of S (the CPU's order).
    let stripes = max(1u, WG / ap.words);
    var acc: array<vec4<f32>, ACC_WORDS>;
    for (var c = 0u; c < ACC_WORDS; c++) {
        acc[c] = vec4<f32>(0.0);
    }
    // The striped sum's accumulator: a register of its own (a dynamically
    // indexed array lives in memory on CPU adapters).
    var a0 = vec4<f32>(0.0);
    let mine_w = li % ap.words;
    let mine_s = li / ap.words;
    let tiles = (count + WG - 1u) / WG;
    for (var tile = 0u; tile < tiles; tile++) {
        let i = tile * WG + li;
        if (i < count) {
            let row = row0 + attended_slot(i, n1, lo);
            if (cur && i + 1u == count) {
                w_sh[li] = a_scores[sc0 + i] / total * cur_scale[1];
                row_sh[li] = CUR_ROW;
            } else {
                w_sh[li] = a_scores[sc0 + i] / total * a_vscale[sb.scale + row];
                row_sh[li] = row;
            }
        }
        workgroupBarrier();
        let here = min(WG, count - tile * WG);
        if (stripes > 1u) {
            // Invocations past the last whole stripe (li >= stripes * words)
            // start past `here`: they own nothing.
            var k = mine_s;
            if (mine_s >= stripes) {
                k = here;
            }
            for (; k < here; k += stripes) {
                a0 += w_sh[k] * v_codes(sb, k, mine_w);
            }
        } else {
            for (var k = 0u; k < here; k++) {
                let wt = w_sh[k];
                for (var c = 0u; c < ACC_WORDS; c++) {
                    let w = li + c * WG;
                    if (w < ap.words) {
                        acc[c] += wt * v_codes(sb, k, w);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (stripes > 1u) {
        if (mine_s < stripes) {
            part_sh[li] = a0;
        }
        workgroupBarrier();
        if (li < ap.words) {
            var sum = part_sh[li];
            for (var s = 1u; s < stripes; s++) {
                sum += part_sh[s * ap.words + li];
            }
            acc[0] = sum;
        }
    }

    // Gate and write.
    let gb = sb.act + ap.g_off + h * n;
    let ob = sb.act + ap.o_off + h * n;
    for (var c = 0u; c < ACC_WORDS; c++) {
        let w = li + c * WG;
        if (w < ap.words) {
            for (var b = 0u; b < 4u; b++) {
                let d = 4u * w + b;
                if (d < n) {
                    let g = a_act[gb + d];
                    a_act[ob + d] = acc[c][b] * sigm(g);
                }
            }
        }
    }
}

// ---------------------------------------------------------------- qk_attend
@group(0) @binding(16) var<storage, read> a_vec: array<f32>;

// xs[0..head_dim] <- RoPE(zcrms(xs, norm at w_off)) (qk_store's arithmetic).
fn norm_rope_xs(sb: Bases, w_off: u32, li: u32) {
    let n = ap.head_dim;
    let half = n / 2u;
    let r = 1.0 / sqrt(sum_sq8(n, li) / f32(n) + 1e-6);
    for (var i = li; i < half; i += WG) {
        let a = xs[i] * r * (1.0 + a_vec[w_off + i]);
        let b = xs[i + half] * r * (1.0 + a_vec[w_off + i + half]);
        let c = bitcast<f32>(a_step[sb.step + ap.cos_at + i]);
        let s = bitcast<f32>(a_step[sb.step + ap.sin_at + i]);
        xs[i] = a * c - b * s;
        xs[i + half] = a * s + b * c;
    }
    workgroupBarrier();
}

// xs quantized as store_int8 does, into cur_codes at word `at` and cur_scale[slot];
// with `cell`, also stored at that cache row of the V (slot 1) or K cache.
fn quantize_cur(sb: Bases, slot: u32, at: u32, store: bool, cell: u32, li: u32) {
    let n = ap.head_dim;
    var m = 0.0;
    for (var i = li; i < n; i += WG) {
        m = max(m, abs(xs[i]));
    }
    let scale = max(1e-12, wg_max(m, li)) / 127.0;
    for (var w = li; w < ap.words; w += WG) {
        var word = 0u;
        for (var b = 0u; b < 4u; b++) {
            let d = 4u * w + b;
            if (d < n) {
                let c = i32(clamp(round(xs[d] / scale), -127.0, 127.0));
                word |= (bitcast<u32>(c) & 0xffu) << (8u * b);
            }
        }
        cur_codes[at + w] = word;
        if (store) {
            if (slot == 1u) {
                a_vcodes[sb.code + cell * ap.words + w] = word;
            } else {
                a_kcodes[sb.code + cell * ap.words + w] = word;
            }
        }
    }
    if (li == 0u) {
        cur_scale[slot] = scale;
        if (store) {
            if (slot == 1u) {
                a_vscale[sb.scale + cell] = scale;
            } else {
                a_kscale[sb.scale + cell] = scale;
            }
        }
    }
    workgroupBarrier();
}

// qk_store and attend in one dispatch (the lean program): dispatch (heads, 1, 1),
// workgroup 64, bindings 8..16 (attend's and the vectors). Query head h with KV
// head j = h / (heads / kv_heads): every workgroup of the group normalises and
// quantizes k_j and v_j itself (the same arithmetic, so the same codes); the
// first one stores them at cache row (layer, j, step[2]) and writes the
// normalised k_j at kn_off + j·head_dim. q_h is normalised in place, then it
// attends as `attend` does, the current position read from its own codes (the
// cache row may not be written yet: workgroups do not wait for each other).
@compute @workgroup_size(64)
fn qk_attend(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = ap.head_dim;
    let h = wid.x;
    let j = h / (ap.heads / ap.kv_heads);
    let first = h % (ap.heads / ap.kv_heads) == 0u;
    let sb = attend_bases(wid.y);
    let cell = (ap.layer * ap.kv_heads + j) * ap.rows + a_step[sb.step + 2u];
    for (var i = li; i < n; i += WG) {
        xs[i] = a_act[sb.act + ap.k_off + j * n + i];
    }
    workgroupBarrier();
    norm_rope_xs(sb, ap.k_norm_off, li);
    if (first) {
        for (var i = li; i < n; i += WG) {
            a_act[sb.act + ap.kn_off + j * n + i] = xs[i];
        }
    }
    quantize_cur(sb, 0u, 0u, first, cell, li);
    for (var i = li; i < n; i += WG) {
        xs[i] = a_act[sb.act + ap.v_off + j * n + i];
    }
    workgroupBarrier();
    quantize_cur(sb, 1u, MAX_WORDS, first, cell, li);
    let qb = sb.act + ap.q_off + h * n;
    for (var i = li; i < n; i += WG) {
        xs[i] = a_act[qb + i];
    }
    workgroupBarrier();
    norm_rope_xs(sb, ap.q_norm_off, li);
    for (var i = li; i < n; i += WG) {
        a_act[qb + i] = xs[i];
    }
    attend_body(sb, h, li, true);
}
