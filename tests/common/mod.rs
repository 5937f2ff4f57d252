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
