//! Packing weights into u32 "arena" buffers: packed indices as words, norms as f16
//! pairs, codebooks and F32 tensors as f32 bit patterns. Each arena stays within the
//! device's storage-binding limit; a matrix too large for one arena is split by rows.

use crate::cq::CqMatrix;
use crate::error::{Error, Result};
use crate::gpu::GpuContext;

/// Where one row range of a CQ matrix lives in an arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqPart {
    /// Arena index.
    pub arena: usize,
    /// Word offset of the part's first packed row.
    pub packed_off: u32,
    /// f16 offset (from the arena's start) of the part's first norm.
    pub norms_off: u32,
    /// Word offset of the codebook (`2^bits` f32).
    pub cb_off: u32,
    /// First matrix row held by this part.
    pub first_row: usize,
    /// Rows held.
    pub rows: usize,
}

/// A CQ matrix laid out in arenas: geometry plus one or more row parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuCq {
    /// Output rows.
    pub rows: usize,
    /// Logical columns.
    pub cols: usize,
    /// Bits per index.
    pub bits: u32,
    /// Columns per group.
    pub group: usize,
    /// Groups per row.
    pub groups: usize,
    /// Row parts in ascending row order, covering `0..rows`.
    pub parts: Vec<CqPart>,
}

impl GpuCq {
    /// `u32` words per packed row.
    pub fn row_words(&self) -> usize {
        self.groups * self.group * self.bits as usize / 32
    }
    /// `u32` words per (row, group).
    pub fn group_words(&self) -> usize {
        self.group * self.bits as usize / 32
    }
    /// `groups · group`.
    pub fn padded(&self) -> usize {
        self.groups * self.group
    }
    /// The parts covering rows `first .. first + count`, each clipped to that range,
    /// as (part, first row within the part's matrix rows, count).
    pub fn parts_for(&self, first: usize, count: usize) -> Vec<(CqPart, usize, usize)> {
        let end = first + count;
        self.parts
            .iter()
            .filter_map(|p| {
                let lo = first.max(p.first_row);
                let hi = end.min(p.first_row + p.rows);
                (lo < hi).then_some((*p, lo, hi - lo))
            })
            .collect()
    }
}

/// Builds arenas of at most `limit_words` words each.
#[derive(Debug)]
pub struct ArenaBuilder {
    limit_words: usize,
    /// Finished and current arenas' words.
    pub arenas: Vec<Vec<u32>>,
}

impl ArenaBuilder {
    /// A builder whose arenas hold at most `limit_bytes` bytes (rounded down to words, at least 1 KiB).
    pub fn new(limit_bytes: u64) -> ArenaBuilder {
        ArenaBuilder {
            limit_words: ((limit_bytes / 4) as usize).max(256),
            arenas: vec![Vec::new()],
        }
    }

    fn room(&mut self, words: usize) -> usize {
        let cur = self.arenas.len() - 1;
        if !self.arenas[cur].is_empty() && self.arenas[cur].len() + words > self.limit_words {
            self.arenas.push(Vec::new());
        }
        self.arenas.len() - 1
    }

    /// Append a CQ matrix, split by rows where one arena can't hold it.
    /// `None` if even one row (plus codebook and norms) exceeds an arena.
    pub fn push_cq(&mut self, m: &CqMatrix) -> Option<GpuCq> {
        let row_words = m.row_bytes() / 4;
        let norm_words_per_row = m.groups().div_ceil(2);
        let cb = m.codebook().len();
        let per_row = row_words + norm_words_per_row + 1;
        let max_rows = self.limit_words.saturating_sub(cb + 7) / per_row;
        if max_rows == 0 {
            return None;
        }
        let norms = m.norms_f16();
        let mut parts = Vec::new();
        let mut first = 0;
        while first < m.rows() {
            let rows = max_rows.min(m.rows() - first);
            let words = cb + 6 + rows * row_words + (rows * m.groups()).div_ceil(2);
            let a = self.room(words);
            let arena = &mut self.arenas[a];
            let cb_off = arena.len() as u32;
            arena.extend(m.codebook().iter().map(|x| x.to_bits()));
            // Packed rows start on a 16-byte boundary, so kernels may read them
            // as vec4<u32> where a row's words come in fours.
            arena.resize(arena.len().next_multiple_of(4), 0);
            let packed_off = arena.len() as u32;
            let bytes = &m.packed()[first * m.row_bytes()..(first + rows) * m.row_bytes()];
            arena.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
            let norms_off = arena.len() as u32 * 2;
            let ns = &norms[first * m.groups()..(first + rows) * m.groups()];
            arena.extend(ns.chunks(2).map(|p| {
                let lo = p[0].to_bits() as u32;
                let hi = p.get(1).map_or(0, |h| h.to_bits() as u32);
                lo | (hi << 16)
            }));
            // Arenas stay a whole number of vec4<u32> long.
            arena.resize(arena.len().next_multiple_of(4), 0);
            parts.push(CqPart {
                arena: a,
                packed_off,
                norms_off,
                cb_off,
                first_row: first,
                rows,
            });
            first += rows;
        }
        Some(GpuCq {
            rows: m.rows(),
            cols: m.cols(),
            bits: m.bits(),
            group: m.group(),
            groups: m.groups(),
            parts,
        })
    }

    /// Upload every arena as a storage buffer labelled `{label} {i}` (arena `i`),
    /// in arena order, so a [`CqPart::arena`] indexes the result.
    ///
    /// # Errors
    /// [`Error::Gpu`] if an arena is larger than the device's storage binding or
    /// buffer size limit (a builder made for a larger device).
    pub fn upload(&self, ctx: &GpuContext, label: &str) -> Result<Vec<wgpu::Buffer>> {
        let limit = ctx.caps.max_storage_binding.min(ctx.caps.max_buffer);
        self.arenas
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let bytes = a.len() as u64 * 4;
                if bytes > limit {
                    return Err(Error::Gpu(format!(
                        "{label} {i} holds {bytes} bytes, over the device's storage binding limit of {limit} bytes"
                    )));
                }
                Ok(ctx.storage_init(&format!("{label} {i}"), bytemuck::cast_slice(a)))
            })
            .collect()
    }
}
