//! [`DeviceState`]: the buffers a step reads and writes besides the weights:
//! activations and lanes (one slot per token of a prefill chunk), the step
//! input, the logits, the int8 KV cache, attention scores and engram rings.
//! The last four are per sequence: an engine holds one, a [`super::GpuBatch`]
//! several side by side, each a window ([`DeviceState::seq_windows`]).

use super::kernels::attention::KvBuffers;
use super::layout::{seq_stride, Slots};
use super::{GpuContext, Window};
use crate::error::Result;
use crate::model::config::Config;

/// The step's device buffers, allocated once per engine.
pub(crate) struct DeviceState {
    /// Activations, `slots.count` slots of `slots.act` elements.
    pub act: wgpu::Buffer,
    /// The four lanes of the hidden state, `slots.count` slots.
    pub lanes: wgpu::Buffer,
    /// The step input ([`super::step_input::StepLayout`]), `slots.count` slots.
    pub step: wgpu::Buffer,
    /// A batched matvec's inputs, prepared once for all its workgroups
    /// (`slots.count` slots of `slots.prep`; apart from `act`, so the batched
    /// kernel can read them while it writes there).
    pub prep: wgpu::Buffer,
    /// The `[vocab]` logits of the last step with a readout.
    pub logits: wgpu::Buffer,
    /// The int8 KV cache.
    pub cache: KvBuffers,
    /// Attention scores, `[heads, cache rows]`.
    pub scores: wgpu::Buffer,
    /// Engram rings, `[sites, ring, hidden]`.
    pub rings: wgpu::Buffer,
    /// Sequences held (each its logits, cache, scores and rings).
    pub seqs: usize,
    /// Bytes of one sequence's logits, scores and rings, and from one sequence's
    /// to the next's (aligned for a binding offset).
    per_seq: [(u64, u64); 3],
}

impl DeviceState {
    /// Zeroed buffers for `c` with `sites` engram sites, for `seqs` sequences.
    ///
    /// # Errors
    /// [`crate::Error::Gpu`] naming a buffer over the device's limits.
    pub(crate) fn new(
        ctx: &GpuContext,
        c: &Config,
        slots: &Slots,
        sites: usize,
        seqs: usize,
    ) -> Result<Self> {
        let h = c.hidden;
        let rows = c.cache_rows();
        let ring = c.engram.as_ref().map_or(1, |e| e.ring());
        let seqs = seqs.max(1);
        let per = |bytes: u64| (bytes, seq_stride(ctx, bytes, seqs));
        let per_seq = [
            per(c.vocab as u64 * 4),
            per((c.heads * rows) as u64 * 4),
            per((sites.max(1) * ring * h) as u64 * 4),
        ];
        let all = |(bytes, stride): (u64, u64)| stride * (seqs as u64 - 1) + bytes;
        // A batch's logits: a window per sequence and one per token slot (the
        // batched vocabulary projection writes slot j's into window j).
        let logit_windows = if seqs == 1 { 1 } else { seqs.max(slots.count) } as u64;
        let (lb, ls) = per_seq[0];
        Ok(DeviceState {
            act: ctx.storage_zeroed("activations", (slots.count * slots.act) as u64 * 4)?,
            lanes: ctx.storage_zeroed("lanes", (slots.count * slots.lanes) as u64 * 4)?,
            step: ctx.storage_zeroed("step", (slots.count * slots.step) as u64 * 4)?,
            prep: ctx.storage_zeroed("prepared inputs", (slots.count * slots.prep) as u64 * 4)?,
            logits: ctx.storage_zeroed("logits", ls * (logit_windows - 1) + lb)?,
            cache: KvBuffers::with_seqs(ctx, c.layers, c.kv_heads, rows, c.head_dim, seqs)?,
            scores: ctx.storage_zeroed("attention scores", all(per_seq[1]))?,
            rings: ctx.storage_zeroed("engram rings", all(per_seq[2]))?,
            seqs,
            per_seq,
        })
    }

    /// The windows of sequence `s`'s logits and engram rings: a dispatch rebound
    /// to them reads and writes that sequence's alone. None with one sequence (the
    /// dispatches bind the whole buffers). The attention kernels bind the whole
    /// KV cache and scores and find a token's sequence in its step input.
    pub(crate) fn seq_windows(&self, s: usize) -> Vec<Window<'_>> {
        if self.seqs == 1 {
            return Vec::new();
        }
        let s = s as u64;
        let w = |buffer, (bytes, stride): (u64, u64)| Window {
            buffer,
            offset: s * stride,
            size: bytes,
        };
        vec![
            w(&self.logits, self.per_seq[0]),
            w(&self.rings, self.per_seq[2]),
        ]
    }

    /// Sequence `s`'s engram rings: byte offset and bytes.
    pub(crate) fn rings_window(&self, s: usize) -> (u64, u64) {
        let (bytes, stride) = self.per_seq[2];
        (s as u64 * stride, bytes)
    }

    /// Elements from one sequence's attention scores to the next's.
    pub(crate) fn scores_stride(&self) -> usize {
        (self.per_seq[1].1 / 4) as usize
    }

    /// Elements from one sequence's engram rings to the next's.
    pub(crate) fn rings_stride(&self) -> usize {
        (self.per_seq[2].1 / 4) as usize
    }

    /// Elements from one sequence's logits to the next's.
    pub(crate) fn logits_stride(&self) -> usize {
        (self.per_seq[0].1 / 4) as usize
    }

    /// Byte offset of logits window `s` (sequence `s`'s, or in a batch token
    /// slot `s`'s) in [`DeviceState::logits`].
    pub(crate) fn logits_offset(&self, s: usize) -> u64 {
        s as u64 * self.per_seq[0].1
    }

    /// Bytes of these buffers.
    pub(crate) fn bytes(&self) -> u64 {
        let c = &self.cache;
        [
            &self.act,
            &self.lanes,
            &self.step,
            &self.prep,
            &self.logits,
            &self.scores,
            &self.rings,
            &c.k_codes,
            &c.v_codes,
            &c.k_scale,
            &c.v_scale,
        ]
        .iter()
        .map(|b| b.size())
        .sum()
    }
}
