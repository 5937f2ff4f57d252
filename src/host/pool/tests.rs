use super::*;
use std::sync::atomic::AtomicUsize;
use std::thread::ThreadId;

#[test]
fn every_part_runs_once_per_job() {
    for pool in [Pool::new(1), Pool::new(3)] {
        for _ in 0..1000 {
            let hits: Vec<AtomicUsize> = (0..pool.threads()).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|p| {
                hits[p].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
        }
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

/// The threads that ran each part of one job.
fn runners(pool: &Pool, part_time: Duration) -> Vec<ThreadId> {
    let ids = Mutex::new(vec![None; pool.threads()]);
    pool.run(&|p| {
        std::thread::sleep(part_time);
        ids.lock().unwrap()[p] = Some(std::thread::current().id());
    });
    ids.into_inner()
        .unwrap()
        .into_iter()
        .map(Option::unwrap)
        .collect()
}

#[test]
fn a_helper_the_os_does_not_run_never_stalls_a_job() {
    let pool = Pool::new(2);
    pool.hold_helpers(true);
    let me = std::thread::current().id();
    for _ in 0..200 {
        assert!(runners(&pool, Duration::ZERO).iter().all(|&t| t == me));
    }
    assert_eq!(pool.stats().parts_taken_by_caller, 200);
    // Released, the helper takes parts again.
    pool.hold_helpers(false);
    let helped = (0..500).any(|_| {
        runners(&pool, Duration::from_millis(1))
            .iter()
            .any(|&t| t != me)
    });
    assert!(helped, "no part ran on the helper after it was released");
}

#[test]
fn an_oversubscribed_pool_beside_busy_threads_runs_every_part_once() {
    let stop = Arc::new(AtomicBool::new(false));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let busy: Vec<_> = (0..cores)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(SeqCst) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    for pool in [Pool::new(8), Pool::new(3)] {
        let x: Vec<u64> = (0..10_000).collect();
        for n in [1usize, 7, 100, 10_000] {
            for _ in 0..50 {
                let (sum, ranges) = (AtomicU64::new(0), AtomicUsize::new(0));
                pool.for_ranges(n, 1, &|r| {
                    sum.fetch_add(x[r].iter().sum(), SeqCst);
                    ranges.fetch_add(1, SeqCst);
                });
                assert_eq!(sum.into_inner(), (0..n as u64).sum::<u64>(), "n = {n}");
                assert_eq!(ranges.into_inner(), n.min(pool.threads()), "n = {n}");
            }
        }
    }
    stop.store(true, SeqCst);
    busy.into_iter().for_each(|t| t.join().unwrap());
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

#[test]
fn helpers_that_never_help_turn_the_pool_to_running_jobs_alone() {
    // Held helpers claim nothing, so a split job takes as long as the caller
    // alone (its part and the other): splitting does not pay, and after a
    // window the pool runs jobs on the caller alone. Every part still runs
    // once, held or not.
    let pool = Pool::new(2);
    let hits = AtomicUsize::new(0);
    let work = |_p: usize| {
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(20) {
            std::hint::spin_loop();
        }
        hits.fetch_add(1, SeqCst);
    };
    pool.hold_helpers(true);
    let jobs = 3 * governor::WINDOW as usize;
    for _ in 0..jobs {
        pool.run(&work);
    }
    let s = pool.stats();
    assert!(s.switches >= 1 && s.alone_under_load > 0, "{s:?}");
    assert_eq!(s.split_jobs + s.alone_jobs, jobs as u64);
    pool.hold_helpers(false);
    for _ in 0..jobs {
        pool.run(&work);
    }
    assert_eq!(hits.load(SeqCst), 2 * 2 * jobs);
}
