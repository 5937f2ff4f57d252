//! SPEC §6.1 fast precision for CQ matvecs: the prepared input quantized to
//! int8 in blocks of [`BLOCK`] values ([`FastInput`]), the codebook held as
//! int8 levels with one f32 scale, exact int32 dot products per block,
//! combined in f32 ([`FastMatrix`], repacked at load).
//!
//! **The arithmetic** (one row `r` against one input; what every kernel
//! computes bit for bit, [`FastMatrix::row_dot_scalar`] being its reference):
//!
//! ```text
//! acc = 0
//! for each group g:                      (in order)
//!     s = 0
//!     for each block b of g:             (in order)
//!         p = Σ_{c in b} level[idx(r, c)] · q[c]        (exact, int32)
//!         s = fma(f32(p), scale[b], s)
//!     acc = fma(s, nf[r, g], acc)        (nf = norm · codebook scale)
//! row = acc
//! ```
//!
//! **The layout** ([`FastMatrix`]): rows are repacked into **tiles** of
//! [`TILE`] rows. A tile stores, per block and per 32-bit word of a row's
//! indices in that block (`bits` words: `32 / bits` columns each), one 64-byte
//! line: row `i` of the tile at bytes `4i .. 4i + 4`. A word's byte `β` holds,
//! at bits `p · bits`, the index of the word's column `4p + β`: its **plane**
//! `p` (`8 / bits` planes) is then four *consecutive* columns, so the input
//! stays in natural order and one broadcast 32-bit load of it serves all 16
//! rows. A plane is one mask (after a 4-bit shift for the planes in a byte's
//! high nibble) and one `vpshufb` of a 16-entry table that holds level `i` at
//! `i << (p·bits mod 4)`. Each group of four rows (one 128-bit lane of the
//! lookup) has its own table, so a tile may hold rows of several matrices
//! ([`FastMatrix::new`] fuses matrices that share an input, each padded to a
//! multiple of four rows). Results accumulate per row in a register lane: no
//! horizontal sums, and one conversion and `fma` per block and input.

use super::matrix::CqMatrix;
use crate::host::pool::Pool;
use crate::kernels::kv::quantize_int8_scalar;
use std::ops::Range;

mod product;
mod sink;
pub use product::{FastProduct, FastSet};
use sink::{Sink, MAX_PARTS};

/// Values per int8 activation block (SPEC §6.1: at most 32, within one group).
pub const BLOCK: usize = 32;

/// Rows per tile (one 512-bit register of 32-bit lanes).
pub const TILE: usize = 16;

/// Rows that share one lookup table (a 128-bit lane of `vpshufb`); fused
/// parts are padded to a multiple of this.
pub const QUAD: usize = 4;

/// Bytes of one tile line: a 32-bit word of every row of the tile.
const LINE: usize = 4 * TILE;

/// Below this many weight bytes times inputs, a product runs on the caller
/// alone (a hand-out to the pool costs more).
const PARALLEL_BYTES: usize = 1 << 14;

/// From this many weight bytes times inputs, a product split by tiles lets a
/// part that is done take tiles from another (`Pool::steal_runs`); below,
/// each part runs its half, since stealing's traffic between the cores
/// (~0.5 µs a job) outweighs what it balances in a decode step's small
/// matvecs.
const STEAL_BYTES: usize = 1 << 20;

/// From this many inputs a part, a product split over the pool splits its
/// inputs, not its tiles (see `FastMatrix::run`): two passes of the widest
/// kernel a part at least.
const SPLIT_INPUTS: usize = 16;

/// A prepared input quantized per §6.1: int8 codes in natural order, and per
/// block its scale and the VNNI kernels' bias. Buffers are reused.
#[derive(Debug, Default, Clone)]
pub struct FastInput {
    len: usize,
    q: Vec<i8>,
    scales: Vec<f32>,
    /// Per block, `−128 · Σ q` (the VNNI kernels start a block's sum there to
    /// take back their `+128` level bias).
    bias: Vec<i32>,
}

impl FastInput {
    /// Quantize `prep` (a prepared input, a whole number of blocks long): block
    /// `b`'s scale is `max(1e-12, max|x|) / 127` and its codes
    /// `clamp(round_half_even(x / scale), ±127)` (§4.3's store); a block holding
    /// a NaN gets a NaN scale, so the NaN reaches the output.
    ///
    /// # Panics
    /// If `prep.len()` is not a multiple of [`BLOCK`].
    pub fn quantize(&mut self, prep: &[f32]) {
        assert!(prep.len().is_multiple_of(BLOCK), "fast input: whole blocks");
        let blocks = prep.len() / BLOCK;
        self.len = prep.len();
        self.q.resize(prep.len(), 0);
        self.scales.resize(blocks, 0.0);
        self.bias.resize(blocks, 0);
        #[cfg(target_arch = "x86_64")]
        if x86::quantize(prep, &mut self.q, &mut self.scales, &mut self.bias) {
            return;
        }
        self.quantize_scalar(prep);
    }

    /// [`FastInput::quantize`]'s scalar loop (the SIMD ones equal it).
    fn quantize_scalar(&mut self, prep: &[f32]) {
        let blocks = prep.chunks_exact(BLOCK).zip(self.q.chunks_exact_mut(BLOCK));
        for (b, (x, q)) in blocks.enumerate() {
            let scale = quantize_int8_scalar(x, q);
            let nan = x.iter().any(|v| v.is_nan());
            self.scales[b] = if nan { f32::NAN } else { scale };
            self.bias[b] = -128 * q.iter().map(|&v| i32::from(v)).sum::<i32>();
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

    /// The int8 codes, natural order.
    pub fn codes(&self) -> &[i8] {
        &self.q[..self.len]
    }

    /// The block scales.
    pub fn scales(&self) -> &[f32] {
        &self.scales[..self.len / BLOCK]
    }
}

/// Which fast kernel runs (see [`FastKernel::for_simd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastKernel {
    /// The scalar reference.
    Scalar,
    /// AVX2: `vpshufb` lookup, `vpmaddubsw` + `vpmaddwd` with the sign trick.
    Avx2,
    /// AVX-VNNI or AVX-512 VNNI at 256 bits: `vpdpbusd` on biased levels.
    Vnni,
    /// AVX-512 VNNI at 512 bits: a whole tile per instruction.
    Vnni512,
}

impl FastKernel {
    /// The best kernel this CPU runs at `simd`: `Scalar` there; at `Avx2` the
    /// AVX2 kernel, or 256-bit VNNI where AVX-VNNI is present; at `Avx512` the
    /// 512-bit VNNI one where AVX-512 VNNI is present, else the best 256-bit one.
    pub fn for_simd(simd: crate::host::simd::CpuSimd) -> FastKernel {
        use crate::host::simd::CpuSimd;
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
            if crate::host::simd::CpuSimd::available().contains(&crate::host::simd::CpuSimd::Avx2) {
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

/// The rows of one or more CQ matrices that share an input, repacked into
/// tiles for the §6.1 kernels (module doc). Output row `off + i` of a part is
/// row `range.start + i` of its matrix; parts start at multiples of [`QUAD`]
/// and the rows between parts are zero.
#[derive(Debug, Clone)]
pub struct FastMatrix {
    bits: u32,
    group: usize,
    groups: usize,
    /// Blocks per row.
    blocks: usize,
    /// Output rows: the last part's end.
    rows: usize,
    tiles: usize,
    /// Each part's output rows.
    parts: Vec<Range<usize>>,
    /// `[tiles, blocks, bits]` lines of [`LINE`] bytes.
    data: Vec<u8>,
    /// `[tiles, groups, TILE]`: norm times codebook scale (0 on padding rows).
    nf: Vec<f32>,
    /// Per tile, per quad of rows, the 16-entry plane table of its levels.
    tables: Vec<[i8; LINE]>,
    /// `tables` plus 128, as unsigned bytes (the VNNI kernels' operand).
    biased: Vec<[u8; LINE]>,
}

impl FastMatrix {
    /// All rows of `m`, or `None` where §6.1 does not apply (8-bit codebooks:
    /// adjacent levels of 256 merge in int8).
    pub fn of(m: &CqMatrix) -> Option<FastMatrix> {
        FastMatrix::new(&[(m, 0..m.rows())])
    }

    /// Rows `range` of each matrix of `parts`, fused in that order, or `None`
    /// where §6.1 does not apply: a part of 8 bits, parts of different widths,
    /// groups or padded lengths (they must share one input), an empty list, a
    /// range outside its matrix, or more than 8 parts.
    pub fn new(parts: &[(&CqMatrix, Range<usize>)]) -> Option<FastMatrix> {
        let (first, _) = parts.first()?;
        let (bits, group, groups) = (first.bits(), first.group(), first.groups());
        let fits = |(m, r): &(&CqMatrix, Range<usize>)| {
            (m.bits(), m.group(), m.groups()) == (bits, group, groups)
                && r.start <= r.end
                && r.end <= m.rows()
        };
        let many = parts.len() > MAX_PARTS;
        if bits > 4 || !group.is_multiple_of(BLOCK) || !parts.iter().all(fits) || many {
            return None;
        }
        let mut ranges = Vec::with_capacity(parts.len());
        let mut at = 0;
        for (_, r) in parts {
            ranges.push(at..at + r.len());
            at = (at + r.len()).next_multiple_of(QUAD);
        }
        let rows = ranges.last().map_or(0, |r| r.end);
        let tiles = rows.div_ceil(TILE);
        let blocks = groups * group / BLOCK;
        let b = bits as usize;
        let mut fm = FastMatrix {
            bits,
            group,
            groups,
            blocks,
            rows,
            tiles,
            parts: ranges,
            data: vec![0; tiles * blocks * b * LINE],
            nf: vec![0.0; tiles * groups * TILE],
            tables: vec![[0; LINE]; tiles],
            biased: vec![[128; LINE]; tiles],
        };
        let per = 8 / b;
        let word_cols = 32 / b;
        let mut idx = Vec::with_capacity(groups * group);
        for ((m, src), out) in parts.iter().zip(fm.parts.clone()) {
            let mut levels = [0i8; 16];
            let scale = quantize_int8_scalar(m.codebook(), &mut levels[..1 << b]);
            for (r_in, r) in src.clone().zip(out) {
                let (tile, lane) = (r / TILE, r % TILE);
                let quad = lane / QUAD;
                for p in 0..per {
                    let shift = (p * b) % 4;
                    for (i, &l) in levels[..1 << b].iter().enumerate() {
                        fm.tables[tile][quad * 16 + (i << shift)] = l;
                        fm.biased[tile][quad * 16 + (i << shift)] = (i16::from(l) + 128) as u8;
                    }
                }
                for g in 0..groups {
                    fm.nf[(tile * groups + g) * TILE + lane] = m.norms()[r_in * groups + g] * scale;
                }
                // The row's indices, a byte each (SPEC §2's order: LSB first).
                idx.clear();
                let row = &m.packed()[r_in * m.row_bytes()..(r_in + 1) * m.row_bytes()];
                let mask = ((1u16 << b) - 1) as u8;
                idx.extend(
                    row.iter()
                        .flat_map(|&x| (0..per).map(move |p| (x >> (p * b)) & mask)),
                );
                // Word k of block blk: byte β holds columns k·word_cols + 4p + β.
                for (blk, cols) in idx.chunks_exact(BLOCK).enumerate() {
                    for (k, word) in cols.chunks_exact(word_cols).enumerate() {
                        let at = ((tile * blocks + blk) * b + k) * LINE + 4 * lane;
                        for (beta, byte) in fm.data[at..at + 4].iter_mut().enumerate() {
                            *byte = (0..per).fold(0, |acc, p| acc | word[4 * p + beta] << (p * b));
                        }
                    }
                }
            }
        }
        Some(fm)
    }

    /// Output rows (the last part's end).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The output rows of part `i`.
    ///
    /// # Panics
    /// If there is no part `i`.
    pub fn part(&self, i: usize) -> Range<usize> {
        self.parts[i].clone()
    }

    /// Bits per index (1, 2 or 4).
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// The input length (groups · group).
    pub fn padded(&self) -> usize {
        self.groups * self.group
    }

    /// Bytes the kernels read for one input: index lines, norms, tables.
    pub fn bytes(&self) -> usize {
        self.data.len() + self.nf.len() * 4 + self.tables.len() * LINE
    }

    /// Every output row for each input of `xs` (quantized from this matrix's
    /// prepared input) into `out` (`[xs.len(), rows]`), with `kernel`, tiles
    /// split over the CPU pool when the work is worth it. Every value is
    /// bit-identical to [`FastMatrix::row_dot_scalar`].
    ///
    /// # Panics
    /// If an input has another length, `out` has another length, or this CPU
    /// lacks `kernel`.
    pub fn matmul(&self, kernel: FastKernel, xs: &[FastInput], out: &mut [f32]) {
        assert_eq!(
            out.len(),
            xs.len() * self.rows,
            "fast matmul: output length"
        );
        let mut sink = Sink::new();
        sink.push(0..self.rows, out.as_mut_ptr(), self.rows);
        self.run(kernel, xs, &sink);
    }

    /// [`FastMatrix::matmul`] with each part's rows straight to its own
    /// output: part `k` into `outs[ids[k]]` (`[xs.len(), part rows]`).
    ///
    /// # Panics
    /// As [`FastMatrix::matmul`], or if `ids` does not name one distinct
    /// output of the right length per part.
    pub fn matmul_parts(
        &self,
        kernel: FastKernel,
        xs: &[FastInput],
        outs: &mut [&mut [f32]],
        ids: &[usize],
    ) {
        assert_eq!(
            ids.len(),
            self.parts.len(),
            "fast matmul: one output a part"
        );
        let mut sink = Sink::new();
        for (k, &id) in ids.iter().enumerate() {
            assert!(!ids[..k].contains(&id), "fast matmul: outputs shared");
            let part = self.parts[k].clone();
            let out = &mut outs[id];
            assert_eq!(
                out.len(),
                xs.len() * part.len(),
                "fast matmul: output length"
            );
            sink.push(part.clone(), out.as_mut_ptr(), part.len());
        }
        self.run(kernel, xs, &sink);
    }

    /// [`FastMatrix::matmul`] of one input.
    ///
    /// # Panics
    /// As [`FastMatrix::matmul`].
    pub fn matvec(&self, kernel: FastKernel, x: &FastInput, out: &mut [f32]) {
        self.matmul(kernel, std::slice::from_ref(x), out);
    }

    /// Every tile against every input into `sink`, split over the pool.
    fn run(&self, kernel: FastKernel, xs: &[FastInput], sink: &Sink) {
        for x in xs {
            assert_eq!(x.len, self.padded(), "fast matmul: input length");
        }
        assert!(
            FastKernel::available().contains(&kernel),
            "fast matmul: {kernel:?} is not available on this CPU"
        );
        if xs.is_empty() || self.rows == 0 {
            return;
        }
        let pool = Pool::global();
        let work = self.data.len() * xs.len();
        // SAFETY (every arm): the tile ranges, or the input ranges, are
        // disjoint, so each output element is written by one part only; the
        // sink's outputs are borrowed mutably by the callers above for this
        // call.
        let (n, parts) = (xs.len(), pool.threads());
        if work < PARALLEL_BYTES || parts == 1 || self.tiles < 2 {
            unsafe { self.tiles_dot(kernel, 0..self.tiles, xs, sink) };
        } else if n >= SPLIT_INPUTS * parts {
            // Many inputs (a prefill chunk): part p owns the inputs from
            // n·p/parts (the runs by which the CPU engine splits its
            // per-token work, so each part reads inputs that it quantized and
            // writes outputs that it reads next, in its own cache; split by
            // tiles, every output line would move between cores twice a
            // product) and runs them through the tiles in order; a part done
            // with its own takes tiles from the end of another's
            // (`Pool::steal_runs`). Unit `u`: the inputs of part u / tiles,
            // tile u % tiles.
            let tiles = self.tiles;
            let inputs = |q: usize| n * q / parts..n * (q + 1) / parts;
            pool.steal_runs(parts * tiles, &|q| q * tiles, &|_, units| {
                let q = units.start / tiles;
                let r = inputs(q);
                let sink = sink.skip_inputs(r.start);
                let run = units.start % tiles..(units.end - 1) % tiles + 1;
                unsafe { self.tiles_dot(kernel, run, &xs[r], &sink) }
            });
        } else if work >= STEAL_BYTES {
            pool.steal_runs(self.tiles, &|q| self.tiles * q / parts, &|_, run| unsafe {
                self.tiles_dot(kernel, run, xs, sink)
            });
        } else {
            pool.for_ranges(self.tiles, 1, &|r| unsafe {
                self.tiles_dot(kernel, r, xs, sink)
            });
        }
    }

    /// Tiles `tiles` against every input into `sink`.
    ///
    /// # Safety
    /// No other thread touches these tiles' output rows meanwhile; `kernel`
    /// is available; the sink's outputs are live.
    unsafe fn tiles_dot(
        &self,
        kernel: FastKernel,
        tiles: Range<usize>,
        xs: &[FastInput],
        sink: &Sink,
    ) {
        #[cfg(target_arch = "x86_64")]
        if kernel != FastKernel::Scalar {
            // SAFETY: forwarded; `available` listed the kernel.
            unsafe { x86::tiles_dot(kernel, self, tiles, xs, sink) };
            return;
        }
        let _ = kernel;
        for tile in tiles {
            for (t, x) in xs.iter().enumerate() {
                let v = std::array::from_fn(|i| {
                    let r = tile * TILE + i;
                    if r < self.rows {
                        self.row_dot_scalar(r, x)
                    } else {
                        0.0
                    }
                });
                // SAFETY: forwarded.
                unsafe { sink.put(tile, t, &v) };
            }
        }
    }

    /// Output row `r` against `x` by the module doc's arithmetic, one
    /// column at a time (the reference every kernel equals bit for bit).
    ///
    /// # Panics
    /// If `r >= rows` or `x` has another length.
    pub fn row_dot_scalar(&self, r: usize, x: &FastInput) -> f32 {
        assert!(r < self.rows, "fast row: out of range");
        assert_eq!(x.len, self.padded(), "fast row: input length");
        let b = self.bits as usize;
        let (tile, lane) = (r / TILE, r % TILE);
        let table = &self.tables[tile][lane / QUAD * 16..][..16];
        let word_cols = 32 / b;
        let blocks_per_group = self.group / BLOCK;
        let mut acc = 0.0f32;
        for g in 0..self.groups {
            let mut s = 0.0f32;
            for blk in g * blocks_per_group..(g + 1) * blocks_per_group {
                let mut p = 0i32;
                for j in 0..BLOCK {
                    let (k, jj) = (j / word_cols, j % word_cols);
                    let (plane, beta) = (jj / 4, jj % 4);
                    let byte =
                        self.data[((tile * self.blocks + blk) * b + k) * LINE + 4 * lane + beta];
                    let idx = (byte >> (plane * b)) & ((1 << b) - 1);
                    let q = x.q[blk * BLOCK + j];
                    p += i32::from(table[usize::from(idx)]) * i32::from(q);
                }
                s = (p as f32).mul_add(x.scales[blk], s);
            }
            acc = s.mul_add(self.nf[(tile * self.groups + g) * TILE + lane], acc);
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;
