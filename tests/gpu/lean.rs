//! The lean GPU program (3 dispatches per layer, `cqlm::gpu::ProgramKind::Lean`)
//! asked for explicitly, whatever the adapter: its dispatch budget, its logits
//! against the CPU reference across the window wrap, its captured tensors
//! against the CPU probe's, and its prefill against its own steps. (CI also runs
//! every GPU test with `CQLM_GPU_PROGRAM=lean`.)

use crate::common::gpu::{gpu, rel_l2};
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
fn lean_prefill_gives_its_steps_logits_bit_for_bit() {
    let Some(ctx) = gpu() else { return };
    let m = model(wrapping(true), 6);
    let ids = token_ids(5, 20, m.config.vocab);
    let mut stepper =
        GpuEngine::with_program(Arc::clone(&m), Arc::clone(&ctx), ProgramKind::Lean).unwrap();
    let stepped: Vec<Vec<f32>> = ids.iter().map(|&id| stepper.logits_after(id)).collect();
    let mut g = GpuEngine::with_program(Arc::clone(&m), ctx, ProgramKind::Lean).unwrap();
    for chunk in [3usize, 7] {
        g.reset();
        g.set_prefill_chunk(chunk);
        let last = g
            .step_many(&ids[..13], Readout::Logits)
            .unwrap()
            .logits()
            .unwrap()
            .to_vec();
        assert_eq!(
            last.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            stepped[12].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "chunk {chunk}"
        );
        // And the state: the steps after it agree too.
        for (t, &id) in ids.iter().enumerate().skip(13) {
            assert_eq!(g.logits_after(id), stepped[t], "chunk {chunk}, step {t}");
        }
    }
}
