//! The per-step input buffer: the only data the host writes for a token step.
//!
//! Layout (u32 words): `[0]` token, `[1]` logical position `t`, `[2]` physical KV
//! slot of `t`, `[3]` number of engram tables, then `head_dim/2` RoPE cosines and
//! `head_dim/2` sines (f32 bit patterns, computed in f64 on the host, SPEC §4.3),
//! then one row index per engram table (gather order), then the index of the
//! sequence the token belongs to (0 in an engine of one sequence; a
//! [`super::GpuBatch`]'s slot), whose KV cache and scores attention uses.

use crate::kernels::kv::physical_slot;
use crate::kernels::rope::rope_table;
use crate::model::config::Config;
use crate::model::engram::{table_rows_for, TokenHistory};

/// Word offsets inside the step buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLayout {
    /// `head_dim / 2`.
    pub half: usize,
    /// Engram tables (0 without engram).
    pub tables: usize,
}

impl StepLayout {
    /// The layout for a config.
    pub fn new(c: &Config) -> StepLayout {
        StepLayout {
            half: c.head_dim / 2,
            tables: c.engram.as_ref().map_or(0, |e| e.tables()),
        }
    }
    /// Word of the token.
    pub const TOKEN: usize = 0;
    /// Word of the logical position `t`.
    pub const POS: usize = 1;
    /// Word of the physical KV slot.
    pub const SLOT: usize = 2;
    /// First RoPE cosine.
    pub fn cos_at(&self) -> usize {
        4
    }
    /// First RoPE sine.
    pub fn sin_at(&self) -> usize {
        4 + self.half
    }
    /// First engram row index.
    pub fn rows_at(&self) -> usize {
        4 + 2 * self.half
    }
    /// Word of the sequence index.
    pub fn seq_at(&self) -> usize {
        4 + 2 * self.half + self.tables
    }
    /// Total words.
    pub fn words(&self) -> usize {
        5 + 2 * self.half + self.tables
    }

    /// Fill `out` (length [`StepLayout::words`]) for `token` of sequence `seq` at
    /// position `t`, with RoPE at `rope_pos` (always `t`, except in
    /// fault-injection tests); `cos` and `sin` are scratch of `head_dim/2` entries
    /// (no allocation per step).
    #[allow(clippy::too_many_arguments)]
    pub fn fill(
        &self,
        c: &Config,
        token: u32,
        seq: usize,
        t: u64,
        rope_pos: u64,
        table_rows: &[usize],
        cos: &mut [f32],
        sin: &mut [f32],
        out: &mut [u32],
    ) {
        out[Self::TOKEN] = token;
        out[Self::POS] = t as u32;
        out[Self::SLOT] = physical_slot(t, c.sink, c.window) as u32;
        out[3] = self.tables as u32;
        rope_table(rope_pos, c.rope_theta, c.head_dim, cos, sin);
        for i in 0..self.half {
            out[self.cos_at() + i] = cos[i].to_bits();
            out[self.sin_at() + i] = sin[i].to_bits();
        }
        for (k, &r) in table_rows.iter().enumerate() {
            out[self.rows_at() + k] = r as u32;
        }
        out[self.seq_at()] = seq as u32;
    }
}

/// The host side of the step input: the token history (for the engram rows) and
/// the scratch the step buffer's words are computed in, allocated once.
#[derive(Debug)]
pub(crate) struct StepInput {
    pub layout: StepLayout,
    history: TokenHistory,
    table_rows: Vec<usize>,
    rows: Vec<usize>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// The words of a chunk's step inputs, one slot each.
    pub words: Vec<u32>,
    /// Rotate by the physical slot instead of the position (fault injection).
    rope_at_slot: bool,
}

impl StepInput {
    /// The input of `c`'s steps, with engram tables of `table_rows` rows.
    pub(crate) fn new(c: &Config, table_rows: Vec<usize>, rope_at_slot: bool) -> StepInput {
        StepInput {
            layout: StepLayout::new(c),
            history: TokenHistory::default(),
            rows: Vec::with_capacity(table_rows.len()),
            table_rows,
            cos: vec![0.0; c.head_dim / 2],
            sin: vec![0.0; c.head_dim / 2],
            words: Vec::new(),
            rope_at_slot,
        }
    }

    /// The input of `model`'s steps (its engram tables' rows).
    pub(crate) fn for_model(model: &crate::model::weights::Model, rope_at_slot: bool) -> StepInput {
        let table_rows = model
            .weights
            .engram
            .as_ref()
            .map_or(Vec::new(), |e| e.tables.iter().map(|t| t.rows()).collect());
        StepInput::new(&model.config, table_rows, rope_at_slot)
    }

    /// Append `token` at position `t` of sequence `seq` to the history and fill
    /// slot `slot` (of `stride` words) of [`StepInput::words`] for it, growing the
    /// words as needed.
    pub(crate) fn fill(
        &mut self,
        c: &Config,
        token: u32,
        seq: usize,
        t: u64,
        slot: usize,
        stride: usize,
    ) {
        self.history.push(token);
        if let Some(e) = &c.engram {
            table_rows_for(&self.history, e, &self.table_rows, &mut self.rows);
        }
        let rope_pos = if self.rope_at_slot {
            physical_slot(t, c.sink, c.window) as u64
        } else {
            t
        };
        let n = self.layout.words();
        if self.words.len() < slot * stride + n {
            self.words.resize(slot * stride + n, 0);
        }
        let out = &mut self.words[slot * stride..slot * stride + n];
        self.layout.fill(
            c,
            token,
            seq,
            t,
            rope_pos,
            &self.rows,
            &mut self.cos,
            &mut self.sin,
            out,
        );
    }

    /// The token history (for a saved sequence).
    pub(crate) fn history(&self) -> &TokenHistory {
        &self.history
    }

    /// Continue from `history` (a restored sequence).
    pub(crate) fn set_history(&mut self, history: TokenHistory) {
        self.history = history;
    }

    /// Forget the history (a reset).
    pub(crate) fn clear(&mut self) {
        self.history.clear();
    }
}
