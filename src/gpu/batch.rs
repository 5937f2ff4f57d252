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
//! one per item. Each item that ends in a pass has its logits copied to its
//! row of a kept buffer in the pass's submit, and its readout runs there too: the
//! device argmax (8 bytes back) or top-k (about 2 KiB), over the ids of its
//! uploaded token mask when it has one, or a copy of the row for an item that
//! asks for the logits. Everything an item reads back is mapped at once after the
//! last pass. Each item's readout is that of its sequence stepped alone by a
//! [`GpuEngine`], since the batched matvecs equal the single ones bit for bit.

use super::engine::GpuEngine;
use super::kernels::sample::{decode_topk, ArgmaxParams, SampleKernels, TopkParams, TOPK_WORDS};
use super::prefill::{mixed_ops, PrefillPlan, SeqBinding};
use super::profile::{describe_method, use_timestamps};
use super::readback::{device_nucleus, non_finite_logits, DeviceReadout};
use super::recorder::{self, Observer, Op, Queries};
use super::step_input::StepInput;
use super::{Dispatch, GpuContext, ProgramKind};
use crate::constrain::TokenMask;
use crate::engine::{host_readout_masked, BatchEngine, ItemOuts, Readout, SlotStep, StepOut};
use crate::error::{Error, Result};
use crate::profile::{KernelTally, KernelTimer, Timing};
use crate::weights::Model;
use std::sync::Arc;

/// One sequence's host side: its position and its step input (token history).
struct Seq {
    pos: u64,
    input: StepInput,
}

/// The device side of one item's readout: its outputs, its token mask, and the
/// readout dispatches built for it (keyed by kind).
struct ItemBufs {
    argmax_out: wgpu::Buffer,
    topk_out: wgpu::Buffer,
    mask: wgpu::Buffer,
    dispatches: Vec<(DispatchKey, Dispatch)>,
}

/// Which readout dispatch: argmax or top-k `(k, temperature bits)`, masked or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DispatchKey {
    Argmax {
        masked: bool,
    },
    TopK {
        k: usize,
        temperature: u32,
        masked: bool,
    },
}

/// What an item of the step reads back, and where in the staging buffer.
#[derive(Debug, Clone, Copy)]
struct ItemRead {
    readout: Readout,
    device: DeviceReadout,
    masked: bool,
    /// Byte offset and length of its bytes in the staging buffer.
    at: u64,
    bytes: u64,
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
    sample: SampleKernels,
    /// Per item, its logits row after a step (`[slots, vocab]`): what its
    /// readout and [`GpuBatch::reread`] read.
    kept: wgpu::Buffer,
    items: Vec<ItemBufs>,
    /// The last step's items: what each reads back (and whether its row holds logits).
    reads: Vec<ItemRead>,
    staging: wgpu::Buffer,
    /// The mapped staging bytes of the last step.
    staged: Vec<u8>,
    outs: ItemOuts,
    /// Reused each step: the items in placing order, ids placed per item, the
    /// tokens of a pass, its step-buffer words, and its slots that end an item.
    order: Vec<usize>,
    placed: Vec<usize>,
    pass: Vec<Placed>,
    words: Vec<u32>,
    ends: Vec<usize>,
    /// Buffers of host readouts (a `Logits` item, a reread).
    row: Vec<f32>,
    masked: Vec<f32>,
    candidates: Vec<(f32, u32)>,
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
        let ctx = &engine.ctx;
        let row = (vocab * 4).max(TOPK_WORDS * 4) as u64;
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("batch readout staging"),
            size: n as u64 * row,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let kept = ctx.storage_zeroed("batch kept logits", (n * vocab * 4) as u64)?;
        let items = (0..n)
            .map(|_| {
                Ok(ItemBufs {
                    argmax_out: ctx.storage_zeroed("batch argmax", 8)?,
                    topk_out: ctx.storage_zeroed("batch top-k", TOPK_WORDS as u64 * 4)?,
                    mask: ctx.storage_zeroed("batch token mask", vocab.div_ceil(32) as u64 * 4)?,
                    dispatches: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let seqs = (0..n)
            .map(|_| Seq {
                pos: 0,
                input: StepInput::for_model(&model, false),
            })
            .collect();
        let sample = SampleKernels::new(ctx);
        ctx.check_errors()?;
        Ok(GpuBatch {
            shared: PrefillPlan::new(engine.slots, SeqBinding::Batched),
            per_seq: (0..n).map(|_| None).collect(),
            seqs,
            sample,
            kept,
            items,
            reads: Vec::with_capacity(n),
            staging,
            staged: Vec::new(),
            outs: ItemOuts::default(),
            order: Vec::with_capacity(n),
            placed: Vec::with_capacity(n),
            pass: Vec::with_capacity(engine.slots.count),
            words: Vec::new(),
            ends: Vec::with_capacity(engine.slots.count),
            row: Vec::new(),
            masked: Vec::new(),
            candidates: Vec::new(),
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

    /// The device the batch runs on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.engine.ctx
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

    /// Append each item of `work` to its slot and read out what each asks
    /// ([`GpuBatch::out`]). The ids go in passes of at most
    /// [`GpuEngine::prefill_slots`] tokens (one pass when they fit); each item's
    /// readout runs on the device in the pass where it ends, and everything the
    /// items read back is mapped once after the last pass. Every item's readout
    /// is that of its slot stepped alone.
    ///
    /// # Errors
    /// As [`BatchEngine::step`]; [`Error::Gpu`] for a device failure (the slots
    /// have then advanced).
    pub fn step(&mut self, work: &[SlotStep<'_>]) -> Result<()> {
        let vocab = self.engine.model.config.vocab;
        crate::engine::check_batch_work(work, self.seqs.len(), vocab)?;
        self.outs.begin(work.len());
        let ctx = Arc::clone(&self.engine.ctx);
        ctx.check_errors()?;
        self.plan_reads(work);
        // Items of one id (decode tokens) first, so a long prompt never pushes
        // them to a later pass.
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend(0..work.len());
        order.sort_by_key(|&k| work[k].ids.len());
        let cap = self.engine.slots.count;
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
        let total = self.reads.iter().map(|r| r.at + r.bytes).max().unwrap_or(0);
        self.staged.resize(total as usize, 0);
        if total > 0 {
            ctx.map_read_into(&self.staging, &mut self.staged)?;
        }
        ctx.check_errors()?;
        for (k, w) in work.iter().enumerate() {
            self.decode_item(k, w)?;
        }
        self.outs.end(work.len());
        Ok(())
    }

    /// Decide what each item of `work` reads back and where it lands in the
    /// staging buffer; upload the masks of masked device readouts.
    fn plan_reads(&mut self, work: &[SlotStep<'_>]) {
        let vocab = self.engine.model.config.vocab as u64;
        self.reads.clear();
        let mut at = 0;
        for (k, w) in work.iter().enumerate() {
            let device = DeviceReadout::of(w.readout);
            let on_device = matches!(device, DeviceReadout::Argmax | DeviceReadout::TopK { .. });
            let masked = on_device && w.mask.is_some();
            if let (true, Some(m)) = (masked, w.mask) {
                self.engine.ctx.queue.write_buffer(
                    &self.items[k].mask,
                    0,
                    bytemuck::cast_slice(m.words()),
                );
            }
            let bytes = match device {
                DeviceReadout::None | DeviceReadout::Keep => 0,
                DeviceReadout::Logits => vocab * 4,
                DeviceReadout::Argmax => 8,
                DeviceReadout::TopK { .. } => TOPK_WORDS as u64 * 4,
            };
            self.reads.push(ItemRead {
                readout: w.readout,
                device,
                masked,
                at,
                bytes,
            });
            at += bytes;
        }
    }

    /// Build item `k`'s readout dispatch if it has none of its kind yet.
    fn prepare_readout(&mut self, k: usize) {
        let read = self.reads[k];
        let vocab = self.engine.model.config.vocab;
        let key = match read.device {
            DeviceReadout::Argmax => DispatchKey::Argmax {
                masked: read.masked,
            },
            DeviceReadout::TopK { k, temperature } => DispatchKey::TopK {
                k,
                temperature: temperature.to_bits(),
                masked: read.masked,
            },
            _ => return,
        };
        let it = &mut self.items[k];
        if it.dispatches.iter().any(|(have, _)| *have == key) {
            return;
        }
        let ctx = &self.engine.ctx;
        let off = (k * vocab) as u32;
        let d = match key {
            DispatchKey::Argmax { masked } => {
                let p = ArgmaxParams {
                    n: vocab as u32,
                    off,
                    masked: u32::from(masked),
                    _pad: 0,
                };
                self.sample
                    .argmax(ctx, &p, &self.kept, &it.argmax_out, &it.mask)
            }
            DispatchKey::TopK {
                k: top,
                temperature,
                masked,
            } => {
                let p = TopkParams {
                    n: vocab as u32,
                    off,
                    k: top as u32,
                    temperature: f32::from_bits(temperature),
                    masked: u32::from(masked),
                    _pad: [0; 3],
                };
                self.sample
                    .topk(ctx, &p, &self.kept, &it.topk_out, &it.mask)
            }
        };
        it.dispatches.push((key, d));
    }

    /// Item `k`'s readout from the mapped staging bytes.
    fn decode_item(&mut self, k: usize, w: &SlotStep<'_>) -> Result<()> {
        let read = self.reads[k];
        let t = self.seqs[w.slot].pos.saturating_sub(1);
        let bytes = &self.staged[read.at as usize..(read.at + read.bytes) as usize];
        let it = self.outs.item(k);
        match read.device {
            DeviceReadout::None | DeviceReadout::Keep => {}
            DeviceReadout::Argmax => {
                let words: Vec<u32> = bytemuck::pod_collect_to_vec(bytes);
                if words[1] != 0 {
                    return Err(non_finite_logits(t));
                }
                it.set_token(words[0]);
            }
            DeviceReadout::TopK { temperature, .. } => {
                let words: Vec<u32> = bytemuck::pod_collect_to_vec(bytes);
                let Some(total) = decode_topk(&words, &mut it.candidates) else {
                    return Err(non_finite_logits(t));
                };
                let vocab = self.engine.model.config.vocab;
                it.set_candidates((temperature > 0.0).then(|| device_nucleus(total, vocab)));
            }
            DeviceReadout::Logits => {
                self.row.clear();
                self.row.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                );
                let allowed = |i: usize| w.mask.is_none_or(|m| m.is_allowed(i as u32));
                if (0..self.row.len()).any(|i| allowed(i) && !self.row[i].is_finite()) {
                    return Err(non_finite_logits(t));
                }
                let out = host_readout_masked(
                    &self.row,
                    read.readout,
                    w.mask,
                    &mut self.masked,
                    &mut self.candidates,
                )?;
                it.keep(out);
            }
        }
        Ok(())
    }

    /// What the last step read out for its item `item` ([`StepOut::None`] past
    /// its items or for an item that asked for none).
    pub fn out(&self, item: usize) -> StepOut<'_> {
        self.outs.get(item)
    }

    /// [`BatchEngine::reread`]: the item's kept logits row copied back and read
    /// out on the host.
    ///
    /// # Errors
    /// As [`BatchEngine::reread`]; [`Error::Gpu`] if the copy fails.
    pub fn reread(
        &mut self,
        item: usize,
        readout: Readout,
        mask: Option<&TokenMask>,
    ) -> Result<StepOut<'_>> {
        readout.validate()?;
        let vocab = self.engine.model.config.vocab;
        let kept = self.outs.has(item)
            && self
                .reads
                .get(item)
                .is_some_and(|r| r.device.needs_logits());
        if !kept {
            return Err(Error::InvalidArgument(format!(
                "batch readout: the last step computed no logits for item {item}"
            )));
        }
        if let Some(m) = mask {
            m.check(vocab)?;
        }
        self.row = self
            .engine
            .ctx
            .read_f32(&self.kept, (item * vocab) as u64, vocab)?;
        host_readout_masked(
            &self.row,
            readout,
            mask,
            &mut self.masked,
            &mut self.candidates,
        )
    }

    /// [`GpuBatch::step`] with every dispatch of its passes timed into `tally`
    /// by kernel name (with timestamp queries inside the passes where `timing`
    /// allows them, else a submit and wait per dispatch, which includes that
    /// overhead); returns how they were timed. The same readouts as an untimed step.
    ///
    /// # Errors
    /// As [`GpuBatch::step`]; [`Error::Gpu`] for [`Timing::Timestamps`] on a
    /// device without timestamp queries.
    pub fn step_timed(
        &mut self,
        work: &[SlotStep<'_>],
        timing: Timing,
        tally: &mut KernelTally,
    ) -> Result<String> {
        let ctx = Arc::clone(&self.engine.ctx);
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

    /// One pass: token `j` of `pass` in slot `j`, in one submit that also copies
    /// the logits of the items ending here into their kept rows, runs their
    /// readouts there and copies what they read back into the staging buffer.
    fn run_pass(&mut self, pass: &[Placed]) -> Result<()> {
        for p in pass.iter().filter(|p| p.last) {
            self.prepare_readout(p.item);
        }
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
        // The slots that end an item and need its logits.
        let reads = &self.reads;
        let ends = &mut self.ends;
        ends.clear();
        ends.extend((0..n).filter(|&j| pass[j].last && reads[pass[j].item].device.needs_logits()));
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
        let mut ops = mixed_ops(&self.shared, &plans, ends, batched_tail)
            .ok_or_else(|| Error::Gpu("the batch dispatches are missing".into()))?;
        // Each ending item's logits to its kept row, then its device readout there.
        let row = (c.vocab * 4) as u64;
        for &j in ends.iter() {
            let window = if batched_tail { j } else { pass[j].seq };
            ops.push(Op::Copy {
                src: &state.logits,
                src_offset: state.logits_offset(window),
                dst: &self.kept,
                dst_offset: pass[j].item as u64 * row,
                bytes: row,
            });
        }
        for &j in ends.iter() {
            let k = pass[j].item;
            let d =
                self.items[k]
                    .dispatches
                    .iter()
                    .find(|(key, _)| match (*key, reads[k].device) {
                        (DispatchKey::Argmax { masked }, DeviceReadout::Argmax) => {
                            masked == reads[k].masked
                        }
                        (
                            DispatchKey::TopK {
                                k: top,
                                temperature,
                                masked,
                            },
                            DeviceReadout::TopK {
                                k: want,
                                temperature: t,
                            },
                        ) => top == want && temperature == t.to_bits() && masked == reads[k].masked,
                        _ => false,
                    });
            if let Some((_, d)) = d {
                ops.push(Op::Run(d));
            }
        }
        let (staging, kept, items) = (&self.staging, &self.kept, &self.items);
        let copy_reads = |enc: &mut wgpu::CommandEncoder| {
            for &j in ends.iter() {
                let k = pass[j].item;
                let r = &reads[k];
                match r.device {
                    DeviceReadout::Logits => {
                        enc.copy_buffer_to_buffer(kept, k as u64 * row, staging, r.at, r.bytes)
                    }
                    DeviceReadout::Argmax => {
                        enc.copy_buffer_to_buffer(&items[k].argmax_out, 0, staging, r.at, r.bytes)
                    }
                    DeviceReadout::TopK { .. } => {
                        enc.copy_buffer_to_buffer(&items[k].topk_out, 0, staging, r.at, r.bytes)
                    }
                    DeviceReadout::None | DeviceReadout::Keep => {}
                }
            }
        };
        let Some(timer) = &mut self.timer else {
            return recorder::submit(ctx, ops, Observer::Plain, copy_reads);
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
            recorder::submit(ctx, ops, Observer::Timestamps(&q), copy_reads)?;
            q.seconds(ctx)?
        } else {
            let mut secs = Vec::with_capacity(meta.len());
            recorder::submit(ctx, ops, Observer::PerDispatch(&mut secs), copy_reads)?;
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

impl BatchEngine for GpuBatch {
    fn model(&self) -> &Arc<Model> {
        GpuBatch::model(self)
    }
    fn slots(&self) -> usize {
        GpuBatch::slots(self)
    }
    fn reset(&mut self, slot: usize) {
        GpuBatch::reset(self, slot);
    }
    fn position(&self, slot: usize) -> u64 {
        GpuBatch::position(self, slot)
    }
    fn step(&mut self, work: &[SlotStep<'_>]) -> Result<()> {
        GpuBatch::step(self, work)
    }
    fn out(&self, item: usize) -> StepOut<'_> {
        GpuBatch::out(self, item)
    }
    fn reread(
        &mut self,
        item: usize,
        readout: Readout,
        mask: Option<&TokenMask>,
    ) -> Result<StepOut<'_>> {
        GpuBatch::reread(self, item, readout, mask)
    }
    fn step_timed(
        &mut self,
        work: &[SlotStep<'_>],
        timing: Timing,
        tally: &mut KernelTally,
    ) -> Result<String> {
        GpuBatch::step_timed(self, work, timing, tally)
    }
    fn bytes_read_back(&self) -> u64 {
        self.engine.ctx.bytes_read_back()
    }
    fn describe(&self) -> String {
        use crate::engine::Engine;
        self.engine.describe()
    }
    fn precision(&self) -> crate::Precision {
        crate::Precision::Exact
    }
}
