//! Generation through the library API: load, tokenize, then one `Generation`
//! (prompt, sampler, limit, stop string) run on a session, its text streamed.
//!
//! `cargo run --release --example generate -- [ARCHIVE] [PROMPT]` (default: the
//! built-in trained model and a line of Austen). An archive without a tokenizer
//! is prompted with its BOS and prints ids.

use cqlm::session::sample::{Sampler, SamplerConfig};
use cqlm::session::tokenizer::{TextStream, TextTokenizer};
use cqlm::session::{Backend, Generation, Session};
use cqlm::Model;
use std::io::Write;
use std::sync::Arc;

fn main() -> Result<(), cqlm::Error> {
    let mut args = std::env::args().skip(1);
    let model = Arc::new(match args.next() {
        Some(path) => Model::load(path.as_ref())?,
        None => cqlm::model::builtin::model()?,
    });
    let prompt = args
        .next()
        .unwrap_or_else(|| "It is a truth universally acknowledged".into());
    let tokenizer = model
        .tokenizer
        .is_some()
        .then(|| TextTokenizer::for_model(&model))
        .transpose()?;
    let ids = match &tokenizer {
        Some(t) => t.encode(&prompt)?,
        None => vec![model.config.bos],
    };
    let sampler = Sampler::new(SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        repeat_penalty: 1.1,
        seed: 1,
        ..SamplerConfig::default()
    })?;
    // 48 tokens at most, ending early at EOS or a blank line.
    let mut generation = Generation::new(ids, sampler, model.config.eos, 48);
    if let Some(t) = &tokenizer {
        generation = generation.with_text(TextStream::new(t, vec!["\n\n".into()]));
    }
    // The GPU when wgpu finds an adapter, else the CPU.
    let mut session = Session::new(Arc::clone(&model), Backend::Auto(Default::default()))?;
    print!("{prompt}");
    session.run(&mut generation, |e| {
        // Whole characters only, never the start of the stop string.
        match &tokenizer {
            Some(_) => print!("{}", e.text),
            None => e.ids.iter().for_each(|id| print!("{id} ")),
        }
        let _ = std::io::stdout().flush();
        true // keep going
    })?;
    // What was held back in case it began the stop string.
    if let Some(text) = generation.text() {
        print!("{}", text.rest()?);
    }
    let out = generation.output()?;
    println!(
        "\n({} tokens, finish {}; {})",
        out.tokens,
        out.finish_reason(),
        session.engine().describe()
    );
    Ok(())
}
