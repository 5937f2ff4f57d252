//! [`Readouts`]: what the items of a batch step read back. Each item that ends
//! in a pass has its logits copied to its row of a kept buffer in that pass's
//! submit, and its readout runs there: the device argmax (8 bytes back) or
//! top-k with the softmax denominator (about 2 KiB; `sample.wgsl`), over the
//! ids of its uploaded token mask when it has one, or a copy of the row for an
//! item that asks for the logits. Everything the items read back lands in one
//! staging buffer, mapped once after the last pass; a reread runs the same
//! readouts on an item's kept row again.

use super::kernels::sample::{
    decode_topk, ArgmaxParams, SampleKernels, TopkParams, MAX_K, TOPK_WORDS,
};
use super::recorder::{self, Observer, Op};
use super::{Dispatch, GpuContext};
use crate::constrain::TokenMask;
use crate::engine::{
    host_readout_masked, ItemOut, ItemOuts, Nucleus, Readout, SlotStep, StepOut, NUCLEUS_CANDIDATES,
};
use crate::error::{Error, Result};

// The nucleus candidates are selected by the device top-k.
const _: () = assert!(NUCLEUS_CANDIDATES <= MAX_K);

/// What the device runs and copies back for a [`Readout`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum DeviceReadout {
    /// Nothing: no vocabulary projection either.
    None,
    /// The vocabulary projection only: the logits stay on the device.
    Keep,
    /// The logits to the staging buffer.
    Logits,
    /// The device argmax and its 8 bytes.
    Argmax,
    /// The device top-k (`k <= MAX_K`, softmax denominator at `temperature` when > 0).
    TopK { k: usize, temperature: f32 },
}

impl DeviceReadout {
    /// The device side of `r`: top-k beyond the device kernel reads the logits.
    pub(crate) fn of(r: Readout) -> DeviceReadout {
        match r {
            Readout::None => DeviceReadout::None,
            Readout::Deferred => DeviceReadout::Keep,
            Readout::Logits => DeviceReadout::Logits,
            Readout::Argmax => DeviceReadout::Argmax,
            Readout::TopK(k) if k == 0 || k > MAX_K => DeviceReadout::Logits,
            Readout::TopK(k) => DeviceReadout::TopK {
                k,
                temperature: 0.0,
            },
            Readout::Nucleus { temperature } => DeviceReadout::TopK {
                k: NUCLEUS_CANDIDATES,
                temperature,
            },
        }
    }

    /// Whether the step runs the vocabulary projection.
    pub(crate) fn needs_logits(self) -> bool {
        self != DeviceReadout::None
    }

    /// Bytes it copies back for `vocab` logits.
    fn bytes(self, vocab: usize) -> u64 {
        match self {
            DeviceReadout::None | DeviceReadout::Keep => 0,
            DeviceReadout::Logits => vocab as u64 * 4,
            DeviceReadout::Argmax => 8,
            DeviceReadout::TopK { .. } => TOPK_WORDS as u64 * 4,
        }
    }
}

/// The softmax denominator `total` the device top-k summed over `vocab` logits,
/// with its error bound.
pub(crate) fn device_nucleus(total: f32, vocab: usize, width: u32) -> Nucleus {
    // The device sums f32 terms: WGSL's exp is within 3 + 2|x| ulp (below
    // 2e-5 relative for every term that matters against the largest, which
    // is 1), each of the kernel's `width` invocations
    // (Capabilities::wide_workgroup) adds ceil(n / width) terms in a row and a
    // tree of log2(width) levels joins them (one rounding each); 4× that for
    // safety. (A looser bound would only send more top-p steps to the full
    // logits.)
    let (n, w) = (vocab as f64, f64::from(width));
    let rounding = ((n / w).ceil() + w.log2()) * f64::from(f32::EPSILON);
    Nucleus {
        total: f64::from(total),
        rel_err: 4.0 * (2e-5 + rounding),
    }
}

/// The error for non-finite logits at position `t`.
pub(crate) fn non_finite_logits(t: u64) -> Error {
    Error::NonFinite {
        tensor: "logits (`cqlm parity` names the first non-finite tensor)".into(),
        position: t,
    }
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

impl DispatchKey {
    fn of(device: DeviceReadout, masked: bool) -> Option<DispatchKey> {
        match device {
            DeviceReadout::Argmax => Some(DispatchKey::Argmax { masked }),
            DeviceReadout::TopK { k, temperature } => Some(DispatchKey::TopK {
                k,
                temperature: temperature.to_bits(),
                masked,
            }),
            _ => None,
        }
    }
}

/// What an item of the step reads back, and where in the staging buffer.
#[derive(Debug, Clone, Copy)]
struct ItemRead {
    /// The item's slot (sequence).
    slot: usize,
    readout: Readout,
    device: DeviceReadout,
    /// Its dispatch, if it runs one.
    key: Option<DispatchKey>,
    /// Byte offset and length of its bytes in the staging buffer.
    at: u64,
    bytes: u64,
}

/// The readouts of a batch's items: kept logits rows, per-item outputs and
/// masks, the staging buffer, and the host copies of what came back.
pub(crate) struct Readouts {
    vocab: usize,
    sample: SampleKernels,
    /// Per item, its logits row after a step (`[items, vocab]`).
    kept: wgpu::Buffer,
    items: Vec<ItemBufs>,
    /// The last step's items.
    reads: Vec<ItemRead>,
    staging: wgpu::Buffer,
    /// The staging buffer's words, as the last map read them.
    staged: Vec<u32>,
    outs: ItemOuts,
    /// A reread's readout.
    again: ItemOut,
    /// Buffers of host readouts (a `Logits` item, a reread).
    row: Vec<f32>,
    masked: Vec<f32>,
    candidates: Vec<(f32, u32)>,
}

impl Readouts {
    /// Buffers for up to `items` items of `vocab` logits.
    ///
    /// # Errors
    /// [`Error::Gpu`] if a buffer exceeds the device's limits.
    pub(crate) fn new(ctx: &GpuContext, vocab: usize, items: usize) -> Result<Readouts> {
        let row = (vocab * 4).max(TOPK_WORDS * 4) as u64;
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readout staging"),
            size: items as u64 * row,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let bufs = (0..items)
            .map(|_| {
                Ok(ItemBufs {
                    argmax_out: ctx.storage_zeroed("argmax", 8)?,
                    topk_out: ctx.storage_zeroed("top-k", TOPK_WORDS as u64 * 4)?,
                    mask: ctx.storage_zeroed("token mask", vocab.div_ceil(32) as u64 * 4)?,
                    dispatches: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Readouts {
            vocab,
            sample: SampleKernels::new(ctx),
            kept: ctx.storage_zeroed("kept logits", (items * vocab * 4) as u64)?,
            items: bufs,
            reads: Vec::with_capacity(items),
            staging,
            staged: Vec::new(),
            outs: ItemOuts::default(),
            again: ItemOut::default(),
            row: Vec::new(),
            masked: Vec::new(),
            candidates: Vec::new(),
        })
    }

    /// Bytes of the device buffers.
    pub(crate) fn bytes(&self) -> u64 {
        let per_item: u64 = self
            .items
            .iter()
            .map(|b| b.argmax_out.size() + b.topk_out.size() + b.mask.size())
            .sum();
        self.kept.size() + self.staging.size() + per_item
    }

    /// Begin a step of `work`: plan what each item reads back and where it
    /// lands in the staging buffer, upload the masks of its device readouts and
    /// build their dispatches.
    pub(crate) fn begin(&mut self, ctx: &GpuContext, work: &[SlotStep<'_>]) {
        self.outs.begin(work.len());
        self.reads.clear();
        let mut at = 0;
        for (k, w) in work.iter().enumerate() {
            let device = DeviceReadout::of(w.readout);
            let key = DispatchKey::of(device, w.mask.is_some());
            let bytes = device.bytes(self.vocab);
            self.reads.push(ItemRead {
                slot: w.slot,
                readout: w.readout,
                device,
                key,
                at,
                bytes,
            });
            at += bytes;
            if let Some(key) = key {
                self.prepare(ctx, k, key, w.mask);
            }
        }
    }

    /// Upload `mask` (if any) to item `k` and build its `key` dispatch if it has
    /// none of that kind yet.
    fn prepare(&mut self, ctx: &GpuContext, k: usize, key: DispatchKey, mask: Option<&TokenMask>) {
        let it = &mut self.items[k];
        if let Some(m) = mask {
            ctx.queue
                .write_buffer(&it.mask, 0, bytemuck::cast_slice(m.words()));
        }
        if it.dispatches.iter().any(|(have, _)| *have == key) {
            return;
        }
        let (n, off) = (self.vocab as u32, (k * self.vocab) as u32);
        let d = match key {
            DispatchKey::Argmax { masked } => {
                let p = ArgmaxParams {
                    n,
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
                    n,
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

    /// Whether item `k` of the step needs its logits computed.
    pub(crate) fn needs_logits(&self, k: usize) -> bool {
        self.reads[k].device.needs_logits()
    }

    /// The op that keeps item `k`'s logits (at byte `offset` of `logits`) in
    /// its row.
    pub(crate) fn keep<'a>(&'a self, k: usize, logits: &'a wgpu::Buffer, offset: u64) -> Op<'a> {
        let row = self.vocab as u64 * 4;
        Op::Copy {
            src: logits,
            src_offset: offset,
            dst: &self.kept,
            dst_offset: k as u64 * row,
            bytes: row,
        }
    }

    /// The op that runs item `k`'s device readout on its kept row, if it has one.
    pub(crate) fn run(&self, k: usize) -> Option<Op<'_>> {
        self.dispatch(k, self.reads[k].key).map(Op::Run)
    }

    fn dispatch(&self, k: usize, key: Option<DispatchKey>) -> Option<&Dispatch> {
        let key = key?;
        let it = self.items.get(k)?;
        it.dispatches
            .iter()
            .find(|(have, _)| *have == key)
            .map(|(_, d)| d)
    }

    /// Record the copy of what item `k` reads back into the staging buffer.
    pub(crate) fn copy_out(&self, enc: &mut wgpu::CommandEncoder, k: usize) {
        let r = &self.reads[k];
        let src = match r.device {
            DeviceReadout::None | DeviceReadout::Keep => return,
            DeviceReadout::Logits => {
                let row = self.vocab as u64 * 4;
                return enc.copy_buffer_to_buffer(
                    &self.kept,
                    k as u64 * row,
                    &self.staging,
                    r.at,
                    r.bytes,
                );
            }
            DeviceReadout::Argmax => &self.items[k].argmax_out,
            DeviceReadout::TopK { .. } => &self.items[k].topk_out,
        };
        enc.copy_buffer_to_buffer(src, 0, &self.staging, r.at, r.bytes);
    }

    /// After the step's last pass: map what its items copied back and decode
    /// each (`position(k)`: item `k`'s last position, for errors).
    ///
    /// # Errors
    /// [`Error::NonFinite`] when a logit an item reads out is not finite;
    /// [`Error::Gpu`] if mapping fails.
    pub(crate) fn finish(
        &mut self,
        ctx: &GpuContext,
        work: &[SlotStep<'_>],
        position: impl Fn(usize) -> u64,
    ) -> Result<()> {
        let total = self.reads.iter().map(|r| r.at + r.bytes).max().unwrap_or(0);
        self.staged.resize(total as usize / 4, 0);
        if total > 0 {
            ctx.map_read_into(&self.staging, bytemuck::cast_slice_mut(&mut self.staged))?;
        }
        for (k, w) in work.iter().enumerate() {
            let r = self.reads[k];
            let words = &self.staged[(r.at / 4) as usize..((r.at + r.bytes) / 4) as usize];
            let scratch = (&mut self.row, &mut self.masked, &mut self.candidates);
            decode(
                r,
                words,
                w.mask,
                position(k),
                (self.vocab, self.sample.width()),
                self.outs.item(k),
                scratch,
            )?;
        }
        self.outs.end(work.len());
        Ok(())
    }

    /// Whether the last step computed logits for its item `k` (kept on the device).
    pub(crate) fn has_logits(&self, k: usize) -> bool {
        self.outs.has(k) && self.reads.get(k).is_some_and(|r| r.device.needs_logits())
    }

    /// Item `k`'s readout of the last step.
    pub(crate) fn out(&self, k: usize) -> StepOut<'_> {
        self.outs.get(k)
    }

    /// Say the last step was one item, of slot 0, whose logits are in its kept
    /// row for a later readout (a captured step).
    pub(crate) fn kept_only(&mut self) {
        self.outs.begin(1);
        self.reads.clear();
        self.reads.push(ItemRead {
            slot: 0,
            readout: Readout::Deferred,
            device: DeviceReadout::Keep,
            key: None,
            at: 0,
            bytes: 0,
        });
        self.outs.end(1);
    }

    /// The slot of the last step's item `k`, if it had one.
    pub(crate) fn slot(&self, k: usize) -> Option<usize> {
        self.reads
            .get(k)
            .filter(|_| self.outs.has(k))
            .map(|r| r.slot)
    }

    /// Forget the last step's readouts when one of its items was of `slot`
    /// (that sequence was reset, or stepped without them).
    pub(crate) fn forget(&mut self, slot: usize) {
        if self.reads.iter().any(|r| r.slot == slot) {
            self.outs.begin(0);
            self.reads.clear();
        }
    }

    /// Read item `k`'s kept logits out again as `readout` asks, under `mask`
    /// (`t`: its position, for errors): the argmax and top-k on the device,
    /// the logits copied back.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the last step computed no logits for it,
    /// for a bad readout or mask; as [`Readouts::finish`].
    pub(crate) fn reread(
        &mut self,
        ctx: &GpuContext,
        k: usize,
        readout: Readout,
        mask: Option<&TokenMask>,
        t: u64,
    ) -> Result<StepOut<'_>> {
        readout.validate()?;
        if !self.has_logits(k) {
            return Err(Error::InvalidArgument(
                "readout: the last step computed no logits".into(),
            ));
        }
        if let Some(m) = mask {
            m.check(self.vocab)?;
        }
        let device = DeviceReadout::of(readout);
        let key = DispatchKey::of(device, mask.is_some());
        let r = ItemRead {
            slot: self.reads[k].slot,
            readout,
            device,
            key,
            at: 0,
            bytes: device.bytes(self.vocab),
        };
        if let Some(key) = key {
            self.prepare(ctx, k, key, mask);
        }
        let row = self.vocab as u64 * 4;
        let run = self.dispatch(k, key).map(Op::Run);
        let (kept, staging, items) = (&self.kept, &self.staging, &self.items);
        recorder::submit(ctx, run, Observer::Plain, |enc| match device {
            DeviceReadout::Logits => {
                enc.copy_buffer_to_buffer(kept, k as u64 * row, staging, 0, r.bytes)
            }
            DeviceReadout::Argmax => {
                enc.copy_buffer_to_buffer(&items[k].argmax_out, 0, staging, 0, 8)
            }
            DeviceReadout::TopK { .. } => {
                enc.copy_buffer_to_buffer(&items[k].topk_out, 0, staging, 0, r.bytes)
            }
            DeviceReadout::None | DeviceReadout::Keep => {}
        })?;
        self.staged.resize(r.bytes as usize / 4, 0);
        if r.bytes > 0 {
            ctx.map_read_into(&self.staging, bytemuck::cast_slice_mut(&mut self.staged))?;
        }
        ctx.check_errors()?;
        let scratch = (&mut self.row, &mut self.masked, &mut self.candidates);
        decode(
            r,
            &self.staged,
            mask,
            t,
            (self.vocab, self.sample.width()),
            &mut self.again,
            scratch,
        )?;
        Ok(self.again.as_out())
    }
}

/// Decode what readout `r` copied back (`words`) into `it`, under `mask`
/// (`t`: the position, for errors); allocates nothing once the buffers have grown.
fn decode(
    r: ItemRead,
    words: &[u32],
    mask: Option<&TokenMask>,
    t: u64,
    (vocab, width): (usize, u32),
    it: &mut ItemOut,
    (row, masked, candidates): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<(f32, u32)>),
) -> Result<()> {
    match r.device {
        DeviceReadout::None | DeviceReadout::Keep => it.keep(StepOut::None),
        DeviceReadout::Argmax => {
            if words[1] != 0 {
                return Err(non_finite_logits(t));
            }
            it.set_token(words[0]);
        }
        DeviceReadout::TopK { temperature, .. } => {
            let Some(total) = decode_topk(words, &mut it.candidates) else {
                return Err(non_finite_logits(t));
            };
            it.set_candidates((temperature > 0.0).then(|| device_nucleus(total, vocab, width)));
        }
        DeviceReadout::Logits => {
            row.clear();
            row.extend_from_slice(bytemuck::cast_slice(words));
            let allowed = |i: usize| mask.is_none_or(|m| m.is_allowed(i as u32));
            if (0..row.len()).any(|i| allowed(i) && !row[i].is_finite()) {
                return Err(non_finite_logits(t));
            }
            it.keep(host_readout_masked(
                row, r.readout, mask, masked, candidates,
            )?);
        }
    }
    Ok(())
}
