//! [`StepHooks`]: what watches a step or a prefill chunk besides its arithmetic:
//! the optional [`Probe`], the kernel [`Clock`] of a timed step, and the
//! non-finite tracking that names the first NaN or infinity.

use super::prep::ChunkPrep;
use crate::cq::CqMatrix;
use crate::engine::profile::{bytes, KernelTimer};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

/// Receives named intermediate tensors of a step (for parity tools and tests).
/// `layer` is `None` for tensors outside the layer loop. Names: `x0`, `engram.e`,
/// `engram.value.{s}`, `engram.key.{s}`, and per layer `u`, `block_in`, `q`, `k`, `v`
/// (after ZCRMS and RoPE for q/k), `attn_o` (gated head outputs), `after_attn`,
/// `mlp_out`, `update`, `route` (16 values), `lanes` (4·hidden, after the layer),
/// and `logits`.
pub trait Probe {
    /// Called with each tensor as soon as it is final.
    fn tensor(&mut self, name: &str, layer: Option<usize>, data: &[f32]);
}

/// The hooks of one step or one prefill chunk. Every tensor goes through
/// [`StepHooks::rows`] in the order the step computes them, so the first
/// non-finite one recorded is what one step per token would name: the first bad
/// tensor of the first bad position (one scan of each activation, small beside
/// the matvecs).
pub(super) struct StepHooks<'a> {
    probe: Option<&'a mut dyn Probe>,
    /// The kernel clock (a no-op without a timer).
    pub(super) clock: Clock<'a>,
    /// The first non-finite tensor: (position, name as the error reports it).
    bad: Option<(u64, String)>,
}

impl<'a> StepHooks<'a> {
    /// Hooks with an optional probe and an optional kernel timer.
    pub(super) fn new(
        probe: Option<&'a mut dyn Probe>,
        timer: Option<&'a mut dyn KernelTimer>,
    ) -> Self {
        StepHooks {
            probe,
            clock: Clock::new(timer),
            bad: None,
        }
    }

    /// Whether a probe listens (tensors only it needs can then be skipped).
    pub(super) fn is_probed(&self) -> bool {
        self.probe.is_some()
    }

    /// Whether a kernel timer listens.
    pub(super) fn is_timed(&self) -> bool {
        self.clock.timer.is_some()
    }

    /// Tensor `name` (of `layer`) of the positions `t0, t0 + 1, …`, one row of
    /// width `w` each (`data.len()` for one position): records the first row
    /// holding a NaN or an infinity unless an earlier position is recorded
    /// already, and hands the tensor (all its rows) to the probe. `name` is
    /// formatted only when it is needed.
    pub(super) fn rows(
        &mut self,
        t0: u64,
        name: impl std::fmt::Display,
        layer: Option<usize>,
        data: &[f32],
        w: usize,
    ) {
        let limit = self.bad.as_ref().map_or(data.len() / w.max(1), |(p, _)| {
            p.saturating_sub(t0) as usize
        });
        let first = first_non_finite(data, w.max(1), limit);
        self.record(t0, first, name, layer, data);
    }

    /// [`StepHooks::rows`] of a tensor whose rows the pool parts that wrote
    /// them have scanned already, into `scan` (each row while it was hot, the
    /// parts at once, instead of one scan of the whole tensor here).
    pub(super) fn rows_scanned(
        &mut self,
        t0: u64,
        name: impl std::fmt::Display,
        layer: Option<usize>,
        data: &[f32],
        scan: &RowScan,
    ) {
        let first = Some(scan.first()).filter(|&t| {
            t != usize::MAX && self.bad.as_ref().is_none_or(|(p, _)| t0 + (t as u64) < *p)
        });
        self.record(t0, first, name, layer, data);
    }

    /// Record row `first` (if any, already known to precede what is recorded)
    /// as the first non-finite one, then hand the tensor to the probe.
    fn record(
        &mut self,
        t0: u64,
        first: Option<usize>,
        name: impl std::fmt::Display,
        layer: Option<usize>,
        data: &[f32],
    ) {
        if let Some(t) = first {
            let tensor = match layer {
                Some(l) => format!("layer {l} {name}"),
                None => name.to_string(),
            };
            self.bad = Some((t0 + t as u64, tensor));
        }
        if let Some(p) = self.probe.as_deref_mut() {
            p.tensor(&name.to_string(), layer, data);
        }
    }

    /// [`Error::NonFinite`] for the first non-finite tensor recorded, if any.
    pub(super) fn check(&self) -> Result<()> {
        match &self.bad {
            None => Ok(()),
            Some((position, tensor)) => Err(Error::NonFinite {
                tensor: tensor.clone(),
                position: *position,
            }),
        }
    }
}

/// The first row of one tensor that holds a NaN or an infinity, as the pool
/// parts writing its rows find them ([`RowScan::note`] each row as it is
/// written), for [`StepHooks::rows_scanned`].
#[derive(Debug)]
pub(super) struct RowScan(AtomicUsize);

impl RowScan {
    /// No bad row yet.
    pub(super) fn new() -> Self {
        RowScan(AtomicUsize::new(usize::MAX))
    }

    /// Row `t` of the tensor is `row`: remember `t` if it holds a non-finite
    /// value and no earlier row noted does.
    pub(super) fn note(&self, t: usize, row: &[f32]) {
        if first_non_finite(row, row.len().max(1), 1).is_some() {
            self.0.fetch_min(t, Relaxed);
        }
    }

    /// The first bad row noted, `usize::MAX` if none.
    fn first(&self) -> usize {
        self.0.load(Relaxed)
    }
}

/// Kernel-boundary clock of a timed step: every method is a no-op without a timer.
pub(super) struct Clock<'a> {
    timer: Option<&'a mut dyn KernelTimer>,
    last: Option<Instant>,
}

impl<'a> Clock<'a> {
    fn new(timer: Option<&'a mut dyn KernelTimer>) -> Self {
        let last = timer.as_ref().map(|_| Instant::now());
        Clock { timer, last }
    }

    /// Start the next kernel now (the time since the last boundary is not reported).
    pub(super) fn mark(&mut self) {
        if self.timer.is_some() {
            self.last = Some(Instant::now());
        }
    }

    /// Kernel `name` ran from the last boundary until now.
    pub(super) fn lap(&mut self, name: &'static str, bytes: impl FnOnce() -> u64) {
        if let Some(t) = self.timer.as_deref_mut() {
            let now = Instant::now();
            let secs = self.last.map_or(0.0, |t0| (now - t0).as_secs_f64());
            t.kernel(name, secs, bytes());
            self.last = Some(now);
        }
    }

    /// A product of `parts` (matrices and their rows) for `n` inputs ran from
    /// the last boundary until now (named by its first part's width).
    pub(super) fn lap_product(&mut self, parts: &[(&CqMatrix, std::ops::Range<usize>)], n: usize) {
        let Some((m, _)) = parts.first() else {
            return;
        };
        self.lap(bytes::matvec_name(m.bits()), || {
            let input = m.padded() as u64 * 4;
            parts
                .iter()
                .map(|(m, r)| {
                    bytes::matvec_dispatch(
                        r.len(),
                        m.row_bytes(),
                        m.groups(),
                        m.bits(),
                        1,
                        n,
                        input,
                    )
                })
                .sum()
        });
    }

    /// When timed: fill `prep` for every matrix of `mats` now from the `n` inputs
    /// of `xs` and report it as the GPU's `prepare` of inputs of `len` values
    /// (`lanes` of them, with a gain when `gain`), so the matvecs after time only
    /// the matvec, as on the GPU where prepare is its own dispatch. The prepares
    /// count once per distinct (group, padded), as on the GPU.
    ///
    /// # Errors
    /// [`Error::Alloc`] if `prep` can't grow.
    pub(super) fn prepare(
        &mut self,
        prep: &mut ChunkPrep,
        (xs, n): (&[f32], usize),
        mats: &[&CqMatrix],
        (len, lanes, gain): (usize, usize, bool),
    ) -> Result<()> {
        if self.timer.is_none() {
            return Ok(());
        }
        for m in mats {
            prep.prime(xs, n, m)?;
        }
        self.lap("prepare", || {
            let mut seen: Vec<(usize, usize)> = Vec::new();
            let mut total = 0;
            for m in mats {
                let key = (m.group(), m.padded());
                if !seen.contains(&key) {
                    seen.push(key);
                    total += n as u64 * bytes::prepare(len, lanes, gain, m.padded());
                }
            }
            total
        });
        Ok(())
    }
}

crate::host::simd::simd_fn! {
    /// The first of the first `limit` rows (of width `w`) of `data` that holds
    /// a NaN or an infinity: a branch-free scan per row, vectorized (the
    /// largest magnitude's bits reach the all-ones exponent exactly when one
    /// value is not finite: an `and` and an integer `max` a register).
    fn first_non_finite(data: &[f32], w: usize, limit: usize) -> Option<usize> {
        const INF: u32 = 0x7f80_0000;
        data.chunks_exact(w)
            .take(limit)
            .position(|r| r.iter().fold(0, |m: u32, v| m.max(v.to_bits() & 0x7fff_ffff)) >= INF)
    }
}

#[cfg(test)]
mod tests {
    use super::{first_non_finite, RowScan, StepHooks};
    use crate::error::Error;

    #[test]
    fn scanned_rows_name_the_first_bad_position_then_the_first_tensor() {
        // Rows noted from several threads: the earliest bad one counts.
        let w = 8;
        let mut data = vec![1.0f32; 6 * w];
        data[4 * w + 3] = f32::INFINITY;
        data[2 * w] = f32::NAN;
        let scan = RowScan::new();
        std::thread::scope(|s| {
            for part in 0..3 {
                let (scan, data) = (&scan, &data);
                s.spawn(move || {
                    for t in (part..6).step_by(3) {
                        scan.note(t, &data[t * w..(t + 1) * w]);
                    }
                });
            }
        });
        let named = |hooks: &StepHooks| match hooks.check() {
            Err(Error::NonFinite { tensor, position }) => Some((tensor, position)),
            _ => None,
        };
        // Alone: row 2 of a chunk starting at position 10.
        let mut hooks = StepHooks::new(None, None);
        hooks.rows_scanned(10, "a", Some(1), &data, &scan);
        assert_eq!(named(&hooks), Some(("layer 1 a".into(), 12)));
        // After a scanned tensor bad at an earlier position: that one stays.
        let mut hooks = StepHooks::new(None, None);
        let mut early = vec![1.0f32; 6 * w];
        early[w + 1] = f32::NAN;
        hooks.rows(10, "first", None, &early, w);
        hooks.rows_scanned(10, "a", Some(1), &data, &scan);
        assert_eq!(named(&hooks), Some(("first".into(), 11)));
        // A later tensor bad at the same position does not replace it, nor
        // does a clean scan.
        let mut hooks = StepHooks::new(None, None);
        hooks.rows_scanned(10, "a", Some(1), &data, &scan);
        hooks.rows_scanned(10, "b", Some(1), &data, &scan);
        hooks.rows_scanned(10, "c", Some(1), &data, &RowScan::new());
        assert_eq!(named(&hooks), Some(("layer 1 a".into(), 12)));
    }

    #[test]
    fn the_scan_finds_the_first_row_with_a_nan_or_an_infinity() {
        // Finite extremes never count; each non-finite kind does, wherever it
        // sits in a row of 19 (a register's tail included).
        let finite = [f32::MAX, -f32::MAX, f32::MIN_POSITIVE / 2.0, -0.0, 1.0];
        let bad = [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        let w = 19;
        for &b in &bad {
            for at in [0, 7, 8, 18] {
                let mut data: Vec<f32> = (0..4 * w).map(|i| finite[i % finite.len()]).collect();
                assert_eq!(first_non_finite(&data, w, 4), None);
                data[2 * w + at] = b;
                assert_eq!(first_non_finite(&data, w, 4), Some(2), "{b} at {at}");
                assert_eq!(first_non_finite(&data, w, 2), None, "past the limit");
                data[w + at] = b;
                assert_eq!(first_non_finite(&data, w, 4), Some(1), "{b} at {at}");
            }
        }
    }
}
