//! Non-finite values are reported, not returned; engines are Send and independent
//! across threads.

mod common;

use common::gpu::gpu;
use cqlm::archive::{write_archive, Tensor};
use cqlm::cq::CqMatrix;
use cqlm::gpu::GpuEngine;
use cqlm::parity::run_ladder;
use cqlm::synth::{synth_tensors, BitsPlan};
use cqlm::{Config, CpuEngine, Engine, Error, Model};
use half::f16;
use std::sync::Arc;

/// `tiny` with one norm of `layers.1.wq` set to +inf.
fn model_with_inf_norm() -> Arc<Model> {
    let c = Config::preset_tiny();
    let mut tensors = synth_tensors(&c, &BitsPlan::mixed(), 5);
    let Some(Tensor::Cq(m)) = tensors.get("layers.1.wq") else {
        panic!("no wq")
    };
    let mut norms = m.norms_f16();
    norms[3] = f16::INFINITY;
    let bad = CqMatrix::new(
        m.cols(),
        m.codebook().to_vec(),
        norms,
        [m.rows(), m.groups()],
        m.packed().to_vec(),
        [m.rows(), m.row_bytes()],
    )
    .unwrap();
    tensors.insert("layers.1.wq".into(), Tensor::Cq(bad));
    let bytes = write_archive(&c, None, &tensors).unwrap();
    Arc::new(Model::from_bytes(&bytes, "inf-norm").expect("an Inf norm is a valid archive"))
}

#[test]
fn cpu_names_the_first_non_finite_tensor() {
    let model = model_with_inf_norm();
    let mut e = CpuEngine::new(model).unwrap();
    match e.step(1, true) {
        Err(Error::NonFinite { tensor, position }) => {
            assert_eq!(tensor, "layer 1 q");
            assert_eq!(position, 0);
        }
        other => panic!(
            "expected NonFinite, got {:?}",
            other.map(|l| l.map(|l| l.len()))
        ),
    }
    // Also without logits.
    assert!(matches!(e.step(2, false), Err(Error::NonFinite { .. })));
}

#[test]
fn gpu_refuses_non_finite_logits_and_parity_names_the_tensor() {
    let Some(ctx) = gpu() else { return };
    let model = model_with_inf_norm();
    let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    match g.step(1, true) {
        Err(Error::NonFinite { tensor, position }) => {
            assert!(tensor.starts_with("logits"), "{tensor}");
            assert_eq!(position, 0);
        }
        other => panic!(
            "expected NonFinite, got {:?}",
            other.map(|l| l.map(|l| l.len()))
        ),
    }
    let mut g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let ladder = run_ladder(&model, &ctx, &mut g, &[1, 2, 3], 0).unwrap();
    assert_eq!(
        ladder.first_divergent.as_deref(),
        Some("position 0 layer 1 q"),
        "{ladder:#?}"
    );
}

fn run(engine: &mut dyn Engine, ids: &[u32]) -> Vec<Vec<f32>> {
    ids.iter()
        .map(|&t| engine.step(t, true).unwrap().unwrap().to_vec())
        .collect()
}

#[test]
fn two_sessions_in_two_threads_match_running_alone() {
    let model =
        Arc::new(cqlm::synth::synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 2).unwrap());
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
