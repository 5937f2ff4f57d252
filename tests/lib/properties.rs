//! Property tests (proptest): random shapes, bit widths and values against the
//! definitions, for the CQ kernels, the quantizer, the int8 store, Sinkhorn and
//! the KV ring.

use cqlm::cq::quantize::quantize;
use cqlm::cq::{cq_matvec, dequantize_row, prepare};
use cqlm::kernels::kv::{attended_ranges, physical_slot, quantize_int8};
use cqlm::kernels::mhc::sinkhorn_route;
use cqlm::make::synth::random_cq;
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn bits() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![1u32, 2, 4, 8])
}

fn group() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![32usize, 64, 128])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn matvec_equals_dot_with_dequantized_rows(
        bits in bits(), group in group(), rows in 1usize..12, cols in 1usize..300, seed in any::<u64>()
    ) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let m = random_cq(&mut rng, rows, cols, bits, group.min(cols.next_power_of_two()).max(32), 0.5);
        let x: Vec<f32> = (0..cols).map(|i| ((i as u64 ^ seed) % 17) as f32 / 8.0 - 1.0).collect();
        let y = cq_matvec(&m, &x).unwrap();
        // Rounding is relative to the terms the kernel actually adds, norm·level ×
        // prepared input (the dense row's terms can cancel to exactly 0, e.g. a
        // 1-bit row with as many +c as −c levels against a one-column input).
        let prep = prepare(&m, &x).unwrap();
        for (r, yr) in y.iter().enumerate() {
            let row = dequantize_row(&m, r).unwrap();
            let want: f64 = row.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let dense: f64 = row.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let summed: f64 = (0..m.padded())
                .map(|c| {
                    let norm = m.norms()[r * m.groups() + c / m.group()] as f64;
                    (norm * m.codebook()[m.index(r, c)] as f64 * prep[c] as f64).abs()
                })
                .sum();
            let scale = dense.max(summed);
            prop_assert!((*yr as f64 - want).abs() <= 1e-5 * scale.max(1e-6), "row {}: {} vs {}", r, yr, want);
        }
    }

    #[test]
    fn quantizer_round_trip_error_is_bounded_by_bits(
        bits in bits(), group in group(), rows in 1usize..24, cols in 1usize..200, seed in any::<u64>()
    ) {
        let mut s = seed | 1;
        let dense: Vec<f32> = (0..rows * cols)
            .map(|_| {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
            })
            .collect();
        let q = quantize(&dense, rows, cols, bits, group).unwrap();
        // Worst-case bounds well above the Lloyd–Max distortions (few samples per level).
        let bound = match bits { 1 => 0.6, 2 => 0.25, 4 => 0.03, _ => 5e-4 };
        prop_assert!(q.rel_mse <= bound, "bits {} rel_mse {}", bits, q.rel_mse);
        prop_assert_eq!(q.matrix.rows(), rows);
        prop_assert_eq!(q.matrix.cols(), cols);
    }

    #[test]
    fn int8_store_is_within_half_a_step(x in prop::collection::vec(-1e4f32..1e4, 1..80)) {
        let mut codes = vec![0i8; x.len()];
        let scale = quantize_int8(&x, &mut codes);
        let max = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        prop_assert!(codes.iter().all(|&c| (-127..=127).contains(&c)));
        for (c, v) in codes.iter().zip(&x) {
            prop_assert!((*c as f32 * scale - v).abs() <= 0.5 * scale * (1.0 + 1e-5) + 1e-30);
        }
        if max > 1e-12 {
            prop_assert_eq!(codes.iter().map(|c| c.unsigned_abs()).max(), Some(127));
        }
    }

    #[test]
    fn sinkhorn_columns_sum_to_one(
        a in -2.0f32..2.0, p in prop::collection::vec(-3.0f32..3.0, 16), b in prop::collection::vec(-3.0f32..3.0, 16),
        iters in 1usize..40
    ) {
        let route = sinkhorn_route(a, &p, &b, iters);
        for j in 0..4 {
            let s: f64 = route.iter().map(|row| row[j] as f64).sum();
            prop_assert!((s - 1.0).abs() <= 1e-5, "column {} sums to {}", j, s);
        }
        prop_assert!(route.iter().flatten().all(|v| v.is_finite() && *v >= 0.0));
    }

    #[test]
    fn ring_slots_never_alias_attended_positions(sink in 0usize..8, window in 1usize..40, t in 0u64..500) {
        let pos: Vec<u64> = attended_ranges(t, sink, window).into_iter().flatten().collect();
        let mut slots: Vec<usize> = pos.iter().map(|&p| physical_slot(p, sink, window)).collect();
        prop_assert!(slots.iter().all(|&s| s < sink + window));
        prop_assert!(pos.contains(&t));
        slots.sort_unstable();
        let n = slots.len();
        slots.dedup();
        prop_assert_eq!(slots.len(), n);
    }
}

/// The case proptest found (seed 1055509378183824549): a 1-bit 3×1 matrix whose
/// row 2 dequantizes to exactly 0 while the kernel's terms leave −4.8e-9.
#[test]
fn matvec_of_a_row_that_dequantizes_to_zero_is_within_rounding() {
    let mut rng = ChaCha8Rng::seed_from_u64(1055509378183824549);
    let m = random_cq(&mut rng, 3, 1, 1, 32, 0.5);
    let x = [((1055509378183824549u64) % 17) as f32 / 8.0 - 1.0];
    let y = cq_matvec(&m, &x).unwrap();
    let prep = prepare(&m, &x).unwrap();
    for (r, yr) in y.iter().enumerate() {
        let want = dequantize_row(&m, r).unwrap()[0] as f64 * x[0] as f64;
        let summed: f64 = (0..m.padded())
            .map(|c| {
                (m.norms()[r] as f64 * m.codebook()[m.index(r, c)] as f64 * prep[c] as f64).abs()
            })
            .sum();
        assert!(
            (*yr as f64 - want).abs() <= 1e-5 * summed,
            "row {r}: {yr} vs {want}"
        );
    }
}
