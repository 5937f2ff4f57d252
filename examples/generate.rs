//! Generation through the library API: load, tokenize, prefill, sample, stream text.
//!
//! `cargo run --release --example generate -- [ARCHIVE] [PROMPT]` (default: the
//! built-in trained model and a line of Austen). An archive without a tokenizer
//! is prompted with its BOS and prints ids.

use cqlm::sample::{Sampler, SamplerConfig};
use cqlm::session::{Backend, Session};
use cqlm::tokenizer::TextTokenizer;
use cqlm::Model;
use std::io::Write;
use std::sync::Arc;

fn main() -> Result<(), cqlm::Error> {
    let mut args = std::env::args().skip(1);
    let model = match args.next() {
        Some(path) => Model::load(path.as_ref())?,
        None => cqlm::builtin::model()?,
    };
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
    // The GPU when wgpu finds an adapter, else the CPU.
    let mut session = Session::new(Arc::new(model), Backend::Auto(Default::default()))?;
    session.prefill(&ids)?;
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        repeat_penalty: 1.1,
        seed: 1,
        ..SamplerConfig::default()
    })?;
    let mut generated = Vec::new();
    let mut shown = 0;
    print!("{prompt}");
    session.generate(&mut sampler, 48, |id| {
        generated.push(id);
        match &tokenizer {
            // Decode the whole tail each time: a byte-level token can end mid-character,
            // which decodes as U+FFFD until the next token completes it.
            Some(t) => {
                if let Ok(text) = t.decode(&generated) {
                    let end = text.trim_end_matches('\u{FFFD}').len();
                    if end > shown && text.is_char_boundary(shown) {
                        print!("{}", &text[shown..end]);
                        shown = end;
                    }
                }
            }
            None => print!("{id} "),
        }
        let _ = std::io::stdout().flush();
        true // keep going
    })?;
    println!("\n({})", session.engine().describe());
    Ok(())
}
