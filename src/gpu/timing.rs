//! How the GPU times a step's dispatches for a profile: timestamp queries
//! written around every dispatch inside the step's compute pass
//! (`TIMESTAMP_QUERY` + `TIMESTAMP_QUERY_INSIDE_PASSES`), or, on a device
//! without them, one submit and wait per dispatch. Both are modes of the one
//! step recorder (`gpu/recorder.rs`, `submit_timed`).

use super::GpuContext;
use crate::engine::profile::Timing;
use crate::error::{Error, Result};
use crate::kernels::kv::attended_ranges;

/// Whether `timing` uses timestamp queries on `ctx`.
///
/// # Errors
/// [`Error::Gpu`] for [`Timing::Timestamps`] on a device without them enabled.
pub fn use_timestamps(timing: Timing, ctx: &GpuContext) -> Result<bool> {
    let have = ctx.caps.timestamps;
    match timing {
        Timing::Auto => Ok(have),
        Timing::Timestamps if !have => Err(Error::Gpu(format!(
            "adapter `{}` has no timestamp queries inside passes enabled \
             (TIMESTAMP_QUERY + TIMESTAMP_QUERY_INSIDE_PASSES missing, or CQLM_NO_TIMESTAMPS set)",
            ctx.info.name
        ))),
        Timing::Timestamps => Ok(true),
        Timing::PerDispatch => Ok(false),
    }
}

/// The profile's method line: timestamps at `period_ns` per tick, or one
/// submit per dispatch (`have`: whether the device had timestamps).
pub fn describe_method(period_ns: Option<f64>, have: bool) -> String {
    match period_ns {
        Some(p) => format!(
            "gpu timestamp queries around each dispatch inside one compute pass \
             (TIMESTAMP_QUERY_INSIDE_PASSES), {p} ns per tick"
        ),
        None if have => "gpu: one submit and wait per dispatch, as asked \
                         (each time includes the submit and wait overhead)"
            .to_string(),
        None => "gpu: one submit and wait per dispatch, because timestamp queries \
                 inside passes are not enabled on this device (each time includes \
                 the submit and wait overhead)"
            .to_string(),
    }
}

/// Positions attended by the step at position `t` (SPEC §4.3: sink plus window).
pub fn attended(t: u64, sink: usize, window: usize) -> usize {
    attended_ranges(t, sink, window)
        .iter()
        .map(|r| (r.end - r.start) as usize)
        .sum()
}
