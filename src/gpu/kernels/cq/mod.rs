//! GPU twins of the CQ kernels of [`crate::cq`]: multi-part `matvec` (which
//! prepares its own input, SPEC §2's `prepare` with the step's pre-ops, or reads
//! inputs that `prepare_inputs` prepared once for several token slots) and row `gather`
//! (shaders/cq.wgsl). This file compiles the pipelines and picks the
//! matvec variant ([`Reduction`]); [`plan`] decides a matvec's dispatches,
//! [`params`] mirrors the shader's params, `gather.rs` builds the gathers.
//! CPU twins: [`crate::kernels::prepare::pre_op`] (for the same [`PrepareMode`]s)
//! then `prepare` and the matvec, and [`crate::kernels::gather::gather`].

mod gather;
pub mod params;
pub mod plan;
mod staging;

use crate::engine::profile::bytes;
use crate::gpu::{Dispatch, GpuContext, Kernel};
pub use params::{GatherMany, GatherParams, MatvecParams, GATHER_ENTRIES, PREPARED};
pub use plan::{plan_matvec, Launch, MatvecItem, PlanCaps};
pub use staging::{staging_columns, with_staging, STAGING_NARROW, STAGING_WIDE};

/// The WGSL source of the family: `shaders/butterfly.wgsl` (the FWHT's register
/// butterflies), then `shaders/cq.wgsl`.
pub const SOURCE: &str = concat!(
    include_str!("../../../../shaders/butterfly.wgsl"),
    include_str!("../../../../shaders/cq.wgsl")
);
/// The subgroup matvec variant, appended to [`SOURCE`]. (naga 30 takes subgroup
/// builtins without WGSL's `enable subgroups;` and rejects that directive; the
/// device's SUBGROUP feature is what gates them.)
pub const SUBGROUP_SOURCE: &str = include_str!("../../../../shaders/cq_subgroup.wgsl");

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

impl Reduction {
    /// Every variant (tests run each; on a device without subgroups the
    /// subgroup ones fall back, see [`CqKernels::with_reduction`]).
    pub const ALL: [Reduction; 4] = [
        Reduction::Portable,
        Reduction::Subgroup,
        Reduction::RowPerInvocation,
        Reduction::RowPerInvocationSubgroup,
    ];
}

/// Most inputs `matvec_rows_sgb` takes together (the size of its accumulator arrays).
const MAX_TB: usize = 8;

/// The token slots a matvec dispatch reads and writes: `tokens` inputs, input
/// `t` at the [`MatvecInput`]'s offset plus `t · x_stride` elements, its outputs
/// at each item's output offset plus `t · y_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotStrides {
    /// Number of inputs (at least 1).
    pub tokens: usize,
    /// Elements between consecutive inputs.
    pub x_stride: usize,
    /// Elements between consecutive outputs.
    pub y_stride: usize,
}

impl SlotStrides {
    /// One input: a decode step's matvec.
    pub const fn single() -> SlotStrides {
        SlotStrides {
            tokens: 1,
            x_stride: 0,
            y_stride: 0,
        }
    }
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

/// What a matvec computes from its raw input before SPEC §2's `prepare`
/// transform: the CPU twin's enum, whose discriminants are `MatvecParams::mode`.
pub use crate::kernels::prepare::PrepareMode;

/// The compiled pipelines of the family.
#[derive(Debug, Clone)]
pub struct CqKernels {
    /// The matvec reduction in use.
    pub reduction: Reduction,
    /// Matvec pipelines for bits 1, 2, 4, 8.
    matvec: [Kernel; 4],
    /// `matvec_rows_sgb` for bits 2 and 4 (with [`Reduction::RowPerInvocationSubgroup`]
    /// on subgroups of at least 8): several inputs share each decoded word.
    batched: Option<[Kernel; 2]>,
    gather: Kernel,
    gather_many: Kernel,
    /// `prepare_inputs`: the raw inputs of several token slots prepared once
    /// ([`CqKernels::prepare`]).
    prepare: Kernel,
    /// Columns of the staging array compiled ([`staging_columns`]).
    staging: usize,
    /// A small read-only storage buffer bound where `prepare_inputs` reads
    /// nothing (its input or gains in the destination's buffer, or no gains).
    placeholder: wgpu::Buffer,
}

/// Scratch space for prepared matvec inputs: where
/// [`CqKernels::matvec_prepared_once`] may write them, as a buffer, the element
/// offset of input 0's and the elements between inputs.
#[derive(Debug, Clone, Copy)]
pub struct PrepScratch<'a> {
    /// The buffer.
    pub buffer: &'a wgpu::Buffer,
    /// Element offset of input 0's prepared columns.
    pub offset: usize,
    /// Elements between consecutive inputs' prepared columns.
    pub stride: usize,
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
    /// Columns of the staging array these kernels were compiled with
    /// ([`staging_columns`]): the widest group they handle.
    pub fn staging(&self) -> usize {
        self.staging
    }

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
        let staging = staging_columns(ctx);
        let base = with_staging(SOURCE, staging);
        let sg_source = with_staging(&subgroup_source(), staging);
        let (src, entry) = match reduction {
            Reduction::Portable => (base.as_str(), "matvec"),
            Reduction::Subgroup => (sg_source.as_str(), "matvec_sg"),
            Reduction::RowPerInvocation => (base.as_str(), "matvec_rows"),
            Reduction::RowPerInvocationSubgroup => (sg_source.as_str(), "matvec_rows_sg"),
        };
        let wide = [("WG", f64::from(ctx.caps.wide_workgroup))];
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
            gather: Kernel::new(ctx, &base, "gather", "gather", 12, &wide),
            prepare: Kernel::new(ctx, &base, "prepare_inputs", "prepare_inputs", 4, &[]),
            placeholder: ctx.storage_init("cq placeholder", &[0u8; 16]),
            gather_many: Kernel::new(ctx, &base, "gather_many", "gather_many", 16, &wide),
            staging,
        }
    }

    /// The dispatches of one matvec: for each of `strides.tokens` inputs (one for a
    /// decode step, [`SlotStrides::single`]), rows `first .. first + rows` of each item's
    /// matrix times the input, written to `out` at the item's output offset (plus
    /// `t · strides.y_stride` for input `t`). Row parts that share an arena, bits
    /// and group are fused four at a time ([`plan_matvec`]). With a
    /// [`MatvecInput::Raw`] input every workgroup prepares it itself, so no prepare
    /// dispatch runs before. Every output equals what the single-input dispatch
    /// computes for its input, bit for bit (the kernels run the same operations in
    /// the same order per input); on CPU adapters with subgroups, 2- and 4-bit
    /// matrices decode each packed word once for up to 8 inputs when these are
    /// prepared already, in a buffer other than `out`, at an offset and a stride
    /// that are multiples of 4 ([`CqKernels::matvec_prepared_once`] arranges that).
    pub fn matvec(
        &self,
        ctx: &GpuContext,
        arenas: &[wgpu::Buffer],
        items: &[MatvecItem<'_>],
        input: MatvecInput<'_>,
        out: &wgpu::Buffer,
        strides: SlotStrides,
    ) -> Vec<Dispatch> {
        let tokens = strides.tokens.max(1);
        let (x_buf, gains_buf, mode, x_off, n, lane_stride, w_off, raw) = match input {
            MatvecInput::Prepared(b, off) => (b, None, PREPARED, off, 0, 0, 0, None),
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
                let gains_buf = g.then_some(gains.0);
                let raw = Some(bytes::prepare(n, lanes, g, 0));
                (
                    src.0,
                    gains_buf,
                    mode as u32,
                    src.1,
                    n,
                    lane_stride,
                    gains.1,
                    raw,
                )
            }
        };
        // Only the output binding (7) is writable, and no buffer bound writable may
        // be bound again (WebGPU rejects overlapping bindings where one is
        // writable): an input or gains in the output buffer are read through the
        // output binding, and bindings 6 and 8 then get the arena (read-only, as at
        // bindings 5 and 9). The same buffer is detected here, not asked of callers.
        let x_in_out = x_buf == out;
        let gains_in_out = gains_buf == Some(out);
        let in_out = x_in_out as u32 | (gains_in_out as u32) << 1;
        let vec4_input = raw.is_none()
            && !x_in_out
            && x_off.is_multiple_of(4)
            && (tokens == 1 || strides.x_stride.is_multiple_of(4));
        let caps = PlanCaps::of(&ctx.caps);
        let launches = plan_matvec(items, strides, self.reduction, caps, vec4_input);
        launches
            .into_iter()
            .map(|l| {
                let mut params = l.params;
                params.x_off = x_off as u32;
                params.mode = mode;
                params.n = n as u32;
                params.w_off = w_off as u32;
                params.lane_stride = lane_stride as u32;
                params.in_out = in_out;
                let kernel = match (&self.batched, l.batched) {
                    (Some([k2, _]), true) if l.bits == 2 => k2,
                    (Some([_, k4]), true) => k4,
                    _ => &self.matvec[bits_slot(l.bits)],
                };
                let ub = ctx.uniform_init("matvec params", bytemuck::bytes_of(&params));
                // Packed rows, their f16 norms, the codebooks, the inputs and the outputs.
                let input = raw.unwrap_or(l.padded as u64 * 4);
                let row_bytes = params.row_words as usize * 4;
                let bytes = bytes::matvec_dispatch(
                    params.total_rows as usize,
                    row_bytes,
                    l.row_groups,
                    l.bits,
                    params.n_parts as usize,
                    tokens,
                    input,
                );
                let arena = &arenas[l.arena];
                let x = if x_in_out { arena } else { x_buf };
                let gains = gains_buf.filter(|_| !gains_in_out).unwrap_or(arena);
                // (binding - 4, buffer, writable).
                let bufs = if l.batched {
                    // matvec_rows_sgb: the arena as u32 and vec4<u32>, the output,
                    // and the prepared inputs as vec4s (binding 10).
                    vec![
                        (0, &ub, false),
                        (1, arena, false),
                        (3, out, true),
                        (5, arena, false),
                        (6, x_buf, false),
                    ]
                } else {
                    let mut bufs = vec![
                        (0, &ub, false),
                        (1, arena, false),
                        (2, x, false),
                        (3, out, true),
                        (4, gains, false),
                    ];
                    if self.reduction == Reduction::RowPerInvocationSubgroup {
                        // Binding 9: the arena again, read as vec4<u32>.
                        bufs.push((5, arena, false));
                    }
                    bufs
                };
                // Checked as the dispatch is built, so a step pays nothing; a caller
                // passing an arena as the output gets a device error, not a panic.
                if let Some((a, b)) = writable_alias(&bufs) {
                    ctx.record_error(format!(
                        "matvec `{}` binds one buffer at bindings {} and {}, one of them writable",
                        kernel.name,
                        a + 4,
                        b + 4
                    ));
                }
                let at: Vec<(u32, &wgpu::Buffer)> = bufs.iter().map(|&(i, b, _)| (i, b)).collect();
                Dispatch::new_at(ctx, kernel, &at, l.groups).with_bytes(bytes)
            })
            .collect()
    }
}

impl CqKernels {
    /// How many workgroups of a matvec of `items` over `strides` stage each input
    /// (every workgroup of rows prepares the inputs it reads raw itself), summed
    /// over its dispatches. Above one, a [`CqKernels::prepare`] dispatch first
    /// does that work once ([`CqKernels::matvec_prepared_once`]).
    pub fn stagings(
        &self,
        ctx: &GpuContext,
        items: &[MatvecItem<'_>],
        strides: SlotStrides,
    ) -> usize {
        plan_matvec(
            items,
            strides,
            self.reduction,
            PlanCaps::of(&ctx.caps),
            false,
        )
        .iter()
        .map(|l| l.groups[0] as usize * l.groups[1] as usize)
        .sum()
    }

    /// The dispatch that prepares `strides.tokens` raw inputs once: SPEC §2's
    /// `prepare` with the input's pre-op, computed as every matvec workgroup
    /// stages a raw input (the same operations in the same order, so a matvec
    /// reading the result as [`MatvecInput::Prepared`] gives the same outputs,
    /// bit for bit). Input `t` is read at the input's offset plus `t ·
    /// strides.x_stride`; its `padded` columns (groups of `group`) are written to
    /// `dst` from `dst.offset + t · dst.stride` on. `None` for an input already
    /// prepared. The destination must not overlap the input or the gains.
    pub fn prepare(
        &self,
        ctx: &GpuContext,
        input: MatvecInput<'_>,
        group: usize,
        padded: usize,
        dst: PrepScratch<'_>,
        strides: SlotStrides,
    ) -> Option<Dispatch> {
        let MatvecInput::Raw {
            mode,
            n,
            src,
            lane_stride,
            gains,
        } = input
        else {
            return None;
        };
        let tokens = strides.tokens.max(1);
        let lanes = if mode == PrepareMode::MeanLanesZcrms {
            4
        } else {
            1
        };
        let g = matches!(mode, PrepareMode::Zcrms | PrepareMode::MeanLanesZcrms);
        let x_in_out = src.0 == dst.buffer;
        let gains_in_out = g && gains.0 == dst.buffer;
        // Several inputs a workgroup where they fit the staging array together
        // (one transform's barriers for all: lavapipe runs each barrier as a
        // switch of every subgroup's coroutine), as long as the device's
        // workgroups at once stay busy; inputs over the array one at a time.
        let parallel = PlanCaps::of(&ctx.caps).parallel as usize;
        let tb = tokens
            .div_ceil(parallel)
            .min(MAX_TB)
            .min(self.staging / padded.max(1))
            .max(1);
        let params = MatvecParams {
            n_parts: 0,
            group_words: 0,
            row_words: 0,
            total_rows: 0,
            x_off: src.1 as u32,
            grid_x: 0,
            mode: mode as u32,
            n: n as u32,
            w_off: gains.1 as u32,
            lane_stride: lane_stride as u32,
            group: group as u32,
            team_rows: 0,
            tokens: tokens as u32,
            tb: tb as u32,
            x_tstride: strides.x_stride as u32,
            y_tstride: dst.stride as u32,
            in_out: x_in_out as u32 | (gains_in_out as u32) << 1,
            prep_len: padded as u32,
            prep_out: dst.offset as u32,
            _pad: 0,
            parts: [[0; 8]; 4],
        };
        let groups = tokens.div_ceil(tb) as u32;
        let ub = ctx.uniform_init("prepare params", bytemuck::bytes_of(&params));
        // An input or gains in the destination's buffer are read through the
        // output binding (as in `matvec`); their read-only bindings then get a
        // placeholder.
        let x = if x_in_out { &self.placeholder } else { src.0 };
        let gains = if g && !gains_in_out {
            gains.0
        } else {
            &self.placeholder
        };
        let at = [(0, &ub), (2, x), (3, dst.buffer), (4, gains)];
        let bytes = tokens as u64 * bytes::prepare(n, lanes, g, padded);
        Some(Dispatch::new_at(ctx, &self.prepare, &at, [groups, 1, 1]).with_bytes(bytes))
    }

    /// [`CqKernels::matvec`], with the raw inputs of several token slots (two or more; a
    /// decode step's one input stays staged by each workgroup, which keeps its
    /// dispatch count) first prepared once into `scratch`
    /// ([`CqKernels::prepare`]) when the items share one group width and padded
    /// length and either more than one workgroup would stage each
    /// input ([`CqKernels::stagings`]) or the batched kernel takes the prepared
    /// inputs (on CPU adapters with subgroups); else the matvec's own dispatches
    /// alone. The outputs are the same bit for bit either way. `scratch` must
    /// hold `strides.tokens` inputs of the padded length and overlap neither the
    /// input, the gains nor the outputs; the batched kernel needs it in another
    /// buffer than `out`, at an offset and a stride that are multiples of 4.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_prepared_once(
        &self,
        ctx: &GpuContext,
        arenas: &[wgpu::Buffer],
        items: &[MatvecItem<'_>],
        input: MatvecInput<'_>,
        out: &wgpu::Buffer,
        strides: SlotStrides,
        scratch: PrepScratch<'_>,
    ) -> Vec<Dispatch> {
        let geometry = |m: &MatvecItem<'_>| (m.0.group, m.0.padded());
        let shared = items
            .first()
            .map(geometry)
            .filter(|g| items.iter().all(|m| geometry(m) == *g));
        let prepared_strides = SlotStrides {
            x_stride: scratch.stride,
            ..strides
        };
        let vec4 = scratch.buffer != out
            && scratch.offset.is_multiple_of(4)
            && scratch.stride.is_multiple_of(4);
        let caps = PlanCaps::of(&ctx.caps);
        let batched = || {
            plan_matvec(items, prepared_strides, self.reduction, caps, vec4)
                .iter()
                .any(|l| l.batched)
        };
        let prep = shared
            .filter(|_| strides.tokens > 1)
            .filter(|_| self.stagings(ctx, items, strides) > 1 || batched())
            .and_then(|(group, padded)| self.prepare(ctx, input, group, padded, scratch, strides));
        let Some(prep) = prep else {
            return self.matvec(ctx, arenas, items, input, out, strides);
        };
        let prepared = MatvecInput::Prepared(scratch.buffer, scratch.offset);
        let mut ds = vec![prep];
        ds.extend(self.matvec(ctx, arenas, items, prepared, out, prepared_strides));
        ds
    }
}

/// The first pair of bindings (`(binding, buffer, writable)` entries) that name
/// one buffer with at least one of them writable, which WebGPU forbids; `None`
/// if there is none.
pub fn writable_alias<B: PartialEq>(entries: &[(u32, B, bool)]) -> Option<(u32, u32)> {
    entries.iter().enumerate().find_map(|(i, (a, ba, wa))| {
        entries[i + 1..]
            .iter()
            .find(|(_, bb, wb)| (*wa || *wb) && ba == bb)
            .map(|(b, ..)| (*a, *b))
    })
}

#[cfg(test)]
mod tests {
    use super::writable_alias;

    #[test]
    fn writable_alias_finds_a_writable_buffer_bound_twice() {
        // Read-only buffers may repeat (the arena at 5 and 9); a writable one may not.
        assert_eq!(
            writable_alias(&[(0, 'u', false), (1, 'a', false), (5, 'a', false)]),
            None
        );
        assert_eq!(
            writable_alias(&[(1, 'a', false), (3, 'o', true), (4, 'g', false)]),
            None
        );
        assert_eq!(
            writable_alias(&[(2, 'o', false), (3, 'o', true)]),
            Some((2, 3))
        );
        assert_eq!(
            writable_alias(&[(3, 'o', true), (1, 'a', false), (4, 'o', false)]),
            Some((3, 4))
        );
        assert_eq!(
            writable_alias(&[(0, 'x', true), (1, 'x', true)]),
            Some((0, 1))
        );
    }
}
