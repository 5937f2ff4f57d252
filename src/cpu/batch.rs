//! [`CpuBatch`]: several sequences of one model stepped together, so each pass
//! over a weight matrix serves one token (or a prefill chunk) of every sequence
//! at once: continuous batching for a server. Each slot has its own state
//! (position, history, engram rings, KV cache); the weights and the work buffers
//! are shared.

use super::forward::{forward_many, Segment};
use super::hooks::StepHooks;
use super::scratch::Scratch;
use super::state::{alloc, State};
use crate::error::Result;
use crate::precision::Precision;
use crate::profile::{KernelTally, KernelTimer};
use crate::weights::Model;
use std::sync::Arc;

/// Sequences of one model in slots, stepped together by [`CpuBatch::step`].
pub struct CpuBatch {
    model: Arc<Model>,
    states: Vec<State>,
    scratch: Scratch,
    logits: Vec<f32>,
    /// Work items of the last step (its logits are `[items, vocab]`).
    items: usize,
}

impl std::fmt::Debug for CpuBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBatch")
            .field("slots", &self.states.len())
            .finish_non_exhaustive()
    }
}

impl CpuBatch {
    /// `slots` empty sequences (position 0) of `model`, their matvecs in
    /// `precision`.
    ///
    /// # Errors
    /// [`Error::Alloc`](crate::Error::Alloc) if a KV cache or the buffers can't be allocated.
    pub fn new(model: Arc<Model>, slots: usize, precision: Precision) -> Result<CpuBatch> {
        let mut scratch = Scratch::default();
        scratch.grow(&model.config, slots.max(1))?;
        scratch.prep.precision = precision;
        if precision == Precision::Fast {
            super::fast::fast_set(&model);
        }
        let states = (0..slots.max(1))
            .map(|_| State::new(&model))
            .collect::<Result<Vec<_>>>()?;
        Ok(CpuBatch {
            logits: alloc("logits", model.config.vocab * slots.max(1))?,
            model,
            states,
            scratch,
            items: 0,
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.states.len()
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Empty slot `slot` (its next token is at position 0).
    ///
    /// # Panics
    /// If `slot >= slots`.
    pub fn reset(&mut self, slot: usize) {
        self.states[slot].reset();
    }

    /// Tokens processed by slot `slot` since its reset.
    ///
    /// # Panics
    /// If `slot >= slots`.
    pub fn position(&self, slot: usize) -> u64 {
        self.states[slot].pos
    }

    /// Append each `(slot, ids)` of `work` (distinct slots, at least one id each,
    /// all `< vocab`) to its slot in one pass, and return the logits after each
    /// item's last id, `[work.len(), vocab]` in `work`'s order. Every item's logits
    /// are bit-identical to stepping its slot alone (the batched matvecs are
    /// bit-identical to single ones).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a slot out of range or repeated, an empty
    /// item, or nothing to do; [`Error::TokenOutOfRange`](crate::Error::TokenOutOfRange) for an id `>= vocab`
    /// (nothing is stepped then); [`Error::NonFinite`](crate::Error::NonFinite) / [`Error::Alloc`](crate::Error::Alloc) as a
    /// step's (the slots have then advanced).
    pub fn step(&mut self, work: &[(usize, &[u32])]) -> Result<&[f32]> {
        self.step_hooked(work, None)
    }

    /// [`CpuBatch::step`] with its kernels timed into `tally` (timers at the
    /// boundaries of the GPU's dispatches, as [`crate::CpuEngine::profile`]).
    ///
    /// # Errors
    /// As [`CpuBatch::step`].
    pub fn step_timed(
        &mut self,
        work: &[(usize, &[u32])],
        tally: &mut KernelTally,
    ) -> Result<&[f32]> {
        self.step_hooked(work, Some(tally))
    }

    fn step_hooked(
        &mut self,
        work: &[(usize, &[u32])],
        tally: Option<&mut KernelTally>,
    ) -> Result<&[f32]> {
        let vocab = self.model.config.vocab;
        crate::engine::check_batch_work(work, self.states.len(), vocab)?;
        self.items = 0;
        if self.logits.len() < work.len() * vocab {
            self.logits = alloc("logits", work.len() * vocab)?;
        }
        // Disjoint mutable borrows of the work's states, in work order.
        let mut refs: Vec<Option<&mut State>> = self.states.iter_mut().map(Some).collect();
        let mut segs: Vec<Segment<'_>> = work
            .iter()
            .map(|&(slot, ids)| Segment {
                st: refs[slot].take().expect("distinct slots"),
                ids,
            })
            .collect();
        let out = &mut self.logits[..work.len() * vocab];
        forward_many(
            &self.model,
            &mut segs,
            &mut self.scratch,
            &mut StepHooks::new(None, tally.map(|t| t as &mut dyn KernelTimer)),
            Some(out),
        )?;
        self.items = work.len();
        Ok(&self.logits[..work.len() * vocab])
    }

    /// The logits of the last [`CpuBatch::step`] that succeeded, `[items, vocab]`
    /// (empty before any).
    pub fn last_logits(&self) -> &[f32] {
        &self.logits[..self.items * self.model.config.vocab]
    }
}

impl crate::engine::BatchEngine for CpuBatch {
    fn model(&self) -> &Arc<Model> {
        CpuBatch::model(self)
    }
    fn slots(&self) -> usize {
        CpuBatch::slots(self)
    }
    fn reset(&mut self, slot: usize) {
        CpuBatch::reset(self, slot);
    }
    fn step(&mut self, work: &[(usize, &[u32])]) -> Result<&[f32]> {
        CpuBatch::step(self, work)
    }
    fn step_timed(
        &mut self,
        work: &[(usize, &[u32])],
        _timing: crate::gpu::profile::GpuTiming,
        tally: &mut KernelTally,
    ) -> Result<String> {
        CpuBatch::step_timed(self, work, tally)?;
        Ok(super::profile::METHOD.to_string())
    }
    fn last_logits(&self) -> &[f32] {
        CpuBatch::last_logits(self)
    }
    fn describe(&self) -> String {
        super::engine::describe(self.scratch.prep.precision)
    }
    fn precision(&self) -> Precision {
        self.scratch.prep.precision
    }
}
