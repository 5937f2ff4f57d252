//! [`Governor`]: whether the pool splits its jobs or the caller runs them
//! alone, from whether splitting pays.
//!
//! On a machine whose cores are all taken (a busy loop per core, a parallel
//! build), a helper that has claimed a part can lose its core in the middle of
//! it, and the caller then waits for it for a whole time slice of the OS
//! (milliseconds, against parts of microseconds): measured on 2 cores beside a
//! busy loop per core, decode on two threads ran at about half of one thread's
//! speed. So the pool times what splitting gives. A split job's wall time
//! (publish to the last part done) is set against what the caller alone would
//! have taken: the time of its own part times the parts. Over a window of
//! [`WINDOW`] split jobs, if the wall times add up to more than [`PAYS`] of
//! that estimate, the pool turns to running jobs on the caller alone. While
//! alone, it splits a burst of [`PROBE_JOBS`] jobs after [`PROBE_INTERVAL`]
//! and turns back if they paid; the interval doubles (up to
//! [`PROBE_INTERVAL_MAX`]) after a burst that did not pay and after a return
//! that did not last a window, and starts again from the bottom once
//! splitting has paid for a while. Between bursts the helpers fall asleep, so
//! they take no core from the caller (helpers that spun between frequent
//! probes did, and kept decode at half of one thread's speed). The sums weigh
//! jobs by their time, so the many small jobs of a step do not outvote the
//! large ones, and a stall of milliseconds counts for what it costs. Two clock
//! reads a split job and one a job run alone (the monotonic clock, no system
//! call).

use std::time::{Duration, Instant};

/// Split jobs a decision rests on while splitting.
pub(super) const WINDOW: u32 = 256;
/// Splitting pays while the split jobs' wall time stays below this share of
/// what the caller alone would take (2 threads at idle: about 0.55).
pub(super) const PAYS: f64 = 0.8;
/// Split jobs in a probe burst (and the window they are judged on).
pub(super) const PROBE_JOBS: u32 = WINDOW;
/// While alone, the shortest time between two probe bursts.
pub(super) const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// The longest.
pub(super) const PROBE_INTERVAL_MAX: Duration = Duration::from_millis(3200);
/// Windows that must pay in a row before the interval starts from the bottom.
const SETTLED: u32 = 16;

/// The mode and the window of split jobs (kept under the pool's `busy` lock).
#[derive(Debug, Default)]
pub(super) struct Governor {
    alone: bool,
    /// While alone: when the next probe burst starts, and the probe jobs of
    /// the current burst still to split.
    next_probe: Option<Instant>,
    probing: u32,
    /// The interval before the next burst (zero: [`PROBE_INTERVAL`]).
    interval: Duration,
    /// Windows in a row that paid since the last return from alone.
    paid: u32,
    /// Split jobs in the window, their wall time and the estimate alone.
    jobs: u32,
    wall: Duration,
    alone_estimate: Duration,
}

impl Governor {
    /// Whether to split the next job: always while splitting pays; while
    /// alone, the jobs of a probe burst.
    pub(super) fn split_next(&mut self) -> bool {
        if !self.alone {
            return true;
        }
        if self.probing > 0 {
            self.probing -= 1;
            return true;
        }
        if self.next_probe.is_some_and(|t| Instant::now() >= t) {
            self.next_probe = None;
            self.probing = PROBE_JOBS - 1;
            return true;
        }
        false
    }

    /// Whether jobs are run alone now (probes aside; tests).
    #[cfg(test)]
    pub(super) fn is_alone(&self) -> bool {
        self.alone
    }

    /// A split job of `parts` parts took `wall`, the caller's own part `own`;
    /// decide at the end of a window. Whether the mode changed.
    pub(super) fn record(&mut self, parts: usize, wall: Duration, own: Duration) -> bool {
        self.jobs += 1;
        self.wall += wall;
        self.alone_estimate += own * parts as u32;
        if self.jobs < if self.alone { PROBE_JOBS } else { WINDOW } {
            return false;
        }
        let ratio = self.wall.as_secs_f64() / self.alone_estimate.as_secs_f64().max(1e-12);
        let alone = ratio > PAYS;
        // How long until the next burst: doubled after a burst that did not
        // pay or a return that did not last a window.
        let failed = if self.alone {
            alone
        } else {
            alone && self.paid == 0
        };
        self.interval = if failed {
            (self.interval * 2).clamp(PROBE_INTERVAL, PROBE_INTERVAL_MAX)
        } else {
            self.interval.max(PROBE_INTERVAL)
        };
        if !self.alone && !alone {
            self.paid += 1;
            if self.paid >= SETTLED {
                self.interval = PROBE_INTERVAL;
            }
        }
        if self.alone && !alone {
            self.paid = 0;
        }
        let switched = alone != self.alone;
        if switched {
            log::debug!(
                "CPU pool: split jobs took {:.2} of the time alone would: {}",
                ratio,
                if alone {
                    "running jobs alone"
                } else {
                    "splitting jobs again"
                }
            );
        }
        self.alone = alone;
        if alone {
            self.next_probe = Some(Instant::now() + self.interval);
        }
        self.jobs = 0;
        self.wall = Duration::ZERO;
        self.alone_estimate = Duration::ZERO;
        switched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `jobs` split jobs of 2 parts, each `own` µs on the caller and `wall` µs
    /// in all.
    /// Mode changes among them.
    fn split_jobs(g: &mut Governor, jobs: u32, own: u64, wall: u64) -> u32 {
        (0..jobs)
            .filter(|_| g.record(2, Duration::from_micros(wall), Duration::from_micros(own)))
            .count() as u32
    }

    #[test]
    fn jobs_run_alone_while_splitting_does_not_pay_and_probe_bursts_bring_it_back() {
        let mut g = Governor::default();
        let mut switches = 0;
        assert!(g.split_next() && !g.is_alone());
        switches += split_jobs(&mut g, WINDOW, 20, 12);
        assert!(!g.is_alone(), "12 µs split against 40 alone: split");
        switches += split_jobs(&mut g, WINDOW, 20, 35);
        assert!(g.is_alone(), "35 against 40: alone");
        // Alone: no job is split before the probe interval has passed.
        assert_eq!((0..1000).filter(|_| g.split_next()).count(), 0);
        g.next_probe = Some(Instant::now());
        // Then a burst of PROBE_JOBS.
        assert_eq!(
            (0..1000).filter(|_| g.split_next()).count(),
            PROBE_JOBS as usize
        );
        switches += split_jobs(&mut g, PROBE_JOBS, 20, 60);
        assert!(g.is_alone(), "probes that stall: stay alone");
        assert!(
            g.next_probe.is_some_and(|t| t > Instant::now()),
            "next burst later"
        );
        assert_eq!(
            g.interval,
            PROBE_INTERVAL * 2,
            "after a burst that did not pay"
        );
        switches += split_jobs(&mut g, PROBE_JOBS, 20, 11);
        assert!(!g.is_alone(), "probes that pay: split again");
        assert_eq!(switches, 2);
        // A return that does not last a window doubles the interval again.
        split_jobs(&mut g, WINDOW, 20, 35);
        assert!(g.is_alone());
        assert_eq!(g.interval, PROBE_INTERVAL * 4);
        // Up to the most, and back to the least once splitting has paid a while.
        for _ in 0..10 {
            split_jobs(&mut g, PROBE_JOBS, 20, 60);
        }
        assert_eq!(g.interval, PROBE_INTERVAL_MAX);
        split_jobs(&mut g, PROBE_JOBS, 20, 11);
        split_jobs(&mut g, WINDOW * SETTLED, 20, 11);
        assert!(!g.is_alone());
        assert_eq!(g.interval, PROBE_INTERVAL);
    }

    #[test]
    fn stalls_count_for_their_time() {
        // 256 jobs of 40 µs alone (10.2 ms): one 4 ms stall among 11 µs splits
        // (6.8 ms) still pays; two (10.8 ms) do not.
        for (stalls, alone) in [(1, false), (2, true)] {
            let mut g = Governor::default();
            for i in 0..WINDOW {
                let wall = if i < stalls { 4_000 } else { 11 };
                g.record(2, Duration::from_micros(wall), Duration::from_micros(20));
            }
            assert_eq!(g.is_alone(), alone, "{stalls} stalls");
        }
    }
}
