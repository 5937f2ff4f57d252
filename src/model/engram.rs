//! Engram bookkeeping shared by every backend (SPEC §4.2): the bounded token
//! history and the FNV-1a n-gram hashes that pick table rows.

use crate::model::config::EngramConfig;

/// FNV-1a 64-bit offset basis.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64-bit prime.
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// Token value hashed for positions before 0.
pub const PAD_TOKEN: u32 = 0xFFFF_FFFF;
/// Largest n-gram order of SPEC §1: the history keeps this many tokens.
pub const MAX_ORDER: usize = 64;

/// FNV-1a 64 over `bytes`.
pub fn fnv1a64_bytes(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes
        .into_iter()
        .fold(FNV_OFFSET, |h, b| (h ^ b as u64).wrapping_mul(FNV_PRIME))
}

/// FNV-1a 64 over the little-endian bytes of `words`.
pub fn fnv1a64_words(words: impl IntoIterator<Item = u32>) -> u64 {
    fnv1a64_bytes(words.into_iter().flat_map(u32::to_le_bytes))
}

/// The last [`MAX_ORDER`] tokens and the count of all tokens seen.
#[derive(Debug, Clone)]
pub struct TokenHistory {
    ring: [u32; MAX_ORDER],
    len: u64,
}

impl Default for TokenHistory {
    fn default() -> Self {
        Self {
            ring: [PAD_TOKEN; MAX_ORDER],
            len: 0,
        }
    }
}

impl TokenHistory {
    /// Append the token of the next position.
    pub fn push(&mut self, token: u32) {
        self.ring[(self.len % MAX_ORDER as u64) as usize] = token;
        self.len += 1;
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Number of tokens pushed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no token was pushed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `tok[p]` for the last position `t = len − 1` minus `back` (`back < MAX_ORDER`),
    /// or [`PAD_TOKEN`] before position 0.
    pub fn back(&self, back: usize) -> u32 {
        debug_assert!(back < MAX_ORDER);
        if (back as u64) >= self.len {
            PAD_TOKEN
        } else {
            self.ring[((self.len - 1 - back as u64) % MAX_ORDER as u64) as usize]
        }
    }

    /// Hash of order `n`, head `h` at the last position `t`: FNV-1a 64 over
    /// `n, h, tok[t−n+1], …, tok[t]`.
    pub fn ngram_hash(&self, n: usize, h: usize) -> u64 {
        let toks = (0..n).rev().map(|b| self.back(b));
        fnv1a64_words([n as u32, h as u32].into_iter().chain(toks))
    }
}

/// Row indices of every engram table for the last position of `history`, in
/// gather order (orders as listed, heads ascending); `table_rows[k]` is table `k`'s `T`.
pub fn table_rows_for(
    history: &TokenHistory,
    e: &EngramConfig,
    table_rows: &[usize],
    out: &mut Vec<usize>,
) {
    out.clear();
    let mut k = 0;
    for &n in &e.orders {
        for h in 0..e.hash_heads {
            out.push((history.ngram_hash(n, h) % table_rows[k] as u64) as usize);
            k += 1;
        }
    }
}
