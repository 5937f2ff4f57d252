//! The x86 SIMD bodies of [`super::attend_group`]: AVX2 (8 lanes, up to 4
//! heads a pass) and AVX-512 (16 lanes, whole groups of 2, 4 or 8 heads).

// Index loops over small register arrays read clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]
use super::{KvHeadView, WideRows};
use crate::host::simd::x86::hsum8;
use crate::kernels::vmath::x86::exp_slice;
use std::arch::x86_64::*;

/// 8 int8 codes at `p` as f32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn codes8(p: *const i8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// Scores of up to 4 heads (`qs` rows `h0 .. h0 + H`) at every slot, two
/// slots at a time (`2·H` independent FMA chains: one slot's `H` chains
/// alone wait on the FMA latency), the last alone when their count is odd.
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
    let mut i = 0;
    while i + 2 <= slots.len() {
        scores_at::<H, 2>(qs, h0, d, kv, slots, i, scores);
        i += 2;
    }
    if i < slots.len() {
        scores_at::<H, 1>(qs, h0, d, kv, slots, i, scores);
    }
}

/// [`scores`] of the `S` slots `slots[i .. i + S]`: `S·H` FMA chains, each
/// slot's sum in the order of one.
#[inline(always)]
unsafe fn scores_at<const H: usize, const S: usize>(
    qs: &[f32],
    h0: usize,
    d: usize,
    kv: &KvHeadView,
    slots: &[usize],
    i: usize,
    scores: &mut [f32],
) {
    let n = slots.len();
    let q = qs.as_ptr().add(h0 * d);
    let slot: [usize; S] = std::array::from_fn(|j| *slots.get_unchecked(i + j));
    let mut acc = [[_mm256_setzero_ps(); H]; S];
    for c in (0..d).step_by(8) {
        let kf: [__m256; S] = std::array::from_fn(|j| codes8(kv.k.as_ptr().add(slot[j] * d + c)));
        for h in 0..H {
            let qv = _mm256_loadu_ps(q.add(h * d + c));
            for j in 0..S {
                acc[j][h] = _mm256_fmadd_ps(qv, kf[j], acc[j][h]);
            }
        }
    }
    let inv = 1.0 / (d as f32).sqrt();
    for j in 0..S {
        let ks = *kv.k_scale.get_unchecked(slot[j]);
        for h in 0..H {
            *scores.get_unchecked_mut((h0 + h) * n + i + j) = hsum8(acc[j][h]) * ks * inv;
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
/// the value scales), 16 dimensions at a time where `d` allows, the last 8
/// alone.
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
    let mut c = 0;
    while c + 16 <= d {
        values_at::<H, 2>(w, h0, d, kv, slots, c, out);
        c += 16;
    }
    if c < d {
        values_at::<H, 1>(w, h0, d, kv, slots, c, out);
    }
}

/// [`values`] of the `8·C` dimensions from `c`: `C·H` FMA chains, each
/// weight broadcast once for all `C`; each output summed over the slots in
/// order.
#[inline(always)]
unsafe fn values_at<const H: usize, const C: usize>(
    w: &[f32],
    h0: usize,
    d: usize,
    kv: &KvHeadView,
    slots: &[usize],
    c: usize,
    out: &mut [f32],
) {
    let n = slots.len();
    let w = w.as_ptr().add(h0 * n);
    let o = out.as_mut_ptr().add(h0 * d + c);
    let mut acc = [[_mm256_setzero_ps(); H]; C];
    for (i, &slot) in slots.iter().enumerate() {
        let v = kv.v.as_ptr().add(slot * d + c);
        let vf: [__m256; C] = std::array::from_fn(|j| codes8(v.add(8 * j)));
        for h in 0..H {
            let wt = _mm256_broadcast_ss(&*w.add(h * n + i));
            for j in 0..C {
                acc[j][h] = _mm256_fmadd_ps(wt, vf[j], acc[j][h]);
            }
        }
    }
    for j in 0..C {
        for h in 0..H {
            _mm256_storeu_ps(o.add(h * d + 8 * j), acc[j][h]);
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

/// Where the 512-bit kernel reads a row's keys and values: the int8 codes,
/// converted at every read ([`Codes`]), or the rows widened to f32 once for
/// many reads ([`Wide`]). The same values either way. `at` is the first of
/// 16 values (`slot · head_dim + 16c`).
trait Rows: Copy {
    /// Key lanes `at .. at + 16` (the codes as f32).
    unsafe fn key(self, at: usize) -> __m512;
    /// Value lanes `at .. at + 16` of row `slot`, `Vscale · Vcode`.
    unsafe fn value(self, slot: usize, at: usize) -> __m512;
    /// Row `slot`'s key scale.
    unsafe fn k_scale(self, slot: usize) -> f32;
}

/// The int8 rows of a view.
#[derive(Clone, Copy)]
struct Codes<'v>(&'v KvHeadView<'v>);

impl Rows for Codes<'_> {
    #[inline(always)]
    unsafe fn key(self, at: usize) -> __m512 {
        codes16(self.0.k.as_ptr().add(at))
    }
    #[inline(always)]
    unsafe fn value(self, slot: usize, at: usize) -> __m512 {
        let vs = _mm512_set1_ps(*self.0.v_scale.get_unchecked(slot));
        _mm512_mul_ps(codes16(self.0.v.as_ptr().add(at)), vs)
    }
    #[inline(always)]
    unsafe fn k_scale(self, slot: usize) -> f32 {
        *self.0.k_scale.get_unchecked(slot)
    }
}

/// A view's rows widened to f32 ([`super::WideRows`]).
#[derive(Clone, Copy)]
struct Wide<'v>(WideRows<'v>, &'v [f32]);

impl Rows for Wide<'_> {
    #[inline(always)]
    unsafe fn key(self, at: usize) -> __m512 {
        _mm512_loadu_ps(self.0.k.as_ptr().add(at))
    }
    #[inline(always)]
    unsafe fn value(self, _slot: usize, at: usize) -> __m512 {
        _mm512_loadu_ps(self.0.v.as_ptr().add(at))
    }
    #[inline(always)]
    unsafe fn k_scale(self, slot: usize) -> f32 {
        *self.1.get_unchecked(slot)
    }
}

/// The head widths (`16 · C`) the 512-bit kernel runs; others take the
/// 8-lane path.
pub(super) fn runs_width(d: usize) -> bool {
    matches!(d, 16 | 32 | 64 | 128)
}

/// Where head `h`'s score or weight at slot `i` (of `n`) lies for `H` heads
/// at once: `[slot][H]` for 1 and 4 heads; `[head][slot]` for a pair, whose
/// heads keep the single head's sums and softmax, each as if alone.
#[inline(always)]
fn at<const H: usize>(h: usize, i: usize, n: usize) -> usize {
    if H == 2 {
        h * n + i
    } else {
        i * H + h
    }
}

/// Scores of `H` (1, 2 or 4) heads `qs` (`H` rows of `16 · C`) at every slot
/// into `scores` laid out as [`at`] says: each key row converted once for the
/// heads. Every score's sixteen lanes are summed by [`sum4`]'s tree, four sums
/// at once (four heads of a slot, a pair of heads at two slots, or one head at
/// four slots), so a head's scores are the same whichever heads run with it.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scores_512<const H: usize, const C: usize>(
    qs: &[f32],
    kv: impl Rows,
    slots: &[usize],
    scores: &mut [f32],
) {
    let d = 16 * C;
    let mut q = [[_mm512_setzero_ps(); C]; H];
    for h in 0..H {
        for c in 0..C {
            q[h][c] = _mm512_loadu_ps(qs.as_ptr().add(h * d + 16 * c));
        }
    }
    let (n, per) = (slots.len(), 4 / H);
    let mut i = 0;
    while i + per <= n {
        scores_step::<H, C>(&q, kv, slots, i, per, scores);
        i += per;
    }
    if i < n {
        scores_step::<H, C>(&q, kv, slots, i, n - i, scores);
    }
}

/// [`scores_512`] at the `m ≤ 4 / H` slots from `i`: the `m · H` sums in
/// [`sum4`]'s lanes 0, 4, 8, 12 (the rest zero), scaled per slot.
#[inline(always)]
unsafe fn scores_step<const H: usize, const C: usize>(
    q: &[[__m512; C]; H],
    kv: impl Rows,
    slots: &[usize],
    i: usize,
    m: usize,
    scores: &mut [f32],
) {
    let (d, n) = (16 * C, slots.len());
    let inv = 1.0 / (d as f32).sqrt();
    // Lanes 0, 4, 8, 12 (the sums after `sum4`) to lanes 0..4.
    let pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    let mut acc = [_mm512_setzero_ps(); 4];
    for j in 0..m {
        let slot = *slots.get_unchecked(i + j);
        for c in 0..C {
            let kf = kv.key(slot * d + 16 * c);
            for h in 0..H {
                acc[j * H + h] = _mm512_fmadd_ps(q[h][c], kf, acc[j * H + h]);
            }
        }
    }
    let x = _mm512_castps512_ps128(_mm512_permutexvar_ps(pick, sum4(acc)));
    if H > 1 && m * H == 4 {
        // A whole step of several heads: lane `j·H + h` is head h at slot
        // i + j; each lane times its slot's scale (the products the loop
        // below forms), then stored as `at` lays the step out: four
        // consecutive values, or for a pair head 0's two slots (lanes 0, 2)
        // and head 1's (lanes 1, 3). (One head's four scales as a vector
        // cost more shuffles than the loop: measured 10-15% slower.)
        let sc = |j: usize| kv.k_scale(*slots.get_unchecked(i + j)) * inv;
        let x = _mm_mul_ps(x, _mm_setr_ps(sc(0), sc(1 / H), sc(2 / H), sc(3 / H)));
        let p = scores.as_mut_ptr();
        if H != 2 {
            return _mm_storeu_ps(p.add(at::<H>(0, i, n)), x);
        }
        let x = _mm_castps_pd(_mm_shuffle_ps::<0b11_01_10_00>(x, x));
        _mm_storel_pd(p.add(at::<H>(0, i, n)) as *mut f64, x);
        return _mm_storeh_pd(p.add(at::<H>(1, i, n)) as *mut f64, x);
    }
    // One head's slots, and the last slots of several (fewer than a step),
    // one by one.
    let mut sums = [0.0f32; 4];
    _mm_storeu_ps(sums.as_mut_ptr(), x);
    for j in 0..m {
        let scale = kv.k_scale(*slots.get_unchecked(i + j)) * inv;
        for h in 0..H {
            *scores.get_unchecked_mut(at::<H>(h, i + j, n)) = sums[j * H + h] * scale;
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

/// Outputs of `H` (1, 2 or 4) heads from their softmax weights `w` (laid out
/// as [`at`] says): each value row converted and scaled once for the heads.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn values_512<const H: usize, const C: usize>(
    w: &[f32],
    kv: impl Rows,
    slots: &[usize],
    out: &mut [f32],
) {
    let d = 16 * C;
    let mut acc = [[_mm512_setzero_ps(); C]; H];
    for (i, &slot) in slots.iter().enumerate() {
        let mut vf = [_mm512_setzero_ps(); C];
        for c in 0..C {
            vf[c] = kv.value(slot, slot * d + 16 * c);
        }
        for h in 0..H {
            let wh = _mm512_set1_ps(*w.get_unchecked(at::<H>(h, i, slots.len())));
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

/// The heads of a group, four at a time, then a pair (each head's values as
/// alone), then one at a time, for a head width of `16 · C`; head block
/// `h0 ..` keeps its scores at `h0 · n ..`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn group_512<const C: usize>(
    qs: &[f32],
    kv: impl Rows,
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
        } else if h + 2 <= g {
            let s = &mut scores[h * n..(h + 2) * n];
            scores_512::<2, C>(q, kv, slots, s);
            softmax_512::<1>(&mut s[..n]);
            softmax_512::<1>(&mut s[n..]);
            values_512::<2, C>(s, kv, slots, o);
            h += 2;
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
    /// [`group_512`] at this head width, reading `rows`.
    #[inline(always)]
    unsafe fn by_width(
        qs: &[f32],
        d: usize,
        rows: impl Rows,
        slots: &[usize],
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        match d / 16 {
            1 => group_512::<1>(qs, rows, slots, scores, out),
            2 => group_512::<2>(qs, rows, slots, scores, out),
            4 => group_512::<4>(qs, rows, slots, scores, out),
            _ => group_512::<8>(qs, rows, slots, scores, out),
        }
    }
    if !runs_width(d) {
        return attend_group(qs, d, kv, slots, scores, out);
    }
    match kv.wide {
        Some(w) => by_width(qs, d, Wide(w, kv.k_scale), slots, scores, out),
        None => by_width(qs, d, Codes(kv), slots, scores, out),
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
