//! `GpuBatch`: sequences stepped together on the device give, bit for bit, the
//! logits of each sequence stepped alone by a `GpuEngine` (and the CPU
//! reference's within SPEC §6), through prompts of several lengths (one longer
//! than the device's 32 token slots, so a step spans two passes), decode steps
//! in changing groups, a prompt chunk in the same pass as decode tokens, resets,
//! and the window's wrap; on the program the adapter (or `CQLM_GPU_PROGRAM`)
//! picks, which CI varies. Bad work is an error and steps nothing.

use crate::common::gpu::{gpu, rel_l2};
use cqlm::cq::BitsPlan;
use cqlm::gpu::ProgramKind;
use cqlm::{Config, CpuEngine, Engine, Error, GpuBatch, GpuEngine, Readout};
use std::sync::Arc;

/// `e`'s logits after stepping `ids`.
fn logits_after(e: &mut dyn Engine, ids: &[u32]) -> Vec<f32> {
    e.step_many(ids, Readout::Logits)
        .unwrap()
        .logits()
        .unwrap()
        .to_vec()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn batched_sequences_match_each_sequence_alone() {
    let Some(ctx) = gpu() else { return };
    let config = Config {
        window: 12,
        sink: 2,
        ..Config::preset_tiny()
    };
    let model = Arc::new(cqlm::synth::synth_model(&config, &BitsPlan::mixed(), 21).unwrap());
    let vocab = model.config.vocab;
    // The adapter's program (`CQLM_GPU_PROGRAM`): CI runs this binary with each.
    for program in [ProgramKind::choose(&ctx)] {
        let mut batch =
            GpuBatch::new(Arc::clone(&model), Arc::clone(&ctx), 3, Some(program)).unwrap();
        assert_eq!(batch.program(), program);
        let mut alone: Vec<GpuEngine> = (0..3)
            .map(|_| {
                GpuEngine::with_program(Arc::clone(&model), Arc::clone(&ctx), program).unwrap()
            })
            .collect();
        let mut cpu: Vec<CpuEngine> = (0..3)
            .map(|_| CpuEngine::new(Arc::clone(&model)).unwrap())
            .collect();
        // Slot 1 waits at first: its prompt comes in step 2, beside a decode
        // token of slot 2, while slot 0 sits out (as it does every third step).
        let mut pending: Vec<Option<Vec<u32>>> =
            vec![Some(vec![3, 9, 27, 81, 5]), None, Some(vec![7; 40])];
        let mut worst = 0.0f64;
        for pass in 0..12 {
            if pass == 2 {
                pending[1] = Some(vec![11, 12, 13]);
            }
            let work: Vec<(usize, Vec<u32>)> = (0..3)
                .filter(|&s| !(s == 0 && pass % 3 == 2))
                .filter_map(|s| pending[s].take().map(|ids| (s, ids)))
                .collect();
            let refs: Vec<(usize, &[u32])> = work.iter().map(|(s, ids)| (*s, &ids[..])).collect();
            let got = batch.step(&refs).unwrap().to_vec();
            assert_eq!(got.len(), work.len() * vocab);
            for (i, (slot, ids)) in work.iter().enumerate() {
                let want = logits_after(&mut alone[*slot], ids);
                let row = &got[i * vocab..(i + 1) * vocab];
                assert_eq!(
                    bits(row),
                    bits(&want),
                    "{program:?} pass {pass} slot {slot}"
                );
                let reference = logits_after(&mut cpu[*slot], ids);
                worst = worst.max(rel_l2(row, &reference));
                assert_eq!(batch.position(*slot), alone[*slot].position());
                pending[*slot] = Some(vec![cqlm::sample::argmax(row)]);
            }
        }
        assert!(
            worst <= 2e-2,
            "{program:?}: logits vs the CPU, worst rel L2 {worst}"
        );
        // A pass of a single token (it runs the decode step, not the batched
        // kernels): still the logits of the sequence alone.
        let next = pending[1].take().expect("slot 1 stepped in the last pass");
        let want = logits_after(&mut alone[1], &next);
        let got = batch.step(&[(1, &next)]).unwrap().to_vec();
        assert_eq!(bits(&got), bits(&want), "{program:?} a lone decode token");
        assert_eq!(batch.position(1), alone[1].position());
        // A reset slot starts over: the logits of a fresh sequence.
        batch.reset(2);
        let mut fresh =
            GpuEngine::with_program(Arc::clone(&model), Arc::clone(&ctx), program).unwrap();
        let want = logits_after(&mut fresh, &[4, 5]);
        let got = batch.step(&[(2, &[4, 5])]).unwrap().to_vec();
        assert_eq!(bits(&got), bits(&want), "{program:?} after reset");
        assert_eq!(batch.position(2), 2);
    }
}

#[test]
fn bad_batch_work_is_an_error_and_steps_nothing() {
    let Some(ctx) = gpu() else { return };
    let model =
        Arc::new(cqlm::synth::synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 3).unwrap());
    let vocab = model.config.vocab as u32;
    let mut b = GpuBatch::new(Arc::clone(&model), ctx, 2, None).unwrap();
    assert!(matches!(b.step(&[]), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        b.step(&[(2, &[1])]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        b.step(&[(0, &[1]), (0, &[2])]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        b.step(&[(1, &[])]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        b.step(&[(0, &[1]), (1, &[vocab])]),
        Err(Error::TokenOutOfRange { .. })
    ));
    assert_eq!((b.position(0), b.position(1)), (0, 0));
    assert!(b.last_logits().is_empty());
    // More sequences than the device has token slots.
    let too_many = cqlm::gpu::PREFILL_SLOTS + 1;
    let ctx = gpu().unwrap();
    assert!(matches!(
        GpuBatch::new(model, ctx, too_many, None),
        Err(Error::Gpu(_))
    ));
}
