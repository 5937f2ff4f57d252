//! [`GpuEngine`]: the SPEC §4 token step on the GPU. Everything is built at load
//! (weights uploaded once, pipelines, bind groups and per-dispatch parameters); a
//! step writes only the small step buffer, records the prebuilt dispatches into one
//! command encoder, submits once and reads back what its [`Readout`] asks.
//!
//! The parts, each owning its data: [`super::upload`] (weights),
//! [`super::layout`] (activation offsets, token slots), [`super::state`] (device
//! buffers), [`super::program`] (the dispatch lists and capture points),
//! [`super::readback`], [`super::prefill`] (chunks of up to
//! [`super::PREFILL_SLOTS`] tokens), and [`super::recorder`], the one recorder
//! every way of running the step goes through.

use super::capture::{Captured, Source};
use super::layout::{ActLayout, Slots};
use super::prefill::{PrefillPlan, SeqBinding};
use super::profile::{attended, describe_method, use_timestamps};
use super::program::{Fault, Kernels, Parts, StepProgram};
use super::readback::{DeviceReadout, Readback};
use super::recorder::{self, Observer, Op, Queries};
use super::state::DeviceState;
use super::step_input::StepInput;
use super::upload::GpuWeights;
use super::{GpuContext, GpuOptions, ProgramKind};
use crate::config::Config;
use crate::constrain::TokenMask;
use crate::engine::{Engine, HostTime, Readout, StepOut};
use crate::error::{Error, Result};
use crate::profile::Timing;
use crate::profile::{bytes, KernelProfile, KernelTally, KernelTimer};

use crate::weights::Model;
use std::sync::Arc;
use std::time::Instant;

/// The GPU engine. Weights and state live on the device for the engine's life.
pub struct GpuEngine {
    pub(super) ctx: Arc<GpuContext>,
    pub(super) model: Arc<Model>,
    pub(super) kernels: Kernels,
    pub(super) weights: GpuWeights,
    pub(super) slots: Slots,
    pub(super) state: DeviceState,
    pub(super) program: StepProgram,
    pub(super) input: StepInput,
    readback: Readback,
    prefill: PrefillPlan,
    prefill_chunk: usize,
    pos: u64,
    /// Host time of the decode steps so far ([`Engine::host_time`]).
    host: HostTime,
}

impl std::fmt::Debug for GpuEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuEngine")
            .field("device", &self.ctx.describe())
            .field("pos", &self.pos)
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

    /// The decode program this engine runs.
    pub fn program(&self) -> ProgramKind {
        self.program.kind
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
        Self::build_seqs(model, ctx, fault, program, 1)
    }

    /// [`GpuEngine::build`] with per-sequence buffers for `seqs` sequences (the
    /// engine's own steps use sequence 0; [`super::GpuBatch`] the others too).
    pub(super) fn build_seqs(
        model: Arc<Model>,
        ctx: Arc<GpuContext>,
        fault: Option<Fault>,
        program: Option<ProgramKind>,
        seqs: usize,
    ) -> Result<GpuEngine> {
        let c = &model.config;
        let kernels = Kernels::new(&ctx);
        let weights = GpuWeights::upload(&ctx, &model)?;
        let act = ActLayout::new(c, weights.sites.len(), weights.embed.padded());
        let input = StepInput::for_model(&model, fault == Some(Fault::RopeAtPhysicalSlot));
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
        let readback = Readback::new(&ctx, c.vocab, &state.logits)?;
        // A device lost or out of memory while uploading is reported here, not later.
        ctx.check_errors()?;
        Ok(GpuEngine {
            kernels,
            weights,
            prefill: PrefillPlan::new(slots, SeqBinding::Every(0)),
            prefill_chunk: slots.count,
            slots,
            state,
            program,
            input,
            readback,
            model,
            ctx,
            pos: 0,
            host: HostTime::default(),
        })
    }

    /// The device this engine runs on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Compute dispatches recorded per token: `(without logits, with logits)`.
    pub fn dispatches_per_token(&self) -> (usize, usize) {
        self.program.dispatches_per_token()
    }

    /// Kernel names of layer `l`'s dispatches, in recording order.
    pub fn layer_dispatch_names(&self, l: usize) -> Vec<&'static str> {
        self.program
            .layers
            .get(l)
            .map_or(Vec::new(), |d| d.iter().map(|x| x.name).collect())
    }

    /// Dispatches recorded for one layer (the largest over layers).
    pub fn dispatches_per_layer(&self) -> usize {
        self.program.layers.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Number of weight arenas (storage buffers holding the CQ matrices).
    pub fn weight_arenas(&self) -> usize {
        self.weights.arenas.len()
    }

    /// Bytes of GPU buffers this engine allocated.
    pub fn gpu_buffer_bytes(&self) -> u64 {
        self.weights.bytes() + self.state.bytes() + self.readback.bytes()
    }

    /// Token slots a prefill chunk can use on this device (at most
    /// [`super::PREFILL_SLOTS`]).
    pub fn prefill_slots(&self) -> usize {
        self.slots.count
    }

    /// Prompt tokens per prefill chunk of [`Engine::step_many`], clamped to
    /// `1..=`[`GpuEngine::prefill_slots`] (default: all slots). 1 runs one step per
    /// token; the logits are the same for every value, bit for bit.
    pub fn set_prefill_chunk(&mut self, n: usize) {
        self.prefill_chunk = n.clamp(1, self.slots.count);
    }

    /// Validate `token` and write the step buffer's slot 0 for it (the position
    /// advances when the step has been submitted).
    fn begin_step(&mut self, token: u32) -> Result<()> {
        let vocab = self.model.config.vocab;
        if token as usize >= vocab {
            return Err(Error::TokenOutOfRange { token, vocab });
        }
        self.ctx.check_errors()?;
        self.input
            .fill(&self.model.config, token, 0, self.pos, 0, 0);
        let n = self.input.layout.words();
        let words = &self.input.words[..n];
        self.ctx
            .queue
            .write_buffer(&self.state.step, 0, bytemuck::cast_slice(words));
        Ok(())
    }

    /// The ops of one decode step: head and layers, with `tail` the vocabulary
    /// projection, then the readout's dispatch (no allocation).
    fn decode_ops(&self, tail: bool, r: DeviceReadout) -> impl Iterator<Item = Op<'_>> + '_ {
        let p = &self.program;
        let tail = if tail { &p.tail[..] } else { &[] };
        p.head
            .iter()
            .chain(p.layers.iter().flatten())
            .chain(tail)
            .chain(self.readback.dispatch(r))
            .map(Op::Run)
    }

    /// Run one step of `token` with the device readout `r` through `observer`.
    fn run_step(&mut self, token: u32, r: DeviceReadout, observer: Observer<'_>) -> Result<()> {
        let t0 = Instant::now();
        let timed = matches!(observer, Observer::Plain | Observer::Timestamps(_));
        self.begin_step(token)?;
        self.readback.prepare(&self.ctx, r, &self.state.logits);
        let ops = self.decode_ops(r.needs_logits(), r);
        recorder::submit(&self.ctx, ops, observer, |enc| {
            self.readback.encode_copy(enc, r, &self.state.logits)
        })?;
        if timed {
            self.host.seconds += t0.elapsed().as_secs_f64();
            self.host.steps += 1;
        }
        self.pos += 1;
        // wgpu reports validation errors of the recorded work at submit time.
        self.ctx.check_errors()
    }

    /// Run `ids` (all `< vocab`, at most [`GpuEngine::prefill_slots`]) as one
    /// prefill chunk, with the device readout `r` after the last one.
    fn run_chunk(&mut self, ids: &[u32], r: DeviceReadout) -> Result<()> {
        let n = ids.len();
        debug_assert!(n >= 1 && n <= self.slots.count);
        self.ctx.check_errors()?;
        let c = &self.model.config;
        let stride = self.slots.step;
        for (j, &token) in ids.iter().enumerate() {
            self.input.fill(c, token, 0, self.pos + j as u64, j, stride);
        }
        let used = (n - 1) * stride + self.input.layout.words();
        self.ctx.queue.write_buffer(
            &self.state.step,
            0,
            bytemuck::cast_slice(&self.input.words[..used]),
        );
        self.readback.prepare(&self.ctx, r, &self.state.logits);
        self.prefill.prepare(
            &self.ctx,
            &self.program,
            &self.kernels,
            &self.weights,
            &self.state,
            n,
        );
        let Some(mut ops) = self.prefill.ops(n, r.needs_logits()) else {
            return Err(Error::Gpu("the prefill dispatches are missing".into()));
        };
        ops.extend(self.readback.dispatch(r).map(Op::Run));
        recorder::submit(&self.ctx, ops, Observer::Plain, |enc| {
            self.readback.encode_copy(enc, r, &self.state.logits)
        })?;
        self.pos += n as u64;
        self.ctx.check_errors()
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
        self.begin_step(token)?;
        let p = &self.program;
        let logits_point = super::capture::CapturePoint {
            after: p.tail.len(),
            name: "logits".into(),
            layer: None,
            source: Source::Logits,
            offset: 0,
            len: self.model.config.vocab,
        };
        let mut segments = vec![(&p.head, &p.head_caps[..])];
        segments.extend(p.layers.iter().zip(p.layer_caps.iter().map(Vec::as_slice)));
        // The tail runs when logits are asked for, or when it computes named
        // tensors of the last layer (the lean program's last layer_step).
        let mut tail_caps = p.tail_caps.clone();
        if want_logits {
            tail_caps.push(logits_point);
        }
        if want_logits || !p.tail_caps.is_empty() {
            segments.push((&p.tail, &tail_caps[..]));
        }
        let points: Vec<_> = segments.iter().flat_map(|(_, c)| c.iter()).collect();
        let total: usize = points.iter().map(|c| c.len).sum();
        let capture = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("capture"),
            size: (total.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let s = &self.state;
        let mut ops = Vec::new();
        let mut cursor = 0u64;
        for (ds, caps) in &segments {
            let mut start = 0;
            for cp in caps.iter() {
                ops.extend(ds[start..cp.after].iter().map(Op::Run));
                start = start.max(cp.after);
                let src = match cp.source {
                    Source::Act => &s.act,
                    Source::Lanes => &s.lanes,
                    Source::Logits => &s.logits,
                };
                ops.push(Op::Copy {
                    src,
                    src_offset: cp.offset as u64 * 4,
                    dst: &capture,
                    dst_offset: cursor * 4,
                    bytes: cp.len as u64 * 4,
                });
                cursor += cp.len as u64;
            }
            ops.extend(ds[start..].iter().map(Op::Run));
        }
        recorder::submit(&self.ctx, ops, Observer::Plain, |_| {})?;
        let data = self.ctx.map_read(&capture, total as u64 * 4)?;
        let all: Vec<f32> = bytemuck::pod_collect_to_vec(&data);
        let mut out = Vec::with_capacity(points.len());
        let mut at = 0;
        let mut logits = None;
        for cp in points {
            let data = all[at..at + cp.len].to_vec();
            at += cp.len;
            if cp.source == Source::Logits {
                logits = Some(data.clone());
            }
            out.push(Captured {
                name: cp.name.clone(),
                layer: cp.layer,
                data,
            });
        }
        self.pos += 1;
        if want_logits {
            self.readback.on_device();
        } else {
            self.readback.forget();
        }
        self.ctx.check_errors()?;
        Ok((logits, out))
    }

    /// Run one step (with logits) dispatch by dispatch, one submit and wait each,
    /// and return each dispatch's kernel name and wall time in seconds. Slow and
    /// coarse (it includes submit and wait overhead): the fallback timing for
    /// adapters without timestamp queries.
    ///
    /// # Errors
    /// As [`Engine::step`].
    pub fn time_dispatches(&mut self, token: u32) -> Result<Vec<(&'static str, f64)>> {
        let mut secs = Vec::new();
        self.run_step(
            token,
            DeviceReadout::Logits,
            Observer::PerDispatch(&mut secs),
        )?;
        self.readback.on_device();
        Ok(self.program.all().map(|d| d.name).zip(secs).collect())
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
        let use_ts = use_timestamps(timing, &self.ctx)?;
        let meta: Vec<(&'static str, u64)> =
            self.program.all().map(|d| (d.name, d.bytes)).collect();
        let queries = if use_ts {
            Some(Queries::new(&self.ctx, meta.len())?)
        } else {
            None
        };
        let c = self.model.config.clone();
        let mut tally = KernelTally::default();
        let mut wall = 0.0;
        for &token in tokens {
            // The attention dispatch's estimate is for a full cache; recount it here.
            let attend_bytes =
                bytes::attend(c.heads, c.head_dim, attended(self.pos, c.sink, c.window));
            let t0 = Instant::now();
            let secs = match &queries {
                Some(q) => {
                    self.run_step(token, DeviceReadout::Logits, Observer::Timestamps(q))?;
                    // The logits come back as in a decode step, inside the wall time.
                    self.readback
                        .finish(&self.ctx, Readout::Logits, self.pos - 1)?;
                    q.seconds(&self.ctx)?
                }
                None => self
                    .time_dispatches(token)?
                    .into_iter()
                    .map(|(_, s)| s)
                    .collect(),
            };
            wall += t0.elapsed().as_secs_f64();
            if secs.len() != meta.len() {
                return Err(Error::Gpu(format!(
                    "profile: {} timings for {} dispatches",
                    secs.len(),
                    meta.len()
                )));
            }
            for (&(name, b), s) in meta.iter().zip(secs) {
                tally.kernel(name, s, if name == "attend" { attend_bytes } else { b });
            }
        }
        let method = describe_method(
            queries.as_ref().map(|q| q.period_ns),
            self.ctx.caps.timestamps,
        );
        Ok(tally.into_profile(tokens.len(), wall, &method))
    }
}

impl Engine for GpuEngine {
    fn config(&self) -> &Config {
        &self.model.config
    }

    fn step(&mut self, token: u32, readout: Readout) -> Result<StepOut<'_>> {
        readout.validate()?;
        self.run_step(token, DeviceReadout::of(readout), Observer::Plain)?;
        self.readback.finish(&self.ctx, readout, self.pos - 1)
    }

    fn step_many(&mut self, ids: &[u32], readout: Readout) -> Result<StepOut<'_>> {
        readout.validate()?;
        let vocab = self.model.config.vocab;
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
        let chunks = ids.len().div_ceil(self.prefill_chunk);
        for (i, part) in ids.chunks(self.prefill_chunk).enumerate() {
            let r = if i + 1 == chunks {
                readout
            } else {
                Readout::None
            };
            if self.prefill_chunk == 1 {
                self.run_step(part[0], DeviceReadout::of(r), Observer::Plain)?;
            } else {
                self.run_chunk(part, DeviceReadout::of(r))?;
            }
        }
        self.readback.finish(&self.ctx, readout, self.pos - 1)
    }

    fn last_logits(&mut self) -> Result<Option<&[f32]>> {
        self.readback.last_logits(&self.ctx, &self.state.logits)
    }

    fn readout(&mut self, readout: Readout, mask: Option<&TokenMask>) -> Result<StepOut<'_>> {
        let t = self.pos.saturating_sub(1);
        self.readback
            .reread(&self.ctx, readout, mask, &self.state.logits, t)
    }

    fn reset(&mut self) {
        self.pos = 0;
        self.readback.forget();
        self.input.clear();
        // Cache and ring rows of earlier runs are never read before being rewritten
        // (attention reads only positions <= t, the ring only positions >= 0).
    }

    fn position(&self) -> u64 {
        self.pos
    }

    fn describe(&self) -> String {
        let program = match self.program.kind {
            ProgramKind::Standard => "standard",
            ProgramKind::Lean => "lean",
        };
        format!("gpu: {}, {program} program", self.ctx.describe())
    }

    fn dispatches_per_token(&self) -> Option<usize> {
        Some(GpuEngine::dispatches_per_token(self).1)
    }

    fn host_time(&self) -> Option<HostTime> {
        Some(self.host)
    }

    fn device_bytes(&self) -> u64 {
        self.gpu_buffer_bytes()
    }

    fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }
}
