//! The per-token arithmetic of SPEC §4 shared by the step ([`super::CpuEngine`]'s
//! `step`) and the batched prefill, so that both compute every value with the
//! same operations in the same order: a prompt prefilled in chunks gives exactly
//! the logits of one step per token.

use super::engine::State;
use crate::config::{Config, EngramConfig};
use crate::cq::CqMatrix;
use crate::kernels::attention::{attend_group, KvHeadView};
use crate::kernels::kv::quantize_int8;
use crate::kernels::mhc::{post_gates, pre_gates, sinkhorn_route};
use crate::kernels::norm::{zcrms_in_place, zcrms_into};
use crate::kernels::rope::apply_rope;
use crate::kernels::vmath::gate_in_place;
use crate::kernels::{sigmoid, silu};
use crate::pool::{Pool, SharedSlice};
use crate::weights::{LayerWeights, MhcWeights, SiteWeights};

/// SPEC §4.1: all four lanes (`lanes`, `4 · hidden`) start as
/// `x0 = dequantize_row(embed, token) · sqrt(hidden)`.
pub(super) fn embed_lanes(embed: &CqMatrix, token: u32, lanes: &mut [f32]) {
    let h = embed.cols();
    embed.dequantize_row_into(token as usize, &mut lanes[..h]);
    let scale = (h as f32).sqrt();
    for v in &mut lanes[..h] {
        *v *= scale;
    }
    let (first, rest) = lanes.split_at_mut(h);
    for lane in rest.chunks_exact_mut(h) {
        lane.copy_from_slice(first);
    }
}

/// SPEC §4.2: `value = v_t + silu(Σ_j [t − j·dilation ≥ 0] conv[j] ⊙ v_{t − j·dilation})`
/// from a site's `[ring, hidden]` ring, whose row of position `t` is already
/// written. `m` is scratch of `hidden` values.
pub(super) fn engram_value(
    t: u64,
    ec: &EngramConfig,
    conv: &[f32],
    ring: &[f32],
    m: &mut [f32],
    value: &mut [f32],
) {
    let h = m.len();
    let rows = ec.ring() as u64;
    m.fill(0.0);
    for j in 0..ec.taps {
        let back = (j * ec.dilation) as u64;
        if back > t {
            break;
        }
        let r = ((t - back) % rows) as usize;
        let past = &ring[r * h..(r + 1) * h];
        let cv = &conv[j * h..(j + 1) * h];
        for ((m, c), p) in m.iter_mut().zip(cv).zip(past) {
            *m += c * p;
        }
    }
    let slot = (t % rows) as usize;
    let v = &ring[slot * h..(slot + 1) * h];
    for ((val, vv), m) in value.iter_mut().zip(v).zip(m.iter()) {
        *val = vv + silu(*m);
    }
}

/// SPEC §4.3 step 3: `u = Σ_i hpre[i] · lanes[i]` from the layer's `p_pre` (4 values).
pub(super) fn mix_pre(l: usize, m: &MhcWeights, lanes: &[f32], p_pre: &[f32], u: &mut [f32]) {
    let h = u.len();
    let hpre = pre_gates(l, m.a_pre[l], p_pre, &m.b_pre[4 * l..4 * l + 4]);
    u.fill(0.0);
    for (i, lane) in lanes.chunks_exact(h).enumerate() {
        for (u, x) in u.iter_mut().zip(lane) {
            *u += hpre[i] * x;
        }
    }
}

/// SPEC §4.3 step 4 at an engram site: `b = u + α · value` with
/// `α = σ(⟨zcrms(u, norm_u), zcrms(key, norm_k)⟩ / sqrt(hidden))`. `a` and `tmp`
/// are scratch of `hidden` values.
pub(super) fn engram_gate(
    site: &SiteWeights,
    u: &[f32],
    key: &[f32],
    value: &[f32],
    a: &mut [f32],
    tmp: &mut [f32],
    b: &mut [f32],
) {
    let inv_sqrt_h = 1.0 / (u.len() as f32).sqrt();
    zcrms_into(u, &site.norm_u, a);
    zcrms_into(key, &site.norm_k, tmp);
    let dot: f32 = a.iter().zip(tmp.iter()).map(|(x, y)| x * y).sum();
    let alpha = sigmoid(dot * inv_sqrt_h);
    for (b, v) in b.iter_mut().zip(value) {
        *b += alpha * v;
    }
}

/// ZCRMS and RoPE (the position's `cos`/`sin` table) on every query and key head.
pub(super) fn qk_norm_rope(
    lw: &LayerWeights,
    hd: usize,
    cos: &[f32],
    sin: &[f32],
    q: &mut [f32],
    k: &mut [f32],
) {
    for qh in q.chunks_exact_mut(hd) {
        zcrms_in_place(qh, &lw.q_norm);
        apply_rope(qh, cos, sin);
    }
    for kh in k.chunks_exact_mut(hd) {
        zcrms_in_place(kh, &lw.k_norm);
        apply_rope(kh, cos, sin);
    }
}

/// Store layer `l`'s keys and values of one position as int8 at cache row `slot`.
/// `codes` is scratch of `head_dim` values.
pub(super) fn store_kv(
    c: &Config,
    st: &mut State,
    l: usize,
    slot: usize,
    k: &[f32],
    v: &[f32],
    codes: &mut [i8],
) {
    let (hd, rows) = (c.head_dim, c.cache_rows());
    for j in 0..c.kv_heads {
        let cell = (l * c.kv_heads + j) * rows + slot;
        st.k_scale[cell] = quantize_int8(&k[j * hd..(j + 1) * hd], codes);
        st.k_codes[cell * hd..(cell + 1) * hd].copy_from_slice(codes);
        st.v_scale[cell] = quantize_int8(&v[j * hd..(j + 1) * hd], codes);
        st.v_codes[cell * hd..(cell + 1) * hd].copy_from_slice(codes);
    }
}

/// Attention of one position over the cache rows `slots` of layer `l`, gated:
/// `o = attention(q) ⊙ σ(gate)`, each KV head with its query heads
/// ([`attend_kv_head`]), the KV heads split over the pool. `scores` holds
/// `heads · cache_rows` floats.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend(
    c: &Config,
    st: &State,
    l: usize,
    q: &[f32],
    gate: &[f32],
    slots: &[usize],
    o: &mut [f32],
    scores: &mut [f32],
) {
    let (hd, rows) = (c.head_dim, c.cache_rows());
    let g = c.heads / c.kv_heads;
    let (o, scores) = (SharedSlice::new(o), SharedSlice::new(scores));
    let pool = Pool::global();
    pool.run(&|part| {
        for j in (part..c.kv_heads).step_by(pool.threads()) {
            let base = (l * c.kv_heads + j) * rows;
            let view = KvHeadView {
                k: &st.k_codes[base * hd..(base + rows) * hd],
                v: &st.v_codes[base * hd..(base + rows) * hd],
                k_scale: &st.k_scale[base..base + rows],
                v_scale: &st.v_scale[base..base + rows],
            };
            // SAFETY: KV head j owns these ranges of `o` and `scores`.
            let (oj, sj) = unsafe {
                (
                    o.range(j * g * hd..(j + 1) * g * hd),
                    scores.range(j * g * rows..(j + 1) * g * rows),
                )
            };
            attend_kv_head(c, j, &view, q, gate, slots, oj, sj);
        }
    });
}

/// The query heads of KV head `j` attending over `view`'s rows `slots`, gated:
/// `oj` (`g · head_dim`, `g = heads / kv_heads`) receives
/// `attention(q_h) ⊙ σ(gate_h)` for those heads; `scores` holds `g · slots.len()`.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_kv_head(
    c: &Config,
    j: usize,
    view: &KvHeadView,
    q: &[f32],
    gate: &[f32],
    slots: &[usize],
    oj: &mut [f32],
    scores: &mut [f32],
) {
    let (hd, g) = (c.head_dim, c.heads / c.kv_heads);
    let heads = j * g * hd..(j + 1) * g * hd;
    attend_group(&q[heads.clone()], hd, view, slots, scores, oj);
    gate_in_place(oj, &gate[heads]);
}

/// SPEC §4.3 step 5, last line: `after = b + attn_out_scale · zcrms(attn, attn_post_norm)`
/// (`attn` is normalised in place).
pub(super) fn after_attention(lw: &LayerWeights, b: &[f32], attn: &mut [f32], after: &mut [f32]) {
    zcrms_in_place(attn, &lw.attn_post_norm);
    for ((a, b), x) in after.iter_mut().zip(b).zip(attn.iter()) {
        *a = b + lw.attn_out_scale * x;
    }
}

/// SPEC §4.3 steps 8–9: the Sinkhorn route and post gates of layer `l` from
/// `p_post` (4) and `p_res` (16), then `next[i] = Σ_j route[i][j] · lanes[j] +
/// hpost[i] · update`. Returns the route.
#[allow(clippy::too_many_arguments)]
pub(super) fn route_lanes(
    l: usize,
    m: &MhcWeights,
    iters: usize,
    p_post: &[f32],
    p_res: &[f32],
    lanes: &[f32],
    update: &[f32],
    next: &mut [f32],
) -> [[f32; 4]; 4] {
    let h = update.len();
    let hpost = post_gates(l, m.a_post[l], p_post, &m.b_post[4 * l..4 * l + 4]);
    let route = sinkhorn_route(m.a_res[l], p_res, &m.b_res[16 * l..16 * l + 16], iters);
    let (l0, rest) = lanes.split_at(h);
    let (l1, rest) = rest.split_at(h);
    let (l2, l3) = rest.split_at(h);
    for (i, nl) in next.chunks_exact_mut(h).enumerate() {
        let ([r0, r1, r2, r3], hp) = (route[i], hpost[i]);
        for (((((dst, a), b), c), d), o) in
            nl.iter_mut().zip(l0).zip(l1).zip(l2).zip(l3).zip(update)
        {
            *dst = (((r0 * a + r1 * b) + r2 * c) + r3 * d) + hp * o;
        }
    }
    route
}

/// SPEC §4.4: `f = zcrms(mean of the 4 lanes, final_norm)` into `f` (`hidden`).
pub(super) fn final_hidden(lanes: &[f32], final_norm: &[f32], f: &mut [f32]) {
    let h = f.len();
    for (col, dst) in f.iter_mut().enumerate() {
        *dst = (lanes[col] + lanes[h + col] + lanes[2 * h + col] + lanes[3 * h + col]) / 4.0;
    }
    zcrms_in_place(f, final_norm);
}
