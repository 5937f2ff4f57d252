//! Parity of the CPU engine's token step with an independent naive f64 reference
//! (`tests/common/naive.rs`), judged by the tolerances of SPEC §6, plus the
//! behavioural contract of `step` (prefill, reset, out-of-range tokens) and a
//! sanity check of the logits' scale.

use crate::common::naive::{argmax_margin, rel_l2, NaiveModel, NaiveState};
use crate::common::token_ids;
use cqlm::cpu::Probe;
use cqlm::cq::BitsPlan;
use cqlm::make::synth::synth_model;
use cqlm::Readout;
use cqlm::{Config, CpuEngine, Engine, EngramConfig, Error, Model};
use std::collections::BTreeMap;
use std::sync::Arc;

fn tiny_without_engram() -> Config {
    Config {
        engram: None,
        ..Config::preset_tiny()
    }
}

/// Records every tensor the engine emits, keyed by `(name, layer)`.
#[derive(Default)]
struct Recorder {
    tensors: BTreeMap<(String, Option<usize>), Vec<f32>>,
}

impl Probe for Recorder {
    fn tensor(&mut self, name: &str, layer: Option<usize>, data: &[f32]) {
        self.tensors
            .insert((name.to_string(), layer), data.to_vec());
    }
}

impl Recorder {
    fn get(&self, name: &str, layer: Option<usize>) -> &[f32] {
        self.tensors
            .get(&(name.to_string(), layer))
            .unwrap_or_else(|| panic!("the engine emitted no {name:?} (layer {layer:?})"))
    }
}

fn median(v: &[f64]) -> f64 {
    cqlm::diag::stats::median(&mut v.to_vec())
}

/// The engine's and the reference's logits at every position of `ids`, with the
/// probe of position 0 checked against the reference's intermediates.
struct Run {
    engine: Vec<Vec<f32>>,
    naive: Vec<Vec<f64>>,
}

fn run_parity(config: &Config, plan: &BitsPlan, seed: u64, ids: &[u32]) -> Run {
    let model = Arc::new(synth_model(config, plan, seed).expect("synth"));
    let naive_model = NaiveModel::new(&model);
    let mut naive = NaiveState::new(&naive_model);
    let mut engine = CpuEngine::new(Arc::clone(&model)).expect("engine");
    let mut run = Run {
        engine: Vec::new(),
        naive: Vec::new(),
    };
    for (t, &id) in ids.iter().enumerate() {
        let reference = naive.step(id);
        let logits = if t == 0 {
            let mut rec = Recorder::default();
            let logits = engine
                .step_probed(id, true, Some(&mut rec))
                .expect("step")
                .expect("logits")
                .to_vec();
            check_position0(&model, &naive, &rec);
            logits
        } else {
            engine
                .step(id, Readout::Logits)
                .expect("step")
                .logits()
                .expect("logits")
                .to_vec()
        };
        assert_eq!(logits.len(), config.vocab);
        assert!(
            logits.iter().all(|v| v.is_finite()),
            "non-finite logits at {t}"
        );
        run.engine.push(logits);
        run.naive.push(reference);
    }
    assert_eq!(engine.position(), ids.len() as u64);
    assert_eq!(naive.position(), ids.len());
    run
}

/// SPEC §6 at position 0: engram `e` and `value_s` ≤ 1e-5, lanes after every layer ≤ 1e-4.
fn check_position0(model: &Model, naive: &NaiveState, rec: &Recorder) {
    let cap = &naive.capture;
    if let Some(ec) = &model.config.engram {
        let err = rel_l2(rec.get("engram.e", None), &cap.e);
        eprintln!("position 0: engram.e rel L2 {err:.3e}");
        assert!(err <= 1e-5, "engram.e rel L2 {err:.3e} > 1e-5");
        assert_eq!(cap.values.len(), ec.sites.len());
        for (s, value) in &cap.values {
            let err = rel_l2(rec.get(&format!("engram.value.{s}"), None), value);
            eprintln!("position 0: engram.value.{s} rel L2 {err:.3e}");
            assert!(err <= 1e-5, "engram.value.{s} rel L2 {err:.3e} > 1e-5");
        }
    } else {
        assert!(cap.e.is_empty());
    }
    assert_eq!(cap.lanes.len(), model.config.layers);
    for (l, lanes) in cap.lanes.iter().enumerate() {
        let err = rel_l2(rec.get("lanes", Some(l)), lanes);
        eprintln!("position 0: lanes after layer {l} rel L2 {err:.3e}");
        assert!(
            err <= 1e-4,
            "lanes after layer {l}: rel L2 {err:.3e} > 1e-4"
        );
    }
}

/// SPEC §6 over a prompt: median relative L2 ≤ 1e-4, every position ≤ 2e-2.
fn check_logits(label: &str, run: &Run) {
    let errs: Vec<f64> = run
        .engine
        .iter()
        .zip(&run.naive)
        .map(|(e, n)| rel_l2(e, n))
        .collect();
    let med = median(&errs);
    let (worst, max) = errs
        .iter()
        .copied()
        .enumerate()
        .fold((0, 0.0f64), |a, (i, e)| if e > a.1 { (i, e) } else { a });
    eprintln!(
        "{label}: logits rel L2 over {} positions: median {med:.3e}, max {max:.3e} (position {worst})",
        errs.len()
    );
    assert!(med <= 1e-4, "{label}: median rel L2 {med:.3e} > 1e-4");
    for (t, e) in errs.iter().enumerate() {
        assert!(*e <= 2e-2, "{label}: position {t} rel L2 {e:.3e} > 2e-2");
    }
}

/// SPEC §6: identical argmax wherever the reference's top-2 margin exceeds 1e-2.
/// Returns the number of positions that were checked.
fn check_argmax(label: &str, run: &Run) -> usize {
    let mut checked = 0;
    for (t, (e, n)) in run.engine.iter().zip(&run.naive).enumerate() {
        let (best, margin) = argmax_margin(n);
        if margin > 1e-2 {
            checked += 1;
            assert_eq!(
                cqlm::session::sample::argmax(e) as usize,
                best,
                "{label}: argmax differs at position {t} (reference margin {margin:.3e})"
            );
        }
    }
    eprintln!(
        "{label}: argmax identical at {checked} of {} positions with margin > 1e-2",
        run.engine.len()
    );
    checked
}

const SEEDS: [u64; 2] = [7, 20240611];

#[test]
fn tiny_matches_naive_reference() {
    let config = Config::preset_tiny();
    // 64 tokens cross the KV window wrap (sink 2 + window 8) many times.
    for seed in SEEDS {
        let ids = token_ids(seed ^ 0x5EED, 64, config.vocab);
        let run = run_parity(&config, &BitsPlan::mixed(), seed, &ids);
        check_logits(&format!("tiny seed {seed}"), &run);
    }
}

#[test]
fn tiny_without_engram_matches_naive_reference() {
    let config = tiny_without_engram();
    for seed in SEEDS {
        let ids = token_ids(seed ^ 0xE06, 64, config.vocab);
        let run = run_parity(&config, &BitsPlan::mixed(), seed, &ids);
        check_logits(&format!("tiny/no-engram seed {seed}"), &run);
    }
}

/// Corner cases of §4: no sink, a window of 1 and of 3, a single KV head shared by
/// every query head, a unigram engram order, one tap, and the standard bits plan.
#[test]
fn edge_configs_match_naive_reference() {
    let base = Config::preset_tiny();
    let configs = [
        (
            "sink 0, window 3, kv_heads 1, orders [1, 4], taps 1",
            Config {
                sink: 0,
                window: 3,
                kv_heads: 1,
                engram: Some(EngramConfig {
                    sites: vec![0],
                    orders: vec![1, 4],
                    hash_heads: 1,
                    dim: 40,
                    taps: 1,
                    dilation: 5,
                }),
                ..base.clone()
            },
        ),
        (
            "sink 5, window 1, heads = kv_heads, taps 4",
            Config {
                sink: 5,
                window: 1,
                heads: 2,
                kv_heads: 2,
                head_dim: 24,
                engram: Some(EngramConfig {
                    sites: vec![0, 1, 2, 3],
                    orders: vec![3],
                    hash_heads: 3,
                    dim: 16,
                    taps: 4,
                    dilation: 1,
                }),
                ..base.clone()
            },
        ),
    ];
    for (label, config) in configs {
        config.validate().expect("valid config");
        for plan in [BitsPlan::mixed(), BitsPlan::standard()] {
            let ids = token_ids(99, 32, config.vocab);
            let run = run_parity(&config, &plan, 3, &ids);
            check_logits(label, &run);
            check_argmax(label, &run);
        }
    }
}

#[test]
fn greedy_argmax_matches_reference() {
    let mut checked = 0;
    let mut total = 0;
    for config in [Config::preset_tiny(), tiny_without_engram()] {
        for seed in SEEDS {
            let ids = token_ids(seed.wrapping_mul(3), 64, config.vocab);
            let run = run_parity(&config, &BitsPlan::mixed(), seed, &ids);
            let label = format!("engram {} seed {seed}", config.engram.is_some());
            checked += check_argmax(&label, &run);
            total += run.engine.len();
        }
    }
    // The comparison must not be vacuous.
    assert!(
        checked * 2 > total,
        "only {checked} of {total} positions had a margin > 1e-2"
    );
}

fn tiny_engine(seed: u64) -> CpuEngine {
    let model = synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), seed).expect("synth");
    CpuEngine::new(Arc::new(model)).expect("engine")
}

fn all_positions(engine: &mut CpuEngine, ids: &[u32]) -> Vec<Vec<f32>> {
    ids.iter()
        .map(|&id| {
            engine
                .step(id, Readout::Logits)
                .expect("step")
                .logits()
                .expect("logits")
                .to_vec()
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn prefill_and_reset_are_bit_exact() {
    let mut engine = tiny_engine(11);
    let vocab = engine.config().vocab;
    let ids = token_ids(1234, 40, vocab);
    let stepped = all_positions(&mut engine, &ids);
    assert_eq!(engine.position(), ids.len() as u64);

    // Prefill of every prefix length (fresh state each time, via reset).
    for n in [1, 2, 3, 9, 10, 11, 17, 40] {
        engine.reset();
        assert_eq!(engine.position(), 0);
        let last = engine.prefill(&ids[..n]).expect("prefill");
        assert_eq!(engine.position(), n as u64);
        assert_eq!(
            bits(&last),
            bits(&stepped[n - 1]),
            "prefill of {n} tokens differs from stepping"
        );
        // Steps without logits return None.
        engine.reset();
        for &id in &ids[..n - 1] {
            assert!(engine.step(id, Readout::None).expect("step").is_none());
        }
        let last = engine
            .step(ids[n - 1], Readout::Logits)
            .expect("step")
            .logits()
            .expect("logits");
        assert_eq!(bits(last), bits(&stepped[n - 1]));
    }

    // Reset, then the same run again: bit-identical at every position.
    engine.reset();
    let again = all_positions(&mut engine, &ids);
    for (t, (a, b)) in again.iter().zip(&stepped).enumerate() {
        assert_eq!(bits(a), bits(b), "position {t} differs after reset");
    }

    // A different run in between must not leak into the next one.
    engine.reset();
    let other = token_ids(999, 25, vocab);
    all_positions(&mut engine, &other);
    engine.reset();
    let third = all_positions(&mut engine, &ids);
    for (t, (a, b)) in third.iter().zip(&stepped).enumerate() {
        assert_eq!(
            bits(a),
            bits(b),
            "position {t} differs after reset from another run"
        );
    }

    // And a fresh engine agrees too.
    let mut fresh = tiny_engine(11);
    let fresh_logits = all_positions(&mut fresh, &ids);
    for (t, (a, b)) in fresh_logits.iter().zip(&stepped).enumerate() {
        assert_eq!(bits(a), bits(b), "position {t} differs on a fresh engine");
    }
}

/// A small model whose CQ matrices take the 8-lane SIMD kernels (group 128 at 2
/// and 4 bits), with a sink + window ring that wraps inside the prompt.
fn simd_engine(seed: u64) -> CpuEngine {
    let config = simd_config();
    let model = synth_model(&config, &BitsPlan::standard(), seed).expect("synth");
    CpuEngine::new(Arc::new(model)).expect("engine")
}

/// [`simd_engine`]'s config (also the fast-precision tests' wide archive).
pub(crate) fn simd_config() -> Config {
    let config = Config {
        vocab: 300,
        hidden: 128,
        layers: 3,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        hadamard_dim: 256,
        sink: 2,
        window: 7,
        engram: Some(EngramConfig {
            sites: vec![1],
            orders: vec![2, 3],
            hash_heads: 2,
            dim: 24,
            taps: 3,
            dilation: 2,
        }),
        ..Config::preset_tiny()
    };
    config.validate().expect("valid config");
    config
}

#[test]
fn prefill_chunks_match_steps_bit_for_bit() {
    // The batched prefill (layer by layer over chunks, the batched matvec, causal
    // attention inside a chunk) against one step per token: identical logits at
    // every cut, whatever the chunk length (1 .. longer than the prompt; the pool
    // switches to the batched kernel at 4 tokens per thread), across the window
    // wrap, and an identical state afterwards (KV cache, engram rings, history:
    // the decode steps that follow agree too).
    for (label, make) in [
        ("simd", simd_engine as fn(u64) -> CpuEngine),
        ("tiny", tiny_engine),
    ] {
        let mut stepper = make(8);
        let vocab = stepper.config().vocab;
        let ids = token_ids(4321, 45, vocab);
        let stepped = all_positions(&mut stepper, &ids);
        let cuts = [0usize, 1, 9, 26, 40, 45];
        for chunk in [1usize, 3, 8, 11, 64] {
            let mut e = make(8);
            e.set_prefill_chunk(chunk);
            for w in cuts.windows(2) {
                let (a, b) = (w[0], w[1]);
                let got = e
                    .step_many(&ids[a..b], Readout::Logits)
                    .expect("prefill")
                    .logits()
                    .expect("logits");
                assert_eq!(
                    bits(got),
                    bits(&stepped[b - 1]),
                    "{label}: chunk {chunk}, logits after ids {a}..{b}"
                );
                assert_eq!(e.position(), b as u64);
            }
            // Without logits, then the state must still be the stepped one.
            e.reset();
            assert!(e
                .step_many(&ids[..30], Readout::None)
                .expect("prefill")
                .is_none());
            for (t, &id) in ids.iter().enumerate().skip(30) {
                let got = e
                    .step(id, Readout::Logits)
                    .expect("step")
                    .logits()
                    .expect("logits");
                assert_eq!(
                    bits(got),
                    bits(&stepped[t]),
                    "{label}: chunk {chunk}, decode at {t} after a prefill of 30"
                );
            }
        }
    }
}

#[test]
fn out_of_range_token_leaves_state_unchanged() {
    let mut engine = tiny_engine(5);
    let mut clean = tiny_engine(5);
    let vocab = engine.config().vocab;
    let ids = token_ids(77, 30, vocab);
    let bad_tokens = [vocab as u32, vocab as u32 + 1, u32::MAX];

    // At position 0, and then interleaved with good tokens (also past the KV wrap).
    for bad in bad_tokens {
        match engine.step(bad, Readout::Logits) {
            Err(Error::TokenOutOfRange { token, vocab: v }) => {
                assert_eq!(token, bad);
                assert_eq!(v, vocab);
            }
            other => panic!("expected TokenOutOfRange, got {other:?}"),
        }
        assert_eq!(engine.position(), 0);
    }
    for (t, &id) in ids.iter().enumerate() {
        if t % 3 == 0 {
            for bad in bad_tokens {
                for want in [false, true] {
                    let err = engine
                        .step(bad, Readout::logits_if(want))
                        .expect_err("bad token accepted");
                    assert!(
                        matches!(err, Error::TokenOutOfRange { token, vocab: v } if token == bad && v == vocab),
                        "unexpected error {err:?}"
                    );
                    assert_eq!(engine.position(), t as u64);
                }
            }
        }
        let a = engine
            .step(id, Readout::Logits)
            .expect("step")
            .logits()
            .expect("logits")
            .to_vec();
        let b = clean
            .step(id, Readout::Logits)
            .expect("step")
            .logits()
            .expect("logits")
            .to_vec();
        assert_eq!(
            bits(&a),
            bits(&b),
            "position {t} differs after a rejected token"
        );
    }

    // The probed step rejects it the same way.
    let pos = engine.position();
    let mut rec = Recorder::default();
    assert!(matches!(
        engine.step_probed(vocab as u32, true, Some(&mut rec)),
        Err(Error::TokenOutOfRange { .. })
    ));
    assert_eq!(engine.position(), pos);

    // Prefill stops at the bad id; the ids before it stay processed.
    engine.reset();
    clean.reset();
    let err = engine
        .prefill(&[ids[0], ids[1], vocab as u32, ids[2]])
        .expect_err("bad token accepted by prefill");
    assert!(matches!(err, Error::TokenOutOfRange { .. }));
    assert_eq!(engine.position(), 2);
    clean.step(ids[0], Readout::None).expect("step");
    clean.step(ids[1], Readout::None).expect("step");
    let a = engine
        .step(ids[2], Readout::Logits)
        .expect("step")
        .logits()
        .expect("logits")
        .to_vec();
    let b = clean
        .step(ids[2], Readout::Logits)
        .expect("step")
        .logits()
        .expect("logits")
        .to_vec();
    assert_eq!(bits(&a), bits(&b));
}

fn check_logit_scale(label: &str, config: &Config, plan: &BitsPlan, steps: usize) {
    let model = synth_model(config, plan, 42).expect("synth");
    let mut engine = CpuEngine::new(Arc::new(model)).expect("engine");
    let ids = token_ids(4242, steps, config.vocab);
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for (t, &id) in ids.iter().enumerate() {
        let logits = engine
            .step(id, Readout::Logits)
            .expect("step")
            .logits()
            .expect("logits");
        assert_eq!(logits.len(), config.vocab);
        assert!(
            logits.iter().all(|v| v.is_finite()),
            "{label}: non-finite logits at position {t}"
        );
        let n = logits.len() as f64;
        let mean = logits.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = logits
            .iter()
            .map(|&v| (v as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        let sd = var.sqrt();
        lo = lo.min(sd);
        hi = hi.max(sd);
        assert!(
            (0.1..=10.0).contains(&sd),
            "{label}: position {t} logit std {sd} outside 0.1..=10"
        );
    }
    eprintln!("{label}: logit std over {steps} steps in {lo:.3}..={hi:.3}");
}

#[test]
fn logits_are_finite_and_well_scaled() {
    check_logit_scale("tiny", &Config::preset_tiny(), &BitsPlan::mixed(), 100);
    check_logit_scale(
        "default",
        &Config::preset_default(),
        &BitsPlan::standard(),
        100,
    );
}

#[test]
fn kernel_selection_follows_cqlm_cpu_kernels() {
    let avail = cqlm::host::simd::CpuSimd::available();
    let sel = cqlm::host::simd::CpuSimd::selected();
    eprintln!("CPU kernels: {} (available: {avail:?})", sel.name());
    match std::env::var("CQLM_CPU_KERNELS").as_deref() {
        Ok("scalar") => assert_eq!(sel, cqlm::host::simd::CpuSimd::Scalar),
        _ => assert_eq!(Some(&sel), avail.last()),
    }
}

#[test]
fn the_parity_tests_pass_with_the_scalar_kernels_too() {
    // This process runs the SIMD kernels where the CPU has them; rerun the naive
    // reference tests in a child with the scalar loops forced, so both paths are
    // held to the same SPEC §6 bounds; the fast-precision engine tests too
    // (SPEC §6.1, its scalar integer kernel).
    if std::env::var_os("CQLM_CPU_KERNELS").is_some() {
        return; // already a child (or forced by the caller): no recursion
    }
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .env("CQLM_CPU_KERNELS", "scalar")
        .args([
            "naive_reference",
            "kernel_selection",
            "prefill_",
            "fast_engine::",
        ])
        .output()
        .expect("rerun the tests");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scalar-kernel run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("test result: ok. 8 passed"),
        "expected the 8 filtered tests to run: {stdout}"
    );
}
