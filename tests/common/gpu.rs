//! Opening the test GPU: skip only when no adapter exists and `CQLM_REQUIRE_GPU` is unset.

use cqlm::gpu::{GpuContext, GpuOptions};
use std::sync::Arc;

/// The shared test device, or `None` (test skipped) when no adapter exists and
/// `CQLM_REQUIRE_GPU` is unset. With `CQLM_REQUIRE_GPU=1` a missing adapter panics.
pub fn gpu() -> Option<Arc<GpuContext>> {
    match GpuContext::new(&GpuOptions::default(), 1 << 20) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            let required =
                std::env::var("CQLM_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(
                !required,
                "CQLM_REQUIRE_GPU is set but no GPU is usable: {e}"
            );
            eprintln!("skipping GPU test: {e}");
            None
        }
    }
}

/// A storage buffer of `n` f32 NaNs, so unwritten outputs are caught.
pub fn poisoned(ctx: &GpuContext, n: usize) -> wgpu::Buffer {
    let v = vec![f32::NAN; n];
    ctx.storage_init("poisoned output", bytemuck::cast_slice(&v))
}

/// Relative L2 error `‖a − b‖ / ‖b‖` in f64 (NaN anywhere gives +inf).
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    if a.iter().chain(b).any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Whether every adapter wgpu sees is a software renderer (and there is one).
pub fn only_software_adapters() -> bool {
    let all = cqlm::gpu::list_adapters();
    !all.is_empty() && all.iter().all(|a| a.device_type == wgpu::DeviceType::Cpu)
}

/// Whether `CQLM_ADAPTER` names an adapter.
pub fn adapter_env_set() -> bool {
    std::env::var("CQLM_ADAPTER").is_ok_and(|s| !s.is_empty())
}

/// Assert that `got` and `want`, logits of the same work done in different
/// passes (batched against alone, chunked against stepped), agree as
/// `program` promises: bit for bit on the standard program (its batched and
/// one-token kernels sum in the same order); within rounding (relative L2 ≤
/// 1e-5) on the lean one, whose fused one-token kernels sum in another order
/// than the standard kernels that passes of several tokens run.
pub fn assert_same_work(got: &[f32], want: &[f32], program: cqlm::gpu::ProgramKind, what: &str) {
    match program {
        cqlm::gpu::ProgramKind::Standard => {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got), bits(want), "{what}");
        }
        cqlm::gpu::ProgramKind::Lean => {
            let e = rel_l2(got, want);
            assert!(e <= 1e-5, "{what}: rel L2 {e:.2e} on the lean program");
        }
    }
}
