//! [`PromptCache`]: sequence states kept across requests, keyed by the tokens
//! each had processed, so that a request whose prompt extends a kept
//! sequence's tokens starts from a copy of that state and prefills only the
//! rest (llama.cpp's and vLLM's prompt caching; every agent resends its whole
//! conversation each turn). Bounded in bytes, least recently used first out.

use crate::engine::SavedSlot;

/// What a [`PromptCache`] has done since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found a kept state.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Prompt tokens the hits did not prefill again.
    pub tokens_reused: u64,
    /// States dropped to keep within the budget.
    pub evictions: u64,
}

struct Entry {
    tokens: Vec<u32>,
    saved: SavedSlot,
    /// The lookup or insertion clock when last used.
    used: u64,
}

/// Saved sequence states keyed by their tokens, within a budget of bytes.
pub struct PromptCache {
    entries: Vec<Entry>,
    budget: u64,
    held: u64,
    clock: u64,
    stats: CacheStats,
}

impl std::fmt::Debug for PromptCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptCache")
            .field("entries", &self.entries.len())
            .field("bytes", &self.held)
            .field("budget", &self.budget)
            .finish()
    }
}

impl PromptCache {
    /// An empty cache holding at most `budget` bytes of states (0: it keeps
    /// nothing).
    pub fn new(budget: u64) -> PromptCache {
        PromptCache {
            entries: Vec::new(),
            budget,
            held: 0,
            clock: 0,
            stats: CacheStats::default(),
        }
    }

    /// The kept state whose tokens are the longest strict prefix of `prompt`
    /// (at least one prompt token is left to feed, whose logits the request
    /// needs), with its length; counted as a hit or a miss.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(&SavedSlot, usize)> {
        self.clock += 1;
        let best = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.tokens.len() < prompt.len() && prompt.starts_with(&e.tokens))
            .max_by_key(|(_, e)| e.tokens.len())
            .map(|(i, _)| i);
        let Some(i) = best else {
            self.stats.misses += 1;
            return None;
        };
        let e = &mut self.entries[i];
        e.used = self.clock;
        self.stats.hits += 1;
        self.stats.tokens_reused += e.tokens.len() as u64;
        Some((&e.saved, e.tokens.len()))
    }

    /// Whether the state after `tokens` is worth saving: the cache keeps
    /// states (a budget over 0) and none has exactly these tokens.
    pub fn wants(&self, tokens: &[u32]) -> bool {
        self.budget > 0 && !tokens.is_empty() && !self.entries.iter().any(|e| e.tokens == tokens)
    }

    /// Keep `saved`, the state after `tokens` (replacing one of the same
    /// tokens), dropping the least recently used states until it fits; a state
    /// over the whole budget is not kept.
    pub fn insert(&mut self, tokens: Vec<u32>, saved: SavedSlot) {
        let bytes = saved.bytes();
        if bytes > self.budget || tokens.is_empty() {
            return;
        }
        if let Some(i) = self.entries.iter().position(|e| e.tokens == tokens) {
            self.held -= self.entries.swap_remove(i).saved.bytes();
        }
        while self.held + bytes > self.budget {
            let Some(lru) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used) else {
                break;
            };
            self.held -= self.entries.swap_remove(lru).saved.bytes();
            self.stats.evictions += 1;
        }
        self.clock += 1;
        self.held += bytes;
        self.entries.push(Entry {
            tokens,
            saved,
            used: self.clock,
        });
    }

    /// Drop every kept state (the stats go on).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.held = 0;
    }

    /// Bytes of the states kept.
    pub fn bytes(&self) -> u64 {
        self.held
    }

    /// States kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it keeps no state.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What it has done so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}
