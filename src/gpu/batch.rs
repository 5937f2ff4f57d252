//! [`GpuBatch`]: several sequences of one model on one device, stepped together:
//! continuous batching for a server. The weights are uploaded once; each
//! sequence has its own KV cache, engram rings, attention scores and logits, side
//! by side in the engine's buffers ([`DeviceState::seq_windows`]), and its own
//! position and token history on the host.
//!
//! A pass of one token per sequence puts sequence `j`'s token in slot `j` of the
//! per-token buffers and runs the prefill's dispatches ([`PrefillPlan`] with
//! [`SeqBinding::SlotIsSeq`]): each matvec is one batched dispatch for every
//! slot, so its weights are decoded once for all sequences, and the per-token
//! kernels (attention, routing, the engram head) run per slot on that
//! sequence's buffers. A longer item (a prompt chunk, a run of forced tokens)
//! runs as a prefill chunk of its own sequence, in its own submit after the
//! decode pass (whose batched vocabulary projection writes every slot's logits
//! window up to the last active one, idle ones included). The logits of
//! every item are read back in one copy and one map. Each item's logits are
//! bit-identical to its sequence stepped alone by a [`GpuEngine`], since the
//! batched matvecs equal the single ones bit for bit.

use super::engine::GpuEngine;
use super::prefill::{PrefillPlan, SeqBinding};
use super::recorder::{self, Observer};
use super::step_input::StepInput;
use super::{GpuContext, ProgramKind};
use crate::error::{Error, Result};
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
    /// One token of each sequence, slot `j` = sequence `j`.
    decode: PrefillPlan,
    /// Per sequence, its prefill chunks (built at its first chunk).
    chunks: Vec<Option<PrefillPlan>>,
    seqs: Vec<Seq>,
    staging: wgpu::Buffer,
    logits: Vec<f32>,
    /// Work items of the last step (its logits are `[items, vocab]`).
    items: usize,
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
            decode: PrefillPlan::new(engine.slots, SeqBinding::SlotIsSeq),
            chunks: (0..n).map(|_| None).collect(),
            seqs,
            staging,
            logits: vec![0.0; n * vocab],
            items: 0,
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
    /// id, `[work.len(), vocab]` in `work`'s order: the items of one id in one
    /// batched pass, longer ones as prefill chunks of their own. Every item's
    /// logits are bit-identical to its slot stepped alone.
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
        // The decode pass first: its batched vocabulary projection writes the
        // logits windows of idle slots too, which a chunk after it then rewrites.
        let mut singles: Vec<(usize, u32)> = work
            .iter()
            .filter(|(_, ids)| ids.len() == 1)
            .map(|&(slot, ids)| (slot, ids[0]))
            .collect();
        singles.sort_unstable();
        if !singles.is_empty() {
            self.run_decode(&singles)?;
        }
        for &(slot, ids) in work.iter().filter(|(_, ids)| ids.len() > 1) {
            self.run_chunks(slot, ids)?;
        }
        // Every item's logits in one copy and one map.
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        let row = (vocab * 4) as u64;
        for (k, &(slot, _)) in work.iter().enumerate() {
            let at = self.engine.state.logits_offset(slot);
            enc.copy_buffer_to_buffer(
                &self.engine.state.logits,
                at,
                &self.staging,
                k as u64 * row,
                row,
            );
        }
        ctx.queue.submit([enc.finish()]);
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

    /// The logits of the last [`GpuBatch::step`] that succeeded, `[items, vocab]`
    /// (empty before any).
    pub fn last_logits(&self) -> &[f32] {
        &self.logits[..self.items * self.engine.model.config.vocab]
    }

    /// One token of each `(slot, token)` (ascending slots) in one submit.
    fn run_decode(&mut self, singles: &[(usize, u32)]) -> Result<()> {
        let e = &self.engine;
        let c = &e.model.config;
        let stride = e.slots.step;
        let n = e.input.layout.words();
        for &(slot, token) in singles {
            let s = &mut self.seqs[slot];
            s.input.fill(c, token, s.pos, 0, stride);
            e.ctx.queue.write_buffer(
                &e.state.step,
                (slot * stride * 4) as u64,
                bytemuck::cast_slice(&s.input.words[..n]),
            );
        }
        let active: Vec<usize> = singles.iter().map(|&(slot, _)| slot).collect();
        let last = active[active.len() - 1] + 1;
        self.decode
            .prepare(&e.ctx, &e.program, &e.kernels, &e.weights, &e.state, last);
        let ops = self
            .decode
            .decode_ops(&active)
            .ok_or_else(|| Error::Gpu("the batch dispatches are missing".into()))?;
        recorder::submit(&e.ctx, ops, Observer::Plain, |_| {})?;
        for &(slot, _) in singles {
            self.seqs[slot].pos += 1;
        }
        Ok(())
    }

    /// `ids` of `slot` as prefill chunks of that sequence, the last with its
    /// vocabulary projection; one submit each.
    fn run_chunks(&mut self, slot: usize, ids: &[u32]) -> Result<()> {
        let e = &self.engine;
        let c = &e.model.config;
        let stride = e.slots.step;
        let plan = self.chunks[slot]
            .get_or_insert_with(|| PrefillPlan::new(e.slots, SeqBinding::Every(slot)));
        let s = &mut self.seqs[slot];
        let parts = ids.len().div_ceil(e.slots.count);
        for (i, part) in ids.chunks(e.slots.count).enumerate() {
            let k = part.len();
            for (j, &token) in part.iter().enumerate() {
                s.input.fill(c, token, s.pos + j as u64, j, stride);
            }
            let used = (k - 1) * stride + e.input.layout.words();
            e.ctx.queue.write_buffer(
                &e.state.step,
                0,
                bytemuck::cast_slice(&s.input.words[..used]),
            );
            plan.prepare(&e.ctx, &e.program, &e.kernels, &e.weights, &e.state, k);
            let ops = plan
                .ops(k, i + 1 == parts)
                .ok_or_else(|| Error::Gpu("the prefill dispatches are missing".into()))?;
            recorder::submit(&e.ctx, ops, Observer::Plain, |_| {})?;
            s.pos += k as u64;
        }
        Ok(())
    }
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
    fn last_logits(&self) -> &[f32] {
        GpuBatch::last_logits(self)
    }
    fn describe(&self) -> String {
        use crate::engine::Engine;
        self.engine.describe()
    }
}
