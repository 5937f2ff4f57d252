//! GPU twins of the CQ kernels of [`crate::cq`]: multi-part `matvec` (which
//! prepares its own input, SPEC §2's `prepare` with the step's pre-ops) and row
//! `gather` (shaders/cq.wgsl).
//! CPU twins: [`crate::kernels::prepare::pre_op`] (its `PrepareMode`s, one to one with [`crate::kernels::prepare::PrepareMode`]) then `prepare` and the matvec, and [`crate::kernels::gather::gather`].

use crate::error::{Error, Result};
use crate::gpu::arena::{CqPart, GpuCq};
use crate::gpu::{grid, Dispatch, GpuContext, Kernel};
use bytemuck::{Pod, Zeroable};

/// The WGSL source of the family.
pub const SOURCE: &str = include_str!("../../../shaders/cq.wgsl");
/// The subgroup matvec variant, appended to [`SOURCE`]. (naga 30 takes subgroup
/// builtins without WGSL's `enable subgroups;` and rejects that directive; the
/// device's SUBGROUP feature is what gates them.)
pub const SUBGROUP_SOURCE: &str = include_str!("../../../shaders/cq_subgroup.wgsl");

/// `SOURCE` with the subgroup variant: what is compiled when subgroups are enabled.
pub fn subgroup_source() -> String {
    format!("{SOURCE}\n{SUBGROUP_SOURCE}")
}

/// Which matvec reduction a [`CqKernels`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// Shared-memory tree (any adapter).
    Portable,
    /// `subgroupShuffleXor` (adapters with SUBGROUP; `CQLM_NO_SUBGROUPS=1` turns it off).
    Subgroup,
    /// No reduction: one invocation per 4 rows (`matvec_rows`), for CPU adapters.
    RowPerInvocation,
    /// `RowPerInvocation` with each word's activations passed to the lanes by
    /// subgroup broadcasts (`matvec_rows_sg`; adapters with SUBGROUP).
    RowPerInvocationSubgroup,
}
/// Largest group the shared-memory FWHTs of `matvec` and `gather` handle.
pub const MAX_GROUP: usize = 4096;

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
    /// [`PrepareMode`] as u32, or [`PREPARED`].
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
    /// Inputs `matvec_rows_sgb` stages together.
    pub tb: u32,
    /// Elements between consecutive inputs.
    pub x_tstride: u32,
    /// Elements between consecutive inputs' outputs.
    pub y_tstride: u32,
    /// `[packed_off, norms_off, cb_off, row_first, rows, out_off, 0, 0]` per part.
    pub parts: [[u32; 8]; 4],
}

/// `MatvecParams::mode` of an input that is already `prepare(x)` (SPEC §2).
pub const PREPARED: u32 = 4;

/// Columns of the workgroup staging array (WGSL `XW`).
const XW: usize = 4096;
/// Most inputs `matvec_rows_sgb` stages together (the size of its accumulator arrays).
const MAX_TB: usize = 8;

/// The inputs of a batched matvec dispatch: `tokens` inputs, input `t` at the
/// [`MatvecInput`]'s offset plus `t · x_stride` elements, its outputs at each
/// item's output offset plus `t · y_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Number of inputs (at least 1).
    pub tokens: usize,
    /// Elements between consecutive inputs.
    pub x_stride: usize,
    /// Elements between consecutive outputs.
    pub y_stride: usize,
}

impl Batch {
    /// One input: a decode step's matvec.
    pub const ONE: Batch = Batch {
        tokens: 1,
        x_stride: 0,
        y_stride: 0,
    };
}

/// The input of a matvec dispatch.
#[derive(Debug, Clone, Copy)]
pub enum MatvecInput<'a> {
    /// `prepare(x)` already computed, at an element offset of the buffer.
    Prepared(&'a wgpu::Buffer, usize),
    /// The raw activation: each workgroup prepares it itself (no prepare dispatch).
    Raw {
        /// What happens before the transform.
        mode: PrepareMode,
        /// Logical length (the matrices' `cols`).
        n: usize,
        /// Buffer and element offset of the input (of lane 0 for
        /// [`PrepareMode::MeanLanesZcrms`]).
        src: (&'a wgpu::Buffer, usize),
        /// Distance between lanes ([`PrepareMode::MeanLanesZcrms`]).
        lane_stride: usize,
        /// Buffer and element offset of the gains ([`PrepareMode::Zcrms`] and
        /// [`PrepareMode::MeanLanesZcrms`]; any buffer otherwise).
        gains: (&'a wgpu::Buffer, usize),
    },
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

/// What a matvec computes from its raw input before SPEC §2's `prepare` transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareMode {
    /// The input as is.
    Copy = 0,
    /// `rms_unit(x)`.
    RmsUnit = 1,
    /// `zcrms(x, w)`.
    Zcrms = 2,
    /// `zcrms((l0 + l1 + l2 + l3) / 4, w)` over 4 lanes `lane_stride` apart.
    MeanLanesZcrms = 3,
}

/// The compiled pipelines of the family.
#[derive(Debug, Clone)]
pub struct CqKernels {
    /// The matvec reduction in use.
    pub reduction: Reduction,
    /// Matvec pipelines for bits 1, 2, 4, 8.
    matvec: [Kernel; 4],
    /// `matvec_rows_sgb` for bits 2 and 4 (with [`Reduction::RowPerInvocationSubgroup`]
    /// on subgroups of at least 8): batches share each decoded word.
    batched: Option<[Kernel; 2]>,
    gather: Kernel,
}

fn bits_slot(bits: u32) -> usize {
    match bits {
        1 => 0,
        2 => 1,
        4 => 2,
        _ => 3,
    }
}

impl CqKernels {
    /// Compile every entry point (one matvec pipeline per bit width), with the
    /// subgroup reduction when the device has subgroups enabled.
    pub fn new(ctx: &GpuContext) -> CqKernels {
        let r = if ctx.caps.row_matvec && ctx.caps.subgroups {
            Reduction::RowPerInvocationSubgroup
        } else if ctx.caps.row_matvec {
            Reduction::RowPerInvocation
        } else if ctx.caps.subgroups {
            Reduction::Subgroup
        } else {
            Reduction::Portable
        };
        Self::with_reduction(ctx, r)
    }

    /// Compile with an explicit matvec reduction (tests cover every one). Without
    /// subgroups enabled, `Subgroup` falls back to `Portable` and
    /// `RowPerInvocationSubgroup` to `RowPerInvocation`.
    pub fn with_reduction(ctx: &GpuContext, reduction: Reduction) -> CqKernels {
        let reduction = match reduction {
            Reduction::Subgroup if !ctx.caps.subgroups => Reduction::Portable,
            Reduction::RowPerInvocationSubgroup if !ctx.caps.subgroups => {
                Reduction::RowPerInvocation
            }
            r => r,
        };
        let sg_source = subgroup_source();
        let (src, entry) = match reduction {
            Reduction::Portable => (SOURCE, "matvec"),
            Reduction::Subgroup => (sg_source.as_str(), "matvec_sg"),
            Reduction::RowPerInvocation => (SOURCE, "matvec_rows"),
            Reduction::RowPerInvocationSubgroup => (sg_source.as_str(), "matvec_rows_sg"),
        };
        let mv = |bits: u32, name| Kernel::new(ctx, src, name, entry, 4, &[("BITS", bits as f64)]);
        let batched = (reduction == Reduction::RowPerInvocationSubgroup
            && ctx.caps.subgroup_min >= 8)
            .then(|| {
                let k = |bits: u32, name| {
                    Kernel::new(
                        ctx,
                        &sg_source,
                        name,
                        "matvec_rows_sgb",
                        4,
                        &[("BITS", bits as f64)],
                    )
                };
                [k(2, "matvec2_batch"), k(4, "matvec4_batch")]
            });
        CqKernels {
            reduction,
            batched,
            matvec: [
                mv(1, "matvec1"),
                mv(2, "matvec2"),
                mv(4, "matvec4"),
                mv(8, "matvec8"),
            ],
            gather: Kernel::new(ctx, SOURCE, "gather", "gather", 12, &[]),
        }
    }

    /// Matvec dispatches for `items` = (matrix, first row, rows, output offset), all
    /// reading the same prepared input `x` (at `x_off`) and writing `out`. Row parts
    /// that share an arena, bits and group are fused four at a time.
    pub fn matvec(
        &self,
        ctx: &GpuContext,
        arenas: &[wgpu::Buffer],
        items: &[(&GpuCq, usize, usize, usize)],
        x: (&wgpu::Buffer, usize),
        out: &wgpu::Buffer,
    ) -> Vec<Dispatch> {
        self.matvec_from(ctx, arenas, items, MatvecInput::Prepared(x.0, x.1), out)
    }

    /// [`CqKernels::matvec`] from any [`MatvecInput`]: with a raw input every
    /// workgroup prepares it itself, so no prepare dispatch runs before.
    pub fn matvec_from(
        &self,
        ctx: &GpuContext,
        arenas: &[wgpu::Buffer],
        items: &[(&GpuCq, usize, usize, usize)],
        input: MatvecInput<'_>,
        out: &wgpu::Buffer,
    ) -> Vec<Dispatch> {
        self.matvec_batch(ctx, arenas, items, input, out, Batch::ONE)
    }

    /// [`CqKernels::matvec_from`] for `batch.tokens` inputs in one dispatch per
    /// fused geometry. Every output equals what the single-input dispatch computes
    /// for its input, bit for bit (the kernels run the same operations in the
    /// same order per input); on CPU adapters with subgroups, 2- and 4-bit
    /// matrices decode each packed word once for up to 8 inputs.
    pub fn matvec_batch(
        &self,
        ctx: &GpuContext,
        arenas: &[wgpu::Buffer],
        items: &[(&GpuCq, usize, usize, usize)],
        input: MatvecInput<'_>,
        out: &wgpu::Buffer,
        batch: Batch,
    ) -> Vec<Dispatch> {
        let tokens = batch.tokens.max(1);
        // Without gains, binding 8 gets the arena (read-only, like binding 5): any
        // buffer but the input, which is bound read_write.
        let (x_buf, gains_buf, mode, x_off, n, lane_stride, w_off, raw_reads) = match input {
            MatvecInput::Prepared(b, off) => (b, None, PREPARED, off, 0, 0, 0, 0u64),
            MatvecInput::Raw {
                mode,
                n,
                src,
                lane_stride,
                gains,
            } => {
                let lanes = if mode == PrepareMode::MeanLanesZcrms {
                    4
                } else {
                    1
                };
                let g = matches!(mode, PrepareMode::Zcrms | PrepareMode::MeanLanesZcrms);
                let reads = (n * (lanes + g as usize)) as u64 * 4;
                let gains_buf = g.then_some(gains.0);
                (
                    src.0,
                    gains_buf,
                    mode as u32,
                    src.1,
                    n,
                    lane_stride,
                    gains.1,
                    reads,
                )
            }
        };
        // Flatten to parts with their output offsets.
        let mut flat: Vec<(&GpuCq, CqPart, usize, usize, usize)> = Vec::new();
        for &(m, first, count, out_off) in items {
            for (part, lo, n) in m.parts_for(first, count) {
                flat.push((m, part, lo - part.first_row, n, out_off + (lo - first)));
            }
        }
        // Parts of one geometry (arena, bits, group, groups) are fused, four at a
        // time, whatever their order in `items`; a stable sort keeps the first
        // appearance order of geometries.
        let key = |m: &GpuCq, p: &CqPart| (p.arena, m.bits, m.group, m.groups);
        let mut order: Vec<(usize, u32, usize, usize)> = Vec::new();
        for (m, p, ..) in &flat {
            let k = key(m, p);
            if !order.contains(&k) {
                order.push(k);
            }
        }
        flat.sort_by_key(|(m, p, ..)| order.iter().position(|k| *k == key(m, p)));
        let mut out_d = Vec::new();
        let mut i = 0;
        while i < flat.len() {
            let (m0, p0, ..) = flat[i];
            let mut j = i + 1;
            while j < flat.len() && j - i < 4 && key(flat[j].0, &flat[j].1) == key(m0, &p0) {
                j += 1;
            }
            let mut params = MatvecParams {
                n_parts: (j - i) as u32,
                group_words: m0.group_words() as u32,
                row_words: m0.row_words() as u32,
                total_rows: 0,
                x_off: x_off as u32,
                grid_x: 0,
                mode,
                n: n as u32,
                w_off: w_off as u32,
                lane_stride: lane_stride as u32,
                group: m0.group as u32,
                team_rows: 1,
                tokens: tokens as u32,
                tb: 1,
                x_tstride: batch.x_stride as u32,
                y_tstride: batch.y_stride as u32,
                parts: [[0; 8]; 4],
            };
            for (k, &(_, p, row_in_part, n, out_off)) in flat[i..j].iter().enumerate() {
                params.parts[k] = [
                    p.packed_off,
                    p.norms_off,
                    p.cb_off,
                    row_in_part as u32,
                    n as u32,
                    out_off as u32,
                    0,
                    0,
                ];
                params.total_rows += n as u32;
            }
            // The 16-lane kernel: 4 teams, each `team_rows` rows in turn, chosen
            // so tall matrices use about 128 workgroups (each preparing the input
            // once for all its rows) and short ones stay spread out.
            params.team_rows = params.total_rows.div_ceil(4 * 128).clamp(1, 16);
            let rows_per_wg = match self.reduction {
                // 4 rows per invocation, 64 invocations (cq.wgsl ROWS_PER_INV).
                Reduction::RowPerInvocation | Reduction::RowPerInvocationSubgroup => 256,
                _ => 4 * params.team_rows,
            };
            let g = grid(
                params.total_rows.div_ceil(rows_per_wg),
                ctx.caps.max_workgroups_per_dim,
            );
            params.grid_x = g[0];
            // The batched kernel where it applies: its four-word path, at least two
            // inputs staged together.
            let padded = m0.padded();
            let kernel = match &self.batched {
                Some([k2, k4])
                    if tokens > 1
                        && (m0.bits == 2 || m0.bits == 4)
                        && m0.group_words() % 4 == 0
                        && 2 * padded <= XW =>
                {
                    params.tb = tokens.min(XW / padded).min(MAX_TB) as u32;
                    if m0.bits == 2 {
                        k2
                    } else {
                        k4
                    }
                }
                _ => &self.matvec[bits_slot(m0.bits)],
            };
            let ub = ctx.uniform_init("matvec params", bytemuck::bytes_of(&params));
            // Packed rows, their f16 norms, the codebooks, the inputs and the outputs.
            let rows = params.total_rows as u64;
            let bytes = rows * (m0.row_words() as u64 * 4 + m0.groups as u64 * 2)
                + (j - i) as u64 * (4u64 << m0.bits)
                + tokens as u64
                    * (rows * 4
                        + if mode == PREPARED {
                            padded as u64 * 4
                        } else {
                            raw_reads
                        });
            let arena = &arenas[p0.arena];
            let mut bufs = vec![&ub, arena, x_buf, out, gains_buf.unwrap_or(arena)];
            if self.reduction == Reduction::RowPerInvocationSubgroup {
                // Binding 9: the arena again, read as vec4<u32>.
                bufs.push(arena);
            }
            out_d.push(Dispatch::new(ctx, kernel, &bufs, g).with_bytes(bytes));
            i = j;
        }
        out_d
    }

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
                let bytes =
                    (m.row_words() * 4 + m.groups * 2 + (4 << m.bits) + m.cols * copies * 4) as u64;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::shader_check::{validate_wgsl, wgsl_struct_size};

    #[test]
    fn shader_validates_and_params_match_wgsl() {
        validate_wgsl(&subgroup_source()).expect("cq.wgsl + cq_subgroup.wgsl validate");
        let m = validate_wgsl(SOURCE).expect("cq.wgsl validates");
        for (name, size) in [
            ("MatvecParams", std::mem::size_of::<MatvecParams>()),
            ("GatherParams", std::mem::size_of::<GatherParams>()),
        ] {
            assert_eq!(wgsl_struct_size(&m, name), Some(size as u32), "{name}");
        }
    }
}
