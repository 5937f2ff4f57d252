//! What a newcomer meets first: `cqlm` alone, `generate`'s sampling defaults
//! and seeds, its prompt sources, and one clear `error:` line for each bad
//! input — run with `XDG_RUNTIME_DIR` unset, where Mesa's device-select layer
//! used to add lines of its own to stderr.

use crate::common::cli::{assert_ok, read_npy, text};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Run `cqlm args…` in `dir` with `XDG_RUNTIME_DIR` unset and `stdin` piped in.
fn run(dir: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cqlm");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Every stderr line is one of cqlm's own: its stats line or a `note:`.
fn assert_own_stderr(out: &Output, what: &str) {
    for line in text(&out.stderr).lines() {
        assert!(
            line.starts_with("note: ") || line.starts_with("prompt "),
            "{what}: a line not of cqlm's: {line:?}"
        );
    }
}

/// A failure: a non-zero status and exactly one `error:` line on stderr.
fn assert_one_error(out: &Output, what: &str, needle: &str) {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{what}: succeeded");
    assert_eq!(err.lines().count(), 1, "{what}: {err:?}");
    assert!(err.starts_with("error: "), "{what}: {err:?}");
    assert!(err.contains(needle), "{what}: {err:?} lacks {needle:?}");
}

/// The stats line's seed.
fn seed_of(out: &Output) -> u64 {
    let err = text(&out.stderr);
    let at = err
        .find("| seed ")
        .unwrap_or_else(|| panic!("no seed in {err}"));
    err[at + 7..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

const PROMPT: &str = "The king said to his daughter,";

#[test]
fn bare_cqlm_lists_the_commands() {
    let d = tempfile::tempdir().unwrap();
    let out = run(d.path(), &[], "");
    assert_ok(&out, "cqlm");
    let list = text(&out.stdout);
    for cmd in ["generate", "chat", "serve", "bench", "profile"] {
        assert!(list.contains(&format!("  {cmd} ")), "{cmd} missing: {list}");
    }
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

#[test]
fn generate_samples_by_default_and_a_seed_repeats() {
    let d = tempfile::tempdir().unwrap();
    let args = [
        "generate",
        "--backend",
        "cpu",
        "--prompt",
        PROMPT,
        "--max-tokens",
        "24",
    ];
    let a = run(d.path(), &args, "");
    let b = run(d.path(), &args, "");
    for o in [&a, &b] {
        assert_ok(o, "generate");
        assert_own_stderr(o, "generate");
    }
    // Two runs draw two seeds (a 2^32 space) and write different text.
    assert_ne!(seed_of(&a), seed_of(&b));
    assert_ne!(text(&a.stdout), text(&b.stdout), "two unseeded runs agree");
    // The printed seed repeats its run.
    let seed = seed_of(&a).to_string();
    let mut again = args.to_vec();
    again.extend(["--seed", &seed]);
    let c = run(d.path(), &again, "");
    assert_ok(&c, "generate --seed");
    assert_eq!(text(&c.stdout), text(&a.stdout));
    // The prompt piped on stdin and read from a file is the --prompt.
    let without_prompt: Vec<&str> = again[..3].iter().chain(&again[5..]).copied().collect();
    let piped = run(d.path(), &without_prompt, PROMPT);
    assert_ok(&piped, "generate < prompt");
    assert_eq!(text(&piped.stdout), text(&a.stdout));
    std::fs::write(d.path().join("p.txt"), PROMPT).unwrap();
    let mut file = without_prompt.clone();
    file.extend(["--prompt-file", "p.txt"]);
    let from_file = run(d.path(), &file, "");
    assert_ok(&from_file, "generate --prompt-file");
    assert_eq!(text(&from_file.stdout), text(&a.stdout));
}

/// `--temperature 0` is greedy: each generated id is the argmax of the logits
/// `cqlm logits` computes at the position before it (same fast precision),
/// found here by a plain loop. A preset without a tokenizer, so ids come out.
#[test]
fn temperature_zero_is_the_argmax_chain() {
    let d = tempfile::tempdir().unwrap();
    let prompt = "1,45,30,99";
    let synth = run(
        d.path(),
        &[
            "synth", "--preset", "tiny", "--seed", "3", "--out", "m.cqlm",
        ],
        "",
    );
    assert_ok(&synth, "synth");
    let out = run(
        d.path(),
        &[
            "generate",
            "--model",
            "m.cqlm",
            "--backend",
            "cpu",
            "--ids",
            prompt,
            "--temperature",
            "0",
            "--max-tokens",
            "10",
        ],
        "",
    );
    assert_ok(&out, "generate greedy");
    assert!(
        text(&out.stderr).contains("| greedy |"),
        "{}",
        text(&out.stderr)
    );
    let generated: Vec<String> = text(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert!(!generated.is_empty());
    let all = format!("{prompt},{}", generated.join(","));
    let l = run(
        d.path(),
        &[
            "logits",
            "--model",
            "m.cqlm",
            "--backend",
            "cpu",
            "--precision",
            "fast",
            "--ids",
            &all,
            "--all-positions",
            "--out",
            "l.npy",
        ],
        "",
    );
    assert_ok(&l, "logits");
    let (shape, v) = read_npy(&d.path().join("l.npy"));
    let vocab = shape[1];
    let p = prompt.split(',').count();
    for (i, id) in generated.iter().enumerate() {
        let row = &v[(p - 1 + i) * vocab..(p + i) * vocab];
        let mut best = 0;
        for (j, &x) in row.iter().enumerate() {
            if x > row[best] {
                best = j;
            }
        }
        assert_eq!(id, &best.to_string(), "token {i}");
    }
}

#[test]
fn bad_inputs_get_one_error_line() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("notes.txt"), "just some text, not a model\n").unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&["generate", "--model", "notes.txt"], "not a cqlm archive"),
        (&["generate", "--max-tokens", "-2"], "-1 for no limit"),
        (
            &["generate", "--max-tokens", "0", "--backend", "cpu"],
            "--max-tokens 0",
        ),
        (
            &[
                "generate",
                "--prompt-file",
                "missing.txt",
                "--backend",
                "cpu",
            ],
            "missing.txt",
        ),
        (&["frobnicate"], "frobnicate"),
    ];
    for (args, needle) in cases {
        assert_one_error(&run(d.path(), args, ""), &args.join(" "), needle);
    }
    // A port in use is reported before the model loads: with a broken model
    // the error is still the port's.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let out = run(
        d.path(),
        &["serve", "--model", "notes.txt", "--port", &port],
        "",
    );
    assert_one_error(&out, "serve on a busy port", "in use");
}
