//! [`GpuModel`]: a model on a device — its context, kernels, uploaded weights,
//! token slots, device state for some sequences and the step program — built
//! once and owned by the [`super::GpuBatch`] that steps it (of which
//! [`super::GpuEngine`] is the one-slot view).

use super::layout::{ActLayout, Slots};
use super::program::{Fault, Kernels, Parts, StepProgram};
use super::state::DeviceState;
use super::step_input::StepInput;
use super::upload::GpuWeights;
use super::{GpuContext, ProgramKind};
use crate::error::Result;
use crate::model::weights::Model;
use std::sync::Arc;

/// A model on a device, with room for some sequences.
pub(crate) struct GpuModel {
    pub(crate) ctx: Arc<GpuContext>,
    pub(crate) model: Arc<Model>,
    pub(crate) kernels: Kernels,
    pub(crate) weights: GpuWeights,
    pub(crate) slots: Slots,
    pub(crate) state: DeviceState,
    pub(crate) program: StepProgram,
    /// Words of one token's step input.
    pub(crate) step_words: usize,
    /// The fault injection that rotates by the physical slot (for the parity tools).
    rope_at_slot: bool,
}

impl GpuModel {
    /// Upload `model` to `ctx` with device state for `seqs` sequences, running
    /// `program` (or what [`ProgramKind::choose`] says), with a deliberate
    /// `fault` for testing the parity tools.
    ///
    /// # Errors
    /// [`crate::Error::Gpu`] for a missing limit, a model the kernels can't run
    /// (a group over 4096 columns), or buffers over the device's limits.
    pub(crate) fn build(
        model: Arc<Model>,
        ctx: Arc<GpuContext>,
        fault: Option<Fault>,
        program: Option<ProgramKind>,
        seqs: usize,
    ) -> Result<GpuModel> {
        let c = &model.config;
        let kernels = Kernels::new(&ctx);
        // A kernel over the device's limits is reported now, before anything
        // binds its placeholder (whose empty layout would log follow-on errors).
        ctx.check_errors()?;
        let weights = GpuWeights::upload(&ctx, &model, kernels.cq.staging())?;
        let act = ActLayout::new(c, weights.sites.len(), weights.embed.padded());
        let rope_at_slot = fault == Some(Fault::RopeAtPhysicalSlot);
        let input = StepInput::for_model(&model, rope_at_slot);
        let slots = Slots::new(
            &ctx,
            act.len,
            c.hidden,
            input.layout.words(),
            weights.max_matvec_padded(),
        );
        let state = DeviceState::new(&ctx, c, &slots, weights.sites.len(), seqs)?;
        let program = StepProgram::build(&Parts {
            ctx: &ctx,
            config: c,
            kernels: &kernels,
            weights: &weights,
            act: &act,
            slots: &slots,
            state: &state,
            step: &input.layout,
            fault,
            program,
        })?;
        // A device lost or out of memory while uploading is reported here, not later.
        ctx.check_errors()?;
        Ok(GpuModel {
            ctx,
            model,
            kernels,
            weights,
            slots,
            state,
            program,
            step_words: input.layout.words(),
            rope_at_slot,
        })
    }

    /// The host side of a fresh sequence's step input.
    pub(crate) fn new_input(&self) -> StepInput {
        StepInput::for_model(&self.model, self.rope_at_slot)
    }

    /// Bytes of the weights' and the state's device buffers.
    pub(crate) fn bytes(&self) -> u64 {
        self.weights.bytes() + self.state.bytes()
    }

    /// `gpu: ADAPTER, PROGRAM program`.
    pub(crate) fn describe(&self) -> String {
        let program = match self.program.kind() {
            ProgramKind::Standard => "standard",
            ProgramKind::Lean => "lean",
        };
        format!("gpu: {}, {program} program", self.ctx.describe())
    }
}
