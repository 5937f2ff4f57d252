//! [`Sink`]: where a fused fast product's rows go, each part's rows to its
//! own output, token-major.

use super::TILE;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The most parts one fused matrix holds.
pub(super) const MAX_PARTS: usize = 8;

/// Where a product's rows go: row `r` of a range `start..end` and input `t`
/// at `ptr + t · stride + (r − start)`; and which product call they belong to.
pub(super) struct Sink {
    ranges: [(Range<usize>, usize, usize); MAX_PARTS],
    len: usize,
    /// A number no other product call of this process has: per-thread copies
    /// of a call's inputs (the packed groups) are reused by its later tile
    /// runs on the same thread, never by another call's.
    pub(super) stamp: u64,
}

impl Sink {
    /// An empty sink with a fresh stamp.
    pub(super) fn new() -> Sink {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Sink {
            ranges: Default::default(),
            len: 0,
            stamp: NEXT.fetch_add(1, Relaxed),
        }
    }
}

// SAFETY: a sink only forwards raw output addresses; its users write disjoint
// elements through it (see `put`).
unsafe impl Sync for Sink {}

impl Sink {
    /// Rows `range` of input `t` to `ptr + t · stride`.
    pub(super) fn push(&mut self, range: Range<usize>, ptr: *mut f32, stride: usize) {
        self.ranges[self.len] = (range, ptr as usize, stride);
        self.len += 1;
    }

    /// The sink whose input `t` is this one's input `t0 + t` (same call).
    pub(super) fn skip_inputs(&self, t0: usize) -> Sink {
        let mut s = Sink {
            ranges: Default::default(),
            len: 0,
            stamp: self.stamp,
        };
        for (range, ptr, stride) in &self.ranges[..self.len] {
            // The address only: nothing is written through it here.
            let p = (*ptr as *mut f32).wrapping_add(t0 * stride);
            s.push(range.clone(), p, *stride);
        }
        s
    }

    /// Tile `tile`'s values `v` (rows `16 · tile ..`) of input `t`.
    ///
    /// # Safety
    /// The outputs are live and no other thread writes these elements.
    pub(super) unsafe fn put(&self, tile: usize, t: usize, v: &[f32; TILE]) {
        let r0 = tile * TILE;
        for (range, ptr, stride) in &self.ranges[..self.len] {
            let (lo, hi) = (range.start.max(r0), range.end.min(r0 + TILE));
            if lo < hi {
                // SAFETY: the caller's.
                unsafe {
                    let dst = (*ptr as *mut f32).add(t * stride + lo - range.start);
                    if hi - lo == TILE {
                        // The usual whole tile: a fixed-size copy, inlined
                        // (a copy of a run-time length is a call to memcpy).
                        (dst as *mut [f32; TILE]).write_unaligned(*v);
                    } else {
                        std::ptr::copy_nonoverlapping(v.as_ptr().add(lo - r0), dst, hi - lo);
                    }
                }
            }
        }
    }
}
