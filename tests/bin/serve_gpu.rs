//! `cqlm serve --backend gpu` (lavapipe in CI): the GPU batch engine serves
//! concurrent requests, and each greedy request's text equals `cqlm generate
//! --backend gpu` for its prompt, one at a time (`--parallel 1`, the others
//! queued) and batched (`--parallel 4`, the requests in one pass); a greedy
//! request reads back a few bytes a token (the device's argmax), one that
//! samples from the full logits reads them back, and logprobs come from the
//! device's top candidates. Skips only where no GPU adapter
//! exists and `CQLM_REQUIRE_GPU` is unset.

use crate::common::serve::{http, post, start_on};
use serde_json::json;
use std::process::Command;

/// `cqlm generate --backend gpu` of `prompt` (greedy), or None when no adapter.
fn generate_gpu(prompt: &str, tokens: usize) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args([
            "generate",
            "--backend",
            "gpu",
            "--temperature",
            "0",
            "--prompt",
            prompt,
        ])
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
    for extra in [&["--parallel", "1"][..], &["--parallel", "4"]] {
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

/// `cqlm_readback_bytes_total` of the server at `addr`.
fn read_back(addr: &str) -> f64 {
    let (status, _, body) = http(addr, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix("cqlm_readback_bytes_total ")?.parse().ok())
        .unwrap_or_else(|| panic!("no cqlm_readback_bytes_total in {body}"))
}

#[test]
fn a_greedy_request_reads_back_no_logits_and_a_full_sample_does() {
    if generate_gpu("x", 1).is_none() {
        return;
    }
    let s = start_on("gpu", &["--parallel", "2"], &[]);
    let vocab = cqlm::model::builtin::model().unwrap().config.vocab as f64;
    let tokens = 12.0;
    let before = read_back(&s.addr);
    let body = json!({"prompt": "In the beginning", "max_tokens": 12, "temperature": 0});
    let (status, v) = post(&s.addr, "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    let n = v["usage"]["completion_tokens"].as_f64().unwrap();
    assert_eq!(n, tokens, "{v}");
    let greedy = read_back(&s.addr) - before;
    // The device's argmax: 8 bytes for each of the 12 choices (the first after
    // the prompt), and nothing else.
    assert_eq!(
        greedy,
        8.0 * tokens,
        "greedy read back {greedy} bytes for {n} tokens"
    );
    // Temperature 1 without top-k or top-p samples from the full logits.
    let before = read_back(&s.addr);
    let body = json!({"prompt": "In the beginning", "max_tokens": 12, "temperature": 1.0,
        "seed": 3});
    let (status, v) = post(&s.addr, "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    let n = v["usage"]["completion_tokens"].as_f64().unwrap();
    let sampled = read_back(&s.addr) - before;
    assert!(
        sampled >= 4.0 * vocab * n,
        "sampled read back {sampled} bytes for {n} tokens"
    );
}

#[test]
fn gpu_logprobs_come_from_the_device_top_k_and_match_cqlm_logits() {
    if generate_gpu("x", 1).is_none() {
        return;
    }
    use crate::serve_logprobs::{chat_prompt_ids, check_against_reference, entries};
    let s = start_on("gpu", &["--parallel", "2"], &[]);
    let vocab = cqlm::model::builtin::model().unwrap().config.vocab as f64;
    let messages = json!([{"role": "user", "content": "Tell me about the king."}]);
    let prompt = chat_prompt_ids(&s, &messages);
    let ask = |extra: serde_json::Value| {
        let mut body = json!({"messages": messages, "max_tokens": 10, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let before = read_back(&s.addr);
        let (status, v) = post(&s.addr, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        (v, read_back(&s.addr) - before)
    };
    let (plain, _) = ask(json!({}));
    let (v, bytes) = ask(json!({"logprobs": true, "top_logprobs": 5}));
    // The same greedy answer; each choice read back the device's top
    // candidates and softmax denominator, never the vocabulary's logits.
    assert_eq!(v["choices"][0]["message"], plain["choices"][0]["message"]);
    let n = v["usage"]["completion_tokens"].as_f64().unwrap();
    assert!(
        bytes > 8.0 * n && bytes < 4.0 * vocab * n / 2.0,
        "read back {bytes} bytes for {n} tokens"
    );
    let got = entries(&v["choices"][0]["logprobs"]["content"]);
    assert_eq!(got.len() as f64, n);
    check_against_reference(&prompt, &got, 5, "gpu");
}

#[test]
fn the_gpu_prompt_cache_answers_as_a_cold_server() {
    if generate_gpu("The king", 1).is_none() {
        return;
    }
    let warm = start_on("gpu", &["--parallel", "2"], &[]);
    let cold = start_on("gpu", &["--parallel", "2", "--cache-mb", "0"], &[]);
    let ask = |s: &crate::common::serve::Server, prompt: &str| {
        let (status, v) = post(
            &s.addr,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 12, "temperature": 0}),
        );
        assert_eq!(status, 200, "{v}");
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        (
            v["choices"][0]["text"].as_str().unwrap().to_string(),
            cached,
        )
    };
    let first = "Once upon a time there was a king who had three daughters";
    assert_eq!(ask(&warm, first).1, 0);
    let second = format!("{first}, and the youngest was the fairest");
    let (text, cached) = ask(&warm, &second);
    assert!(cached > 5, "the state after the first prompt: {cached}");
    assert_eq!(text, ask(&cold, &second).0);
}
