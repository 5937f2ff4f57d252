//! llama-server's introspection routes on `cqlm serve`: `/tokenize` and
//! `/detokenize` round trips (multi-byte characters, pieces that are parts of
//! a character), the count against a completion's `usage`, `/props` against
//! the flags the server was started with, and their errors.

use crate::common::serve::{http, post, start};
use serde_json::{json, Value};

#[test]
fn tokenize_and_detokenize_round_trip_and_count_as_a_prompt_does() {
    let s = start(&[
        "--parallel",
        "3",
        "--ctx-tokens",
        "512",
        "--max-tokens-cap",
        "7",
    ]);
    let text = "The king said: « Ça va, 東京? » 🙂 42";
    let (status, plain) = post(&s.addr, "/tokenize", &json!({"content": text}));
    assert_eq!(status, 200, "{plain}");
    let ids: Vec<u64> = plain["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(ids.len() > 5, "{plain}");
    let (status, back) = post(&s.addr, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(status, 200, "{back}");
    assert_eq!(back["content"], text);
    // With pieces: the same ids, and their bytes joined are the text's bytes
    // (a piece that is part of a character comes as a list of bytes).
    let (_, pieces) = post(
        &s.addr,
        "/tokenize",
        &json!({"content": text, "with_pieces": true}),
    );
    let mut bytes = Vec::new();
    let mut partial = 0;
    for (t, id) in pieces["tokens"].as_array().unwrap().iter().zip(&ids) {
        assert_eq!(t["id"].as_u64(), Some(*id), "{t}");
        match &t["piece"] {
            Value::String(p) => bytes.extend_from_slice(p.as_bytes()),
            Value::Array(b) => {
                partial += 1;
                bytes.extend(b.iter().map(|x| x.as_u64().unwrap() as u8));
            }
            other => panic!("piece {other}"),
        }
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text);
    assert!(
        partial > 0,
        "the emoji and CJK split into byte tokens here: {pieces}"
    );
    // With BOS, as a prompt: the completion's prompt_tokens.
    let (_, special) = post(
        &s.addr,
        "/tokenize",
        &json!({"content": text, "add_special": true}),
    );
    let (status, c) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": text, "max_tokens": 1}),
    );
    assert_eq!(status, 200, "{c}");
    assert_eq!(
        special["tokens"].as_array().unwrap().len() as u64,
        c["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        special["tokens"].as_array().unwrap().len(),
        ids.len() + 1,
        "BOS in front"
    );

    let (status, props) = {
        let (st, _, b) = http(&s.addr, "GET", "/props", &[], b"");
        (st, serde_json::from_str::<Value>(&b).unwrap())
    };
    assert_eq!(status, 200, "{props}");
    assert_eq!(props["model"], "cqlm-small");
    assert_eq!(props["n_ctx"], 512);
    assert_eq!(props["total_slots"], 3);
    assert_eq!(props["vocab_size"], 4103);
    assert_eq!(props["max_tokens_cap"], 7);
    // The cap: a request asking for more ends at 7 tokens, by its limit.
    let (_, capped) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 50, "temperature": 0}),
    );
    assert_eq!(capped["usage"]["completion_tokens"], 7, "{capped}");
    assert_eq!(capped["choices"][0]["finish_reason"], "length", "{capped}");
    assert!(
        props["chat_template"]
            .as_str()
            .unwrap()
            .contains("messages"),
        "{props}"
    );
    assert_eq!(props["default_generation_settings"]["temperature"], 1.0);

    // Errors name the field; the server keeps serving.
    for (path, body, param) in [
        ("/detokenize", json!({"tokens": [1, 99999]}), "tokens"),
        ("/tokenize", json!({"text": "x"}), "text"),
        ("/tokenize", json!({"content": 5}), "content"),
    ] {
        let (status, v) = post(&s.addr, path, &body);
        assert_eq!(status, 400, "{path} {body}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(param),
            "{v}"
        );
    }
    assert_eq!(post(&s.addr, "/tokenize", &json!({"content": "ok"})).0, 200);
}
