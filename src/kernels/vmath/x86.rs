//! One implementation of each function for both register widths: the
//! [`Lanes`] trait gives the operations, [`exp`], [`ln`] and [`sigmoid`]
//! are written once over it, so the 8- and 16-lane forms do the same
//! operations lane by lane (the same bits, by construction).

use std::arch::x86_64::*;

mod lanes;
pub(crate) use lanes::Lanes;

/// `exp` of every lane: the Cephes single-precision scheme (module note of
/// [`super`]): `n = round(x·log2 e)`, `r = x − n·ln 2` in two parts, a
/// degree-6 polynomial, times `2ⁿ`; `+∞` above 88.72, 0 below −103.97, the
/// scalar `exp` between the clamp and those edges, NaN for NaN.
#[inline(always)]
pub(crate) unsafe fn exp<V: Lanes>(x: V) -> V {
    unsafe {
        // Clamp to where 2ⁿ stays a normal float; the edges are patched below.
        let xc = x.max(V::splat(-87.336_55)).min(V::splat(88.376_26));
        let n = xc.mul(V::splat(std::f32::consts::LOG2_E)).round();
        let r = n.fnma(V::splat(0.693_359_4), xc);
        let r = n.fnma(V::splat(-2.121_944_4e-4), r);
        let mut y = V::splat(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            y = y.fma(r, V::splat(c));
        }
        let y = y.fma(r.mul(r), r.add(V::splat(1.0)));
        let mut out = y.mul(n.pow2());
        let outside = V::or(xc.lt(x), x.lt(xc));
        if V::any(outside) {
            // Rare (|x| > 87): the scalar exp there.
            let mut lanes = [0.0f32; 16];
            x.store(lanes.as_mut_ptr());
            lanes[..V::N].iter_mut().for_each(|v| *v = v.exp());
            out = V::select(outside, out, V::load(lanes.as_ptr()));
        }
        let out = V::select(x.gt(V::splat(88.722_84)), out, V::splat(f32::INFINITY));
        let out = V::select(x.lt(V::splat(-103.972_08)), out, V::splat(0.0));
        V::select(x.nan(), out, x)
    }
}

/// `σ(x) = 1 / (1 + exp(−x))` of every lane.
#[inline(always)]
pub(crate) unsafe fn sigmoid<V: Lanes>(x: V) -> V {
    unsafe {
        let one = V::splat(1.0);
        one.div(one.add(exp(V::splat(0.0).sub(x))))
    }
}

/// The coefficients of the Cephes `logf` polynomial, highest first.
const LN_POLY: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_5e-1,
    -2.499_999_4e-1,
    0.333_333_3,
];

/// `ln` of every lane: `x = m · 2^e` with `m` in `[√½, √2)` (subnormals
/// scaled by 2²³ first), `ln x = e·ln 2 + ln m` by the Cephes polynomial;
/// `−∞` at 0, NaN below 0 and for NaN, `+∞` at `+∞`.
#[inline(always)]
pub(crate) unsafe fn ln<V: Lanes>(x: V) -> V {
    unsafe {
        let tiny = x.lt(V::splat(f32::MIN_POSITIVE));
        let xs = V::select(tiny, x, x.mul(V::splat(8_388_608.0)));
        let e = xs.exponent();
        let e = V::select(tiny, e, e.sub(V::splat(23.0)));
        // The mantissa in [0.5, 1).
        let m = xs.bits_and_or(0x007f_ffff, 0x3f00_0000);
        let small = m.lt(V::splat(std::f32::consts::FRAC_1_SQRT_2));
        let e = V::select(small, e, e.sub(V::splat(1.0)));
        let m = V::select(small, m, m.add(m)).sub(V::splat(1.0));
        let z = m.mul(m);
        let mut y = V::splat(LN_POLY[0]);
        for &c in &LN_POLY[1..] {
            y = y.fma(m, V::splat(c));
        }
        let y = y.mul(m).mul(z);
        let y = e.fma(V::splat(-2.121_944_4e-4), y);
        let y = V::splat(0.5).fnma(z, y);
        let r = e.fma(V::splat(0.693_359_4), m.add(y));
        let r = V::select(x.eq(V::splat(0.0)), r, V::splat(f32::NEG_INFINITY));
        let r = V::select(x.nge(V::splat(0.0)), r, V::splat(f32::NAN));
        V::select(x.eq(V::splat(f32::INFINITY)), r, x)
    }
}

/// [`sigmoid`] of 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn sigmoid16(x: __m512) -> __m512 {
    unsafe { sigmoid(x) }
}

/// `x ← f(x)` for every value, `V::N` at a time, the tail through a
/// register padded with `pad` (the same lane arithmetic).
#[inline(always)]
unsafe fn map<V: Lanes>(x: &mut [f32], pad: f32, f: impl Fn(V) -> V) {
    let n = x.len() / V::N * V::N;
    let p = x.as_mut_ptr();
    for i in (0..n).step_by(V::N) {
        // SAFETY: V::N values at i < n.
        unsafe { f(V::load(p.add(i))).store(p.add(i)) };
    }
    let tail = &mut x[n..];
    if !tail.is_empty() {
        let mut lanes = [pad; 16];
        lanes[..tail.len()].copy_from_slice(tail);
        // SAFETY: `lanes` holds 16 ≥ V::N values.
        unsafe { f(V::load(lanes.as_ptr())).store(lanes.as_mut_ptr()) };
        let k = tail.len();
        tail.copy_from_slice(&lanes[..k]);
    }
}

/// `z[i] ← f(d[i], z[i])` for every value, as [`map`].
#[inline(always)]
unsafe fn zip_map<V: Lanes>(z: &mut [f32], d: &[f32], f: impl Fn(V, V) -> V) {
    let n = z.len() / V::N * V::N;
    let p = z.as_mut_ptr();
    for i in (0..n).step_by(V::N) {
        // SAFETY: V::N values at i < n in both.
        unsafe { f(V::load(d.as_ptr().add(i)), V::load(p.add(i))).store(p.add(i)) };
    }
    let k = z.len() - n;
    if k > 0 {
        let (mut a, mut b) = ([0.0f32; 16], [0.0f32; 16]);
        a[..k].copy_from_slice(&d[n..]);
        b[..k].copy_from_slice(&z[n..]);
        // SAFETY: 16 ≥ V::N values each.
        unsafe { f(V::load(a.as_ptr()), V::load(b.as_ptr())).store(b.as_mut_ptr()) };
        z[n..].copy_from_slice(&b[..k]);
    }
}

/// `x[i] ← exp(x[i])`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_slice(x: &mut [f32]) {
    unsafe { map(x, 0.0, |v: __m256| exp(v)) }
}

/// `x[i] ← exp(x[i])`, 16 lanes at a time.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn exp_slice_512(x: &mut [f32]) {
    unsafe { map(x, 0.0, |v: __m512| exp(v)) }
}

/// `x[i] ← ln(x[i])`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn ln_slice(x: &mut [f32]) {
    unsafe { map(x, 1.0, |v: __m256| ln(v)) }
}

/// `x[i] ← ln(x[i])`, 16 lanes at a time.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn ln_slice_512(x: &mut [f32]) {
    unsafe { map(x, 1.0, |v: __m512| ln(v)) }
}

/// `z[i] ← silu(d[i] · z[i])`; `d.len() == z.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn silu_of_product(z: &mut [f32], d: &[f32]) {
    unsafe {
        zip_map(z, d, |d: __m256, z| {
            let v = d.mul(z);
            v.mul(sigmoid(v))
        })
    }
}

/// `z[i] ← silu(d[i] · z[i])`, 16 lanes at a time.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn silu_of_product_512(z: &mut [f32], d: &[f32]) {
    unsafe {
        zip_map(z, d, |d: __m512, z| {
            let v = d.mul(z);
            v.mul(sigmoid(v))
        })
    }
}

/// `o[i] ← o[i] · σ(g[i])`; `g.len() == o.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gate(o: &mut [f32], g: &[f32]) {
    unsafe { zip_map(o, g, |g: __m256, o| o.mul(sigmoid(g))) }
}

/// `o[i] ← o[i] · σ(g[i])`, 16 lanes at a time.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn gate_512(o: &mut [f32], g: &[f32]) {
    unsafe { zip_map(o, g, |g: __m512, o| o.mul(sigmoid(g))) }
}
