//! [`FastProduct`] and [`FastSet`]: which parts of a model's matrix products
//! fuse into one [`FastMatrix`] (the parts of one width sharing an input).

use super::sink::MAX_PARTS;
use super::FastMatrix;
use crate::cq::matrix::CqMatrix;
use std::ops::Range;

/// The fused fast forms of the matrix products of a model that share an
/// input, in an order its engine defines (see `crate::cpu`), each `None`
/// where no part has a fast form.
#[derive(Debug, Default)]
pub struct FastSet {
    /// The products.
    pub products: Vec<FastProduct>,
}

/// One product's fast matrices: each fuses some of the product's parts (by
/// index) that share a width; the parts in none of them run exactly.
#[derive(Debug, Default)]
pub struct FastProduct {
    /// A fused matrix and the product's part indices it holds, in its order.
    pub fused: Vec<(FastMatrix, Vec<usize>)>,
}

impl FastProduct {
    /// The fused fast forms of `parts` (each a matrix and its rows): parts of
    /// one (bits, group, padded) fuse; 8-bit parts stay exact.
    pub fn new(parts: &[(&CqMatrix, Range<usize>)]) -> FastProduct {
        let mut fused: Vec<(FastMatrix, Vec<usize>)> = Vec::new();
        let mut done = vec![false; parts.len()];
        for i in 0..parts.len() {
            if done[i] || parts[i].0.bits() > 4 {
                continue;
            }
            let key = |m: &CqMatrix| (m.bits(), m.group(), m.padded());
            let ids: Vec<usize> = (i..parts.len())
                .filter(|&j| !done[j] && key(parts[j].0) == key(parts[i].0))
                .collect();
            for ids in ids.chunks(MAX_PARTS) {
                let these: Vec<_> = ids.iter().map(|&j| parts[j].clone()).collect();
                if let Some(fm) = FastMatrix::new(&these) {
                    ids.iter().for_each(|&j| done[j] = true);
                    fused.push((fm, ids.to_vec()));
                }
            }
        }
        FastProduct { fused }
    }

    /// Whether part `i` runs in a fused fast matrix.
    pub fn covers(&self, i: usize) -> bool {
        self.fused.iter().any(|(_, ids)| ids.contains(&i))
    }
}
