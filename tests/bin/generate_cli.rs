//! `cqlm generate` from outside: sampled text is the same for the same seed and
//! stops before a stop string, the stats line, and a text prompt without a
//! tokenizer is a clear error.

use cqlm::cq::BitsPlan;
use cqlm::Config;

/// A word-level tokenizer over the first ids of `tiny`; "<s>" is BOS (1), "</s>" EOS (2).
fn word_tokenizer() -> String {
    let mut vocab = serde_json::Map::new();
    for (i, w) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(w.to_string(), i.into());
    }
    for i in 3..256u32 {
        vocab.insert(format!("w{i}"), i.into());
    }
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": false},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
    .to_string()
}

fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cli_generates_text_deterministically_and_honours_stop_strings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("words.cqlm");
    let c = Config::preset_tiny();
    let tensors = cqlm::make::synth::synth_tensors(&c, &BitsPlan::mixed(), 6);
    cqlm::archive::write_archive_file(&path, &c, Some(&word_tokenizer()), &tensors).unwrap();
    let p = path.to_str().unwrap();
    let base = [
        "generate",
        "--model",
        p,
        "--prompt",
        "w10 w11 w12",
        "--backend",
        "cpu",
        "--max-tokens",
        "12",
    ];
    let sampled = |seed: &str| {
        let mut a = base.to_vec();
        a.extend([
            "--temperature",
            "1.5",
            "--top-k",
            "50",
            "--repeat-penalty",
            "1.3",
            "--seed",
            seed,
        ]);
        let out = cli(&a);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let a = sampled("1");
    eprintln!("sampled text: {a}");
    assert_eq!(a, sampled("1"), "same seed, same text");
    assert!(a.split_whitespace().all(|w| w.starts_with('w')), "{a}");
    let words: Vec<&str> = a.split_whitespace().collect();
    assert!(!words.is_empty());
    // Stop at the third generated word: the output ends before it.
    if words.len() >= 3 {
        let mut s = base.to_vec();
        s.extend([
            "--temperature",
            "1.5",
            "--top-k",
            "50",
            "--repeat-penalty",
            "1.3",
            "--seed",
            "1",
            "--stop",
            words[2],
        ]);
        let out = cli(&s);
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            !text.contains(words[2]) || words[..2].contains(&words[2]),
            "{text}"
        );
        assert!(text.split_whitespace().count() <= 2, "{text}");
    }
    // The stats line.
    let out = cli(&base);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("prompt 4 tokens") && err.contains("decode") && err.contains("cpu"),
        "{err}"
    );
}

#[test]
fn cli_prompt_without_tokenizer_is_a_clear_error() {
    let out = cli(&[
        "generate",
        "--preset",
        "tiny",
        "--prompt",
        "hello",
        "--backend",
        "cpu",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines().last().unwrap_or("").starts_with("error:") && err.contains("tokenizer"),
        "{err}"
    );
}
