//! The scalar reference inner loops of the CQ matvec (SPEC §2): byte lookup
//! tables for 2 and 4 bits, the generic loop for any width, and one group's dot
//! product built on them ([`Lut::dot`]; `matrix.rs` sums them into rows). The
//! SIMD kernels of `simd.rs` are checked against these (the plain reference
//! beside the fast path, like candle's `vec_dot_unopt`).

/// Byte lookup tables of SEED §3: one packed byte yields 4 (2-bit) or 2 (4-bit) levels.
#[derive(Debug, Clone)]
pub(super) enum Lut {
    None,
    Two(Box<[[f32; 4]; 256]>),
    Four(Box<[[f32; 2]; 256]>),
}

impl Lut {
    /// The table for a codebook of `bits`-bit levels (`None` for 1 and 8 bits).
    pub(super) fn build(bits: u32, codebook: &[f32]) -> Lut {
        match bits {
            2 => {
                let mut t = Box::new([[0.0f32; 4]; 256]);
                for (b, e) in t.iter_mut().enumerate() {
                    for (k, v) in e.iter_mut().enumerate() {
                        *v = codebook[(b >> (2 * k)) & 3];
                    }
                }
                Lut::Two(t)
            }
            4 => {
                let mut t = Box::new([[0.0f32; 2]; 256]);
                for (b, e) in t.iter_mut().enumerate() {
                    e[0] = codebook[b & 15];
                    e[1] = codebook[b >> 4];
                }
                Lut::Four(t)
            }
            _ => Lut::None,
        }
    }

    /// One group's `Σ_c codebook[q[c]] · x[c]` for its packed `bytes`: the
    /// table's loop, or the generic one (for `bits`-bit indices into `codebook`)
    /// where there is no table.
    #[inline]
    pub(super) fn dot(&self, codebook: &[f32], bits: u32, bytes: &[u8], x: &[f32]) -> f32 {
        match self {
            Lut::Four(t) => dot4(t, bytes, x),
            Lut::Two(t) => dot2(t, bytes, x),
            Lut::None => dot_generic(codebook, bits, bytes, x),
        }
    }
}

#[inline]
fn dot4(t: &[[f32; 2]; 256], bytes: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (b4, x8) in bytes.chunks_exact(4).zip(x.chunks_exact(8)) {
        for j in 0..4 {
            let l = &t[b4[j] as usize];
            acc[2 * j] += l[0] * x8[2 * j];
            acc[2 * j + 1] += l[1] * x8[2 * j + 1];
        }
    }
    acc.iter().sum()
}

#[inline]
fn dot2(t: &[[f32; 4]; 256], bytes: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (b2, x8) in bytes.chunks_exact(2).zip(x.chunks_exact(8)) {
        let l0 = &t[b2[0] as usize];
        let l1 = &t[b2[1] as usize];
        for k in 0..4 {
            acc[k] += l0[k] * x8[k];
            acc[4 + k] += l1[k] * x8[4 + k];
        }
    }
    acc.iter().sum()
}

#[inline]
pub(super) fn dot_generic(codebook: &[f32], bits: u32, bytes: &[u8], x: &[f32]) -> f32 {
    let mask = (1usize << bits) - 1;
    let mut acc = 0.0f32;
    for (c, &xv) in x.iter().enumerate() {
        let bit = c * bits as usize;
        let idx = (bytes[bit >> 3] as usize >> (bit & 7)) & mask;
        acc += codebook[idx] * xv;
    }
    acc
}
