//! The engram site's causal dilated convolution (SPEC §4.2): [`conv`], the CPU
//! twin of shaders/engram.wgsl's `conv` entry point (`crate::gpu::kernels::engram`).

use super::vmath::silu_in_place;

/// Columns [`conv`] handles per pass (its accumulators live on the stack).
const COLS: usize = 64;

crate::host::simd::simd_fn! {
    /// CPU twin of the GPU `conv` entry point (shaders/engram.wgsl,
    /// `EngramKernels::conv`, inputs as `EngramConvParams`) at logical position `t`:
    /// writes `v` (`hidden` values, `v = wv · e`) at row `t mod rows` of the site's
    /// `ring` (`[rows, hidden]`, `rows = (taps − 1)·dilation + 1`), then
    /// `value = v + silu(m)` (silu by [`silu_in_place`]) with
    /// `m = Σ_{j < taps, j·dilation ≤ t} conv[j] ⊙ ring[(t − j·dilation) mod rows]`
    /// (j ascending from 0). Rows of positions before 0 are never read.
    ///
    /// # Panics
    /// If the lengths disagree (`conv`: `taps · hidden`; `ring`: a positive multiple
    /// of `hidden`).
    pub fn conv(
        t: u64,
        taps: usize,
        dilation: usize,
        v: &[f32],
        conv: &[f32],
        ring: &mut [f32],
        value: &mut [f32],
    ) {
        let h = v.len();
        assert!(
            h > 0 && value.len() == h && conv.len() == taps * h && ring.len().is_multiple_of(h),
            "engram conv: lengths"
        );
        let rows = (ring.len() / h) as u64;
        assert!(rows > 0, "engram conv: empty ring");
        let slot = (t % rows) as usize;
        ring[slot * h..(slot + 1) * h].copy_from_slice(v);
        let ring = &*ring;
        for c0 in (0..h).step_by(COLS) {
            let w = COLS.min(h - c0);
            let mut m = [0.0f32; COLS];
            let m = &mut m[..w];
            for j in 0..taps {
                let back = (j * dilation) as u64;
                if back > t {
                    break;
                }
                let r = ((t - back) % rows) as usize;
                let past = &ring[r * h + c0..r * h + c0 + w];
                let cv = &conv[j * h + c0..j * h + c0 + w];
                for ((m, c), p) in m.iter_mut().zip(cv).zip(past) {
                    *m += c * p;
                }
            }
            silu_in_place(m);
            for ((val, vv), m) in value[c0..c0 + w]
                .iter_mut()
                .zip(&v[c0..c0 + w])
                .zip(m.iter())
            {
                *val = vv + m;
            }
        }
    }
}
