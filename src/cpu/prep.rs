//! A small cache of one activation prepared for each distinct CQ group width, so
//! matrices that share an input and a group (e.g. `wq wk wv wg`) prepare it once.

use crate::cq::{prepare_into, CqMatrix};

#[derive(Debug, Default)]
pub(crate) struct PrepCache {
    slots: Vec<(usize, Vec<f32>)>,
    used: usize,
}

impl PrepCache {
    /// Forget the current activation (keeps the allocations).
    pub(crate) fn clear(&mut self) {
        self.used = 0;
    }

    /// `prepare(x)` for `m`'s group and padding, computed once per activation.
    /// The caller must [`PrepCache::clear`] whenever `x` changes.
    pub(crate) fn get(&mut self, x: &[f32], m: &CqMatrix) -> &[f32] {
        let (group, padded) = (m.group(), m.padded());
        let hit = self.slots[..self.used]
            .iter()
            .position(|(g, v)| *g == group && v.len() == padded);
        let i = match hit {
            Some(i) => i,
            None => {
                if self.used == self.slots.len() {
                    self.slots.push((0, Vec::new()));
                }
                let slot = &mut self.slots[self.used];
                slot.0 = group;
                slot.1.resize(padded, 0.0);
                prepare_into(x, group, &mut slot.1);
                self.used += 1;
                self.used - 1
            }
        };
        &self.slots[i].1
    }
}
