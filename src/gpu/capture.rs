//! Capture points of the step: where `GpuEngine::step_captured` copies a named
//! intermediate out (the CPU probe's names), between the same dispatches as a
//! plain step, and the captured step itself ([`run`]). A plain step records none
//! of them, so capture is free when off.

use super::model::GpuModel;
use super::recorder::{self, Observer, Op};
use crate::error::Result;

/// One tensor copied out of a captured step.
#[derive(Debug, Clone, PartialEq)]
pub struct Captured {
    /// Name, as the CPU engine's [`crate::cpu::Probe`] names it.
    pub name: String,
    /// Layer, or `None` outside the layer loop.
    pub layer: Option<usize>,
    /// Values.
    pub data: Vec<f32>,
}

/// Which buffer a capture point copies from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The activations (slot 0).
    Act,
    /// The lanes (slot 0).
    Lanes,
    /// The logits.
    Logits,
}

/// A copy of `len` elements at `offset` of `source`, made after dispatch `after`
/// of its segment (head, a layer, or the tail).
#[derive(Debug, Clone)]
pub(crate) struct CapturePoint {
    pub after: usize,
    pub name: String,
    pub layer: Option<usize>,
    pub source: Source,
    pub offset: usize,
    pub len: usize,
}

/// Run one decode step of `gpu`'s program (its step input already written)
/// and copy every named intermediate out of it: the CPU probe's names, `x0`,
/// `engram.e`, `engram.key.{s}`, `engram.value.{s}`, and per layer `u`,
/// `block_in`, `q`, `k`, `v`, `attn_o`, `after_attn`, `mlp_out`, `update`,
/// `route`, `lanes`; `logits` when `want_logits` (then `keep` runs after the
/// tail too: the op that keeps the logits for a later readout). The copies run
/// between the same dispatches as a plain step.
///
/// # Errors
/// [`crate::Error::Gpu`] if the device fails.
pub(crate) fn run(
    gpu: &GpuModel,
    want_logits: bool,
    keep: Option<Op<'_>>,
) -> Result<(Option<Vec<f32>>, Vec<Captured>)> {
    let p = gpu.program.decode();
    let logits_point = CapturePoint {
        after: p.tail.len(),
        name: "logits".into(),
        layer: None,
        source: Source::Logits,
        offset: 0,
        len: gpu.model.config.vocab,
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
    let capture = gpu.ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("capture"),
        size: (total.max(1) * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let s = &gpu.state;
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
    ops.extend(keep);
    recorder::submit(&gpu.ctx, ops, Observer::Plain, |_| {})?;
    let data = gpu.ctx.map_read(&capture, total as u64 * 4)?;
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
    Ok((logits, out))
}
