//! The CPU side of `cqlm profile`: per-kernel wall times of real decode steps,
//! cut at the GPU's dispatch boundaries (see [`crate::engine::profile`]).

use crate::engine::profile::{KernelProfile, KernelTally};
use crate::error::Result;
use std::time::Instant;

/// How the CPU times its kernels (the profile's `method`).
pub(crate) const METHOD: &str = "cpu: std::time::Instant at kernel boundaries";

/// Run `step` (a timed decode step with logits, reporting to the tally) for
/// every id of `tokens` and average the kernels per token.
///
/// # Errors
/// The first error of `step`; steps before it stay processed.
pub(super) fn profile(
    tokens: &[u32],
    mut step: impl FnMut(u32, &mut KernelTally) -> Result<()>,
) -> Result<KernelProfile> {
    let mut tally = KernelTally::default();
    let mut wall = 0.0;
    for &t in tokens {
        let t0 = Instant::now();
        step(t, &mut tally)?;
        wall += t0.elapsed().as_secs_f64();
    }
    Ok(tally.into_profile(tokens.len(), wall, METHOD))
}

/// Run `run` (a timed pass of several tokens, reporting to the tally) `runs`
/// times and average the kernels over the `tokens` they process together.
///
/// # Errors
/// The first error of `run`; passes before it stay processed.
pub(super) fn profile_runs(
    tokens: usize,
    runs: usize,
    mut run: impl FnMut(&mut KernelTally) -> Result<()>,
) -> Result<KernelProfile> {
    let mut tally = KernelTally::default();
    let t0 = Instant::now();
    for _ in 0..runs {
        run(&mut tally)?;
    }
    Ok(tally.into_profile(tokens, t0.elapsed().as_secs_f64(), METHOD))
}
