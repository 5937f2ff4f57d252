//! `EngineBuilder`: auto never picks a software GPU adapter unless asked, every
//! option reaches the engine. (The CLI's backend flags are
//! `tests/bin/backend_cli.rs`.)

use crate::common::gpu::{adapter_env_set, only_software_adapters};
use cqlm::cq::BitsPlan;
use cqlm::gpu::{list_adapters, GpuOptions};
use cqlm::make::synth::synth_model;
use cqlm::session::builder::AnyEngine;
use cqlm::{Backend, Config, EngineBuilder, Readout};
use std::sync::Arc;

fn tiny() -> Arc<cqlm::Model> {
    Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 5).unwrap())
}

#[test]
fn auto_takes_the_cpu_when_the_only_adapters_are_software_and_a_gpu_otherwise() {
    if adapter_env_set() {
        eprintln!("skipping: CQLM_ADAPTER names an adapter, which auto then always takes");
        return;
    }
    let built = EngineBuilder::new(tiny()).build_any().unwrap();
    let all = list_adapters();
    if only_software_adapters() {
        assert!(matches!(built.engine, AnyEngine::Cpu(_)));
        let why = built.notice.expect("a notice saying why the CPU runs");
        assert!(why.contains("software renderer"), "{why}");
        assert!(why.contains("--backend gpu"), "{why}");
        // Named without its driver details: "llvmpipe (LLVM 15.0.6, 256 bits)" → "llvmpipe".
        let short = all[0].name.split(" (").next().unwrap();
        assert!(why.contains(&format!("({short})")), "{why}");
    } else if all.is_empty() {
        assert!(matches!(built.engine, AnyEngine::Cpu(_)));
        assert!(built.notice.unwrap().contains("no GPU adapter"));
    } else {
        assert!(
            matches!(built.engine, AnyEngine::Gpu(_)),
            "a hardware adapter exists"
        );
        assert!(built.notice.is_none());
    }
}

#[test]
fn auto_and_gpu_run_on_a_software_adapter_when_asked() {
    let Some(_) = crate::common::gpu::gpu() else {
        return;
    };
    let soft: Vec<_> = list_adapters()
        .into_iter()
        .filter(|a| a.device_type == wgpu::DeviceType::Cpu)
        .collect();
    let Some(a) = soft.first() else {
        eprintln!("skipping: no software adapter");
        return;
    };
    let opts = GpuOptions {
        adapter: Some(a.name.clone()),
        ..Default::default()
    };
    for backend in [Backend::Auto(opts.clone()), Backend::Gpu(opts.clone())] {
        let built = EngineBuilder::new(tiny())
            .backend(backend)
            .build_any()
            .unwrap();
        assert!(matches!(built.engine, AnyEngine::Gpu(_)));
        assert!(built.notice.is_none());
    }
    let (g, _) = EngineBuilder::new(tiny())
        .backend(Backend::Gpu(GpuOptions::default()))
        .build()
        .unwrap();
    assert!(g.describe().starts_with("gpu"), "{}", g.describe());
}

#[test]
fn the_prefill_chunk_reaches_either_engine_and_keeps_the_logits() {
    let model = tiny();
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 256).collect();
    let mut cpu_logits = Vec::new();
    for chunk in [None, Some(1), Some(7)] {
        let (mut e, _) = EngineBuilder::new(Arc::clone(&model))
            .backend(Backend::Cpu)
            .prefill_chunk(chunk)
            .build()
            .unwrap();
        assert_eq!(e.prefill_chunk(), chunk.unwrap_or(256));
        cpu_logits.push(e.prefill(&ids).unwrap());
    }
    assert!(cpu_logits.windows(2).all(|w| w[0] == w[1]));
    let Some(_) = crate::common::gpu::gpu() else {
        return;
    };
    for chunk in [Some(1), Some(7), Some(1000)] {
        let (mut e, _) = EngineBuilder::new(Arc::clone(&model))
            .backend(Backend::Gpu(GpuOptions::default()))
            .prefill_chunk(chunk)
            .build()
            .unwrap();
        let slots = cqlm::gpu::PREFILL_SLOTS;
        assert_eq!(e.prefill_chunk(), chunk.unwrap().min(slots));
        let l = e
            .step_many(&ids, Readout::Logits)
            .unwrap()
            .logits()
            .unwrap();
        assert_eq!(l.len(), 256);
    }
}
