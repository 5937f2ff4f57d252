//! Helpers shared by the integration tests (`mod common;`).
//!
//! Not every test binary uses every helper.
#![allow(dead_code)]

pub mod cli;
pub mod gpu;
pub mod naive;

use cqlm::{Engine, Readout};

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
