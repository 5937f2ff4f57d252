//! The cq kernels' workgroup staging array (WGSL `XW` in shaders/cq.wgsl):
//! 4,096 columns where the adapter's workgroup memory holds every cq entry
//! point so built, else 2,048 (WebGPU's default 16,384 bytes). A matrix's
//! group must fit the array (the FWHT runs on one staged group).

use super::{subgroup_source, SOURCE};
use crate::gpu::GpuContext;

/// Columns of the staging array where the adapter's workgroup memory holds
/// them (every matvec then takes 16,640 to 20,736 bytes).
pub const STAGING_WIDE: usize = 4096;
/// Columns of the staging array on an adapter with less workgroup memory
/// (WebGPU's default of 16,384 bytes: every cq entry point then fits).
pub const STAGING_NARROW: usize = 2048;

/// Every entry point of the family that stages (an entry point missing from
/// a source counts as fitting in [`GpuContext::fits_workgroup_storage`]).
const STAGING_ENTRIES: [&str; 7] = [
    "matvec",
    "matvec_sg",
    "matvec_rows",
    "matvec_rows_sg",
    "prepare_inputs",
    "gather",
    "gather_many",
];

/// The family's source ([`SOURCE`], or [`subgroup_source`]) with a staging
/// array of `columns` columns ([`STAGING_WIDE`] as written).
pub fn with_staging(source: &str, columns: usize) -> String {
    source.replacen(
        "const XW: u32 = 4096u;",
        &format!("const XW: u32 = {columns}u;"),
        1,
    )
}

/// The staging array's columns the device's kernels use: [`STAGING_WIDE`] when
/// every cq entry point built on it fits the device's workgroup memory, else
/// [`STAGING_NARROW`]. Matrices' groups must be at most this wide.
pub fn staging_columns(ctx: &GpuContext) -> usize {
    let wide = if ctx.caps.subgroups {
        subgroup_source()
    } else {
        SOURCE.to_string()
    };
    if STAGING_ENTRIES
        .iter()
        .all(|e| ctx.fits_workgroup_storage(&wide, e))
    {
        STAGING_WIDE
    } else {
        STAGING_NARROW
    }
}
