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

crate::simd::simd_fn! {
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
    if d.is_multiple_of(16) && crate::simd::CpuSimd::selected() == crate::simd::CpuSimd::Avx512 {
        // SAFETY: the AVX-512 selection implies AVX-512F/BW, AVX2 and FMA;
        // lengths and slots checked above.
        unsafe { x86::attend_group_512(qs, d, kv, slots, &mut scores[..g * n], out) };
        return;
    }
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

    /// Scores of up to 4 heads (`qs` rows `h0 .. h0 + H`) at every slot, two
    /// slots at a time (`2·H` independent FMA chains: one slot's `H` chains
    /// alone wait on the FMA latency); each slot's sum in the order of one.
    /// `d % 8 == 0`, slots inside the cache (the caller checked both).
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
        let q = qs.as_ptr().add(h0 * d);
        let mut i = 0;
        while i + 2 <= n {
            let (s0, s1) = (*slots.get_unchecked(i), *slots.get_unchecked(i + 1));
            let (k0, k1) = (kv.k.as_ptr().add(s0 * d), kv.k.as_ptr().add(s1 * d));
            let mut a0 = [_mm256_setzero_ps(); H];
            let mut a1 = [_mm256_setzero_ps(); H];
            for c in (0..d).step_by(8) {
                let (f0, f1) = (codes8(k0.add(c)), codes8(k1.add(c)));
                for h in 0..H {
                    let qv = _mm256_loadu_ps(q.add(h * d + c));
                    a0[h] = _mm256_fmadd_ps(qv, f0, a0[h]);
                    a1[h] = _mm256_fmadd_ps(qv, f1, a1[h]);
                }
            }
            let (ks0, ks1) = (*kv.k_scale.get_unchecked(s0), *kv.k_scale.get_unchecked(s1));
            for h in 0..H {
                *scores.get_unchecked_mut((h0 + h) * n + i) = hsum8(a0[h]) * ks0 * inv;
                *scores.get_unchecked_mut((h0 + h) * n + i + 1) = hsum8(a1[h]) * ks1 * inv;
            }
            i += 2;
        }
        if i < n {
            let slot = *slots.get_unchecked(i);
            let k = kv.k.as_ptr().add(slot * d);
            let mut acc = [_mm256_setzero_ps(); H];
            for c in (0..d).step_by(8) {
                let kf = codes8(k.add(c));
                for h in 0..H {
                    let qv = _mm256_loadu_ps(q.add(h * d + c));
                    acc[h] = _mm256_fmadd_ps(qv, kf, acc[h]);
                }
            }
            let ks = *kv.k_scale.get_unchecked(slot);
            for h in 0..H {
                *scores.get_unchecked_mut((h0 + h) * n + i) = hsum8(acc[h]) * ks * inv;
            }
        }
    }

    /// Softmax of one head's scores in place, folded with the value scales of
    /// their slots: `e_i / Σ e · Vscale[slot_i]`, 8 lanes at a time.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn softmax(s: &mut [f32], kv: &KvHeadView, slots: &[usize]) {
        let n = s.len();
        let body = n - n % 8;
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        for c in (0..body).step_by(8) {
            m = _mm256_max_ps(m, _mm256_loadu_ps(s.as_ptr().add(c)));
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let max = lanes
            .iter()
            .chain(&s[body..])
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        s.iter_mut().for_each(|v| *v -= max);
        exp_slice(s);
        let mut t = _mm256_setzero_ps();
        for c in (0..body).step_by(8) {
            t = _mm256_add_ps(t, _mm256_loadu_ps(s.as_ptr().add(c)));
        }
        let total = hsum8(t) + s[body..].iter().sum::<f32>();
        let inv = 1.0 / total;
        let iv = _mm256_set1_ps(inv);
        for c in (0..body).step_by(8) {
            let sl = slots.as_ptr().add(c);
            let vs = |j: usize| *kv.v_scale.get_unchecked(*sl.add(j));
            let scale = _mm256_setr_ps(vs(0), vs(1), vs(2), vs(3), vs(4), vs(5), vs(6), vs(7));
            let e = _mm256_loadu_ps(s.as_ptr().add(c));
            _mm256_storeu_ps(
                s.as_mut_ptr().add(c),
                _mm256_mul_ps(_mm256_mul_ps(e, iv), scale),
            );
        }
        for (v, &slot) in s[body..].iter_mut().zip(&slots[body..]) {
            *v = *v * inv * kv.v_scale[slot];
        }
    }

    /// Outputs of up to 4 heads from their softmax weights (already scaled by
    /// the value scales), 16 dimensions at a time where `d` allows (`2·H`
    /// FMA chains, each weight broadcast once for both halves); each output
    /// summed over the slots in order.
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
        let w = w.as_ptr().add(h0 * n);
        let o = out.as_mut_ptr().add(h0 * d);
        let mut c = 0;
        while c + 16 <= d {
            let mut a0 = [_mm256_setzero_ps(); H];
            let mut a1 = [_mm256_setzero_ps(); H];
            for (i, &slot) in slots.iter().enumerate() {
                let v = kv.v.as_ptr().add(slot * d + c);
                let (v0, v1) = (codes8(v), codes8(v.add(8)));
                for h in 0..H {
                    let wt = _mm256_broadcast_ss(&*w.add(h * n + i));
                    a0[h] = _mm256_fmadd_ps(wt, v0, a0[h]);
                    a1[h] = _mm256_fmadd_ps(wt, v1, a1[h]);
                }
            }
            for h in 0..H {
                _mm256_storeu_ps(o.add(h * d + c), a0[h]);
                _mm256_storeu_ps(o.add(h * d + c + 8), a1[h]);
            }
            c += 16;
        }
        if c < d {
            let mut acc = [_mm256_setzero_ps(); H];
            for (i, &slot) in slots.iter().enumerate() {
                let vf = codes8(kv.v.as_ptr().add(slot * d + c));
                for h in 0..H {
                    let wt = _mm256_broadcast_ss(&*w.add(h * n + i));
                    acc[h] = _mm256_fmadd_ps(wt, vf, acc[h]);
                }
            }
            for h in 0..H {
                _mm256_storeu_ps(o.add(h * d + c), acc[h]);
            }
        }
    }

    /// The sums of the 16 lanes of each of `v` (4 registers) in lanes 0, 4, 8
    /// and 12 (each 128-bit lane holds its register's sum in every position).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sum4(v: [__m512; 4]) -> __m512 {
        // [a0+a2, a1+a3, b0+b2, b1+b3] by 128-bit lanes, then c and d likewise.
        let ab = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(v[0], v[1]),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(v[0], v[1]),
        );
        let cd = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(v[2], v[3]),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(v[2], v[3]),
        );
        // [a, b, c, d] as 4-value partial sums, one per 128-bit lane.
        let x = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd),
        );
        let x = _mm512_add_ps(x, _mm512_permute_ps::<0b01_00_11_10>(x));
        _mm512_add_ps(x, _mm512_permute_ps::<0b10_11_00_01>(x))
    }

    /// 16 int8 codes at `p` as f32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn codes16(p: *const i8) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)))
    }

    /// Scores of `H` (1 or 4) heads `qs` (`H` rows of `16 · C`) at every slot
    /// into `scores` as `[slot][H]`: each key row converted once for the heads.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn scores_512<const H: usize, const C: usize>(
        qs: &[f32],
        kv: &KvHeadView,
        slots: &[usize],
        scores: &mut [f32],
    ) {
        let d = 16 * C;
        let inv = 1.0 / (d as f32).sqrt();
        let mut q = [[_mm512_setzero_ps(); C]; H];
        for h in 0..H {
            for c in 0..C {
                q[h][c] = _mm512_loadu_ps(qs.as_ptr().add(h * d + 16 * c));
            }
        }
        // Lanes 0, 4, 8, 12 (the heads' sums after `sum4`) to lanes 0..4.
        let pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        let out = scores.as_mut_ptr();
        for (i, &slot) in slots.iter().enumerate() {
            let k = kv.k.as_ptr().add(slot * d);
            let mut acc = [_mm512_setzero_ps(); 4];
            for c in 0..C {
                let kf = codes16(k.add(16 * c));
                for h in 0..H {
                    acc[h] = _mm512_fmadd_ps(q[h][c], kf, acc[h]);
                }
            }
            let scale = *kv.k_scale.get_unchecked(slot) * inv;
            if H == 4 {
                let x = _mm512_permutexvar_ps(pick, sum4(acc));
                let x = _mm_mul_ps(_mm512_castps512_ps128(x), _mm_set1_ps(scale));
                _mm_storeu_ps(out.add(4 * i), x);
            } else {
                *out.add(i) = _mm512_reduce_add_ps(acc[0]) * scale;
            }
        }
    }

    /// The maximum (`MAX`) or the sum of the 16 / H slots of each head in `v`
    /// (`[slot][H]` lanes): every lane ends with its head's result.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fold<const H: usize, const MAX: bool>(v: __m512) -> __m512 {
        let op = |a, b| {
            if MAX {
                _mm512_max_ps(a, b)
            } else {
                _mm512_add_ps(a, b)
            }
        };
        let v = op(v, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v));
        let v = op(v, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
        if H == 1 {
            let v = op(v, _mm512_permute_ps::<0b01_00_11_10>(v));
            op(v, _mm512_permute_ps::<0b10_11_00_01>(v))
        } else {
            v
        }
    }

    /// Softmax over the slots of each of the `H` (1 or 4) heads of `scores`
    /// (`[slot][H]`), the maximum subtracted: the weights, not yet times the
    /// value scales.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn softmax_512<const H: usize>(scores: &mut [f32]) {
        // 16 values hold 16 / H slots of every head; the tail is per value.
        let body = scores.len() / 16 * 16;
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        for c in scores[..body].chunks_exact(16) {
            // `max` keeps its second operand when the first is NaN, as `f32::max`.
            m = _mm512_max_ps(_mm512_loadu_ps(c.as_ptr()), m);
        }
        let mut mx = [0.0f32; 16];
        _mm512_storeu_ps(mx.as_mut_ptr(), fold::<H, true>(m));
        for (j, &v) in scores[body..].iter().enumerate() {
            mx[j % H] = mx[j % H].max(v);
        }
        for j in 0..16 {
            mx[j] = mx[j % H];
        }
        let m = _mm512_loadu_ps(mx.as_ptr());
        for c in scores[..body].chunks_exact_mut(16) {
            _mm512_storeu_ps(
                c.as_mut_ptr(),
                _mm512_sub_ps(_mm512_loadu_ps(c.as_ptr()), m),
            );
        }
        for (j, v) in scores[body..].iter_mut().enumerate() {
            *v -= mx[j % H];
        }
        crate::kernels::vmath::x86::exp_slice_512(scores);
        let mut t = _mm512_setzero_ps();
        for c in scores[..body].chunks_exact(16) {
            t = _mm512_add_ps(t, _mm512_loadu_ps(c.as_ptr()));
        }
        let mut total = [0.0f32; 16];
        _mm512_storeu_ps(total.as_mut_ptr(), fold::<H, false>(t));
        for (j, &v) in scores[body..].iter().enumerate() {
            total[j % H] += v;
        }
        for j in 0..H {
            total[j] = 1.0 / total[j];
        }
        for j in H..16 {
            total[j] = total[j % H];
        }
        let inv = _mm512_loadu_ps(total.as_ptr());
        for c in scores[..body].chunks_exact_mut(16) {
            _mm512_storeu_ps(
                c.as_mut_ptr(),
                _mm512_mul_ps(_mm512_loadu_ps(c.as_ptr()), inv),
            );
        }
        for (j, v) in scores[body..].iter_mut().enumerate() {
            *v *= total[j % H];
        }
    }

    /// Outputs of `H` (1 or 4) heads from their softmax weights `w`
    /// (`[slot][H]`): each value row converted and scaled once for the heads.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn values_512<const H: usize, const C: usize>(
        w: &[f32],
        kv: &KvHeadView,
        slots: &[usize],
        out: &mut [f32],
    ) {
        let d = 16 * C;
        let mut acc = [[_mm512_setzero_ps(); C]; H];
        for (i, &slot) in slots.iter().enumerate() {
            let v = kv.v.as_ptr().add(slot * d);
            let vs = _mm512_set1_ps(*kv.v_scale.get_unchecked(slot));
            let mut vf = [_mm512_setzero_ps(); C];
            for c in 0..C {
                vf[c] = _mm512_mul_ps(codes16(v.add(16 * c)), vs);
            }
            for h in 0..H {
                let wh = _mm512_set1_ps(*w.get_unchecked(i * H + h));
                for c in 0..C {
                    acc[h][c] = _mm512_fmadd_ps(wh, vf[c], acc[h][c]);
                }
            }
        }
        for h in 0..H {
            for c in 0..C {
                _mm512_storeu_ps(out.as_mut_ptr().add(h * d + 16 * c), acc[h][c]);
            }
        }
    }

    /// The heads of a group, four at a time (then one at a time), for a head
    /// width of `16 · C`; head block `h0 ..` keeps its scores at `h0 · n ..`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    unsafe fn group_512<const C: usize>(
        qs: &[f32],
        kv: &KvHeadView,
        slots: &[usize],
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let d = 16 * C;
        let (g, n) = (qs.len() / d, slots.len());
        let mut h = 0;
        while h < g {
            let (q, o) = (&qs[h * d..], &mut out[h * d..]);
            if h + 4 <= g {
                let s = &mut scores[h * n..(h + 4) * n];
                scores_512::<4, C>(q, kv, slots, s);
                softmax_512::<4>(s);
                values_512::<4, C>(s, kv, slots, o);
                h += 4;
            } else {
                let s = &mut scores[h * n..(h + 1) * n];
                scores_512::<1, C>(q, kv, slots, s);
                softmax_512::<1>(s);
                values_512::<1, C>(s, kv, slots, o);
                h += 1;
            }
        }
    }

    /// [`super::attend_group`] with AVX-512: `d % 16 == 0`, `scores.len() ==
    /// heads · slots.len()`. Head widths of 16 to 128 keep a head's query and
    /// accumulators in registers; wider ones run the 8-lane path.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    pub(super) unsafe fn attend_group_512(
        qs: &[f32],
        d: usize,
        kv: &KvHeadView,
        slots: &[usize],
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        match d / 16 {
            1 => group_512::<1>(qs, kv, slots, scores, out),
            2 => group_512::<2>(qs, kv, slots, scores, out),
            4 => group_512::<4>(qs, kv, slots, scores, out),
            8 => group_512::<8>(qs, kv, slots, scores, out),
            _ => attend_group(qs, d, kv, slots, scores, out),
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
            softmax(s, kv, slots);
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
