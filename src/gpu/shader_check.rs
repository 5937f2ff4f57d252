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

/// Parse and validate WGSL (as [`validate_wgsl`]) and return the validator's
/// module info too.
///
/// # Errors
/// The parse or validation error as text.
pub fn validate_wgsl_info(source: &str) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{e:?}"))?;
    Ok((module, info))
}

/// Static workgroup memory of the entry point `entry` of WGSL `source`, in bytes,
/// counted as WebGPU counts it against `max_compute_workgroup_storage_size`: the
/// sum, over the `var<workgroup>` globals the entry point (or a function it calls)
/// actually uses, of each one's size rounded up to 16 bytes. Globals only another
/// entry point of the file uses don't count. Array sizes must be constant (not
/// pipeline overrides).
///
/// # Errors
/// A parse or validation error, a missing entry point, or a size naga can't lay
/// out, as text.
pub fn workgroup_bytes(source: &str, entry: &str) -> Result<u32, String> {
    let (module, info) = validate_wgsl_info(source)?;
    let index = module
        .entry_points
        .iter()
        .position(|e| e.name == entry)
        .ok_or_else(|| format!("no entry point `{entry}`"))?;
    let uses = info.get_entry_point(index);
    let mut layouter = naga::proc::Layouter::default();
    layouter
        .update(module.to_ctx())
        .map_err(|e| format!("layout: {e:?}"))?;
    let mut total = 0u32;
    for (h, g) in module.global_variables.iter() {
        if g.space == naga::AddressSpace::WorkGroup && !uses[h].is_empty() {
            let size = layouter[g.ty].size.div_ceil(16) * 16;
            total = total
                .checked_add(size)
                .ok_or_else(|| "workgroup memory overflows u32".to_string())?;
        }
    }
    Ok(total)
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

#[cfg(test)]
mod tests {
    use super::workgroup_bytes;
    use crate::gpu::kernels::{attention, cq, engram, layer, mhc, mlp, sample};

    #[test]
    fn workgroup_bytes_of_each_entry_point_match_a_hand_count() {
        // Hand counts from the `var<workgroup>` declarations (f32/u32/atomic = 4 bytes,
        // each variable rounded up to 16 bytes).
        let sg = cq::subgroup_source();
        let cases: [(&str, &str, u32); 14] = [
            // best_v, best_i, bad: 3 × 256 × 4 (topk's variables don't count).
            (sample::SOURCE, "argmax", 3 * 1024),
            // hist 1024, taken 4 → 16, flag 4 → 16, sel 16, scratch 256 × 4.
            (sample::SOURCE, "topk", 1024 + 16 + 16 + 16 + 1024),
            // xs 1024 × 4 + scratch 64 × 4; attend adds w_sh and row_sh (64 × 4
            // each) and, through attend_body (which qk_attend shares), cur_codes
            // (512 × 4), cur_scale (2 × 4 → 16), q4 (256 vec4: 4096) and
            // part_sh (64 vec4: 1024): 12 KiB, within WebGPU's default 16 KiB.
            (attention::SOURCE, "qk_store", 4096 + 256),
            (
                attention::SOURCE,
                "attend",
                4096 + 256 + 256 + 256 + 2048 + 16 + 4096 + 1024,
            ),
            (
                attention::SOURCE,
                "qk_attend",
                4096 + 256 + 256 + 256 + 2048 + 16 + 4096 + 1024,
            ),
            // mlp.wgsl's scratch only: within WebGPU's default 16 KiB.
            (layer::SOURCE, "layer_step", 16384),
            // wide.wgsl's scratch, 256 × 4 (route keeps its 20 gates there).
            (mhc::SOURCE, "premix", 1024),
            (mhc::SOURCE, "route", 1024),
            // scratch = CHUNK (4096) × 4.
            (mlp::SOURCE, "mlp", 16384),
            (engram::SOURCE, "conv", 0),
            // scratch 4096 × 4, lut 1024 × 4, red 64 × 4.
            (cq::SOURCE, "matvec", 16384 + 4096 + 256),
            // scratch 4096 × 4.
            (cq::SOURCE, "gather_many", 16384),
            // scratch 4096 × 4, red 64 × 4 (input_rms, inputs over one chunk), red_tb
            // 64 × MAX_TB (8) × 4 (inputs_rms, side by side).
            (cq::SOURCE, "prepare_inputs", 16384 + 256 + 2048),
            // Reads prepared inputs from a buffer: no workgroup memory (no barrier).
            (&sg, "matvec_rows_sgb", 0),
        ];
        for (src, entry, want) in cases {
            assert_eq!(workgroup_bytes(src, entry), Ok(want), "{entry}");
        }
        assert!(workgroup_bytes(sample::SOURCE, "nope").is_err());
    }
}
