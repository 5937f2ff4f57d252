//! mHC lane routing (SPEC §4.3 steps 3 and 8): gates and the log-space Sinkhorn router.

use super::sigmoid;
use super::vmath::exp_in_place;

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
