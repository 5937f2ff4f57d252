//! Custom tools (free-text input, optionally in a Lark or regex grammar) in a
//! tool set beside a function: along random token paths over the built-in
//! model's vocabulary, under `required` and `auto`, every finished output is
//! free text or calls between the markers, and each call's input is checked
//! by an independent validator (a regular expression written here for the
//! patch grammar's language, the regex tool's pattern, the function's
//! arguments against its schema). Also: the parse of calls written by hand,
//! and the errors of a bad set.

use cqlm::constrain::{
    ConstraintSpec, CustomTool, TextGrammar, TokenMask, TokenSpace, ToolChoice, ToolSet,
};
use rand::{Rng, SeedableRng};
use serde_json::json;

/// A small patch format of our own.
const PATCH: &str = r#"
start: "*** Begin Patch\n" hunk hunk? "*** End Patch"
hunk: "*** Update File: " PATH "\n" line line?
line: SIGN TEXT "\n"
SIGN: /[+ -]/
PATH: /[a-z]{1,10}\.py/
TEXT: /[a-z ]{0,16}/
"#;

/// The language of [`PATCH`], written apart from it.
const PATCH_LANGUAGE: &str = r"\*\*\* Begin Patch\n(\*\*\* Update File: [a-z]{1,10}\.py\n([+ -][a-z ]{0,16}\n){1,2}){1,2}\*\*\* End Patch";

const TICKET: &str = r"[A-Z]{2,4}-[0-9]{1,5}";

fn tool_set() -> ToolSet {
    let functions = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"], "additionalProperties": false}}}]);
    let custom = vec![
        CustomTool {
            name: "apply_patch".into(),
            description: Some("Apply a patch.".into()),
            grammar: Some(TextGrammar::Lark(PATCH.into())),
        },
        CustomTool {
            name: "open_ticket".into(),
            description: None,
            grammar: Some(TextGrammar::Regex(TICKET.into())),
        },
        CustomTool {
            name: "note".into(),
            description: None,
            grammar: None,
        },
    ];
    ToolSet::from_parts(Some(&functions), custom).unwrap()
}

/// One random path: a random allowed token at each step, the end wherever
/// the output may end with probability 1/2. The text, if it finished.
fn walk(
    space: &TokenSpace,
    spec: &ConstraintSpec,
    text: &dyn Fn(u32) -> String,
    seed: u64,
    vocab: usize,
) -> Option<String> {
    let mut c = space.compile(spec).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut mask = TokenMask::none(vocab);
    let mut out = String::new();
    for _ in 0..400 {
        for t in c.take_forced() {
            out.push_str(&text(t));
        }
        if c.is_stopped() {
            return Some(out);
        }
        c.mask_into(&mut mask).unwrap();
        if mask.is_allowed(c.eos()) && rng.random_bool(0.5) {
            return Some(out);
        }
        let allowed: Vec<u32> = (0..vocab as u32)
            .filter(|&t| mask.is_allowed(t) && t != c.eos())
            .collect();
        // Prefer short tokens that begin a marker or a line, so paths finish.
        let helpful: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|&t| {
                let s = text(t);
                s.starts_with('<') || s.starts_with('*') || s.contains('\n')
            })
            .collect();
        let pool = if !helpful.is_empty() && rng.random_bool(0.3) {
            &helpful
        } else {
            &allowed
        };
        let t = pool[rng.random_range(0..pool.len())];
        out.push_str(&text(t));
        c.commit(t).unwrap();
    }
    None
}

#[test]
fn every_finished_output_parses_and_each_input_is_in_its_tools_language() {
    let model = cqlm::model::builtin::model().unwrap();
    let vocab = model.config.vocab;
    let space = TokenSpace::for_model(&model).unwrap();
    let tok = cqlm::session::tokenizer::TextTokenizer::for_model(&model).unwrap();
    let text = |t: u32| tok.decode(&[t]).unwrap_or_default();
    let (patch, ticket) = (
        regex::Regex::new(&format!("^{PATCH_LANGUAGE}$")).unwrap(),
        regex::Regex::new(&format!("^{TICKET}$")).unwrap(),
    );
    let mut seen = std::collections::BTreeSet::new();
    for choice in [ToolChoice::Required, ToolChoice::Auto] {
        let spec = ConstraintSpec::Tools {
            tools: tool_set(),
            choice: choice.clone(),
            parallel: true,
        };
        let checker = space.compile(&spec).unwrap();
        let mut finished = 0;
        for seed in 0..60 {
            let Some(out) = walk(&space, &spec, &text, seed, vocab) else {
                continue;
            };
            finished += 1;
            let calls = checker
                .tool_calls(&out)
                .unwrap_or_else(|e| panic!("{e}: {out:?}"));
            if choice == ToolChoice::Required {
                assert!(!calls.is_empty(), "required: {out:?}");
            }
            if calls.is_empty() {
                assert!(!out.starts_with('<'), "free text: {out:?}");
            }
            for c in &calls {
                seen.insert(c.name.clone());
                match (c.name.as_str(), &c.input) {
                    ("apply_patch", Some(i)) => assert!(patch.is_match(i), "{i:?}"),
                    ("open_ticket", Some(i)) => assert!(ticket.is_match(i), "{i:?}"),
                    ("note", Some(i)) => assert!(!i.contains("</tool_call>"), "{i:?}"),
                    ("get_weather", None) => {
                        assert!(c.arguments["city"].is_string(), "{:?}", c.arguments);
                        assert_eq!(c.arguments.as_object().unwrap().len(), 1);
                    }
                    other => panic!("{other:?} in {out:?}"),
                }
            }
        }
        assert!(
            finished >= 30,
            "{choice:?}: {finished} of 60 paths finished"
        );
    }
    for name in ["apply_patch", "open_ticket", "note", "get_weather"] {
        assert!(seen.contains(name), "no path called {name}: {seen:?}");
    }
}

#[test]
fn calls_between_markers_parse_and_a_bad_set_is_refused() {
    let model = cqlm::model::builtin::model().unwrap();
    let space = TokenSpace::for_model(&model).unwrap();
    let spec = ConstraintSpec::Tools {
        tools: tool_set(),
        choice: ToolChoice::Auto,
        parallel: true,
    };
    let c = space.compile(&spec).unwrap();
    let calls = c
        .tool_calls("<tool_call>open_ticket\nAB-12</tool_call><tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}</tool_call>")
        .unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].name.as_str(), calls[0].input.as_deref()),
        ("open_ticket", Some("AB-12"))
    );
    assert_eq!(calls[1].arguments, json!({"city": "Oslo"}));
    assert!(calls[1].input.is_none());
    assert!(c.tool_calls("Just text.").unwrap().is_empty());
    assert!(c.tool_calls("<tool_call>nope\nx</tool_call>").is_err());
    assert!(c.tool_calls("<tool_call>note\nno end").is_err());
    // Names: unique across functions and custom tools, and well formed.
    let f = json!([{"type": "function", "function": {"name": "note"}}]);
    let dup = vec![CustomTool {
        name: "note".into(),
        description: None,
        grammar: None,
    }];
    assert!(ToolSet::from_parts(Some(&f), dup).is_err());
    let bad = vec![CustomTool {
        name: "a b".into(),
        description: None,
        grammar: None,
    }];
    assert!(ToolSet::from_parts(None, bad).is_err());
    assert!(ToolSet::from_parts(None, Vec::new()).is_err());
    // A grammar that does not compile is a clean error.
    let broken = vec![CustomTool {
        name: "x".into(),
        description: None,
        grammar: Some(TextGrammar::Lark("start: (".into())),
    }];
    let spec = ConstraintSpec::Tools {
        tools: ToolSet::from_parts(None, broken).unwrap(),
        choice: ToolChoice::Required,
        parallel: false,
    };
    assert!(space.compile(&spec).is_err());
}
