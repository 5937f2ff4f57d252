//! [`DeviceErrors`]: the first error a device reported (validation, out of
//! memory, loss), kept for [`crate::gpu::GpuContext::check_errors`] instead of
//! wgpu's default panic, and what the device was running when it was lost.

use std::sync::Mutex;

/// The dispatches of a submit the host has not yet seen finish: what a
/// device lost meanwhile was running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InFlight {
    /// Compute dispatches in the submit.
    pub dispatches: usize,
    /// The kernel of its first dispatch and of its last.
    pub first: &'static str,
    pub last: &'static str,
}

impl std::fmt::Display for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.dispatches {
            1 => write!(f, "kernel `{}`", self.first),
            n => write!(
                f,
                "a submit of {n} dispatches, kernels `{}` to `{}` (the device does not say which one)",
                self.first, self.last
            ),
        }
    }
}

/// A device's error record, shared with wgpu's error and device-lost
/// callbacks. Errors are sticky: the first one is kept (one line), and every
/// later check reports it again, since the device's buffers may hold garbage.
#[derive(Debug, Default)]
pub(crate) struct DeviceErrors {
    first: Mutex<Option<String>>,
    in_flight: Mutex<Option<InFlight>>,
    lost: std::sync::atomic::AtomicBool,
}

impl DeviceErrors {
    /// Keep `msg` unless an error is already kept.
    pub(crate) fn record(&self, msg: &str) {
        if let Ok(mut slot) = self.first.lock() {
            slot.get_or_insert_with(|| one_line(msg));
        }
    }

    /// Replace the kept error by `msg` (the same error, better named).
    pub(crate) fn rename(&self, msg: &str) {
        if let Ok(mut slot) = self.first.lock() {
            *slot = Some(one_line(msg));
        }
    }

    /// The device was lost (`reason`, the driver's `msg`): kept, naming the
    /// submit it was running if any.
    pub(crate) fn lost(&self, reason: wgpu::DeviceLostReason, msg: &str) {
        self.lost.store(true, std::sync::atomic::Ordering::Relaxed);
        let running = self.in_flight.lock().ok().and_then(|r| *r);
        let what = match running {
            Some(r) => format!("the GPU device was lost ({reason:?}) while running {r}: {msg}"),
            None => format!("the GPU device was lost ({reason:?}): {msg}"),
        };
        self.record(&what);
    }

    /// Whether the device was lost.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The kept error, if any.
    pub(crate) fn first(&self) -> Option<String> {
        self.first.lock().ok().and_then(|s| s.clone())
    }

    /// Note that `submit` was handed to the queue (`None`: everything handed
    /// to it so far has finished).
    pub(crate) fn set_in_flight(&self, submit: Option<InFlight>) {
        if let Ok(mut slot) = self.in_flight.lock() {
            *slot = submit;
        }
    }
}

fn one_line(msg: &str) -> String {
    msg.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_error_is_kept_on_one_line_and_a_loss_names_what_ran() {
        let e = DeviceErrors::default();
        assert_eq!(e.first(), None);
        e.set_in_flight(Some(InFlight {
            dispatches: 52,
            first: "gather_many",
            last: "matvec_rows",
        }));
        e.lost(wgpu::DeviceLostReason::Unknown, "driver\n  reset");
        assert_eq!(
            e.first().unwrap(),
            "the GPU device was lost (Unknown) while running a submit of 52 dispatches, \
             kernels `gather_many` to `matvec_rows` (the device does not say which one): driver reset"
        );
        e.record("a later error");
        assert!(e.first().unwrap().starts_with("the GPU device was lost"));
        e.rename("kernel `x`: named");
        assert_eq!(e.first().unwrap(), "kernel `x`: named");
        let idle = DeviceErrors::default();
        idle.set_in_flight(Some(InFlight {
            dispatches: 1,
            first: "argmax",
            last: "argmax",
        }));
        idle.set_in_flight(None);
        idle.lost(wgpu::DeviceLostReason::Destroyed, "gone");
        assert_eq!(
            idle.first().unwrap(),
            "the GPU device was lost (Destroyed): gone"
        );
    }
}
