//! Criterion benchmark of one full CPU step on the `default` preset, with logits
//! (decode) and without (prefill).

use cqlm::cq::BitsPlan;
use cqlm::make::synth::synth_model;
use cqlm::Readout;
use cqlm::{Config, CpuEngine, Engine};
use criterion::{criterion_group, criterion_main, Criterion};
use std::sync::Arc;

fn step(c: &mut Criterion) {
    let model = synth_model(&Config::preset_default(), &BitsPlan::standard(), 1).expect("synth");
    let mut engine = CpuEngine::new(Arc::new(model)).expect("engine");
    // Warm the cache to a typical depth; stay inside the window so every sample costs the same.
    let prompt: Vec<u32> = (0..64).map(|i| (i * 977 % 32000) as u32).collect();
    engine.prefill(&prompt).expect("prefill");
    let mut g = c.benchmark_group("step");
    g.sample_size(50);
    for (name, want_logits) in [
        ("default/decode_with_logits", true),
        ("default/prefill_step_no_logits", false),
    ] {
        let mut tok = 5u32;
        g.bench_function(name, |b| {
            b.iter(|| {
                if engine.position() > 200 {
                    engine.reset();
                    engine.prefill(&prompt).expect("prefill");
                }
                tok = (tok * 31 + 7) % 32000;
                engine
                    .step(tok, Readout::logits_if(want_logits))
                    .expect("step")
                    .logits()
                    .map(|l| l[0])
            })
        });
    }
    g.finish();
}

criterion_group!(benches, step);
criterion_main!(benches);
