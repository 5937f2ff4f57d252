//! The prompt cache of `cqlm serve`: a request whose prompt extends an earlier
//! sequence's tokens starts from its kept state, reports the tokens it reused
//! (`usage.prompt_tokens_details.cached_tokens`, Anthropic's
//! `cache_read_input_tokens`) and answers exactly as a server without a cache
//! (`--cache-mb 0`) does, alone or beside other requests; a small
//! `--cache-mb` evicts and stays within its bytes.

use crate::common::serve::{http, post, start, Server};
use serde_json::json;

/// Token ids of `text` as a prompt (BOS first), by the server's /tokenize.
fn ids(s: &Server, text: &str) -> Vec<u64> {
    let (_, v) = post(
        &s.addr,
        "/tokenize",
        &json!({"content": text, "add_special": true}),
    );
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// A greedy completion of token ids: (text, cached tokens, prompt tokens).
fn complete(s: &Server, prompt: &[u64], tokens: usize) -> (String, u64, u64) {
    let (status, v) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": tokens, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    let u = &v["usage"];
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        u["prompt_tokens"].as_u64().unwrap(),
    )
}

/// The value of the metric sample `name` in /metrics.
fn metric(s: &Server, name: &str) -> f64 {
    let (_, _, text) = http(&s.addr, "GET", "/metrics", &[], b"");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[test]
fn a_cache_hit_reuses_the_shared_prefix_and_answers_as_a_cold_server() {
    for parallel in ["1", "4"] {
        let cold = start(&["--parallel", parallel, "--cache-mb", "0"]);
        let warm = start(&["--parallel", parallel]);
        let p = ids(
            &warm,
            "Once upon a time there was a king who had three daughters, and the youngest",
        );
        let q = ids(
            &warm,
            " was the fairest of them all. One day she went into the forest",
        );
        // Other requests run meanwhile on the warm server.
        let others: Vec<_> = (0..3)
            .map(|i| {
                let addr = warm.addr.clone();
                std::thread::spawn(move || {
                    post(&addr, "/v1/completions", &json!({"prompt": format!("And {i}"), "max_tokens": 24, "temperature": 1.0, "seed": i}))
                })
            })
            .collect();
        let (first, cached, _) = complete(&warm, &p, 12);
        assert_eq!(cached, 0);
        // P then Q: the state after P (its prompt) is reused.
        let pq: Vec<u64> = p.iter().chain(&q[1..]).copied().collect();
        let (text, cached, prompt) = complete(&warm, &pq, 16);
        assert_eq!(
            (cached, prompt),
            (p.len() as u64, pq.len() as u64),
            "--parallel {parallel}"
        );
        assert_eq!(
            text,
            complete(&cold, &pq, 16).0,
            "--parallel {parallel}: hit vs cold"
        );
        // P, the first answer's tokens, then Q: the first sequence's final
        // state (its prompt and all answer tokens but the last) is reused.
        let answer = ids(&warm, &first);
        let pa: Vec<u64> = p
            .iter()
            .chain(&answer[1..])
            .chain(&q[1..])
            .copied()
            .collect();
        let (text, cached, _) = complete(&warm, &pa, 16);
        assert_eq!(
            text,
            complete(&cold, &pa, 16).0,
            "--parallel {parallel}: hit vs cold"
        );
        assert!(cached >= p.len() as u64, "{cached}");
        assert_eq!(complete(&cold, &pa, 4).1, 0, "no cache, nothing cached");
        for o in others {
            assert_eq!(o.join().unwrap().0, 200);
        }
        assert!(metric(&warm, "cqlm_prompt_cache_hits_total") >= 2.0);
        assert!(metric(&warm, "cqlm_prompt_cache_tokens_reused_total") >= 2.0 * p.len() as f64);
        assert_eq!(metric(&cold, "cqlm_prompt_cache_states"), 0.0);
    }
}

#[test]
fn a_multi_turn_chat_reuses_the_previous_turn_through_both_apis() {
    let warm = start(&[]);
    let cold = start(&["--cache-mb", "0"]);
    let mut msgs = vec![json!({"role": "user", "content": "Tell me about the king."})];
    let mut last_prompt = 0;
    for turn in 0..3 {
        let body = json!({"messages": msgs, "max_tokens": 20, "temperature": 0});
        let (_, w) = post(&warm.addr, "/v1/chat/completions", &body);
        let (_, c) = post(&cold.addr, "/v1/chat/completions", &body);
        let answer = w["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(
            answer,
            c["choices"][0]["message"]["content"].as_str().unwrap(),
            "turn {turn}"
        );
        let cached = w["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        if turn > 0 {
            assert!(
                cached >= last_prompt,
                "turn {turn}: {cached} cached, the last prompt had {last_prompt}"
            );
        }
        last_prompt = w["usage"]["prompt_tokens"].as_u64().unwrap();
        msgs.push(json!({"role": "assistant", "content": answer}));
        msgs.push(json!({"role": "user", "content": "And then what happened?"}));
    }
    // Anthropic's API: cache_read_input_tokens plus input_tokens is the prompt.
    let body = json!({"model": "cqlm-small", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me about the king."}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "Go on."}]});
    let (_, first) = post(&warm.addr, "/v1/messages", &body);
    let mut longer = body.clone();
    longer["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": "y"}),
        json!({"role": "user", "content": "More."}),
    ]);
    let (_, second) = post(&warm.addr, "/v1/messages", &longer);
    let (_, count) = post(&warm.addr, "/v1/messages/count_tokens", &longer);
    let u = &second["usage"];
    assert!(
        u["cache_read_input_tokens"].as_u64().unwrap()
            >= first["usage"]["input_tokens"].as_u64().unwrap(),
        "{second}"
    );
    assert_eq!(
        u["cache_read_input_tokens"].as_u64().unwrap() + u["input_tokens"].as_u64().unwrap(),
        count["input_tokens"].as_u64().unwrap()
    );
}

#[test]
fn a_small_cache_evicts_stays_within_its_bytes_and_answers_right() {
    let warm = start(&["--cache-mb", "1"]);
    let cold = start(&["--cache-mb", "0"]);
    let texts = [
        "The king said",
        "In the beginning",
        "And the LORD spake",
        "Once upon a time",
        "The queen",
    ];
    for round in 0..2 {
        for t in texts {
            let p = ids(&warm, t);
            let more: Vec<u64> = p
                .iter()
                .chain(&ids(&warm, " and then")[1..])
                .copied()
                .collect();
            for prompt in [&p, &more] {
                assert_eq!(
                    complete(&warm, prompt, 6).0,
                    complete(&cold, prompt, 6).0,
                    "round {round}: {t}"
                );
            }
        }
    }
    assert!(metric(&warm, "cqlm_prompt_cache_evictions_total") > 0.0);
    assert!(metric(&warm, "cqlm_prompt_cache_bytes") <= (1 << 20) as f64);
    assert!(metric(&warm, "cqlm_prompt_cache_states") >= 1.0);
}
