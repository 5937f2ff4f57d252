//! `cqlm eval` and [`cqlm::diag::eval::score_stream`] on the shipped held-out text
//! (`tools/train/heldout.txt`), against the bits per byte the PyTorch
//! implementation computed for the same archive (`tests/fixtures/trained/reference.json`,
//! written by `tools/train/evaluate.py fixtures`: the archive dequantized to f64
//! with the int8 K/V rounding emulated, attention over SPEC §4.3's sinks and window).

use crate::common::cli::{assert_ok, cqlm, text};
use crate::common::gpu::gpu;
use cqlm::diag::eval::score_stream;
use cqlm::session::tokenizer::TextTokenizer;
use cqlm::{CpuEngine, Engine};
use std::path::PathBuf;
use std::sync::Arc;

/// These tests each keep both cores busy (the CPU engine's pool, lavapipe); run
/// them one at a time so they don't thrash each other.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn heldout() -> PathBuf {
    root().join("tools/train/heldout.txt")
}

fn reference() -> serde_json::Value {
    serde_json::from_slice(
        &std::fs::read(root().join("tests/fixtures/trained/reference.json")).unwrap(),
    )
    .unwrap()
}

/// The Python figure for `key` (`heldout` or `heldout_prefix`): (tokens, bytes, bits per byte).
fn python(key: &str) -> (usize, usize, f64) {
    let r = &reference()[key];
    (
        r["tokens"].as_u64().unwrap() as usize,
        r["bytes"].as_u64().unwrap() as usize,
        r["bits_per_byte"].as_f64().unwrap(),
    )
}

/// The whole held-out file on the CPU engine reproduces Python's bits per byte.
/// The issue asks for 1%; the two implementations differ only by float rounding
/// (and the rare int8 code it flips), so 0.1% is asserted and the gap printed.
#[test]
fn heldout_bits_per_byte_reproduce_the_pytorch_figure() {
    let _serial = serial();
    let model = Arc::new(cqlm::model::builtin::model().unwrap());
    let text = std::fs::read_to_string(heldout()).unwrap();
    let ids = TextTokenizer::for_model(&model)
        .unwrap()
        .encode(&text)
        .unwrap();
    let (tokens, bytes, want) = python("heldout");
    assert_eq!(
        ids.len() - 1,
        tokens,
        "Rust and Python tokenize the file alike"
    );
    assert_eq!(text.len(), bytes);
    let mut engine = CpuEngine::new(model).unwrap();
    let score = score_stream(&mut engine, &ids, |_| {}).unwrap();
    let got = score.bits_per_byte(bytes);
    eprintln!(
        "heldout: rust {got:.6} bits/byte, python {want:.6} ({:+.2e} relative)",
        got / want - 1.0
    );
    assert!(
        (got / want - 1.0).abs() <= 1e-3,
        "rust {got}, python {want}"
    );
    assert_eq!(engine.position(), ids.len() as u64 - 1);
}

fn eval_json(args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let h = heldout();
    let mut all = vec!["eval", "--text", h.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    let out = cqlm(dir.path(), &all);
    assert_ok(&out, "eval");
    serde_json::from_str(text(&out.stdout).trim()).expect("one JSON object on stdout")
}

/// `cqlm eval --max-tokens` on both backends (the built-in model, no `--model`)
/// reproduces Python's figure for the same prefix of the file.
#[test]
fn cli_eval_of_a_prefix_matches_pytorch_on_both_backends() {
    let _serial = serial();
    let (tokens, bytes, want) = python("heldout_prefix");
    let n = tokens.to_string();
    let mut backends = vec!["cpu"];
    if gpu().is_some() {
        backends.push("gpu");
    }
    for backend in backends {
        let v = eval_json(&["--max-tokens", &n, "--backend", backend]);
        assert_eq!(v["tokens"].as_u64().unwrap() as usize, tokens, "{v}");
        assert_eq!(v["bytes"].as_u64().unwrap() as usize, bytes, "{v}");
        let got = v["bits_per_byte"].as_f64().unwrap();
        assert!(
            (got / want - 1.0).abs() <= 1e-3,
            "{backend}: {got} vs python {want}"
        );
        let ppl = v["perplexity"].as_f64().unwrap();
        let nats = v["nll_nats"].as_f64().unwrap();
        assert!(
            (ppl - (nats / tokens as f64).exp()).abs() <= 1e-9 * ppl,
            "{v}"
        );
    }
}

#[test]
fn cli_eval_errors_name_their_cause() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let missing = cqlm(
        dir.path(),
        &["eval", "--text", "no-such-file.txt", "--backend", "cpu"],
    );
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("no-such-file.txt"),
        "{}",
        text(&missing.stderr)
    );

    let binary = dir.path().join("bin.txt");
    std::fs::write(&binary, [0xff, 0xfe, 0x00, 0x80]).unwrap();
    let out = cqlm(
        dir.path(),
        &[
            "eval",
            "--text",
            binary.to_str().unwrap(),
            "--backend",
            "cpu",
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not UTF-8"),
        "{}",
        text(&out.stderr)
    );

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let out = cqlm(
        dir.path(),
        &[
            "eval",
            "--text",
            empty.to_str().unwrap(),
            "--backend",
            "cpu",
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no tokens"),
        "{}",
        text(&out.stderr)
    );

    // A model without a tokenizer cannot read text.
    let h = heldout();
    let out = cqlm(
        dir.path(),
        &[
            "eval",
            "--preset",
            "tiny",
            "--text",
            h.to_str().unwrap(),
            "--backend",
            "cpu",
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("tokenizer"),
        "{}",
        text(&out.stderr)
    );
    for o in [&missing, &out] {
        assert!(!text(&o.stderr).contains("panicked"));
    }
}
