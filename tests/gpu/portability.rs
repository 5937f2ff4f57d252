//! Device-open checks for real GPUs: the workgroup memory limit, the subgroup
//! layout self-test and its fallback, and (in CI) that lavapipe really ran the
//! subgroup size `LP_NATIVE_VECTOR_WIDTH` asks for.

use crate::common::gpu::{gpu, rel_l2};
use crate::common::StepLogits;
use cqlm::cq::BitsPlan;
use cqlm::gpu::{env_flag, GpuContext, GpuEngine, GpuOptions};
use cqlm::make::synth::synth_model;
use cqlm::{Config, CpuEngine, Error, Model};
use std::sync::Arc;

fn tiny(seed: u64) -> Arc<Model> {
    Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), seed).unwrap())
}

#[test]
fn a_workgroup_memory_limit_below_a_kernel_fails_engine_construction_naming_it() {
    // Every matvec variant needs more than 16384 bytes (rows: 16640, lanes: 20736),
    // so a WebGPU-default-sized adapter can't run cqlm: the engine must say which
    // kernel, how many bytes and the adapter's limit, without panicking.
    let Some(_) = gpu() else { return };
    let limit = 16384u32;
    let opts = GpuOptions {
        max_workgroup_storage: Some(limit),
        ..Default::default()
    };
    let ctx = GpuContext::new(&opts, 1 << 20).unwrap();
    assert_eq!(ctx.caps.max_workgroup_storage, limit);
    match GpuEngine::with_context(tiny(41), ctx) {
        Err(Error::Gpu(msg)) => {
            assert!(msg.contains("limit of 16384 bytes"), "{msg}");
            assert!(msg.contains("workgroup memory"), "{msg}");
            assert!(msg.contains("kernel `matvec"), "{msg}");
            let needs = ["16640 bytes", "20736 bytes"];
            assert!(needs.iter().any(|n| msg.contains(n)), "{msg}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("an engine over the workgroup memory limit was built"),
    }
    // Through GpuEngine::new as well (the option travels in GpuOptions).
    let Err(err) = GpuEngine::new(tiny(41), &opts) else {
        panic!("over the limit, yet built");
    };
    assert!(err.to_string().contains("16384"), "{err}");
    // At exactly the largest kernel's need (the lanes matvec, 20736 bytes) every
    // kernel fits and the engine steps like the CPU.
    let opts = GpuOptions {
        max_workgroup_storage: Some(20736),
        ..Default::default()
    };
    let model = tiny(42);
    let mut g = GpuEngine::new(Arc::clone(&model), &opts).unwrap();
    let mut c = CpuEngine::new(model).unwrap();
    let got = g.logits_after(3);
    let want = c.logits_after(3);
    assert!(rel_l2(&got, &want) <= 1e-4);
}

#[test]
fn the_subgroup_layout_self_test_passes_here() {
    let Some(ctx) = gpu() else { return };
    assert_eq!(ctx.subgroup_fallback, None, "self-test failed");
    let has = ctx.device.features().contains(wgpu::Features::SUBGROUP);
    if has && !env_flag("CQLM_NO_SUBGROUPS") {
        assert!(ctx.caps.subgroups);
        assert!(ctx.caps.subgroup_min >= 1 && ctx.caps.subgroup_min <= ctx.caps.subgroup_max);
    }
    if ctx.info.name.contains("llvmpipe") && !env_flag("CQLM_NO_SUBGROUPS") {
        // lavapipe has subgroups, so the self-test really ran.
        assert!(ctx.caps.subgroups, "lavapipe without subgroups?");
    }
}

#[test]
fn a_failed_subgroup_self_test_falls_back_to_the_portable_kernels() {
    let Some(_) = gpu() else { return };
    let opts = GpuOptions {
        fail_subgroup_self_test: true,
        ..Default::default()
    };
    let ctx = GpuContext::new(&opts, 1 << 20).unwrap();
    assert!(!ctx.caps.subgroups);
    assert_eq!((ctx.caps.subgroup_min, ctx.caps.subgroup_max), (0, 0));
    let subgroups_were_on = ctx.device.features().contains(wgpu::Features::SUBGROUP);
    if subgroups_were_on {
        let why = ctx.subgroup_fallback.as_deref().expect("a reason");
        assert!(why.contains("self-test failed"), "{why}");
    }
    // The engine on that context runs the portable kernels and still matches
    // the CPU over a few steps (past the tiny window).
    let model = tiny(43);
    let mut g = GpuEngine::with_context(Arc::clone(&model), ctx).unwrap();
    let mut c = CpuEngine::new(model).unwrap();
    for (t, id) in [5u32, 1, 9, 2, 7, 3, 3, 8, 1, 4].into_iter().enumerate() {
        let got = g.logits_after(id);
        let want = c.logits_after(id);
        let e = rel_l2(&got, &want);
        assert!(e <= 1e-4, "position {t}: rel L2 {e}");
    }
}

#[test]
fn lavapipe_runs_the_subgroup_size_lp_native_vector_width_implies() {
    // CI runs the GPU tests at LP_NATIVE_VECTOR_WIDTH = 1024 and 128 (subgroups of
    // 32 and 4) besides the default; this proves those runs got those sizes.
    let Some(ctx) = gpu() else { return };
    let Ok(width) = std::env::var("LP_NATIVE_VECTOR_WIDTH") else {
        eprintln!("LP_NATIVE_VECTOR_WIDTH unset: nothing to check");
        return;
    };
    if !ctx.info.name.contains("llvmpipe") {
        eprintln!(
            "adapter `{}` is not llvmpipe: nothing to check",
            ctx.info.name
        );
        return;
    }
    let want: u32 = width.parse::<u32>().expect("a bit count") / 32;
    assert_eq!(
        (ctx.info.subgroup_min_size, ctx.info.subgroup_max_size),
        (want, want),
        "LP_NATIVE_VECTOR_WIDTH={width}"
    );
    if ctx.caps.subgroups {
        // The self-test saw this size in the shader too (it checks min..=max).
        assert_eq!((ctx.caps.subgroup_min, ctx.caps.subgroup_max), (want, want));
        assert_eq!(ctx.subgroup_fallback, None);
    }
}
