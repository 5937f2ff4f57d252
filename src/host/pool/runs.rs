//! [`Pool::steal_runs`]: a job over `n` units in which each part runs its own
//! run of units and then takes what the others have left, so a thread that the
//! host slows down holds up the job by little.

use super::Pool;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

impl Pool {
    /// Call `f(part, units)` for runs of units that together cover `0 .. n`
    /// exactly once, in parallel, balancing the work as it goes. Part `p`
    /// owns the run `start(p) .. start(p + 1)` (`start` ascending, from
    /// `start(0) = 0` to `start(threads()) = n`) and takes it from the front,
    /// half of what is left at a time, so each part runs the units of its own
    /// run in order (what it wrote last job is in its cache); a part that has
    /// finished its own run takes the second half of what another part has
    /// left, from the back, until nothing is left anywhere. A thread the host
    /// slows down, or an uneven guess of the work, so costs what the slow
    /// part holds when the others run dry (half its run at first, ever less
    /// later) rather than the difference of two static halves. Each job costs
    /// ~0.5 µs more than [`Pool::run`] (the runs' lines move between cores):
    /// for jobs of tens of microseconds and more. `part` is the pool part that
    /// runs the units (for its scratch).
    ///
    /// # Panics
    /// If `n` does not fit in 32 bits; re-raises a panic of any part.
    pub fn steal_runs(
        &self,
        n: usize,
        start: &(dyn Fn(usize) -> usize + Sync),
        f: &(dyn Fn(usize, Range<usize>) + Sync),
    ) {
        assert!(u32::try_from(n).is_ok(), "steal_runs: too many units");
        let parts = self.threads();
        let mut on_stack: [Run; STACK_RUNS] = Default::default();
        let mut on_heap = Vec::new();
        let runs: &mut [Run] = if parts <= STACK_RUNS {
            &mut on_stack[..parts]
        } else {
            on_heap.resize_with(parts, Run::default);
            &mut on_heap
        };
        for (p, run) in runs.iter().enumerate() {
            let (lo, hi) = (start(p).min(n), start(p + 1).min(n));
            run.set(lo, hi.max(lo));
        }
        let runs = &*runs;
        self.run(&|p| {
            while let Some(r) = runs[p].take_front() {
                f(p, r);
            }
            for q in (1..parts).map(|i| (p + i) % parts) {
                while let Some(r) = runs[q].take_back() {
                    f(p, r);
                }
            }
        });
    }
}

/// Most pool parts whose runs [`Pool::steal_runs`] keeps on the stack (more
/// threads than this keep them on the heap).
const STACK_RUNS: usize = 16;

/// One part's untaken units in a [`Pool::steal_runs`] job: `lo` in the low
/// 32 bits, `hi` in the high ones, on a line of its own (two lines: the
/// adjacent-line prefetcher pairs them).
#[repr(align(128))]
#[derive(Default)]
struct Run(AtomicU64);

impl Run {
    fn set(&self, lo: usize, hi: usize) {
        self.0.store((lo as u64) | ((hi as u64) << 32), SeqCst);
    }

    /// Take the first `ceil(left / 2)` untaken units (the owner's end), or
    /// none when none is left.
    fn take_front(&self) -> Option<Range<usize>> {
        self.take(|lo, hi| {
            let k = (hi - lo).div_ceil(2);
            (lo + k, hi, lo..lo + k)
        })
    }

    /// Take the last `ceil(left / 2)` untaken units (a thief's end).
    fn take_back(&self) -> Option<Range<usize>> {
        self.take(|lo, hi| {
            let k = (hi - lo).div_ceil(2);
            (lo, hi - k, hi - k..hi)
        })
    }

    fn take(
        &self,
        cut: impl Fn(usize, usize) -> (usize, usize, Range<usize>),
    ) -> Option<Range<usize>> {
        let mut v = self.0.load(SeqCst);
        loop {
            let (lo, hi) = ((v & 0xffff_ffff) as usize, (v >> 32) as usize);
            if lo >= hi {
                return None;
            }
            let (nlo, nhi, r) = cut(lo, hi);
            let nv = (nlo as u64) | ((nhi as u64) << 32);
            match self.0.compare_exchange_weak(v, nv, SeqCst, SeqCst) {
                Ok(_) => return Some(r),
                Err(now) => v = now,
            }
        }
    }
}
