//! [`StepProgram`]: the token step as lists of prebuilt dispatches
//! ([`StepLists`]: head, one list per layer, tail, with the capture points
//! between them) — the standard program's always, the lean program's beside
//! them when chosen — and, per layer, the plan a pass of several tokens batches
//! its matvecs from; and [`ProgramKind`], which program a one-token step runs.

use crate::gpu::capture::CapturePoint;
use crate::gpu::kernels::engram::EngramConvParams;
use crate::gpu::kernels::mhc::{PremixParams, RouteParams};
use crate::gpu::kernels::mlp::MlpParams;
use crate::gpu::matvec_plan::MatvecPlan;
use crate::gpu::{Dispatch, GpuContext};

/// Which dispatch lists a one-token step records (passes of several tokens
/// run the standard program's batched plan either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramKind {
    /// 8 dispatches per layer, each kernel on its own (what suits lavapipe, whose
    /// threads run a workgroup as a loop: a single-workgroup kernel there is one
    /// CPU thread).
    Standard,
    /// 3 dispatches per layer (`gpu/program/lean.rs`: one `layer_step`, the
    /// q/k/v/g matvec and `qk_attend`).
    Lean,
}

impl ProgramKind {
    /// `CQLM_GPU_PROGRAM=lean|standard` when set (an unknown value is ignored
    /// with a warning), else lean on a hardware GPU and standard on a software
    /// adapter (wgpu's `DeviceType::Cpu`).
    pub fn choose(ctx: &GpuContext) -> ProgramKind {
        match std::env::var("CQLM_GPU_PROGRAM").as_deref() {
            Ok("lean") => return ProgramKind::Lean,
            Ok("standard") => return ProgramKind::Standard,
            Ok(other) => log::warn!("CQLM_GPU_PROGRAM={other}: expected lean or standard"),
            Err(_) => {}
        }
        if ctx.info.device_type == wgpu::DeviceType::Cpu {
            ProgramKind::Standard
        } else {
            ProgramKind::Lean
        }
    }
}

/// One layer of the step as a prefill chunk runs it: three batched matvecs,
/// the MLP, premix and route, each one dispatch over every token slot (their
/// params carry the slot strides), and between them the per-token dispatches that
/// touch a sequence's cache (slot-0 bindings; rebound per slot).
pub(crate) struct LayerPlan {
    pub phi: MatvecPlan,
    pub premix: PremixParams,
    pub qkvg: MatvecPlan,
    pub qk_store: Dispatch,
    pub attend: Dispatch,
    pub wo: MatvecPlan,
    pub mlp: MlpParams,
    pub route: RouteParams,
}

/// One program's token step: its dispatch lists and the capture points
/// between them.
pub(crate) struct StepLists {
    /// Standard: the embedding gather and the engram head; lean: every gather
    /// in one dispatch and the engram sites' matvec.
    pub head: Vec<Dispatch>,
    /// Per layer; standard: phi, premix, qkvg, qk_store, attend, wo, mlp, route;
    /// lean: layer_step, qkvg, qk_attend.
    pub layers: Vec<Vec<Dispatch>>,
    /// The vocabulary projection (lean: after the last layer_step).
    pub tail: Vec<Dispatch>,
    /// Capture points of the head, of each layer and of the tail (lean: the last
    /// layer's tensors after its layer_step; the logits are added by the caller).
    pub head_caps: Vec<CapturePoint>,
    pub layer_caps: Vec<Vec<CapturePoint>>,
    pub tail_caps: Vec<CapturePoint>,
}

impl StepLists {
    /// Dispatches of a step without and with the vocabulary projection.
    pub(crate) fn dispatches_per_token(&self) -> (usize, usize) {
        let base = self.head.len() + self.layers.iter().map(Vec::len).sum::<usize>();
        (base, base + self.tail.len())
    }
}

/// The token step's dispatches, capture points and the batched plan.
///
/// Passes of several tokens (prefill chunks, batch passes) run the standard
/// lists' per-token dispatches around the batched ones of [`StepProgram::plan`],
/// whichever program was chosen; a pass of one token runs
/// [`StepProgram::decode`]. Both programs leave the same cache and rings, so a
/// sequence moves between them at any token.
pub(crate) struct StepProgram {
    /// The standard program's lists.
    pub standard: StepLists,
    /// The lean program's lists, when it was asked for and the model fits it.
    pub lean: Option<StepLists>,
    /// The engram convolutions within the standard head, and their params (a
    /// batch pass runs them for several sequences at once with a ring stride).
    pub head_conv: std::ops::Range<usize>,
    pub head_conv_params: Vec<EngramConvParams>,
    /// The engram sites' value and key matvecs within the standard head (between
    /// the gathers and the convolutions), and their plans, which a prefill chunk
    /// runs batched over its token slots.
    pub head_sites: std::ops::Range<usize>,
    pub head_site_plans: Vec<MatvecPlan>,
    /// The standard head's gathers (the embedding and the engram tables) in one
    /// `gather_many` dispatch for one token slot, at the slot strides: with
    /// [`Dispatch::over_slots`] a pass's slots `0..n` at once. `None` when they don't
    /// fit one dispatch ([`crate::gpu::kernels::cq::CqKernels::gather_many`]).
    pub head_gathers: Option<Dispatch>,
    /// Per layer, what a pass of several tokens batches.
    pub plan: Vec<LayerPlan>,
    /// The vocabulary projection batched over token slots, slot `j`'s logits in
    /// window `j` of the logits buffer ([`crate::gpu::GpuBatch`]'s passes).
    pub tail_plan: MatvecPlan,
}

impl StepProgram {
    /// Which program a one-token step runs.
    pub(crate) fn kind(&self) -> ProgramKind {
        match self.lean {
            Some(_) => ProgramKind::Lean,
            None => ProgramKind::Standard,
        }
    }

    /// The lists a one-token step runs: the lean program's when built, else
    /// the standard one's.
    pub(crate) fn decode(&self) -> &StepLists {
        self.lean.as_ref().unwrap_or(&self.standard)
    }
}
