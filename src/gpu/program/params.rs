//! What the standard and the lean program both build from: the [`Parts`] they
//! wire together, the compiled [`Kernels`], the per-layer MLP and attention
//! params, and the deliberate [`Fault`]s.

use super::plan::ProgramKind;
use crate::gpu::kernels::attention::{AttentionKernels, AttnParams};
use crate::gpu::kernels::cq::CqKernels;
use crate::gpu::kernels::engram::EngramKernels;
use crate::gpu::kernels::layer::LayerKernels;
use crate::gpu::kernels::mhc::MhcKernels;
use crate::gpu::kernels::mlp::{MlpKernels, MlpParams};
use crate::gpu::layout::{ActLayout, Slots};
use crate::gpu::state::DeviceState;
use crate::gpu::step_input::StepLayout;
use crate::gpu::upload::GpuWeights;
use crate::gpu::GpuContext;
use crate::model::config::Config;

/// A deliberate bug, for testing that parity tools find it (never use otherwise).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Skip the `− u` of SPEC §4.3 step 7: the update is the block output itself.
    SkipMinusU,
    /// Rotate queries and keys by the physical cache slot instead of the logical position.
    RopeAtPhysicalSlot,
    /// Record one dispatch with more workgroups than the device allows (a wgpu
    /// validation error inside the step).
    InvalidDispatch,
}

/// The compiled kernel families of the step.
pub(crate) struct Kernels {
    pub cq: CqKernels,
    pub attention: AttentionKernels,
    pub mhc: MhcKernels,
    pub mlp: MlpKernels,
    pub engram: EngramKernels,
    pub layer: LayerKernels,
}

impl Kernels {
    /// Compile every family for `ctx`.
    pub(crate) fn new(ctx: &GpuContext) -> Kernels {
        Kernels {
            cq: CqKernels::new(ctx),
            attention: AttentionKernels::new(ctx),
            mhc: MhcKernels::new(ctx),
            mlp: MlpKernels::new(ctx),
            engram: EngramKernels::new(ctx),
            layer: LayerKernels::new(ctx),
        }
    }
}

/// Everything [`StepProgram::build`](super::StepProgram::build) wires together.
pub(crate) struct Parts<'a> {
    pub ctx: &'a GpuContext,
    pub config: &'a Config,
    pub kernels: &'a Kernels,
    pub weights: &'a GpuWeights,
    pub act: &'a ActLayout,
    pub slots: &'a Slots,
    pub state: &'a DeviceState,
    pub step: &'a StepLayout,
    pub fault: Option<Fault>,
    /// The program asked for (`None`: [`ProgramKind::choose`]).
    pub program: Option<ProgramKind>,
}

impl Parts<'_> {
    /// Where a batched matvec's inputs are prepared once
    /// ([`MatvecPlan::scratch`](crate::gpu::matvec_plan::MatvecPlan::scratch)).
    pub(super) fn scratch(&self) -> (wgpu::Buffer, usize) {
        (self.state.prep.clone(), self.slots.prep)
    }
}

/// Layer `l`'s MLP params (both programs).
pub(crate) fn mlp_params(p: &Parts<'_>, l: usize) -> MlpParams {
    let (c, a, lv) = (p.config, p.act, &p.weights.layer_vecs[l]);
    let skip_u = p.fault == Some(Fault::SkipMinusU);
    MlpParams {
        hidden: c.hidden as u32,
        hd: c.hadamard_dim as u32,
        b: a.b as u32,
        u: if skip_u { a.zero } else { a.u } as u32,
        attn: a.attn as u32,
        after: a.after as u32,
        update: a.update as u32,
        z: a.z as u32,
        post_norm: lv.post_norm as u32,
        mlp_norm: lv.mlp_norm as u32,
        d1: lv.d[0] as u32,
        d2: lv.d[1] as u32,
        d3: lv.d[2] as u32,
        out_scale: lv.scale as u32,
        out: a.out as u32,
        tstride: p.slots.act as u32,
    }
}

/// Layer `l`'s attention params (both programs; the lean one adds `kn_off`).
pub(crate) fn attn_params(p: &Parts<'_>, l: usize) -> AttnParams {
    let (c, a, lv) = (p.config, p.act, &p.weights.layer_vecs[l]);
    AttnParams {
        layer: l as u32,
        heads: c.heads as u32,
        kv_heads: c.kv_heads as u32,
        head_dim: c.head_dim as u32,
        sink: c.sink as u32,
        window: c.window as u32,
        rows: c.cache_rows() as u32,
        words: c.head_dim.div_ceil(4) as u32,
        q_off: a.q as u32,
        k_off: a.k as u32,
        v_off: a.v as u32,
        g_off: a.g as u32,
        o_off: a.o as u32,
        q_norm_off: lv.q_norm as u32,
        k_norm_off: lv.k_norm as u32,
        cos_at: p.step.cos_at() as u32,
        sin_at: p.step.sin_at() as u32,
        kn_off: 0,
        act_stride: p.slots.act as u32,
        step_stride: p.slots.step as u32,
        seq_at: p.step.seq_at() as u32,
        code_stride: (p.state.cache.code.1 / 4) as u32,
        scale_stride: (p.state.cache.scale.1 / 4) as u32,
        scores_stride: p.state.scores_stride() as u32,
    }
}
