//! `cqlm generate` with a constraint: stdout is exactly the output and one
//! newline, checked by independent validators; a constraint that can't compile
//! is one `error:` line, exit 1 and nothing on stdout; a cut output exits 3.

use serde_json::Value;

fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .unwrap()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

const BASE: [&str; 7] = [
    "generate",
    "--backend",
    "cpu",
    "--temperature",
    "0",
    "--prompt",
    "Answer:",
];

#[test]
fn a_schema_gives_valid_compact_json_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let schema = serde_json::json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "n"], "additionalProperties": false});
    let path = dir.path().join("s.json");
    std::fs::write(&path, schema.to_string()).unwrap();
    for seed in ["0", "5"] {
        // Sampled at temperature 1 (the later flag), so the mask is what keeps
        // the document valid.
        let mut args: Vec<&str> = BASE
            .iter()
            .copied()
            .filter(|a| *a != "--temperature" && *a != "0")
            .collect();
        args.extend([
            "--json-schema",
            path.to_str().unwrap(),
            "--temperature",
            "1",
            "--seed",
            seed,
            "--max-tokens",
            "80",
        ]);
        let o = cli(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = stdout(&o);
        let body = text.strip_suffix('\n').expect("one newline");
        assert!(!body.contains('\n'), "{text:?}");
        let v: Value = serde_json::from_str(body).unwrap();
        assert!(jsonschema::is_valid(&schema, &v), "{body}");
        assert!(
            stderr(&o).contains("µs/token"),
            "the stats line names the mask time"
        );
    }
}

#[test]
fn a_regex_and_a_tool_call_satisfy_their_constraints() {
    let mut args = BASE.to_vec();
    args.extend(["--regex", "[0-9]{3}-[0-9]{4}", "--max-tokens", "20"]);
    let o = cli(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let re = regex::Regex::new(r"^[0-9]{3}-[0-9]{4}\n$").unwrap();
    assert!(re.is_match(&stdout(&o)), "{:?}", stdout(&o));

    let tools = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/train/tools.json");
    let raw: Value = serde_json::from_str(&std::fs::read_to_string(tools).unwrap()).unwrap();
    let mut args = BASE.to_vec();
    args.extend([
        "--tools",
        tools,
        "--tool-choice",
        "get_weather",
        "--max-tokens",
        "60",
    ]);
    let o = cli(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let call: Value = serde_json::from_str(stdout(&o).trim_end()).unwrap();
    assert_eq!(call["name"], "get_weather");
    let params = &raw[0]["function"]["parameters"];
    assert!(jsonschema::is_valid(params, &call["arguments"]), "{call}");
}

#[test]
fn bad_constraints_fail_cleanly_with_nothing_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let bad_json = dir.path().join("bad.json");
    std::fs::write(&bad_json, "{\"type\": ").unwrap();
    let unsupported = dir.path().join("if.json");
    std::fs::write(
        &unsupported,
        r#"{"type":"object","if":{"required":["a"]},"then":{}}"#,
    )
    .unwrap();
    let grammar = dir.path().join("g.lark");
    std::fs::write(&grammar, "start: (").unwrap();
    let tools = dir.path().join("tools.json");
    std::fs::write(
        &tools,
        r#"[{"type":"function","function":{"name":"f","parameters":{"type":"string"}}}]"#,
    )
    .unwrap();
    let real_tools = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/train/tools.json");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--json-schema", bad_json.to_str().unwrap()],
            "not valid JSON",
        ),
        (
            vec!["--json-schema", unsupported.to_str().unwrap()],
            "JSON schema",
        ),
        (vec!["--regex", "(ab"], "regular expression"),
        (vec!["--grammar", grammar.to_str().unwrap()], "Lark grammar"),
        (vec!["--tools", tools.to_str().unwrap()], "object schema"),
        (
            vec!["--tools", real_tools, "--tool-choice", "nope"],
            "no such tool",
        ),
    ];
    for (extra, want) in cases {
        let mut args = BASE.to_vec();
        args.extend(extra.iter());
        let o = cli(&args);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty(), "{extra:?}: {:?}", stdout(&o));
        let err = stderr(&o);
        let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or("");
        assert!(line.contains(want), "{extra:?}: {err}");
    }
    // Two constraints at once, or a tool choice without tools: usage errors.
    let mut args = BASE.to_vec();
    args.extend(["--regex", "a", "--grammar", grammar.to_str().unwrap()]);
    assert_eq!(cli(&args).status.code(), Some(2));
    let mut args = BASE.to_vec();
    args.extend(["--tool-choice", "required"]);
    assert_eq!(cli(&args).status.code(), Some(2));
}

#[test]
fn a_cut_output_is_printed_and_exits_3() {
    let mut args = BASE.to_vec();
    args.extend(["--regex", "[a-z]{30}", "--max-tokens", "3"]);
    let o = cli(&args);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.ends_with('\n') && text.len() > 1, "{text:?}");
    assert!(
        text.trim_end().chars().all(|c| c.is_ascii_lowercase()),
        "{text:?}"
    );
    assert!(stderr(&o).contains("error: --max-tokens 3 reached before the output was complete"));
}
