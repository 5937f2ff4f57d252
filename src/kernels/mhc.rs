//! mHC lane routing (SPEC §4.3 steps 3, 4, 8 and 9): gates, the log-space Sinkhorn
//! router, and the CPU twins of shaders/mhc.wgsl's entry points
//! (`crate::gpu::kernels::mhc`): [`premix`] (`premix`: pre-mix and engram gate)
//! and [`route`] (`route`: Sinkhorn routing and the lane update).

use super::norm::inv_rms;
use super::sigmoid;
use super::vmath::exp_in_place;

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
        let (ru, rk) = (inv_rms(u), inv_rms(s.key));
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
    let h = update.len();
    assert_eq!(lanes.len(), 4 * h, "route: lanes");
    let hpost = post_gates(layer, a_post, p_post, b_post);
    let r = sinkhorn_route(a_res, p_res, b_res, iters);
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
    r
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
/// `L[i][j] = a·p[4i+j] + b[4i+j]`. Columns of the result sum to 1.
///
/// The 16 exponentials of each half-round go through [`exp_in_place`] together
/// (vectorized where allowed; with scalar kernels this is exactly [`lse4`] per row
/// and column).
pub fn sinkhorn_route(a: f32, p: &[f32], b: &[f32], iters: usize) -> [[f32; 4]; 4] {
    let mut l: [[f32; 4]; 4] =
        std::array::from_fn(|i| std::array::from_fn(|j| a * p[4 * i + j] + b[4 * i + j]));
    let mut e = [0.0f32; 16];
    // One half-round: `at(k, m)` is the m-th entry of the k-th row (or column).
    let mut half = |l: &mut [[f32; 4]; 4], at: fn(usize, usize) -> (usize, usize)| {
        let mut max = [f32::NEG_INFINITY; 4];
        for (k, mk) in max.iter_mut().enumerate() {
            for m in 0..4 {
                let (i, j) = at(k, m);
                *mk = mk.max(l[i][j]);
            }
            for m in 0..4 {
                let (i, j) = at(k, m);
                e[4 * k + m] = l[i][j] - *mk;
            }
        }
        exp_in_place(&mut e);
        for (k, mk) in max.iter().enumerate() {
            let sum: f32 = e[4 * k..4 * k + 4].iter().sum();
            let lse = mk + sum.ln();
            for m in 0..4 {
                let (i, j) = at(k, m);
                l[i][j] -= lse;
            }
        }
    };
    for _ in 0..iters {
        half(&mut l, |k, m| (k, m));
        half(&mut l, |k, m| (m, k));
    }
    let mut out = [0.0f32; 16];
    for (o, v) in out.iter_mut().zip(l.iter().flatten()) {
        *o = *v;
    }
    exp_in_place(&mut out);
    std::array::from_fn(|i| std::array::from_fn(|j| out[4 * i + j]))
}
