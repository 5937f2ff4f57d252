//! `cqlm chat`: through a pseudo-terminal (`tests/chat/chat_pty.py`, pexpect,
//! with `CQLM_OPENAI_PYTHON`), and with standard input piped: one answer per
//! line, greedy answers equal to `cqlm generate`'s on the same rendered
//! prompt (a fresh prefill against the chat's continued state), demo tool
//! calls, the context window, and stderr holding only cqlm's own lines (with
//! `XDG_RUNTIME_DIR` unset too).

use crate::common::cli::{assert_ok, cqlm, text};
use crate::common::serve::openai_python;
use cqlm::serve::chat::ChatTemplate;
use cqlm::serve::wire::Message;
use cqlm::session::tokenizer::TextTokenizer;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `cqlm chat args…` with `input` piped in; `xdg`: the `XDG_RUNTIME_DIR` to
/// set (`None`: unset).
fn chat(args: &[&str], input: &str, xdg: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cqlm"));
    cmd.arg("chat")
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match xdg {
        Some(d) => cmd.env("XDG_RUNTIME_DIR", d),
        None => cmd.env_remove("XDG_RUNTIME_DIR"),
    };
    let mut child = cmd.spawn().expect("run cqlm chat");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().expect("cqlm chat ends")
}

/// Whether `line` is one of the chat's own stderr lines: a stats line, a
/// note, a tool call or result, a window notice, or auto's backend notice.
fn is_cqlm_line(line: &str) -> bool {
    let stats = regex::Regex::new(
        r"^\[prompt \d+ tokens, \d+ cached \| \d+ generated \| first token (\d+ ms|-) \| [\d.]+ tok/s\]$",
    )
    .unwrap();
    stats.is_match(line)
        || line.starts_with("note: using the cpu backend")
        || line.starts_with("→ ")
        || line.starts_with("← ")
        || line.starts_with("tools: ")
        || line.ends_with("fell out of the context]")
}

fn assert_only_cqlm_lines(out: &Output, what: &str) {
    let err = text(&out.stderr);
    for line in err.lines() {
        assert!(
            is_cqlm_line(line),
            "{what}: stray stderr line {line:?}\n{err}"
        );
    }
}

/// The prompt text of `messages`, rendered by the archive's template.
fn rendered(messages: serde_json::Value) -> String {
    let model = cqlm::model::builtin::model().unwrap();
    let tok = TextTokenizer::for_model(&model).unwrap();
    let (bos, eos) = (
        tok.decode_special(model.config.bos),
        tok.decode_special(model.config.eos),
    );
    let t = ChatTemplate::new(model.chat_template.as_deref(), &bos, &eos).unwrap();
    let m: Vec<Message> = serde_json::from_value(messages).unwrap();
    t.render(&m, None).unwrap()
}

#[test]
fn chat_through_a_pseudo_terminal() {
    let Some(python) = openai_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(python)
        .arg(root().join("tests/chat/chat_pty.py"))
        .arg(env!("CARGO_BIN_EXE_cqlm"))
        .arg(root().join("models/cqlm-small.safetensors"))
        .arg(dir.path())
        .env("XDG_RUNTIME_DIR", "/tmp")
        .env_remove("RUST_LOG")
        .output()
        .expect("python runs");
    assert!(
        out.status.success() && text(&out.stdout).ends_with("ok\n"),
        "chat_pty.py failed\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn piped_lines_get_one_answer_each_as_generate_gives() {
    let (u1, u2) = ("Hello!", "What is the weather in Paris?");
    let flags = [
        "--backend",
        "cpu",
        "--precision",
        "fast",
        "--temperature",
        "0",
        "--max-tokens",
        "40",
        "--ctx-tokens",
        "4096",
    ];
    let out = chat(&flags, &format!("{u1}\n{u2}\n"), Some("/tmp"));
    assert_ok(&out, "chat");
    assert_only_cqlm_lines(&out, "chat");
    let answers: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(
        text(&out.stderr).lines().count(),
        2,
        "one stats line per answer"
    );
    // The same prompts prefilled from scratch by `cqlm generate`.
    let convs = [
        json!([{"role": "user", "content": u1}]),
        json!([{"role": "user", "content": u1},
               {"role": "assistant", "content": answers[0]},
               {"role": "user", "content": u2}]),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (conv, answer) in convs.into_iter().zip(&answers) {
        let prompt = rendered(conv);
        let mut args = vec!["generate", "--prompt", prompt.as_str()];
        args.extend_from_slice(&flags[..8]);
        let g = cqlm(dir.path(), &args);
        assert_ok(&g, "generate");
        assert_eq!(&text(&g.stdout).trim_end_matches('\n'), answer, "{prompt}");
    }
}

#[test]
fn piped_demo_tools_run_and_old_turns_fall_out() {
    let out = chat(
        &[
            "--backend",
            "cpu",
            "--temperature",
            "0",
            "--ctx-tokens",
            "4096",
        ],
        "/tools demo\nWhat is 23 * 40?\n",
        Some("/tmp"),
    );
    assert_ok(&out, "tools");
    assert_only_cqlm_lines(&out, "tools");
    let err = text(&out.stderr);
    assert!(err.contains("→ calculate("), "{err}");
    assert!(err.contains("\"result\":920"), "{err}");
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains("920"), "{stdout}");

    // A context of 40 tokens holds one short turn and its answer's room.
    let out = chat(
        &[
            "--backend",
            "cpu",
            "--temperature",
            "0",
            "--ctx-tokens",
            "40",
            "--max-tokens",
            "8",
        ],
        "Hello!\nHi again.\nAnd again.\n",
        Some("/tmp"),
    );
    assert_ok(&out, "window");
    assert_only_cqlm_lines(&out, "window");
    let err = text(&out.stderr);
    assert!(
        err.contains("[1 old turn fell out of the context]"),
        "{err}"
    );
    assert_eq!(text(&out.stdout).lines().count(), 3);
}

#[test]
fn piped_chat_without_xdg_runtime_dir_keeps_stderr_to_its_own_lines() {
    // Auto probes the GPU adapters, whose drivers complain without XDG_RUNTIME_DIR.
    let out = chat(
        &["--temperature", "0", "--max-tokens", "8"],
        "Hello!\n",
        None,
    );
    assert_ok(&out, "auto");
    assert_only_cqlm_lines(&out, "auto");
    assert_eq!(text(&out.stdout).lines().count(), 1);
    let out = chat(
        &["--backend", "cpu", "--max-tokens", "8", "--seed", "7"],
        "Hello!\n/bogus\n",
        None,
    );
    assert!(
        !out.status.success(),
        "a failed line makes the status non-zero"
    );
    let err = text(&out.stderr);
    assert!(err.contains("error: unknown command /bogus"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
