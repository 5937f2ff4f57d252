//! The token step as prebuilt dispatch lists ([`StepProgram`], built once per
//! engine): `standard.rs` builds every model's lists and the batched plans, and
//! `lean.rs` builds the one-token step's lists beside them where the model fits
//! and [`ProgramKind::choose`] asks for it. Both build from `params.rs`.

mod lean;
mod params;
mod plan;
mod standard;

pub use params::Fault;
pub(crate) use params::{Kernels, Parts};
pub use plan::ProgramKind;
pub(crate) use plan::StepProgram;

use crate::error::Result;

impl StepProgram {
    /// Build every dispatch of the step: the standard program, and the lean
    /// one's lists beside it when [`Parts::program`] (or
    /// [`ProgramKind::choose`]) asks for it and the model fits it.
    ///
    /// # Errors
    /// [`crate::Error::Gpu`] for a matrix the gather kernel can't run.
    pub(crate) fn build(p: &Parts<'_>) -> Result<StepProgram> {
        let mut program = standard::build(p)?;
        if p.program.unwrap_or_else(|| ProgramKind::choose(p.ctx)) == ProgramKind::Lean {
            program.lean = lean::build(p, &program);
            if program.lean.is_none() {
                log::info!("the lean GPU program does not fit this model: using the standard one");
            }
        }
        Ok(program)
    }
}
