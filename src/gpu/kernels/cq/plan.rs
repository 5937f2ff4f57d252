//! The matvec planner: which dispatches a multi-part matvec takes, as plain data
//! (no device, no buffers), so its row coverage, grid and fusing are testable
//! without a GPU. [`super::CqKernels::matvec`] turns each [`Launch`] into a dispatch.

use super::params::MatvecParams;
use super::{Reduction, SlotStrides, MAX_TB};
use crate::gpu::arena::{CqPart, GpuCq};
use crate::gpu::{grid, Capabilities};

/// Rows `first .. first + rows` of a matrix, written to the output from element
/// `out_off` on: `(matrix, first, rows, out_off)`.
pub type MatvecItem<'a> = (&'a GpuCq, usize, usize, usize);

/// What the planner needs of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanCaps {
    /// Largest workgroup count in one grid dimension.
    pub max_workgroups_per_dim: u32,
    /// Smallest subgroup size the device may use (the batched kernel needs 8).
    pub subgroup_min: u32,
    /// Workgroups the device runs at once where the batched kernel runs (a
    /// CPU adapter: the host's threads). A batched dispatch with fewer
    /// workgroups of rows splits its inputs over more workgroups (grid z).
    pub parallel: u32,
}

impl PlanCaps {
    /// The planner's view of a device. The batched kernel serves CPU adapters
    /// only ([`has_batched`]), which run workgroups on this machine's threads:
    /// as many as it has, or lavapipe's `LP_NUM_THREADS` where that is set.
    pub fn of(caps: &Capabilities) -> PlanCaps {
        // Read once: every matvec that a program or a prefill builds plans with it.
        static THREADS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        let threads = *THREADS.get_or_init(|| {
            let lavapipe = std::env::var("LP_NUM_THREADS").ok();
            lavapipe
                .and_then(|v| v.trim().parse::<u32>().ok())
                .or_else(|| {
                    std::thread::available_parallelism()
                        .ok()
                        .map(|n| n.get() as u32)
                })
                .unwrap_or(1)
                .max(1)
        });
        PlanCaps {
            max_workgroups_per_dim: caps.max_workgroups_per_dim,
            subgroup_min: caps.subgroup_min,
            parallel: threads,
        }
    }
}

/// One planned matvec dispatch: up to four row parts of one geometry.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The arena all its parts live in.
    pub arena: usize,
    /// Bits per index (which pipeline).
    pub bits: u32,
    /// Runs `matvec_rows_sgb` (prepared inputs, `params.tb` at a time) instead of
    /// the reduction's matvec.
    pub batched: bool,
    /// The params, with every field but the input's (`x_off`, `mode`, `n`,
    /// `w_off`, `lane_stride`, `in_out`: zero here) filled in.
    pub params: MatvecParams,
    /// Workgroups in x, y, z (`params.grid_x` is x; z: the batched kernel's
    /// blocks of `params.tb` inputs, workgroup z taking blocks `z, z + groups[2], …`).
    pub groups: [u32; 3],
    /// `groups · group` of the parts' matrices (the prepared input's length).
    pub padded: usize,
    /// Groups per row.
    pub row_groups: usize,
}

/// Whether a device with `caps` runs `matvec_rows_sgb` (several inputs at once) under
/// a `reduction` (after [`super::CqKernels::with_reduction`]'s fallbacks).
pub fn has_batched(reduction: Reduction, caps: PlanCaps) -> bool {
    reduction == Reduction::RowPerInvocationSubgroup && caps.subgroup_min >= 8
}

/// Rows one workgroup of the `reduction`'s kernel computes, for a 16-lane
/// kernel whose teams take `team_rows` rows in turn.
fn rows_per_workgroup(reduction: Reduction, team_rows: u32) -> u32 {
    match reduction {
        // 4 rows per invocation, 64 invocations (cq.wgsl ROWS_PER_INV).
        Reduction::RowPerInvocation | Reduction::RowPerInvocationSubgroup => 256,
        Reduction::Portable | Reduction::Subgroup => 4 * team_rows,
    }
}

/// The dispatches of a matvec of `items` for the inputs of `strides`: the items' rows
/// flattened to arena parts, parts of one geometry (arena, bits, group, groups)
/// fused four at a time in the order geometries first appear, each with its
/// `team_rows`, grid and (on devices with the batched kernel) inputs per block.
/// `vec4_input`: the inputs are prepared already, in a buffer other than the
/// output, at offsets and a stride that are multiples of 4 elements: what the
/// batched kernel (`matvec_rows_sgb`, which reads them as vec4s) needs.
pub fn plan_matvec(
    items: &[MatvecItem<'_>],
    strides: SlotStrides,
    reduction: Reduction,
    caps: PlanCaps,
    vec4_input: bool,
) -> Vec<Launch> {
    let tokens = strides.tokens.max(1);
    // Flatten to parts with their output offsets.
    let mut flat: Vec<(&GpuCq, CqPart, usize, usize, usize)> = Vec::new();
    for &(m, first, count, out_off) in items {
        for (part, lo, n) in m.parts_for(first, count) {
            flat.push((m, part, lo - part.first_row, n, out_off + (lo - first)));
        }
    }
    // Parts of one geometry are fused, four at a time, whatever their order in
    // `items`; a stable sort keeps the first appearance order of geometries.
    let key = |m: &GpuCq, p: &CqPart| (p.arena, m.bits, m.group, m.groups);
    let mut order: Vec<(usize, u32, usize, usize)> = Vec::new();
    for (m, p, ..) in &flat {
        let k = key(m, p);
        if !order.contains(&k) {
            order.push(k);
        }
    }
    flat.sort_by_key(|(m, p, ..)| order.iter().position(|k| *k == key(m, p)));
    let batched = has_batched(reduction, caps);
    let mut out = Vec::new();
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
            x_off: 0,
            grid_x: 0,
            mode: 0,
            n: 0,
            w_off: 0,
            lane_stride: 0,
            group: m0.group as u32,
            team_rows: 1,
            tokens: tokens as u32,
            tb: 1,
            x_tstride: strides.x_stride as u32,
            y_tstride: strides.y_stride as u32,
            in_out: 0,
            prep_len: 0,
            prep_out: 0,
            _pad: 0,
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
        let mut g = grid(
            params
                .total_rows
                .div_ceil(rows_per_workgroup(reduction, params.team_rows)),
            caps.max_workgroups_per_dim,
        );
        params.grid_x = g[0];
        // The batched kernel where it applies: its four-word path, at least two
        // inputs, read prepared as vec4s.
        let padded = m0.padded();
        let use_batched = batched
            && vec4_input
            && tokens > 1
            && (m0.bits == 2 || m0.bits == 4)
            && m0.group_words() % 4 == 0;
        if use_batched {
            // Each block of tb inputs decodes the words anew, so blocks in
            // workgroups of their own cost no more work; a matrix of few row
            // workgroups also takes smaller blocks until the device's
            // workgroups at once are busy (each block at least 2 inputs).
            let mut tb = tokens.min(MAX_TB);
            let rows = g[0] as usize * g[1] as usize;
            while tb > 2 && rows * tokens.div_ceil(tb) < caps.parallel as usize {
                tb = tb.div_ceil(2);
            }
            params.tb = tb as u32;
            g[2] = (tokens.div_ceil(tb) as u32).min(caps.max_workgroups_per_dim);
        }
        out.push(Launch {
            arena: p0.arena,
            bits: m0.bits,
            batched: use_batched,
            params,
            groups: g,
            padded,
            row_groups: m0.groups,
        });
        i = j;
    }
    out
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
