//! The backend-independent interface of a token-stepping engine, and what a
//! step hands back ([`Readout`] asks, [`StepOut`] answers); several sequences
//! stepped together ([`batch`]: [`BatchEngine`], [`SlotStep`]), the arithmetic
//! of the CQ matvecs ([`precision`]) and per-kernel profiles ([`profile`]).

use crate::constrain::TokenMask;
use crate::error::{Error, Result};
use crate::model::config::Config;
use precision::Precision;

pub mod batch;
pub mod precision;
pub mod profile;

pub(crate) use batch::{check_batch_work, ItemOut, ItemOuts};
pub use batch::{BatchEngine, SavedSlot, SlotStep};

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
    /// as [`crate::session::sample::argmax`].
    Argmax,
    /// The `k` largest next logits as `(logit, id)` pairs (ties at the cut toward
    /// lower ids; order unspecified): all that
    /// [`crate::session::sample::Sampler::sample_top_k`] needs. `k = 0` gives none.
    TopK(usize),
    /// What a top-p draw without a top-k needs
    /// ([`crate::session::sample::Sampler::sample_nucleus`]): the [`NUCLEUS_CANDIDATES`]
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
        Readout::Argmax => StepOut::Token(crate::session::sample::argmax(logits)),
        Readout::TopK(k) => {
            crate::session::sample::top_k_into(logits, k, candidates);
            StepOut::Candidates(candidates)
        }
        Readout::Nucleus { temperature } => {
            crate::session::sample::top_k_into(logits, NUCLEUS_CANDIDATES, candidates);
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

    /// Save the state (the engine goes on unchanged), as
    /// [`BatchEngine::save`] saves a slot: a prompt cache keeps it to continue
    /// from later.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an engine that cannot save its state (the
    /// default); [`Error::Alloc`] or [`Error::Gpu`] when the copy can't be made.
    fn save(&mut self) -> Result<SavedSlot> {
        Err(Error::InvalidArgument(format!(
            "{} cannot save its state",
            self.describe()
        )))
    }

    /// Continue from `saved` (from this engine's [`Engine::save`]): the next
    /// step goes on bit for bit as the saved engine's would have; no logits
    /// are held until that step.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a state another kind of engine or a model
    /// of another shape saved, or an engine that cannot restore (the default).
    fn restore(&mut self, saved: &SavedSlot) -> Result<()> {
        let _ = saved;
        Err(Error::InvalidArgument(format!(
            "{} cannot restore a state",
            self.describe()
        )))
    }

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
