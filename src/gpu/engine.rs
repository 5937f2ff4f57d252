//! [`GpuEngine`]: the SPEC §4 token step on the GPU, as the one-slot view of
//! [`GpuBatch`]: a decode step, a prefill chunk and a readout of the engine are
//! a batch step of one item, so one sequence and a server's batch run the same
//! code. Everything is built at load (weights uploaded once, pipelines, bind
//! groups and per-dispatch parameters); a step writes only the small step
//! buffer, records the prebuilt dispatches into one command encoder, submits
//! once and reads back what its [`Readout`] asks.

use super::batch::GpuBatch;
use super::{Captured, Fault, GpuContext, GpuOptions, ProgramKind};
use crate::constrain::TokenMask;
use crate::engine::profile::{KernelProfile, KernelTally, Timing};
use crate::engine::{BatchEngine, Engine, HostTime, Readout, SavedSlot, SlotStep, StepOut};
use crate::error::{Error, Result};
use crate::model::config::Config;
use crate::model::weights::Model;
use std::sync::Arc;
use std::time::Instant;

/// The GPU engine. Weights and state live on the device for the engine's life.
pub struct GpuEngine {
    /// The sequence, in slot 0.
    batch: GpuBatch,
    prefill_chunk: usize,
}

impl std::fmt::Debug for GpuEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuEngine")
            .field("device", &self.batch.context().describe())
            .field("pos", &self.batch.position(0))
            .finish_non_exhaustive()
    }
}

impl GpuEngine {
    /// Open a device with `opts` and build an engine for `model`.
    ///
    /// # Errors
    /// [`Error::Gpu`] for a missing adapter or limit, or a model the kernels can't
    /// run (a group over 4096 columns).
    pub fn new(model: Arc<Model>, opts: &GpuOptions) -> Result<GpuEngine> {
        let ctx = Self::context_for(&model, opts)?;
        Self::with_context(model, ctx)
    }

    /// Open a device with `opts` whose limits fit `model` (what
    /// [`GpuEngine::new`] runs on; engines and batches can share it).
    ///
    /// # Errors
    /// As [`GpuEngine::new`].
    pub fn context_for(model: &Model, opts: &GpuOptions) -> Result<Arc<GpuContext>> {
        let c = &model.config;
        let needed = (c.vocab as u64 * 4).max(model.weights.embed.row_bytes() as u64 * 64);
        GpuContext::new(opts, needed)
    }

    /// Build an engine on an existing device (engines on one device share nothing but it).
    ///
    /// # Errors
    /// As [`GpuEngine::new`].
    pub fn with_context(model: Arc<Model>, ctx: Arc<GpuContext>) -> Result<GpuEngine> {
        Self::build(model, ctx, None, None)
    }

    /// [`GpuEngine::with_context`] running `program` whatever the adapter and
    /// `CQLM_GPU_PROGRAM` say (the lean program falls back to the standard one for
    /// a model it does not fit: see [`GpuEngine::program`]).
    ///
    /// # Errors
    /// As [`GpuEngine::new`].
    pub fn with_program(
        model: Arc<Model>,
        ctx: Arc<GpuContext>,
        program: ProgramKind,
    ) -> Result<GpuEngine> {
        Self::build(model, ctx, None, Some(program))
    }

    /// [`GpuEngine::with_context`] with a deliberate bug (for testing parity tools).
    ///
    /// # Errors
    /// As [`GpuEngine::new`].
    #[doc(hidden)]
    pub fn with_fault(model: Arc<Model>, ctx: Arc<GpuContext>, fault: Fault) -> Result<GpuEngine> {
        Self::build(model, ctx, Some(fault), None)
    }

    fn build(
        model: Arc<Model>,
        ctx: Arc<GpuContext>,
        fault: Option<Fault>,
        program: Option<ProgramKind>,
    ) -> Result<GpuEngine> {
        let batch = GpuBatch::build(model, ctx, 1, program, fault)?;
        Ok(GpuEngine {
            prefill_chunk: batch.gpu().slots.count,
            batch,
        })
    }

    /// The decode program this engine runs.
    pub fn program(&self) -> ProgramKind {
        self.batch.program()
    }

    /// The device this engine runs on.
    pub fn context(&self) -> &Arc<GpuContext> {
        self.batch.context()
    }

    /// Compute dispatches recorded per token: `(without logits, with logits)`.
    pub fn dispatches_per_token(&self) -> (usize, usize) {
        self.batch.gpu().program.decode().dispatches_per_token()
    }

    /// Kernel names of layer `l`'s dispatches, in recording order.
    pub fn layer_dispatch_names(&self, l: usize) -> Vec<&'static str> {
        let layers = &self.batch.gpu().program.decode().layers;
        layers
            .get(l)
            .map_or(Vec::new(), |d| d.iter().map(|x| x.name).collect())
    }

    /// Dispatches recorded for one layer (the largest over layers).
    pub fn dispatches_per_layer(&self) -> usize {
        let layers = &self.batch.gpu().program.decode().layers;
        layers.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Number of weight arenas (storage buffers holding the CQ matrices).
    pub fn weight_arenas(&self) -> usize {
        self.batch.gpu().weights.arenas.len()
    }

    /// Bytes of GPU buffers this engine allocated.
    pub fn gpu_buffer_bytes(&self) -> u64 {
        self.batch.device_bytes()
    }

    /// Token slots a prefill chunk can use on this device (at most
    /// [`super::PREFILL_SLOTS`]).
    pub fn prefill_slots(&self) -> usize {
        self.batch.gpu().slots.count
    }

    /// Prompt tokens per prefill chunk of [`Engine::step_many`], clamped to
    /// `1..=`[`GpuEngine::prefill_slots`] (default: all slots). 1 runs one step per
    /// token; the logits are the same for every value, bit for bit.
    pub fn set_prefill_chunk(&mut self, n: usize) {
        self.prefill_chunk = n.clamp(1, self.prefill_slots());
    }

    /// Run one step and also copy every named intermediate out of it (the CPU
    /// probe's names: `x0`, `engram.e`, `engram.key.{s}`, `engram.value.{s}`, and per
    /// layer `u`, `block_in`, `q`, `k`, `v`, `attn_o`, `after_attn`, `mlp_out`,
    /// `update`, `route`, `lanes`; `logits` when asked). The copies run between the
    /// same dispatches as [`Engine::step`]; a normal step records none of them, so
    /// capture costs nothing when off.
    ///
    /// # Errors
    /// As [`Engine::step`].
    pub fn step_captured(
        &mut self,
        token: u32,
        want_logits: bool,
    ) -> Result<(Option<Vec<f32>>, Vec<Captured>)> {
        self.batch.step_captured(token, want_logits)
    }

    /// Step every id of `tokens` with logits, as real decode steps, and time each
    /// dispatch; the result averages per token and groups dispatches by kernel
    /// name, so its calls per token add up to
    /// [`GpuEngine::dispatches_per_token`]`().1`.
    ///
    /// With timestamps, each dispatch is bracketed by two timestamp writes in the
    /// step's single compute pass: the kernel times add up to at most the GPU time
    /// of the step, itself inside the step's wall time (write of the step buffer
    /// to the logits readback). Per dispatch, each time is the host wall time of
    /// one submit and wait; they add up to at most the step's wall time.
    ///
    /// # Errors
    /// As [`Engine::step`]; [`Error::Gpu`] for [`Timing::Timestamps`] on a
    /// device without timestamp queries enabled.
    pub fn profile(&mut self, tokens: &[u32], timing: Timing) -> Result<KernelProfile> {
        let mut tally = KernelTally::default();
        let (mut wall, mut method) = (0.0, String::new());
        for &token in tokens {
            let t0 = Instant::now();
            let ids = [token];
            let work = [SlotStep::new(0, &ids, Readout::Logits)];
            method = self.batch.step_timed(&work, timing, &mut tally)?;
            wall += t0.elapsed().as_secs_f64();
        }
        if tokens.is_empty() {
            // Still say how it would have timed (and refuse what it can't).
            let ctx = self.context();
            let ts = super::timing::use_timestamps(timing, ctx)?;
            method = super::timing::describe_method(None, ctx.caps.timestamps && ts);
        }
        Ok(tally.into_profile(tokens.len(), wall, &method))
    }
}

impl Engine for GpuEngine {
    fn config(&self) -> &Config {
        &self.batch.model().config
    }

    fn step(&mut self, token: u32, readout: Readout) -> Result<StepOut<'_>> {
        self.step_many(&[token], readout)
    }

    fn step_many(&mut self, ids: &[u32], readout: Readout) -> Result<StepOut<'_>> {
        readout.validate()?;
        let vocab = self.config().vocab;
        if let Some(bad) = ids.iter().position(|&t| t as usize >= vocab) {
            self.step_many(&ids[..bad], Readout::None)?;
            return Err(Error::TokenOutOfRange {
                token: ids[bad],
                vocab,
            });
        }
        if ids.is_empty() {
            return Ok(StepOut::None);
        }
        let parts = ids.len().div_ceil(self.prefill_chunk);
        for (i, part) in ids.chunks(self.prefill_chunk).enumerate() {
            let r = if i + 1 == parts {
                readout
            } else {
                Readout::None
            };
            self.batch.step(&[SlotStep::new(0, part, r)])?;
        }
        Ok(self.batch.out(0))
    }

    fn last_logits(&mut self) -> Result<Option<&[f32]>> {
        if !self.batch.has_logits(0) {
            return Ok(None);
        }
        // A step that read out the logits has them on the host already.
        if matches!(self.batch.out(0), StepOut::Logits(_)) {
            return Ok(self.batch.out(0).logits());
        }
        Ok(self.batch.reread(0, Readout::Logits, None)?.logits())
    }

    fn readout(&mut self, readout: Readout, mask: Option<&TokenMask>) -> Result<StepOut<'_>> {
        self.batch.reread(0, readout, mask)
    }

    fn reset(&mut self) {
        self.batch.reset(0);
    }

    fn save(&mut self) -> Result<SavedSlot> {
        self.batch.save(0)
    }

    fn restore(&mut self, saved: &SavedSlot) -> Result<()> {
        self.batch.restore(0, saved)
    }

    fn position(&self) -> u64 {
        self.batch.position(0)
    }

    fn describe(&self) -> String {
        self.batch.gpu().describe()
    }

    fn dispatches_per_token(&self) -> Option<usize> {
        Some(GpuEngine::dispatches_per_token(self).1)
    }

    fn host_time(&self) -> Option<HostTime> {
        Some(self.batch.host_time())
    }

    fn device_bytes(&self) -> u64 {
        self.gpu_buffer_bytes()
    }

    fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }
}
