//! [`super::qk_norm_rope`] with AVX-512: each head's ZCRMS and RoPE in
//! 16-lane registers, the same operations on every value as the plain loops
//! ([`crate::kernels::norm::zcrms_in_place`], [`crate::kernels::rope::apply_rope`]),
//! so the same bits. The plain loops keep a head's squares in eight partial
//! sums (a chain of `head_dim / 8` additions each, then the eight added in
//! order): here the low and high halves of each register of squares are that
//! chain's consecutive terms.

use crate::kernels::norm::EPS;
use std::arch::x86_64::*;

/// Every head (`2 · cos.len()` values, a multiple of 32) of `x` normalised by
/// ZCRMS with gains `w` and rotated by the position's `cos`/`sin`, in place.
/// The caller checked `x.len() % (2 · cos.len()) == 0`, `w.len() == 2 ·
/// cos.len() == 2 · sin.len()` and `cos.len() % 16 == 0`.
#[target_feature(enable = "avx512f,avx512vl,avx2")]
pub(super) unsafe fn norm_rope_heads(x: &mut [f32], w: &[f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    let hd = 2 * half;
    let one = _mm512_set1_ps(1.0);
    let len = hd as f32;
    for head in x.chunks_exact_mut(hd) {
        let p = head.as_mut_ptr();
        // SAFETY: every access below is inside this head (`hd` values) or
        // inside `w` (`hd`), `cos` and `sin` (`half` each), in steps of 16.
        unsafe {
            // The eight partials: chunk 2j is register j's low half, 2j + 1 its high.
            let mut acc = _mm256_setzero_ps();
            for j in 0..hd / 16 {
                let v = _mm512_loadu_ps(p.add(16 * j));
                let sq = _mm512_mul_ps(v, v);
                acc = _mm256_add_ps(acc, _mm512_castps512_ps256(sq));
                let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sq));
                acc = _mm256_add_ps(acc, _mm256_castpd_ps(high));
            }
            let mut parts = [0.0f32; 8];
            _mm256_storeu_ps(parts.as_mut_ptr(), acc);
            let sum: f32 = parts.iter().sum();
            let r = _mm512_set1_ps(1.0 / (sum / len + EPS).sqrt());
            // `(v · r) · (1 + w)` per value, then the rotation of each pair.
            let norm = |at: usize| {
                let g = _mm512_add_ps(one, _mm512_loadu_ps(w.as_ptr().add(at)));
                _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p.add(at)), r), g)
            };
            for j in 0..half / 16 {
                let (a, b) = (norm(16 * j), norm(half + 16 * j));
                let c = _mm512_loadu_ps(cos.as_ptr().add(16 * j));
                let s = _mm512_loadu_ps(sin.as_ptr().add(16 * j));
                let lo = _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s));
                let hi = _mm512_add_ps(_mm512_mul_ps(a, s), _mm512_mul_ps(b, c));
                _mm512_storeu_ps(p.add(16 * j), lo);
                _mm512_storeu_ps(p.add(half + 16 * j), hi);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::norm_rope_heads;
    use crate::kernels::norm::zcrms_in_place;
    use crate::kernels::rope::apply_rope;
    use rand::{Rng, SeedableRng};

    #[test]
    fn the_registers_give_the_plain_loops_bits_and_the_f64_values() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl")) {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        for (hd, heads) in [(32usize, 3usize), (64, 8), (64, 2), (128, 5)] {
            let half = hd / 2;
            let mut x: Vec<f32> = (0..hd * heads)
                .map(|_| rng.random_range(-3.0..3.0))
                .collect();
            // A head of tiny values and one of zeros: ε decides their scale.
            x[..hd].iter_mut().for_each(|v| *v *= 1e-4);
            x[hd..2 * hd].fill(0.0);
            let w: Vec<f32> = (0..hd).map(|_| rng.random_range(-0.5..0.5)).collect();
            let angle: Vec<f64> = (0..half)
                .map(|i| 7.0 * 10000f64.powf(-(i as f64) / half as f64))
                .collect();
            let cos: Vec<f32> = angle.iter().map(|a| a.cos() as f32).collect();
            let sin: Vec<f32> = angle.iter().map(|a| a.sin() as f32).collect();
            let mut want = x.clone();
            for h in want.chunks_exact_mut(hd) {
                zcrms_in_place(h, &w);
                apply_rope(h, &cos, &sin);
            }
            let mut got = vec![f32::NAN; x.len()];
            got.copy_from_slice(&x);
            // SAFETY: the features are checked above; lengths as the contract says.
            unsafe { norm_rope_heads(&mut got, &w, &cos, &sin) };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "head_dim {hd}");
            // Independently in f64: zcrms then the rotation.
            for (h, xh) in x.chunks_exact(hd).enumerate() {
                let ms = xh.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / hd as f64;
                let r = 1.0 / (ms + 1e-6).sqrt();
                let n: Vec<f64> = xh
                    .iter()
                    .zip(&w)
                    .map(|(&v, &g)| v as f64 * r * (1.0 + g as f64))
                    .collect();
                for i in 0..half {
                    let (c, s) = (cos[i] as f64, sin[i] as f64);
                    let lo = n[i] * c - n[i + half] * s;
                    let hi = n[i] * s + n[i + half] * c;
                    for (e, g) in [(lo, got[h * hd + i]), (hi, got[h * hd + half + i])] {
                        assert!(
                            (e - g as f64).abs() <= 1e-5 * (1.0 + e.abs()),
                            "head {h}: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }
}
