//! GPU twin of [`crate::kernels::mlp::hadamard_mlp`] together with the attention
//! residual before it and the lane update after it (shaders/mlp.wgsl).
//! CPU twin: [`crate::kernels::mlp::block`].

use crate::engine::profile::bytes;
use crate::gpu::{Dispatch, GpuContext, Kernel, MlpWorkgroup};
use bytemuck::{Pod, Zeroable};

/// The WGSL source of the family: the shared prelude `shaders/common.wgsl`, the
/// FWHT's register butterflies `shaders/butterfly.wgsl`, the per-layer buffers
/// `shaders/layer_io.wgsl`, then `shaders/mlp.wgsl`.
pub const SOURCE: &str = concat!(
    include_str!("../../../shaders/common.wgsl"),
    include_str!("../../../shaders/butterfly.wgsl"),
    include_str!("../../../shaders/layer_io.wgsl"),
    include_str!("../../../shaders/mlp.wgsl")
);
/// Largest `hadamard_dim` transformed entirely in workgroup memory; above it the
/// kernel also uses the `z` scratch region of act.
pub const SHARED_HD: usize = 4096;

/// Mirror of WGSL `MlpParams` (SPEC §4.3 end of step 5, steps 6 and 7).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq)]
pub struct MlpParams {
    /// Model width.
    pub hidden: u32,
    /// `hadamard_dim` (a power of two, at least `hidden`).
    pub hd: u32,
    /// act offset of the block input `b`.
    pub b: u32,
    /// act offset of `u`.
    pub u: u32,
    /// act offset of the `wo` output `attn`.
    pub attn: u32,
    /// act offset of `after` (written).
    pub after: u32,
    /// act offset of `update` (written).
    pub update: u32,
    /// act offset of `hd` values of scratch (written only when `hd > 4096`).
    pub z: u32,
    /// vectors offset of `attn_post_norm`.
    pub post_norm: u32,
    /// vectors offset of `mlp_norm`.
    pub mlp_norm: u32,
    /// vectors offset of `mlp_d1`.
    pub d1: u32,
    /// vectors offset of `mlp_d2`.
    pub d2: u32,
    /// vectors offset of `mlp_d3`.
    pub d3: u32,
    /// vectors offset of the single value `attn_out_scale`.
    pub out_scale: u32,
    /// act offset of `out = after + z[..hidden]` (written for parity captures).
    pub out: u32,
    /// act elements between token slots: workgroup `y` of the dispatch (one per
    /// token slot of a prefill chunk; a decode step has only `y = 0`) adds
    /// `y · tstride` to every act offset above.
    pub tstride: u32,
}

/// The compiled pipeline of the family.
#[derive(Debug, Clone)]
pub struct MlpKernels {
    mlp: Kernel,
}

impl MlpKernels {
    /// Compile the entry point with the device's workgroup width
    /// ([`crate::gpu::Capabilities::mlp_workgroup`]).
    pub fn new(ctx: &GpuContext) -> MlpKernels {
        MlpKernels::with_workgroup(ctx, ctx.caps.mlp_workgroup)
    }

    /// Compile the entry point at the workgroup width `width`.
    pub fn with_workgroup(ctx: &GpuContext, width: MlpWorkgroup) -> MlpKernels {
        let wg = f64::from(width.invocations());
        MlpKernels {
            mlp: Kernel::new(ctx, SOURCE, "mlp", "mlp", 0, &[("WG", wg)]),
        }
    }

    /// One workgroup: `after = b + s·zcrms(attn, post_norm)` and
    /// `update = hadamard_mlp(after) − u`, written to `act` at `p.after` and `p.update`.
    /// Over token slots ([`Dispatch::over_slots`]): one workgroup a slot, run in
    /// parallel, slot `y` at every act offset plus `y · p.tstride`.
    pub fn mlp(
        &self,
        ctx: &GpuContext,
        p: &MlpParams,
        act: &wgpu::Buffer,
        vectors: &wgpu::Buffer,
    ) -> Dispatch {
        let ub = ctx.uniform_init("mlp params", bytemuck::bytes_of(p));
        Dispatch::new(ctx, &self.mlp, &[&ub, act, vectors], [1, 1, 1])
            .with_bytes(bytes::mlp(p.hidden as usize, p.hd as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::shader_check::{validate_wgsl, wgsl_struct_size};

    #[test]
    fn wgsl_validates_and_params_match() {
        let m = validate_wgsl(SOURCE).unwrap_or_else(|e| panic!("mlp.wgsl: {e}"));
        assert_eq!(
            wgsl_struct_size(&m, "MlpParams"),
            Some(std::mem::size_of::<MlpParams>() as u32)
        );
    }
}
