//! Rotary position embedding on logical positions (SPEC §4.3 step 5).

/// `(cos θ_i, sin θ_i)` for `i < head_dim/2` at logical position `t`, with
/// `θ_i = t · theta^(−2i/head_dim)` computed in f64 and each result rounded to f32.
/// `cos` and `sin` must each have `head_dim/2` entries.
///
/// # Panics
/// If `cos` and `sin` differ in length.
pub fn rope_table(t: u64, theta: f64, head_dim: usize, cos: &mut [f32], sin: &mut [f32]) {
    assert_eq!(cos.len(), sin.len());
    let freqs: Vec<f64> = rope_freqs(theta, head_dim).take(cos.len()).collect();
    rope_table_at(t, &freqs, cos, sin);
}

/// `theta^(−2i/head_dim)` for `i = 0, 1, …` (f64): the frequencies of
/// [`rope_table`], the same for every position.
pub fn rope_freqs(theta: f64, head_dim: usize) -> impl Iterator<Item = f64> {
    (0..).map(move |i: usize| theta.powf(-2.0 * i as f64 / head_dim as f64))
}

/// [`rope_table`] from its frequencies ([`rope_freqs`], one per entry of
/// `cos` and `sin`): `θ_i = t · freqs[i]` in f64, the same values.
///
/// # Panics
/// If `cos`, `sin` and `freqs` differ in length.
pub fn rope_table_at(t: u64, freqs: &[f64], cos: &mut [f32], sin: &mut [f32]) {
    assert!(cos.len() == sin.len() && freqs.len() == cos.len());
    for ((c, s), f) in cos.iter_mut().zip(sin.iter_mut()).zip(freqs) {
        let angle = t as f64 * f;
        *c = angle.cos() as f32;
        *s = angle.sin() as f32;
    }
}

/// Rotate one head in place: `(x_i, x_{i+half}) ← (x_i·c − x_{i+half}·s, x_i·s + x_{i+half}·c)`.
///
/// # Panics
/// If `x.len() != 2 · cos.len()` or `sin` and `cos` differ in length.
#[inline]
pub fn apply_rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    assert!(
        x.len() == 2 * half && sin.len() == half,
        "apply_rope: lengths"
    );
    let (lo, hi) = x.split_at_mut(half);
    for (((l, h), c), s) in lo.iter_mut().zip(hi.iter_mut()).zip(cos).zip(sin) {
        let (a, b) = (*l, *h);
        *l = a * c - b * s;
        *h = a * s + b * c;
    }
}
