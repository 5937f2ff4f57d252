//! `cqlm serve --backend gpu` (lavapipe in CI): the GPU batch engine serves
//! concurrent requests, and each greedy request's text equals `cqlm generate
//! --backend gpu` for its prompt, batched (`--parallel 3`, the requests in one
//! pass) and with a session each (`--no-batch`). Skips only where no GPU adapter
//! exists and `CQLM_REQUIRE_GPU` is unset.

use super::serve::{post, start_on};
use serde_json::json;
use std::process::Command;

/// `cqlm generate --backend gpu` of `prompt` (greedy), or None when no adapter.
fn generate_gpu(prompt: &str, tokens: usize) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args(["generate", "--backend", "gpu", "--prompt", prompt])
        .args(["--max-tokens", &tokens.to_string()])
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .unwrap();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let required = std::env::var("CQLM_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0");
        assert!(
            !required,
            "CQLM_REQUIRE_GPU is set but the GPU run failed: {err}"
        );
        eprintln!("skipping: {err}");
        return None;
    }
    // stdout is the text and one newline.
    let text = String::from_utf8(out.stdout).unwrap();
    Some(text.strip_suffix('\n').unwrap_or(&text).to_string())
}

#[test]
fn the_gpu_batch_serves_concurrent_requests_as_generate_would() {
    let prompts = [
        "The king said to his daughter,",
        "In the beginning",
        "And the LORD spake",
    ];
    let mut want = Vec::new();
    for p in prompts {
        let Some(text) = generate_gpu(p, 16) else {
            return;
        };
        want.push(text);
    }
    for extra in [&["--parallel", "3"][..], &["--parallel", "3", "--no-batch"]] {
        let s = start_on("gpu", extra, &[]);
        let got: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (addr, p) = (s.addr.clone(), p.to_string());
                std::thread::spawn(move || {
                    post(
                        &addr,
                        "/v1/completions",
                        &json!({"prompt": p, "max_tokens": 16, "temperature": 0}),
                    )
                })
            })
            .collect();
        for (g, want) in got.into_iter().zip(&want) {
            let (status, v) = g.join().unwrap();
            assert_eq!(status, 200, "{extra:?}: {v}");
            assert_eq!(v["choices"][0]["text"], *want, "{extra:?}");
        }
    }
}

#[test]
fn more_sequences_than_the_gpu_holds_is_an_error_before_serving() {
    if generate_gpu("x", 1).is_none() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args([
            "serve",
            "--backend",
            "gpu",
            "--port",
            "0",
            "--parallel",
            "33",
        ])
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.contains("XDG_RUNTIME_DIR"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("error:") && lines[0].contains("32 token slots"),
        "{err}"
    );
    assert!(!err.contains("listening"), "{err}");
}
