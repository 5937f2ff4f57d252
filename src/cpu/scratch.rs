//! [`Scratch`]: the work buffers of one forward pass ([`super::forward::forward_many`]) of
//! `n` tokens, token-major (`[n, width]`), grown on demand and never shrunk, so
//! a decode step (`n = 1`) after a long prefill allocates nothing; and the
//! chunk length of the prefill ([`chunk_len`]).

use super::attention::{ChunkAttention, SegmentWork};
use super::prep::ChunkPrep;
use crate::error::Result;
use crate::host::pool::Pool;
use crate::kernels::kv::grow;
use crate::kernels::rope::rope_freqs;
use crate::model::config::Config;

/// Tokens per prefill chunk unless `CpuEngine::set_prefill_chunk` says otherwise.
pub(super) const DEFAULT_CHUNK: usize = 256;

/// A chunk's per-token buffers hold at most about this many floats (the chunk is
/// shortened for very wide models).
const MAX_CHUNK_FLOATS: usize = 16 << 20;

/// Work buffers of a forward pass, token-major; see the module doc. Fields are
/// named after the SPEC §4 values they hold.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// The four residual lanes (`4 · hidden`).
    pub(super) lanes: Vec<f32>,
    /// `rms_unit(lanes)`, the input of the three Φ (`4 · hidden`).
    pub(super) xhat: Vec<f32>,
    /// Φ_pre, Φ_post, Φ_res projections (4, 4, 16).
    pub(super) p_pre: Vec<f32>,
    pub(super) p_post: Vec<f32>,
    pub(super) p_res: Vec<f32>,
    /// Pre-mixed input `u` and block input `b` (`hidden`).
    pub(super) u: Vec<f32>,
    pub(super) b: Vec<f32>,
    /// The input of the next matvecs before their pre-op (`hidden`; also the
    /// final hidden state of the logits).
    pub(super) a: Vec<f32>,
    /// Query, key, value, gate and gated head outputs.
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) g: Vec<f32>,
    pub(super) o: Vec<f32>,
    /// `wo · o`, the attention residual, the MLP output and `update = out − u`.
    pub(super) attn: Vec<f32>,
    pub(super) after: Vec<f32>,
    pub(super) out: Vec<f32>,
    pub(super) update: Vec<f32>,
    /// The 16 route weights of each token (what the probe sees as `route`).
    pub(super) route: Vec<f32>,
    /// One MLP scratch of `hadamard_dim` per pool part.
    pub(super) z: Vec<f32>,
    /// RoPE table of each position (`head_dim / 2` each).
    pub(super) cos: Vec<f32>,
    pub(super) sin: Vec<f32>,
    /// Per segment (sequence) of the pass: where its keys and values go and which
    /// rows each of its tokens attends.
    pub(super) attention: Vec<ChunkAttention>,
    /// Per segment: its first token in the pass, and its first position.
    pub(super) seg_start: Vec<usize>,
    pub(super) seg_pos: Vec<u64>,
    /// The pass's ids, all segments in order, and their positions.
    pub(super) ids: Vec<u32>,
    pub(super) positions: Vec<u64>,
    /// The RoPE frequencies of the config ([`crate::kernels::rope::rope_freqs`]).
    pub(super) rope_freqs: Vec<f64>,
    /// The last token's lanes of each segment (several segments' logits).
    pub(super) last_lanes: Vec<f32>,
    /// Attention scores, `heads · cache_rows` per pool part.
    pub(super) scores: Vec<f32>,
    /// The attention work items of a pass of several segments.
    pub(super) segment_work: SegmentWork,
    /// Engram: each token's table rows (`tables`), gathered rows (`e_dim`),
    /// value projection (`hidden`), and per site its keys and values.
    pub(super) table_idx: Vec<usize>,
    /// One token's table rows, as [`crate::model::engram::table_rows_for`] fills them.
    pub(super) idx: Vec<usize>,
    pub(super) e: Vec<f32>,
    pub(super) site_v: Vec<f32>,
    pub(super) site_key: Vec<Vec<f32>>,
    pub(super) site_value: Vec<Vec<f32>>,
    /// Prepared inputs of the current activation.
    pub(super) prep: ChunkPrep,
}

impl Scratch {
    /// Grow every buffer for a forward pass of `n` tokens of `c`.
    ///
    /// # Errors
    /// [`crate::Error::Alloc`] if a buffer can't grow.
    pub(super) fn grow(&mut self, c: &Config, n: usize) -> Result<()> {
        let (h, hd, qd, kvd) = (c.hidden, c.head_dim, c.q_dim(), c.kv_dim());
        for (v, len) in [
            (&mut self.lanes, 4 * h),
            (&mut self.xhat, 4 * h),
            (&mut self.p_pre, 4),
            (&mut self.p_post, 4),
            (&mut self.p_res, 16),
            (&mut self.u, h),
            (&mut self.b, h),
            (&mut self.a, h),
            (&mut self.q, qd),
            (&mut self.k, kvd),
            (&mut self.v, kvd),
            (&mut self.g, qd),
            (&mut self.o, qd),
            (&mut self.attn, h),
            (&mut self.after, h),
            (&mut self.out, h),
            (&mut self.update, h),
            (&mut self.route, 16),
            (&mut self.cos, hd / 2),
            (&mut self.sin, hd / 2),
        ] {
            grow(v, n * len, "forward buffers")?;
        }
        if self.rope_freqs.len() != hd / 2 {
            self.rope_freqs = rope_freqs(c.rope_theta, hd).take(hd / 2).collect();
        }
        let parts = Pool::global().threads();
        grow(&mut self.z, parts * c.hadamard_dim, "MLP scratch")?;
        grow(
            &mut self.scores,
            parts * c.heads * c.cache_rows(),
            "attention scores",
        )?;
        if let Some(e) = &c.engram {
            grow(&mut self.table_idx, n * e.tables(), "engram table rows")?;
            grow(&mut self.e, n * e.e_dim(), "engram rows")?;
            grow(&mut self.site_v, n * h, "engram values")?;
            self.site_key.resize_with(e.sites.len(), Vec::new);
            self.site_value.resize_with(e.sites.len(), Vec::new);
            for (key, value) in self.site_key.iter_mut().zip(&mut self.site_value) {
                grow(key, n * h, "engram keys")?;
                grow(value, n * h, "engram values")?;
            }
        }
        Ok(())
    }
}

/// The chunk length the prefill uses for `c` when `chunk` is asked for (shortened
/// so a chunk's buffers stay within about 64 MiB).
pub(super) fn chunk_len(c: &Config, chunk: usize) -> usize {
    let e = c
        .engram
        .as_ref()
        .map_or(0, |e| e.e_dim() + 2 * e.sites.len() * c.hidden);
    let per_token = 16 * c.hidden + 5 * c.q_dim() + c.head_dim + e;
    chunk
        .max(1)
        .min((MAX_CHUNK_FLOATS / per_token.max(1)).max(1))
}
