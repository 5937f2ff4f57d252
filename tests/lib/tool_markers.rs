//! Tool-call markers named by the archive (`cqlm.tool_call_markers`): stored and
//! read back, malformed values rejected with the key named, and in `auto` mode
//! the grammar takes calls between those markers (and free text that cannot be
//! confused with them), token by token through the constraint's masks.

use cqlm::constrain::{ConstraintSpec, TokenMask, TokenSpace, ToolChoice, ToolMarkers, ToolSet};
use cqlm::cq::BitsPlan;
use cqlm::session::tokenizer::TextTokenizer;
use cqlm::{Config, Model};
use serde_json::json;

fn config() -> Config {
    let b = cqlm::model::builtin::model().unwrap();
    Config {
        vocab: b.config.vocab,
        eos: b.config.eos,
        ..Config::preset_tiny()
    }
}

/// An archive with these markers, and its folder.
fn archive_with(markers: (&str, &str)) -> (tempfile::TempDir, std::path::PathBuf) {
    let b = cqlm::model::builtin::model().unwrap();
    let c = config();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.cqlm");
    let tensors = cqlm::make::synth::synth_tensors(&c, &BitsPlan::uniform(4, 128), 3);
    cqlm::archive::write_archive_file_with_chat(
        &path,
        &c,
        b.tokenizer.as_deref(),
        None,
        Some(&ToolMarkers::new(markers.0, markers.1).unwrap()),
        &tensors,
    )
    .unwrap();
    (dir, path)
}

#[test]
fn markers_are_stored_and_read_back() {
    let (_d, path) = archive_with(("[[call]]", "[[/call]]"));
    let m = Model::load(&path).unwrap();
    assert_eq!(
        m.tool_markers,
        ToolMarkers::new("[[call]]", "[[/call]]").unwrap()
    );
    // The built-in model names the default markers; an archive without any gets them.
    let plain = cqlm::model::builtin::model().unwrap();
    assert_eq!(plain.tool_markers, ToolMarkers::default());
    let c = config();
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("none.cqlm");
    let tensors = cqlm::make::synth::synth_tensors(&c, &BitsPlan::uniform(4, 128), 3);
    cqlm::archive::write_archive_file(&none, &c, None, &tensors).unwrap();
    assert_eq!(
        Model::load(&none).unwrap().tool_markers,
        ToolMarkers::default()
    );
}

#[test]
fn malformed_markers_are_an_error_naming_the_key() {
    // Same-length edits of the stored value `["@@","%%"]` inside the header JSON
    // (which holds it once: not a merge of the tokenizer's).
    let (_d, path) = archive_with(("@@", "%%"));
    let bytes = std::fs::read(&path).unwrap();
    let stored = br#"[\"@@\",\"%%\"]"#;
    let found: Vec<usize> = bytes
        .windows(stored.len())
        .enumerate()
        .filter(|(_, w)| *w == stored)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(found.len(), 1, "the markers are in the header once");
    let at = found[0];
    for (bad, why) in [
        (&br#"[\"\",\"@@%%\"]"#[..], "a marker is empty"),
        (&br#"[1,2]          "#[..], "two strings"),
        (&br#"[\"ABCDEFGHI\"]"#[..], "two strings"),
        (&br#"{\"@@\":\"%%\"}"#[..], "two strings"),
    ] {
        assert_eq!(bad.len(), stored.len());
        let mut b = bytes.clone();
        b[at..at + bad.len()].copy_from_slice(bad);
        let err = Model::from_bytes(&b, "edited").unwrap_err().to_string();
        assert!(
            err.contains("cqlm.tool_call_markers") && err.contains(why),
            "{err}"
        );
    }
}

#[test]
fn auto_mode_takes_calls_between_the_archive_markers() {
    let (_d, path) = archive_with(("[[call]]", "[[/call]]"));
    let model = Model::load(&path).unwrap();
    let tok = TextTokenizer::for_model(&model).unwrap();
    let space = TokenSpace::for_model(&model).unwrap();
    let tools = ToolSet::from_openai(&json!([{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"], "additionalProperties": false}}}]))
    .unwrap()
    .with_markers(model.tool_markers.clone());
    let spec = ConstraintSpec::Tools {
        tools,
        choice: ToolChoice::Auto,
        parallel: false,
    };
    let vocab = model.config.vocab;
    // Feed `text` token by token, each one checked against the mask first:
    // whether all were allowed, and the calls parsed at the end.
    let feed = |text: &str| {
        let mut c = space.compile(&spec).unwrap();
        let mut mask = TokenMask::none(vocab);
        for id in tok.encode(text).unwrap().into_iter().skip(1) {
            c.mask_into(&mut mask).unwrap();
            if !mask.is_allowed(id) {
                return (false, Vec::new());
            }
            c.commit(id).unwrap();
        }
        assert!(c.is_accepting(), "{text:?} can end");
        (true, c.tool_calls(text).unwrap())
    };
    let (ok, calls) =
        feed(r#"[[call]]{"name":"get_weather","arguments":{"city":"Oslo"}}[[/call]]"#);
    assert!(ok);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(calls[0].arguments, json!({"city": "Oslo"}));
    // Free text, even text that holds the default markers, is text.
    let (ok, calls) = feed("Hello <tool_call> there");
    assert!(ok);
    assert!(calls.is_empty());
    // Text that begins like the start marker must become a call.
    let (ok, _) = feed("[x] is not a call");
    assert!(!ok, "`[` can only begin the start marker");
}
