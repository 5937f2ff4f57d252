//! `CpuBatch`: sequences stepped together give, bit for bit, the logits of each
//! stepped alone (exact and fast precision), through prompts of several lengths,
//! decode steps in changing groups, resets, and the window's wrap.

use cqlm::cq::BitsPlan;
use cqlm::{BatchEngine, Config, CpuBatch, CpuEngine, Engine, Precision, Readout};
use std::sync::Arc;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn batched_sequences_match_each_sequence_alone() {
    let config = Config {
        window: 16,
        sink: 2,
        ..Config::preset_tiny()
    };
    let model = Arc::new(cqlm::make::synth::synth_model(&config, &BitsPlan::mixed(), 12).unwrap());
    let vocab = model.config.vocab as u32;
    for precision in [Precision::Exact, Precision::Fast] {
        let mut batch = CpuBatch::new(Arc::clone(&model), 3, precision).unwrap();
        let mut alone: Vec<CpuEngine> = (0..3)
            .map(|_| {
                let mut e = CpuEngine::new(Arc::clone(&model)).unwrap();
                e.set_precision(precision);
                e
            })
            .collect();
        let prompts: Vec<Vec<u32>> = (0..3u32)
            .map(|s| {
                (0..[5u32, 1, 11][s as usize])
                    .map(|i| (i * 7 + s * 3 + 1) % vocab)
                    .collect()
            })
            .collect();
        // Prompts together (as prefill chunks), then 30 decode steps in groups
        // that change: all, pairs, one (past the 18-row window).
        let mut work: Vec<(usize, Vec<u32>)> = prompts.iter().cloned().enumerate().collect();
        for step in 0..31 {
            let refs: Vec<(usize, &[u32])> = work.iter().map(|(s, ids)| (*s, &ids[..])).collect();
            let got = crate::common::batch_logits(&mut batch, &refs).unwrap();
            let mut next = Vec::new();
            for (i, (slot, ids)) in work.iter().enumerate() {
                let want = alone[*slot]
                    .step_many(ids, Readout::Logits)
                    .unwrap()
                    .logits()
                    .unwrap()
                    .to_vec();
                let row = &got[i * vocab as usize..(i + 1) * vocab as usize];
                assert_eq!(
                    bits(row),
                    bits(&want),
                    "{precision:?} step {step} slot {slot}"
                );
                assert_eq!(batch.position(*slot), alone[*slot].position());
                let tok = cqlm::session::sample::argmax(row);
                if (step + slot) % 3 != 0 || step == 0 {
                    next.push((*slot, vec![tok]));
                }
            }
            if next.is_empty() {
                next.push((step % 3, vec![1]));
            }
            work = next;
        }
        // A reset slot starts over: position 0, the logits of a fresh sequence.
        batch.reset(1);
        let mut fresh = CpuEngine::new(Arc::clone(&model)).unwrap();
        fresh.set_precision(precision);
        let want = fresh
            .step_many(&[4, 5], Readout::Logits)
            .unwrap()
            .logits()
            .unwrap()
            .to_vec();
        let got = crate::common::batch_logits(&mut batch, &[(1, &[4, 5])]).unwrap();
        assert_eq!(bits(&got), bits(&want));
    }
    // Bad work is refused before anything runs.
    let mut b = CpuBatch::new(Arc::clone(&model), 2, Precision::Exact).unwrap();
    assert!(crate::common::batch_logits(&mut b, &[]).is_err());
    assert!(crate::common::batch_logits(&mut b, &[(2, &[1])]).is_err());
    assert!(crate::common::batch_logits(&mut b, &[(0, &[1]), (0, &[2])]).is_err());
    assert!(crate::common::batch_logits(&mut b, &[(0, &[])]).is_err());
    assert!(crate::common::batch_logits(&mut b, &[(0, &[vocab])]).is_err());
    assert_eq!(b.position(0), 0);
}

#[test]
fn a_saved_slot_restored_continues_bit_for_bit() {
    let config = Config {
        window: 16,
        sink: 2,
        ..Config::preset_tiny()
    };
    let model = Arc::new(cqlm::make::synth::synth_model(&config, &BitsPlan::mixed(), 13).unwrap());
    for precision in [Precision::Exact, Precision::Fast] {
        let mut batch = CpuBatch::new(Arc::clone(&model), 3, precision).unwrap();
        crate::common::check_saved_slots(&mut batch);
    }
    // A state of a model of another shape is refused, naming why.
    let wide = Config {
        window: 32,
        ..config.clone()
    };
    let other = Arc::new(cqlm::make::synth::synth_model(&wide, &BitsPlan::mixed(), 13).unwrap());
    let mut a = CpuBatch::new(Arc::clone(&model), 1, Precision::Exact).unwrap();
    let mut b = CpuBatch::new(other, 1, Precision::Exact).unwrap();
    let saved = b.save(0).unwrap();
    let err = a.restore(0, &saved).unwrap_err().to_string();
    assert!(err.contains("another shape"), "{err}");
    let mine = a.save(0).unwrap();
    assert!(a.restore(5, &mine).is_err());
}
