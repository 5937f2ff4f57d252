//! Anthropic's Messages API on `cqlm serve` from outside: raw HTTP for what the
//! `anthropic` client never sends (`x-api-key` against a server with a key,
//! malformed bodies, unknown fields) and for the stream's framing, the chat
//! completions route as the independent check of the answers (the same
//! conversation must give the same greedy tokens through both APIs), and the
//! official `anthropic` Python client (`tests/serve/anthropic_client.py`).

use crate::common::serve::{http, openai_python, start};
use serde_json::{json, Value};
use std::process::Command;

fn post_with(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, String, Value) {
    let (status, head, b) = http(addr, "POST", path, headers, body.to_string().as_bytes());
    let v = serde_json::from_str(&b).unwrap_or(Value::String(b));
    (status, head, v)
}

/// Anthropic's error shape, with its `type`.
fn error_type(v: &Value) -> &str {
    assert_eq!(v["type"], "error", "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    v["error"]["type"].as_str().unwrap_or_default()
}

#[test]
fn messages_errors_come_in_anthropics_shape_and_the_server_keeps_serving() {
    let s = start(&["--api-key", "k", "--ctx-tokens", "60"]);
    let key = [("x-api-key", "k"), ("anthropic-version", "2023-06-01")];
    let ok = json!({"model": "cqlm-small", "max_tokens": 3, "messages": [{"role": "user", "content": "Hello"}]});
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        b
    };
    // (body, headers, status, error type, a text the message must name)
    type Case<'a> = (Value, Vec<(&'a str, &'a str)>, u16, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (ok.clone(), vec![], 401, "authentication_error", ""),
        (
            ok.clone(),
            vec![("x-api-key", "nope")],
            401,
            "authentication_error",
            "",
        ),
        (
            with("model", json!("claude-9")),
            key.to_vec(),
            404,
            "not_found_error",
            "claude-9",
        ),
        (
            json!({"model": "cqlm-small", "messages": [{"role": "user", "content": "x"}]}),
            key.to_vec(),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            with("frequency_penalty", json!(1)),
            key.to_vec(),
            400,
            "invalid_request_error",
            "frequency_penalty",
        ),
        (
            with("messages", json!([{"role": "tool", "content": "x"}])),
            key.to_vec(),
            400,
            "invalid_request_error",
            "messages[0].role",
        ),
        (
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            ),
            key.to_vec(),
            400,
            "invalid_request_error",
            "messages[0].content[0].type",
        ),
        (
            with("tools", json!([{"name": "f", "input_schema": "x"}])),
            key.to_vec(),
            400,
            "invalid_request_error",
            "tools[0].input_schema",
        ),
        (
            with("tool_choice", json!({"type": "sometimes"})),
            key.to_vec(),
            400,
            "invalid_request_error",
            "tool_choice.type",
        ),
        (
            with(
                "messages",
                json!([{"role": "user", "content": "word ".repeat(80)}]),
            ),
            key.to_vec(),
            400,
            "invalid_request_error",
            "tokens",
        ),
    ];
    for (i, (body, headers, want, kind, names)) in cases.into_iter().enumerate() {
        let (status, _, v) = post_with(&s.addr, "/v1/messages", &headers, &body);
        assert_eq!(status, want, "case {i}: {v}");
        assert_eq!(error_type(&v), kind, "case {i}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(names),
            "case {i} names {names}: {v}"
        );
    }
    let (status, _, b) = http(&s.addr, "POST", "/v1/messages", &key, b"{\"model\": ");
    assert_eq!(status, 400, "{b}");
    assert_eq!(
        error_type(&serde_json::from_str(&b).unwrap()),
        "invalid_request_error"
    );
    let (status, _, v) = post_with(&s.addr, "/v1/messages/count_tokens", &[], &ok);
    assert_eq!(
        (status, error_type(&v)),
        (401, "authentication_error"),
        "{v}"
    );
    // Still serving, with either header.
    for auth in [("x-api-key", "k"), ("Authorization", "Bearer k")] {
        let (status, _, v) = post_with(&s.addr, "/v1/messages", &[auth], &ok);
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["type"], "message");
    }
}

#[test]
fn messages_answer_as_chat_completions_do_and_stream_named_events_in_order() {
    let s = start(&["--parallel", "2"]);
    let system = "You are a storyteller.";
    let user = "Tell me about the king.";
    let chat = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 12, "temperature": 0});
    let (status, _, c) = post_with(&s.addr, "/v1/chat/completions", &[], &chat);
    assert_eq!(status, 200, "{c}");
    let body = json!({"model": "cqlm-small", "system": [{"type": "text", "text": system}], "max_tokens": 12,
        "temperature": 0, "messages": [{"role": "user", "content": [{"type": "text", "text": user}]}]});
    let (status, _, m) = post_with(&s.addr, "/v1/messages", &[], &body);
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["content"][0]["type"], "text", "{m}");
    assert_eq!(
        m["content"][0]["text"], c["choices"][0]["message"]["content"],
        "{m} vs {c}"
    );
    assert_eq!(m["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
    assert_eq!(m["usage"]["output_tokens"], c["usage"]["completion_tokens"]);
    let reason = if c["choices"][0]["finish_reason"] == "length" {
        "max_tokens"
    } else {
        "end_turn"
    };
    assert_eq!(m["stop_reason"], reason, "{m}");
    let (status, _, n) = post_with(&s.addr, "/v1/messages/count_tokens", &[], &body);
    assert_eq!(status, 200, "{n}");
    assert_eq!(n["input_tokens"], m["usage"]["input_tokens"]);

    // Streamed: every data line named by the event line before it, in the
    // documented order, and the deltas joined are the whole text.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, head, raw) = http(
        &s.addr,
        "POST",
        "/v1/messages",
        &[],
        streamed.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{raw}");
    assert!(
        head.to_ascii_lowercase().contains("text/event-stream"),
        "{head}"
    );
    let (mut names, mut text) = (Vec::new(), String::new());
    let mut last_event = None;
    for line in raw.lines() {
        if let Some(e) = line.strip_prefix("event: ") {
            last_event = Some(e.to_string());
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).unwrap();
            let name = last_event
                .take()
                .expect("a data line without its event line");
            assert_eq!(v["type"], name.as_str(), "{v}");
            if name == "content_block_delta" {
                text.push_str(v["delta"]["text"].as_str().unwrap());
            }
            if name == "message_delta" {
                assert_eq!(v["delta"]["stop_reason"], reason, "{v}");
                assert_eq!(
                    v["usage"]["output_tokens"], m["usage"]["output_tokens"],
                    "{v}"
                );
            }
            names.push(name);
        }
    }
    assert_eq!(text, m["content"][0]["text"].as_str().unwrap());
    names.dedup();
    let want = [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ];
    assert_eq!(names, want, "{raw}");
}

#[test]
fn messages_keep_a_stop_sequence_and_a_named_tool_call() {
    let s = start(&[]);
    let base = json!({"model": "cqlm-small", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me about the king."}]});
    let (_, _, free) = post_with(&s.addr, "/v1/messages", &[], &base);
    let text = free["content"][0]["text"].as_str().unwrap().to_string();
    // A stop sequence taken from the middle of the greedy text.
    let cut = text
        .char_indices()
        .map(|(i, _)| i)
        .nth(text.chars().count() / 2)
        .unwrap();
    let stop: String = text[cut..].chars().take(3).collect();
    let mut b = base.clone();
    b["stop_sequences"] = json!(["never appears here", stop]);
    let (status, _, v) = post_with(&s.addr, "/v1/messages", &[], &b);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stop_reason"], "stop_sequence", "{v}");
    assert_eq!(v["stop_sequence"], stop.as_str(), "{v}");
    let got = v["content"][0]["text"].as_str().unwrap();
    assert_eq!(got, &text[..text.find(&stop).unwrap()], "{v}");

    // A named tool: a tool_use block whose input holds to the schema, then
    // the tool_result round trip answers.
    let tools = json!([{"name": "get_weather", "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"]}},
        {"type": "web_search_20250305", "name": "web_search"}]);
    let mut b = base.clone();
    b["tools"] = tools.clone();
    b["tool_choice"] = json!({"type": "tool", "name": "get_weather"});
    b["max_tokens"] = json!(64);
    let (status, _, v) = post_with(&s.addr, "/v1/messages", &[], &b);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let call = &v["content"][0];
    assert_eq!(
        (call["type"].as_str(), call["name"].as_str()),
        (Some("tool_use"), Some("get_weather")),
        "{v}"
    );
    assert!(
        call["input"]["city"].is_string() && call["input"]["days"].is_i64(),
        "{v}"
    );
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"), "{v}");
    let mut next = b.clone();
    next["tool_choice"] = json!({"type": "none"});
    next["messages"] = json!([
        {"role": "user", "content": "Tell me about the king."},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": [{"type": "text", "text": "Sunny, 21 C."}]}]},
    ]);
    let (status, _, v) = post_with(&s.addr, "/v1/messages", &[], &next);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["content"][0]["type"], "text", "{v}");
    // The result is in the prompt: more input tokens than the first turn's.
    let (_, _, first) = post_with(&s.addr, "/v1/messages/count_tokens", &[], &b);
    assert!(
        v["usage"]["input_tokens"].as_u64() > first["input_tokens"].as_u64(),
        "{v} {first}"
    );
}

#[test]
fn the_official_anthropic_client_works_unmodified() {
    let Some(python) = openai_python() else {
        return;
    };
    let s = start(&["--api-key", "sk-ant-test", "--parallel", "2"]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/serve/anthropic_client.py"
    );
    let out = Command::new(python)
        .args([script, &format!("http://{}", s.addr), "sk-ant-test"])
        .output()
        .unwrap();
    crate::common::cli::assert_ok(&out, "anthropic_client.py");
}

/// Claude Code's tool search: tools marked `defer_loading` stay out of the
/// prompt until a tool result's `tool_reference` block loads them, and a tool
/// result's blocks that a text model cannot read stand in as a line each. The
/// check is the chat completions route given, by hand, the prompt that the
/// contract describes: the same tools and the same tool message text.
#[test]
fn tool_references_load_deferred_tools_and_unreadable_blocks_stand_in_as_text() {
    let s = start(&[]);
    let schema =
        json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]});
    let tool = |name: &str, deferred: bool| {
        let mut t = json!({"name": name, "description": format!("The {name} tool."), "input_schema": schema});
        if deferred {
            t["defer_loading"] = json!(true);
        }
        t
    };
    let call = json!({"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "cron"}});
    let result = json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": [
        {"type": "text", "text": "Found one."},
        {"type": "tool_reference", "tool_name": "CronDelete"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]});
    let body = json!({"model": "cqlm-small", "max_tokens": 8, "temperature": 0,
        "tools": [tool("ToolSearch", false), tool("CronDelete", true), tool("CronCreate", true)],
        "messages": [{"role": "user", "content": "Find the cron tools."},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]}]});
    let (status, _, m) = post_with(&s.addr, "/v1/messages", &[], &body);
    assert_eq!(status, 200, "{m}");
    let (status, _, n) = post_with(&s.addr, "/v1/messages/count_tokens", &[], &body);
    assert_eq!(status, 200, "{n}");
    assert_eq!(n["input_tokens"], m["usage"]["input_tokens"], "{n} {m}");

    let function = |name: &str| json!({"type": "function", "function": {"name": name, "description": format!("The {name} tool."), "parameters": schema}});
    let chat = |tools: Value| {
        json!({"max_tokens": 1, "temperature": 0, "tools": tools, "messages": [
            {"role": "user", "content": "Find the cron tools."},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "toolu_1", "type": "function",
                "function": {"name": "ToolSearch", "arguments": "{\"query\":\"cron\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1",
                "content": "Found one.\nTool loaded: CronDelete\n[image omitted: this model reads text only]"}]})
    };
    let (status, _, c) = post_with(
        &s.addr,
        "/v1/chat/completions",
        &[],
        &chat(json!([function("ToolSearch"), function("CronDelete")])),
    );
    assert_eq!(status, 200, "{c}");
    assert_eq!(
        m["usage"]["input_tokens"], c["usage"]["prompt_tokens"],
        "{m} {c}"
    );
    // CronCreate, never loaded, is not in the prompt; had it been, the count grows.
    let (_, _, all) = post_with(
        &s.addr,
        "/v1/chat/completions",
        &[],
        &chat(json!([
            function("ToolSearch"),
            function("CronDelete"),
            function("CronCreate")
        ])),
    );
    assert!(
        all["usage"]["prompt_tokens"].as_u64() > c["usage"]["prompt_tokens"].as_u64(),
        "{all} {c}"
    );
    // A block a tool result may not hold is still a 400 naming it.
    let mut bad = body.clone();
    bad["messages"][2]["content"][0]["content"] = json!([{"type": "video", "url": "x"}]);
    let (status, _, e) = post_with(&s.addr, "/v1/messages", &[], &bad);
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("video"),
        "{e}"
    );
}
