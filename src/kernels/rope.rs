//! Rotary position embedding on logical positions (SPEC §4.3 step 5).

/// `(cos θ_i, sin θ_i)` for `i < head_dim/2` at logical position `t`, with
/// `θ_i = t · theta^(−2i/head_dim)` computed in f64 and each result rounded to f32.
/// `cos` and `sin` must each have `head_dim/2` entries.
///
/// # Panics
/// If `cos` and `sin` differ in length.
pub fn rope_table(t: u64, theta: f64, head_dim: usize, cos: &mut [f32], sin: &mut [f32]) {
    assert_eq!(cos.len(), sin.len());
    for (i, (c, s)) in cos.iter_mut().zip(sin.iter_mut()).enumerate() {
        let angle = t as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64);
        *c = angle.cos() as f32;
        *s = angle.sin() as f32;
    }
}

/// Rotate one head in place: `(x_i, x_{i+half}) ← (x_i·c − x_{i+half}·s, x_i·s + x_{i+half}·c)`.
///
/// # Panics
/// If `x.len() != 2 · cos.len()`.
pub fn apply_rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    assert_eq!(x.len(), 2 * half);
    let (lo, hi) = x.split_at_mut(half);
    for i in 0..half {
        let (a, b) = (lo[i], hi[i]);
        lo[i] = a * cos[i] - b * sin[i];
        hi[i] = a * sin[i] + b * cos[i];
    }
}
