//! Device-open checks for real GPUs: the workgroup memory limit, the subgroup
//! layout self-test and its fallback, and (in CI) that lavapipe really ran the
//! subgroup size `LP_NATIVE_VECTOR_WIDTH` asks for.

use crate::common::gpu::{gpu, rel_l2};
use crate::common::StepLogits;
use cqlm::cq::BitsPlan;
use cqlm::gpu::{env_flag, DeviceLimits, GpuContext, GpuEngine, GpuOptions};
use cqlm::make::synth::synth_model;
use cqlm::{Config, CpuEngine, Error, Model};
use std::sync::Arc;

fn tiny(seed: u64) -> Arc<Model> {
    Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), seed).unwrap())
}

#[test]
fn webgpus_default_workgroup_memory_takes_the_narrow_staging_and_less_fails_naming_the_kernel() {
    // At WebGPU's default of 16,384 bytes every kernel fits: the cq kernels
    // stage 2048 columns instead of 4096, and the engine steps like the CPU.
    let Some(_) = gpu() else { return };
    let webgpu_run = std::env::var("CQLM_GPU_LIMITS").is_ok_and(|v| v == "webgpu" || v == "compat");
    for (row_matvec, limit) in [(false, 16384u32), (true, 16384), (false, 20736)] {
        if webgpu_run && limit > 16384 {
            continue; // the run caps every device at 16,384 bytes
        }
        let opts = GpuOptions {
            max_workgroup_storage: Some(limit),
            row_matvec: Some(row_matvec),
            ..Default::default()
        };
        let ctx = GpuContext::new(&opts, 1 << 20).unwrap();
        assert_eq!(ctx.caps.max_workgroup_storage, limit);
        let staging = cqlm::gpu::kernels::cq::staging_columns(&ctx);
        assert_eq!(staging, if limit < 20736 { 2048 } else { 4096 }, "{limit}");
        let model = tiny(42);
        let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
        let mut c = CpuEngine::new(model).unwrap();
        for t in [3, 9, 27] {
            let got = g.logits_after(t);
            let want = c.logits_after(t);
            assert!(rel_l2(&got, &want) <= 1e-4, "{limit} rows {row_matvec}");
        }
        // Every pipeline it compiled fits the limit.
        for p in ctx.pipelines() {
            let bytes = cqlm::gpu::Kernel::workgroup_bytes(&p.source, &p.entry).unwrap();
            assert!(
                bytes <= limit,
                "{} ({}) takes {bytes} bytes",
                p.name,
                p.entry
            );
        }
    }
    // Below what the narrow variants need: an error naming the kernel, its
    // bytes and the adapter's limit, without a panic.
    let opts = GpuOptions {
        max_workgroup_storage: Some(8192),
        ..Default::default()
    };
    match GpuEngine::new(tiny(41), &opts) {
        Err(Error::Gpu(msg)) => {
            assert!(msg.contains("limit of 8192 bytes"), "{msg}");
            assert!(msg.contains("workgroup memory"), "{msg}");
            assert!(msg.contains("kernel `"), "{msg}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("an engine over the workgroup memory limit was built"),
    }
}

#[test]
fn webgpus_default_and_compatibility_limits_run_the_engine_as_the_cpu_does() {
    let Some(_) = gpu() else { return };
    // WebGPU's defaults keep the 256-invocation kernels; its compatibility
    // mode (128 invocations, as OpenGL ES 3.1 may allow) takes the narrow ones.
    for (limits, wide) in [(DeviceLimits::WebGpu, 256), (DeviceLimits::Compat, 128)] {
        let opts = GpuOptions {
            limits,
            ..Default::default()
        };
        let ctx = GpuContext::new(&opts, 1 << 20).unwrap();
        assert_eq!(ctx.caps.max_workgroup_storage, 16384);
        assert_eq!(ctx.caps.wide_workgroup, wide, "{limits:?}");
        assert!(ctx.caps.mlp_workgroup.invocations() <= wide, "{limits:?}");
        let model = tiny(43);
        let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
        let mut c = CpuEngine::new(model).unwrap();
        for t in [1, 5, 8] {
            let (got, want) = (g.logits_after(t), c.logits_after(t));
            assert!(rel_l2(&got, &want) <= 1e-4, "{limits:?}");
        }
        // The wide kernels were built at the width the limits allow.
        for p in ctx.pipelines() {
            if let Some((_, w)) = p.constants.iter().find(|(k, _)| k == "WG") {
                assert!(*w <= f64::from(wide), "{} at {w}", p.name);
            }
        }
        assert!(
            ctx.pipelines()
                .iter()
                .any(|p| p.name == "route" && p.constants == [("WG".to_string(), f64::from(wide))]),
            "{limits:?}"
        );
    }
    // A value CQLM_GPU_LIMITS does not know is refused with the values it knows.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cqlm"))
        .args([
            "generate",
            "--backend",
            "gpu",
            "--max-tokens",
            "1",
            "--prompt",
            "a",
        ])
        .env("CQLM_GPU_LIMITS", "browser")
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("CQLM_GPU_LIMITS must be `adapter`, `webgpu` or `compat`"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
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
    let lavapipe = ctx.info.name.contains("llvmpipe") && ctx.info.backend == wgpu::Backend::Vulkan;
    if lavapipe && !env_flag("CQLM_NO_SUBGROUPS") {
        // lavapipe has subgroups, so the self-test really ran (llvmpipe's GL
        // has none: wgpu's GL backend never offers them).
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

/// `.ci/run` runs this binary on several driver stacks and limits and says what
/// each run must get: `CQLM_EXPECT_BACKEND` (`vulkan`, `gl`) and
/// `CQLM_EXPECT_STAGING` (the cq kernels' staging columns: 4096, or 2048 under
/// WebGPU's default limits), so that no run passes on the wrong variant.
#[test]
fn the_run_gets_the_backend_and_variant_ci_asked_for() {
    let Some(ctx) = gpu() else { return };
    if let Ok(want) = std::env::var("CQLM_EXPECT_BACKEND") {
        let got = format!("{:?}", ctx.info.backend).to_lowercase();
        assert_eq!(got, want.to_lowercase(), "{}", ctx.info.name);
    }
    if let Ok(want) = std::env::var("CQLM_EXPECT_STAGING") {
        let got = cqlm::gpu::kernels::cq::staging_columns(&ctx);
        assert_eq!(got.to_string(), want, "{:?}", ctx.caps);
    }
    if let Ok(want) = std::env::var("CQLM_EXPECT_WIDE_WORKGROUP") {
        assert_eq!(ctx.caps.wide_workgroup.to_string(), want, "{:?}", ctx.caps);
    }
}
