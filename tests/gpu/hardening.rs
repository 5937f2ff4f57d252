//! Non-finite values are reported, not returned; engines are Send and independent
//! across threads.

use crate::common::gpu::gpu;
use crate::common::StepLogits;
use cqlm::archive::{write_archive, Tensor};
use cqlm::cq::BitsPlan;
use cqlm::cq::CqMatrix;
use cqlm::diag::parity::run_ladder;
use cqlm::gpu::GpuEngine;
use cqlm::make::synth::synth_tensors;
use cqlm::Readout;
use cqlm::{Config, CpuEngine, Engine, Error, Model};
use half::f16;
use std::sync::Arc;

/// `tiny` with one norm of `layers.1.wq` set to +inf.
fn model_with_inf_norm() -> Arc<Model> {
    model_with_norm("layers.1.wq", f16::INFINITY)
}

/// `tiny` with one norm of the CQ matrix `name` set to `value`.
fn model_with_norm(name: &str, value: f16) -> Arc<Model> {
    let c = Config::preset_tiny();
    let mut tensors = synth_tensors(&c, &BitsPlan::mixed(), 5);
    let Some(Tensor::Cq(m)) = tensors.get(name) else {
        panic!("no {name}")
    };
    let mut norms = m.norms_f16();
    norms[3] = value;
    let bad = CqMatrix::new(
        m.cols(),
        m.codebook().to_vec(),
        norms,
        [m.rows(), m.groups()],
        m.packed().to_vec(),
        [m.rows(), m.row_bytes()],
    )
    .unwrap();
    tensors.insert(name.into(), Tensor::Cq(bad));
    let bytes = write_archive(&c, None, &tensors).unwrap();
    Arc::new(Model::from_bytes(&bytes, "inf-norm").expect("an Inf norm is a valid archive"))
}

#[test]
fn cpu_names_the_first_non_finite_tensor() {
    let model = model_with_inf_norm();
    let mut e = CpuEngine::new(model).unwrap();
    match e.step(1, Readout::Logits) {
        Err(Error::NonFinite { tensor, position }) => {
            assert_eq!(tensor, "layer 1 q");
            assert_eq!(position, 0);
        }
        other => panic!(
            "expected NonFinite, got {:?}",
            other.map(|l| l.logits().map(|l| l.len()))
        ),
    }
    // Also without logits.
    assert!(matches!(
        e.step(2, Readout::None),
        Err(Error::NonFinite { .. })
    ));
    // The batched prefill names what the first step names, with or without the
    // chunk's batched matvec (1 and 64 tokens per chunk).
    prefill_names(model_with_inf_norm, "layer 1 q");
}

/// A prefill of nine tokens by a fresh engine of `model()`, in chunks of 1 and
/// of 64, fails naming `tensor` at position 0.
fn prefill_names(model: impl Fn() -> Arc<Model>, tensor: &str) {
    for chunk in [1, 64] {
        let mut e = CpuEngine::new(model()).unwrap();
        e.set_prefill_chunk(chunk);
        match e.step_many(&[1, 5, 9, 13, 17, 21, 25, 29, 33], Readout::None) {
            Err(Error::NonFinite {
                tensor: t,
                position,
            }) => {
                assert_eq!((t.as_str(), position), (tensor, 0), "chunk {chunk}");
            }
            other => panic!(
                "chunk {chunk}: expected NonFinite, got {:?}",
                other.map(|l| !l.is_none())
            ),
        }
    }
}

#[test]
fn cpu_names_a_gated_attention_output_whose_gate_is_nan() {
    // A NaN norm of wg: the gate (not checked itself) is NaN in one row, so
    // the first non-finite tensor is the gated attention output, which the
    // pool parts scan as they write it, in a step and in chunks alike.
    prefill_names(
        || model_with_norm("layers.2.wg", f16::NAN),
        "layer 2 attn_o",
    );
}

#[test]
fn gpu_refuses_non_finite_logits_and_parity_names_the_tensor() {
    let Some(ctx) = gpu() else { return };
    let model = model_with_inf_norm();
    let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    match g.step(1, Readout::Logits) {
        Err(Error::NonFinite { tensor, position }) => {
            assert!(tensor.starts_with("logits"), "{tensor}");
            assert_eq!(position, 0);
        }
        other => panic!(
            "expected NonFinite, got {:?}",
            other.map(|l| l.logits().map(|l| l.len()))
        ),
    }
    // The greedy step (argmax on the device) refuses them too.
    let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    assert!(matches!(
        g.step(1, Readout::Argmax),
        Err(Error::NonFinite { position: 0, .. })
    ));
    let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let ladder = run_ladder(&model, &ctx, &mut g, &[1, 2, 3], 0).unwrap();
    assert_eq!(
        ladder.first_divergent.as_deref(),
        Some("position 0 layer 1 q"),
        "{ladder:#?}"
    );
}

fn run(engine: &mut dyn Engine, ids: &[u32]) -> Vec<Vec<f32>> {
    ids.iter().map(|&t| engine.logits_after(t)).collect()
}

#[test]
fn two_sessions_in_two_threads_match_running_alone() {
    let model = Arc::new(
        cqlm::make::synth::synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 2).unwrap(),
    );
    let a_ids: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 256).collect();
    let b_ids: Vec<u32> = (0..24).map(|i| (i * 91 + 11) % 256).collect();
    let ctx = gpu();
    let make = |m: &Arc<Model>| -> Box<dyn Engine> {
        match &ctx {
            Some(c) => Box::new(GpuEngine::with_context(Arc::clone(m), Arc::clone(c)).unwrap()),
            None => Box::new(CpuEngine::new(Arc::clone(m)).unwrap()),
        }
    };
    let alone_a = run(make(&model).as_mut(), &a_ids);
    let alone_b = run(make(&model).as_mut(), &b_ids);
    let (mut ea, mut eb) = (make(&model), make(&model));
    let (ra, rb) = std::thread::scope(|s| {
        let ta = s.spawn(|| run(ea.as_mut(), &a_ids));
        let tb = s.spawn(|| run(eb.as_mut(), &b_ids));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    assert_eq!(ra, alone_a);
    assert_eq!(rb, alone_b);
}

#[test]
fn an_archive_larger_than_memory_fails_cleanly() {
    // A sparse file of 1 TiB: no disk used, but far past any machine's free memory.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.cqlm");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(1 << 40).unwrap();
    let err = Model::load(&path).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Alloc { .. }), "{msg}");
    assert!(
        msg.contains("huge.cqlm") && msg.contains("available memory"),
        "{msg}"
    );
}

/// `tiny` with random weights (mixed bit widths, engram on).
fn tiny_model(seed: u64) -> Arc<Model> {
    let c = Config::preset_tiny();
    Arc::new(cqlm::make::synth::synth_model(&c, &BitsPlan::mixed(), seed).unwrap())
}

/// The message of an expected [`Error::Gpu`].
fn gpu_error<T: std::fmt::Debug>(r: cqlm::Result<T>, what: &str) -> String {
    match r {
        Err(Error::Gpu(msg)) => msg,
        other => panic!("{what}: expected Error::Gpu, got {other:?}"),
    }
}

#[test]
fn a_validation_error_inside_the_step_is_an_error_not_a_panic() {
    // Each gpu() call opens its own device, so the sticky error stays in this test.
    let Some(ctx) = gpu() else { return };
    let model = tiny_model(21);
    let mut g =
        GpuEngine::with_fault(model, Arc::clone(&ctx), cqlm::gpu::Fault::InvalidDispatch).unwrap();
    for want_logits in [true, false] {
        let msg = gpu_error(
            g.step(1, Readout::logits_if(want_logits))
                .map(|l| l.logits().map(<[f32]>::len)),
            "bad step",
        );
        // One line naming the kernel (the fault is a copy of the head's first
        // dispatch with too many workgroups), then wgpu's reason.
        assert!(msg.starts_with("kernel `gather"), "{msg}");
        assert!(msg.contains("dispatch group size"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }
    // Once the device reported an error, every later step says so again.
    let again = gpu_error(g.step(2, Readout::Logits).map(|_| ()), "later step");
    assert!(again.starts_with("kernel `gather"), "{again}");
}

#[test]
fn a_device_lost_during_a_step_names_what_it_was_running() {
    let Some(ctx) = gpu() else { return };
    let model = tiny_model(23);
    let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    assert!(g.logits_after(1).iter().all(|v| v.is_finite()));
    ctx.lose_device_after_next_submit_for_test();
    let msg = gpu_error(
        g.step(2, Readout::Logits)
            .map(|l| l.logits().map(<[f32]>::len)),
        "a step during which the device is lost",
    );
    // The step's one submit: its dispatch count and its first and last kernels
    // (a lost device does not say which dispatch it was on).
    let (_, with_logits) = g.dispatches_per_token();
    assert!(msg.starts_with("the GPU device was lost"), "{msg}");
    assert!(
        msg.contains(&format!(
            "while running a submit of {with_logits} dispatches, kernels `gather"
        )),
        "{msg}"
    );
    assert!(msg.contains("` to `matvec"), "{msg}");
    // Every later step says the same, and nothing panics or hangs.
    let again = gpu_error(
        g.step(3, Readout::None).map(|_| ()),
        "a step after the loss",
    );
    assert_eq!(again, msg);
}

#[test]
fn device_loss_is_an_error_from_step_not_a_panic_or_hang() {
    let Some(ctx) = gpu() else { return };
    let model = tiny_model(22);
    let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let before = g.logits_after(1);
    assert!(before.iter().all(|v| v.is_finite()));
    ctx.lose_device_for_test();
    for (token, want_logits) in [(2, true), (3, false), (4, true)] {
        let msg = gpu_error(
            g.step(token, Readout::logits_if(want_logits))
                .map(|l| l.logits().map(<[f32]>::len)),
            "step after device loss",
        );
        assert!(msg.contains("lost"), "{msg}");
    }
    // A new engine on the lost device fails cleanly too.
    let e = GpuEngine::with_context(model, ctx).map(|_| ());
    assert!(matches!(e, Err(Error::Gpu(_))), "{e:?}");
}

#[test]
fn a_row_larger_than_the_storage_binding_names_the_tensor_and_the_limit() {
    // Splitting works by whole rows (tested in gpu_engine.rs); a single row that
    // can't fit one binding is refused up front, naming the tensor and the limit.
    let Some(_) = gpu() else { return };
    let opts = cqlm::gpu::GpuOptions {
        max_storage_binding: Some(64),
        ..Default::default()
    };
    let ctx = cqlm::gpu::GpuContext::new(&opts, 0).unwrap();
    let model = tiny_model(23);
    let msg = gpu_error(
        GpuEngine::with_context(model, ctx).map(|_| ()),
        "64-byte bindings",
    );
    assert!(msg.contains("tensor `"), "{msg}");
    assert!(msg.contains("64 bytes"), "{msg}");
}
