//! SPEC §6.1 fast CQ kernels: each kernel (scalar reference, AVX2, VNNI) against
//! a naive f64 loop that performs §6.1's quantization itself (the integer result
//! must agree to float rounding), SIMD against scalar bit for bit, and fast
//! against exact within §6.1's one-matvec bound.

use crate::cq_kernels::random_matrix;
use cqlm::cq::{prepare, CqMatrix, FastInput, FastKernel, FastMatrix, FastProduct};
use cqlm::host::simd::CpuSimd;
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

/// `n` random inputs for `m`, prepared and quantized.
fn inputs(rng: &mut ChaCha8Rng, m: &CqMatrix, n: usize) -> Vec<(Vec<f32>, FastInput)> {
    (0..n)
        .map(|_| {
            let x: Vec<f32> = (0..m.cols())
                .map(|_| rng.random_range(-3.0f32..3.0))
                .collect();
            let prep = prepare(m, &x).unwrap();
            let mut q = FastInput::default();
            q.quantize(&prep);
            (prep, q)
        })
        .collect()
}

/// Every kernel's product of `fm` with `xs` (poisoned first), against the
/// scalar reference row by row, bit for bit.
fn assert_kernels_equal_scalar(fm: &FastMatrix, xs: &[FastInput], what: &str) {
    for &k in &kernels() {
        let mut out = vec![f32::NAN; xs.len() * fm.rows()];
        fm.matmul(k, xs, &mut out);
        for (t, x) in xs.iter().enumerate() {
            for r in 0..fm.rows() {
                let (got, want) = (out[t * fm.rows() + r], fm.row_dot_scalar(r, x));
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{k:?}, {what}: input {t} of {}, row {r}: {got} vs {want}",
                    xs.len()
                );
            }
        }
    }
}

#[test]
fn fast_kernels_match_a_naive_f64_loop_and_each_other() {
    let mut rng = ChaCha8Rng::seed_from_u64(61);
    eprintln!("fast kernels on this CPU: {:?}", kernels());
    for bits in [1u32, 2, 4] {
        // Odd sizes: row counts that leave a partial tile, groups of 1 to many
        // blocks, block counts that are not a multiple of 8, a ragged last group.
        for (rows, cols, group) in [
            (7, 96, 32),
            (33, 200, 64),
            (5, 512, 128),
            (19, 1000, 256),
            (3, 300, 512),
        ] {
            let m = random_matrix(&mut rng, rows, cols, bits, group);
            let fm = FastMatrix::of(&m).expect("a fast form");
            assert_eq!(fm.rows(), rows);
            let what = format!("bits {bits} {rows}x{cols}/{group}");
            // 1 to 11 inputs at once: whole passes of every kernel's width and
            // the remainders (the prefill's matmul), each input's own values.
            let xs = inputs(&mut rng, &m, 11);
            for (prep, q) in &xs {
                for r in 0..rows {
                    // The integer sums are exact; what is left is f32 rounding in
                    // the combination of the blocks (a few ulps of their size).
                    let got = fm.row_dot_scalar(r, q);
                    let (want, magnitude) = naive_fast_row(&m, r, prep);
                    assert!(
                        (got as f64 - want).abs() <= 1e-6 * magnitude,
                        "{what} row {r}: {got} vs {want}"
                    );
                }
            }
            let qs: Vec<FastInput> = xs.into_iter().map(|(_, q)| q).collect();
            for n in [1, 2, 3, 5, 8, 11] {
                assert_kernels_equal_scalar(&fm, &qs[..n], &what);
            }
        }
    }
}

/// Three random matrices of `rows` rows and `cols` columns (group: a quarter
/// of them, at most 128) fused over their row `ranges`.
fn fused_three(
    rng: &mut ChaCha8Rng,
    rows: [usize; 3],
    ranges: [std::ops::Range<usize>; 3],
    bits: u32,
    cols: usize,
) -> (Vec<CqMatrix>, FastMatrix) {
    let group = (cols / 4).min(128);
    let ms: Vec<CqMatrix> = rows
        .iter()
        .map(|&r| random_matrix(rng, r, cols, bits, group))
        .collect();
    let parts: Vec<_> = ms.iter().zip(ranges).collect();
    let fm = FastMatrix::new(&parts).expect("a fast form");
    (ms, fm)
}

#[test]
fn a_product_of_many_inputs_splits_them_over_the_pool_bit_for_bit() {
    // From 16 inputs a pool part, a product gives each part a run of inputs
    // through every tile (each part's outputs written through a sink shifted
    // to its first input) instead of a run of tiles: 45 inputs (runs of 22
    // and 23 on two threads, each with a remainder below the widest kernel's
    // pass), three fused parts of odd sizes, every part's rows against the
    // scalar reference. On one thread the product runs whole on the caller.
    let mut rng = ChaCha8Rng::seed_from_u64(70);
    for bits in [1u32, 2, 4] {
        let (ms, fm) = fused_three(&mut rng, [40, 70, 9], [0..40, 3..70, 1..9], bits, 512);
        let qs: Vec<FastInput> = inputs(&mut rng, &ms[0], 45)
            .into_iter()
            .map(|(_, q)| q)
            .collect();
        for &k in &kernels() {
            let mut bufs: Vec<Vec<f32>> = (0..3)
                .map(|i| vec![f32::NAN; qs.len() * fm.part(i).len()])
                .collect();
            let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            fm.matmul_parts(k, &qs, &mut outs, &[0, 1, 2]);
            for (i, buf) in bufs.iter().enumerate() {
                let part = fm.part(i);
                for (t, x) in qs.iter().enumerate() {
                    for (j, r) in part.clone().enumerate() {
                        let (got, want) = (buf[t * part.len() + j], fm.row_dot_scalar(r, x));
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{k:?}, bits {bits}, part {i}, input {t}, row {r}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn products_of_many_tiles_and_inputs_equal_the_scalar_reference() {
    // Where a call covers many tiles and eight inputs or more, the 512-bit
    // kernel packs the inputs eight by eight (block-interleaved) before its
    // passes. 600 rows (38 tiles: at least 8 a part on up to 4 threads when the
    // tiles are split), three fused parts, groups of one block and of four,
    // and 8 to 45 inputs: whole groups, then rests of 4, 2 and 1, split over
    // the pool by tiles (fewer than 16 inputs a part) or by inputs. The last
    // tile holds 9 rows, or 5 (597 rows: the 512-bit kernel runs a last tile
    // of at most 8 rows in its 256-bit form, beside the packed tiles).
    let mut rng = ChaCha8Rng::seed_from_u64(71);
    for bits in [1u32, 2, 4] {
        for (cols, last) in [(128, 60), (512, 60), (512, 56)] {
            let (ms, fm) = fused_three(
                &mut rng,
                [250, 300, 60],
                [0..250, 1..290, 3..last],
                bits,
                cols,
            );
            let qs: Vec<FastInput> = inputs(&mut rng, &ms[0], 45)
                .into_iter()
                .map(|(_, q)| q)
                .collect();
            for n in [8, 15, 45] {
                let what = format!("bits {bits}, {} rows x {cols}, {n} inputs", fm.rows());
                assert_kernels_equal_scalar(&fm, &qs[..n], &what);
            }
        }
    }
}

#[test]
fn fused_parts_give_each_matrix_its_own_rows() {
    // Three matrices of one width with their own codebooks, odd row ranges (the
    // parts start at multiples of four rows, so a tile holds rows of several),
    // fused: each part's outputs are its matrix's rows by the naive loop.
    let mut rng = ChaCha8Rng::seed_from_u64(66);
    for bits in [1u32, 2, 4] {
        let ranges = [2..9, 5..26, 0..6];
        let (ms, fm) = fused_three(&mut rng, [9, 30, 6], ranges.clone(), bits, 256);
        assert_eq!((fm.part(0), fm.part(1), fm.part(2)), (0..7, 8..29, 32..38));
        let xs = inputs(&mut rng, &ms[0], 9);
        for (prep, q) in &xs {
            for (i, (m, range)) in ms.iter().zip(ranges.clone()).enumerate() {
                for (k, r) in range.enumerate() {
                    let got = fm.row_dot_scalar(fm.part(i).start + k, q);
                    let (want, magnitude) = naive_fast_row(m, r, prep);
                    assert!(
                        (got as f64 - want).abs() <= 1e-6 * magnitude,
                        "bits {bits}, part {i} row {r}: {got} vs {want}"
                    );
                }
            }
        }
        let qs: Vec<FastInput> = xs.into_iter().map(|(_, q)| q).collect();
        assert_kernels_equal_scalar(&fm, &qs, &format!("fused, bits {bits}"));
        // Each part straight to an output of its own (in another order), the
        // rows of the whole product.
        for &k in FastKernel::available() {
            let mut whole = vec![f32::NAN; qs.len() * fm.rows()];
            fm.matmul(k, &qs, &mut whole);
            let mut bufs: Vec<Vec<f32>> = (0..3)
                .map(|i| vec![f32::NAN; qs.len() * fm.part(2 - i).len()])
                .collect();
            let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            fm.matmul_parts(k, &qs, &mut outs, &[2, 1, 0]);
            for (i, buf) in bufs.iter().enumerate() {
                let part = fm.part(2 - i);
                for t in 0..qs.len() {
                    let want = &whole[t * fm.rows() + part.start..t * fm.rows() + part.end];
                    let got = &buf[t * part.len()..(t + 1) * part.len()];
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{k:?}, bits {bits}: part {} of input {t}",
                        2 - i
                    );
                }
            }
        }
    }
}

#[test]
fn a_product_fuses_parts_of_one_width_and_leaves_the_rest_exact() {
    let mut rng = ChaCha8Rng::seed_from_u64(67);
    let two = random_matrix(&mut rng, 8, 128, 2, 32);
    let eight = random_matrix(&mut rng, 8, 128, 8, 32);
    let four = random_matrix(&mut rng, 8, 128, 4, 32);
    let two_b = random_matrix(&mut rng, 4, 128, 2, 32);
    let p = FastProduct::new(&[(&two, 0..8), (&eight, 0..8), (&four, 0..8), (&two_b, 0..4)]);
    let fused: Vec<&[usize]> = p.fused.iter().map(|(_, ids)| &ids[..]).collect();
    assert_eq!(fused, [&[0usize, 3][..], &[2][..]]);
    assert!(p.covers(0) && p.covers(2) && p.covers(3) && !p.covers(1));
    // Parts that can't share an input (another padded length) don't fuse.
    let wide = random_matrix(&mut rng, 4, 256, 2, 32);
    assert!(FastMatrix::new(&[(&two, 0..8), (&wide, 0..4)]).is_none());
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
            q.quantize(&prep);
            let mut fast = vec![f32::NAN; 64];
            let fm = FastMatrix::of(&m).unwrap();
            fm.matvec(FastKernel::for_simd(CpuSimd::selected()), &q, &mut fast);
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
    assert!(FastMatrix::of(&random_matrix(&mut rng, 4, 64, 8, 32)).is_none());
}

#[test]
fn the_fast_input_is_the_scalar_int8_store_of_each_block() {
    // FastInput::quantize has its own SIMD loops: per block of 32 they must give
    // quantize_int8_scalar's codes and scale (a NaN block: a NaN scale), for
    // random values, exact ties, zeros, tiny values, NaN and infinities. (Its
    // bias, −128·Σq, is what the VNNI kernels start from: a wrong one fails
    // their bit-for-bit tests against the scalar reference.)
    use cqlm::kernels::kv::quantize_int8_scalar;
    let mut rng = ChaCha8Rng::seed_from_u64(68);
    // 56 blocks: three runs of 16 (the AVX-512 loop's; the third all finite,
    // which takes its path without clamp or NaN mask) and a tail of 8.
    let mut x: Vec<f32> = (0..32 * 56)
        .map(|_| rng.random_range(-5.0f32..5.0))
        .collect();
    for (i, v) in x[32..64].iter_mut().enumerate() {
        *v = (i as f32 % 20.0) - 9.5; // ties: the step is 1 below
    }
    x[32] = 127.0;
    x[64..96].fill(0.0);
    x[100] = f32::NAN;
    x[140] = f32::INFINITY;
    x[180] = f32::NEG_INFINITY;
    x[200] = f32::NAN;
    x[201] = f32::INFINITY;
    x[250] = 1e-30;
    // The third run: ties, a block's maximum of exactly 127, zeros, tiny and
    // subnormal values, all finite.
    for (i, v) in x[1024..1056].iter_mut().enumerate() {
        *v = (i as f32 % 20.0) - 9.5;
    }
    x[1056] = -127.0;
    x[1088..1120].fill(0.0);
    for v in &mut x[1120..1152] {
        *v *= 1e-20;
    }
    x[1153] = 1e-40;
    // The specials again in the second run of 16 and in the tail.
    for base in [512, 1536] {
        x[base + 40] = f32::NAN;
        x[base + 70..base + 102].fill(0.0);
        x[base + 150] = f32::INFINITY;
        x[base + 200] = f32::NEG_INFINITY;
    }
    for v in &mut x[700..732] {
        *v *= 1e-20; // a block of tiny values
    }
    let mut q = FastInput::default();
    q.quantize(&x);
    for (b, block) in x.chunks_exact(32).enumerate() {
        let mut want = [0i8; 32];
        let scale = quantize_int8_scalar(block, &mut want);
        let scale = if block.iter().any(|v| v.is_nan()) {
            f32::NAN
        } else {
            scale
        };
        assert_eq!(&q.codes()[32 * b..32 * b + 32], &want, "codes of block {b}");
        assert_eq!(
            q.scales()[b].to_bits(),
            scale.to_bits(),
            "scale of block {b}"
        );
    }
}

#[test]
fn the_fast_input_rounds_quotients_beside_half_integers_as_the_division_does() {
    // The AVX-512 loop divides by a block's scale through its reciprocal and
    // a remainder (three multiply-adds, correctly rounded by Markstein's
    // theorem): the codes must stay those of `v / scale`, above all where the
    // quotient sits within a few ulps of a half-integer, the one place where
    // a quotient 1 ulp off would change a code. Blocks of every magnitude,
    // each led by its maximum, the rest k + 1/2 steps nudged by 0..=3 ulps.
    use cqlm::kernels::kv::quantize_int8_scalar;
    let mut rng = ChaCha8Rng::seed_from_u64(69);
    let blocks = 4096;
    let mut x = vec![0.0f32; 32 * blocks];
    for block in x.chunks_exact_mut(32) {
        let max = 10f32.powf(rng.random_range(-8.0f32..8.0)) * rng.random_range(1.0f32..2.0);
        let scale = max / 127.0;
        block[0] = if rng.random_bool(0.5) { max } else { -max };
        for v in &mut block[1..] {
            let k = rng.random_range(-127i32..127) as f32 + 0.5;
            let mut t = k * scale;
            for _ in 0..rng.random_range(0..=3) {
                let up = rng.random_bool(0.5) == (t > 0.0);
                t = f32::from_bits(if up { t.to_bits() + 1 } else { t.to_bits() - 1 });
            }
            *v = t.clamp(-max, max);
        }
    }
    let mut q = FastInput::default();
    q.quantize(&x);
    for (b, block) in x.chunks_exact(32).enumerate() {
        let mut want = [0i8; 32];
        quantize_int8_scalar(block, &mut want);
        assert_eq!(&q.codes()[32 * b..32 * b + 32], &want, "codes of block {b}");
    }
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
        q.quantize(&prep);
        let fm = FastMatrix::of(&m).unwrap();
        for &k in FastKernel::available() {
            let mut out = vec![0.0f32; 9];
            fm.matvec(k, &q, &mut out);
            assert!(out.iter().all(|v| v.is_nan()), "{k:?} bits {bits}: {out:?}");
        }
    }
}
