//! The web page of `cqlm serve` and its routes: `/` and its files (content
//! types, cache header, nothing but DOM APIs for model text), the demo-tool
//! routes against [`cqlm::demo_tools`], the engine profile route against
//! `cqlm profile --json`, and the page itself in a headless Chromium
//! (`tests/serve/web_page.py`, selenium). The browser test skips without
//! Chromium, chromedriver or a Python with selenium unless
//! `CQLM_REQUIRE_BROWSER` is set.

use crate::common::serve::{http, openai_python, post, start, start_with_env};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

/// The OpenAI error shape.
fn is_error(v: &Value) -> bool {
    v["error"]["message"].is_string()
        && v["error"]["type"].is_string()
        && v["error"].get("param").is_some()
}

/// The header `name` (lower case) of a response head.
fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The server answers a short chat (it still serves).
fn still_serves(addr: &str) {
    let (status, v) = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    assert!(v["choices"][0]["message"].is_object(), "{v}");
}

#[test]
fn the_page_and_its_files_are_served_with_their_types() {
    let s = start(&[]);
    let mut total = 0;
    for (path, kind) in [
        ("/", "text/html"),
        ("/app.css", "text/css"),
        ("/app.js", "text/javascript"),
    ] {
        let (status, head, body) = http(&s.addr, "GET", path, &[], b"");
        assert_eq!(status, 200, "{path}: {head}");
        let ct = header(&head, "content-type").unwrap_or("");
        assert!(ct.starts_with(kind), "{path}: content-type {ct}");
        assert!(
            header(&head, "cache-control").is_some_and(|c| c.contains("max-age")),
            "{path}: {head}"
        );
        assert!(!body.is_empty(), "{path}");
        total += body.len();
    }
    eprintln!("web page: {total} bytes served in all");
    let (_, head, html) = http(&s.addr, "GET", "/", &[], b"");
    assert!(html.contains(r#"<script src="/app.js""#) && html.contains("/app.css"));
    assert!(
        header(&head, "content-security-policy").is_some_and(|c| c.contains("default-src 'self'")),
        "{head}"
    );
    // Nothing is fetched from elsewhere, and model text never becomes HTML.
    let (_, _, js) = http(&s.addr, "GET", "/app.js", &[], b"");
    for bad in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(!js.contains(bad), "app.js uses {bad}");
    }
    for body in [&html, &js] {
        assert!(
            !body.contains("http://") && !body.contains("https://"),
            "a file refers to another origin"
        );
    }
    // A file that is not there is a 404 in the OpenAI shape.
    let (status, _, body) = http(&s.addr, "GET", "/app.jsx", &[], b"");
    assert_eq!(status, 404);
    assert!(is_error(&serde_json::from_str(&body).unwrap()));
}

#[test]
fn the_demo_tool_routes_answer_as_the_library_does_and_refuse_bad_bodies() {
    let s = start(&[]);
    let (status, _, body) = http(&s.addr, "GET", "/v1/cqlm/demo-tools", &[], b"");
    assert_eq!(status, 200);
    let tools: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(tools, cqlm::demo_tools::tools());

    // The call the built-in model makes for "What is 23 * 40?".
    let args = r#"{"expression":"23 * 40"}"#;
    let (status, v) = post(
        &s.addr,
        "/v1/cqlm/demo-tools/call",
        &json!({"name": "calculate", "arguments": args}),
    );
    assert_eq!(status, 200, "{v}");
    let content = v["content"].as_str().unwrap();
    assert_eq!(content, cqlm::demo_tools::call("calculate", args));
    let result: Value = serde_json::from_str(content).unwrap();
    assert_eq!(result["result"].as_f64(), Some(920.0), "{content}");
    // Arguments as an object give the same answer.
    let (_, v) = post(
        &s.addr,
        "/v1/cqlm/demo-tools/call",
        &json!({"name": "calculate", "arguments": {"expression": "23 * 40"}}),
    );
    assert_eq!(v["content"].as_str(), Some(content));

    let bad: [&[u8]; 7] = [
        b"not json",
        b"{}",
        br#"{"name": "calculate"}"#,
        br#"{"name": "rm_rf", "arguments": "{}"}"#,
        br#"{"name": "calculate", "arguments": 5}"#,
        br#"{"name": "calculate", "arguments": "{}", "extra": 1}"#,
        br#"[1, 2]"#,
    ];
    for b in bad {
        let (status, _, body) = http(&s.addr, "POST", "/v1/cqlm/demo-tools/call", &[], b);
        assert_eq!(status, 400, "{}: {body}", String::from_utf8_lossy(b));
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(is_error(&v), "{body}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    // Arguments that are not JSON are the tool's error answer, not a failure
    // (the model reads it as the result).
    let (status, v) = post(
        &s.addr,
        "/v1/cqlm/demo-tools/call",
        &json!({"name": "calculate", "arguments": "{oops"}),
    );
    assert_eq!(status, 200);
    assert!(v["content"].as_str().unwrap().contains("error"), "{v}");
    still_serves(&s.addr);
}

/// The kernel names of a profile's JSON.
fn kernels(v: &Value) -> BTreeSet<String> {
    v["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("no rows: {v}"))
        .iter()
        .map(|r| r["kernel"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_profile_route_times_the_kernels_cqlm_profile_names() {
    let s = start(&[]);
    let (status, _, body) = http(&s.addr, "GET", "/v1/cqlm/profile?passes=4", &[], b"");
    assert_eq!(status, 200, "{body}");
    let served: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(served["tokens"], 4);
    assert!(
        served["backend"].as_str().unwrap().starts_with("cpu"),
        "{served}"
    );
    for r in served["rows"].as_array().unwrap() {
        assert!(r["us_per_pass"].as_f64().unwrap() >= 0.0, "{r}");
        assert!(r["calls_per_pass"].as_u64().unwrap() >= 1, "{r}");
    }
    let served = kernels(&served);
    assert!(served.contains("attend") && served.iter().any(|k| k.starts_with("matvec")));
    for extra in [&["--sequences", "1"][..], &[]] {
        let out = Command::new(env!("CARGO_BIN_EXE_cqlm"))
            .args(["profile", "--backend", "cpu", "--json", "--tokens", "2"])
            .args(extra)
            .output()
            .unwrap();
        crate::common::cli::assert_ok(&out, "cqlm profile --json");
        let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(kernels(&cli), served, "cqlm profile {extra:?}");
    }
    for q in [
        "passes=0",
        "passes=65",
        "passes=x",
        "prompt_len=9999",
        "bogus=1",
    ] {
        let (status, _, body) = http(&s.addr, "GET", &format!("/v1/cqlm/profile?{q}"), &[], b"");
        assert_eq!(status, 400, "{q}: {body}");
        assert!(is_error(&serde_json::from_str(&body).unwrap()), "{body}");
    }
    still_serves(&s.addr);
}

#[test]
fn the_profile_route_is_a_503_while_every_slot_generates() {
    // One slot, slowed: a long completion holds it.
    let s = start_with_env(&["--parallel", "1"], &[("CQLM_SERVE_PASS_DELAY_MS", "30")]);
    let addr = s.addr.clone();
    let long = std::thread::spawn(move || {
        post(
            &addr,
            "/v1/completions",
            &json!({"prompt": "The king said to his daughter,", "max_tokens": 60, "temperature": 0}),
        )
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut busy = None;
    while std::time::Instant::now() < deadline {
        let (status, head, body) = http(&s.addr, "GET", "/v1/cqlm/profile?passes=1", &[], b"");
        if status == 503 {
            busy = Some((head, body));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (head, body) = busy.expect("the profile route never answered 503 while the slot was busy");
    assert!(header(&head, "retry-after").is_some(), "{head}");
    assert!(is_error(&serde_json::from_str(&body).unwrap()), "{body}");
    let (status, v) = long.join().unwrap();
    assert_eq!(status, 200, "{v}");
    // The slot is free again: the profile runs.
    let (status, _, body) = http(&s.addr, "GET", "/v1/cqlm/profile?passes=1", &[], b"");
    assert_eq!(status, 200, "{body}");
}

/// Chromium and chromedriver (`apt-get install chromium chromium-driver`), or
/// None to skip, which `CQLM_REQUIRE_BROWSER` forbids.
fn browser() -> Option<()> {
    let chromium = std::env::var("CQLM_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let driver =
        std::env::var("CQLM_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    let missing: Vec<&str> = [chromium.as_str(), driver.as_str()]
        .into_iter()
        .filter(|p| !std::path::Path::new(p).exists())
        .collect();
    if missing.is_empty() {
        return Some(());
    }
    assert!(
        std::env::var("CQLM_REQUIRE_BROWSER").is_err(),
        "CQLM_REQUIRE_BROWSER is set but {missing:?} are missing (apt-get install chromium chromium-driver)"
    );
    eprintln!("skipped: {missing:?} missing (apt-get install chromium chromium-driver)");
    None
}

#[test]
fn the_page_chats_streams_stops_calls_tools_and_profiles_in_a_browser() {
    let Some(python) = openai_python() else {
        return;
    };
    if browser().is_none() {
        return;
    }
    let has_selenium = Command::new(&python)
        .args(["-c", "import selenium"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_selenium {
        assert!(
            std::env::var("CQLM_REQUIRE_BROWSER").is_err(),
            "CQLM_REQUIRE_BROWSER is set but {python} has no selenium (.ci/run installs it)"
        );
        eprintln!("skipped: {python} has no selenium");
        return;
    }
    // Each pass waits 40 ms, so that the tiny model's short answers stream
    // over a second or so and the test can watch them grow, and stop them.
    let s = start_with_env(&[], &[("CQLM_SERVE_PASS_DELAY_MS", "40")]);
    // The target dir: the one holding `release/cqlm`.
    let target: PathBuf = PathBuf::from(env!("CARGO_BIN_EXE_cqlm"))
        .parent()
        .and_then(|p| p.parent())
        .unwrap()
        .to_path_buf();
    let shots = target.join("web-screenshots");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve/web_page.py");
    let out = Command::new(&python)
        .args([script, &format!("http://{}", s.addr)])
        .arg(&shots)
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    crate::common::cli::assert_ok(&out, "web_page.py");
    assert!(shots.join("9-phone.png").exists());
    still_serves(&s.addr);
}

#[test]
fn the_page_is_open_and_its_routes_need_the_api_key_when_one_is_set() {
    let s = start(&["--api-key", "k"]);
    for path in ["/", "/app.js", "/app.css"] {
        let (status, _, _) = http(&s.addr, "GET", path, &[], b"");
        assert_eq!(status, 200, "{path}");
    }
    let auth = [("Authorization", "Bearer k")];
    for path in ["/v1/cqlm/demo-tools", "/v1/cqlm/profile?passes=1"] {
        let (status, _, body) = http(&s.addr, "GET", path, &[], b"");
        assert_eq!(status, 401, "{path}: {body}");
        assert!(is_error(&serde_json::from_str(&body).unwrap()), "{body}");
        let (status, _, body) = http(&s.addr, "GET", path, &auth, b"");
        assert_eq!(status, 200, "{path}: {body}");
    }
    let call = br#"{"name": "calculate", "arguments": "{\"expression\": \"2 + 2\"}"}"#;
    let (status, _, _) = http(&s.addr, "POST", "/v1/cqlm/demo-tools/call", &[], call);
    assert_eq!(status, 401);
    let (status, _, body) = http(&s.addr, "POST", "/v1/cqlm/demo-tools/call", &auth, call);
    assert_eq!(status, 200, "{body}");
}
