//! Where each activation of the step lives in the `act` buffer ([`ActLayout`],
//! named element offsets), and the token slots of the per-token buffers
//! ([`Slots`]) that a prefill chunk runs its tokens in.

use super::GpuContext;
use crate::model::config::Config;

/// Most token slots a prefill chunk uses (fewer where the device's storage
/// binding limit can't hold that many copies of the per-token buffers).
pub const PREFILL_SLOTS: usize = 32;

/// Bump allocator of element offsets in one f32 buffer.
#[derive(Debug, Default)]
struct Regions {
    len: usize,
}

impl Regions {
    /// Reserve `n` elements (16-element aligned) and return their offset.
    fn take(&mut self, n: usize) -> usize {
        let at = self.len;
        self.len += n.div_ceil(16) * 16;
        at
    }
}

/// The activations of one engram site.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SiteAct {
    /// The value projection (written to the ring by the conv).
    pub v: usize,
    /// The key projection.
    pub key: usize,
    /// The conv output (the site's value).
    pub value: usize,
}

/// Element offsets of every activation of one token slot of `act` (SPEC §4 names).
#[derive(Debug, Clone)]
pub(crate) struct ActLayout {
    /// The 24 Φ outputs: `p_pre` (4), `p_post` (4), `p_res` (16).
    pub p: usize,
    /// The pre-mixed hidden `u`.
    pub u: usize,
    /// The block input (after the engram gate).
    pub b: usize,
    /// Queries, keys, values and gates.
    pub q: usize,
    /// Keys.
    pub k: usize,
    /// Values.
    pub v: usize,
    /// Gates.
    pub g: usize,
    /// Gated head outputs.
    pub o: usize,
    /// The lean program's normalised keys (its `k` capture; `k` keeps the raw ones).
    pub kn: usize,
    /// The lean program's prepared input of the vocabulary projection.
    pub lprep: usize,
    /// The output projection.
    pub attn: usize,
    /// After the post-attention norm and residual.
    pub after: usize,
    /// The block's update (`out − u`).
    pub update: usize,
    /// The MLP's `hadamard_dim` scratch.
    pub z: usize,
    /// Zeros (what the `SkipMinusU` fault subtracts instead of `u`).
    pub zero: usize,
    /// The MLP output.
    pub out: usize,
    /// The 4×4 route.
    pub route: usize,
    /// The engram tables' gathered rows.
    pub e: usize,
    /// Per engram site.
    pub sites: Vec<SiteAct>,
    /// Elements of one slot.
    pub len: usize,
}

impl ActLayout {
    /// The layout for `c` with `sites` engram sites, the embedding's prepared
    /// input `embed_padded` long.
    pub(crate) fn new(c: &Config, sites: usize, embed_padded: usize) -> ActLayout {
        let h = c.hidden;
        let mut r = Regions::default();
        let p = r.take(24);
        let u = r.take(h);
        let b = r.take(h);
        let q = r.take(c.q_dim());
        let k = r.take(c.kv_dim());
        let v = r.take(c.kv_dim());
        let g = r.take(c.q_dim());
        let o = r.take(c.q_dim());
        let kn = r.take(c.kv_dim());
        let lprep = r.take(embed_padded);
        let attn = r.take(h);
        let after = r.take(h);
        let update = r.take(h);
        let z = r.take(c.hadamard_dim);
        let zero = r.take(h);
        let out = r.take(h);
        let route = r.take(16);
        let e = r.take(c.engram.as_ref().map_or(0, |e| e.e_dim()));
        let sites = (0..sites)
            .map(|_| SiteAct {
                v: r.take(h),
                key: r.take(h),
                value: r.take(h),
            })
            .collect();
        ActLayout {
            p,
            u,
            b,
            q,
            k,
            v,
            g,
            o,
            kn,
            lprep,
            attn,
            after,
            update,
            z,
            zero,
            out,
            route,
            e,
            sites,
            len: r.len,
        }
    }
}

/// The per-token buffers' token slots and their strides (elements): slot `j`
/// of a prefill chunk holds token `j`; a decode step uses slot 0.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slots {
    /// Token slots allocated.
    pub count: usize,
    /// Stride of `act`.
    pub act: usize,
    /// Stride of `lanes`.
    pub lanes: usize,
    /// Stride of the step input.
    pub step: usize,
    /// Stride of the prepared matvec inputs ([`super::state::DeviceState::prep`]).
    pub prep: usize,
}

impl Slots {
    /// Slots for `act_len`, `4 · hidden` lanes, `step_words` and `prep_len`
    /// prepared columns, each at a stride the device can bind a window at (and a
    /// multiple of 4 elements), as many as fit the binding limit (at most
    /// [`PREFILL_SLOTS`]).
    pub(crate) fn new(
        ctx: &GpuContext,
        act_len: usize,
        hidden: usize,
        step_words: usize,
        prep_len: usize,
    ) -> Slots {
        let align = (ctx.device.limits().min_storage_buffer_offset_alignment as usize / 4).max(4);
        let stride = |n: usize| n.div_ceil(align) * align;
        let (act, lanes, step) = (stride(act_len), stride(4 * hidden), stride(step_words));
        let prep = stride(prep_len);
        let fit = ctx.caps.max_storage_binding.min(ctx.caps.max_buffer) as usize
            / (4 * act.max(lanes).max(step).max(prep));
        Slots {
            count: fit.clamp(1, PREFILL_SLOTS),
            act,
            lanes,
            step,
            prep,
        }
    }
}

/// Bytes from one sequence's copy of a `bytes`-long region to the next's when
/// `seqs` sequences sit side by side in one buffer (a [`super::GpuBatch`]):
/// `bytes` rounded up to the device's storage offset alignment, so each copy can
/// be bound as a window; just `bytes` for one sequence.
pub(crate) fn seq_stride(ctx: &GpuContext, bytes: u64, seqs: usize) -> u64 {
    if seqs <= 1 {
        return bytes;
    }
    let align = u64::from(ctx.device.limits().min_storage_buffer_offset_alignment).max(4);
    bytes.div_ceil(align) * align
}
