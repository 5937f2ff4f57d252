//! SPEC §6.1 fast precision for CQ matvecs: the prepared input quantized to
//! int8 in blocks of [`BLOCK`] values ([`FastInput`]), the codebook held as int8
//! levels with one f32 scale ([`FastRows`], built at load), exact int32 dot
//! products per block, combined in f32.
//!
//! One arithmetic, three implementations that give identical bits: the scalar
//! reference [`CqMatrix::row_dot_fast_scalar`] and the AVX2 and VNNI kernels of
//! `x86` below. The f32 part is fixed so all three agree: block `b`'s integer
//! dot `d_b` is weighted by `w_b = a_b · nf[g(b)]` (`a_b` the block's scale,
//! `nf` the row's norms times the codebook scale) into accumulator `b mod 8` by
//! one fused multiply-add, and the 8 accumulators are summed as
//! `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.

use super::matrix::CqMatrix;
use crate::kernels::kv::quantize_int8;

/// Values per int8 activation block (SPEC §6.1: at most 32, within one group).
pub const BLOCK: usize = 32;

/// A matrix's rows in fast form: int8 codebook levels and the norms times the
/// codebook scale (padded by 8 so the SIMD kernels may read past a row).
#[derive(Debug, Clone)]
pub(crate) struct FastRows {
    /// Level `i` as int8 (`round_half_even(c_i / s_c)`, `s_c = max|c| / 127`);
    /// entries past `2^bits` are 0.
    pub(crate) levels: [i8; 16],
    /// The levels plus 128 as unsigned bytes (the VNNI kernels' operand).
    pub(crate) biased: [u8; 16],
    /// `norm[r, g] · s_c`, `[rows, groups]` then 8 zeros.
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
        let mut nf: Vec<f32> = norms.iter().map(|n| n * scale).collect();
        nf.extend([0.0; 8]);
        let biased = levels.map(|l| (i16::from(l) + 128) as u8);
        Some(FastRows { levels, biased, nf })
    }
}

/// A prepared input quantized per §6.1 for matrices of one bit width: the int8
/// values in natural order and in the SIMD kernels' order for `bits`, and the
/// block scales (zero-padded to a multiple of 8 blocks). Buffers are reused.
#[derive(Debug, Default, Clone)]
pub struct FastInput {
    bits: u32,
    len: usize,
    q: Vec<i8>,
    qp: Vec<i8>,
    scales: Vec<f32>,
    /// Σ of each block's values (zero-padded like `scales`), for the VNNI
    /// kernels' `+128` level bias.
    sums: Vec<i32>,
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
        let blocks = prep.len() / BLOCK;
        self.bits = bits;
        self.len = prep.len();
        self.q.resize(prep.len(), 0);
        self.qp.resize(prep.len(), 0);
        self.scales.clear();
        for (x, q) in prep.chunks_exact(BLOCK).zip(self.q.chunks_exact_mut(BLOCK)) {
            self.scales.push(quantize_int8(x, q));
        }
        self.scales.resize(blocks.div_ceil(8) * 8, 0.0);
        self.sums.clear();
        self.sums.extend(
            self.q
                .chunks_exact(BLOCK)
                .map(|q| q.iter().map(|&v| i32::from(v)).sum::<i32>()),
        );
        self.sums.resize(blocks.div_ceil(8) * 8, 0);
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
    }

    /// Values quantized.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is quantized.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bit width the kernel order is for.
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// The int8 values in natural order.
    pub fn values(&self) -> &[i8] {
        &self.q
    }

    /// The block scales (then zeros up to a multiple of 8 blocks).
    pub fn scales(&self) -> &[f32] {
        &self.scales
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
            for (i, v) in o.iter_mut().enumerate() {
                *v = self.row_dot_fast(kernel, f + i, x);
            }
        });
    }

    fn row_dot_fast(&self, kernel: FastKernel, r: usize, x: &FastInput) -> f32 {
        match kernel {
            FastKernel::Scalar => self.row_dot_fast_scalar(r, x),
            #[cfg(target_arch = "x86_64")]
            FastKernel::Avx2 | FastKernel::Vnni => {
                let f = self.fast.as_ref().expect("fast form");
                let rb = self.row_bytes();
                let row = &self.packed[r * rb..(r + 1) * rb];
                let nf = &f.nf[r * self.groups..];
                // SAFETY: for_simd chose these only where the CPU has the features;
                // `nf` has 8 readable values past the row's last group.
                unsafe { x86::row_dot(kernel, self.bits, self.group, row, nf, f, x) }
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => self.row_dot_fast_scalar(r, x),
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
        let gpb = self.group / BLOCK;
        let mut acc = [0.0f32; 8];
        for (b, q) in x.q.chunks_exact(BLOCK).enumerate() {
            let mut d = 0i32;
            for (c, &qc) in q.iter().enumerate() {
                let col = b * BLOCK + c;
                let idx = (row[col / per] >> ((col % per) * bits)) & mask;
                d += i32::from(f.levels[idx as usize]) * i32::from(qc);
            }
            let w = x.scales[b] * f.nf[r * self.groups + b / gpb];
            acc[b % 8] = (d as f32).mul_add(w, acc[b % 8]);
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

    /// One row's fast dot (module doc) with the AVX2 or a VNNI kernel.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA (and the VNNI variant for `Vnni`); `nf` holds the
    /// row's norms and 8 more readable values.
    pub(super) unsafe fn row_dot(
        kernel: FastKernel,
        bits: u32,
        group: usize,
        row: &[u8],
        nf: &[f32],
        f: &FastRows,
        x: &FastInput,
    ) -> f32 {
        unsafe {
            match (kernel, vnni()) {
                (FastKernel::Vnni, Vnni::Avx) => row_vnni_avx(bits, group, row, nf, &f.biased, x),
                (FastKernel::Vnni, Vnni::Avx512) => {
                    row_vnni_512(bits, group, row, nf, &f.biased, x)
                }
                _ => row_avx2(bits, group, row, nf, &f.levels, x),
            }
        }
    }

    /// Block `b`'s 32 indices as bytes, in the order FastInput::quantize lays
    /// out the activations: byte j's index p at p·nb + j.
    #[inline(always)]
    unsafe fn indices(bits: u32, row: &[u8], b: usize) -> __m256i {
        unsafe {
            let nb = BLOCK * bits as usize / 8;
            let p = row.as_ptr().add(b * nb);
            match bits {
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

    /// [Σ v0, …, Σ v7] of eight i32x8 vectors (exact).
    #[inline(always)]
    unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
        let h01 = _mm256_hadd_epi32(v[0], v[1]);
        let h23 = _mm256_hadd_epi32(v[2], v[3]);
        let h45 = _mm256_hadd_epi32(v[4], v[5]);
        let h67 = _mm256_hadd_epi32(v[6], v[7]);
        let a = _mm256_hadd_epi32(h01, h23);
        let b = _mm256_hadd_epi32(h45, h67);
        let lo = _mm256_permute2x128_si256(a, b, 0x20);
        let hi = _mm256_permute2x128_si256(a, b, 0x31);
        _mm256_add_epi32(lo, hi)
    }

    /// The weights of blocks 8c .. 8c + 7: their scales times their groups' nf.
    #[inline(always)]
    unsafe fn weights(x: &FastInput, nf: &[f32], gpb: usize, c: usize) -> __m256 {
        unsafe {
            let a = _mm256_loadu_ps(x.scales.as_ptr().add(8 * c));
            let n = if gpb >= 8 {
                _mm256_set1_ps(nf[8 * c / gpb])
            } else {
                let v = _mm256_loadu_ps(nf.as_ptr().add(8 * c / gpb));
                let k = gpb.trailing_zeros() as i32;
                let idx = _mm256_srlv_epi32(
                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                    _mm256_set1_epi32(k),
                );
                _mm256_permutevar8x32_ps(v, idx)
            };
            _mm256_mul_ps(a, n)
        }
    }

    #[inline(always)]
    unsafe fn hsum(acc: __m256) -> f32 {
        let mut l = [0.0f32; 8];
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc) };
        sum8(l)
    }

    /// The row loop, generic over the block's integer dot `dot(levels, q)` from
    /// the looked-up levels `l` and the activations `q`, and the per-8-block
    /// correction `fix` of the summed dots.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn row_loop(
        bits: u32,
        group: usize,
        row: &[u8],
        nf: &[f32],
        table: &[u8; 16],
        x: &FastInput,
        dot: impl Fn(__m256i, __m256i) -> __m256i,
        fix: impl Fn(__m256i, usize) -> __m256i,
    ) -> f32 {
        unsafe {
            let table =
                _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
            let blocks = x.len / BLOCK;
            let gpb = group / BLOCK;
            let mut acc = _mm256_setzero_ps();
            let zero = _mm256_setzero_si256();
            for c in 0..blocks.div_ceil(8) {
                let mut v = [zero; 8];
                for (k, vk) in v.iter_mut().enumerate() {
                    let b = 8 * c + k;
                    if b < blocks {
                        let l = _mm256_shuffle_epi8(table, indices(bits, row, b));
                        let q = _mm256_loadu_si256(x.qp.as_ptr().add(b * BLOCK) as *const __m256i);
                        *vk = dot(l, q);
                    }
                }
                let d = _mm256_cvtepi32_ps(fix(reduce8(&v), c));
                acc = _mm256_fmadd_ps(d, weights(x, nf, gpb, c), acc);
            }
            hsum(acc)
        }
    }

    /// Σ (L + 128)·q − 128·Σ q = Σ L·q for blocks 8c .. 8c + 7.
    #[inline(always)]
    unsafe fn unbias(d: __m256i, x: &FastInput, c: usize) -> __m256i {
        unsafe {
            let s = _mm256_loadu_si256(x.sums.as_ptr().add(8 * c) as *const __m256i);
            _mm256_sub_epi32(d, _mm256_slli_epi32(s, 7))
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn row_avx2(
        bits: u32,
        group: usize,
        row: &[u8],
        nf: &[f32],
        levels: &[i8; 16],
        x: &FastInput,
    ) -> f32 {
        unsafe {
            let ones = _mm256_set1_epi16(1);
            // The sign trick: |L| (unsigned) times q·sign(L) (signed); a pair of
            // products is at most 2·127·127, so vpmaddubsw never saturates.
            let table: &[u8; 16] = &*(levels as *const [i8; 16] as *const [u8; 16]);
            row_loop(
                bits,
                group,
                row,
                nf,
                table,
                x,
                |l, q| {
                    let p = _mm256_maddubs_epi16(_mm256_abs_epi8(l), _mm256_sign_epi8(q, l));
                    _mm256_madd_epi16(p, ones)
                },
                |d, _| d,
            )
        }
    }

    #[target_feature(enable = "avx2,fma,avxvnni")]
    unsafe fn row_vnni_avx(
        bits: u32,
        group: usize,
        row: &[u8],
        nf: &[f32],
        biased: &[u8; 16],
        x: &FastInput,
    ) -> f32 {
        unsafe {
            row_loop(
                bits,
                group,
                row,
                nf,
                biased,
                x,
                |l, q| _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), l, q),
                |d, c| unbias(d, x, c),
            )
        }
    }

    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    unsafe fn row_vnni_512(
        bits: u32,
        group: usize,
        row: &[u8],
        nf: &[f32],
        biased: &[u8; 16],
        x: &FastInput,
    ) -> f32 {
        unsafe {
            row_loop(
                bits,
                group,
                row,
                nf,
                biased,
                x,
                |l, q| _mm256_dpbusd_epi32(_mm256_setzero_si256(), l, q),
                |d, c| unbias(d, x, c),
            )
        }
    }
}
