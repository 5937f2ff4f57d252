//! `cqlm profile` from outside: JSON whose rows add up to at most the step, an SVG
//! chart, the GPU's dispatches counted (skipped without an adapter unless
//! `CQLM_REQUIRE_GPU` is set), a batch's profile per pass, and bad flags are
//! errors. (The profiles themselves are `tests/gpu/profile.rs`.)

use crate::common::cli::{assert_ok, cqlm, text};
use crate::common::gpu::gpu;
use std::process::Output;

/// Stdout of a run that must succeed.
fn ok(out: &Output, what: &str) -> String {
    assert_ok(out, what);
    text(&out.stdout)
}

fn check_json(stdout: &str, tokens: u64) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(v["tokens"], tokens);
    let rows = v["rows"].as_array().expect("rows");
    assert!(!rows.is_empty());
    let mut sum = 0.0;
    let mut calls = 0;
    for r in rows {
        assert!(r["kernel"].is_string(), "{r}");
        let us = r["us_per_token"].as_f64().unwrap();
        assert!(us > 0.0, "{r}");
        assert!(r["bytes_per_token"].as_u64().unwrap() > 0, "{r}");
        assert!(r["gb_per_s"].as_f64().unwrap() > 0.0, "{r}");
        let share = r["share"].as_f64().unwrap();
        assert!(share > 0.0 && share <= 1.0, "{r}");
        calls += r["calls_per_token"].as_u64().unwrap();
        sum += us;
    }
    assert_eq!(v["calls_per_token"].as_u64(), Some(calls));
    assert!((v["kernel_sum_us"].as_f64().unwrap() - sum).abs() <= 1e-6 * sum.max(1.0));
    assert!(sum <= v["step_us"].as_f64().unwrap(), "{v}");
    v
}

#[test]
fn cli_profile_prints_json_and_writes_an_svg_chart() {
    let dir = tempfile::tempdir().unwrap();
    let out = cqlm(
        dir.path(),
        &[
            "profile",
            "--preset",
            "tiny",
            "--backend",
            "cpu",
            "--tokens",
            "3",
            "--json",
        ],
    );
    let v = check_json(&ok(&out, "profile --json"), 3);
    assert!(v["method"].as_str().unwrap().contains("cpu"));
    assert!(v["dispatches_per_token"].is_null());
    assert!(v["host_us_per_token"].is_null());

    let out = cqlm(
        dir.path(),
        &[
            "profile",
            "--preset",
            "tiny",
            "--backend",
            "cpu",
            "--tokens",
            "2",
            "--svg",
            "chart.svg",
        ],
    );
    let text = ok(&out, "profile --svg");
    assert!(text.contains("kernel") && text.contains("attend"), "{text}");
    let svg = std::fs::read_to_string(dir.path().join("chart.svg")).expect("chart written");
    assert!(svg.contains("<svg"), "{svg}");
    assert!(svg.contains("attend") && svg.contains("µs per token"));

    let out = cqlm(
        dir.path(),
        &[
            "profile",
            "--preset",
            "tiny",
            "--backend",
            "cpu",
            "--tokens",
            "0",
        ],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error:"));
}

#[test]
fn cli_profile_on_the_gpu_counts_every_dispatch() {
    let Some(_) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = cqlm(
        dir.path(),
        &[
            "profile",
            "--preset",
            "tiny",
            "--backend",
            "gpu",
            "--tokens",
            "2",
            "--json",
        ],
    );
    let v = check_json(&ok(&out, "profile --backend gpu --json"), 2);
    assert_eq!(v["calls_per_token"], v["dispatches_per_token"]);
    // Whole steps (in-pass timestamps) have a host cost; one submit per dispatch
    // is not a step and reports none.
    let per_dispatch = v["method"].as_str().unwrap().contains("per dispatch");
    match v["host_us_per_token"].as_f64() {
        Some(h) => assert!(!per_dispatch && h.is_finite() && h > 0.0, "{v}"),
        None => assert!(per_dispatch, "no host_us_per_token: {v}"),
    }
}

#[test]
fn cli_profile_of_a_batch_reports_per_pass() {
    let dir = tempfile::tempdir().unwrap();
    let args = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut a = vec![
            "profile",
            "--preset",
            "tiny",
            "--backend",
            "cpu",
            "--tokens",
            "2",
        ];
        a.extend_from_slice(extra);
        a
    };
    let out = cqlm(dir.path(), &args(&["--sequences", "3", "--json"]));
    let text = ok(&out, "profile --sequences 3 --json");
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON object");
    assert_eq!(v["pass"], "batch of 3");
    assert_eq!(v["tokens"], 2);
    assert!(v.get("calls_per_token").is_none(), "{v}");
    let rows = v["rows"].as_array().expect("rows");
    let mut sum = 0.0;
    for r in rows {
        let us = r["us_per_pass"].as_f64().expect("us_per_pass");
        assert!(us > 0.0 && r["calls_per_pass"].as_u64().unwrap() > 0, "{r}");
        sum += us;
    }
    assert!(sum <= v["step_us"].as_f64().unwrap(), "{v}");
    let out = cqlm(dir.path(), &args(&["--sequences", "2"]));
    let text = ok(&out, "profile --sequences 2");
    assert!(
        text.contains("µs/pass") && text.contains("batch of 2"),
        "{text}"
    );
    for bad in [
        &["--sequences", "0"][..],
        &["--sequences", "2", "--prefill"],
    ] {
        let out = cqlm(dir.path(), &args(bad));
        assert!(!out.status.success(), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("error:") && err.contains("--"),
            "{bad:?}: {err}"
        );
    }
}
