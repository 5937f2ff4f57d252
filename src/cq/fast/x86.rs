//! The SIMD kernels: one generic chunk loop ([`tile`]) over a register
//! abstraction ([`Chunk`]) that is either one zmm or a pair of ymm.

use super::{FastInput, FastKernel, FastRows, CHUNK, LANES};
use std::arch::x86_64::*;
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Vnni {
    None,
    /// AVX-VNNI (VEX, 256-bit).
    Avx,
    /// AVX-512 VNNI with VL (EVEX, 256-bit).
    Avx512,
}

/// The 256-bit VNNI form this CPU has.
pub(super) fn vnni() -> Vnni {
    static V: OnceLock<Vnni> = OnceLock::new();
    *V.get_or_init(|| {
        if is_x86_feature_detected!("avxvnni") {
            Vnni::Avx
        } else if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
            Vnni::Avx512
        } else {
            Vnni::None
        }
    })
}

/// Whether this CPU runs the 512-bit VNNI kernel.
pub(super) fn vnni512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// A matrix's row geometry for the chunk loop.
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    groups: usize,
    row_bytes: usize,
    /// Rows (the outputs per input).
    rows: usize,
    /// Chunks per row (the last one may be partial).
    chunks: usize,
    /// Whole chunks per row.
    full: usize,
    /// Chunks per group (1 where a group is at most a chunk).
    chunks_per_group: usize,
    /// Groups per chunk (1 where a group is at least a chunk).
    groups_per_chunk: usize,
}

impl Geometry {
    pub(super) fn new(
        bits: u32,
        group: usize,
        groups: usize,
        row_bytes: usize,
        rows: usize,
    ) -> Self {
        let w = super::chunk_cols(bits);
        Geometry {
            groups,
            row_bytes,
            rows,
            chunks: row_bytes.div_ceil(CHUNK),
            full: row_bytes / CHUNK,
            chunks_per_group: (group / w).max(1),
            groups_per_chunk: (w / group).max(1),
        }
    }
}

/// One chunk's registers: 64 bytes (16 i32 lanes) and 16 f32 lanes.
trait Chunk {
    type I: Copy;
    type F: Copy;
    /// Whether [`Chunk::dot`] takes the biased (unsigned) table and starts
    /// from the input's lane bias.
    const BIASED: bool;
    unsafe fn table(t: &[u8; 16]) -> Self::I;
    unsafe fn load(p: *const u8) -> Self::I;
    unsafe fn load_i32(p: *const i32) -> Self::I;
    unsafe fn zero_i() -> Self::I;
    unsafe fn splat8(b: u8) -> Self::I;
    /// Every byte's high nibble in its low nibble (other bits: garbage).
    unsafe fn high_nibbles(v: Self::I) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    /// `table[idx]` per byte (idx < 16).
    unsafe fn lookup(table: Self::I, idx: Self::I) -> Self::I;
    /// `acc` plus, per i32 lane, the 4 products of the levels `l` and `q`.
    unsafe fn dot(acc: Self::I, l: Self::I, q: Self::I) -> Self::I;
    unsafe fn cvt(v: Self::I) -> Self::F;
    unsafe fn zero_f() -> Self::F;
    unsafe fn load_f(p: *const f32) -> Self::F;
    unsafe fn splat_f(p: *const f32) -> Self::F;
    /// The permutation that [`Chunk::spread_f`] takes for `gpc` groups a chunk.
    unsafe fn spread_index(gpc: usize) -> Self::I;
    /// The lane norms of a chunk with `gpc` > 1 groups from `p` (the first):
    /// lane λ gets `p[λ · gpc / 16]` (`idx` from [`Chunk::spread_index`]).
    unsafe fn spread_f(p: *const f32, gpc: usize, idx: Self::I) -> Self::F;
    unsafe fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn sum(v: Self::F) -> f32;
}

/// `sum8` of the lanes of `s` (module doc), in registers: the halves, then
/// the quarters, then the pairs.
#[inline(always)]
unsafe fn hsum8(s: __m256) -> f32 {
    unsafe {
        let t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
        _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
    }
}

/// 512 bits: one zmm per chunk, `vpdpbusd` (AVX-512 VNNI).
struct Z;

impl Chunk for Z {
    type I = __m512i;
    type F = __m512;
    const BIASED: bool = true;
    #[inline(always)]
    unsafe fn table(t: &[u8; 16]) -> __m512i {
        unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512i {
        unsafe { _mm512_loadu_si512(p as *const __m512i) }
    }
    #[inline(always)]
    unsafe fn load_i32(p: *const i32) -> __m512i {
        unsafe { _mm512_loadu_si512(p as *const __m512i) }
    }
    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn splat8(b: u8) -> __m512i {
        _mm512_set1_epi8(b as i8)
    }
    #[inline(always)]
    unsafe fn high_nibbles(v: __m512i) -> __m512i {
        _mm512_srli_epi16::<4>(v)
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        _mm512_and_si512(a, b)
    }
    #[inline(always)]
    unsafe fn lookup(table: __m512i, idx: __m512i) -> __m512i {
        _mm512_shuffle_epi8(table, idx)
    }
    #[inline(always)]
    unsafe fn dot(acc: __m512i, l: __m512i, q: __m512i) -> __m512i {
        _mm512_dpbusd_epi32(acc, l, q)
    }
    #[inline(always)]
    unsafe fn cvt(v: __m512i) -> __m512 {
        _mm512_cvtepi32_ps(v)
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn splat_f(p: *const f32) -> __m512 {
        unsafe { _mm512_set1_ps(*p) }
    }
    #[inline(always)]
    unsafe fn spread_index(gpc: usize) -> __m512i {
        let idx: [i32; LANES] = std::array::from_fn(|l| (l * gpc / LANES) as i32);
        unsafe { _mm512_loadu_si512(idx.as_ptr() as *const __m512i) }
    }
    #[inline(always)]
    unsafe fn spread_f(p: *const f32, _: usize, idx: __m512i) -> __m512 {
        unsafe { _mm512_permutexvar_ps(idx, _mm512_loadu_ps(p)) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn sum(v: __m512) -> f32 {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        unsafe { hsum8(_mm256_add_ps(lo, hi)) }
    }
}

/// 256 bits: a pair of ymm per chunk (lanes 0..8, 8..16), with the dot
/// product `D` ([`DOT_AVX2`], [`DOT_VEX`], [`DOT_EVEX`]).
struct Y<const D: u8>;

/// AVX2's sign trick: `vpmaddubsw(|l|, q·sign(l))` then `vpmaddwd` by ones (a
/// pair of products is at most 2·127·127: no saturation).
const DOT_AVX2: u8 = 0;
/// AVX-VNNI `vpdpbusd` (VEX).
const DOT_VEX: u8 = 1;
/// AVX-512 VNNI `vpdpbusd` on ymm (EVEX).
const DOT_EVEX: u8 = 2;

impl<const D: u8> Chunk for Y<D> {
    type I = (__m256i, __m256i);
    type F = (__m256, __m256);
    const BIASED: bool = D != DOT_AVX2;
    #[inline(always)]
    unsafe fn table(t: &[u8; 16]) -> Self::I {
        let v =
            unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i)) };
        (v, v)
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self::I {
        unsafe {
            (
                _mm256_loadu_si256(p as *const __m256i),
                _mm256_loadu_si256(p.add(32) as *const __m256i),
            )
        }
    }
    #[inline(always)]
    unsafe fn load_i32(p: *const i32) -> Self::I {
        unsafe { Self::load(p as *const u8) }
    }
    #[inline(always)]
    unsafe fn zero_i() -> Self::I {
        (_mm256_setzero_si256(), _mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn splat8(b: u8) -> Self::I {
        let v = _mm256_set1_epi8(b as i8);
        (v, v)
    }
    #[inline(always)]
    unsafe fn high_nibbles(v: Self::I) -> Self::I {
        (_mm256_srli_epi16::<4>(v.0), _mm256_srli_epi16::<4>(v.1))
    }
    #[inline(always)]
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I {
        (_mm256_and_si256(a.0, b.0), _mm256_and_si256(a.1, b.1))
    }
    #[inline(always)]
    unsafe fn lookup(table: Self::I, idx: Self::I) -> Self::I {
        (
            _mm256_shuffle_epi8(table.0, idx.0),
            _mm256_shuffle_epi8(table.1, idx.1),
        )
    }
    #[inline(always)]
    unsafe fn dot(acc: Self::I, l: Self::I, q: Self::I) -> Self::I {
        #[inline(always)]
        unsafe fn one<const D: u8>(acc: __m256i, l: __m256i, q: __m256i) -> __m256i {
            match D {
                DOT_AVX2 => {
                    let p = _mm256_maddubs_epi16(_mm256_abs_epi8(l), _mm256_sign_epi8(q, l));
                    _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
                }
                DOT_VEX => _mm256_dpbusd_avx_epi32(acc, l, q),
                _ => _mm256_dpbusd_epi32(acc, l, q),
            }
        }
        unsafe { (one::<D>(acc.0, l.0, q.0), one::<D>(acc.1, l.1, q.1)) }
    }
    #[inline(always)]
    unsafe fn cvt(v: Self::I) -> Self::F {
        (_mm256_cvtepi32_ps(v.0), _mm256_cvtepi32_ps(v.1))
    }
    #[inline(always)]
    unsafe fn zero_f() -> Self::F {
        (_mm256_setzero_ps(), _mm256_setzero_ps())
    }
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> Self::F {
        unsafe { (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }
    #[inline(always)]
    unsafe fn splat_f(p: *const f32) -> Self::F {
        let v = unsafe { _mm256_broadcast_ss(&*p) };
        (v, v)
    }
    #[inline(always)]
    unsafe fn spread_index(gpc: usize) -> Self::I {
        // Lanes 8.. start at group gpc / 2, with the same offsets.
        let idx: [i32; 8] = std::array::from_fn(|l| (l * gpc / LANES) as i32);
        let v = unsafe { _mm256_loadu_si256(idx.as_ptr() as *const __m256i) };
        (v, v)
    }
    #[inline(always)]
    unsafe fn spread_f(p: *const f32, gpc: usize, idx: Self::I) -> Self::F {
        unsafe {
            (
                _mm256_permutevar8x32_ps(_mm256_loadu_ps(p), idx.0),
                _mm256_permutevar8x32_ps(_mm256_loadu_ps(p.add(gpc / 2)), idx.1),
            )
        }
    }
    #[inline(always)]
    unsafe fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F {
        (
            _mm256_fmadd_ps(a.0, b.0, c.0),
            _mm256_fmadd_ps(a.1, b.1, c.1),
        )
    }
    #[inline(always)]
    unsafe fn sum(v: Self::F) -> f32 {
        unsafe { hsum8(_mm256_add_ps(v.0, v.1)) }
    }
}

/// Packed bytes of the rows that several inputs pass over together (half of
/// a 48 KiB L1, the rest for the inputs).
const ROW_BLOCK_BYTES: usize = 24 * 1024;

/// The matrix-wide operands of a call.
struct Shared<'a> {
    g: Geometry,
    rows: &'a [u8],
    nf: &'a [f32],
}

/// Rows `r0 .. r0 + R` against inputs `xs[t0 .. t0 + T]`: the module doc's
/// arithmetic, chunk by chunk; each chunk's planes are decoded once per row
/// for all `T` inputs. Returns `[R][T]` row values.
#[inline(always)]
unsafe fn tile<S: Chunk, const BITS: u32, const R: usize, const T: usize>(
    sh: &Shared,
    (table, spread): (S::I, S::I),
    r0: usize,
    xs: [&FastInput; T],
) -> [[f32; T]; R] {
    unsafe {
        let g = sh.g;
        let per = 8 / BITS as usize;
        let row = |r: usize| sh.rows.as_ptr().add((r0 + r) * g.row_bytes);
        // A partial last chunk is read from zero-padded copies.
        let mut tails = [[0u8; CHUNK]; R];
        if g.full < g.chunks {
            for (r, t) in tails.iter_mut().enumerate() {
                let n = g.row_bytes - g.full * CHUNK;
                std::ptr::copy_nonoverlapping(row(r).add(g.full * CHUNK), t.as_mut_ptr(), n);
            }
        }
        let mut acc = [[S::zero_f(); T]; R];
        let mut gacc = [[S::zero_f(); T]; R];
        // The group of the chunk's first lane, and the chunks to its end
        // (counted, not divided: this runs per chunk).
        let (mut group, mut left) = (0, g.chunks_per_group);
        for c in 0..g.chunks {
            let mut p = [[S::zero_i(); T]; R];
            if S::BIASED {
                for t in 0..T {
                    let b = S::load_i32(xs[t].bias.as_ptr().add(LANES * c));
                    for pr in p.iter_mut() {
                        pr[t] = b;
                    }
                }
            }
            // (Plain loops, not `array::from_fn`: its closures may stay
            // calls, and the intrinsics in them with them.)
            let mut v = [S::zero_i(); R];
            let mut hi = [S::zero_i(); R];
            for r in 0..R {
                v[r] = S::load(if c < g.full {
                    row(r).add(c * CHUNK)
                } else {
                    tails[r].as_ptr()
                });
                hi[r] = S::high_nibbles(v[r]);
            }
            for plane in 0..per {
                let shift = plane * BITS as usize;
                let mask = S::splat8((((1u32 << BITS) - 1) << (shift % 4)) as u8);
                let mut q = [S::zero_i(); T];
                for t in 0..T {
                    q[t] = S::load(xs[t].qp.as_ptr().add((c * per + plane) * CHUNK) as *const u8);
                }
                for (r, pr) in p.iter_mut().enumerate() {
                    let src = if shift < 4 { v[r] } else { hi[r] };
                    let l = S::lookup(table, S::and(src, mask));
                    for t in 0..T {
                        pr[t] = S::dot(pr[t], l, q[t]);
                    }
                }
            }
            for t in 0..T {
                let a = S::load_f(xs[t].lane_scales.as_ptr().add(LANES * c));
                for r in 0..R {
                    gacc[r][t] = S::fma(S::cvt(p[r][t]), a, gacc[r][t]);
                }
            }
            left -= 1;
            if left == 0 {
                for r in 0..R {
                    let at = sh.nf.as_ptr().add((r0 + r) * g.groups + group);
                    let nf = if g.groups_per_chunk == 1 {
                        S::splat_f(at)
                    } else {
                        S::spread_f(at, g.groups_per_chunk, spread)
                    };
                    for t in 0..T {
                        acc[r][t] = S::fma(gacc[r][t], nf, acc[r][t]);
                        gacc[r][t] = S::zero_f();
                    }
                }
                group += g.groups_per_chunk;
                left = g.chunks_per_group;
            }
        }
        let mut sums = [[0.0f32; T]; R];
        for r in 0..R {
            for t in 0..T {
                sums[r][t] = S::sum(acc[r][t]);
            }
        }
        sums
    }
}

/// All rows against all inputs: `RD` rows at a time for one input (decode),
/// `TP` inputs at a time for several (prefill), single tiles for the rest.
#[inline(always)]
unsafe fn drive<S: Chunk, const BITS: u32, const RD: usize, const TP: usize>(
    sh: &Shared,
    table: &[u8; 16],
    xs: &[FastInput],
    out: &impl Fn(usize, usize, f32),
) {
    unsafe {
        let table = (S::table(table), S::spread_index(sh.g.groups_per_chunk));
        let n = sh.g.rows;
        if xs.len() == 1 {
            let mut r = 0;
            while r + RD <= n {
                let v = tile::<S, BITS, RD, 1>(sh, table, r, [&xs[0]]);
                for (k, v) in v.iter().enumerate() {
                    out(0, r + k, v[0]);
                }
                r += RD;
            }
            for r in r..n {
                out(0, r, tile::<S, BITS, 1, 1>(sh, table, r, [&xs[0]])[0][0]);
            }
            return;
        }
        // Blocks of rows that stay in L1 while every group of inputs (whose
        // values stay in L1 across the block's rows) passes over them.
        let block = (ROW_BLOCK_BYTES / sh.g.row_bytes.max(1)).max(1);
        for rows in (0..n).step_by(block) {
            let rows = rows..(rows + block).min(n);
            let mut t = 0;
            while t + TP <= xs.len() {
                let mut group = [&xs[t]; TP];
                for (k, g) in group.iter_mut().enumerate() {
                    *g = &xs[t + k];
                }
                for r in rows.clone() {
                    let v = tile::<S, BITS, 1, TP>(sh, table, r, group);
                    for (k, &v) in v[0].iter().enumerate() {
                        out(t + k, r, v);
                    }
                }
                t += TP;
            }
            for (t, x) in xs.iter().enumerate().skip(t) {
                for r in rows.clone() {
                    out(t, r, tile::<S, BITS, 1, 1>(sh, table, r, [x])[0][0]);
                }
            }
        }
    }
}

/// One kernel's entry point per width, compiled with its features.
macro_rules! entry {
    ($name:ident, $features:literal, $chunk:ty, $rd:literal, $tp:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $name(
            bits: u32,
            sh: &Shared,
            f: &FastRows,
            xs: &[FastInput],
            out: &impl Fn(usize, usize, f32),
        ) {
            unsafe {
                let table = if <$chunk as Chunk>::BIASED {
                    &f.biased
                } else {
                    &*(&f.table as *const [i8; 16] as *const [u8; 16])
                };
                match bits {
                    4 => drive::<$chunk, 4, $rd, $tp>(sh, table, xs, out),
                    2 => drive::<$chunk, 2, $rd, $tp>(sh, table, xs, out),
                    _ => drive::<$chunk, 1, $rd, $tp>(sh, table, xs, out),
                }
            }
        }
    };
}
entry!(run_avx2, "avx2,fma", Y<DOT_AVX2>, 2, 2);
entry!(run_vex, "avx2,fma,avxvnni", Y<DOT_VEX>, 2, 2);
entry!(run_evex, "avx2,fma,avx512vnni,avx512vl", Y<DOT_EVEX>, 2, 2);
entry!(run_512, "avx512f,avx512bw,avx512vnni", Z, 4, 4);

/// `k` rows of `rows` (packed, consecutive) against every input of `xs`, one
/// fast dot each (module doc), handed to `out(t, i, value)`, with `kernel`.
///
/// # Safety
/// The CPU has `kernel`'s features ([`FastKernel::available`] lists it);
/// `nf` starts at the rows' first norm and runs to the zero padding.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_dot(
    kernel: FastKernel,
    bits: u32,
    g: Geometry,
    rows: &[u8],
    nf: &[f32],
    f: &FastRows,
    xs: &[FastInput],
    out: &impl Fn(usize, usize, f32),
) {
    debug_assert!(nf.len() >= g.rows * g.groups + LANES);
    let sh = Shared { g, rows, nf };
    unsafe {
        match (kernel, vnni()) {
            (FastKernel::Vnni512, _) => run_512(bits, &sh, f, xs, out),
            (FastKernel::Vnni, Vnni::Avx) => run_vex(bits, &sh, f, xs, out),
            (FastKernel::Vnni, Vnni::Avx512) => run_evex(bits, &sh, f, xs, out),
            _ => run_avx2(bits, &sh, f, xs, out),
        }
    }
}
