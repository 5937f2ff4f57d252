//! [`TokenMask`]: which token ids a step may choose, one bit per id.

use crate::error::{Error, Result};

/// The allowed tokens of one step: bit `t & 31` of word `t >> 5` is 1 when id `t`
/// is allowed (the layout llguidance's masks and the GPU readout kernels use).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    vocab: usize,
    words: Vec<u32>,
}

impl TokenMask {
    /// A mask of `vocab` ids with none allowed.
    pub fn none(vocab: usize) -> TokenMask {
        TokenMask {
            vocab,
            words: vec![0; vocab.div_ceil(32).max(1)],
        }
    }

    /// A mask of `vocab` ids with all allowed.
    pub fn all(vocab: usize) -> TokenMask {
        let mut m = TokenMask::none(vocab);
        for t in 0..vocab as u32 {
            m.allow(t);
        }
        m
    }

    /// A mask of `vocab` ids allowing exactly `ids` (ids `>= vocab` are ignored).
    pub fn of_ids(vocab: usize, ids: &[u32]) -> TokenMask {
        let mut m = TokenMask::none(vocab);
        for &t in ids {
            if (t as usize) < vocab {
                m.allow(t);
            }
        }
        m
    }

    /// Replace the bits by `words` (llguidance's `SimpleVob::as_slice`; words and
    /// bits past the vocabulary are dropped, missing ones are 0).
    pub fn set_words(&mut self, words: &[u32]) {
        let n = self.words.len();
        self.words.fill(0);
        let k = words.len().min(n);
        self.words[..k].copy_from_slice(&words[..k]);
        let tail = self.vocab % 32;
        if tail != 0 && k == n {
            self.words[n - 1] &= (1u32 << tail) - 1;
        }
    }

    /// Allow `token` (`< vocab`).
    pub fn allow(&mut self, token: u32) {
        if (token as usize) < self.vocab {
            self.words[token as usize >> 5] |= 1 << (token & 31);
        }
    }

    /// Whether `token` is allowed (false for ids `>= vocab`).
    pub fn is_allowed(&self, token: u32) -> bool {
        (token as usize) < self.vocab && (self.words[token as usize >> 5] >> (token & 31)) & 1 == 1
    }

    /// Number of allowed ids.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The vocabulary size the mask covers.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The words (`ceil(vocab / 32)`, at least 1).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// `logits` with −∞ at every disallowed id, into `out`.
    pub fn apply_into(&self, logits: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.extend(logits.iter().enumerate().map(|(i, &v)| {
            if self.is_allowed(i as u32) {
                v
            } else {
                f32::NEG_INFINITY
            }
        }));
    }

    /// Check that the mask fits a `vocab`-token model and allows something.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another vocabulary size or an empty mask.
    pub fn check(&self, vocab: usize) -> Result<()> {
        if self.vocab != vocab {
            return Err(Error::InvalidArgument(format!(
                "token mask: covers {} ids, the model has {vocab}",
                self.vocab
            )));
        }
        if self.count() == 0 {
            return Err(Error::InvalidArgument(
                "token mask: no token is allowed".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_follow_the_word_layout() {
        let mut m = TokenMask::none(70);
        assert_eq!(m.words().len(), 3);
        m.allow(0);
        m.allow(33);
        m.allow(69);
        m.allow(70); // past the vocabulary: ignored
        assert_eq!(m.words(), &[1, 2, 1 << 5]);
        assert!(m.is_allowed(33) && !m.is_allowed(34) && !m.is_allowed(70));
        assert_eq!(m.count(), 3);
        m.set_words(&[u32::MAX, 0, u32::MAX, 7]);
        assert_eq!(m.count(), 32 + 6);
        assert_eq!(TokenMask::all(70).count(), 70);
        let mut out = Vec::new();
        TokenMask::of_ids(3, &[1]).apply_into(&[1.0, 2.0, 3.0], &mut out);
        assert_eq!(out, [f32::NEG_INFINITY, 2.0, f32::NEG_INFINITY]);
        assert!(TokenMask::none(3).check(3).is_err());
        assert!(TokenMask::all(3).check(4).is_err());
    }
}
