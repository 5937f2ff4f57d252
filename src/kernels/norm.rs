//! `rms_unit` and `zcrms` (SPEC §0).

/// SPEC §0 `ε`.
pub const EPS: f32 = 1e-6;

/// `1 / sqrt(mean(x²) + ε)` in f32 (eight partial sums, then added in order).
pub fn inv_rms(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for k in 0..8 {
            acc[k] += c[k] * c[k];
        }
    }
    for (k, v) in chunks.remainder().iter().enumerate() {
        acc[k] += v * v;
    }
    let sum: f32 = acc.iter().sum();
    1.0 / (sum / x.len() as f32 + EPS).sqrt()
}

/// `out = rms_unit(x) = x / sqrt(mean(x²) + ε)`.
///
/// # Panics
/// If `out.len() != x.len()`.
pub fn rms_unit_into(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len());
    let r = inv_rms(x);
    for (o, v) in out.iter_mut().zip(x) {
        *o = v * r;
    }
}

/// `out = zcrms(x, w) = rms_unit(x) ⊙ (1 + w)`.
///
/// # Panics
/// If the three lengths differ.
pub fn zcrms_into(x: &[f32], w: &[f32], out: &mut [f32]) {
    assert!(x.len() == out.len() && w.len() == x.len());
    let r = inv_rms(x);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * r * (1.0 + g);
    }
}

/// In place: `x ← zcrms(x, w)`.
///
/// # Panics
/// If the lengths differ.
pub fn zcrms_in_place(x: &mut [f32], w: &[f32]) {
    assert_eq!(x.len(), w.len());
    let r = inv_rms(x);
    for (v, g) in x.iter_mut().zip(w) {
        *v = *v * r * (1.0 + g);
    }
}
