//! The `features` test binary: the engine alone (`default-features = false`)
//! links none of the command line's or the server's crates, and `server` none of
//! the command line's, read off `cargo tree`'s normal dependencies for the host.
//!
//! Needs no feature itself, so `cargo test --no-default-features` runs it too.

use std::collections::BTreeSet;
use std::process::Command;

/// Crates only the `cqlm` binary uses (the `cli` feature). Not `anyhow`, which
/// the binary also takes from `cli` but llguidance links anyway.
const CLI_ONLY: &[&str] = &[
    "clap",
    "indicatif",
    "plotters",
    "ctrlc",
    "env_logger",
    "npyz",
];
/// Crates only `cqlm::serve` uses (the `server` feature).
const SERVER_ONLY: &[&str] = &[
    "axum",
    "tokio",
    "tokio-stream",
    "serde_path_to_error",
    "minijinja",
    "prometheus-client",
];

/// The names of the packages in cqlm's normal dependency tree, itself included,
/// built with `features` (cargo arguments).
fn tree(features: &[&str]) -> BTreeSet<String> {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--manifest-path", manifest, "-e", "normal"])
        .args(["--prefix", "none", "--format", "{p}"])
        .args(features)
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree {features:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: BTreeSet<String> = String::from_utf8(out.stdout)
        .expect("cargo tree output is UTF-8")
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    // An empty or unparsed tree would pass every absence check below.
    for engine in ["cqlm", "wgpu", "tokenizers", "llguidance"] {
        assert!(
            names.contains(engine),
            "{engine} missing from the tree {features:?}: {names:?}"
        );
    }
    names
}

fn assert_absent(names: &BTreeSet<String>, crates: &[&str], what: &str) {
    let found: Vec<&str> = crates
        .iter()
        .copied()
        .filter(|c| names.contains(*c))
        .collect();
    assert!(found.is_empty(), "{what} links {found:?}");
}

#[test]
fn engine_alone_links_no_cli_or_server_crate() {
    let names = tree(&["--no-default-features"]);
    assert_absent(&names, CLI_ONLY, "the engine alone (--no-default-features)");
    assert_absent(
        &names,
        SERVER_ONLY,
        "the engine alone (--no-default-features)",
    );
}

#[test]
fn server_links_no_cli_crate() {
    let names = tree(&["--no-default-features", "--features", "server"]);
    assert_absent(&names, CLI_ONLY, "--features server");
    for c in SERVER_ONLY {
        assert!(names.contains(*c), "--features server lacks {c}");
    }
}

/// The names above are the ones cargo prints: the default build has them all.
#[test]
fn default_features_link_the_cli_and_server_crates() {
    let names = tree(&[]);
    for c in CLI_ONLY.iter().chain(SERVER_ONLY) {
        assert!(names.contains(*c), "the default features lack {c}");
    }
}
