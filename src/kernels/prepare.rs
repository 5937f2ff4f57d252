//! The pre-ops a matvec applies to its raw input before SPEC §2's `prepare`
//! transform: [`pre_op`], the CPU twin of the modes of shaders/cq.wgsl's `matvec`
//! entry points (`crate::gpu::kernels::cq::PrepareMode`, its `input_rms` /
//! `stage_chunk`). The transform itself is [`crate::cq::prepare_into`].

use super::norm::{rms_unit_into, zcrms_in_place, zcrms_into};

/// What a matvec computes from its raw input before `prepare`. The GPU matvec
/// uses this enum too (`gpu::kernels::cq::PrepareMode` re-exports it): its
/// discriminants are the shader's `MatvecParams::mode` values 0..3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareMode {
    /// The input as is (the engram rows `e`, the attention output `o`).
    Copy = 0,
    /// `rms_unit(x)` (the 4 lanes before the mHC projections).
    RmsUnit = 1,
    /// `zcrms(x, w)` (the block input before `wq wk wv wg`).
    Zcrms = 2,
    /// `zcrms((l0 + l1 + l2 + l3) / 4, w)` over 4 lanes `lane_stride` apart (the
    /// final norm before the logits, SPEC §4.4).
    MeanLanesZcrms = 3,
}

crate::host::simd::simd_fn! {
    /// CPU twin of the matvec pre-op of `mode` (the GPU's `MatvecInput::Raw`): `out`
    /// (`n` values) from `src`, which holds the `n` inputs (or, for
    /// [`PrepareMode::MeanLanesZcrms`], lane `i` at `i · lane_stride`), with gains
    /// `gains` (`n` values; unused by `Copy` and `RmsUnit`).
    ///
    /// # Panics
    /// If `src`, `gains` or `out` is too short for `n` (and `lane_stride`).
    pub fn pre_op(
        mode: PrepareMode,
        src: &[f32],
        n: usize,
        lane_stride: usize,
        gains: &[f32],
        out: &mut [f32],
    ) {
        let out = &mut out[..n];
        match mode {
            PrepareMode::Copy => out.copy_from_slice(&src[..n]),
            PrepareMode::RmsUnit => rms_unit_into(&src[..n], out),
            PrepareMode::Zcrms => zcrms_into(&src[..n], &gains[..n], out),
            PrepareMode::MeanLanesZcrms => {
                let s = lane_stride;
                let (l0, l1, l2, l3) = (
                    &src[..n],
                    &src[s..s + n],
                    &src[2 * s..2 * s + n],
                    &src[3 * s..3 * s + n],
                );
                for (col, dst) in out.iter_mut().enumerate() {
                    *dst = (l0[col] + l1[col] + l2[col] + l3[col]) / 4.0;
                }
                zcrms_in_place(out, &gains[..n]);
            }
        }
    }
}
