//! Unit checks of the small kernels of SPEC §4 against hand computations.

use cqlm::kernels::kv::{attended_ranges, physical_slot, quantize_int8};
use cqlm::kernels::mhc::sinkhorn_route;
use cqlm::kernels::norm::{rms_unit_into, zcrms_into};
use cqlm::kernels::rope::{apply_rope, rope_table};
use cqlm::model::config::EngramConfig;
use cqlm::model::engram::{fnv1a64_bytes, table_rows_for, TokenHistory, PAD_TOKEN};

#[test]
fn fnv1a64_published_vectors() {
    // Reference values of the FNV-1a 64 specification (Fowler–Noll–Vo test suite).
    assert_eq!(fnv1a64_bytes(*b""), 0xcbf29ce484222325);
    assert_eq!(fnv1a64_bytes(*b"a"), 0xaf63dc4c8601ec8c);
    assert_eq!(fnv1a64_bytes(*b"foobar"), 0x85944171f73967e8);
}

#[test]
fn ngram_hash_by_hand_with_padding_before_position_zero() {
    // By hand: FNV-1a over bytes of the u32 words, little-endian, one byte at a time.
    fn by_hand(words: &[u32]) -> u64 {
        let mut h: u64 = 0xcbf29ce484222325;
        for w in words {
            for k in 0..4 {
                h ^= ((w >> (8 * k)) & 0xff) as u64;
                h = h.wrapping_mul(0x100000001b3);
            }
        }
        h
    }
    let mut hist = TokenHistory::default();
    hist.push(17);
    // t = 0, order 3, head 1: tok[-2], tok[-1] are padding.
    assert_eq!(
        hist.ngram_hash(3, 1),
        by_hand(&[3, 1, PAD_TOKEN, PAD_TOKEN, 17])
    );
    hist.push(4);
    hist.push(99);
    // t = 2, order 2, head 0: tok[1], tok[2].
    assert_eq!(hist.ngram_hash(2, 0), by_hand(&[2, 0, 4, 99]));
    assert_eq!(hist.ngram_hash(3, 1), by_hand(&[3, 1, 17, 4, 99]));
    // Row selection is the hash modulo each table's size, in gather order.
    let e = EngramConfig {
        sites: vec![0],
        orders: vec![3, 2],
        hash_heads: 2,
        dim: 8,
        taps: 1,
        dilation: 1,
    };
    let sizes = [97, 89, 83, 79];
    let mut rows = Vec::new();
    table_rows_for(&hist, &e, &sizes, &mut rows);
    let want = [
        by_hand(&[3, 0, 17, 4, 99]) % 97,
        by_hand(&[3, 1, 17, 4, 99]) % 89,
        by_hand(&[2, 0, 4, 99]) % 83,
        by_hand(&[2, 1, 4, 99]) % 79,
    ];
    assert_eq!(rows, want.map(|v| v as usize).to_vec());
}

#[test]
fn history_stays_bounded_and_exact_over_long_runs() {
    let mut hist = TokenHistory::default();
    for t in 0..1000u32 {
        hist.push(t * 7);
    }
    assert_eq!(hist.len(), 1000);
    for back in 0..64 {
        assert_eq!(hist.back(back), (999 - back as u32) * 7);
    }
}

#[test]
fn physical_slot_wraps_after_sink_plus_window() {
    let (sink, window) = (4, 6);
    let slots: Vec<usize> = (0..20).map(|t| physical_slot(t, sink, window)).collect();
    assert_eq!(
        slots,
        vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 4, 5, 6, 7, 8, 9, 4, 5, 6, 7]
    );
    assert_eq!(physical_slot(1_000_003, 0, 1), 0);
    assert_eq!(
        physical_slot(u64::MAX, 2, 3),
        2 + ((u64::MAX - 2) % 3) as usize
    );
}

#[test]
fn attended_positions_follow_the_spec_set() {
    for (sink, window) in [(4usize, 6usize), (0, 3), (2, 1), (5, 100)] {
        for t in 0..40u64 {
            let got: Vec<u64> = attended_ranges(t, sink, window)
                .into_iter()
                .flatten()
                .collect();
            let want: Vec<u64> = (0..=t)
                .filter(|&p| p < sink as u64 || p + window as u64 > t)
                .collect();
            assert_eq!(got, want, "t {t} sink {sink} window {window}");
            // Every attended slot is distinct: the ring never aliases a live position.
            let mut slots: Vec<usize> = got
                .iter()
                .map(|&p| physical_slot(p, sink, window))
                .collect();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(slots.len(), got.len());
        }
    }
}

#[test]
fn int8_store_rounds_half_to_even_and_clamps() {
    // max|x| = 127 → scale 1: codes are x rounded half to even.
    let x = [127.0f32, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.4999, -126.6];
    let mut codes = [0i8; 9];
    let scale = quantize_int8(&x, &mut codes);
    assert_eq!(scale, 1.0);
    assert_eq!(codes, [127, 0, 2, 2, 0, -2, -2, 3, -127]);
    // All zeros: scale 1e-12/127, codes 0.
    let mut z = [5i8; 3];
    let s = quantize_int8(&[0.0; 3], &mut z);
    assert_eq!(z, [0, 0, 0]);
    assert!((s - 1e-12 / 127.0).abs() < 1e-20);
    // Extremes never exceed ±127 (no −128).
    let mut c = [0i8; 2];
    quantize_int8(&[-3.0, 3.0], &mut c);
    assert_eq!(c, [-127, 127]);
}

#[test]
fn sinkhorn_columns_sum_to_one_and_rows_nearly() {
    let p: Vec<f32> = (0..16).map(|i| ((i * 7 % 5) as f32 - 2.0) * 0.8).collect();
    let b: Vec<f32> = (0..16).map(|i| ((i * 3 % 7) as f32 - 3.0) * 0.3).collect();
    let route = sinkhorn_route(0.9, &p, &b, 20);
    for j in 0..4 {
        let s: f64 = route.iter().map(|row| row[j] as f64).sum();
        assert!((s - 1.0).abs() <= 1e-6, "column {j} sums to {s}");
    }
    for (i, row) in route.iter().enumerate() {
        let s: f64 = row.iter().map(|v| *v as f64).sum();
        assert!((s - 1.0).abs() <= 1e-3, "row {i} sums to {s}");
        assert!(row.iter().all(|v| *v > 0.0));
    }
    // Against an f64 log-space Sinkhorn written here.
    let mut l = [[0.0f64; 4]; 4];
    for i in 0..4 {
        for j in 0..4 {
            l[i][j] = 0.9f32 as f64 * p[4 * i + j] as f64 + b[4 * i + j] as f64;
        }
    }
    let lse = |v: [f64; 4]| {
        let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    };
    for _ in 0..20 {
        for row in l.iter_mut() {
            let s = lse(*row);
            row.iter_mut().for_each(|v| *v -= s);
        }
        for j in 0..4 {
            let s = lse([l[0][j], l[1][j], l[2][j], l[3][j]]);
            l.iter_mut().for_each(|row| row[j] -= s);
        }
    }
    for i in 0..4 {
        for j in 0..4 {
            assert!((route[i][j] as f64 - l[i][j].exp()).abs() < 1e-5);
        }
    }
}

#[test]
fn norms_match_definitions() {
    let x: Vec<f32> = (0..50).map(|i| (i as f32 - 20.0) * 0.3).collect();
    let w: Vec<f32> = (0..50).map(|i| (i % 5) as f32 * 0.1 - 0.2).collect();
    let ms: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 50.0;
    let r = 1.0 / (ms + 1e-6).sqrt();
    let mut a = vec![0.0; 50];
    let mut b = vec![0.0; 50];
    rms_unit_into(&x, &mut a);
    zcrms_into(&x, &w, &mut b);
    for i in 0..50 {
        assert!((a[i] as f64 - x[i] as f64 * r).abs() < 1e-5);
        assert!((b[i] as f64 - x[i] as f64 * r * (1.0 + w[i] as f64)).abs() < 1e-5);
    }
}

#[test]
fn rope_rotates_pairs_by_logical_position() {
    let hd = 8;
    let mut c = vec![0.0; 4];
    let mut s = vec![0.0; 4];
    let t = 300u64;
    rope_table(t, 10000.0, hd, &mut c, &mut s);
    let x: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
    let mut y = x.clone();
    apply_rope(&mut y, &c, &s);
    for i in 0..4 {
        let theta = t as f64 * 10000f64.powf(-2.0 * i as f64 / hd as f64);
        let (a, b) = (x[i] as f64, x[i + 4] as f64);
        assert!((y[i] as f64 - (a * theta.cos() - b * theta.sin())).abs() < 1e-5);
        assert!((y[i + 4] as f64 - (a * theta.sin() + b * theta.cos())).abs() < 1e-5);
    }
}

#[test]
fn attend_group_matches_a_naive_f64_attention() {
    // Every query head of a KV head over random int8 codes and scales at a
    // random subset of slots, against SPEC §4.3 step 5 in f64, for head widths
    // that take each SIMD path (16-lane, 8-lane, scalar) and group sizes with
    // and without whole runs of four heads; over caches short enough that the
    // softmax has no whole run of 8 slots, and an odd count of slots.
    use cqlm::kernels::attention::{attend_group, KvHeadView, WideRows};
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(71);
    for (d, rows) in [12usize, 16, 24, 64, 128, 160]
        .into_iter()
        .flat_map(|d| [(d, 40usize), (d, 7)])
    {
        for g in [1usize, 2, 3, 4, 5, 6, 8] {
            let k: Vec<i8> = (0..rows * d)
                .map(|_| rng.random_range(-127..=127))
                .collect();
            let v: Vec<i8> = (0..rows * d)
                .map(|_| rng.random_range(-127..=127))
                .collect();
            let ks: Vec<f32> = (0..rows)
                .map(|_| rng.random_range(0.001f32..0.05))
                .collect();
            let vs: Vec<f32> = (0..rows)
                .map(|_| rng.random_range(0.001f32..0.05))
                .collect();
            let q: Vec<f32> = (0..g * d).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            let slots: Vec<usize> = match rows {
                // Every row, newest first: 7 slots.
                7 => (0..rows).rev().collect(),
                _ => (0..rows).filter(|_| rng.random_bool(0.7)).collect(),
            };
            let view = KvHeadView {
                k: &k,
                v: &v,
                k_scale: &ks,
                v_scale: &vs,
                wide: None,
            };
            let mut scores = vec![f32::NAN; g * slots.len()];
            let mut out = vec![f32::NAN; g * d];
            attend_group(&q, d, &view, &slots, &mut scores, &mut out);
            // The rows up to the last slot read widened to f32: the same bits.
            let wide = slots.iter().max().map_or(0, |m| m + 1) * d;
            let (mut wk, mut wv) = (vec![f32::NAN; wide], vec![f32::NAN; wide]);
            view.widen_into(d, &mut wk, &mut wv);
            let widened = KvHeadView {
                wide: Some(WideRows { k: &wk, v: &wv }),
                ..view
            };
            let mut out_wide = vec![f32::NAN; g * d];
            attend_group(&q, d, &widened, &slots, &mut scores, &mut out_wide);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out_wide), bits(&out), "d {d} g {g}: widened rows");
            // Heads past the last whole run of four (a pair, then one) give
            // what each gives alone, bit for bit.
            for h in g / 4 * 4..g {
                let mut alone = vec![f32::NAN; d];
                let qh = &q[h * d..(h + 1) * d];
                attend_group(qh, d, &view, &slots, &mut scores, &mut alone);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let (got, want) = (bits(&out[h * d..(h + 1) * d]), bits(&alone));
                assert_eq!(got, want, "d {d} g {g} head {h}: as alone");
            }
            for h in 0..g {
                let qh = &q[h * d..(h + 1) * d];
                let s: Vec<f64> = slots
                    .iter()
                    .map(|&p| {
                        let dot: f64 = (0..d).map(|i| qh[i] as f64 * k[p * d + i] as f64).sum();
                        dot * ks[p] as f64 / (d as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let total: f64 = e.iter().sum();
                for i in 0..d {
                    let want: f64 = slots
                        .iter()
                        .zip(&e)
                        .map(|(&p, w)| w / total * vs[p] as f64 * v[p * d + i] as f64)
                        .sum();
                    let got = out[h * d + i] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "d {d} g {g} head {h} dim {i}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn storing_a_chunk_of_rows_at_once_equals_storing_them_one_by_one() {
    use cqlm::kernels::kv::KvCache;
    let (layers, kvh, rows, hd) = (3, 2, 24, 16);
    // A chunk of 20 positions that wraps around the ring: rows 10..24, then 4..10.
    let slots: Vec<usize> = (10..24).chain(4..10).collect();
    let w = kvh * hd;
    let k: Vec<f32> = (0..slots.len() * w)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.1)
        .collect();
    let v: Vec<f32> = (0..slots.len() * w)
        .map(|i| ((i * 11 % 97) as f32 - 48.0) * 0.2)
        .collect();
    let mut one = KvCache::new(layers, kvh, rows, hd).unwrap();
    for (t, &s) in slots.iter().enumerate() {
        one.store(1, s, &k[t * w..(t + 1) * w], &v[t * w..(t + 1) * w]);
    }
    let mut all = KvCache::new(layers, kvh, rows, hd).unwrap();
    all.store_rows(1, &slots, &k, &v);
    assert_eq!(all.k_codes, one.k_codes);
    assert_eq!(all.v_codes, one.v_codes);
    assert_eq!(all.k_scale, one.k_scale);
    assert_eq!(all.v_scale, one.v_scale);
    // A slot twice would have two positions write one row: refused.
    let twice = std::panic::catch_unwind(|| {
        let mut c = KvCache::new(layers, kvh, rows, hd).unwrap();
        c.store_rows(0, &[3, 5, 3], &k[..3 * w], &v[..3 * w]);
    });
    assert!(twice.is_err());
}
