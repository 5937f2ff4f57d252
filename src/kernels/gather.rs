//! Row gather (SPEC §4.1, §4.2): [`gather`], the CPU twin of shaders/cq.wgsl's
//! `gather` entry point (`crate::gpu::kernels::cq`, `CqKernels::gather`).

use crate::cq::CqMatrix;

crate::host::simd::simd_fn! {
    /// CPU twin of the GPU `gather` entry point (inputs as `GatherParams`):
    /// `dequantize_row(m, row) · scale` written `copies` times, `copy_stride` apart,
    /// into `out` (copy `i` at `i · copy_stride`, `m.cols()` values each). The
    /// embedding gathers `x0` into the 4 lanes with `scale = sqrt(hidden)`
    /// (SPEC §4.1); an engram table its row once with scale 1 (SPEC §4.2).
    ///
    /// # Panics
    /// If `row >= m.rows()` or `out` is too short.
    pub fn gather(
        m: &CqMatrix,
        row: usize,
        scale: f32,
        copies: usize,
        copy_stride: usize,
        out: &mut [f32],
    ) {
        let cols = m.cols();
        if copies == 0 {
            return;
        }
        m.dequantize_row_into(row, &mut out[..cols]);
        if scale != 1.0 {
            for v in &mut out[..cols] {
                *v *= scale;
            }
        }
        for i in 1..copies {
            out.copy_within(0..cols, i * copy_stride);
        }
    }
}
