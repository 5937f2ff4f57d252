//! One query head attending over the int8 KV cache (SPEC §4.3 step 5).

/// Read-only view of one layer and KV head of the cache.
pub struct KvHeadView<'a> {
    /// `[rows, head_dim]` key codes.
    pub k: &'a [i8],
    /// `[rows, head_dim]` value codes.
    pub v: &'a [i8],
    /// `[rows]` key scales.
    pub k_scale: &'a [f32],
    /// `[rows]` value scales.
    pub v_scale: &'a [f32],
}

/// `o = Σ_p softmax(score)_p · Vscale[p] · Vcode[p]` over the given physical `slots`,
/// with `score_p = (Σ_d q[d]·Kcode[p,d]) · Kscale[p] / sqrt(head_dim)`.
/// `scores` is scratch of at least `slots.len()` entries.
///
/// # Panics
/// If `out.len() != q.len()`, `scores` is too short or a slot is out of the cache.
pub fn attend_head(
    q: &[f32],
    kv: &KvHeadView,
    slots: &[usize],
    scores: &mut [f32],
    out: &mut [f32],
) {
    let d = q.len();
    assert_eq!(out.len(), d);
    let scores = &mut scores[..slots.len()];
    let sqrt_d = (d as f32).sqrt();
    let mut max = f32::NEG_INFINITY;
    for (s, &slot) in scores.iter_mut().zip(slots) {
        let k = &kv.k[slot * d..(slot + 1) * d];
        let dot: f32 = q.iter().zip(k).map(|(a, &b)| a * b as f32).sum();
        *s = dot * kv.k_scale[slot] / sqrt_d;
        max = max.max(*s);
    }
    let mut total = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        total += *s;
    }
    out.fill(0.0);
    for (s, &slot) in scores.iter().zip(slots) {
        let w = s / total * kv.v_scale[slot];
        let v = &kv.v[slot * d..(slot + 1) * d];
        for (o, &c) in out.iter_mut().zip(v) {
            *o += w * c as f32;
        }
    }
}
