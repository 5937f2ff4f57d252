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
mod x86;
