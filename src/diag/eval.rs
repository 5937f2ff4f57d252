//! Perplexity and bits per byte of a token stream (`cqlm eval`).
//!
//! A text is scored the way the engine reads it: one stream from a fresh state,
//! `[BOS] + tokens`, every token after the first predicted from all that precedes
//! it through [`Engine::step`], so attention sees the sinks and the sliding window
//! of SPEC §4.3 exactly as in generation.

use crate::engine::{Engine, Readout};
use crate::error::{Error, Result};

/// What scoring a stream measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    /// Tokens predicted (the stream's length minus one).
    pub tokens: usize,
    /// Natural-log negative log-likelihood summed over the predicted tokens.
    pub nll_nats: f64,
}

impl Score {
    /// Mean negative log-likelihood per predicted token, in nats (NaN when none).
    pub fn nats_per_token(&self) -> f64 {
        self.nll_nats / self.tokens as f64
    }

    /// Perplexity, `exp(nats per token)`.
    pub fn perplexity(&self) -> f64 {
        self.nats_per_token().exp()
    }

    /// Bits per byte of a text whose predicted tokens decode to `bytes` bytes.
    pub fn bits_per_byte(&self, bytes: usize) -> f64 {
        self.nll_nats / std::f64::consts::LN_2 / bytes as f64
    }
}

/// `−log softmax(logits)[target]` in f64: `lse(logits) − logits[target]`.
/// `position` only names the step in an error.
///
/// # Errors
/// [`Error::NonFinite`] when a logit is NaN or infinite; [`Error::TokenOutOfRange`]
/// when `target` is not an index of `logits`.
pub fn token_nll(logits: &[f32], target: u32, position: u64) -> Result<f64> {
    let vocab = logits.len();
    let Some(&t) = logits.get(target as usize) else {
        return Err(Error::TokenOutOfRange {
            token: target,
            vocab,
        });
    };
    let mut max = f64::NEG_INFINITY;
    for &v in logits {
        if !v.is_finite() {
            return Err(Error::NonFinite {
                tensor: "logits".into(),
                position,
            });
        }
        max = max.max(f64::from(v));
    }
    let sum: f64 = logits.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    Ok(max + sum.ln() - f64::from(t))
}

/// Score `ids` from a fresh state: reset `engine`, then step every id with logits
/// and add the NLL of the id after it. `progress(done)` is called after each step
/// with the number of ids stepped so far.
///
/// # Errors
/// [`Error::InvalidArgument`] for fewer than 2 ids; an id `≥ vocab` gives
/// [`Error::TokenOutOfRange`] before anything is stepped; engine errors pass through.
pub fn score_stream(
    engine: &mut dyn Engine,
    ids: &[u32],
    mut progress: impl FnMut(usize),
) -> Result<Score> {
    if ids.len() < 2 {
        return Err(Error::InvalidArgument(format!(
            "cannot score {} token(s): a stream needs at least 2 (one to predict from, one to predict)",
            ids.len()
        )));
    }
    let vocab = engine.config().vocab;
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::TokenOutOfRange { token: bad, vocab });
    }
    engine.reset();
    let mut nll = 0.0;
    for (i, pair) in ids.windows(2).enumerate() {
        let logits = engine
            .step(pair[0], Readout::Logits)?
            .logits()
            .ok_or_else(|| Error::InvalidArgument("the engine returned no logits".into()))?;
        nll += token_nll(logits, pair[1], i as u64)?;
        progress(i + 1);
    }
    Ok(Score {
        tokens: ids.len() - 1,
        nll_nats: nll,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_of_uniform_logits_is_ln_vocab() {
        let l = vec![3.5f32; 1000];
        assert!((token_nll(&l, 7, 0).unwrap() - (1000f64).ln()).abs() < 1e-12);
    }

    #[test]
    fn nll_is_shift_invariant_and_matches_a_naive_softmax() {
        let l: Vec<f32> = (0..50)
            .map(|i| ((i * 37 % 11) as f32) * 0.7 - 2.0)
            .collect();
        let z: f64 = l.iter().map(|&v| f64::from(v).exp()).sum();
        let naive = -(f64::from(l[13]).exp() / z).ln();
        assert!((token_nll(&l, 13, 0).unwrap() - naive).abs() < 1e-12);
        // Logits near 1000 would overflow a naive exp: the max subtraction keeps it exact.
        let shifted: Vec<f32> = l.iter().map(|v| v + 1000.0).collect();
        let z: f64 = shifted.iter().map(|&v| (f64::from(v) - 1000.0).exp()).sum();
        let naive_shifted = -((f64::from(shifted[13]) - 1000.0).exp() / z).ln();
        assert!((token_nll(&shifted, 13, 0).unwrap() - naive_shifted).abs() < 1e-12);
    }

    #[test]
    fn bad_logits_and_targets_are_errors() {
        assert!(matches!(
            token_nll(&[0.0, f32::NAN], 0, 0),
            Err(Error::NonFinite { .. })
        ));
        assert!(matches!(
            token_nll(&[0.0, 1.0], 2, 0),
            Err(Error::TokenOutOfRange { .. })
        ));
    }

    #[test]
    fn bits_per_byte_and_perplexity() {
        let s = Score {
            tokens: 4,
            nll_nats: 4.0 * std::f64::consts::LN_2,
        };
        assert!((s.perplexity() - 2.0).abs() < 1e-12);
        assert!((s.bits_per_byte(8) - 0.5).abs() < 1e-12);
    }
}
