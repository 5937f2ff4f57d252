//! The CQ quantizer: dense f32 matrix → [`CqMatrix`] (SPEC §2), with a codebook
//! fitted to the data by 1-D Lloyd (k-means) iterations started from the
//! Lloyd–Max levels of the unit Gaussian.

use super::fwht::nfwht;
use super::matrix::CqMatrix;
use crate::error::{Error, Result};
use half::f16;
use rayon::prelude::*;

/// Most samples fed to the codebook fit; larger matrices are subsampled evenly.
const MAX_FIT_SAMPLES: usize = 1 << 21;

/// A quantized matrix and how far it is from the dense input.
#[derive(Debug, Clone)]
pub struct Quantized {
    /// The CQ matrix.
    pub matrix: CqMatrix,
    /// Relative mean squared error `‖W − Ŵ‖² / ‖W‖²` of the dense reconstruction (0 for an all-zero input).
    pub rel_mse: f64,
}

/// Standard normal density.
fn phi(x: f64) -> f64 {
    (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// Standard normal CDF.
fn big_phi(x: f64) -> f64 {
    0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// The `2^bits` Lloyd–Max reconstruction levels of the unit Gaussian (ascending)
/// and their mean squared distortion, by Lloyd iteration on the density
/// (computed once per bit width, then cached).
pub fn lloyd_max_gaussian(bits: u32) -> (Vec<f64>, f64) {
    use std::sync::OnceLock;
    static CACHE: [OnceLock<(Vec<f64>, f64)>; 9] = [const { OnceLock::new() }; 9];
    match CACHE.get(bits as usize) {
        Some(cell) => cell.get_or_init(|| lloyd_max_uncached(bits)).clone(),
        None => lloyd_max_uncached(bits),
    }
}

fn lloyd_max_uncached(bits: u32) -> (Vec<f64>, f64) {
    let n = 1usize << bits;
    // Start from the cell-midpoint quantiles, found by bisection on the CDF.
    let mut c: Vec<f64> = (0..n)
        .map(|i| {
            let p = (i as f64 + 0.5) / n as f64;
            let (mut lo, mut hi) = (-10.0f64, 10.0f64);
            for _ in 0..100 {
                let mid = 0.5 * (lo + hi);
                if big_phi(mid) < p {
                    lo = mid
                } else {
                    hi = mid
                }
            }
            0.5 * (lo + hi)
        })
        .collect();
    let mut dist = 0.0;
    for _ in 0..20000 {
        let mut next = c.clone();
        let mut second_moment = 0.0;
        for i in 0..n {
            let a = if i == 0 {
                f64::NEG_INFINITY
            } else {
                0.5 * (c[i - 1] + c[i])
            };
            let b = if i + 1 == n {
                f64::INFINITY
            } else {
                0.5 * (c[i] + c[i + 1])
            };
            let (pa, pb) = (big_phi(a), big_phi(b));
            let (da, db) = (
                if a.is_finite() { phi(a) } else { 0.0 },
                if b.is_finite() { phi(b) } else { 0.0 },
            );
            let mass = pb - pa;
            if mass > 0.0 {
                next[i] = (da - db) / mass;
                second_moment += mass * next[i] * next[i];
            }
        }
        let moved = next
            .iter()
            .zip(&c)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        c = next;
        dist = 1.0 - second_moment;
        if moved < 1e-13 {
            break;
        }
    }
    (c, dist)
}

/// Lloyd (1-D k-means) on sorted samples, starting from `levels` (ascending).
fn fit_levels(sorted: &[f64], mut levels: Vec<f64>) -> Vec<f64> {
    let mut prefix = Vec::with_capacity(sorted.len() + 1);
    prefix.push(0.0f64);
    let mut s = 0.0;
    for v in sorted {
        s += v;
        prefix.push(s);
    }
    let n = levels.len();
    for _ in 0..300 {
        let mut moved = 0.0f64;
        let mut start = 0usize;
        for i in 0..n {
            let end = if i + 1 == n {
                sorted.len()
            } else {
                let t = 0.5 * (levels[i] + levels[i + 1]);
                sorted.partition_point(|&v| v < t)
            };
            if end > start {
                let c = (prefix[end] - prefix[start]) / (end - start) as f64;
                moved = moved.max((c - levels[i]).abs());
                levels[i] = c;
            }
            start = end.max(start);
        }
        // Keep levels ascending (an empty cell keeps its old level, which may now be out of order).
        levels.sort_by(f64::total_cmp);
        if moved < 1e-10 {
            break;
        }
    }
    levels
}

/// Index of the level nearest to `v` (levels ascending).
#[inline]
fn nearest(levels: &[f32], v: f32) -> usize {
    let i = levels.partition_point(|&l| l < v);
    if i == 0 {
        0
    } else if i == levels.len() {
        levels.len() - 1
    } else if v - levels[i - 1] <= levels[i] - v {
        i - 1
    } else {
        i
    }
}

/// Quantize a dense row-major `[rows, cols]` matrix to `bits ∈ {1,2,4,8}` with
/// `group` columns per group (a power of two `>= 32`).
///
/// Each padded group is rotated with `nfwht`; the rotated values, divided by their
/// group's RMS, are fitted with a codebook (Lloyd iterations from the Gaussian
/// Lloyd–Max levels); each group then gets the nearest levels and the
/// least-squares norm for them (rounded to f16), twice.
///
/// # Errors
/// [`Error::InvalidArgument`] for a bad bit width, group, shape, a non-finite
/// weight, or a norm that overflows f16.
pub fn quantize(
    dense: &[f32],
    rows: usize,
    cols: usize,
    bits: u32,
    group: usize,
) -> Result<Quantized> {
    if ![1, 2, 4, 8].contains(&bits) {
        return Err(Error::InvalidArgument(format!(
            "bits {bits} is not 1, 2, 4 or 8"
        )));
    }
    if group < 32 || !group.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "group {group} is not a power of two >= 32"
        )));
    }
    if rows == 0 || cols == 0 || rows.checked_mul(cols) != Some(dense.len()) {
        return Err(Error::InvalidArgument(format!(
            "dense matrix has {} values, expected {rows}×{cols} (both >= 1)",
            dense.len()
        )));
    }
    if let Some(i) = dense.iter().position(|v| !v.is_finite()) {
        return Err(Error::InvalidArgument(format!(
            "weight at row {}, column {} is not finite",
            i / cols,
            i % cols
        )));
    }
    let groups = cols.div_ceil(group);
    let padded = groups * group;

    // Rotate every group.
    let mut rotated = vec![0.0f32; rows * padded];
    rotated
        .par_chunks_mut(padded)
        .zip(dense.par_chunks(cols))
        .for_each(|(y, x)| {
            y[..cols].copy_from_slice(x);
            for g in y.chunks_exact_mut(group) {
                nfwht(g);
            }
        });
    let rms: Vec<f32> = rotated
        .par_chunks(group)
        .map(|g| (g.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / group as f64).sqrt() as f32)
        .collect();

    // Fit the codebook on the RMS-normalised values.
    let total = rows * padded;
    let stride = total.div_ceil(MAX_FIT_SAMPLES).max(1);
    let mut samples: Vec<f64> = (0..total)
        .step_by(stride)
        .filter_map(|i| {
            let s = rms[i / group];
            (s > 0.0).then(|| (rotated[i] / s) as f64)
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    let (init, _) = lloyd_max_gaussian(bits);
    let levels = if samples.is_empty() {
        init
    } else {
        fit_levels(&samples, init)
    };
    let codebook: Vec<f32> = levels.iter().map(|&v| v as f32).collect();

    // Assign indices and least-squares norms per (row, group).
    let mut norms = vec![0.0f32; rows * groups];
    let mut indices = vec![0u8; total];
    indices
        .par_chunks_mut(group)
        .zip(norms.par_iter_mut())
        .zip(rotated.par_chunks(group))
        .zip(rms.par_iter())
        .for_each(|(((idx, norm), y), &s)| {
            let mut scale = s;
            for _ in 0..2 {
                if scale <= 0.0 {
                    idx.fill(nearest(&codebook, 0.0) as u8);
                    scale = 0.0;
                    break;
                }
                let (mut yq, mut qq) = (0.0f64, 0.0f64);
                for (i, &v) in idx.iter_mut().zip(y) {
                    *i = nearest(&codebook, v / scale) as u8;
                    let q = codebook[*i as usize] as f64;
                    yq += v as f64 * q;
                    qq += q * q;
                }
                scale = if qq > 0.0 { (yq / qq) as f32 } else { 0.0 };
            }
            *norm = f16::from_f32(scale).to_f32();
        });
    if let Some(i) = norms.iter().position(|v| !v.is_finite()) {
        return Err(Error::InvalidArgument(format!(
            "row {} group {}: its norm overflows f16 (weights too large)",
            i / groups,
            i % groups
        )));
    }

    // Pack LSB first.
    let row_bytes = padded * bits as usize / 8;
    let mut packed = vec![0u8; rows * row_bytes];
    packed
        .par_chunks_mut(row_bytes)
        .zip(indices.par_chunks(padded))
        .for_each(|(p, idx)| {
            for (c, &i) in idx.iter().enumerate() {
                let bit = c * bits as usize;
                p[bit >> 3] |= i << (bit & 7);
            }
        });
    let matrix = CqMatrix::from_parts(rows, cols, bits, group, groups, codebook, norms, packed);

    // Relative error of the dense reconstruction.
    let (err, energy) = (0..rows)
        .into_par_iter()
        .map(|r| {
            let mut row = vec![0.0f32; cols];
            matrix.dequantize_row_into(r, &mut row);
            let x = &dense[r * cols..(r + 1) * cols];
            row.iter().zip(x).fold((0.0f64, 0.0f64), |(e, w), (a, b)| {
                (e + (*a as f64 - *b as f64).powi(2), w + (*b as f64).powi(2))
            })
        })
        .reduce(|| (0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
    let rel_mse = if energy > 0.0 { err / energy } else { 0.0 };
    Ok(Quantized { matrix, rel_mse })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lloyd_max_matches_published_distortions() {
        // Max (1960) / Panter–Dite: 1 bit 0.3634, 2 bits 0.1175, 4 bits 0.009497, 8 bits ≈ 4.2e-5.
        let want = [(1, 0.3634), (2, 0.1175), (4, 0.009497), (8, 4.2e-5)];
        for (bits, d) in want {
            let (levels, dist) = lloyd_max_gaussian(bits);
            assert_eq!(levels.len(), 1 << bits);
            let tol = if bits == 8 { 0.05 } else { 0.002 };
            assert!((dist - d).abs() <= tol * d, "bits {bits}: {dist} vs {d}");
        }
        let (l1, _) = lloyd_max_gaussian(1);
        assert!((l1[1] - (2.0 / std::f64::consts::PI).sqrt()).abs() < 1e-9);
    }

    #[test]
    fn nearest_picks_closest_level() {
        let l = [-1.0f32, 0.0, 2.0];
        assert_eq!(nearest(&l, -5.0), 0);
        assert_eq!(nearest(&l, -0.6), 0);
        assert_eq!(nearest(&l, -0.4), 1);
        assert_eq!(nearest(&l, 0.9), 1);
        assert_eq!(nearest(&l, 1.1), 2);
        assert_eq!(nearest(&l, 9.0), 2);
    }
}
