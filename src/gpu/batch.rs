//! [`GpuBatch`]: several sequences of one model on one device, stepped together:
//! continuous batching for a server. The weights are uploaded once; each
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
//! one per item. The logits of the items that end in a pass are copied out in
//! its submit, and all are read back with one map. Each item's logits are
//! bit-identical to its sequence stepped alone by a [`GpuEngine`], since the
//! batched matvecs equal the single ones bit for bit.

use super::engine::GpuEngine;
use super::prefill::{mixed_ops, PrefillPlan, SeqBinding};
use super::profile::GpuTiming;
use super::recorder::{self, Observer, Queries};
use super::step_input::StepInput;
use super::{GpuContext, ProgramKind};
use crate::error::{Error, Result};
use crate::profile::{KernelTally, KernelTimer};
use crate::weights::Model;
use std::sync::Arc;

/// One sequence's host side: its position and its step input (token history).
struct Seq {
    pos: u64,
    input: StepInput,
}

/// Sequences of one model in slots on one device, stepped together by
/// [`GpuBatch::step`].
pub struct GpuBatch {
    engine: GpuEngine,
    /// The batched dispatches every pass shares.
    shared: PrefillPlan,
    /// Per sequence, its per-slot dispatches (built at its first pass).
    per_seq: Vec<Option<PrefillPlan>>,
    seqs: Vec<Seq>,
    staging: wgpu::Buffer,
    logits: Vec<f32>,
    /// Work items of the last step (its logits are `[items, vocab]`).
    items: usize,
    /// Reused each step: the items in placing order, ids placed per item, the
    /// tokens of a pass, its step-buffer words, and its slots that end an item.
    order: Vec<usize>,
    placed: Vec<usize>,
    pass: Vec<Placed>,
    words: Vec<u32>,
    ends: Vec<usize>,
    /// While [`GpuBatch::step_timed`] runs: how each pass is timed, and the
    /// tally its dispatches go to.
    timer: Option<PassTimer>,
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
            .field("device", &self.engine.ctx.describe())
            .field("slots", &self.seqs.len())
            .finish_non_exhaustive()
    }
}

impl GpuBatch {
    /// `slots` empty sequences (position 0) of `model` on `ctx`, running
    /// `program` (or what [`ProgramKind::choose`] says). Slots are capped at the
    /// device's token slots ([`GpuEngine::prefill_slots`]).
    ///
    /// # Errors
    /// As [`GpuEngine::new`]; [`Error::Gpu`] when the per-sequence buffers of
    /// `slots` sequences exceed the device's limits, or `slots` is over the
    /// device's token slots.
    pub fn new(
        model: Arc<Model>,
        ctx: Arc<GpuContext>,
        slots: usize,
        program: Option<ProgramKind>,
    ) -> Result<GpuBatch> {
        let n = slots.max(1);
        let engine = GpuEngine::build_seqs(Arc::clone(&model), ctx, None, program, n)?;
        if n > engine.slots.count {
            return Err(Error::Gpu(format!(
                "{n} batched sequences: this device holds {} token slots",
                engine.slots.count
            )));
        }
        let vocab = model.config.vocab;
        let staging = engine.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("batch logits staging"),
            size: (n * vocab * 4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let seqs = (0..n)
            .map(|_| Seq {
                pos: 0,
                input: StepInput::for_model(&model, false),
            })
            .collect();
        engine.ctx.check_errors()?;
        Ok(GpuBatch {
            shared: PrefillPlan::new(engine.slots, SeqBinding::Batched),
            per_seq: (0..n).map(|_| None).collect(),
            seqs,
            staging,
            logits: vec![0.0; n * vocab],
            items: 0,
            order: Vec::with_capacity(n),
            placed: Vec::with_capacity(n),
            pass: Vec::with_capacity(engine.slots.count),
            words: Vec::new(),
            ends: Vec::with_capacity(engine.slots.count),
            timer: None,
            engine,
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.seqs.len()
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.engine.model
    }

    /// The decode program the batch runs.
    pub fn program(&self) -> ProgramKind {
        self.engine.program.kind
    }

    /// Empty slot `slot` (its next token is at position 0).
    ///
    /// # Panics
    /// If `slot >= slots`.
    pub fn reset(&mut self, slot: usize) {
        let s = &mut self.seqs[slot];
        s.pos = 0;
        s.input.clear();
    }

    /// Tokens processed by slot `slot` since its reset.
    ///
    /// # Panics
    /// If `slot >= slots`.
    pub fn position(&self, slot: usize) -> u64 {
        self.seqs[slot].pos
    }

    /// Append each `(slot, ids)` of `work` (distinct slots, at least one id each,
    /// all `< vocab`) to its slot and return the logits after each item's last
    /// id, `[work.len(), vocab]` in `work`'s order. The ids go in passes of at
    /// most [`GpuEngine::prefill_slots`] tokens (one pass when they fit). Every
    /// item's logits are bit-identical to its slot stepped alone.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a slot out of range or repeated, an empty
    /// item, or nothing to do; [`Error::TokenOutOfRange`] for an id `>= vocab`
    /// (nothing is stepped then); [`Error::NonFinite`] for non-finite logits and
    /// [`Error::Gpu`] for a device failure (the slots have then advanced).
    pub fn step(&mut self, work: &[(usize, &[u32])]) -> Result<&[f32]> {
        let vocab = self.engine.model.config.vocab;
        crate::engine::check_batch_work(work, self.seqs.len(), vocab)?;
        self.items = 0;
        let ctx = Arc::clone(&self.engine.ctx);
        ctx.check_errors()?;
        // Items of one id (decode tokens) first, so a long prompt never pushes
        // them to a later pass.
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend(0..work.len());
        order.sort_by_key(|&k| work[k].1.len());
        let cap = self.engine.slots.count;
        self.placed.clear();
        self.placed.resize(work.len(), 0);
        let mut pass = std::mem::take(&mut self.pass);
        let mut ran = Ok(());
        while ran.is_ok() {
            pass.clear();
            for &k in &order {
                let (seq, ids) = work[k];
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
        let out = &mut self.logits[..work.len() * vocab];
        ctx.map_read_into(&self.staging, bytemuck::cast_slice_mut(out))?;
        ctx.check_errors()?;
        for (k, &(slot, _)) in work.iter().enumerate() {
            if out[k * vocab..(k + 1) * vocab]
                .iter()
                .any(|v| !v.is_finite())
            {
                return Err(Error::NonFinite {
                    tensor: format!("logits of batch slot {slot}"),
                    position: self.seqs[slot].pos - 1,
                });
            }
        }
        self.items = work.len();
        Ok(&self.logits[..work.len() * vocab])
    }

    /// [`GpuBatch::step`] with every dispatch of its passes timed into `tally`
    /// by kernel name (with timestamp queries inside the passes where `timing`
    /// allows them, else a submit and wait per dispatch, which includes that
    /// overhead); returns how they were timed. The same logits as an untimed step.
    ///
    /// # Errors
    /// As [`GpuBatch::step`]; [`Error::Gpu`] for [`GpuTiming::Timestamps`] on a
    /// device without timestamp queries.
    pub fn step_timed(
        &mut self,
        work: &[(usize, &[u32])],
        timing: GpuTiming,
        tally: &mut KernelTally,
    ) -> Result<String> {
        let ctx = Arc::clone(&self.engine.ctx);
        let timestamps = timing.use_timestamps(&ctx)?;
        self.timer = Some(PassTimer {
            timestamps,
            tally: std::mem::take(tally),
        });
        let ran = self.step(work).map(|_| ());
        if let Some(t) = self.timer.take() {
            *tally = t.tally;
        }
        ran?;
        let period = timestamps.then(|| f64::from(ctx.queue.get_timestamp_period()));
        Ok(GpuTiming::describe(period, ctx.caps.timestamps))
    }

    /// The logits of the last [`GpuBatch::step`] that succeeded, `[items, vocab]`
    /// (empty before any).
    pub fn last_logits(&self) -> &[f32] {
        &self.logits[..self.items * self.engine.model.config.vocab]
    }

    /// One pass: token `j` of `pass` in slot `j`, in one submit that also copies
    /// the logits of the items ending here into their rows of the staging buffer.
    fn run_pass(&mut self, pass: &[Placed]) -> Result<()> {
        let e = &self.engine;
        let c = &e.model.config;
        let stride = e.slots.step;
        let words = e.input.layout.words();
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
                let rows = super::profile::attended(s.pos, c.sink, c.window);
                attend_bytes +=
                    c.layers as u64 * crate::profile::bytes::attend(c.heads, c.head_dim, rows);
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
        let ends = &mut self.ends;
        ends.clear();
        ends.extend((0..n).filter(|&j| pass[j].last));
        // The batched projection computes every slot of the pass: worth it when
        // most of them end an item (decode tokens), not for a prompt chunk.
        // A pass of one token runs the decode step ([`mixed_ops`]).
        let batched_tail = program.kind != super::ProgramKind::Lean && n > 1 && 2 * ends.len() >= n;
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
        let ops = mixed_ops(&self.shared, &plans, ends, batched_tail)
            .ok_or_else(|| Error::Gpu("the batch dispatches are missing".into()))?;
        let row = (c.vocab * 4) as u64;
        let staging = &self.staging;
        let copy_logits = |enc: &mut wgpu::CommandEncoder| {
            for &j in ends.iter() {
                let window = if batched_tail { j } else { pass[j].seq };
                let at = state.logits_offset(window);
                let to = pass[j].item as u64 * row;
                enc.copy_buffer_to_buffer(&state.logits, at, staging, to, row);
            }
        };
        let Some(timer) = &mut self.timer else {
            return recorder::submit(ctx, ops, Observer::Plain, copy_logits);
        };
        let meta: Vec<(&'static str, u64)> = ops
            .iter()
            .filter_map(|op| match op {
                recorder::Op::Run(d) => Some((d.name, d.bytes)),
                _ => None,
            })
            .collect();
        let secs = if timer.timestamps {
            let q = Queries::new(ctx, meta.len())?;
            recorder::submit(ctx, ops, Observer::Timestamps(&q), copy_logits)?;
            q.seconds(ctx)?
        } else {
            let mut secs = Vec::with_capacity(meta.len());
            recorder::submit(ctx, ops, Observer::PerDispatch(&mut secs), copy_logits)?;
            secs
        };
        if secs.len() != meta.len() {
            return Err(Error::Gpu(format!(
                "profile: {} timings for {} dispatches",
                secs.len(),
                meta.len()
            )));
        }
        // The pass's attention bytes shared evenly by its attend dispatches.
        let attends = meta.iter().filter(|(name, _)| *name == "attend").count() as u64;
        for ((name, bytes), s) in meta.into_iter().zip(secs) {
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

impl crate::engine::BatchEngine for GpuBatch {
    fn model(&self) -> &Arc<Model> {
        GpuBatch::model(self)
    }
    fn slots(&self) -> usize {
        GpuBatch::slots(self)
    }
    fn reset(&mut self, slot: usize) {
        GpuBatch::reset(self, slot);
    }
    fn step(&mut self, work: &[(usize, &[u32])]) -> Result<&[f32]> {
        GpuBatch::step(self, work)
    }
    fn step_timed(
        &mut self,
        work: &[(usize, &[u32])],
        timing: GpuTiming,
        tally: &mut KernelTally,
    ) -> Result<String> {
        GpuBatch::step_timed(self, work, timing, tally)
    }
    fn last_logits(&self) -> &[f32] {
        GpuBatch::last_logits(self)
    }
    fn describe(&self) -> String {
        use crate::engine::Engine;
        self.engine.describe()
    }
    fn precision(&self) -> crate::Precision {
        crate::Precision::Exact
    }
}
