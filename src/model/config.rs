//! SPEC §1: the model config, its validation and the named presets.

pub(crate) mod dupcheck;

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};

/// The engram (hashed n-gram memory) settings of SPEC §1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngramConfig {
    /// Layer indices that read the engram, strictly ascending, each `< layers`.
    pub sites: Vec<usize>,
    /// N-gram orders, distinct, each `1..=64`.
    pub orders: Vec<usize>,
    /// Hash heads per order, `1..=64`.
    pub hash_heads: usize,
    /// Width of one table row, `1..=65536`.
    pub dim: usize,
    /// Taps of the causal depthwise convolution, `1..=64`.
    pub taps: usize,
    /// Distance in tokens between taps, `1..=64`.
    pub dilation: usize,
}

impl EngramConfig {
    /// `E = len(orders) · hash_heads · dim`: the length of the gathered engram vector.
    pub fn e_dim(&self) -> usize {
        self.orders.len() * self.hash_heads * self.dim
    }

    /// Rows of one site's value ring: `(taps − 1) · dilation + 1`.
    pub fn ring(&self) -> usize {
        (self.taps - 1) * self.dilation + 1
    }

    /// Number of tables, `len(orders) · hash_heads`, in gather order (orders as listed, heads ascending).
    pub fn tables(&self) -> usize {
        self.orders.len() * self.hash_heads
    }
}

/// The model config of SPEC §1. Build it with [`Config::from_json`] or a preset;
/// a value that passed [`Config::validate`] satisfies every rule of the SPEC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Always `"cqlm"`.
    pub format: String,
    /// Always `1`.
    pub version: u32,
    /// Vocabulary size, `1..=2^24`.
    pub vocab: usize,
    /// Lane width, `1..=65536`.
    pub hidden: usize,
    /// Number of layers, `1..=1024`.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; divides `heads`.
    pub kv_heads: usize,
    /// Width of one head; even.
    pub head_dim: usize,
    /// Number of mHC lanes; must be 4.
    pub lanes: usize,
    /// Width of the Hadamard MLP: a power of two `>= hidden`.
    pub hadamard_dim: usize,
    /// RoPE base, finite and `> 0`.
    pub rope_theta: f64,
    /// Pinned prefix positions of the KV cache.
    pub sink: usize,
    /// Sliding-window length of the KV cache, `>= 1`.
    pub window: usize,
    /// Sinkhorn iterations of the residual router, `1..=1000`.
    pub sinkhorn_iters: usize,
    /// Engram settings, or `None` for a model without engram.
    pub engram: Option<EngramConfig>,
    /// Beginning-of-sequence token id (used by tools, not by `step`).
    pub bos: u32,
    /// End-of-sequence token id (used by tools, not by `step`).
    pub eos: u32,
}

const FIELDS: [&str; 17] = [
    "format",
    "version",
    "vocab",
    "hidden",
    "layers",
    "heads",
    "kv_heads",
    "head_dim",
    "lanes",
    "hadamard_dim",
    "rope_theta",
    "sink",
    "window",
    "sinkhorn_iters",
    "engram",
    "bos",
    "eos",
];

fn in_range(field: &str, v: usize, lo: usize, hi: usize) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(ConfigError::new(
            field,
            format!("{v} is outside {lo}..={hi}"),
        ));
    }
    Ok(())
}

const ENGRAM_FIELDS: [&str; 6] = ["sites", "orders", "hash_heads", "dim", "taps", "dilation"];

/// How a config field must be written in JSON.
enum JsonKind {
    /// A non-negative JSON integer no larger than this.
    Uint(u64),
    /// An array of non-negative JSON integers.
    UintArray,
    /// A JSON string.
    Str,
    /// A JSON number.
    Number,
    /// `null` or an object.
    Engram,
}

fn kind_of(field: &str) -> JsonKind {
    match field {
        "format" => JsonKind::Str,
        "rope_theta" => JsonKind::Number,
        "engram" => JsonKind::Engram,
        "sites" | "orders" => JsonKind::UintArray,
        "version" | "bos" | "eos" => JsonKind::Uint(u32::MAX.into()),
        _ => JsonKind::Uint(usize::MAX as u64),
    }
}

fn check_kind(name: &str, kind: JsonKind, v: &serde_json::Value) -> Result<(), ConfigError> {
    let uint = |v: &serde_json::Value, max: u64| v.as_u64().is_some_and(|n| n <= max);
    let (ok, want) = match kind {
        JsonKind::Uint(max) => (uint(v, max), format!("an integer in 0..={max}")),
        JsonKind::UintArray => (
            v.as_array()
                .is_some_and(|a| a.iter().all(|x| uint(x, usize::MAX as u64))),
            "an array of non-negative integers".to_string(),
        ),
        JsonKind::Str => (v.is_string(), "a string".to_string()),
        JsonKind::Number => (v.is_number(), "a number".to_string()),
        JsonKind::Engram => (
            v.is_null() || v.is_object(),
            "null or an object".to_string(),
        ),
    };
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(name, format!("{v} is not {want}")))
    }
}

/// SPEC §1's JSON-level rules, naming the field: no unknown field, every field
/// present, and each of the JSON type its rule needs (integers as JSON integers).
fn check_fields(obj: &serde_json::Map<String, serde_json::Value>) -> Result<(), ConfigError> {
    let check =
        |obj: &serde_json::Map<String, serde_json::Value>, fields: &[&str], prefix: &str| {
            if let Some(k) = obj.keys().find(|k| !fields.contains(&k.as_str())) {
                return Err(ConfigError::new(
                    format!("{prefix}{k}"),
                    "is not a config field",
                ));
            }
            for &field in fields {
                let name = format!("{prefix}{field}");
                match obj.get(field) {
                    None => return Err(ConfigError::new(name, "is required")),
                    Some(v) => check_kind(&name, kind_of(field), v)?,
                }
            }
            Ok(())
        };
    check(obj, &FIELDS, "")?;
    if let Some(serde_json::Value::Object(e)) = obj.get("engram") {
        check(e, &ENGRAM_FIELDS, "engram.")?;
    }
    Ok(())
}

impl Config {
    /// Parse and validate a config from its JSON text (SPEC §1): every field is
    /// required (`engram` may be `null`), integers must be JSON integers and
    /// unknown fields are rejected.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first offending field.
    pub fn from_json(text: &str) -> Result<Config, ConfigError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ConfigError::new("<json>", e.to_string()))?;
        // serde_json maps keep the last of repeated keys; SPEC §5 forbids them in the
        // header, and a config with a repeated field is just as ambiguous.
        serde_json::from_str::<dupcheck::NoDuplicateKeys>(text)
            .map_err(|e| ConfigError::new("<json>", e.to_string()))?;
        let obj = value
            .as_object()
            .ok_or_else(|| ConfigError::new("<json>", "the config is not a JSON object"))?;
        check_fields(obj)?;
        let config: Config = serde_json::from_value(value).map_err(|e| {
            let msg = e.to_string();
            // serde names unknown fields and type errors in its message; keep it whole.
            let field = msg
                .split('`')
                .nth(1)
                .filter(|_| msg.starts_with("unknown field"))
                .unwrap_or("<json>")
                .to_string();
            ConfigError::new(field, msg)
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Serialize to the JSON text stored as `cqlm.config`.
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Check every rule of SPEC §1.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first offending field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.format != "cqlm" {
            return Err(ConfigError::new(
                "format",
                format!("{:?} is not \"cqlm\"", self.format),
            ));
        }
        if self.version != 1 {
            return Err(ConfigError::new(
                "version",
                format!("{} is not 1", self.version),
            ));
        }
        in_range("vocab", self.vocab, 1, 1 << 24)?;
        in_range("hidden", self.hidden, 1, 65536)?;
        in_range("layers", self.layers, 1, 1024)?;
        in_range("heads", self.heads, 1, 1024)?;
        in_range("kv_heads", self.kv_heads, 1, 1024)?;
        in_range("head_dim", self.head_dim, 1, 1024)?;
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(ConfigError::new(
                "kv_heads",
                format!("{} does not divide heads = {}", self.kv_heads, self.heads),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ConfigError::new(
                "head_dim",
                format!("{} is odd", self.head_dim),
            ));
        }
        if self.lanes != 4 {
            return Err(ConfigError::new(
                "lanes",
                format!("{} is not 4", self.lanes),
            ));
        }
        if !self.hadamard_dim.is_power_of_two()
            || self.hadamard_dim < self.hidden
            || self.hadamard_dim > 1 << 20
        {
            return Err(ConfigError::new(
                "hadamard_dim",
                format!(
                    "{} is not a power of two in hidden ({})..=2^20",
                    self.hadamard_dim, self.hidden
                ),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(ConfigError::new(
                "rope_theta",
                format!("{} is not a finite number > 0", self.rope_theta),
            ));
        }
        if self.window < 1 {
            return Err(ConfigError::new("window", "must be >= 1"));
        }
        if self.sink > 1 << 20 || self.window > 1 << 20 || self.sink + self.window > 1 << 20 {
            return Err(ConfigError::new(
                "window",
                format!(
                    "sink + window = {} + {} exceeds 2^20",
                    self.sink, self.window
                ),
            ));
        }
        in_range("sinkhorn_iters", self.sinkhorn_iters, 1, 1000)?;
        if let Some(e) = &self.engram {
            if e.sites.is_empty() {
                return Err(ConfigError::new("engram.sites", "is empty"));
            }
            for (i, &s) in e.sites.iter().enumerate() {
                if s >= self.layers {
                    return Err(ConfigError::new(
                        "engram.sites",
                        format!("site {s} is not a layer index < {}", self.layers),
                    ));
                }
                if i > 0 && e.sites[i - 1] >= s {
                    return Err(ConfigError::new(
                        "engram.sites",
                        "is not strictly ascending",
                    ));
                }
            }
            if e.orders.is_empty() {
                return Err(ConfigError::new("engram.orders", "is empty"));
            }
            for (i, &n) in e.orders.iter().enumerate() {
                in_range("engram.orders", n, 1, 64)?;
                if e.orders[..i].contains(&n) {
                    return Err(ConfigError::new(
                        "engram.orders",
                        format!("order {n} is repeated"),
                    ));
                }
            }
            in_range("engram.hash_heads", e.hash_heads, 1, 64)?;
            in_range("engram.dim", e.dim, 1, 65536)?;
            in_range("engram.taps", e.taps, 1, 64)?;
            in_range("engram.dilation", e.dilation, 1, 64)?;
        }
        if self.bos as usize >= self.vocab {
            return Err(ConfigError::new(
                "bos",
                format!("{} is not < vocab = {}", self.bos, self.vocab),
            ));
        }
        if self.eos as usize >= self.vocab {
            return Err(ConfigError::new(
                "eos",
                format!("{} is not < vocab = {}", self.eos, self.vocab),
            ));
        }
        Ok(())
    }

    /// `heads · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// `kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// KV head read by query head `h`: `h / (heads / kv_heads)`.
    pub fn group_of_head(&self, h: usize) -> usize {
        h / (self.heads / self.kv_heads)
    }

    /// Physical rows of the KV ring: `sink + window`.
    pub fn cache_rows(&self) -> usize {
        self.sink + self.window
    }

    /// Whether layer `l` is an engram site.
    pub fn is_site(&self, l: usize) -> bool {
        self.engram.as_ref().is_some_and(|e| e.sites.contains(&l))
    }

    /// The `default` preset of SPEC §1.
    pub fn preset_default() -> Config {
        Config {
            format: "cqlm".into(),
            version: 1,
            vocab: 32000,
            hidden: 512,
            layers: 16,
            heads: 8,
            kv_heads: 2,
            head_dim: 64,
            lanes: 4,
            hadamard_dim: 2048,
            rope_theta: 10000.0,
            sink: 4,
            window: 256,
            sinkhorn_iters: 20,
            engram: Some(EngramConfig {
                sites: vec![2, 15],
                orders: vec![2, 3],
                hash_heads: 2,
                dim: 64,
                taps: 4,
                dilation: 3,
            }),
            bos: 1,
            eos: 2,
        }
    }

    /// The `tiny` preset: small enough for exhaustive tests. `hidden = 80` is
    /// deliberately not a multiple of the 32-column group, `sink + window = 10`
    /// wraps the KV ring within a dozen tokens, and `engram.dim = 24` pads its tables.
    pub fn preset_tiny() -> Config {
        Config {
            format: "cqlm".into(),
            version: 1,
            vocab: 256,
            hidden: 80,
            layers: 4,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            lanes: 4,
            hadamard_dim: 128,
            rope_theta: 10000.0,
            sink: 2,
            window: 8,
            sinkhorn_iters: 20,
            engram: Some(EngramConfig {
                sites: vec![1, 3],
                orders: vec![2, 3],
                hash_heads: 2,
                dim: 24,
                taps: 3,
                dilation: 2,
            }),
            bos: 1,
            eos: 2,
        }
    }

    /// The `large` preset: hidden 1024, 24 layers, vocab 64000 (for scaling benchmarks).
    pub fn preset_large() -> Config {
        Config {
            vocab: 64000,
            hidden: 1024,
            layers: 24,
            heads: 16,
            kv_heads: 4,
            head_dim: 64,
            hadamard_dim: 4096,
            engram: Some(EngramConfig {
                sites: vec![2, 23],
                orders: vec![2, 3],
                hash_heads: 2,
                dim: 64,
                taps: 4,
                dilation: 3,
            }),
            ..Config::preset_default()
        }
    }

    /// A preset by name: `tiny`, `default` or `large`.
    pub fn preset(name: &str) -> Option<Config> {
        match name {
            "tiny" => Some(Self::preset_tiny()),
            "default" => Some(Self::preset_default()),
            "large" => Some(Self::preset_large()),
            _ => None,
        }
    }
}
