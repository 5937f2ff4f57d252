//! Row gather: [`CqKernels::gather`], one dispatch per arena part of a matrix.

use super::{CqKernels, GatherParams, MAX_GROUP};
use crate::error::{Error, Result};
use crate::gpu::arena::GpuCq;
use crate::gpu::{grid, Dispatch, GpuContext};
use crate::profile::bytes;

impl CqKernels {
    /// Gather row `idx[idx_at]` of `m` (dequantized, times `scale`) into `out` at
    /// `out_off`, `copies` times `copy_stride` apart: one dispatch per arena part of
    /// `m`, of which only the part holding the row writes.
    ///
    /// # Errors
    /// [`Error::Gpu`] if the group exceeds [`MAX_GROUP`].
    #[allow(clippy::too_many_arguments)]
    pub fn gather(
        &self,
        ctx: &GpuContext,
        arenas: &[wgpu::Buffer],
        m: &GpuCq,
        idx: (&wgpu::Buffer, usize),
        scale: f32,
        out: (&wgpu::Buffer, usize),
        copies: usize,
        copy_stride: usize,
    ) -> Result<Vec<Dispatch>> {
        if m.group > MAX_GROUP {
            return Err(Error::Gpu(format!(
                "group {} exceeds the GPU limit of {MAX_GROUP}",
                m.group
            )));
        }
        let bytes = bytes::gather_geometry(m.row_words() * 4, m.groups, m.bits, m.cols, copies);
        Ok(m.parts
            .iter()
            .map(|p| {
                let params = GatherParams {
                    packed_off: p.packed_off,
                    norms_off: p.norms_off,
                    cb_off: p.cb_off,
                    row_words: m.row_words() as u32,
                    group: m.group as u32,
                    groups: m.groups as u32,
                    cols: m.cols as u32,
                    bits: m.bits,
                    idx_at: idx.1 as u32,
                    out_off: out.1 as u32,
                    copies: copies as u32,
                    copy_stride: copy_stride as u32,
                    scale,
                    row_first: p.first_row as u32,
                    rows: p.rows as u32,
                    _pad: 0,
                };
                let ub = ctx.uniform_init("gather params", bytemuck::bytes_of(&params));
                Dispatch::new(
                    ctx,
                    &self.gather,
                    &[&ub, &arenas[p.arena], idx.0, out.0],
                    grid(m.groups as u32, ctx.caps.max_workgroups_per_dim),
                )
                .with_bytes(bytes)
            })
            .collect())
    }
}
