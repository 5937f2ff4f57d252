//! [`State`]: everything a step reads from earlier steps (position, token
//! history, the int8 KV cache, the engram rings), and [`alloc`].

use crate::error::Result;
use crate::kernels::kv::{grow, KvCache};
use crate::model::engram::TokenHistory;
use crate::model::weights::Model;

/// A zeroed vector of `n` values, reporting an allocation failure (naming
/// `what`) as [`crate::Error::Alloc`] instead of aborting.
pub(super) fn alloc<T: Clone + Default>(what: &str, n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    grow(&mut v, n, what)?;
    Ok(v)
}

/// Incremental state of one sequence.
#[derive(Debug, Clone)]
pub(super) struct State {
    /// Logical position of the next token.
    pub(super) pos: u64,
    /// The tokens so far (for the engram hashes).
    pub(super) history: TokenHistory,
    /// `[layers, kv_heads, sink + window, head_dim]`.
    pub(super) kv: KvCache,
    /// Per engram site: `[ring, hidden]` raw value projections.
    pub(super) rings: Vec<Vec<f32>>,
    /// Rows of each engram table (a model constant the hashes need).
    pub(super) table_rows: Vec<usize>,
}

impl State {
    /// Position 0 for `model`.
    ///
    /// # Errors
    /// [`crate::Error::Alloc`] if the KV cache or the rings can't be allocated.
    pub(super) fn new(model: &Model) -> Result<State> {
        let c = &model.config;
        let kv = KvCache::new(c.layers, c.kv_heads, c.cache_rows(), c.head_dim)?;
        let (rings, table_rows) = match (&c.engram, &model.weights.engram) {
            (Some(e), Some(w)) => (
                (0..e.sites.len())
                    .map(|_| alloc("engram ring", e.ring() * c.hidden))
                    .collect::<Result<Vec<_>>>()?,
                w.tables.iter().map(|t| t.rows()).collect(),
            ),
            _ => (Vec::new(), Vec::new()),
        };
        Ok(State {
            pos: 0,
            history: TokenHistory::default(),
            kv,
            rings,
            table_rows,
        })
    }

    /// Bytes of its cache and rings (what a saved copy holds).
    pub(super) fn bytes(&self) -> u64 {
        let kv = &self.kv;
        let codes = kv.k_codes.len() + kv.v_codes.len();
        let scales = kv.k_scale.len() + kv.v_scale.len();
        let rings: usize = self.rings.iter().map(Vec::len).sum();
        (codes + 4 * (scales + rings)) as u64
    }

    /// Back to position 0. Stale cache rows and ring rows are never read before
    /// being rewritten: attention reads only slots of positions `<= t`, and the
    /// ring only rows of positions `>= 0`, both written earlier in the same run.
    pub(super) fn reset(&mut self) {
        self.pos = 0;
        self.history.clear();
    }
}
