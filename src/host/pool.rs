//! A persistent fork-join pool for the token step: its helper threads spin for a
//! short while between jobs (so the dozens of small matvecs of a token each cost
//! well under a microsecond to hand out) and then sleep, so an idle engine burns
//! no CPU.
//!
//! Why not rayon: its workers go to sleep between the short jobs of a step, and
//! waking them costs more than a 512×512 matvec (measured: splitting every matvec
//! through rayon made `default` decode 12% slower than not splitting at all).
//! Low-latency pools on crates.io (fork_union) build C++ and need `&mut` access.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle helper spins before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// One job: a borrowed closure called once per part (`0 .. parts`).
type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// Incremented to publish a job.
    generation: AtomicU64,
    /// The current job; written only while no helper runs one.
    job: UnsafeCell<Option<Job>>,
    /// Helpers still running the current job.
    pending: AtomicUsize,
    /// Set if a part panicked.
    panicked: AtomicBool,
    /// Helpers asleep (or about to be) on `wake`.
    sleeping: AtomicUsize,
    stop: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written by the one thread holding `Pool::busy` before the
// generation is published and read by helpers only after they observe it; the
// pointee outlives the job because `run` waits for every helper to finish.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fork-join pool of `threads()` threads: the caller plus `threads() − 1` helpers.
pub struct Pool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// Held while a job runs; a second caller meanwhile runs its job alone.
    busy: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl Pool {
    /// A pool of `threads` threads in all (at least 1: the caller alone).
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let helpers = (1..threads.max(1))
            .filter_map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("cqlm-cpu-{i}"))
                    .spawn(move || helper(&s, i))
                    .ok()
            })
            .collect();
        Pool {
            shared,
            helpers,
            busy: Mutex::new(()),
        }
    }

    /// The process-wide pool of the CPU engines: `CQLM_THREADS` threads if set
    /// (≥ 1), else one per available core.
    pub fn global() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let n = std::env::var("CQLM_THREADS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|&n| n >= 1)
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            Pool::new(n)
        })
    }

    /// Threads a job is split over (the caller included).
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Call `f(part)` for every `part` in `0 .. threads()`, in parallel (the caller
    /// runs part 0), and return when all are done. While another thread's job
    /// runs, the parts run one after another on the caller instead of waiting.
    ///
    /// # Panics
    /// Re-raises a panic of any part (after all parts have finished).
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        let n = self.threads();
        let guard = match self.busy.try_lock() {
            Ok(g) if n > 1 => g,
            _ => {
                (0..n).for_each(f);
                return;
            }
        };
        let s = &*self.shared;
        // SAFETY: erasing the lifetime is sound because this function does not
        // return before every helper has finished with `f` (`pending == 0`).
        let job: Job = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Job>(f) };
        // SAFETY: no helper reads `job` until the generation below changes, and
        // the previous job's helpers all finished before its `run` returned.
        unsafe { *s.job.get() = Some(job) };
        s.pending.store(n - 1, SeqCst);
        s.generation.fetch_add(1, SeqCst);
        if s.sleeping.load(SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let mut spins = 0u32;
        while s.pending.load(SeqCst) != 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let helper_panicked = s.panicked.swap(false, SeqCst);
        drop(guard);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        assert!(
            !helper_panicked,
            "a CPU pool job panicked on a helper thread"
        );
    }

    /// Split `0 .. n` into `threads()` contiguous ranges whose starts are multiples
    /// of `align` (except none), and call `f(range)` for each non-empty one in parallel.
    pub fn for_ranges(&self, n: usize, align: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        let parts = self.threads();
        let align = align.max(1);
        let units = n.div_ceil(align);
        self.run(&|p| {
            let a = (units * p / parts * align).min(n);
            let b = (units * (p + 1) / parts * align).min(n);
            if a < b {
                f(a..b);
            }
        });
    }

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

/// A mutable slice that the parts of one [`Pool`] job may share, each taking a
/// disjoint range of it.
#[derive(Debug)]
pub struct SharedSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: parts only reach the elements through `range`, whose contract makes
// the ranges of concurrent callers disjoint.
unsafe impl<T: Send> Send for SharedSlice<'_, T> {}
unsafe impl<T: Send> Sync for SharedSlice<'_, T> {}

impl<'a, T> SharedSlice<'a, T> {
    /// Share `s` for the duration of its borrow.
    pub fn new(s: &'a mut [T]) -> Self {
        SharedSlice {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _life: std::marker::PhantomData,
        }
    }

    /// Elements `r` of the slice.
    ///
    /// # Safety
    /// No two live results of `range` on this value may overlap.
    ///
    /// # Panics
    /// If `r` is not inside the slice.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range(&self, r: std::ops::Range<usize>) -> &mut [T] {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "SharedSlice::range out of bounds"
        );
        // SAFETY: in bounds (checked); disjointness is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len()) }
    }

    /// Write element `i`.
    ///
    /// # Safety
    /// No live result of `range` covers `i`, and no other part writes or reads
    /// `i` meanwhile.
    ///
    /// # Panics
    /// If `i` is not inside the slice.
    pub unsafe fn set(&self, i: usize, v: T) {
        assert!(i < self.len, "SharedSlice::set out of bounds");
        // SAFETY: in bounds (checked); exclusivity is the caller's promise.
        unsafe { self.ptr.add(i).write(v) }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

fn helper(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        // Spin for new work, then sleep.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.stop.load(SeqCst) {
                return;
            }
            if s.generation.load(SeqCst) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && start.elapsed() > SPIN {
                s.sleeping.fetch_add(1, SeqCst);
                let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                while s.generation.load(SeqCst) == seen && !s.stop.load(SeqCst) {
                    l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
                }
                drop(l);
                s.sleeping.fetch_sub(1, SeqCst);
            } else {
                std::hint::spin_loop();
            }
        }
        seen = s.generation.load(SeqCst);
        // SAFETY: the job was written before the generation was published and
        // stays valid until `pending` reaches 0, which needs this helper.
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            // SAFETY: see above; `run` keeps the closure alive until pending == 0.
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(index))).is_err() {
                s.panicked.store(true, SeqCst);
            }
        }
        s.pending.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_part_runs_once_per_job() {
        let pool = Pool::new(3);
        for _ in 0..1000 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|p| {
                hits[p].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
        }
    }

    #[test]
    fn ranges_cover_everything_once_with_aligned_starts() {
        let pool = Pool::new(2);
        for n in [0usize, 1, 3, 4, 7, 64, 1001] {
            let seen: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.for_ranges(n, 4, &|r| {
                assert!(r.start % 4 == 0);
                for i in r {
                    seen[i].fetch_add(1, SeqCst);
                }
            });
            assert!(seen.iter().all(|h| h.load(SeqCst) == 1), "n = {n}");
        }
    }

    /// Counts of each unit's runs and of the units each part ran, after
    /// `steal_runs(n, start, ..)`; `slow` sleeps part 0 per unit.
    fn steal(
        pool: &Pool,
        n: usize,
        start: &(dyn Fn(usize) -> usize + Sync),
        slow: bool,
    ) -> (Vec<usize>, Vec<usize>) {
        let runs: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        let by: Vec<AtomicUsize> = (0..pool.threads()).map(|_| AtomicUsize::new(0)).collect();
        pool.steal_runs(n, start, &|p, r| {
            assert!(r.start < r.end && r.end <= n, "empty or outside run {r:?}");
            for u in r {
                if slow && p == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                runs[u].fetch_add(1, SeqCst);
                by[p].fetch_add(1, SeqCst);
            }
        });
        let get = |v: Vec<AtomicUsize>| v.into_iter().map(AtomicUsize::into_inner).collect();
        (get(runs), get(by))
    }

    #[test]
    fn stolen_runs_cover_every_unit_once_however_the_runs_are_cut() {
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads);
            let parts = threads;
            for n in [0usize, 1, 2, 5, 64, 1000] {
                let cuts: [&(dyn Fn(usize) -> usize + Sync); 4] = [
                    &|p| n * p / parts,
                    &|p| if p == 0 { 0 } else { n },
                    &|p| if p < parts { 0 } else { n },
                    &|p| (n * p * p / (parts * parts)).min(n),
                ];
                for start in cuts {
                    for _ in 0..20 {
                        let (runs, _) = steal(&pool, n, start, false);
                        assert!(
                            runs.iter().all(|&c| c == 1),
                            "threads {threads}, n {n}: {runs:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_slow_part_has_its_units_taken_by_the_others() {
        let pool = Pool::new(2);
        // Part 0 owns all 40 units and sleeps on each: part 1 must take the
        // back of its run (half of what is left, as often as it can).
        let (runs, by) = steal(&pool, 40, &|p| if p == 0 { 0 } else { 40 }, true);
        assert!(runs.iter().all(|&c| c == 1));
        assert!(by[1] >= 10, "part 1 took {} of 40 units", by[1]);
    }

    #[test]
    fn concurrent_callers_of_steal_runs_each_finish_their_own_job() {
        let pool = Arc::new(Pool::new(2));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    for n in 0..200 {
                        let (runs, _) = steal(&pool, n, &|p| n * p / 2, false);
                        assert!(runs.iter().all(|&c| c == 1));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn helpers_wake_after_sleeping_and_concurrent_callers_both_finish() {
        let pool = Arc::new(Pool::new(2));
        std::thread::sleep(Duration::from_millis(5)); // helpers are asleep now
        let total = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (pool, total) = (Arc::clone(&pool), Arc::clone(&total));
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        pool.run(&|_| {
                            total.fetch_add(1, SeqCst);
                        });
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(total.load(SeqCst), 2 * 200 * 2);
    }

    #[test]
    fn a_panicking_part_is_raised_on_the_caller_and_the_pool_survives() {
        let pool = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|p| {
                if p == 1 {
                    panic!("part 1 fails");
                }
            })
        }));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        pool.run(&|_| {
            n.fetch_add(1, SeqCst);
        });
        assert_eq!(n.load(SeqCst), 2);
    }
}
