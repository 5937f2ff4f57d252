//! mHC lane routing (SPEC §4.3 steps 3, 4, 8 and 9): gates, the log-space Sinkhorn
//! router, and the CPU twins of shaders/mhc.wgsl's entry points
//! (`crate::gpu::kernels::mhc`): [`premix`] (`premix`: pre-mix and engram gate)
//! and [`route`] (`route`: Sinkhorn routing and the lane update).

use super::norm::inv_rms_wide;
use super::sigmoid;

/// An engram site's inputs to [`premix`] (SPEC §4.3 step 4): the site's key and
/// value for this position and its two gate norms, `hidden` values each.
#[derive(Debug, Clone, Copy)]
pub struct EngramGate<'a> {
    /// `key` of the site (SPEC §4.2).
    pub key: &'a [f32],
    /// `value` of the site (SPEC §4.2).
    pub value: &'a [f32],
    /// `norm_u` of the site.
    pub norm_u: &'a [f32],
    /// `norm_k` of the site.
    pub norm_k: &'a [f32],
}

crate::host::simd::simd_fn! {
    /// CPU twin of the GPU `premix` entry point (shaders/mhc.wgsl,
    /// `MhcKernels::premix`, inputs as `PremixParams`): SPEC §4.3 step 3,
    /// `hpre[i] = σ(a_pre·p_pre[i] + b_pre[i] + off(i))` and
    /// `u = Σ_i hpre[i] · lanes[i]` (i ascending from 0), then step 4, `b = u` and at
    /// an engram site (`site`) `b += α · value` with
    /// `α = σ(⟨zcrms(u, norm_u), zcrms(key, norm_k)⟩ / sqrt(hidden))`. `a_pre` is
    /// layer `layer`'s value, `b_pre` its 4 values, `p_pre` its 4 projections,
    /// `lanes` the 4 lanes (`4 · hidden`); writes `u` and `b` (`hidden` each).
    ///
    /// # Panics
    /// If the lengths disagree.
    #[allow(clippy::too_many_arguments)]
    pub fn premix(
        layer: usize,
        a_pre: f32,
        b_pre: &[f32],
        p_pre: &[f32],
        lanes: &[f32],
        site: Option<EngramGate<'_>>,
        u: &mut [f32],
        b: &mut [f32],
    ) {
        let h = u.len();
        assert!(lanes.len() == 4 * h && b.len() == h, "premix: lengths");
        let hpre = pre_gates(layer, a_pre, p_pre, b_pre);
        u.fill(0.0);
        for (i, lane) in lanes.chunks_exact(h).enumerate() {
            for (u, x) in u.iter_mut().zip(lane) {
                *u += hpre[i] * x;
            }
        }
        b.copy_from_slice(u);
        if let Some(s) = site {
            assert!(
                s.key.len() == h && s.value.len() == h && s.norm_u.len() == h && s.norm_k.len() == h,
                "premix: site lengths"
            );
            // ⟨zcrms(u, norm_u), zcrms(key, norm_k)⟩, each factor as `zcrms_into` forms it.
            let (ru, rk) = (inv_rms_wide(u), inv_rms_wide(s.key));
            let dot: f32 = u
                .iter()
                .zip(s.norm_u)
                .zip(s.key.iter().zip(s.norm_k))
                .map(|((x, g), (y, gk))| (x * ru * (1.0 + g)) * (y * rk * (1.0 + gk)))
                .sum();
            let alpha = sigmoid(dot * (1.0 / (h as f32).sqrt()));
            for (b, v) in b.iter_mut().zip(s.value) {
                *b += alpha * v;
            }
        }
    }
}

/// CPU twin of the GPU `route` entry point (shaders/mhc.wgsl, `MhcKernels::route`,
/// inputs as `RouteParams`): SPEC §4.3 steps 8–9, `hpost` from `a_post`, `b_post`
/// (4) and `p_post` (4), `route` = [`sinkhorn_route`] of `a_res`, `b_res` (16) and
/// `p_res` (16) over `iters` rounds, then in place on the 4 lanes
/// (`4 · hidden`, `hidden = update.len()`)
/// `lanes'[i] = Σ_j route[i][j] · lanes[j] + hpost[i] · update`. Returns the route
/// (what the GPU writes at `route_out`).
///
/// # Panics
/// If the lengths disagree.
#[allow(clippy::too_many_arguments)]
pub fn route(
    layer: usize,
    a_post: f32,
    b_post: &[f32],
    a_res: f32,
    b_res: &[f32],
    iters: usize,
    p_post: &[f32],
    p_res: &[f32],
    update: &[f32],
    lanes: &mut [f32],
) -> [[f32; 4]; 4] {
    let hpost = post_gates(layer, a_post, p_post, b_post);
    let r = sinkhorn_route(a_res, p_res, b_res, iters);
    mix_lanes(&hpost, &r, update, lanes);
    r
}

crate::host::simd::simd_fn! {
    /// SPEC §4.3 step 9 in place on the 4 lanes (`4 · hidden`, `hidden =
    /// update.len()`): `lanes'[i] = Σ_j route[i][j] · lanes[j] + hpost[i] · update`
    /// (the sum in `j` order, then the update).
    ///
    /// # Panics
    /// If the lengths disagree.
    pub fn mix_lanes(hpost: &[f32; 4], r: &[[f32; 4]; 4], update: &[f32], lanes: &mut [f32]) {
        let h = update.len();
        assert_eq!(lanes.len(), 4 * h, "route: lanes");
        let (l0, rest) = lanes.split_at_mut(h);
        let (l1, rest) = rest.split_at_mut(h);
        let (l2, l3) = rest.split_at_mut(h);
        let mix = |i: usize, a: f32, b: f32, c: f32, d: f32, o: f32| {
            let [r0, r1, r2, r3] = r[i];
            (((r0 * a + r1 * b) + r2 * c) + r3 * d) + hpost[i] * o
        };
        for ((((x0, x1), x2), x3), &o) in l0.iter_mut().zip(l1).zip(l2).zip(l3).zip(update) {
            let (a, b, c, d) = (*x0, *x1, *x2, *x3);
            *x0 = mix(0, a, b, c, d, o);
            *x1 = mix(1, a, b, c, d, o);
            *x2 = mix(2, a, b, c, d, o);
            *x3 = mix(3, a, b, c, d, o);
        }
    }
}

/// `off(i)`: `+4` for the lane `l mod 4`, `−4` for the others.
#[inline]
pub fn lane_offset(layer: usize, lane: usize) -> f32 {
    if lane == layer % 4 {
        4.0
    } else {
        -4.0
    }
}

/// `hpre[i] = σ(a·p[i] + b[i] + off(i))`.
pub fn pre_gates(layer: usize, a: f32, p: &[f32], b: &[f32]) -> [f32; 4] {
    std::array::from_fn(|i| sigmoid(a * p[i] + b[i] + lane_offset(layer, i)))
}

/// `hpost[i] = 2 · σ(a·p[i] + b[i] + off(i))`.
pub fn post_gates(layer: usize, a: f32, p: &[f32], b: &[f32]) -> [f32; 4] {
    std::array::from_fn(|i| 2.0 * sigmoid(a * p[i] + b[i] + lane_offset(layer, i)))
}

/// `lse(v) = m + ln Σ exp(v − m)` with `m = max(v)`.
#[inline]
pub fn lse4(v: [f32; 4]) -> f32 {
    let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    m + v.iter().map(|x| (x - m).exp()).sum::<f32>().ln()
}

/// `route = exp(L)` after `iters` rounds of (rows −= lse, then columns −= lse) on
/// `L[i][j] = a·p[4i+j] + b[4i+j]`. Columns of the result sum to 1. One token
/// of [`sinkhorn_routes`] (the same values as among a chunk's tokens).
pub fn sinkhorn_route(a: f32, p: &[f32], b: &[f32], iters: usize) -> [[f32; 4]; 4] {
    let mut out = [0.0f32; 16];
    sinkhorn_routes(a, &p[..16], b, iters, &mut out);
    std::array::from_fn(|i| std::array::from_fn(|j| out[4 * i + j]))
}

/// [`sinkhorn_route`] of `n` tokens: `p` and `out` are `[n, 16]`, `b` the 16
/// biases. With SIMD the tokens are the lanes (16 or 8 at a time), so every
/// token gets the values it would get alone; with scalar kernels each token is
/// [`lse4`] per row and column, `f32::exp` and `f32::ln`.
///
/// # Panics
/// If `p` and `out` differ in length or are not whole tokens, or `b` has fewer
/// than 16 values.
pub fn sinkhorn_routes(a: f32, p: &[f32], b: &[f32], iters: usize, out: &mut [f32]) {
    assert!(
        p.len() == out.len() && p.len().is_multiple_of(16) && b.len() >= 16,
        "sinkhorn: lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::host::simd::CpuSimd::selected() != crate::host::simd::CpuSimd::Scalar {
        // SAFETY: a non-scalar selection implies AVX2 and FMA (AVX-512F for
        // the wide form).
        unsafe { x86::sinkhorn_routes(a, p, &b[..16], iters, out) };
        return;
    }
    for (p, out) in p.chunks_exact(16).zip(out.chunks_exact_mut(16)) {
        let mut l: [[f32; 4]; 4] =
            std::array::from_fn(|i| std::array::from_fn(|j| a * p[4 * i + j] + b[4 * i + j]));
        for _ in 0..iters {
            for row in l.iter_mut() {
                let s = lse4(*row);
                row.iter_mut().for_each(|v| *v -= s);
            }
            for j in 0..4 {
                let s = lse4([l[0][j], l[1][j], l[2][j], l[3][j]]);
                l.iter_mut().for_each(|row| row[j] -= s);
            }
        }
        for (o, v) in out.iter_mut().zip(l.iter().flatten()) {
            *o = v.exp();
        }
    }
}

/// The Sinkhorn router with the tokens in the lanes of a register.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::kernels::vmath::x86::{exp, ln, Lanes};
    use std::arch::x86_64::*;

    /// `x[k] −= lse(x[k] for k in idx)` for the four entries `idx`:
    /// `lse = m + ln((e0 + e1) + (e2 + e3))`, `m` their maximum (the order
    /// [`one`]'s register trees give too).
    #[inline(always)]
    unsafe fn half<V: Lanes>(l: &mut [V; 16], idx: [usize; 4]) {
        unsafe {
            let m = l[idx[0]].max(l[idx[1]]).max(l[idx[2]]).max(l[idx[3]]);
            // (Plain statements, not closures: the intrinsics stay inline.)
            let e0 = exp(l[idx[0]].sub(m));
            let e1 = exp(l[idx[1]].sub(m));
            let e2 = exp(l[idx[2]].sub(m));
            let e3 = exp(l[idx[3]].sub(m));
            let lse = m.add(ln(e0.add(e1).add(e2.add(e3))));
            for k in idx {
                l[k] = l[k].sub(lse);
            }
        }
    }

    /// The routes of up to `V::N` tokens (`p`, `out`: `[tokens, 16]`): the
    /// tokens transposed into the lanes, the rounds, and back.
    #[inline(always)]
    unsafe fn group<V: Lanes>(a: f32, p: &[f32], b: &[f32], iters: usize, out: &mut [f32]) {
        unsafe {
            let tokens = p.len() / 16;
            // Entry k of every token (the last token repeated in unused lanes).
            let mut t = [[0.0f32; 16]; 16];
            for (k, tk) in t.iter_mut().enumerate() {
                for (lane, v) in tk.iter_mut().enumerate().take(V::N) {
                    *v = p[16 * lane.min(tokens - 1) + k];
                }
            }
            let av = V::splat(a);
            let mut l = [av; 16];
            for (k, lk) in l.iter_mut().enumerate() {
                *lk = V::load(t[k].as_ptr()).mul(av).add(V::splat(b[k]));
            }
            for _ in 0..iters {
                for i in 0..4 {
                    half(&mut l, [4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3]);
                }
                for j in 0..4 {
                    half(&mut l, [j, 4 + j, 8 + j, 12 + j]);
                }
            }
            for (k, tk) in t.iter_mut().enumerate() {
                exp(l[k]).store(tk.as_mut_ptr());
            }
            for lane in 0..tokens {
                for k in 0..16 {
                    out[16 * lane + k] = t[k][lane];
                }
            }
        }
    }

    /// One token's route with its 16 entries in one register (row-major: row
    /// `i` in lanes `4i .. 4i + 4`), each half-round's reductions as trees of
    /// lane swaps: lane for lane the operations of [`group`]'s [`half`], so
    /// the same values.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn one_512(a: f32, p: &[f32], b: &[f32], iters: usize, out: &mut [f32]) {
        unsafe {
            let mut l = _mm512_add_ps(
                _mm512_mul_ps(_mm512_loadu_ps(p.as_ptr()), _mm512_set1_ps(a)),
                _mm512_loadu_ps(b.as_ptr()),
            );
            // Rows: lanes 1 and 2 apart inside a 128-bit lane; columns: 128-bit
            // lanes 1 and 2 apart.
            let half = |l: __m512, row: bool| {
                let (m, e) = if row {
                    let m = _mm512_max_ps(l, _mm512_permute_ps::<0b10_11_00_01>(l));
                    let m = _mm512_max_ps(m, _mm512_permute_ps::<0b01_00_11_10>(m));
                    let e = exp(_mm512_sub_ps(l, m));
                    let e = _mm512_add_ps(e, _mm512_permute_ps::<0b10_11_00_01>(e));
                    (m, _mm512_add_ps(e, _mm512_permute_ps::<0b01_00_11_10>(e)))
                } else {
                    let m = _mm512_max_ps(l, _mm512_shuffle_f32x4::<0b10_11_00_01>(l, l));
                    let m = _mm512_max_ps(m, _mm512_shuffle_f32x4::<0b01_00_11_10>(m, m));
                    let e = exp(_mm512_sub_ps(l, m));
                    let e = _mm512_add_ps(e, _mm512_shuffle_f32x4::<0b10_11_00_01>(e, e));
                    (
                        m,
                        _mm512_add_ps(e, _mm512_shuffle_f32x4::<0b01_00_11_10>(e, e)),
                    )
                };
                _mm512_sub_ps(l, _mm512_add_ps(m, ln(e)))
            };
            for _ in 0..iters {
                l = half(l, true);
                l = half(l, false);
            }
            _mm512_storeu_ps(out.as_mut_ptr(), exp(l));
        }
    }

    /// [`one_512`] with the 16 entries in two 8-lane registers (rows 0–1 and
    /// 2–3): the same operations lane by lane, so the same values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn one_256(a: f32, p: &[f32], b: &[f32], iters: usize, out: &mut [f32]) {
        unsafe {
            let init = |k: usize| {
                _mm256_add_ps(
                    _mm256_mul_ps(_mm256_loadu_ps(p.as_ptr().add(k)), _mm256_set1_ps(a)),
                    _mm256_loadu_ps(b.as_ptr().add(k)),
                )
            };
            let mut l = [init(0), init(8)];
            let swap1 = |v: __m256| _mm256_permute_ps::<0b10_11_00_01>(v);
            let swap2 = |v: __m256| _mm256_permute_ps::<0b01_00_11_10>(v);
            let swap_rows = |v: __m256| _mm256_permute2f128_ps::<0x01>(v, v);
            for _ in 0..iters {
                // Rows: inside each 128-bit lane.
                for v in l.iter_mut() {
                    let m = _mm256_max_ps(*v, swap1(*v));
                    let m = _mm256_max_ps(m, swap2(m));
                    let e = exp(_mm256_sub_ps(*v, m));
                    let e = _mm256_add_ps(e, swap1(e));
                    let e = _mm256_add_ps(e, swap2(e));
                    *v = _mm256_sub_ps(*v, _mm256_add_ps(m, ln(e)));
                }
                // Columns: rows 0 and 1 (2 and 3) across the 128-bit lanes of
                // a register, then the two registers.
                let m: [__m256; 2] = [
                    _mm256_max_ps(l[0], swap_rows(l[0])),
                    _mm256_max_ps(l[1], swap_rows(l[1])),
                ];
                let m = [_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[1], m[0])];
                let e = [
                    exp(_mm256_sub_ps(l[0], m[0])),
                    exp(_mm256_sub_ps(l[1], m[1])),
                ];
                let e = [
                    _mm256_add_ps(e[0], swap_rows(e[0])),
                    _mm256_add_ps(e[1], swap_rows(e[1])),
                ];
                let e = [_mm256_add_ps(e[0], e[1]), _mm256_add_ps(e[1], e[0])];
                for k in 0..2 {
                    l[k] = _mm256_sub_ps(l[k], _mm256_add_ps(m[k], ln(e[k])));
                }
            }
            _mm256_storeu_ps(out.as_mut_ptr(), exp(l[0]));
            _mm256_storeu_ps(out.as_mut_ptr().add(8), exp(l[1]));
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn routes_256(a: f32, p: &[f32], b: &[f32], iters: usize, out: &mut [f32]) {
        for (p, o) in p.chunks(16 * 8).zip(out.chunks_mut(16 * 8)) {
            // SAFETY: the features are enabled here.
            unsafe { group::<__m256>(a, p, b, iters, o) };
        }
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn routes_512(a: f32, p: &[f32], b: &[f32], iters: usize, out: &mut [f32]) {
        for (p, o) in p.chunks(16 * 16).zip(out.chunks_mut(16 * 16)) {
            // SAFETY: the features are enabled here.
            unsafe { group::<__m512>(a, p, b, iters, o) };
        }
    }

    /// [`super::sinkhorn_routes`] with the tokens in the lanes.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, and AVX-512F when it is the selected level.
    pub(super) unsafe fn sinkhorn_routes(
        a: f32,
        p: &[f32],
        b: &[f32],
        iters: usize,
        out: &mut [f32],
    ) {
        unsafe {
            if crate::host::simd::CpuSimd::selected() == crate::host::simd::CpuSimd::Avx512 {
                // Up to 3 tokens: each in one register (latency-bound, but 1/4 of
                // the work of a register of tokens for one token; measured on Zen 5:
                // 1.66 µs a token alone, 5.2-5.3 µs for a register of 4 to 16).
                if p.len() < 16 * 4 {
                    for (p, o) in p.chunks_exact(16).zip(out.chunks_exact_mut(16)) {
                        one_512(a, p, b, iters, o);
                    }
                    return;
                }
                routes_512(a, p, b, iters, out);
            } else if p.len() < 16 * 4 {
                for (p, o) in p.chunks_exact(16).zip(out.chunks_exact_mut(16)) {
                    one_256(a, p, b, iters, o);
                }
            } else {
                routes_256(a, p, b, iters, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` tokens of Φ logits, with some large ones (entries far apart).
    fn logits(n: usize) -> Vec<f32> {
        (0..16 * n)
            .map(|i| {
                let v = ((i * 37 % 101) as f32 - 50.0) * 0.07;
                if i % 29 == 0 {
                    v * 30.0
                } else {
                    v
                }
            })
            .collect()
    }

    #[test]
    fn a_batch_gives_every_token_its_own_route_bit_for_bit() {
        let b: Vec<f32> = (0..16).map(|i| (i as f32 * 0.3).sin()).collect();
        for n in [1usize, 3, 4, 5, 7, 8, 9, 16, 20, 33] {
            let p = logits(n);
            let mut batch = vec![f32::NAN; 16 * n];
            sinkhorn_routes(0.8, &p, &b, 20, &mut batch);
            for t in 0..n {
                let one = sinkhorn_route(0.8, &p[16 * t..16 * t + 16], &b, 20);
                let one: Vec<u32> = one.iter().flatten().map(|v| v.to_bits()).collect();
                let got: Vec<u32> = batch[16 * t..16 * t + 16]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                assert_eq!(got, one, "token {t} of {n}");
            }
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn every_simd_form_of_the_router_gives_the_same_bits() {
        use std::arch::is_x86_feature_detected as has;
        if !(has!("avx2") && has!("fma")) {
            return;
        }
        let wide = has!("avx512f");
        let b: Vec<f32> = (0..16).map(|i| (i as f32 * 0.7).cos()).collect();
        let n = 21;
        let p = logits(n);
        let run = |f: unsafe fn(f32, &[f32], &[f32], usize, &mut [f32]), per: usize| {
            let mut out = vec![f32::NAN; 16 * n];
            for (p, o) in p.chunks(16 * per).zip(out.chunks_mut(16 * per)) {
                // SAFETY: the features were detected above.
                unsafe { f(1.3, p, &b, 20, o) };
            }
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let reference = run(x86::one_256, 1);
        assert_eq!(run(x86::routes_256, n), reference, "8 tokens a register");
        if wide {
            assert_eq!(run(x86::one_512, 1), reference, "one token in a zmm");
            assert_eq!(run(x86::routes_512, n), reference, "16 tokens a register");
        }
    }
}
