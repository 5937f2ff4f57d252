//! The backend-independent interface of a token-stepping engine.

use crate::config::Config;
use crate::error::Result;

/// Candidates [`Engine::step_nucleus`] hands over (the device top-k limit).
pub const NUCLEUS_CANDIDATES: usize = 256;

/// The softmax denominator of a step's logits at a temperature, as
/// [`Engine::step_nucleus`] computed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Nucleus {
    /// `Σ exp((logit − max) / temperature)` over the whole vocabulary.
    pub total: f64,
    /// A bound on `total`'s relative error against an exact sum of the f32 terms.
    pub rel_err: f64,
}

/// A model instance with its incremental state (KV cache, engram rings, history).
pub trait Engine: Send {
    /// The model's config.
    fn config(&self) -> &Config;

    /// Append `token` at the next logical position and, when `want_logits`, return
    /// the `[vocab]` logits for the token after it (SPEC §4).
    ///
    /// # Errors
    /// [`crate::Error::TokenOutOfRange`] if `token >= vocab`; the state is then unchanged.
    fn step(&mut self, token: u32, want_logits: bool) -> Result<Option<&[f32]>>;

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

    /// Bytes of device buffers held by this engine (0 for the CPU).
    fn device_bytes(&self) -> u64 {
        0
    }

    /// Append `token` and return the greedy choice of the next one: the lowest index
    /// of the largest logit, as [`crate::sample::argmax`]. The GPU picks it on the
    /// device and reads back 8 bytes instead of `vocab` floats; the logits stay
    /// available through [`Engine::last_logits`].
    ///
    /// # Errors
    /// As [`Engine::step`]; [`crate::Error::NonFinite`] when a logit is NaN or infinite.
    fn step_argmax(&mut self, token: u32) -> Result<u32> {
        match self.step(token, true)? {
            Some(l) => Ok(crate::sample::argmax(l)),
            None => Err(crate::Error::InvalidArgument(
                "the engine returned no logits".into(),
            )),
        }
    }

    /// Append `token` and put the `k` largest next logits as `(logit, id)` pairs
    /// into `out` (ties at the cut toward lower ids; order unspecified): all that
    /// [`crate::sample::Sampler::sample_top_k`] needs. The GPU selects them on the
    /// device for `k` up to 256 and reads back `8·k + 8` bytes; the logits stay
    /// available through [`Engine::last_logits`].
    ///
    /// # Errors
    /// As [`Engine::step`]; [`crate::Error::NonFinite`] when a logit is NaN or infinite.
    fn step_top_k(&mut self, token: u32, k: usize, out: &mut Vec<(f32, u32)>) -> Result<()> {
        match self.step(token, true)? {
            Some(l) => {
                crate::sample::top_k_into(l, k, out);
                Ok(())
            }
            None => Err(crate::Error::InvalidArgument(
                "the engine returned no logits".into(),
            )),
        }
    }

    /// Append `token` and hand over what a top-p draw without a top-k needs
    /// ([`crate::sample::Sampler::sample_nucleus`]): the [`NUCLEUS_CANDIDATES`]
    /// largest next logits as `(logit, id)` pairs in `out` (ties at the cut toward
    /// lower ids; order unspecified) and the softmax denominator at `temperature`
    /// over the whole vocabulary, `Σ exp((logit − max) / temperature)`. The GPU
    /// computes both on the device and reads back about 2 KiB; the logits stay
    /// available through [`Engine::last_logits`] for the rare draw the candidates
    /// can't decide.
    ///
    /// # Errors
    /// As [`Engine::step`]; [`crate::Error::NonFinite`] when a logit is NaN or
    /// infinite; [`crate::Error::InvalidArgument`] unless `temperature > 0`.
    fn step_nucleus(
        &mut self,
        token: u32,
        temperature: f32,
        out: &mut Vec<(f32, u32)>,
    ) -> Result<Nucleus> {
        if !(temperature > 0.0 && temperature.is_finite()) {
            return Err(crate::Error::InvalidArgument(format!(
                "step_nucleus: temperature {temperature} is not > 0"
            )));
        }
        match self.step(token, true)? {
            Some(l) => {
                crate::sample::top_k_into(l, NUCLEUS_CANDIDATES, out);
                let m = out.first().map_or(0.0, |c| c.0);
                let total = l
                    .iter()
                    .filter(|v| !v.is_nan())
                    .map(|&v| ((v - m) / temperature).exp() as f64)
                    .sum();
                // f64 sums of the same f32 terms in another order.
                Ok(Nucleus {
                    total,
                    rel_err: 1e-12,
                })
            }
            None => Err(crate::Error::InvalidArgument(
                "the engine returned no logits".into(),
            )),
        }
    }

    /// The logits computed by the last step, if it computed them (a step with
    /// logits or [`Engine::step_argmax`]); `None` after a step without logits or
    /// at position 0.
    ///
    /// # Errors
    /// [`crate::Error::Gpu`] if reading them back from the device fails.
    fn last_logits(&mut self) -> Result<Option<&[f32]>>;

    /// Append every id of `ids` in order, as one [`Engine::step`] per id would, and
    /// return the logits after the last one when `want_logits` (earlier ids run
    /// without logits; an empty `ids` returns `None`). This is the prefill: both
    /// engines run it in chunks, layer by layer, sharing each pass over the
    /// weights among the chunk's tokens (the GPU one dispatch per matvec for the
    /// whole chunk), with results bit-identical to one step per token.
    ///
    /// # Errors
    /// [`crate::Error::TokenOutOfRange`] for an id `>= vocab`, after the ids before
    /// it have been appended; otherwise as [`Engine::step`].
    fn step_many(&mut self, ids: &[u32], want_logits: bool) -> Result<Option<&[f32]>> {
        let Some((&last, rest)) = ids.split_last() else {
            return Ok(None);
        };
        for &id in rest {
            self.step(id, false)?;
        }
        self.step(last, want_logits)
    }

    /// [`Engine::step_many`] with logits, copied out: the logits after the last id
    /// of `ids` (an empty vector for an empty `ids`).
    ///
    /// # Errors
    /// As [`Engine::step_many`].
    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        Ok(self
            .step_many(ids, true)?
            .map(<[f32]>::to_vec)
            .unwrap_or_default())
    }
}
