//! `Sampler`'s draws (greedy, temperature, top-k, top-p, the repeat penalty,
//! seeds) and a `Session`'s generation against a manual greedy loop. (The
//! 4,000-token run against the GPU is in `tests/gpu/engine.rs`, `cqlm generate`
//! in `tests/bin/generate_cli.rs`.)

use crate::common::StepLogits;
use cqlm::cq::BitsPlan;
use cqlm::make::synth::synth_model;
use cqlm::session::sample::{argmax, Sampler, SamplerConfig};
use cqlm::session::{Backend, Finish, Session};
use cqlm::{Config, CpuEngine, Engine};
use std::sync::Arc;

fn sampler(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Sampler {
    Sampler::new(SamplerConfig {
        temperature,
        top_k,
        top_p,
        seed,
        ..SamplerConfig::default()
    })
    .unwrap()
}

#[test]
fn greedy_and_degenerate_settings_pick_the_argmax() {
    let logits = [0.3f32, 2.5, -1.0, 2.4, 0.0];
    assert_eq!(Sampler::greedy().sample(&logits, &[]), 1);
    assert_eq!(sampler(0.0, 0, 1.0, 9).sample(&logits, &[]), 1);
    for seed in 0..20 {
        assert_eq!(
            sampler(1.5, 1, 1.0, seed).sample(&logits, &[]),
            1,
            "top-k 1"
        );
        assert_eq!(
            sampler(1.5, 0, 1e-6, seed).sample(&logits, &[]),
            1,
            "tiny top-p"
        );
    }
}

#[test]
fn temperature_sampling_follows_the_softmax() {
    // p ∝ (1, 2, 3) at temperature 1.
    let logits = [0.0f32, 2f32.ln(), 3f32.ln()];
    let mut s = sampler(1.0, 0, 1.0, 42);
    let n = 30000;
    let mut counts = [0usize; 3];
    for _ in 0..n {
        counts[s.sample(&logits, &[]) as usize] += 1;
    }
    for (i, want) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].iter().enumerate() {
        let got = counts[i] as f64 / n as f64;
        assert!((got - want).abs() < 0.012, "token {i}: {got} vs {want}");
    }
    // Temperature 0.5 squares the odds: p ∝ (1, 4, 9).
    let mut s = sampler(0.5, 0, 1.0, 43);
    let mut c2 = 0usize;
    for _ in 0..n {
        c2 += (s.sample(&logits, &[]) == 2) as usize;
    }
    assert!((c2 as f64 / n as f64 - 9.0 / 14.0).abs() < 0.012);
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    // p = (0.5, 0.3, 0.2): top-p 0.6 keeps tokens 0 and 1 only, in ratio 5:3.
    let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
    let mut s = sampler(1.0, 0, 0.6, 5);
    let mut counts = [0usize; 3];
    for _ in 0..20000 {
        counts[s.sample(&logits, &[]) as usize] += 1;
    }
    assert_eq!(counts[2], 0);
    let r = counts[0] as f64 / (counts[0] + counts[1]) as f64;
    assert!((r - 0.625).abs() < 0.015, "{r}");
}

#[test]
fn repeat_penalty_applies_once_per_recent_token() {
    let logits = [2.0f32, 1.9, -1.0];
    let mut s = Sampler::new(SamplerConfig {
        repeat_penalty: 1.2,
        ..SamplerConfig::default()
    })
    .unwrap();
    // Token 0 was seen: 2.0 / 1.2 < 1.9, so token 1 wins, however often 0 repeats.
    assert_eq!(s.sample(&logits, &[0, 0, 0]), 1);
    // Both seen: both divided by 1.2 once, so their order stays.
    assert_eq!(s.sample(&logits, &[0, 1, 0, 1]), 0);
    // Tokens older than the window are not penalised.
    let old: Vec<u32> = std::iter::once(0)
        .chain(std::iter::repeat_n(2, 64))
        .collect();
    assert_eq!(s.sample(&logits, &old), 0);
}

#[test]
fn sampling_is_deterministic_per_seed() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 7 % 13) as f32) * 0.1).collect();
    let run = |seed| {
        let mut s = sampler(1.0, 20, 0.95, seed);
        (0..40).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
    assert!(Sampler::new(SamplerConfig {
        temperature: -1.0,
        ..Default::default()
    })
    .is_err());
    assert!(Sampler::new(SamplerConfig {
        top_p: 0.0,
        ..Default::default()
    })
    .is_err());
}

#[test]
fn session_generates_what_a_manual_greedy_loop_does() {
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 8).unwrap());
    let mut session = Session::new(Arc::clone(&model), Backend::Cpu).unwrap();
    let prompt = [1u32, 40, 41, 42];
    session.prefill(&prompt).unwrap();
    let mut got = Vec::new();
    let stop = session
        .generate(&mut Sampler::greedy(), 12, |id| {
            got.push(id);
            true
        })
        .unwrap();
    let mut e = CpuEngine::new(Arc::clone(&model)).unwrap();
    let mut logits = e.prefill(&prompt).unwrap();
    let mut want = Vec::new();
    for _ in 0..12 {
        let next = argmax(&logits);
        if next == model.config.eos {
            break;
        }
        want.push(next);
        logits = e.logits_after(next);
    }
    assert_eq!(got, want);
    assert_eq!(
        stop,
        if want.len() == 12 {
            Finish::Length
        } else {
            Finish::Eos
        }
    );
    assert_eq!(session.tokens().len(), prompt.len() + got.len());
    // A callback can stop it.
    let mut n = 0;
    let stop = session.generate(&mut Sampler::greedy(), 10, |_| {
        n += 1;
        n < 3
    });
    assert!(matches!(stop, Ok(Finish::Cancelled) | Ok(Finish::Eos)));
    // Out-of-range prompt ids are refused before anything runs.
    let before = session.tokens().len();
    assert!(session.prefill(&[3, 256]).is_err());
    assert_eq!(session.tokens().len(), before);
}

/// Draw `n` times and return each token's share.
fn shares(s: &mut Sampler, logits: &[f32], history: &[u32], n: usize) -> Vec<f64> {
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits, history) as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

#[test]
fn min_p_keeps_the_tokens_at_least_that_likely_relative_to_the_best() {
    // p ∝ (1, 2, 3, 6): min-p 0.4 keeps p ≥ 2.4, i.e. the 3 and the 6.
    let logits = [0.0f32, 2f32.ln(), 3f32.ln(), 6f32.ln()];
    let mut s = Sampler::new(SamplerConfig {
        temperature: 1.0,
        min_p: 0.4,
        seed: 5,
        ..SamplerConfig::default()
    })
    .unwrap();
    let got = shares(&mut s, &logits, &[], 30000);
    for (i, want) in [0.0, 0.0, 1.0 / 3.0, 2.0 / 3.0].iter().enumerate() {
        assert!((got[i] - want).abs() < 0.012, "token {i}: {got:?}");
    }
    // With a top-k too, from the top-k candidates alone: the same cut.
    let mut k = Sampler::new(SamplerConfig {
        temperature: 1.0,
        top_k: 3,
        min_p: 0.4,
        seed: 5,
        ..SamplerConfig::default()
    })
    .unwrap();
    assert_eq!(k.top_k_only(), Some(3));
    let cands = [(logits[3], 3), (logits[2], 2), (logits[1], 1)];
    for _ in 0..200 {
        assert!(k.sample_top_k(&cands) >= 2);
    }
    // Min-p needs the full logits under a top-p: no nucleus shortcut.
    let p = SamplerConfig {
        temperature: 1.0,
        top_p: 0.9,
        min_p: 0.1,
        ..SamplerConfig::default()
    };
    assert_eq!(Sampler::new(p).unwrap().top_p_only(), None);
    assert!(Sampler::new(SamplerConfig {
        min_p: 1.5,
        ..SamplerConfig::default()
    })
    .is_err());
}

#[test]
fn frequency_and_presence_penalties_lower_seen_tokens_by_count_and_once() {
    // Equal logits; token 0 seen twice, token 1 once. Frequency 1: logits
    // (−2, −1, 0); with presence 0.5 as well: (−2.5, −1.5, 0).
    let logits = [0.0f32; 3];
    let history = [0u32, 1, 0];
    for (freq, pres, adjusted) in [
        (1.0f32, 0.0f32, [-2.0f64, -1.0, 0.0]),
        (1.0, 0.5, [-2.5, -1.5, 0.0]),
    ] {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            frequency_penalty: freq,
            presence_penalty: pres,
            seed: 11,
            ..SamplerConfig::default()
        })
        .unwrap();
        assert!(!s.is_greedy() && s.top_k_only().is_none() && s.top_p_only().is_none());
        let total: f64 = adjusted.iter().map(|a| a.exp()).sum();
        let got = shares(&mut s, &logits, &history, 30000);
        for i in 0..3 {
            let want = adjusted[i].exp() / total;
            assert!(
                (got[i] - want).abs() < 0.012,
                "({freq}, {pres}) token {i}: {got:?}"
            );
        }
    }
    // Greedy: the penalty moves the argmax off a seen token.
    let mut g = Sampler::new(SamplerConfig {
        presence_penalty: 0.5,
        ..SamplerConfig::default()
    })
    .unwrap();
    assert_eq!(g.sample(&[1.0, 0.9], &[0]), 1);
    assert_eq!(g.sample(&[1.0, 0.9], &[]), 0);
    assert!(Sampler::new(SamplerConfig {
        frequency_penalty: 2.5,
        ..SamplerConfig::default()
    })
    .is_err());
}
