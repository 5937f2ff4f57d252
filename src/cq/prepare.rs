//! SPEC §2 `prepare(x)`: zero-pad an activation to the matrix's padded width and
//! apply `nfwht` to every group.

use super::fwht::{nfwht, nfwht_into};
use super::matrix::CqMatrix;
use crate::error::{Error, Result};

impl CqMatrix {
    /// `prepare(x)` into `out` (length `padded`): zero-pad, then `nfwht` on every group.
    ///
    /// # Panics
    /// If `x.len() != cols` or `out.len() != padded`.
    pub fn prepare_into(&self, x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), self.cols, "prepare: input length");
        prepare_into(x, self.group, out);
    }
}

/// `prepare(x)` for a given group into `out` (length = padded, a multiple of `group`):
/// copy `x`, zero the tail, `nfwht` every group.
///
/// # Panics
/// If `out` is shorter than `x` or not a multiple of `group`.
pub fn prepare_into(x: &[f32], group: usize, out: &mut [f32]) {
    assert!(
        x.len() <= out.len() && out.len().is_multiple_of(group),
        "prepare: bad lengths"
    );
    // Whole groups straight from `x`; the last, padded one from a copy.
    let whole = x.len() / group * group;
    for (src, dst) in x[..whole]
        .chunks_exact(group)
        .zip(out.chunks_exact_mut(group))
    {
        nfwht_into(src, dst);
    }
    let rest = &mut out[whole..];
    rest[..x.len() - whole].copy_from_slice(&x[whole..]);
    rest[x.len() - whole..].fill(0.0);
    for g in rest.chunks_exact_mut(group) {
        nfwht(g);
    }
}

/// `prepare(x)` for a matrix: `x` zero-padded to `padded`, `nfwht` on every group.
///
/// # Errors
/// [`Error::InvalidArgument`] if `x.len() != P.cols`.
pub fn prepare(p: &CqMatrix, x: &[f32]) -> Result<Vec<f32>> {
    if x.len() != p.cols() {
        return Err(Error::InvalidArgument(format!(
            "prepare: input has {} values, the matrix has {} columns",
            x.len(),
            p.cols()
        )));
    }
    let mut out = vec![0.0; p.padded()];
    prepare_into(x, p.group(), &mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_into_is_the_copy_padding_and_transform_of_each_group() {
        for (cols, group) in [
            (16usize, 16usize),
            (40, 32),
            (300, 64),
            (2048, 128),
            (500, 256),
            (1000, 512),
        ] {
            let x: Vec<f32> = (0..cols)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
                .collect();
            let padded = cols.div_ceil(group) * group;
            let mut want = vec![0.0f32; padded];
            want[..cols].copy_from_slice(&x);
            for g in want.chunks_exact_mut(group) {
                crate::cq::fwht_scalar(g);
                let s = 1.0 / (group as f32).sqrt();
                g.iter_mut().for_each(|v| *v *= s);
            }
            let mut got = vec![f32::NAN; padded];
            prepare_into(&x, group, &mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{cols} columns, group {group}");
        }
    }
}
