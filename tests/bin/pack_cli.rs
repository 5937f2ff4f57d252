//! `cqlm pack`: float checkpoint → archive, from outside. What `cqlm inspect`
//! reports of the result, the config from the checkpoint or the flag, rejections
//! of broken checkpoints (one `error:` line), tool-call markers and a chat
//! template stored, and `cqlm synth --float`. (The packed model's accuracy is
//! `tests/lib/pack.rs`.)

use cqlm::archive::{
    expected_tensors, read_archive_file, read_float_checkpoint, write_float_checkpoint, FloatDtype,
    FloatTensor, TensorKind,
};
use cqlm::make::pack::PackPlan;
use cqlm::make::synth::synth_float_tensors;
use cqlm::{Config, Model};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::cli::{assert_ok, cqlm, text};

/// A failure: non-zero exit, exactly one stderr line, starting `error:`; returns it.
fn assert_one_error(out: &Output, what: &str) -> String {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{what}: succeeded\n{err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: want one stderr line, got {err:?}");
    assert!(lines[0].starts_with("error: "), "{what}: {err:?}");
    lines[0].to_string()
}

/// Expected `(bits, group) → (matrices, weights)` of a pack, from the spec and the plan.
fn expected_histogram(
    c: &Config,
    floats: &BTreeMap<String, FloatTensor>,
    plan: &PackPlan,
) -> BTreeMap<(u32, usize), (usize, usize)> {
    let mut hist = BTreeMap::new();
    for spec in expected_tensors(c) {
        if let TensorKind::Cq { cols, .. } = spec.kind {
            let e: &mut (usize, usize) = hist
                .entry((plan.bits_for(&spec.name), plan.group_for(cols)))
                .or_default();
            e.0 += 1;
            e.1 += floats[&spec.name].data.len();
        }
    }
    hist
}

/// The `bits group matrices weights` table of `cqlm inspect`.
fn inspect_histogram(stdout: &str) -> BTreeMap<(u32, usize), (usize, usize)> {
    let mut lines = stdout.lines().skip_while(|l| !l.starts_with("bits"));
    lines.next().expect("histogram header");
    lines
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<usize> = l
                .split_whitespace()
                .map(|x| x.parse().expect("number"))
                .collect();
            assert_eq!(f.len(), 4, "{l}");
            ((f[0] as u32, f[1]), (f[2], f[3]))
        })
        .collect()
}

/// A minimal Hugging Face word-level tokenizer.
const TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"<unk>":0,"<s>":1,"</s>":2,"hello":3,"world":4},"unk_token":"<unk>"}}"#;

#[test]
fn inspect_reports_what_pack_was_asked() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert_ok(
        &cqlm(
            d,
            &[
                "synth",
                "--float",
                "--preset",
                "tiny",
                "--seed",
                "5",
                "--out",
                "f.safetensors",
            ],
        ),
        "synth --float",
    );
    std::fs::write(d.join("tok.json"), TOKENIZER).unwrap();
    let bits = "embed=8,attn=2,phi=4,engram=1,attn_o=4";
    let out = cqlm(
        d,
        &[
            "pack",
            "--model",
            "f.safetensors",
            "--bits",
            bits,
            "--group",
            "64",
            "--tokenizer",
            "tok.json",
            "--out",
            "p.cqlm",
        ],
    );
    assert_ok(&out, "pack");
    let c = Config::preset_tiny();
    let mut plan = PackPlan::standard().with_bits(bits).unwrap();
    plan.group = 64;
    let floats = read_float_checkpoint(&d.join("f.safetensors"), None)
        .unwrap()
        .tensors;

    // The report: one row per CQ matrix with its bits and group, then the totals.
    let report = text(&out.stdout);
    let cq: Vec<_> = expected_tensors(&c)
        .into_iter()
        .filter_map(|s| match s.kind {
            TensorKind::Cq { cols, .. } => Some((s.name, cols)),
            _ => None,
        })
        .collect();
    for (name, cols) in &cq {
        let row = report
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("no report row for {name}:\n{report}"));
        let f: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(f.len(), 6, "{row}");
        let rows = floats[name].shape[0];
        assert_eq!(f[1], format!("{rows}×{cols}"), "{row}");
        assert_eq!(f[2], plan.bits_for(name).to_string(), "{row}");
        assert_eq!(f[3], plan.group_for(*cols).to_string(), "{row}");
        let mse: f64 = f[4].parse().unwrap();
        assert!(mse > 0.0 && mse < 0.5, "{row}");
    }
    let total = report
        .lines()
        .find(|l| l.starts_with("total:"))
        .expect("totals line");
    assert!(
        total.contains(&format!("{} CQ matrices", cq.len())),
        "{total}"
    );
    let bpw: f64 = total
        .split(", ")
        .find_map(|p| p.strip_suffix(" bits per weight"))
        .expect("bits per weight")
        .parse()
        .unwrap();
    assert!(bpw > 1.0 && bpw < 10.0, "{total}");
    let archive_bytes = std::fs::metadata(d.join("p.cqlm")).unwrap().len();
    assert!(
        report.contains(&format!("({archive_bytes} bytes)")),
        "{report}"
    );

    // inspect: the bits/group histogram is exactly the plan's.
    let out = cqlm(d, &["inspect", "p.cqlm"]);
    assert_ok(&out, "inspect");
    let stdout = text(&out.stdout);
    assert_eq!(
        inspect_histogram(&stdout),
        expected_histogram(&c, &floats, &plan),
        "{stdout}"
    );
    assert!(stdout.contains("tokenizer embedded"), "{stdout}");
    let raw = read_archive_file(&d.join("p.cqlm")).unwrap();
    assert_eq!(raw.config, c);
    assert_eq!(raw.tokenizer.as_deref(), Some(TOKENIZER));
}

#[test]
fn config_comes_from_the_checkpoint_or_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let c = Config::preset_tiny();
    let floats = synth_float_tensors(&c, 8);
    write_float_checkpoint(&d.join("bare.safetensors"), None, &floats, FloatDtype::F16).unwrap();
    let err = assert_one_error(
        &cqlm(
            d,
            &["pack", "--model", "bare.safetensors", "--out", "a.cqlm"],
        ),
        "no config",
    );
    assert!(err.contains("--config"), "{err}");
    assert!(!d.join("a.cqlm").exists());

    std::fs::write(d.join("c.json"), c.to_json()).unwrap();
    let out = cqlm(
        d,
        &[
            "pack",
            "--model",
            "bare.safetensors",
            "--config",
            "c.json",
            "--bits",
            "all=4",
            "--group",
            "32",
            "--out",
            "a.cqlm",
        ],
    );
    assert_ok(&out, "pack --config");
    let model = Model::load(&d.join("a.cqlm")).unwrap();
    assert_eq!(model.config, c);
    assert!(model.tokenizer.is_none());

    // A config that does not fit the tensors: the first mismatching tensor is named.
    let other = Config {
        hidden: 96,
        ..c.clone()
    };
    std::fs::write(d.join("other.json"), other.to_json()).unwrap();
    let err = assert_one_error(
        &cqlm(
            d,
            &[
                "pack",
                "--model",
                "bare.safetensors",
                "--config",
                "other.json",
                "--out",
                "b.cqlm",
            ],
        ),
        "mismatched config",
    );
    assert!(
        err.contains("bare.safetensors") && err.contains("`embed`"),
        "{err}"
    );
    assert!(!d.join("b.cqlm").exists());
}

/// Write a broken variant of a good checkpoint, pack it, expect one `error:` line
/// naming the file and the tensor, and no output.
fn expect_pack_error(
    dir: &Path,
    file: &str,
    tensors: &BTreeMap<String, FloatTensor>,
    name: &str,
    what: &str,
) {
    let c = Config::preset_tiny();
    write_float_checkpoint(&dir.join(file), Some(&c), tensors, FloatDtype::F32).unwrap();
    let out = cqlm(dir, &["pack", "--model", file, "--out", "out.cqlm"]);
    let err = assert_one_error(&out, file);
    assert!(
        err.contains(file) && err.contains(&format!("`{name}`")) && err.contains(what),
        "{file}: {err}"
    );
    assert!(!dir.join("out.cqlm").exists(), "{file}: wrote an archive");
    assert!(out.stdout.is_empty(), "{file}: {}", text(&out.stdout));
}

#[test]
fn broken_float_checkpoints_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = synth_float_tensors(&Config::preset_tiny(), 6);

    let mut t = good.clone();
    t.remove("layers.2.wv");
    expect_pack_error(d, "missing.safetensors", &t, "layers.2.wv", "missing");

    let mut t = good.clone();
    let wq = t.get_mut("layers.1.wq").unwrap();
    wq.shape = vec![64, 79];
    wq.data.truncate(64 * 79);
    expect_pack_error(d, "shape.safetensors", &t, "layers.1.wq", "[64, 80]");

    let mut t = good.clone();
    t.get_mut("layers.3.wg").unwrap().data[100] = f32::NAN;
    expect_pack_error(d, "nan.safetensors", &t, "layers.3.wg", "not finite");

    let mut t = good.clone();
    t.get_mut("final_norm").unwrap().data[5] = f32::NEG_INFINITY;
    expect_pack_error(d, "inf.safetensors", &t, "final_norm", "not finite");

    let mut t = good.clone();
    t.insert("lm_head".into(), t["embed"].clone());
    expect_pack_error(d, "unknown.safetensors", &t, "lm_head", "unknown");

    let mut t = good.clone();
    let e = t.get_mut("engram.table.2.0").unwrap();
    e.shape = vec![0, 24];
    e.data.clear();
    expect_pack_error(
        d,
        "table.safetensors",
        &t,
        "engram.table.2.0",
        "[T >= 1, 24]",
    );

    // Nothing but the inputs is left in the folder (no temporary files).
    let mut names: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(
        names.iter().all(|n| n.ends_with(".safetensors")),
        "{names:?}"
    );

    // Bad options are one `error:` line too.
    write_float_checkpoint(
        &d.join("good.safetensors"),
        Some(&Config::preset_tiny()),
        &good,
        FloatDtype::F32,
    )
    .unwrap();
    for (bits, group, what) in [
        ("embed=3", "128", "1, 2, 4 or 8"),
        ("embed4", "128", "CLASS=BITS"),
        ("lm_head=4", "128", "unknown class"),
        ("all=4", "48", "power of two"),
    ] {
        let out = cqlm(
            d,
            &[
                "pack",
                "--model",
                "good.safetensors",
                "--bits",
                bits,
                "--group",
                group,
                "--out",
                "out.cqlm",
            ],
        );
        let err = assert_one_error(&out, bits);
        assert!(err.contains(what), "{bits} {group}: {err}");
        assert!(!d.join("out.cqlm").exists());
    }
}

fn synth_float(dir: &Path, seed: u64, extra: &[&str], name: &str) -> PathBuf {
    let seed = seed.to_string();
    let mut args = vec![
        "synth", "--float", "--preset", "tiny", "--seed", &seed, "--out", name,
    ];
    args.extend_from_slice(extra);
    assert_ok(&cqlm(dir, &args), "synth --float");
    dir.join(name)
}

#[test]
fn synth_float_is_deterministic_per_seed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = std::fs::read(synth_float(d, 7, &[], "a.safetensors")).unwrap();
    let b = std::fs::read(synth_float(d, 7, &[], "b.safetensors")).unwrap();
    let c = std::fs::read(synth_float(d, 8, &[], "c.safetensors")).unwrap();
    assert_eq!(a, b, "same seed, different bytes");
    assert_ne!(a, c, "different seeds, same bytes");

    // What it holds: the library's tensors for that seed, with unit-ish scales.
    let config = Config::preset_tiny();
    let ckpt = read_float_checkpoint(&d.join("a.safetensors"), None).unwrap();
    assert_eq!(ckpt.config, config);
    assert_eq!(ckpt.tensors, synth_float_tensors(&config, 7));
    let rms = |v: &[f32]| (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
    let wq = &ckpt.tensors["layers.0.wq"];
    assert_eq!(wq.shape, vec![config.q_dim(), config.hidden]);
    let want = 1.0 / (config.hidden as f32).sqrt();
    assert!(
        (rms(&wq.data) / want - 1.0).abs() < 0.1,
        "{}",
        rms(&wq.data)
    );
    let table = &ckpt.tensors["engram.table.2.0"];
    assert!((rms(&table.data) - 1.0).abs() < 0.1);

    // A bf16 checkpoint is half the size and packs.
    let h = synth_float(d, 7, &["--dtype", "bf16"], "h.safetensors");
    let hb = std::fs::metadata(&h).unwrap().len() as f64;
    assert!(
        (hb / a.len() as f64 - 0.5).abs() < 0.05,
        "{hb} vs {}",
        a.len()
    );
    let out = cqlm(d, &["pack", "--model", "h.safetensors", "--out", "h.cqlm"]);
    assert_ok(&out, "pack bf16");
    Model::load(&d.join("h.cqlm")).unwrap();
}

#[test]
fn pack_stores_tool_call_markers_and_a_chat_template() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    synth_float(d, 9, &[], "f.safetensors");
    std::fs::write(
        d.join("t.jinja"),
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    .unwrap();
    let out = cqlm(
        d,
        &[
            "pack",
            "--model",
            "f.safetensors",
            "--chat-template",
            "t.jinja",
            "--tool-call-markers",
            "[[call]]",
            "[[/call]]",
            "--out",
            "p.cqlm",
        ],
    );
    assert_ok(&out, "pack");
    let m = cqlm::Model::load(&d.join("p.cqlm")).unwrap();
    assert_eq!(
        m.chat_template.as_deref(),
        Some("{% for m in messages %}{{ m.content }}{% endfor %}")
    );
    let markers = m.tool_markers;
    assert_eq!(
        (markers.start.as_str(), markers.end.as_str()),
        ("[[call]]", "[[/call]]")
    );
    // An empty marker is refused before anything is written.
    let out = cqlm(
        d,
        &[
            "pack",
            "--model",
            "f.safetensors",
            "--tool-call-markers",
            "",
            "x",
            "--out",
            "q.cqlm",
        ],
    );
    let err = assert_one_error(&out, "empty marker");
    assert!(
        err.contains("--tool-call-markers: a marker is empty"),
        "{err}"
    );
    assert!(!d.join("q.cqlm").exists());
}

/// The `__metadata__` keys of a safetensors file, in the order its header text
/// holds them (found in the text itself, so the check does not depend on whether
/// serde_json keeps a map's order).
fn metadata_keys(bytes: &[u8]) -> Vec<String> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let text = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    let header: serde_json::Value = serde_json::from_str(text).unwrap();
    let meta = header["__metadata__"].as_object().unwrap();
    let start = text.find("\"__metadata__\":{").unwrap();
    let mut keys: Vec<(usize, String)> = meta
        .keys()
        .map(|k| {
            (
                start + text[start..].find(&format!("\"{k}\":")).unwrap(),
                k.clone(),
            )
        })
        .collect();
    keys.sort();
    keys.into_iter().map(|(_, k)| k).collect()
}

/// The same checkpoint and flags give the same archive bytes in every process
/// (safetensors writes its metadata map in a per-process random order; the writer
/// sorts it), so a packed model's checksum is reproducible; `synth` likewise.
#[test]
fn pack_and_synth_write_the_same_bytes_every_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("tok.json"), TOKENIZER).unwrap();
    std::fs::write(
        d.join("chat.jinja"),
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    .unwrap();
    let mut packs = Vec::new();
    let mut synths = Vec::new();
    for run in 0..3 {
        let (f, p) = (format!("f{run}.safetensors"), format!("p{run}.cqlm"));
        let synth = [
            "synth", "--float", "--preset", "tiny", "--seed", "5", "--out", &f,
        ];
        assert_ok(&cqlm(d, &synth), "synth --float");
        let out = cqlm(
            d,
            &[
                "pack",
                "--model",
                &f,
                "--tokenizer",
                "tok.json",
                "--chat-template",
                "chat.jinja",
                "--tool-call-markers",
                "<a>",
                "</a>",
                "--out",
                &p,
            ],
        );
        assert_ok(&out, "pack");
        packs.push(std::fs::read(d.join(&p)).unwrap());
        synths.push(std::fs::read(d.join(&f)).unwrap());
    }
    let keys = metadata_keys(&packs[0]);
    assert_eq!(keys.len(), 4, "{keys:?}");
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    for run in 1..3 {
        assert!(packs[run] == packs[0], "pack run {run} wrote other bytes");
        assert!(
            synths[run] == synths[0],
            "synth run {run} wrote other bytes"
        );
    }
    // And the archive still reads back whole.
    let raw = read_archive_file(&d.join("p0.cqlm")).unwrap();
    assert_eq!(raw.tokenizer.as_deref(), Some(TOKENIZER));
    assert_eq!(raw.config, Config::preset_tiny());
    assert_eq!(
        raw.chat_template.as_deref(),
        Some("{% for m in messages %}{{ m.content }}{% endfor %}")
    );
    assert_eq!(
        raw.tool_markers.map(|m| (m.start, m.end)),
        Some(("<a>".into(), "</a>".into()))
    );
}
