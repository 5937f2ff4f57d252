//! Choosing the next token from logits.

/// Index of the largest logit (the first on ties); 0 for an empty slice.
/// NaN logits are never chosen over finite ones.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_and_margin() {
        assert_eq!(argmax(&[0.0, 3.0, -1.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -5.0]), 1);
        assert!((top2_margin(&[1.0, 4.0, 2.5]) - 1.5).abs() < 1e-6);
        assert_eq!(top2_margin(&[1.0]), 0.0);
    }
}
