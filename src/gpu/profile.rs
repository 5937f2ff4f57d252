//! [`GpuEngine::profile`]: per-kernel timings of real decode steps, from timestamp
//! queries written around every dispatch inside the step's compute pass
//! (`TIMESTAMP_QUERY` + `TIMESTAMP_QUERY_INSIDE_PASSES`), or, on a device without
//! them, from one submit and wait per dispatch ([`GpuEngine::time_dispatches`]).

use super::{Dispatch, GpuEngine};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::kernels::kv::attended_ranges;
use crate::profile::{bytes, KernelProfile, KernelTally, KernelTimer};
use std::sync::Arc;
use std::time::Instant;

/// How [`GpuEngine::profile`] times the dispatches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuTiming {
    /// Timestamp queries where the device has them enabled, else [`GpuTiming::PerDispatch`].
    #[default]
    Auto,
    /// Timestamp queries inside the compute pass (an error where the device lacks them).
    Timestamps,
    /// One submit and wait per dispatch: works on every device, but each time
    /// includes the submit and wait overhead.
    PerDispatch,
}

/// Query sets and buffers for one profile run (built once, reused every step).
struct Queries {
    sets: Vec<wgpu::QuerySet>,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Two per dispatch: before and after.
    count: u32,
    /// Nanoseconds per tick.
    period_ns: f64,
}

const PER_SET: u32 = wgpu::QUERY_SET_MAX_QUERIES;

impl Queries {
    fn new(ctx: &super::GpuContext, dispatches: usize) -> Result<Queries> {
        let count = u32::try_from(2 * dispatches)
            .map_err(|_| Error::Gpu("too many dispatches to profile".into()))?;
        let sets = (0..count.div_ceil(PER_SET))
            .map(|k| {
                ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("cqlm profile timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: (count - k * PER_SET).min(PER_SET),
                })
            })
            .collect();
        let size = u64::from(count.max(2)) * 8;
        let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("cqlm profile resolve"),
            size,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readback = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("cqlm profile readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let period_ns = f64::from(ctx.queue.get_timestamp_period());
        if period_ns <= 0.0 {
            return Err(Error::Gpu(
                "the queue reports a timestamp period of 0 (timestamps unsupported)".into(),
            ));
        }
        Ok(Queries {
            sets,
            resolve,
            readback,
            count,
            period_ns,
        })
    }

    /// Query set and index of query `q`.
    fn slot(&self, q: usize) -> (&wgpu::QuerySet, u32) {
        let q = q as u32;
        (&self.sets[(q / PER_SET) as usize], q % PER_SET)
    }
}

/// Positions attended by the step at position `t` (SPEC §4.3: sink plus window).
fn attended(t: u64, sink: usize, window: usize) -> usize {
    attended_ranges(t, sink, window)
        .iter()
        .map(|r| (r.end - r.start) as usize)
        .sum()
}

impl GpuEngine {
    /// Step every id of `tokens` with logits, as real decode steps (the position
    /// advances and the logits are computed on the device; they are not read
    /// back), and time each dispatch; the result averages per token and groups
    /// dispatches by kernel name, so its calls per token add up to
    /// [`GpuEngine::dispatches_per_token`]`().1`.
    ///
    /// With timestamps, each dispatch is bracketed by two timestamp writes in the
    /// step's single compute pass: the kernel times add up to at most the GPU time
    /// of the step, itself inside the step's wall time (write of the step buffer
    /// to the timestamp readback). Per dispatch, each time is the host wall time
    /// of one submit and wait; they add up to at most the step's wall time
    /// (measured around all of them).
    ///
    /// # Errors
    /// As [`Engine::step`]; [`Error::Gpu`] for [`GpuTiming::Timestamps`] on a
    /// device without timestamp queries enabled.
    pub fn profile(&mut self, tokens: &[u32], timing: GpuTiming) -> Result<KernelProfile> {
        let have = self.context().caps.timestamps;
        let use_ts = match timing {
            GpuTiming::Auto => have,
            GpuTiming::Timestamps if !have => {
                return Err(Error::Gpu(format!(
                    "adapter `{}` has no timestamp queries inside passes enabled \
                     (TIMESTAMP_QUERY + TIMESTAMP_QUERY_INSIDE_PASSES missing, or CQLM_NO_TIMESTAMPS set)",
                    self.context().info.name
                )))
            }
            GpuTiming::Timestamps => true,
            GpuTiming::PerDispatch => false,
        };
        let meta: Vec<(&'static str, u64)> =
            self.all_dispatches().map(|d| (d.name, d.bytes)).collect();
        let (heads, head_dim, sink, window) = {
            let c = self.config();
            (c.heads, c.head_dim, c.sink, c.window)
        };
        let queries = if use_ts {
            Some(Queries::new(self.context(), meta.len())?)
        } else {
            None
        };
        let mut tally = KernelTally::default();
        let mut wall = 0.0;
        for &token in tokens {
            // The attention dispatch's estimate is for a full cache; recount it here.
            let attend_bytes = bytes::attend(
                heads,
                head_dim,
                attended(Engine::position(self), sink, window),
            );
            let t0 = Instant::now();
            let secs: Vec<f64> = match &queries {
                Some(q) => self.step_timestamped(q, token)?,
                None => self
                    .time_dispatches(token)?
                    .into_iter()
                    .map(|(_, s)| s)
                    .collect(),
            };
            wall += t0.elapsed().as_secs_f64();
            if secs.len() != meta.len() {
                return Err(Error::Gpu(format!(
                    "profile: {} timings for {} dispatches",
                    secs.len(),
                    meta.len()
                )));
            }
            for (&(name, b), s) in meta.iter().zip(secs) {
                tally.kernel(name, s, if name == "attend" { attend_bytes } else { b });
            }
        }
        let method = match &queries {
            Some(q) => format!(
                "gpu timestamp queries around each dispatch inside one compute pass \
                 (TIMESTAMP_QUERY_INSIDE_PASSES), {} ns per tick",
                q.period_ns
            ),
            None if have => "gpu: one submit and wait per dispatch, as asked \
                             (each time includes the submit and wait overhead)"
                .to_string(),
            None => "gpu: one submit and wait per dispatch, because timestamp queries \
                     inside passes are not enabled on this device (each time includes \
                     the submit and wait overhead)"
                .to_string(),
        };
        Ok(tally.into_profile(tokens.len(), wall, &method))
    }

    /// One step with logits, every dispatch bracketed by timestamps; each dispatch's
    /// seconds in recording order.
    fn step_timestamped(&mut self, q: &Queries, token: u32) -> Result<Vec<f64>> {
        self.begin_step(token)?;
        let ctx = Arc::clone(self.context());
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("cqlm profiled step"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("cqlm profiled step"),
                timestamp_writes: None,
            });
            for (i, d) in self.all_dispatches().enumerate() {
                record_timed(&mut pass, q, i, d);
            }
        }
        for (k, set) in q.sets.iter().enumerate() {
            let first = k as u32 * PER_SET;
            let n = (q.count - first).min(PER_SET);
            enc.resolve_query_set(set, 0..n, &q.resolve, u64::from(first) * 8);
        }
        enc.copy_buffer_to_buffer(&q.resolve, 0, &q.readback, 0, u64::from(q.count) * 8);
        // The logits come back as in a normal decode step, inside the step's wall time.
        self.encode_logits_copy(&mut enc);
        ctx.queue.submit([enc.finish()]);
        self.advance();
        self.fetch_logits()?;
        let mut ticks = vec![0u64; q.count as usize];
        ctx.map_read_into(&q.readback, bytemuck::cast_slice_mut(&mut ticks))?;
        Ok(ticks
            .chunks_exact(2)
            .map(|p| p[1].saturating_sub(p[0]) as f64 * q.period_ns * 1e-9)
            .collect())
    }
}

/// Record dispatch `i` between its two timestamp writes.
fn record_timed(pass: &mut wgpu::ComputePass<'_>, q: &Queries, i: usize, d: &Dispatch) {
    let (set, at) = q.slot(2 * i);
    pass.write_timestamp(set, at);
    d.record(pass);
    let (set, at) = q.slot(2 * i + 1);
    pass.write_timestamp(set, at);
}
