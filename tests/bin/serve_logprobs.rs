//! `logprobs` on `cqlm serve` (exact precision) against an independent path:
//! the prompt the server prefills (`/apply-template`, `/tokenize`) and the ids
//! it generated run through `cqlm logits --all-positions`, and a naive f64
//! log-softmax of those logits must give every reported logprob within 1e-4,
//! for each readout the server reads them from (the device-style top
//! candidates of a greedy and a top-k draw, the full logits of a top-p draw
//! at another temperature). Also: the top lists are sorted and hold the
//! greedy token first, a stream reports the same entries, a constrained
//! answer reports the masked distribution, the completions table, the
//! Responses API's output text, and the limits.

use crate::common::cli::{assert_ok, cqlm, read_npy};
use crate::common::serve::{post, start, Server};
use serde_json::{json, Value};

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/cqlm-small.safetensors");

/// The prompt ids `/v1/chat/completions` prefills for `messages`.
pub(crate) fn chat_prompt_ids(s: &Server, messages: &Value) -> Vec<u32> {
    let (status, t) = post(&s.addr, "/apply-template", &json!({"messages": messages}));
    assert_eq!(status, 200, "{t}");
    let (status, ids) = post(
        &s.addr,
        "/tokenize",
        &json!({"content": t["prompt"], "add_special": true}),
    );
    assert_eq!(status, 200, "{ids}");
    ids["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// A naive f64 log-softmax of each row of `cqlm logits --all-positions
/// --backend BACKEND` after `ids`: `rows[i][t]` is token `t`'s logprob after
/// `ids[..=i]`.
fn reference_logprobs(ids: &[u32], backend: &str) -> Vec<Vec<f64>> {
    let dir = tempfile::tempdir().unwrap();
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    let out = cqlm(
        dir.path(),
        &[
            "logits",
            "--model",
            MODEL,
            "--backend",
            backend,
            "--ids",
            &list.join(","),
            "--all-positions",
            "--out",
            "l.npy",
        ],
    );
    assert_ok(&out, "cqlm logits");
    let (shape, values) = read_npy(&dir.path().join("l.npy"));
    assert_eq!(shape[0], ids.len());
    values
        .chunks_exact(shape[1])
        .map(|row| {
            let m = row.iter().map(|&v| f64::from(v)).fold(f64::MIN, f64::max);
            let log_sum = row
                .iter()
                .map(|&v| (f64::from(v) - m).exp())
                .sum::<f64>()
                .ln();
            row.iter().map(|&v| f64::from(v) - m - log_sum).collect()
        })
        .collect()
}

/// The `(id, logprob, top)` of chat entries.
pub(crate) type Entry = (u32, f64, Vec<(u32, f64)>);

/// The entries of a chat `logprobs.content` (each token's text checked
/// against its bytes).
pub(crate) fn entries(content: &Value) -> Vec<Entry> {
    let id = |e: &Value| e["id"].as_u64().unwrap() as u32;
    let lp = |e: &Value| e["logprob"].as_f64().unwrap();
    content
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let bytes: Vec<u8> = e["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8)
                .collect();
            assert_eq!(
                String::from_utf8_lossy(&bytes),
                e["token"].as_str().unwrap()
            );
            let top = e["top_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| (id(t), lp(t)))
                .collect();
            (id(e), lp(e), top)
        })
        .collect()
}

/// Every entry against the reference after `prompt` and the generated ids:
/// the token's and each alternative's logprob within 1e-4, the alternatives
/// the `top` most likely in order (`cqlm logits` on `backend`).
pub(crate) fn check_against_reference(prompt: &[u32], got: &[Entry], top: usize, backend: &str) {
    let mut ids = prompt.to_vec();
    ids.extend(got.iter().map(|e| e.0));
    let rows = reference_logprobs(&ids[..ids.len() - 1], backend);
    for (k, (id, lp, alts)) in got.iter().enumerate() {
        let row = &rows[prompt.len() - 1 + k];
        let want = row[*id as usize];
        assert!((lp - want).abs() < 1e-4, "token {k}: {lp} against {want}");
        assert_eq!(alts.len(), top, "token {k}");
        let mut order: Vec<u32> = (0..row.len() as u32).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        for (j, &(alt, alt_lp)) in alts.iter().enumerate() {
            let want = row[alt as usize];
            assert!(
                (alt_lp - want).abs() < 1e-4,
                "token {k} top {j}: {alt_lp} against {want}"
            );
            // The j-th most likely (a near tie may swap within the tolerance).
            assert!(
                (row[order[j] as usize] - want).abs() < 1e-4,
                "token {k} top {j}"
            );
            if j > 0 {
                assert!(alt_lp <= alts[j - 1].1, "token {k}: top list not sorted");
            }
        }
    }
}

#[test]
fn chat_logprobs_match_the_log_softmax_of_cqlm_logits_for_each_readout() {
    let s = start(&["--precision", "exact"]);
    let messages = json!([{"role": "user", "content": "Tell me about the king."}]);
    let prompt = chat_prompt_ids(&s, &messages);
    // Greedy, top-k and a top-p draw at temperature 0.8 (the full logits).
    let cases = [
        json!({"temperature": 0}),
        json!({"temperature": 1, "top_k": 40, "seed": 7}),
        json!({"temperature": 0.8, "top_p": 0.9, "seed": 3}),
    ];
    for (i, extra) in cases.iter().enumerate() {
        let top = [20, 3, 5][i];
        let mut body = json!({"messages": messages, "max_tokens": 12,
            "logprobs": true, "top_logprobs": top});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, r) = post(&s.addr, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{r}");
        assert_eq!(
            r["usage"]["prompt_tokens"].as_u64(),
            Some(prompt.len() as u64)
        );
        let got = entries(&r["choices"][0]["logprobs"]["content"]);
        assert_eq!(
            got.len() as u64,
            r["usage"]["completion_tokens"].as_u64().unwrap()
        );
        let text: String = r["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["token"].as_str().unwrap())
            .collect();
        assert_eq!(
            text,
            r["choices"][0]["message"]["content"].as_str().unwrap()
        );
        check_against_reference(&prompt, &got, top, "cpu");
        if i == 0 {
            // Greedy: the chosen token is the top entry.
            for (k, (id, _, alts)) in got.iter().enumerate() {
                assert_eq!(alts[0].0, *id, "token {k}");
            }
            // The same entries streamed, spread over the chunks.
            body["stream"] = json!(true);
            let (status, _, raw) = crate::common::serve::http(
                &s.addr,
                "POST",
                "/v1/chat/completions",
                &[("Content-Type", "application/json")],
                body.to_string().as_bytes(),
            );
            assert_eq!(status, 200);
            let mut streamed = Vec::new();
            for line in raw.lines().filter_map(|l| l.strip_prefix("data: ")) {
                if line == "[DONE]" {
                    continue;
                }
                let c: Value = serde_json::from_str(line).unwrap();
                let lp = &c["choices"][0]["logprobs"];
                if !lp.is_null() {
                    streamed.extend(entries(&lp["content"]));
                }
            }
            assert_eq!(streamed, got);
        }
    }
    // Without logprobs: the same greedy answer, and `logprobs: null`.
    let (_, plain) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 12, "temperature": 0}),
    );
    assert!(plain["choices"][0]["logprobs"].is_null());
    let (_, with) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 12, "temperature": 0, "logprobs": true}),
    );
    assert_eq!(
        with["choices"][0]["message"],
        plain["choices"][0]["message"]
    );
    let first = &with["choices"][0]["logprobs"]["content"][0];
    assert_eq!(
        first["top_logprobs"],
        json!([]),
        "top_logprobs defaults to 0"
    );
}

#[test]
fn a_constrained_answer_reports_the_masked_distribution() {
    let s = start(&["--precision", "exact"]);
    let messages = json!([{"role": "user", "content": "Give me a colour as JSON."}]);
    let prompt = chat_prompt_ids(&s, &messages);
    let schema = json!({"type": "object", "properties": {"colour": {"enum": ["red", "green"]}},
        "required": ["colour"], "additionalProperties": false});
    let (status, r) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 40, "temperature": 0, "logprobs": true,
            "top_logprobs": 4, "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}),
    );
    assert_eq!(status, 200, "{r}");
    let got = entries(&r["choices"][0]["logprobs"]["content"]);
    assert_eq!(
        got.len() as u64,
        r["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let mut ids = prompt.clone();
    ids.extend(got.iter().map(|e| e.0));
    let rows = reference_logprobs(&ids[..ids.len() - 1], "cpu");
    let mut forced = 0;
    for (k, (id, lp, alts)) in got.iter().enumerate() {
        let unmasked = rows[prompt.len() - 1 + k][*id as usize];
        // The mask only takes probability away from other tokens.
        assert!(
            *lp <= 1e-6 && *lp >= unmasked - 1e-4,
            "token {k}: {lp} against {unmasked}"
        );
        let mass: f64 = alts.iter().map(|a| a.1.exp()).sum();
        assert!(mass <= 1.0 + 1e-5, "token {k}: {mass}");
        assert_eq!(alts[0].0, *id, "greedy: token {k} is the top entry");
        if *lp == 0.0 {
            forced += 1;
            assert_eq!(alts.len(), 1, "a forced token is the only one");
        }
    }
    assert!(forced > 0, "the schema forces its key: {r}");
}

#[test]
fn completions_report_the_legacy_table_and_responses_the_output_text_logprobs() {
    let s = start(&["--precision", "exact"]);
    let prompt = "The king said to his daughter,";
    let (status, r) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 5}),
    );
    assert_eq!(status, 200, "{r}");
    let c = &r["choices"][0];
    let table = &c["logprobs"];
    let tokens: Vec<&str> = table["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.concat(), c["text"].as_str().unwrap());
    let mut at = prompt.chars().count();
    for (k, tok) in tokens.iter().enumerate() {
        assert_eq!(table["text_offset"][k].as_u64(), Some(at as u64));
        at += tok.chars().count();
        let top = table["top_logprobs"][k].as_object().unwrap();
        assert!((1..=5).contains(&top.len()), "{top:?}");
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        // Greedy: the chosen token is the likeliest.
        assert_eq!(table["token_logprobs"][k].as_f64(), Some(best));
    }
    // Responses: include the output text's logprobs; the same greedy tokens
    // as chat completions on the same conversation.
    let messages = json!([{"role": "user", "content": "Hello there"}]);
    let (_, chat) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 8, "temperature": 0, "logprobs": true, "top_logprobs": 2}),
    );
    let (status, resp) = post(
        &s.addr,
        "/v1/responses",
        &json!({"input": "Hello there", "max_output_tokens": 8, "temperature": 0,
            "include": ["message.output_text.logprobs"], "top_logprobs": 2}),
    );
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        resp["output"][0]["content"][0]["logprobs"],
        chat["choices"][0]["logprobs"]["content"]
    );
    // Limits, each a 400 naming its field.
    for (path, body, param) in [
        (
            "/v1/completions",
            json!({"prompt": "a", "logprobs": 6}),
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": messages, "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": messages, "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/responses",
            json!({"input": "a", "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/responses",
            json!({"input": "a", "top_logprobs": -1}),
            "top_logprobs",
        ),
    ] {
        let (status, e) = post(&s.addr, path, &body);
        assert_eq!(status, 400, "{path} {body}: {e}");
        assert_eq!(e["error"]["param"], param, "{e}");
    }
}
