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

    /// Name the kept error, raised by the last submit: `blamed` (the kernel
    /// whose recording raises it) when known, else the submit in flight
    /// (`… while running a submit of N dispatches, kernels …`).
    pub(crate) fn attribute(&self, blamed: Option<String>) {
        let running = self.in_flight.lock().ok().and_then(|r| *r);
        if let Ok(mut slot) = self.first.lock() {
            let named = match (blamed, running, slot.as_deref()) {
                (Some(b), ..) => one_line(&b),
                (None, Some(r), Some(msg)) => format!("{msg} (while running {r})"),
                _ => return,
            };
            *slot = Some(named);
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
        e.attribute(Some("kernel `x`:\n named".into()));
        assert_eq!(e.first().unwrap(), "kernel `x`: named");
        // An error no single kernel's recording raises names the submit.
        let oom = DeviceErrors::default();
        oom.set_in_flight(Some(InFlight {
            dispatches: 3,
            first: "gather",
            last: "matvec",
        }));
        oom.record("Out of Memory");
        oom.attribute(None);
        assert_eq!(
            oom.first().unwrap(),
            "Out of Memory (while running a submit of 3 dispatches, kernels `gather` to \
             `matvec` (the device does not say which one))"
        );
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
