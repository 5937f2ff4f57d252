//! Several sequences stepped together: [`BatchEngine`], what each item of a
//! step asks ([`SlotStep`]), and the readouts a batch keeps for its items.

use super::precision::Precision;
use super::{Nucleus, Readout, StepOut};
use crate::constrain::TokenMask;
use crate::error::{Error, Result};

/// One sequence's part of a [`BatchEngine::step`]: the ids to append to its
/// slot, and what to read out of the logits after the last of them, as
/// [`super::Engine::step_many`] would for that sequence alone, restricted to the tokens
/// of `mask` when there is one (as [`super::Engine::readout`] with a mask).
#[derive(Debug, Clone, Copy)]
pub struct SlotStep<'a> {
    /// The slot (sequence) the ids go to.
    pub slot: usize,
    /// The ids to append, at least one.
    pub ids: &'a [u32],
    /// What the step reads out after the last id.
    pub readout: Readout,
    /// Only these tokens may be read out (constrained generation).
    pub mask: Option<&'a TokenMask>,
}

impl<'a> SlotStep<'a> {
    /// `ids` for `slot` with `readout` after them, unmasked.
    pub fn new(slot: usize, ids: &'a [u32], readout: Readout) -> SlotStep<'a> {
        SlotStep {
            slot,
            ids,
            readout,
            mask: None,
        }
    }

    /// The same step with its readout restricted to the tokens `mask` allows.
    pub fn masked(self, mask: Option<&'a TokenMask>) -> SlotStep<'a> {
        SlotStep { mask, ..self }
    }
}

/// A slot's state saved by [`BatchEngine::save`] (its position, token history,
/// int8 KV cache and engram rings; on a GPU a copy that stays on the device):
/// what [`BatchEngine::restore`] of the same engine puts back into any slot, so
/// that the slot continues the saved sequence exactly as it would have.
pub struct SavedSlot {
    state: Box<dyn std::any::Any + Send>,
    bytes: u64,
    position: u64,
}

impl std::fmt::Debug for SavedSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavedSlot")
            .field("bytes", &self.bytes)
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

impl SavedSlot {
    /// A backend's saved `state` of `bytes` bytes at `position`.
    pub(crate) fn new(state: Box<dyn std::any::Any + Send>, bytes: u64, position: u64) -> Self {
        SavedSlot {
            state,
            bytes,
            position,
        }
    }

    /// Bytes it holds (host or device memory).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Tokens the saved sequence had processed.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The backend's state, if it is a `T`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when another kind of engine saved it.
    pub(crate) fn state<T: 'static>(&self) -> Result<&T> {
        self.state.downcast_ref().ok_or_else(|| {
            Error::InvalidArgument("restore: this state was saved by another kind of engine".into())
        })
    }
}

/// Several sequences of one model stepped together (continuous batching):
/// [`crate::CpuBatch`] and [`crate::gpu::GpuBatch`]. Each slot holds one
/// sequence with its own state; a step appends ids to some slots in one pass and
/// reads out, for each item, what its [`SlotStep`] asks: the GPU selects the
/// argmax or top-k on the device and copies back a few bytes per item, the
/// logits only for an item that asks for them. Every item's readout equals that
/// of its sequence stepped alone.
pub trait BatchEngine: Send {
    /// The model.
    fn model(&self) -> &std::sync::Arc<crate::model::weights::Model>;
    /// Number of slots.
    fn slots(&self) -> usize;
    /// Empty slot `slot` (its next token is at position 0); panics if out of range.
    fn reset(&mut self, slot: usize);
    /// Tokens processed by slot `slot` since its reset; panics if out of range.
    fn position(&self, slot: usize) -> u64;
    /// Save slot `slot`'s state (the slot goes on unchanged).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a slot out of range; [`Error::Alloc`] or
    /// [`Error::Gpu`] when the copy can't be made.
    fn save(&mut self, slot: usize) -> Result<SavedSlot>;
    /// Put `saved` (from this engine's [`BatchEngine::save`]) into slot `slot`:
    /// its next step continues the saved sequence, bit for bit as the saved
    /// slot would have.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a slot out of range or a state another
    /// engine saved.
    fn restore(&mut self, slot: usize, saved: &SavedSlot) -> Result<()>;
    /// Append each item's ids to its slot and read out what each item asks
    /// ([`BatchEngine::out`] then hands it over, item by item in `work`'s order).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a slot out of range or repeated, an empty
    /// item, no work, a bad readout argument or a mask of another vocabulary
    /// size or that allows nothing; [`Error::TokenOutOfRange`] (nothing
    /// stepped); the engine's step errors (the slots have then advanced), such
    /// as [`Error::NonFinite`] when a logit an item reads out is not finite.
    fn step(&mut self, work: &[SlotStep<'_>]) -> Result<()>;
    /// What the last step read out for its item `item` ([`StepOut::None`] past
    /// its items, or for an item whose readout was `None` or `Deferred`).
    fn out(&self, item: usize) -> StepOut<'_>;
    /// Read item `item`'s logits of the last step out again as `readout` asks,
    /// under `mask` (as [`super::Engine::readout`]): e.g. the full logits when a top-p
    /// draw's candidates could not decide.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the last step has no such item or computed
    /// no logits for it (its readout was `None`), and as [`super::Engine::readout`].
    fn reread(
        &mut self,
        item: usize,
        readout: Readout,
        mask: Option<&TokenMask>,
    ) -> Result<StepOut<'_>>;
    /// [`BatchEngine::step`] with every kernel run of the step timed into
    /// `tally` (the CPU: timers at the kernel boundaries; the GPU: as `timing`
    /// says, over every dispatch of its passes); returns how the kernels were
    /// timed.
    ///
    /// # Errors
    /// As [`BatchEngine::step`]; [`Error::Gpu`] for
    /// [`crate::engine::profile::Timing::Timestamps`] on a device without timestamp
    /// queries.
    fn step_timed(
        &mut self,
        work: &[SlotStep<'_>],
        timing: crate::engine::profile::Timing,
        tally: &mut crate::engine::profile::KernelTally,
    ) -> Result<String>;
    /// Bytes copied back from a device since the engine was built (0 on the
    /// CPU, whose logits never leave the host).
    fn bytes_read_back(&self) -> u64 {
        0
    }
    /// What runs the batch (as [`super::Engine::describe`]).
    fn describe(&self) -> String;
    /// The arithmetic of its CQ matvecs (as [`super::Engine::precision`]).
    fn precision(&self) -> Precision;
}

/// Check a batch step's `work` for `slots` slots and `vocab` ids: the errors of
/// [`BatchEngine::step`] that come before anything is stepped.
pub(crate) fn check_batch_work(work: &[SlotStep<'_>], slots: usize, vocab: usize) -> Result<()> {
    if work.is_empty() {
        return Err(Error::InvalidArgument("batch step: no work".into()));
    }
    for (i, w) in work.iter().enumerate() {
        let slot = w.slot;
        // Distinct slots (quadratic in the items: a few dozen at most).
        if slot >= slots || work[..i].iter().any(|p| p.slot == slot) {
            return Err(Error::InvalidArgument(format!(
                "batch step: slot {slot} is out of range or given twice"
            )));
        }
        if w.ids.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "batch step: slot {slot} has no ids"
            )));
        }
        if let Some(&token) = w.ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange { token, vocab });
        }
        w.readout.validate()?;
        if let Some(m) = w.mask {
            m.check(vocab)?;
        }
    }
    Ok(())
}

/// The readouts of a batch step's items, owned by the batch until its next
/// step: what [`BatchEngine::out`] hands over.
#[derive(Debug, Default)]
pub(crate) struct ItemOuts {
    items: Vec<ItemOut>,
    count: usize,
}

/// One item's readout: its kind, and the buffers its candidates or logits are in.
#[derive(Debug, Default)]
pub(crate) struct ItemOut {
    kind: OutKind,
    /// The candidates of a top-k or nucleus readout.
    pub(crate) candidates: Vec<(f32, u32)>,
    /// The logits of a `Logits` readout (masked ones carry −∞ where disallowed).
    pub(crate) logits: Vec<f32>,
}

#[derive(Debug, Default, Clone, Copy)]
enum OutKind {
    #[default]
    None,
    Logits,
    Token(u32),
    Candidates,
    Nucleus(Nucleus),
}

impl ItemOuts {
    /// Forget the last step's readouts and make room for `n` items.
    pub(crate) fn begin(&mut self, n: usize) {
        self.count = 0;
        if self.items.len() < n {
            self.items.resize_with(n, ItemOut::default);
        }
        for it in &mut self.items[..n] {
            it.kind = OutKind::None;
        }
    }

    /// Say the step's `n` items are read out.
    pub(crate) fn end(&mut self, n: usize) {
        self.count = n;
    }

    /// Item `k`'s buffers, to fill.
    pub(crate) fn item(&mut self, k: usize) -> &mut ItemOut {
        &mut self.items[k]
    }

    /// Item `k`'s readout (none past the last step's items).
    pub(crate) fn get(&self, k: usize) -> StepOut<'_> {
        if k >= self.count {
            return StepOut::None;
        }
        self.items[k].as_out()
    }

    /// Whether the last step has an item `k`.
    pub(crate) fn has(&self, k: usize) -> bool {
        k < self.count
    }
}

impl ItemOut {
    /// The readout this item holds.
    pub(crate) fn as_out(&self) -> StepOut<'_> {
        match self.kind {
            OutKind::None => StepOut::None,
            OutKind::Logits => StepOut::Logits(&self.logits),
            OutKind::Token(t) => StepOut::Token(t),
            OutKind::Candidates => StepOut::Candidates(&self.candidates),
            OutKind::Nucleus(nucleus) => StepOut::Nucleus {
                candidates: &self.candidates,
                nucleus,
            },
        }
    }

    /// Keep a copy of `out` (the buffers are reused).
    pub(crate) fn keep(&mut self, out: StepOut<'_>) {
        self.kind = match out {
            StepOut::None => OutKind::None,
            StepOut::Token(t) => OutKind::Token(t),
            StepOut::Logits(l) => {
                self.logits.clear();
                self.logits.extend_from_slice(l);
                OutKind::Logits
            }
            StepOut::Candidates(c) => {
                self.candidates.clear();
                self.candidates.extend_from_slice(c);
                OutKind::Candidates
            }
            StepOut::Nucleus {
                candidates,
                nucleus,
            } => {
                self.candidates.clear();
                self.candidates.extend_from_slice(candidates);
                OutKind::Nucleus(nucleus)
            }
        };
    }

    /// Say the item's readout is the device's argmax `t`.
    pub(crate) fn set_token(&mut self, t: u32) {
        self.kind = OutKind::Token(t);
    }

    /// Say the item's readout is in `candidates` (with the nucleus denominator
    /// when there is one).
    pub(crate) fn set_candidates(&mut self, nucleus: Option<Nucleus>) {
        self.kind = nucleus.map_or(OutKind::Candidates, OutKind::Nucleus);
    }
}
