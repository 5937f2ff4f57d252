//! `cqlm serve`'s operations side: `GET /metrics` counts what the responses say
//! was served (requests by endpoint and status, prompt and generated tokens from
//! their `usage`, one time-to-first-token and n − 1 inter-token gaps per
//! generation, nothing left active or queued), and stderr has one line per
//! request naming its id, status, tokens and how it ended. Batched and a session
//! per sequence alike.

use crate::common::serve::{http, post, start};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The samples of a text exposition: `name{labels}` → value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn scrape(addr: &str, headers: &[(&str, &str)]) -> (u16, String, HashMap<String, f64>) {
    let (status, head, body) = http(addr, "GET", "/metrics", headers, b"");
    (status, head, samples(&body))
}

fn requests(m: &HashMap<String, f64>, endpoint: &str, status: u16) -> f64 {
    let k = format!("cqlm_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}}");
    m.get(&k).copied().unwrap_or(0.0)
}

/// Wait until the server's log holds a line with every one of `parts`.
fn logged(log: &std::sync::Mutex<String>, parts: &[&str]) -> String {
    let t0 = Instant::now();
    loop {
        let text = log.lock().unwrap().clone();
        if let Some(l) = text.lines().find(|l| parts.iter().all(|p| l.contains(p))) {
            return l.to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no log line with {parts:?} in:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn metrics_count_what_was_served_and_each_request_is_logged() {
    let s = start(&["--parallel", "2"]);
    let (status, head, before) = scrape(&s.addr, &[]);
    assert_eq!(status, 200);
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert_eq!(before["cqlm_generated_tokens_total"], 0.0);

    // A whole completion, a streamed chat, a malformed request, a health check.
    let (status, done) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "In the beginning", "max_tokens": 5, "temperature": 0}),
    );
    assert_eq!(status, 200, "{done}");
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
        "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
    let (status, _, b) = http(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        body.to_string().as_bytes(),
    );
    assert_eq!(status, 200);
    let chunks: Vec<Value> = b
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let streamed = chunks.last().unwrap().clone();
    let (status, refused) = post(&s.addr, "/v1/completions", &json!({"prompt": 7}));
    assert_eq!(status, 400);
    assert_eq!(http(&s.addr, "GET", "/health", &[], b"").0, 200);

    // A long stream the client leaves after its first bytes.
    let long = json!({"prompt": "x", "max_tokens": 4000, "stream": true}).to_string();
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{long}", long.len()).unwrap();
    let mut first = [0u8; 64];
    c.read_exact(&mut first).unwrap();
    drop(c);
    let gone = logged(&s.log, &["POST /v1/completions", "finish=disconnected"]);

    // The worker stops the dropped stream at its next token.
    let mut scrapes = 1.0;
    let t0 = Instant::now();
    let m = loop {
        let (_, _, m) = scrape(&s.addr, &[]);
        if m["cqlm_active_sequences"] == 0.0 {
            break m;
        }
        scrapes += 1.0;
        assert!(t0.elapsed() < Duration::from_secs(10), "{m:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let usage = [&done["usage"], &streamed["usage"]];
    let sum = |k: &str| usage.iter().map(|u| u[k].as_f64().unwrap()).sum::<f64>();
    let field = |l: &str, k: &str| -> f64 {
        l.split(' ')
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {l}"))
    };
    // The dropped stream's tokens are counted as generated, as its log says.
    let (gone_prompt, gone_tokens) = (
        field(&gone, "prompt_tokens"),
        m["cqlm_generated_tokens_total"] - sum("completion_tokens"),
    );
    assert!(gone_tokens >= 1.0, "{m:?}");
    assert_eq!(
        m["cqlm_prompt_tokens_total"],
        sum("prompt_tokens") + gone_prompt
    );
    assert_eq!(requests(&m, "/v1/completions", 200), 2.0);
    assert_eq!(requests(&m, "/v1/completions", 400), 1.0);
    assert_eq!(requests(&m, "/v1/chat/completions", 200), 1.0);
    assert_eq!(requests(&m, "/health", 200), 1.0);
    assert_eq!(requests(&m, "/metrics", 200), scrapes);
    assert_eq!(m["cqlm_request_duration_seconds_count"], 5.0 + scrapes);
    // Three generations: a first token each, the other tokens one gap each.
    assert_eq!(m["cqlm_time_to_first_token_seconds_count"], 3.0);
    assert_eq!(
        m["cqlm_inter_token_latency_seconds_count"],
        m["cqlm_generated_tokens_total"] - 3.0
    );
    assert_eq!(m["cqlm_queue_depth"], 0.0);

    // One line per request, with the ids and counts the responses gave.
    for (v, path) in [
        (&done, "/v1/completions"),
        (&streamed, "/v1/chat/completions"),
    ] {
        let id = v["id"].as_str().unwrap();
        let line = logged(&s.log, &[path, &format!("id={id} ")]);
        assert!(line.contains("status=200"), "{line}");
        let u = &v["usage"];
        assert_eq!(
            field(&line, "prompt_tokens"),
            u["prompt_tokens"].as_f64().unwrap()
        );
        assert_eq!(
            field(&line, "completion_tokens"),
            u["completion_tokens"].as_f64().unwrap()
        );
        assert!(line.contains("finish=length"), "{line}");
        assert!(field(&line, "latency_ms") > 0.0, "{line}");
    }
    // A refusal's line says why, in the words its body gave the client.
    let why = refused["error"]["message"].as_str().unwrap();
    logged(
        &s.log,
        &[
            "POST /v1/completions status=400 error=",
            &format!("{why:?} latency_ms="),
        ],
    );
}

#[test]
fn metrics_need_the_api_key_when_one_is_set() {
    let s = start(&["--api-key", "k3y"]);
    assert_eq!(scrape(&s.addr, &[]).0, 401);
    let (status, _, m) = scrape(&s.addr, &[("Authorization", "Bearer k3y")]);
    assert_eq!(status, 200);
    assert_eq!(requests(&m, "/metrics", 401), 1.0);
    // Readiness stays open for probes.
    assert_eq!(http(&s.addr, "GET", "/health", &[], b"").0, 200);
}
