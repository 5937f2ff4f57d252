//! [`Generation`]: one sequence's generation as a state machine, shared by
//! [`super::Session`] (the CLI and the library) and the server's batch loop.
//!
//! A driver asks [`Generation::next`] what to feed (a prompt chunk, or the
//! tokens chosen and forced since the last step) and which [`Readout`] (under
//! which mask) the step after them needs, steps its engine, and hands the
//! readout back to [`Generation::advance`]. The generation feeds the prompt,
//! appends the tokens a constraint forces, computes the constraint's mask of
//! the next choice, samples, detects EOS, the token limit and stop strings,
//! keeps the text as it grows ([`TextStream`]), and says why it ended
//! ([`Finish`]); [`Generation::output`] applies the tool-call rule. The same
//! readouts on any engine give the same tokens, so a sequence generates the
//! same alone or in a batch.

use super::output::{ConstraintStats, Finish, Output};
use crate::constrain::{Constraint, TokenMask};
use crate::engine::{Readout, StepOut, NUCLEUS_CANDIDATES};
use crate::error::{Error, Result};
use crate::session::logprobs::TokenLogprob;
use crate::session::sample::Sampler;
use crate::session::tokenizer::TextStream;
use std::time::Instant;

/// What the next step of a generation is ([`Generation::next`]): its ids are
/// [`Generation::ids`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Next {
    /// What to read out after the ids (`None` for a prompt chunk before the last).
    pub readout: Readout,
    /// Whether the readout is restricted to [`Generation::mask`]'s tokens.
    pub masked: bool,
}

/// What [`Generation::advance`] made of a readout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Go on: [`Generation::next`] has the next step.
    Continue,
    /// A top-p draw's candidates could not decide: hand over the full logits
    /// of the same step (under the same mask) to [`Generation::advance`].
    NeedLogits,
    /// The generation ended.
    Done(Finish),
}

/// A value the generation owns, or one the caller lends it.
enum Held<'a, T> {
    Owned(T),
    Lent(&'a mut T),
}

impl<T> std::ops::Deref for Held<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            Held::Owned(t) => t,
            Held::Lent(t) => t,
        }
    }
}

impl<T> std::ops::DerefMut for Held<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match self {
            Held::Owned(t) => t,
            Held::Lent(t) => t,
        }
    }
}

/// One sequence's generation: prompt, sampler, constraint, limits and text.
pub struct Generation<'a> {
    sampler: Held<'a, Sampler>,
    constraint: Option<Held<'a, Constraint>>,
    text: Option<TextStream<'a>>,
    eos: u32,
    max_tokens: usize,
    /// Ids of the prompt: the first `prompt_len` of `history`.
    prompt_len: usize,
    /// Prompt ids handed out so far.
    fed: usize,
    /// Prompt and generated ids (the repetition penalty's history).
    history: Vec<u32>,
    /// Tokens generated (emitted) so far.
    generated: usize,
    /// The constraint's forced start and whether the output is complete after
    /// it, emitted once the prompt is in.
    start: Option<(Vec<u32>, bool)>,
    /// The ids of the step [`Generation::next`] handed out.
    ids: Vec<u32>,
    /// Emitted ids not yet handed out to step.
    unstepped: Vec<u32>,
    /// Emitted ids and text not yet taken by the driver.
    emitted: Vec<u32>,
    delta: String,
    /// Whether the readout after `ids` is a choice.
    choosing: bool,
    mask: TokenMask,
    mask_ready: bool,
    finish: Option<Finish>,
    stats: ConstraintStats,
    nucleus_misses: u64,
    /// Alternatives to report per token when the logprobs are kept.
    logprobs: Option<usize>,
    /// The logprob of the token chosen at this step, for [`Generation::emit`].
    chosen: Option<TokenLogprob>,
    /// The logprobs of emitted tokens not yet taken by the driver.
    logprobs_out: Vec<TokenLogprob>,
}

impl std::fmt::Debug for Generation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("prompt", &self.prompt_len)
            .field("generated", &self.generated)
            .field("finish", &self.finish)
            .finish_non_exhaustive()
    }
}

impl<'a> Generation<'a> {
    /// A generation of at most `max_tokens` tokens after `prompt` (empty: the
    /// prompt is already in the engine, and the first choice reads its last
    /// step's logits), sampling with `sampler`, ending at `eos`.
    pub fn new(prompt: Vec<u32>, sampler: Sampler, eos: u32, max_tokens: usize) -> Generation<'a> {
        Self::with(prompt, Held::Owned(sampler), eos, max_tokens)
    }

    /// [`Generation::new`] with a sampler the caller keeps (its random stream
    /// goes on from where this generation leaves it).
    pub fn lending(
        prompt: Vec<u32>,
        sampler: &'a mut Sampler,
        eos: u32,
        max_tokens: usize,
    ) -> Generation<'a> {
        Self::with(prompt, Held::Lent(sampler), eos, max_tokens)
    }

    fn with(prompt: Vec<u32>, sampler: Held<'a, Sampler>, eos: u32, max_tokens: usize) -> Self {
        Generation {
            sampler,
            constraint: None,
            text: None,
            eos,
            max_tokens,
            prompt_len: prompt.len(),
            history: prompt,
            fed: 0,
            generated: 0,
            start: None,
            ids: Vec::new(),
            unstepped: Vec::new(),
            emitted: Vec::new(),
            delta: String::new(),
            choosing: false,
            mask: TokenMask::none(0),
            mask_ready: false,
            finish: (max_tokens == 0).then_some(Finish::Length),
            stats: ConstraintStats::default(),
            nucleus_misses: 0,
            logprobs: None,
            chosen: None,
            logprobs_out: Vec::new(),
        }
    }

    /// Tokens the prompt's history starts with for the repetition penalty when
    /// the prompt is already in the engine (an empty `prompt`).
    pub fn with_history(mut self, history: &[u32]) -> Self {
        if self.prompt_len == 0 {
            self.history = history.to_vec();
        }
        self
    }

    /// The first `n` prompt ids are already in the engine (a state restored
    /// from a [`crate::session::prompt_cache::PromptCache`]): feeding starts
    /// after them. At least one prompt id stays to feed (its logits make the
    /// first choice); a larger `n` is cut to that.
    pub fn with_prompt_in_engine(mut self, n: usize) -> Self {
        self.fed = n.min(self.prompt_len.saturating_sub(1));
        self
    }

    /// The ids so far: the prompt, then the generated ones (the first
    /// [`Generation::prompt_len`] are the prompt).
    pub fn tokens(&self) -> &[u32] {
        &self.history
    }

    /// Keep each emitted token's log-probability and its position's `top`
    /// likeliest alternatives ([`Generation::take_logprobs`]; the values are
    /// described in [`crate::session::logprobs`]). The choices' readouts then
    /// carry the softmax denominator: a greedy, top-k or top-p (temperature 1)
    /// draw reads the device's top candidates, any other the full logits. The
    /// tokens drawn are the same as without logprobs.
    pub fn with_logprobs(mut self, top: usize) -> Self {
        self.logprobs = Some(top);
        self
    }

    /// The logprobs of the tokens emitted since the last call, one per token
    /// in the order of [`Generation::take_emitted`] (empty unless
    /// [`Generation::with_logprobs`]).
    pub fn take_logprobs(&mut self) -> Vec<TokenLogprob> {
        std::mem::take(&mut self.logprobs_out)
    }

    /// Keep the text as it grows, with its stop strings ([`Generation::take_delta`]).
    pub fn with_text(mut self, text: TextStream<'a>) -> Self {
        self.text = Some(text);
        self
    }

    /// Generate what `constraint` allows (owned), over `vocab` token ids.
    pub fn with_constraint(self, constraint: Constraint, vocab: usize) -> Self {
        self.constrained(Held::Owned(constraint), vocab)
    }

    /// [`Generation::with_constraint`] with a constraint the caller keeps.
    pub fn lending_constraint(self, constraint: &'a mut Constraint, vocab: usize) -> Self {
        self.constrained(Held::Lent(constraint), vocab)
    }

    fn constrained(mut self, mut c: Held<'a, Constraint>, vocab: usize) -> Self {
        self.eos = c.eos();
        self.mask = TokenMask::none(vocab);
        let forced = c.take_forced();
        let done = c.is_stopped();
        self.stats.forced += forced.len();
        self.constraint = Some(c);
        if !forced.is_empty() {
            self.start = Some((forced, done));
        } else if done {
            // The constraint allows no output at all.
            self.finish.get_or_insert(Finish::Complete);
        }
        self
    }

    /// Whether the generation has ended ([`Generation::finish`] says why).
    pub fn is_done(&self) -> bool {
        self.finish.is_some()
    }

    /// Why the generation ended, once it has.
    pub fn finish(&self) -> Option<Finish> {
        self.finish
    }

    /// Tokens generated so far (forced ones included).
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// The prompt's length.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// What the constraint has cost so far.
    pub fn constraint_stats(&self) -> &ConstraintStats {
        &self.stats
    }

    /// Top-p draws the engine's candidates could not decide (the full logits
    /// were read instead).
    pub fn nucleus_misses(&self) -> u64 {
        self.nucleus_misses
    }

    /// The text so far, if the generation keeps it.
    pub fn text(&self) -> Option<&TextStream<'a>> {
        self.text.as_ref()
    }

    /// End the generation now ([`Finish::Cancelled`]) unless it has ended.
    pub fn cancel(&mut self) {
        self.finish.get_or_insert(Finish::Cancelled);
    }

    /// The ids emitted since the last call (the tokens of the output, in order).
    pub fn take_emitted(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.emitted)
    }

    /// The text that may be shown since the last call: whole characters, never
    /// what could still become a stop string (empty without a text stream).
    pub fn take_delta(&mut self) -> String {
        std::mem::take(&mut self.delta)
    }

    /// Emitted ids that no step has fed yet (after the end: what a session
    /// appends so that it holds every generated token).
    pub fn take_unstepped(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.unstepped)
    }

    /// The next step, `None` once the generation has ended: feed
    /// [`Generation::ids`] (at most `chunk` prompt ids at a time; empty only for a
    /// generation whose prompt is already in the engine, whose first choice then
    /// reads the engine's last logits) and read out [`Next::readout`] after them,
    /// under [`Generation::mask`] when [`Next::masked`]. Once the prompt is in,
    /// the constraint's forced start is emitted here (and may end the
    /// generation: take what was emitted either way).
    ///
    /// # Errors
    /// Text decoding errors.
    pub fn next(&mut self, chunk: usize) -> Result<Option<Next>> {
        if self.finish.is_some() {
            return Ok(None);
        }
        self.ids.clear();
        self.mask_ready = false;
        if self.fed < self.prompt_len {
            let end = (self.fed + chunk.max(1)).min(self.prompt_len);
            self.ids.extend_from_slice(&self.history[self.fed..end]);
            self.fed = end;
            // After the whole prompt comes a choice, unless a forced start comes first.
            self.choosing = end == self.prompt_len && self.start.is_none();
        } else {
            if let Some((forced, done)) = self.start.take() {
                self.emit(&forced, done)?;
                if self.finish.is_some() {
                    return Ok(None);
                }
            }
            self.ids.append(&mut self.unstepped);
            self.choosing = true;
        }
        Ok(Some(Next {
            readout: if self.choosing {
                self.choice_readout()
            } else {
                Readout::None
            },
            masked: self.choosing && self.constraint.is_some(),
        }))
    }

    /// The ids of the step [`Generation::next`] handed out.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The readout the sampler needs: the device's argmax for greedy, its top-k
    /// candidates for top-k, its candidates and softmax denominator for top-p,
    /// else the logits. Logprobs need the denominator at temperature 1: the
    /// nucleus readout at 1 serves a greedy or top-k draw as well (its
    /// candidates hold theirs), anything else reads the logits.
    fn choice_readout(&self) -> Readout {
        let s = &*self.sampler;
        let plain = if s.is_greedy() {
            Readout::Argmax
        } else if let Some(k) = s.top_k_only() {
            Readout::TopK(k)
        } else if let Some(temperature) = s.top_p_only() {
            Readout::Nucleus { temperature }
        } else {
            Readout::Logits
        };
        if self.logprobs.is_none() {
            return plain;
        }
        const AT_ONE: Readout = Readout::Nucleus { temperature: 1.0 };
        match plain {
            Readout::Argmax => AT_ONE,
            Readout::TopK(k) if k <= NUCLEUS_CANDIDATES => AT_ONE,
            Readout::Nucleus { temperature: 1.0 } => AT_ONE,
            _ => Readout::Logits,
        }
    }

    /// The mask of the next choice (computed once per step, when first asked;
    /// a driver whose engine steps on a device asks while the device works).
    /// `None` without a constraint.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the constraint is in an error state.
    pub fn mask(&mut self) -> Result<Option<&TokenMask>> {
        let Some(c) = self.constraint.as_mut() else {
            return Ok(None);
        };
        if !self.mask_ready {
            let t0 = Instant::now();
            c.mask_into(&mut self.mask)?;
            let secs = t0.elapsed().as_secs_f64();
            self.stats.masks += 1;
            self.stats.mask_seconds += secs;
            self.stats.mask_us_each.push((secs * 1e6) as f32);
            self.mask_ready = true;
        }
        Ok(Some(&self.mask))
    }

    /// The mask computed for this step, if any (no new computation).
    pub fn current_mask(&self) -> Option<&TokenMask> {
        (self.constraint.is_some() && self.mask_ready).then_some(&self.mask)
    }

    /// Take the readout of the step [`Generation::next`] described: after a
    /// prompt chunk nothing, after a choice's step choose the next token, commit
    /// it to the constraint with what the constraint then forces, and emit them
    /// (up to the token limit, ending at a stop string).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a choice's step read nothing out or chose
    /// a token the mask does not allow, or when the constraint fails; text
    /// decoding errors.
    pub fn advance(&mut self, out: StepOut<'_>) -> Result<Progress> {
        if self.finish.is_some() {
            return Ok(self.progress());
        }
        if !self.choosing {
            return Ok(self.progress());
        }
        let s = &mut *self.sampler;
        let id = match out {
            StepOut::Token(id) => id,
            StepOut::Candidates(c) => s.sample_top_k(c),
            // A greedy or top-k draw from a logprobs readout's candidates.
            StepOut::Nucleus { candidates, .. } if s.is_greedy() => {
                crate::session::sample::best_candidate(candidates)
            }
            StepOut::Nucleus { candidates, .. } if s.top_k_only().is_some() => {
                s.sample_top_k(candidates)
            }
            StepOut::Nucleus {
                candidates,
                nucleus,
            } => match s.sample_nucleus(candidates, nucleus.total, nucleus.rel_err) {
                Some(id) => id,
                None => {
                    self.nucleus_misses += 1;
                    return Ok(Progress::NeedLogits);
                }
            },
            StepOut::Logits(l) => s.sample(l, &self.history),
            StepOut::None => {
                return Err(Error::InvalidArgument(
                    "generation: the step read nothing out for a choice".into(),
                ))
            }
        };
        self.choosing = false;
        if let Some(top) = self.logprobs {
            let entry = match out {
                StepOut::Logits(l) => TokenLogprob::from_logits(l, id, top),
                StepOut::Nucleus {
                    candidates,
                    nucleus,
                } => TokenLogprob::from_candidates(candidates, nucleus, id, top),
                _ => None,
            };
            self.chosen = Some(entry.ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "logprobs: the step's readout cannot give the log-probability of token {id}"
                ))
            })?);
        }
        if let Some(c) = self.constraint.as_mut() {
            if !(self.mask_ready && self.mask.is_allowed(id)) {
                return Err(Error::InvalidArgument(format!(
                    "constrained generation: the readout chose {id}, which the mask does not allow"
                )));
            }
            self.stats.chosen += 1;
            if id == self.eos {
                self.finish = Some(Finish::Complete);
                return Ok(self.progress());
            }
            c.commit(id)?;
            let mut ids = vec![id];
            let forced = c.take_forced();
            self.stats.forced += forced.len();
            ids.extend(forced);
            let done = c.is_stopped();
            self.emit(&ids, done)?;
        } else {
            if id == self.eos {
                self.finish = Some(Finish::Eos);
                return Ok(self.progress());
            }
            self.emit(&[id], false)?;
        }
        Ok(self.progress())
    }

    fn progress(&self) -> Progress {
        self.finish.map_or(Progress::Continue, Progress::Done)
    }

    /// Emit `ids` (to feed next), up to the token limit; `done`: the
    /// constraint's output is complete after them (unless the limit cut them).
    fn emit(&mut self, ids: &[u32], done: bool) -> Result<()> {
        let room = self.max_tokens - self.generated;
        let cut = ids.len() > room;
        for &id in &ids[..ids.len().min(room)] {
            if let Some(top) = self.logprobs {
                // The chosen token first; any after it were forced.
                let entry = self.chosen.take();
                let entry = entry.unwrap_or_else(|| TokenLogprob::forced(id, top));
                self.logprobs_out.push(entry);
            }
            self.generated += 1;
            self.history.push(id);
            self.emitted.push(id);
            self.unstepped.push(id);
            if let Some(text) = self.text.as_mut() {
                if let Some(d) = text.push(id)? {
                    self.delta.push_str(&d);
                }
                if text.stopped() {
                    self.finish = Some(Finish::StopString);
                    return Ok(());
                }
            }
        }
        if cut || (!done && self.generated >= self.max_tokens) {
            self.finish = Some(Finish::Length);
        } else if done {
            self.finish = Some(Finish::Complete);
        }
        Ok(())
    }

    /// What the generation produced, once it has ended (or so far): why it
    /// ended, its tokens and text, and the tool calls of a tool constraint's
    /// output that ended on its own (EOS or complete; not cut by a stop string
    /// or the limit), which make the `finish_reason` `tool_calls`.
    ///
    /// # Errors
    /// Text decoding errors; [`Error::InvalidArgument`] when a call in the
    /// output does not parse.
    pub fn output(&self) -> Result<Output> {
        let finish = self.finish.unwrap_or(Finish::Cancelled);
        let text = match &self.text {
            Some(t) => t.full()?,
            None => String::new(),
        };
        let tool_calls = match (&self.constraint, finish) {
            (Some(c), Finish::Eos | Finish::Complete) => c.tool_calls(&text)?,
            _ => Vec::new(),
        };
        let stop_string = self
            .text
            .as_ref()
            .and_then(|t| t.stop_string())
            .map(str::to_string);
        Ok(Output {
            finish,
            tokens: self.generated,
            text,
            tool_calls,
            stop_string,
        })
    }
}
