//! GPU engram site convolution (SPEC §4.2): store `v` in the site's ring and form
//! `value = v + silu(conv ∗ ring)` (shaders/engram.wgsl), the twin of the engram
//! section of [`crate::cpu`]'s step. CPU twin: [`crate::kernels::engram::conv`].

use crate::engine::profile::bytes;
use crate::gpu::{Dispatch, GpuContext, Kernel};
use bytemuck::{Pod, Zeroable};

/// The WGSL source of the family: the shared prelude `shaders/common.wgsl`, the
/// per-layer buffers `shaders/layer_io.wgsl`, the width `shaders/wide.wgsl`, then
/// `shaders/engram.wgsl` (whose `conv_column` `layer_step` calls too).
pub const SOURCE: &str = concat!(
    include_str!("../../../shaders/common.wgsl"),
    include_str!("../../../shaders/layer_io.wgsl"),
    include_str!("../../../shaders/wide.wgsl"),
    include_str!("../../../shaders/engram.wgsl")
);

/// Mirror of WGSL `EngramConvParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq)]
pub struct EngramConvParams {
    /// Model width.
    pub hidden: u32,
    /// Convolution taps.
    pub taps: u32,
    /// Convolution dilation.
    pub dilation: u32,
    /// Rows of the ring, `(taps − 1)·dilation + 1`.
    pub ring: u32,
    /// act offset of `v = wv·e`.
    pub v: u32,
    /// act offset of the site value (written).
    pub value: u32,
    /// Element offset of this site's `[ring, hidden]` ring in `rings`.
    pub ring_off: u32,
    /// vectors offset of `conv[taps, hidden]`.
    pub conv: u32,
    /// Step words from one token slot (workgroup y) to the next.
    pub step_stride: u32,
    /// act elements from one token slot to the next.
    pub act_stride: u32,
    /// Step word holding the slot's sequence.
    pub seq_at: u32,
    /// `rings` elements from one sequence's rings to the next's; 0 where the
    /// binding is already the sequence's window.
    pub ring_seq_stride: u32,
}

/// The compiled pipeline of the family.
#[derive(Debug, Clone)]
pub struct EngramKernels {
    conv: Kernel,
}

impl EngramKernels {
    /// Compile the entry point at the device's wide workgroup
    /// ([`crate::gpu::Capabilities::wide_workgroup`]).
    pub fn new(ctx: &GpuContext) -> EngramKernels {
        let wg = [("WG", f64::from(ctx.caps.wide_workgroup))];
        EngramKernels {
            conv: Kernel::new(ctx, SOURCE, "engram_conv", "conv", 0, &wg),
        }
    }

    /// `ceil(hidden / wide_workgroup)` workgroups for token slot 0: ring row `t mod ring ← v`,
    /// then the site value, with `t` read from word 1 of `step` (the per-step
    /// buffer). Over token slots ([`Dispatch::over_slots`]): each slot at the
    /// params' strides, on its sequence's ring (their sequences distinct).
    pub fn conv(
        &self,
        ctx: &GpuContext,
        p: &EngramConvParams,
        act: &wgpu::Buffer,
        vectors: &wgpu::Buffer,
        step: &wgpu::Buffer,
        rings: &wgpu::Buffer,
    ) -> Dispatch {
        let ub = ctx.uniform_init("engram conv params", bytemuck::bytes_of(p));
        let groups = p.hidden.div_ceil(ctx.caps.wide_workgroup).max(1);
        let at = [(11, &ub), (1, act), (2, vectors), (8, step), (7, rings)];
        Dispatch::new_at(ctx, &self.conv, &at, [groups, 1, 1])
            .with_bytes(bytes::engram_conv(p.hidden as usize, p.taps as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::shader_check::{validate_wgsl, wgsl_struct_size};

    #[test]
    fn wgsl_validates_and_params_match() {
        let m = validate_wgsl(SOURCE).unwrap_or_else(|e| panic!("engram.wgsl: {e}"));
        assert_eq!(
            wgsl_struct_size(&m, "EngramConvParams"),
            Some(std::mem::size_of::<EngramConvParams>() as u32)
        );
    }
}
