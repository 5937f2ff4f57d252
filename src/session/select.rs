//! Selecting among logits without sampling: the greedy choice ([`argmax`],
//! vectorized; [`best_candidate`] among candidates) and the largest logits
//! ([`top_k_into`]), in the one order every readout uses ([`best_first`]).

/// Index of the largest logit (the first on ties); 0 for an empty slice or
/// one with no logit above −∞. NaN logits are never chosen over finite ones.
/// Two vectorized passes: the maximum, then the first logit equal to it.
pub fn argmax(logits: &[f32]) -> u32 {
    let max = max_logit(logits);
    if max == f32::NEG_INFINITY {
        return 0;
    }
    first_equal(logits, max) as u32
}

/// Lanes of [`max_logit`]'s partial maxima and [`first_equal`]'s chunks.
const LANES: usize = 16;

crate::host::simd::simd_fn! {
    /// The largest of `x` (−∞ for none; NaN is skipped: `max` keeps the
    /// running maximum when the value is NaN), in 16 partial maxima.
    fn max_logit(x: &[f32]) -> f32 {
        let keep = |m: f32, v: f32| if v > m { v } else { m };
        let mut m = [f32::NEG_INFINITY; LANES];
        let mut chunks = x.chunks_exact(LANES);
        for c in &mut chunks {
            for (m, &v) in m.iter_mut().zip(c) {
                *m = keep(*m, v);
            }
        }
        for &v in chunks.remainder() {
            m[0] = keep(m[0], v);
        }
        m.into_iter().fold(f32::NEG_INFINITY, keep)
    }
}

crate::host::simd::simd_fn! {
    /// The index of the first value of `x` equal to `v` (`x.len()` if none),
    /// a chunk of 16 compared at once.
    fn first_equal(x: &[f32], v: f32) -> usize {
        for (k, c) in x.chunks(LANES).enumerate() {
            if c.iter().fold(false, |hit, &y| hit | (y == v)) {
                return k * LANES + c.iter().position(|&y| y == v).unwrap_or(0);
            }
        }
        x.len()
    }
}

/// The greedy choice among `(logit, id)` candidates in any order: the largest
/// logit, the lowest id among equals, as [`argmax`] over the logits they came
/// from (NaN skipped; 0 for no candidate).
pub fn best_candidate(candidates: &[(f32, u32)]) -> u32 {
    candidates
        .iter()
        .filter(|(v, _)| !v.is_nan())
        .min_by(|a, b| best_first(a, b))
        .map_or(0, |c| c.1)
}

/// Order of candidates: larger logit first, then lower id.
pub(crate) fn best_first(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// The `k` largest logits as `(logit, id)`, best first, ties toward lower ids (all
/// of them when `k` is at least their number), into `out`. NaN and −∞ (a masked
/// token) are never candidates.
pub fn top_k_into(logits: &[f32], k: usize, out: &mut Vec<(f32, u32)>) {
    out.clear();
    out.extend(
        logits
            .iter()
            .enumerate()
            .filter(|(_, &v)| v > f32::NEG_INFINITY)
            .map(|(i, &v)| (v, i as u32)),
    );
    if k == 0 {
        out.clear();
        return;
    }
    if k < out.len() {
        out.select_nth_unstable_by(k - 1, best_first);
        out.truncate(k);
    }
    out.sort_unstable_by(best_first);
}
