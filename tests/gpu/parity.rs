//! The parity ladder passes on a correct GPU engine and, on a deliberately broken
//! one, fails at the right rung naming the right tensor.

use crate::common::gpu::gpu;
use cqlm::cq::BitsPlan;
use cqlm::diag::parity::run_ladder;
use cqlm::gpu::{Fault, GpuEngine};
use cqlm::make::synth::synth_model;
use cqlm::Config;
use std::sync::Arc;

fn ids() -> Vec<u32> {
    // 16 tokens: past tiny's sink + window = 10, so the ring wraps.
    vec![1, 5, 9, 200, 3, 3, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41]
}

#[test]
fn healthy_engine_passes_every_rung() {
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 3).unwrap());
    let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let ladder = run_ladder(&model, &ctx, &mut g, &ids(), 8).unwrap();
    assert!(ladder.passed(), "{ladder:#?}");
    assert!(ladder.first_divergent.is_none());
    let rungs: Vec<usize> = ladder.rungs.iter().map(|r| r.rung).collect();
    for r in 1..=7 {
        assert!(rungs.contains(&r), "rung {r} missing: {rungs:?}");
    }
}

#[test]
fn skipping_minus_u_fails_at_layer_zero_update() {
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 3).unwrap());
    let mut g =
        GpuEngine::with_fault(Arc::clone(&model), Arc::clone(&ctx), Fault::SkipMinusU).unwrap();
    let ladder = run_ladder(&model, &ctx, &mut g, &ids(), 8).unwrap();
    assert!(!ladder.passed());
    let failed = ladder.rungs.iter().find(|r| !r.pass).unwrap();
    assert_eq!(failed.rung, 4, "{ladder:#?}");
    assert_eq!(
        ladder.first_divergent.as_deref(),
        Some("position 0 layer 0 update"),
        "{ladder:#?}"
    );
    // Everything before the update of layer 0 still matched.
    let passed: Vec<&str> = ladder
        .rungs
        .iter()
        .filter(|r| r.pass)
        .map(|r| r.name.as_str())
        .collect();
    assert!(
        passed.contains(&"position 0 layer 0 after_attn"),
        "{passed:?}"
    );
}

#[test]
fn rope_at_the_physical_slot_fails_after_the_wrap_at_q() {
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 3).unwrap());
    let c = &model.config;
    let wrap = c.sink + c.window;
    let mut g = GpuEngine::with_fault(
        Arc::clone(&model),
        Arc::clone(&ctx),
        Fault::RopeAtPhysicalSlot,
    )
    .unwrap();
    let ladder = run_ladder(&model, &ctx, &mut g, &ids(), 8).unwrap();
    let failed = ladder
        .rungs
        .iter()
        .find(|r| !r.pass)
        .expect("the fault must be caught");
    assert_eq!(failed.rung, 6, "{ladder:#?}");
    // Positions before the wrap have slot == position, so the first divergence is
    // the first wrapped position's query of layer 0.
    assert_eq!(
        ladder.first_divergent.as_deref(),
        Some(format!("position {wrap} layer 0 q").as_str()),
        "{ladder:#?}"
    );
}

#[test]
fn cli_parity_exits_zero_on_a_healthy_engine_and_prints_json() {
    let Some(_) = gpu() else { return };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args([
            "parity",
            "--preset",
            "tiny",
            "--ids",
            "1,2,3,4,5,6,7,8,9,10,11,12",
            "--generate",
            "4",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rungs = v["rungs"].as_array().unwrap();
    assert!(rungs.len() >= 7);
    assert!(rungs.iter().all(|r| r["pass"] == true));
    assert!(v["first_divergent"].is_null());
}

/// A minimal Hugging Face word-level tokenizer over tiny's first ids.
const TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"<unk>":0,"<s>":1,"</s>":2,"hello":3,"world":4,"again":5},"unk_token":"<unk>"}}"#;

#[test]
fn text_prompts_use_the_embedded_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let c = Config::preset_tiny();
    let tensors = cqlm::make::synth::synth_tensors(&c, &BitsPlan::mixed(), 4);
    let with = dir.path().join("with.cqlm");
    let without = dir.path().join("without.cqlm");
    cqlm::archive::write_archive_file(&with, &c, Some(TOKENIZER), &tensors).unwrap();
    cqlm::archive::write_archive_file(&without, &c, None, &tensors).unwrap();

    // The library: BOS goes in front (this tokenizer's post-processor adds none).
    let model = cqlm::Model::load(&with).unwrap();
    let tok = cqlm::session::tokenizer::TextTokenizer::for_model(&model).unwrap();
    assert_eq!(
        tok.encode("hello world again hello").unwrap(),
        vec![1, 3, 4, 5, 3]
    );
    assert_eq!(tok.decode(&[3, 4]).unwrap(), "hello world");

    let run = |path: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_cqlm"))
            .args([
                "parity",
                "--model",
                path.to_str().unwrap(),
                "--prompt",
                "hello world again",
                "--generate",
                "2",
            ])
            .output()
            .unwrap()
    };
    let out = run(&without);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.starts_with("error:") && err.contains("no embedded tokenizer"),
        "{err}"
    );
    if gpu().is_some() {
        let out = run(&with);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
