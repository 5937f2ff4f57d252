//! The GPU engine end to end against the CPU reference (SPEC §6 bounds).

use crate::common::gpu::{assert_same_work, gpu, rel_l2};
use crate::common::{token_ids, StepLogits};
use cqlm::cpu::Probe;
use cqlm::cq::BitsPlan;
use cqlm::make::synth::synth_model;
use cqlm::session::sample::{argmax, top2_margin};
use cqlm::Readout;
use cqlm::{Config, CpuEngine, Engine, GpuEngine, HostTime, Model};
use std::sync::Arc;

fn tiny(engram: bool, seed: u64) -> Arc<Model> {
    let mut c = Config::preset_tiny();
    if !engram {
        c.engram = None;
    }
    Arc::new(synth_model(&c, &BitsPlan::mixed(), seed).unwrap())
}

fn prompt(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 2654435761 + seed * 97) % vocab as u64) as u32)
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    cqlm::diag::stats::median(&mut v)
}

/// Logits at every position of a 64-token prompt (crossing the window wrap).
fn check_all_positions(model: Arc<Model>, what: &str) {
    let Some(ctx) = gpu() else { return };
    check_all_positions_on(ctx, model, what);
}

fn check_all_positions_on(ctx: Arc<cqlm::gpu::GpuContext>, model: Arc<Model>, what: &str) {
    let mut g = GpuEngine::with_context(Arc::clone(&model), ctx).unwrap();
    let mut c = CpuEngine::new(Arc::clone(&model)).unwrap();
    let ids = prompt(64, model.config.vocab, 3);
    let mut errs = Vec::new();
    for &id in &ids {
        let want = c.logits_after(id);
        let got = g.logits_after(id);
        errs.push(rel_l2(&got, &want));
    }
    let max = errs.iter().cloned().fold(0.0, f64::max);
    let med = median(errs.clone());
    eprintln!("{what}: logits rel L2 median {med:.2e}, max {max:.2e}");
    assert!(med <= 1e-4, "{what}: median {med}");
    assert!(max <= 2e-2, "{what}: max {max}");
}

#[test]
fn tiny_logits_match_cpu_at_every_position() {
    check_all_positions(tiny(true, 7), "tiny");
}

#[test]
fn portable_kernels_match_cpu_too() {
    // The same parity with subgroups switched off (the CQLM_NO_SUBGROUPS path).
    let Some(_) = gpu() else { return };
    let opts = cqlm::gpu::GpuOptions {
        no_subgroups: true,
        row_matvec: Some(false),
        ..Default::default()
    };
    let ctx = cqlm::gpu::GpuContext::new(&opts, 1 << 20).unwrap();
    assert!(!ctx.caps.subgroups && !ctx.caps.row_matvec);
    check_all_positions_on(ctx, tiny(true, 12), "tiny, portable kernels");
}

#[test]
fn every_matvec_variant_matches_cpu_end_to_end() {
    // Whatever the adapter picks by default, run the other matvec kernels too:
    // rows per invocation (CPU adapters) with and without subgroup broadcasts,
    // and 16 lanes per row with the subgroup reduction (GPUs).
    let Some(_) = gpu() else { return };
    for (row_matvec, no_subgroups, label) in [
        (true, false, "rows per invocation"),
        (true, true, "rows per invocation, no subgroups"),
        (false, false, "16 lanes per row"),
    ] {
        let opts = cqlm::gpu::GpuOptions {
            row_matvec: Some(row_matvec),
            no_subgroups,
            ..Default::default()
        };
        let ctx = cqlm::gpu::GpuContext::new(&opts, 1 << 20).unwrap();
        assert_eq!(ctx.caps.row_matvec, row_matvec);
        check_all_positions_on(ctx, tiny(true, 13), label);
    }
}

#[test]
fn weights_split_over_small_bindings_still_match_cpu() {
    // As on an adapter whose storage bindings hold 16 KiB: the 1024-row embedding
    // (about 55 KiB, gathered and projected) is split by rows over several arenas.
    let Some(_) = gpu() else { return };
    let opts = cqlm::gpu::GpuOptions {
        max_storage_binding: Some(16 << 10),
        ..Default::default()
    };
    let ctx = cqlm::gpu::GpuContext::new(&opts, 0).unwrap();
    let mut c = Config::preset_tiny();
    c.vocab = 1024;
    let model = Arc::new(synth_model(&c, &BitsPlan::mixed(), 14).unwrap());
    let g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    assert!(g.weight_arenas() > 4, "only {} arenas", g.weight_arenas());
    check_all_positions_on(ctx, model, "tiny, vocab 1024, 16 KiB bindings");
}

#[test]
fn tiny_without_engram_matches_cpu() {
    check_all_positions(tiny(false, 8), "tiny without engram");
}

struct Lanes(Vec<Vec<f32>>);
impl Probe for Lanes {
    fn tensor(&mut self, name: &str, _layer: Option<usize>, data: &[f32]) {
        if name == "lanes" {
            self.0.push(data.to_vec());
        }
    }
}

#[test]
fn lanes_after_each_layer_match_cpu_at_position_zero() {
    let Some(ctx) = gpu() else { return };
    for engram in [true, false] {
        let model = tiny(engram, 11);
        let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
        let mut c = CpuEngine::new(Arc::clone(&model)).unwrap();
        let mut probe = Lanes(Vec::new());
        let want = c
            .step_probed(5, true, Some(&mut probe))
            .unwrap()
            .unwrap()
            .to_vec();
        let (logits, caps) = g.step_captured(5, true).unwrap();
        let lanes: Vec<Vec<f32>> = caps
            .into_iter()
            .filter(|c| c.name == "lanes")
            .map(|c| c.data)
            .collect();
        assert_eq!(lanes.len(), model.config.layers);
        for (l, (a, b)) in lanes.iter().zip(&probe.0).enumerate() {
            let e = rel_l2(a, b);
            assert!(e <= 1e-4, "engram {engram}: lanes after layer {l}: {e}");
        }
        assert!(rel_l2(&logits.unwrap(), &want) <= 1e-4);
    }
}

#[test]
fn greedy_ids_match_cpu_where_margins_allow() {
    let Some(ctx) = gpu() else { return };
    let model = tiny(true, 5);
    let mut g = GpuEngine::with_context(Arc::clone(&model), ctx).unwrap();
    let mut c = CpuEngine::new(Arc::clone(&model)).unwrap();
    let ids = prompt(6, model.config.vocab, 1);
    let mut lc = c.prefill(&ids).unwrap();
    let mut lg = g.prefill(&ids).unwrap();
    let mut compared = 0;
    for _ in 0..32 {
        // Teacher-forced by the CPU's choice so one low-margin flip can't derail the rest.
        let next = argmax(&lc);
        if top2_margin(&lc) > 1e-2 {
            assert_eq!(argmax(&lg), next);
            compared += 1;
        }
        lc = c.logits_after(next);
        lg = g.logits_after(next);
    }
    assert!(
        compared >= 16,
        "only {compared} of 32 positions had a usable margin"
    );
}

#[test]
fn reset_is_bit_exact_and_engines_on_one_device_are_independent() {
    let Some(ctx) = gpu() else { return };
    let model = tiny(true, 9);
    let a_ids = prompt(14, model.config.vocab, 2);
    let b_ids = prompt(14, model.config.vocab, 4);
    let mut a = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let alone: Vec<Vec<f32>> = a_ids.iter().map(|&t| a.logits_after(t)).collect();
    a.reset();
    assert_eq!(a.position(), 0);
    let mut b = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    for (i, (&ta, &tb)) in a_ids.iter().zip(&b_ids).enumerate() {
        let la = a.logits_after(ta);
        b.step(tb, Readout::None).unwrap();
        assert_eq!(
            la, alone[i],
            "position {i}: reset or a second engine changed the logits"
        );
    }
}

#[test]
fn bad_token_is_an_error_and_leaves_state_unchanged() {
    let Some(ctx) = gpu() else { return };
    let model = tiny(true, 3);
    let mut a = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let mut b = GpuEngine::with_context(Arc::clone(&model), ctx).unwrap();
    a.step(4, Readout::None).unwrap();
    b.step(4, Readout::None).unwrap();
    let vocab = model.config.vocab as u32;
    assert!(matches!(
        a.step(vocab, Readout::Logits),
        Err(cqlm::Error::TokenOutOfRange { .. })
    ));
    assert_eq!(a.position(), 1);
    assert_eq!(
        a.step(9, Readout::Logits).unwrap().logits().unwrap(),
        b.step(9, Readout::Logits).unwrap().logits().unwrap()
    );
}

#[test]
fn dispatch_budget_per_layer() {
    let Some(ctx) = gpu() else { return };
    // Matvecs prepare their own inputs (no prepare dispatches). tiny mixes bit
    // widths inside q/k/v/g (2 and 8 bits): two matvec dispatches there.
    let g = GpuEngine::with_context(tiny(true, 1), Arc::clone(&ctx)).unwrap();
    assert!(
        g.dispatches_per_layer() <= 9,
        "tiny: {:?}",
        g.layer_dispatch_names(1)
    );
    let default = synth_model(&Config::preset_default(), &BitsPlan::standard(), 1).unwrap();
    let g = GpuEngine::with_context(Arc::new(default), ctx).unwrap();
    // The default preset: Φ matvec, premix, q/k/v/g matvec, qk_store, attend,
    // wo matvec, mlp, route: 8 per layer (issue 7's budget).
    assert!(
        g.dispatches_per_layer() <= 8,
        "default: {:?}",
        g.layer_dispatch_names(2)
    );
    let (without, with) = g.dispatches_per_token();
    assert!(with > without);
}

#[test]
fn long_generation_stays_finite_and_gpu_matches_cpu_where_margins_allow() {
    // 4,000 tokens on tiny: the KV ring (sink 2 + window 8) and the engram rings
    // wrap hundreds of times. Teacher-forced by the CPU's greedy choice.
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 21).unwrap());
    let mut c = CpuEngine::new(Arc::clone(&model)).unwrap();
    let mut g = gpu().map(|ctx| GpuEngine::with_context(Arc::clone(&model), ctx).unwrap());
    let mut lc = c.prefill(&[1, 7]).unwrap();
    let mut lg = g.as_mut().map(|g| g.prefill(&[1, 7]).unwrap());
    let (mut compared, mut agreed) = (0usize, 0usize);
    for step in 0..4000 {
        assert!(
            lc.iter().all(|v| v.is_finite()),
            "cpu logits not finite at {step}"
        );
        let next = argmax(&lc);
        if let Some(lg) = &lg {
            assert!(
                lg.iter().all(|v| v.is_finite()),
                "gpu logits not finite at {step}"
            );
            if top2_margin(&lc) > 1e-2 {
                compared += 1;
                agreed += (argmax(lg) == next) as usize;
            }
        }
        lc = c.logits_after(next);
        if let (Some(g), Some(l)) = (g.as_mut(), lg.as_mut()) {
            *l = g.logits_after(next);
        }
    }
    if g.is_some() {
        assert_eq!(
            agreed,
            compared,
            "GPU disagreed with the CPU at {} of {compared} positions",
            compared - agreed
        );
        assert!(
            compared > 2000,
            "only {compared} positions had a usable margin"
        );
    }
}

/// A model whose matvecs take the batched prefill kernel on CPU adapters (2 and
/// 4 bits, groups of 128: four-word groups), with engram and a short window.
fn batched_shapes(seed: u64) -> Arc<Model> {
    let mut c = Config::preset_tiny();
    c.hidden = 128;
    c.hadamard_dim = 256;
    let plan = BitsPlan {
        group: 128,
        ..BitsPlan::mixed()
    };
    Arc::new(synth_model(&c, &plan, seed).unwrap())
}

#[test]
fn gpu_prefill_chunks_match_gpu_steps_bit_for_bit() {
    // A prefill chunk runs each matvec once for all its tokens and the per-token
    // kernels in token order; its logits, and every decode step after it, must be
    // exactly those of one step per token: chunk sizes 2..32 (more than the
    // window), prompts cut mid-chunk, positions across the window wrap, with and
    // without engram and with every matvec variant; and within SPEC §6 of the CPU.
    // Bit for bit holds on lavapipe (IEEE arithmetic, one compiler for both
    // pipelines), not necessarily on a real GPU, where the batched row kernel and the
    // single one may fuse multiply-adds differently: CPU adapters only; the twin
    // gpu_prefill_chunks_match_gpu_steps_within_rounding runs everywhere.
    let Some(ctx0) = gpu() else { return };
    if ctx0.info.device_type != wgpu::DeviceType::Cpu {
        return;
    }
    for (row_matvec, no_subgroups) in [(true, false), (true, true), (false, false)] {
        let opts = cqlm::gpu::GpuOptions {
            row_matvec: Some(row_matvec),
            no_subgroups,
            ..Default::default()
        };
        let ctx = cqlm::gpu::GpuContext::new(&opts, 1 << 20).unwrap();
        let models = [
            (tiny(true, 32), "tiny"),
            (batched_shapes(31), "hidden 128, group 128"),
            (tiny(false, 33), "tiny without engram"),
        ];
        // The 16-lane kernels are slow on lavapipe: one model for them.
        let models = if row_matvec {
            &models[..]
        } else {
            &models[..1]
        };
        for (model, what) in models {
            let c = &model.config;
            let ids = prompt((c.sink + 3 * c.window + 5).max(45), c.vocab, 9);
            let after = [7u32, 1, 2];
            // One engine, reset between runs (reset is bit-exact: tested above),
            // on the standard program, whose one-token step is the batched
            // plan's arithmetic (the lean one's: lean::lean_prefill_*).
            let mut g = GpuEngine::with_program(
                Arc::clone(model),
                Arc::clone(&ctx),
                cqlm::gpu::ProgramKind::Standard,
            )
            .unwrap();
            g.set_prefill_chunk(1);
            let want = g.prefill(&ids).unwrap();
            let want_after: Vec<Vec<f32>> = after.iter().map(|&t| g.logits_after(t)).collect();
            let mut cpu = CpuEngine::new(Arc::clone(model)).unwrap();
            let e = rel_l2(&want, &cpu.prefill(&ids).unwrap());
            assert!(e <= 1e-3, "{what}: GPU against CPU after the prompt: {e}");
            for chunk in [3usize, 8, 32] {
                let label = format!(
                    "{what}, rows {row_matvec}, no subgroups {no_subgroups}, chunk {chunk}"
                );
                g.reset();
                g.set_prefill_chunk(chunk);
                let cut = chunk + 1;
                assert!(g.step_many(&ids[..cut], Readout::None).unwrap().is_none());
                assert_eq!(g.position(), cut as u64);
                let got = g.prefill(&ids[cut..]).unwrap();
                assert_eq!(g.position(), ids.len() as u64);
                let same =
                    |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same(&got, &want),
                    "{label}: prefill logits differ (rel L2 {})",
                    rel_l2(&got, &want)
                );
                for (i, &t) in after.iter().enumerate() {
                    let l = g.step(t, Readout::Logits).unwrap().logits().unwrap();
                    assert!(
                        same(l, &want_after[i]),
                        "{label}: decode step {i} after the prefill differs"
                    );
                }
            }
        }
    }
}

#[test]
fn gpu_prefill_stops_at_a_bad_token_after_the_ones_before_it() {
    let Some(ctx) = gpu() else { return };
    let model = tiny(true, 34);
    let mut g = GpuEngine::with_context(Arc::clone(&model), ctx).unwrap();
    g.set_prefill_chunk(4);
    let mut ids = prompt(11, model.config.vocab, 2);
    ids[6] = model.config.vocab as u32;
    let e = g.step_many(&ids, Readout::Logits).unwrap_err();
    assert!(
        matches!(e, cqlm::Error::TokenOutOfRange { token, vocab } if token as usize == vocab),
        "{e:?}"
    );
    assert_eq!(g.position(), 6, "the 6 ids before the bad one are appended");
    // The engine goes on from there as if it had stepped those 6.
    let mut one = GpuEngine::with_context(Arc::clone(&model), Arc::clone(g.context())).unwrap();
    for &t in &ids[..6] {
        one.step(t, Readout::None).unwrap();
    }
    let a = g.logits_after(5);
    let b = one.logits_after(5);
    assert_same_work(&a, &b, g.program(), "after the bad token");
}

#[test]
fn gpu_prefill_chunks_match_gpu_steps_within_rounding() {
    // The tolerance twin of gpu_prefill_chunks_match_gpu_steps_bit_for_bit, for any
    // adapter: prefill chunks (separately compiled batched matvecs on CPU adapters)
    // against one step per token, within float rounding, for each matvec variant.
    let Some(_) = gpu() else { return };
    for (row_matvec, no_subgroups) in [(true, false), (true, true), (false, false)] {
        let opts = cqlm::gpu::GpuOptions {
            row_matvec: Some(row_matvec),
            no_subgroups,
            ..Default::default()
        };
        let ctx = cqlm::gpu::GpuContext::new(&opts, 1 << 20).unwrap();
        let model = tiny(true, 34);
        let c = &model.config;
        let ids = prompt(c.sink + 2 * c.window + 7, c.vocab, 10);
        let mut g = GpuEngine::with_context(Arc::clone(&model), ctx).unwrap();
        g.set_prefill_chunk(1);
        let want = g.prefill(&ids).unwrap();
        let want_next = g.logits_after(7);
        for chunk in [3usize, 8] {
            g.reset();
            g.set_prefill_chunk(chunk);
            let got = g.prefill(&ids).unwrap();
            let e = rel_l2(&got, &want);
            assert!(
                e <= 1e-5,
                "rows {row_matvec}, no sg {no_subgroups}, chunk {chunk}: {e}"
            );
            let next = g.logits_after(7);
            let e = rel_l2(&next, &want_next);
            assert!(
                e <= 1e-5,
                "rows {row_matvec}, chunk {chunk}: the step after: {e}"
            );
        }
    }
}

#[test]
fn host_time_counts_decode_steps_only() {
    // `host_us_per_token` of bench and profile: each decode step adds its
    // recording and submit time; a prefill chunk is not a decode step.
    let Some(ctx) = gpu() else { return };
    let mut g = GpuEngine::with_context(tiny(true, 1), ctx).unwrap();
    let vocab = g.config().vocab;
    let h0 = g.host_time().expect("a device backend reports host time");
    assert_eq!(h0, HostTime::default());
    g.set_prefill_chunk(4);
    g.prefill(&token_ids(3, 8, vocab)).unwrap();
    assert_eq!(
        g.host_time().unwrap().steps,
        0,
        "a prefill counted as steps"
    );
    for &t in &token_ids(4, 3, vocab) {
        g.step(t, Readout::Logits).unwrap();
    }
    let h = g.host_time().unwrap();
    assert_eq!(h.steps, 3);
    let us = h.us_per_step_since(h0).expect("three steps");
    assert!(us.is_finite() && us > 0.0, "{us} µs per step");
    assert_eq!(h.us_per_step_since(h), None, "no steps in between");
}
