//! The Hadamard MLP (SPEC §4.3 step 6) and [`block`], the CPU twin of
//! shaders/mlp.wgsl's `mlp` entry point (`crate::gpu::kernels::mlp`): attention
//! output norm and residual, the MLP and the lane update.

use super::norm::{inv_rms, zcrms_into};
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

/// CPU twin of the GPU `mlp` entry point (shaders/mlp.wgsl, `MlpKernels::mlp`,
/// inputs as `MlpParams`) for one token: SPEC §4.3 end of step 5,
/// `after = b + out_scale · zcrms(attn, post_norm)`; step 6,
/// `out = `[`hadamard_mlp`]`(after, mlp_norm, d1, d2, d3)`; step 7,
/// `update = out − u`. `b`, `u`, `attn`, the norms and the outputs hold `hidden`
/// values; `z` is scratch of `hadamard_dim = d1.len()`.
///
/// # Panics
/// If the lengths disagree.
#[allow(clippy::too_many_arguments)]
pub fn block(
    b: &[f32],
    u: &[f32],
    attn: &[f32],
    out_scale: f32,
    post_norm: &[f32],
    mlp_norm: &[f32],
    [d1, d2, d3]: [&[f32]; 3],
    z: &mut [f32],
    after: &mut [f32],
    out: &mut [f32],
    update: &mut [f32],
) {
    let h = b.len();
    assert!(
        u.len() == h && attn.len() == h && post_norm.len() == h && after.len() == h,
        "mlp block: lengths"
    );
    assert_eq!(update.len(), h, "mlp block: update");
    // `zcrms(attn, post_norm)` element by element as `zcrms_into` forms it.
    let r = inv_rms(attn);
    for ((a, b), (x, g)) in after.iter_mut().zip(b).zip(attn.iter().zip(post_norm)) {
        *a = b + out_scale * (x * r * (1.0 + g));
    }
    hadamard_mlp(after, mlp_norm, d1, d2, d3, z, out);
    for ((d, o), u) in update.iter_mut().zip(out.iter()).zip(u) {
        *d = o - u;
    }
}
