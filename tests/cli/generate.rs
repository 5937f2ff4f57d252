//! Sampling, sessions and long generation runs.

use crate::common::gpu::gpu;
use crate::common::StepLogits;
use cqlm::cq::BitsPlan;
use cqlm::make::synth::synth_model;
use cqlm::session::sample::{argmax, top2_margin, Sampler, SamplerConfig};
use cqlm::session::{Backend, Finish, Session};
use cqlm::{Config, CpuEngine, Engine, GpuEngine};
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

#[test]
fn long_generation_stays_finite_and_gpu_matches_cpu_where_margins_allow() {
    // 4,000 tokens on tiny: the KV ring (sink 2 + window 8) and the engram rings
    // wrap hundreds of times. Teacher-forced by the CPU's greedy choice.
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 21).unwrap());
    let mut c = CpuEngine::new(Arc::clone(&model)).unwrap();
    let mut g = gpu().map(|ctx| GpuEngine::with_context(Arc::clone(&model), ctx).unwrap());
    let mut lc = c.prefill(&[1, 7]).unwrap();
    let mut lg = g.as_mut().map(|g| g.prefill(&[1, 7]).unwrap());
    let (mut compared, mut agreed) = (0usize, 0usize);
    for step in 0..4000 {
        assert!(
            lc.iter().all(|v| v.is_finite()),
            "cpu logits not finite at {step}"
        );
        let next = argmax(&lc);
        if let Some(lg) = &lg {
            assert!(
                lg.iter().all(|v| v.is_finite()),
                "gpu logits not finite at {step}"
            );
            if top2_margin(&lc) > 1e-2 {
                compared += 1;
                agreed += (argmax(lg) == next) as usize;
            }
        }
        lc = c.logits_after(next);
        if let (Some(g), Some(l)) = (g.as_mut(), lg.as_mut()) {
            *l = g.logits_after(next);
        }
    }
    if g.is_some() {
        assert_eq!(
            agreed,
            compared,
            "GPU disagreed with the CPU at {} of {compared} positions",
            compared - agreed
        );
        assert!(
            compared > 2000,
            "only {compared} positions had a usable margin"
        );
    }
}

/// A word-level tokenizer over the first ids of `tiny`; "<s>" is BOS (1), "</s>" EOS (2).
fn word_tokenizer() -> String {
    let mut vocab = serde_json::Map::new();
    for (i, w) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(w.to_string(), i.into());
    }
    for i in 3..256u32 {
        vocab.insert(format!("w{i}"), i.into());
    }
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": false},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
    .to_string()
}

fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cli_generates_text_deterministically_and_honours_stop_strings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("words.cqlm");
    let c = Config::preset_tiny();
    let tensors = cqlm::make::synth::synth_tensors(&c, &BitsPlan::mixed(), 6);
    cqlm::archive::write_archive_file(&path, &c, Some(&word_tokenizer()), &tensors).unwrap();
    let p = path.to_str().unwrap();
    let base = [
        "generate",
        "--model",
        p,
        "--prompt",
        "w10 w11 w12",
        "--backend",
        "cpu",
        "--max-tokens",
        "12",
    ];
    let sampled = |seed: &str| {
        let mut a = base.to_vec();
        a.extend([
            "--temperature",
            "1.5",
            "--top-k",
            "50",
            "--repeat-penalty",
            "1.3",
            "--seed",
            seed,
        ]);
        let out = cli(&a);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let a = sampled("1");
    eprintln!("sampled text: {a}");
    assert_eq!(a, sampled("1"), "same seed, same text");
    assert!(a.split_whitespace().all(|w| w.starts_with('w')), "{a}");
    let words: Vec<&str> = a.split_whitespace().collect();
    assert!(!words.is_empty());
    // Stop at the third generated word: the output ends before it.
    if words.len() >= 3 {
        let mut s = base.to_vec();
        s.extend([
            "--temperature",
            "1.5",
            "--top-k",
            "50",
            "--repeat-penalty",
            "1.3",
            "--seed",
            "1",
            "--stop",
            words[2],
        ]);
        let out = cli(&s);
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            !text.contains(words[2]) || words[..2].contains(&words[2]),
            "{text}"
        );
        assert!(text.split_whitespace().count() <= 2, "{text}");
    }
    // The stats line.
    let out = cli(&base);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("prompt 4 tokens") && err.contains("decode") && err.contains("cpu"),
        "{err}"
    );
}

#[test]
fn cli_prompt_without_tokenizer_is_a_clear_error() {
    let out = cli(&[
        "generate",
        "--preset",
        "tiny",
        "--prompt",
        "hello",
        "--backend",
        "cpu",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines().last().unwrap_or("").starts_with("error:") && err.contains("tokenizer"),
        "{err}"
    );
}
