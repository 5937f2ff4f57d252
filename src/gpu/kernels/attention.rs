//! GPU twins of the attention kernels of [`crate::kernels`] (SPEC §4.3 step 5):
//! per-head ZCRMS + RoPE with the int8 KV store (`qk_store`), and attention over
//! the cache with the output gate (`attend`), in shaders/attention.wgsl.
//! CPU twins: [`crate::kernels::attention::qk_store`] and [`crate::kernels::attention::attend`].

use crate::engine::profile::bytes;
use crate::error::{Error, Result};
use crate::gpu::layout::seq_stride;
use crate::gpu::{Dispatch, GpuContext, Kernel};
use bytemuck::{Pod, Zeroable};

/// The WGSL source of the family: the shared prelude `shaders/common.wgsl`, then
/// `shaders/attention.wgsl`.
pub const SOURCE: &str = concat!(
    include_str!("../../../shaders/common.wgsl"),
    include_str!("../../../shaders/attention.wgsl")
);
/// Largest `head_dim` the shaders handle (workgroup staging of one head).
pub const MAX_HEAD_DIM: usize = 1024;

/// The int8 KV cache's buffers on the GPU (the CPU's is
/// [`crate::kernels::kv::KvCache`]): codes packed four to a u32 (little-endian
/// bytes, code `i` of a vector in byte `i % 4` of word `i / 4`; a vector takes
/// `ceil(head_dim / 4)` words, padding bytes zero), per-vector f32 scales.
/// Layout `[layers, kv_heads, rows, words]` for codes and `[layers, kv_heads, rows]`
/// for scales.
#[derive(Debug)]
pub struct KvBuffers {
    /// Key codes, `[layers, kv_heads, rows, words]` u32.
    pub k_codes: wgpu::Buffer,
    /// Value codes, `[layers, kv_heads, rows, words]` u32.
    pub v_codes: wgpu::Buffer,
    /// Key scales, `[layers, kv_heads, rows]` f32.
    pub k_scale: wgpu::Buffer,
    /// Value scales, `[layers, kv_heads, rows]` f32.
    pub v_scale: wgpu::Buffer,
    /// Layers.
    pub layers: usize,
    /// KV heads per layer.
    pub kv_heads: usize,
    /// Physical rows per (layer, KV head): `sink + window`.
    pub rows: usize,
    /// Elements per head vector.
    pub head_dim: usize,
    /// Bytes of one sequence's codes, and from one sequence's to the next's
    /// ([`KvBuffers::with_seqs`]), per code buffer.
    pub code: (u64, u64),
    /// The same for the scale buffers.
    pub scale: (u64, u64),
}

impl KvBuffers {
    /// A zero-filled cache.
    ///
    /// # Errors
    /// [`Error::Gpu`] naming the buffer if one exceeds the device's buffer or
    /// storage-binding size limit, or if `head_dim` exceeds [`MAX_HEAD_DIM`].
    pub fn new(
        ctx: &GpuContext,
        layers: usize,
        kv_heads: usize,
        rows: usize,
        head_dim: usize,
    ) -> Result<KvBuffers> {
        Self::with_seqs(ctx, layers, kv_heads, rows, head_dim, 1)
    }

    /// A zero-filled cache for each of `seqs` sequences, side by side in each
    /// buffer: sequence `s`'s cache starts at `s ·` the stride of
    /// [`KvBuffers::code`] bytes of the code buffers and `s ·` that of
    /// [`KvBuffers::scale`] of the scale ones (multiples of the device's storage
    /// offset alignment), so a dispatch
    /// bound to that window sees exactly one sequence's cache.
    ///
    /// # Errors
    /// As [`KvBuffers::new`], for all sequences together.
    pub fn with_seqs(
        ctx: &GpuContext,
        layers: usize,
        kv_heads: usize,
        rows: usize,
        head_dim: usize,
        seqs: usize,
    ) -> Result<KvBuffers> {
        if head_dim > MAX_HEAD_DIM {
            return Err(Error::Gpu(format!(
                "head_dim {head_dim} exceeds the GPU attention limit of {MAX_HEAD_DIM}"
            )));
        }
        let vectors = (layers as u64) * (kv_heads as u64) * (rows as u64);
        let code_bytes = vectors * head_dim.div_ceil(4) as u64 * 4;
        let scale_bytes = vectors * 4;
        let code_stride = seq_stride(ctx, code_bytes, seqs);
        let scale_stride = seq_stride(ctx, scale_bytes, seqs);
        let n = seqs.max(1) as u64;
        let make = |label: &str, bytes: u64| -> Result<wgpu::Buffer> {
            if bytes > ctx.caps.max_storage_binding {
                return Err(Error::Gpu(format!(
                    "buffer `{label}` needs {bytes} bytes, the device binds at most {}",
                    ctx.caps.max_storage_binding
                )));
            }
            ctx.storage_zeroed(label, bytes)
        };
        Ok(KvBuffers {
            k_codes: make("kv k_codes", code_stride * (n - 1) + code_bytes)?,
            v_codes: make("kv v_codes", code_stride * (n - 1) + code_bytes)?,
            k_scale: make("kv k_scale", scale_stride * (n - 1) + scale_bytes)?,
            v_scale: make("kv v_scale", scale_stride * (n - 1) + scale_bytes)?,
            layers,
            kv_heads,
            rows,
            head_dim,
            code: (code_bytes, code_stride),
            scale: (scale_bytes, scale_stride),
        })
    }

    /// u32 words per cached vector: `ceil(head_dim / 4)`.
    pub fn words_per_vector(&self) -> usize {
        self.head_dim.div_ceil(4)
    }
}

/// Mirror of WGSL `AttnParams`, shared by the entry points (96 bytes).
///
/// A dispatch runs token slots `y = 0..slots` (its `y` workgroups): slot `y`'s
/// act offsets count from `y · act_stride`, its step words from `y ·
/// step_stride`, and its sequence `s = step[y · step_stride + seq_at]` owns the
/// cache from `s · code_stride` code words and `s · scale_stride` scales, and the
/// scores from `s · scores_stride`. With one slot and one sequence the strides
/// do not matter.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq)]
pub struct AttnParams {
    /// Layer (selects the cache plane).
    pub layer: u32,
    /// Query heads.
    pub heads: u32,
    /// KV heads (divides `heads`).
    pub kv_heads: u32,
    /// Elements per head (even, at most [`MAX_HEAD_DIM`]).
    pub head_dim: u32,
    /// Sink positions.
    pub sink: u32,
    /// Window length (at least 1).
    pub window: u32,
    /// Cache rows per (layer, KV head): `sink + window`.
    pub rows: u32,
    /// Words per cached vector: `ceil(head_dim / 4)`.
    pub words: u32,
    /// First element of `q` in `act`.
    pub q_off: u32,
    /// First element of `k` in `act`.
    pub k_off: u32,
    /// First element of `v` in `act`.
    pub v_off: u32,
    /// First element of the gate `g` in `act`.
    pub g_off: u32,
    /// First element of the output `o` in `act`.
    pub o_off: u32,
    /// First element of `q_norm` in `vectors`.
    pub q_norm_off: u32,
    /// First element of `k_norm` in `vectors`.
    pub k_norm_off: u32,
    /// Word offset of the first RoPE cosine in `step`.
    pub cos_at: u32,
    /// Word offset of the first RoPE sine in `step`.
    pub sin_at: u32,
    /// `qk_attend`: first element of the normalised keys in `act` (what the
    /// `k` capture reads; the raw keys at `k_off` stay for the other heads).
    pub kn_off: u32,
    /// Elements from one token slot's act to the next's.
    pub act_stride: u32,
    /// Words from one token slot's step input to the next's.
    pub step_stride: u32,
    /// Step word holding the slot's sequence index.
    pub seq_at: u32,
    /// Cache code words from one sequence's to the next's.
    pub code_stride: u32,
    /// Cache scales from one sequence's to the next's.
    pub scale_stride: u32,
    /// Scores from one sequence's to the next's.
    pub scores_stride: u32,
}

/// The compiled pipelines of the family.
#[derive(Debug, Clone)]
pub struct AttentionKernels {
    qk_store: Kernel,
    attend: Kernel,
    qk_attend: Kernel,
}

impl AttentionKernels {
    /// Compile both entry points.
    pub fn new(ctx: &GpuContext) -> AttentionKernels {
        AttentionKernels {
            qk_store: Kernel::new(ctx, SOURCE, "qk_store", "qk_store", 0, &[]),
            attend: Kernel::new(ctx, SOURCE, "attend", "attend", 8, &[]),
            qk_attend: Kernel::new(ctx, SOURCE, "qk_attend", "qk_attend", 8, &[]),
        }
    }

    /// Dispatch `(heads + kv_heads, 1, 1)`: workgroup `w < heads`: query head `w` ←
    /// RoPE(zcrms(q_w, q_norm)) in place in `act`; `w >= heads`: KV head `j = w − heads`:
    /// `k_j` ← RoPE(zcrms(k_j, k_norm)) in place, then `k_j` and `v_j` (not normalised)
    /// quantized to int8 (`scale = max(1e-12, max|x|)/127`,
    /// `code = clamp(round_half_to_even(x/scale), −127, 127)`) and stored at cache
    /// row `(layer, j, step[2])`. RoPE reads `step[cos_at..]` and `step[sin_at..]`.
    /// Over token slots ([`Dispatch::over_slots`]): slots and sequences at the
    /// strides of `p`; the slots must belong to distinct sequences (their
    /// workgroups run in no particular order).
    pub fn qk_store(
        &self,
        ctx: &GpuContext,
        p: &AttnParams,
        act: &wgpu::Buffer,
        vectors: &wgpu::Buffer,
        step: &wgpu::Buffer,
        cache: &KvBuffers,
    ) -> Dispatch {
        debug_check(p, cache);
        let ub = ctx.uniform_init("qk_store params", bytemuck::bytes_of(p));
        Dispatch::new(
            ctx,
            &self.qk_store,
            &[
                &ub,
                act,
                vectors,
                step,
                &cache.k_codes,
                &cache.v_codes,
                &cache.k_scale,
                &cache.v_scale,
            ],
            [p.heads + p.kv_heads, 1, 1],
        )
        .with_bytes(bytes::qk_store(
            p.heads as usize,
            p.kv_heads as usize,
            p.head_dim as usize,
        ))
    }

    /// Dispatch `(heads, 1, 1)`: query head `h` with KV head `j = h / (heads/kv_heads)`
    /// attends over the SPEC §4.3 set `S` (sink positions `p < min(sink, t+1)`, then
    /// window positions `max(sink, t−window+1) ..= t`, `t = step[1]`, each read at its
    /// physical slot): `score_p = (Σ_d q[d]·Kcode[p,d])·Kscale[p]/sqrt(head_dim)`,
    /// softmax over `S` (max subtracted), `o_h = Σ_p w_p·Vscale[p]·Vcode[p,:]`, then
    /// `o_h ⊙= σ(g_h)`, written at `o_off + h·head_dim` in `act`. `scores` is f32
    /// scratch of at least `heads · rows` elements. The dispatch's byte estimate is
    /// for a full cache (`rows` positions); profiles recount it for the position.
    /// Over token slots ([`Dispatch::over_slots`]): slots and sequences at the
    /// strides of `p`; the slots must belong to distinct sequences (each
    /// sequence's scores are one scratch).
    pub fn attend(
        &self,
        ctx: &GpuContext,
        p: &AttnParams,
        act: &wgpu::Buffer,
        step: &wgpu::Buffer,
        cache: &KvBuffers,
        scores: &wgpu::Buffer,
    ) -> Dispatch {
        debug_check(p, cache);
        debug_assert!(scores.size() >= u64::from(p.heads) * u64::from(p.rows) * 4);
        let ub = ctx.uniform_init("attend params", bytemuck::bytes_of(p));
        Dispatch::new(
            ctx,
            &self.attend,
            &[
                &ub,
                act,
                step,
                &cache.k_codes,
                &cache.v_codes,
                &cache.k_scale,
                &cache.v_scale,
                scores,
            ],
            [p.heads, 1, 1],
        )
        .with_bytes(bytes::attend(
            p.heads as usize,
            p.head_dim as usize,
            p.rows as usize,
        ))
    }
}

impl AttentionKernels {
    /// Dispatch `(heads, 1, 1)`: [`AttentionKernels::qk_store`] and
    /// [`AttentionKernels::attend`] in one (the lean program). Every workgroup of a
    /// KV head's group normalises and quantizes that head's key and value itself;
    /// the group's first stores them in the cache and writes the normalised key at
    /// `kn_off`; each normalises its query head in place and attends, reading the
    /// current position from its own codes. `q`, `kn_off`, `v`, `o` then hold what
    /// the two dispatches leave; the raw keys at `k_off` are left as they were.
    #[allow(clippy::too_many_arguments)]
    pub fn qk_attend(
        &self,
        ctx: &GpuContext,
        p: &AttnParams,
        act: &wgpu::Buffer,
        vectors: &wgpu::Buffer,
        step: &wgpu::Buffer,
        cache: &KvBuffers,
        scores: &wgpu::Buffer,
    ) -> Dispatch {
        debug_check(p, cache);
        debug_assert!(scores.size() >= u64::from(p.heads) * u64::from(p.rows) * 4);
        let ub = ctx.uniform_init("qk_attend params", bytemuck::bytes_of(p));
        Dispatch::new(
            ctx,
            &self.qk_attend,
            &[
                &ub,
                act,
                step,
                &cache.k_codes,
                &cache.v_codes,
                &cache.k_scale,
                &cache.v_scale,
                scores,
                vectors,
            ],
            [p.heads, 1, 1],
        )
        .with_bytes(
            bytes::qk_store(p.heads as usize, p.kv_heads as usize, p.head_dim as usize)
                + bytes::attend(p.heads as usize, p.head_dim as usize, p.rows as usize),
        )
    }
}

/// Debug-build consistency checks between the params and the cache.
fn debug_check(p: &AttnParams, cache: &KvBuffers) {
    debug_assert!(p.head_dim as usize <= MAX_HEAD_DIM && p.head_dim.is_multiple_of(2));
    debug_assert_eq!(p.head_dim as usize, cache.head_dim);
    debug_assert_eq!(p.words as usize, cache.words_per_vector());
    debug_assert_eq!(p.rows as usize, cache.rows);
    debug_assert_eq!(p.rows, p.sink + p.window);
    debug_assert!(p.window >= 1);
    debug_assert_eq!(p.kv_heads as usize, cache.kv_heads);
    debug_assert!((p.layer as usize) < cache.layers);
    debug_assert!(p.kv_heads >= 1 && p.heads.is_multiple_of(p.kv_heads));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::shader_check::{validate_wgsl, wgsl_struct_size};

    #[test]
    fn wgsl_validates_and_params_match() {
        let m = validate_wgsl(SOURCE).unwrap_or_else(|e| panic!("attention.wgsl: {e}"));
        assert_eq!(
            wgsl_struct_size(&m, "AttnParams"),
            Some(std::mem::size_of::<AttnParams>() as u32)
        );
    }
}
