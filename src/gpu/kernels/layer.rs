//! The lean program's single-workgroup kernel between two layers' attention
//! (shaders/layer.wgsl, entry `layer_step`): layer `l − 1`'s output projection,
//! MLP and routing, then layer `l`'s Φ projections and pre-mix; the first one
//! also runs the engram convolutions, the last prepares the logits' input.
//! CPU twins, phase by phase: [`crate::kernels::engram::conv`],
//! [`crate::cq::CqMatrix::matvec_rows_prepared`], [`crate::kernels::mlp::block`],
//! [`crate::kernels::mhc::route`], [`crate::kernels::mhc::premix`] and
//! [`crate::kernels::prepare::pre_op`]; tested end to end against the CPU
//! engine (tests/gpu/lean.rs) and by every GPU test with `CQLM_GPU_PROGRAM=lean`.

use super::mlp::MlpParams;
use crate::gpu::arena::GpuCq;
use crate::gpu::{Dispatch, GpuContext, Kernel};
use bytemuck::{Pod, Zeroable};

/// The WGSL source: `common.wgsl`, `butterfly.wgsl`, `layer_io.wgsl` (the
/// per-layer buffers), `mlp.wgsl`, `mhc.wgsl` and `engram.wgsl` (whose
/// functions each phase calls: `mlp_body`, `premix_slot`, `route_gates`,
/// `route_column`, `conv_column`), then `layer.wgsl`.
pub const SOURCE: &str = concat!(
    include_str!("../../../shaders/common.wgsl"),
    include_str!("../../../shaders/butterfly.wgsl"),
    include_str!("../../../shaders/layer_io.wgsl"),
    include_str!("../../../shaders/mlp.wgsl"),
    include_str!("../../../shaders/mhc.wgsl"),
    include_str!("../../../shaders/engram.wgsl"),
    include_str!("../../../shaders/layer.wgsl")
);

/// Phases of [`LayerParams::flags`].
pub mod flags {
    /// Every engram site's ring write and convolution.
    pub const CONV: u32 = 1;
    /// The output projection, MLP and routing of layer `prev`.
    pub const PREV: u32 = 2;
    /// The Φ projections and pre-mix of layer `next`.
    pub const NEXT: u32 = 4;
    /// The logits' prepared input.
    pub const LOGITS: u32 = 8;
}

/// Largest prepared input the kernel stages (its `scratch`, floats).
pub const MAX_STAGED: usize = 4096;

/// Mirror of WGSL `CqRef`: rows `first ..` of one arena part of a matrix.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq, Default)]
pub struct CqRef {
    /// Packed word offset of the first row, its first norm (f16 index), the
    /// codebook's word offset, the arena binding (0 or 1).
    pub a: [u32; 4],
    /// Words per row, words per (row, group), group, bits.
    pub b: [u32; 4],
}

impl CqRef {
    /// Rows `first .. first + rows` of `m` in arena binding `binding`, if one
    /// part holds them all (else `None`: the caller uses the standard program).
    pub fn of(m: &GpuCq, first: usize, rows: usize, binding: u32) -> Option<CqRef> {
        let [(part, at, n)] = m.parts_for(first, rows)[..] else {
            return None;
        };
        // `at` is a row of the matrix; the part's offsets are of its own first row.
        let within = at - part.first_row;
        (n == rows).then(|| CqRef {
            a: [
                part.packed_off + (within * m.row_words()) as u32,
                part.norms_off + (within * m.groups) as u32,
                part.cb_off,
                binding,
            ],
            b: [
                m.row_words() as u32,
                m.group_words() as u32,
                m.group as u32,
                m.bits,
            ],
        })
    }
}

/// Mirror of WGSL `LayerParams` (320 bytes); see shaders/layer.wgsl for each field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq, Default)]
#[allow(missing_docs)]
pub struct LayerParams {
    pub flags: u32,
    pub hidden: u32,
    pub prev: u32,
    pub next: u32,
    pub o: u32,
    pub q_dim: u32,
    pub iters: u32,
    pub route_out: u32,
    pub p_prev: u32,
    pub a_post: u32,
    pub b_post: u32,
    pub a_res: u32,
    pub b_res: u32,
    pub p_next: u32,
    pub a_pre: u32,
    pub b_pre: u32,
    pub u: u32,
    pub b: u32,
    pub site: u32,
    pub key: u32,
    pub value: u32,
    pub norm_u: u32,
    pub norm_k: u32,
    pub final_norm: u32,
    pub lprep: u32,
    pub lgroup: u32,
    pub lpadded: u32,
    pub n_sites: u32,
    pub taps: u32,
    pub dilation: u32,
    pub ring: u32,
    pub _pad0: u32,
    /// Per engram site: `(v, value, ring_off, conv)`.
    pub sites: [[u32; 4]; 4],
    pub wo: CqRef,
    pub phi: [CqRef; 3],
}

/// The buffers a `layer_step` dispatch binds.
pub struct LayerBuffers<'a> {
    /// Activations (read_write).
    pub act: &'a wgpu::Buffer,
    /// The F32 model tensors.
    pub vectors: &'a wgpu::Buffer,
    /// The four lanes (read_write).
    pub lanes: &'a wgpu::Buffer,
    /// The arenas of bindings 0 and 1 of the [`CqRef`]s (the same one twice when
    /// one holds every matrix).
    pub arenas: [&'a wgpu::Buffer; 2],
    /// The engram rings (read_write).
    pub rings: &'a wgpu::Buffer,
    /// The step input.
    pub step: &'a wgpu::Buffer,
}

/// The compiled pipeline.
#[derive(Debug, Clone)]
pub struct LayerKernels {
    step: Kernel,
}

impl LayerKernels {
    /// Compile `layer_step` at the device's wide workgroup
    /// ([`crate::gpu::Capabilities::wide_workgroup`]).
    pub fn new(ctx: &GpuContext) -> LayerKernels {
        let wg = [("WG", f64::from(ctx.caps.wide_workgroup))];
        LayerKernels {
            step: Kernel::new(ctx, SOURCE, "layer_step", "layer_step", 0, &wg),
        }
    }

    /// Dispatch `(1, 1, 1)` of the phases `lp.flags` (the MLP phase reads `mp`,
    /// any value otherwise).
    pub fn layer_step(
        &self,
        ctx: &GpuContext,
        lp: &LayerParams,
        mp: &MlpParams,
        b: &LayerBuffers<'_>,
    ) -> Dispatch {
        let up = ctx.uniform_init("layer_step mlp params", bytemuck::bytes_of(mp));
        let ul = ctx.uniform_init("layer_step params", bytemuck::bytes_of(lp));
        Dispatch::new(
            ctx,
            &self.step,
            &[
                &up,
                b.act,
                b.vectors,
                b.lanes,
                b.arenas[0],
                b.arenas[1],
                &ul,
                b.rings,
                b.step,
            ],
            [1, 1, 1],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::shader_check::{validate_wgsl, wgsl_struct_size};

    #[test]
    fn wgsl_validates_and_params_match() {
        let m = validate_wgsl(SOURCE).unwrap_or_else(|e| panic!("layer.wgsl: {e}"));
        assert_eq!(
            wgsl_struct_size(&m, "LayerParams"),
            Some(std::mem::size_of::<LayerParams>() as u32)
        );
        assert_eq!(
            wgsl_struct_size(&m, "CqRef"),
            Some(std::mem::size_of::<CqRef>() as u32)
        );
    }
}
