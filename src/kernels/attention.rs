//! Attention over the int8 KV cache (SPEC §4.3 step 5). The twins of the GPU
//! entry points of shaders/attention.wgsl (`crate::gpu::kernels::attention`) are
//! [`qk_store`] (`qk_store`: per-head ZCRMS + RoPE and the int8 KV store) and
//! [`attend`] (`attend`: attention over the cache with the output gate); the
//! per-head arithmetic is [`attend_head`] / [`attend_group`].

use super::kv::KvCache;
pub use super::kv::{KvHeadView, WideRows};
use super::norm::zcrms_in_place;
use super::rope::apply_rope;
use super::vmath::gate_in_place;
use crate::host::pool::{Pool, SharedSlice};

/// ZCRMS (`q_norm`, `k_norm`) and RoPE (the position's `cos`/`sin` table,
/// `head_dim / 2` each) on every query head of `q` and key head of `k`, in place:
/// the first half of [`qk_store`]. With AVX-512 and `head_dim % 32 == 0` a
/// head is a few registers (the same bits as the plain loops).
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
    assert!(
        sin.len() == cos.len()
            && q_norm.len() == hd
            && k_norm.len() == hd
            && q.len().is_multiple_of(hd.max(1))
            && k.len().is_multiple_of(hd.max(1)),
        "qk_norm_rope: lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if hd > 0
        && cos.len().is_multiple_of(16)
        && crate::host::simd::CpuSimd::selected() == crate::host::simd::CpuSimd::Avx512
    {
        // SAFETY: the AVX-512 selection implies AVX-512F/VL and AVX2; the
        // lengths are checked above.
        unsafe {
            qk_x86::norm_rope_heads(q, q_norm, cos, sin);
            qk_x86::norm_rope_heads(k, k_norm, cos, sin);
        }
        return;
    }
    norm_rope_plain(q, q_norm, cos, sin);
    norm_rope_plain(k, k_norm, cos, sin);
}

crate::host::simd::simd_fn! {
    /// [`qk_norm_rope`]'s work on one tensor of heads `x` with gains `w`, as
    /// plain loops over each head (the reference of the AVX-512 form).
    fn norm_rope_plain(x: &mut [f32], w: &[f32], cos: &[f32], sin: &[f32]) {
        for head in x.chunks_exact_mut(2 * cos.len()) {
            zcrms_in_place(head, w);
            apply_rope(head, cos, sin);
        }
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
            attend_kv_head(cache, layer, j, None, q, gate, slots, oj, sj);
        }
    });
}

/// The query heads of KV head `j` of `layer` attending over its rows `slots`,
/// gated: `oj` (`g · head_dim`, `g = q.len() / (kv_heads · head_dim)`) receives
/// `attention(q_h) ⊙ σ(gate_h)` for those heads ([`attend_group`]); `scores`
/// holds at least `g · slots.len()`. One KV head of [`attend`], single-threaded;
/// `wide`, the head's rows widened ([`KvHeadView::wide`]), if the caller has them.
///
/// # Panics
/// As [`attend_group`].
#[allow(clippy::too_many_arguments)]
pub fn attend_kv_head(
    cache: &KvCache,
    layer: usize,
    j: usize,
    wide: Option<WideRows<'_>>,
    q: &[f32],
    gate: &[f32],
    slots: &[usize],
    oj: &mut [f32],
    scores: &mut [f32],
) {
    let hd = cache.head_dim;
    let g = q.len() / (hd * cache.kv_heads).max(1);
    let heads = j * g * hd..(j + 1) * g * hd;
    let view = KvHeadView {
        wide,
        ..cache.head(layer, j)
    };
    attend_group(&q[heads.clone()], hd, &view, slots, scores, oj);
    gate_in_place(oj, &gate[heads]);
}

/// Whether [`attend_group`] reads [`KvHeadView::wide`] rows at this head
/// width on this CPU (its AVX-512 kernel runs): widening pays only then.
pub fn reads_wide_rows(head_dim: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::runs_width(head_dim)
            && crate::host::simd::CpuSimd::selected() == crate::host::simd::CpuSimd::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = head_dim;
        false
    }
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
/// [`crate::host::simd::CpuSimd::selected`] allowing it) the key and value codes are
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
    let (rows, end) = (kv.k_scale.len(), slots.iter().max().map_or(0, |m| m + 1));
    assert!(
        end <= rows && kv.k.len() >= rows * d && kv.v.len() >= rows * d,
        "attend_group: slot outside the cache"
    );
    if let Some(w) = &kv.wide {
        assert!(
            w.v.len() == w.k.len() && end * d <= w.k.len(),
            "attend_group: slot outside the wide rows"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(16)
        && crate::host::simd::CpuSimd::selected() == crate::host::simd::CpuSimd::Avx512
    {
        // SAFETY: the AVX-512 selection implies AVX-512F/BW, AVX2 and FMA;
        // lengths and slots checked above.
        unsafe { x86::attend_group_512(qs, d, kv, slots, &mut scores[..g * n], out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(8)
        && crate::host::simd::CpuSimd::selected() != crate::host::simd::CpuSimd::Scalar
    {
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
mod qk_x86;
#[cfg(target_arch = "x86_64")]
mod x86;
