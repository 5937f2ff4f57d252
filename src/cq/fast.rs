//! SPEC §6.1 fast precision for CQ matvecs: the prepared input quantized to
//! int8 in blocks of [`BLOCK`] values ([`FastInput`]), the codebook held as int8
//! levels with one f32 scale ([`FastRows`], built at load), exact int32 dot
//! products per block, combined in f32.
//!
//! One arithmetic, four implementations that give identical bits: the scalar
//! reference [`CqMatrix::row_dot_fast_scalar`] and the AVX2, 256-bit VNNI and
//! 512-bit VNNI kernels of `x86` below. The arithmetic is laid out for the
//! kernels' registers. A row's packed bytes are read in **chunks** of [`CHUNK`]
//! bytes (`512 / bits` columns); a chunk has 16 **lanes** of 4 consecutive
//! bytes, and each lane lies inside one block. A byte holds `8 / bits` indices,
//! its **planes** (plane `p` at bits `p·bits ..`); so lane `λ` of chunk `c`
//! covers the columns `c·W + β·per + p` (`W = 512 / bits`, `per = 8 / bits`)
//! for its bytes `β = 4λ .. 4λ + 4` and every plane `p`.
//!
//! Per lane: `p_λ` = the exact int32 sum of the lane's products `level · q`;
//! `g_λ ← fma(f32(p_λ), a_b, g_λ)` (`a_b` the scale of the lane's block) every
//! chunk; where a group ends (every chunk when a group is at most `W` columns,
//! else after `group / W` chunks) `acc_λ ← fma(g_λ, nf_λ, acc_λ)` and `g_λ ← 0`
//! (`nf_λ` the norm of the lane's group times the codebook scale); the row is
//! `sum8(acc_λ + acc_{λ+8})` with `sum8(l) = ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
//! Columns past the row's end are zero (a lane there adds exactly nothing).
//!
//! In the kernels a plane is one mask (`and`, after one 4-bit shift for the
//! planes in a byte's high nibble) and one `pshufb` of a 16-entry table that
//! holds level `i` at `i << (p·bits mod 4)`, so no lane order is shuffled: the
//! input is laid out to match instead ([`FastInput`]).

use super::matrix::CqMatrix;
use crate::kernels::kv::quantize_int8;

/// Values per int8 activation block (SPEC §6.1: at most 32, within one group).
pub const BLOCK: usize = 32;

/// Packed bytes per kernel chunk (one 512-bit register; 16 lanes of 4 bytes).
pub const CHUNK: usize = 64;

/// Lanes per chunk.
const LANES: usize = 16;

/// A matrix's rows in fast form: the plane tables of its int8 codebook levels
/// and the norms times the codebook scale.
#[derive(Debug, Clone)]
pub(crate) struct FastRows {
    /// Level `i` (`round_half_even(c_i / s_c)`, `s_c = max|c| / 127`) at every
    /// `i << s` for the plane shifts `s` of this width (module doc).
    pub(crate) table: [i8; 16],
    /// `table` plus 128 as unsigned bytes (the VNNI kernels' operand).
    pub(crate) biased: [u8; 16],
    /// `norm[r, g] · s_c`, `[rows, groups]`, then [`LANES`] zeros (the kernels
    /// read a whole register of norms from a row's last groups).
    pub(crate) nf: Vec<f32>,
}

impl FastRows {
    /// The fast form of a matrix of `bits`-bit indices and `group`-column groups,
    /// or `None` where §6.1 does not apply or pay: 8-bit codebooks (adjacent
    /// levels of 256 merge in int8), groups that are not whole blocks, and
    /// non-finite norms (a kernel lane past a row's end multiplies a zero by the
    /// next row's norm).
    pub(crate) fn build(bits: u32, group: usize, codebook: &[f32], norms: &[f32]) -> Option<Self> {
        if bits > 4 || !group.is_multiple_of(BLOCK) {
            return None;
        }
        let mut levels = [0i8; 16];
        let scale = quantize_int8(codebook, &mut levels[..codebook.len()]);
        let mut nf: Vec<f32> = norms.iter().map(|n| n * scale).collect();
        if nf.iter().any(|v| !v.is_finite()) {
            return None;
        }
        nf.extend([0.0; LANES]);
        let mut table = [0i8; 16];
        for p in 0..8 / bits {
            let shift = (p * bits) % 4;
            for (i, &l) in levels[..1 << bits].iter().enumerate() {
                table[i << shift] = l;
            }
        }
        let biased = table.map(|l| (i16::from(l) + 128) as u8);
        Some(FastRows { table, biased, nf })
    }
}

/// Columns per chunk at `bits`.
fn chunk_cols(bits: u32) -> usize {
    CHUNK * 8 / bits as usize
}

/// A prepared input quantized per §6.1 for matrices of one bit width: the int8
/// values in natural order and in the kernels' chunk order for `bits`, the
/// block scales and per chunk lane the scale and the VNNI kernels' bias.
/// Buffers are reused.
#[derive(Debug, Default, Clone)]
pub struct FastInput {
    bits: u32,
    len: usize,
    q: Vec<i8>,
    scales: Vec<f32>,
    /// Per chunk `c` and plane `p`, [`CHUNK`] values: byte `β`'s is column
    /// `c·W + β·per + p` (0 past the end).
    qp: Vec<i8>,
    /// Per chunk, per lane: the scale of the lane's block (0 past the end).
    lane_scales: Vec<f32>,
    /// Per chunk, per lane: −128 · Σ of the lane's values (the VNNI kernels
    /// start their sums there to take back their `+128` level bias).
    bias: Vec<i32>,
}

impl FastInput {
    /// Quantize `prep` (a prepared input, a whole number of blocks long) for
    /// `bits`-bit matrices: block `b`'s scale is `max(1e-12, max|x|) / 127` and its
    /// values `clamp(round_half_even(x / scale), ±127)` (§4.3's store); a block
    /// holding a NaN gets a NaN scale, so the NaN reaches the output.
    ///
    /// # Panics
    /// If `prep.len()` is not a multiple of [`BLOCK`] or `bits` is not 1, 2 or 4.
    pub fn quantize(&mut self, prep: &[f32], bits: u32) {
        assert!(prep.len().is_multiple_of(BLOCK), "fast input: whole blocks");
        assert!(matches!(bits, 1 | 2 | 4), "fast input: bits");
        self.len = prep.len();
        self.q.resize(prep.len(), 0);
        self.scales.clear();
        for (x, q) in prep.chunks_exact(BLOCK).zip(self.q.chunks_exact_mut(BLOCK)) {
            // A NaN would quantize to code 0 and vanish: its block's scale is NaN
            // instead, so the matvec's output is NaN as the exact one's would be.
            let scale = quantize_int8(x, q);
            let nan = x.iter().any(|v| v.is_nan());
            self.scales.push(if nan { f32::NAN } else { scale });
        }
        self.lay_out(bits);
    }

    /// The same quantized input as `other` laid out for `bits`-bit matrices (the
    /// values and scales do not depend on the width, only the kernel order).
    ///
    /// # Panics
    /// If `bits` is not 1, 2 or 4.
    pub fn relay(&mut self, other: &FastInput, bits: u32) {
        assert!(matches!(bits, 1 | 2 | 4), "fast input: bits");
        self.len = other.len;
        self.q.clear();
        self.q.extend_from_slice(&other.q);
        self.scales.clear();
        self.scales.extend_from_slice(&other.scales);
        self.lay_out(bits);
    }

    /// The chunk order, lane scales and lane biases of `q` for `bits`.
    fn lay_out(&mut self, bits: u32) {
        self.bits = bits;
        let w = chunk_cols(bits);
        let chunks = self.len.div_ceil(w);
        self.qp.clear();
        self.qp.resize(chunks * w, 0);
        match bits {
            4 => deinterleave::<2>(&self.q, &mut self.qp),
            2 => deinterleave::<4>(&self.q, &mut self.qp),
            _ => deinterleave::<8>(&self.q, &mut self.qp),
        }
        // A lane's values are 4 · per consecutive columns of one block.
        let span = 4 * 8 / bits as usize;
        self.lane_scales.clear();
        self.bias.clear();
        for lane in 0..chunks * LANES {
            let col = lane * span;
            if col < self.len {
                let sum: i32 = self.q[col..col + span].iter().map(|&q| i32::from(q)).sum();
                self.bias.push(-128 * sum);
                self.lane_scales.push(self.scales[col / BLOCK]);
            } else {
                self.bias.push(0);
                self.lane_scales.push(0.0);
            }
        }
    }

    /// Values quantized.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is quantized.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// `q` in chunk order into `qp` (zeroed, whole chunks long) for `PER` planes a
/// byte: per chunk of `64 · PER` columns, plane `p`'s [`CHUNK`] values, byte
/// `β`'s being column `β · PER + p`.
fn deinterleave<const PER: usize>(q: &[i8], qp: &mut [i8]) {
    for (src, out) in q.chunks(CHUNK * PER).zip(qp.chunks_exact_mut(CHUNK * PER)) {
        for (beta, v) in src.chunks_exact(PER).enumerate() {
            for (p, &x) in v.iter().enumerate() {
                out[p * CHUNK + beta] = x;
            }
        }
    }
}

/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
fn sum8(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// `sum8(l_k + l_{k+8})`, the lane sum every kernel ends with.
fn sum16(l: [f32; LANES]) -> f32 {
    sum8(std::array::from_fn(|k| l[k] + l[k + 8]))
}

/// Which fast row kernel runs (see [`FastKernel::for_simd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastKernel {
    /// The scalar reference.
    Scalar,
    /// AVX2: `vpshufb` lookup, `vpmaddubsw` + `vpmaddwd` with the sign trick.
    Avx2,
    /// AVX-VNNI or AVX-512 VNNI at 256 bits: `vpdpbusd` on biased levels.
    Vnni,
    /// AVX-512 VNNI at 512 bits: a whole chunk per instruction.
    Vnni512,
}

impl FastKernel {
    /// The best kernel this CPU runs at `simd`: `Scalar` there; at `Avx2` the
    /// AVX2 kernel, or 256-bit VNNI where AVX-VNNI is present; at `Avx512` the
    /// 512-bit VNNI one where AVX-512 VNNI is present, else the best 256-bit one.
    pub fn for_simd(simd: crate::simd::CpuSimd) -> FastKernel {
        use crate::simd::CpuSimd;
        let avail = FastKernel::available();
        let has = |k| avail.contains(&k);
        match simd {
            CpuSimd::Scalar => FastKernel::Scalar,
            _ if !has(FastKernel::Avx2) => FastKernel::Scalar,
            CpuSimd::Avx512 if has(FastKernel::Vnni512) => FastKernel::Vnni512,
            CpuSimd::Avx512 if has(FastKernel::Vnni) => FastKernel::Vnni,
            #[cfg(target_arch = "x86_64")]
            CpuSimd::Avx2 if x86::vnni() == x86::Vnni::Avx => FastKernel::Vnni,
            _ => FastKernel::Avx2,
        }
    }

    /// Every fast kernel this CPU runs (the scalar reference first).
    pub fn available() -> &'static [FastKernel] {
        static AVAIL: std::sync::OnceLock<Vec<FastKernel>> = std::sync::OnceLock::new();
        AVAIL.get_or_init(|| {
            #[allow(unused_mut)]
            let mut v = vec![FastKernel::Scalar];
            #[cfg(target_arch = "x86_64")]
            if crate::simd::CpuSimd::available().contains(&crate::simd::CpuSimd::Avx2) {
                v.push(FastKernel::Avx2);
                if x86::vnni() != x86::Vnni::None {
                    v.push(FastKernel::Vnni);
                }
                if x86::vnni512() {
                    v.push(FastKernel::Vnni512);
                }
            }
            v
        })
    }
}

impl CqMatrix {
    /// Whether this matrix has a fast form (1, 2 or 4 bits, whole blocks per group).
    pub fn has_fast(&self) -> bool {
        self.fast.is_some()
    }

    /// Rows `first .. first + out.len()` of the fast matvec (§6.1) of `x` (this
    /// matrix's prepared input quantized for its bits), with `kernel`, rows split
    /// over the pool like the exact matvec.
    ///
    /// # Panics
    /// If the matrix has no fast form, `x` is for another width or length, the
    /// rows run past `rows`, or this CPU lacks `kernel`.
    pub fn matvec_rows_fast(
        &self,
        kernel: FastKernel,
        x: &FastInput,
        first: usize,
        out: &mut [f32],
    ) {
        assert!(self.fast.is_some(), "matvec_fast: no fast form");
        assert_eq!(x.bits, self.bits, "matvec_fast: input bits");
        assert_eq!(x.len, self.padded(), "matvec_fast: input length");
        assert!(
            first + out.len() <= self.rows,
            "matvec_fast: rows out of range"
        );
        assert!(
            FastKernel::available().contains(&kernel),
            "matvec_fast: {kernel:?} is not available on this CPU"
        );
        self.split_rows(first, out, |f, o| {
            let k = o.len();
            let cell = std::cell::Cell::from_mut(o).as_slice_of_cells();
            self.rows_fast(kernel, f, std::slice::from_ref(x), k, &|_, i, v| {
                cell[i].set(v)
            })
        });
    }

    /// [`CqMatrix::matvec_rows_fast`] for several inputs at once (a prefill
    /// chunk): rows `first .. first + count` for each of `xs` into `out`
    /// (`[xs.len(), count]`). Each row's indices are decoded once for several
    /// inputs, and every value is bit-identical to the one-input call.
    ///
    /// # Panics
    /// As [`CqMatrix::matvec_rows_fast`], or if `out.len() != xs.len() · count`.
    pub fn matmul_rows_fast(
        &self,
        kernel: FastKernel,
        xs: &[FastInput],
        first: usize,
        count: usize,
        out: &mut [f32],
    ) {
        assert!(self.fast.is_some(), "matmul_fast: no fast form");
        assert_eq!(out.len(), xs.len() * count, "matmul_fast: output length");
        assert!(first + count <= self.rows, "matmul_fast: rows out of range");
        assert!(
            FastKernel::available().contains(&kernel),
            "matmul_fast: {kernel:?} is not available on this CPU"
        );
        for x in xs {
            assert_eq!(
                (x.bits, x.len),
                (self.bits, self.padded()),
                "matmul_fast: input"
            );
        }
        if xs.len() == 1 {
            return self.matvec_rows_fast(kernel, &xs[0], first, out);
        }
        // Rows are split over the pool; a part writes its rows of every input.
        let shared = crate::pool::SharedSlice::new(out);
        crate::pool::Pool::global().for_ranges(count, 4, &|r| {
            let put = |t: usize, i: usize, v: f32| {
                // SAFETY: the parts' row ranges are disjoint: only this part
                // writes row r.start + i of any input.
                unsafe { shared.set(t * count + r.start + i, v) }
            };
            self.rows_fast(kernel, first + r.start, xs, r.len(), &put);
        });
    }

    /// Rows `first .. first + k` for each input `t` of `xs`, handed to
    /// `put(t, i, value)` (`i < k`), with `kernel`.
    fn rows_fast(
        &self,
        kernel: FastKernel,
        first: usize,
        xs: &[FastInput],
        k: usize,
        put: &impl Fn(usize, usize, f32),
    ) {
        #[cfg(target_arch = "x86_64")]
        if kernel != FastKernel::Scalar {
            let f = self.fast.as_ref().expect("fast form");
            let rb = self.row_bytes();
            let rows = &self.packed[first * rb..(first + k) * rb];
            let nf = &f.nf[first * self.groups..];
            let geo = x86::Geometry::new(self.bits, self.group, self.groups, rb, k);
            // SAFETY: `available` listed the kernel, so the CPU has its
            // features; `nf` holds these rows' norms and the zero padding.
            unsafe { x86::rows_dot(kernel, self.bits, geo, rows, nf, f, xs, put) };
            return;
        }
        for i in 0..k {
            for (t, x) in xs.iter().enumerate() {
                put(t, i, self.row_dot_fast_scalar(first + i, x));
            }
        }
    }

    /// Row `r` of the fast matvec by the scalar reference of the module doc's
    /// arithmetic (what the SIMD kernels must equal bit for bit), from the
    /// input's natural order.
    ///
    /// # Panics
    /// As [`CqMatrix::matvec_rows_fast`].
    pub fn row_dot_fast_scalar(&self, r: usize, x: &FastInput) -> f32 {
        let f = self.fast.as_ref().expect("matvec_fast: no fast form");
        assert_eq!((x.bits, x.len), (self.bits, self.padded()), "fast input");
        let rb = self.row_bytes();
        let row = &self.packed[r * rb..(r + 1) * rb];
        let nf = &f.nf[r * self.groups..(r + 1) * self.groups];
        let bits = self.bits as usize;
        let mask = (1u8 << bits) - 1;
        let per = 8 / bits;
        let w = chunk_cols(self.bits);
        let chunks_per_group = (self.group / w).max(1);
        // Plane 0's shift is 0, so the table's first 2^bits entries are the levels.
        let levels = &f.table[..1 << bits];
        let mut acc = [0.0f32; LANES];
        let mut g = [0.0f32; LANES];
        for c in 0..self.padded().div_ceil(w) {
            for (lane, gl) in g.iter_mut().enumerate() {
                let first_col = c * w + 4 * lane * per;
                if first_col >= self.padded() {
                    continue;
                }
                let mut p = 0i32;
                for beta in 4 * lane..4 * lane + 4 {
                    let byte = row[c * CHUNK + beta];
                    for plane in 0..per {
                        let idx = (byte >> (plane * bits)) & mask;
                        let col = c * w + beta * per + plane;
                        p += i32::from(levels[usize::from(idx)]) * i32::from(x.q[col]);
                    }
                }
                *gl = (p as f32).mul_add(x.scales[first_col / BLOCK], *gl);
            }
            if (c + 1) % chunks_per_group == 0 {
                for (lane, (a, gl)) in acc.iter_mut().zip(&mut g).enumerate() {
                    let first_col = c * w + 4 * lane * per;
                    if first_col < self.padded() {
                        *a = gl.mul_add(nf[first_col / self.group], *a);
                    }
                    *gl = 0.0;
                }
            }
        }
        sum16(acc)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
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
            } else if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
            {
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
            let v = unsafe {
                _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i))
            };
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
                        q[t] =
                            S::load(xs[t].qp.as_ptr().add((c * per + plane) * CHUNK) as *const u8);
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
}
