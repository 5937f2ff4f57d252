//! [`GpuBatch`]: several sequences of one model on one device, stepped together:
//! continuous batching for a server, and (one slot) the [`super::GpuEngine`].
//! The model is uploaded once ([`GpuModel`]); each
//! sequence has its own KV cache, engram rings, attention scores and logits, side
//! by side in the engine's buffers ([`DeviceState::seq_windows`]), and its own
//! position and token history on the host.
//!
//! A step packs its items' ids into passes of at most the device's token slots
//! (one id items first, then longer ones, each item's ids in ascending slots).
//! A pass is one submit: every matvec, the MLP, the lane pre-mix and the lane
//! routing are one dispatch over its slots, so the weights are decoded once for
//! all of them, whichever sequences they belong to. Attention (qk_store, attend)
//! and the engram convolutions find each slot's sequence in its step input: the
//! leading slots of distinct sequences (the decode tokens) run in one dispatch
//! each, the rest (a prompt chunk's tokens) per slot in order, bound to the
//! slot's sequence's rings ([`PrefillPlan`] with [`SeqBinding::Every`] per
//! sequence, built at its first pass). The head's gathers (embedding and engram
//! tables) of every slot run in one dispatch, its engram matvecs batched. A
//! decode pass thus runs no dispatch per slot, and a prompt chunk rides in the
//! same pass as the other sequences' decode tokens. The vocabulary projection runs for the slots that
//! end an item: one batched matvec over the pass when they are most of it, else
//! one per item. Each item that ends in a pass reads out what it asks in that
//! pass's submit ([`Readouts`]: the device argmax or top-k under its mask, or
//! its logits), all mapped at once after the last pass. Each item's readout is
//! that of its sequence stepped alone, since the batched matvecs equal the
//! single ones bit for bit.

use super::capture::{self, Captured};
use super::model::GpuModel;
use super::prefill::{mixed_ops, PrefillPlan, SeqBinding};
use super::readout::Readouts;
use super::recorder::{self, Observer};
use super::saved;
use super::step_input::StepInput;
use super::timing::{describe_method, use_timestamps};
use super::{GpuContext, ProgramKind};
use crate::constrain::TokenMask;
use crate::engine::profile::{KernelTally, KernelTimer, Timing};
use crate::engine::{BatchEngine, HostTime, Readout, SavedSlot, SlotStep, StepOut};
use crate::error::{Error, Result};
use crate::model::weights::Model;
use std::sync::Arc;
use std::time::Instant;

/// One sequence's host side: its position and its step input (token history).
struct Seq {
    pos: u64,
    input: StepInput,
}

/// Sequences of one model in slots on one device, stepped together by
/// [`GpuBatch::step`].
pub struct GpuBatch {
    gpu: GpuModel,
    /// The batched dispatches every pass shares.
    shared: PrefillPlan,
    /// Per sequence, its per-slot dispatches (built at its first pass).
    per_seq: Vec<Option<PrefillPlan>>,
    seqs: Vec<Seq>,
    readouts: Readouts,
    /// Reused each step: the items in placing order, ids placed per item, the
    /// tokens of a pass, its step-buffer words, and its slots that end an item
    /// needing logits.
    order: Vec<usize>,
    placed: Vec<usize>,
    pass: Vec<Placed>,
    words: Vec<u32>,
    ends: Vec<usize>,
    /// While [`GpuBatch::step_timed`] runs: how each pass is timed, and the
    /// tally its dispatches go to.
    timer: Option<PassTimer>,
    /// Host time of the decode passes so far (write, record, submit; not the
    /// wait), and whether the step running now is one (every item one id).
    host: HostTime,
    decoding: bool,
}

/// The timing of a [`GpuBatch::step_timed`]: timestamp queries around each
/// dispatch (else a submit and wait per dispatch) and the tally they fill.
struct PassTimer {
    timestamps: bool,
    tally: KernelTally,
}

impl std::fmt::Debug for GpuBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBatch")
            .field("device", &self.gpu.ctx.describe())
            .field("slots", &self.seqs.len())
            .finish_non_exhaustive()
    }
}

impl GpuBatch {
    /// `slots` empty sequences (position 0) of `model` on `ctx`, running
    /// `program` (or what [`ProgramKind::choose`] says). Slots are capped at the
    /// device's token slots ([`crate::GpuEngine::prefill_slots`]).
    ///
    /// # Errors
    /// As [`crate::GpuEngine::new`]; [`Error::Gpu`] when the per-sequence
    /// buffers of `slots` sequences exceed the device's limits, or `slots` is
    /// over the device's token slots.
    pub fn new(
        model: Arc<Model>,
        ctx: Arc<GpuContext>,
        slots: usize,
        program: Option<ProgramKind>,
    ) -> Result<GpuBatch> {
        Self::build(model, ctx, slots, program, None)
    }

    /// [`GpuBatch::new`] with a deliberate `fault` (for testing the parity tools).
    pub(super) fn build(
        model: Arc<Model>,
        ctx: Arc<GpuContext>,
        slots: usize,
        program: Option<ProgramKind>,
        fault: Option<super::Fault>,
    ) -> Result<GpuBatch> {
        let n = slots.max(1);
        let gpu = GpuModel::build(model, ctx, fault, program, n)?;
        if n > gpu.slots.count {
            return Err(Error::Gpu(format!(
                "{n} batched sequences: this device holds {} token slots",
                gpu.slots.count
            )));
        }
        let readouts = Readouts::new(&gpu.ctx, gpu.model.config.vocab, n)?;
        let seqs = (0..n)
            .map(|_| Seq {
                pos: 0,
                input: gpu.new_input(),
            })
            .collect();
        gpu.ctx.check_errors()?;
        Ok(GpuBatch {
            shared: PrefillPlan::new(gpu.slots, SeqBinding::Batched),
            per_seq: (0..n).map(|_| None).collect(),
            seqs,
            readouts,
            order: Vec::with_capacity(n),
            placed: Vec::with_capacity(n),
            pass: Vec::with_capacity(gpu.slots.count),
            words: Vec::new(),
            ends: Vec::with_capacity(gpu.slots.count),
            timer: None,
            host: HostTime::default(),
            decoding: false,
            gpu,
        })
    }

    /// The device the batch runs on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.gpu.ctx
    }

    /// The decode program the batch runs.
    pub fn program(&self) -> ProgramKind {
        self.gpu.program.kind()
    }

    /// The model on the device.
    pub(super) fn gpu(&self) -> &GpuModel {
        &self.gpu
    }

    /// Bytes of the device buffers this batch allocated.
    pub fn device_bytes(&self) -> u64 {
        self.gpu.bytes() + self.readouts.bytes()
    }

    /// Host time of the decode passes so far (steps whose items are one id
    /// each): writing the step buffer, recording and submitting, not the wait
    /// for the device.
    pub fn host_time(&self) -> HostTime {
        self.host
    }

    /// Whether the last step computed logits for its item `item`.
    pub(super) fn has_logits(&self, item: usize) -> bool {
        self.readouts.has_logits(item)
    }

    /// Step `token` in slot 0 and also copy every named intermediate out of the
    /// step ([`crate::GpuEngine::step_captured`]); its logits, when asked, stay
    /// for [`GpuBatch::reread`] of item 0.
    ///
    /// # Errors
    /// As [`GpuBatch::step`].
    pub(super) fn step_captured(
        &mut self,
        token: u32,
        want_logits: bool,
    ) -> Result<(Option<Vec<f32>>, Vec<Captured>)> {
        let vocab = self.gpu.model.config.vocab;
        if token as usize >= vocab {
            return Err(Error::TokenOutOfRange { token, vocab });
        }
        self.gpu.ctx.check_errors()?;
        let s = &mut self.seqs[0];
        s.input.fill(&self.gpu.model.config, token, 0, s.pos, 0, 0);
        let words = &s.input.words[..self.gpu.step_words];
        self.gpu
            .ctx
            .queue
            .write_buffer(&self.gpu.state.step, 0, bytemuck::cast_slice(words));
        let keep = want_logits.then(|| self.readouts.keep(0, &self.gpu.state.logits, 0));
        let out = capture::run(&self.gpu, want_logits, keep);
        s.pos += 1;
        if want_logits {
            self.readouts.kept_only();
        } else {
            self.readouts.forget(0);
        }
        let out = out?;
        self.gpu.ctx.check_errors()?;
        Ok(out)
    }

    /// One pass: token `j` of `pass` in slot `j`, in one submit that also keeps
    /// the logits of the items ending here, runs their readouts and copies what
    /// they read back into the staging buffer.
    fn run_pass(&mut self, pass: &[Placed]) -> Result<()> {
        let t0 = Instant::now();
        let e = &self.gpu;
        let c = &e.model.config;
        let stride = e.slots.step;
        let words = e.step_words;
        let n = pass.len();
        // The pass's step inputs, slot after slot, in one write.
        self.words.clear();
        self.words.resize((n - 1) * stride + words, 0);
        // For a timed pass: the attention's bytes at each token's position (the
        // dispatches' estimates are for a full cache).
        let (timed, mut attend_bytes) = (self.timer.is_some(), 0);
        for (j, p) in pass.iter().enumerate() {
            let s = &mut self.seqs[p.seq];
            s.input.fill(c, p.token, p.seq, s.pos, 0, stride);
            self.words[j * stride..j * stride + words].copy_from_slice(&s.input.words[..words]);
            if timed {
                let rows = super::timing::attended(s.pos, c.sink, c.window);
                attend_bytes += c.layers as u64
                    * crate::engine::profile::bytes::attend(c.heads, c.head_dim, rows);
            }
            s.pos += 1;
        }
        e.ctx
            .queue
            .write_buffer(&e.state.step, 0, bytemuck::cast_slice(&self.words));
        let (ctx, program, kernels, weights, state) =
            (&e.ctx, &e.program, &e.kernels, &e.weights, &e.state);
        self.shared
            .prepare_batched(ctx, program, kernels, weights, state, n);
        for p in pass {
            let plan = self.per_seq[p.seq]
                .get_or_insert_with(|| PrefillPlan::new(e.slots, SeqBinding::Every(p.seq)));
            plan.prepare_slots(ctx, program, state);
        }
        // The slots that end an item needing logits.
        let readouts = &self.readouts;
        let ends = &mut self.ends;
        ends.clear();
        ends.extend((0..n).filter(|&j| pass[j].last && readouts.needs_logits(pass[j].item)));
        // The batched projection computes every slot of the pass: worth it when
        // most of them end an item (decode tokens), not for a prompt chunk.
        // A pass of one token runs the decode step ([`mixed_ops`]).
        // (One sequence has one logits window: never batched.)
        let batched_tail = self.seqs.len() > 1 && n > 1 && 2 * ends.len() >= n;
        let plans: Vec<&PrefillPlan> = pass
            .iter()
            .map(|p| self.per_seq[p.seq].as_ref().expect("prepared"))
            .collect();
        self.shared.prepare_distinct(
            ctx,
            program,
            kernels,
            weights,
            state,
            super::prefill::distinct_prefix(&plans),
        );
        let mut ops = mixed_ops(&self.shared, &plans, ends, batched_tail)
            .ok_or_else(|| Error::Gpu("the batch dispatches are missing".into()))?;
        // Each ending item's logits to its kept row, then its device readout there.
        for &j in ends.iter() {
            let window = if batched_tail { j } else { pass[j].seq };
            ops.push(readouts.keep(pass[j].item, &state.logits, state.logits_offset(window)));
        }
        ops.extend(ends.iter().filter_map(|&j| readouts.run(pass[j].item)));
        let copy_out = |enc: &mut wgpu::CommandEncoder| {
            for &j in ends.iter() {
                readouts.copy_out(enc, pass[j].item);
            }
        };
        let Some(timer) = &mut self.timer else {
            recorder::submit(ctx, ops, Observer::Plain, copy_out)?;
            if self.decoding {
                self.host.seconds += t0.elapsed().as_secs_f64();
                self.host.steps += 1;
            }
            return Ok(());
        };
        let (timed, submitted) = recorder::submit_timed(ctx, ops, timer.timestamps, copy_out)?;
        if let (true, Some(at)) = (self.decoding, submitted) {
            self.host.seconds += (at - t0).as_secs_f64();
            self.host.steps += 1;
        }
        // The pass's attention bytes shared evenly by its attend dispatches.
        let attends = timed.iter().filter(|t| t.0 == "attend").count() as u64;
        for (name, bytes, s) in timed {
            let bytes = match name {
                "attend" => attend_bytes / attends,
                _ => bytes,
            };
            timer.tally.kernel(name, s, bytes);
        }
        Ok(())
    }
}

/// A token placed in a pass: its item (index in the step's work), sequence, id,
/// and whether it is the item's last.
struct Placed {
    item: usize,
    seq: usize,
    token: u32,
    last: bool,
}

impl BatchEngine for GpuBatch {
    fn model(&self) -> &Arc<Model> {
        &self.gpu.model
    }
    fn slots(&self) -> usize {
        self.seqs.len()
    }
    fn reset(&mut self, slot: usize) {
        let s = &mut self.seqs[slot];
        s.pos = 0;
        s.input.clear();
        self.readouts.forget(slot);
        // Cache and ring rows of earlier runs are never read before being rewritten
        // (attention reads only positions <= t, the ring only positions >= 0).
    }
    fn position(&self, slot: usize) -> u64 {
        self.seqs[slot].pos
    }
    fn save(&mut self, slot: usize) -> Result<SavedSlot> {
        let s = self.seqs.get(slot).ok_or_else(|| {
            Error::InvalidArgument(format!("save: slot {slot} of {}", self.seqs.len()))
        })?;
        let saved = saved::save(&self.gpu, slot, s.pos, s.input.history().clone())?;
        let (bytes, pos) = (saved.bytes(), s.pos);
        Ok(SavedSlot::new(Box::new(saved), bytes, pos))
    }
    fn restore(&mut self, slot: usize, from: &SavedSlot) -> Result<()> {
        let state: &saved::SavedSeq = from.state()?;
        if slot >= self.seqs.len() {
            return Err(Error::InvalidArgument(format!(
                "restore: slot {slot} of {}",
                self.seqs.len()
            )));
        }
        saved::restore(&self.gpu, slot, state)?;
        self.reset(slot);
        let s = &mut self.seqs[slot];
        s.pos = state.pos;
        s.input.set_history(state.history.clone());
        Ok(())
    }
    fn step(&mut self, work: &[SlotStep<'_>]) -> Result<()> {
        let vocab = self.gpu.model.config.vocab;
        crate::engine::check_batch_work(work, self.seqs.len(), vocab)?;
        let ctx = Arc::clone(&self.gpu.ctx);
        ctx.check_errors()?;
        self.readouts.begin(&ctx, work);
        self.decoding = work.iter().all(|w| w.ids.len() == 1);
        // Items of one id (decode tokens) first, so a long prompt never pushes
        // them to a later pass.
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend(0..work.len());
        order.sort_by_key(|&k| work[k].ids.len());
        let cap = self.gpu.slots.count;
        self.placed.clear();
        self.placed.resize(work.len(), 0);
        let mut pass = std::mem::take(&mut self.pass);
        let mut ran = Ok(());
        while ran.is_ok() {
            pass.clear();
            for &k in &order {
                let (seq, ids) = (work[k].slot, work[k].ids);
                let placed = &mut self.placed[k];
                while *placed < ids.len() && pass.len() < cap {
                    pass.push(Placed {
                        item: k,
                        seq,
                        token: ids[*placed],
                        last: *placed + 1 == ids.len(),
                    });
                    *placed += 1;
                }
            }
            if pass.is_empty() {
                break;
            }
            ran = self.run_pass(&pass);
        }
        (self.order, self.pass) = (order, pass);
        ran?;
        let seqs = &self.seqs;
        self.readouts
            .finish(&ctx, work, |k| seqs[work[k].slot].pos.saturating_sub(1))?;
        ctx.check_errors()
    }
    fn out(&self, item: usize) -> StepOut<'_> {
        self.readouts.out(item)
    }
    fn reread(
        &mut self,
        item: usize,
        readout: Readout,
        mask: Option<&TokenMask>,
    ) -> Result<StepOut<'_>> {
        // The item's position, for errors.
        let slot = self.readouts.slot(item).unwrap_or(0);
        let t = self.seqs[slot].pos.saturating_sub(1);
        self.readouts.reread(&self.gpu.ctx, item, readout, mask, t)
    }
    fn step_timed(
        &mut self,
        work: &[SlotStep<'_>],
        timing: Timing,
        tally: &mut KernelTally,
    ) -> Result<String> {
        let ctx = Arc::clone(&self.gpu.ctx);
        let timestamps = use_timestamps(timing, &ctx)?;
        self.timer = Some(PassTimer {
            timestamps,
            tally: std::mem::take(tally),
        });
        let ran = self.step(work);
        if let Some(t) = self.timer.take() {
            *tally = t.tally;
        }
        ran?;
        let period = timestamps.then(|| f64::from(ctx.queue.get_timestamp_period()));
        Ok(describe_method(period, ctx.caps.timestamps))
    }
    fn bytes_read_back(&self) -> u64 {
        self.gpu.ctx.bytes_read_back()
    }
    fn describe(&self) -> String {
        self.gpu.describe()
    }
    fn precision(&self) -> crate::Precision {
        crate::Precision::Exact
    }
}
