//! The built-in chat model calls the right tool (and, where it can copy them,
//! the right arguments) on held-out conversations (`tools/train/chat_heldout.jsonl`: phrasings and values
//! never seen in training), through the engine in Rust alone: the server's
//! template renders the prompt, the tool-call constraint (`auto`) decodes greedily,
//! and the call is parsed by the constraint. The expected calls were written by
//! the corpus generator, not by the engine.
//!
//! The full evaluation (every held-out conversation, the answers after the tool
//! results, the server and the openai client) is `tools/train/evaluate.py chat`;
//! `tests/e2e/chat_eval.rs` runs it on a subset.

use crate::common::gpu::gpu;
use cqlm::constrain::{ConstraintSpec, TokenSpace, ToolChoice, ToolSet};
use cqlm::serve::chat::ChatTemplate;
use cqlm::serve::wire::Message;
use cqlm::session::sample::{Sampler, SamplerConfig};
use cqlm::session::tokenizer::TextTokenizer;
use cqlm::session::Session;
use cqlm::{CpuEngine, Engine, GpuEngine, Model};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

struct Case {
    messages: Vec<Message>,
    /// The expected call's (name, arguments), or None when no tool is needed.
    expect: Option<(String, Value)>,
}

/// The first `n` held-out conversations, cut before their last assistant turn.
fn heldout(n: usize) -> Vec<Case> {
    let text = std::fs::read_to_string(root().join("tools/train/chat_heldout.jsonl")).unwrap();
    text.lines()
        .take(n)
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            let msgs = v["messages"].as_array().unwrap();
            let cut = msgs.iter().rposition(|m| m["role"] == "user").unwrap() + 1;
            let messages = serde_json::from_value(Value::Array(msgs[..cut].to_vec())).unwrap();
            let e = &v["expect"];
            let expect = e["tool"]
                .as_str()
                .map(|name| (name.to_string(), e["arguments"].clone()));
            Case { messages, expect }
        })
        .collect()
}

/// Numbers compare by value (`3` and `3.0` alike), everything else exactly.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[derive(Default, Debug)]
struct Score {
    tool: usize,
    name: usize,
    args: usize,
    none: usize,
    no_call: usize,
}

fn score(model: &Arc<Model>, cases: &[Case], mut engine: impl FnMut() -> Box<dyn Engine>) -> Score {
    let tools: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tools/train/tools.json")).unwrap(),
    )
    .unwrap();
    let tok = TextTokenizer::for_model(model).unwrap();
    let template = ChatTemplate::new(
        model.chat_template.as_deref(),
        &tok.decode_special(model.config.bos),
        &tok.decode_special(model.config.eos),
    )
    .unwrap();
    let space = TokenSpace::for_model(model).unwrap();
    let spec = ConstraintSpec::Tools {
        tools: ToolSet::from_openai(&tools).unwrap(),
        choice: ToolChoice::Auto,
        parallel: false,
    };
    let mut s = Score::default();
    for (i, case) in cases.iter().enumerate() {
        let prompt = template.render(&case.messages, Some(&tools)).unwrap();
        let mut session = Session::from_engine(engine(), Arc::clone(model));
        session.prefill(&tok.encode(&prompt).unwrap()).unwrap();
        let mut c = space.compile(&spec).unwrap();
        let mut ids = Vec::new();
        let mut sampler = Sampler::new(SamplerConfig::default()).unwrap();
        session
            .generate_constrained(&mut sampler, 96, &mut c, |t| {
                ids.push(t);
                true
            })
            .unwrap();
        let text = tok.decode(&ids).unwrap();
        let calls = c.tool_calls(&text).unwrap();
        match &case.expect {
            None => {
                s.none += 1;
                s.no_call += calls.is_empty() as usize;
            }
            Some((name, args)) => {
                s.tool += 1;
                let got = calls.first();
                let name_ok = got.is_some_and(|g| &g.name == name);
                s.name += name_ok as usize;
                s.args += (name_ok && same(&got.unwrap().arguments, args)) as usize;
            }
        }
        eprintln!("case {i}: {text:?} (expected {:?})", case.expect);
    }
    eprintln!("{s:?}");
    s
}

fn pct(a: usize, b: usize) -> f64 {
    100.0 * a as f64 / b.max(1) as f64
}

#[test]
fn heldout_tool_calls_on_the_cpu_engine() {
    let model = Arc::new(cqlm::model::builtin::model().unwrap());
    let cases = heldout(60);
    let s = score(&model, &cases, || {
        Box::new(CpuEngine::new(Arc::clone(&model)).unwrap())
    });
    assert!(s.tool >= 35 && s.none >= 8, "{s:?}");
    // Floors below what the shipped model measured on these 60 through `cqlm
    // generate` (51 of 52 names, 43 of 52 arguments, 8 of 8 without a call), so
    // that a regression fails. The target for arguments (90%) is missed
    // (README): the model confuses the two units of a conversion.
    assert!(pct(s.name, s.tool) >= 90.0, "tool name: {s:?}");
    assert!(pct(s.args, s.tool) >= 65.0, "exact arguments: {s:?}");
    assert!(pct(s.no_call, s.none) >= 85.0, "no tool: {s:?}");
}

#[test]
fn heldout_tool_calls_on_the_gpu_engine() {
    let Some(ctx) = gpu() else { return };
    let model = Arc::new(cqlm::model::builtin::model().unwrap());
    // lavapipe is slow: the first 6 conversations (tools and small talk).
    let cases = heldout(6);
    let s = score(&model, &cases, || {
        Box::new(GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx)).unwrap())
    });
    // On the CPU: every name, 4 of 4 arguments, both without a call.
    assert_eq!(s.name, s.tool, "{s:?}");
    assert!(s.args >= 3, "{s:?}");
    assert_eq!(s.no_call, s.none, "{s:?}");
}
