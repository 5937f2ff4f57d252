//! SPEC §6.1 fast precision for CQ matvecs: the prepared input quantized to
//! int8 in blocks of [`BLOCK`] values ([`FastInput`]), the codebook held as int8
//! levels with one f32 scale ([`FastRows`], built at load), exact int32 dot
//! products per block, combined in f32.
//!
//! One arithmetic, three implementations that give identical bits: the scalar
//! reference [`CqMatrix::row_dot_fast_scalar`] and the AVX2 and VNNI kernels of
//! `x86` below. The f32 part is fixed so all three agree: a block's 32 products
//! are summed exactly in int32 as 8 lane partials `p_k` (the products at the
//! block's kernel-order positions `4k .. 4k + 4`); per lane, the group's blocks
//! add `f32(p_k) · a_b` (`a_b` the block scale) by fused multiply-adds into
//! `g_k`, each group then adds `g_k · nf_g` (the norm times the codebook scale)
//! into `acc_k`, and the row is `((acc_0+acc_4)+(acc_2+acc_6)) +
//! ((acc_1+acc_5)+(acc_3+acc_7))`.

use super::matrix::CqMatrix;
use crate::kernels::kv::quantize_int8;

/// Values per int8 activation block (SPEC §6.1: at most 32, within one group).
pub const BLOCK: usize = 32;

/// A matrix's rows in fast form: int8 codebook levels and the norms times the
/// codebook scale.
#[derive(Debug, Clone)]
pub(crate) struct FastRows {
    /// Level `i` as int8 (`round_half_even(c_i / s_c)`, `s_c = max|c| / 127`);
    /// entries past `2^bits` are 0.
    pub(crate) levels: [i8; 16],
    /// The levels plus 128 as unsigned bytes (the VNNI kernels' operand).
    pub(crate) biased: [u8; 16],
    /// `norm[r, g] · s_c`, `[rows, groups]`.
    pub(crate) nf: Vec<f32>,
}

impl FastRows {
    /// The fast form of a matrix of `bits`-bit indices and `group`-column groups,
    /// or `None` where §6.1 does not apply or pay: 8-bit codebooks (adjacent
    /// levels of 256 merge in int8) and groups that are not whole blocks.
    pub(crate) fn build(bits: u32, group: usize, codebook: &[f32], norms: &[f32]) -> Option<Self> {
        if bits > 4 || !group.is_multiple_of(BLOCK) {
            return None;
        }
        let mut levels = [0i8; 16];
        let scale = quantize_int8(codebook, &mut levels[..codebook.len()]);
        let nf: Vec<f32> = norms.iter().map(|n| n * scale).collect();
        let biased = levels.map(|l| (i16::from(l) + 128) as u8);
        Some(FastRows { levels, biased, nf })
    }
}

/// A prepared input quantized per §6.1 for matrices of one bit width: the int8
/// values in natural order and in the SIMD kernels' order for `bits`, the
/// block scales and the VNNI kernels' lane biases. Buffers are reused.
#[derive(Debug, Default, Clone)]
pub struct FastInput {
    bits: u32,
    len: usize,
    q: Vec<i8>,
    qp: Vec<i8>,
    scales: Vec<f32>,
    /// Per block, per lane k: −128 · Σ of the values at kernel-order positions
    /// 4k .. 4k + 4 (the VNNI kernels start their sums there to take back their
    /// `+128` level bias).
    bias: Vec<i32>,
}

impl FastInput {
    /// Quantize `prep` (a prepared input, a whole number of blocks long) for
    /// `bits`-bit matrices: block `b`'s scale is `max(1e-12, max|x|) / 127` and its
    /// values `clamp(round_half_even(x / scale), ±127)` (§4.3's store).
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
            self.scales.push(quantize_int8(x, q));
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

    /// The kernel order and the lane biases of `q` for `bits`.
    fn lay_out(&mut self, bits: u32) {
        self.bits = bits;
        self.qp.resize(self.q.len(), 0);
        // In a block, the kernels read byte j's index p (of per = 8/bits) at
        // position p·nb + j (nb = bytes per block): column j·per + p.
        let per = 8 / bits as usize;
        let nb = BLOCK / per;
        for (q, qp) in self
            .q
            .chunks_exact(BLOCK)
            .zip(self.qp.chunks_exact_mut(BLOCK))
        {
            for p in 0..per {
                for j in 0..nb {
                    qp[p * nb + j] = q[j * per + p];
                }
            }
        }
        self.bias.clear();
        self.bias.extend(
            self.qp
                .chunks_exact(4)
                .map(|v| -128 * v.iter().map(|&q| i32::from(q)).sum::<i32>()),
        );
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

/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, the lane sum every kernel ends with.
fn sum8(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// Which fast row kernel runs (see [`CqMatrix::fast_kernel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastKernel {
    /// The scalar reference.
    Scalar,
    /// AVX2: `vpshufb` lookup, `vpmaddubsw` + `vpmaddwd` with the sign trick.
    Avx2,
    /// AVX-VNNI or AVX-512 VNNI (256-bit): `vpdpbusd` with the sign trick.
    Vnni,
}

impl FastKernel {
    /// The best kernel this CPU runs at `simd` (`Scalar` there: the scalar
    /// reference; `Avx512`: VNNI where present).
    pub fn for_simd(simd: crate::simd::CpuSimd) -> FastKernel {
        use crate::simd::CpuSimd;
        #[cfg(target_arch = "x86_64")]
        {
            let avail = CpuSimd::available();
            if simd == CpuSimd::Scalar || !avail.contains(&CpuSimd::Avx2) {
                return FastKernel::Scalar;
            }
            if simd == CpuSimd::Avx512 && x86::vnni() != x86::Vnni::None {
                return FastKernel::Vnni;
            }
            FastKernel::Avx2
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = simd;
            FastKernel::Scalar
        }
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
    /// If the matrix has no fast form, `x` is for another width or length, or the
    /// rows run past `rows`.
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
    /// (`[xs.len(), count]`). Each row is read from memory once for all inputs
    /// (then from L1), and every value is bit-identical to the one-input call.
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
    /// `put(t, i, value)` (`i < k`), with `kernel`, row by row, every input of a
    /// row while it is in L1.
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
            let g = (self.group, self.groups, k);
            // SAFETY: for_simd chose these only where the CPU has the features;
            // `nf` holds these rows' norms.
            unsafe { x86::rows_dot(kernel, self.bits, g, rows, nf, f, xs, put) };
            return;
        }
        for i in 0..k {
            for (t, x) in xs.iter().enumerate() {
                put(t, i, self.row_dot_fast_scalar(first + i, x));
            }
        }
    }

    /// Row `r` of the fast matvec by the scalar reference of the module doc's
    /// arithmetic (what the SIMD kernels must equal bit for bit).
    ///
    /// # Panics
    /// As [`CqMatrix::matvec_rows_fast`].
    pub fn row_dot_fast_scalar(&self, r: usize, x: &FastInput) -> f32 {
        let f = self.fast.as_ref().expect("matvec_fast: no fast form");
        let rb = self.row_bytes();
        let row = &self.packed[r * rb..(r + 1) * rb];
        let bits = self.bits as usize;
        let mask = (1u8 << bits) - 1;
        let per = 8 / bits;
        let nb = BLOCK / per;
        let gpb = self.group / BLOCK;
        let mut acc = [0.0f32; 8];
        let mut g = [0.0f32; 8];
        for (b, qp) in x.qp.chunks_exact(BLOCK).enumerate() {
            for (k, gk) in g.iter_mut().enumerate() {
                let mut p = 0i32;
                for (i, &q) in qp[4 * k..4 * k + 4].iter().enumerate() {
                    // Kernel-order position 4k + i is column (pos % nb)·per + pos / nb.
                    let pos = 4 * k + i;
                    let col = b * BLOCK + (pos % nb) * per + pos / nb;
                    let idx = (row[col / per] >> ((col % per) * bits)) & mask;
                    p += i32::from(f.levels[idx as usize]) * i32::from(q);
                }
                *gk = (p as f32).mul_add(x.scales[b], *gk);
            }
            if (b + 1) % gpb == 0 {
                let nf = f.nf[r * self.groups + b / gpb];
                for (a, gk) in acc.iter_mut().zip(&mut g) {
                    *a = gk.mul_add(nf, *a);
                    *gk = 0.0;
                }
            }
        }
        sum8(acc)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{sum8, FastInput, FastKernel, FastRows, BLOCK};
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

    /// Rows of `rows` (packed, consecutive) into `out`, one fast dot each (module
    /// doc), with the AVX2 or a VNNI kernel.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA (and the VNNI variant for `Vnni`); `nf` holds the
    /// rows' norms.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn rows_dot(
        kernel: FastKernel,
        bits: u32,
        (group, groups, k): (usize, usize, usize),
        rows: &[u8],
        nf: &[f32],
        f: &FastRows,
        xs: &[FastInput],
        out: &impl Fn(usize, usize, f32),
    ) {
        unsafe {
            let g = Geometry {
                group,
                groups,
                row_bytes: rows.len() / k.max(1),
                rows: k,
            };
            macro_rules! go {
                ($bits:literal) => {
                    match (kernel, vnni()) {
                        (FastKernel::Vnni, Vnni::Avx) => {
                            rows_vnni_avx::<$bits>(g, rows, nf, &f.biased, xs, out)
                        }
                        (FastKernel::Vnni, Vnni::Avx512) => {
                            rows_vnni_512::<$bits>(g, rows, nf, &f.biased, xs, out)
                        }
                        _ => rows_avx2::<$bits>(g, rows, nf, &f.levels, xs, out),
                    }
                };
            }
            match bits {
                4 => go!(4),
                2 => go!(2),
                _ => go!(1),
            }
        }
    }

    /// A matrix's row geometry.
    #[derive(Clone, Copy)]
    struct Geometry {
        group: usize,
        groups: usize,
        row_bytes: usize,
        /// Rows (the outputs per input).
        rows: usize,
    }

    /// Block `b`'s 32 indices as bytes, in the order FastInput::quantize lays
    /// out the activations: byte j's index p at p·nb + j.
    #[inline(always)]
    unsafe fn indices<const BITS: u32>(row: *const u8, b: usize) -> __m256i {
        unsafe {
            let nb = BLOCK * BITS as usize / 8;
            let p = row.add(b * nb);
            match BITS {
                4 => {
                    let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
                    let s = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
                    _mm256_and_si256(s, _mm256_set1_epi8(0x0f))
                }
                2 => {
                    let v = _mm256_set1_epi64x((p as *const i64).read_unaligned());
                    let s = _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 2, 4, 6));
                    _mm256_and_si256(s, _mm256_set1_epi8(0x03))
                }
                _ => {
                    let v = _mm256_set1_epi32((p as *const i32).read_unaligned());
                    let s = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                    _mm256_and_si256(s, _mm256_set1_epi8(0x01))
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn hsum(acc: __m256) -> f32 {
        let mut l = [0.0f32; 8];
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc) };
        sum8(l)
    }

    /// The rows loop, generic over the block's lane partials `dot(l, q, b)`
    /// from the looked-up levels `l`, the activations `q` and the block index.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_loop<const BITS: u32>(
        g: Geometry,
        rows: &[u8],
        nf: &[f32],
        table: &[u8; 16],
        xs: &[FastInput],
        out: &impl Fn(usize, usize, f32),
        dot: impl Fn(__m256i, __m256i, &FastInput, usize) -> __m256i,
    ) {
        unsafe {
            let table =
                _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
            let gpb = g.group / BLOCK;
            // R rows at a time: their fused multiply-add chains are independent,
            // so the adds' latency overlaps (one row alone waits on each).
            const R: usize = 4;
            let mut r0 = 0;
            while r0 < g.rows {
                let n = (g.rows - r0).min(R);
                for (t, x) in xs.iter().enumerate() {
                    let blocks = x.len / BLOCK;
                    let qp = x.qp.as_ptr();
                    let sc = x.scales.as_ptr();
                    let mut acc = [_mm256_setzero_ps(); R];
                    for gi in 0..blocks / gpb {
                        let mut gacc = [_mm256_setzero_ps(); R];
                        for b in gi * gpb..(gi + 1) * gpb {
                            let q = _mm256_loadu_si256(qp.add(b * BLOCK) as *const __m256i);
                            let a = _mm256_broadcast_ss(&*sc.add(b));
                            for (k, ga) in gacc.iter_mut().enumerate().take(n) {
                                let row = rows.as_ptr().add((r0 + k) * g.row_bytes);
                                let l = _mm256_shuffle_epi8(table, indices::<BITS>(row, b));
                                let p = _mm256_cvtepi32_ps(dot(l, q, x, b));
                                *ga = _mm256_fmadd_ps(p, a, *ga);
                            }
                        }
                        for (k, (ac, ga)) in acc.iter_mut().zip(&gacc).enumerate().take(n) {
                            let nf_r = nf.as_ptr().add((r0 + k) * g.groups + gi);
                            *ac = _mm256_fmadd_ps(*ga, _mm256_broadcast_ss(&*nf_r), *ac);
                        }
                    }
                    for (k, ac) in acc.iter().enumerate().take(n) {
                        out(t, r0 + k, hsum(*ac));
                    }
                }
                r0 += n;
            }
        }
    }

    /// The block's bias-corrected start for `vpdpbusd` on levels + 128.
    #[inline(always)]
    unsafe fn bias(x: &FastInput, b: usize) -> __m256i {
        unsafe { _mm256_loadu_si256(x.bias.as_ptr().add(8 * b) as *const __m256i) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_avx2<const BITS: u32>(
        g: Geometry,
        rows: &[u8],
        nf: &[f32],
        levels: &[i8; 16],
        xs: &[FastInput],
        out: &impl Fn(usize, usize, f32),
    ) {
        unsafe {
            let ones = _mm256_set1_epi16(1);
            // The sign trick: |L| (unsigned) times q·sign(L) (signed); a pair of
            // products is at most 2·127·127, so vpmaddubsw never saturates.
            let table: &[u8; 16] = &*(levels as *const [i8; 16] as *const [u8; 16]);
            let dot = |l, q, _: &FastInput, _| {
                let p = _mm256_maddubs_epi16(_mm256_abs_epi8(l), _mm256_sign_epi8(q, l));
                _mm256_madd_epi16(p, ones)
            };
            rows_loop::<BITS>(g, rows, nf, table, xs, out, dot)
        }
    }

    /// The two VNNI kernels: `vpdpbusd` on the levels + 128 (unsigned) and the
    /// activations (signed), starting from the block's −128·Σq bias, so nothing
    /// needs the sign trick; `$dp` is the VEX (AVX-VNNI) or EVEX (AVX-512 VNNI)
    /// form of the same instruction.
    macro_rules! vnni_rows {
        ($name:ident, $features:literal, $dp:ident) => {
            #[target_feature(enable = $features)]
            unsafe fn $name<const BITS: u32>(
                g: Geometry,
                rows: &[u8],
                nf: &[f32],
                biased: &[u8; 16],
                xs: &[FastInput],
                out: &impl Fn(usize, usize, f32),
            ) {
                unsafe {
                    let dot = |l, q, x: &FastInput, b| $dp(bias(x, b), l, q);
                    rows_loop::<BITS>(g, rows, nf, biased, xs, out, dot)
                }
            }
        };
    }
    vnni_rows!(rows_vnni_avx, "avx2,fma,avxvnni", _mm256_dpbusd_avx_epi32);
    vnni_rows!(
        rows_vnni_512,
        "avx2,fma,avx512vnni,avx512vl",
        _mm256_dpbusd_epi32
    );
}
