//! The one step recorder: every way of running the step (plain, with capture
//! copies, with timestamps around each dispatch, one submit per dispatch) is an
//! [`Observer`] of the same list of [`Op`]s, so the dispatches and copies land in
//! the same order in every mode.

use super::device_errors::InFlight;
use super::{Dispatch, GpuContext};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// One recorded operation of a step.
#[derive(Clone, Copy)]
pub(crate) enum Op<'a> {
    /// A compute dispatch.
    Run(&'a Dispatch),
    /// A buffer copy (capture points; it ends the compute pass it follows).
    Copy {
        src: &'a wgpu::Buffer,
        src_offset: u64,
        dst: &'a wgpu::Buffer,
        dst_offset: u64,
        bytes: u64,
    },
}

/// Timestamp query sets for bracketing each dispatch of a step (built once,
/// reused every step).
pub(crate) struct Queries {
    sets: Vec<wgpu::QuerySet>,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Two per dispatch: before and after.
    count: u32,
    /// Nanoseconds per tick.
    pub period_ns: f64,
}

const PER_SET: u32 = wgpu::QUERY_SET_MAX_QUERIES;

impl Queries {
    /// Queries for `dispatches` dispatches.
    ///
    /// # Errors
    /// [`Error::Gpu`] for too many dispatches or a queue without timestamps.
    pub(crate) fn new(ctx: &GpuContext, dispatches: usize) -> Result<Queries> {
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
        let buffer = |label, usage| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            })
        };
        let resolve = buffer(
            "cqlm profile resolve",
            wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        );
        let readback = buffer(
            "cqlm profile readback",
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
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

    /// Seconds of each dispatch of the last recorded step, in recording order.
    ///
    /// # Errors
    /// [`Error::Gpu`] if mapping the readback fails.
    pub(crate) fn seconds(&self, ctx: &GpuContext) -> Result<Vec<f64>> {
        let mut ticks = vec![0u64; self.count as usize];
        ctx.map_read_into(&self.readback, bytemuck::cast_slice_mut(&mut ticks))?;
        Ok(ticks
            .chunks_exact(2)
            .map(|p| p[1].saturating_sub(p[0]) as f64 * self.period_ns * 1e-9)
            .collect())
    }
}

/// How the recorder runs the ops.
pub(crate) enum Observer<'a> {
    /// One compute pass per run of dispatches, one submit.
    Plain,
    /// As `Plain`, with two timestamp writes around every dispatch (the
    /// dispatches in order must fit the queries) and their resolve.
    Timestamps(&'a Queries),
    /// One submit and wait per op; each dispatch's wall time is appended.
    PerDispatch(&'a mut Vec<f64>),
}

/// Record `ops` as `observer` says, then `finish` (the readout's copies) into the
/// last encoder, and submit. `ops` is any iterator that can be gone over again
/// (to name the kernel of an error), so a decode step records without
/// allocating.
///
/// # Errors
/// [`Error::Gpu`] when the device reports an error (an earlier one, or one
/// that recording the ops raised, named by its kernel: [`blame`]) or waiting
/// on it fails (per-dispatch timing).
pub(crate) fn submit<'a, I>(
    ctx: &GpuContext,
    ops: I,
    observer: Observer<'_>,
    finish: impl FnOnce(&mut wgpu::CommandEncoder),
) -> Result<()>
where
    I: IntoIterator<Item = Op<'a>>,
    I::IntoIter: Clone,
{
    ctx.check_errors()?;
    let ops = ops.into_iter();
    let all = ops.clone();
    let encoder = || {
        ctx.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("cqlm step"),
            })
    };
    match observer {
        Observer::PerDispatch(times) => {
            ctx.wait_idle()?;
            for op in ops {
                let t0 = Instant::now();
                let mut enc = encoder();
                let ran = record(&mut enc, [op], None);
                hand_over(ctx, enc, ran);
                ctx.wait_idle()?;
                if matches!(op, Op::Run(_)) {
                    times.push(t0.elapsed().as_secs_f64());
                }
            }
            let mut enc = encoder();
            finish(&mut enc);
            hand_over(ctx, enc, None);
        }
        Observer::Plain | Observer::Timestamps(_) => {
            let queries = match observer {
                Observer::Timestamps(q) => Some(q),
                _ => None,
            };
            let mut enc = encoder();
            let ran = record(&mut enc, ops, queries);
            if let Some(q) = queries {
                for (k, set) in q.sets.iter().enumerate() {
                    let first = k as u32 * PER_SET;
                    let n = (q.count - first).min(PER_SET);
                    enc.resolve_query_set(set, 0..n, &q.resolve, u64::from(first) * 8);
                }
                enc.copy_buffer_to_buffer(&q.resolve, 0, &q.readback, 0, u64::from(q.count) * 8);
            }
            finish(&mut enc);
            hand_over(ctx, enc, ran);
        }
    }
    if ctx.errors.first().is_some() && !ctx.errors.is_lost() {
        ctx.errors.attribute(blame(ctx, all));
    }
    ctx.check_errors()
}

/// Finish `enc` and hand it to the queue, noting `ran` (its dispatches) as in
/// flight for naming a device loss.
fn hand_over(ctx: &GpuContext, enc: wgpu::CommandEncoder, ran: Option<InFlight>) {
    let commands = enc.finish();
    if ran.is_some() {
        ctx.errors.set_in_flight(ran);
    }
    ctx.queue.submit([commands]);
    if ctx.lose_after_submit.load(Ordering::Relaxed)
        && ctx.lose_after_submit.swap(false, Ordering::Relaxed)
    {
        ctx.device.destroy();
    }
}

/// The first dispatch of `ops` whose recording alone raises a validation or
/// out-of-memory error, as `kernel `NAME` (dispatch I of the submit): ERROR`:
/// each is recorded into its own encoder within error scopes and never
/// submitted. Runs only after a submit raised an error (the device's own
/// message names the encoder, not the kernel). `None` when no single dispatch
/// raises one (an error of the submit as a whole, such as memory running out
/// at the submit: [`super::device_errors::DeviceErrors::attribute`] then
/// names the submit).
fn blame<'a>(ctx: &GpuContext, ops: impl Iterator<Item = Op<'a>>) -> Option<String> {
    let runs = ops.filter_map(|op| match op {
        Op::Run(d) => Some(d),
        Op::Copy { .. } => None,
    });
    for (i, d) in runs.enumerate() {
        let oom = ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let invalid = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        record(&mut enc, [Op::Run(d)], None);
        drop(enc.finish());
        let invalid = pollster::block_on(invalid.pop());
        let oom = pollster::block_on(oom.pop());
        if let Some(e) = invalid.or(oom) {
            return Some(format!(
                "kernel `{}` (dispatch {i} of the submit): {e}",
                d.name
            ));
        }
    }
    None
}

/// Record `ops` into `enc`: each run of dispatches in one compute pass, copies
/// between passes; with `queries`, dispatch `i` between timestamps `2i` and `2i + 1`.
/// Returns the dispatches recorded (`None`: none).
fn record<'a>(
    enc: &mut wgpu::CommandEncoder,
    ops: impl IntoIterator<Item = Op<'a>>,
    queries: Option<&Queries>,
) -> Option<InFlight> {
    let mut ops = ops.into_iter().peekable();
    let mut i = 0;
    let mut ran: Option<InFlight> = None;
    while ops.peek().is_some() {
        if let Some(Op::Run(_)) = ops.peek() {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("cqlm step"),
                timestamp_writes: None,
            });
            while let Some(&Op::Run(d)) = ops.peek() {
                ops.next();
                let r = ran.get_or_insert(InFlight {
                    dispatches: 0,
                    first: d.name,
                    last: d.name,
                });
                r.dispatches += 1;
                r.last = d.name;
                match queries {
                    Some(q) => {
                        let (set, at) = q.slot(2 * i);
                        pass.write_timestamp(set, at);
                        d.record(&mut pass);
                        let (set, at) = q.slot(2 * i + 1);
                        pass.write_timestamp(set, at);
                    }
                    None => d.record(&mut pass),
                }
                i += 1;
            }
        }
        if let Some(Op::Copy {
            src,
            src_offset,
            dst,
            dst_offset,
            bytes,
        }) = ops.next()
        {
            enc.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, bytes);
        }
    }
    ran
}

/// One dispatch's timing in a [`submit_timed`]: its kernel name, byte
/// estimate and seconds.
pub(crate) type Timed = (&'static str, u64, f64);

/// [`submit`] with every dispatch timed: with timestamp queries inside the
/// pass when `timestamps`, else one submit and wait per dispatch (which
/// includes that overhead). Returns each dispatch's timing in order, and with
/// timestamps when the submit returned (before the wait for the queries: the
/// host's share of the step ends there).
///
/// # Errors
/// [`Error::Gpu`] when the queries can't be made or read, or a wait fails.
pub(crate) fn submit_timed(
    ctx: &GpuContext,
    ops: Vec<Op<'_>>,
    timestamps: bool,
    finish: impl FnOnce(&mut wgpu::CommandEncoder),
) -> Result<(Vec<Timed>, Option<Instant>)> {
    let meta: Vec<(&'static str, u64)> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Run(d) => Some((d.name, d.bytes)),
            Op::Copy { .. } => None,
        })
        .collect();
    let (secs, submitted) = if timestamps {
        let q = Queries::new(ctx, meta.len())?;
        submit(ctx, ops, Observer::Timestamps(&q), finish)?;
        let at = Instant::now();
        (q.seconds(ctx)?, Some(at))
    } else {
        let mut secs = Vec::with_capacity(meta.len());
        submit(ctx, ops, Observer::PerDispatch(&mut secs), finish)?;
        (secs, None)
    };
    if secs.len() != meta.len() {
        return Err(Error::Gpu(format!(
            "profile: {} timings for {} dispatches",
            secs.len(),
            meta.len()
        )));
    }
    let timed = meta.into_iter().zip(secs).map(|((n, b), s)| (n, b, s));
    Ok((timed.collect(), submitted))
}
