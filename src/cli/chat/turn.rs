//! One answer on the chat's [`Session`]: the engine's state is kept across
//! turns. A prompt that extends the tokens it holds (the previous prompt and
//! the answer's sampled tokens) feeds only the rest; otherwise the longest
//! prompt of an earlier turn that the new prompt extends is restored from the
//! chat's [`PromptCache`] (each turn keeps the state after its prompt, but
//! for the last token, so an answer that the template renders as other tokens
//! still reuses everything before it); else the whole prompt is prefilled.
use anyhow::Result;
use cqlm::constrain::Constraint;
use cqlm::session::prompt_cache::PromptCache;
use cqlm::session::sample::Sampler;
use cqlm::session::tokenizer::{TextStream, TextTokenizer};
use cqlm::session::{Generation, Output, Session};
use std::time::{Duration, Instant};

/// What one answer cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TurnStats {
    /// Tokens of the prompt (the whole rendered conversation).
    pub prompt: usize,
    /// Prompt tokens not fed: held by the engine from the previous turn or
    /// restored from an earlier turn's kept state.
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

/// The chat's engine: a session, its sampler (whose random stream goes on
/// from turn to turn) and the states kept after earlier prompts.
#[derive(Debug)]
pub struct Chatter {
    /// The session (its tokens: the last prompt and answer).
    pub session: Session,
    sampler: Sampler,
    cache: PromptCache,
    eos: u32,
    vocab: usize,
}

impl Chatter {
    /// A chatter over `session` sampling with `sampler`, keeping at most
    /// `cache_bytes` of earlier prompts' states (0: none).
    pub fn new(
        session: Session,
        sampler: Sampler,
        cache_bytes: u64,
        eos: u32,
        vocab: usize,
    ) -> Chatter {
        Chatter {
            session,
            sampler,
            cache: PromptCache::new(cache_bytes),
            eos,
            vocab,
        }
    }

    /// Forget the engine's state and the kept states.
    pub fn reset(&mut self) {
        self.session.reset();
        self.cache.clear();
    }

    /// Bring the session to a prefix of `prompt` with at least one token left
    /// to feed: the tokens it holds if `prompt` extends them, else the longest
    /// kept state `prompt` extends, else nothing. Returns the prefix's length.
    fn resume(&mut self, prompt: &[u32]) -> Result<usize> {
        let held = reusable(self.session.tokens(), prompt);
        let kept = self.cache.lookup(prompt);
        match kept {
            Some((saved, n)) if n > held => {
                self.session.restore(&prompt[..n], saved)?;
                Ok(n)
            }
            _ if held > 0 => Ok(held),
            _ => {
                self.session.reset();
                Ok(0)
            }
        }
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
        let cached = self.resume(prompt)?;
        // Feed all but the prompt's last token and keep that state: the next
        // turn's prompt extends it even when this answer renders differently.
        let last = prompt.len().saturating_sub(1).max(cached);
        self.session.prefill(&prompt[cached..last])?;
        if self.cache.wants(&prompt[..last]) {
            let saved = self.session.save()?;
            self.cache.insert(prompt[..last].to_vec(), saved);
        }
        let mut g = Generation::lending(
            prompt[last..].to_vec(),
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
    use super::{reusable, Chatter};
    use cqlm::session::sample::{Sampler, SamplerConfig};
    use cqlm::session::tokenizer::TextTokenizer;
    use cqlm::session::Session;
    use cqlm::Backend;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn reuse_needs_an_extension_by_one_token_at_least() {
        assert_eq!(reusable(&[1, 2, 3], &[1, 2, 3, 4]), 3);
        assert_eq!(reusable(&[1, 2, 3], &[1, 2, 3]), 0);
        assert_eq!(reusable(&[1, 2, 3], &[1, 2, 5, 4]), 0);
        assert_eq!(reusable(&[], &[1]), 0);
    }

    /// A greedy chatter on the built-in model on the CPU, keeping `cache_mb`.
    fn chatter(cache_mb: u64) -> (Chatter, TextTokenizer) {
        let model = Arc::new(cqlm::model::builtin::model().unwrap());
        let tok = TextTokenizer::for_model(&model).unwrap();
        let session = Session::new(Arc::clone(&model), Backend::Cpu).unwrap();
        let greedy = Sampler::new(SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        })
        .unwrap();
        let (eos, vocab) = (model.config.eos, model.config.vocab);
        (
            Chatter::new(session, greedy, cache_mb << 20, eos, vocab),
            tok,
        )
    }

    /// Answer `prompt` with 6 tokens: (cached, the answer's ids).
    fn answer(c: &mut Chatter, tok: &TextTokenizer, prompt: &[u32]) -> (usize, Vec<u32>) {
        let (_, stats) = c
            .answer(prompt, 6, None, tok, Instant::now(), |_| true)
            .unwrap();
        let ids = c.session.tokens()[prompt.len()..].to_vec();
        (stats.cached, ids)
    }

    #[test]
    fn a_turn_resumes_from_the_held_tokens_or_the_longest_kept_prompt_and_answers_as_cold() {
        let (mut c, tok) = chatter(64);
        let p1: Vec<u32> = tok
            .encode("user: hello there, how are you today?\n")
            .unwrap();
        let (cached, a1) = answer(&mut c, &tok, &p1);
        assert_eq!(cached, 0);
        // Extending the prompt and its answer: all of it is held.
        let mut p2 = [&p1[..], &a1[..]].concat();
        p2.extend(tok.encode_plain("\nuser: and then?\n").unwrap());
        assert_eq!(answer(&mut c, &tok, &p2).0, p1.len() + a1.len());
        // The first prompt with another ending (an answer rendered otherwise):
        // the state kept after the first prompt but its last token.
        let p3 = [
            &p1[..],
            &tok.encode_plain("user: something else\n").unwrap()[..],
        ]
        .concat();
        let (cached, a3) = answer(&mut c, &tok, &p3);
        assert_eq!(cached, p1.len() - 1);
        // Token for token what a chatter without a cache answers.
        let (mut cold, _) = chatter(0);
        assert_eq!(answer(&mut cold, &tok, &p3), (0, a3));
        // Nothing in common: from nothing; and /reset forgets the kept states.
        let p4 = tok.encode("a different start").unwrap();
        assert_eq!(answer(&mut c, &tok, &p4).0, 0);
        c.reset();
        assert_eq!(answer(&mut c, &tok, &p3).0, 0);
    }
}
