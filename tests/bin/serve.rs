//! `cqlm serve` from outside: a real server on loopback, raw HTTP/1.1 requests
//! (errors, framing, disconnects, a queue that fills, a bounded load) and the
//! official `openai` Python client (`tests/serve/openai_client.py`, in the
//! virtual environment `.ci/run` creates).

use crate::common::serve::{http, openai_python, post, start, start_with_env};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

/// The OpenAI error shape with a message.
fn is_error(v: &Value) -> bool {
    v["error"]["message"].is_string()
        && v["error"]["type"].is_string()
        && v["error"].get("param").is_some()
}

#[test]
fn errors_come_back_in_the_openai_shape_and_the_server_keeps_serving() {
    let s = start(&["--api-key", "k", "--ctx-tokens", "40"]);
    let auth = [("Authorization", "Bearer k")];
    let chat = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3, "temperature": 0});
    type Case<'a> = (Vec<u8>, Vec<(&'a str, &'a str)>, u16, Option<&'a str>);
    let cases: Vec<Case> = vec![
        (b"{\"messages\": [".to_vec(), auth.to_vec(), 400, None),
        (br#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#.to_vec(), auth.to_vec(), 400, Some("temperature")),
        (br#"{"messages": "x"}"#.to_vec(), auth.to_vec(), 400, Some("messages")),
        (br#"{"messages": [{"role": "user", "content": "x"}], "n": 2}"#.to_vec(), auth.to_vec(), 400, Some("n")),
        (br#"{"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"}"#.to_vec(), auth.to_vec(), 404, Some("model")),
        (chat.to_string().into_bytes(), vec![], 401, None),
        (chat.to_string().into_bytes(), vec![("Authorization", "Bearer nope")], 401, None),
        (json!({"messages": [{"role": "user", "content": "word ".repeat(60)}]}).to_string().into_bytes(), auth.to_vec(), 400, Some("messages")),
        (json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}).to_string().into_bytes(), auth.to_vec(), 400, Some("response_format")),
        (json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], "tool_choice": "required"}).to_string().into_bytes(), auth.to_vec(), 400, Some("tools")),
        (vec![b' '; (4 << 20) + 10], auth.to_vec(), 413, None),
        // Fields the server does not implement are refused, never dropped.
        (br#"{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 10}}"#.to_vec(), auth.to_vec(), 400, Some("logit_bias")),
        (br#"{"messages": [{"role": "user", "content": "x"}], "audio": {"voice": "x"}}"#.to_vec(), auth.to_vec(), 400, Some("audio")),
        (br#"{"messages": [{"role": "user", "content": "x"}], "min_p": 1.5}"#.to_vec(), auth.to_vec(), 400, Some("min_p")),
        (br#"{"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 3}"#.to_vec(), auth.to_vec(), 400, Some("frequency_penalty")),
        (br#"{"messages": [{"role": "user", "content": "x"}], "presence_penalty": -2.5}"#.to_vec(), auth.to_vec(), 400, Some("presence_penalty")),
    ];
    for (i, (body, headers, want, param)) in cases.into_iter().enumerate() {
        let (status, _, b) = http(&s.addr, "POST", "/v1/chat/completions", &headers, &body);
        assert_eq!(status, want, "case {i}: {b}");
        let v: Value =
            serde_json::from_str(&b).unwrap_or_else(|_| panic!("case {i}: not JSON: {b}"));
        assert!(is_error(&v), "case {i}: {v}");
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "case {i}: {v}");
        }
    }
    // Still serving: health without a key, a chat with one.
    assert_eq!(http(&s.addr, "GET", "/health", &[], b"").0, 200);
    let (status, _, b) = http(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &auth,
        chat.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{b}");
    // A field asking for nothing (null, false) is no request for it.
    let mut quiet = chat.clone();
    quiet["audio"] = Value::Null;
    quiet["echo"] = json!(false);
    let (status, _, b) = http(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &auth,
        quiet.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{b}");
}

#[test]
fn min_p_of_one_samples_the_greedy_text_and_penalties_are_taken() {
    let s = start(&[]);
    let msgs = json!([{"role": "user", "content": "Tell me about the king."}]);
    let (_, greedy) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 20, "temperature": 0}),
    );
    let text = &greedy["choices"][0]["message"]["content"];
    // min-p 1 keeps only the most likely token: any temperature and seed give the greedy text.
    for seed in 0..3 {
        let body = json!({"messages": msgs, "max_tokens": 20, "temperature": 1.5, "min_p": 1.0, "seed": seed});
        let (status, v) = post(&s.addr, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        assert_eq!(&v["choices"][0]["message"]["content"], text, "seed {seed}");
    }
    let body = json!({"messages": msgs, "max_tokens": 20, "temperature": 0.7, "frequency_penalty": 0.5, "presence_penalty": 0.5});
    assert_eq!(post(&s.addr, "/v1/chat/completions", &body).0, 200);
}

#[test]
fn greedy_output_through_the_server_equals_cqlm_generate() {
    let prompt = "The king said to his daughter,";
    let out = Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args([
            "generate",
            "--backend",
            "cpu",
            "--temperature",
            "0",
            "--prompt",
            prompt,
            "--max-tokens",
            "24",
        ])
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .unwrap();
    assert!(out.status.success());
    let want = String::from_utf8(out.stdout)
        .unwrap()
        .trim_end_matches('\n')
        .to_string();
    for parallel in ["1", "4"] {
        let s = start(&["--parallel", parallel]);
        // Other requests run meanwhile (sampled, other prompts).
        let addr = s.addr.clone();
        let others: Vec<_> = (0..3)
            .map(|i| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    post(&addr, "/v1/completions", &json!({"prompt": format!("Once {i}"), "max_tokens": 30, "temperature": 1.0, "seed": i}))
                })
            })
            .collect();
        let (status, v) = post(
            &s.addr,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 24, "temperature": 0}),
        );
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["text"], want, "--parallel {parallel}");
        for o in others {
            assert_eq!(o.join().unwrap().0, 200);
        }
    }
}

#[test]
fn streams_are_framed_and_a_client_that_hangs_up_frees_its_sequence() {
    let s = start(&["--parallel", "1", "--max-queue", "0"]);
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}});
    let (status, head, b) = http(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        body.to_string().as_bytes(),
    );
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase().contains("text/event-stream"),
        "{head}"
    );
    let events: Vec<&str> = b.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{b}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    // A long stream dropped after its first event: the one sequence is free again
    // soon (a queue of 0 would answer 503 while it is still taken).
    let long = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4000, "stream": true});
    let mut c = TcpStream::connect(&s.addr).unwrap();
    let body = long.to_string();
    write!(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut first = [0u8; 64];
    c.read_exact(&mut first).unwrap();
    drop(c);
    let t0 = std::time::Instant::now();
    loop {
        let (status, v) = post(
            &s.addr,
            "/v1/completions",
            &json!({"prompt": "x", "max_tokens": 2}),
        );
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{v}");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the dropped stream still holds its sequence"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let s = start(&["--parallel", "1", "--max-queue", "0"]);
    // A stream that can't end soon at any speed (its schema wants a long string
    // before the end of the turn), held open after its first bytes: the one
    // sequence is taken while the next request comes.
    let schema = json!({"type": "string", "minLength": 2000});
    let long = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4000,
        "stream": true, "response_format": {"type": "json_schema",
        "json_schema": {"name": "long", "schema": schema}}});
    let mut c = TcpStream::connect(&s.addr).unwrap();
    let body = long.to_string();
    write!(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut first = [0u8; 64];
    c.read_exact(&mut first).unwrap();
    let first = String::from_utf8_lossy(&first);
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let (status, head, b) = http(
        &s.addr,
        "POST",
        "/v1/completions",
        &[],
        json!({"prompt": "y", "max_tokens": 2})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(status, 503, "{b}");
    assert!(head.to_ascii_lowercase().contains("retry-after"), "{head}");
    assert!(is_error(&serde_json::from_str(&b).unwrap()));
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse()
                    .unwrap_or(0)
            })
        })
        .unwrap_or(0)
}

#[test]
fn a_bounded_load_of_mixed_clients_gets_correct_answers_and_no_5xx() {
    // 16 clients × 25 requests: streamed, plain, tool calls, malformed, and
    // streams dropped midway; every well-formed request answered, every
    // malformed one a 4xx, no 5xx, and the RSS settles.
    let s = start(&["--parallel", "4", "--max-queue", "64"]);
    let tools: Value = serde_json::from_str(include_str!("../../tools/train/tools.json")).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..16)
        .map(|c| {
            let addr = s.addr.clone();
            let tools = tools.clone();
            let done = std::sync::Arc::clone(&done);
            std::thread::spawn(move || {
                let mut codes = Vec::new();
                for r in 0..25 {
                    let k = (c * 25 + r) % 5;
                    let msg = json!([{"role": "user", "content": format!("Question {c} {r}")}]);
                    let code = match k {
                        0 => post(&addr, "/v1/chat/completions", &json!({"messages": msg, "max_tokens": 4, "temperature": 0})).0,
                        1 => {
                            let (st, _, b) = http(&addr, "POST", "/v1/chat/completions", &[], json!({"messages": msg, "max_tokens": 4, "stream": true}).to_string().as_bytes());
                            assert!(b.contains("data: [DONE]"), "{b}");
                            st
                        }
                        2 => {
                            let (st, v) = post(&addr, "/v1/chat/completions", &json!({"messages": msg, "max_tokens": 48, "temperature": 0, "tools": tools, "tool_choice": "required"}));
                            let fr = v["choices"][0]["finish_reason"].as_str().unwrap_or("");
                            assert!(fr == "tool_calls" || fr == "length", "{v}");
                            st
                        }
                        3 => {
                            let (st, v) = post(&addr, "/v1/chat/completions", &json!({"messages": 5}));
                            assert!((400..500).contains(&st), "{v}");
                            0
                        }
                        _ => {
                            let mut t = TcpStream::connect(&addr).unwrap();
                            let body = json!({"messages": msg, "max_tokens": 200, "stream": true}).to_string();
                            write!(t, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
                            let mut b = [0u8; 32];
                            let _ = t.read_exact(&mut b);
                            0
                        }
                    };
                    if code != 0 {
                        codes.push(code);
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                codes
            })
        })
        .collect();
    // RSS once the first 50 requests are answered.
    let pid = s.child.id();
    while done.load(std::sync::atomic::Ordering::SeqCst) < 50 {
        std::thread::sleep(Duration::from_millis(5));
    }
    // The prompt cache holds states by design (up to --cache-mb): RSS less
    // the bytes it reports holding must settle.
    let cache_kb = || {
        let (_, _, text) = http(&s.addr, "GET", "/metrics", &[], b"");
        let v: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("cqlm_prompt_cache_bytes "))
            .and_then(|v| v.trim().parse().ok())
            .expect("cqlm_prompt_cache_bytes");
        (v / 1024.0) as u64
    };
    let after_50 = rss_kb(pid).saturating_sub(cache_kb());
    for c in clients {
        for code in c.join().unwrap() {
            assert_eq!(code, 200);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let held = cache_kb();
    let end = rss_kb(pid).saturating_sub(held);
    assert!(
        after_50 > 0 && end as f64 <= after_50 as f64 * 1.10,
        "RSS less the prompt cache's {held} kB: {after_50} kB -> {end} kB"
    );
    // The server's own account agrees: 400 requests answered (the dropped streams
    // too, once their sequences stop), 80 of them 4xx, none 5xx, nothing left
    // running, one log line each.
    let t0 = std::time::Instant::now();
    loop {
        let (_, _, text) = http(&s.addr, "GET", "/metrics", &[], b"");
        let counts: Vec<(String, f64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("cqlm_requests_total{endpoint=\"/v1/chat/completions\""))
            .filter_map(|l| {
                let (labels, v) = l.rsplit_once(' ')?;
                Some((labels.to_string(), v.parse().ok()?))
            })
            .collect();
        let with = |p: &str| -> f64 {
            counts
                .iter()
                .filter(|(l, _)| l.contains(p))
                .map(|c| c.1)
                .sum()
        };
        let lines = s
            .log
            .lock()
            .unwrap()
            .lines()
            .filter(|l| l.contains("POST /v1/chat/completions"))
            .count();
        if with("status") == 400.0 && text.contains("cqlm_active_sequences 0\n") && lines == 400 {
            assert_eq!(with("status=\"4"), 80.0, "{text}");
            assert_eq!(with("status=\"5"), 0.0, "{text}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{lines} lines; {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_official_openai_client_works_unmodified() {
    let Some(python) = openai_python() else {
        return;
    };
    let s = start(&["--api-key", "sk-test", "--parallel", "2"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve/openai_client.py");
    let out = Command::new(python)
        .args([script, &format!("http://{}/v1", s.addr), "sk-test"])
        .output()
        .unwrap();
    crate::common::cli::assert_ok(&out, "openai_client.py");
}

#[test]
fn an_archive_chat_template_is_stored_and_rendered() {
    // The built-in model with a custom template: the server's prompt is the
    // template's text (so its token count is the tokenizer's count of it).
    let b = cqlm::model::builtin::model().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.cqlm");
    let template = "{% for m in messages %}<<{{ m.role }}>>{{ m.content }}{% endfor %}[answer]";
    let tensors =
        cqlm::make::synth::synth_tensors(&b.config, &cqlm::cq::BitsPlan::uniform(4, 128), 1);
    cqlm::archive::write_archive_file_with_chat(
        &path,
        &b.config,
        b.tokenizer.as_deref(),
        Some(template),
        None,
        &tensors,
    )
    .unwrap();
    let m = cqlm::Model::load(&path).unwrap();
    assert_eq!(m.chat_template.as_deref(), Some(template));
    let s = start(&["--model", path.to_str().unwrap()]);
    let (status, v) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 1, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    let tok = cqlm::session::tokenizer::TextTokenizer::for_model(&m).unwrap();
    let want = tok.encode("<<user>>Hello there[answer]").unwrap().len();
    assert_eq!(v["usage"]["prompt_tokens"], want, "{v}");
}

#[test]
fn an_engine_failure_is_a_500_for_that_request_and_the_server_keeps_serving() {
    // A model whose logits are NaN (final_norm poisoned): every generation fails
    // in the engine; each request gets a 500 in the OpenAI shape (streamed: an
    // error event), and the server still answers the next one.
    let b = cqlm::model::builtin::model().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nan.cqlm");
    let mut tensors =
        cqlm::make::synth::synth_tensors(&b.config, &cqlm::cq::BitsPlan::uniform(4, 128), 2);
    match tensors.get_mut("final_norm") {
        Some(cqlm::archive::Tensor::F32 { data, .. }) => {
            data.iter_mut().for_each(|v| *v = f32::NAN)
        }
        _ => panic!("final_norm is a dense tensor"),
    }
    cqlm::archive::write_archive_file(&path, &b.config, b.tokenizer.as_deref(), &tensors).unwrap();
    let args = vec!["--model", path.to_str().unwrap()];
    let s = start(&args);
    for _ in 0..2 {
        let (status, v) = post(
            &s.addr,
            "/v1/completions",
            &json!({"prompt": "x", "max_tokens": 3}),
        );
        assert_eq!(status, 500, "{v}");
        assert!(is_error(&v) && v["error"]["type"] == "server_error", "{v}");
    }
    let (status, _, b) = http(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        json!({"messages": [{"role": "user", "content": "x"}], "stream": true})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(status, 200);
    assert!(b.contains("\"error\""), "{b}");
    assert_eq!(http(&s.addr, "GET", "/health", &[], b"").0, 200);
}

#[test]
fn sigterm_ends_running_streams_and_shuts_down_cleanly() {
    let mut s = start(&[]);
    let addr = s.addr.clone();
    let stream = std::thread::spawn(move || {
        let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100000, "stream": true});
        http(
            &addr,
            "POST",
            "/v1/chat/completions",
            &[],
            body.to_string().as_bytes(),
        )
    });
    std::thread::sleep(Duration::from_millis(500));
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the server did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    // The running stream ended (its worker stopped at the next token).
    let (code, _, body) = stream.join().unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("data: "), "{body}");
}

#[test]
fn a_call_cut_by_the_token_limit_or_a_stop_string_is_not_an_error() {
    // A named tool forces `{"name":"get_weather","arguments":{"city":"` at once:
    // three tokens cut it (finish `length`); a stop string inside it ends the
    // answer as text (finish `stop`). Neither is a call, and neither a 500.
    let tools: Value = serde_json::from_str(include_str!("../../tools/train/tools.json")).unwrap();
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let s = start(&[]);
    let msg = json!([{"role": "user", "content": "Weather in Oslo?"}]);
    let (st, v) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msg, "max_tokens": 3, "temperature": 0, "tools": tools, "tool_choice": named}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(v["choices"][0]["message"]["tool_calls"].is_null(), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
    let (st, v) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msg, "max_tokens": 40, "temperature": 0, "tools": tools,
                "tool_choice": named, "stop": ["arguments"]}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(
        v["choices"][0]["message"]["content"], "{\"name\":\"get_weather\",\"",
        "{v}"
    );
    assert!(v["choices"][0]["message"]["tool_calls"].is_null(), "{v}");
}

#[test]
fn a_worker_that_panics_is_replaced_and_the_server_keeps_serving() {
    // The test hook CQLM_SERVE_PANIC_TOKEN makes an engine pass fed that token
    // panic: that request gets a 500 in the OpenAI shape, the worker (session or
    // batch) is rebuilt, and requests before and after are answered.
    let b = cqlm::model::builtin::model().unwrap();
    let tok = cqlm::session::tokenizer::TextTokenizer::for_model(&b).unwrap();
    let id = *tok.encode(" Zyzzyva").unwrap().last().unwrap();
    let args = vec!["--parallel", "2"];
    let s = start_with_env(&args, &[("CQLM_SERVE_PANIC_TOKEN", &id.to_string())]);
    let ok = json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0});
    let bad = json!({"prompt": "Hello Zyzzyva", "max_tokens": 3, "temperature": 0});
    assert_eq!(post(&s.addr, "/v1/completions", &ok).0, 200);
    for _ in 0..2 {
        let (st, v) = post(&s.addr, "/v1/completions", &bad);
        assert_eq!(st, 500, "{v}");
        assert_eq!(v["error"]["type"], "server_error", "{v}");
        let (st, v) = post(&s.addr, "/v1/completions", &ok);
        assert_eq!(st, 200, "after a panic: {v}");
        assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
    }
}

/// The content deltas of a streamed chat completion, and its completion tokens.
fn streamed_deltas(addr: &str, body: &Value) -> (Vec<String>, u64) {
    let (status, _, b) = http(
        addr,
        "POST",
        "/v1/chat/completions",
        &[],
        body.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{b}");
    let mut deltas = Vec::new();
    let mut used = 0;
    for e in b.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if e == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(t) = v["choices"][0]["delta"]["content"]
            .as_str()
            .filter(|t| !t.is_empty())
        {
            deltas.push(t.to_string());
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            used = n;
        }
    }
    (deltas, used)
}

#[test]
fn a_stream_faster_than_its_interval_sends_its_tokens_together_and_the_same_text() {
    // --stream-interval-ms 0: a chunk per token that adds text; a long interval
    // (here 1 s, longer than the whole generation): the first piece at once and
    // the rest with the end, the same text and token count either way.
    // (A repeated phrase: the built-in model answers it at length.)
    let body = json!({"messages": [{"role": "user", "content": "the king ".repeat(24)}],
        "max_tokens": 40, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
    let each = start(&["--stream-interval-ms", "0"]);
    let (per_token, used) = streamed_deltas(&each.addr, &body);
    let whole = post(
        &each.addr,
        "/v1/chat/completions",
        &json!({"messages": body["messages"],
        "max_tokens": 40, "temperature": 0}),
    );
    let text = whole.1["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(used >= 10, "{used} tokens: too short a stream to tell");
    assert!(
        per_token.len() as u64 >= used / 2,
        "{} chunks for {used} tokens",
        per_token.len()
    );
    assert_eq!(per_token.concat(), text);
    let grouped = start(&["--stream-interval-ms", "1000"]);
    let (together, used_together) = streamed_deltas(&grouped.addr, &body);
    assert_eq!(used_together, used);
    assert!(together.len() <= 2, "{together:?}");
    assert_eq!(together.concat(), text);
    // A bad interval is one error line naming the flag.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args(["serve", "--port", "0", "--stream-interval-ms", "2000"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error:") && err.contains("--stream-interval-ms"),
        "{err}"
    );
}
