//! The CPU pool changes no number: `cqlm logits` over a prompt (prefilled in
//! chunks, and step by step with the logits of every position), in both
//! precisions, writes the same bytes with 1, 2 and 8 threads (more threads
//! than cores), and beside busy processes that take every core.

use crate::common::cli::{assert_ok, cqlm};
use std::process::{Child, Command};

/// One busy loop per core, killed on drop.
struct Busy(Vec<Child>);

impl Busy {
    fn start() -> Busy {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Busy(
            (0..cores)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("start a busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn logits_are_the_same_bytes_with_any_thread_count_and_beside_busy_cores() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // `default`'s shape: large enough that the pool splits matvecs, prefill
    // chunks and the per-token work.
    let synth = cqlm(
        d,
        &[
            "synth", "--preset", "default", "--seed", "5", "--out", "m.cqlm",
        ],
    );
    assert_ok(&synth, "synth");
    let ids: Vec<String> = (0..40u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) % 32_000).to_string())
        .collect();
    let ids = ids.join(",");
    let run = |threads: &str, precision: &str, all: bool| -> Vec<u8> {
        let out = format!("l-{threads}-{precision}-{all}.npy");
        let mut args = vec![
            "logits",
            "--model",
            "m.cqlm",
            "--backend",
            "cpu",
            "--precision",
            precision,
            "--ids",
            &ids,
            "--prefill-chunk",
            "16",
            "--out",
            &out,
        ];
        if all {
            args.push("--all-positions");
        }
        let o = Command::new(env!("CARGO_BIN_EXE_cqlm"))
            .args(&args)
            .current_dir(d)
            .env("CQLM_THREADS", threads)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert_ok(&o, &format!("logits, {threads} threads"));
        std::fs::read(d.join(out)).unwrap()
    };
    for precision in ["fast", "exact"] {
        for all in [false, true] {
            let one = run("1", precision, all);
            let what = format!("{precision}, all positions {all}");
            assert_eq!(run("2", precision, all), one, "2 threads: {what}");
            assert_eq!(run("8", precision, all), one, "8 threads: {what}");
            let busy = Busy::start();
            assert_eq!(run("2", precision, all), one, "2 threads, busy: {what}");
            assert_eq!(run("8", precision, all), one, "8 threads, busy: {what}");
            drop(busy);
        }
    }
}
