//! A [`super::GpuBatch`] sequence saved and put back on the device: its KV
//! cache windows (codes and scales) and engram ring window copied into a
//! buffer of their own by `copy_buffer_to_buffer` (the state never leaves the
//! device), and its host side (position, token history) beside them.

use super::model::GpuModel;
use crate::error::Result;
use crate::model::engram::TokenHistory;

/// One sequence's saved state.
pub(crate) struct SavedSeq {
    /// The windows, one after another in [`windows`]' order.
    copy: wgpu::Buffer,
    /// Its position and token history.
    pub(crate) pos: u64,
    pub(crate) history: TokenHistory,
}

impl SavedSeq {
    /// Bytes of device memory it holds.
    pub(crate) fn bytes(&self) -> u64 {
        self.copy.size()
    }
}

/// Sequence `seq`'s windows: (buffer, byte offset, bytes), all multiples of 4.
fn windows(gpu: &GpuModel, seq: usize) -> [(&wgpu::Buffer, u64, u64); 5] {
    let (st, s) = (&gpu.state, seq as u64);
    let c = &st.cache;
    let (rings_at, rings_bytes) = st.rings_window(seq);
    [
        (&c.k_codes, s * c.code.1, c.code.0),
        (&c.v_codes, s * c.code.1, c.code.0),
        (&c.k_scale, s * c.scale.1, c.scale.0),
        (&c.v_scale, s * c.scale.1, c.scale.0),
        (&st.rings, rings_at, rings_bytes),
    ]
}

/// Copy sequence `seq`'s windows into a new device buffer (queued after every
/// pass submitted so far).
///
/// # Errors
/// [`crate::Error::Gpu`] when the device reports an error (out of memory).
pub(crate) fn save(
    gpu: &GpuModel,
    seq: usize,
    pos: u64,
    history: TokenHistory,
) -> Result<SavedSeq> {
    let ctx = &gpu.ctx;
    let w = windows(gpu, seq);
    let total: u64 = w.iter().map(|x| x.2).sum();
    let copy = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("saved sequence"),
        size: total.max(4),
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let mut at = 0;
    for (buffer, offset, bytes) in w {
        enc.copy_buffer_to_buffer(buffer, offset, &copy, at, bytes);
        at += bytes;
    }
    ctx.queue.submit([enc.finish()]);
    ctx.check_errors()?;
    Ok(SavedSeq { copy, pos, history })
}

/// Copy `saved`'s windows into sequence `seq`'s (queued before any later pass).
///
/// # Errors
/// [`crate::Error::InvalidArgument`] when `saved` is of another shape;
/// [`crate::Error::Gpu`] when the device reports an error.
pub(crate) fn restore(gpu: &GpuModel, seq: usize, saved: &SavedSeq) -> Result<()> {
    let ctx = &gpu.ctx;
    let w = windows(gpu, seq);
    let total: u64 = w.iter().map(|x| x.2).sum();
    if total.max(4) != saved.copy.size() {
        return Err(crate::Error::InvalidArgument(
            "restore: the state was saved from a model of another shape".into(),
        ));
    }
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let mut at = 0;
    for (buffer, offset, bytes) in w {
        enc.copy_buffer_to_buffer(&saved.copy, at, buffer, offset, bytes);
        at += bytes;
    }
    ctx.queue.submit([enc.finish()]);
    ctx.check_errors()
}
