//! The Hadamard MLP (SPEC §4.3 step 6).

use super::norm::zcrms_into;
use super::vmath::silu_of_product;
use crate::cq::nfwht;

/// `out = after + (d3 ⊙ nfwht(silu(d2 ⊙ nfwht(d1 ⊙ pad(zcrms(after, norm))))))[..hidden]`.
/// `z` is scratch of `hadamard_dim = d1.len()` entries.
///
/// # Panics
/// If the lengths disagree.
pub fn hadamard_mlp(
    after: &[f32],
    norm: &[f32],
    d1: &[f32],
    d2: &[f32],
    d3: &[f32],
    z: &mut [f32],
    out: &mut [f32],
) {
    let h = after.len();
    assert!(z.len() == d1.len() && d2.len() == d1.len() && d3.len() == d1.len() && out.len() == h);
    zcrms_into(after, norm, &mut z[..h]);
    z[h..].fill(0.0);
    for (v, w) in z.iter_mut().zip(d1) {
        *v *= w;
    }
    nfwht(z);
    silu_of_product(z, d2);
    nfwht(z);
    for (v, w) in z.iter_mut().zip(d3) {
        *v *= w;
    }
    for ((o, a), v) in out.iter_mut().zip(after).zip(z.iter()) {
        *o = a + v;
    }
}
