//! The int8 KV cache rules (SPEC §4.3 step 5): physical slots and per-vector quantization.

/// Physical cache row of logical position `t`: `t` inside the sink, else
/// `sink + (t − sink) mod window`.
///
/// # Panics
/// If `window == 0`.
pub fn physical_slot(t: u64, sink: usize, window: usize) -> usize {
    let sink64 = sink as u64;
    if t < sink64 {
        t as usize
    } else {
        sink + ((t - sink64) % window as u64) as usize
    }
}

/// Quantize `x` to int8 codes with one f32 scale: `scale = max(1e-12, max|x|) / 127`,
/// `code = clamp(round_half_to_even(x / scale), −127, 127)`. Returns the scale.
///
/// # Panics
/// If `codes.len() != x.len()`.
pub fn quantize_int8(x: &[f32], codes: &mut [i8]) -> f32 {
    assert_eq!(x.len(), codes.len());
    let max = x.iter().fold(1e-12f32, |m, v| m.max(v.abs()));
    let scale = max / 127.0;
    for (c, v) in codes.iter_mut().zip(x) {
        *c = (v / scale).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// The logical positions attended at position `t` (SPEC §4.3): the sink prefix
/// `p < min(sink, t+1)` followed by the window `max(sink, t−window+1) ..= t`,
/// as two ascending ranges (the second may be empty).
pub fn attended_ranges(t: u64, sink: usize, window: usize) -> [std::ops::Range<u64>; 2] {
    let sink64 = sink as u64;
    let first = 0..sink64.min(t + 1);
    let lo = sink64.max((t + 1).saturating_sub(window as u64));
    [first, lo..t + 1]
}
