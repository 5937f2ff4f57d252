//! [`CpuEngine`]: the SPEC §4 token step in plain f32 on the CPU, as the
//! one-slot view of [`CpuBatch`]: every step, prefill chunk and readout of the
//! engine is a batch step of one item, so a sequence alone and a sequence in a
//! server's batch run the same code.

use super::batch::CpuBatch;
use super::hooks::{Probe, StepHooks};
use super::scratch::{chunk_len, DEFAULT_CHUNK};
use crate::constrain::TokenMask;
use crate::engine::precision::Precision;
use crate::engine::profile::{KernelProfile, KernelTimer};
use crate::engine::{BatchEngine, Engine, Readout, SavedSlot, SlotStep, StepOut};
use crate::error::{Error, Result};
use crate::model::config::Config;
use crate::model::weights::Model;
use std::sync::Arc;

/// The CPU reference engine. Weights are shared through an [`Arc`], so many
/// engines (sessions) can run one loaded model.
#[derive(Debug)]
pub struct CpuEngine {
    /// The sequence, in slot 0.
    batch: CpuBatch,
    /// Tokens per prefill chunk.
    prefill_chunk: usize,
}

impl CpuEngine {
    /// A fresh engine (position 0) for `model`.
    ///
    /// # Errors
    /// [`Error::Alloc`] if the KV cache or scratch buffers can't be allocated.
    pub fn new(model: Arc<Model>) -> Result<CpuEngine> {
        Ok(CpuEngine {
            batch: CpuBatch::new(model, 1, Precision::Exact)?,
            prefill_chunk: DEFAULT_CHUNK,
        })
    }

    /// The model this engine runs.
    pub fn model(&self) -> &Arc<Model> {
        self.batch.model()
    }

    /// Run the CQ matvecs in `precision` from the next step on (SPEC §6.1 fast:
    /// int8 activations inside the 1, 2 and 4-bit matvecs; default exact). The
    /// first fast engine of a model repacks its matrices for the fast kernels
    /// here (once; later engines of the model share them).
    pub fn set_precision(&mut self, precision: Precision) {
        self.batch.set_precision(precision);
    }

    /// Tokens per chunk of the batched prefill ([`crate::Engine::step_many`]):
    /// `n ≥ 1` (0 is taken as 1). Any value gives the same logits; larger chunks
    /// share each weight pass among more tokens (default 256).
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
        self.run(
            &[token],
            Readout::logits_if(want_logits),
            StepHooks::new(probe, None),
        )?;
        Ok(self.batch.logits(0))
    }

    /// [`Engine::step`] that reports each kernel of the step to `timer` with its wall
    /// time and byte estimate, cut where the GPU step has its dispatches (see
    /// [`crate::engine::profile`]). Host work with no GPU kernel (RoPE table, attended
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
        self.run(
            &[token],
            Readout::logits_if(want_logits),
            StepHooks::new(None, Some(timer)),
        )?;
        Ok(self.batch.logits(0))
    }

    /// Step every id of `tokens` with logits (real decode steps: the position
    /// advances) and time the kernels of each from [`std::time::Instant`] at their
    /// boundaries ([`CpuEngine::step_timed`]), averaged per token.
    ///
    /// # Errors
    /// As [`crate::Engine::step`]; steps before a failing one stay processed.
    pub fn profile(&mut self, tokens: &[u32]) -> Result<KernelProfile> {
        super::timing::profile(tokens, |t, tally| {
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
        let vocab = self.config().vocab;
        if let Some(&token) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange { token, vocab });
        }
        let parts: Vec<&[u32]> = ids.chunks(self.chunk()).collect();
        let mut i = 0;
        super::timing::profile_runs(ids.len(), parts.len(), |tally| {
            let readout = Readout::logits_if(i + 1 == parts.len());
            let r = self.run(parts[i], readout, StepHooks::new(None, Some(tally)));
            i += 1;
            r
        })
    }

    /// Tokens per chunk, as the model's width allows.
    fn chunk(&self) -> usize {
        chunk_len(&self.batch.model().config, self.prefill_chunk)
    }

    /// One batch step of `ids` (all `< vocab`) in slot 0, with `readout`.
    fn run(&mut self, ids: &[u32], readout: Readout, hooks: StepHooks) -> Result<()> {
        self.batch
            .step_hooked(&[SlotStep::new(0, ids, readout)], hooks)
    }
}

impl Engine for CpuEngine {
    fn config(&self) -> &Config {
        &self.batch.model().config
    }

    fn step(&mut self, token: u32, readout: Readout) -> Result<StepOut<'_>> {
        self.step_many(&[token], readout)
    }

    fn last_logits(&mut self) -> Result<Option<&[f32]>> {
        Ok(self.batch.logits(0))
    }

    fn readout(&mut self, readout: Readout, mask: Option<&TokenMask>) -> Result<StepOut<'_>> {
        self.batch.reread(0, readout, mask)
    }

    /// The batched prefill (see [`CpuEngine::set_prefill_chunk`]): the same
    /// logits, bit for bit, as one [`Engine::step`] per id, computed layer by
    /// layer for chunks of ids. An id `>= vocab` is an error after the ids
    /// before it have been appended. A NaN or infinity anywhere in a chunk is
    /// reported (as [`Error::NonFinite`] at its position) after the whole chunk.
    fn step_many(&mut self, ids: &[u32], readout: Readout) -> Result<StepOut<'_>> {
        readout.validate()?;
        let vocab = self.config().vocab;
        let bad = ids.iter().position(|&t| t as usize >= vocab);
        let ok = &ids[..bad.unwrap_or(ids.len())];
        let chunk = self.chunk();
        let parts = ok.len().div_ceil(chunk);
        for (i, part) in ok.chunks(chunk).enumerate() {
            let last = i + 1 == parts && bad.is_none();
            let r = if last { readout } else { Readout::None };
            self.run(part, r, StepHooks::new(None, None))?;
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
        Ok(self.batch.out(0))
    }

    fn computes_on_host(&self) -> bool {
        true
    }

    fn save(&mut self) -> Result<SavedSlot> {
        self.batch.save(0)
    }

    fn restore(&mut self, saved: &SavedSlot) -> Result<()> {
        self.batch.restore(0, saved)
    }

    fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    fn precision(&self) -> Precision {
        self.batch.precision()
    }

    fn reset(&mut self) {
        self.batch.reset(0);
    }

    fn position(&self) -> u64 {
        self.batch.position(0)
    }

    fn describe(&self) -> String {
        describe(self.precision())
    }
}

/// What a CPU engine or batch in `precision` says it is.
pub(super) fn describe(precision: crate::engine::precision::Precision) -> String {
    format!(
        "cpu ({} threads, {precision} precision)",
        crate::host::pool::Pool::global().threads()
    )
}
