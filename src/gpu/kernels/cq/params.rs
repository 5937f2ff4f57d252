//! `#[repr(C)]` mirrors of the WGSL params structs of shaders/cq.wgsl (their
//! sizes are checked against the shader's in this file's test).

use bytemuck::{Pod, Zeroable};

/// `MatvecParams::mode` of an input that is already `prepare(x)` (SPEC §2).
pub const PREPARED: u32 = 4;

/// Mirror of WGSL `MatvecParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct MatvecParams {
    /// Parts in this dispatch (1..=4).
    pub n_parts: u32,
    /// Words per (row, group).
    pub group_words: u32,
    /// Words per row.
    pub row_words: u32,
    /// Rows of all parts.
    pub total_rows: u32,
    /// First input element (prepared for mode 4, raw otherwise).
    pub x_off: u32,
    /// Workgroups per grid row.
    pub grid_x: u32,
    /// [`super::PrepareMode`] as u32, or [`PREPARED`].
    pub mode: u32,
    /// Logical input length (modes 0..3).
    pub n: u32,
    /// First gain element (modes 2, 3).
    pub w_off: u32,
    /// Lane stride (mode 3).
    pub lane_stride: u32,
    /// Group width.
    pub group: u32,
    /// Rows each 16-lane team of the `matvec` entry computes in turn.
    pub team_rows: u32,
    /// Inputs in the dispatch (1 for a decode step).
    pub tokens: u32,
    /// Inputs `matvec_rows_sgb` takes together (a block); inputs a
    /// `prepare_inputs` workgroup stages together.
    pub tb: u32,
    /// Elements between consecutive inputs.
    pub x_tstride: u32,
    /// Elements between consecutive inputs' outputs.
    pub y_tstride: u32,
    /// Bit 0: the input is in the output buffer (read through the output
    /// binding); bit 1: the gains are. See [`super::CqKernels::matvec`].
    pub in_out: u32,
    /// `prepare_inputs`: columns prepared per input (`groups · group`).
    pub prep_len: u32,
    /// `prepare_inputs`: first output element of input 0 (input `t` at
    /// `prep_out + t · y_tstride`).
    pub prep_out: u32,
    /// Padding (`parts` is 16-byte aligned).
    pub _pad: u32,
    /// `[packed_off, norms_off, cb_off, row_first, rows, out_off, 0, 0]` per part.
    pub parts: [[u32; 8]; 4],
}

/// Mirror of WGSL `GatherParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct GatherParams {
    /// Word offset of packed row 0.
    pub packed_off: u32,
    /// f16 offset of norm (0, 0).
    pub norms_off: u32,
    /// Word offset of the codebook.
    pub cb_off: u32,
    /// Words per row.
    pub row_words: u32,
    /// Group width.
    pub group: u32,
    /// Groups per row.
    pub groups: u32,
    /// Logical columns.
    pub cols: u32,
    /// Bits per index.
    pub bits: u32,
    /// The row index is `idx[idx_at]`.
    pub idx_at: u32,
    /// First output element.
    pub out_off: u32,
    /// Copies written.
    pub copies: u32,
    /// Distance between copies.
    pub copy_stride: u32,
    /// Factor applied after the transform.
    pub scale: f32,
    /// First matrix row held by this dispatch's part.
    pub row_first: u32,
    /// Rows held by the part.
    pub rows: u32,
    /// Padding.
    pub _pad: u32,
}

/// Entries of one [`GatherMany`] dispatch at most.
pub const GATHER_ENTRIES: usize = 8;

/// Mirror of WGSL `GatherMany`: several gathers in one dispatch (a step's
/// head), for every token slot of a pass (workgroup y). Entry `i` runs
/// workgroups `start[i] .. start[i + 1]`; its `_pad` names its arena binding
/// (bit 0) and its output (bit 1).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct GatherMany {
    /// Entries used.
    pub n: u32,
    /// Index words from one token slot (workgroup y) to the next.
    pub idx_stride: u32,
    /// Output elements from one slot to the next, in output 0 and output 1.
    pub out_strides: [u32; 2],
    /// First workgroup of each entry, then the total (`GATHER_ENTRIES + 1` used of 12).
    pub start: [u32; 12],
    /// The gathers.
    pub e: [GatherParams; GATHER_ENTRIES],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::kernels::cq::{subgroup_source, SOURCE};
    use crate::gpu::shader_check::{validate_wgsl, wgsl_struct_size};

    #[test]
    fn shader_validates_and_params_match_wgsl() {
        validate_wgsl(&subgroup_source()).expect("cq.wgsl + cq_subgroup.wgsl validate");
        let m = validate_wgsl(SOURCE).expect("cq.wgsl validates");
        for (name, size) in [
            ("MatvecParams", std::mem::size_of::<MatvecParams>()),
            ("GatherParams", std::mem::size_of::<GatherParams>()),
            ("GatherMany", std::mem::size_of::<GatherMany>()),
        ] {
            assert_eq!(wgsl_struct_size(&m, name), Some(size as u32), "{name}");
        }
    }
}
