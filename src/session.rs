//! [`Session`]: a model, an engine and the tokens so far — prefill, then generate.

pub use crate::builder::Backend;
use crate::builder::EngineBuilder;
use crate::engine::{Engine, Nucleus, Readout, StepOut};
use crate::error::{Error, Result};
use crate::sample::Sampler;
use crate::weights::Model;
use std::sync::Arc;

/// Prompt tokens handed to the engine per [`Engine::step_many`] call by
/// [`Session::prefill_with`] (one progress report each).
pub const PREFILL_PROGRESS_CHUNK: usize = 64;

/// Where the next token of a generation comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pending {
    /// Sampled from the session's logits.
    Logits,
    /// Already picked (greedy, on the engine).
    Id(u32),
    /// Sampled from the engine's top-k candidates.
    TopK,
    /// Sampled from the engine's top candidates and softmax denominator (top-p),
    /// or from the logits when those can't decide.
    Nucleus(Nucleus),
}

/// Why [`Session::generate`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It produced the requested number of tokens.
    Length,
    /// The model chose its end-of-sequence token (not emitted).
    Eos,
    /// The callback asked to stop.
    Callback,
}

/// A running conversation with one model.
pub struct Session {
    model: Arc<Model>,
    engine: Box<dyn Engine>,
    tokens: Vec<u32>,
    logits: Vec<f32>,
    /// The top-k candidates of the last step (when the sampler needs no more).
    candidates: Vec<(f32, u32)>,
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
            candidates: Vec::new(),
            fallback,
            nucleus_misses: 0,
        })
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

    /// Generate up to `n` tokens with `sampler`, calling `on_token` with each (it
    /// returns false to stop). Every emitted token is also stepped, so the session
    /// can continue. Stops early at the model's EOS (which is not emitted).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] before any prefill; step errors.
    pub fn generate(
        &mut self,
        sampler: &mut Sampler,
        n: usize,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Stop> {
        if self.logits.is_empty() {
            return Err(Error::InvalidArgument(
                "generate needs a prefilled prompt".into(),
            ));
        }
        let eos = self.model.config.eos;
        // A greedy sampler lets the engine pick on the device, a top-k sampler lets
        // it hand over just the k best logits (the GPU then reads back 8 bytes, or
        // its top-k buffer of about 2 KiB); the full logits are fetched once at the end. The draw for a
        // token happens when it is needed, so the sampler's random sequence is
        // the same on every path.
        let greedy = sampler.is_greedy();
        let top_k = if greedy { None } else { sampler.top_k_only() };
        // A top-p sampler without a top-k takes the engine's best candidates and
        // softmax denominator, falling back to the logits when they can't decide.
        let top_p = if greedy || top_k.is_some() {
            None
        } else {
            sampler.top_p_only()
        };
        let mut pending = Pending::Logits;
        let mut stop = Stop::Length;
        for _ in 0..n {
            let next = match pending {
                Pending::Id(id) => id,
                Pending::TopK => sampler.sample_top_k(&self.candidates),
                Pending::Nucleus(nu) => {
                    match sampler.sample_nucleus(&self.candidates, nu.total, nu.rel_err) {
                        Some(id) => id,
                        None => {
                            self.nucleus_misses += 1;
                            self.logits.clear();
                            if let Some(l) = self.engine.last_logits()? {
                                self.logits.extend_from_slice(l);
                            }
                            sampler.sample(&self.logits, &self.tokens)
                        }
                    }
                }
                Pending::Logits => sampler.sample(&self.logits, &self.tokens),
            };
            if next == eos {
                stop = Stop::Eos;
                break;
            }
            let readout = if greedy {
                Readout::Argmax
            } else if let Some(k) = top_k {
                Readout::TopK(k)
            } else if let Some(temperature) = top_p {
                Readout::Nucleus { temperature }
            } else {
                Readout::Logits
            };
            pending = match self.engine.step(next, readout)? {
                StepOut::Token(id) => Pending::Id(id),
                StepOut::Candidates(c) => {
                    self.candidates.clear();
                    self.candidates.extend_from_slice(c);
                    Pending::TopK
                }
                StepOut::Nucleus {
                    candidates,
                    nucleus,
                } => {
                    self.candidates.clear();
                    self.candidates.extend_from_slice(candidates);
                    Pending::Nucleus(nucleus)
                }
                StepOut::Logits(l) => {
                    self.logits.clear();
                    self.logits.extend_from_slice(l);
                    Pending::Logits
                }
                StepOut::None => {
                    return Err(Error::InvalidArgument(
                        "the engine returned no readout".into(),
                    ))
                }
            };
            self.tokens.push(next);
            if !on_token(next) {
                stop = Stop::Callback;
                break;
            }
        }
        if pending != Pending::Logits {
            if let Some(l) = self.engine.last_logits()? {
                self.logits.clear();
                self.logits.extend_from_slice(l);
            }
        }
        Ok(stop)
    }
}
