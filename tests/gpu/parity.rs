//! The parity ladder passes on a correct GPU engine and, on a deliberately broken
//! one, fails at the right rung naming the right tensor. (`cqlm parity` from
//! outside is `tests/bin/backend_cli.rs`.)

use crate::common::gpu::gpu;
use cqlm::cq::BitsPlan;
use cqlm::diag::parity::run_ladder;
use cqlm::gpu::{Fault, GpuEngine};
use cqlm::make::synth::synth_model;
use cqlm::Config;
use std::sync::Arc;

fn ids() -> Vec<u32> {
    // 16 tokens: past tiny's sink + window = 10, so the ring wraps.
    vec![1, 5, 9, 200, 3, 3, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41]
}

#[test]
fn healthy_engine_passes_every_rung() {
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 3).unwrap());
    let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let ladder = run_ladder(&model, &ctx, &mut g, &ids(), 8).unwrap();
    assert!(ladder.passed(), "{ladder:#?}");
    assert!(ladder.first_divergent.is_none());
    let rungs: Vec<usize> = ladder.rungs.iter().map(|r| r.rung).collect();
    for r in 1..=7 {
        assert!(rungs.contains(&r), "rung {r} missing: {rungs:?}");
    }
}

#[test]
fn skipping_minus_u_fails_at_layer_zero_update() {
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 3).unwrap());
    let mut g =
        GpuEngine::with_fault(Arc::clone(&model), Arc::clone(&ctx), Fault::SkipMinusU).unwrap();
    let ladder = run_ladder(&model, &ctx, &mut g, &ids(), 8).unwrap();
    assert!(!ladder.passed());
    let failed = ladder.rungs.iter().find(|r| !r.pass).unwrap();
    assert_eq!(failed.rung, 4, "{ladder:#?}");
    assert_eq!(
        ladder.first_divergent.as_deref(),
        Some("position 0 layer 0 update"),
        "{ladder:#?}"
    );
    // Everything before the update of layer 0 still matched.
    let passed: Vec<&str> = ladder
        .rungs
        .iter()
        .filter(|r| r.pass)
        .map(|r| r.name.as_str())
        .collect();
    assert!(
        passed.contains(&"position 0 layer 0 after_attn"),
        "{passed:?}"
    );
}

#[test]
fn rope_at_the_physical_slot_fails_after_the_wrap_at_q() {
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 3).unwrap());
    let c = &model.config;
    let wrap = c.sink + c.window;
    let mut g = GpuEngine::with_fault(
        Arc::clone(&model),
        Arc::clone(&ctx),
        Fault::RopeAtPhysicalSlot,
    )
    .unwrap();
    let ladder = run_ladder(&model, &ctx, &mut g, &ids(), 8).unwrap();
    let failed = ladder
        .rungs
        .iter()
        .find(|r| !r.pass)
        .expect("the fault must be caught");
    assert_eq!(failed.rung, 6, "{ladder:#?}");
    // Positions before the wrap have slot == position, so the first divergence is
    // the first wrapped position's query of layer 0.
    assert_eq!(
        ladder.first_divergent.as_deref(),
        Some(format!("position {wrap} layer 0 q").as_str()),
        "{ladder:#?}"
    );
}
