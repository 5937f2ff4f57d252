//! Sampling help on the device (shaders/sample.wgsl): the GPU twin of
//! [`crate::session::sample::argmax`] plus a non-finite flag, so a greedy decode step reads
//! back 8 bytes instead of `vocab` floats, and the top-k candidates (at most
//! [`MAX_K`]) for top-k / top-p sampling, with the softmax denominator a top-p cut
//! without a top-k needs. The top-k output is always the whole [`TOPK_WORDS`]-word
//! buffer (`4 · TOPK_WORDS` = 2060 bytes, whatever `k` is); the engine copies and
//! reads back all of it.
//! CPU twins: [`crate::session::sample::argmax`] and [`crate::session::sample::top_k_into`].

use crate::gpu::{Dispatch, GpuContext, Kernel};
use bytemuck::{Pod, Zeroable};

/// The WGSL source of the family: the shared prelude `shaders/common.wgsl`, then
/// `shaders/sample.wgsl`.
pub const SOURCE: &str = concat!(
    include_str!("../../../shaders/common.wgsl"),
    include_str!("../../../shaders/sample.wgsl")
);

/// Mirror of WGSL `ArgmaxParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq)]
pub struct ArgmaxParams {
    /// Logits to scan.
    pub n: u32,
    /// Element offset of the first logit.
    pub off: u32,
    /// Non-zero: only the ids the mask allows.
    pub masked: u32,
    /// Padding to 16 bytes.
    pub _pad: u32,
}

/// Largest `k` [`SampleKernels::topk`] gathers (WGSL `MAX_K`).
pub const MAX_K: usize = 256;

/// Words of the top-k output buffer: flag, count, `MAX_K` ids, `MAX_K` logit bit
/// patterns, the softmax denominator's bit pattern.
pub const TOPK_WORDS: usize = 3 + 2 * MAX_K;

/// Mirror of WGSL `TopkParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq)]
pub struct TopkParams {
    /// Logits to scan.
    pub n: u32,
    /// Element offset of the first logit.
    pub off: u32,
    /// Candidates wanted (clamped to [`MAX_K`] and `n`).
    pub k: u32,
    /// `> 0`: also compute `Σ exp((logit − max) / temperature)` over all logits
    /// (the softmax denominator of a top-p cut); `0`: skip it.
    pub temperature: f32,
    /// Non-zero: only the ids the mask allows.
    pub masked: u32,
    /// Padding to 32 bytes.
    pub _pad: [u32; 3],
}

/// The compiled pipelines of the family.
#[derive(Debug, Clone)]
pub struct SampleKernels {
    argmax: Kernel,
    topk: Kernel,
    width: u32,
}

impl SampleKernels {
    /// Compile both entry points (`argmax`, `topk`) at the device's wide
    /// workgroup ([`crate::gpu::Capabilities::wide_workgroup`]).
    pub fn new(ctx: &GpuContext) -> SampleKernels {
        let wg = [("WG", f64::from(ctx.caps.wide_workgroup))];
        SampleKernels {
            argmax: Kernel::new(ctx, SOURCE, "sample", "argmax", 0, &wg),
            topk: Kernel::new(ctx, SOURCE, "topk", "topk", 4, &wg),
            width: ctx.caps.wide_workgroup,
        }
    }

    /// Invocations of the kernels' one workgroup (the top-k's denominator sums
    /// over them, then a tree: its rounding bound depends on it).
    pub fn width(&self) -> u32 {
        self.width
    }

    /// One workgroup: `out[0]` = argmax of `logits[off .. off + n]` (lowest index of
    /// the maximum), `out[1]` = 1 if any of them is NaN or infinite. `out` holds 2
    /// u32. With `p.masked`, only the ids `mask` allows (bit `i & 31` of word
    /// `i >> 5`) count; `mask` is bound either way.
    pub fn argmax(
        &self,
        ctx: &GpuContext,
        p: &ArgmaxParams,
        logits: &wgpu::Buffer,
        out: &wgpu::Buffer,
        mask: &wgpu::Buffer,
    ) -> Dispatch {
        let ub = ctx.uniform_init("argmax params", bytemuck::bytes_of(p));
        Dispatch::new(ctx, &self.argmax, &[&ub, logits, out, mask], [1, 1, 1])
            .with_bytes(p.n as u64 * 4 + 8)
    }
}

impl SampleKernels {
    /// One workgroup: the `min(k, n, MAX_K)` largest of `logits[off .. off + n]`
    /// (ties at the cut toward lower ids) into `out` ([`TOPK_WORDS`] u32: flag,
    /// count, ids, logit bits, softmax denominator), in no particular order; the
    /// flag is 1 when a logit is NaN or infinite. With `temperature > 0` the last
    /// word is `Σ exp((logit − max) / temperature)` over all `n` logits (f32).
    /// With `p.masked`, only the ids `mask` allows count (as in
    /// [`SampleKernels::argmax`]); `m` is then at most their number.
    pub fn topk(
        &self,
        ctx: &GpuContext,
        p: &TopkParams,
        logits: &wgpu::Buffer,
        out: &wgpu::Buffer,
        mask: &wgpu::Buffer,
    ) -> Dispatch {
        let ub = ctx.uniform_init("topk params", bytemuck::bytes_of(p));
        Dispatch::new(ctx, &self.topk, &[&ub, logits, out, mask], [1, 1, 1]).with_bytes(
            p.n as u64 * 4 * if p.temperature > 0.0 { 8 } else { 6 } + TOPK_WORDS as u64 * 4,
        )
    }
}

/// Decode the top-k output buffer into `(logit, id)` pairs and return the softmax
/// denominator (0 unless asked for), or `None` when the flag says a logit was not
/// finite.
pub fn decode_topk(words: &[u32], out: &mut Vec<(f32, u32)>) -> Option<f32> {
    out.clear();
    if words[0] != 0 {
        return None;
    }
    let m = (words[1] as usize).min(MAX_K);
    out.extend((0..m).map(|i| (f32::from_bits(words[2 + MAX_K + i]), words[2 + i])));
    Some(f32::from_bits(words[2 + 2 * MAX_K]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::shader_check::{validate_wgsl, wgsl_struct_size};

    #[test]
    fn wgsl_validates_and_params_match() {
        let m = validate_wgsl(SOURCE).unwrap_or_else(|e| panic!("sample.wgsl: {e}"));
        assert_eq!(
            wgsl_struct_size(&m, "ArgmaxParams"),
            Some(std::mem::size_of::<ArgmaxParams>() as u32)
        );
        assert_eq!(
            wgsl_struct_size(&m, "TopkParams"),
            Some(std::mem::size_of::<TopkParams>() as u32)
        );
    }
}
