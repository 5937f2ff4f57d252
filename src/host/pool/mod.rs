//! A persistent fork-join pool for the token step, made to stay fast on a busy
//! machine.
//!
//! A job is `f(part)` for `part` in `0 .. threads()`. The caller publishes it
//! and runs part 0; every other part is claimed by whichever thread gets to it
//! first: a helper that is awake, or the caller once its own part is done. So a
//! job never waits for a helper that the OS has not scheduled: the caller runs
//! the parts no helper has claimed, and waits only for parts already under way.
//!
//! Between jobs a helper spins briefly ([`SPIN`], so the dozens of small jobs of
//! a token each cost well under a microsecond to hand out), then yields its core
//! to whatever else is runnable ([`YIELD`]), then sleeps, so an idle engine burns
//! no CPU. The caller waits for parts under way in the same three stages.
//!
//! On a machine whose cores are all taken, splitting costs more than it gives
//! (a helper that loses its core mid-part holds the job for a time slice): the
//! pool then runs jobs on the caller alone, and splits a probe now and then
//! until splitting pays again (`governor.rs`, which times split jobs against
//! the caller's own part).
//!
//! Why not rayon: its workers go to sleep between the short jobs of a step, and
//! waking them costs more than a 512×512 matvec (measured: splitting every matvec
//! through rayon made `default` decode 12% slower than not splitting at all).
//! Low-latency pools on crates.io (fork_union) build C++ and need `&mut` access.

mod governor;
mod runs;
mod shared_slice;

pub use shared_slice::SharedSlice;

use governor::Governor;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a waiting thread (an idle helper, or the caller waiting for parts
/// under way) spins before it yields.
const SPIN: Duration = Duration::from_micros(20);
/// How long it then yields its core to other runnable threads before it sleeps.
const YIELD: Duration = Duration::from_micros(200);
/// Sleeping helpers are woken by a job at most this often.
const WAKE_EVERY: Duration = Duration::from_micros(200);

/// One job: a borrowed closure called once per part (`0 .. parts`).
type Job = *const (dyn Fn(usize) + Sync);

/// Bits of [`Shared::claim`] that hold the next unclaimed part (the rest: the
/// job's generation).
const PART_BITS: u32 = 24;

struct Shared {
    /// The current job's generation (high bits) and its next unclaimed part
    /// (low [`PART_BITS`]); publishing a job raises the generation.
    claim: AtomicU64,
    /// The current job; written only while no part of a job is under way.
    job: UnsafeCell<Option<Job>>,
    /// Parts of every job (the pool's threads).
    parts: usize,
    /// Parts of the current job finished.
    done: AtomicUsize,
    /// Set if a part panicked.
    panicked: AtomicBool,
    /// Helpers asleep (or about to be) on `wake`.
    sleeping: AtomicUsize,
    /// The caller sleeps (or is about to) on `finished`.
    caller_sleeping: AtomicBool,
    /// While set, helpers claim no part (a helper the OS does not run; tests).
    held: AtomicBool,
    stop: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    finished: Condvar,
}

// SAFETY: `job` is written by the one thread holding `Pool::busy` before the
// generation is published, and read by a helper only after it has claimed a
// part of that generation; the pointee outlives the job because `run` waits
// until every claimed part is done.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

impl Shared {
    /// Claim the next part of generation `generation`, if any is left.
    fn claim(&self, generation: u64) -> Option<usize> {
        let mut v = self.claim.load(SeqCst);
        loop {
            let part = (v & ((1 << PART_BITS) - 1)) as usize;
            if v >> PART_BITS != generation || part >= self.parts {
                return None;
            }
            match self.claim.compare_exchange_weak(v, v + 1, SeqCst, SeqCst) {
                Ok(_) => return Some(part),
                Err(now) => v = now,
            }
        }
    }

    /// Run part `part` of the current job (claimed by this thread) and count it.
    fn run_part(&self, f: &(dyn Fn(usize) + Sync), part: usize) {
        if catch_unwind(AssertUnwindSafe(|| f(part))).is_err() {
            self.panicked.store(true, SeqCst);
        }
        if self.done.fetch_add(1, SeqCst) + 1 == self.parts && self.caller_sleeping.load(SeqCst) {
            let _l = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.finished.notify_one();
        }
    }
}

/// Spin, then yield, until `ready()` or the two stages have passed; `true`
/// when `ready()`.
fn spin_then_yield(ready: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if ready() {
            return true;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            let waited = start.elapsed();
            if waited > SPIN + YIELD {
                return false;
            }
            if waited > SPIN {
                std::thread::yield_now();
                continue;
            }
        }
        std::hint::spin_loop();
    }
}

/// What a pool has done so far ([`Pool::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Threads of the pool (the caller included).
    pub threads: usize,
    /// Jobs split over the pool.
    pub split_jobs: u64,
    /// Jobs run on the caller alone: a pool of one thread, or another
    /// thread's job was running.
    pub alone_jobs: u64,
    /// Parts of split jobs that the caller ran because no helper had claimed
    /// them (helpers the OS had not scheduled, or asleep).
    pub parts_taken_by_caller: u64,
    /// Of `alone_jobs`, those run alone because splitting did not pay (a
    /// machine whose cores are all taken).
    pub alone_under_load: u64,
    /// Times the pool turned between splitting and running jobs alone.
    pub switches: u64,
}

impl PoolStats {
    /// What the pool did between `before` (an earlier [`Pool::stats`] of the
    /// same pool) and `self`; `threads` is kept.
    pub fn since(&self, before: &PoolStats) -> PoolStats {
        PoolStats {
            threads: self.threads,
            split_jobs: self.split_jobs - before.split_jobs,
            alone_jobs: self.alone_jobs - before.alone_jobs,
            parts_taken_by_caller: self.parts_taken_by_caller - before.parts_taken_by_caller,
            alone_under_load: self.alone_under_load - before.alone_under_load,
            switches: self.switches - before.switches,
        }
    }

    /// The share of jobs split over the pool, in 0..=1 (0 with no jobs).
    pub fn split_share(&self) -> f64 {
        self.split_jobs as f64 / (self.split_jobs + self.alone_jobs).max(1) as f64
    }
}

/// A fork-join pool of `threads()` threads: the caller plus `threads() − 1` helpers.
pub struct Pool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// Held while a job runs, with when a job last woke the sleeping
    /// helpers and whether jobs are split; a second caller meanwhile runs its
    /// job alone.
    busy: Mutex<RunState>,
    split_jobs: AtomicU64,
    alone_jobs: AtomicU64,
    taken_by_caller: AtomicU64,
    alone_under_load: AtomicU64,
    switches: AtomicU64,
}

/// What [`Pool::busy`] guards.
struct RunState {
    last_wake: Instant,
    governor: Governor,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads())
            .finish()
    }
}

/// How the process-wide pool's thread count was chosen, for [`Pool::why`].
static WHY: OnceLock<String> = OnceLock::new();

impl Pool {
    /// A pool of `threads` threads in all (at least 1: the caller alone).
    pub fn new(threads: usize) -> Pool {
        let threads = threads.clamp(1, 1 << (PART_BITS - 1));
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(threads as u64),
            job: UnsafeCell::new(None),
            parts: threads,
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            caller_sleeping: AtomicBool::new(false),
            held: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            finished: Condvar::new(),
        });
        let helpers: Vec<_> = (1..threads)
            .filter_map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("cqlm-cpu-{i}"))
                    .spawn(move || helper(&s))
                    .ok()
            })
            .collect();
        if helpers.len() + 1 != threads {
            // The parts stay `threads` (callers' splits don't depend on the
            // spawns): the caller claims what no helper does.
            log::warn!(
                "CPU pool: {} of {threads} threads started",
                helpers.len() + 1
            );
        }
        Pool {
            shared,
            helpers,
            busy: Mutex::new(RunState {
                last_wake: Instant::now(),
                governor: Governor::default(),
            }),
            split_jobs: AtomicU64::new(0),
            alone_jobs: AtomicU64::new(0),
            taken_by_caller: AtomicU64::new(0),
            alone_under_load: AtomicU64::new(0),
            switches: AtomicU64::new(0),
        }
    }

    /// The process-wide pool of the CPU engines: `CQLM_THREADS` threads if set
    /// (≥ 1), else one per available core.
    pub fn global() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let set = std::env::var("CQLM_THREADS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|&n| n >= 1);
            let (n, why) = match set {
                Some(n) => (n, format!("CQLM_THREADS={n}")),
                None => (cores, format!("one per available core ({cores})")),
            };
            let _ = WHY.set(why);
            Pool::new(n)
        })
    }

    /// How the process-wide pool's thread count was chosen (after
    /// [`Pool::global`]; empty before).
    pub fn why() -> &'static str {
        WHY.get().map_or("", String::as_str)
    }

    /// Threads a job is split over (the caller included).
    pub fn threads(&self) -> usize {
        self.shared.parts
    }

    /// What the pool has done since it was made.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            threads: self.threads(),
            split_jobs: self.split_jobs.load(Relaxed),
            alone_jobs: self.alone_jobs.load(Relaxed),
            parts_taken_by_caller: self.taken_by_caller.load(Relaxed),
            alone_under_load: self.alone_under_load.load(Relaxed),
            switches: self.switches.load(Relaxed),
        }
    }

    /// While `held`, helpers claim no part of any job, as if the OS did not run
    /// them (they finish a part already under way); for tests.
    #[doc(hidden)]
    pub fn hold_helpers(&self, held: bool) {
        self.shared.held.store(held, SeqCst);
        if !held {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
    }

    /// Call `f(part)` for every `part` in `0 .. threads()`, each exactly once,
    /// and return when all are done: in parallel when the pool splits the job
    /// (the caller runs part 0 and every part no helper has claimed by then),
    /// else one after another on the caller (while another thread's job
    /// runs, or while the machine's cores are all taken: `governor.rs`). A
    /// part may run on any of the pool's threads, never on two at once.
    ///
    /// # Panics
    /// Re-raises a panic of any part (after all parts have finished).
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        let n = self.threads();
        let guard = match self.busy.try_lock() {
            Ok(g) => Some(g),
            // A part panicked on the caller while it held `busy`: the instant
            // it guards is whole.
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        let Some(mut state) = guard.filter(|_| n > 1) else {
            self.alone_jobs.fetch_add(1, Relaxed);
            (0..n).for_each(f);
            return;
        };
        if !state.governor.split_next() {
            self.alone_jobs.fetch_add(1, Relaxed);
            self.alone_under_load.fetch_add(1, Relaxed);
            (0..n).for_each(f);
            return;
        }
        self.split_jobs.fetch_add(1, Relaxed);
        let RunState {
            last_wake,
            governor,
        } = &mut *state;
        let (panicked, wall, own) = self.run_split(f, last_wake);
        if governor.record(n, wall, own) {
            self.switches.fetch_add(1, Relaxed);
        }
        drop(state);
        assert!(!panicked, "a CPU pool job panicked");
    }

    /// One job split over the pool (the caller holds `busy`): whether a part
    /// panicked, the job's wall time and the time of the caller's own part.
    fn run_split(
        &self,
        f: &(dyn Fn(usize) + Sync),
        last_wake: &mut Instant,
    ) -> (bool, Duration, Duration) {
        let start = Instant::now();
        let s = &*self.shared;
        // SAFETY: erasing the lifetime is sound because this function does not
        // return before every claimed part has finished with `f` (`done ==
        // parts`), and no part can be claimed after that.
        let job: Job = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Job>(f) };
        // SAFETY: no helper reads `job` before it claims a part of the new
        // generation, and every part of the previous job finished before its
        // `run` returned.
        unsafe { *s.job.get() = Some(job) };
        s.done.store(0, SeqCst);
        let generation = (s.claim.load(SeqCst) >> PART_BITS) + 1;
        // Part 0 is the caller's.
        s.claim.store((generation << PART_BITS) | 1, SeqCst);
        // Sleeping helpers are woken at most once per [`WAKE_EVERY`]: the job
        // does not wait for them (the caller claims their parts), and on a busy
        // machine, where they fall asleep between most jobs, a wake per job
        // would be a futex call and a preemption per job.
        if s.sleeping.load(SeqCst) > 0 && start.duration_since(*last_wake) >= WAKE_EVERY {
            *last_wake = start;
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        s.run_part(f, 0);
        let own = start.elapsed();
        while let Some(part) = s.claim(generation) {
            self.taken_by_caller.fetch_add(1, Relaxed);
            s.run_part(f, part);
        }
        if !spin_then_yield(|| s.done.load(SeqCst) == s.parts) {
            s.caller_sleeping.store(true, SeqCst);
            let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            while s.done.load(SeqCst) != s.parts {
                l = s.finished.wait(l).unwrap_or_else(|e| e.into_inner());
            }
            drop(l);
            s.caller_sleeping.store(false, SeqCst);
        }
        (s.panicked.swap(false, SeqCst), start.elapsed(), own)
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

/// A helper thread: wait for a new job, claim its parts while any is left.
fn helper(s: &Shared) {
    // Generation 0 is the empty job the pool starts with.
    let mut seen = 0;
    loop {
        let fresh = || s.claim.load(SeqCst) >> PART_BITS != seen || s.stop.load(SeqCst);
        if !spin_then_yield(fresh) {
            s.sleeping.fetch_add(1, SeqCst);
            let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            while !fresh() {
                l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
            }
            drop(l);
            s.sleeping.fetch_sub(1, SeqCst);
        }
        if s.stop.load(SeqCst) {
            return;
        }
        seen = s.claim.load(SeqCst) >> PART_BITS;
        while s.held.load(SeqCst) && !s.stop.load(SeqCst) {
            let l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            let _ = s.wake.wait_timeout(l, Duration::from_millis(1));
        }
        while let Some(part) = s.claim(seen) {
            // SAFETY: the job was written before its generation was published
            // and stays valid until its parts are done, this one among them.
            let job = unsafe { *s.job.get() };
            if let Some(job) = job {
                // SAFETY: see above.
                s.run_part(unsafe { &*job }, part);
            }
        }
    }
}

#[cfg(test)]
mod tests;
