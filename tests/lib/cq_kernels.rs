//! CQ kernels (SPEC §2) against a naive f64 dense reconstruction written here,
//! independently of the crate's transform and inner loops.

use cqlm::cq::{cq_matvec, cq_matvec_rows, dequantize_row, prepare, CqMatrix};
use cqlm::host::simd::CpuSimd;
use half::f16;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `H[i][j] / sqrt(n)` from the Sylvester definition: `(-1)^popcount(i & j)`.
fn hadamard_entry(i: usize, j: usize, n: usize) -> f64 {
    let s = if (i & j).count_ones().is_multiple_of(2) {
        1.0
    } else {
        -1.0
    };
    s / (n as f64).sqrt()
}

/// Dense `W[r, 0..cols]` in f64, straight from SPEC §2: index by bit arithmetic,
/// level, then `norm · nfwht(q)` per group by the explicit matrix product.
fn naive_dense_row(m: &CqMatrix, r: usize) -> Vec<f64> {
    let (bits, group) = (m.bits() as usize, m.group());
    let row_bytes = m.padded() * bits / 8;
    let level = |c: usize| {
        let bit = c * bits;
        let byte = m.packed()[r * row_bytes + bit / 8] as usize;
        m.codebook()[(byte >> (bit % 8)) & ((1 << bits) - 1)] as f64
    };
    let mut out = vec![0.0; m.cols()];
    for (j, o) in out.iter_mut().enumerate() {
        let k = j / group;
        let norm = m.norms()[r * m.groups() + k] as f64;
        let mut acc = 0.0;
        for c in 0..group {
            acc += hadamard_entry(j % group, c, group) * level(k * group + c);
        }
        *o = norm * acc;
    }
    out
}

fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-300)).sqrt()
}

/// A random CQ matrix built through the public validating constructor.
pub(crate) fn random_matrix(
    rng: &mut ChaCha8Rng,
    rows: usize,
    cols: usize,
    bits: u32,
    group: usize,
) -> CqMatrix {
    let groups = cols.div_ceil(group);
    let codebook: Vec<f32> = (0..1usize << bits)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect();
    let norms: Vec<f16> = (0..rows * groups)
        .map(|_| f16::from_f32(rng.random_range(0.05f32..1.0)))
        .collect();
    let row_bytes = groups * group * bits as usize / 8;
    let mut packed = vec![0u8; rows * row_bytes];
    rng.fill_bytes(&mut packed);
    CqMatrix::new(
        cols,
        codebook,
        norms,
        [rows, groups],
        packed,
        [rows, row_bytes],
    )
    .expect("valid geometry")
}

#[test]
fn matvec_and_rows_match_naive_dense_for_every_bits_and_group() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for bits in [1u32, 2, 4, 8] {
        for group in [32usize, 64, 128, 256] {
            // cols deliberately not a multiple of the group (and one exact multiple).
            for cols in [group * 2 + 7, group - 5, group * 3] {
                let rows = 9;
                let m = random_matrix(&mut rng, rows, cols, bits, group);
                let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let y = cq_matvec(&m, &x).unwrap();
                let mut want = Vec::new();
                let mut via_rows = Vec::new();
                for r in 0..rows {
                    let dense = naive_dense_row(&m, r);
                    want.push(
                        dense
                            .iter()
                            .zip(&x)
                            .map(|(w, v)| w * *v as f64)
                            .sum::<f64>(),
                    );
                    // dequantize_row vs naive dense.
                    let dq: Vec<f64> = dequantize_row(&m, r)
                        .unwrap()
                        .iter()
                        .map(|v| *v as f64)
                        .collect();
                    let e = rel_l2(&dq, &dense);
                    assert!(
                        e <= 1e-5,
                        "dequantize_row bits {bits} group {group} cols {cols} row {r}: {e}"
                    );
                    // cq_matvec(P, x)[r] ≈ dot(dequantize_row(P, r), x).
                    via_rows.push(dq.iter().zip(&x).map(|(w, v)| w * *v as f64).sum::<f64>());
                }
                let got: Vec<f64> = y.iter().map(|v| *v as f64).collect();
                let e = rel_l2(&got, &want);
                assert!(
                    e <= 1e-5,
                    "cq_matvec bits {bits} group {group} cols {cols}: {e}"
                );
                let e = rel_l2(&got, &via_rows);
                assert!(
                    e <= 1e-5,
                    "matvec vs dequantized rows bits {bits} group {group}: {e}"
                );
                // A row range gives the same rows.
                let part = cq_matvec_rows(&m, &x, 3, 4).unwrap();
                assert_eq!(
                    part.as_slice(),
                    &y[3..7],
                    "cq_matvec_rows bits {bits} group {group}"
                );
            }
        }
    }
}

#[test]
fn lut_paths_agree_with_generic_inner_loop() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for bits in [2u32, 4] {
        let m = random_matrix(&mut rng, 40, 300, bits, 64);
        let x: Vec<f32> = (0..300).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let prep = prepare(&m, &x).unwrap();
        let y = cq_matvec(&m, &x).unwrap();
        for (r, v) in y.iter().enumerate() {
            let g = m.row_dot_generic(r, &prep);
            assert!(
                (v - g).abs() <= 1e-5 * (1.0 + g.abs()),
                "bits {bits} row {r}: {v} vs {g}"
            );
        }
    }
}

#[test]
fn parallel_matvec_matches_naive_on_a_large_matrix() {
    // Large enough to be split across threads.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let m = random_matrix(&mut rng, 3000, 512, 4, 128);
    let x: Vec<f32> = (0..512).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let y = cq_matvec(&m, &x).unwrap();
    for r in (0..3000).step_by(97) {
        let dense = naive_dense_row(&m, r);
        let want: f64 = dense.iter().zip(&x).map(|(w, v)| w * *v as f64).sum();
        assert!(
            (y[r] as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
            "row {r}"
        );
    }
}

#[test]
fn prepare_pads_and_rotates_each_group() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let m = random_matrix(&mut rng, 1, 70, 2, 32);
    let x: Vec<f32> = (0..70).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let p = prepare(&m, &x).unwrap();
    assert_eq!(p.len(), 96);
    for k in 0..3 {
        for i in 0..32 {
            let want: f64 = (0..32)
                .map(|c| {
                    let j = k * 32 + c;
                    let v = if j < 70 { x[j] as f64 } else { 0.0 };
                    hadamard_entry(i, c, 32) * v
                })
                .sum();
            assert!(
                (p[k * 32 + i] as f64 - want).abs() < 1e-5,
                "group {k} index {i}"
            );
        }
    }
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let m = random_matrix(&mut rng, 4, 40, 4, 32);
    assert!(cq_matvec(&m, &[0.0; 39]).is_err());
    assert!(cq_matvec_rows(&m, &[0.0; 40], 3, 2).is_err());
    assert!(cq_matvec_rows(&m, &[0.0; 40], usize::MAX, 2).is_err());
    assert!(dequantize_row(&m, 4).is_err());
    assert!(prepare(&m, &[0.0; 41]).is_err());
}

#[test]
fn constructor_rejects_broken_geometry() {
    let cb4 = vec![0.0f32; 16];
    let n = |rows: usize, groups: usize| vec![f16::ONE; rows * groups];
    // 3-entry codebook.
    assert!(CqMatrix::new(64, vec![0.0; 3], n(1, 2), [1, 2], vec![0; 32], [1, 32]).is_err());
    // group 16 (< 32): 1 group of 16 4-bit columns = 8 bytes.
    assert!(CqMatrix::new(16, cb4.clone(), n(1, 1), [1, 1], vec![0; 8], [1, 8]).is_err());
    // group 48 (not a power of two): 24 bytes of 4-bit = 48 columns.
    assert!(CqMatrix::new(48, cb4.clone(), n(1, 1), [1, 1], vec![0; 24], [1, 24]).is_err());
    // padded 128 >= cols + group (cols 64, group 64, 2 groups).
    assert!(CqMatrix::new(64, cb4.clone(), n(1, 2), [1, 2], vec![0; 64], [1, 64]).is_err());
    // padded < cols.
    assert!(CqMatrix::new(65, cb4.clone(), n(1, 1), [1, 1], vec![0; 32], [1, 32]).is_err());
    // row width not divisible into groups: 33 bytes, 2 groups of 4 bits.
    assert!(CqMatrix::new(64, cb4.clone(), n(1, 2), [1, 2], vec![0; 33], [1, 33]).is_err());
    // rows disagree.
    assert!(CqMatrix::new(64, cb4.clone(), n(2, 1), [2, 1], vec![0; 32], [1, 32]).is_err());
    // The valid neighbour of these cases is accepted.
    assert!(CqMatrix::new(64, cb4, n(1, 1), [1, 1], vec![0; 32], [1, 32]).is_ok());
}

#[test]
fn every_cpu_kernel_variant_matches_naive_dense() {
    // Each SIMD variant this CPU has (and the scalar one) on every bit width and
    // group, odd row counts and a row offset, against the naive f64 rows; outputs
    // start as NaN so an unwritten row fails.
    let variants = CpuSimd::available();
    eprintln!("CPU kernel variants here: {variants:?}");
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let mut simd_runs = 0;
    for bits in [1u32, 2, 4, 8] {
        for group in [32usize, 64, 128, 256, 512, 1024] {
            for cols in [group * 2 + 7, group * 3] {
                let rows = 13;
                let m = random_matrix(&mut rng, rows, cols, bits, group);
                let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let prep = prepare(&m, &x).unwrap();
                let want: Vec<f64> = (0..rows)
                    .map(|r| {
                        naive_dense_row(&m, r)
                            .iter()
                            .zip(&x)
                            .map(|(w, v)| w * *v as f64)
                            .sum()
                    })
                    .collect();
                for &k in variants {
                    let mut out = vec![f32::NAN; rows - 2];
                    m.matvec_rows_prepared_with(k, &prep, 2, &mut out);
                    let got: Vec<f64> = out.iter().map(|v| *v as f64).collect();
                    let e = rel_l2(&got, &want[2..]);
                    let kernel = m.row_kernel(k);
                    assert!(
                        e <= 1e-5,
                        "{k:?} ({kernel}) bits {bits} group {group} cols {cols}: {e}"
                    );
                    if kernel != "scalar" {
                        simd_runs += 1;
                    }
                }
            }
        }
    }
    // Where the CPU has AVX2, the SIMD kernels were really exercised.
    if variants.len() > 1 {
        assert!(simd_runs >= 12, "only {simd_runs} SIMD runs");
    }
}

#[test]
fn simd_kernels_apply_to_the_default_presets_shapes() {
    // default: 2-bit attention and 4-bit embedding/Φ at group 128.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for &k in CpuSimd::available() {
        let two = random_matrix(&mut rng, 4, 512, 2, 128);
        let four = random_matrix(&mut rng, 4, 512, 4, 128);
        let (a, b) = (two.row_kernel(k), four.row_kernel(k));
        match k {
            CpuSimd::Scalar => assert_eq!((a, b), ("scalar", "scalar")),
            CpuSimd::Avx2 => assert_eq!((a, b), ("simd8", "simd8")),
            CpuSimd::Avx512 => assert_eq!((a, b), ("simd8", "simd16")),
        }
    }
}

#[test]
fn batched_matmul_is_bit_identical_to_one_matvec_per_input() {
    // Several inputs at once (the batched prefill's kernel): every variant, every
    // bit width, groups where the 8-lane SIMD kernel applies and where it doesn't,
    // row counts that leave a tail of 1–3 rows, a row offset, and input counts
    // below, at and above the batched threshold (4 per pool thread). Each value
    // must equal the single-input matvec's bit for bit, and the naive f64 rows
    // within SPEC §6; outputs start as NaN.
    let threads = cqlm::host::pool::Pool::global().threads();
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for bits in [1u32, 2, 4, 8] {
        for group in [32usize, 128, 256] {
            let (rows, cols) = (15, group * 2 + 5);
            let m = random_matrix(&mut rng, rows, cols, bits, group);
            for tokens in [1usize, 3, 4 * threads, 4 * threads + 3] {
                let xs: Vec<Vec<f32>> = (0..tokens)
                    .map(|_| (0..cols).map(|_| rng.random_range(-1.0f32..1.0)).collect())
                    .collect();
                let preps: Vec<f32> = xs.iter().flat_map(|x| prepare(&m, x).unwrap()).collect();
                let (first, count) = (1, rows - 1);
                for &k in CpuSimd::available() {
                    let mut out = vec![f32::NAN; tokens * count];
                    m.matmul_rows_prepared_with(k, &preps, tokens, first, count, &mut out);
                    for (t, x) in xs.iter().enumerate() {
                        let mut one = vec![f32::NAN; count];
                        let prep = &preps[t * m.padded()..(t + 1) * m.padded()];
                        m.matvec_rows_prepared_with(k, prep, first, &mut one);
                        let got = &out[t * count..(t + 1) * count];
                        let same = got
                            .iter()
                            .zip(&one)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{k:?} bits {bits} group {group} tokens {tokens} input {t}: \
                             {got:?} != {one:?}"
                        );
                        let want: Vec<f64> = (first..rows)
                            .map(|r| {
                                naive_dense_row(&m, r)
                                    .iter()
                                    .zip(x)
                                    .map(|(w, v)| w * *v as f64)
                                    .sum()
                            })
                            .collect();
                        let got: Vec<f64> = got.iter().map(|v| *v as f64).collect();
                        let e = rel_l2(&got, &want);
                        assert!(e <= 1e-5, "{k:?} bits {bits} group {group}: {e}");
                    }
                }
            }
        }
    }
}
