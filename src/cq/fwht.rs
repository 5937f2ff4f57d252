//! SEED §1: the Walsh–Hadamard transform in natural (Sylvester) order.

/// Unnormalised in-place fast Walsh–Hadamard transform: `x ← H_n · x`.
///
/// `x.len()` must be a power of two (a length of 0 or 1 is the identity).
/// `fwht(fwht(x)) = n · x`.
///
/// # Panics
/// If `x.len()` is not a power of two (a programming error: every caller passes a group or `hadamard_dim`).
pub fn fwht(x: &mut [f32]) {
    let n = x.len();
    if n <= 1 {
        return;
    }
    assert!(n.is_power_of_two(), "fwht length {n} is not a power of two");
    let mut h = 1;
    while h < n {
        for block in x.chunks_exact_mut(2 * h) {
            let (lo, hi) = block.split_at_mut(h);
            for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                let (u, v) = (*a, *b);
                *a = u + v;
                *b = u - v;
            }
        }
        h *= 2;
    }
}

/// Orthonormal transform `nfwht(x) = fwht(x) / sqrt(n)`, its own inverse.
///
/// # Panics
/// If `x.len()` is not a power of two.
pub fn nfwht(x: &mut [f32]) {
    fwht(x);
    let s = 1.0 / (x.len() as f32).sqrt();
    for v in x.iter_mut() {
        *v *= s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive f64 `H_n · x` from the Sylvester definition: `H[i][j] = (-1)^popcount(i & j)`.
    fn hadamard_f64(x: &[f32]) -> Vec<f64> {
        let n = x.len();
        (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| {
                        let s = if (i & j).count_ones() % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        };
                        s * x[j] as f64
                    })
                    .sum()
            })
            .collect()
    }

    fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_naive_sylvester_matrix() {
        for n in [1usize, 2, 4, 8, 32, 128] {
            let x = pseudo_random(n, n as u64);
            let mut y = x.clone();
            fwht(&mut y);
            let want = hadamard_f64(&x);
            for (a, b) in y.iter().zip(&want) {
                assert!(
                    (*a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "n={n}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn twice_is_n_times_identity() {
        for n in [2usize, 16, 256, 2048] {
            let x = pseudo_random(n, 7 + n as u64);
            let mut y = x.clone();
            fwht(&mut y);
            fwht(&mut y);
            for (a, b) in y.iter().zip(&x) {
                assert!((a - n as f32 * b).abs() <= 1e-4 * n as f32, "n={n}");
            }
        }
    }

    #[test]
    fn normalised_is_orthonormal_and_involutive() {
        let n = 512;
        let x = pseudo_random(n, 3);
        let mut y = x.clone();
        nfwht(&mut y);
        let nx: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum();
        let ny: f64 = y.iter().map(|v| (*v as f64).powi(2)).sum();
        assert!(
            (nx - ny).abs() <= 1e-5 * nx,
            "norm not preserved: {nx} vs {ny}"
        );
        nfwht(&mut y);
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b).abs() <= 1e-5, "not an involution");
        }
        // Columns of H/sqrt(n) are orthonormal: transform two basis vectors and take dot products.
        for (i, j) in [(0usize, 0usize), (3, 3), (1, 5), (7, 100)] {
            let mut ei = vec![0.0f32; n];
            let mut ej = vec![0.0f32; n];
            ei[i] = 1.0;
            ej[j] = 1.0;
            nfwht(&mut ei);
            nfwht(&mut ej);
            let d: f64 = ei.iter().zip(&ej).map(|(a, b)| *a as f64 * *b as f64).sum();
            let want = if i == j { 1.0 } else { 0.0 };
            assert!((d - want).abs() < 1e-6, "<H e{i}, H e{j}> = {d}");
        }
    }
}
