//! The backend-independent interface of a token-stepping engine, and what a
//! step hands back ([`Readout`] asks, [`StepOut`] answers).

use crate::config::Config;
use crate::constrain::TokenMask;
use crate::error::{Error, Result};
use crate::precision::Precision;

/// Candidates a [`Readout::Nucleus`] step hands over. The GPU selects them on the
/// device, so this is at most its top-k limit (`gpu::kernels::sample::MAX_K`,
/// checked at compile time there).
pub const NUCLEUS_CANDIDATES: usize = 256;

/// The softmax denominator of a step's logits at a temperature, as a
/// [`Readout::Nucleus`] step computed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Nucleus {
    /// `Σ exp((logit − max) / temperature)` over the whole vocabulary.
    pub total: f64,
    /// A bound on `total`'s relative error against an exact sum of the f32 terms.
    pub rel_err: f64,
}

/// What a step reads out of the logits it computes: the less a readout needs,
/// the less the GPU copies back (nothing, 8 bytes, about 2 KiB, or `vocab` floats).
/// [`Engine::readout`] reads the same logits out again, optionally restricted to
/// the tokens of a [`TokenMask`] (constrained generation).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Readout {
    /// No logits: the step only appends the token (prefill).
    None,
    /// Compute the logits and keep them for [`Engine::readout`]; nothing comes
    /// back, and the GPU step returns without waiting for the device (so the host
    /// can work meanwhile, e.g. on the next token mask).
    Deferred,
    /// The `[vocab]` logits of the next token.
    Logits,
    /// The greedy choice of the next token: the lowest index of the largest logit,
    /// as [`crate::sample::argmax`].
    Argmax,
    /// The `k` largest next logits as `(logit, id)` pairs (ties at the cut toward
    /// lower ids; order unspecified): all that
    /// [`crate::sample::Sampler::sample_top_k`] needs. `k = 0` gives none.
    TopK(usize),
    /// What a top-p draw without a top-k needs
    /// ([`crate::sample::Sampler::sample_nucleus`]): the [`NUCLEUS_CANDIDATES`]
    /// largest next logits and the softmax denominator at `temperature` (> 0)
    /// over the whole vocabulary.
    Nucleus {
        /// The sampling temperature.
        temperature: f32,
    },
}

impl Readout {
    /// `Logits` when `want_logits`, else `None`.
    pub fn logits_if(want_logits: bool) -> Readout {
        if want_logits {
            Readout::Logits
        } else {
            Readout::None
        }
    }

    /// Whether this readout needs the logits computed (everything but `None`).
    pub fn needs_logits(self) -> bool {
        self != Readout::None
    }

    /// Check the readout's arguments.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `Nucleus` temperature that is not a
    /// finite number > 0.
    pub fn validate(self) -> Result<()> {
        if let Readout::Nucleus { temperature } = self {
            if !(temperature > 0.0 && temperature.is_finite()) {
                return Err(Error::InvalidArgument(format!(
                    "nucleus readout: temperature {temperature} is not > 0"
                )));
            }
        }
        Ok(())
    }
}

/// What a step handed back, as its [`Readout`] asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepOut<'a> {
    /// Nothing ([`Readout::None`]).
    None,
    /// The next token's logits ([`Readout::Logits`]).
    Logits(&'a [f32]),
    /// The greedy next token ([`Readout::Argmax`]).
    Token(u32),
    /// The top candidates ([`Readout::TopK`]).
    Candidates(&'a [(f32, u32)]),
    /// The top candidates and the softmax denominator ([`Readout::Nucleus`]).
    Nucleus {
        /// The [`NUCLEUS_CANDIDATES`] largest logits (fewer for a smaller vocabulary).
        candidates: &'a [(f32, u32)],
        /// The softmax denominator.
        nucleus: Nucleus,
    },
}

impl<'a> StepOut<'a> {
    /// Whether this is [`StepOut::None`].
    pub fn is_none(self) -> bool {
        matches!(self, StepOut::None)
    }

    /// The logits, if this is [`StepOut::Logits`].
    pub fn logits(self) -> Option<&'a [f32]> {
        match self {
            StepOut::Logits(l) => Some(l),
            _ => None,
        }
    }

    /// The token, if this is [`StepOut::Token`].
    pub fn token(self) -> Option<u32> {
        match self {
            StepOut::Token(t) => Some(t),
            _ => None,
        }
    }

    /// The candidates of [`StepOut::Candidates`] or [`StepOut::Nucleus`].
    pub fn candidates(self) -> Option<&'a [(f32, u32)]> {
        match self {
            StepOut::Candidates(c) | StepOut::Nucleus { candidates: c, .. } => Some(c),
            _ => None,
        }
    }
}

/// The readout of `logits` on the host, for engines that have them there: what a
/// device readout computes, with `candidates` as the buffer the candidates go in.
///
/// # Errors
/// [`Error::InvalidArgument`] for a bad readout argument ([`Readout::validate`]).
pub fn host_readout<'a>(
    logits: &'a [f32],
    readout: Readout,
    candidates: &'a mut Vec<(f32, u32)>,
) -> Result<StepOut<'a>> {
    readout.validate()?;
    Ok(match readout {
        Readout::None | Readout::Deferred => StepOut::None,
        Readout::Logits => StepOut::Logits(logits),
        Readout::Argmax => StepOut::Token(crate::sample::argmax(logits)),
        Readout::TopK(k) => {
            crate::sample::top_k_into(logits, k, candidates);
            StepOut::Candidates(candidates)
        }
        Readout::Nucleus { temperature } => {
            crate::sample::top_k_into(logits, NUCLEUS_CANDIDATES, candidates);
            let m = candidates.first().map_or(0.0, |c| c.0);
            let total = logits
                .iter()
                .filter(|v| !v.is_nan())
                .map(|&v| ((v - m) / temperature).exp() as f64)
                .sum();
            // f64 sums of the same f32 terms in another order.
            StepOut::Nucleus {
                candidates,
                nucleus: Nucleus {
                    total,
                    rel_err: 1e-12,
                },
            }
        }
    })
}

/// [`host_readout`] restricted to the tokens `mask` allows (every one without a
/// mask): the readout of `logits` with −∞ at the others (written into `masked`),
/// which no readout then chooses or lists; a `Logits` readout hands back those
/// masked logits.
///
/// # Errors
/// As [`host_readout`]; [`Error::InvalidArgument`] for a mask of another
/// vocabulary size or one that allows nothing.
pub fn host_readout_masked<'a>(
    logits: &'a [f32],
    readout: Readout,
    mask: Option<&TokenMask>,
    masked: &'a mut Vec<f32>,
    candidates: &'a mut Vec<(f32, u32)>,
) -> Result<StepOut<'a>> {
    let Some(mask) = mask else {
        return host_readout(logits, readout, candidates);
    };
    mask.check(logits.len())?;
    mask.apply_into(logits, masked);
    host_readout(masked, readout, candidates)
}

/// A model instance with its incremental state (KV cache, engram rings, history).
pub trait Engine: Send {
    /// The model's config.
    fn config(&self) -> &Config;

    /// Append `token` at the next logical position and read out the next token's
    /// logits as `readout` asks (SPEC §4). A readout other than
    /// [`Readout::Logits`] lets the GPU decide on the device and copy back a few
    /// bytes; the logits then stay available through [`Engine::last_logits`].
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] if `token >= vocab`, and
    /// [`Error::InvalidArgument`] for a bad readout argument; the state is then
    /// unchanged. [`Error::NonFinite`] when a logit the readout needs is NaN or
    /// infinite.
    fn step(&mut self, token: u32, readout: Readout) -> Result<StepOut<'_>>;

    /// Forget all tokens: the next step is at position 0.
    fn reset(&mut self);

    /// Number of tokens processed since the last reset.
    fn position(&self) -> u64;

    /// A short name of the backend and device, e.g. `cpu (2 threads)`.
    fn describe(&self) -> String;

    /// GPU dispatches recorded per token with logits (`None` for backends without dispatches).
    fn dispatches_per_token(&self) -> Option<usize> {
        None
    }

    /// Host time spent on the device's decode steps since the engine was built:
    /// writing the step buffer, recording and submitting, not the wait for the
    /// device (`None` for backends whose host does all the work). Take the
    /// difference of two readings for a stretch of steps.
    fn host_time(&self) -> Option<HostTime> {
        None
    }

    /// Whether the engine computes its steps on this machine's CPU threads
    /// (the CPU engine) rather than on a device that works while the caller goes
    /// on: a caller then does its own per-step work (a constraint's mask) before
    /// or after a step, not on a thread beside it, which would only take a core
    /// from the step.
    fn computes_on_host(&self) -> bool {
        false
    }

    /// Prompt tokens per prefill chunk of [`Engine::step_many`] (1: one step per token).
    fn prefill_chunk(&self) -> usize {
        1
    }

    /// The arithmetic of the CQ matvecs ([`Precision`]; the GPU engine's is exact).
    fn precision(&self) -> Precision {
        Precision::Exact
    }

    /// Bytes of device buffers held by this engine (0 for the CPU).
    fn device_bytes(&self) -> u64 {
        0
    }

    /// The logits computed by the last step, if it computed them (any readout but
    /// [`Readout::None`]); `None` after a step without logits or at position 0.
    ///
    /// # Errors
    /// [`Error::Gpu`] if reading them back from the device fails.
    fn last_logits(&mut self) -> Result<Option<&[f32]>>;

    /// Read the last step's logits out again as `readout` asks, restricted to the
    /// tokens `mask` allows (every token without one): disallowed tokens are never
    /// the argmax, never candidates and add nothing to a nucleus denominator; a
    /// `Logits` readout gives the logits with −∞ at them. On the GPU the mask is
    /// uploaded and applied on the device, so this copies back what `readout`
    /// needs, not the logits. `Readout::None` and `Deferred` give
    /// [`StepOut::None`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the last step computed no logits, for a bad
    /// readout argument, or for a mask of another vocabulary size or that allows
    /// nothing; [`Error::NonFinite`] when an allowed logit is NaN or infinite;
    /// [`Error::Gpu`] if the device fails.
    fn readout(&mut self, readout: Readout, mask: Option<&TokenMask>) -> Result<StepOut<'_>>;

    /// Append every id of `ids` in order, as one [`Engine::step`] per id would, and
    /// read out the logits after the last one as `readout` asks (earlier ids run
    /// without logits; an empty `ids` gives [`StepOut::None`]). This is the
    /// prefill: both engines run it in chunks, layer by layer, sharing each pass
    /// over the weights among the chunk's tokens (the GPU one dispatch per matvec
    /// for the whole chunk), with results bit-identical to one step per token.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for an id `>= vocab`, after the ids before it
    /// have been appended; otherwise as [`Engine::step`].
    fn step_many(&mut self, ids: &[u32], readout: Readout) -> Result<StepOut<'_>> {
        readout.validate()?;
        let Some((&last, rest)) = ids.split_last() else {
            return Ok(StepOut::None);
        };
        for &id in rest {
            self.step(id, Readout::None)?;
        }
        self.step(last, readout)
    }

    /// [`Engine::step_many`] with logits, copied out: the logits after the last id
    /// of `ids` (an empty vector for an empty `ids`).
    ///
    /// # Errors
    /// As [`Engine::step_many`].
    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        Ok(self
            .step_many(ids, Readout::Logits)?
            .logits()
            .map(<[f32]>::to_vec)
            .unwrap_or_default())
    }
}

/// Cumulative host time of a device backend's decode steps ([`Engine::host_time`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostTime {
    /// Seconds from the start of a step to its submit returning, summed.
    pub seconds: f64,
    /// Steps counted.
    pub steps: u64,
}

impl HostTime {
    /// Microseconds per step between `earlier` and `self` (`None` without steps).
    pub fn us_per_step_since(&self, earlier: HostTime) -> Option<f64> {
        let steps = self.steps.checked_sub(earlier.steps).filter(|&n| n > 0)?;
        Some((self.seconds - earlier.seconds) * 1e6 / steps as f64)
    }
}

/// One sequence's part of a [`BatchEngine::step`]: the ids to append to its
/// slot, and what to read out of the logits after the last of them, as
/// [`Engine::step_many`] would for that sequence alone, restricted to the tokens
/// of `mask` when there is one (as [`Engine::readout`] with a mask).
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

/// Several sequences of one model stepped together (continuous batching):
/// [`crate::CpuBatch`] and [`crate::gpu::GpuBatch`]. Each slot holds one
/// sequence with its own state; a step appends ids to some slots in one pass and
/// reads out, for each item, what its [`SlotStep`] asks: the GPU selects the
/// argmax or top-k on the device and copies back a few bytes per item, the
/// logits only for an item that asks for them. Every item's readout equals that
/// of its sequence stepped alone.
pub trait BatchEngine: Send {
    /// The model.
    fn model(&self) -> &std::sync::Arc<crate::weights::Model>;
    /// Number of slots.
    fn slots(&self) -> usize;
    /// Empty slot `slot` (its next token is at position 0); panics if out of range.
    fn reset(&mut self, slot: usize);
    /// Tokens processed by slot `slot` since its reset; panics if out of range.
    fn position(&self, slot: usize) -> u64;
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
    /// under `mask` (as [`Engine::readout`]): e.g. the full logits when a top-p
    /// draw's candidates could not decide.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the last step has no such item or computed
    /// no logits for it (its readout was `None`), and as [`Engine::readout`].
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
    /// [`crate::profile::Timing::Timestamps`] on a device without timestamp
    /// queries.
    fn step_timed(
        &mut self,
        work: &[SlotStep<'_>],
        timing: crate::profile::Timing,
        tally: &mut crate::profile::KernelTally,
    ) -> Result<String>;
    /// Bytes copied back from a device since the engine was built (0 on the
    /// CPU, whose logits never leave the host).
    fn bytes_read_back(&self) -> u64 {
        0
    }
    /// What runs the batch (as [`Engine::describe`]).
    fn describe(&self) -> String;
    /// The arithmetic of its CQ matvecs (as [`Engine::precision`]).
    fn precision(&self) -> Precision;
}

/// Check a batch step's `work` for `slots` slots and `vocab` ids: the errors of
/// [`BatchEngine::step`] that come before anything is stepped.
pub(crate) fn check_batch_work(work: &[SlotStep<'_>], slots: usize, vocab: usize) -> Result<()> {
    if work.is_empty() {
        return Err(Error::InvalidArgument("batch step: no work".into()));
    }
    let mut seen = vec![false; slots];
    for w in work {
        let slot = w.slot;
        if slot >= slots || std::mem::replace(&mut seen[slot], true) {
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
