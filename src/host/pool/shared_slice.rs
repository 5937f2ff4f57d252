//! [`SharedSlice`]: one mutable slice that the parts of a pool job write in
//! disjoint ranges.

/// A mutable slice that the parts of one [`Pool`] job may share, each taking a
/// disjoint range of it.
#[derive(Debug)]
pub struct SharedSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: parts only reach the elements through `range`, whose contract makes
// the ranges of concurrent callers disjoint.
unsafe impl<T: Send> Send for SharedSlice<'_, T> {}
unsafe impl<T: Send> Sync for SharedSlice<'_, T> {}

impl<'a, T> SharedSlice<'a, T> {
    /// Share `s` for the duration of its borrow.
    pub fn new(s: &'a mut [T]) -> Self {
        SharedSlice {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _life: std::marker::PhantomData,
        }
    }

    /// Elements `r` of the slice.
    ///
    /// # Safety
    /// No two live results of `range` on this value may overlap.
    ///
    /// # Panics
    /// If `r` is not inside the slice.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range(&self, r: std::ops::Range<usize>) -> &mut [T] {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "SharedSlice::range out of bounds"
        );
        // SAFETY: in bounds (checked); disjointness is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len()) }
    }

    /// Write element `i`.
    ///
    /// # Safety
    /// No live result of `range` covers `i`, and no other part writes or reads
    /// `i` meanwhile.
    ///
    /// # Panics
    /// If `i` is not inside the slice.
    pub unsafe fn set(&self, i: usize, v: T) {
        assert!(i < self.len, "SharedSlice::set out of bounds");
        // SAFETY: in bounds (checked); exclusivity is the caller's promise.
        unsafe { self.ptr.add(i).write(v) }
    }
}
