//! Shader checks that need no adapter: every WGSL file parses and validates with
//! naga, and each params struct has the same size in WGSL as its Rust mirror.

/// Parse and validate WGSL with every validation flag and capability.
///
/// # Errors
/// The parse or validation error as text.
pub fn validate_wgsl(source: &str) -> Result<naga::Module, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{e:?}"))?;
    Ok(module)
}

/// Byte size of the WGSL struct `name` in `module`, if it exists.
pub fn wgsl_struct_size(module: &naga::Module, name: &str) -> Option<u32> {
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(module.to_ctx()).ok()?;
    module
        .types
        .iter()
        .find(|(_, t)| t.name.as_deref() == Some(name))
        .map(|(h, _)| layouter[h].size)
}
