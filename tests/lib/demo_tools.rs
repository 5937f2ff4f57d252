//! The in-process demo tools against `tools/train/demo_tools.py`, the
//! implementation the training corpus took its results from: the same calls
//! give the same compact JSON, byte for byte.

use std::process::Command;

/// Calls whose results the model saw in training, and the edges: units of each
/// dimension, temperatures, mismatched and unknown units, operator precedence,
/// modulo signs, bad expressions, known and unknown verses, bad arguments.
const CALLS: &[(&str, &str)] = &[
    ("get_weather", r#"{"city":"Oslo"}"#),
    ("get_weather", r#"{"city":"  paris ","unit":"fahrenheit"}"#),
    ("get_weather", r#"{"city":"São Paulo","unit":"celsius"}"#),
    ("get_weather", r#"{"city":"Tokyo","unit":"fahrenheit"}"#),
    ("get_weather", r#"{"city":"New York"}"#),
    (
        "convert_units",
        r#"{"value":5,"from_unit":"km","to_unit":"miles"}"#,
    ),
    (
        "convert_units",
        r#"{"value":100,"from_unit":"F","to_unit":"celsius"}"#,
    ),
    (
        "convert_units",
        r#"{"value":-40,"from_unit":"c","to_unit":"f"}"#,
    ),
    (
        "convert_units",
        r#"{"value":300,"from_unit":"kelvin","to_unit":"C"}"#,
    ),
    (
        "convert_units",
        r#"{"value":2.5,"from_unit":"gallons","to_unit":"l"}"#,
    ),
    (
        "convert_units",
        r#"{"value":12,"from_unit":"oz","to_unit":"grams"}"#,
    ),
    (
        "convert_units",
        r#"{"value":3,"from_unit":"kg","to_unit":"meters"}"#,
    ),
    (
        "convert_units",
        r#"{"value":3,"from_unit":"parsec","to_unit":"m"}"#,
    ),
    (
        "convert_units",
        r#"{"value":1,"from_unit":"stone","to_unit":"lb"}"#,
    ),
    ("calculate", r#"{"expression":"23 * 40"}"#),
    ("calculate", r#"{"expression":"10/4"}"#),
    ("calculate", r#"{"expression":"2 ^ 10"}"#),
    ("calculate", r#"{"expression":"-2**2"}"#),
    ("calculate", r#"{"expression":"2**-1"}"#),
    ("calculate", r#"{"expression":"(3 + 4) × 5 ÷ 2"}"#),
    ("calculate", r#"{"expression":"7 % -3"}"#),
    ("calculate", r#"{"expression":"-7 % 3"}"#),
    ("calculate", r#"{"expression":"1/3"}"#),
    ("calculate", r#"{"expression":"1.5e3 - .25"}"#),
    ("calculate", r#"{"expression":"5 / 0"}"#),
    ("calculate", r#"{"expression":"2 ** 13"}"#),
    ("calculate", r#"{"expression":"two plus two"}"#),
    ("calculate", r#"{"expression":"7 // 2"}"#),
    ("calculate", r#"{"expression":"(1 + 2"}"#),
    ("lookup_verse", r#"{"book":"John","chapter":3,"verse":16}"#),
    (
        "lookup_verse",
        r#"{"book":"psalms","chapter":23,"verse":1}"#,
    ),
    ("lookup_verse", r#"{"book":"Jude","chapter":1,"verse":99}"#),
    ("send_email", r#"{"to":"x"}"#),
];

#[test]
fn demo_tools_answer_as_the_training_corpus_did() {
    let script = r#"
import json, sys
sys.path.insert(0, "tools/train")
import demo_tools
for line in sys.stdin:
    name, args = json.loads(line)
    print(demo_tools.result_json(demo_tools.run(name, json.loads(args))))
"#;
    let input: String = CALLS
        .iter()
        .map(|c| serde_json::to_string(&[c.0, c.1]).unwrap() + "\n")
        .collect();
    let mut child = Command::new("python3")
        .args(["-c", script])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs (CI has it)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "demo_tools.py failed");
    let expected: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(expected.len(), CALLS.len());
    for ((name, args), want) in CALLS.iter().zip(expected) {
        assert_eq!(cqlm::demo_tools::call(name, args), want, "{name}({args})");
    }
}

#[test]
fn bad_arguments_are_error_objects_not_failures() {
    for (name, args) in [
        ("get_weather", "not json"),
        ("get_weather", "[1]"),
        ("get_weather", r#"{"town":"Oslo"}"#),
        (
            "convert_units",
            r#"{"value":"five","from_unit":"m","to_unit":"km"}"#,
        ),
        ("lookup_verse", r#"{"book":"John","chapter":3}"#),
    ] {
        let out: serde_json::Value =
            serde_json::from_str(&cqlm::demo_tools::call(name, args)).expect("a result is JSON");
        assert!(out["error"].is_string(), "{name}({args}) -> {out}");
    }
    assert_eq!(cqlm::demo_tools::tools().as_array().unwrap().len(), 4);
}
