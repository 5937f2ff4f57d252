//! Per-kernel profiles of the CPU and GPU engines and batches: every dispatch or
//! kernel boundary of the step is covered, times are positive and add up to at
//! most the step's wall time, and the profiled steps are real decode steps.
//! (`cqlm profile` from outside is `tests/bin/profile_cli.rs`.)

use crate::common::gpu::{gpu, rel_l2};
use crate::common::StepLogits;
use cqlm::cq::BitsPlan;
use cqlm::engine::profile::KernelProfile;
use cqlm::engine::profile::Timing;
use cqlm::make::synth::synth_model;
use cqlm::{Config, CpuEngine, Engine, GpuEngine, Model};
use std::collections::BTreeSet;
use std::sync::Arc;

fn tiny(seed: u64) -> Arc<Model> {
    Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), seed).unwrap())
}

fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 2654435761 + seed * 97) % vocab as u64) as u32)
        .collect()
}

fn calls(p: &KernelProfile, name: &str) -> usize {
    p.rows
        .iter()
        .find(|r| r.name == name)
        .map_or(0, |r| r.calls_per_token)
}

/// What holds for every profile: rows sorted, positive, within the step.
fn check_common(p: &KernelProfile, tokens: usize, what: &str) {
    eprintln!(
        "{what}: {} rows, {} calls/token, kernels {:.1} µs of a {:.1} µs step ({})",
        p.rows.len(),
        p.calls_per_token(),
        p.kernel_seconds() * 1e6,
        p.step_seconds * 1e6,
        p.method
    );
    assert_eq!(p.tokens, tokens, "{what}");
    assert!(!p.rows.is_empty(), "{what}");
    for r in &p.rows {
        assert!(r.calls_per_token > 0, "{what}: {r:?}");
        assert!(r.seconds_per_token > 0.0, "{what}: {r:?}");
        assert!(r.bytes_per_token > 0, "{what}: {r:?}");
        assert!(
            r.gb_per_s() > 0.0 && r.gb_per_s().is_finite(),
            "{what}: {r:?}"
        );
    }
    for w in p.rows.windows(2) {
        assert!(
            w[0].seconds_per_token >= w[1].seconds_per_token,
            "{what}: sorted"
        );
    }
    let names: BTreeSet<&str> = p.rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names.len(), p.rows.len(), "{what}: one row per kernel");
    assert!(
        p.kernel_seconds() <= p.step_seconds,
        "{what}: kernels {} s > step {} s",
        p.kernel_seconds(),
        p.step_seconds
    );
    let share: f64 = p.rows.iter().map(|r| p.share(r)).sum();
    assert!(share > 0.0 && share <= 1.0, "{what}: shares sum to {share}");
}

#[test]
fn cpu_profile_covers_every_kernel_of_the_step() {
    let model = tiny(3);
    let c = model.config.clone();
    let e = c.engram.clone().expect("tiny has engram");
    let all = ids(10, c.vocab, 1);
    let mut eng = CpuEngine::new(Arc::clone(&model)).unwrap();
    eng.prefill(&all[..6]).unwrap();
    let p = eng.profile(&all[6..]).unwrap();
    check_common(&p, 4, "cpu tiny");
    assert!(p.method.contains("cpu"));
    let l = c.layers;
    for name in ["premix", "qk_store", "attend", "mlp", "route"] {
        assert_eq!(calls(&p, name), l, "{name}");
    }
    assert_eq!(calls(&p, "engram_conv"), e.sites.len());
    assert_eq!(calls(&p, "gather"), 1 + e.tables());
    // Engram input, then per layer the Φ input, the attention input and wo's input, then logits.
    assert_eq!(calls(&p, "prepare"), 1 + 3 * l + 1);
    let matvecs: usize = p
        .rows
        .iter()
        .filter(|r| r.name.starts_with("matvec"))
        .map(|r| r.calls_per_token)
        .sum();
    // One product per shared input: wv and wk per site; Φ pre/post/res, then
    // wq wk wv wg, then wo per layer; the vocabulary.
    assert_eq!(matvecs, e.sites.len() + 3 * l + 1);
    assert_eq!(
        p.calls_per_token(),
        calls(&p, "prepare") + matvecs + 5 * l + e.sites.len() + 1 + e.tables()
    );

    // The profiled steps were real steps, bit for bit: the next logits match a
    // plain engine fed the same tokens.
    assert_eq!(eng.position(), 10);
    let mut plain = CpuEngine::new(Arc::clone(&model)).unwrap();
    plain.prefill(&all).unwrap();
    let want = plain.logits_after(5);
    let got = eng.logits_after(5);
    assert_eq!(got, want);
}

/// Profile `tokens` steps on the GPU after a short prompt; check the profile and
/// that the steps were real (the next logits match the CPU's).
fn gpu_profile(timing: Timing, tokens: usize, what: &str) -> Option<(KernelProfile, bool)> {
    let ctx = gpu()?;
    let has_ts = ctx.caps.timestamps;
    let model = tiny(5);
    let vocab = model.config.vocab;
    let all = ids(5 + tokens, vocab, 2);
    let mut g = GpuEngine::with_context(Arc::clone(&model), ctx).unwrap();
    g.prefill(&all[..5]).unwrap();
    let p = g.profile(&all[5..], timing).unwrap();
    check_common(&p, tokens, what);
    let (_, per_token) = g.dispatches_per_token();
    assert_eq!(p.calls_per_token(), per_token, "{what}: every dispatch");
    let mut names: BTreeSet<&str> = BTreeSet::new();
    for l in 0..model.config.layers {
        names.extend(g.layer_dispatch_names(l));
    }
    for n in &names {
        assert!(p.rows.iter().any(|r| r.name == *n), "{what}: {n} missing");
    }
    assert_eq!(g.position(), (5 + tokens) as u64);
    let mut cpu = CpuEngine::new(Arc::clone(&model)).unwrap();
    cpu.prefill(&all).unwrap();
    let want = cpu.logits_after(9);
    let got = g.logits_after(9);
    let err = rel_l2(&got, &want);
    assert!(
        err <= 2e-2,
        "{what}: logits after the profile: rel L2 {err}"
    );
    Some((p, has_ts))
}

#[test]
fn gpu_profile_covers_every_dispatch() {
    // Timestamps where the adapter has them (lavapipe does): the kernel times are
    // GPU time between two timestamps around each dispatch, so they add up to at
    // most the step's wall time. Without them this is the per-dispatch path.
    let Some((p, has_ts)) = gpu_profile(Timing::Auto, 3, "gpu tiny") else {
        return;
    };
    if has_ts {
        assert!(p.method.contains("timestamp"), "{}", p.method);
    } else {
        assert!(p.method.contains("submit and wait"), "{}", p.method);
    }
}

#[test]
fn gpu_per_dispatch_fallback_covers_every_dispatch() {
    // The fallback for adapters without timestamps: each time is the wall time of
    // one submit and wait, all measured inside the step's wall time.
    let Some((p, _)) = gpu_profile(Timing::PerDispatch, 2, "gpu tiny, per dispatch") else {
        return;
    };
    assert!(p.method.contains("submit and wait"), "{}", p.method);
}

#[test]
fn gpu_timestamps_when_asked_match_the_capability() {
    let Some(ctx) = gpu() else { return };
    let has_ts = ctx.caps.timestamps;
    let model = tiny(6);
    let mut g = GpuEngine::with_context(model, ctx).unwrap();
    let r = g.profile(&[1, 2], Timing::Timestamps);
    assert_eq!(r.is_ok(), has_ts, "{r:?}");
    if !has_ts {
        assert_eq!(g.position(), 0, "nothing stepped");
    }
}

/// A pass of every slot of `b` (token `t` of slot `s` from `ids`), timed into
/// `tally` when given: the logits, and how the kernels were timed.
fn batch_pass(
    b: &mut dyn cqlm::BatchEngine,
    t: usize,
    tally: Option<&mut cqlm::engine::profile::KernelTally>,
) -> (Vec<f32>, String) {
    let vocab = b.model().config.vocab;
    let toks: Vec<[u32; 1]> = (0..b.slots())
        .map(|s| [ids(t + 1, vocab, 11 + s as u64)[t]])
        .collect();
    let work: Vec<cqlm::engine::SlotStep<'_>> = (toks.iter().enumerate())
        .map(|(s, x)| cqlm::engine::SlotStep::new(s, x, cqlm::Readout::Logits))
        .collect();
    let how = match tally {
        Some(tally) => b.step_timed(&work, Timing::Auto, tally).unwrap(),
        None => {
            b.step(&work).unwrap();
            String::new()
        }
    };
    let logits = (0..work.len())
        .flat_map(|k| b.out(k).logits().unwrap().to_vec())
        .collect();
    (logits, how)
}

/// Builds a fresh batch engine.
type MakeBatch<'a> = Box<dyn Fn() -> Box<dyn cqlm::BatchEngine> + 'a>;

/// The batch `b` after each slot's own 5-token prompt.
fn primed(mut b: Box<dyn cqlm::BatchEngine>) -> Box<dyn cqlm::BatchEngine> {
    let vocab = b.model().config.vocab;
    let prompts: Vec<Vec<u32>> = (0..b.slots())
        .map(|s| ids(5, vocab, 300 + s as u64))
        .collect();
    let work: Vec<cqlm::engine::SlotStep<'_>> = (prompts.iter().enumerate())
        .map(|(s, p)| cqlm::engine::SlotStep::new(s, p, cqlm::Readout::None))
        .collect();
    b.step(&work).unwrap();
    b
}

#[test]
fn batch_profiles_time_real_passes_with_every_kernel_once_a_pass() {
    // step_timed on the CPU and GPU batch engines: the same logits as untimed
    // passes of a twin batch, bit for bit (so the timed passes are the real
    // ones), and the kernels a pass of 3 distinct sequences runs as the batching
    // promises: per layer one premix, qk_store, attend, mlp and route for all
    // slots; on the GPU the head's gathers in one dispatch and the engram
    // convolutions of every slot in one dispatch a site. (The GPU's standard
    // program, whatever CQLM_GPU_PROGRAM says: the lean one steps a pass's slots
    // one after another, sharing no dispatch.)
    let model = tiny(7);
    let c = model.config.clone();
    let (layers, sites) = (c.layers, c.engram.as_ref().unwrap().sites.len());
    let mut engines: Vec<(&str, MakeBatch<'_>)> = vec![(
        "cpu",
        Box::new(|| {
            Box::new(cqlm::CpuBatch::new(Arc::clone(&model), 3, cqlm::Precision::Fast).unwrap())
        }),
    )];
    if let Some(ctx) = gpu() {
        let m = Arc::clone(&model);
        engines.push((
            "gpu",
            Box::new(move || {
                let standard = Some(cqlm::gpu::ProgramKind::Standard);
                Box::new(
                    cqlm::GpuBatch::new(Arc::clone(&m), Arc::clone(&ctx), 3, standard).unwrap(),
                )
            }),
        ));
    }
    for (what, make) in engines {
        let (mut timed, mut plain) = (primed(make()), primed(make()));
        let mut tally = cqlm::engine::profile::KernelTally::default();
        let passes = 3;
        let (mut how, mut wall) = (String::new(), 0.0);
        for t in 0..passes {
            let t0 = std::time::Instant::now();
            let (a, h) = batch_pass(timed.as_mut(), t, Some(&mut tally));
            wall += t0.elapsed().as_secs_f64();
            let (b, _) = batch_pass(plain.as_mut(), t, None);
            assert_eq!(a.len(), 3 * c.vocab);
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{what}: timed pass {t} changed the logits");
            how = h;
        }
        let p = tally.into_profile(passes, wall, &how);
        check_common(&p, passes, what);
        // The attention's bytes: each slot's attended rows at its position
        // (after its 5-token prompt), every layer, as a single step counts them.
        let attend: u64 = (0..passes as u64)
            .map(|t| {
                let rows = cqlm::gpu::timing::attended(5 + t, c.sink, c.window);
                3 * layers as u64 * cqlm::engine::profile::bytes::attend(c.heads, c.head_dim, rows)
            })
            .sum();
        let got = p.rows.iter().find(|r| r.name == "attend").unwrap();
        assert_eq!(
            got.bytes_per_token,
            attend / passes as u64,
            "{what}: attend bytes"
        );
        for k in ["premix", "qk_store", "attend", "mlp", "route"] {
            assert_eq!(calls(&p, k), layers, "{what}: {k} calls a pass");
        }
        if what == "gpu" {
            assert!(how.contains("gpu"), "{how}");
            assert_eq!(calls(&p, "gather_many"), 1, "gathers of every slot at once");
            assert_eq!(calls(&p, "gather"), 0);
            assert_eq!(
                calls(&p, "engram_conv"),
                sites,
                "convolutions of every slot at once"
            );
        } else {
            assert!(how.contains("cpu"), "{how}");
        }
    }
}
