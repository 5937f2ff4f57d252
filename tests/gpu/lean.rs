//! The lean GPU program (3 dispatches per layer, `cqlm::gpu::ProgramKind::Lean`)
//! asked for explicitly, whatever the adapter: its dispatch budget, its logits
//! against the CPU reference across the window wrap, its captured tensors
//! against the CPU probe's, and its prefill (the standard program's batched
//! plan) against the standard steps. (CI also runs
//! every GPU test with `CQLM_GPU_PROGRAM=lean`.)

use crate::common::gpu::{assert_same_work, gpu, rel_l2};
use crate::common::{token_ids, StepLogits};
use cqlm::cpu::Probe;
use cqlm::cq::BitsPlan;
use cqlm::gpu::ProgramKind;
use cqlm::make::synth::synth_model;
use cqlm::{Config, CpuEngine, Engine, GpuEngine, Model, Readout};
use std::collections::BTreeMap;
use std::sync::Arc;

fn model(c: Config, seed: u64) -> Arc<Model> {
    Arc::new(synth_model(&c, &BitsPlan::mixed(), seed).unwrap())
}

/// `tiny` with a small ring (sink 2, window 5), so 24 positions wrap it.
fn wrapping(engram: bool) -> Config {
    let mut c = Config {
        sink: 2,
        window: 5,
        ..Config::preset_tiny()
    };
    if !engram {
        c.engram = None;
    }
    c
}

#[test]
fn the_default_preset_runs_in_at_most_54_dispatches_a_token() {
    // Issue 16's budget: <= 3 per layer + 6 per token, the readout included.
    let Some(ctx) = gpu() else { return };
    let m = Arc::new(synth_model(&Config::preset_default(), &BitsPlan::standard(), 1).unwrap());
    let layers = m.config.layers;
    let g = GpuEngine::with_program(m, ctx, ProgramKind::Lean).unwrap();
    assert_eq!(g.program(), ProgramKind::Lean, "the lean program fell back");
    assert_eq!(
        g.dispatches_per_layer(),
        3,
        "{:?}",
        g.layer_dispatch_names(1)
    );
    let (_, with_logits) = g.dispatches_per_token();
    // + 1 for a device readout (argmax or top-k) after the vocabulary projection.
    let with_readout = with_logits + 1;
    assert!(with_readout <= 3 * layers + 6, "{with_readout} dispatches");
    assert!(g.describe().ends_with("lean program"), "{}", g.describe());
}

#[test]
fn lean_logits_match_cpu_at_every_position_across_the_wrap() {
    let Some(ctx) = gpu() else { return };
    for engram in [true, false] {
        let m = model(wrapping(engram), 21);
        let mut g =
            GpuEngine::with_program(Arc::clone(&m), Arc::clone(&ctx), ProgramKind::Lean).unwrap();
        assert_eq!(g.program(), ProgramKind::Lean);
        let mut c = CpuEngine::new(Arc::clone(&m)).unwrap();
        let mut worst = 0.0f64;
        for &id in &token_ids(9, 24, m.config.vocab) {
            let e = rel_l2(&g.logits_after(id), &c.logits_after(id));
            worst = worst.max(e);
        }
        assert!(
            worst <= 1e-4,
            "engram {engram}: worst logits rel L2 {worst:.2e}"
        );
    }
}

/// Every tensor the CPU probe names, by (name, layer).
#[derive(Default)]
struct All(BTreeMap<(String, Option<usize>), Vec<f32>>);

impl Probe for All {
    fn tensor(&mut self, name: &str, layer: Option<usize>, data: &[f32]) {
        self.0.insert((name.to_string(), layer), data.to_vec());
    }
}

#[test]
fn lean_captures_name_every_tensor_the_cpu_probe_names() {
    // cqlm parity finds the first divergent tensor from these captures: the
    // fused kernels must still expose every intermediate, at the right values.
    let Some(ctx) = gpu() else { return };
    let m = model(wrapping(true), 4);
    let mut g = GpuEngine::with_program(Arc::clone(&m), ctx, ProgramKind::Lean).unwrap();
    let mut c = CpuEngine::new(Arc::clone(&m)).unwrap();
    for (t, &id) in token_ids(2, 9, m.config.vocab).iter().enumerate() {
        let mut probe = All::default();
        c.step_probed(id, false, Some(&mut probe)).unwrap();
        let (_, caps) = g.step_captured(id, false).unwrap();
        let got: BTreeMap<_, _> = caps
            .into_iter()
            .map(|c| ((c.name, c.layer), c.data))
            .collect();
        let want_names: Vec<_> = probe.0.keys().collect();
        let got_names: Vec<_> = got.keys().collect();
        assert_eq!(got_names, want_names, "position {t}: capture names");
        for (key, want) in &probe.0 {
            let e = rel_l2(&got[key], want);
            assert!(e <= 1e-4, "position {t}: {key:?} rel L2 {e:.2e}");
        }
    }
}

#[test]
fn a_lean_engine_prefills_with_the_standard_plan_and_steps_within_rounding_of_it() {
    // Passes of several tokens run the standard program's batched plan whatever
    // program was chosen: a lean engine's prefill gives the standard steps'
    // logits bit for bit (on CPU adapters) unless its last pass is one token
    // (a lean step), and its lean steps after it stay within rounding of the
    // standard steps, across the window wrap.
    let Some(ctx) = gpu() else { return };
    let m = model(wrapping(true), 6);
    let ids = token_ids(5, 20, m.config.vocab);
    let mut standard =
        GpuEngine::with_program(Arc::clone(&m), Arc::clone(&ctx), ProgramKind::Standard).unwrap();
    let stepped: Vec<Vec<f32>> = ids.iter().map(|&id| standard.logits_after(id)).collect();
    let software = ctx.info.device_type == wgpu::DeviceType::Cpu;
    let mut g = GpuEngine::with_program(Arc::clone(&m), ctx, ProgramKind::Lean).unwrap();
    assert_eq!(g.program(), ProgramKind::Lean);
    // 13 tokens in chunks of 3 end with a pass of one, which runs the lean step.
    for chunk in [3usize, 5, 7] {
        g.reset();
        g.set_prefill_chunk(chunk);
        let last = g
            .step_many(&ids[..13], Readout::Logits)
            .unwrap()
            .logits()
            .unwrap()
            .to_vec();
        let program = if software && 13 % chunk != 1 {
            ProgramKind::Standard
        } else {
            ProgramKind::Lean
        };
        assert_same_work(&last, &stepped[12], program, &format!("chunk {chunk}"));
        for (t, &id) in ids.iter().enumerate().skip(13) {
            let e = rel_l2(&g.logits_after(id), &stepped[t]);
            assert!(e <= 1e-5, "chunk {chunk}, lean step {t}: rel L2 {e:.2e}");
        }
    }
}
