//! SEED §1: the Walsh–Hadamard transform in natural (Sylvester) order.

/// Unnormalised in-place fast Walsh–Hadamard transform: `x ← H_n · x`.
///
/// `x.len()` must be a power of two (a length of 0 or 1 is the identity).
/// `fwht(fwht(x)) = n · x`. Uses 8-lane AVX2 butterflies where the CPU has them
/// (and [`crate::host::simd::CpuSimd::selected`] allows), bit-identical to
/// [`fwht_scalar`]: every output is the same `u + v` or `u − v` of the same inputs.
///
/// # Panics
/// If `x.len()` is not a power of two (a programming error: every caller passes a group or `hadamard_dim`).
pub fn fwht(x: &mut [f32]) {
    fwht_then_scale(x, None);
}

/// [`fwht`], then every value times `scale` when given (in the SIMD paths as
/// the last stage stores it: the same multiply as a pass after).
fn fwht_then_scale(x: &mut [f32], scale: Option<f32>) {
    let n = x.len();
    assert!(
        n <= 1 || n.is_power_of_two(),
        "fwht length {n} is not a power of two"
    );
    #[cfg(target_arch = "x86_64")]
    {
        use crate::host::simd::CpuSimd;
        match CpuSimd::selected() {
            CpuSimd::Avx512 if n >= 16 => {
                // SAFETY: the selection implies AVX-512F; n is a power of two >= 16.
                unsafe { x86::fwht_avx512(x, scale) };
                return;
            }
            CpuSimd::Scalar => {}
            _ if n >= 8 => {
                // SAFETY: a non-scalar selection implies AVX2; n is a power of two >= 8.
                unsafe { fwht_avx2(x) };
                scale_by(x, scale);
                return;
            }
            _ => {}
        }
    }
    fwht_scalar(x);
    scale_by(x, scale);
}

/// Every value of `x` times `scale`, when given.
fn scale_by(x: &mut [f32], scale: Option<f32>) {
    if let Some(s) = scale {
        for v in x.iter_mut() {
            *v *= s;
        }
    }
}

/// The plain butterfly loops of [`fwht`] (the reference the SIMD path is tested against).
///
/// # Panics
/// If `x.len()` is not a power of two.
pub fn fwht_scalar(x: &mut [f32]) {
    let n = x.len();
    if n <= 1 {
        return;
    }
    assert!(n.is_power_of_two(), "fwht length {n} is not a power of two");
    let mut h = 1;
    while h < n {
        for block in x.chunks_exact_mut(2 * h) {
            let (lo, hi) = block.split_at_mut(h);
            for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                let (u, v) = (*a, *b);
                *a = u + v;
                *b = u - v;
            }
        }
        h *= 2;
    }
}

/// AVX2 butterflies: stages 1, 2, 4 inside each 8-lane vector (permute, add,
/// subtract, blend), then whole-vector stages, up to three a pass. Every
/// output is the same `u + v` or `u − v` of the same inputs, stage by stage in
/// the same order, as [`fwht_scalar`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fwht_avx2(x: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = x.len();
    let p = x.as_mut_ptr();
    for b in (0..n).step_by(8) {
        let mut v = _mm256_loadu_ps(p.add(b));
        // h = 1: t = [a1 a0 a3 a2 ..]; even lanes u + v, odd lanes u − v.
        let t = _mm256_permute_ps::<0b10_11_00_01>(v);
        v = _mm256_blend_ps::<0b1010_1010>(_mm256_add_ps(v, t), _mm256_sub_ps(t, v));
        // h = 2: t = [a2 a3 a0 a1 ..].
        let t = _mm256_permute_ps::<0b01_00_11_10>(v);
        v = _mm256_blend_ps::<0b1100_1100>(_mm256_add_ps(v, t), _mm256_sub_ps(t, v));
        // h = 4: t = the other 128-bit half.
        let t = _mm256_permute2f128_ps::<0x01>(v, v);
        v = _mm256_blend_ps::<0b1111_0000>(_mm256_add_ps(v, t), _mm256_sub_ps(t, v));
        _mm256_storeu_ps(p.add(b), v);
    }
    // Then up to three stages a pass across 8 registers (radix 8), so each
    // value is loaded and stored once per three stages.
    let mut h = 8;
    while h < n {
        let r = if h * 8 <= n {
            across::<8>(p, n, h)
        } else if h * 4 <= n {
            across::<4>(p, n, h)
        } else {
            across::<2>(p, n, h)
        };
        h *= r;
    }
}

/// Stages `h, 2h, … (R/2)·h` of the AVX2 transform (`R` a power of two, `R·h ≤
/// n`), in that order, over registers `h` apart; returns `R`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn across<const R: usize>(p: *mut f32, n: usize, h: usize) -> usize {
    use std::arch::x86_64::*;
    for block in (0..n).step_by(R * h) {
        for i in (block..block + h).step_by(8) {
            let mut v = [_mm256_setzero_ps(); R];
            for (k, v) in v.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(p.add(i + k * h));
            }
            let mut d = 1;
            while d < R {
                for k in 0..R {
                    if k & d == 0 {
                        let (a, b) = (v[k], v[k + d]);
                        v[k] = _mm256_add_ps(a, b);
                        v[k + d] = _mm256_sub_ps(a, b);
                    }
                }
                d *= 2;
            }
            for (k, v) in v.iter().enumerate() {
                _mm256_storeu_ps(p.add(i + k * h), *v);
            }
        }
    }
    R
}

/// Orthonormal transform `nfwht(x) = fwht(x) / sqrt(n)`, its own inverse.
///
/// # Panics
/// If `x.len()` is not a power of two.
pub fn nfwht(x: &mut [f32]) {
    let s = 1.0 / (x.len() as f32).sqrt();
    fwht_then_scale(x, Some(s));
}

/// `dst ← nfwht(src)`: exactly the values of [`nfwht`] on a copy of `src`,
/// with the AVX-512 transform reading `src` in its first pass instead of
/// after a copy.
///
/// # Panics
/// If the lengths differ or are not a power of two.
pub fn nfwht_into(src: &[f32], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "nfwht_into: lengths");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= 16
        && crate::host::simd::CpuSimd::selected() == crate::host::simd::CpuSimd::Avx512
    {
        assert!(
            src.len().is_power_of_two(),
            "fwht length {} is not a power of two",
            src.len()
        );
        let s = 1.0 / (src.len() as f32).sqrt();
        // SAFETY: the selected level implies AVX-512F.
        unsafe { x86::fwht_avx512_into(src, dst, s) };
        return;
    }
    dst.copy_from_slice(src);
    nfwht(dst);
}

/// The AVX-512 transform: the first four stages inside each 16-lane register,
/// then up to four stages at a time across 16 registers (radix 16), each pass
/// one load and one store of every value. Every output is the same `u + v` or
/// `u − v` of the same inputs, stage by stage in the same order, as
/// [`fwht_scalar`].
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// Stages 1, 2, 4 and 8 of the 16 lanes of `v`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn in_register(v: __m512) -> __m512 {
        // Each stage: t = the partner lanes; the lower lane of a pair keeps
        // u + v (here t + v), the upper one u − v (here t − v): one
        // `fma(v, ±1, t)`, rounded once, exactly the sum or difference.
        let s1 = _mm512_setr_ps(
            1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0,
        );
        let s2 = _mm512_setr_ps(
            1.0, 1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0,
        );
        let s4 = _mm512_setr_ps(
            1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0,
        );
        let s8 = _mm512_setr_ps(
            1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0,
        );
        let v = _mm512_fmadd_ps(v, s1, _mm512_permute_ps::<0b10_11_00_01>(v));
        let v = _mm512_fmadd_ps(v, s2, _mm512_permute_ps::<0b01_00_11_10>(v));
        let v = _mm512_fmadd_ps(v, s4, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
        _mm512_fmadd_ps(v, s8, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v))
    }

    /// One pass: in every run of `stride · SPAN` registers, the `stride` sets
    /// of `SPAN` registers `stride` apart go through the stages of strides
    /// `stride .. stride · SPAN` (after [`in_register`] when `first`); register
    /// `i` (of 16 values at `16 · i`) comes from `load(i)` and goes to
    /// `store(i, v)`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pass<const SPAN: usize>(
        regs: usize,
        stride: usize,
        first: bool,
        load: &impl Fn(usize) -> __m512,
        store: &mut impl FnMut(usize, __m512),
    ) {
        for base in (0..regs).step_by(stride * SPAN) {
            for off in 0..stride {
                let at = |k: usize| base + off + k * stride;
                let mut r = [_mm512_setzero_ps(); SPAN];
                for (k, rk) in r.iter_mut().enumerate() {
                    *rk = load(at(k));
                    if first {
                        *rk = in_register(*rk);
                    }
                }
                let mut h = 1;
                while h < SPAN {
                    for k in 0..SPAN {
                        if k & h == 0 {
                            let (a, b) = (r[k], r[k + h]);
                            r[k] = _mm512_add_ps(a, b);
                            r[k + h] = _mm512_sub_ps(a, b);
                        }
                    }
                    h *= 2;
                }
                for (k, &rk) in r.iter().enumerate() {
                    store(at(k), rk);
                }
            }
        }
    }

    /// The transform of `16 · regs` values (a power of two ≥ 16), passes of up
    /// to four stages (radix 16): the first pass reads register `i` from
    /// `load(i)`, the last hands it to `store(i, v)` (untransformed by any
    /// scale), the passes between keep the values in `buf` (16 · regs floats,
    /// unused with one pass).
    ///
    /// # Safety
    /// The CPU has AVX-512F; `buf` holds `16 · regs` floats.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn fwht_hooked(
        regs: usize,
        buf: *mut f32,
        load: impl Fn(usize) -> __m512,
        mut store: impl FnMut(usize, __m512),
    ) {
        // The stride in registers at which the next stage pairs them.
        let mut stride = 1;
        loop {
            let span = (regs / stride).min(16);
            let first = stride == 1;
            let last = stride * span == regs;
            // SAFETY (every arm): `buf` holds the registers; the caller's
            // hooks stay inside their own buffers.
            let mid_load = |i: usize| unsafe { _mm512_loadu_ps(buf.add(16 * i)) };
            let mut mid_store =
                |i: usize, v: __m512| unsafe { _mm512_storeu_ps(buf.add(16 * i), v) };
            macro_rules! run {
                ($span:literal) => {
                    unsafe {
                        match (first, last) {
                            (true, true) => pass::<$span>(regs, stride, true, &load, &mut store),
                            (true, false) => {
                                pass::<$span>(regs, stride, true, &load, &mut mid_store)
                            }
                            (false, true) => {
                                pass::<$span>(regs, stride, false, &mid_load, &mut store)
                            }
                            (false, false) => {
                                pass::<$span>(regs, stride, false, &mid_load, &mut mid_store)
                            }
                        }
                    }
                };
            }
            match span {
                16 => run!(16),
                8 => run!(8),
                4 => run!(4),
                2 => run!(2),
                _ => run!(1),
            }
            if last {
                return;
            }
            stride *= span;
        }
    }

    /// `dst ← H·src · scale`, as [`fwht_avx512`] of a copy gives it; the
    /// lengths equal, a power of two ≥ 16.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fwht_avx512_into(src: &[f32], dst: &mut [f32], scale: f32) {
        let (p, d) = (src.as_ptr(), dst.as_mut_ptr());
        let s = _mm512_set1_ps(scale);
        // SAFETY: every register index is inside both slices (equal lengths).
        unsafe {
            fwht_hooked(
                dst.len() / 16,
                d,
                |i| _mm512_loadu_ps(p.add(16 * i)),
                |i, v| _mm512_storeu_ps(d.add(16 * i), _mm512_mul_ps(v, s)),
            )
        }
    }

    /// `x ← H·x`, then times `scale` when given; `x.len()` a power of two ≥ 16.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fwht_avx512(x: &mut [f32], scale: Option<f32>) {
        let p = x.as_mut_ptr();
        let s = _mm512_set1_ps(scale.unwrap_or(1.0));
        // SAFETY: every register index is inside `x`.
        unsafe {
            fwht_hooked(
                x.len() / 16,
                p,
                |i| _mm512_loadu_ps(p.add(16 * i)),
                |i, v| {
                    let v = if scale.is_some() {
                        _mm512_mul_ps(v, s)
                    } else {
                        v
                    };
                    _mm512_storeu_ps(p.add(16 * i), v)
                },
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive f64 `H_n · x` from the Sylvester definition: `H[i][j] = (-1)^popcount(i & j)`.
    fn hadamard_f64(x: &[f32]) -> Vec<f64> {
        let n = x.len();
        (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| {
                        let s = if (i & j).count_ones() % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        };
                        s * x[j] as f64
                    })
                    .sum()
            })
            .collect()
    }

    fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_naive_sylvester_matrix() {
        for n in [1usize, 2, 4, 8, 32, 128] {
            let x = pseudo_random(n, n as u64);
            let mut y = x.clone();
            fwht(&mut y);
            let want = hadamard_f64(&x);
            for (a, b) in y.iter().zip(&want) {
                assert!(
                    (*a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "n={n}: {a} vs {b}"
                );
            }
        }
    }

    /// The values' bit patterns (NaN-proof equality).
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn every_path_is_bit_identical_to_the_scalar_loops() {
        for n in [1usize, 2, 4, 8, 16, 32, 64, 128, 256, 2048, 4096, 1 << 16] {
            let x = pseudo_random(n, 99 + n as u64);
            let mut a = x.clone();
            let mut b = x.clone();
            fwht(&mut a);
            fwht_scalar(&mut b);
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "n = {n}"
            );
            #[cfg(target_arch = "x86_64")]
            if n >= 8 && std::arch::is_x86_feature_detected!("avx2") {
                let mut c = x.clone();
                // SAFETY: AVX2 detected, n a power of two >= 8.
                unsafe { fwht_avx2(&mut c) };
                assert!(c.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
            }
            #[cfg(target_arch = "x86_64")]
            if n >= 16 && std::arch::is_x86_feature_detected!("avx512f") {
                let mut c = x.clone();
                // SAFETY: AVX-512F detected, n a power of two >= 16.
                unsafe { x86::fwht_avx512(&mut c, None) };
                assert!(
                    c.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "n = {n}"
                );
                // With the scale folded into the last store: the scalar multiply.
                let mut c = x.clone();
                let s = 1.0 / (n as f32).sqrt();
                unsafe { x86::fwht_avx512(&mut c, Some(s)) };
                assert!(
                    c.iter()
                        .zip(&b)
                        .all(|(p, q)| p.to_bits() == (q * s).to_bits()),
                    "n = {n}"
                );
                // Reading the input from elsewhere: the same values as in place.
                let mut d = vec![f32::NAN; n];
                unsafe { x86::fwht_avx512_into(&x, &mut d, s) };
                assert_eq!(bits(&d), bits(&c), "into, n = {n}");
            }
            // The dispatching copy-free form, whatever this CPU runs.
            let mut d = vec![f32::NAN; n];
            nfwht_into(&x, &mut d);
            let mut e = x.clone();
            nfwht(&mut e);
            assert_eq!(bits(&d), bits(&e), "nfwht_into, n = {n}");
        }
    }

    #[test]
    fn twice_is_n_times_identity() {
        for n in [2usize, 16, 256, 2048] {
            let x = pseudo_random(n, 7 + n as u64);
            let mut y = x.clone();
            fwht(&mut y);
            fwht(&mut y);
            for (a, b) in y.iter().zip(&x) {
                assert!((a - n as f32 * b).abs() <= 1e-4 * n as f32, "n={n}");
            }
        }
    }

    #[test]
    fn normalised_is_orthonormal_and_involutive() {
        let n = 512;
        let x = pseudo_random(n, 3);
        let mut y = x.clone();
        nfwht(&mut y);
        let nx: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum();
        let ny: f64 = y.iter().map(|v| (*v as f64).powi(2)).sum();
        assert!(
            (nx - ny).abs() <= 1e-5 * nx,
            "norm not preserved: {nx} vs {ny}"
        );
        nfwht(&mut y);
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b).abs() <= 1e-5, "not an involution");
        }
        // Columns of H/sqrt(n) are orthonormal: transform two basis vectors and take dot products.
        for (i, j) in [(0usize, 0usize), (3, 3), (1, 5), (7, 100)] {
            let mut ei = vec![0.0f32; n];
            let mut ej = vec![0.0f32; n];
            ei[i] = 1.0;
            ej[j] = 1.0;
            nfwht(&mut ei);
            nfwht(&mut ej);
            let d: f64 = ei.iter().zip(&ej).map(|(a, b)| *a as f64 * *b as f64).sum();
            let want = if i == j { 1.0 } else { 0.0 };
            assert!((d - want).abs() < 1e-6, "<H e{i}, H e{j}> = {d}");
        }
    }
}
