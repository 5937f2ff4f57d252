//! The built-in model's chat template: Rust (minijinja, the server's renderer, and
//! the Rust tokenizer) turns the same conversations into the same prompt text and
//! token ids as Python (jinja2 and the `tokenizers` package) did when it wrote
//! `tests/fixtures/chat/rendered.json` (`tools/train/chat_fixtures.py`), and the
//! prompt the server sends is a prefix of what training saw.
//!
//! With `CQLM_OPENAI_PYTHON` naming a Python with jinja2 and tokenizers (CI's
//! venv), the fixture is also rebuilt live and must equal the committed one.

use cqlm::serve::chat::ChatTemplate;
use cqlm::serve::wire::Message;
use cqlm::session::tokenizer::TextTokenizer;
use serde_json::Value;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture() -> Value {
    let path = root().join("tests/fixtures/chat/rendered.json");
    serde_json::from_slice(&std::fs::read(&path).expect("fixture present")).unwrap()
}

fn tools_by_name() -> Vec<Value> {
    let text = std::fs::read_to_string(root().join("tools/train/tools.json")).unwrap();
    serde_json::from_str::<Vec<Value>>(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn rust_renders_and_tokenizes_conversations_as_python_did() {
    let model = cqlm::model::builtin::model().unwrap();
    let tok = TextTokenizer::for_model(&model).unwrap();
    let (bos, eos) = (
        tok.decode_special(model.config.bos),
        tok.decode_special(model.config.eos),
    );
    let fx = fixture();
    assert_eq!(fx["bos"], bos.as_str());
    assert_eq!(fx["eos"], eos.as_str(), "the end of a turn is the EOS");
    let template = ChatTemplate::new(model.chat_template.as_deref(), &bos, &eos).unwrap();
    assert!(
        model.chat_template.is_some(),
        "the built-in model ships a template"
    );
    let defs = tools_by_name();
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let mut prefixes = 0;
    for (i, c) in cases.iter().enumerate() {
        let messages: Vec<Message> = serde_json::from_value(c["messages"].clone()).unwrap();
        let tools = c["tools"].as_array().map(|names| {
            Value::Array(
                names
                    .iter()
                    .map(|n| {
                        defs.iter()
                            .find(|d| d["function"]["name"] == *n)
                            .unwrap()
                            .clone()
                    })
                    .collect(),
            )
        });
        let text = template.render(&messages, tools.as_ref()).unwrap();
        assert_eq!(text, c["prompt"].as_str().unwrap(), "case {i}: prompt text");
        let got = tok.encode(&text).unwrap();
        let want = ids(&c["prompt_ids"]);
        assert_eq!(got, want, "case {i}: prompt ids");
        assert_eq!(
            got[0], model.config.bos,
            "case {i}: one BOS, from the template"
        );
        assert_ne!(
            got[1], model.config.bos,
            "case {i}: one BOS, from the template"
        );
        if !c["full_ids"].is_null() {
            let full = ids(&c["full_ids"]);
            assert!(
                full.starts_with(&got),
                "case {i}: the prompt is a prefix of the training ids"
            );
            prefixes += 1;
        }
    }
    assert!(prefixes >= 24, "{prefixes} prefix checks");
}

#[test]
fn the_python_fixture_is_current() {
    let Some(python) = std::env::var_os("CQLM_OPENAI_PYTHON") else {
        eprintln!("skipped: CQLM_OPENAI_PYTHON is unset (the committed fixture is still checked)");
        return;
    };
    let out = std::process::Command::new(python)
        .arg(root().join("tools/train/chat_fixtures.py"))
        .arg("--stdout")
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let live: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(live, fixture(), "rerun tools/train/chat_fixtures.py");
}
