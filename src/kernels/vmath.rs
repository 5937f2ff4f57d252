//! Slice-wide `exp`, `σ` and `silu` for the step's elementwise work, 8 lanes at a
//! time with AVX2+FMA (16 with AVX-512, the same arithmetic lane by lane) where
//! [`crate::host::simd::CpuSimd::selected`] allows, else the scalar functions of
//! [`super`] (the reference).
//!
//! The vector `exp` is the Cephes single-precision scheme: `n = round(x·log2 e)`,
//! `r = x − n·ln 2` in two parts, a degree-6 polynomial, times `2ⁿ`. Its error is
//! within 2 ulp of the true value on the normal range; beyond it, it returns what
//! `f32::exp` returns (`+∞` above 88.72, `0` below −103.97, NaN for NaN).

use super::{sigmoid, silu};
use crate::host::simd::CpuSimd;

fn vector() -> bool {
    cfg!(target_arch = "x86_64") && CpuSimd::selected() != CpuSimd::Scalar
}

/// Whether the 16-lane forms run (the same lane arithmetic as the 8-lane ones).
fn wide() -> bool {
    cfg!(target_arch = "x86_64") && CpuSimd::selected() == CpuSimd::Avx512
}

/// `x[i] ← exp(x[i])`.
pub fn exp_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: the AVX-512 selection implies AVX-512F (and AVX2, FMA).
        unsafe { x86::exp_slice_512(x) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if vector() {
        // SAFETY: a non-scalar selection implies AVX2 and FMA were detected.
        unsafe { x86::exp_slice(x) };
        return;
    }
    x.iter_mut().for_each(|v| *v = v.exp());
}

/// `x[i] ← ln(x[i])` (the vector form: the Cephes single-precision scheme,
/// within 2 ulp; `−∞` at 0, NaN below it and for NaN, `+∞` at `+∞`).
pub fn ln_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: the AVX-512 selection implies AVX-512F (and AVX2, FMA).
        unsafe { x86::ln_slice_512(x) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if vector() {
        // SAFETY: a non-scalar selection implies AVX2 and FMA were detected.
        unsafe { x86::ln_slice(x) };
        return;
    }
    x.iter_mut().for_each(|v| *v = v.ln());
}

/// `z[i] ← silu(d[i] · z[i])` (the Hadamard MLP's activation).
///
/// # Panics
/// If the lengths differ.
pub fn silu_of_product(z: &mut [f32], d: &[f32]) {
    assert_eq!(z.len(), d.len(), "silu_of_product: lengths");
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: as in exp_in_place.
        unsafe { x86::silu_of_product_512(z, d) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if vector() {
        // SAFETY: as in exp_in_place.
        unsafe { x86::silu_of_product(z, d) };
        return;
    }
    for (v, w) in z.iter_mut().zip(d) {
        *v = silu(w * *v);
    }
}

/// `x[i] ← silu(x[i])`: [`silu_of_product`] with every factor 1, so the same
/// values (`1 · x` is `x`).
pub fn silu_in_place(x: &mut [f32]) {
    const ONES: [f32; 64] = [1.0; 64];
    for c in x.chunks_mut(64) {
        let n = c.len();
        silu_of_product(c, &ONES[..n]);
    }
}

/// `o[i] ← o[i] · σ(g[i])` (the attention output gate).
///
/// # Panics
/// If the lengths differ.
pub fn gate_in_place(o: &mut [f32], g: &[f32]) {
    assert_eq!(o.len(), g.len(), "gate_in_place: lengths");
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: as in exp_in_place.
        unsafe { x86::gate_512(o, g) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if vector() {
        // SAFETY: as in exp_in_place.
        unsafe { x86::gate(o, g) };
        return;
    }
    for (v, w) in o.iter_mut().zip(g) {
        *v *= sigmoid(*w);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f64) -> f64 {
        let b32 = b as f32;
        if a == b32 {
            return 0.0;
        }
        let ulp = (b32.abs() * f32::EPSILON).max(f32::MIN_POSITIVE);
        (a as f64 - b).abs() / ulp as f64
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64_and_keeps_the_edges_of_f32_exp() {
        let mut xs: Vec<f32> = (0..20001).map(|i| -100.0 + i as f32 * 0.01).collect();
        xs.extend([
            88.5,
            88.72,
            88.73,
            100.0,
            -87.0,
            -87.5,
            -103.0,
            -104.0,
            -1000.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.0,
            -0.0,
        ]);
        let mut got = xs.clone();
        exp_in_place(&mut got);
        for (&x, &y) in xs.iter().zip(&got) {
            let want = x.exp();
            if !want.is_finite() || want == 0.0 || want < f32::MIN_POSITIVE {
                assert!(
                    (want.is_nan() && y.is_nan()) || y == want || (y - want).abs() <= 1e-44,
                    "exp({x}) = {y}, f32::exp gives {want}"
                );
                continue;
            }
            let u = ulps(y, (x as f64).exp());
            assert!(u <= 2.0, "exp({x}) = {y}: {u} ulp off");
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_16_lane_forms_equal_the_8_lane_ones_bit_for_bit() {
        if !(std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma"))
        {
            return;
        }
        let mut xs: Vec<f32> = (0..4001).map(|i| -110.0 + i as f32 * 0.05).collect();
        xs.extend([
            88.5,
            88.73,
            -87.5,
            -104.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        let d: Vec<f32> = (0..xs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // SAFETY: the features were detected above.
        unsafe {
            let (mut a, mut b) = (xs.clone(), xs.clone());
            x86::exp_slice(&mut a);
            x86::exp_slice_512(&mut b);
            assert_eq!(bits(&a), bits(&b), "exp");
            let (mut a, mut b) = (xs.clone(), xs.clone());
            x86::silu_of_product(&mut a, &d);
            x86::silu_of_product_512(&mut b, &d);
            assert_eq!(bits(&a), bits(&b), "silu");
            let (mut a, mut b) = (xs.clone(), xs.clone());
            x86::gate(&mut a, &d);
            x86::gate_512(&mut b, &d);
            assert_eq!(bits(&a), bits(&b), "gate");
        }
    }

    #[test]
    fn ln_is_within_two_ulp_of_f64_and_keeps_the_edges_of_f32_ln() {
        let mut xs: Vec<f32> = (0..20001).map(|i| 1e-3 + i as f32 * 0.0137).collect();
        xs.extend((1..200).map(|i| (i as f32 * 0.37).exp2() * 1e-30));
        xs.extend([
            1.0,
            2.0,
            4.0,
            f32::MIN_POSITIVE,
            1e-40,
            1e-45,
            f32::MAX,
            f32::INFINITY,
            0.0,
            -0.0,
            -1.0,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        let mut got = xs.clone();
        ln_in_place(&mut got);
        for (&x, &y) in xs.iter().zip(&got) {
            let want = x.ln();
            if !want.is_finite() {
                assert!(
                    (want.is_nan() && y.is_nan()) || y == want,
                    "ln({x}) = {y}, f32::ln gives {want}"
                );
                continue;
            }
            let u = ulps(y, (x as f64).ln());
            assert!(u <= 2.0, "ln({x}) = {y}: {u} ulp off");
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            let (mut a, mut b) = (xs.clone(), xs.clone());
            // SAFETY: the features were detected above.
            unsafe {
                x86::ln_slice(&mut a);
                x86::ln_slice_512(&mut b);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "the 16-lane ln equals the 8-lane one");
        }
    }

    #[test]
    fn silu_and_gate_match_the_scalar_functions() {
        let n = 1003; // not a multiple of 8: the tail runs the scalar path
        let z: Vec<f32> = (0..n)
            .map(|i| ((i * 37) % 201) as f32 * 0.1 - 10.0)
            .collect();
        let d: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let mut a = z.clone();
        silu_of_product(&mut a, &d);
        let mut b = z.clone();
        gate_in_place(&mut b, &d);
        for i in 0..n {
            let s = silu(d[i] * z[i]);
            assert!((a[i] - s).abs() <= 4e-7 * (1.0 + s.abs()), "silu {i}");
            let g = z[i] * sigmoid(d[i]);
            assert!((b[i] - g).abs() <= 4e-7 * (1.0 + g.abs()), "gate {i}");
        }
    }
}
