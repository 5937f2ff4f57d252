//! The `cqlm` binary's backends: flags a backend would ignore are errors,
//! `--prefill-chunk` reaches the engine, auto on a software adapter takes the CPU
//! with one note; on the GPU (skipped without an adapter unless
//! `CQLM_REQUIRE_GPU` is set) `logits` matches the CPU's and `parity` passes and
//! prints JSON; text prompts go through the embedded tokenizer.

use crate::common::cli::{assert_ok, cqlm, text};
use crate::common::gpu::{adapter_env_set, only_software_adapters};
use crate::common::gpu::{gpu, rel_l2};
use cqlm::cq::BitsPlan;
use cqlm::Config;

#[test]
fn cli_auto_notice_prefill_chunk_and_ignored_flags() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // --adapter with --backend cpu would be ignored: an error naming both.
    let synth = cqlm(
        d,
        &[
            "synth", "--preset", "tiny", "--seed", "1", "--out", "t.cqlm",
        ],
    );
    assert_ok(&synth, "synth");
    std::fs::write(d.join("t.txt"), "some text to score").unwrap();
    for args in [
        &["generate", "--preset", "tiny"][..],
        &["bench", "--preset", "tiny"],
        &["profile", "--preset", "tiny"],
        &[
            "logits", "--model", "t.cqlm", "--ids", "1,2", "--out", "l.npy",
        ],
        &["eval", "--text", "t.txt"],
    ] {
        let mut argv = args.to_vec();
        argv.extend(["--backend", "cpu", "--adapter", "x"]);
        let out = cqlm(d, &argv);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{argv:?}");
        assert!(
            err.contains("--adapter") && err.contains("--backend cpu"),
            "{argv:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{argv:?}: {err}");
    }
    // --prefill-chunk reaches the engine (bench reports it).
    let out = cqlm(
        d,
        &[
            "bench",
            "--backend",
            "cpu",
            "--preset",
            "tiny",
            "--prompt-len",
            "9",
            "--tokens",
            "2",
            "--reps",
            "1",
            "--json",
            "--prefill-chunk",
            "3",
        ],
    );
    assert_ok(&out, "bench --prefill-chunk");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["prefill_chunk"], 3);
    // Auto on a machine whose only adapter is a software renderer: the CPU, with
    // one note saying why and how to force the GPU.
    if only_software_adapters() && !adapter_env_set() {
        let out = cqlm(d, &["generate", "--preset", "tiny", "--max-tokens", "2"]);
        assert_ok(&out, "generate auto");
        let err = text(&out.stderr);
        let notes: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("software renderer"))
            .collect();
        assert_eq!(notes.len(), 1, "{err}");
        assert!(notes[0].starts_with("note: using the cpu backend"), "{err}");
        assert!(
            err.contains("| cpu ("),
            "the stats line names the cpu: {err}"
        );
    }
}

#[test]
fn cli_logits_on_the_gpu_match_the_cpu() {
    let Some(_) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.cqlm");
    let bin = env!("CARGO_BIN_EXE_cqlm");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "synth",
        "--preset",
        "tiny",
        "--seed",
        "2",
        "--out",
        model.to_str().unwrap(),
    ]);
    let ids = "1,5,9,200,3,3,7,11,13,17,19,23,29";
    let mut rows = Vec::new();
    for backend in ["gpu", "cpu"] {
        let out = dir.path().join(format!("{backend}.npy"));
        run(&[
            "logits",
            "--model",
            model.to_str().unwrap(),
            "--ids",
            ids,
            "--all-positions",
            "--backend",
            backend,
            "--out",
            out.to_str().unwrap(),
        ]);
        let bytes = std::fs::read(&out).unwrap();
        // .npy v1: 10-byte preamble + header, then little-endian f32 data.
        let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        let data: Vec<f32> = bytes[10 + header_len..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(data.len(), 13 * 256);
        rows.push(data);
    }
    for p in 0..13 {
        let e = rel_l2(
            &rows[0][p * 256..(p + 1) * 256],
            &rows[1][p * 256..(p + 1) * 256],
        );
        assert!(e <= 2e-2, "position {p}: {e}");
    }
}

#[test]
fn cli_parity_exits_zero_on_a_healthy_engine_and_prints_json() {
    let Some(_) = gpu() else { return };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args([
            "parity",
            "--preset",
            "tiny",
            "--ids",
            "1,2,3,4,5,6,7,8,9,10,11,12",
            "--generate",
            "4",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rungs = v["rungs"].as_array().unwrap();
    assert!(rungs.len() >= 7);
    assert!(rungs.iter().all(|r| r["pass"] == true));
    assert!(v["first_divergent"].is_null());
}

/// A minimal Hugging Face word-level tokenizer over tiny's first ids.
const TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"<unk>":0,"<s>":1,"</s>":2,"hello":3,"world":4,"again":5},"unk_token":"<unk>"}}"#;

#[test]
fn text_prompts_use_the_embedded_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let c = Config::preset_tiny();
    let tensors = cqlm::make::synth::synth_tensors(&c, &BitsPlan::mixed(), 4);
    let with = dir.path().join("with.cqlm");
    let without = dir.path().join("without.cqlm");
    cqlm::archive::write_archive_file(&with, &c, Some(TOKENIZER), &tensors).unwrap();
    cqlm::archive::write_archive_file(&without, &c, None, &tensors).unwrap();

    // The library: BOS goes in front (this tokenizer's post-processor adds none).
    let model = cqlm::Model::load(&with).unwrap();
    let tok = cqlm::session::tokenizer::TextTokenizer::for_model(&model).unwrap();
    assert_eq!(
        tok.encode("hello world again hello").unwrap(),
        vec![1, 3, 4, 5, 3]
    );
    assert_eq!(tok.decode(&[3, 4]).unwrap(), "hello world");

    let run = |path: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_cqlm"))
            .args([
                "parity",
                "--model",
                path.to_str().unwrap(),
                "--prompt",
                "hello world again",
                "--generate",
                "2",
            ])
            .output()
            .unwrap()
    };
    let out = run(&without);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.starts_with("error:") && err.contains("no embedded tokenizer"),
        "{err}"
    );
    if gpu().is_some() {
        let out = run(&with);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
