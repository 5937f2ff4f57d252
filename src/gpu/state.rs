//! [`DeviceState`]: the buffers a step reads and writes besides the weights:
//! activations and lanes (one slot per token of a prefill chunk), the step
//! input, the logits, the int8 KV cache, attention scores and engram rings.

use super::kernels::attention::KvCache;
use super::layout::Slots;
use super::GpuContext;
use crate::config::Config;
use crate::error::Result;

/// The step's device buffers, allocated once per engine.
pub(crate) struct DeviceState {
    /// Activations, `slots.count` slots of `slots.act` elements.
    pub act: wgpu::Buffer,
    /// The four lanes of the hidden state, `slots.count` slots.
    pub lanes: wgpu::Buffer,
    /// The step input ([`super::step_input::StepLayout`]), `slots.count` slots.
    pub step: wgpu::Buffer,
    /// The `[vocab]` logits of the last step with a readout.
    pub logits: wgpu::Buffer,
    /// The int8 KV cache.
    pub cache: KvCache,
    /// Attention scores, `[heads, cache rows]`.
    pub scores: wgpu::Buffer,
    /// Engram rings, `[sites, ring, hidden]`.
    pub rings: wgpu::Buffer,
}

impl DeviceState {
    /// Zeroed buffers for `c` with `sites` engram sites.
    ///
    /// # Errors
    /// [`crate::Error::Gpu`] naming a buffer over the device's limits.
    pub(crate) fn new(ctx: &GpuContext, c: &Config, slots: &Slots, sites: usize) -> Result<Self> {
        let h = c.hidden;
        let rows = c.cache_rows();
        let ring = c.engram.as_ref().map_or(1, |e| e.ring());
        Ok(DeviceState {
            act: ctx.storage_zeroed("activations", (slots.count * slots.act) as u64 * 4)?,
            lanes: ctx.storage_zeroed("lanes", (slots.count * slots.lanes) as u64 * 4)?,
            step: ctx.storage_zeroed("step", (slots.count * slots.step) as u64 * 4)?,
            logits: ctx.storage_zeroed("logits", c.vocab as u64 * 4)?,
            cache: KvCache::new(ctx, c.layers, c.kv_heads, rows, c.head_dim)?,
            scores: ctx.storage_zeroed("attention scores", (c.heads * rows) as u64 * 4)?,
            rings: ctx.storage_zeroed("engram rings", (sites.max(1) * ring * h) as u64 * 4)?,
        })
    }

    /// Bytes of these buffers.
    pub(crate) fn bytes(&self) -> u64 {
        let c = &self.cache;
        [
            &self.act,
            &self.lanes,
            &self.step,
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
