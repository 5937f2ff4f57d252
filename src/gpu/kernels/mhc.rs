//! GPU twins of the mHC kernels of [`crate::kernels::mhc`]: the lane pre-mix with
//! the engram gate (`premix`) and the Sinkhorn lane routing (`route`), shaders/mhc.wgsl.
//! CPU twins: [`crate::kernels::mhc::premix`] and [`crate::kernels::mhc::route`].

use crate::engine::profile::bytes;
use crate::gpu::{Dispatch, GpuContext, Kernel};
use bytemuck::{Pod, Zeroable};

/// The WGSL source of the family: the shared prelude `shaders/common.wgsl`, the
/// per-layer buffers `shaders/layer_io.wgsl`, the width `shaders/wide.wgsl`, then
/// `shaders/mhc.wgsl` (whose functions `layer_step` calls too).
pub const SOURCE: &str = concat!(
    include_str!("../../../shaders/common.wgsl"),
    include_str!("../../../shaders/layer_io.wgsl"),
    include_str!("../../../shaders/wide.wgsl"),
    include_str!("../../../shaders/mhc.wgsl")
);

/// Mirror of WGSL `PremixParams` (SPEC §4.3 steps 3 and 4).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq)]
pub struct PremixParams {
    /// Model width.
    pub hidden: u32,
    /// Layer index `l` (selects the `+4` lane offset `l mod 4`).
    pub layer: u32,
    /// 1 if `l` is an engram site, else 0.
    pub site: u32,
    /// act offset of the 4 values `p_pre`.
    pub p_pre: u32,
    /// act offset of `u` (written).
    pub u: u32,
    /// act offset of the block input `b` (written).
    pub b: u32,
    /// act offset of the site's engram key (site only).
    pub key: u32,
    /// act offset of the site's engram value (site only).
    pub value: u32,
    /// vectors offset of `a_pre[layer]`.
    pub a_pre: u32,
    /// vectors offset of `b_pre[layer, 0]`.
    pub b_pre: u32,
    /// vectors offset of the site's `norm_u` (site only).
    pub norm_u: u32,
    /// vectors offset of the site's `norm_k` (site only).
    pub norm_k: u32,
    /// Elements from one token slot's lanes to the next's (slot `y` of a
    /// dispatch reads the lanes at `y · lanes_stride`).
    pub lanes_stride: u32,
    /// Elements from one token slot's act to the next's (slot `y`'s act offsets
    /// count from `y · act_stride`).
    pub act_stride: u32,
    /// Padding to 64 bytes.
    pub _pad: [u32; 2],
}

/// Mirror of WGSL `RouteParams` (SPEC §4.3 steps 8 and 9).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq)]
pub struct RouteParams {
    /// Model width.
    pub hidden: u32,
    /// Layer index `l`.
    pub layer: u32,
    /// Sinkhorn iterations.
    pub iters: u32,
    /// act offset of the 4 values `p_post`.
    pub p_post: u32,
    /// act offset of the 16 values `p_res`.
    pub p_res: u32,
    /// act offset of `update`.
    pub update: u32,
    /// vectors offset of `a_post[layer]`.
    pub a_post: u32,
    /// vectors offset of `b_post[layer, 0]`.
    pub b_post: u32,
    /// vectors offset of `a_res[layer]`.
    pub a_res: u32,
    /// vectors offset of `b_res[layer, 0]`.
    pub b_res: u32,
    /// act offset where workgroup 0 writes the 16 route weights (parity captures).
    pub route_out: u32,
    /// Elements from one token slot's lanes to the next's.
    pub lanes_stride: u32,
    /// Elements from one token slot's act to the next's.
    pub act_stride: u32,
    /// Padding to 64 bytes.
    pub _pad: [u32; 3],
}

/// The compiled pipelines of the family.
#[derive(Debug, Clone)]
pub struct MhcKernels {
    premix: Kernel,
    route: Kernel,
}

impl MhcKernels {
    /// Compile both entry points at the device's wide workgroup
    /// ([`crate::gpu::Capabilities::wide_workgroup`]).
    pub fn new(ctx: &GpuContext) -> MhcKernels {
        let wg = [("WG", f64::from(ctx.caps.wide_workgroup))];
        MhcKernels {
            premix: Kernel::new(ctx, SOURCE, "premix", "premix", 0, &wg),
            route: Kernel::new(ctx, SOURCE, "route", "route", 0, &wg),
        }
    }

    /// One workgroup: `u = Σ_i hpre[i]·lanes[i]`, `b = u` (plus `α·value` at an
    /// engram site), written to `act` at `p.u` and `p.b`. `lanes` is only read.
    /// Over token slots ([`Dispatch::over_slots`]): one workgroup a slot, slot
    /// `y` at the strides of `p`, each as if alone.
    pub fn premix(
        &self,
        ctx: &GpuContext,
        p: &PremixParams,
        lanes: &wgpu::Buffer,
        act: &wgpu::Buffer,
        vectors: &wgpu::Buffer,
    ) -> Dispatch {
        let ub = ctx.uniform_init("premix params", bytemuck::bytes_of(p));
        let at = [(9, &ub), (3, lanes), (1, act), (2, vectors)];
        Dispatch::new_at(ctx, &self.premix, &at, [1, 1, 1])
            .with_bytes(bytes::premix(p.hidden as usize, p.site != 0))
    }

    /// `lanes'[i] = Σ_j route[i][j]·lanes[j] + hpost[i]·update`, in place on `lanes`
    /// (`ceil(hidden / wide_workgroup)` workgroups). `act` is only read but for the 16
    /// route weights written at `p.route_out`. Over token slots
    /// ([`Dispatch::over_slots`]): slot `y` at the strides of `p`, each as if alone.
    pub fn route(
        &self,
        ctx: &GpuContext,
        p: &RouteParams,
        lanes: &wgpu::Buffer,
        act: &wgpu::Buffer,
        vectors: &wgpu::Buffer,
    ) -> Dispatch {
        let ub = ctx.uniform_init("route params", bytemuck::bytes_of(p));
        let groups = p.hidden.div_ceil(ctx.caps.wide_workgroup).max(1);
        let at = [(10, &ub), (3, lanes), (1, act), (2, vectors)];
        Dispatch::new_at(ctx, &self.route, &at, [groups, 1, 1])
            .with_bytes(bytes::route(p.hidden as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::shader_check::{validate_wgsl, wgsl_struct_size};

    #[test]
    fn wgsl_validates_and_params_match() {
        let m = validate_wgsl(SOURCE).unwrap_or_else(|e| panic!("mhc.wgsl: {e}"));
        for (name, size) in [
            ("PremixParams", std::mem::size_of::<PremixParams>()),
            ("RouteParams", std::mem::size_of::<RouteParams>()),
        ] {
            assert_eq!(wgsl_struct_size(&m, name), Some(size as u32), "{name}");
        }
    }
}
