//! `tools/train/evaluate.py chat` on the built-in chat model, through the engine
//! from outside: `cqlm generate --tools` on prompts that Python rendered (CPU and
//! GPU), and `cqlm serve` with the official `openai` client. A subset of the
//! held-out conversations each; the scoring is Python's (independent of the
//! engine). The targets (tool name 95%, exact arguments, no tool and
//! answers with the result 90%) are not all met by the shipped model (README,
//! BENCHMARKS.md: exact arguments 86.2% over the whole set); the floors here sit
//! below what it measured on each subset, so a regression fails.
//!
//! Needs `CQLM_OPENAI_PYTHON` (a Python with openai and jinja2: `.ci/run`'s venv);
//! skipped without it unless `CQLM_REQUIRE_OPENAI` is set.

use crate::common::cli::assert_ok;
use crate::common::gpu::gpu;
use crate::common::serve::{openai_python as python, start};
use serde_json::Value;
use std::process::Command;

/// `evaluate.py chat` with `args`: its JSON summary.
fn evaluate(python: &str, args: &[&str]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/train/evaluate.py");
    let out = Command::new(python)
        .arg(script)
        .arg("chat")
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .unwrap();
    assert_ok(&out, "evaluate.py chat");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("{v}");
    v
}

/// The four figures reach `floors` (tool name, exact arguments, no tool, answer
/// uses the result; percent) over a subset that has both kinds.
fn assert_floors(v: &Value, floors: [f64; 4]) {
    assert!(v["tool_conversations"].as_u64().unwrap() >= 3, "{v}");
    assert!(v["no_tool_conversations"].as_u64().unwrap() >= 1, "{v}");
    let keys = [
        "tool_name_pct",
        "exact_arguments_pct",
        "no_tool_pct",
        "answer_uses_result_pct",
    ];
    for (k, floor) in keys.into_iter().zip(floors) {
        assert!(v[k].as_f64().unwrap() >= floor, "{k} below {floor}: {v}");
    }
}

#[test]
fn heldout_chat_through_cqlm_generate_on_the_cpu() {
    let Some(py) = python() else { return };
    let v = evaluate(
        &py,
        &[
            "--cqlm",
            env!("CARGO_BIN_EXE_cqlm"),
            "--backend",
            "cpu",
            "--limit",
            "80",
        ],
    );
    assert_eq!(v["conversations"], 80);
    // Measured on these 80: 98.5, 81.5, 100, 92.3.
    assert_floors(&v, [90.0, 65.0, 90.0, 80.0]);
}

#[test]
fn heldout_chat_through_cqlm_generate_on_the_gpu() {
    let Some(py) = python() else { return };
    if gpu().is_none() {
        return;
    }
    // lavapipe decodes ~15 tokens/s: a few conversations.
    let v = evaluate(
        &py,
        &[
            "--cqlm",
            env!("CARGO_BIN_EXE_cqlm"),
            "--backend",
            "gpu",
            "--limit",
            "6",
        ],
    );
    // Measured on these 6 (CPU): 4 of 4 names, 4 of 4 arguments, 2 of 2 without
    // a call, 4 of 4 answers.
    assert_floors(&v, [75.0, 50.0, 50.0, 75.0]);
}

#[test]
fn heldout_chat_through_the_server_and_the_openai_client() {
    let Some(py) = python() else { return };
    let s = start(&["--parallel", "2"]);
    let url = format!("http://{}/v1", s.addr);
    let v = evaluate(&py, &["--server", &url, "--limit", "40"]);
    assert_eq!(v["conversations"], 40);
    // Measured on these 40 through `cqlm generate`: 97.1, 85.7, 100, 91.4.
    assert_floors(&v, [90.0, 70.0, 90.0, 75.0]);
}
