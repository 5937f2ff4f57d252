//! `GpuBatch`: sequences stepped together on the device give the logits of
//! each sequence stepped alone by a `GpuEngine` (bit for bit on the standard
//! program, within rounding on the lean one: `assert_same_work`; and the CPU
//! reference's within SPEC §6), through prompts of several lengths (one longer
//! than the device's 32 token slots, so a step spans two passes), decode steps
//! in changing groups, a prompt chunk in the same pass as decode tokens, resets,
//! and the window's wrap; on the program the adapter (or `CQLM_GPU_PROGRAM`)
//! picks, which CI varies. Bad work is an error and steps nothing.

use crate::common::gpu::{assert_same_work, gpu, rel_l2};
use cqlm::cq::BitsPlan;
use cqlm::gpu::ProgramKind;
use cqlm::{BatchEngine, Config, CpuEngine, Engine, Error, GpuBatch, GpuEngine, Readout};
use std::sync::Arc;

/// `e`'s logits after stepping `ids`.
fn logits_after(e: &mut dyn Engine, ids: &[u32]) -> Vec<f32> {
    e.step_many(ids, Readout::Logits)
        .unwrap()
        .logits()
        .unwrap()
        .to_vec()
}

#[test]
fn batched_sequences_match_each_sequence_alone() {
    let Some(ctx) = gpu() else { return };
    let config = Config {
        window: 12,
        sink: 2,
        ..Config::preset_tiny()
    };
    let model = Arc::new(cqlm::make::synth::synth_model(&config, &BitsPlan::mixed(), 21).unwrap());
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
            let got = crate::common::batch_logits(&mut batch, &refs).unwrap();
            assert_eq!(got.len(), work.len() * vocab);
            for (i, (slot, ids)) in work.iter().enumerate() {
                let want = logits_after(&mut alone[*slot], ids);
                let row = &got[i * vocab..(i + 1) * vocab];
                assert_same_work(row, &want, program, &format!("pass {pass} slot {slot}"));
                let reference = logits_after(&mut cpu[*slot], ids);
                worst = worst.max(rel_l2(row, &reference));
                assert_eq!(batch.position(*slot), alone[*slot].position());
                pending[*slot] = Some(vec![cqlm::session::sample::argmax(row)]);
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
        let got = crate::common::batch_logits(&mut batch, &[(1, &next)]).unwrap();
        assert_same_work(&got, &want, program, "a lone decode token");
        assert_eq!(batch.position(1), alone[1].position());
        // A reset slot starts over: the logits of a fresh sequence.
        batch.reset(2);
        let mut fresh =
            GpuEngine::with_program(Arc::clone(&model), Arc::clone(&ctx), program).unwrap();
        let want = logits_after(&mut fresh, &[4, 5]);
        let got = crate::common::batch_logits(&mut batch, &[(2, &[4, 5])]).unwrap();
        assert_same_work(&got, &want, program, "after reset");
        assert_eq!(batch.position(2), 2);
    }
}

#[test]
fn a_saved_slot_restored_continues_bit_for_bit() {
    let Some(ctx) = gpu() else { return };
    let config = Config {
        window: 16,
        sink: 2,
        ..Config::preset_tiny()
    };
    let model = Arc::new(cqlm::make::synth::synth_model(&config, &BitsPlan::mixed(), 13).unwrap());
    let program = ProgramKind::choose(&ctx);
    let mut batch = GpuBatch::new(Arc::clone(&model), Arc::clone(&ctx), 3, Some(program)).unwrap();
    crate::common::check_saved_slots(&mut batch);
    // A CPU engine's state is not a GPU batch's.
    let mut cpu = cqlm::CpuBatch::new(model, 1, cqlm::Precision::Exact).unwrap();
    let err = batch
        .restore(0, &cpu.save(0).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("another kind of engine"), "{err}");
}

#[test]
fn bad_batch_work_is_an_error_and_steps_nothing() {
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(
        cqlm::make::synth::synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 3).unwrap(),
    );
    let vocab = model.config.vocab as u32;
    let mut b = GpuBatch::new(Arc::clone(&model), ctx, 2, None).unwrap();
    assert!(matches!(
        crate::common::batch_logits(&mut b, &[]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        crate::common::batch_logits(&mut b, &[(2, &[1])]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        crate::common::batch_logits(&mut b, &[(0, &[1]), (0, &[2])]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        crate::common::batch_logits(&mut b, &[(1, &[])]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        crate::common::batch_logits(&mut b, &[(0, &[1]), (1, &[vocab])]),
        Err(Error::TokenOutOfRange { .. })
    ));
    assert_eq!((b.position(0), b.position(1)), (0, 0));
    assert!(cqlm::BatchEngine::out(&b, 0).is_none());
    // More sequences than the device has token slots.
    let too_many = cqlm::gpu::PREFILL_SLOTS + 1;
    let ctx = gpu().unwrap();
    assert!(matches!(
        GpuBatch::new(model, ctx, too_many, None),
        Err(Error::Gpu(_))
    ));
}

/// The readouts of a batch item computed on the host from `logits` under
/// `mask`, written apart from the engine: the lowest index of the largest
/// allowed logit, or the allowed `(logit bits, id)` pairs of the `k` largest
/// (ties toward lower ids), sorted.
fn host_argmax(logits: &[f32], mask: Option<&cqlm::constrain::TokenMask>) -> u32 {
    let mut best: Option<(f32, u32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        let ok = mask.is_none_or(|m| m.is_allowed(i as u32));
        if ok && best.is_none_or(|(b, _)| v > b) {
            best = Some((v, i as u32));
        }
    }
    best.expect("an allowed token").1
}

fn host_top_k(
    logits: &[f32],
    k: usize,
    mask: Option<&cqlm::constrain::TokenMask>,
) -> Vec<(u32, u32)> {
    let mut all: Vec<(f32, u32)> = (0..logits.len() as u32)
        .filter(|&i| mask.is_none_or(|m| m.is_allowed(i)))
        .map(|i| (logits[i as usize], i))
        .collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut top: Vec<(u32, u32)> = all.iter().take(k).map(|&(v, i)| (v.to_bits(), i)).collect();
    top.sort_unstable();
    top
}

fn sorted(c: &[(f32, u32)]) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = c.iter().map(|&(l, i)| (l.to_bits(), i)).collect();
    v.sort_unstable();
    v
}

/// Every slot of a pass reads out its own way (device argmax, top-k and
/// nucleus, each with and without a token mask, the logits, nothing): each
/// equals the readout of that slot's full logits (the same steps on a second
/// batch that reads out logits only) computed on the host, a greedy pass reads
/// back 8 bytes an item where the logits path reads back `vocab` floats, and a
/// reread gives the item's logits under its mask.
#[test]
fn device_readouts_of_a_batch_equal_the_host_readouts_of_its_logits() {
    use cqlm::constrain::TokenMask;
    use cqlm::engine::SlotStep;
    use cqlm::StepOut;
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(
        cqlm::make::synth::synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 5).unwrap(),
    );
    let vocab = model.config.vocab;
    let mut device = GpuBatch::new(Arc::clone(&model), Arc::clone(&ctx), 4, None).unwrap();
    let mut host = GpuBatch::new(Arc::clone(&model), Arc::clone(&ctx), 4, None).unwrap();
    // A mask per slot allowing about a third of the ids (never none).
    let masks: Vec<TokenMask> = (0..4u32)
        .map(|s| {
            let ids: Vec<u32> = (0..vocab as u32)
                .filter(|i| (i * 2654435761u32.wrapping_add(s)) % 3 == 0 || *i == s)
                .collect();
            TokenMask::of_ids(vocab, &ids)
        })
        .collect();
    let kinds = [
        Readout::Argmax,
        Readout::TopK(7),
        Readout::Nucleus { temperature: 0.7 },
        Readout::Logits,
    ];
    let mut ids: Vec<Vec<u32>> = (0..4u32).map(|s| vec![1 + s, 9, 4 * s + 2]).collect();
    for pass in 0..8 {
        let readouts: Vec<Readout> = (0..4).map(|s| kinds[(s + pass) % 4]).collect();
        let masked = |s: usize| (s + pass / 4) % 2 == 1;
        let work: Vec<SlotStep<'_>> = (0..4)
            .map(|s| SlotStep::new(s, &ids[s], readouts[s]).masked(masked(s).then_some(&masks[s])))
            .collect();
        let before = ctx.bytes_read_back();
        device.step(&work).unwrap();
        let read = ctx.bytes_read_back() - before;
        let plain: Vec<(usize, &[u32])> = (0..4).map(|s| (s, &ids[s][..])).collect();
        let logits = crate::common::batch_logits(&mut host, &plain).unwrap();
        let logits_read = ctx.bytes_read_back() - before - read;
        assert!(logits_read >= (4 * vocab * 4) as u64, "pass {pass}");
        let mut next = Vec::new();
        for s in 0..4 {
            let row = &logits[s * vocab..(s + 1) * vocab];
            let mask = masked(s).then_some(&masks[s]);
            let what = format!(
                "pass {pass} slot {s} {:?} masked {}",
                readouts[s],
                mask.is_some()
            );
            match (readouts[s], device.out(s)) {
                (Readout::Argmax, StepOut::Token(t)) => {
                    assert_eq!(t, host_argmax(row, mask), "{what}")
                }
                (Readout::TopK(k), StepOut::Candidates(c)) => {
                    assert_eq!(sorted(c), host_top_k(row, k, mask), "{what}")
                }
                (
                    Readout::Nucleus { temperature },
                    StepOut::Nucleus {
                        candidates,
                        nucleus,
                    },
                ) => {
                    assert_eq!(sorted(candidates), host_top_k(row, 256, mask), "{what}");
                    let m = host_top_k(row, 1, mask)[0].0;
                    let max = f32::from_bits(m) as f64;
                    let total: f64 = (0..vocab)
                        .filter(|&i| mask.is_none_or(|mk| mk.is_allowed(i as u32)))
                        .map(|i| ((row[i] as f64 - max) / temperature as f64).exp())
                        .sum();
                    let err = (nucleus.total - total).abs() / total;
                    assert!(
                        err <= nucleus.rel_err,
                        "{what}: {err} > {}",
                        nucleus.rel_err
                    );
                }
                (Readout::Logits, StepOut::Logits(l)) => {
                    for i in 0..vocab {
                        let want = match mask {
                            Some(m) if !m.is_allowed(i as u32) => f32::NEG_INFINITY,
                            _ => row[i],
                        };
                        assert_eq!(l[i].to_bits(), want.to_bits(), "{what} id {i}");
                    }
                }
                (_, other) => panic!("{what}: read out {other:?}"),
            }
            // The full logits again, under the item's mask.
            let again = device.reread(s, Readout::Logits, mask).unwrap();
            let again = again.logits().unwrap();
            for i in 0..vocab {
                if mask.is_none_or(|m| m.is_allowed(i as u32)) {
                    assert_eq!(again[i].to_bits(), row[i].to_bits(), "{what} reread id {i}");
                } else {
                    assert_eq!(again[i], f32::NEG_INFINITY, "{what} reread id {i}");
                }
            }
            next.push(vec![host_argmax(row, mask)]);
        }
        ids = next;
    }
    // A greedy pass reads back 8 bytes an item, not the logits.
    let work: Vec<SlotStep<'_>> = (0..4)
        .map(|s| SlotStep::new(s, &ids[s], Readout::Argmax))
        .collect();
    let before = ctx.bytes_read_back();
    device.step(&work).unwrap();
    assert_eq!(ctx.bytes_read_back() - before, 4 * 8);
    // A prompt chunk without a readout reads nothing back, and no reread.
    let work = [SlotStep::new(0, &[3, 4, 5], Readout::None)];
    let before = ctx.bytes_read_back();
    device.step(&work).unwrap();
    assert_eq!(ctx.bytes_read_back(), before);
    assert!(device.out(0).is_none());
    assert!(matches!(
        device.reread(0, Readout::Logits, None),
        Err(Error::InvalidArgument(_))
    ));
}

/// A `Session` on a `GpuEngine` saves and restores its state through the
/// one-slot batch: a fresh session restored to a saved prefix continues bit
/// for bit as the saved one; a state of the wrong length or of the CPU engine
/// is refused.
#[test]
fn a_session_restored_on_the_gpu_continues_bit_for_bit() {
    use cqlm::session::Session;
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(
        cqlm::make::synth::synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 21).unwrap(),
    );
    let session = |ctx: &Arc<cqlm::gpu::GpuContext>| {
        let e = GpuEngine::with_context(Arc::clone(&model), Arc::clone(ctx)).unwrap();
        Session::from_engine(Box::new(e), Arc::clone(&model))
    };
    let (head, tail) = ([3u32, 14, 15, 92, 65], [35u32, 89, 79]);
    let mut a = session(&ctx);
    a.prefill(&head).unwrap();
    let saved = a.save().unwrap();
    a.prefill(&tail).unwrap();
    let want = a.logits().to_vec();
    let mut b = session(&ctx);
    b.prefill(&[7, 7, 7, 7, 7, 7, 7, 7, 7]).unwrap();
    b.restore(&head, &saved).unwrap();
    assert!(b.logits().is_empty(), "no logits until the next prefill");
    b.prefill(&tail).unwrap();
    assert_eq!(b.tokens(), [&head[..], &tail[..]].concat());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(b.logits()), bits(&want));
    assert!(matches!(
        b.restore(&head[..4], &saved),
        Err(Error::InvalidArgument(_))
    ));
    let mut cpu = Session::new(Arc::clone(&model), cqlm::Backend::Cpu).unwrap();
    cpu.prefill(&head).unwrap();
    let cpu_saved = cpu.save().unwrap();
    assert!(matches!(
        b.restore(&head, &cpu_saved),
        Err(Error::InvalidArgument(_))
    ));
}
