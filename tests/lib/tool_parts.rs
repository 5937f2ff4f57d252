//! `auto` tool calls run as parts in turn (free text or the start marker, the
//! call, the end marker) give, token by token, the forced runs, masks and
//! acceptance of the single grammar `TEXT | start call end`, written here
//! apart from the library in Lark with the call's schema inline. Along random
//! paths through free text and through calls of a real tool set, and, in a
//! vocabulary with a token that crosses from the call into the end marker,
//! where the library must fall back to the single grammar.

use cqlm::constrain::{Constraint, ConstraintSpec, TokenMask, TokenSpace, ToolChoice, ToolSet};
use cqlm::cq::BitsPlan;
use cqlm::{Config, Model};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// The single grammar of `auto` over `tools` (OpenAI format) with the default
/// markers: free text that does not begin with `<`, or one compact call.
fn whole_grammar(tools: &Value) -> String {
    let calls: Vec<Value> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = &t["function"];
            json!({"type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                "required": ["name", "arguments"], "additionalProperties": false})
        })
        .collect();
    let schema = json!({"anyOf": calls, "x-guidance": {"whitespace_flexible": false}});
    format!(
        "start: TEXT | \"<tool_call>\" call \"</tool_call>\"\n\
         call: %json {schema}\n\
         TEXT: /([^<](.|\\n)*)?/\n"
    )
}

/// What one walk saw.
#[derive(Default)]
struct Walk {
    /// It ended with the end marker (a whole call).
    called: bool,
    /// The tokens it allowed or forced.
    seen: Vec<u32>,
}

/// Walk `parts` and `whole` along one random path (a call when `call`),
/// checking that they agree at every step.
fn walk(
    mut parts: Constraint,
    mut whole: Constraint,
    text: &dyn Fn(u32) -> String,
    seed: u64,
    call: bool,
    vocab: usize,
) -> Walk {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (mut ma, mut mb) = (TokenMask::none(vocab), TokenMask::none(vocab));
    let mut seen = Walk::default();
    for step in 0..120 {
        let forced = parts.take_forced();
        assert_eq!(forced, whole.take_forced(), "seed {seed} step {step}");
        seen.seen.extend(&forced);
        assert_eq!(
            parts.is_stopped(),
            whole.is_stopped(),
            "seed {seed} step {step}"
        );
        assert_eq!(
            parts.is_accepting(),
            whole.is_accepting(),
            "seed {seed} step {step}"
        );
        if whole.is_stopped() {
            seen.called = text(*seen.seen.last().unwrap()).ends_with('>');
            return seen;
        }
        parts.mask_into(&mut ma).unwrap();
        whole.mask_into(&mut mb).unwrap();
        assert_eq!(ma.words(), mb.words(), "seed {seed} step {step}");
        let allowed: Vec<u32> = (0..vocab as u32)
            .filter(|&t| mb.is_allowed(t) && t != whole.eos())
            .collect();
        seen.seen.extend(&allowed);
        // The first token chooses text or a call; after that, punctuation half
        // the time, so strings close and calls finish within the walk.
        let pick: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|&t| {
                let s = text(t);
                if step == 0 {
                    s.starts_with('<') == call
                } else {
                    rng.random_bool(0.5) || !s.chars().any(char::is_alphanumeric)
                }
            })
            .collect();
        let from = if pick.is_empty() { &allowed } else { &pick };
        if from.is_empty() {
            return seen;
        }
        let t = from[rng.random_range(0..from.len())];
        parts.commit(t).unwrap();
        whole.commit(t).unwrap();
    }
    seen
}

fn spec(tools: &Value) -> ConstraintSpec {
    ConstraintSpec::Tools {
        tools: ToolSet::from_openai(tools).unwrap(),
        choice: ToolChoice::Auto,
        parallel: false,
    }
}

#[test]
fn auto_parts_in_turn_are_the_single_grammar() {
    let model = cqlm::model::builtin::model().unwrap();
    let vocab = model.config.vocab;
    let tok = cqlm::session::tokenizer::TextTokenizer::for_model(&model).unwrap();
    let text = |t: u32| tok.decode(&[t]).unwrap_or_default();
    let space = TokenSpace::for_model(&model).unwrap();
    let tools: Value = serde_json::from_str(include_str!("../../tools/train/tools.json")).unwrap();
    // A tool whose call is forced whole once named: the parts hand over inside
    // one run of forced tokens.
    let mut with_ping = tools.clone();
    with_ping
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "function", "function": {
        "name": "ping", "parameters": {"type": "object", "properties": {},
        "additionalProperties": false}}}));
    let mut calls = 0;
    for (k, set) in [tools, with_ping].iter().enumerate() {
        let whole = ConstraintSpec::Lark(whole_grammar(set));
        for seed in 0..24u64 {
            let call = seed % 3 != 0;
            let w = walk(
                space.compile(&spec(set)).unwrap(),
                space.compile(&whole).unwrap(),
                &text,
                seed + 1000 * k as u64,
                call,
                vocab,
            );
            calls += w.called as usize;
        }
    }
    // Most call walks get to the end marker, through all three parts.
    assert!(calls >= 16, "{calls} of 32 call walks finished");
}

#[test]
fn a_token_across_the_end_marker_falls_back_to_the_single_grammar() {
    // The built-in tokenizer with one more token, `}<`: the call's last `}` and
    // the end marker's `<` in one token, which only the single grammar allows.
    let b = cqlm::model::builtin::model().unwrap();
    let mut json: Value = serde_json::from_str(b.tokenizer.as_deref().unwrap()).unwrap();
    let added = json["added_tokens"].as_array_mut().unwrap();
    let id = added
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .max()
        .unwrap() as u32
        + 1;
    added.push(
        json!({"id": id, "content": "}<", "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": false}),
    );
    let c = Config {
        vocab: b.config.vocab.max(id as usize + 1),
        eos: b.config.eos,
        ..Config::preset_tiny()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.cqlm");
    let tensors = cqlm::make::synth::synth_tensors(&c, &BitsPlan::uniform(4, 128), 3);
    let tokenizer = json.to_string();
    cqlm::archive::write_archive_file(&path, &c, Some(&tokenizer), &tensors).unwrap();
    let model = Model::load(&path).unwrap();
    let tok = cqlm::session::tokenizer::TextTokenizer::for_model(&model).unwrap();
    let text = |t: u32| tok.decode(&[t]).unwrap_or_default();
    let space = TokenSpace::for_model(&model).unwrap();
    let tools = json!([{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"x": {"enum": ["a", "b"]}},
        "required": ["x"], "additionalProperties": false}}}]);
    let whole = ConstraintSpec::Lark(whole_grammar(&tools));
    let mut crossed = false;
    for seed in 0..4 {
        let w = walk(
            space.compile(&spec(&tools)).unwrap(),
            space.compile(&whole).unwrap(),
            &text,
            seed,
            true,
            c.vocab,
        );
        assert!(w.called, "seed {seed}");
        crossed |= w.seen.contains(&id);
    }
    assert!(crossed, "the single grammar offers `}}<` at the call's end");
}
