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
use crate::engine::precision::Precision;
use crate::engine::profile::KernelTally;
use crate::engine::{
    host_readout_masked, BatchEngine, ItemOuts, Readout, SavedSlot, SlotStep, StepOut,
};
use crate::error::{Error, Result};
use crate::model::weights::Model;
use std::sync::Arc;

/// One item of the last step: its slot, its row of the logits (none without
/// logits), and whether its readout is that row as it is.
#[derive(Debug, Clone, Copy)]
struct Item {
    slot: usize,
    row: Option<usize>,
    direct: bool,
}

/// Sequences of one model in slots, stepped together by [`CpuBatch::step`].
pub struct CpuBatch {
    model: Arc<Model>,
    states: Vec<State>,
    scratch: Scratch,
    /// The logits of the last step's items that computed them, `[rows, vocab]`.
    logits: Vec<f32>,
    /// The last step's items.
    items: Vec<Item>,
    /// The last step's readouts (those that are not a row as it is).
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
    /// [`Error::Alloc`] if a KV cache or the buffers can't be allocated.
    pub fn new(model: Arc<Model>, slots: usize, precision: Precision) -> Result<CpuBatch> {
        let mut scratch = Scratch::default();
        scratch.grow(&model.config, 1)?;
        let states = (0..slots.max(1))
            .map(|_| State::new(&model))
            .collect::<Result<Vec<_>>>()?;
        let mut b = CpuBatch {
            logits: alloc("logits", model.config.vocab)?,
            model,
            states,
            scratch,
            items: Vec::new(),
            outs: ItemOuts::default(),
            masked: Vec::new(),
            candidates: Vec::new(),
        };
        b.set_precision(precision);
        Ok(b)
    }

    /// The arithmetic of the CQ matvecs.
    pub fn precision(&self) -> Precision {
        self.scratch.prep.precision
    }

    /// Run the CQ matvecs in `precision` from the next step on (SPEC §6.1 fast:
    /// int8 activations inside the 1, 2 and 4-bit matvecs; default exact). The
    /// first fast batch or engine of a model repacks its matrices for the fast
    /// kernels here (once; later ones share them).
    pub fn set_precision(&mut self, precision: Precision) {
        if precision == Precision::Fast {
            super::fast::fast_set(&self.model);
        }
        self.scratch.prep.precision = precision;
    }

    /// [`CpuBatch::step`] with its kernels timed into `tally` (timers at the
    /// boundaries of the GPU's dispatches, as [`crate::CpuEngine::profile`]).
    ///
    /// # Errors
    /// As [`CpuBatch::step`].
    pub fn step_timed(&mut self, work: &[SlotStep<'_>], tally: &mut KernelTally) -> Result<()> {
        self.step_hooked(work, StepHooks::new(None, Some(tally)))
    }

    /// The logits the last step computed for its item `item`, if it did.
    pub(super) fn logits(&self, item: usize) -> Option<&[f32]> {
        let vocab = self.model.config.vocab;
        let row = self.items.get(item)?.row.filter(|_| self.outs.has(item))?;
        Some(&self.logits[row * vocab..(row + 1) * vocab])
    }

    /// [`CpuBatch::step`] with `hooks` (probes, timers) seeing its kernels.
    pub(super) fn step_hooked(
        &mut self,
        work: &[SlotStep<'_>],
        mut hooks: StepHooks,
    ) -> Result<()> {
        let vocab = self.model.config.vocab;
        crate::engine::check_batch_work(work, self.states.len(), vocab)?;
        self.outs.begin(work.len());
        self.items.clear();
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
            &mut hooks,
            Some(&mut self.logits[..wanted * vocab]),
        )?;
        let mut row = 0;
        for (k, w) in work.iter().enumerate() {
            let needs = w.readout.needs_logits();
            // Unmasked logits are handed over from their row, not copied.
            let direct = w.readout == Readout::Logits && w.mask.is_none();
            self.items.push(Item {
                slot: w.slot,
                row: needs.then_some(row),
                direct,
            });
            if !needs {
                continue;
            }
            let logits = &self.logits[row * vocab..(row + 1) * vocab];
            row += 1;
            if !direct {
                let out = host_readout_masked(
                    logits,
                    w.readout,
                    w.mask,
                    &mut self.masked,
                    &mut self.candidates,
                )?;
                self.outs.item(k).keep(out);
            }
        }
        self.outs.end(work.len());
        Ok(())
    }
}

impl BatchEngine for CpuBatch {
    fn model(&self) -> &Arc<Model> {
        &self.model
    }
    fn slots(&self) -> usize {
        self.states.len()
    }
    fn reset(&mut self, slot: usize) {
        self.states[slot].reset();
        // The last step's readouts go with a slot it stepped.
        if self.items.iter().any(|it| it.slot == slot) {
            self.items.clear();
            self.outs.begin(0);
        }
    }
    fn position(&self, slot: usize) -> u64 {
        self.states[slot].pos
    }
    fn save(&mut self, slot: usize) -> Result<SavedSlot> {
        let state = self.states.get(slot).ok_or_else(|| {
            Error::InvalidArgument(format!("save: slot {slot} of {}", self.states.len()))
        })?;
        let (bytes, pos) = (state.bytes(), state.pos);
        Ok(SavedSlot::new(Box::new(state.clone()), bytes, pos))
    }
    fn restore(&mut self, slot: usize, saved: &SavedSlot) -> Result<()> {
        let state: &State = saved.state()?;
        if slot >= self.states.len() {
            return Err(Error::InvalidArgument(format!(
                "restore: slot {slot} of {}",
                self.states.len()
            )));
        }
        let (a, b) = (&state.kv, &self.states[slot].kv);
        let same = (a.layers, a.kv_heads, a.rows, a.head_dim)
            == (b.layers, b.kv_heads, b.rows, b.head_dim)
            && state.rings.len() == self.states[slot].rings.len();
        if !same {
            return Err(Error::InvalidArgument(
                "restore: the state was saved from a model of another shape".into(),
            ));
        }
        self.reset(slot);
        self.states[slot].clone_from(state);
        Ok(())
    }
    fn step(&mut self, work: &[SlotStep<'_>]) -> Result<()> {
        self.step_hooked(work, StepHooks::new(None, None))
    }
    fn out(&self, item: usize) -> StepOut<'_> {
        match self.items.get(item) {
            Some(&Item { direct: true, .. }) => {
                self.logits(item).map_or(StepOut::None, StepOut::Logits)
            }
            _ => self.outs.get(item),
        }
    }
    fn reread(
        &mut self,
        item: usize,
        readout: Readout,
        mask: Option<&TokenMask>,
    ) -> Result<StepOut<'_>> {
        readout.validate()?;
        let vocab = self.model.config.vocab;
        let Some(row) = self
            .items
            .get(item)
            .and_then(|it| it.row)
            .filter(|_| self.outs.has(item))
        else {
            return Err(Error::InvalidArgument(format!(
                "readout: the last step computed no logits for item {item}"
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
    fn step_timed(
        &mut self,
        work: &[SlotStep<'_>],
        _timing: crate::engine::profile::Timing,
        tally: &mut KernelTally,
    ) -> Result<String> {
        CpuBatch::step_timed(self, work, tally)?;
        Ok(super::timing::METHOD.to_string())
    }
    fn describe(&self) -> String {
        super::engine::describe(self.precision())
    }
    fn precision(&self) -> Precision {
        CpuBatch::precision(self)
    }
}
