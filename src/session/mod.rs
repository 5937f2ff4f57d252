//! What runs on an engine: [`builder::EngineBuilder`] chooses and builds it,
//! [`sample::Sampler`] chooses tokens, [`tokenizer`] turns text into ids and
//! ids into streamed text, [`Generation`] is one sequence's generation (the one
//! loop of the CLI, the library and the server), and [`Session`] holds a model,
//! an engine and the tokens so far: prefill, then run generations.

pub mod builder;
mod generation;
pub mod logprobs;
mod output;
pub mod prompt_cache;
pub mod sample;
mod select;
pub mod tokenizer;

pub use builder::Backend;
pub use generation::{Generation, Next, Progress};
pub use output::{ConstraintStats, Finish, Output};

/// What a generation emitted since the driver last looked
/// ([`Session::run`]'s callback).
#[derive(Debug, Clone, Copy)]
pub struct Emitted<'a> {
    /// The tokens, in order.
    pub ids: &'a [u32],
    /// The text they add that may be shown (whole characters, nothing that
    /// could still become a stop string; empty without a text stream).
    pub text: &'a str,
}

use crate::constrain::Constraint;
use crate::engine::{Engine, Readout};
use crate::error::{Error, Result};
use crate::model::weights::Model;
use builder::EngineBuilder;
use sample::Sampler;
use std::sync::Arc;

/// Prompt tokens handed to the engine per [`Engine::step_many`] call by
/// [`Session::prefill_with`] (one progress report each).
pub const PREFILL_PROGRESS_CHUNK: usize = 256;

/// A running conversation with one model.
pub struct Session {
    model: Arc<Model>,
    engine: Box<dyn Engine>,
    tokens: Vec<u32>,
    logits: Vec<f32>,
    /// The ids of the step being fed (reused).
    feed: Vec<u32>,
    fallback: Option<String>,
    /// Top-p draws the candidates could not decide (they fetched the logits).
    nucleus_misses: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("engine", &self.engine.describe())
            .field("tokens", &self.tokens.len())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session at position 0 on `backend` (with the engines' default options;
    /// [`Session::from_builder`] takes any [`EngineBuilder`]).
    ///
    /// # Errors
    /// [`Error::Gpu`] for `Backend::Gpu` without a usable adapter; allocation errors.
    pub fn new(model: Arc<Model>, backend: Backend) -> Result<Session> {
        Self::from_builder(EngineBuilder::new(model).backend(backend))
    }

    /// A session at position 0 on the engine `builder` builds.
    ///
    /// # Errors
    /// As [`EngineBuilder::build`].
    pub fn from_builder(builder: EngineBuilder) -> Result<Session> {
        let model = Arc::clone(builder.model());
        let (engine, fallback) = builder.build()?;
        Ok(Session {
            model,
            engine,
            tokens: Vec::new(),
            logits: Vec::new(),
            feed: Vec::new(),
            fallback,
            nucleus_misses: 0,
        })
    }

    /// A session at `engine`'s position over `model` (the model the engine runs),
    /// e.g. for an engine built with options the builder does not have.
    ///
    /// # Panics
    /// If `engine` runs a model of another config.
    pub fn from_engine(engine: Box<dyn Engine>, model: Arc<Model>) -> Session {
        assert_eq!(engine.config(), &model.config, "from_engine: another model");
        Session {
            model,
            engine,
            tokens: Vec::new(),
            logits: Vec::new(),
            feed: Vec::new(),
            fallback: None,
            nucleus_misses: 0,
        }
    }

    /// The engine (e.g. for [`Engine::describe`]).
    pub fn engine(&self) -> &dyn Engine {
        self.engine.as_ref()
    }

    /// Why `Backend::Auto` runs on the CPU, if it does (one line).
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// How many top-p draws (without a top-k) of this session's generations the
    /// engine's top candidates could not decide, so the full logits were fetched.
    pub fn nucleus_misses(&self) -> u64 {
        self.nucleus_misses
    }

    /// Every token processed so far (prompt and generated), oldest first.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The logits after the last processed token (empty before any).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Forget all tokens.
    pub fn reset(&mut self) {
        self.engine.reset();
        self.tokens.clear();
        self.logits.clear();
    }

    /// Save the state after [`Session::tokens`] (the session goes on
    /// unchanged), e.g. for a [`prompt_cache::PromptCache`].
    ///
    /// # Errors
    /// As [`Engine::save`].
    pub fn save(&mut self) -> Result<crate::engine::SavedSlot> {
        self.engine.save()
    }

    /// Continue from `saved`, the state after `tokens` (a [`Session::save`] of
    /// a session of this model on the same backend): the tokens become
    /// `tokens`, and no logits are held until the next prefill, which goes on
    /// bit for bit as the saved session's would have.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `saved` holds another number of tokens
    /// than `tokens`; as [`Engine::restore`] (the session is then unchanged).
    pub fn restore(&mut self, tokens: &[u32], saved: &crate::engine::SavedSlot) -> Result<()> {
        if saved.position() != tokens.len() as u64 {
            return Err(Error::InvalidArgument(format!(
                "restore: the state holds {} tokens, not {}",
                saved.position(),
                tokens.len()
            )));
        }
        self.engine.restore(saved)?;
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
        self.logits.clear();
        Ok(())
    }

    /// Append `ids` (logits only for the last one).
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for an id `>= vocab` (checked before any is processed).
    pub fn prefill(&mut self, ids: &[u32]) -> Result<()> {
        self.prefill_with(ids, |_| true).map(|_| ())
    }

    /// [`Session::prefill`] calling `progress(done)` after each chunk of
    /// [`PREFILL_PROGRESS_CHUNK`] tokens (the engine's batched prefill); it stops early
    /// when `progress` returns false, and then no logits are kept (generation needs a
    /// complete prefill). Returns how many ids were processed.
    ///
    /// # Errors
    /// As [`Session::prefill`].
    pub fn prefill_with(
        &mut self,
        ids: &[u32],
        mut progress: impl FnMut(usize) -> bool,
    ) -> Result<usize> {
        let vocab = self.model.config.vocab;
        if let Some(&token) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange { token, vocab });
        }
        self.logits.clear();
        // Chunks of the engine's batched prefill, with progress between them.
        let mut done = 0;
        for part in ids.chunks(PREFILL_PROGRESS_CHUNK) {
            let last = done + part.len() == ids.len();
            let readout = Readout::logits_if(last);
            if let Some(l) = self.engine.step_many(part, readout)?.logits() {
                self.logits.extend_from_slice(l);
            }
            self.tokens.extend_from_slice(part);
            done += part.len();
            if !progress(done) && !last {
                return Ok(done);
            }
        }
        Ok(ids.len())
    }

    /// Generate up to `n` tokens with `sampler` after the prefilled prompt,
    /// calling `on_token` with each (it returns false to stop:
    /// [`Finish::Cancelled`]). Stops early at the model's EOS (not emitted).
    /// Every emitted token is also stepped, so the session can continue.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] before any prefill; step errors.
    pub fn generate(
        &mut self,
        sampler: &mut Sampler,
        n: usize,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<Finish> {
        let eos = self.model.config.eos;
        let mut g = Generation::lending(Vec::new(), sampler, eos, n).with_history(&self.tokens);
        self.run(&mut g, each_token(on_token))
    }

    /// Generate up to `n` tokens that satisfy `constraint`, with `sampler` over
    /// the allowed tokens of each step, calling `on_token` with each (false
    /// stops). Tokens the constraint forces are appended as one prefill chunk
    /// each time, not sampled; EOS is allowed only where the output may end and
    /// is not emitted; generation stops once the output is complete
    /// ([`Finish::Complete`]). Every emitted token is also stepped.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] before any prefill or when the constraint
    /// fails; step errors.
    pub fn generate_constrained(
        &mut self,
        sampler: &mut Sampler,
        n: usize,
        constraint: &mut Constraint,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Finish, ConstraintStats)> {
        let (eos, vocab) = (self.model.config.eos, self.model.config.vocab);
        let mut g = Generation::lending(Vec::new(), sampler, eos, n)
            .with_history(&self.tokens)
            .lending_constraint(constraint, vocab);
        let finish = self.run(&mut g, each_token(on_token))?;
        Ok((finish, g.constraint_stats().clone()))
    }

    /// Run `generation` to its end on this session's engine, calling `on_emit`
    /// with what it emits (false cancels it). Its prompt, if it has one,
    /// is appended first; with none, its first choice reads the logits the
    /// session's last step left. Each step reads out only what the sampler
    /// needs (on the GPU: the argmax or top-k on the device); a constrained
    /// step computes its mask while a device engine runs the step and applies
    /// it to the readout (on the GPU, on the device). The tokens emitted last
    /// are appended too, so the session holds every token and the logits after
    /// the last one.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a generation without a prompt before any
    /// prefill; the generation's and the engine's errors.
    pub fn run(
        &mut self,
        generation: &mut Generation<'_>,
        mut on_emit: impl FnMut(Emitted<'_>) -> bool,
    ) -> Result<Finish> {
        let g = generation;
        if g.prompt_len() == 0 && self.logits.is_empty() {
            return Err(Error::InvalidArgument(
                "generate needs a prefilled prompt".into(),
            ));
        }
        let mut emit = |g: &mut Generation<'_>| {
            let (ids, text) = (g.take_emitted(), g.take_delta());
            if (!ids.is_empty() || !text.is_empty())
                && !on_emit(Emitted {
                    ids: &ids,
                    text: &text,
                })
            {
                g.cancel();
            }
        };
        self.logits.clear();
        loop {
            let next = g.next(usize::MAX)?;
            emit(g);
            let Some(next) = next.filter(|_| !g.is_done()) else {
                break;
            };
            self.feed.clear();
            self.feed.extend_from_slice(g.ids());
            let engine = &mut self.engine;
            let out = if next.masked {
                // A device works on the step while the mask is computed here.
                if !self.feed.is_empty() {
                    engine.step_many(&self.feed, Readout::Deferred)?;
                }
                let mask = g.mask()?;
                engine.readout(next.readout, mask)?
            } else if self.feed.is_empty() {
                engine.readout(next.readout, None)?
            } else {
                engine.step_many(&self.feed, next.readout)?
            };
            self.tokens.extend_from_slice(&self.feed);
            if g.advance(out)? == Progress::NeedLogits {
                let out = engine.readout(Readout::Logits, g.current_mask())?;
                g.advance(out)?;
            }
            emit(g);
        }
        self.nucleus_misses += g.nucleus_misses();
        let rest = g.take_unstepped();
        if !rest.is_empty() {
            self.engine.step_many(&rest, Readout::Deferred)?;
            self.tokens.extend_from_slice(&rest);
        }
        if let Some(l) = self.engine.last_logits()? {
            self.logits.extend_from_slice(l);
        }
        Ok(g.finish().unwrap_or(Finish::Cancelled))
    }
}

/// A [`Session::run`] callback that hands `on_token` each emitted token
/// (stopping at the first that it refuses).
fn each_token(mut on_token: impl FnMut(u32) -> bool) -> impl FnMut(Emitted<'_>) -> bool {
    move |e| e.ids.iter().all(|&id| on_token(id))
}
