//! SPEC §2: codebook-quantized (CQ) matrices: the Hadamard transform, activation
//! preparation, CPU matvec and row gather, and the quantizer that makes them.

mod fwht;
mod matrix;
pub mod quantize;
mod simd;

pub use fwht::{fwht, fwht_scalar, nfwht};
pub use matrix::{cq_matvec, cq_matvec_rows, dequantize_row, prepare, prepare_into, CqMatrix};
pub(crate) use matrix::{BatchIn, BatchLayout};
pub use simd::CpuKernels;
