//! SPEC §2: the codebook-quantized matrix and its CPU kernels (prepare, matvec, row gather).

use super::fwht::nfwht;
use super::simd::{self, CpuKernels, Plan};
use crate::error::{Error, Result};
use crate::pool::{Pool, SharedSlice};
use half::f16;

/// Byte lookup tables of SEED §3: one packed byte yields 4 (2-bit) or 2 (4-bit) levels.
#[derive(Debug, Clone)]
enum Lut {
    None,
    Two(Box<[[f32; 4]; 256]>),
    Four(Box<[[f32; 2]; 256]>),
}

/// A codebook-quantized matrix (SPEC §2): `rows × cols` logical weights stored as
/// `bits`-bit codebook indices in groups of `group` Hadamard-rotated columns, one
/// f16 norm per (row, group).
///
/// Invariants (checked by [`CqMatrix::new`]): `bits ∈ {1,2,4,8}`, `group` a power of
/// two `>= 32`, `cols <= groups·group < cols + group`, and the buffers have the
/// matching lengths.
#[derive(Debug, Clone)]
pub struct CqMatrix {
    rows: usize,
    cols: usize,
    bits: u32,
    group: usize,
    groups: usize,
    codebook: Vec<f32>,
    norms: Vec<f32>,
    packed: Vec<u8>,
    lut: Lut,
}

/// How the batched kernel wants its inputs: each prepared input permuted for an
/// 8-lane plan at a bit width (see [`CqMatrix::batch_layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchLayout {
    plan: Plan,
    bits: u32,
}

impl BatchLayout {
    /// Lay out prepared inputs (`[tokens, padded]`) into `dst` (the same length).
    pub(crate) fn lay_out(&self, preps: &[f32], dst: &mut [f32]) {
        self.plan.permute_into(self.bits, preps, dst);
    }
}

/// The inputs of a batched matvec.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BatchIn<'a> {
    /// Prepared inputs, `[tokens, padded]`.
    Prepared(&'a [f32]),
    /// Prepared inputs laid out by [`BatchLayout::lay_out`].
    LaidOut(&'a [f32]),
}

thread_local! {
    /// The prepared activation in the SIMD kernels' order (reused between calls).
    static PERMUTED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Packed rows at or above this many bytes in one call are split across threads
/// (a hand-out costs about a microsecond; 16 KiB of 2-bit rows take several).
const PARALLEL_BYTES: usize = 1 << 14;

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
        let lut = match bits {
            2 => {
                let mut t = Box::new([[0.0f32; 4]; 256]);
                for (b, e) in t.iter_mut().enumerate() {
                    for (k, v) in e.iter_mut().enumerate() {
                        *v = codebook[(b >> (2 * k)) & 3];
                    }
                }
                Lut::Two(t)
            }
            4 => {
                let mut t = Box::new([[0.0f32; 2]; 256]);
                for (b, e) in t.iter_mut().enumerate() {
                    e[0] = codebook[b & 15];
                    e[1] = codebook[b >> 4];
                }
                Lut::Four(t)
            }
            _ => Lut::None,
        };
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

    /// `prepare(x)` into `out` (length `padded`): zero-pad, then `nfwht` on every group.
    ///
    /// # Panics
    /// If `x.len() != cols` or `out.len() != padded`.
    pub fn prepare_into(&self, x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), self.cols, "prepare: input length");
        prepare_into(x, self.group, out);
    }

    /// Rows `first .. first + out.len()` of `P · x` for an input already prepared for
    /// this matrix's group (`prep.len() == padded`), with the CPU's best row
    /// kernels ([`CpuKernels::selected`]).
    ///
    /// # Panics
    /// If `prep.len() != padded` or the rows run past `rows`.
    pub fn matvec_rows_prepared(&self, prep: &[f32], first: usize, out: &mut [f32]) {
        self.matvec_rows_prepared_with(CpuKernels::selected(), prep, first, out);
    }

    /// [`CqMatrix::matvec_rows_prepared`] with the given row kernels (for tests and
    /// benchmarks that compare them; a variant this CPU lacks runs the scalar path).
    ///
    /// # Panics
    /// As [`CqMatrix::matvec_rows_prepared`].
    pub fn matvec_rows_prepared_with(
        &self,
        kernels: CpuKernels,
        prep: &[f32],
        first: usize,
        out: &mut [f32],
    ) {
        assert_eq!(prep.len(), self.padded(), "matvec: prepared input length");
        assert!(first + out.len() <= self.rows, "matvec: rows out of range");
        let kernels = if CpuKernels::available().contains(&kernels) {
            kernels
        } else {
            CpuKernels::Scalar
        };
        let gb = self.group * self.bits as usize / 8;
        match Plan::choose(kernels, self.bits, gb) {
            None => self.split_rows(first, out, |f, o| self.rows_into(prep, f, o)),
            Some(plan) => PERMUTED.with(|cell| {
                let mut own = Vec::new();
                let mut guard = cell.try_borrow_mut();
                let xp = match guard.as_mut() {
                    Ok(v) => &mut **v,
                    Err(_) => &mut own,
                };
                plan.permute(self.bits, prep, xp);
                let xp = &*xp;
                let rb = self.row_bytes();
                self.split_rows(first, out, |f, o| {
                    let r = simd::Rows {
                        codebook: &self.codebook,
                        packed: &self.packed[f * rb..(f + o.len()) * rb],
                        norms: &self.norms[f * self.groups..(f + o.len()) * self.groups],
                        xp,
                        bits: self.bits,
                        group: self.group,
                        groups: self.groups,
                    };
                    simd::rows(plan, &r, o);
                });
            }),
        }
    }

    /// Rows `first .. first + count` of `P · x_t` for `tokens` inputs at once, with
    /// the CPU's best row kernels: `preps` holds the prepared inputs one after
    /// another (`tokens × padded`), and `out` receives `tokens × count` values,
    /// token-major (`out[t·count + i]` is row `first + i` for input `t`).
    ///
    /// Each value is bit-identical to what [`CqMatrix::matvec_rows_prepared`]
    /// gives for that input alone; the batch only shares work (an 8-lane SIMD
    /// pass decodes each weight vector once for up to four inputs).
    ///
    /// # Panics
    /// If `preps.len() != tokens · padded`, `out.len() != tokens · count` or the
    /// rows run past `rows`.
    pub fn matmul_rows_prepared(
        &self,
        preps: &[f32],
        tokens: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    ) {
        self.matmul_rows_prepared_with(CpuKernels::selected(), preps, tokens, first, count, out);
    }

    /// [`CqMatrix::matmul_rows_prepared`] with the given row kernels (bit-identical
    /// to [`CqMatrix::matvec_rows_prepared_with`] per input under the same kernels).
    ///
    /// # Panics
    /// As [`CqMatrix::matmul_rows_prepared`].
    pub fn matmul_rows_prepared_with(
        &self,
        kernels: CpuKernels,
        preps: &[f32],
        tokens: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    ) {
        let lay = self.batch_layout(kernels, tokens);
        self.matmul_rows_in(
            kernels,
            BatchIn::Prepared(preps),
            lay,
            tokens,
            first,
            count,
            out,
        );
    }

    /// The activation layout of the batched kernel for `tokens` inputs under
    /// `kernels`, or `None` when the inputs run one at a time: the batched kernel
    /// pays when every pool thread gets whole passes of 4 inputs.
    pub(crate) fn batch_layout(&self, kernels: CpuKernels, tokens: usize) -> Option<BatchLayout> {
        if !CpuKernels::available().contains(&kernels) {
            return None;
        }
        let gb = self.group * self.bits as usize / 8;
        let plan = Plan::choose(kernels, self.bits, gb).filter(|p| p.lanes == 8)?;
        (tokens >= 4 * Pool::global().threads()).then_some(BatchLayout {
            plan,
            bits: self.bits,
        })
    }

    /// The batched matvec of `tokens` inputs given prepared (`[tokens, padded]`)
    /// or already laid out for `lay` (the value of [`CqMatrix::batch_layout`] for
    /// these kernels and tokens, which the caller passes along).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul_rows_in(
        &self,
        kernels: CpuKernels,
        input: BatchIn<'_>,
        lay: Option<BatchLayout>,
        tokens: usize,
        first: usize,
        count: usize,
        out: &mut [f32],
    ) {
        let padded = self.padded();
        let xs = match input {
            BatchIn::Prepared(x) | BatchIn::LaidOut(x) => x,
        };
        assert_eq!(xs.len(), tokens * padded, "matmul: inputs length");
        assert_eq!(out.len(), tokens * count, "matmul: output length");
        assert!(first + count <= self.rows, "matmul: rows out of range");
        assert_eq!(lay, self.batch_layout(kernels, tokens), "matmul: layout");
        let kernels = if CpuKernels::available().contains(&kernels) {
            kernels
        } else {
            CpuKernels::Scalar
        };
        let Some(lay) = lay.filter(|_| count > 0) else {
            let BatchIn::Prepared(preps) = input else {
                unreachable!("laid-out inputs come with a layout");
            };
            for (x, o) in preps
                .chunks_exact(padded)
                .zip(out.chunks_exact_mut(count.max(1)))
            {
                self.matvec_rows_prepared_with(kernels, x, first, &mut o[..count]);
            }
            return;
        };
        PERMUTED.with(|cell| {
            let mut own = Vec::new();
            let mut guard = cell.try_borrow_mut();
            let xp = match guard.as_mut() {
                Ok(v) => &mut **v,
                Err(_) => &mut own,
            };
            // Every value is overwritten below; only grow (no clearing memset).
            let scratch = if matches!(input, BatchIn::Prepared(_)) {
                tokens * padded
            } else {
                0
            };
            if xp.len() < scratch {
                xp.resize(scratch, 0.0);
            }
            let xp = SharedSlice::new(&mut xp[..scratch]);
            let shared = SharedSlice::new(out);
            let rb = self.row_bytes();
            // Inputs, not rows, are split over the threads: each thread lays out
            // its inputs and reads all the rows (from cache), decoding each weight
            // vector once per 4 inputs.
            Pool::global().for_ranges(tokens, 4, &|range| {
                let span = range.start * padded..range.end * padded;
                // SAFETY: the ranges of one for_ranges call are disjoint.
                let o = unsafe { shared.range(range.start * count..range.end * count) };
                let x: &[f32] = match input {
                    BatchIn::LaidOut(x) => &x[span],
                    BatchIn::Prepared(p) => {
                        // SAFETY: as above.
                        let d = unsafe { xp.range(span.clone()) };
                        lay.lay_out(&p[span], d);
                        d
                    }
                };
                let r = simd::Rows {
                    codebook: &self.codebook,
                    packed: &self.packed[first * rb..(first + count) * rb],
                    norms: &self.norms[first * self.groups..(first + count) * self.groups],
                    xp: x,
                    bits: self.bits,
                    group: self.group,
                    groups: self.groups,
                };
                simd::rows_batch(lay.plan, &r, count, range.len(), o, count);
            });
        });
    }

    /// Which row kernel [`CqMatrix::matvec_rows_prepared_with`] runs for this
    /// matrix under `kernels`: `"scalar"`, `"simd8"` (8 lanes) or `"simd16"` (16 lanes).
    pub fn row_kernel(&self, kernels: CpuKernels) -> &'static str {
        if !CpuKernels::available().contains(&kernels) {
            return "scalar";
        }
        match Plan::choose(kernels, self.bits, self.group * self.bits as usize / 8) {
            None => "scalar",
            Some(Plan { lanes: 8 }) => "simd8",
            Some(_) => "simd16",
        }
    }

    /// Run `rows(first_row, out_chunk)` over `out`, split across the CPU pool's
    /// threads when the rows hold at least [`PARALLEL_BYTES`].
    fn split_rows(&self, first: usize, out: &mut [f32], rows: impl Fn(usize, &mut [f32]) + Sync) {
        let pool = Pool::global();
        if out.len() * self.row_bytes() < PARALLEL_BYTES || pool.threads() == 1 {
            rows(first, out);
            return;
        }
        let n = out.len();
        let shared = SharedSlice::new(out);
        pool.for_ranges(n, 4, &|r| {
            // SAFETY: the ranges of one for_ranges call are disjoint.
            let o = unsafe { shared.range(r.clone()) };
            rows(first + r.start, o);
        });
    }

    fn rows_into(&self, prep: &[f32], first: usize, out: &mut [f32]) {
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
            let d = match &self.lut {
                Lut::Four(t) => dot4(t, bytes, x),
                Lut::Two(t) => dot2(t, bytes, x),
                Lut::None => dot_generic(&self.codebook, self.bits, bytes, x),
            };
            sum += n * d;
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

    /// `dequantize_row(P, r)` into `out` (length `cols`): per group
    /// `norms[r,k] · nfwht(q[r, group k])`, padding columns dropped.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols`.
    pub fn dequantize_row_into(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "dequantize_row: row out of range");
        assert_eq!(out.len(), self.cols, "dequantize_row: output length");
        let mut tmp = vec![0.0f32; self.group];
        for k in 0..self.groups {
            let n = self.norms[r * self.groups + k];
            for (c, t) in tmp.iter_mut().enumerate() {
                *t = n * self.codebook[self.index(r, k * self.group + c)];
            }
            nfwht(&mut tmp);
            let start = k * self.group;
            if start >= self.cols {
                break;
            }
            let end = (start + self.group).min(self.cols);
            out[start..end].copy_from_slice(&tmp[..end - start]);
        }
    }
}

/// `prepare(x)` for a given group into `out` (length = padded, a multiple of `group`):
/// copy `x`, zero the tail, `nfwht` every group.
///
/// # Panics
/// If `out` is shorter than `x` or not a multiple of `group`.
pub fn prepare_into(x: &[f32], group: usize, out: &mut [f32]) {
    assert!(
        x.len() <= out.len() && out.len().is_multiple_of(group),
        "prepare: bad lengths"
    );
    out[..x.len()].copy_from_slice(x);
    out[x.len()..].fill(0.0);
    for g in out.chunks_exact_mut(group) {
        nfwht(g);
    }
}

#[inline]
fn dot4(t: &[[f32; 2]; 256], bytes: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (b4, x8) in bytes.chunks_exact(4).zip(x.chunks_exact(8)) {
        for j in 0..4 {
            let l = &t[b4[j] as usize];
            acc[2 * j] += l[0] * x8[2 * j];
            acc[2 * j + 1] += l[1] * x8[2 * j + 1];
        }
    }
    acc.iter().sum()
}

#[inline]
fn dot2(t: &[[f32; 4]; 256], bytes: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (b2, x8) in bytes.chunks_exact(2).zip(x.chunks_exact(8)) {
        let l0 = &t[b2[0] as usize];
        let l1 = &t[b2[1] as usize];
        for k in 0..4 {
            acc[k] += l0[k] * x8[k];
            acc[4 + k] += l1[k] * x8[4 + k];
        }
    }
    acc.iter().sum()
}

#[inline]
fn dot_generic(codebook: &[f32], bits: u32, bytes: &[u8], x: &[f32]) -> f32 {
    let mask = (1usize << bits) - 1;
    let mut acc = 0.0f32;
    for (c, &xv) in x.iter().enumerate() {
        let bit = c * bits as usize;
        let idx = (bytes[bit >> 3] as usize >> (bit & 7)) & mask;
        acc += codebook[idx] * xv;
    }
    acc
}

/// `cq_matvec(P, x)`: all rows of `P · x` (SPEC §2).
///
/// # Errors
/// [`Error::InvalidArgument`] if `x.len() != P.cols`.
pub fn cq_matvec(p: &CqMatrix, x: &[f32]) -> Result<Vec<f32>> {
    cq_matvec_rows(p, x, 0, p.rows())
}

/// `cq_matvec_rows(P, x, first, count)`: rows `first .. first + count` of `P · x`.
///
/// # Errors
/// [`Error::InvalidArgument`] if `x.len() != P.cols` or the rows are out of range.
pub fn cq_matvec_rows(p: &CqMatrix, x: &[f32], first: usize, count: usize) -> Result<Vec<f32>> {
    if x.len() != p.cols() {
        return Err(Error::InvalidArgument(format!(
            "cq_matvec: input has {} values, the matrix has {} columns",
            x.len(),
            p.cols()
        )));
    }
    if first.checked_add(count).is_none_or(|e| e > p.rows()) {
        return Err(Error::InvalidArgument(format!(
            "cq_matvec_rows: rows {first}+{count} exceed {}",
            p.rows()
        )));
    }
    let mut prep = vec![0.0; p.padded()];
    p.prepare_into(x, &mut prep);
    let mut out = vec![0.0; count];
    p.matvec_rows_prepared(&prep, first, &mut out);
    Ok(out)
}

/// `dequantize_row(P, r)`: the dense row `W[r, 0..cols]`.
///
/// # Errors
/// [`Error::InvalidArgument`] if `r >= rows`.
pub fn dequantize_row(p: &CqMatrix, r: usize) -> Result<Vec<f32>> {
    if r >= p.rows() {
        return Err(Error::InvalidArgument(format!(
            "dequantize_row: row {r} is not < {}",
            p.rows()
        )));
    }
    let mut out = vec![0.0; p.cols()];
    p.dequantize_row_into(r, &mut out);
    Ok(out)
}

/// `prepare(x)` for a matrix: `x` zero-padded to `padded`, `nfwht` on every group.
///
/// # Errors
/// [`Error::InvalidArgument`] if `x.len() != P.cols`.
pub fn prepare(p: &CqMatrix, x: &[f32]) -> Result<Vec<f32>> {
    if x.len() != p.cols() {
        return Err(Error::InvalidArgument(format!(
            "prepare: input has {} values, the matrix has {} columns",
            x.len(),
            p.cols()
        )));
    }
    let mut out = vec![0.0; p.padded()];
    prepare_into(x, p.group(), &mut out);
    Ok(out)
}
