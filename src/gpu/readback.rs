//! [`Readback`]: what a step copies back, as its [`Readout`] asks — nothing, the
//! logits (`vocab` floats), the device argmax (8 bytes) or the device top-k
//! ([`TOPK_WORDS`] words) — with the staging buffers and their decoding; and the
//! masked readouts of the last step's logits ([`Readback::reread`]: the token mask
//! uploaded, the argmax or top-k run on the device over the allowed ids only).

use super::recorder::{self, Observer, Op};

use super::kernels::sample::{
    decode_topk, ArgmaxParams, SampleKernels, TopkParams, MAX_K, TOPK_WORDS,
};
use super::{Dispatch, GpuContext};
use crate::constrain::TokenMask;
use crate::engine::{Nucleus, Readout, StepOut, NUCLEUS_CANDIDATES};
use crate::error::{Error, Result};

// The nucleus candidates are selected by the device top-k.
const _: () = assert!(NUCLEUS_CANDIDATES <= MAX_K);

/// What the device runs and copies back after the vocabulary projection.
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
}

/// Where the logits of the last step are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogitsAt {
    /// The last step computed none (or there was no step).
    Nowhere,
    /// In the device buffer only.
    Device,
    /// Also on the host.
    Host,
}

/// Staging buffers, readout dispatches and the host copies of what came back.
pub(crate) struct Readback {
    logits_staging: wgpu::Buffer,
    logits_host: Vec<f32>,
    at: LogitsAt,
    argmax: Dispatch,
    argmax_out: wgpu::Buffer,
    argmax_staging: wgpu::Buffer,
    /// The masked argmax (over the ids `mask` allows).
    argmax_masked: Dispatch,
    sample: SampleKernels,
    /// The top-k dispatch of the last `(k, temperature bits, masked)` asked for.
    topk: Option<((usize, u32, bool), Dispatch)>,
    /// The token mask of masked readouts (`ceil(vocab / 32)` words).
    mask: wgpu::Buffer,
    /// The host's masked logits of a masked `Logits` readout.
    masked_logits: Vec<f32>,
    topk_out: wgpu::Buffer,
    topk_staging: wgpu::Buffer,
    topk_words: Vec<u32>,
    candidates: Vec<(f32, u32)>,
}

fn staging(ctx: &GpuContext, label: &str, size: u64) -> wgpu::Buffer {
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

impl Readback {
    /// Buffers for `vocab` logits in `logits`.
    ///
    /// # Errors
    /// [`Error::Gpu`] if a buffer can't be allocated.
    pub(crate) fn new(ctx: &GpuContext, vocab: usize, logits: &wgpu::Buffer) -> Result<Readback> {
        let sample = SampleKernels::new(ctx);
        let argmax_out = ctx.storage_zeroed("argmax", 8)?;
        let mask = ctx.storage_zeroed("token mask", vocab.div_ceil(32).max(1) as u64 * 4)?;
        let argmax_with = |masked: u32| {
            let p = ArgmaxParams {
                n: vocab as u32,
                off: 0,
                masked,
                _pad: 0,
            };
            sample.argmax(ctx, &p, logits, &argmax_out, &mask)
        };
        let (argmax, argmax_masked) = (argmax_with(0), argmax_with(1));
        Ok(Readback {
            logits_staging: staging(ctx, "logits staging", vocab as u64 * 4),
            logits_host: vec![0.0; vocab],
            at: LogitsAt::Nowhere,
            argmax,
            argmax_masked,
            argmax_out,
            argmax_staging: staging(ctx, "argmax staging", 8),
            sample,
            topk: None,
            mask,
            masked_logits: Vec::new(),
            topk_out: ctx.storage_zeroed("top-k", TOPK_WORDS as u64 * 4)?,
            topk_staging: staging(ctx, "top-k staging", TOPK_WORDS as u64 * 4),
            topk_words: vec![0; TOPK_WORDS],
            candidates: Vec::with_capacity(MAX_K),
        })
    }

    /// Bytes of the readback's device buffers.
    pub(crate) fn bytes(&self) -> u64 {
        [
            &self.logits_staging,
            &self.argmax_out,
            &self.argmax_staging,
            &self.topk_out,
            &self.topk_staging,
            &self.mask,
        ]
        .iter()
        .map(|b| b.size())
        .sum()
    }

    /// Build what `r` records (the top-k dispatch, once per `(k, temperature)`);
    /// `masked`: over the ids the uploaded mask allows.
    pub(crate) fn prepare_masked(
        &mut self,
        ctx: &GpuContext,
        r: DeviceReadout,
        logits: &wgpu::Buffer,
        masked: bool,
    ) {
        if let DeviceReadout::TopK { k, temperature } = r {
            let key = (k, temperature.to_bits(), masked);
            if self.topk.as_ref().is_none_or(|(have, _)| *have != key) {
                let p = TopkParams {
                    n: self.logits_host.len() as u32,
                    off: 0,
                    k: k as u32,
                    temperature,
                    masked: u32::from(masked),
                    _pad: [0; 3],
                };
                let d = self
                    .sample
                    .topk(ctx, &p, logits, &self.topk_out, &self.mask);
                self.topk = Some((key, d));
            }
        }
    }

    /// [`Readback::prepare_masked`] without a mask (a step's own readout).
    pub(crate) fn prepare(&mut self, ctx: &GpuContext, r: DeviceReadout, logits: &wgpu::Buffer) {
        self.prepare_masked(ctx, r, logits, false)
    }

    /// The dispatch `r` records after the vocabulary projection, if any (after
    /// [`Readback::prepare`]).
    pub(crate) fn dispatch(&self, r: DeviceReadout) -> Option<&Dispatch> {
        match r {
            DeviceReadout::Argmax => Some(&self.argmax),
            DeviceReadout::TopK { .. } => self.topk.as_ref().map(|(_, d)| d),
            _ => None,
        }
    }

    /// The masked readout of the last step's logits (`t`: that step's position,
    /// for errors): the mask uploaded, then `readout`'s dispatch over the allowed
    /// ids and its copy in one submit; a `Logits` readout (or a top-k beyond the
    /// device kernel) copies the logits back and masks them on the host.
    ///
    /// # Errors
    /// As [`crate::Engine::readout`].
    pub(crate) fn reread(
        &mut self,
        ctx: &GpuContext,
        readout: Readout,
        mask: Option<&TokenMask>,
        logits: &wgpu::Buffer,
        t: u64,
    ) -> Result<StepOut<'_>> {
        readout.validate()?;
        if self.at == LogitsAt::Nowhere {
            return Err(Error::InvalidArgument(
                "readout: the last step computed no logits".into(),
            ));
        }
        let vocab = self.logits_host.len();
        if let Some(m) = mask {
            m.check(vocab)?;
        }
        let r = DeviceReadout::of(readout);
        match r {
            DeviceReadout::None | DeviceReadout::Keep => return Ok(StepOut::None),
            DeviceReadout::Logits => {
                self.last_logits(ctx, logits)?;
                let Some(m) = mask else {
                    return self.decode_logits(readout, t);
                };
                m.apply_into(&self.logits_host, &mut self.masked_logits);
                let host = &self.logits_host;
                if (0..vocab as u32).any(|i| m.is_allowed(i) && !host[i as usize].is_finite()) {
                    return Err(non_finite_logits(t));
                }
                return Ok(match readout {
                    Readout::TopK(k) => {
                        crate::sample::top_k_into(&self.masked_logits, k, &mut self.candidates);
                        StepOut::Candidates(&self.candidates)
                    }
                    _ => StepOut::Logits(&self.masked_logits),
                });
            }
            DeviceReadout::Argmax | DeviceReadout::TopK { .. } => {}
        }
        if let Some(m) = mask {
            ctx.queue
                .write_buffer(&self.mask, 0, bytemuck::cast_slice(m.words()));
        }
        self.prepare_masked(ctx, r, logits, mask.is_some());
        let d = match (r, mask.is_some()) {
            (DeviceReadout::Argmax, true) => Some(&self.argmax_masked),
            _ => self.dispatch(r),
        };
        recorder::submit(ctx, d.map(Op::Run), Observer::Plain, |enc| {
            self.encode_copy(enc, r, logits)
        })?;
        ctx.check_errors()?;
        self.decode_device(ctx, r, t)
    }

    /// Record the copy of what `r` reads back into its staging buffer.
    pub(crate) fn encode_copy(
        &self,
        enc: &mut wgpu::CommandEncoder,
        r: DeviceReadout,
        logits: &wgpu::Buffer,
    ) {
        match r {
            DeviceReadout::None | DeviceReadout::Keep => {}
            DeviceReadout::Logits => enc.copy_buffer_to_buffer(
                logits,
                0,
                &self.logits_staging,
                0,
                self.logits_staging.size(),
            ),
            DeviceReadout::Argmax => {
                enc.copy_buffer_to_buffer(&self.argmax_out, 0, &self.argmax_staging, 0, 8)
            }
            DeviceReadout::TopK { .. } => enc.copy_buffer_to_buffer(
                &self.topk_out,
                0,
                &self.topk_staging,
                0,
                self.topk_staging.size(),
            ),
        }
    }

    /// Map what the submitted step copied back and decode it as `readout` asked
    /// (`t`: the step's position, for errors).
    ///
    /// # Errors
    /// [`Error::NonFinite`] when a logit the readout reads is NaN or infinite;
    /// [`Error::Gpu`] if mapping fails.
    pub(crate) fn finish(
        &mut self,
        ctx: &GpuContext,
        readout: Readout,
        t: u64,
    ) -> Result<StepOut<'_>> {
        let r = DeviceReadout::of(readout);
        self.at = if r.needs_logits() {
            LogitsAt::Device
        } else {
            LogitsAt::Nowhere
        };
        match r {
            DeviceReadout::None | DeviceReadout::Keep => Ok(StepOut::None),
            DeviceReadout::Logits => {
                self.fetch_logits(ctx)?;
                self.decode_logits(readout, t)
            }
            DeviceReadout::Argmax | DeviceReadout::TopK { .. } => self.decode_device(ctx, r, t),
        }
    }

    /// `readout` from the host copy of the logits (a `Logits` readout, or a top-k
    /// beyond the device kernel).
    fn decode_logits(&mut self, readout: Readout, t: u64) -> Result<StepOut<'_>> {
        if !self.logits_host.iter().all(|v| v.is_finite()) {
            return Err(non_finite_logits(t));
        }
        match readout {
            Readout::TopK(k) => {
                crate::sample::top_k_into(&self.logits_host, k, &mut self.candidates);
                Ok(StepOut::Candidates(&self.candidates))
            }
            _ => Ok(StepOut::Logits(&self.logits_host)),
        }
    }

    /// Map and decode what the device argmax or top-k `r` copied back.
    fn decode_device(&mut self, ctx: &GpuContext, r: DeviceReadout, t: u64) -> Result<StepOut<'_>> {
        match r {
            DeviceReadout::Argmax => {
                let mut out = [0u32; 2];
                ctx.map_read_into(&self.argmax_staging, bytemuck::cast_slice_mut(&mut out))?;
                if out[1] != 0 {
                    return Err(non_finite_logits(t));
                }
                Ok(StepOut::Token(out[0]))
            }
            DeviceReadout::TopK { temperature, .. } => {
                ctx.map_read_into(
                    &self.topk_staging,
                    bytemuck::cast_slice_mut(&mut self.topk_words),
                )?;
                let Some(total) = decode_topk(&self.topk_words, &mut self.candidates) else {
                    return Err(non_finite_logits(t));
                };
                if temperature <= 0.0 {
                    return Ok(StepOut::Candidates(&self.candidates));
                }
                Ok(StepOut::Nucleus {
                    candidates: &self.candidates,
                    nucleus: device_nucleus(total, self.logits_host.len()),
                })
            }
            _ => Ok(StepOut::None),
        }
    }

    /// Forget the last step's logits (a reset, or a step that computed none).
    pub(crate) fn forget(&mut self) {
        self.at = LogitsAt::Nowhere;
    }

    /// Say the last step left its logits in the device buffer (a captured or
    /// timed step).
    pub(crate) fn on_device(&mut self) {
        self.at = LogitsAt::Device;
    }

    /// The last step's logits, copied back from `logits` if they are only on the device.
    ///
    /// # Errors
    /// [`Error::Gpu`] if the copy or mapping fails.
    pub(crate) fn last_logits(
        &mut self,
        ctx: &GpuContext,
        logits: &wgpu::Buffer,
    ) -> Result<Option<&[f32]>> {
        match self.at {
            LogitsAt::Nowhere => Ok(None),
            LogitsAt::Host => Ok(Some(&self.logits_host)),
            LogitsAt::Device => {
                let mut enc = ctx.device.create_command_encoder(&Default::default());
                self.encode_copy(&mut enc, DeviceReadout::Logits, logits);
                ctx.queue.submit([enc.finish()]);
                self.fetch_logits(ctx)?;
                Ok(Some(&self.logits_host))
            }
        }
    }

    /// Map the logits staging buffer into the host copy.
    fn fetch_logits(&mut self, ctx: &GpuContext) -> Result<()> {
        ctx.map_read_into(
            &self.logits_staging,
            bytemuck::cast_slice_mut(&mut self.logits_host),
        )?;
        self.at = LogitsAt::Host;
        Ok(())
    }
}

/// The softmax denominator `total` the device top-k summed over `vocab` logits,
/// with its error bound.
pub(crate) fn device_nucleus(total: f32, vocab: usize) -> Nucleus {
    // The device sums f32 terms: WGSL's exp is within 3 + 2|x| ulp (below
    // 2e-5 relative for every term that matters against the largest, which
    // is 1), each invocation adds ceil(n / 256) terms in a row and a tree of 8
    // levels joins them (one rounding each); 4× that for safety.
    let n = vocab as f64;
    let rounding = ((n / 256.0).ceil() + 8.0) * f64::from(f32::EPSILON);
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
