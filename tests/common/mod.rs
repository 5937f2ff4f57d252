//! Helpers shared by the integration tests (`mod common;`).
//!
//! Not every test binary uses every helper.
#![allow(dead_code)]

pub mod cli;
pub mod gpu;
pub mod naive;
pub mod serve;

use cqlm::{Engine, Readout};
use rand::Rng;

/// `n` values drawn uniformly from `[-scale, scale)`.
pub fn random_vec(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// Pseudo-random token ids `< vocab` from a fixed seed (splitmix64).
pub fn token_ids(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z % vocab as u64) as u32
        })
        .collect()
}

/// `step(id, Readout::Logits)` and copy the logits out, panicking on an error or
/// a missing readout (test shorthand).
pub trait StepLogits {
    /// The logits after appending `id`.
    fn logits_after(&mut self, id: u32) -> Vec<f32>;
}

impl<E: Engine + ?Sized> StepLogits for E {
    fn logits_after(&mut self, id: u32) -> Vec<f32> {
        self.step(id, Readout::Logits)
            .unwrap()
            .logits()
            .expect("a logits readout")
            .to_vec()
    }
}

/// Step `work` (`(slot, ids)` items) on `batch` reading out every item's full
/// logits, and return them `[items, vocab]` in `work`'s order.
pub fn batch_logits(
    batch: &mut dyn cqlm::BatchEngine,
    work: &[(usize, &[u32])],
) -> cqlm::Result<Vec<f32>> {
    let steps: Vec<cqlm::engine::SlotStep<'_>> = work
        .iter()
        .map(|&(slot, ids)| cqlm::engine::SlotStep::new(slot, ids, Readout::Logits))
        .collect();
    batch.step(&steps)?;
    Ok((0..work.len())
        .flat_map(|k| batch.out(k).logits().expect("a logits readout").to_vec())
        .collect())
}

/// The prompt cache's engine contract on `batch` (3 slots or more, a model
/// whose window is under 24 rows so that the saved sequence has wrapped its
/// ring): a state saved after a prompt and restored into another slot, whose
/// own earlier sequence poisons its cache and rings, continues with the very
/// logits (bit for bit) the saved slot gave when it went on; a restore into a
/// slot beside another's pass does too, and the saved slot is left unchanged.
pub fn check_saved_slots(batch: &mut dyn cqlm::BatchEngine) {
    let vocab = batch.model().config.vocab;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let prompt = token_ids(1, 30, vocab);
    let rest = token_ids(2, 5, vocab);
    batch.reset(0);
    batch_logits(batch, &[(0, &prompt)]).unwrap();
    let saved = batch.save(0).unwrap();
    assert_eq!(saved.position(), 30);
    assert!(saved.bytes() > 0);
    // The saved slot goes on: a chunk, then three decode steps.
    let mut want = vec![batch_logits(batch, &[(0, &rest)]).unwrap()];
    for _ in 0..3 {
        let next = crate::common::argmax_of(want.last().unwrap());
        want.push(batch_logits(batch, &[(0, &[next])]).unwrap());
    }
    // Slot 1 ran another sequence first; restored, it follows slot 0's path.
    batch.reset(1);
    batch_logits(batch, &[(1, &token_ids(3, 27, vocab))]).unwrap();
    batch.restore(1, &saved).unwrap();
    assert_eq!(batch.position(1), 30);
    let mut got = vec![batch_logits(batch, &[(1, &rest)]).unwrap()];
    for _ in 0..3 {
        let next = crate::common::argmax_of(got.last().unwrap());
        got.push(batch_logits(batch, &[(1, &[next])]).unwrap());
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(bits(g), bits(w), "step {i} after a restore");
    }
    // Restored into slot 2 while slot 1 steps in the same passes.
    batch.restore(2, &saved).unwrap();
    let other = token_ids(4, 1, vocab);
    let both = batch_logits(batch, &[(1, &other), (2, &rest)]).unwrap();
    assert_eq!(
        bits(&both[vocab..]),
        bits(&want[0]),
        "restored beside another slot"
    );
}

/// The argmax of a logits row.
pub fn argmax_of(row: &[f32]) -> u32 {
    cqlm::session::sample::argmax(row)
}
