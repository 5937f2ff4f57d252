//! The 512-bit VNNI kernel over eight inputs **packed block-interleaved**: a
//! group of eight inputs copied so that each block's eight runs of 32 codes lie
//! side by side (`[blocks][8][32]` bytes), with the eight scales and biases of
//! each block beside one another ([`Meta`]).
//!
//! Why: in the plain kernel ([`super::tile`]) each of a block's 64 `vpdpbusd`
//! reads its input's four codes through base + index addressing (eight
//! buffers, one loop index), and Intel cores split ("unlaminate") such a
//! micro-fused load when they rename it, so the out-of-order window holds
//! fewer of the block's instructions and its eight dependency chains stall
//! each other. Packed, a plane's eight dot products read `[q + 32·t]` off one
//! pointer, with the displacement in the instruction (written as one `asm!`
//! block: the compiler otherwise folds the pointer's increments back into an
//! index register). The arithmetic, the order of every sum and so every value
//! are the plain kernel's (the tests hold both to the scalar reference).
//!
//! Packing costs a copy of the inputs' codes, about one tile's work for each
//! input, once per product call and thread: a thread's packed copy is kept,
//! keyed by the call's [`Sink::stamp`] and the inputs, for its later tile runs
//! of the same call (the pool hands out tiles in several runs, see
//! `Pool::steal_runs`). It runs for matrices of [`PACK_TILES`] tiles or more
//! and calls of eight inputs or more.

use super::super::{FastInput, FastMatrix, Sink, BLOCK, LINE, TILE};
use super::{drive, rests, Reg, DOT_EVEX, Y, Z};
use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

/// Inputs a packed group holds (the 512-bit kernel's pass).
const GROUP: usize = 8;

/// From this many tiles a matrix, packing the inputs pays (it costs about one
/// tile's work; the packed kernel saves a fifth of each tile's).
const PACK_TILES: usize = 8;

/// One block's scales and biases of the eight inputs of a group.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
struct Meta {
    scales: [f32; GROUP],
    bias: [i32; GROUP],
}

/// A call's full groups of inputs, packed ([`Packed::pack`]); one per
/// thread, reused by the same call's later runs and then by the next call.
#[derive(Debug, Default)]
struct Packed {
    /// `[groups, blocks, 8, 32]` codes.
    q: Vec<i8>,
    /// `[groups, blocks]`.
    meta: Vec<Meta>,
    blocks: usize,
    /// The call (its sink's stamp) and inputs (address, count) packed now.
    key: (u64, usize, usize),
}

impl Packed {
    /// The full groups of eight of `xs` (each `blocks` blocks long), packed;
    /// `false` if the buffers can't grow (the caller then runs unpacked).
    fn pack(&mut self, xs: &[FastInput], blocks: usize, stamp: u64) -> bool {
        let key = (stamp, xs.as_ptr() as usize, xs.len());
        if self.key == key {
            return true;
        }
        self.key = (0, 0, 0);
        let groups = xs.len() / GROUP;
        let (nq, nm) = (groups * blocks * GROUP * BLOCK, groups * blocks);
        let grow = |len: usize, need: usize| need.saturating_sub(len);
        if self.q.try_reserve(grow(self.q.len(), nq)).is_err()
            || self.meta.try_reserve(grow(self.meta.len(), nm)).is_err()
        {
            return false;
        }
        self.q.resize(nq.max(self.q.len()), 0);
        self.meta.resize(nm.max(self.meta.len()), Meta::default());
        self.blocks = blocks;
        for (g, group) in xs.chunks_exact(GROUP).enumerate() {
            let group: &[FastInput; GROUP] = group.try_into().expect("a group of eight");
            for x in group {
                assert!(x.q.len() >= blocks * BLOCK && x.scales.len() >= blocks);
                assert!(x.bias.len() >= blocks);
            }
            // Written in order: a block's eight runs of codes, then its meta.
            let (q, meta) = (
                &mut self.q[g * blocks * GROUP * BLOCK..],
                &mut self.meta[g * blocks..],
            );
            for blk in 0..blocks {
                let dst = &mut q[blk * GROUP * BLOCK..(blk + 1) * GROUP * BLOCK];
                for (t, x) in group.iter().enumerate() {
                    // SAFETY: both runs of BLOCK codes are in bounds (asserted
                    // and sliced above).
                    unsafe {
                        let src = x.q.as_ptr().add(blk * BLOCK);
                        std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr().add(t * BLOCK), BLOCK);
                    }
                }
                meta[blk] = Meta {
                    scales: std::array::from_fn(|t| group[t].scales[blk]),
                    bias: std::array::from_fn(|t| group[t].bias[blk]),
                };
            }
        }
        self.key = key;
        true
    }

    /// Group `g`'s codes and block data.
    fn group(&self, g: usize) -> (*const i8, *const Meta) {
        let at = g * self.blocks;
        (
            self.q[at * GROUP * BLOCK..].as_ptr(),
            self.meta[at..].as_ptr(),
        )
    }
}

thread_local! {
    static PACKED: RefCell<Packed> = RefCell::new(Packed::default());
}

/// [`super::drive`] for the 512-bit kernel at `BITS`: packed where it pays
/// (module doc), the plain kernel otherwise and for the inputs after the last
/// full group; a last tile of at most 8 rows in the plain kernel's 256-bit
/// form.
///
/// # Safety
/// As [`super::drive`]; the CPU has AVX-512 F/BW/VL and VNNI.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vl")]
pub(super) unsafe fn drive_512<const BITS: u32>(
    fm: &FastMatrix,
    tiles: Range<usize>,
    xs: &[FastInput],
    sink: &Sink,
) {
    unsafe {
        // A last tile of at most 8 rows (Φ's 24 rows: 16 + 8) in 256-bit
        // registers, the same arithmetic on half the lanes.
        let last = fm.tiles - 1;
        if tiles.contains(&last) && fm.rows - last * TILE <= TILE / 2 {
            if tiles.start < last {
                drive_512::<BITS>(fm, tiles.start..last, xs, sink);
            }
            return drive::<Y<DOT_EVEX>, BITS, GROUP>(fm, last..last + 1, xs, sink);
        }
        if fm.tiles < PACK_TILES || xs.len() < GROUP {
            return drive::<Z, BITS, GROUP>(fm, tiles, xs, sink);
        }
        PACKED.with(|p| {
            let Ok(mut p) = p.try_borrow_mut() else {
                return drive::<Z, BITS, GROUP>(fm, tiles.clone(), xs, sink);
            };
            if !p.pack(xs, fm.blocks, sink.stamp) {
                return drive::<Z, BITS, GROUP>(fm, tiles.clone(), xs, sink);
            }
            let full = xs.len() / GROUP * GROUP;
            for tl in tiles.clone() {
                for g in 0..full / GROUP {
                    let (q, meta) = p.group(g);
                    let mut v = [[0.0f32; TILE]; GROUP];
                    tile8::<BITS>(fm, tl, q, meta, &mut v);
                    for (k, v) in v.iter().enumerate() {
                        sink.put(tl, g * GROUP + k, v);
                    }
                }
                rests::<Z, BITS, GROUP>(fm, tl, xs, full, sink);
            }
        })
    }
}

/// Tile `tile` against a packed group (`q`, `meta`: [`Packed::group`]):
/// [`super::tile`]'s arithmetic for eight inputs, each row's values of input
/// `t` in `out[t]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::needless_range_loop)]
unsafe fn tile8<const BITS: u32>(
    fm: &FastMatrix,
    tile: usize,
    q: *const i8,
    meta: *const Meta,
    out: &mut [[f32; TILE]; GROUP],
) {
    unsafe {
        let b = BITS as usize;
        let per = 8 / b;
        let table = Z::table(fm.biased[tile].as_ptr());
        let mut mask = [Z::zero_i(); 8];
        for (p, m) in mask.iter_mut().enumerate().take(per) {
            *m = Z::splat8((((1u32 << BITS) - 1) << ((p * b) % 4)) as u8);
        }
        let mut data = fm.data.as_ptr().add(tile * fm.blocks * b * LINE);
        let nf = fm.nf.as_ptr().add(tile * fm.groups * TILE);
        let per_group = fm.group / BLOCK;
        let (mut q, mut meta) = (q, meta);
        let mut acc = [Z::zero_f(); GROUP];
        for g in 0..fm.groups {
            let mut s = [Z::zero_f(); GROUP];
            for _ in 0..per_group {
                let m = &*meta;
                let mut p: [__m512i; GROUP] = std::array::from_fn(|t| Z::splat_i(m.bias[t]));
                for k in 0..b {
                    let v = Z::load(data.add(k * LINE));
                    let hi = Z::high_nibbles(v);
                    for plane in 0..per {
                        let src = if plane * b < 4 { v } else { hi };
                        let l = Z::lookup(table, Z::and(src, mask[plane]));
                        dot8(&mut p, l, q.add(4 * (k * per + plane)));
                    }
                }
                for t in 0..GROUP {
                    s[t] = Z::fma(Z::cvt(p[t]), Z::splat_f(m.scales[t]), s[t]);
                }
                q = q.add(GROUP * BLOCK);
                meta = meta.add(1);
                data = data.add(b * LINE);
            }
            let n = Z::load_f(nf.add(g * TILE));
            for t in 0..GROUP {
                acc[t] = Z::fma(s[t], n, acc[t]);
            }
        }
        for t in 0..GROUP {
            Z::store_f(out[t].as_mut_ptr(), acc[t]);
        }
    }
}

/// `p[t] += l · (the four codes at q + 32·t)` per 32-bit lane, for the eight
/// inputs of a packed group: `vpdpbusd` with a broadcast memory operand off
/// the one pointer `q` (see the module doc).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dot8(p: &mut [__m512i; GROUP], l: __m512i, q: *const i8) {
    let [p0, p1, p2, p3, p4, p5, p6, p7] = p;
    // SAFETY: reads 4 bytes at q + 32·t for t < 8, inside the packed block
    // (the caller's pointer); touches no other memory, flags or stack.
    unsafe {
        asm!(
            "vpdpbusd {p0}, {l}, dword ptr [{q}]{{1to16}}",
            "vpdpbusd {p1}, {l}, dword ptr [{q} + 32]{{1to16}}",
            "vpdpbusd {p2}, {l}, dword ptr [{q} + 64]{{1to16}}",
            "vpdpbusd {p3}, {l}, dword ptr [{q} + 96]{{1to16}}",
            "vpdpbusd {p4}, {l}, dword ptr [{q} + 128]{{1to16}}",
            "vpdpbusd {p5}, {l}, dword ptr [{q} + 160]{{1to16}}",
            "vpdpbusd {p6}, {l}, dword ptr [{q} + 192]{{1to16}}",
            "vpdpbusd {p7}, {l}, dword ptr [{q} + 224]{{1to16}}",
            p0 = inout(zmm_reg) *p0,
            p1 = inout(zmm_reg) *p1,
            p2 = inout(zmm_reg) *p2,
            p3 = inout(zmm_reg) *p3,
            p4 = inout(zmm_reg) *p4,
            p5 = inout(zmm_reg) *p5,
            p6 = inout(zmm_reg) *p6,
            p7 = inout(zmm_reg) *p7,
            l = in(zmm_reg) l,
            q = in(reg) q,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
}
