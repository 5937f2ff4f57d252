//! Constrained generation costs on the built-in model (4,096 tokens): the mask
//! time per token over the JSON schemas of `tests/fixtures/constrain/schemas.json`
//! (p50, p99, max), the compile time of a tool set's grammar (new, first, cached), and greedy decode
//! tok/s constrained against unconstrained in one run, with the share of tokens
//! fast-forwarded. `CQLM_BENCH_BACKEND=gpu` runs it on the GPU engine.
//!
//! `cargo bench --bench constrain`

use cqlm::constrain::{ConstraintSpec, TokenSpace, ToolChoice, ToolSet};
use cqlm::session::builder::EngineBuilder;
use cqlm::session::sample::Sampler;
use cqlm::session::tokenizer::TextTokenizer;
use cqlm::session::{Backend, Session};
use cqlm::Precision;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

fn pct(v: &mut [f32], p: f64) -> f32 {
    v.sort_by(f32::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let backend = match std::env::var("CQLM_BENCH_BACKEND").as_deref() {
        Ok("gpu") => Backend::Gpu(Default::default()),
        _ => Backend::Cpu,
    };
    let model = Arc::new(cqlm::model::builtin::model().expect("built-in model"));
    let tok = TextTokenizer::for_model(&model).expect("tokenizer");
    let t0 = Instant::now();
    let space = TokenSpace::for_model(&model).expect("token space");
    println!(
        "token space (trie + slicer): {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );

    let tools: Value = serde_json::from_str(include_str!("../tools/train/tools.json"))
        .expect("tools/train/tools.json");
    let set = ToolSet::from_openai(&tools).expect("tool set");
    for choice in [ToolChoice::Auto, ToolChoice::Required] {
        let spec = |tools: ToolSet| ConstraintSpec::Tools {
            tools,
            choice: choice.clone(),
            parallel: false,
        };
        // The first compile in a fresh token space (nothing cached: the first
        // request after start), a new tool set in a warm one (what a server
        // sees: the parts that depend only on the markers are cached), and the
        // same tool set again (cached).
        let (mut first, mut new_set, mut again) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..10 {
            let fresh = TokenSpace::for_model(&model).expect("token space");
            let t = Instant::now();
            let _c = fresh.compile(&spec(set.clone())).expect("compile");
            first.push((t.elapsed().as_secs_f64() * 1e3) as f32);
            let _c = space.compile(&spec(set.clone())).expect("compile");
            for k in 0..10 {
                // Another name for the first tool: a tool set not seen before.
                let mut renamed = tools.clone();
                renamed[0]["function"]["name"] = format!("tool_{round}_{k}").into();
                let renamed = ToolSet::from_openai(&renamed).expect("tool set");
                let t = Instant::now();
                let _c = space.compile(&spec(renamed)).expect("compile");
                new_set.push((t.elapsed().as_secs_f64() * 1e3) as f32);
            }
            let t = Instant::now();
            let _c = space.compile(&spec(set.clone())).expect("compile");
            again.push((t.elapsed().as_secs_f64() * 1e3) as f32);
        }
        println!(
            "tool-set grammar compile ({} tools, {choice:?}): new tool set p50 {:.2} ms, p90 {:.2} ms; first in a fresh token space p50 {:.2} ms; cached {:.3} ms",
            set.tools().len(),
            pct(&mut new_set, 0.5),
            pct(&mut new_set, 0.9),
            pct(&mut first, 0.5),
            pct(&mut again, 0.5)
        );
    }

    let cases: Vec<Value> =
        serde_json::from_str(include_str!("../tests/fixtures/constrain/schemas.json"))
            .expect("schemas");
    let prompt = tok.encode("Answer in JSON:").expect("prompt");
    // The precision `cqlm generate` runs at (fast on the CPU; the GPU is exact).
    let builder = EngineBuilder::new(Arc::clone(&model))
        .backend(backend)
        .precision(Precision::Fast);
    let mut session = Session::from_builder(builder).expect("engine");
    println!("engine: {}", session.engine().describe());
    let n = 64;
    let (mut masks, mut forced, mut emitted, mut secs_c) = (Vec::new(), 0, 0, 0.0);
    let (mut emitted_u, mut secs_u) = (0, 0.0);
    // Each case's constrained over unconstrained tok/s, measured side by side
    // (the median of these is robust to the VM's slow phases).
    let mut ratios = Vec::new();
    let (mut first, mut later) = (Vec::new(), Vec::new());
    let mut cold = Vec::new();
    for round in 0..2 {
        for case in &cases {
            let spec = ConstraintSpec::json_schema(case["schema"].clone());
            let mut c = space.compile(&spec).expect("compile");
            session.reset();
            session.prefill(&prompt).expect("prefill");
            let t = Instant::now();
            let mut k = 0;
            let (_, stats) = session
                .generate_constrained(&mut Sampler::greedy(), n, &mut c, |_| {
                    k += 1;
                    true
                })
                .expect("generate");
            if round == 0 {
                cold.extend(stats.mask_us_each.iter().copied());
            }
            let secs_case = t.elapsed().as_secs_f64();
            if round == 1 {
                secs_c += secs_case;
                emitted += k;
                forced += stats.forced.min(k);
                if let Some((&a, rest)) = stats.mask_us_each.split_first() {
                    first.push(a);
                    later.extend(rest);
                }
                masks.extend(stats.mask_us_each);
            }
            // The same number of unconstrained greedy tokens, interleaved.
            session.reset();
            session.prefill(&prompt).expect("prefill");
            let t = Instant::now();
            let mut u = 0;
            session
                .generate(&mut Sampler::greedy(), k, |_| {
                    u += 1;
                    true
                })
                .expect("generate");
            if round == 1 {
                let su = t.elapsed().as_secs_f64();
                secs_u += su;
                emitted_u += u;
                ratios.push(((k as f64 / secs_case) / (u as f64 / su)) as f32);
            }
        }
    }
    let (c, u) = (emitted as f64 / secs_c, emitted_u as f64 / secs_u);
    println!(
        "first mask of a request: p50 {:.1} µs, max {:.1} µs; later masks: p50 {:.1} µs, p99 {:.1} µs",
        pct(&mut first, 0.5),
        pct(&mut first, 1.0),
        pct(&mut later, 0.5),
        pct(&mut later, 0.99)
    );
    println!(
        "masks over {} schemas: {} masks, p50 {:.1} µs, p90 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        cases.len(),
        masks.len(),
        pct(&mut masks, 0.5),
        pct(&mut masks, 0.9),
        pct(&mut masks, 0.99),
        pct(&mut masks, 1.0)
    );
    println!(
        "first round (each grammar new): {} masks, p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        cold.len(),
        pct(&mut cold, 0.5),
        pct(&mut cold, 0.99),
        pct(&mut cold, 1.0)
    );
    println!(
        "greedy decode: constrained {c:.0} tok/s, unconstrained {u:.0} tok/s, ratio {:.3} (median of the cases' ratios {:.3}); {forced} of {emitted} constrained tokens forced ({:.0}%)",
        c / u,
        pct(&mut ratios, 0.5),
        100.0 * forced as f64 / emitted.max(1) as f64
    );
}
