//! The CQ products of the forward pass in SPEC §6.1 fast form: each product is
//! the matrices (or row ranges) that share one input, fused where their
//! widths agree ([`FastProduct`]), built once per model ([`fast_set`]) and
//! found by [`Product`].

use crate::cq::{CqMatrix, FastProduct, FastSet};
use crate::model::weights::Model;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// A product's parts (at most four): each a matrix and its rows.
pub(super) struct Parts<'a> {
    items: [(&'a CqMatrix, Range<usize>); 4],
    len: usize,
}

impl<'a> Parts<'a> {
    fn new<const N: usize>(parts: [(&'a CqMatrix, Range<usize>); N]) -> Parts<'a> {
        let filler = parts[0].0;
        let mut items = [(); 4].map(|_| (filler, 0..0));
        for (slot, p) in items.iter_mut().zip(parts) {
            *slot = p;
        }
        Parts { items, len: N }
    }
}

impl<'a> Deref for Parts<'a> {
    type Target = [(&'a CqMatrix, Range<usize>)];
    fn deref(&self) -> &Self::Target {
        &self.items[..self.len]
    }
}

/// A matrix product of the forward pass: its matrices share one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Product {
    /// The vocabulary projection (`embed`).
    Logits,
    /// Engram site `i`'s `wv` and `wk`.
    Site(usize),
    /// Layer `l`'s rows of `phi_pre`, `phi_post` and `phi_res`.
    Phi(usize),
    /// Layer `l`'s `wq`, `wk`, `wv` and `wg`.
    Qkvg(usize),
    /// Layer `l`'s `wo`.
    Wo(usize),
}

impl Product {
    /// The product's parts in order: a matrix and its rows (what the
    /// forward pass writes to its outputs in this order).
    pub(super) fn parts(self, model: &Model) -> Parts<'_> {
        let w = &model.weights;
        let all = |m: &CqMatrix| 0..m.rows();
        match self {
            Product::Logits => Parts::new([(&w.embed, all(&w.embed))]),
            Product::Site(i) => {
                let s = &w.engram.as_ref().expect("engram sites").sites[i];
                Parts::new([(&s.wv, all(&s.wv)), (&s.wk, all(&s.wk))])
            }
            Product::Phi(l) => {
                let m = &w.mhc;
                Parts::new([
                    (&m.phi_pre, 4 * l..4 * l + 4),
                    (&m.phi_post, 4 * l..4 * l + 4),
                    (&m.phi_res, 16 * l..16 * l + 16),
                ])
            }
            Product::Qkvg(l) => {
                let lw = &w.layers[l];
                Parts::new([&lw.wq, &lw.wk, &lw.wv, &lw.wg].map(|m| (m, all(m))))
            }
            Product::Wo(l) => Parts::new([(&w.layers[l].wo, all(&w.layers[l].wo))]),
        }
    }

    /// Every product of `model`, in [`FastSet`] order.
    fn all(model: &Model) -> Vec<Product> {
        let sites = model.weights.engram.as_ref().map_or(0, |e| e.sites.len());
        let mut v = vec![Product::Logits];
        v.extend((0..sites).map(Product::Site));
        for l in 0..model.weights.layers.len() {
            v.extend([Product::Phi(l), Product::Qkvg(l), Product::Wo(l)]);
        }
        v
    }

    /// This product's index in [`FastSet`] order.
    fn index(self, model: &Model) -> usize {
        let sites = model.weights.engram.as_ref().map_or(0, |e| e.sites.len());
        match self {
            Product::Logits => 0,
            Product::Site(i) => 1 + i,
            Product::Phi(l) => 1 + sites + 3 * l,
            Product::Qkvg(l) => 2 + sites + 3 * l,
            Product::Wo(l) => 3 + sites + 3 * l,
        }
    }

    /// This product's fast form in `set` (built by [`fast_set`] for `model`).
    pub(super) fn fast<'s>(self, model: &Model, set: &'s FastSet) -> &'s FastProduct {
        &set.products[self.index(model)]
    }
}

/// The fast forms of every product of `model`, built the first time they are
/// asked for (repacking every 1, 2 and 4-bit matrix once) and shared by every
/// engine of the model.
pub(super) fn fast_set(model: &Model) -> &Arc<FastSet> {
    model.fast.get_or_init(|| {
        let products = Product::all(model)
            .into_iter()
            .map(|p| FastProduct::new(&p.parts(model)))
            .collect();
        Arc::new(FastSet { products })
    })
}
