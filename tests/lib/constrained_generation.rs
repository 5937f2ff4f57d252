//! Structured generation on the CPU engine, every output checked by an
//! independent validator: the `jsonschema` crate for the 42 schemas of
//! `tests/fixtures/constrain/schemas.json` (greedy and sampled, on the built-in
//! model and on a random model with its tokenizer), the `regex` crate for
//! patterns, tool calls against their tools' parameters; bad inputs are clean
//! errors; forced tokens fast-forwarded give the logits of stepping them.

use cqlm::constrain::{ConstraintSpec, JsonWhitespace, TokenSpace, ToolChoice, ToolSet};
use cqlm::cq::BitsPlan;
use cqlm::model::weights::Model;
use cqlm::session::sample::{Sampler, SamplerConfig};
use cqlm::session::tokenizer::TextTokenizer;
use cqlm::session::{Backend, Finish, Session};
use cqlm::{Config, CpuEngine, Engine, Readout};
use serde_json::{json, Value};
use std::sync::Arc;

fn builtin() -> Arc<Model> {
    Arc::new(cqlm::model::builtin::model().unwrap())
}

/// A random `tiny`-shaped model with the built-in model's vocabulary and tokenizer.
fn random_with_tokenizer() -> Arc<Model> {
    let b = cqlm::model::builtin::model().unwrap();
    let config = Config {
        vocab: b.config.vocab,
        ..Config::preset_tiny()
    };
    let mut m = cqlm::make::synth::synth_model(&config, &BitsPlan::mixed(), 17).unwrap();
    m.tokenizer = b.tokenizer.clone();
    Arc::new(m)
}

/// Generate under `spec` from `prompt`: (text, stop).
fn run(
    model: &Arc<Model>,
    space: &TokenSpace,
    spec: &ConstraintSpec,
    prompt: &str,
    sampler: SamplerConfig,
    max: usize,
) -> (String, Finish, Vec<u32>) {
    let tok = TextTokenizer::for_model(model).unwrap();
    let mut c = space.compile(spec).unwrap();
    let mut s = Session::new(Arc::clone(model), Backend::Cpu).unwrap();
    s.prefill(&tok.encode(prompt).unwrap()).unwrap();
    let mut ids = Vec::new();
    let mut sampler = Sampler::new(sampler).unwrap();
    let (stop, _) = s
        .generate_constrained(&mut sampler, max, &mut c, |t| {
            ids.push(t);
            true
        })
        .unwrap();
    (tok.decode(&ids).unwrap(), stop, ids)
}

/// Whether every output of `s` is bounded in length (so a generous token limit
/// can never cut it): strings with a `maxLength` or a pattern without `+`/`*`,
/// integers with both bounds, arrays with `maxItems`, closed objects; numbers
/// are not (their fractions are unbounded).
fn bounded(s: &Value, root: &Value, depth: usize) -> bool {
    if depth > 8 {
        return false;
    }
    let b = |v: &Value| bounded(v, root, depth + 1);
    if s.get("const").is_some() || s.get("enum").is_some() {
        return true;
    }
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/$defs/");
        return b(&root["$defs"][name]);
    }
    for k in ["anyOf", "oneOf", "allOf"] {
        if let Some(list) = s.get(k).and_then(Value::as_array) {
            return list.iter().all(b);
        }
    }
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => return false,
    };
    types.iter().all(|t| match *t {
        "boolean" | "null" => true,
        "string" => {
            s.get("maxLength").is_some()
                || s.get("pattern")
                    .and_then(Value::as_str)
                    .is_some_and(|p| !p.contains('+') && !p.contains('*'))
        }
        "integer" => {
            (s.get("maximum").is_some() || s.get("exclusiveMaximum").is_some())
                && (s.get("minimum").is_some() || s.get("exclusiveMinimum").is_some())
        }
        "array" => {
            let prefix = s
                .get("prefixItems")
                .and_then(Value::as_array)
                .is_some_and(|p| p.iter().all(b));
            (prefix && s.get("items") == Some(&Value::Bool(false)))
                || (s.get("maxItems").is_some() && s.get("items").is_some_and(b))
        }
        "object" => {
            s.get("additionalProperties") == Some(&Value::Bool(false))
                && s.get("properties")
                    .and_then(Value::as_object)
                    .is_some_and(|p| p.values().all(b))
        }
        _ => false,
    })
}

/// The longest run of whitespace outside JSON strings in `text`.
fn longest_space_outside_strings(text: &str) -> usize {
    let (mut in_str, mut escaped, mut run, mut longest) = (false, false, 0, 0);
    for c in text.chars() {
        if in_str {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        if c.is_whitespace() {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
            in_str = c == '"';
        }
    }
    longest
}

fn samplers() -> Vec<SamplerConfig> {
    vec![
        SamplerConfig::default(),
        SamplerConfig {
            temperature: 1.0,
            seed: 7,
            ..Default::default()
        },
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            seed: 8,
            ..Default::default()
        },
        SamplerConfig {
            temperature: 1.2,
            top_p: 0.9,
            repeat_penalty: 1.1,
            seed: 9,
            ..Default::default()
        },
    ]
}

#[test]
fn json_schema_outputs_validate_on_both_models() {
    let cases: Vec<Value> =
        serde_json::from_str(include_str!("../fixtures/constrain/schemas.json")).unwrap();
    assert!(cases.len() >= 40);
    for model in [builtin(), random_with_tokenizer()] {
        let space = TokenSpace::for_model(&model).unwrap();
        let (mut complete, mut cut) = (0, 0);
        for case in &cases {
            let name = case["name"].as_str().unwrap();
            let schema = &case["schema"];
            let bounded = bounded(schema, schema, 0);
            let validator = jsonschema::validator_for(schema).unwrap();
            for (i, cfg) in samplers().into_iter().enumerate() {
                let spec = ConstraintSpec::json_schema(schema.clone());
                let (text, stop, _) = run(&model, &space, &spec, "Answer in JSON:", cfg, 160);
                if stop == Finish::Length {
                    assert!(
                        !bounded,
                        "{name} sampler {i}: cut at the token limit: {text}"
                    );
                    cut += 1;
                    continue;
                }
                assert_eq!(stop, Finish::Complete, "{name} sampler {i}");
                complete += 1;
                let v: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{name} sampler {i}: not JSON ({e}): {text}"));
                assert!(
                    validator.is_valid(&v),
                    "{name} sampler {i}: invalid against the schema: {text}"
                );
                // Compact: no whitespace outside strings.
                assert_eq!(
                    longest_space_outside_strings(&text),
                    0,
                    "{name} sampler {i}: not compact: {text}"
                );
            }
        }
        let n_bounded = cases
            .iter()
            .filter(|c| bounded(&c["schema"], &c["schema"], 0))
            .count();
        eprintln!("schemas: {complete} complete, {cut} cut (unbounded schemas only; {n_bounded} of {} bounded)", cases.len());
        assert!(n_bounded >= 25, "{n_bounded} bounded schemas");
        // Every bounded schema completed under every sampler (asserted above).
        assert!(
            complete >= n_bounded * samplers().len(),
            "{complete} complete"
        );
    }
}

#[test]
fn bounded_whitespace_is_bounded() {
    let model = builtin();
    let space = TokenSpace::for_model(&model).unwrap();
    let schema = json!({"type": "object", "properties": {"a": {"type": "array",
        "items": {"type": "integer", "maximum": 9, "minimum": 0}, "maxItems": 3}},
        "required": ["a"], "additionalProperties": false});
    for seed in 0..4 {
        let spec = ConstraintSpec::JsonSchema {
            schema: schema.clone(),
            whitespace: JsonWhitespace(2),
        };
        let cfg = SamplerConfig {
            temperature: 1.5,
            seed,
            ..Default::default()
        };
        let (text, stop, _) = run(&model, &space, &spec, "JSON:", cfg, 120);
        assert_eq!(stop, Finish::Complete, "{text:?}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(jsonschema::is_valid(&schema, &v));
        assert!(longest_space_outside_strings(&text) <= 2, "{text:?}");
    }
}

#[test]
fn the_whitespace_bound_is_in_the_grammar() {
    // Independent of what a model happens to write: after the forced `{`, a
    // space is allowed only with a whitespace bound, and never a third in a row
    // with a bound of 2.
    let model = builtin();
    let space = TokenSpace::for_model(&model).unwrap();
    let tok = TextTokenizer::for_model(&model).unwrap();
    let ids = tok.encode(" ").unwrap();
    assert_eq!(ids.len(), 2, "BOS and one space token");
    let sp = ids[1];
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}},
        "required": ["a"], "additionalProperties": false});
    let mut mask = cqlm::constrain::TokenMask::none(model.config.vocab);
    for (bound, runs) in [(0usize, 0usize), (2, 2)] {
        let spec = ConstraintSpec::JsonSchema {
            schema: schema.clone(),
            whitespace: JsonWhitespace(bound),
        };
        let mut c = space.compile(&spec).unwrap();
        let forced = tok.decode(&c.take_forced()).unwrap();
        assert!(
            forced.starts_with('{') && !forced.contains(' '),
            "{forced:?}"
        );
        for i in 0..=runs {
            c.mask_into(&mut mask).unwrap();
            let allowed = mask.is_allowed(sp);
            assert_eq!(
                allowed,
                i < runs,
                "bound {bound}: space {i} after {forced:?}"
            );
            if allowed {
                c.commit(sp).unwrap();
            }
        }
    }
}

#[test]
fn regex_outputs_match_as_a_whole() {
    let model = builtin();
    let space = TokenSpace::for_model(&model).unwrap();
    for pattern in [
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
        r"(yes|no|maybe)",
        r"[A-Z][a-z]{1,8} [A-Z][a-z]{1,8}",
        r"\+?[0-9]{1,3}( [0-9]{3}){2}",
        r"(the|a) [a-z]{3,8}",
    ] {
        let full = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
        for cfg in samplers() {
            let spec = ConstraintSpec::Regex(pattern.into());
            let (text, stop, _) = run(&model, &space, &spec, "The answer:", cfg, 40);
            assert_eq!(stop, Finish::Complete, "{pattern}: {text:?}");
            assert!(full.is_match(&text), "{pattern}: {text:?}");
        }
    }
}

#[test]
fn lark_grammar_outputs_parse() {
    let model = builtin();
    let space = TokenSpace::for_model(&model).unwrap();
    let g =
        "start: expr\nexpr: NUM | \"(\" expr OP expr \")\"\nOP: \"+\" | \"*\"\nNUM: /[0-9]{1,2}/\n";
    // An independent check: a small recursive parser of the same language.
    fn expr(s: &[u8], i: usize) -> Option<usize> {
        if s.get(i) == Some(&b'(') {
            let j = expr(s, i + 1)?;
            if !matches!(s.get(j), Some(b'+' | b'*')) {
                return None;
            }
            let k = expr(s, j + 1)?;
            (s.get(k) == Some(&b')')).then_some(k + 1)
        } else {
            let n = s[i..].iter().take_while(|c| c.is_ascii_digit()).count();
            (1..=2).contains(&n).then_some(i + n)
        }
    }
    for cfg in samplers() {
        let (text, stop, _) = run(
            &model,
            &space,
            &ConstraintSpec::Lark(g.into()),
            "Sum:",
            cfg,
            60,
        );
        if stop == Finish::Length {
            continue; // the language is unbounded
        }
        assert_eq!(expr(text.as_bytes(), 0), Some(text.len()), "{text:?}");
    }
}

fn demo_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "lookup_verse",
            "parameters": {"type": "object", "properties": {
                "book": {"type": "string", "maxLength": 16},
                "chapter": {"type": "integer", "minimum": 1, "maximum": 150},
                "verse": {"type": "integer", "minimum": 1, "maximum": 176}},
                "required": ["book", "chapter", "verse"], "additionalProperties": false}}}
    ])
}

#[test]
fn tool_calls_parse_and_fit_their_parameters() {
    let model = builtin();
    let space = TokenSpace::for_model(&model).unwrap();
    let raw = demo_tools();
    let tools = ToolSet::from_openai(&raw).unwrap();
    let params = |name: &str| {
        raw.as_array()
            .unwrap()
            .iter()
            .find(|t| t["function"]["name"] == name)
            .map(|t| t["function"]["parameters"].clone())
            .unwrap()
    };
    for (choice, parallel) in [
        (ToolChoice::Required, false),
        (ToolChoice::Required, true),
        (ToolChoice::Function("lookup_verse".into()), false),
        (ToolChoice::Auto, false),
    ] {
        for cfg in samplers() {
            let spec = ConstraintSpec::Tools {
                tools: tools.clone(),
                choice: choice.clone(),
                parallel,
            };
            let mut c = space.compile(&spec).unwrap();
            let tok = TextTokenizer::for_model(&model).unwrap();
            let mut s = Session::new(Arc::clone(&model), Backend::Cpu).unwrap();
            s.prefill(&tok.encode("What is the weather in Paris?").unwrap())
                .unwrap();
            let mut ids = Vec::new();
            let (stop, _) = s
                .generate_constrained(&mut Sampler::new(cfg).unwrap(), 120, &mut c, |t| {
                    ids.push(t);
                    true
                })
                .unwrap();
            let text = tok.decode(&ids).unwrap();
            if stop == Finish::Length {
                // Only free text (auto) and arrays of calls (parallel) are unbounded.
                assert!(choice == ToolChoice::Auto || parallel, "{text:?}");
                continue;
            }
            let calls = c.tool_calls(&text).unwrap();
            match &choice {
                ToolChoice::Auto if !text.starts_with("<tool_call>") => {
                    assert!(calls.is_empty());
                    continue;
                }
                _ => assert!(!calls.is_empty(), "{choice:?}: {text:?}"),
            }
            if !parallel {
                assert_eq!(calls.len(), 1, "{text:?}");
            }
            for call in calls {
                if let ToolChoice::Function(n) = &choice {
                    assert_eq!(&call.name, n);
                }
                assert!(
                    jsonschema::is_valid(&params(&call.name), &call.arguments),
                    "{text:?}"
                );
            }
        }
    }
}

#[test]
fn bad_constraints_are_clean_errors() {
    let model = builtin();
    let space = TokenSpace::for_model(&model).unwrap();
    let err = |spec: ConstraintSpec| space.compile(&spec).unwrap_err().to_string();
    let e = err(ConstraintSpec::json_schema(
        json!({"type": "object", "properties": 5}),
    ));
    assert!(e.contains("JSON schema"), "{e}");
    let e = err(ConstraintSpec::json_schema(json!({"type": "strnig"})));
    assert!(e.contains("JSON schema"), "{e}");
    // A keyword llguidance does not support.
    let e = err(ConstraintSpec::json_schema(
        json!({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}),
    ));
    assert!(e.contains("JSON schema"), "{e}");
    let e = err(ConstraintSpec::json_schema(json!(true)));
    assert!(e.contains("object"), "{e}");
    let e = err(ConstraintSpec::Regex("(ab".into()));
    assert!(e.contains("regular expression"), "{e}");
    let e = err(ConstraintSpec::Lark("start: (".into()));
    assert!(e.contains("Lark grammar"), "{e}");
    let bad_params =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]);
    let e = ToolSet::from_openai(&bad_params).unwrap_err().to_string();
    assert!(e.contains("parameters must be an object schema"), "{e}");
    for bad in [
        json!({}),
        json!([]),
        json!([{"type": "code"}]),
        json!([{"type": "function", "function": {"name": "a b"}}]),
    ] {
        assert!(ToolSet::from_openai(&bad).is_err(), "{bad}");
    }
    let tools = ToolSet::from_openai(&demo_tools()).unwrap();
    let e = err(ConstraintSpec::Tools {
        tools,
        choice: "nope".parse().unwrap(),
        parallel: false,
    });
    assert!(e.contains("no such tool"), "{e}");
    // A model without a tokenizer cannot be constrained.
    let m = cqlm::make::synth::synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 3).unwrap();
    assert!(TokenSpace::for_model(&m).is_err());
}

#[test]
fn forced_tokens_fast_forwarded_give_the_logits_of_stepping_them() {
    // A schema whose output is mostly forced: the session prefills forced runs as
    // chunks; stepping the same ids one by one gives bit-identical logits.
    let model = builtin();
    let space = TokenSpace::for_model(&model).unwrap();
    let schema = json!({"type": "object", "properties": {
        "a_long_forced_property_name": {"enum": ["first value", "second value"]},
        "another_forced_key": {"type": "boolean"}},
        "required": ["a_long_forced_property_name", "another_forced_key"],
        "additionalProperties": false});
    let tok = TextTokenizer::for_model(&model).unwrap();
    let prompt = tok.encode("JSON:").unwrap();
    let mut c = space.compile(&ConstraintSpec::json_schema(schema)).unwrap();
    let mut s = Session::new(Arc::clone(&model), Backend::Cpu).unwrap();
    s.prefill(&prompt).unwrap();
    let (stop, stats) = s
        .generate_constrained(&mut Sampler::greedy(), 100, &mut c, |_| true)
        .unwrap();
    assert_eq!(stop, Finish::Complete);
    assert!(stats.forced > stats.chosen, "{stats:?}");
    let mut e = CpuEngine::new(Arc::clone(&model)).unwrap();
    let mut last = Vec::new();
    for &t in s.tokens() {
        last = e
            .step(t, Readout::Logits)
            .unwrap()
            .logits()
            .unwrap()
            .to_vec();
    }
    let a: Vec<u32> = s.logits().iter().map(|v| v.to_bits()).collect();
    let b: Vec<u32> = last.iter().map(|v| v.to_bits()).collect();
    assert_eq!(a, b);
}
