//! Generation through the library API: load, prefill, sample, stream.
//!
//! `cargo run --release --example generate -- [ARCHIVE]` (default: the `tiny` preset, random weights).

use cqlm::sample::{Sampler, SamplerConfig};
use cqlm::session::{Backend, Session};
use cqlm::synth::{synth_model, BitsPlan};
use cqlm::{Config, Model};
use std::sync::Arc;

fn main() -> Result<(), cqlm::Error> {
    let model = match std::env::args().nth(1) {
        Some(path) => Model::load(path.as_ref())?,
        None => synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 7)?,
    };
    // The GPU when wgpu finds an adapter, else the CPU.
    let mut session = Session::new(Arc::new(model), Backend::Auto(Default::default()))?;
    session.prefill(&[1, 42, 7])?;
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        repeat_penalty: 1.1,
        seed: 1,
        ..SamplerConfig::default()
    })?;
    session.generate(&mut sampler, 16, |id| {
        print!("{id} ");
        true // keep going
    })?;
    println!("\n({})", session.engine().describe());
    Ok(())
}
