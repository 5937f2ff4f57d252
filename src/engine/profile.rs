//! Per-kernel timings of a decode step, shared by both backends and `cqlm profile`.
//!
//! A [`KernelProfile`] holds one [`ProfileRow`] per kernel name, averaged over the
//! profiled tokens, and the step's wall time. The GPU engine fills it from
//! timestamp queries (or, without them, from one submit per dispatch), see
//! [`crate::GpuEngine::profile`]; the CPU engine from [`std::time::Instant`] at the
//! same kernel boundaries, see [`crate::CpuEngine::profile`]. Kernel names are the
//! GPU's (`gather`, `prepare`, `matvec1/2/4/8`, `engram_conv`, `premix`,
//! `qk_store`, `attend`, `mlp`, `route`); the CPU step is cut at the matching
//! points, so its `prepare` includes the norm before a matvec and its `mlp` the
//! attention residual and the `− u` of the update, as on the GPU.

use serde::Serialize;
use std::collections::HashMap;

/// How a profile times the GPU's dispatches (the CPU ignores it: it times at
/// its kernel boundaries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Timing {
    /// Timestamp queries where the device has them enabled, else [`Timing::PerDispatch`].
    #[default]
    Auto,
    /// Timestamp queries inside the compute pass (an error where the device lacks them).
    Timestamps,
    /// One submit and wait per dispatch: works on every device, but each time
    /// includes the submit and wait overhead.
    PerDispatch,
}

/// One kernel of the step, averaged over the profiled tokens.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileRow {
    /// Kernel name (the GPU entry point's, or the CPU's matching boundary).
    pub name: String,
    /// Dispatches (GPU) or timed calls (CPU) per token.
    pub calls_per_token: usize,
    /// Total seconds per token over those calls.
    pub seconds_per_token: f64,
    /// Estimated bytes read and written per token (weights, activations, cache).
    pub bytes_per_token: u64,
}

impl ProfileRow {
    /// Effective bandwidth in GB/s (10⁹ bytes): bytes moved over time taken (0 for no time).
    pub fn gb_per_s(&self) -> f64 {
        if self.seconds_per_token > 0.0 {
            self.bytes_per_token as f64 / self.seconds_per_token / 1e9
        } else {
            0.0
        }
    }
}

/// Per-kernel timings of a decode step, sorted by time (largest first).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelProfile {
    /// One row per kernel name, sorted by `seconds_per_token`, largest first.
    pub rows: Vec<ProfileRow>,
    /// Mean wall time of a profiled step in seconds, on the host: from writing
    /// the step's input to the last readback (GPU) or to the logits (CPU).
    pub step_seconds: f64,
    /// Profiled tokens (decode steps with logits).
    pub tokens: usize,
    /// How the times were measured, in words.
    pub method: String,
}

impl KernelProfile {
    /// Sum of the rows' seconds per token.
    pub fn kernel_seconds(&self) -> f64 {
        self.rows.iter().map(|r| r.seconds_per_token).sum()
    }

    /// Sum of the rows' calls per token (for the GPU: dispatches per token).
    pub fn calls_per_token(&self) -> usize {
        self.rows.iter().map(|r| r.calls_per_token).sum()
    }

    /// Sum of the rows' bytes per token.
    pub fn bytes_per_token(&self) -> u64 {
        self.rows.iter().map(|r| r.bytes_per_token).sum()
    }

    /// `row`'s share of the step's wall time (0 when the step took no time).
    pub fn share(&self, row: &ProfileRow) -> f64 {
        if self.step_seconds > 0.0 {
            row.seconds_per_token / self.step_seconds
        } else {
            0.0
        }
    }
}

/// Receives the kernel boundaries of a timed step: one call per kernel run.
pub trait KernelTimer {
    /// Kernel `name` ran for `seconds` and moved about `bytes` bytes.
    fn kernel(&mut self, name: &'static str, seconds: f64, bytes: u64);
}

/// A [`KernelTimer`] that sums calls, seconds and bytes per kernel name.
#[derive(Debug, Clone, Default)]
pub struct KernelTally {
    /// name → (calls, seconds, bytes), in first-seen order.
    totals: Vec<(&'static str, usize, f64, u64)>,
    index: HashMap<&'static str, usize>,
}

impl KernelTimer for KernelTally {
    fn kernel(&mut self, name: &'static str, seconds: f64, bytes: u64) {
        let i = *self.index.entry(name).or_insert_with(|| {
            self.totals.push((name, 0, 0.0, 0));
            self.totals.len() - 1
        });
        let t = &mut self.totals[i];
        t.1 += 1;
        t.2 += seconds;
        t.3 += bytes;
    }
}

impl KernelTally {
    /// Average the totals over `tokens` steps (integer calls and bytes per token)
    /// into a profile whose step took `step_seconds_total / tokens` on average.
    pub fn into_profile(
        self,
        tokens: usize,
        step_seconds_total: f64,
        method: &str,
    ) -> KernelProfile {
        let n = tokens.max(1);
        let mut rows: Vec<ProfileRow> = self
            .totals
            .into_iter()
            .map(|(name, calls, secs, bytes)| ProfileRow {
                name: name.to_string(),
                calls_per_token: calls / n,
                seconds_per_token: secs / n as f64,
                bytes_per_token: bytes / n as u64,
            })
            .collect();
        rows.sort_by(|a, b| b.seconds_per_token.total_cmp(&a.seconds_per_token));
        KernelProfile {
            rows,
            step_seconds: step_seconds_total / n as f64,
            tokens,
            method: method.to_string(),
        }
    }
}

/// Byte estimates of the step's kernels: what each reads and writes, from the
/// tensor sizes (f32 activations and vectors, packed CQ rows with f16 norms and
/// f32 codebooks, int8 cache codes with f32 scales). Shared by the GPU dispatches
/// and the CPU timing so both report the same traffic.
pub mod bytes {
    use crate::cq::CqMatrix;

    const F32: u64 = 4;

    /// mHC pre-mix: reads 4 lanes, the 4 `p_pre` and `a_pre`, `b_pre[4]`; writes
    /// `u` and `b`; at an engram site also reads the key, the value and both norms.
    pub fn premix(hidden: usize, site: bool) -> u64 {
        let h = hidden as u64;
        F32 * (6 * h + 9 + if site { 4 * h } else { 0 })
    }

    /// mHC routing: reads 4 lanes, the update and the 20 `p_post`/`p_res` with
    /// their 22 `a`/`b` parameters; writes 4 lanes.
    pub fn route(hidden: usize) -> u64 {
        F32 * (9 * hidden as u64 + 42)
    }

    /// Attention residual, Hadamard MLP and update: reads `b`, `u`, `attn`, two
    /// norms, the scale and `d1 d2 d3`; writes `after` and `update` (workgroup
    /// scratch not counted).
    pub fn mlp(hidden: usize, hadamard_dim: usize) -> u64 {
        F32 * (7 * hidden as u64 + 1 + 3 * hadamard_dim as u64)
    }

    /// Bytes of one cached int8 vector (codes padded to whole u32 words) with its scale.
    fn cached_vector(head_dim: usize) -> u64 {
        head_dim.div_ceil(4) as u64 * 4 + F32
    }

    /// Q/K norm, RoPE and KV store: reads `q k v`, both norms and the RoPE table;
    /// writes `q k` in place and one key and one value per KV head to the cache.
    pub fn qk_store(heads: usize, kv_heads: usize, head_dim: usize) -> u64 {
        let (q, kv, d) = (heads as u64, kv_heads as u64, head_dim as u64);
        F32 * ((2 * q + 3 * kv + 3) * d) + 2 * kv * cached_vector(head_dim)
    }

    /// Attention over `attended` cached positions: reads `q` and the gate, for every
    /// query head the key and value of each attended position (as the kernel reads
    /// them, once per query head), writes and rereads the scores, writes `o`.
    pub fn attend(heads: usize, head_dim: usize, attended: usize) -> u64 {
        let (q, d, s) = (heads as u64, head_dim as u64, attended as u64);
        F32 * 3 * q * d + q * s * (2 * cached_vector(head_dim) + 2 * F32)
    }

    /// Engram convolution: reads `v`, `taps` conv rows and `taps` ring rows; writes
    /// the ring row and the value.
    pub fn engram_conv(hidden: usize, taps: usize) -> u64 {
        let h = hidden as u64;
        F32 * (3 * h + 2 * taps as u64 * h)
    }

    /// Gather of one row of `m` (packed row, norms, codebook), written `copies` times.
    pub fn gather(m: &CqMatrix, copies: usize) -> u64 {
        gather_geometry(m.row_bytes(), m.groups(), m.bits(), m.cols(), copies)
    }

    /// [`gather`] from the matrix's geometry alone (`row_bytes` per packed row,
    /// `groups` norms, `bits`, `cols`), as the GPU's arena layout knows it.
    pub fn gather_geometry(
        row_bytes: usize,
        groups: usize,
        bits: u32,
        cols: usize,
        copies: usize,
    ) -> u64 {
        (row_bytes + groups * 2 + (4 << bits) + cols * copies * 4) as u64
    }

    /// Prepare of `n` inputs (`lanes` values each, plus a gain when `gain`) into a
    /// prepared vector of `padded` values.
    pub fn prepare(n: usize, lanes: usize, gain: bool, padded: usize) -> u64 {
        F32 * (n * (lanes + gain as usize) + padded) as u64
    }

    /// Matvec of `rows` rows of `m`: packed rows, their norms and one output each,
    /// the codebook and the prepared input once.
    pub fn matvec(m: &CqMatrix, rows: usize) -> u64 {
        let input = m.padded() as u64 * F32;
        matvec_dispatch(rows, m.row_bytes(), m.groups(), m.bits(), 1, 1, input)
    }

    /// One GPU matvec dispatch: `rows` rows of `parts` fused parts that share a
    /// geometry (`row_bytes` per packed row, `groups` f16 norms per row, `bits`),
    /// for `tokens` inputs of `input` bytes each. The packed rows, their norms and
    /// each part's codebook are read once; per input the input and one output per
    /// row. [`matvec`] is one part and one prepared input.
    pub fn matvec_dispatch(
        rows: usize,
        row_bytes: usize,
        groups: usize,
        bits: u32,
        parts: usize,
        tokens: usize,
        input: u64,
    ) -> u64 {
        let r = rows as u64;
        r * (row_bytes as u64 + groups as u64 * 2)
            + parts as u64 * (4u64 << bits)
            + tokens as u64 * (r * F32 + input)
    }

    /// The GPU kernel name of a matvec of `bits`-bit indices (`matvec1/2/4/8`).
    pub fn matvec_name(bits: u32) -> &'static str {
        match bits {
            1 => "matvec1",
            2 => "matvec2",
            4 => "matvec4",
            _ => "matvec8",
        }
    }
}

/// The token of sequence `seq` at position `i` that [`profile_batch`] feeds: a
/// fixed pseudo-random id below `vocab` (the same for every run).
fn profile_token(seq: usize, i: usize, vocab: usize) -> u32 {
    let v = vocab.max(1) as u64;
    ((((i as u64).wrapping_mul(2654435761)).wrapping_add(seq as u64 * 40503) >> 7) % v) as u32
}

/// Profile `passes` batch passes of one token of every slot in `slots` through
/// `batch` (what `cqlm profile --sequences N` and the server's
/// `GET /v1/cqlm/profile` run): each slot is reset and prefills its own fixed
/// `prompt_len`-token prompt unprofiled, then every kernel of each pass is
/// timed as `timing` says, averaged per pass. The slots are left holding the
/// profile's tokens (reset them before use).
///
/// # Errors
/// [`crate::Error::InvalidArgument`] for no slots, a slot out of range or
/// repeated, or `passes == 0`; the engine's step errors.
pub fn profile_batch(
    batch: &mut dyn crate::engine::BatchEngine,
    slots: &[usize],
    prompt_len: usize,
    passes: usize,
    timing: Timing,
) -> crate::Result<KernelProfile> {
    use crate::engine::{Readout, SlotStep};
    if passes == 0 || slots.is_empty() {
        return Err(crate::Error::InvalidArgument(
            "a profile needs at least one slot and one pass".into(),
        ));
    }
    if let Some(&s) = slots.iter().find(|&&s| s >= batch.slots()) {
        return Err(crate::Error::InvalidArgument(format!(
            "slot {s} is not < the batch's {} slots",
            batch.slots()
        )));
    }
    let vocab = batch.model().config.vocab;
    for &s in slots {
        batch.reset(s);
    }
    if prompt_len > 0 {
        let prompts: Vec<Vec<u32>> = (0..slots.len())
            .map(|k| {
                (0..prompt_len)
                    .map(|i| profile_token(k, i, vocab))
                    .collect()
            })
            .collect();
        let work: Vec<SlotStep<'_>> = (slots.iter().zip(&prompts))
            .map(|(&s, p)| SlotStep::new(s, p, Readout::None))
            .collect();
        batch.step(&work)?;
    }
    let mut tally = KernelTally::default();
    let (mut wall, mut method) = (0.0, String::new());
    for p in 0..passes {
        let ids: Vec<[u32; 1]> = (0..slots.len())
            .map(|k| [profile_token(k, prompt_len + p, vocab)])
            .collect();
        let work: Vec<SlotStep<'_>> = (slots.iter().zip(&ids))
            .map(|(&s, t)| SlotStep::new(s, t, Readout::Argmax))
            .collect();
        let t0 = std::time::Instant::now();
        method = batch.step_timed(&work, timing, &mut tally)?;
        wall += t0.elapsed().as_secs_f64();
    }
    Ok(tally.into_profile(passes, wall, &method))
}

impl KernelProfile {
    /// The rows as JSON objects (`kernel`, `calls_per_token`, `us_per_token`,
    /// `share`, `bytes_per_token`, `gb_per_s`), as `cqlm profile --json` prints them.
    pub fn rows_json(&self) -> Vec<serde_json::Value> {
        self.rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "kernel": r.name,
                    "calls_per_token": r.calls_per_token,
                    "us_per_token": r.seconds_per_token * 1e6,
                    "share": self.share(r),
                    "bytes_per_token": r.bytes_per_token,
                    "gb_per_s": r.gb_per_s(),
                })
            })
            .collect()
    }
}

/// `v` with every object key `…_per_token` renamed `…_per_pass` (a batch
/// profile averages per pass, and says so in every key).
pub fn per_pass(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (k.replace("_per_token", "_per_pass"), per_pass(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(per_pass).collect()),
        v => v,
    }
}
