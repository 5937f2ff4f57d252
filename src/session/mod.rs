//! [`Session`]: a model, an engine and the tokens so far — prefill, then generate.

pub use crate::builder::Backend;
use crate::builder::EngineBuilder;
use crate::constrain::{Constraint, TokenMask};
use crate::engine::{Engine, Nucleus, Readout, StepOut};
use crate::error::{Error, Result};
use crate::sample::Sampler;
use crate::weights::Model;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

/// Prompt tokens handed to the engine per [`Engine::step_many`] call by
/// [`Session::prefill_with`] (one progress report each).
pub const PREFILL_PROGRESS_CHUNK: usize = 256;

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

/// Why [`Session::generate`] or [`Session::generate_constrained`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It produced the requested number of tokens.
    Length,
    /// The model chose its end-of-sequence token (not emitted).
    Eos,
    /// The callback asked to stop.
    Callback,
    /// The constraint's output is complete: no token can follow, or the model
    /// chose EOS where the output may end (EOS is not emitted).
    Complete,
}

/// What a constrained generation spent on its constraint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConstraintStats {
    /// Each mask's time in µs, in order.
    pub mask_us_each: Vec<f32>,
    /// Token masks computed.
    pub masks: usize,
    /// Seconds spent computing them (beside the steps on a side thread, or
    /// before each step with an engine that computes on this CPU).
    pub mask_seconds: f64,
    /// Seconds the generation waited for masks: after its step had finished
    /// (side thread), or all of their time (computed before the steps).
    pub mask_wait_seconds: f64,
    /// Tokens the constraint forced (appended without a choice, in chunks).
    pub forced: usize,
    /// Tokens chosen under a mask.
    pub chosen: usize,
}

impl ConstraintStats {
    /// Mean mask time per mask, in µs (0 without masks).
    pub fn mask_us(&self) -> f64 {
        if self.masks == 0 {
            0.0
        } else {
            self.mask_seconds * 1e6 / self.masks as f64
        }
    }
}

/// What the main thread asks the constraint's side thread.
/// What the side thread answers: the next mask and the seconds it took.
struct SideMask(Result<TokenMask>, f64);

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
            candidates: Vec::new(),
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

    /// Choose the next token from the engine's last logits under `mask`, as
    /// `sampler` would from the logits with the disallowed tokens removed (the
    /// engine's masked readouts: on the GPU the mask is applied on the device).
    fn choose_masked(&mut self, sampler: &mut Sampler, mask: &TokenMask) -> Result<u32> {
        let id = if sampler.is_greedy() {
            self.engine.readout(Readout::Argmax, Some(mask))?.token()
        } else if let Some(k) = sampler.top_k_only() {
            let c = self.engine.readout(Readout::TopK(k), Some(mask))?;
            c.candidates().map(|c| sampler.sample_top_k(c))
        } else {
            let drawn = match sampler.top_p_only() {
                Some(temperature) => match self
                    .engine
                    .readout(Readout::Nucleus { temperature }, Some(mask))?
                {
                    StepOut::Nucleus {
                        candidates,
                        nucleus,
                    } => sampler.sample_nucleus(candidates, nucleus.total, nucleus.rel_err),
                    _ => None,
                },
                None => None,
            };
            match drawn {
                Some(id) => Some(id),
                None => {
                    let l = self.engine.readout(Readout::Logits, Some(mask))?;
                    l.logits().map(|l| sampler.sample(l, &self.tokens))
                }
            }
        };
        match id {
            Some(id) if mask.is_allowed(id) => Ok(id),
            other => Err(Error::InvalidArgument(format!(
                "constrained generation: the readout chose {other:?}, which the mask does not allow"
            ))),
        }
    }

    /// Generate up to `n` tokens that satisfy `constraint`, with `sampler` over
    /// the allowed tokens of each step, calling `on_token` with each (it returns
    /// false to stop). Tokens the constraint forces are appended as one prefill
    /// chunk each time, not sampled; EOS is allowed only where the output may end
    /// and is not emitted; generation stops once the output is complete. The mask
    /// of the next token depends only on the tokens already chosen: with an
    /// engine that steps on a device it is computed on a side thread while the
    /// engine runs the step, with one that computes on this CPU
    /// ([`Engine::computes_on_host`]) just before the step. Every emitted token
    /// is also stepped, so the session can continue.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] before any prefill or when the constraint fails;
    /// step errors.
    pub fn generate_constrained(
        &mut self,
        sampler: &mut Sampler,
        n: usize,
        constraint: &mut Constraint,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Stop, ConstraintStats)> {
        if self.logits.is_empty() {
            return Err(Error::InvalidArgument(
                "generate needs a prefilled prompt".into(),
            ));
        }
        let vocab = self.model.config.vocab;
        let eos = constraint.eos();
        let mut stats = ConstraintStats::default();
        // The next mask depends only on the tokens already chosen. With an
        // engine that steps on a device, a side thread computes it while the
        // engine steps; with one that steps on this CPU, here before the step
        // (a thread beside the step would only take a core from it). The
        // commits (fast) run here either way.
        let beside = !self.engine.computes_on_host();
        let shared = std::sync::Mutex::new(constraint);
        let lock = || shared.lock().unwrap_or_else(|e| e.into_inner());
        let (to_side, side_in) = mpsc::channel::<TokenMask>();
        let (side_out, from_side) = mpsc::channel::<SideMask>();
        let side_error = || {
            Error::InvalidArgument("constrained generation: the constraint thread stopped".into())
        };
        let stop = std::thread::scope(|scope| -> Result<Stop> {
            // Owned here, so returning closes the channel and ends the side thread
            // (the scope waits for it).
            let to_side = to_side;
            let shared = &shared;
            if beside {
                scope.spawn(move || {
                    let lock = || shared.lock().unwrap_or_else(|e| e.into_inner());
                    while let Ok(mut m) = side_in.recv() {
                        let t0 = Instant::now();
                        let r = lock().mask_into(&mut m).map(|_| m);
                        if side_out
                            .send(SideMask(r, t0.elapsed().as_secs_f64()))
                            .is_err()
                        {
                            return;
                        }
                    }
                });
            }
            let mut emitted = 0usize;
            let mut mask = Some(TokenMask::none(vocab));
            // The mask computed here (not beside).
            let mut ready: Option<SideMask> = None;
            let mut chunk: Vec<u32> = Vec::new();
            // Forced tokens at the start.
            let (mut forced, mut done) = {
                let mut c = lock();
                (c.take_forced(), c.is_stopped())
            };
            loop {
                stats.forced += forced.len();
                chunk.append(&mut forced);
                chunk.truncate(n - emitted);
                if !done && emitted + chunk.len() < n {
                    let mut m = mask.take().unwrap_or_else(|| TokenMask::none(vocab));
                    if beside {
                        if to_side.send(m).is_err() {
                            return Err(side_error());
                        }
                    } else {
                        let t0 = Instant::now();
                        let r = lock().mask_into(&mut m).map(|_| m);
                        ready = Some(SideMask(r, t0.elapsed().as_secs_f64()));
                    }
                }
                if !chunk.is_empty() {
                    self.engine.step_many(&chunk, Readout::Deferred)?;
                    self.tokens.extend_from_slice(&chunk);
                }
                for &t in &chunk {
                    emitted += 1;
                    if !on_token(t) {
                        return Ok(Stop::Callback);
                    }
                }
                chunk.clear();
                if done {
                    return Ok(Stop::Complete);
                }
                if emitted >= n {
                    return Ok(Stop::Length);
                }
                let waited = Instant::now();
                let got = match ready.take() {
                    Some(here) => Ok(here),
                    None => from_side.recv(),
                };
                let Ok(SideMask(m, secs)) = got else {
                    return Err(side_error());
                };
                if beside {
                    stats.mask_wait_seconds += waited.elapsed().as_secs_f64();
                } else {
                    stats.mask_wait_seconds += secs;
                }
                stats.masks += 1;
                stats.mask_seconds += secs;
                stats.mask_us_each.push((secs * 1e6) as f32);
                let m = m?;
                let next = self.choose_masked(sampler, &m)?;
                mask = Some(m);
                stats.chosen += 1;
                if next == eos {
                    return Ok(Stop::Complete);
                }
                let mut c = lock();
                c.commit(next)?;
                (forced, done) = (c.take_forced(), c.is_stopped());
                drop(c);
                chunk.push(next);
            }
        });
        // The side thread ends when its channel closes (here, or on its own).
        let stop = stop?;
        self.logits.clear();
        if let Some(l) = self.engine.last_logits()? {
            self.logits.extend_from_slice(l);
        }
        Ok((stop, stats))
    }
}
