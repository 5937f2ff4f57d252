//! [`MatvecPlan`]: one matvec of the step kept as data, so that its dispatches
//! can be built for a decode step (one input) and, batched, for any number of
//! token slots (a prefill chunk, a [`super::GpuBatch`] pass).

use super::arena::GpuCq;
use super::kernels::cq::{CqKernels, MatvecInput, PrepScratch, PrepareMode, SlotStrides};
use super::{Dispatch, GpuContext};

/// A matvec of the step: rows of one or more matrices times one raw input (its
/// pre-op `mode` applied first), token slot `j`'s input and outputs `j` strides
/// apart.
pub(crate) struct MatvecPlan {
    /// `(matrix, first row, rows, output offset)`.
    pub items: Vec<(GpuCq, usize, usize, usize)>,
    /// The pre-op before SPEC §2's `prepare`.
    pub mode: PrepareMode,
    /// Logical input length.
    pub n: usize,
    /// Buffer and element offset of slot 0's input.
    pub src: (wgpu::Buffer, usize),
    /// Distance between lanes ([`PrepareMode::MeanLanesZcrms`]).
    pub lane_stride: usize,
    /// Buffer and element offset of the gains.
    pub gains: (wgpu::Buffer, usize),
    /// The output buffer.
    pub out: wgpu::Buffer,
    /// Elements between token slots of the input and of the output buffer.
    pub x_stride: usize,
    pub y_stride: usize,
    /// Where the token slots' inputs may be prepared once, before the matvec
    /// ([`CqKernels::matvec_prepared_once`]): the device's prepared-input
    /// buffer (slot 0 at element 0) and its slot stride.
    pub scratch: (wgpu::Buffer, usize),
}

impl MatvecPlan {
    /// The dispatches for `tokens` inputs in consecutive slots (1: the decode
    /// step's, which prepares its input in the matvec itself).
    pub(crate) fn dispatches(
        &self,
        cq: &CqKernels,
        ctx: &GpuContext,
        arenas: &[wgpu::Buffer],
        tokens: usize,
    ) -> Vec<Dispatch> {
        let items: Vec<(&GpuCq, usize, usize, usize)> = self
            .items
            .iter()
            .map(|(m, a, b, o)| (m, *a, *b, *o))
            .collect();
        let input = MatvecInput::Raw {
            mode: self.mode,
            n: self.n,
            src: (&self.src.0, self.src.1),
            lane_stride: self.lane_stride,
            gains: (&self.gains.0, self.gains.1),
        };
        let strides = SlotStrides {
            tokens,
            x_stride: self.x_stride,
            y_stride: self.y_stride,
        };
        let scratch = PrepScratch {
            buffer: &self.scratch.0,
            offset: 0,
            stride: self.scratch.1,
        };
        cq.matvec_prepared_once(ctx, arenas, &items, input, &self.out, strides, scratch)
    }
}
