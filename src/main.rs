//! The `cqlm` command line. Every failure is one `error: …` line on stderr and a
//! non-zero exit status.

mod cli;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    quiet_vulkan_layers();
    env_logger::Builder::from_env(
        // naga 30 warns of every `@diagnostic(…)` rule it does not know; the
        // shaders name `subgroup_uniformity` for Tint's sake (shaders/cq_subgroup.wgsl),
        // which WGSL allows and naga then ignores: not a user's concern.
        env_logger::Env::default()
            .default_filter_or("warn,cqlm::request=info,naga::front::wgsl::parse::directive=error"),
    )
    .init();
    let args = match cli::Cli::try_parse() {
        Ok(args) => args,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line, as SPEC §7 asks of every failure; `--help` has the rest.
            let text = e.render().to_string();
            let msg: Vec<&str> = text
                .lines()
                .map(str::trim)
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .filter(|l| !l.is_empty())
                .collect();
            let msg = msg.join(" ");
            eprintln!("error: {}", msg.strip_prefix("error: ").unwrap_or(&msg));
            return ExitCode::from(2);
        }
    };
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {msg}");
            // A constrained output cut by --max-tokens: what was generated is on
            // stdout, and the status says it is incomplete.
            if e.downcast_ref::<cli::Incomplete>().is_some() {
                ExitCode::from(3)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Mesa's device-select Vulkan layer calls libwayland while wgpu lists adapters,
/// and without an absolute `XDG_RUNTIME_DIR` libwayland writes two
/// `error: XDG_RUNTIME_DIR is invalid` lines of its own on stderr. The layer only
/// orders devices, which cqlm chooses itself: turn it off in that case (before any
/// thread starts), unless the user has said otherwise.
fn quiet_vulkan_layers() {
    let runtime_ok =
        std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_absolute());
    if !runtime_ok && std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}
