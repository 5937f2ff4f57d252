//! SPEC §2: codebook-quantized (CQ) matrices: the Hadamard transform, activation
//! preparation, CPU matvec and row gather, the quantizer that makes them and the
//! bit plans ([`BitsPlan`]) it quantizes to.
//!
//! The matrix type and its validation are in `matrix.rs`; `prepare.rs` pads and
//! rotates activations; `scalar.rs` holds the reference inner loops and
//! `matvec.rs` the SIMD dispatch and threading (kernels in `simd.rs`). The
//! SPEC-named free functions are below.

mod fast;
mod fwht;
mod matrix;
mod matvec;
mod plan;
mod prepare;
pub mod quantize;
mod scalar;
mod simd;

pub use fast::{FastInput, FastKernel, FastMatrix, FastProduct, FastSet, BLOCK, QUAD, TILE};
#[cfg(target_arch = "x86_64")]
pub(crate) use fwht::x86 as fwht_x86;
pub use fwht::{fwht, fwht_scalar, nfwht, nfwht_into};
pub use matrix::CqMatrix;
pub(crate) use matvec::{ChunkIn, ChunkLayout};
pub use plan::{plan_for_preset, BitsPlan};
pub use prepare::{prepare, prepare_into};

use crate::error::{Error, Result};

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
