//! SPEC §1, §2, §3 and §5: every way an archive can be rejected. Each test
//! checks the error kind and that its message names the file and the tensor or
//! field at fault; the fuzz tests check that no truncation or header corruption
//! makes the reader panic.

use cqlm::archive::{read_archive, write_archive, Tensor, CONFIG_KEY};
use cqlm::cq::BitsPlan;
use cqlm::make::synth::{synth_archive, synth_tensors};
use cqlm::{ArchiveError, Config, ConfigError, CpuEngine, Engine, Error, Model};
use half::f16;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

const SRC: &str = "broken.cqlm";

fn tiny() -> Config {
    Config::preset_tiny()
}

fn tiny_tensors() -> BTreeMap<String, Tensor> {
    synth_tensors(&tiny(), &BitsPlan::mixed(), 1)
}

/// Read `bytes` as an archive named [`SRC`], expecting a rejection; returns the
/// kind and the Display message (which must name the file).
fn reject(bytes: &[u8]) -> (ArchiveError, String) {
    match read_archive(bytes, SRC) {
        Ok(_) => panic!("the archive was accepted"),
        Err(e) => {
            let msg = e.to_string();
            match e {
                Error::Archive { archive, kind } => {
                    assert_eq!(archive, SRC);
                    assert!(msg.contains(SRC), "message does not name the file: {msg}");
                    (kind, msg)
                }
                other => panic!("expected Error::Archive, got {other:?}"),
            }
        }
    }
}

fn assert_names(msg: &str, what: &str) {
    assert!(msg.contains(what), "message does not name `{what}`: {msg}");
}

// ---------------------------------------------------------------------------
// A hand-made safetensors encoder, so tests can store any dtype, shape, gap or
// header text the library's writer would never produce.

#[derive(Clone, Debug)]
struct Raw {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Raw {
    fn new(name: &str, dtype: &'static str, shape: Vec<usize>, data: Vec<u8>) -> Raw {
        Raw {
            name: name.to_string(),
            dtype,
            shape,
            data,
        }
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
        .collect()
}

/// The stored tensors of `tensors`, as the library's writer lays them out.
fn to_raw(tensors: &BTreeMap<String, Tensor>) -> Vec<Raw> {
    let mut out = Vec::new();
    for (name, t) in tensors {
        match t {
            Tensor::F32 { shape, data } => {
                out.push(Raw::new(name, "F32", shape.clone(), f32_bytes(data)))
            }
            Tensor::Cq(m) => {
                out.push(Raw::new(
                    &format!("{name}.codebook"),
                    "F32",
                    vec![m.codebook().len()],
                    f32_bytes(m.codebook()),
                ));
                out.push(Raw::new(
                    &format!("{name}.norms"),
                    "F16",
                    vec![m.rows(), m.groups()],
                    f16_bytes(m.norms()),
                ));
                out.push(Raw::new(
                    &format!("{name}.packed"),
                    "U8",
                    vec![m.rows(), m.row_bytes()],
                    m.packed().to_vec(),
                ));
            }
        }
    }
    out
}

fn tiny_raw() -> Vec<Raw> {
    to_raw(&tiny_tensors())
}

fn config_meta(config: &Config) -> Vec<(String, String)> {
    vec![(CONFIG_KEY.to_string(), config.to_json())]
}

/// The 8-byte length plus `header` padded with spaces to a multiple of 8.
fn frame(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

/// A safetensors file: contiguous offsets in the order of `tensors`.
fn encode(meta: Option<&[(String, String)]>, tensors: &[Raw]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if let Some(meta) = meta {
        let m: serde_json::Map<String, Value> = meta
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        header.insert("__metadata__".into(), Value::Object(m));
    }
    let mut data = Vec::new();
    for t in tensors {
        let start = data.len();
        data.extend_from_slice(&t.data);
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [start, data.len()]}),
        );
    }
    frame(&Value::Object(header).to_string(), &data)
}

fn encode_tiny(tensors: &[Raw]) -> Vec<u8> {
    encode(Some(&config_meta(&tiny())), tensors)
}

fn replace(tensors: &mut [Raw], name: &str, dtype: &'static str, shape: Vec<usize>, data: Vec<u8>) {
    let t = tensors
        .iter_mut()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"));
    t.dtype = dtype;
    t.shape = shape;
    t.data = data;
}

fn find<'a>(tensors: &'a [Raw], name: &str) -> &'a Raw {
    tensors
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"))
}

// ---------------------------------------------------------------------------
// Baselines: the unmodified inputs are accepted, so every rejection below is
// caused by the one change each test makes.

#[test]
fn baselines_are_accepted() {
    let bytes = write_archive(&tiny(), None, &tiny_tensors()).unwrap();
    let raw = read_archive(&bytes, SRC).unwrap();
    assert_eq!(raw.config, tiny());
    Model::from_bytes(&bytes, SRC).unwrap();

    let hand = encode_tiny(&tiny_raw());
    let raw2 = read_archive(&hand, SRC).unwrap();
    assert_eq!(raw2.tensors.len(), raw.tensors.len());

    // Tensor order in the data section is free.
    let mut rev = tiny_raw();
    rev.reverse();
    Model::from_bytes(&encode_tiny(&rev), SRC).unwrap();

    // No engram: engram = null and no engram tensors.
    let mut plain = tiny();
    plain.engram = None;
    let bytes = synth_archive(&plain, &BitsPlan::mixed(), 1).unwrap();
    Model::from_bytes(&bytes, SRC).unwrap();

    let synth = synth_archive(&tiny(), &BitsPlan::mixed(), 1).unwrap();
    Model::from_bytes(&synth, SRC).unwrap();
}

// ---------------------------------------------------------------------------
// Missing and unknown tensors (SPEC §3).

#[test]
fn missing_cq_matrix_is_named() {
    let mut t = tiny_tensors();
    assert!(t.remove("layers.1.wo").is_some());
    let bytes = write_archive(&tiny(), None, &t).unwrap();
    let (kind, msg) = reject(&bytes);
    match &kind {
        ArchiveError::MissingTensor(n) => assert!(n.starts_with("layers.1.wo"), "{n}"),
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    assert_names(&msg, "layers.1.wo");
    // The same through Model::from_bytes.
    let err = Model::from_bytes(&bytes, SRC).unwrap_err();
    assert!(matches!(
        err,
        Error::Archive {
            kind: ArchiveError::MissingTensor(_),
            ..
        }
    ));
}

#[test]
fn missing_f32_tensor_is_named() {
    for name in [
        "final_norm",
        "layers.3.attn_out_scale",
        "mhc.b_res",
        "engram.3.conv",
    ] {
        let mut t = tiny_tensors();
        assert!(t.remove(name).is_some(), "{name}");
        let (kind, msg) = reject(&write_archive(&tiny(), None, &t).unwrap());
        assert_eq!(kind, ArchiveError::MissingTensor(name.to_string()));
        assert_names(&msg, name);
    }
}

#[test]
fn missing_part_of_a_cq_matrix_is_named() {
    for part in [
        "embed.codebook",
        "layers.2.wk.norms",
        "engram.table.3.1.packed",
    ] {
        let t: Vec<Raw> = tiny_raw().into_iter().filter(|t| t.name != part).collect();
        let (kind, msg) = reject(&encode_tiny(&t));
        assert_eq!(kind, ArchiveError::MissingTensor(part.to_string()));
        assert_names(&msg, part);
    }
}

#[test]
fn missing_engram_tensor_when_config_has_engram() {
    let mut t = tiny_tensors();
    assert!(t.remove("engram.table.2.0").is_some());
    let (kind, msg) = reject(&write_archive(&tiny(), None, &t).unwrap());
    assert!(matches!(&kind, ArchiveError::MissingTensor(n) if n.starts_with("engram.table.2.0")));
    assert_names(&msg, "engram.table.2.0");
}

#[test]
fn unknown_tensor_is_named() {
    // A stray F32 tensor.
    let mut t = tiny_tensors();
    t.insert(
        "layers.0.bias".into(),
        Tensor::F32 {
            shape: vec![2],
            data: vec![0.0, 1.0],
        },
    );
    let (kind, msg) = reject(&write_archive(&tiny(), None, &t).unwrap());
    assert_eq!(kind, ArchiveError::UnknownTensor("layers.0.bias".into()));
    assert_names(&msg, "layers.0.bias");

    // A stray CQ matrix: a layer the config does not have.
    let mut t = tiny_tensors();
    let wo = t["layers.0.wo"].clone();
    t.insert("layers.4.wo".into(), wo);
    let (kind, msg) = reject(&write_archive(&tiny(), None, &t).unwrap());
    assert!(matches!(&kind, ArchiveError::UnknownTensor(n) if n.starts_with("layers.4.wo")));
    assert_names(&msg, "layers.4.wo");

    // Engram tensors in an archive whose config has no engram.
    let mut plain = tiny();
    plain.engram = None;
    let (kind, msg) = reject(&write_archive(&plain, None, &tiny_tensors()).unwrap());
    assert!(matches!(&kind, ArchiveError::UnknownTensor(n) if n.starts_with("engram.")));
    assert_names(&msg, "engram.");
}

// ---------------------------------------------------------------------------
// Wrong dtype and shape (SPEC §2, §3).

fn expect_dtype(tensors: &[Raw], name: &str, expected: &str, found: &str) {
    let (kind, msg) = reject(&encode_tiny(tensors));
    match &kind {
        ArchiveError::WrongDtype {
            name: n,
            expected: e,
            found: f,
        } => {
            assert_eq!(n, name);
            assert_eq!(e, expected);
            assert_eq!(f, found);
        }
        other => panic!("expected WrongDtype for {name}, got {other:?}"),
    }
    assert_names(&msg, name);
}

#[test]
fn wrong_dtype_of_f32_vector() {
    let h = tiny().hidden;
    let mut t = tiny_raw();
    replace(
        &mut t,
        "final_norm",
        "F16",
        vec![h],
        f16_bytes(&vec![0.5; h]),
    );
    expect_dtype(&t, "final_norm", "F32", "F16");

    let mut t = tiny_raw();
    let bytes = find(&t, "layers.1.mlp_d3").data.clone();
    let n = bytes.len() / 4;
    replace(&mut t, "layers.1.mlp_d3", "I32", vec![n], bytes);
    expect_dtype(&t, "layers.1.mlp_d3", "F32", "I32");
}

#[test]
fn wrong_dtype_of_cq_parts() {
    // Codebook stored as F64.
    let mut t = tiny_raw();
    let cb = find(&t, "embed.codebook").clone();
    let n = cb.shape[0];
    replace(&mut t, "embed.codebook", "F64", vec![n], vec![0u8; n * 8]);
    expect_dtype(&t, "embed.codebook", "F32", "F64");

    // Norms stored as F32 (same shape).
    let mut t = tiny_raw();
    let norms = find(&t, "layers.0.wq.norms").clone();
    let numel: usize = norms.shape.iter().product();
    replace(
        &mut t,
        "layers.0.wq.norms",
        "F32",
        norms.shape.clone(),
        f32_bytes(&vec![0.1; numel]),
    );
    expect_dtype(&t, "layers.0.wq.norms", "F16", "F32");

    // Norms stored as BF16 (same byte size as F16).
    let mut t = tiny_raw();
    replace(
        &mut t,
        "layers.0.wq.norms",
        "BF16",
        norms.shape.clone(),
        norms.data.clone(),
    );
    expect_dtype(&t, "layers.0.wq.norms", "F16", "BF16");

    // Packed indices stored as I8.
    let mut t = tiny_raw();
    let packed = find(&t, "mhc.phi_res.packed").clone();
    replace(
        &mut t,
        "mhc.phi_res.packed",
        "I8",
        packed.shape.clone(),
        packed.data.clone(),
    );
    expect_dtype(&t, "mhc.phi_res.packed", "U8", "I8");
}

fn expect_shape(tensors: &[Raw], name: &str, found: &[usize]) {
    let (kind, msg) = reject(&encode_tiny(tensors));
    match &kind {
        ArchiveError::WrongShape {
            name: n, found: f, ..
        } => {
            assert_eq!(n, name);
            assert_eq!(f, found);
        }
        other => panic!("expected WrongShape for {name}, got {other:?}"),
    }
    assert_names(&msg, name);
}

#[test]
fn wrong_shape_of_f32_tensors() {
    let c = tiny();
    // A vector one element too long.
    let mut t = tiny_raw();
    replace(
        &mut t,
        "final_norm",
        "F32",
        vec![c.hidden + 1],
        f32_bytes(&vec![0.0; c.hidden + 1]),
    );
    expect_shape(&t, "final_norm", &[c.hidden + 1]);

    // A vector one element too short.
    let mut t = tiny_raw();
    let hd = c.head_dim - 1;
    replace(
        &mut t,
        "layers.2.k_norm",
        "F32",
        vec![hd],
        f32_bytes(&vec![0.0; hd]),
    );
    expect_shape(&t, "layers.2.k_norm", &[hd]);

    // Right element count, wrong rank.
    let mut t = tiny_raw();
    let b = find(&t, "mhc.b_res").data.clone();
    replace(&mut t, "mhc.b_res", "F32", vec![c.layers * 16], b);
    expect_shape(&t, "mhc.b_res", &[c.layers * 16]);

    // A scalar stored with shape [] instead of [1].
    let mut t = tiny_raw();
    replace(
        &mut t,
        "layers.0.attn_out_scale",
        "F32",
        vec![],
        f32_bytes(&[1.0]),
    );
    expect_shape(&t, "layers.0.attn_out_scale", &[]);

    // Transposed conv.
    let mut t = tiny_raw();
    let e = c.engram.clone().unwrap();
    let conv = find(&t, "engram.1.conv").data.clone();
    replace(&mut t, "engram.1.conv", "F32", vec![c.hidden, e.taps], conv);
    expect_shape(&t, "engram.1.conv", &[c.hidden, e.taps]);
}

#[test]
fn wrong_shape_of_cq_parts() {
    let c = tiny();
    // Norms with one row too few.
    let mut t = tiny_raw();
    let norms = find(&t, "embed.norms").clone();
    let groups = norms.shape[1];
    let rows = c.vocab - 1;
    replace(
        &mut t,
        "embed.norms",
        "F16",
        vec![rows, groups],
        f16_bytes(&vec![0.1; rows * groups]),
    );
    expect_shape(&t, "embed.norms", &[rows, groups]);

    // Packed with one row too many (norms right).
    let mut t = tiny_raw();
    let packed = find(&t, "layers.3.wv.packed").clone();
    let (r, w) = (packed.shape[0] + 1, packed.shape[1]);
    replace(
        &mut t,
        "layers.3.wv.packed",
        "U8",
        vec![r, w],
        vec![0; r * w],
    );
    expect_shape(&t, "layers.3.wv.packed", &[r, w]);

    // Norms flattened to one dimension.
    let mut t = tiny_raw();
    let n = find(&t, "layers.0.wo.norms").clone();
    let numel: usize = n.shape.iter().product();
    replace(
        &mut t,
        "layers.0.wo.norms",
        "F16",
        vec![numel],
        n.data.clone(),
    );
    expect_shape(&t, "layers.0.wo.norms", &[numel]);

    // A two-dimensional codebook.
    let mut t = tiny_raw();
    let cb = find(&t, "mhc.phi_pre.codebook").clone();
    let len = cb.shape[0];
    replace(
        &mut t,
        "mhc.phi_pre.codebook",
        "F32",
        vec![1, len],
        cb.data.clone(),
    );
    expect_shape(&t, "mhc.phi_pre.codebook", &[1, len]);

    // An engram table with zero rows (tables may have any row count >= 1).
    let mut t = tiny_raw();
    let g = find(&t, "engram.table.2.1.norms").shape[1];
    let w = find(&t, "engram.table.2.1.packed").shape[1];
    replace(&mut t, "engram.table.2.1.norms", "F16", vec![0, g], vec![]);
    replace(&mut t, "engram.table.2.1.packed", "U8", vec![0, w], vec![]);
    expect_shape(&t, "engram.table.2.1.norms", &[0, g]);
}

#[test]
fn engram_tables_may_have_any_row_count() {
    // Control for the zero-row case above: 5 rows is accepted.
    let mut t = tiny_raw();
    let g = find(&t, "engram.table.2.1.norms").shape[1];
    let w = find(&t, "engram.table.2.1.packed").shape[1];
    replace(
        &mut t,
        "engram.table.2.1.norms",
        "F16",
        vec![5, g],
        f16_bytes(&vec![0.5; 5 * g]),
    );
    replace(
        &mut t,
        "engram.table.2.1.packed",
        "U8",
        vec![5, w],
        vec![7; 5 * w],
    );
    Model::from_bytes(&encode_tiny(&t), SRC).unwrap();
}

// ---------------------------------------------------------------------------
// CQ geometry (SPEC §2), on `embed` (rows vocab, cols hidden = 80).

/// `embed` re-stored with `groups` groups of `row_bytes` bytes per row and a codebook of `cb_len` entries.
fn embed_with(groups: usize, row_bytes: usize, cb_len: usize) -> Vec<u8> {
    let rows = tiny().vocab;
    let mut t = tiny_raw();
    let cb: Vec<f32> = (0..cb_len)
        .map(|i| i as f32 - cb_len as f32 / 2.0)
        .collect();
    replace(
        &mut t,
        "embed.codebook",
        "F32",
        vec![cb_len],
        f32_bytes(&cb),
    );
    replace(
        &mut t,
        "embed.norms",
        "F16",
        vec![rows, groups],
        f16_bytes(&vec![0.25; rows * groups]),
    );
    replace(
        &mut t,
        "embed.packed",
        "U8",
        vec![rows, row_bytes],
        (0..rows * row_bytes)
            .map(|i| (i * 37 % 251) as u8)
            .collect(),
    );
    encode_tiny(&t)
}

fn expect_bad_cq(bytes: &[u8], what: &str) -> String {
    let (kind, msg) = reject(bytes);
    match &kind {
        ArchiveError::BadCq { name, reason } => {
            assert_eq!(name, "embed", "{what}");
            assert!(!reason.is_empty());
        }
        other => panic!("{what}: expected BadCq, got {other:?}"),
    }
    assert_names(&msg, "embed");
    msg
}

#[test]
fn cq_geometry_controls_are_accepted() {
    // hidden = 80: every legal (bits, group) layout of embed loads.
    let cols = tiny().hidden;
    for bits in [1usize, 2, 4, 8] {
        for group in [32usize, 64, 128] {
            let groups = cols.div_ceil(group);
            let bytes = embed_with(groups, groups * group * bits / 8, 1 << bits);
            let m = Model::from_bytes(&bytes, SRC)
                .unwrap_or_else(|e| panic!("bits {bits} group {group}: {e}"));
            assert_eq!(m.weights.embed.group(), group);
            assert_eq!(m.weights.embed.bits() as usize, bits);
        }
    }
}

#[test]
fn cq_codebook_of_unsupported_size() {
    // 3 groups of 32 4-bit indices = 48 bytes per row, but codebooks of 3, 1, 8, 32 entries.
    for n in [3usize, 1, 8, 32] {
        let msg = expect_bad_cq(&embed_with(3, 48, n), "codebook size");
        assert!(msg.contains("codebook"), "{msg}");
    }
    // An empty codebook.
    expect_bad_cq(&embed_with(3, 48, 0), "empty codebook");
}

#[test]
fn cq_group_not_a_power_of_two() {
    // 2 groups of 48 4-bit indices: padded 96 fits cols 80, but 48 is not a power of two.
    let msg = expect_bad_cq(&embed_with(2, 48, 16), "group 48");
    assert!(msg.contains("group"), "{msg}");
}

#[test]
fn cq_group_below_32() {
    // 6 groups of 16 4-bit indices: padded 96 fits cols 80, but 16 < 32.
    let msg = expect_bad_cq(&embed_with(6, 48, 16), "group 16");
    assert!(msg.contains("group"), "{msg}");
    // 10 groups of 8 8-bit indices: padded exactly 80.
    expect_bad_cq(&embed_with(10, 80, 256), "group 8");
}

#[test]
fn cq_padded_too_large() {
    // 4 groups of 32: padded 128 >= cols + group = 112.
    expect_bad_cq(&embed_with(4, 64, 16), "padded 128");
    // 2 groups of 128 1-bit indices: padded 256 >= cols + group = 208.
    expect_bad_cq(&embed_with(2, 32, 2), "padded 256");
}

#[test]
fn cq_padded_too_small() {
    // 2 groups of 32: padded 64 < cols 80.
    expect_bad_cq(&embed_with(2, 32, 16), "padded 64");
}

#[test]
fn cq_packed_width_not_divisible() {
    // 3 groups of 4-bit indices need 12 bits per group-slot; 49 bytes = 392 bits is not a multiple.
    let msg = expect_bad_cq(&embed_with(3, 49, 16), "49 bytes");
    assert!(msg.contains("49"), "{msg}");
    // Zero-width packed rows.
    expect_bad_cq(&embed_with(3, 0, 16), "0 bytes");
}

#[test]
fn cq_zero_groups() {
    expect_bad_cq(&embed_with(0, 48, 16), "0 groups");
}

// ---------------------------------------------------------------------------
// Config (SPEC §1) through Config::from_json.

fn tiny_json() -> Value {
    serde_json::to_value(tiny()).unwrap()
}

/// Apply `edit` to the tiny config JSON and expect a ConfigError naming `field`.
fn config_err(edit: impl FnOnce(&mut serde_json::Map<String, Value>), field: &str) -> ConfigError {
    let mut v = tiny_json();
    edit(v.as_object_mut().unwrap());
    let text = v.to_string();
    let err = match Config::from_json(&text) {
        Ok(c) => panic!("accepted a config that should name `{field}`: {c:?}"),
        Err(e) => e,
    };
    assert_eq!(err.field, field, "{text}: {err}");
    assert!(err.to_string().contains(field), "{err}");
    err
}

fn set(key: &'static str, value: Value) -> impl FnOnce(&mut serde_json::Map<String, Value>) {
    move |o| {
        o.insert(key.to_string(), value);
    }
}

fn set_engram(key: &'static str, value: Value) -> impl FnOnce(&mut serde_json::Map<String, Value>) {
    move |o| {
        o["engram"]
            .as_object_mut()
            .unwrap()
            .insert(key.to_string(), value);
    }
}

#[test]
fn config_baselines_are_accepted() {
    assert_eq!(Config::from_json(&tiny_json().to_string()).unwrap(), tiny());
    for c in [Config::preset_default(), Config::preset_large()] {
        assert_eq!(Config::from_json(&c.to_json()).unwrap(), c);
    }
    let mut v = tiny_json();
    v["engram"] = Value::Null;
    assert!(Config::from_json(&v.to_string()).unwrap().engram.is_none());
    // rope_theta may be written as an integer; it is a number.
    let mut v = tiny_json();
    v["rope_theta"] = json!(500000);
    assert_eq!(
        Config::from_json(&v.to_string()).unwrap().rope_theta,
        500000.0
    );
    // Boundaries that are legal.
    let mut v = tiny_json();
    v["sink"] = json!(0);
    v["window"] = json!(1);
    v["sinkhorn_iters"] = json!(1000);
    v["kv_heads"] = json!(4);
    v["bos"] = json!(255);
    v["eos"] = json!(0);
    v["hadamard_dim"] = json!(1 << 20);
    Config::from_json(&v.to_string()).unwrap();
}

#[test]
fn config_unknown_field() {
    config_err(set("dropout", json!(0)), "dropout");
    let err = config_err(set_engram("bias", json!(1)), "engram.bias");
    assert!(err.to_string().contains("bias"));
}

#[test]
fn config_missing_field() {
    let fields: Vec<String> = tiny_json().as_object().unwrap().keys().cloned().collect();
    assert_eq!(fields.len(), 17);
    for f in fields {
        let f2 = f.clone();
        let mut v = tiny_json();
        v.as_object_mut().unwrap().remove(&f2);
        let err = Config::from_json(&v.to_string()).unwrap_err();
        assert_eq!(err.field, f, "{err}");
        assert!(err.to_string().contains(&f), "{err}");
    }
}

#[test]
fn config_engram_missing_field() {
    for f in ["sites", "orders", "hash_heads", "dim", "taps", "dilation"] {
        let mut v = tiny_json();
        v["engram"].as_object_mut().unwrap().remove(f);
        let err = Config::from_json(&v.to_string()).unwrap_err();
        let want = format!("engram.{f}");
        assert_eq!(err.field, want, "{err}");
        assert!(err.to_string().contains(&want), "{err}");
    }
}

#[test]
fn config_non_integer_is_named() {
    config_err(set("vocab", json!(256.0)), "vocab");
    config_err(set("hidden", json!(80.5)), "hidden");
    config_err(set("layers", json!("4")), "layers");
    config_err(set("version", json!(1.0)), "version");
    config_err(set("bos", json!(-1)), "bos");
    config_err(set("eos", json!(null)), "eos");
    config_err(set("sink", json!(true)), "sink");
    config_err(set("window", json!([8])), "window");
    config_err(set("lanes", json!(4.0)), "lanes");
    config_err(set("sinkhorn_iters", json!(1e1)), "sinkhorn_iters");
    config_err(set_engram("dim", json!(24.0)), "engram.dim");
    config_err(set_engram("taps", json!(-3)), "engram.taps");
    config_err(set_engram("sites", json!([1.0, 3])), "engram.sites");
    config_err(set_engram("orders", json!(2)), "engram.orders");
}

#[test]
fn config_wrong_json_type_is_named() {
    config_err(set("format", json!(1)), "format");
    config_err(set("rope_theta", json!("10000")), "rope_theta");
    config_err(set("engram", json!(5)), "engram");
    config_err(set("engram", json!([1, 2])), "engram");
}

#[test]
fn config_integer_too_large_is_named() {
    // Values that do not fit the field's integer type are still rejected by name.
    config_err(set("version", json!(4_294_967_297u64)), "version");
    config_err(set("bos", json!(4_294_967_296u64)), "bos");
    config_err(set("vocab", json!(u64::MAX)), "vocab");
}

#[test]
fn config_exact_values() {
    config_err(set("format", json!("CQLM")), "format");
    config_err(set("version", json!(2)), "version");
    config_err(set("version", json!(0)), "version");
    config_err(set("lanes", json!(3)), "lanes");
    config_err(set("lanes", json!(8)), "lanes");
}

#[test]
fn config_out_of_range() {
    config_err(set("vocab", json!(0)), "vocab");
    config_err(set("vocab", json!((1 << 24) + 1)), "vocab");
    config_err(set("hidden", json!(0)), "hidden");
    config_err(set("hidden", json!(65537)), "hidden");
    config_err(set("layers", json!(0)), "layers");
    config_err(set("layers", json!(1025)), "layers");
    config_err(set("heads", json!(0)), "heads");
    config_err(set("heads", json!(1026)), "heads");
    config_err(set("kv_heads", json!(0)), "kv_heads");
    config_err(set("head_dim", json!(0)), "head_dim");
    config_err(set("head_dim", json!(1026)), "head_dim");
    config_err(set("sinkhorn_iters", json!(0)), "sinkhorn_iters");
    config_err(set("sinkhorn_iters", json!(1001)), "sinkhorn_iters");
    config_err(set("window", json!(0)), "window");
    config_err(set_engram("orders", json!([2, 65])), "engram.orders");
    config_err(set_engram("orders", json!([0])), "engram.orders");
    config_err(set_engram("hash_heads", json!(0)), "engram.hash_heads");
    config_err(set_engram("hash_heads", json!(65)), "engram.hash_heads");
    config_err(set_engram("dim", json!(0)), "engram.dim");
    config_err(set_engram("dim", json!(65537)), "engram.dim");
    config_err(set_engram("taps", json!(65)), "engram.taps");
    config_err(set_engram("dilation", json!(0)), "engram.dilation");
}

#[test]
fn config_sink_plus_window_too_large() {
    let mut v = tiny_json();
    v["sink"] = json!(1 << 19);
    v["window"] = json!(1 << 19);
    Config::from_json(&v.to_string()).unwrap();
    let err = config_err(
        |o| {
            o.insert("sink".into(), json!((1 << 19) + 1));
            o.insert("window".into(), json!(1 << 19));
        },
        "window",
    );
    assert!(err.to_string().contains("sink"), "{err}");
    // Huge values must not overflow.
    let err = Config::from_json(
        &{
            let mut v = tiny_json();
            v["sink"] = json!(u64::MAX);
            v
        }
        .to_string(),
    )
    .unwrap_err();
    assert!(err.field == "sink" || err.field == "window", "{err}");
}

#[test]
fn config_heads_not_divisible_by_kv_heads() {
    let mut v = tiny_json();
    v["kv_heads"] = json!(3);
    let err = Config::from_json(&v.to_string()).unwrap_err();
    assert!(err.field == "kv_heads" || err.field == "heads", "{err}");
    assert!(err.to_string().contains("heads"), "{err}");
}

#[test]
fn config_odd_head_dim() {
    config_err(set("head_dim", json!(15)), "head_dim");
}

#[test]
fn config_hadamard_dim() {
    config_err(set("hadamard_dim", json!(96)), "hadamard_dim");
    config_err(set("hadamard_dim", json!(64)), "hadamard_dim"); // < hidden 80
    config_err(set("hadamard_dim", json!(0)), "hadamard_dim");
    config_err(set("hadamard_dim", json!(1 << 21)), "hadamard_dim");
}

#[test]
fn config_rope_theta() {
    config_err(set("rope_theta", json!(0.0)), "rope_theta");
    config_err(set("rope_theta", json!(-10000.0)), "rope_theta");
    config_err(set("rope_theta", json!(-0.0)), "rope_theta");
}

#[test]
fn config_engram_sites() {
    config_err(set_engram("sites", json!([3, 1])), "engram.sites");
    config_err(set_engram("sites", json!([1, 1])), "engram.sites");
    config_err(set_engram("sites", json!([1, 4])), "engram.sites"); // layers = 4
    config_err(set_engram("sites", json!([])), "engram.sites");
}

#[test]
fn config_engram_orders() {
    config_err(set_engram("orders", json!([2, 3, 2])), "engram.orders");
    config_err(set_engram("orders", json!([])), "engram.orders");
}

#[test]
fn config_token_ids_below_vocab() {
    config_err(set("bos", json!(256)), "bos");
    config_err(set("eos", json!(300)), "eos");
}

#[test]
fn config_not_an_object_or_not_json() {
    for text in ["", "[]", "42", "{", "{\"format\": \"cqlm\",}"] {
        let err = Config::from_json(text).unwrap_err();
        assert!(!err.field.is_empty(), "{text:?}");
    }
}

// ---------------------------------------------------------------------------
// Config through whole archives, and the metadata itself.

#[test]
fn archive_with_invalid_config() {
    let mut c = tiny();
    c.lanes = 3;
    let (kind, msg) = reject(&write_archive(&c, None, &tiny_tensors()).unwrap());
    match &kind {
        ArchiveError::Config(e) => assert_eq!(e.field, "lanes"),
        other => panic!("expected Config, got {other:?}"),
    }
    assert_names(&msg, "lanes");
    assert_names(&msg, CONFIG_KEY);

    // A non-integer written by hand.
    let mut v = tiny_json();
    v["vocab"] = json!(256.0);
    let meta = vec![(CONFIG_KEY.to_string(), v.to_string())];
    let (kind, msg) = reject(&encode(Some(&meta), &tiny_raw()));
    assert!(
        matches!(&kind, ArchiveError::Config(e) if e.field == "vocab"),
        "{kind:?}"
    );
    assert_names(&msg, "vocab");

    // Config text that is not JSON.
    let meta = vec![(CONFIG_KEY.to_string(), "not json".to_string())];
    let (kind, _) = reject(&encode(Some(&meta), &tiny_raw()));
    assert!(matches!(kind, ArchiveError::Config(_)), "{kind:?}");
}

#[test]
fn archive_without_config_metadata() {
    // No __metadata__ at all.
    let (kind, msg) = reject(&encode(None, &tiny_raw()));
    assert_eq!(kind, ArchiveError::MissingConfig);
    assert_names(&msg, CONFIG_KEY);
    // Metadata with other keys only.
    let meta = vec![("cqlm.tokenizer".to_string(), "{}".to_string())];
    let (kind, msg) = reject(&encode(Some(&meta), &tiny_raw()));
    assert_eq!(kind, ArchiveError::MissingConfig);
    assert_names(&msg, CONFIG_KEY);
}

#[test]
fn other_metadata_keys_are_ignored() {
    let mut meta = config_meta(&tiny());
    meta.push(("producer".into(), "tests".into()));
    meta.push(("cqlm.tokenizer".into(), "{\"model\": {}}".into()));
    let raw = read_archive(&encode(Some(&meta), &tiny_raw()), SRC).unwrap();
    assert_eq!(raw.tokenizer.as_deref(), Some("{\"model\": {}}"));
}

#[test]
fn metadata_value_that_is_not_a_string() {
    let mut header = serde_json::Map::new();
    header.insert(
        "__metadata__".into(),
        json!({ CONFIG_KEY: serde_json::to_value(tiny()).unwrap() }),
    );
    let bytes = frame(&Value::Object(header).to_string(), &[]);
    let (kind, _) = reject(&bytes);
    assert!(matches!(kind, ArchiveError::Format(_)), "{kind:?}");
}

// ---------------------------------------------------------------------------
// Container rules (SPEC §5).

/// The header JSON of `bytes` and the data section after it.
fn split(bytes: &[u8]) -> (String, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (
        String::from_utf8(bytes[8..8 + n].to_vec()).unwrap(),
        bytes[8 + n..].to_vec(),
    )
}

#[test]
fn duplicate_keys_in_header() {
    let good = encode_tiny(&tiny_raw());
    let (header, data) = split(&good);
    let header = header.trim_end();
    assert!(header.starts_with('{'));

    // `__metadata__.cqlm.config` twice, both copies valid: only a duplicate check catches it.
    let cfg = serde_json::to_string(&tiny().to_json()).unwrap();
    let dup_meta = format!(
        "{{\"__metadata__\":{{\"{CONFIG_KEY}\":{cfg},\"{CONFIG_KEY}\":{cfg}}},{}",
        &header[1..].replacen(
            &format!("\"__metadata__\":{{\"{CONFIG_KEY}\":{cfg}}},"),
            "",
            1
        )
    );
    assert_ne!(dup_meta.len(), header.len());
    let (kind, msg) = reject(&frame(&dup_meta, &data));
    assert!(matches!(kind, ArchiveError::Format(_)), "{kind:?}");
    assert_names(&msg, "duplicate");
    assert_names(&msg, CONFIG_KEY);

    // A repeated key inside one tensor's entry.
    let dup_field = header.replacen(
        "\"dtype\":\"F32\"",
        "\"dtype\":\"F32\",\"dtype\":\"F32\"",
        1,
    );
    assert_ne!(dup_field, header);
    let (kind, msg) = reject(&frame(&dup_field, &data));
    assert!(matches!(kind, ArchiveError::Format(_)), "{kind:?}");
    assert_names(&msg, "dtype");

    // A tensor listed twice with the same entry.
    let t = tiny_raw();
    let first = &t[0];
    let entry = format!(
        "\"{}\":{}",
        first.name,
        json!({"dtype": first.dtype, "shape": first.shape, "data_offsets": [0, first.data.len()]})
    );
    assert!(header.contains(&entry), "{entry}");
    let twice = header.replacen(&entry, &format!("{entry},{entry}"), 1);
    let (kind, msg) = reject(&frame(&twice, &data));
    assert!(matches!(kind, ArchiveError::Format(_)), "{kind:?}");
    assert_names(&msg, &first.name);
}

#[test]
fn offsets_with_a_gap() {
    let t = tiny_raw();
    let k = t.len() / 2;
    // Shift tensor k and all after it by 8 bytes, with 8 bytes of padding in the data.
    let mut header = serde_json::Map::new();
    header.insert(
        "__metadata__".into(),
        json!({ CONFIG_KEY: tiny().to_json() }),
    );
    let mut data = Vec::new();
    for (i, r) in t.iter().enumerate() {
        if i == k {
            data.extend_from_slice(&[0u8; 8]);
        }
        let start = data.len();
        data.extend_from_slice(&r.data);
        header.insert(
            r.name.clone(),
            json!({"dtype": r.dtype, "shape": r.shape, "data_offsets": [start, data.len()]}),
        );
    }
    let (kind, msg) = reject(&frame(&Value::Object(header).to_string(), &data));
    assert!(matches!(kind, ArchiveError::Format(_)), "{kind:?}");
    assert_names(&msg, &t[k].name);
}

#[test]
fn offsets_overlapping_or_past_the_end() {
    let t = tiny_raw();
    let meta = json!({ CONFIG_KEY: tiny().to_json() });

    // Two tensors share their first bytes.
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), meta.clone());
    let mut data = Vec::new();
    for (i, r) in t.iter().enumerate() {
        let start = if i == 1 { 0 } else { data.len() };
        if i != 1 {
            data.extend_from_slice(&r.data);
        }
        let end = start + r.data.len();
        header.insert(
            r.name.clone(),
            json!({"dtype": r.dtype, "shape": r.shape, "data_offsets": [start, end]}),
        );
    }
    let (kind, _) = reject(&frame(&Value::Object(header).to_string(), &data));
    assert!(
        matches!(kind, ArchiveError::Format(_) | ArchiveError::Truncated(_)),
        "{kind:?}"
    );

    // Offsets that run past the end of the file.
    let good = encode_tiny(&t);
    let (_, data) = split(&good);
    let (kind, _) = reject(&frame(
        &{
            let mut h = serde_json::Map::new();
            h.insert("__metadata__".into(), meta.clone());
            let mut off = 0;
            for r in &t {
                h.insert(
                    r.name.clone(),
                    json!({"dtype": r.dtype, "shape": r.shape, "data_offsets": [off, off + r.data.len()]}),
                );
                off += r.data.len();
            }
            Value::Object(h).to_string()
        },
        &data[..data.len() - 4],
    ));
    assert!(matches!(kind, ArchiveError::Truncated(_)), "{kind:?}");

    // Extra bytes after the last tensor.
    let mut long = good.clone();
    long.extend_from_slice(&[0; 8]);
    let (kind, _) = reject(&long);
    assert!(
        matches!(kind, ArchiveError::Truncated(_) | ArchiveError::Format(_)),
        "{kind:?}"
    );
}

#[test]
fn data_length_disagrees_with_shape() {
    // final_norm claims [hidden] F32 but its offsets span one element more.
    let mut t = tiny_raw();
    let h = tiny().hidden;
    replace(
        &mut t,
        "final_norm",
        "F32",
        vec![h],
        f32_bytes(&vec![0.0; h + 1]),
    );
    let (kind, msg) = reject(&encode_tiny(&t));
    assert!(
        matches!(kind, ArchiveError::Format(_) | ArchiveError::Truncated(_)),
        "{kind:?}"
    );
    assert_names(&msg, SRC);
}

#[test]
fn header_length_and_encoding() {
    // A header length that runs past the end of the file.
    let mut b = encode_tiny(&tiny_raw());
    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(reject(&b).0, ArchiveError::Truncated(_)));
    let len = b.len() as u64;
    b[..8].copy_from_slice(&(len - 7).to_le_bytes());
    assert!(matches!(reject(&b).0, ArchiveError::Truncated(_)));
    // A header that is not UTF-8, not JSON, not an object.
    assert!(matches!(
        reject(&frame("{\"\u{ff}", &[])).0,
        ArchiveError::Format(_)
    ));
    // A header that does not start with `{` (as safetensors requires) is no
    // archive at all: a text file, say.
    let mut bad = frame("{}", &[]);
    bad[8] = 0xff;
    assert_eq!(reject(&bad).0, ArchiveError::NotAnArchive);
    for h in ["[]", "null"] {
        assert_eq!(
            reject(&frame(h, &[])).0,
            ArchiveError::NotAnArchive,
            "{h:?}"
        );
    }
    for h in ["", "{", "{\"a\": 1}"] {
        let (kind, _) = reject(&frame(h, &[]));
        assert!(
            matches!(kind, ArchiveError::Format(_) | ArchiveError::Truncated(_)),
            "{h:?}: {kind:?}"
        );
    }
    // An empty but well-formed file has no config.
    assert_eq!(reject(&frame("{}", &[])).0, ArchiveError::MissingConfig);
}

#[test]
fn truncated_file() {
    let good = synth_archive(&tiny(), &BitsPlan::mixed(), 1).unwrap();
    for cut in [0, 1, 7, 8, 9, 100, good.len() / 2, good.len() - 1] {
        let (kind, msg) = reject(&good[..cut]);
        assert!(
            matches!(kind, ArchiveError::Truncated(_)),
            "cut {cut}: {kind:?}"
        );
        assert_names(&msg, "truncated");
    }
}

// ---------------------------------------------------------------------------
// Files.

#[test]
fn load_nonexistent_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.cqlm");
    let err = Model::load(&path).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[test]
fn load_directory() {
    let dir = tempfile::tempdir().unwrap();
    let err = Model::load(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );
}

#[test]
fn load_empty_and_short_files() {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in [("empty.cqlm", &b""[..]), ("short.cqlm", &b"\x10\0\0"[..])] {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        let err = Model::load(&path).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Archive {
                    kind: ArchiveError::Truncated(_),
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }
}

#[test]
fn load_broken_file_names_path_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.cqlm");
    let mut t = tiny_tensors();
    t.remove("layers.3.wg");
    std::fs::write(&path, write_archive(&tiny(), None, &t).unwrap()).unwrap();
    let err = Model::load(&path).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("layers.3.wg"), "{msg}");
    // And a good file loads.
    let good = dir.path().join("good.cqlm");
    std::fs::write(
        &good,
        synth_archive(&tiny(), &BitsPlan::mixed(), 1).unwrap(),
    )
    .unwrap();
    assert_eq!(Model::load(&good).unwrap().config, tiny());
}

// ---------------------------------------------------------------------------
// Fuzz: no truncation or header corruption makes the reader panic.

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Load `bytes` without letting a panic escape; when it loads, also run two
/// tokens through the CPU engine. Returns whether it loaded.
fn load_no_panic(bytes: &[u8], what: &str) -> bool {
    match catch_unwind(AssertUnwindSafe(|| match Model::from_bytes(bytes, SRC) {
        Ok(m) => {
            let vocab = m.config.vocab as u32;
            let mut e = CpuEngine::new(Arc::new(m)).expect("engine");
            let logits = e.prefill(&[1 % vocab, 2 % vocab]).expect("prefill");
            assert_eq!(logits.len(), vocab as usize);
            true
        }
        Err(e) => {
            assert!(e.to_string().contains(SRC), "{e}");
            false
        }
    })) {
        Ok(ok) => ok,
        Err(p) => {
            let m = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{what}: the reader panicked: {m}");
        }
    }
}

fn tiny_archive() -> Vec<u8> {
    synth_archive(&tiny(), &BitsPlan::mixed(), 1).unwrap()
}

fn header_end(bytes: &[u8]) -> usize {
    8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

#[test]
fn fuzz_truncation_never_panics_and_is_rejected() {
    let good = tiny_archive();
    assert!(load_no_panic(&good, "baseline"));
    let hend = header_end(&good);
    let mut cuts: Vec<usize> = (0..=hend).collect();
    let data_len = good.len() - hend;
    for k in 1..400 {
        cuts.push(hend + data_len * k / 400);
    }
    cuts.push(good.len() - 1);
    for cut in cuts {
        let what = format!("truncated at {cut} of {}", good.len());
        let r = catch_unwind(AssertUnwindSafe(|| read_archive(&good[..cut], SRC)));
        match r {
            Err(_) => panic!("{what}: the reader panicked"),
            Ok(Ok(_)) => panic!("{what}: accepted"),
            Ok(Err(Error::Archive {
                kind: ArchiveError::Truncated(_),
                ..
            })) => {}
            Ok(Err(e)) => panic!("{what}: expected Truncated, got {e:?}"),
        }
    }
}

#[test]
fn fuzz_header_byte_flips_never_panic() {
    let good = tiny_archive();
    let hend = header_end(&good);
    let mut loaded = 0usize;
    let mut tried = 0usize;
    // Every header byte (and the length prefix) with a low-bit flip; a sparser
    // sweep with other xor values.
    for pos in 0..hend {
        let xors: &[u8] = if pos % 7 == 0 {
            &[0x01, 0x02, 0x10, 0x20, 0x80, 0xff]
        } else {
            &[0x01]
        };
        for &x in xors {
            let mut b = good.clone();
            b[pos] ^= x;
            tried += 1;
            if load_no_panic(&b, &format!("byte {pos} ^= {x:#04x}")) {
                loaded += 1;
            }
        }
    }
    // Random positions and values, fixed seed; also a few multi-byte corruptions.
    let mut rng = SplitMix(0x5eed_cafe);
    for i in 0..3000 {
        let mut b = good.clone();
        let n = 1 + i % 3;
        let mut what = String::new();
        for _ in 0..n {
            let pos = rng.below(hend);
            let v = (rng.next() & 0xff) as u8;
            b[pos] = v;
            what.push_str(&format!("byte {pos} = {v:#04x}; "));
        }
        tried += 1;
        if load_no_panic(&b, &what) {
            loaded += 1;
        }
    }
    // Most corruptions must be caught (a flip inside padding or a float digit may not be).
    assert!(
        loaded * 2 < tried,
        "{loaded} of {tried} corrupted archives loaded"
    );
}

#[test]
fn fuzz_digit_substitutions_in_header_never_panic() {
    // Replace each ASCII digit of the header (shapes, offsets, config numbers)
    // with other digits: the corruptions most likely to pass the JSON parser.
    let good = tiny_archive();
    let hend = header_end(&good);
    let mut rng = SplitMix(42);
    let digits: Vec<usize> = (8..hend).filter(|&i| good[i].is_ascii_digit()).collect();
    assert!(digits.len() > 100);
    for (k, &pos) in digits.iter().enumerate() {
        let replacements: Vec<u8> = if k % 5 == 0 {
            b"0123456789".to_vec()
        } else {
            vec![b'0' + rng.below(10) as u8]
        };
        for d in replacements {
            if d == good[pos] {
                continue;
            }
            let mut b = good.clone();
            b[pos] = d;
            load_no_panic(&b, &format!("digit at {pos} -> {}", d as char));
        }
    }
    // Inserting digits that make numbers huge (overflow in shapes/offsets).
    let mut inserted = 0;
    for &pos in digits.iter().step_by(23) {
        let (header, data) = split(&good);
        let rel = pos - 8;
        let mut h = header.clone();
        h.insert_str(rel, "99999999999999999999");
        load_no_panic(&frame(&h, &data), &format!("huge number at {pos}"));
        h = header.clone();
        h.insert_str(rel, "1844674407370955161");
        load_no_panic(&frame(&h, &data), &format!("near-u64 number at {pos}"));
        inserted += 1;
    }
    assert!(inserted > 10);
}

#[test]
fn config_with_a_repeated_field_is_rejected() {
    let text = Config::preset_tiny().to_json();
    // Repeat `vocab` with the same value: only a duplicate check can tell.
    let doubled = text.replacen("\"vocab\":256,", "\"vocab\":256,\"vocab\":256,", 1);
    assert_ne!(doubled, text);
    let err = Config::from_json(&doubled).unwrap_err();
    assert!(err.reason.contains("duplicate key `vocab`"), "{err}");
    assert!(Config::from_json(&text).is_ok());
}
