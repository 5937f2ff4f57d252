//! Helpers shared by the integration tests (`mod common;`).
//!
//! Not every test binary uses every helper.
#![allow(dead_code)]

pub mod cli;
pub mod gpu;
pub mod naive;
