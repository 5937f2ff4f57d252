//! SPEC §2: the codebook-quantized matrix: its validation, accessors, row
//! gather (`dequantize_row`) and scalar row dot products (`row_dot`, on the
//! group loops of `scalar.rs`). Its other kernels live beside it: `prepare.rs`,
//! `scalar.rs` (the reference loops) and `matvec.rs` (SIMD dispatch and threads).

use super::fwht::nfwht;
use super::scalar::{dot_generic, Lut};
use half::f16;

/// A codebook-quantized matrix (SPEC §2): `rows × cols` logical weights stored as
/// `bits`-bit codebook indices in groups of `group` Hadamard-rotated columns, one
/// f16 norm per (row, group).
///
/// Invariants (checked by [`CqMatrix::new`]): `bits ∈ {1,2,4,8}`, `group` a power of
/// two `>= 32`, `cols <= groups·group < cols + group`, and the buffers have the
/// matching lengths.
#[derive(Debug, Clone)]
pub struct CqMatrix {
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) bits: u32,
    pub(super) group: usize,
    pub(super) groups: usize,
    pub(super) codebook: Vec<f32>,
    pub(super) norms: Vec<f32>,
    pub(super) packed: Vec<u8>,
    pub(super) lut: Lut,
}

impl CqMatrix {
    /// Build a matrix from its three stored tensors and its role's `cols`.
    ///
    /// * `codebook`: `2^bits` levels, `bits ∈ {1,2,4,8}`.
    /// * `norms`: `[rows, groups]` row-major, `groups >= 1`.
    /// * `packed`: `[rows, row_bytes]` row-major with `row_bytes = groups·group·bits/8`.
    ///
    /// # Errors
    /// A message saying which rule of SPEC §2 is broken.
    pub fn new(
        cols: usize,
        codebook: Vec<f32>,
        norms: Vec<f16>,
        norms_shape: [usize; 2],
        packed: Vec<u8>,
        packed_shape: [usize; 2],
    ) -> std::result::Result<CqMatrix, String> {
        let [rows, groups] = norms_shape;
        let bits = match codebook.len() {
            2 => 1u32,
            4 => 2,
            16 => 4,
            256 => 8,
            n => {
                return Err(format!(
                    "codebook has {n} entries, expected 2, 4, 16 or 256"
                ))
            }
        };
        if groups == 0 {
            return Err("norms have 0 groups".into());
        }
        if packed_shape[0] != rows {
            return Err(format!(
                "packed has {} rows but norms have {rows}",
                packed_shape[0]
            ));
        }
        if norms.len() != rows * groups || packed.len() != rows * packed_shape[1] {
            return Err("buffer lengths do not match the shapes".into());
        }
        let bits_per_row = packed_shape[1]
            .checked_mul(8)
            .ok_or("packed row width overflows")?;
        let denom = bits as usize * groups;
        if bits_per_row % denom != 0 {
            return Err(format!(
                "packed row of {} bytes is not a whole number of {groups} groups of {bits}-bit indices",
                packed_shape[1]
            ));
        }
        let group = bits_per_row / denom;
        if group < 32 || !group.is_power_of_two() {
            return Err(format!("group {group} is not a power of two >= 32"));
        }
        let padded = groups * group;
        if !(cols <= padded && padded < cols + group) {
            return Err(format!(
                "padded width {groups}·{group} = {padded} does not fit cols {cols} (need cols <= padded < cols + group)"
            ));
        }
        let norms: Vec<f32> = norms.into_iter().map(f32::from).collect();
        Ok(Self::from_parts(
            rows, cols, bits, group, groups, codebook, norms, packed,
        ))
    }

    /// Assemble from already-validated parts (norms must be exact f16 values).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        rows: usize,
        cols: usize,
        bits: u32,
        group: usize,
        groups: usize,
        codebook: Vec<f32>,
        norms: Vec<f32>,
        packed: Vec<u8>,
    ) -> CqMatrix {
        let lut = Lut::build(bits, &codebook);
        CqMatrix {
            rows,
            cols,
            bits,
            group,
            groups,
            codebook,
            norms,
            packed,
            lut,
        }
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Logical input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bits per index: 1, 2, 4 or 8.
    pub fn bits(&self) -> u32 {
        self.bits
    }
    /// Columns per group (power of two >= 32).
    pub fn group(&self) -> usize {
        self.group
    }
    /// Groups per row.
    pub fn groups(&self) -> usize {
        self.groups
    }
    /// `groups · group`: the prepared input length.
    pub fn padded(&self) -> usize {
        self.groups * self.group
    }
    /// Bytes of one packed row: `padded · bits / 8`.
    pub fn row_bytes(&self) -> usize {
        self.padded() * self.bits as usize / 8
    }
    /// The `2^bits` codebook levels.
    pub fn codebook(&self) -> &[f32] {
        &self.codebook
    }
    /// Norms `[rows, groups]`, widened from f16 (exactly).
    pub fn norms(&self) -> &[f32] {
        &self.norms
    }
    /// Norms `[rows, groups]` as stored (f16).
    pub fn norms_f16(&self) -> Vec<f16> {
        self.norms.iter().map(|&v| f16::from_f32(v)).collect()
    }
    /// Packed indices `[rows, row_bytes]`, LSB first.
    pub fn packed(&self) -> &[u8] {
        &self.packed
    }
    /// Bytes of all three tensors as stored in an archive.
    pub fn stored_bytes(&self) -> usize {
        self.packed.len() + self.norms.len() * 2 + self.codebook.len() * 4
    }

    /// Codebook index of column `c` (`c < padded`) in row `r`, straight from SPEC §2.
    pub fn index(&self, r: usize, c: usize) -> usize {
        let bit = c * self.bits as usize;
        let byte = self.packed[r * self.row_bytes() + (bit >> 3)];
        ((byte >> (bit & 7)) as usize) & ((1usize << self.bits) - 1)
    }

    /// `dequantize_row(P, r)` into `out` (length `cols`): per group
    /// `norms[r,k] · nfwht(q[r, group k])`, padding columns dropped.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols`.
    pub fn dequantize_row_into(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "dequantize_row: row out of range");
        assert_eq!(out.len(), self.cols, "dequantize_row: output length");
        let row = &self.packed[r * self.row_bytes()..(r + 1) * self.row_bytes()];
        let group_bytes = self.group * self.bits as usize / 8;
        let mut tail = Vec::new();
        for (k, bytes) in row.chunks_exact(group_bytes).enumerate() {
            let start = k * self.group;
            if start >= self.cols {
                break;
            }
            // A whole group is formed in place; a ragged last one in a copy.
            let end = start + self.group;
            let norm = self.norms[r * self.groups + k];
            if end <= self.cols {
                let g = &mut out[start..end];
                self.group_levels(bytes, norm, g);
                nfwht(g);
            } else {
                tail.resize(self.group, 0.0);
                self.group_levels(bytes, norm, &mut tail);
                nfwht(&mut tail);
                out[start..].copy_from_slice(&tail[..self.cols - start]);
            }
        }
    }

    /// `norm · codebook[idx]` of every index of one group's packed `bytes`
    /// into `out` (SPEC §2's index order: LSB first).
    fn group_levels(&self, bytes: &[u8], norm: f32, out: &mut [f32]) {
        let bits = self.bits as usize;
        let per = 8 / bits;
        let mask = ((1u16 << bits) - 1) as u8;
        let cb = &self.codebook;
        for (o, &byte) in out.chunks_exact_mut(per).zip(bytes) {
            for (p, v) in o.iter_mut().enumerate() {
                *v = norm * cb[usize::from((byte >> (p * bits)) & mask)];
            }
        }
    }

    /// Rows `first .. first + out.len()` of `P · prep`, one [`CqMatrix::row_dot`] each.
    pub(super) fn rows_into(&self, prep: &[f32], first: usize, out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.row_dot(first + i, prep);
        }
    }

    /// `Σ_k norms[r,k] · Σ_{c in group k} q[r,c] · prep[c]` with the specialised inner loops.
    fn row_dot(&self, r: usize, prep: &[f32]) -> f32 {
        let rb = self.row_bytes();
        let gb = self.group * self.bits as usize / 8;
        let row = &self.packed[r * rb..(r + 1) * rb];
        let norms = &self.norms[r * self.groups..(r + 1) * self.groups];
        let mut sum = 0.0f32;
        for ((bytes, x), &n) in row
            .chunks_exact(gb)
            .zip(prep.chunks_exact(self.group))
            .zip(norms)
        {
            sum += n * self.lut.dot(&self.codebook, self.bits, bytes, x);
        }
        sum
    }

    /// The scalar reference inner loop for any bit width (used for 1 and 8 bits,
    /// and by tests to check the LUT paths).
    #[doc(hidden)]
    pub fn row_dot_generic(&self, r: usize, prep: &[f32]) -> f32 {
        let rb = self.row_bytes();
        let gb = self.group * self.bits as usize / 8;
        let row = &self.packed[r * rb..(r + 1) * rb];
        let mut sum = 0.0f32;
        for (k, (bytes, x)) in row
            .chunks_exact(gb)
            .zip(prep.chunks_exact(self.group))
            .enumerate()
        {
            sum +=
                self.norms[r * self.groups + k] * dot_generic(&self.codebook, self.bits, bytes, x);
        }
        sum
    }
}
