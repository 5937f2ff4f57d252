//! Choosing the next token from logits: greedy, or seeded sampling with
//! temperature, top-k, top-p and a repetition penalty.

use crate::error::{Error, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub(crate) use super::select::best_first;
pub use super::select::{argmax, best_candidate, top_k_into};

/// The gap between the largest and second-largest logit (0 for fewer than two).
pub fn top2_margin(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in logits {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    if b.is_finite() {
        a - b
    } else {
        0.0
    }
}

/// Sampling settings. The default is greedy decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (`0`: no limit).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `p` (`1`: no limit).
    pub top_p: f32,
    /// Divide positive logits (multiply negative ones) of recently seen tokens by this (`1`: off).
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Keep only tokens whose probability is at least `min_p` times the most
    /// likely one's (`0`: off; applied after the temperature, like top-p).
    pub min_p: f32,
    /// OpenAI's frequency penalty: subtract `n × frequency_penalty` from the
    /// logit of a token seen `n` times in the last `repeat_last_n` (`0`: off).
    pub frequency_penalty: f32,
    /// OpenAI's presence penalty: subtract it from the logit of every token
    /// seen in the last `repeat_last_n` (`0`: off).
    pub presence_penalty: f32,
    /// Seed of the sampling stream; the same seed gives the same choices.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            min_p: 0.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
        }
    }
}

/// A seeded sampler. Reusable across steps without allocating after the first.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
    scratch: Vec<(f32, u32)>,
    adjusted: Vec<f32>,
    seen: Vec<u32>,
}

impl Sampler {
    /// A sampler for `cfg`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a negative or non-finite temperature, `top_p`
    /// outside `(0, 1]`, `min_p` outside `[0, 1]`, a repeat penalty that is not
    /// finite and positive, or a frequency or presence penalty outside `[-2, 2]`.
    pub fn new(cfg: SamplerConfig) -> Result<Sampler> {
        if !(cfg.temperature.is_finite() && cfg.temperature >= 0.0) {
            return Err(Error::InvalidArgument(format!(
                "temperature {} is not a finite number >= 0",
                cfg.temperature
            )));
        }
        if !(cfg.top_p > 0.0 && cfg.top_p <= 1.0) {
            return Err(Error::InvalidArgument(format!(
                "top-p {} is not in (0, 1]",
                cfg.top_p
            )));
        }
        if !(cfg.repeat_penalty.is_finite() && cfg.repeat_penalty > 0.0) {
            return Err(Error::InvalidArgument(format!(
                "repeat penalty {} is not a finite number > 0",
                cfg.repeat_penalty
            )));
        }
        if !(0.0..=1.0).contains(&cfg.min_p) {
            return Err(Error::InvalidArgument(format!(
                "min-p {} is not in [0, 1]",
                cfg.min_p
            )));
        }
        for (name, v) in [
            ("frequency penalty", cfg.frequency_penalty),
            ("presence penalty", cfg.presence_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(Error::InvalidArgument(format!(
                    "{name} {v} is not in [-2, 2]"
                )));
            }
        }
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            scratch: Vec::new(),
            adjusted: Vec::new(),
            seen: Vec::new(),
        })
    }

    /// Greedy decoding.
    pub fn greedy() -> Sampler {
        Sampler {
            rng: ChaCha8Rng::seed_from_u64(0),
            cfg: SamplerConfig::default(),
            scratch: Vec::new(),
            adjusted: Vec::new(),
            seen: Vec::new(),
        }
    }

    /// Whether the logits are used as they come: no penalty looks at the history.
    fn unpenalized(&self) -> bool {
        let c = &self.cfg;
        c.repeat_penalty == 1.0 && c.frequency_penalty == 0.0 && c.presence_penalty == 0.0
    }

    /// Whether [`Sampler::sample`] is plain argmax of the logits (temperature 0 or
    /// top-k 1, no penalty), so an engine may pick on the device.
    pub fn is_greedy(&self) -> bool {
        let c = &self.cfg;
        self.unpenalized() && (c.temperature == 0.0 || c.top_k == 1)
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Choose the next token from `logits`, given the tokens seen so far (`history`,
    /// oldest first) for the repetition penalty.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let c = &self.cfg;
        self.adjusted.clear();
        self.adjusted.extend_from_slice(logits);
        if !self.unpenalized() {
            // Once per distinct token of the last `repeat_last_n`, with its count.
            let start = history.len().saturating_sub(c.repeat_last_n);
            self.seen.clear();
            self.seen.extend_from_slice(&history[start..]);
            self.seen.sort_unstable();
            for run in self.seen.chunk_by(|a, b| a == b) {
                if let Some(v) = self.adjusted.get_mut(run[0] as usize) {
                    if c.repeat_penalty != 1.0 {
                        *v = if *v > 0.0 {
                            *v / c.repeat_penalty
                        } else {
                            *v * c.repeat_penalty
                        };
                    }
                    *v -= run.len() as f32 * c.frequency_penalty + c.presence_penalty;
                }
            }
        }
        if c.temperature == 0.0 || c.top_k == 1 {
            return argmax(&self.adjusted);
        }
        // Candidates by logit, best first, ties by lower id (NaN dropped). With a
        // top-k, only the k best are selected (linear time) and then sorted.
        let k = if c.top_k > 0 { c.top_k } else { usize::MAX };
        top_k_into(&self.adjusted, k, &mut self.scratch);
        self.draw_from_candidates()
    }

    /// With this sampler, [`Sampler::sample`] only looks at the `k` largest logits
    /// (top-k `k >= 2`, temperature > 0, no penalty): an engine may then
    /// hand over just those, e.g. from a [`crate::Readout::TopK`] step.
    pub fn top_k_only(&self) -> Option<usize> {
        let c = &self.cfg;
        (self.unpenalized() && c.temperature > 0.0 && c.top_k >= 2).then_some(c.top_k)
    }

    /// [`Sampler::sample`] given only the `top_k` largest logits as `(logit, id)`
    /// pairs in any order (ties at the cut resolved toward lower ids): the same draw
    /// as from the full logits when [`Sampler::top_k_only`] is `Some`.
    pub fn sample_top_k(&mut self, candidates: &[(f32, u32)]) -> u32 {
        self.scratch.clear();
        self.scratch
            .extend(candidates.iter().copied().filter(|(v, _)| !v.is_nan()));
        self.scratch.sort_unstable_by(best_first);
        if self.cfg.top_k > 0 {
            self.scratch.truncate(self.cfg.top_k);
        }
        self.draw_from_candidates()
    }

    /// With this sampler, [`Sampler::sample`] is a top-p cut without a top-k
    /// (temperature > 0, top-p < 1, no top-k, no min-p, no penalty): its
    /// temperature, for a [`crate::Readout::Nucleus`] step; then
    /// [`Sampler::sample_nucleus`] can usually draw from the largest logits alone.
    pub fn top_p_only(&self) -> Option<f32> {
        let c = &self.cfg;
        let plain = self.unpenalized() && c.min_p == 0.0;
        (plain && c.temperature > 0.0 && c.top_k == 0 && c.top_p < 1.0).then_some(c.temperature)
    }

    /// [`Sampler::sample`] for a [`Sampler::top_p_only`] sampler, given only the
    /// largest logits as `(logit, id)` pairs (any order; the top of the vocabulary,
    /// ties at the cut toward lower ids) and the softmax denominator
    /// `total ≈ Σ exp((logit − max) / temperature)` over the whole vocabulary,
    /// known to a relative error of at most `rel_err`.
    ///
    /// Returns the token [`Sampler::sample`] would draw from the full logits when
    /// the candidates reach the top-p mass and the denominator's uncertainty
    /// cannot move the cut. Otherwise (`None`, no randomness consumed) the caller
    /// must draw with [`Sampler::sample`] from the full logits.
    pub fn sample_nucleus(
        &mut self,
        candidates: &[(f32, u32)],
        total: f64,
        rel_err: f64,
    ) -> Option<u32> {
        let c = &self.cfg;
        if self.top_p_only().is_none() || !(total.is_finite() && total > 0.0) {
            return None;
        }
        self.scratch.clear();
        self.scratch
            .extend(candidates.iter().copied().filter(|(v, _)| !v.is_nan()));
        self.scratch.sort_unstable_by(best_first);
        let m = self.scratch.first()?.0;
        for e in self.scratch.iter_mut() {
            e.0 = ((e.0 - m) / c.temperature).exp();
        }
        // The cut is where the running mass first reaches top_p · total; it is
        // decided only if no prefix lands inside the uncertainty band.
        let p = c.top_p as f64;
        let (lo, hi) = (p * total * (1.0 - rel_err), p * total * (1.0 + rel_err));
        let mut acc = 0.0f64;
        let mut keep = None;
        for (i, e) in self.scratch.iter().enumerate() {
            acc += e.0 as f64;
            if acc >= lo {
                keep = (acc >= hi).then_some(i + 1);
                break;
            }
        }
        self.scratch.truncate(keep?);
        let total = self.scratch.iter().map(|e| e.0 as f64).sum();
        Some(self.draw(total))
    }

    /// The softmax at the temperature, the top-p and min-p cuts and the draw over
    /// `self.scratch` (sorted best first, at most `top_k` long).
    fn draw_from_candidates(&mut self) -> u32 {
        let c = &self.cfg;
        if self.scratch.is_empty() {
            return 0;
        }
        // Softmax at the temperature (max subtracted), then the top-p cut.
        let m = self.scratch[0].0;
        let mut total = 0.0f64;
        for e in self.scratch.iter_mut() {
            e.0 = ((e.0 - m) / c.temperature).exp();
            total += e.0 as f64;
        }
        if c.top_p < 1.0 {
            let mut acc = 0.0f64;
            let mut keep = self.scratch.len();
            for (i, e) in self.scratch.iter().enumerate() {
                acc += e.0 as f64 / total;
                if acc >= c.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            self.scratch.truncate(keep);
            total = self.scratch.iter().map(|e| e.0 as f64).sum();
        }
        if c.min_p > 0.0 {
            // The weights are relative to the most likely token's (1): keep
            // the prefix at or above min_p.
            let keep = self.scratch.partition_point(|e| e.0 >= c.min_p).max(1);
            self.scratch.truncate(keep);
            total = self.scratch.iter().map(|e| e.0 as f64).sum();
        }
        self.draw(total)
    }

    /// Draw from `self.scratch` (weights, best first) whose weights sum to `total`.
    fn draw(&mut self, total: f64) -> u32 {
        let mut r = self.rng.random::<f64>() * total;
        for e in &self.scratch {
            r -= e.0 as f64;
            if r < 0.0 {
                return e.1;
            }
        }
        self.scratch.last().map_or(0, |e| e.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sampler as first written: a stable sort of the whole vocabulary.
    fn sample_by_full_sort(cfg: &SamplerConfig, rng: &mut ChaCha8Rng, logits: &[f32]) -> u32 {
        let mut v: Vec<(f32, u32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &x)| (x, i as u32))
            .collect();
        v.sort_by(|a, b| b.0.total_cmp(&a.0));
        v.retain(|(x, _)| !x.is_nan());
        if cfg.top_k > 0 {
            v.truncate(cfg.top_k);
        }
        let m = v[0].0;
        let mut total = 0.0f64;
        for e in v.iter_mut() {
            e.0 = ((e.0 - m) / cfg.temperature).exp();
            total += e.0 as f64;
        }
        if cfg.top_p < 1.0 {
            let mut acc = 0.0f64;
            let mut keep = v.len();
            for (i, e) in v.iter().enumerate() {
                acc += e.0 as f64 / total;
                if acc >= cfg.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            v.truncate(keep);
            total = v.iter().map(|e| e.0 as f64).sum();
        }
        let mut r = rng.random::<f64>() * total;
        for e in &v {
            r -= e.0 as f64;
            if r < 0.0 {
                return e.1;
            }
        }
        v.last().map_or(0, |e| e.1)
    }

    #[test]
    fn top_k_selection_draws_what_a_full_sort_draws() {
        // Coarse logits (many ties, some NaN) and every mix of settings: the same
        // seed must give the same token as sorting the whole vocabulary.
        let mut gen = ChaCha8Rng::seed_from_u64(5);
        for round in 0..200 {
            let n = 50 + round * 7;
            let logits: Vec<f32> = (0..n)
                .map(|i| {
                    if i % 37 == 5 {
                        f32::NAN
                    } else {
                        (gen.random_range(0..20) as f32) * 0.5
                    }
                })
                .collect();
            let cfg = SamplerConfig {
                temperature: [0.5f32, 1.0, 2.0][round % 3],
                top_k: [0usize, 1, 3, 10, 40, n + 5][round % 6],
                top_p: [1.0f32, 0.9, 0.5][round % 3],
                seed: round as u64,
                ..Default::default()
            };
            let mut s = Sampler::new(cfg.clone()).unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(round as u64);
            for _ in 0..3 {
                let want = if cfg.top_k == 1 {
                    argmax(&logits)
                } else {
                    sample_by_full_sort(&cfg, &mut rng, &logits)
                };
                assert_eq!(s.sample(&logits, &[]), want, "round {round} {cfg:?}");
            }
        }
    }

    #[test]
    fn nucleus_draws_what_the_full_logits_draw_or_declines() {
        // Top-p without top-k from the 256 best logits and a softmax denominator
        // known to a relative error: whenever it decides, the same token as the
        // full-logits draw with the same seed; when it declines it consumes no
        // randomness (the next draws still agree). Sharp and flat distributions,
        // exact and perturbed denominators.
        let mut gen = ChaCha8Rng::seed_from_u64(9);
        let (mut decided, mut declined) = (0, 0);
        for round in 0..300 {
            let n = [100usize, 1000, 5000][round % 3];
            let scale = [0.5f32, 3.0, 12.0][(round / 3) % 3];
            let logits: Vec<f32> = (0..n)
                .map(|_| gen.random_range(-1.0f32..1.0) * scale)
                .collect();
            let cfg = SamplerConfig {
                temperature: [0.7f32, 1.0, 1.5][round % 3],
                top_p: [0.5f32, 0.9, 0.99][(round / 9) % 3],
                seed: round as u64,
                ..Default::default()
            };
            let mut full = Sampler::new(cfg.clone()).unwrap();
            let mut part = Sampler::new(cfg.clone()).unwrap();
            assert_eq!(part.top_p_only(), Some(cfg.temperature));
            let mut cands = Vec::new();
            top_k_into(&logits, 256, &mut cands);
            let m = cands[0].0;
            let exact: f64 = logits
                .iter()
                .map(|&v| ((v - m) / cfg.temperature).exp() as f64)
                .sum();
            let rel_err = 1e-4;
            let total = exact * (1.0 + [0.0, 0.9, -0.9][round % 3] * rel_err);
            for _ in 0..3 {
                let want = full.sample(&logits, &[]);
                match part.sample_nucleus(&cands, total, rel_err) {
                    Some(got) => {
                        assert_eq!(got, want, "round {round} {cfg:?}");
                        decided += 1;
                    }
                    None => {
                        assert_eq!(part.sample(&logits, &[]), want, "round {round}");
                        declined += 1;
                    }
                }
            }
        }
        eprintln!("decided {decided}, declined {declined}");
        assert!(
            decided > 300 && declined > 20,
            "decided {decided}, declined {declined}"
        );
        // Samplers with a top-k, greedy or a penalty are not top-p-only.
        for cfg in [
            SamplerConfig {
                temperature: 1.0,
                top_k: 5,
                top_p: 0.9,
                ..Default::default()
            },
            SamplerConfig {
                temperature: 0.0,
                top_p: 0.9,
                ..Default::default()
            },
            SamplerConfig {
                temperature: 1.0,
                top_p: 0.9,
                repeat_penalty: 1.1,
                ..Default::default()
            },
            SamplerConfig {
                temperature: 1.0,
                top_p: 1.0,
                ..Default::default()
            },
        ] {
            let mut s = Sampler::new(cfg).unwrap();
            assert_eq!(s.top_p_only(), None);
            assert_eq!(s.sample_nucleus(&[(1.0, 3)], 1.0, 0.0), None);
        }
    }

    #[test]
    fn argmax_and_margin() {
        assert_eq!(argmax(&[0.0, 3.0, -1.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -5.0]), 1);
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 0);
        // Against the definition as one scalar pass, over lengths around the
        // chunks, with ties, NaN and −∞ sprinkled in.
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        for len in (0..70).chain([4103, 32000]) {
            for _ in 0..20 {
                let x: Vec<f32> = (0..len)
                    .map(|_| match rng.random_range(0..10) {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 => 1.5,
                        _ => rng.random_range(-3.0f32..1.5),
                    })
                    .collect();
                let mut want = (0usize, f32::NEG_INFINITY);
                for (i, &v) in x.iter().enumerate() {
                    if v > want.1 {
                        want = (i, v);
                    }
                }
                assert_eq!(argmax(&x), want.0 as u32, "len {len}: {x:?}");
            }
        }
        assert!((top2_margin(&[1.0, 4.0, 2.5]) - 1.5).abs() < 1e-6);
        assert_eq!(top2_margin(&[1.0]), 0.0);
    }
}
