//! [`CpuEngine`]: the SPEC §4 token step in plain f32 on the CPU, composed from
//! the parts of [`super`]: one [`forward`] driver for a decode step (one token)
//! and the batched prefill (chunks of tokens), its state, scratch and hooks.

use super::forward::forward;
use super::hooks::{Probe, StepHooks};
use super::scratch::{chunk_len, Scratch, DEFAULT_CHUNK};
use super::state::{alloc, State};
use crate::config::Config;
use crate::constrain::TokenMask;
use crate::engine::{host_readout, host_readout_masked, Engine, Readout, StepOut};
use crate::error::{Error, Result};
use crate::precision::Precision;
use crate::profile::{KernelProfile, KernelTimer};
use crate::weights::Model;
use std::sync::Arc;

/// The CPU reference engine. Weights are shared through an [`Arc`], so many
/// engines (sessions) can run one loaded model.
#[derive(Debug)]
pub struct CpuEngine {
    model: Arc<Model>,
    state: State,
    /// Work buffers of the forward pass, sized for the longest chunk so far.
    scratch: Scratch,
    logits: Vec<f32>,
    /// Whether `logits` hold the last step's logits.
    logits_valid: bool,
    /// Tokens per prefill chunk.
    prefill_chunk: usize,
    /// The candidates of the last top-k or nucleus readout.
    candidates: Vec<(f32, u32)>,
    /// The logits of the last masked readout.
    masked: Vec<f32>,
}

impl CpuEngine {
    /// A fresh engine (position 0) for `model`.
    ///
    /// # Errors
    /// [`Error::Alloc`] if the KV cache or scratch buffers can't be allocated.
    pub fn new(model: Arc<Model>) -> Result<CpuEngine> {
        let c = &model.config;
        let mut scratch = Scratch::default();
        scratch.grow(c, 1)?;
        Ok(CpuEngine {
            state: State::new(&model)?,
            scratch,
            logits: alloc("logits", c.vocab)?,
            logits_valid: false,
            prefill_chunk: DEFAULT_CHUNK,
            candidates: Vec::new(),
            masked: Vec::new(),
            model,
        })
    }

    /// The model this engine runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Run the CQ matvecs in `precision` from the next step on (SPEC §6.1 fast:
    /// int8 activations inside the 1, 2 and 4-bit matvecs; default exact). The
    /// first fast engine of a model repacks its matrices for the fast kernels
    /// here (once; later engines of the model share them).
    pub fn set_precision(&mut self, precision: Precision) {
        if precision == Precision::Fast {
            super::fast::fast_set(&self.model);
        }
        self.scratch.prep.precision = precision;
    }

    /// Tokens per chunk of the batched prefill ([`crate::Engine::step_many`]):
    /// `n ≥ 1` (0 is taken as 1). Any value gives the same logits; larger chunks
    /// share each weight pass among more tokens (default 64).
    pub fn set_prefill_chunk(&mut self, n: usize) {
        self.prefill_chunk = n.max(1);
    }

    /// [`Engine::step`] that also hands every intermediate tensor to `probe`.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] if `token >= vocab`; the state is then unchanged.
    pub fn step_probed(
        &mut self,
        token: u32,
        want_logits: bool,
        probe: Option<&mut dyn Probe>,
    ) -> Result<Option<&[f32]>> {
        self.step_hooked(token, want_logits, StepHooks::new(probe, None))
    }

    /// [`Engine::step`] that reports each kernel of the step to `timer` with its wall
    /// time and byte estimate, cut where the GPU step has its dispatches (see
    /// [`crate::profile`]). Host work with no GPU kernel (RoPE table, attended
    /// slots) is not reported.
    ///
    /// # Errors
    /// As [`Engine::step`].
    pub fn step_timed(
        &mut self,
        token: u32,
        want_logits: bool,
        timer: &mut dyn KernelTimer,
    ) -> Result<Option<&[f32]>> {
        self.step_hooked(token, want_logits, StepHooks::new(None, Some(timer)))
    }

    /// Step every id of `tokens` with logits (real decode steps: the position
    /// advances) and time the kernels of each from [`std::time::Instant`] at their
    /// boundaries ([`CpuEngine::step_timed`]), averaged per token.
    ///
    /// # Errors
    /// As [`crate::Engine::step`]; steps before a failing one stay processed.
    pub fn profile(&mut self, tokens: &[u32]) -> Result<KernelProfile> {
        super::profile::profile(tokens, |t, tally| {
            self.step_timed(t, true, tally).map(|_| ())
        })
    }

    /// Prefill `ids` (all `< vocab`) in chunks as [`crate::Engine::step_many`]
    /// does, logits after the last one, and time the kernels of each chunk
    /// ([`CpuEngine::step_timed`]'s cuts), averaged per prompt token.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] naming the first id `>= vocab` (nothing runs),
    /// else as [`crate::Engine::step_many`].
    pub fn profile_prefill(&mut self, ids: &[u32]) -> Result<KernelProfile> {
        let vocab = self.model.config.vocab;
        if let Some(&token) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange { token, vocab });
        }
        let chunk = chunk_len(&self.model.config, self.prefill_chunk);
        let parts: Vec<&[u32]> = ids.chunks(chunk).collect();
        let last = parts.len().saturating_sub(1);
        self.logits_valid = false;
        let mut i = 0;
        let profile = super::profile::profile_runs(ids.len(), parts.len(), |tally| {
            let (st, s) = (&mut self.state, &mut self.scratch);
            let out = (i == last).then_some(&mut self.logits[..]);
            let r = forward(
                &self.model,
                st,
                s,
                parts[i],
                &mut StepHooks::new(None, Some(tally)),
                out,
            );
            i += 1;
            r
        })?;
        self.logits_valid = true;
        Ok(profile)
    }

    fn step_hooked(
        &mut self,
        token: u32,
        want_logits: bool,
        mut hooks: StepHooks,
    ) -> Result<Option<&[f32]>> {
        let (st, s) = (&mut self.state, &mut self.scratch);
        let out = want_logits.then_some(&mut self.logits[..]);
        if token as usize >= self.model.config.vocab {
            return Err(Error::TokenOutOfRange {
                token,
                vocab: self.model.config.vocab,
            });
        }
        self.logits_valid = false;
        forward(&self.model, st, s, &[token], &mut hooks, out)?;
        self.logits_valid = want_logits;
        Ok(want_logits.then_some(&self.logits[..]))
    }

    /// Append `ids` (all `< vocab`) by the batched prefill, a [`forward`] pass
    /// per chunk; logits after the last one when asked.
    ///
    /// # Errors
    /// As [`forward`], for the first chunk that fails (later ones don't run).
    fn prefill_ids(&mut self, ids: &[u32], want_logits: bool) -> Result<()> {
        self.logits_valid = false;
        let chunk = chunk_len(&self.model.config, self.prefill_chunk);
        let (st, s) = (&mut self.state, &mut self.scratch);
        for (i, part) in ids.chunks(chunk).enumerate() {
            let last = (i + 1) * chunk >= ids.len();
            let out = (want_logits && last).then_some(&mut self.logits[..]);
            forward(
                &self.model,
                st,
                s,
                part,
                &mut StepHooks::new(None, None),
                out,
            )?;
        }
        self.logits_valid = want_logits;
        Ok(())
    }

    /// The readout of the last step's logits (none for [`Readout::None`]).
    fn read_out(&mut self, readout: Readout) -> Result<StepOut<'_>> {
        if !(readout.needs_logits() && self.logits_valid) {
            return Ok(StepOut::None);
        }
        host_readout(&self.logits, readout, &mut self.candidates)
    }
}

impl Engine for CpuEngine {
    fn config(&self) -> &Config {
        &self.model.config
    }

    fn step(&mut self, token: u32, readout: Readout) -> Result<StepOut<'_>> {
        readout.validate()?;
        self.step_probed(token, readout.needs_logits(), None)?;
        self.read_out(readout)
    }

    fn last_logits(&mut self) -> Result<Option<&[f32]>> {
        Ok(self.logits_valid.then_some(&self.logits[..]))
    }

    fn readout(&mut self, readout: Readout, mask: Option<&TokenMask>) -> Result<StepOut<'_>> {
        readout.validate()?;
        if !self.logits_valid {
            return Err(Error::InvalidArgument(
                "readout: the last step computed no logits".into(),
            ));
        }
        host_readout_masked(
            &self.logits,
            readout,
            mask,
            &mut self.masked,
            &mut self.candidates,
        )
    }

    /// The batched prefill (see [`CpuEngine::set_prefill_chunk`]): the same
    /// logits, bit for bit, as one [`Engine::step`] per id, computed layer by
    /// layer for chunks of ids. An id `>= vocab` is an error after the ids
    /// before it have been appended. A NaN or infinity anywhere in a chunk is
    /// reported (as [`Error::NonFinite`] at its position) after the whole chunk.
    fn step_many(&mut self, ids: &[u32], readout: Readout) -> Result<StepOut<'_>> {
        readout.validate()?;
        let want_logits = readout.needs_logits();
        let vocab = self.model.config.vocab;
        let bad = ids.iter().position(|&t| t as usize >= vocab);
        let ok = &ids[..bad.unwrap_or(ids.len())];
        if !ok.is_empty() {
            self.prefill_ids(ok, want_logits && bad.is_none())?;
        }
        if let Some(i) = bad {
            return Err(Error::TokenOutOfRange {
                token: ids[i],
                vocab,
            });
        }
        if ids.is_empty() {
            return Ok(StepOut::None);
        }
        self.read_out(readout)
    }

    fn computes_on_host(&self) -> bool {
        true
    }

    fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    fn precision(&self) -> Precision {
        self.scratch.prep.precision
    }

    fn reset(&mut self) {
        self.logits_valid = false;
        self.state.reset();
    }

    fn position(&self) -> u64 {
        self.state.pos
    }

    fn describe(&self) -> String {
        describe(self.scratch.prep.precision)
    }
}

/// What a CPU engine or batch in `precision` says it is.
pub(super) fn describe(precision: crate::precision::Precision) -> String {
    format!(
        "cpu ({} threads, {precision} precision)",
        crate::pool::Pool::global().threads()
    )
}
