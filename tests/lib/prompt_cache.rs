//! `PromptCache`: the longest kept strict prefix of a prompt wins, an exact
//! match is not one (the request needs the logits of its last prompt token),
//! least recently used states go first, the byte budget holds, and the stats
//! count what happened.

use cqlm::cq::BitsPlan;
use cqlm::session::prompt_cache::{CacheStats, PromptCache};
use cqlm::{BatchEngine, Config, CpuBatch, Precision};
use std::sync::Arc;

/// A saved state of a tiny model (all the same size).
fn state() -> cqlm::engine::SavedSlot {
    let model = Arc::new(
        cqlm::make::synth::synth_model(&Config::preset_tiny(), &BitsPlan::mixed(), 1).unwrap(),
    );
    CpuBatch::new(model, 1, Precision::Exact)
        .unwrap()
        .save(0)
        .unwrap()
}

#[test]
fn the_longest_strict_prefix_wins_and_the_least_recently_used_goes_first() {
    let one = state().bytes();
    let mut c = PromptCache::new(3 * one);
    assert!(c.lookup(&[1, 2, 3]).is_none());
    c.insert(vec![1, 2], state());
    c.insert(vec![1, 2, 3, 4], state());
    c.insert(vec![9], state());
    assert_eq!((c.len(), c.bytes()), (3, 3 * one));
    assert_eq!(c.lookup(&[1, 2, 3, 4, 5]).map(|(_, n)| n), Some(4));
    assert_eq!(
        c.lookup(&[1, 2, 3, 4]).map(|(_, n)| n),
        Some(2),
        "an exact match is no prefix"
    );
    assert_eq!(c.lookup(&[1, 2]).map(|(_, n)| n), None);
    assert_eq!(c.lookup(&[1, 3]).map(|(_, n)| n), None);
    assert!(!c.wants(&[9]) && c.wants(&[9, 1]));
    // [9] is the least recently used: a fourth state evicts it.
    c.insert(vec![7, 7], state());
    assert_eq!((c.len(), c.bytes()), (3, 3 * one));
    assert!(c.lookup(&[9, 9]).is_none());
    assert_eq!(c.lookup(&[1, 2, 0]).map(|(_, n)| n), Some(2));
    // The same tokens again replace their state, evicting nothing.
    c.insert(vec![7, 7], state());
    assert_eq!(
        c.stats(),
        CacheStats {
            hits: 3,
            misses: 4,
            tokens_reused: 8,
            evictions: 1
        }
    );
    // No budget, no states; a state over the budget is not kept.
    let mut none = PromptCache::new(0);
    assert!(!none.wants(&[1]));
    none.insert(vec![1], state());
    let mut small = PromptCache::new(one - 1);
    small.insert(vec![1], state());
    assert!(none.is_empty() && small.is_empty());
}
