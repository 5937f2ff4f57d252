//! OpenAI's Responses API on `cqlm serve`: the same conversation answers as
//! chat completions do (the independent path), its stream is named events with
//! sequence numbers, stateful and unknown fields are 400s naming them, and the
//! official `openai` client's `responses` (`tests/serve/openai_responses.py`:
//! streamed events, function and custom-grammar tool round trips, json_schema).

use crate::common::serve::{http, openai_python, post, start};
use serde_json::{json, Value};
use std::process::Command;

#[test]
fn a_response_answers_as_chat_completions_and_streams_numbered_events() {
    let s = start(&[]);
    let chat = json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about the king."}],
        "max_tokens": 12, "temperature": 0});
    let (_, c) = post(&s.addr, "/v1/chat/completions", &chat);
    let body = json!({"instructions": "Be brief.", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Tell me about the king."}]}],
        "max_output_tokens": 12, "temperature": 0});
    let (status, r) = post(&s.addr, "/v1/responses", &body);
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        r["output"][0]["content"][0]["text"], c["choices"][0]["message"]["content"],
        "{r}"
    );
    assert_eq!(r["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
    assert_eq!(r["usage"]["output_tokens"], c["usage"]["completion_tokens"]);
    let want_status = if c["choices"][0]["finish_reason"] == "length" {
        "incomplete"
    } else {
        "completed"
    };
    assert_eq!(r["status"], want_status, "{r}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, _, raw) = http(
        &s.addr,
        "POST",
        "/v1/responses",
        &[],
        streamed.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{raw}");
    let (mut seq, mut text, mut event) = (0, String::new(), None);
    for line in raw.lines() {
        if let Some(e) = line.strip_prefix("event: ") {
            event = Some(e.to_string());
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).unwrap();
            assert_eq!(
                Some(v["type"].as_str().unwrap().to_string()),
                event.take(),
                "{v}"
            );
            assert_eq!(v["sequence_number"], seq, "{v}");
            seq += 1;
            if v["type"] == "response.output_text.delta" {
                text.push_str(v["delta"].as_str().unwrap());
            }
        }
    }
    assert!(seq >= 8, "{raw}");
    assert_eq!(text, r["output"][0]["content"][0]["text"].as_str().unwrap());

    for (body, names) in [
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"input": "x", "conversation": "c_1"}), "conversation"),
        (
            json!({"input": "x", "presence_penalty": 1}),
            "presence_penalty",
        ),
        (
            json!({"input": [{"type": "input_image", "image_url": "x"}]}),
            "input[0].type",
        ),
        (
            json!({"input": "x", "tools": [{"type": "custom", "name": "p"}], "tool_choice": {"type": "custom", "name": "q"}}),
            "tool_choice.name",
        ),
        (json!({"max_output_tokens": 4}), "input"),
    ] {
        let (status, v) = post(&s.addr, "/v1/responses", &body);
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], names, "{v}");
    }
    assert_eq!(
        post(
            &s.addr,
            "/v1/responses",
            &json!({"input": "Hi", "max_output_tokens": 2})
        )
        .0,
        200
    );
}

#[test]
fn the_official_openai_client_speaks_responses() {
    let Some(python) = openai_python() else {
        return;
    };
    let s = start(&["--api-key", "sk-test", "--parallel", "2"]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/serve/openai_responses.py"
    );
    let out = Command::new(python)
        .args([script, &format!("http://{}/v1", s.addr), "sk-test"])
        .output()
        .unwrap();
    crate::common::cli::assert_ok(&out, "openai_responses.py");
}
