//! SPEC §6.1 fast CQ kernels: each kernel (scalar reference, AVX2, VNNI) against
//! a naive f64 loop that performs §6.1's quantization itself (the integer result
//! must agree to float rounding), SIMD against scalar bit for bit, and fast
//! against exact within §6.1's one-matvec bound.

use crate::cq_kernels::random_matrix;
use cqlm::cq::{prepare, CqMatrix, FastInput, FastKernel};
use cqlm::simd::CpuSimd;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// §6.1 by hand, in f64: int8 blocks of 32 (`absmax / 127`, half to even,
/// clamped), int8 levels with one scale, `Σ_g norm · s_c · Σ_b a_b · Σ L·q`;
/// with the sum of the blocks' absolute values (the scale of f32 rounding).
fn naive_fast_row(m: &CqMatrix, r: usize, prep: &[f32]) -> (f64, f64) {
    let bits = m.bits() as usize;
    let cb = m.codebook();
    let cmax = cb.iter().fold(1e-12f32, |a, c| a.max(c.abs()));
    let s_c = cmax / 127.0;
    let level = |i: usize| (cb[i] / s_c).round_ties_even().clamp(-127.0, 127.0) as i64;
    let row_bytes = m.padded() * bits / 8;
    let idx = |c: usize| {
        let bit = c * bits;
        (m.packed()[r * row_bytes + bit / 8] as usize >> (bit % 8)) & ((1 << bits) - 1)
    };
    let (mut total, mut magnitude) = (0.0f64, 0.0f64);
    for (b, x) in prep.chunks_exact(32).enumerate() {
        let amax = x.iter().fold(1e-12f32, |a, v| a.max(v.abs()));
        let a = amax / 127.0;
        let mut d = 0i64;
        for (j, &v) in x.iter().enumerate() {
            let q = (v / a).round_ties_even().clamp(-127.0, 127.0) as i64;
            d += level(idx(b * 32 + j)) * q;
        }
        let norm = m.norms()[r * m.groups() + b * 32 / m.group()] as f64;
        let term = norm * s_c as f64 * a as f64 * d as f64;
        total += term;
        magnitude += term.abs();
    }
    (total, magnitude)
}

fn kernels() -> Vec<FastKernel> {
    let k = FastKernel::available().to_vec();
    assert_eq!(k[0], FastKernel::Scalar);
    for simd in CpuSimd::available() {
        assert!(k.contains(&FastKernel::for_simd(*simd)));
    }
    k
}

#[test]
fn fast_kernels_match_a_naive_f64_loop_and_each_other() {
    let mut rng = ChaCha8Rng::seed_from_u64(61);
    let ks = kernels();
    eprintln!("fast kernels on this CPU: {ks:?}");
    for bits in [1u32, 2, 4] {
        // Odd sizes: row counts that split unevenly, groups of 1 to many blocks,
        // block counts that are not a multiple of 8, a ragged last group.
        for (rows, cols, group) in [
            (7, 96, 32),
            (33, 200, 64),
            (5, 512, 128),
            (19, 1000, 256),
            (3, 300, 512),
        ] {
            let m = random_matrix(&mut rng, rows, cols, bits, group);
            assert!(m.has_fast());
            let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-3.0f32..3.0)).collect();
            let prep = prepare(&m, &x).unwrap();
            let mut q = FastInput::default();
            q.quantize(&prep, bits);
            // The same input quantized for another width, then laid out for this
            // one (what an input shared by matrices of two widths gets).
            let mut other = FastInput::default();
            other.quantize(&prep, if bits == 4 { 2 } else { 4 });
            let mut relaid = FastInput::default();
            relaid.relay(&other, bits);
            let mut a = vec![f32::NAN; rows];
            let mut b = vec![f32::NAN; rows];
            m.matvec_rows_fast(FastKernel::Scalar, &q, 0, &mut a);
            m.matvec_rows_fast(FastKernel::Scalar, &relaid, 0, &mut b);
            assert_eq!(a, b, "relaid input, bits {bits}");
            let mut outs = Vec::new();
            for &k in &ks {
                let mut out = vec![f32::NAN; rows];
                m.matvec_rows_fast(k, &q, 0, &mut out);
                outs.push(out);
            }
            for (r, &got) in outs[0].iter().enumerate() {
                // The integer sums are exact; what is left is f32 rounding
                // in the combination of the blocks (a few ulps of their size).
                let (want, magnitude) = naive_fast_row(&m, r, &prep);
                let tol = 1e-6 * magnitude;
                assert!(
                    (got as f64 - want).abs() <= tol,
                    "bits {bits} {rows}x{cols}/{group} row {r}: {got} vs {want}"
                );
                assert_eq!(m.row_dot_fast_scalar(r, &q).to_bits(), got.to_bits());
            }
            // Several inputs at once (the prefill's matmul: whole tiles of
            // inputs and a remainder) give each input's one-input values.
            let inputs: Vec<FastInput> = (0..7)
                .map(|_| {
                    let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-3.0f32..3.0)).collect();
                    let mut q = FastInput::default();
                    q.quantize(&prepare(&m, &x).unwrap(), bits);
                    q
                })
                .collect();
            for &k in &ks {
                let mut out = vec![f32::NAN; rows * inputs.len()];
                m.matmul_rows_fast(k, &inputs, 0, rows, &mut out);
                for (t, x) in inputs.iter().enumerate() {
                    for r in 0..rows {
                        assert_eq!(
                            out[t * rows + r].to_bits(),
                            m.row_dot_fast_scalar(r, x).to_bits(),
                            "{k:?} matmul, input {t} row {r}: bits {bits} {rows}x{cols}/{group}"
                        );
                    }
                }
            }
            for (k, out) in ks.iter().zip(&outs).skip(1) {
                let same = out
                    .iter()
                    .zip(&outs[0])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{k:?} differs from the scalar fast kernel: bits {bits} {rows}x{cols}/{group}"
                );
            }
        }
    }
}

#[test]
fn one_fast_matvec_is_within_1e_2_of_exact() {
    let mut rng = ChaCha8Rng::seed_from_u64(62);
    for bits in [1u32, 2, 4] {
        for group in [32usize, 128] {
            let m = random_matrix(&mut rng, 64, 512, bits, group);
            let x: Vec<f32> = (0..512).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let prep = prepare(&m, &x).unwrap();
            let mut exact = vec![0.0; 64];
            m.matvec_rows_prepared(&prep, 0, &mut exact);
            let mut q = FastInput::default();
            q.quantize(&prep, bits);
            let mut fast = vec![f32::NAN; 64];
            m.matvec_rows_fast(FastKernel::for_simd(CpuSimd::selected()), &q, 0, &mut fast);
            let num: f64 = fast
                .iter()
                .zip(&exact)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum();
            let den: f64 = exact.iter().map(|b| (*b as f64).powi(2)).sum();
            let e = (num / den).sqrt();
            assert!(e <= 1e-2, "bits {bits} group {group}: rel L2 {e:.2e}");
        }
    }
}

#[test]
fn eight_bit_matrices_have_no_fast_form() {
    let mut rng = ChaCha8Rng::seed_from_u64(63);
    assert!(!random_matrix(&mut rng, 4, 64, 8, 32).has_fast());
}

#[test]
fn int8_quantization_simd_equals_its_scalar_loop() {
    // The KV store and the fast input both quantize with quantize_int8; its SIMD
    // form must give the scalar loop's codes and scale for every input: random
    // values, exact ties (k + 0.5 steps), zeros, NaN and infinities, ragged lengths.
    use cqlm::kernels::kv::{quantize_int8, quantize_int8_scalar};
    let mut rng = ChaCha8Rng::seed_from_u64(64);
    let mut cases: Vec<Vec<f32>> = Vec::new();
    for n in [1usize, 7, 8, 9, 31, 32, 33, 64, 100] {
        cases.push((0..n).map(|_| rng.random_range(-5.0f32..5.0)).collect());
        // Ties: max 127 so the step is 1, values at k + 0.5.
        let mut t: Vec<f32> = (0..n).map(|i| (i as f32 % 20.0) - 9.5).collect();
        t[0] = 127.0;
        cases.push(t);
        cases.push(vec![0.0; n]);
    }
    let mut odd: Vec<f32> = (0..20).map(|i| i as f32).collect();
    odd[3] = f32::NAN;
    cases.push(odd.clone());
    odd[5] = f32::INFINITY;
    cases.push(odd);
    for x in cases {
        let (mut a, mut b) = (vec![0i8; x.len()], vec![0i8; x.len()]);
        let sa = quantize_int8(&x, &mut a);
        let sb = quantize_int8_scalar(&x, &mut b);
        assert_eq!(sa.to_bits(), sb.to_bits(), "scale of {x:?}");
        assert_eq!(a, b, "codes of {x:?}");
    }
}

#[test]
fn a_nan_input_gives_nan_outputs_in_every_fast_kernel() {
    // quantize_int8 turns a NaN into code 0; the fast input marks its block
    // instead, so the NaN reaches every row (as in the exact matvec) rather than
    // vanishing into a finite result.
    let mut rng = ChaCha8Rng::seed_from_u64(65);
    for bits in [1u32, 2, 4] {
        let m = random_matrix(&mut rng, 9, 256, bits, 128);
        let mut prep: Vec<f32> = (0..256).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        prep[77] = f32::NAN;
        let mut q = FastInput::default();
        q.quantize(&prep, bits);
        for &k in FastKernel::available() {
            let mut out = vec![0.0f32; 9];
            m.matvec_rows_fast(k, &q, 0, &mut out);
            assert!(out.iter().all(|v| v.is_nan()), "{k:?} bits {bits}: {out:?}");
        }
    }
}
