//! [`TokenLogprob`]: a generated token's log-probability and the most likely
//! alternatives at its position, as the OpenAI `logprobs` fields report them.
//!
//! The values are the log-softmax of the model's logits at temperature 1
//! **after** a constraint's mask: the distribution the token was drawn from
//! when the sampler is plain, restricted to the tokens the constraint allowed
//! (a token the constraint forced has probability 1, logprob 0). They come
//! from the full logits, or from a device top-k readout and its softmax
//! denominator ([`crate::Readout::Nucleus`] at temperature 1), which copies
//! back about 2 KiB instead of the vocabulary.

use crate::engine::Nucleus;

/// Most alternatives a request may ask for per token (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One generated token's log-probability and its position's top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub id: u32,
    /// Its natural log-probability (≤ 0).
    pub logprob: f32,
    /// The most likely tokens at its position as `(id, logprob)`, most likely
    /// first (ties toward lower ids), as many as asked for and allowed.
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// A token the constraint forced: certain (logprob 0), the only alternative.
    pub fn forced(id: u32, top: usize) -> TokenLogprob {
        TokenLogprob {
            id,
            logprob: 0.0,
            top: if top > 0 { vec![(id, 0.0)] } else { Vec::new() },
        }
    }

    /// From a position's logits (−∞ at masked tokens, NaN skipped): the
    /// log-softmax of `id` and of the `top` largest, summed in f64. `None`
    /// when `id` is out of range or masked.
    pub fn from_logits(logits: &[f32], id: u32, top: usize) -> Option<TokenLogprob> {
        let finite = || logits.iter().copied().filter(|v| v.is_finite());
        let max = finite().fold(f32::NEG_INFINITY, f32::max);
        let total: f64 = finite().map(|v| f64::from(v - max).exp()).sum();
        let at = *logits.get(id as usize)?;
        let log = |v: f32| (f64::from(v - max) - total.ln()) as f32;
        if !at.is_finite() || total <= 0.0 {
            return None;
        }
        let mut best = Vec::new();
        crate::session::sample::top_k_into(logits, top, &mut best);
        Some(TokenLogprob {
            id,
            logprob: log(at),
            top: best.into_iter().map(|(v, i)| (i, log(v))).collect(),
        })
    }

    /// From a top-k readout at temperature 1: `candidates` the largest logits
    /// as `(logit, id)` in any order, `nucleus.total` = `Σ exp(logit − max)`
    /// over the allowed vocabulary. `None` when `id` is not a candidate or
    /// the denominator is not a positive number.
    pub fn from_candidates(
        candidates: &[(f32, u32)],
        nucleus: Nucleus,
        id: u32,
        top: usize,
    ) -> Option<TokenLogprob> {
        let (max, at) = candidates
            .iter()
            .fold((f32::NEG_INFINITY, None), |(m, at), &(v, i)| {
                (m.max(v), if i == id { Some(v) } else { at })
            });
        let at = at?;
        if !nucleus.total.is_finite() || nucleus.total <= 0.0 {
            return None;
        }
        let ln_total = nucleus.total.ln();
        let log = |v: f32| (f64::from(v - max) - ln_total) as f32;
        let mut best: Vec<(f32, u32)> = candidates
            .iter()
            .copied()
            .filter(|(v, _)| v.is_finite())
            .collect();
        best.sort_unstable_by(crate::session::sample::best_first);
        best.truncate(top);
        Some(TokenLogprob {
            id,
            logprob: log(at),
            top: best.into_iter().map(|(v, i)| (i, log(v))).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A naive log-softmax, apart from the code under test.
    fn naive(logits: &[f32], i: usize) -> f64 {
        let m = logits
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| f64::from(v))
            .fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = logits
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| (f64::from(v) - m).exp())
            .sum();
        f64::from(logits[i]) - m - s.ln()
    }

    #[test]
    fn from_logits_and_from_candidates_agree_with_a_naive_log_softmax() {
        let logits = [0.5f32, 3.0, -1.0, 3.0, f32::NEG_INFINITY, 2.25, -7.0];
        let e = TokenLogprob::from_logits(&logits, 5, 3).unwrap();
        assert!((f64::from(e.logprob) - naive(&logits, 5)).abs() < 1e-6);
        // Ties toward the lower id; the masked token never listed.
        assert_eq!(e.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 5]);
        for &(i, lp) in &e.top {
            assert!((f64::from(lp) - naive(&logits, i as usize)).abs() < 1e-6);
        }
        assert!(TokenLogprob::from_logits(&logits, 4, 3).is_none());
        assert!(TokenLogprob::from_logits(&logits, 9, 3).is_none());
        // The same from three candidates in another order and the denominator.
        let total: f64 = logits
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| f64::from(v - 3.0).exp())
            .sum();
        let cands = [(2.25f32, 5u32), (3.0, 3), (3.0, 1), (0.5, 0)];
        let nucleus = Nucleus {
            total,
            rel_err: 0.0,
        };
        let c = TokenLogprob::from_candidates(&cands, nucleus, 5, 3).unwrap();
        assert_eq!(c.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 5]);
        assert!((c.logprob - e.logprob).abs() < 1e-6);
        assert!(TokenLogprob::from_candidates(&cands, nucleus, 6, 3).is_none());
        assert_eq!(TokenLogprob::forced(7, 2).top, vec![(7, 0.0)]);
        assert!(TokenLogprob::forced(7, 0).top.is_empty());
    }
}
