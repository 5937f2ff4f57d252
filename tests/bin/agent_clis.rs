//! The coding agents themselves against `cqlm serve` on loopback: OpenAI's
//! Codex CLI (`codex exec`, Responses API, a model provider with
//! `wire_api = "responses"`) and Anthropic's Claude Code (`claude -p`,
//! Messages API through `ANTHROPIC_BASE_URL`), one non-interactive exchange
//! each, with their real system prompts and tool lists (about 7,000 tokens).
//! Neither reaches anything but loopback here.
//!
//! The CLIs come from `CQLM_AGENT_CLIS`, a folder holding `codex` and
//! `claude` (`.ci/run` installs pinned versions with npm); without it the
//! tests skip, unless `CQLM_REQUIRE_AGENT_CLIS` is set.

use crate::common::serve::start;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The folder with the agent CLIs, or None (skip) when it is not given.
fn clis() -> Option<PathBuf> {
    let dir = std::env::var_os("CQLM_AGENT_CLIS").map(PathBuf::from);
    let required =
        std::env::var("CQLM_REQUIRE_AGENT_CLIS").is_ok_and(|v| !v.is_empty() && v != "0");
    match dir {
        Some(d) if d.join("codex").exists() && d.join("claude").exists() => Some(d),
        _ => {
            assert!(
                !required,
                "CQLM_REQUIRE_AGENT_CLIS is set but CQLM_AGENT_CLIS holds no codex and claude"
            );
            eprintln!("skipping: set CQLM_AGENT_CLIS to a folder with codex and claude");
            None
        }
    }
}

/// The server's request log lines for `route`.
fn logged(log: &std::sync::Mutex<String>, route: &str) -> Vec<String> {
    log.lock()
        .unwrap()
        .lines()
        .filter(|l| l.contains(&format!("POST {route} ")))
        .map(str::to_string)
        .collect()
}

#[test]
fn codex_cli_runs_a_turn_through_the_responses_api() {
    let Some(dir) = clis() else {
        return;
    };
    let s = start(&["--api-key", "k"]);
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "model = \"cqlm-small\"\nmodel_provider = \"cqlm\"\n\n[model_providers.cqlm]\n\
             name = \"cqlm\"\nbase_url = \"http://{}/v1\"\nwire_api = \"responses\"\n\
             env_key = \"CQLM_API_KEY\"\n",
            s.addr
        ),
    )
    .unwrap();
    let out = Command::new(dir.join("codex"))
        .args(["exec", "--json", "--skip-git-repo-check", "Say hello."])
        .current_dir(work.path())
        .env("CODEX_HOME", home.path())
        .env("CQLM_API_KEY", "k")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let events = String::from_utf8_lossy(&out.stdout);
    // The streamed answer reached Codex: an agent message with text.
    let message = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["item"]["type"] == "agent_message")
        .unwrap_or_else(|| {
            panic!(
                "no agent message: {events}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(
        !message["item"]["text"].as_str().unwrap_or("").is_empty(),
        "{message}"
    );
    // Every request was answered (the built-in model may talk until its
    // token limit, which Codex reports as an incomplete turn, not a failure
    // of the protocol).
    let lines = logged(&s.log, "/v1/responses");
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l.contains("status=200")),
        "{lines:?}"
    );
    assert!(
        out.status.success() || events.contains("reason: max_output_tokens"),
        "{events}"
    );
}

#[test]
fn claude_code_runs_a_turn_through_the_messages_api() {
    let Some(dir) = clis() else {
        return;
    };
    // Claude Code asks for 32,000 tokens a turn; the built-in model may
    // ramble that long, so the server caps each answer.
    let s = start(&["--api-key", "k", "--max-tokens-cap", "128"]);
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(dir.join("claude"))
        .args(["-p", "Say hello.", "--output-format", "json"])
        .args([
            "--disallowedTools",
            "Bash,Edit,Write,NotebookEdit,WebFetch,WebSearch",
        ])
        .current_dir(work.path())
        .env("HOME", home.path())
        .env("ANTHROPIC_BASE_URL", format!("http://{}", s.addr))
        .env("ANTHROPIC_AUTH_TOKEN", "k")
        .env("ANTHROPIC_MODEL", "cqlm-small")
        .env("ANTHROPIC_SMALL_FAST_MODEL", "cqlm-small")
        // Subagents (the Agent and Workflow tools) otherwise ask for a model
        // of their own, which this server does not run (a 404 ends the turn).
        .env("CLAUDE_CODE_SUBAGENT_MODEL", "cqlm-small")
        .env("CLAUDE_CODE_SUBAGENT_MODEL_FORCE", "1")
        .env("CLAUDE_CODE_WORKFLOW_SUBAGENT_MODEL", "cqlm-small")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(r["is_error"], false, "{r}");
    assert!(r["usage"]["input_tokens"].as_u64().unwrap() > 0, "{r}");
    let lines = logged(&s.log, "/v1/messages");
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l.contains("status=200")),
        "{lines:?}"
    );
}
