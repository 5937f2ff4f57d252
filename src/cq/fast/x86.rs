//! The SIMD kernels: one generic tile loop ([`tile`]) over a register
//! abstraction ([`Reg`]) that holds either the 16 rows of a tile (zmm) or half
//! of them (ymm); the 512-bit kernel's form over eight inputs packed
//! block-interleaved, where a call is large enough to repay the packing, is in
//! [`packed`]. The input quantization on AVX-512 and AVX2 is in [`quantize`].

use super::{FastInput, FastKernel, FastMatrix, Sink, BLOCK, LINE, TILE};
use std::arch::x86_64::*;
use std::ops::Range;
use std::sync::OnceLock;

mod packed;
mod quantize;
pub(super) use quantize::quantize;

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

/// Whether this CPU runs the 512-bit VNNI kernel (and its 256-bit form for
/// a last tile of few rows).
pub(super) fn vnni512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vl")
}

/// The registers of one row set: [`Reg::ROWS`] rows' 32-bit words (integers)
/// or their f32 sums.
trait Reg {
    type I: Copy;
    type F: Copy;
    /// Rows per register.
    const ROWS: usize;
    /// Whether [`Reg::dot`] takes the biased (unsigned) table and a block's
    /// sum starts from the input's bias.
    const BIASED: bool;
    /// The lookup tables of the register's quads (`ROWS / 4` × 16 bytes).
    unsafe fn table(p: *const u8) -> Self::I;
    /// `ROWS` 32-bit words.
    unsafe fn load(p: *const u8) -> Self::I;
    /// The 32-bit word at `p` in every lane.
    unsafe fn bcast(p: *const i8) -> Self::I;
    unsafe fn splat_i(v: i32) -> Self::I;
    unsafe fn zero_i() -> Self::I;
    unsafe fn splat8(b: u8) -> Self::I;
    /// Every byte's high nibble in its low nibble (other bits: garbage).
    unsafe fn high_nibbles(v: Self::I) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    /// `table[idx]` per byte (idx < 16, the table of the byte's 128-bit lane).
    unsafe fn lookup(table: Self::I, idx: Self::I) -> Self::I;
    /// `acc` plus, per 32-bit lane, the 4 products of the levels `l` and `q`.
    unsafe fn dot(acc: Self::I, l: Self::I, q: Self::I) -> Self::I;
    unsafe fn cvt(v: Self::I) -> Self::F;
    unsafe fn zero_f() -> Self::F;
    unsafe fn load_f(p: *const f32) -> Self::F;
    unsafe fn splat_f(v: f32) -> Self::F;
    unsafe fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn store_f(p: *mut f32, v: Self::F);
}

/// 512 bits: a whole tile, `vpdpbusd` (AVX-512 VNNI).
struct Z;

impl Reg for Z {
    type I = __m512i;
    type F = __m512;
    const ROWS: usize = 16;
    const BIASED: bool = true;
    #[inline(always)]
    unsafe fn table(p: *const u8) -> __m512i {
        unsafe { _mm512_loadu_si512(p as *const __m512i) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512i {
        unsafe { _mm512_loadu_si512(p as *const __m512i) }
    }
    #[inline(always)]
    unsafe fn bcast(p: *const i8) -> __m512i {
        unsafe { _mm512_set1_epi32((p as *const i32).read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn splat_i(v: i32) -> __m512i {
        _mm512_set1_epi32(v)
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
    unsafe fn splat_f(v: f32) -> __m512 {
        _mm512_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: __m512) {
        unsafe { _mm512_storeu_ps(p, v) }
    }
}

/// 256 bits: half a tile, with the dot product `D` ([`DOT_AVX2`],
/// [`DOT_VEX`], [`DOT_EVEX`]).
struct Y<const D: u8>;

/// AVX2's sign trick: `vpmaddubsw(|l|, q·sign(l))` then `vpmaddwd` by ones (a
/// pair of products is at most 2·127·127: no saturation).
const DOT_AVX2: u8 = 0;
/// AVX-VNNI `vpdpbusd` (VEX).
const DOT_VEX: u8 = 1;
/// AVX-512 VNNI `vpdpbusd` on ymm (EVEX).
const DOT_EVEX: u8 = 2;

impl<const D: u8> Reg for Y<D> {
    type I = __m256i;
    type F = __m256;
    const ROWS: usize = 8;
    const BIASED: bool = D != DOT_AVX2;
    #[inline(always)]
    unsafe fn table(p: *const u8) -> __m256i {
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m256i {
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }
    #[inline(always)]
    unsafe fn bcast(p: *const i8) -> __m256i {
        unsafe { _mm256_set1_epi32((p as *const i32).read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn splat_i(v: i32) -> __m256i {
        _mm256_set1_epi32(v)
    }
    #[inline(always)]
    unsafe fn zero_i() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn splat8(b: u8) -> __m256i {
        _mm256_set1_epi8(b as i8)
    }
    #[inline(always)]
    unsafe fn high_nibbles(v: __m256i) -> __m256i {
        _mm256_srli_epi16::<4>(v)
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        _mm256_and_si256(a, b)
    }
    #[inline(always)]
    unsafe fn lookup(table: __m256i, idx: __m256i) -> __m256i {
        _mm256_shuffle_epi8(table, idx)
    }
    #[inline(always)]
    unsafe fn dot(acc: __m256i, l: __m256i, q: __m256i) -> __m256i {
        match D {
            DOT_AVX2 => {
                let p = _mm256_maddubs_epi16(_mm256_abs_epi8(l), _mm256_sign_epi8(q, l));
                _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
            }
            DOT_VEX => _mm256_dpbusd_avx_epi32(acc, l, q),
            _ => _mm256_dpbusd_epi32(acc, l, q),
        }
    }
    #[inline(always)]
    unsafe fn cvt(v: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(v)
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: __m256) {
        unsafe { _mm256_storeu_ps(p, v) }
    }
}

/// The rows `R::ROWS · half ..` of tile `tile` against the inputs `xs`: the
/// module doc's arithmetic, block by block, each plane looked up once for all
/// `T` inputs. Returns each input's `R::ROWS` row values in `out[t]`. (Plain
/// index loops: closures of iterator adapters may stay calls, and the
/// intrinsics in them with them.)
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn tile<R: Reg, const BITS: u32, const T: usize>(
    fm: &FastMatrix,
    tile: usize,
    half: usize,
    xs: [&FastInput; T],
    out: &mut [[f32; TILE]; T],
) {
    unsafe {
        let b = BITS as usize;
        let per = 8 / b;
        let lanes = half * R::ROWS;
        let table = if R::BIASED {
            R::table(fm.biased[tile].as_ptr().add(4 * lanes))
        } else {
            R::table(fm.tables[tile].as_ptr().add(4 * lanes) as *const u8)
        };
        let mut mask = [R::zero_i(); 8];
        for (p, m) in mask.iter_mut().enumerate().take(per) {
            *m = R::splat8((((1u32 << BITS) - 1) << ((p * b) % 4)) as u8);
        }
        let data = fm
            .data
            .as_ptr()
            .add(tile * fm.blocks * b * LINE + 4 * lanes);
        let nf = fm.nf.as_ptr().add(tile * fm.groups * TILE + lanes);
        let per_group = fm.group / BLOCK;
        let mut acc = [R::zero_f(); T];
        let mut blk = 0;
        for g in 0..fm.groups {
            let mut s = [R::zero_f(); T];
            for _ in 0..per_group {
                let mut p = [R::zero_i(); T];
                if R::BIASED {
                    for t in 0..T {
                        p[t] = R::splat_i(*xs[t].bias.get_unchecked(blk));
                    }
                }
                for k in 0..b {
                    let v = R::load(data.add((blk * b + k) * LINE));
                    let hi = R::high_nibbles(v);
                    for plane in 0..per {
                        let shift = plane * b;
                        let src = if shift < 4 { v } else { hi };
                        let l = R::lookup(table, R::and(src, mask[plane]));
                        let col = blk * BLOCK + 4 * (k * per + plane);
                        for t in 0..T {
                            p[t] = R::dot(p[t], l, R::bcast(xs[t].q.as_ptr().add(col)));
                        }
                    }
                }
                for t in 0..T {
                    let a = R::splat_f(*xs[t].scales.get_unchecked(blk));
                    s[t] = R::fma(R::cvt(p[t]), a, s[t]);
                }
                blk += 1;
            }
            let n = R::load_f(nf.add(g * TILE));
            for t in 0..T {
                acc[t] = R::fma(s[t], n, acc[t]);
            }
        }
        for t in 0..T {
            R::store_f(out[t].as_mut_ptr().add(lanes), acc[t]);
        }
    }
}

/// The halves (`R::ROWS` rows each) of tile `tl` that hold rows of the
/// matrix: all but in a last tile of few rows, whose other lanes stay 0
/// (the padding rows no output keeps).
#[inline(always)]
fn live_halves<R: Reg>(fm: &FastMatrix, tl: usize) -> usize {
    (fm.rows - (tl * TILE).min(fm.rows))
        .min(TILE)
        .div_ceil(R::ROWS)
}

/// Tiles `tiles` against every input of `xs`, `TP` inputs at a time (then
/// the rest one by one), each tile's rows handed to `sink`.
#[inline(always)]
unsafe fn drive<R: Reg, const BITS: u32, const TP: usize>(
    fm: &FastMatrix,
    tiles: Range<usize>,
    xs: &[FastInput],
    sink: &Sink,
) {
    unsafe {
        for tl in tiles {
            let halves = live_halves::<R>(fm, tl);
            let mut t = 0;
            while t + TP <= xs.len() {
                let group: [&FastInput; TP] = std::array::from_fn(|k| &xs[t + k]);
                let mut v = [[0.0f32; TILE]; TP];
                for half in 0..halves {
                    tile::<R, BITS, TP>(fm, tl, half, group, &mut v);
                }
                for (k, v) in v.iter().enumerate() {
                    sink.put(tl, t + k, v);
                }
                t += TP;
            }
            rests::<R, BITS, TP>(fm, tl, xs, t, sink);
        }
    }
}

/// Tile `tl` against the inputs `t ..` of `xs` after the last full pass of
/// `TP` (a few inputs: small chunks, batched decode): 4, 2, then 1 at a time,
/// each tile line still decoded once for several.
#[inline(always)]
unsafe fn rests<R: Reg, const BITS: u32, const TP: usize>(
    fm: &FastMatrix,
    tl: usize,
    xs: &[FastInput],
    mut t: usize,
    sink: &Sink,
) {
    unsafe {
        if TP > 4 && t + 4 <= xs.len() {
            rest::<R, BITS, 4>(fm, tl, &xs[t..t + 4], t, sink);
            t += 4;
        }
        if TP > 2 && t + 2 <= xs.len() {
            rest::<R, BITS, 2>(fm, tl, &xs[t..t + 2], t, sink);
            t += 2;
        }
        for (t, x) in xs.iter().enumerate().skip(t) {
            rest::<R, BITS, 1>(fm, tl, std::slice::from_ref(x), t, sink);
        }
    }
}

/// Tile `tl` against the `T` inputs `xs` (inputs `t0 ..` of the call) into
/// `sink`.
#[inline(always)]
unsafe fn rest<R: Reg, const BITS: u32, const T: usize>(
    fm: &FastMatrix,
    tl: usize,
    xs: &[FastInput],
    t0: usize,
    sink: &Sink,
) {
    unsafe {
        let group: [&FastInput; T] = std::array::from_fn(|k| &xs[k]);
        let mut v = [[0.0f32; TILE]; T];
        for half in 0..live_halves::<R>(fm, tl) {
            tile::<R, BITS, T>(fm, tl, half, group, &mut v);
        }
        for (k, v) in v.iter().enumerate() {
            sink.put(tl, t0 + k, v);
        }
    }
}

/// One kernel's entry point, compiled with its features: `TP` inputs a pass.
macro_rules! entry {
    ($name:ident, $features:literal, $reg:ty, $tp:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $name(fm: &FastMatrix, tiles: Range<usize>, xs: &[FastInput], sink: &Sink) {
            unsafe {
                match fm.bits {
                    4 => drive::<$reg, 4, $tp>(fm, tiles, xs, sink),
                    2 => drive::<$reg, 2, $tp>(fm, tiles, xs, sink),
                    _ => drive::<$reg, 1, $tp>(fm, tiles, xs, sink),
                }
            }
        }
    };
}
entry!(run_avx2, "avx2,fma", Y<DOT_AVX2>, 2);
entry!(run_vex, "avx2,fma,avxvnni", Y<DOT_VEX>, 2);
entry!(run_evex, "avx2,fma,avx512vnni,avx512vl", Y<DOT_EVEX>, 4);

/// The 512-bit kernel: packed inputs where they pay ([`packed`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vl")]
unsafe fn run_512(fm: &FastMatrix, tiles: Range<usize>, xs: &[FastInput], sink: &Sink) {
    unsafe {
        match fm.bits {
            4 => packed::drive_512::<4>(fm, tiles, xs, sink),
            2 => packed::drive_512::<2>(fm, tiles, xs, sink),
            _ => packed::drive_512::<1>(fm, tiles, xs, sink),
        }
    }
}

/// [`FastMatrix::tiles_dot`] with a SIMD `kernel`.
///
/// # Safety
/// The CPU has `kernel`'s features ([`FastKernel::available`] lists it); no
/// other thread touches these tiles' output rows meanwhile.
pub(super) unsafe fn tiles_dot(
    kernel: FastKernel,
    fm: &FastMatrix,
    tiles: Range<usize>,
    xs: &[FastInput],
    sink: &Sink,
) {
    unsafe {
        match (kernel, vnni()) {
            (FastKernel::Vnni512, _) => run_512(fm, tiles, xs, sink),
            (FastKernel::Vnni, Vnni::Avx) => run_vex(fm, tiles, xs, sink),
            (FastKernel::Vnni, Vnni::Avx512) => run_evex(fm, tiles, xs, sink),
            _ => run_avx2(fm, tiles, xs, sink),
        }
    }
}
