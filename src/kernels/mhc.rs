//! mHC lane routing (SPEC §4.3 steps 3 and 8): gates and the log-space Sinkhorn router.

use super::sigmoid;

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
pub fn sinkhorn_route(a: f32, p: &[f32], b: &[f32], iters: usize) -> [[f32; 4]; 4] {
    let mut l: [[f32; 4]; 4] =
        std::array::from_fn(|i| std::array::from_fn(|j| a * p[4 * i + j] + b[4 * i + j]));
    for _ in 0..iters {
        for row in l.iter_mut() {
            let s = lse4(*row);
            for v in row.iter_mut() {
                *v -= s;
            }
        }
        for j in 0..4 {
            let s = lse4([l[0][j], l[1][j], l[2][j], l[3][j]]);
            for row in l.iter_mut() {
                row[j] -= s;
            }
        }
    }
    l.map(|row| row.map(f32::exp))
}
