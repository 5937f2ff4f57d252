//! Small statistics shared by the tools and tests.

/// The median of `v` (the mean of the two middle values for an even count), with
/// NaN ordered last; `NaN` for an empty slice. Sorts `v` in place.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn odd_even_and_empty() {
        assert_eq!(super::median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(super::median(&mut []).is_nan());
    }
}
