//! The int8 KV cache (SPEC §4.3 step 5): physical slots, per-vector quantization,
//! the cache itself ([`KvCache`]) and the view of one head that attention reads
//! ([`KvHeadView`]).

use crate::error::{Error, Result};
use crate::host::pool::{Pool, SharedSlice};

/// Physical cache row of logical position `t`: `t` inside the sink, else
/// `sink + (t − sink) mod window`.
///
/// # Panics
/// If `window == 0`.
pub fn physical_slot(t: u64, sink: usize, window: usize) -> usize {
    let sink64 = sink as u64;
    if t < sink64 {
        t as usize
    } else {
        sink + ((t - sink64) % window as u64) as usize
    }
}

/// Quantize `x` to int8 codes with one f32 scale: `scale = max(1e-12, max|x|) / 127`,
/// `code = clamp(round_half_to_even(x / scale), −127, 127)`. Returns the scale.
///
/// # Panics
/// If `codes.len() != x.len()`.
pub fn quantize_int8(x: &[f32], codes: &mut [i8]) -> f32 {
    assert_eq!(x.len(), codes.len());
    #[cfg(target_arch = "x86_64")]
    if crate::host::simd::CpuSimd::selected() != crate::host::simd::CpuSimd::Scalar {
        // SAFETY: the selected level implies AVX2.
        return unsafe { quantize_int8_avx2(x, codes) };
    }
    quantize_int8_scalar(x, codes)
}

/// [`quantize_int8`]'s scalar loop (the AVX2 one must equal it for every input).
#[doc(hidden)]
pub fn quantize_int8_scalar(x: &[f32], codes: &mut [i8]) -> f32 {
    assert_eq!(x.len(), codes.len());
    let max = x.iter().fold(1e-12f32, |m, v| m.max(v.abs()));
    let scale = max / 127.0;
    for (c, v) in codes.iter_mut().zip(x) {
        *c = (v / scale).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// [`quantize_int8`] eight values at a time: the same maximum (exact), the same
/// division, `roundps` to nearest-even (what `round_ties_even` does) and the same
/// clamp (a NaN stays NaN through it and converts to code 0, as `as i8` does).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_int8_avx2(x: &[f32], codes: &mut [i8]) -> f32 {
    use std::arch::x86_64::*;
    let n = x.len();
    let body = n / 8 * 8;
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut m = _mm256_set1_ps(1e-12);
    for c in x[..body].chunks_exact(8) {
        // SAFETY: 8 values.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        // max(a, b) returns b when either is NaN: NaNs are skipped, as f32::max does.
        m = _mm256_max_ps(_mm256_and_ps(v, abs), m);
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: 8 values.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let max = x[body..]
        .iter()
        .fold(lanes.iter().fold(1e-12f32, |a, &b| a.max(b)), |a, v| {
            a.max(v.abs())
        });
    let scale = max / 127.0;
    let (s, lo, hi) = (
        _mm256_set1_ps(scale),
        _mm256_set1_ps(-127.0),
        _mm256_set1_ps(127.0),
    );
    let mut q = [0i32; 8];
    for (c, o) in x[..body]
        .chunks_exact(8)
        .zip(codes[..body].chunks_exact_mut(8))
    {
        // SAFETY: 8 values in, 8 out.
        unsafe {
            let v = _mm256_div_ps(_mm256_loadu_ps(c.as_ptr()), s);
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            // Operand order keeps a NaN: max/min return the second operand on NaN.
            let r = _mm256_min_ps(hi, _mm256_max_ps(lo, r));
            _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, _mm256_cvtps_epi32(r));
        }
        for (o, &v) in o.iter_mut().zip(&q) {
            // cvtps of NaN is i32::MIN, whose low byte is 0: code 0, as `as i8` gives.
            *o = v as i8;
        }
    }
    for (o, v) in codes[body..].iter_mut().zip(&x[body..]) {
        *o = (v / scale).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// The logical positions attended at position `t` (SPEC §4.3): the sink prefix
/// `p < min(sink, t+1)` followed by the window `max(sink, t−window+1) ..= t`,
/// as two ascending ranges (the second may be empty).
pub fn attended_ranges(t: u64, sink: usize, window: usize) -> [std::ops::Range<u64>; 2] {
    let sink64 = sink as u64;
    let first = 0..sink64.min(t + 1);
    let lo = sink64.max((t + 1).saturating_sub(window as u64));
    [first, lo..t + 1]
}

/// The physical cache rows attended at position `t`, in the order attention
/// visits them: [`attended_ranges`] mapped through [`physical_slot`], into `out`
/// (cleared first). The positions the GPU `attend` entry point derives from
/// `t = step[1]` (shaders/attention.wgsl).
pub fn attended_slots(t: u64, sink: usize, window: usize, out: &mut Vec<usize>) {
    out.clear();
    for range in attended_ranges(t, sink, window) {
        out.extend(range.map(|p| physical_slot(p, sink, window)));
    }
}

/// The int8 KV cache of SPEC §4.3 step 5 on the CPU (the twin of
/// `crate::gpu::kernels::attention::KvBuffers`, with unpacked codes): per
/// `(layer, kv_head, row)` one key and one value of `head_dim` int8 codes, each
/// with an f32 scale. Codes are `[layers, kv_heads, rows, head_dim]`, scales
/// `[layers, kv_heads, rows]`.
#[derive(Debug, Default, Clone)]
pub struct KvCache {
    /// Layers.
    pub layers: usize,
    /// KV heads per layer.
    pub kv_heads: usize,
    /// Physical rows per (layer, KV head).
    pub rows: usize,
    /// Elements per head vector.
    pub head_dim: usize,
    /// Key codes.
    pub k_codes: Vec<i8>,
    /// Value codes.
    pub v_codes: Vec<i8>,
    /// Key scales.
    pub k_scale: Vec<f32>,
    /// Value scales.
    pub v_scale: Vec<f32>,
}

impl KvCache {
    /// A zero-filled cache.
    ///
    /// # Errors
    /// [`Error::Alloc`] if its size overflows or it can't be allocated.
    pub fn new(layers: usize, kv_heads: usize, rows: usize, head_dim: usize) -> Result<KvCache> {
        let mut c = KvCache::default();
        c.reshape(layers, kv_heads, rows, head_dim)?;
        Ok(c)
    }

    /// Take the shape `[layers, kv_heads, rows, head_dim]`, growing the buffers
    /// when needed (never shrinking them; contents are unspecified afterwards,
    /// as the rows are reinterpreted).
    ///
    /// # Errors
    /// [`Error::Alloc`] if the size overflows or can't be allocated.
    pub fn reshape(
        &mut self,
        layers: usize,
        kv_heads: usize,
        rows: usize,
        head_dim: usize,
    ) -> Result<()> {
        let too_big = || Error::Alloc {
            what: "KV cache".into(),
            bytes: u64::MAX,
        };
        let cells = layers
            .checked_mul(kv_heads)
            .and_then(|n| n.checked_mul(rows))
            .ok_or_else(too_big)?;
        let codes = cells.checked_mul(head_dim).ok_or_else(too_big)?;
        grow(&mut self.k_codes, codes, "KV cache keys")?;
        grow(&mut self.v_codes, codes, "KV cache values")?;
        grow(&mut self.k_scale, cells, "KV cache key scales")?;
        grow(&mut self.v_scale, cells, "KV cache value scales")?;
        (self.layers, self.kv_heads, self.rows, self.head_dim) = (layers, kv_heads, rows, head_dim);
        Ok(())
    }

    /// Index of row 0 of `(layer, j)` among all `(layer, kv_head, row)` cells.
    #[inline]
    pub fn base(&self, layer: usize, j: usize) -> usize {
        (layer * self.kv_heads + j) * self.rows
    }

    /// Read-only view of layer `layer`, KV head `j`.
    ///
    /// # Panics
    /// If `layer` or `j` is out of the cache.
    pub fn head(&self, layer: usize, j: usize) -> KvHeadView<'_> {
        let (base, hd, rows) = (self.base(layer, j), self.head_dim, self.rows);
        KvHeadView {
            k: &self.k_codes[base * hd..(base + rows) * hd],
            v: &self.v_codes[base * hd..(base + rows) * hd],
            k_scale: &self.k_scale[base..base + rows],
            v_scale: &self.v_scale[base..base + rows],
            wide: None,
        }
    }

    /// Quantize (SPEC §4.3: [`quantize_int8`]) the key and value of every KV head
    /// of one position (`k`, `v`: `kv_heads · head_dim`) into row `row` of `layer`.
    ///
    /// # Panics
    /// If the lengths disagree or `layer`/`row` is out of the cache.
    pub fn store(&mut self, layer: usize, row: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        for j in 0..self.kv_heads {
            let cell = self.base(layer, j) + row;
            let codes = cell * hd..(cell + 1) * hd;
            self.k_scale[cell] =
                quantize_int8(&k[j * hd..(j + 1) * hd], &mut self.k_codes[codes.clone()]);
            self.v_scale[cell] = quantize_int8(&v[j * hd..(j + 1) * hd], &mut self.v_codes[codes]);
        }
    }

    /// [`KvCache::store`] of several positions of `layer` at once: position
    /// `t`'s keys and values (`k`, `v`: `[slots.len(), kv_heads · head_dim]`) at
    /// row `slots[t]`, the positions split over the CPU pool when there are
    /// enough. The same values as storing them one by one, in any order.
    ///
    /// # Panics
    /// If the slots are not a rotation of an ascending run (a chunk's
    /// positions in a ring are: they are then distinct), a slot or the layer
    /// is out of the cache, or the lengths disagree.
    pub fn store_rows(&mut self, layer: usize, slots: &[usize], k: &[f32], v: &[f32]) {
        let (hd, kvh) = (self.head_dim, self.kv_heads);
        let w = kvh * hd;
        assert!(
            k.len() == slots.len() * w && v.len() == slots.len() * w,
            "store_rows: lengths"
        );
        assert!(
            layer < self.layers && slots.iter().all(|&r| r < self.rows),
            "store_rows: out of the cache"
        );
        let descents = slots.windows(2).filter(|p| p[1] <= p[0]).count();
        let rotated = descents == 1 && slots.last() < slots.first();
        assert!(descents == 0 || rotated, "store_rows: slots not distinct");
        let base = self.base(layer, 0);
        let head = self.rows;
        let (kc, vc) = (
            SharedSlice::new(&mut self.k_codes),
            SharedSlice::new(&mut self.v_codes),
        );
        let (ks, vs) = (
            SharedSlice::new(&mut self.k_scale),
            SharedSlice::new(&mut self.v_scale),
        );
        let store = |t: usize| {
            for j in 0..kvh {
                let cell = base + j * head + slots[t];
                let x = t * w + j * hd..t * w + (j + 1) * hd;
                // SAFETY: distinct slots are distinct cells, so no two
                // positions touch the same codes or scales.
                unsafe {
                    ks.set(
                        cell,
                        quantize_int8(&k[x.clone()], kc.range(cell * hd..(cell + 1) * hd)),
                    );
                    vs.set(
                        cell,
                        quantize_int8(&v[x], vc.range(cell * hd..(cell + 1) * hd)),
                    );
                }
            }
        };
        let pool = Pool::global();
        // About 1 µs a position: worth splitting from a few positions on.
        if slots.len() < 8 || pool.threads() == 1 {
            (0..slots.len()).for_each(store);
        } else {
            pool.for_ranges(slots.len(), 1, &|r| r.for_each(store));
        }
    }

    /// Copy cell `src` of `from` (codes and scales) to cell `dst` of `self`
    /// (cells index `(layer, kv_head, row)`, see [`KvCache::base`]); `count`
    /// consecutive cells.
    ///
    /// # Panics
    /// If the head dims differ or a range is out of either cache.
    pub fn copy_cells(&mut self, dst: usize, from: &KvCache, src: usize, count: usize) {
        let hd = self.head_dim;
        assert_eq!(hd, from.head_dim, "copy_cells: head_dim");
        self.k_codes[dst * hd..(dst + count) * hd]
            .copy_from_slice(&from.k_codes[src * hd..(src + count) * hd]);
        self.v_codes[dst * hd..(dst + count) * hd]
            .copy_from_slice(&from.v_codes[src * hd..(src + count) * hd]);
        self.k_scale[dst..dst + count].copy_from_slice(&from.k_scale[src..src + count]);
        self.v_scale[dst..dst + count].copy_from_slice(&from.v_scale[src..src + count]);
    }
}

/// Read-only view of one layer and KV head of the cache.
pub struct KvHeadView<'a> {
    /// `[rows, head_dim]` key codes.
    pub k: &'a [i8],
    /// `[rows, head_dim]` value codes.
    pub v: &'a [i8],
    /// `[rows]` key scales.
    pub k_scale: &'a [f32],
    /// `[rows]` value scales.
    pub v_scale: &'a [f32],
    /// The first rows widened to f32 ([`KvHeadView::widen_into`]) when many
    /// queries read them (a prefill chunk's tokens): the AVX-512 kernel then
    /// loads them instead of converting the codes at every read, with the
    /// same values and so the same bits.
    pub wide: Option<WideRows<'a>>,
}

/// A head's first rows widened to f32 ([`KvHeadView::widen_into`]): `k` the
/// key codes as f32 and `v` the values dequantized (`Vscale[p] · Vcode[p, d]`,
/// the product the kernel forms), `[rows, head_dim]` each.
#[derive(Debug, Clone, Copy)]
pub struct WideRows<'a> {
    /// Key codes as f32.
    pub k: &'a [f32],
    /// Dequantized values.
    pub v: &'a [f32],
}

impl KvHeadView<'_> {
    /// The first `k.len() / head_dim` rows widened into `k` and `v`
    /// ([`WideRows`]'s contents).
    ///
    /// # Panics
    /// If `k` and `v` differ in length, are not whole rows or hold more rows
    /// than the view.
    pub fn widen_into(&self, head_dim: usize, k: &mut [f32], v: &mut [f32]) {
        assert!(
            k.len() == v.len()
                && k.len() <= self.k.len()
                && head_dim > 0
                && k.len().is_multiple_of(head_dim),
            "widen_into: lengths"
        );
        let n = k.len();
        widen_rows(&self.k[..n], &self.v[..n], self.v_scale, head_dim, k, v);
    }
}

crate::host::simd::simd_fn! {
    /// [`KvHeadView::widen_into`]'s loops: `kw = kc as f32`, `vw = vc as f32 ·
    /// v_scale[row]`, rows of `d`.
    fn widen_rows(kc: &[i8], vc: &[i8], v_scale: &[f32], d: usize, kw: &mut [f32], vw: &mut [f32]) {
        for (w, &c) in kw.iter_mut().zip(kc) {
            *w = c as f32;
        }
        for ((vr, cr), &scale) in vw.chunks_exact_mut(d).zip(vc.chunks_exact(d)).zip(v_scale) {
            for (w, &c) in vr.iter_mut().zip(cr) {
                *w = c as f32 * scale;
            }
        }
    }
}

/// Make `v` at least `n` values long (new ones zero; never shrinks), reporting
/// an allocation failure as an error.
///
/// # Errors
/// [`Error::Alloc`] naming `what`.
pub(crate) fn grow<T: Clone + Default>(v: &mut Vec<T>, n: usize, what: &str) -> Result<()> {
    if v.len() < n {
        v.try_reserve_exact(n - v.len()).map_err(|_| Error::Alloc {
            what: what.to_string(),
            bytes: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        })?;
        v.resize(n, T::default());
    }
    Ok(())
}
