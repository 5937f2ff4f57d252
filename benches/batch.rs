//! Continuous batching on the CPU engine without HTTP: decode tok/s of
//! `CpuBatch` with 1, 4 and 8 sequences stepped together (one token each a
//! pass), on the built-in model and the `default` preset, fast precision.
//!
//! `cargo bench --bench batch`

use cqlm::{CpuBatch, Precision};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let models = [
        ("built-in", cqlm::builtin::model().expect("built-in")),
        (
            "default",
            cqlm::synth::synth_model(
                &cqlm::Config::preset("default").expect("preset"),
                &cqlm::cq::plan_for_preset("default"),
                2026,
            )
            .expect("synth"),
        ),
    ];
    for (name, model) in models {
        let model = Arc::new(model);
        let mut one = 0.0;
        for slots in [1usize, 4, 8] {
            let mut b = CpuBatch::new(Arc::clone(&model), slots, Precision::Fast).expect("batch");
            let prompt: Vec<u32> = (0..16).map(|i| 3 + i).collect();
            let work: Vec<(usize, &[u32])> = (0..slots).map(|s| (s, &prompt[..])).collect();
            b.step(&work).expect("prefill");
            let steps = 64;
            let ids: Vec<[u32; 1]> = (0..slots).map(|s| [(5 + s) as u32]).collect();
            let t0 = Instant::now();
            for _ in 0..steps {
                let work: Vec<(usize, &[u32])> =
                    ids.iter().enumerate().map(|(s, t)| (s, &t[..])).collect();
                b.step(&work).expect("step");
            }
            let secs = t0.elapsed().as_secs_f64();
            let rate = (steps * slots) as f64 / secs;
            if slots == 1 {
                one = rate;
            }
            println!(
                "{name}: {slots} sequences: {rate:.0} tok/s aggregate, {:.0} per sequence, {:.2} ms a pass, {:.2}x one",
                rate / slots as f64,
                secs * 1e3 / steps as f64,
                rate / one
            );
        }
    }
}
