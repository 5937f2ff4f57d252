//! Row gather: [`CqKernels::gather`], one dispatch per arena part of a matrix,
//! and [`CqKernels::gather_many`], several matrices' gathers in one dispatch.

use super::{CqKernels, GatherMany, GatherParams, GATHER_ENTRIES};
use crate::engine::profile::bytes;
use crate::error::{Error, Result};
use crate::gpu::arena::CqPart;
use crate::gpu::arena::GpuCq;
use crate::gpu::{grid, Dispatch, GpuContext};

impl CqKernels {
    /// Gather row `idx[idx_at]` of `m` (dequantized, times `scale`) into `out` at
    /// `out_off`, `copies` times `copy_stride` apart: one dispatch per arena part of
    /// `m`, of which only the part holding the row writes.
    ///
    /// # Errors
    /// [`Error::Gpu`] if the group exceeds the staging array ([`CqKernels::staging`]).
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
        if m.group > self.staging {
            return Err(Error::Gpu(format!(
                "group {} exceeds the GPU limit of {}",
                m.group, self.staging
            )));
        }
        let bytes = bytes::gather_geometry(m.row_words() * 4, m.groups, m.bits, m.cols, copies);
        Ok(m.parts
            .iter()
            .map(|p| {
                let params = entry(m, p, idx.1, scale, out.1, copies, copy_stride);
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

    /// The gathers of `items` (`(matrix, idx_at, scale, output, out_off, copies,
    /// copy_stride)`, as [`CqKernels::gather`] takes them, output 0 or 1 of
    /// `outs`, all from one index buffer) in one dispatch, for one token slot;
    /// over slots ([`Dispatch::over_slots`]), slot `y` reads its indices
    /// `y · strides.0` words on and writes its outputs `y · strides.1[o]`
    /// elements on. `None` when they have more than
    /// [`GATHER_ENTRIES`] arena parts in all, more than two arenas, a group over
    /// the staging array ([`CqKernels::staging`]), or more workgroups than one grid row holds.
    #[allow(clippy::type_complexity)]
    pub fn gather_many(
        &self,
        ctx: &GpuContext,
        arenas: &[wgpu::Buffer],
        items: &[(&GpuCq, usize, f32, usize, usize, usize, usize)],
        idx: &wgpu::Buffer,
        outs: [&wgpu::Buffer; 2],
        strides: (usize, [usize; 2]),
    ) -> Option<Dispatch> {
        let mut gm: GatherMany = bytemuck::Zeroable::zeroed();
        gm.idx_stride = u32::try_from(strides.0).ok()?;
        gm.out_strides = [
            u32::try_from(strides.1[0]).ok()?,
            u32::try_from(strides.1[1]).ok()?,
        ];
        let mut used: Vec<usize> = Vec::new();
        let mut total = 0u32;
        let mut bytes_all = 0;
        for &(m, idx_at, scale, to, out_off, copies, stride) in items {
            if m.group > self.staging {
                return None;
            }
            bytes_all +=
                bytes::gather_geometry(m.row_words() * 4, m.groups, m.bits, m.cols, copies);
            for p in &m.parts {
                let i = gm.n as usize;
                if i == GATHER_ENTRIES {
                    return None;
                }
                let sel = match used.iter().position(|&a| a == p.arena) {
                    Some(s) => s,
                    None if used.len() < 2 => {
                        used.push(p.arena);
                        used.len() - 1
                    }
                    None => return None,
                };
                gm.e[i] = entry(m, p, idx_at, scale, out_off, copies, stride);
                gm.e[i]._pad = sel as u32 | (to.min(1) as u32) << 1;
                gm.start[i] = total;
                total += m.groups as u32;
                gm.n += 1;
            }
        }
        let first = *used.first()?;
        if total > ctx.caps.max_workgroups_per_dim {
            return None;
        }
        gm.start[gm.n as usize] = total;
        let ub = ctx.uniform_init("gather_many params", bytemuck::bytes_of(&gm));
        let b = &arenas[*used.get(1).unwrap_or(&first)];
        Some(
            Dispatch::new(
                ctx,
                &self.gather_many,
                &[&ub, &arenas[first], b, idx, outs[0], outs[1]],
                [total, 1, 1],
            )
            .with_bytes(bytes_all),
        )
    }
}

/// The gather params of part `p` of `m`.
fn entry(
    m: &GpuCq,
    p: &CqPart,
    idx_at: usize,
    scale: f32,
    out_off: usize,
    copies: usize,
    copy_stride: usize,
) -> GatherParams {
    GatherParams {
        packed_off: p.packed_off,
        norms_off: p.norms_off,
        cb_off: p.cb_off,
        row_words: m.row_words() as u32,
        group: m.group as u32,
        groups: m.groups as u32,
        cols: m.cols as u32,
        bits: m.bits,
        idx_at: idx_at as u32,
        out_off: out_off as u32,
        copies: copies as u32,
        copy_stride: copy_stride as u32,
        scale,
        row_first: p.first_row as u32,
        rows: p.rows as u32,
        _pad: 0,
    }
}
