//! Greedy generation through the library API.
//!
//! `cargo run --release --example generate -- [ARCHIVE]` (default: the `tiny` preset, random weights).

use cqlm::synth::{synth_model, BitsPlan};
use cqlm::{Config, CpuEngine, Engine, Model};
use std::sync::Arc;

fn main() -> Result<(), cqlm::Error> {
    let model = match std::env::args().nth(1) {
        Some(path) => Model::load(path.as_ref())?,
        None => synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 7)?,
    };
    let eos = model.config.eos;
    let mut engine = CpuEngine::new(Arc::new(model))?;
    let mut logits = engine.prefill(&[1, 42, 7])?;
    for _ in 0..16 {
        let next = cqlm::sample::argmax(&logits);
        print!("{next} ");
        if next == eos {
            break;
        }
        logits = engine
            .step(next, true)?
            .map(<[f32]>::to_vec)
            .unwrap_or_default();
    }
    println!();
    Ok(())
}
