//! [`CpuBatch`]: several sequences of one model stepped together, so each pass
//! over a weight matrix serves one token (or a prefill chunk) of every sequence
//! at once: continuous batching for a server. Each slot has its own state
//! (position, history, engram rings, KV cache); the weights and the work buffers
//! are shared.

use super::forward::{forward_many, Segment};
use super::hooks::StepHooks;
use super::scratch::Scratch;
use super::state::{alloc, State};
use crate::constrain::TokenMask;
use crate::engine::{host_readout_masked, BatchEngine, ItemOuts, Readout, SlotStep, StepOut};
use crate::error::{Error, Result};
use crate::precision::Precision;
use crate::profile::{KernelTally, KernelTimer};
use crate::weights::Model;
use std::sync::Arc;

/// Sequences of one model in slots, stepped together by [`CpuBatch::step`].
pub struct CpuBatch {
    model: Arc<Model>,
    states: Vec<State>,
    scratch: Scratch,
    /// The logits of the last step's items that computed them, `[rows, vocab]`.
    logits: Vec<f32>,
    /// Per item of the last step, its row of `logits` (none without logits).
    rows: Vec<Option<usize>>,
    /// The last step's readouts.
    outs: ItemOuts,
    /// Buffers of a masked or top-k host readout.
    masked: Vec<f32>,
    candidates: Vec<(f32, u32)>,
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
            rows: Vec::new(),
            outs: ItemOuts::default(),
            masked: Vec::new(),
            candidates: Vec::new(),
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

    /// Append each item of `work` to its slot in one pass and read out what each
    /// asks ([`CpuBatch::out`]); the logits are computed only for the items
    /// whose readout needs them. Every item's readout is bit-identical to its
    /// slot stepped alone (the batched matvecs are bit-identical to single ones).
    ///
    /// # Errors
    /// As [`BatchEngine::step`].
    pub fn step(&mut self, work: &[SlotStep<'_>]) -> Result<()> {
        self.step_hooked(work, None)
    }

    /// [`CpuBatch::step`] with its kernels timed into `tally` (timers at the
    /// boundaries of the GPU's dispatches, as [`crate::CpuEngine::profile`]).
    ///
    /// # Errors
    /// As [`CpuBatch::step`].
    pub fn step_timed(&mut self, work: &[SlotStep<'_>], tally: &mut KernelTally) -> Result<()> {
        self.step_hooked(work, Some(tally))
    }

    /// What the last step read out for its item `item` ([`StepOut::None`] past
    /// its items or for an item that asked for none).
    pub fn out(&self, item: usize) -> StepOut<'_> {
        self.outs.get(item)
    }

    fn step_hooked(
        &mut self,
        work: &[SlotStep<'_>],
        tally: Option<&mut KernelTally>,
    ) -> Result<()> {
        let vocab = self.model.config.vocab;
        crate::engine::check_batch_work(work, self.states.len(), vocab)?;
        self.outs.begin(work.len());
        self.rows.clear();
        let wanted = work.iter().filter(|w| w.readout.needs_logits()).count();
        if self.logits.len() < wanted * vocab {
            self.logits = alloc("logits", wanted * vocab)?;
        }
        // Disjoint mutable borrows of the work's states, in work order.
        let mut refs: Vec<Option<&mut State>> = self.states.iter_mut().map(Some).collect();
        let mut segs: Vec<Segment<'_>> = work
            .iter()
            .map(|w| Segment {
                st: refs[w.slot].take().expect("distinct slots"),
                ids: w.ids,
                logits: w.readout.needs_logits(),
            })
            .collect();
        forward_many(
            &self.model,
            &mut segs,
            &mut self.scratch,
            &mut StepHooks::new(None, tally.map(|t| t as &mut dyn KernelTimer)),
            Some(&mut self.logits[..wanted * vocab]),
        )?;
        let mut row = 0;
        for (k, w) in work.iter().enumerate() {
            if !w.readout.needs_logits() {
                self.rows.push(None);
                continue;
            }
            self.rows.push(Some(row));
            let logits = &self.logits[row * vocab..(row + 1) * vocab];
            row += 1;
            let it = self.outs.item(k);
            let out = host_readout_masked(
                logits,
                w.readout,
                w.mask,
                &mut self.masked,
                &mut self.candidates,
            )?;
            it.keep(out);
        }
        self.outs.end(work.len());
        Ok(())
    }

    /// [`BatchEngine::reread`].
    ///
    /// # Errors
    /// As [`BatchEngine::reread`].
    pub fn reread(
        &mut self,
        item: usize,
        readout: Readout,
        mask: Option<&TokenMask>,
    ) -> Result<StepOut<'_>> {
        readout.validate()?;
        let vocab = self.model.config.vocab;
        let Some(row) = self
            .rows
            .get(item)
            .copied()
            .flatten()
            .filter(|_| self.outs.has(item))
        else {
            return Err(Error::InvalidArgument(format!(
                "batch readout: the last step computed no logits for item {item}"
            )));
        };
        host_readout_masked(
            &self.logits[row * vocab..(row + 1) * vocab],
            readout,
            mask,
            &mut self.masked,
            &mut self.candidates,
        )
    }
}

impl BatchEngine for CpuBatch {
    fn model(&self) -> &Arc<Model> {
        CpuBatch::model(self)
    }
    fn slots(&self) -> usize {
        CpuBatch::slots(self)
    }
    fn reset(&mut self, slot: usize) {
        CpuBatch::reset(self, slot);
    }
    fn position(&self, slot: usize) -> u64 {
        CpuBatch::position(self, slot)
    }
    fn step(&mut self, work: &[SlotStep<'_>]) -> Result<()> {
        CpuBatch::step(self, work)
    }
    fn out(&self, item: usize) -> StepOut<'_> {
        CpuBatch::out(self, item)
    }
    fn reread(
        &mut self,
        item: usize,
        readout: Readout,
        mask: Option<&TokenMask>,
    ) -> Result<StepOut<'_>> {
        CpuBatch::reread(self, item, readout, mask)
    }
    fn step_timed(
        &mut self,
        work: &[SlotStep<'_>],
        _timing: crate::profile::Timing,
        tally: &mut KernelTally,
    ) -> Result<String> {
        CpuBatch::step_timed(self, work, tally)?;
        Ok(super::profile::METHOD.to_string())
    }
    fn describe(&self) -> String {
        super::engine::describe(self.scratch.prep.precision)
    }
    fn precision(&self) -> Precision {
        self.scratch.prep.precision
    }
}
