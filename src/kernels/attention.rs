//! Attention over the int8 KV cache (SPEC §4.3 step 5). The twins of the GPU
//! entry points of shaders/attention.wgsl (`crate::gpu::kernels::attention`) are
//! [`qk_store`] (`qk_store`: per-head ZCRMS + RoPE and the int8 KV store) and
//! [`attend`] (`attend`: attention over the cache with the output gate); the
//! per-head arithmetic is [`attend_head`] / [`attend_group`].

use super::kv::KvCache;
use super::norm::zcrms_in_place;
use super::rope::apply_rope;
use super::vmath::gate_in_place;
use crate::pool::{Pool, SharedSlice};

/// ZCRMS (`q_norm`, `k_norm`) and RoPE (the position's `cos`/`sin` table,
/// `head_dim / 2` each) on every query head of `q` and key head of `k`, in place:
/// the first half of [`qk_store`].
///
/// # Panics
/// If the lengths disagree.
pub fn qk_norm_rope(
    q_norm: &[f32],
    k_norm: &[f32],
    cos: &[f32],
    sin: &[f32],
    q: &mut [f32],
    k: &mut [f32],
) {
    let hd = 2 * cos.len();
    for qh in q.chunks_exact_mut(hd) {
        zcrms_in_place(qh, q_norm);
        apply_rope(qh, cos, sin);
    }
    for kh in k.chunks_exact_mut(hd) {
        zcrms_in_place(kh, k_norm);
        apply_rope(kh, cos, sin);
    }
}

/// CPU twin of the GPU `qk_store` entry point (shaders/attention.wgsl,
/// `AttentionKernels::qk_store`): [`qk_norm_rope`] on `q` and `k` in place, then
/// the key and value of every KV head quantized to int8 at row `slot` (the
/// position's physical slot, `step[2]` on the GPU) of `layer` in `cache`
/// ([`KvCache::store`]). `v` is not normalised.
///
/// # Panics
/// If the lengths disagree with the cache or `layer`/`slot` is out of it.
#[allow(clippy::too_many_arguments)]
pub fn qk_store(
    q_norm: &[f32],
    k_norm: &[f32],
    cos: &[f32],
    sin: &[f32],
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    cache: &mut KvCache,
    layer: usize,
    slot: usize,
) {
    qk_norm_rope(q_norm, k_norm, cos, sin, q, k);
    cache.store(layer, slot, k, v);
}

/// CPU twin of the GPU `attend` entry point (shaders/attention.wgsl,
/// `AttentionKernels::attend`): every query head of `q` (`heads · head_dim`,
/// `heads` a multiple of the cache's KV heads) attends over the rows `slots` of
/// `layer` (for a decode step [`super::kv::attended_slots`] of its position), and
/// `o = attention(q) ⊙ σ(gate)`. The KV heads ([`attend_kv_head`]) are split over
/// the pool. `scores` is scratch of at least `heads · slots.len()` floats.
///
/// # Panics
/// As [`attend_group`], or if `o`, `gate` and `q` differ in length.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    cache: &KvCache,
    layer: usize,
    q: &[f32],
    gate: &[f32],
    slots: &[usize],
    o: &mut [f32],
    scores: &mut [f32],
) {
    let (hd, kvh) = (cache.head_dim, cache.kv_heads);
    assert!(
        o.len() == q.len() && gate.len() == q.len(),
        "attend: lengths"
    );
    let g = q.len() / (hd * kvh).max(1);
    let n = slots.len();
    assert!(scores.len() >= kvh * g * n, "attend: scores scratch");
    let (o, scores) = (SharedSlice::new(o), SharedSlice::new(scores));
    let pool = Pool::global();
    pool.run(&|part| {
        for j in (part..kvh).step_by(pool.threads()) {
            // SAFETY: KV head j owns these ranges of `o` and `scores`.
            let (oj, sj) = unsafe {
                (
                    o.range(j * g * hd..(j + 1) * g * hd),
                    scores.range(j * g * n..(j + 1) * g * n),
                )
            };
            attend_kv_head(cache, layer, j, q, gate, slots, oj, sj);
        }
    });
}

/// The query heads of KV head `j` of `layer` attending over its rows `slots`,
/// gated: `oj` (`g · head_dim`, `g = q.len() / (kv_heads · head_dim)`) receives
/// `attention(q_h) ⊙ σ(gate_h)` for those heads ([`attend_group`]); `scores`
/// holds at least `g · slots.len()`. One KV head of [`attend`], single-threaded.
///
/// # Panics
/// As [`attend_group`].
#[allow(clippy::too_many_arguments)]
pub fn attend_kv_head(
    cache: &KvCache,
    layer: usize,
    j: usize,
    q: &[f32],
    gate: &[f32],
    slots: &[usize],
    oj: &mut [f32],
    scores: &mut [f32],
) {
    let hd = cache.head_dim;
    let g = q.len() / (hd * cache.kv_heads).max(1);
    let heads = j * g * hd..(j + 1) * g * hd;
    attend_group(
        &q[heads.clone()],
        hd,
        &cache.head(layer, j),
        slots,
        scores,
        oj,
    );
    gate_in_place(oj, &gate[heads]);
}

/// Read-only view of one layer and KV head of the cache.
pub struct KvHeadView<'a> {
    /// `[rows, head_dim]` key codes.
    pub k: &'a [i8],
    /// `[rows, head_dim]` value codes.
    pub v: &'a [i8],
    /// `[rows]` key scales.
    pub k_scale: &'a [f32],
    /// `[rows]` value scales.
    pub v_scale: &'a [f32],
}

/// `o = Σ_p softmax(score)_p · Vscale[p] · Vcode[p]` over the given physical `slots`,
/// with `score_p = (Σ_d q[d]·Kcode[p,d]) · Kscale[p] / sqrt(head_dim)`.
/// `scores` is scratch of at least `slots.len()` entries.
///
/// # Panics
/// If `out.len() != q.len()`, `scores` is too short or a slot is out of the cache.
pub fn attend_head(
    q: &[f32],
    kv: &KvHeadView,
    slots: &[usize],
    scores: &mut [f32],
    out: &mut [f32],
) {
    let d = q.len();
    assert_eq!(out.len(), d);
    let scores = &mut scores[..slots.len()];
    let sqrt_d = (d as f32).sqrt();
    let mut max = f32::NEG_INFINITY;
    for (s, &slot) in scores.iter_mut().zip(slots) {
        let k = &kv.k[slot * d..(slot + 1) * d];
        let dot: f32 = q.iter().zip(k).map(|(a, &b)| a * b as f32).sum();
        *s = dot * kv.k_scale[slot] / sqrt_d;
        max = max.max(*s);
    }
    let mut total = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        total += *s;
    }
    out.fill(0.0);
    for (s, &slot) in scores.iter().zip(slots) {
        let w = s / total * kv.v_scale[slot];
        let v = &kv.v[slot * d..(slot + 1) * d];
        for (o, &c) in out.iter_mut().zip(v) {
            *o += w * c as f32;
        }
    }
}

/// Every query head of one KV head (SPEC §4.3 step 5): `qs` holds
/// `g = qs.len() / head_dim` query heads back to back, `out` receives their outputs
/// in the same layout, and `scores` is scratch of at least `g · slots.len()`.
/// Equal to [`attend_head`] per head up to float rounding; with AVX2 (and
/// [`crate::simd::CpuSimd::selected`] allowing it) the key and value codes are
/// read once for all `g` heads, 8 lanes at a time.
///
/// # Panics
/// If `head_dim` is 0, the lengths disagree, `scores` is too short or a slot is
/// out of the cache.
pub fn attend_group(
    qs: &[f32],
    head_dim: usize,
    kv: &KvHeadView,
    slots: &[usize],
    scores: &mut [f32],
    out: &mut [f32],
) {
    let d = head_dim;
    assert!(
        d > 0 && qs.len().is_multiple_of(d) && out.len() == qs.len(),
        "attend_group: lengths"
    );
    let g = qs.len() / d;
    let n = slots.len();
    assert!(scores.len() >= g * n, "attend_group: scores scratch");
    let rows = kv.k_scale.len();
    assert!(
        slots.iter().all(|&s| s < rows) && kv.k.len() >= rows * d && kv.v.len() >= rows * d,
        "attend_group: slot outside the cache"
    );
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(8) && crate::simd::CpuSimd::selected() != crate::simd::CpuSimd::Scalar {
        // SAFETY: a non-scalar selection implies AVX2 and FMA; lengths and slots checked above.
        unsafe { x86::attend_group(qs, d, kv, slots, &mut scores[..g * n], out) };
        return;
    }
    for ((q, o), s) in qs
        .chunks_exact(d)
        .zip(out.chunks_exact_mut(d))
        .zip(scores.chunks_exact_mut(n.max(1)))
    {
        attend_head(q, kv, slots, s, o);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    // Index loops over small register arrays read clearer than iterator chains here.
    #![allow(clippy::needless_range_loop)]
    use super::KvHeadView;
    use crate::kernels::vmath::x86::exp_slice;
    use crate::simd::x86::hsum8;
    use std::arch::x86_64::*;

    /// 8 int8 codes at `p` as f32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn codes8(p: *const i8) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
    }

    /// Scores of up to 4 heads (`qs` rows `h0 .. h0 + H`) at every slot.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn scores<const H: usize>(
        qs: &[f32],
        h0: usize,
        d: usize,
        kv: &KvHeadView,
        slots: &[usize],
        scores: &mut [f32],
    ) {
        let n = slots.len();
        let inv = 1.0 / (d as f32).sqrt();
        for (i, &slot) in slots.iter().enumerate() {
            let k = kv.k.as_ptr().add(slot * d);
            let mut acc = [_mm256_setzero_ps(); H];
            for c in (0..d).step_by(8) {
                let kf = codes8(k.add(c));
                for h in 0..H {
                    let q = _mm256_loadu_ps(qs.as_ptr().add((h0 + h) * d + c));
                    acc[h] = _mm256_fmadd_ps(q, kf, acc[h]);
                }
            }
            let ks = kv.k_scale[slot];
            for h in 0..H {
                scores[(h0 + h) * n + i] = hsum8(acc[h]) * ks * inv;
            }
        }
    }

    /// Outputs of up to 4 heads from their softmax weights (already scaled by the value scales).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn values<const H: usize>(
        w: &[f32],
        h0: usize,
        d: usize,
        kv: &KvHeadView,
        slots: &[usize],
        out: &mut [f32],
    ) {
        let n = slots.len();
        for c in (0..d).step_by(8) {
            let mut acc = [_mm256_setzero_ps(); H];
            for (i, &slot) in slots.iter().enumerate() {
                let vf = codes8(kv.v.as_ptr().add(slot * d + c));
                for h in 0..H {
                    acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(w[(h0 + h) * n + i]), vf, acc[h]);
                }
            }
            for h in 0..H {
                _mm256_storeu_ps(out.as_mut_ptr().add((h0 + h) * d + c), acc[h]);
            }
        }
    }

    /// See [`super::attend_group`]; `d % 8 == 0`, `scores.len() == heads · slots.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn attend_group(
        qs: &[f32],
        d: usize,
        kv: &KvHeadView,
        slots: &[usize],
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let g = qs.len() / d;
        let n = slots.len();
        let mut h = 0;
        while h + 4 <= g {
            self::scores::<4>(qs, h, d, kv, slots, scores);
            h += 4;
        }
        while h < g {
            self::scores::<1>(qs, h, d, kv, slots, scores);
            h += 1;
        }
        // Softmax per head, folded with the value scales.
        for s in scores.chunks_exact_mut(n.max(1)).take(g) {
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            s.iter_mut().for_each(|v| *v -= max);
            exp_slice(s);
            let total: f32 = s.iter().sum();
            for (v, &slot) in s.iter_mut().zip(slots) {
                *v = *v / total * kv.v_scale[slot];
            }
        }
        let mut h = 0;
        while h + 4 <= g {
            values::<4>(scores, h, d, kv, slots, out);
            h += 4;
        }
        while h < g {
            values::<1>(scores, h, d, kv, slots, out);
            h += 1;
        }
    }
}
