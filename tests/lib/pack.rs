//! `pack` in the library: float checkpoint → archive. The packed model's logits
//! against a dense f64 forward pass of the float weights (`tests/common/naive.rs`),
//! the plan's bit widths and kept F32 vectors, and errors that name the tensor.
//! (`cqlm pack`, `cqlm inspect` and `cqlm synth --float` from outside are
//! `tests/bin/pack_cli.rs`.)

use crate::common::naive::{rel_l2, Dense, NaiveModel, NaiveState};
use crate::common::token_ids;
use cqlm::archive::{expected_tensors, write_archive, FloatTensor, Tensor, TensorKind};
use cqlm::make::pack::{pack, PackPlan, PackReportRow};
use cqlm::make::synth::synth_float_tensors;
use cqlm::Readout;
use cqlm::{Config, CpuEngine, Engine, Error, Model};
use std::collections::BTreeMap;
use std::sync::Arc;

fn median(v: &[f64]) -> f64 {
    cqlm::diag::stats::median(&mut v.to_vec())
}

/// A pack and the per-position relative L2 error of its logits (CpuEngine) against
/// reference logits.
struct Packed {
    tensors: BTreeMap<String, Tensor>,
    report: Vec<PackReportRow>,
    errs: Vec<f64>,
}

fn pack_and_run(
    config: &Config,
    floats: &BTreeMap<String, FloatTensor>,
    plan: &PackPlan,
    ids: &[u32],
    reference: &[Vec<f64>],
) -> Packed {
    let (tensors, report) = pack(config, floats, plan, |_| {}).expect("pack");
    let bytes = write_archive(config, None, &tensors).expect("write");
    let model = Arc::new(Model::from_bytes(&bytes, "<packed>").expect("load packed"));
    let mut engine = CpuEngine::new(model).expect("engine");
    let errs = ids
        .iter()
        .zip(reference)
        .map(|(&id, want)| {
            let got = engine
                .step(id, Readout::Logits)
                .expect("step")
                .logits()
                .expect("logits");
            assert!(got.iter().all(|v| v.is_finite()));
            rel_l2(got, want)
        })
        .collect();
    Packed {
        tensors,
        report,
        errs,
    }
}

/// Relative RMS weight error over all CQ matrices of a pack: `sqrt(Σ rel_mse·n / Σ n)`.
fn weight_error(report: &[PackReportRow]) -> f64 {
    let n: usize = report.iter().map(|r| r.rows * r.cols).sum();
    let e: f64 = report
        .iter()
        .map(|r| r.rel_mse * (r.rows * r.cols) as f64)
        .sum();
    (e / n as f64).sqrt()
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// The packed model against the dense float model it came from.
///
/// The logits error is consistent with the bit widths: at most 3× the relative RMS
/// weight error of the pack (a random model amplifies it about 2×), falling
/// monotonically with the bits. At 4 bits the weights are off by about 8.7%
/// (relative MSE ≈ 0.0075 per matrix, below the Gaussian Lloyd–Max 0.0095), and the
/// tied embedding alone, quantized once where a token is looked up and once where
/// the logits are read, puts √2 of that (≈ 0.12) into the logits; with every other
/// matrix at 4 bits too, the median lands near 0.18 for this model, so the 4-bit
/// bound here is 0.25.
#[test]
fn packed_logits_track_the_dense_float_model() {
    let c = Config::preset_tiny();
    let floats = synth_float_tensors(&c, 11);
    let dense = NaiveModel::from_dense(&c, &floats);
    let mut naive = NaiveState::new(&dense);
    let ids = token_ids(5, 16, c.vocab);
    let reference: Vec<Vec<f64>> = ids.iter().map(|&id| naive.step(id)).collect();
    // The dense model is not degenerate: its logits vary across positions.
    let spread = rel_l2(
        &reference[3].iter().map(|&v| v as f32).collect::<Vec<_>>(),
        &reference[9],
    );
    assert!(
        spread > 0.3,
        "logits barely change with the token: {spread}"
    );

    let mut medians = Vec::new();
    let mut packs = Vec::new();
    for bits in [2, 4, 8] {
        let p = pack_and_run(&c, &floats, &PackPlan::uniform(bits, 32), &ids, &reference);
        let med = median(&p.errs);
        let w = weight_error(&p.report);
        eprintln!(
            "{bits} bits: weight error {w:.4}, median logits rel L2 {med:.4}, per position {:.3?}",
            p.errs
        );
        assert!(p.report.iter().all(|r| r.bits == bits && r.group == 32));
        assert!(
            med <= 3.0 * w,
            "{bits} bits: logits error {med} is more than 3x the weight error {w}"
        );
        medians.push(med);
        packs.push(p);
    }
    let [m2, m4, m8] = [medians[0], medians[1], medians[2]];
    assert!(m4 <= 0.25, "4 bits: median logits relative L2 {m4} > 0.25");
    assert!(m8 < m4 && m4 < m2, "not monotone in bits: {medians:?}");
    assert!(
        m8 * 10.0 < m2,
        "8 bits is not much better than 2: {medians:?}"
    );

    // Per matrix, the quantizer's error falls with the bits and sits near the
    // Gaussian Lloyd–Max distortion (0.1175, 0.0095, 4.2e-5).
    let (r2, r4, r8) = (&packs[0].report, &packs[1].report, &packs[2].report);
    for ((a, b), d) in r2.iter().zip(r4).zip(r8) {
        assert_eq!((&a.name, &b.name), (&d.name, &d.name));
        assert!(
            d.rel_mse < b.rel_mse && b.rel_mse < a.rel_mse,
            "{}: {} {} {}",
            a.name,
            a.rel_mse,
            b.rel_mse,
            d.rel_mse
        );
        assert!(a.rel_mse < 0.15, "{} {}", a.name, a.rel_mse);
        assert!(b.rel_mse < 0.015, "{} {}", b.name, b.rel_mse);
        assert!(d.rel_mse < 1e-4, "{} {}", d.name, d.rel_mse);
    }

    // The floor: only the 4-bit embedding quantized (in the dense f64 pass) moves the
    // logits by about √2 × its relative weight error.
    let Tensor::Cq(embed4) = &packs[1].tensors["embed"] else {
        panic!("embed is not CQ")
    };
    let embed_only = NaiveModel::from_parts(
        &c,
        &|name| {
            if name == "embed" {
                Dense::from_cq(embed4)
            } else {
                let t = &floats[name];
                Dense {
                    rows: t.shape[0],
                    cols: t.shape[1],
                    w: widen(&t.data),
                }
            }
        },
        &|name| widen(&floats[name].data),
    );
    let mut st = NaiveState::new(&embed_only);
    let errs: Vec<f64> = ids
        .iter()
        .zip(&reference)
        .map(|(&id, want)| {
            let got: Vec<f32> = st.step(id).iter().map(|&v| v as f32).collect();
            rel_l2(&got, want)
        })
        .collect();
    let embed_mse = r4.iter().find(|r| r.name == "embed").unwrap().rel_mse;
    let ratio = median(&errs) / (2.0 * embed_mse).sqrt();
    eprintln!(
        "4-bit embed only: median logits rel L2 {:.4} = {ratio:.2} × sqrt(2 · {embed_mse:.2e})",
        median(&errs)
    );
    assert!((0.7..1.4).contains(&ratio), "{ratio}");
    assert!(median(&errs) < m4);
}

#[test]
fn pack_keeps_f32_vectors_and_matches_the_plan() {
    let c = Config::preset_tiny();
    let floats = synth_float_tensors(&c, 2);
    let plan = PackPlan::standard()
        .with_bits("attn_kv=8,attn_o=1")
        .unwrap();
    let mut seen = Vec::new();
    let (tensors, report) = pack(&c, &floats, &plan, |p| {
        seen.push((p.tensor.map(str::to_string), p.done, p.total))
    })
    .unwrap();
    // Progress: one call per matrix in order, then a final one with everything done.
    assert_eq!(seen.len(), report.len() + 1);
    for (s, r) in seen.iter().zip(&report) {
        assert_eq!(s.0.as_deref(), Some(r.name.as_str()));
    }
    let last = seen.last().unwrap();
    assert_eq!((last.0.as_deref(), last.1), (None, last.2));
    assert_eq!(
        last.2,
        report.iter().map(|r| r.rows * r.cols).sum::<usize>()
    );

    for spec in expected_tensors(&c) {
        match (&spec.kind, &tensors[&spec.name]) {
            (TensorKind::F32 { .. }, Tensor::F32 { data, .. }) => {
                assert_eq!(data, &floats[&spec.name].data, "{}", spec.name)
            }
            (TensorKind::Cq { cols, .. }, Tensor::Cq(m)) => {
                assert_eq!(m.bits(), plan.bits_for(&spec.name), "{}", spec.name);
                assert_eq!(m.group(), plan.group_for(*cols), "{}", spec.name);
                assert_eq!(m.rows(), floats[&spec.name].shape[0]);
            }
            _ => panic!("{}: wrong kind", spec.name),
        }
    }
    assert_eq!(plan.bits_for("layers.0.wk"), 8);
    assert_eq!(plan.bits_for("layers.0.wo"), 1);
    assert_eq!(plan.bits_for("layers.0.wq"), 2);
}

#[test]
fn library_errors_name_the_tensor() {
    let c = Config::preset_tiny();
    let good = synth_float_tensors(&c, 4);
    let plan = PackPlan::uniform(4, 32);
    let check = |t: &BTreeMap<String, FloatTensor>, name: &str, what: &str| match pack(
        &c,
        t,
        &plan,
        |_| {},
    ) {
        Err(Error::Pack { tensor, reason }) => {
            assert_eq!(tensor, name, "{reason}");
            assert!(reason.contains(what), "{reason}");
        }
        other => panic!("expected Error::Pack for {name}, got {other:?}"),
    };
    let mut t = good.clone();
    t.remove("layers.1.wk");
    check(&t, "layers.1.wk", "missing");
    let mut t = good.clone();
    t.get_mut("engram.table.3.1").unwrap().data[7] = f32::INFINITY;
    check(&t, "engram.table.3.1", "not finite");
    let mut t = good.clone();
    t.get_mut("layers.0.q_norm").unwrap().data[0] = f32::NAN;
    check(&t, "layers.0.q_norm", "not finite");
    let mut t = good.clone();
    t.get_mut("layers.2.wo").unwrap().shape = vec![64, 80];
    check(&t, "layers.2.wo", "expected [80, 64]");
    let mut t = good.clone();
    t.insert(
        "layers.9.wq".into(),
        FloatTensor {
            shape: vec![1],
            data: vec![0.0],
        },
    );
    check(&t, "layers.9.wq", "not a tensor");
    // Weights too large for an f16 norm: the quantizer's error, with the name.
    let mut t = good;
    t.get_mut("mhc.phi_res")
        .unwrap()
        .data
        .iter_mut()
        .for_each(|v| *v *= 1e30);
    check(&t, "mhc.phi_res", "f16");
}
