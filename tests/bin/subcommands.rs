//! The `cqlm` binary: SPEC §7 (`logits`) and the other subcommands, run as a
//! user would, in a temporary folder.

use cqlm::archive::read_archive_file;
use cqlm::archive::Tensor;
use cqlm::cq::plan_for_preset;
use cqlm::make::synth::synth_model;
use cqlm::session::sample::argmax;
use cqlm::{Config, CpuEngine, Engine, Model};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use crate::common::cli::{assert_ok, cqlm, read_npy, text};
use crate::common::StepLogits;

/// `cqlm synth --preset tiny --seed SEED --out NAME` in `dir`.
fn synth(dir: &Path, seed: u64, name: &str) -> PathBuf {
    let out = cqlm(
        dir,
        &[
            "synth",
            "--preset",
            "tiny",
            "--seed",
            &seed.to_string(),
            "--out",
            name,
        ],
    );
    assert_ok(&out, "synth");
    dir.join(name)
}

/// Logits after every id of `ids`, from the library's CPU engine.
fn reference_logits(model: &Path, ids: &[u32]) -> Vec<Vec<f32>> {
    let m = Model::load(model).unwrap();
    let mut e = CpuEngine::new(Arc::new(m)).unwrap();
    ids.iter().map(|&id| e.logits_after(id)).collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

// ---------------------------------------------------------------------------

#[test]
fn synth_is_deterministic_per_seed() {
    let dir = tempfile::tempdir().unwrap();
    let a = std::fs::read(synth(dir.path(), 3, "a.cqlm")).unwrap();
    let b = std::fs::read(synth(dir.path(), 3, "b.cqlm")).unwrap();
    let c = std::fs::read(synth(dir.path(), 4, "c.cqlm")).unwrap();
    assert!(!a.is_empty());
    assert!(a == b, "the same seed gave different bytes");
    assert!(a != c, "different seeds gave the same bytes");
    assert_eq!(a.len(), c.len());
    // The archive is the tiny preset and loads.
    let m = Model::load(&dir.path().join("a.cqlm")).unwrap();
    assert_eq!(m.config, Config::preset_tiny());
}

#[test]
fn synth_rejects_a_bad_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = serde_json::to_value(Config::preset_tiny()).unwrap();
    v["head_dim"] = serde_json::json!(15);
    std::fs::write(dir.path().join("bad.json"), v.to_string()).unwrap();
    let before = listing(dir.path());
    let out = cqlm(
        dir.path(),
        &["synth", "--config", "bad.json", "--out", "x.cqlm"],
    );
    assert_one_line_error(&out, "synth --config bad.json");
    assert!(
        text(&out.stderr).contains("head_dim"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(listing(dir.path()), before);
}

#[test]
fn logits_last_position_matches_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), 3, "m.cqlm");
    let vocab = Config::preset_tiny().vocab;
    let ids = [1u32, 2, 3];
    let reference = reference_logits(&model, &ids);

    // Default backend: shape [1, vocab].
    let out = cqlm(
        dir.path(),
        &[
            "logits", "--model", "m.cqlm", "--ids", "1,2,3", "--out", "y.npy",
        ],
    );
    assert_ok(&out, "logits");
    let (shape, values) = read_npy(&dir.path().join("y.npy"));
    assert_eq!(shape, vec![1, vocab]);
    assert!(values.iter().all(|v| v.is_finite()));

    // CPU backend: bit for bit the library's CPU engine.
    let out = cqlm(
        dir.path(),
        &[
            "logits",
            "--model",
            "m.cqlm",
            "--ids",
            "1,2,3",
            "--backend",
            "cpu",
            "--out",
            "cpu.npy",
        ],
    );
    assert_ok(&out, "logits --backend cpu");
    let (shape, cpu) = read_npy(&dir.path().join("cpu.npy"));
    assert_eq!(shape, vec![1, vocab]);
    assert!(
        same_bits(&cpu, &reference[2]),
        "logits differ from CpuEngine"
    );
    // The last id matters.
    assert!(!same_bits(&cpu, &reference[1]));
}

#[test]
fn logits_all_positions() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), 5, "m.cqlm");
    let vocab = Config::preset_tiny().vocab;
    let ids = [7u32, 0, 255];
    let reference = reference_logits(&dir.path().join("m.cqlm"), &ids);
    let run = |extra: &[&str], out: &str| {
        let mut args = vec![
            "logits",
            "--model",
            "m.cqlm",
            "--ids",
            "7,0,255",
            "--backend",
            "cpu",
            "--out",
            out,
        ];
        args.extend_from_slice(extra);
        assert_ok(&cqlm(dir.path(), &args), out);
        read_npy(&dir.path().join(out))
    };
    let (shape, all) = run(&["--all-positions"], "all.npy");
    assert_eq!(shape, vec![3, vocab]);
    let (shape1, last) = run(&[], "last.npy");
    assert_eq!(shape1, vec![1, vocab]);
    assert!(
        same_bits(&all[2 * vocab..], &last),
        "row 2 != single-position output"
    );
    for (i, r) in reference.iter().enumerate() {
        assert!(same_bits(&all[i * vocab..(i + 1) * vocab], r), "row {i}");
    }
    // The rows are not all the same.
    assert!(!same_bits(&all[..vocab], &all[vocab..2 * vocab]));
}

#[test]
fn logits_after_a_chunked_prefill_equal_stepping_bit_for_bit() {
    // `logits` prefills the earlier ids through the engine's batched prefill;
    // whatever the chunk (--prefill-chunk, 1 = one step per token), the file
    // holds the same bits, and they equal the last row of --all-positions
    // (which steps every id with logits).
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), 6, "m.cqlm");
    let ids: Vec<String> = (0..23).map(|i| ((i * 37 + 11) % 256).to_string()).collect();
    let ids = ids.join(",");
    let run = |extra: &[&str], out: &str| {
        let mut args = vec![
            "logits",
            "--model",
            "m.cqlm",
            "--ids",
            &ids,
            "--backend",
            "cpu",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--out", out]);
        let o = cqlm(dir.path(), &args);
        assert_ok(&o, out);
        read_npy(&dir.path().join(out))
    };
    let (shape1, one) = run(&["--prefill-chunk", "1"], "c1.npy");
    let (shape5, five) = run(&["--prefill-chunk", "5"], "c5.npy");
    let (_, dflt) = run(&[], "c64.npy");
    let (shape_all, all) = run(&["--all-positions"], "all.npy");
    let vocab = Config::preset_tiny().vocab;
    assert_eq!(shape1, vec![1, vocab]);
    assert_eq!(shape5, shape1);
    assert_eq!(shape_all, vec![23, vocab]);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    assert_eq!(bits(&five), bits(&one));
    assert_eq!(bits(&dflt), bits(&one));
    assert_eq!(bits(&all[22 * vocab..]), bits(&one));
    // The chunk must be at least 1.
    let o = cqlm(
        dir.path(),
        &[
            "logits",
            "--model",
            "m.cqlm",
            "--ids",
            "1",
            "--backend",
            "cpu",
            "--prefill-chunk",
            "0",
            "--out",
            "z.npy",
        ],
    );
    assert!(!o.status.success());
    assert!(!dir.path().join("z.npy").exists());
}

#[test]
fn logits_writes_to_exactly_the_given_path() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), 3, "m.cqlm");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let before = listing(&dir.path().join("sub"));
    assert!(before.is_empty());
    // A name without the .npy suffix is written as given.
    let out = cqlm(
        dir.path(),
        &[
            "logits",
            "--model",
            "m.cqlm",
            "--ids",
            "9",
            "--backend",
            "cpu",
            "--out",
            "sub/out.bin",
        ],
    );
    assert_ok(&out, "logits sub/out.bin");
    assert_eq!(
        listing(&dir.path().join("sub")),
        BTreeSet::from(["out.bin".to_string()])
    );
    let (shape, _) = read_npy(&dir.path().join("sub/out.bin"));
    assert_eq!(shape, vec![1, Config::preset_tiny().vocab]);
    // Overwrites an existing file.
    let out = cqlm(
        dir.path(),
        &[
            "logits",
            "--model",
            "m.cqlm",
            "--ids",
            "9,9",
            "--all-positions",
            "--backend",
            "cpu",
            "--out",
            "sub/out.bin",
        ],
    );
    assert_ok(&out, "logits overwrite");
    let (shape, _) = read_npy(&dir.path().join("sub/out.bin"));
    assert_eq!(shape, vec![2, Config::preset_tiny().vocab]);
}

// ---------------------------------------------------------------------------
// Error cases (SPEC §7): non-zero exit, one `error:` line, no panic, no file.

fn assert_error_prefix(out: &Output, what: &str) -> String {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{what}: exited 0; stderr: {err}");
    assert!(err.starts_with("error:"), "{what}: stderr: {err}");
    assert!(!err.contains("panicked"), "{what}: stderr: {err}");
    // Argument errors from clap are folded into one line too.
    assert_eq!(err.lines().count(), 1, "{what}: stderr: {err}");
    assert!(
        out.stdout.is_empty(),
        "{what}: stdout: {}",
        text(&out.stdout)
    );
    err
}

fn assert_one_line_error(out: &Output, what: &str) -> String {
    let err = assert_error_prefix(out, what);
    assert_eq!(err.lines().count(), 1, "{what}: stderr: {err}");
    assert!(err.ends_with('\n'), "{what}");
    err
}

/// Run `logits` with `args` (plus `--out y.npy`) and check it fails without writing anything.
fn logits_fails(dir: &Path, args: &[&str], one_line: bool) -> String {
    let before = listing(dir);
    let mut full = vec!["logits"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["--out", "y.npy"]);
    let out = cqlm(dir, &full);
    let what = format!("{full:?}");
    let err = if one_line {
        assert_one_line_error(&out, &what)
    } else {
        assert_error_prefix(&out, &what)
    };
    assert_eq!(listing(dir), before, "{what}: files changed");
    assert!(!dir.join("y.npy").exists());
    err
}

#[test]
fn logits_token_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), 3, "m.cqlm");
    let vocab = Config::preset_tiny().vocab;
    for ids in [
        format!("{vocab}"),
        format!("1,2,{vocab}"),
        format!("{},5", vocab + 1000),
    ] {
        let err = logits_fails(
            dir.path(),
            &["--model", "m.cqlm", "--ids", &ids, "--backend", "cpu"],
            true,
        );
        assert!(err.contains(&vocab.to_string()), "{err}");
    }
    // Also with --all-positions and the default backend.
    logits_fails(
        dir.path(),
        &[
            "--model",
            "m.cqlm",
            "--ids",
            &format!("3,{vocab}"),
            "--all-positions",
        ],
        true,
    );
    // The largest valid id is fine.
    let out = cqlm(
        dir.path(),
        &[
            "logits",
            "--model",
            "m.cqlm",
            "--ids",
            &(vocab - 1).to_string(),
            "--out",
            "ok.npy",
        ],
    );
    assert_ok(&out, "id vocab-1");
}

#[test]
fn logits_nonexistent_model() {
    let dir = tempfile::tempdir().unwrap();
    let err = logits_fails(dir.path(), &["--model", "missing.cqlm", "--ids", "1"], true);
    assert!(err.contains("missing.cqlm"), "{err}");
}

#[test]
fn logits_model_is_a_directory_or_empty() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("d.cqlm")).unwrap();
    let err = logits_fails(dir.path(), &["--model", "d.cqlm", "--ids", "1"], true);
    assert!(err.contains("d.cqlm"), "{err}");
    std::fs::write(dir.path().join("empty.cqlm"), b"").unwrap();
    let err = logits_fails(dir.path(), &["--model", "empty.cqlm", "--ids", "1"], true);
    assert!(err.contains("empty.cqlm"), "{err}");
}

#[test]
fn logits_corrupt_archive() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), 3, "m.cqlm");
    let bytes = std::fs::read(&model).unwrap();
    // Truncated.
    std::fs::write(dir.path().join("cut.cqlm"), &bytes[..bytes.len() - 100]).unwrap();
    let err = logits_fails(dir.path(), &["--model", "cut.cqlm", "--ids", "1,2"], true);
    assert!(err.contains("cut.cqlm"), "{err}");
    // Header length prefix garbled.
    let mut garbled = bytes.clone();
    garbled[7] = 0x7f;
    std::fs::write(dir.path().join("garbled.cqlm"), &garbled).unwrap();
    let err = logits_fails(dir.path(), &["--model", "garbled.cqlm", "--ids", "1"], true);
    assert!(err.contains("garbled.cqlm"), "{err}");
    // A tensor missing: the message names it.
    let mut t =
        cqlm::make::synth::synth_tensors(&Config::preset_tiny(), &plan_for_preset("tiny"), 3);
    t.remove("layers.2.wv");
    cqlm::archive::write_archive_file(
        &dir.path().join("missing.cqlm"),
        &Config::preset_tiny(),
        None,
        &t,
    )
    .unwrap();
    let err = logits_fails(dir.path(), &["--model", "missing.cqlm", "--ids", "1"], true);
    assert!(err.contains("layers.2.wv"), "{err}");
}

#[test]
fn logits_bad_ids() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), 3, "m.cqlm");
    for ids in [
        "",
        "1,,2",
        ",1",
        "1,",
        "1 ,2",
        "+1",
        "0x10",
        "1.0",
        "99999999999",
        "4294967296",
        "abc",
    ] {
        logits_fails(dir.path(), &["--model", "m.cqlm", "--ids", ids], false);
        let eq = format!("--ids={ids}");
        logits_fails(dir.path(), &["--model", "m.cqlm", &eq], false);
    }
    // A negative id, as a separate argument and attached.
    logits_fails(dir.path(), &["--model", "m.cqlm", "--ids", "-1"], false);
    logits_fails(dir.path(), &["--model", "m.cqlm", "--ids=-1"], false);
    logits_fails(dir.path(), &["--model", "m.cqlm", "--ids=1,-2"], false);
    // Missing --ids altogether.
    logits_fails(dir.path(), &["--model", "m.cqlm"], false);
}

#[test]
fn logits_output_in_missing_directory() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), 3, "m.cqlm");
    let before = listing(dir.path());
    let out = cqlm(
        dir.path(),
        &[
            "logits",
            "--model",
            "m.cqlm",
            "--ids",
            "1,2",
            "--out",
            "nodir/y.npy",
        ],
    );
    let err = assert_one_line_error(&out, "nodir/y.npy");
    assert!(err.contains("nodir"), "{err}");
    assert_eq!(listing(dir.path()), before);
    assert!(!dir.path().join("nodir").exists());
}

#[test]
fn logits_output_path_is_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), 3, "m.cqlm");
    std::fs::create_dir(dir.path().join("out.npy")).unwrap();
    let before = listing(dir.path());
    let out = cqlm(
        dir.path(),
        &[
            "logits", "--model", "m.cqlm", "--ids", "1", "--out", "out.npy",
        ],
    );
    assert_one_line_error(&out, "--out is a directory");
    assert_eq!(listing(dir.path()), before);
    assert!(listing(&dir.path().join("out.npy")).is_empty());
}

// ---------------------------------------------------------------------------
// inspect, generate, bench.

#[test]
fn inspect_prints_vocab_and_histogram() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), 3, "m.cqlm");
    let out = cqlm(dir.path(), &["inspect", "m.cqlm"]);
    assert_ok(&out, "inspect");
    let stdout = text(&out.stdout);
    let c = Config::preset_tiny();
    assert!(stdout.contains(&format!("vocab {}", c.vocab)), "{stdout}");
    // The (bits, group) histogram, computed here from the archive.
    let raw = read_archive_file(&model).unwrap();
    let mut hist: BTreeMap<(u32, usize), usize> = BTreeMap::new();
    for t in raw.tensors.values() {
        if let Tensor::Cq(m) = t {
            *hist.entry((m.bits(), m.group())).or_default() += 1;
        }
    }
    assert!(hist.len() >= 4, "the mixed plan uses every bit width");
    for ((bits, group), n) in &hist {
        let want = [bits.to_string(), group.to_string(), n.to_string()];
        let found = stdout.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() >= 3 && w[..3] == want
        });
        assert!(found, "no histogram row {want:?} in\n{stdout}");
    }
}

#[test]
fn inspect_rejects_a_broken_archive() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x.cqlm"), b"\x08\0\0\0\0\0\0\0{}      ").unwrap();
    let out = cqlm(dir.path(), &["inspect", "x.cqlm"]);
    let err = assert_one_line_error(&out, "inspect broken");
    assert!(
        err.contains("x.cqlm") && err.contains("cqlm.config"),
        "{err}"
    );
}

#[test]
fn generate_greedy_from_preset() {
    // `generate` samples by default: `--temperature 0` is the argmax chain.
    // Prompt 1,2 meets EOS at once (nothing printed); 5,9 runs 5 tokens.
    let dir = tempfile::tempdir().unwrap();
    let c = Config::preset_tiny();
    let model = Arc::new(synth_model(&c, &plan_for_preset("tiny"), 11).unwrap());
    let mut lengths = Vec::new();
    for prompt in [[1u32, 2], [5, 9]] {
        let arg = format!("{},{}", prompt[0], prompt[1]);
        let out = cqlm(
            dir.path(),
            &[
                "generate",
                "--preset",
                "tiny",
                "--weights-seed",
                "11",
                "--ids",
                &arg,
                "--max-tokens",
                "5",
                "--temperature",
                "0",
                "--backend",
                "cpu",
            ],
        );
        assert_ok(&out, "generate");
        let ids: Vec<u32> = text(&out.stdout)
            .split_whitespace()
            .map(|s| s.parse().expect("an id"))
            .collect();
        assert!(ids.len() <= 5, "{ids:?}");
        assert!(ids.iter().all(|&i| (i as usize) < c.vocab));
        // EOS ends generation and is not printed.
        assert!(ids.iter().all(|&i| i != c.eos), "{ids:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains("random weights"), "{stderr}");

        // The same greedy loop through the library.
        let mut e = CpuEngine::new(Arc::clone(&model)).unwrap();
        let mut logits = e.prefill(&prompt).unwrap();
        let mut want = Vec::new();
        while want.len() < 5 {
            let next = argmax(&logits);
            if next == c.eos {
                break;
            }
            want.push(next);
            logits = e.logits_after(next);
        }
        assert_eq!(ids, want, "prompt {prompt:?}");
        lengths.push(ids.len());
    }
    // Both ends of the loop were seen: an EOS stop and the token limit.
    assert_eq!(lengths, [0, 5]);
}

#[test]
fn generate_from_archive_and_bad_ids() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), 3, "m.cqlm");
    let out = cqlm(
        dir.path(),
        &[
            "generate",
            "--model",
            "m.cqlm",
            "--ids",
            "4",
            "--max-tokens",
            "3",
            "--backend",
            "cpu",
        ],
    );
    assert_ok(&out, "generate --model");
    assert!(!text(&out.stderr).contains("random weights"));
    let n = text(&out.stdout).split_whitespace().count();
    assert!((1..=3).contains(&n));

    let out = cqlm(
        dir.path(),
        &[
            "generate",
            "--model",
            "m.cqlm",
            "--ids",
            "256",
            "--backend",
            "cpu",
        ],
    );
    assert_error_prefix(&out, "generate id 256");
    let err = text(&out.stderr);
    assert!(err.contains("256") && !err.contains("panicked"), "{err}");
}

/// `cqlm bench --preset tiny --backend cpu --reps 1 --json` plus `extra`, parsed.
fn bench_json(extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "bench",
        "--preset",
        "tiny",
        "--backend",
        "cpu",
        "--reps",
        "1",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = cqlm(dir.path(), &args);
    assert_ok(&out, "bench");
    serde_json::from_str(text(&out.stdout).trim()).expect("one JSON object")
}

#[test]
fn bench_json_has_the_documented_keys() {
    let v = bench_json(&["--prompt-len", "8", "--tokens", "4"]);
    let o = v.as_object().expect("an object");
    for key in [
        "decode_tok_s",
        "prefill_tok_s",
        "dispatches_per_token",
        "host_us_per_token",
        "peak_rss_bytes",
        "gpu_buffer_bytes",
    ] {
        assert!(o.contains_key(key), "missing {key} in {v}");
    }
    // The CPU's host does all the work: no separate host cost.
    assert!(o["host_us_per_token"].is_null(), "{v}");
    for key in ["decode_tok_s", "prefill_tok_s"] {
        let x = o[key].as_f64().expect(key);
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
    assert!(o["peak_rss_bytes"].as_u64().expect("peak_rss_bytes") > 0);
    assert!(o["gpu_buffer_bytes"].is_u64());
    let d = &o["dispatches_per_token"];
    assert!(d.is_null() || d.is_u64() || d.is_f64(), "{d}");
}

#[test]
fn bench_sequences_reports_each_batch_against_one() {
    let v = bench_json(&["--prompt-len", "4", "--tokens", "3", "--sequences", "1,3"]);
    let rows = v["batched"].as_array().expect("batched rows");
    assert_eq!(rows.len(), 2, "{v}");
    assert!(v["backend"].as_str().unwrap().starts_with("cpu"), "{v}");
    for (row, n) in rows.iter().zip([1.0, 3.0]) {
        assert_eq!(row["sequences"].as_f64(), Some(n), "{v}");
        let agg = row["aggregate_tok_s"].as_f64().unwrap();
        assert!(agg.is_finite() && agg > 0.0, "{v}");
        let per = row["per_sequence_tok_s"].as_f64().unwrap();
        assert!((per * n - agg).abs() <= 1e-9 * agg, "{v}");
        let ms = row["ms_per_pass"].as_f64().unwrap();
        assert!((ms * agg / 1e3 - n).abs() <= 1e-9 * n, "{v}");
    }
    assert_eq!(rows[0]["vs_one"].as_f64(), Some(1.0));
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "bench",
        "--preset",
        "tiny",
        "--backend",
        "cpu",
        "--sequences",
        "2,0",
    ];
    assert_one_line_error(&cqlm(dir.path(), &args), "bench --sequences 2,0");
}

#[test]
fn bench_rejects_zero_reps() {
    let dir = tempfile::tempdir().unwrap();
    let out = cqlm(
        dir.path(),
        &[
            "bench",
            "--preset",
            "tiny",
            "--backend",
            "cpu",
            "--reps",
            "0",
        ],
    );
    assert_one_line_error(&out, "bench --reps 0");
}

#[test]
fn unknown_preset_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = cqlm(
        dir.path(),
        &["synth", "--preset", "huge", "--out", "x.cqlm"],
    );
    assert_one_line_error(&out, "synth --preset huge");
    assert!(!dir.path().join("x.cqlm").exists());
}

#[test]
fn bench_soak_reports_memory_and_every_window_of_a_long_run() {
    // 3,000 tiny CPU tokens (well past sink + window): memory at token 1,000 and
    // at the end, and one ms/token figure per window of 1,000 tokens.
    let v = bench_json(&["--prompt-len", "4", "--tokens", "3000"]);
    let s = v["soak"]
        .as_object()
        .expect("a soak object for >= 2,000 tokens");
    let windows = s["ms_per_token_per_1000"].as_array().expect("windows");
    assert_eq!(windows.len(), 3, "{s:?}");
    assert!(windows.iter().all(|w| w.as_f64().is_some_and(|x| x > 0.0)));
    let (a, b) = (
        s["rss_bytes_at_1000"].as_u64().unwrap(),
        s["rss_bytes_at_end"].as_u64().unwrap(),
    );
    assert!(a > 0 && b > 0);
    // Everything is allocated before the first token: RSS within 1% (plus a page).
    assert!(
        (b as f64) <= a as f64 * 1.01 + 4096.0,
        "RSS grew from {a} to {b}"
    );
}

#[test]
fn fast_precision_costs_at_most_0_3_percent_of_held_out_bits_per_byte() {
    // SPEC §6.1's bound for a trained model, on the built-in model and a
    // held-out prefix; eval defaults to exact, bench to fast (on the CPU).
    let dir = tempfile::tempdir().unwrap();
    let heldout = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/train/heldout.txt");
    let eval = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "eval",
            "--text",
            heldout,
            "--max-tokens",
            "1500",
            "--json",
            "--backend",
            "cpu",
        ];
        args.extend_from_slice(extra);
        let out = cqlm(dir.path(), &args);
        assert_ok(&out, "eval");
        serde_json::from_str(text(&out.stdout).trim()).expect("one JSON object")
    };
    let exact = eval(&[]);
    let fast = eval(&["--precision", "fast"]);
    assert!(
        exact["backend"]
            .as_str()
            .unwrap()
            .contains("exact precision"),
        "{exact}"
    );
    assert!(
        fast["backend"].as_str().unwrap().contains("fast precision"),
        "{fast}"
    );
    let (e, f) = (
        exact["bits_per_byte"].as_f64().unwrap(),
        fast["bits_per_byte"].as_f64().unwrap(),
    );
    eprintln!(
        "bits per byte: exact {e:.5}, fast {f:.5} ({:+.3}%)",
        (f / e - 1.0) * 100.0
    );
    assert!(f <= e * 1.003, "fast {f} vs exact {e}");
    assert_ne!(
        f, e,
        "fast and exact gave the same figure: is fast running?"
    );
    let b = bench_json(&["--prompt-len", "8", "--tokens", "4"]);
    assert_eq!(b["precision"], "fast", "{b}");
}

#[test]
fn fast_precision_on_the_gpu_says_the_gpu_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "bench",
        "--preset",
        "tiny",
        "--backend",
        "gpu",
        "--precision",
        "fast",
        "--reps",
        "1",
        "--tokens",
        "2",
        "--prompt-len",
        "2",
        "--json",
    ];
    let out = cqlm(dir.path(), &args);
    if !out.status.success() && std::env::var_os("CQLM_REQUIRE_GPU").is_none() {
        return; // no adapter here
    }
    assert_ok(&out, "bench --backend gpu --precision fast");
    let err = text(&out.stderr);
    assert!(
        err.contains("the gpu engine computes exact arithmetic"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["precision"], "exact", "{v}");
}
