//! Greedy sampling on the device: the argmax kernel against `sample::argmax` on
//! crafted and random logits, and greedy engine steps against full-logits steps.

mod common;

use common::gpu::gpu;
use cqlm::gpu::kernels::sample::{ArgmaxParams, SampleKernels};
use cqlm::gpu::{run_dispatches, GpuContext, GpuEngine};
use cqlm::sample::argmax;
use cqlm::synth::{synth_model, BitsPlan};
use cqlm::{Config, CpuEngine, Engine};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// (index, non-finite flag) from the kernel over `logits[off..off + n]`.
fn device_argmax(ctx: &GpuContext, logits: &[f32], off: usize, n: usize) -> (u32, u32) {
    let buf = ctx.storage_init("logits", bytemuck::cast_slice(logits));
    // Poisoned output: an unwritten result shows as 0xdeadbeef.
    let out = ctx.storage_init("out", bytemuck::cast_slice(&[0xdead_beefu32; 2]));
    let k = SampleKernels::new(ctx);
    let p = ArgmaxParams {
        n: n as u32,
        off: off as u32,
        _pad: [0; 2],
    };
    run_dispatches(ctx, &[k.argmax(ctx, &p, &buf, &out)]).unwrap();
    let b = ctx.read_bytes(&out, 0, 8).unwrap();
    let w: &[u32] = bytemuck::cast_slice(&b);
    (w[0], w[1])
}

#[test]
fn argmax_kernel_matches_the_cpu_argmax() {
    let Some(ctx) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    // Odd sizes, below and above one value per invocation; a window at an offset.
    for n in [1usize, 7, 255, 256, 257, 1000, 32003] {
        let v: Vec<f32> = (0..n + 5).map(|_| rng.random_range(-8.0f32..8.0)).collect();
        let (i, bad) = device_argmax(&ctx, &v, 5, n);
        assert_eq!((i, bad), (argmax(&v[5..]), 0), "n = {n}");
    }
    // Ties keep the lowest index, across invocations and within one.
    let mut v = vec![0.0f32; 3000];
    for k in [2999, 700, 1900, 444] {
        v[k] = 5.0;
    }
    assert_eq!(device_argmax(&ctx, &v, 0, 3000), (444, 0));
    assert_eq!(argmax(&v), 444);
    // Everything equal: index 0.
    assert_eq!(device_argmax(&ctx, &[-3.0; 600], 0, 600), (0, 0));
}

#[test]
fn argmax_kernel_flags_nan_and_infinities() {
    let Some(ctx) = gpu() else { return };
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut v = vec![1.0f32; 900];
        v[611] = bad;
        let (_, flag) = device_argmax(&ctx, &v, 0, 900);
        assert_eq!(flag, 1, "{bad} not flagged");
    }
    // The largest finite value is fine.
    let mut v = vec![0.0f32; 300];
    v[17] = f32::MAX;
    assert_eq!(device_argmax(&ctx, &v, 0, 300), (17, 0));
}

#[test]
fn greedy_steps_pick_the_argmax_of_the_same_logits() {
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 31).unwrap());
    let mut greedy = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let mut full = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let mut cpu = CpuEngine::new(Arc::clone(&model)).unwrap();
    assert!(greedy.last_logits().unwrap().is_none());
    // 24 greedy tokens (past the tiny window), each checked against the argmax of
    // the other engine's read-back logits, which must equal the greedy engine's
    // own logits bit for bit (same kernels, same device).
    let mut next = 3u32;
    for t in 0..24 {
        let picked = greedy.step_argmax(next).unwrap();
        let logits = full.step(next, true).unwrap().unwrap().to_vec();
        assert_eq!(picked, argmax(&logits), "position {t}");
        let mine = greedy.last_logits().unwrap().unwrap();
        assert!(mine
            .iter()
            .zip(&logits)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        // The CPU engine's default step_argmax is argmax of its logits.
        let c = cpu.step_argmax(next).unwrap();
        assert_eq!(c, argmax(cpu.last_logits().unwrap().unwrap()));
        next = picked;
    }
    // A step without logits leaves none; reset too.
    greedy.step(1, false).unwrap();
    assert!(greedy.last_logits().unwrap().is_none());
    greedy.step_argmax(1).unwrap();
    greedy.reset();
    assert!(greedy.last_logits().unwrap().is_none());
}
