//! One answer on the chat's [`Session`]: the engine's state is kept across
//! turns, and a prompt that extends the tokens it holds (the previous prompt
//! and the answer's sampled tokens) feeds only the rest; any other prompt
//! resets it and prefills everything (the engine cannot rewind).

use anyhow::Result;
use cqlm::constrain::Constraint;
use cqlm::session::sample::Sampler;
use cqlm::session::tokenizer::{TextStream, TextTokenizer};
use cqlm::session::{Generation, Output, Session};
use std::time::{Duration, Instant};

/// What one answer cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TurnStats {
    /// Tokens of the prompt (the whole rendered conversation).
    pub prompt: usize,
    /// Prompt tokens the engine already held from the previous turn (not fed).
    pub cached: usize,
    /// Tokens generated.
    pub generated: usize,
    /// From the start of the turn to the first token.
    pub first_token: Option<Duration>,
    /// From the first token to the end.
    pub decode: Duration,
}

impl TurnStats {
    /// Generated tokens per second after the first (0 with fewer than two).
    pub fn tokens_per_second(&self) -> f64 {
        let s = self.decode.as_secs_f64();
        if self.generated < 2 || s <= 0.0 {
            return 0.0;
        }
        (self.generated - 1) as f64 / s
    }
}

/// How many tokens of `prompt` the state after `held` serves: all of `held`
/// when `prompt` extends it by at least one token (whose logits make the first
/// choice), else none.
pub fn reusable(held: &[u32], prompt: &[u32]) -> usize {
    if prompt.len() > held.len() && prompt.starts_with(held) {
        held.len()
    } else {
        0
    }
}

/// The chat's engine: a session and its sampler (whose random stream goes on
/// from turn to turn).
#[derive(Debug)]
pub struct Chatter {
    /// The session (its tokens: the last prompt and answer).
    pub session: Session,
    sampler: Sampler,
    eos: u32,
    vocab: usize,
}

impl Chatter {
    /// A chatter over `session` sampling with `sampler`.
    pub fn new(session: Session, sampler: Sampler, eos: u32, vocab: usize) -> Chatter {
        Chatter {
            session,
            sampler,
            eos,
            vocab,
        }
    }

    /// Forget the engine's state.
    pub fn reset(&mut self) {
        self.session.reset();
    }

    /// Answer `prompt` with at most `max_tokens` tokens under `constraint`,
    /// handing `on_text` the text as it grows (possibly empty, after a token
    /// that ends no character; false stops the answer);
    /// `start` is when the turn began (for the time to the first token).
    ///
    /// # Errors
    /// The engine's and the generation's errors.
    pub fn answer(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        constraint: Option<Constraint>,
        tok: &TextTokenizer,
        start: Instant,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<(Output, TurnStats)> {
        let cached = reusable(self.session.tokens(), prompt);
        if cached == 0 {
            self.session.reset();
        }
        let mut g = Generation::lending(
            prompt[cached..].to_vec(),
            &mut self.sampler,
            self.eos,
            max_tokens,
        )
        .with_text(TextStream::new(tok, Vec::new()));
        if let Some(c) = constraint {
            g = g.with_constraint(c, self.vocab);
        }
        let mut first: Option<Instant> = None;
        self.session.run(&mut g, |e| {
            if first.is_none() && !e.ids.is_empty() {
                first = Some(Instant::now());
            }
            on_text(e.text)
        })?;
        if let Some(t) = g.text() {
            let rest = t.rest()?;
            if !rest.is_empty() {
                on_text(&rest);
            }
        }
        let out = g.output()?;
        let end = Instant::now();
        let stats = TurnStats {
            prompt: prompt.len(),
            cached,
            generated: out.tokens,
            first_token: first.map(|f| f - start),
            decode: first.map_or(Duration::ZERO, |f| end - f),
        };
        Ok((out, stats))
    }
}

#[cfg(test)]
mod tests {
    use super::reusable;

    #[test]
    fn reuse_needs_an_extension_by_one_token_at_least() {
        assert_eq!(reusable(&[1, 2, 3], &[1, 2, 3, 4]), 3);
        assert_eq!(reusable(&[1, 2, 3], &[1, 2, 3]), 0);
        assert_eq!(reusable(&[1, 2, 3], &[1, 2, 5, 4]), 0);
        assert_eq!(reusable(&[], &[1]), 0);
    }
}
