//! Greedy sampling on the device: the argmax kernel against `sample::argmax` on
//! crafted and random logits, and greedy engine steps against full-logits steps.

use crate::common::gpu::gpu;
use crate::common::StepLogits;
use cqlm::cq::BitsPlan;
use cqlm::gpu::kernels::sample::{ArgmaxParams, SampleKernels};
use cqlm::gpu::{run_dispatches, GpuContext, GpuEngine};
use cqlm::make::synth::synth_model;
use cqlm::session::sample::argmax;
use cqlm::Readout;
use cqlm::{Config, CpuEngine, Engine};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// (index, non-finite flag) from the kernel over `logits[off..off + n]`.
fn device_argmax(ctx: &GpuContext, logits: &[f32], off: usize, n: usize) -> (u32, u32) {
    device_argmax_masked(ctx, logits, off, n, None)
}

/// [`device_argmax`] over the ids `mask` allows (mask words), when given.
pub(crate) fn device_argmax_masked(
    ctx: &GpuContext,
    logits: &[f32],
    off: usize,
    n: usize,
    mask: Option<&[u32]>,
) -> (u32, u32) {
    let buf = ctx.storage_init("logits", bytemuck::cast_slice(logits));
    // Poisoned output: an unwritten result shows as 0xdeadbeef.
    let out = ctx.storage_init("out", bytemuck::cast_slice(&[0xdead_beefu32; 2]));
    let words = ctx.storage_init("mask", bytemuck::cast_slice(mask.unwrap_or(&[0])));
    let k = SampleKernels::new(ctx);
    let p = ArgmaxParams {
        n: n as u32,
        off: off as u32,
        masked: u32::from(mask.is_some()),
        _pad: 0,
    };
    run_dispatches(ctx, &[k.argmax(ctx, &p, &buf, &out, &words)]).unwrap();
    let b = ctx.read_bytes(&out, 0, 8).unwrap();
    let w: &[u32] = bytemuck::cast_slice(&b);
    (w[0], w[1])
}

#[test]
fn argmax_kernel_matches_the_cpu_argmax() {
    let Some(ctx) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    // Odd sizes, below and above one value per invocation; a window at an offset.
    for n in [1usize, 7, 255, 256, 257, 1000, 32003] {
        let v: Vec<f32> = (0..n + 5).map(|_| rng.random_range(-8.0f32..8.0)).collect();
        let (i, bad) = device_argmax(&ctx, &v, 5, n);
        assert_eq!((i, bad), (argmax(&v[5..]), 0), "n = {n}");
    }
    // Ties keep the lowest index, across invocations and within one.
    let mut v = vec![0.0f32; 3000];
    for k in [2999, 700, 1900, 444] {
        v[k] = 5.0;
    }
    assert_eq!(device_argmax(&ctx, &v, 0, 3000), (444, 0));
    assert_eq!(argmax(&v), 444);
    // Everything equal: index 0.
    assert_eq!(device_argmax(&ctx, &[-3.0; 600], 0, 600), (0, 0));
}

#[test]
fn argmax_kernel_flags_nan_and_infinities() {
    let Some(ctx) = gpu() else { return };
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut v = vec![1.0f32; 900];
        v[611] = bad;
        let (_, flag) = device_argmax(&ctx, &v, 0, 900);
        assert_eq!(flag, 1, "{bad} not flagged");
    }
    // The largest finite value is fine.
    let mut v = vec![0.0f32; 300];
    v[17] = f32::MAX;
    assert_eq!(device_argmax(&ctx, &v, 0, 300), (17, 0));
}

#[test]
fn greedy_steps_pick_the_argmax_of_the_same_logits() {
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 31).unwrap());
    let mut greedy = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let mut full = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let mut cpu = CpuEngine::new(Arc::clone(&model)).unwrap();
    assert!(greedy.last_logits().unwrap().is_none());
    // 24 greedy tokens (past the tiny window), each checked against the argmax of
    // the other engine's read-back logits, which must equal the greedy engine's
    // own logits bit for bit (same kernels, same device).
    let mut next = 3u32;
    for t in 0..24 {
        let picked = greedy.step(next, Readout::Argmax).unwrap().token().unwrap();
        let logits = full.logits_after(next);
        assert_eq!(picked, argmax(&logits), "position {t}");
        let mine = greedy.last_logits().unwrap().unwrap();
        assert!(mine
            .iter()
            .zip(&logits)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        // The CPU engine's argmax readout is argmax of its logits.
        let c = cpu.step(next, Readout::Argmax).unwrap().token().unwrap();
        assert_eq!(c, argmax(cpu.last_logits().unwrap().unwrap()));
        next = picked;
    }
    // A step without logits leaves none; reset too.
    greedy.step(1, Readout::None).unwrap();
    assert!(greedy.last_logits().unwrap().is_none());
    greedy.step(1, Readout::Argmax).unwrap();
    greedy.reset();
    assert!(greedy.last_logits().unwrap().is_none());
}

/// The device top-k of `logits[off .. off + n]`, sorted like `top_k_into`.
fn device_topk(
    ctx: &GpuContext,
    logits: &[f32],
    off: usize,
    n: usize,
    k: usize,
) -> Option<Vec<(f32, u32)>> {
    device_topk_at(ctx, logits, off, n, k, 0.0)
}

/// [`device_topk`] at `temperature` (> 0 also sums the softmax denominator, as
/// the nucleus readout asks).
fn device_topk_at(
    ctx: &GpuContext,
    logits: &[f32],
    off: usize,
    n: usize,
    k: usize,
    temperature: f32,
) -> Option<Vec<(f32, u32)>> {
    device_topk_masked(ctx, logits, off, n, k, temperature, None).map(|(v, _)| v)
}

/// [`device_topk_at`] over the ids `mask` allows (mask words), when given, with
/// the softmax denominator.
pub(crate) fn device_topk_masked(
    ctx: &GpuContext,
    logits: &[f32],
    off: usize,
    n: usize,
    k: usize,
    temperature: f32,
    mask: Option<&[u32]>,
) -> Option<(Vec<(f32, u32)>, f32)> {
    use cqlm::gpu::kernels::sample::{decode_topk, TopkParams, TOPK_WORDS};
    let buf = ctx.storage_init("logits", bytemuck::cast_slice(logits));
    let out = ctx.storage_init(
        "out",
        bytemuck::cast_slice(&vec![0xdead_beefu32; TOPK_WORDS]),
    );
    let words = ctx.storage_init("mask", bytemuck::cast_slice(mask.unwrap_or(&[0])));
    let p = TopkParams {
        n: n as u32,
        off: off as u32,
        k: k as u32,
        temperature,
        masked: u32::from(mask.is_some()),
        _pad: [0; 3],
    };
    let d = SampleKernels::new(ctx).topk(ctx, &p, &buf, &out, &words);
    run_dispatches(ctx, &[d]).unwrap();
    let b = ctx.read_bytes(&out, 0, TOPK_WORDS as u64 * 4).unwrap();
    let mut v = Vec::new();
    let total = decode_topk(bytemuck::cast_slice(&b), &mut v)?;
    v.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    Some((v, total))
}

#[test]
fn topk_kernel_matches_the_cpu_selection_with_ties_at_the_cut() {
    let Some(ctx) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(78);
    for (n, k) in [
        (1usize, 1usize),
        (7, 3),
        (300, 40),
        (1000, 256),
        (32003, 40),
        (50, 80),
    ] {
        // Coarse values: many ties, including across the k-th place; negative and
        // positive values, zeros of both signs.
        let mut v: Vec<f32> = (0..n + 3)
            .map(|_| rng.random_range(-6i32..6) as f32 * 0.5)
            .collect();
        v[3] = -0.0;
        let want = {
            let mut w = Vec::new();
            cqlm::session::sample::top_k_into(&v[3..], k, &mut w);
            w
        };
        let got = device_topk(&ctx, &v, 3, n, k).expect("finite");
        assert_eq!(got.len(), k.min(n), "n {n} k {k}");
        let ids = |x: &[(f32, u32)]| x.iter().map(|e| e.1).collect::<Vec<_>>();
        assert_eq!(ids(&got), ids(&want), "n {n} k {k}");
    }
    let mut v = vec![1.0f32; 500];
    v[77] = f32::NAN;
    assert!(
        device_topk(&ctx, &v, 0, 500, 10).is_none(),
        "NaN not flagged"
    );
}

#[test]
fn every_device_readout_flags_a_non_finite_logit_at_any_position() {
    // NaN, +∞ and −∞, each alone at the first, a middle and the last index of the
    // scanned window (at an offset, with finite values outside it that must not
    // matter), through argmax, top-k and the nucleus variant (temperature > 0).
    // The device test is an integer test of the exponent bits, which a compiler
    // assuming no NaN/∞ (Metal fast math) cannot fold away.
    let Some(ctx) = gpu() else { return };
    let (off, n) = (3usize, 700usize);
    let mut flagged = 0;
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for at in [0, n / 2 + 1, n - 1] {
            let mut v: Vec<f32> = (0..off + n + 2).map(|i| (i % 13) as f32 * 0.25).collect();
            v[off + at] = bad;
            let (_, flag) = device_argmax(&ctx, &v, off, n);
            assert_eq!(flag, 1, "argmax: {bad} at {at} not flagged");
            assert!(
                device_topk(&ctx, &v, off, n, 40).is_none(),
                "top-k: {bad} at {at} not flagged"
            );
            assert!(
                device_topk_at(&ctx, &v, off, n, 256, 0.7).is_none(),
                "nucleus: {bad} at {at} not flagged"
            );
            flagged += 1;
        }
    }
    assert_eq!(flagged, 9);
    // The same window with all of it finite (the largest finite values and the
    // smallest subnormal included) is not flagged, and a non-finite value just
    // outside the window is ignored.
    let mut v: Vec<f32> = (0..off + n + 2).map(|i| (i % 13) as f32 * 0.25).collect();
    v[off] = f32::MAX;
    v[off + 1] = -f32::MAX;
    v[off + 2] = f32::from_bits(1);
    v[off - 1] = f32::NAN;
    v[off + n] = f32::INFINITY;
    assert_eq!(device_argmax(&ctx, &v, off, n), (0, 0));
    let want = {
        let mut w = Vec::new();
        cqlm::session::sample::top_k_into(&v[off..off + n], 40, &mut w);
        w
    };
    assert_eq!(device_topk(&ctx, &v, off, n, 40), Some(want.clone()));
    let got = device_topk_at(&ctx, &v, off, n, 40, 0.7).expect("finite");
    assert_eq!(got, want);
}

/// The reference for the session tests: after the prompt `1, 2, 3`, `n` tokens
/// drawn by `cfg`'s sampler from the full logits read back from a GPU engine each
/// step; returns them and the last logits.
fn draw_from_read_back_logits(
    model: &Arc<cqlm::Model>,
    ctx: Arc<GpuContext>,
    cfg: cqlm::session::sample::SamplerConfig,
    n: usize,
) -> (Vec<u32>, Vec<f32>) {
    let mut g = GpuEngine::with_context(Arc::clone(model), ctx).unwrap();
    let mut logits = g.prefill(&[1, 2, 3]).unwrap();
    let mut sampler = cqlm::session::sample::Sampler::new(cfg).unwrap();
    let mut history = vec![1u32, 2, 3];
    let mut drawn = Vec::new();
    for _ in 0..n {
        let id = sampler.sample(&logits, &history);
        drawn.push(id);
        history.push(id);
        logits = g.logits_after(id);
    }
    (drawn, logits)
}

#[test]
fn sampled_generation_on_the_gpu_draws_what_the_full_logits_draw() {
    use cqlm::session::sample::{Sampler, SamplerConfig};
    use cqlm::session::{Backend, Session};
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 32).unwrap());
    let cfg = SamplerConfig {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.95,
        seed: 5,
        ..Default::default()
    };
    // The session hands the sampler the device's top-k candidates ...
    let mut session = Session::new(Arc::clone(&model), Backend::Gpu(Default::default())).unwrap();
    session.prefill(&[1, 2, 3]).unwrap();
    let mut got = Vec::new();
    let mut s1 = Sampler::new(cfg.clone()).unwrap();
    session
        .generate(&mut s1, 24, |id| {
            got.push(id);
            true
        })
        .unwrap();
    // ... which must draw exactly what sampling the full read-back logits draws.
    let (want, logits) = draw_from_read_back_logits(&model, ctx, cfg, got.len());
    assert_eq!(got, want);
    // The session's logits after generating are the engine's last logits.
    assert_eq!(session.logits(), &logits[..]);
}

#[test]
fn step_top_k_beyond_the_device_limit_selects_from_the_logits() {
    // k above MAX_K (256) takes the logits path; both paths agree with top_k_into.
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 34).unwrap());
    let mut a = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
    let mut b = GpuEngine::with_context(Arc::clone(&model), ctx).unwrap();
    for (token, k) in [(1u32, 300usize), (2, 40), (3, 256), (4, 257)] {
        let mut got = a
            .step(token, Readout::TopK(k))
            .unwrap()
            .candidates()
            .unwrap()
            .to_vec();
        let logits = b.logits_after(token);
        let mut want = Vec::new();
        cqlm::session::sample::top_k_into(&logits, k, &mut want);
        got.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
        assert_eq!(got, want, "k {k}");
        assert_eq!(a.last_logits().unwrap().unwrap(), &logits[..]);
    }
}

#[test]
fn topk_kernel_softmax_denominator_is_within_its_stated_bound() {
    // The denominator a top-p cut needs, Σ exp((logit − max) / T) over every logit,
    // against an f64 sum of the same logits, within the bound the engine states
    // (a `Readout::Nucleus` step); the candidates are unchanged by asking for it.
    let Some(ctx) = gpu() else { return };
    use cqlm::gpu::kernels::sample::{decode_topk, TopkParams, TOPK_WORDS};
    let mut rng = ChaCha8Rng::seed_from_u64(81);
    for (n, t) in [
        (1usize, 1.0f32),
        (300, 0.5),
        (5000, 1.0),
        (32000, 0.8),
        (32000, 3.0),
    ] {
        let logits: Vec<f32> = (0..n).map(|_| rng.random_range(-6.0f32..6.0)).collect();
        let buf = ctx.storage_init("logits", bytemuck::cast_slice(&logits));
        let out = ctx.storage_init(
            "out",
            bytemuck::cast_slice(&vec![0xdead_beefu32; TOPK_WORDS]),
        );
        let p = TopkParams {
            n: n as u32,
            off: 0,
            k: 256,
            temperature: t,
            masked: 0,
            _pad: [0; 3],
        };
        let words = ctx.storage_init("mask", &[0; 4]);
        let d = SampleKernels::new(&ctx).topk(&ctx, &p, &buf, &out, &words);
        run_dispatches(&ctx, &[d]).unwrap();
        let b = ctx.read_bytes(&out, 0, TOPK_WORDS as u64 * 4).unwrap();
        let mut got = Vec::new();
        let total = decode_topk(bytemuck::cast_slice(&b), &mut got).expect("finite");
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want: f64 = logits
            .iter()
            .map(|&v| ((v as f64 - m as f64) / t as f64).exp())
            .sum();
        let rel = (total as f64 - want).abs() / want;
        // Each of the kernel's invocations sums ceil(n / width) terms, then a
        // tree of log2(width) levels.
        let width = f64::from(ctx.caps.wide_workgroup);
        let terms = (n as f64 / width).ceil() + width.log2();
        let bound = 4.0 * (2e-5 + terms * f64::from(f32::EPSILON));
        eprintln!("n {n} T {t}: relative error {rel:.2e} (bound {bound:.2e})");
        assert!(
            rel <= bound,
            "n {n} T {t}: {total} vs {want}: {rel:e} > {bound:e}"
        );
        let mut want_c = Vec::new();
        cqlm::session::sample::top_k_into(&logits, 256, &mut want_c);
        got.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
        assert_eq!(got, want_c, "n {n}");
    }
}

#[test]
fn top_p_generation_on_the_gpu_draws_what_the_full_logits_draw() {
    // Top-p without top-k: the session hands the sampler the device's 256 best
    // candidates and softmax denominator (a `Readout::Nucleus` step) and falls back
    // to the logits only when those can't decide. Either way it must draw exactly
    // what sampling the full read-back logits draws. A vocabulary of 1000 (more
    // than the candidates): a sharp temperature lets the candidates decide, a
    // flat one needs the fallback; both happen here.
    use cqlm::session::sample::{Sampler, SamplerConfig};
    use cqlm::session::{Backend, Session};
    let Some(ctx) = gpu() else { return };
    let config = Config {
        vocab: 1000,
        ..Config::preset_tiny()
    };
    let model = Arc::new(synth_model(&config, &BitsPlan::mixed(), 35).unwrap());
    let (mut decided_all, mut missed) = (false, false);
    for (temperature, top_p) in [(0.05f32, 0.9f32), (0.5, 0.95), (4.0, 0.95)] {
        let cfg = SamplerConfig {
            temperature,
            top_p,
            seed: 11,
            ..Default::default()
        };
        let n = 12;
        let mut session =
            Session::new(Arc::clone(&model), Backend::Gpu(Default::default())).unwrap();
        session.prefill(&[1, 2, 3]).unwrap();
        let mut got = Vec::new();
        let mut s1 = Sampler::new(cfg.clone()).unwrap();
        session
            .generate(&mut s1, n, |id| {
                got.push(id);
                true
            })
            .unwrap();
        let misses = session.nucleus_misses();
        eprintln!(
            "T {temperature} top-p {top_p}: {misses} of {} draws fetched the logits",
            got.len() - 1
        );
        decided_all |= misses == 0 && got.len() == n;
        missed |= misses > 0;
        let (want, logits) = draw_from_read_back_logits(&model, Arc::clone(&ctx), cfg, got.len());
        assert_eq!(got, want, "T {temperature} top-p {top_p}");
        assert_eq!(session.logits(), &logits[..]);
    }
    assert!(
        decided_all && missed,
        "decided_all {decided_all}, missed {missed}"
    );
}

/// A random mask of `n` ids (mask words), each id allowed with probability `p`,
/// with at least one allowed.
fn random_mask(rng: &mut ChaCha8Rng, n: usize, p: f64) -> cqlm::constrain::TokenMask {
    let mut m = cqlm::constrain::TokenMask::none(n);
    for t in 0..n as u32 {
        if rng.random_bool(p) {
            m.allow(t);
        }
    }
    if m.count() == 0 {
        m.allow(rng.random_range(0..n as u32));
    }
    m
}

#[test]
fn masked_argmax_and_topk_kernels_match_the_host_masked_readout() {
    // Random masks (dense, sparse, one id, only ids outside the unmasked top-k)
    // over random logits: the device's choice, candidates and denominator equal
    // the host twin's (engine::host_readout_masked) over the same values, with
    // poisoned outputs.
    use cqlm::engine::{host_readout_masked, StepOut};
    let Some(ctx) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(79);
    for (round, n) in [1usize, 33, 300, 4096, 4099, 32000].into_iter().enumerate() {
        let logits: Vec<f32> = (0..n)
            .map(|_| rng.random_range(-6i32..6) as f32 * 0.75)
            .collect();
        let mut top = Vec::new();
        cqlm::session::sample::top_k_into(&logits, 40, &mut top);
        let mut outside = cqlm::constrain::TokenMask::none(n);
        for t in 0..n as u32 {
            if !top.iter().any(|c| c.1 == t) {
                outside.allow(t);
            }
        }
        let masks = [
            random_mask(&mut rng, n, 0.5),
            random_mask(&mut rng, n, 0.01),
            cqlm::constrain::TokenMask::of_ids(n, &[rng.random_range(0..n as u32)]),
            outside,
        ];
        for (mi, mask) in masks.iter().enumerate() {
            if mask.count() == 0 {
                continue; // n = 1 with its only id in the top-k
            }
            let (mut masked, mut cands) = (Vec::new(), Vec::new());
            let want = match host_readout_masked(
                &logits,
                Readout::Argmax,
                Some(mask),
                &mut masked,
                &mut cands,
            )
            .unwrap()
            {
                StepOut::Token(t) => t,
                o => panic!("{o:?}"),
            };
            let got = device_argmax_masked(&ctx, &logits, 0, n, Some(mask.words()));
            assert_eq!(got, (want, 0), "argmax round {round} mask {mi}");
            assert!(mask.is_allowed(got.0));
            for (k, t) in [(5usize, 0.0f32), (40, 0.0), (256, 0.9)] {
                let (got, total) =
                    device_topk_masked(&ctx, &logits, 0, n, k, t, Some(mask.words()))
                        .expect("finite");
                let mut want = Vec::new();
                mask.apply_into(&logits, &mut masked);
                cqlm::session::sample::top_k_into(&masked, k, &mut want);
                let ids = |x: &[(f32, u32)]| x.iter().map(|e| e.1).collect::<Vec<_>>();
                assert_eq!(ids(&got), ids(&want), "top-{k} round {round} mask {mi}");
                assert!(got.iter().all(|c| mask.is_allowed(c.1)));
                if t > 0.0 {
                    let m = want[0].0 as f64;
                    let exact: f64 = (0..n)
                        .filter(|&i| mask.is_allowed(i as u32))
                        .map(|i| ((logits[i] as f64 - m) / t as f64).exp())
                        .sum();
                    let rel = (total as f64 - exact).abs() / exact;
                    assert!(rel < 1e-4, "denominator round {round} mask {mi}: {rel:e}");
                }
            }
        }
    }
    // A disallowed NaN is not looked at; an allowed one is flagged.
    let mut v = vec![1.0f32; 100];
    v[7] = f32::NAN;
    v[9] = 2.0;
    let mut m = cqlm::constrain::TokenMask::all(100);
    let mut words = m.words().to_vec();
    words[0] &= !(1 << 7);
    assert_eq!(device_argmax_masked(&ctx, &v, 0, 100, Some(&words)), (9, 0));
    m.allow(7);
    assert_eq!(device_argmax_masked(&ctx, &v, 0, 100, Some(m.words())).1, 1);
}

#[test]
fn masked_engine_readouts_choose_what_the_host_twin_chooses() {
    // A GPU engine's masked readouts of its own last logits against the host twin
    // over those logits (fetched back), after a deferred step.
    use cqlm::engine::{host_readout_masked, StepOut};
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 5).unwrap());
    let mut g = GpuEngine::with_context(Arc::clone(&model), ctx).unwrap();
    let vocab = model.config.vocab;
    let mut rng = ChaCha8Rng::seed_from_u64(80);
    assert!(g.readout(Readout::Argmax, None).is_err(), "no step yet");
    for (i, &t) in [3u32, 9, 1, 4].iter().enumerate() {
        assert!(g.step(t, Readout::Deferred).unwrap().is_none());
        let logits = g.last_logits().unwrap().unwrap().to_vec();
        let mask = random_mask(&mut rng, vocab, [0.3, 0.02, 0.5, 0.001][i]);
        for r in [
            Readout::Argmax,
            Readout::TopK(7),
            Readout::Nucleus { temperature: 0.8 },
            Readout::Logits,
        ] {
            let (mut masked, mut cands) = (Vec::new(), Vec::new());
            let want =
                host_readout_masked(&logits, r, Some(&mask), &mut masked, &mut cands).unwrap();
            let got = g.readout(r, Some(&mask)).unwrap();
            match (got, want) {
                (StepOut::Token(a), StepOut::Token(b)) => assert_eq!(a, b, "{r:?}"),
                (StepOut::Logits(a), StepOut::Logits(b)) => {
                    assert_eq!(a.len(), b.len());
                    assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
                }
                (a, b) => {
                    let ids = |o: StepOut| {
                        let mut v: Vec<u32> = o.candidates().unwrap().iter().map(|c| c.1).collect();
                        v.sort_unstable();
                        v
                    };
                    assert_eq!(ids(a), ids(b), "{r:?}");
                }
            }
        }
    }
    // A mask of another size, or one that allows nothing, is refused.
    assert!(g
        .readout(
            Readout::Argmax,
            Some(&cqlm::constrain::TokenMask::all(vocab + 1))
        )
        .is_err());
    assert!(g
        .readout(
            Readout::Argmax,
            Some(&cqlm::constrain::TokenMask::none(vocab))
        )
        .is_err());
}

#[test]
fn constrained_generation_on_the_gpu_satisfies_its_schema() {
    // Deferred steps, device-masked readouts and forced chunks on the GPU engine:
    // every output validates (jsonschema), greedy and sampled.
    use cqlm::constrain::{ConstraintSpec, TokenSpace};
    use cqlm::session::sample::{Sampler, SamplerConfig};
    use cqlm::session::{Finish, Session};
    let Some(ctx) = gpu() else { return };
    let b = cqlm::model::builtin::model().unwrap();
    let config = Config {
        vocab: b.config.vocab,
        ..Config::preset_tiny()
    };
    let mut m = synth_model(&config, &BitsPlan::mixed(), 21).unwrap();
    m.tokenizer = b.tokenizer.clone();
    let model = Arc::new(m);
    let space = TokenSpace::for_model(&model).unwrap();
    let tok = cqlm::session::tokenizer::TextTokenizer::for_model(&model).unwrap();
    let schema = serde_json::json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10},
        "days": {"type": "array", "items": {"enum": ["mon", "tue", "wed"]}, "maxItems": 3},
        "n": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["city", "days", "n"], "additionalProperties": false});
    for cfg in [
        SamplerConfig::default(),
        SamplerConfig {
            temperature: 1.0,
            top_k: 20,
            seed: 3,
            ..Default::default()
        },
        SamplerConfig {
            temperature: 1.0,
            top_p: 0.8,
            seed: 4,
            ..Default::default()
        },
    ] {
        let g = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap();
        let mut s = Session::from_engine(Box::new(g), Arc::clone(&model));
        s.prefill(&tok.encode("JSON:").unwrap()).unwrap();
        let mut c = space
            .compile(&ConstraintSpec::json_schema(schema.clone()))
            .unwrap();
        let mut ids = Vec::new();
        let (stop, _) = s
            .generate_constrained(&mut Sampler::new(cfg.clone()).unwrap(), 80, &mut c, |t| {
                ids.push(t);
                true
            })
            .unwrap();
        let text = tok.decode(&ids).unwrap();
        assert_eq!(stop, Finish::Complete, "{cfg:?}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(jsonschema::is_valid(&schema, &v), "{text}");
    }
}
