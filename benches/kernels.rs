//! Criterion benchmarks of the CPU CQ matvec at 2 and 4 bits (group 128) on the
//! shapes of the `default` preset's attention (512×512) and vocabulary (32000×512),
//! for every row-kernel variant this CPU has (compare them as ratios of one run),
//! and the batched matmul of the prefill against one matvec per input; and one
//! KV head's attention (`attend_group`) at `default`'s head width.

use cqlm::cq::{prepare, FastInput, FastKernel, FastMatrix};
use cqlm::host::simd::CpuSimd;
use cqlm::make::synth::random_cq;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::hint::black_box;

fn matvec(c: &mut Criterion) {
    let mut g = c.benchmark_group("cq_matvec");
    for (rows, cols) in [(512usize, 512usize), (32000, 512)] {
        for bits in [2u32, 4] {
            let mut rng = ChaCha8Rng::seed_from_u64(1);
            let m = random_cq(&mut rng, rows, cols, bits, 128, 1.0 / (cols as f32).sqrt());
            let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
            let prep = prepare(&m, &x).expect("input length");
            let mut out = vec![0.0f32; rows];
            g.throughput(Throughput::Bytes(m.stored_bytes() as u64));
            for &k in CpuSimd::available() {
                g.bench_function(format!("{rows}x{cols}/{bits}bit/{}", k.name()), |b| {
                    b.iter(|| {
                        m.matvec_rows_prepared_with(k, black_box(&prep), 0, black_box(&mut out))
                    })
                });
            }
        }
    }
    g.finish();
}

/// 64 inputs through a 512×512 matrix: one matvec per input against the batched
/// matmul of the prefill (bit-identical results), per row-kernel variant.
fn matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("cq_matmul_64");
    let (rows, cols, tokens) = (512usize, 512usize, 64usize);
    for bits in [2u32, 4] {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let m = random_cq(&mut rng, rows, cols, bits, 128, 1.0 / (cols as f32).sqrt());
        let preps: Vec<f32> = (0..tokens)
            .flat_map(|t| {
                let x: Vec<f32> = (0..cols)
                    .map(|i| ((i + 7 * t) as f32 * 0.37).sin())
                    .collect();
                prepare(&m, &x).expect("input length")
            })
            .collect();
        let mut out = vec![0.0f32; rows * tokens];
        g.throughput(Throughput::Elements(tokens as u64));
        for &k in CpuSimd::available() {
            g.bench_function(
                format!("{rows}x{cols}/{bits}bit/{}/per_input", k.name()),
                |b| {
                    b.iter(|| {
                        for (x, o) in preps
                            .chunks_exact(m.padded())
                            .zip(out.chunks_exact_mut(rows))
                        {
                            m.matvec_rows_prepared_with(k, black_box(x), 0, o);
                        }
                    })
                },
            );
            g.bench_function(
                format!("{rows}x{cols}/{bits}bit/{}/batched", k.name()),
                |b| {
                    b.iter(|| {
                        m.matmul_rows_prepared_with(k, black_box(&preps), tokens, 0, rows, &mut out)
                    })
                },
            );
        }
    }
    g.finish();
}

/// SPEC §6.1 fast products (int8 activations, rows repacked into tiles) on the
/// `default` preset's shapes, per fast kernel this CPU has: one input (decode)
/// and 64 (a prefill chunk), with the quantization of the input apart.
fn matvec_fast(c: &mut Criterion) {
    let mut g = c.benchmark_group("cq_matvec_fast");
    for (rows, cols, bits) in [
        (512usize, 512usize, 2u32),
        (2048, 512, 2),
        (24, 2048, 4),
        (32000, 512, 4),
    ] {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let m = random_cq(&mut rng, rows, cols, bits, 128, 1.0 / (cols as f32).sqrt());
        let fm = FastMatrix::of(&m).expect("a fast form");
        let inputs: Vec<FastInput> = (0..64)
            .map(|t| {
                let x: Vec<f32> = (0..cols)
                    .map(|i| ((i + 7 * t) as f32 * 0.37).sin())
                    .collect();
                let mut q = FastInput::default();
                q.quantize(&prepare(&m, &x).expect("input length"));
                q
            })
            .collect();
        let mut out = vec![0.0f32; rows * inputs.len()];
        g.throughput(Throughput::Bytes(m.stored_bytes() as u64));
        for &k in FastKernel::available() {
            g.bench_function(format!("{rows}x{cols}/{bits}bit/{k:?}"), |b| {
                b.iter(|| fm.matvec(k, black_box(&inputs[0]), black_box(&mut out[..rows])))
            });
            if rows <= 2048 && k != FastKernel::Scalar {
                g.bench_function(format!("{rows}x{cols}/{bits}bit/{k:?}/64_inputs"), |b| {
                    b.iter(|| fm.matmul(k, black_box(&inputs), black_box(&mut out)))
                });
            }
        }
        let prep = prepare(&m, &(0..cols).map(|i| (i as f32).cos()).collect::<Vec<_>>())
            .expect("input length");
        let mut q = FastInput::default();
        g.bench_function(format!("{cols}/quantize"), |b| {
            b.iter(|| q.quantize(black_box(&prep)))
        });
    }
    g.finish();
}

/// One KV head's query heads (1, 2 or 4 of width 64, as `default` and the
/// built-in model group them) over 128 cached rows of int8 codes, read as
/// codes and widened to f32 (a prefill chunk's reads).
fn attention(c: &mut Criterion) {
    use cqlm::kernels::attention::{attend_group, KvHeadView, WideRows};
    use rand::Rng;
    let mut g = c.benchmark_group("attend_group");
    let (d, rows) = (64usize, 128usize);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut codes =
        |n: usize| -> Vec<i8> { (0..n).map(|_| rng.random_range(-127..=127)).collect() };
    let (k, v) = (codes(rows * d), codes(rows * d));
    let scales: Vec<f32> = (0..rows)
        .map(|i| 0.001 + 0.0003 * (i % 97) as f32)
        .collect();
    let view = KvHeadView {
        k: &k,
        v: &v,
        k_scale: &scales,
        v_scale: &scales,
        wide: None,
    };
    let slots: Vec<usize> = (0..rows).collect();
    let (mut wk, mut wv) = (vec![0.0f32; rows * d], vec![0.0f32; rows * d]);
    view.widen_into(d, &mut wk, &mut wv);
    let widened = KvHeadView {
        wide: Some(WideRows { k: &wk, v: &wv }),
        ..view
    };
    for heads in [1usize, 2, 4] {
        let q: Vec<f32> = (0..heads * d).map(|i| (i as f32 * 0.61).sin()).collect();
        let (mut scores, mut out) = (vec![0.0f32; heads * rows], vec![0.0f32; heads * d]);
        g.throughput(Throughput::Elements((heads * rows) as u64));
        for (rows_as, view) in [("codes", &view), ("wide", &widened)] {
            g.bench_function(format!("d{d}/{heads}_heads/{rows}_rows/{rows_as}"), |b| {
                b.iter(|| attend_group(black_box(&q), d, view, &slots, &mut scores, &mut out))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, matvec, matmul, matvec_fast, attention);
criterion_main!(benches);
