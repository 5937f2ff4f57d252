//! The quantizer on i.i.d. Gaussian weights: distortion within 10% of the
//! Lloyd–Max Gaussian distortion, and dense → CQ → dense round trips.

use cqlm::cq::quantize::quantize;
use cqlm::cq::{cq_matvec, dequantize_row};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

fn gaussian(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let d = Normal::new(0.0f32, 0.02).unwrap();
    (0..rows * cols).map(|_| d.sample(&mut rng)).collect()
}

/// Relative MSE measured here from the dequantized rows.
fn measured_rel_mse(dense: &[f32], m: &cqlm::cq::CqMatrix) -> f64 {
    let cols = m.cols();
    let (mut e, mut w) = (0.0f64, 0.0f64);
    for r in 0..m.rows() {
        let row = dequantize_row(m, r).unwrap();
        for (a, b) in row.iter().zip(&dense[r * cols..(r + 1) * cols]) {
            e += (*a as f64 - *b as f64).powi(2);
            w += (*b as f64).powi(2);
        }
    }
    e / w
}

#[test]
fn distortion_is_within_ten_percent_of_lloyd_max() {
    // Published Lloyd–Max distortions of the unit Gaussian (Max 1960; 8 bits from the
    // Panter–Dite asymptote π√3/2 · 4^-8 ≈ 4.15e-5).
    let lloyd_max = [(1u32, 0.3634), (2, 0.1175), (4, 0.009497), (8, 4.2e-5)];
    let (rows, cols) = (512, 500);
    let dense = gaussian(rows, cols, 42);
    for (bits, d) in lloyd_max {
        for group in [64usize, 128] {
            let q = quantize(&dense, rows, cols, bits, group).unwrap();
            let measured = measured_rel_mse(&dense, &q.matrix);
            assert!(
                (measured - q.rel_mse).abs() <= 1e-3 * measured,
                "reported {} vs measured {measured}",
                q.rel_mse
            );
            println!("bits {bits} group {group}: relative MSE {measured:.4e} (Lloyd–Max {d:.4e})");
            assert!(
                measured <= 1.10 * d,
                "bits {bits} group {group}: relative MSE {measured} exceeds 1.1 × {d}"
            );
            assert_eq!(q.matrix.bits(), bits);
            assert_eq!(q.matrix.group(), group);
            assert_eq!(q.matrix.cols(), cols);
        }
    }
}

#[test]
fn round_trip_preserves_matvec_and_rows() {
    let (rows, cols) = (64, 200);
    let dense = gaussian(rows, cols, 7);
    let q = quantize(&dense, rows, cols, 8, 64).unwrap();
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 37 % 11) as f32 - 5.0) / 5.0)
        .collect();
    let y = cq_matvec(&q.matrix, &x).unwrap();
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for r in 0..rows {
        let want: f64 = dense[r * cols..(r + 1) * cols]
            .iter()
            .zip(&x)
            .map(|(w, v)| *w as f64 * *v as f64)
            .sum();
        num += (y[r] as f64 - want).powi(2);
        den += want * want;
    }
    // 8-bit: relative error of the product about sqrt(4e-5).
    assert!((num / den).sqrt() < 0.02, "{}", (num / den).sqrt());
    // Re-quantizing the dense reconstruction changes little (idempotence up to the codebook refit).
    let recon: Vec<f32> = (0..rows)
        .flat_map(|r| dequantize_row(&q.matrix, r).unwrap())
        .collect();
    let q2 = quantize(&recon, rows, cols, 8, 64).unwrap();
    assert!(q2.rel_mse < 1e-4, "{}", q2.rel_mse);
}

#[test]
fn zero_rows_and_bad_input() {
    let mut dense = gaussian(4, 64, 1);
    dense[64..128].fill(0.0);
    let q = quantize(&dense, 4, 64, 4, 32).unwrap();
    assert!(dequantize_row(&q.matrix, 1)
        .unwrap()
        .iter()
        .all(|v| *v == 0.0));
    assert!(quantize(&dense, 4, 64, 3, 32).is_err());
    assert!(quantize(&dense, 4, 64, 4, 48).is_err());
    assert!(quantize(&dense, 4, 63, 4, 32).is_err());
    dense[5] = f32::NAN;
    assert!(quantize(&dense, 4, 64, 4, 32).is_err());
    let huge = vec![1e30f32; 64];
    assert!(quantize(&huge, 1, 64, 4, 32).is_err());
}
