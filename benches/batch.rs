//! Continuous batching without HTTP: decode tok/s of a `BatchEngine` with 1, 4
//! and 8 sequences stepped together (one token each a pass): `CpuBatch` (fast
//! precision) on the built-in model and the `default` preset, and `GpuBatch` on
//! the first GPU adapter (lavapipe here) on the built-in model, against 1, 4 and
//! 8 `GpuEngine`s stepped one after another (a session each). Each pass reads
//! out every sequence's greedy token (on the GPU: the device's argmax).
//!
//! `cargo bench --bench batch` (`CQLM_BENCH_GPU=0` skips the GPU).

use cqlm::engine::SlotStep;
use cqlm::gpu::{GpuContext, GpuOptions};
use cqlm::{BatchEngine, CpuBatch, Engine, GpuBatch, GpuEngine, Model, Precision, Readout};
use std::sync::Arc;
use std::time::Instant;

/// Aggregate decode tok/s of `slots` sequences in `b` over `steps` passes.
fn batched(b: &mut dyn BatchEngine, slots: usize, steps: usize) -> f64 {
    let prompt: Vec<u32> = (0..16).map(|i| 3 + i).collect();
    let work: Vec<SlotStep<'_>> = (0..slots)
        .map(|s| SlotStep::new(s, &prompt, Readout::None))
        .collect();
    b.step(&work).expect("prefill");
    let ids: Vec<[u32; 1]> = (0..slots).map(|s| [(5 + s) as u32]).collect();
    let work: Vec<SlotStep<'_>> = (ids.iter().enumerate())
        .map(|(s, t)| SlotStep::new(s, t, Readout::Argmax))
        .collect();
    b.step(&work).expect("warm-up");
    let t0 = Instant::now();
    for _ in 0..steps {
        b.step(&work).expect("step");
    }
    (steps * slots) as f64 / t0.elapsed().as_secs_f64()
}

/// The same with `slots` engines stepped in turn (the device's argmax each step).
fn sessions(engines: &mut [GpuEngine], steps: usize) -> f64 {
    let prompt: Vec<u32> = (0..16).map(|i| 3 + i).collect();
    for e in engines.iter_mut() {
        e.step_many(&prompt, Readout::None).expect("prefill");
        e.step(5, Readout::Argmax).expect("warm-up");
    }
    let t0 = Instant::now();
    for _ in 0..steps {
        for (s, e) in engines.iter_mut().enumerate() {
            e.step((5 + s) as u32, Readout::Argmax).expect("step");
        }
    }
    (steps * engines.len()) as f64 / t0.elapsed().as_secs_f64()
}

fn report(what: &str, slots: usize, rate: f64, one: f64) {
    println!(
        "{what}: {slots} sequences: {rate:.0} tok/s aggregate, {:.1} per sequence, {:.2} ms a pass, {:.2}x one",
        rate / slots as f64,
        slots as f64 * 1e3 / rate,
        rate / one
    );
}

fn main() {
    let builtin = Arc::new(cqlm::model::builtin::model().expect("built-in"));
    let default = Arc::new(
        cqlm::make::synth::synth_model(
            &cqlm::Config::preset("default").expect("preset"),
            &cqlm::cq::plan_for_preset("default"),
            2026,
        )
        .expect("synth"),
    );
    for (name, model) in [("built-in", &builtin), ("default", &default)] {
        let mut one = 0.0;
        for slots in [1usize, 4, 8] {
            let mut b = CpuBatch::new(Arc::clone(model), slots, Precision::Fast).expect("batch");
            let rate = batched(&mut b, slots, 64);
            if slots == 1 {
                one = rate;
            }
            report(&format!("cpu {name}"), slots, rate, one);
        }
    }
    if std::env::var("CQLM_BENCH_GPU").is_ok_and(|v| v == "0") {
        return;
    }
    let ctx: Arc<GpuContext> = match GpuEngine::context_for(&builtin, &GpuOptions::default()) {
        Ok(c) => c,
        Err(e) => {
            println!("gpu: skipped ({e})");
            return;
        }
    };
    let model: &Arc<Model> = &builtin;
    let steps = 16;
    let (mut one_b, mut one_s) = (0.0, 0.0);
    for slots in [1usize, 4, 8] {
        let mut b =
            GpuBatch::new(Arc::clone(model), Arc::clone(&ctx), slots, None).expect("gpu batch");
        let what = format!("gpu built-in batched ({})", b.describe());
        let rate = batched(&mut b, slots, steps);
        drop(b);
        let mut engines: Vec<GpuEngine> = (0..slots)
            .map(|_| GpuEngine::with_context(Arc::clone(model), Arc::clone(&ctx)).expect("engine"))
            .collect();
        let alone = sessions(&mut engines, steps);
        if slots == 1 {
            (one_b, one_s) = (rate, alone);
        }
        report(&what, slots, rate, one_b);
        report("gpu built-in, a session each", slots, alone, one_s);
    }
}
