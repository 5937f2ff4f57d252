//! A test-only, deliberately naive f64 implementation of the SPEC §4 token step.
//!
//! It is written from `SPEC.md` alone and shares no arithmetic with the engine:
//! CQ matrices are reconstructed densely from their stored tensors with a
//! Walsh–Hadamard matrix built from the Sylvester sign rule
//! `H[i][j] = (−1)^popcount(i & j)`, the KV cache is an unbounded list indexed by
//! logical position (no ring), attended positions come straight from the set `S`
//! of §4.3, and the engram keeps every past value vector. Everything is f64 except
//! the int8 codes of the KV cache, which the SPEC makes part of the arithmetic.
//!
//! Only plain data is read from the crate: the config, the stored tensors of each
//! CQ matrix (codebook, norms, packed bytes) and the F32 vectors. The same step
//! also runs on dense float weights ([`NaiveModel::from_dense`]: a float
//! checkpoint of `cqlm pack`, unquantized).
#![allow(clippy::needless_range_loop)]

use cqlm::archive::engram_table_names;
use cqlm::archive::FloatTensor;
use cqlm::cq::CqMatrix;
use cqlm::model::weights::SiteWeights;
use cqlm::{Config, Model};
use std::collections::BTreeMap;

const EPS: f64 = 1e-6;

// ---------------------------------------------------------------------------
// Elementwise helpers of SPEC §0.

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// `x / sqrt(mean(x²) + ε)`.
pub fn rms_unit(x: &[f64]) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + EPS).sqrt();
    x.iter().map(|v| v * inv).collect()
}

/// `rms_unit(x) ⊙ (1 + w)`.
pub fn zcrms(x: &[f64], w: &[f64]) -> Vec<f64> {
    assert_eq!(x.len(), w.len());
    rms_unit(x)
        .iter()
        .zip(w)
        .map(|(a, g)| a * (1.0 + g))
        .collect()
}

/// `lse(v) = m + ln Σ exp(v − m)`.
pub fn lse(v: &[f64]) -> f64 {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// Sylvester Hadamard sign: `(−1)^popcount(i & j)`.
fn hsign(i: usize, j: usize) -> f64 {
    if (i & j).count_ones().is_multiple_of(2) {
        1.0
    } else {
        -1.0
    }
}

/// The orthonormal Walsh–Hadamard transform `H·x / sqrt(n)` as a plain
/// matrix–vector product (`n` a power of two).
pub fn nwht(x: &[f64]) -> Vec<f64> {
    let n = x.len();
    assert!(n.is_power_of_two());
    let inv = 1.0 / (n as f64).sqrt();
    (0..n)
        .map(|i| (0..n).map(|j| hsign(i, j) * x[j]).sum::<f64>() * inv)
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

// ---------------------------------------------------------------------------
// SPEC §2: dense reconstruction of a CQ matrix.

/// Codebook index of column `c` of row `r`, read from the packed bytes per SPEC §2
/// (`bit = c·bits`, `(packed[r, bit >> 3] >> (bit & 7)) & (2^bits − 1)`).
pub fn spec_index(m: &CqMatrix, r: usize, c: usize) -> usize {
    let bits = m.bits() as usize;
    let row_bytes = m.groups() * m.group() * bits / 8;
    let bit = c * bits;
    let byte = m.packed()[r * row_bytes + (bit >> 3)] as usize;
    (byte >> (bit & 7)) & ((1 << bits) - 1)
}

/// `W[r, 0..cols]` in f64: per group `k`, `norms[r,k] · nfwht(q[r, group k])`.
pub fn dense_row(m: &CqMatrix, r: usize) -> Vec<f64> {
    let (g, groups, cols) = (m.group(), m.groups(), m.cols());
    assert!(g.is_power_of_two() && g >= 32);
    assert!(cols <= groups * g && groups * g < cols + g);
    let codebook = m.codebook();
    let mut out = Vec::with_capacity(groups * g);
    for k in 0..groups {
        let q: Vec<f64> = (0..g)
            .map(|j| {
                let idx = spec_index(m, r, k * g + j);
                debug_assert_eq!(idx, m.index(r, k * g + j));
                codebook[idx] as f64
            })
            .collect();
        let norm = m.norms()[r * groups + k] as f64;
        out.extend(nwht(&q).into_iter().map(|v| norm * v));
    }
    out.truncate(cols);
    out
}

/// A dense f64 `rows × cols` matrix.
#[derive(Debug, Clone)]
pub struct Dense {
    pub rows: usize,
    pub cols: usize,
    pub w: Vec<f64>,
}

impl Dense {
    pub fn from_cq(m: &CqMatrix) -> Dense {
        let mut w = Vec::with_capacity(m.rows() * m.cols());
        for r in 0..m.rows() {
            w.extend(dense_row(m, r));
        }
        Dense {
            rows: m.rows(),
            cols: m.cols(),
            w,
        }
    }

    pub fn row(&self, r: usize) -> &[f64] {
        &self.w[r * self.cols..(r + 1) * self.cols]
    }

    /// Rows `first .. first + count` of `W·x`.
    pub fn matvec_rows(&self, x: &[f64], first: usize, count: usize) -> Vec<f64> {
        assert_eq!(x.len(), self.cols);
        (first..first + count)
            .map(|r| dot(self.row(r), x))
            .collect()
    }

    pub fn matvec(&self, x: &[f64]) -> Vec<f64> {
        self.matvec_rows(x, 0, self.rows)
    }
}

// ---------------------------------------------------------------------------
// The model, densified once.

pub struct NaiveLayer {
    pub attn_norm: Vec<f64>,
    pub attn_post_norm: Vec<f64>,
    pub mlp_norm: Vec<f64>,
    pub wq: Dense,
    pub wk: Dense,
    pub wv: Dense,
    pub wg: Dense,
    pub wo: Dense,
    pub q_norm: Vec<f64>,
    pub k_norm: Vec<f64>,
    pub attn_out_scale: f64,
    pub d1: Vec<f64>,
    pub d2: Vec<f64>,
    pub d3: Vec<f64>,
}

pub struct NaiveSite {
    pub layer: usize,
    pub wk: Dense,
    pub wv: Dense,
    /// `[taps, hidden]`.
    pub conv: Vec<f64>,
    pub norm_u: Vec<f64>,
    pub norm_k: Vec<f64>,
}

pub struct NaiveEngram {
    pub orders: Vec<usize>,
    pub hash_heads: usize,
    pub dim: usize,
    pub taps: usize,
    pub dilation: usize,
    /// Tables in gather order (orders as listed, heads ascending), each `[T, dim]`.
    pub tables: Vec<Dense>,
    pub sites: Vec<NaiveSite>,
}

pub struct NaiveModel {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub hadamard_dim: usize,
    pub rope_theta: f64,
    pub sink: usize,
    pub window: usize,
    pub sinkhorn_iters: usize,
    pub embed: Dense,
    pub final_norm: Vec<f64>,
    pub phi_pre: Dense,
    pub phi_post: Dense,
    pub phi_res: Dense,
    pub a_pre: Vec<f64>,
    pub a_post: Vec<f64>,
    pub a_res: Vec<f64>,
    pub b_pre: Vec<f64>,
    pub b_post: Vec<f64>,
    pub b_res: Vec<f64>,
    pub layer_w: Vec<NaiveLayer>,
    pub engram: Option<NaiveEngram>,
}

impl NaiveModel {
    /// Densify every tensor of `model` (meant for small configs such as `tiny`).
    pub fn new(model: &Model) -> NaiveModel {
        let w = &model.weights;
        let tables = engram_table_names(&model.config);
        let layer = |name: &str| -> (usize, String) {
            let rest = name.strip_prefix("layers.").expect("a layer tensor");
            let (l, field) = rest.split_once('.').expect("layers.L.field");
            (l.parse().expect("layer index"), field.to_string())
        };
        let site = |name: &str| -> (&SiteWeights, String) {
            let rest = name.strip_prefix("engram.").expect("an engram tensor");
            let (s, field) = rest.split_once('.').expect("engram.S.field");
            let s: usize = s.parse().expect("site layer");
            let e = w.engram.as_ref().expect("engram weights");
            let sw = e.sites.iter().find(|x| x.layer == s).expect("site");
            (sw, field.to_string())
        };
        let matrix = |name: &str| -> Dense {
            let m: &CqMatrix = match name {
                "embed" => &w.embed,
                "mhc.phi_pre" => &w.mhc.phi_pre,
                "mhc.phi_post" => &w.mhc.phi_post,
                "mhc.phi_res" => &w.mhc.phi_res,
                n if n.starts_with("layers.") => {
                    let (l, f) = layer(n);
                    let lw = &w.layers[l];
                    match f.as_str() {
                        "wq" => &lw.wq,
                        "wk" => &lw.wk,
                        "wv" => &lw.wv,
                        "wg" => &lw.wg,
                        "wo" => &lw.wo,
                        _ => panic!("no matrix {n}"),
                    }
                }
                n if n.starts_with("engram.table.") => {
                    let k = tables.iter().position(|t| t == n).expect("table");
                    &w.engram.as_ref().expect("engram weights").tables[k]
                }
                n => {
                    let (sw, f) = site(n);
                    match f.as_str() {
                        "wk" => &sw.wk,
                        "wv" => &sw.wv,
                        _ => panic!("no matrix {n}"),
                    }
                }
            };
            Dense::from_cq(m)
        };
        let vector = |name: &str| -> Vec<f64> {
            let v: Vec<f32> = match name {
                "final_norm" => w.final_norm.clone(),
                "mhc.a_pre" => w.mhc.a_pre.clone(),
                "mhc.a_post" => w.mhc.a_post.clone(),
                "mhc.a_res" => w.mhc.a_res.clone(),
                "mhc.b_pre" => w.mhc.b_pre.clone(),
                "mhc.b_post" => w.mhc.b_post.clone(),
                "mhc.b_res" => w.mhc.b_res.clone(),
                n if n.starts_with("layers.") => {
                    let (l, f) = layer(n);
                    let lw = &w.layers[l];
                    match f.as_str() {
                        "attn_norm" => lw.attn_norm.clone(),
                        "attn_post_norm" => lw.attn_post_norm.clone(),
                        "mlp_norm" => lw.mlp_norm.clone(),
                        "q_norm" => lw.q_norm.clone(),
                        "k_norm" => lw.k_norm.clone(),
                        "attn_out_scale" => vec![lw.attn_out_scale],
                        "mlp_d1" => lw.mlp_d1.clone(),
                        "mlp_d2" => lw.mlp_d2.clone(),
                        "mlp_d3" => lw.mlp_d3.clone(),
                        _ => panic!("no vector {n}"),
                    }
                }
                n => {
                    let (sw, f) = site(n);
                    match f.as_str() {
                        "conv" => sw.conv.clone(),
                        "norm_u" => sw.norm_u.clone(),
                        "norm_k" => sw.norm_k.clone(),
                        _ => panic!("no vector {n}"),
                    }
                }
            };
            widen(&v)
        };
        assert_eq!(
            model.config.engram.is_some(),
            w.engram.is_some(),
            "config and weights disagree about engram"
        );
        NaiveModel::from_parts(&model.config, &matrix, &vector)
    }

    /// The dense model of a float checkpoint: every CQ role straight from its
    /// `[rows, cols]` f32 tensor (widened), no quantization anywhere.
    pub fn from_dense(config: &Config, tensors: &BTreeMap<String, FloatTensor>) -> NaiveModel {
        let get = |name: &str| {
            tensors
                .get(name)
                .unwrap_or_else(|| panic!("the checkpoint has no {name}"))
        };
        let matrix = |name: &str| {
            let t = get(name);
            assert_eq!(t.shape.len(), 2, "{name}");
            Dense {
                rows: t.shape[0],
                cols: t.shape[1],
                w: widen(&t.data),
            }
        };
        let vector = |name: &str| widen(&get(name).data);
        NaiveModel::from_parts(config, &matrix, &vector)
    }

    /// Build from SPEC §3 names: `matrix(name)` gives the dense weights of a CQ role,
    /// `vector(name)` the values of an F32 tensor.
    pub fn from_parts(
        c: &Config,
        matrix: &dyn Fn(&str) -> Dense,
        vector: &dyn Fn(&str) -> Vec<f64>,
    ) -> NaiveModel {
        assert_eq!(c.lanes, 4);
        let layer_w = (0..c.layers)
            .map(|l| {
                let p = |s: &str| format!("layers.{l}.{s}");
                NaiveLayer {
                    attn_norm: vector(&p("attn_norm")),
                    attn_post_norm: vector(&p("attn_post_norm")),
                    mlp_norm: vector(&p("mlp_norm")),
                    wq: matrix(&p("wq")),
                    wk: matrix(&p("wk")),
                    wv: matrix(&p("wv")),
                    wg: matrix(&p("wg")),
                    wo: matrix(&p("wo")),
                    q_norm: vector(&p("q_norm")),
                    k_norm: vector(&p("k_norm")),
                    attn_out_scale: vector(&p("attn_out_scale"))[0],
                    d1: vector(&p("mlp_d1")),
                    d2: vector(&p("mlp_d2")),
                    d3: vector(&p("mlp_d3")),
                }
            })
            .collect();
        let engram = c.engram.as_ref().map(|ec| NaiveEngram {
            orders: ec.orders.clone(),
            hash_heads: ec.hash_heads,
            dim: ec.dim,
            taps: ec.taps,
            dilation: ec.dilation,
            tables: engram_table_names(c).iter().map(|n| matrix(n)).collect(),
            sites: ec
                .sites
                .iter()
                .map(|&s| {
                    let p = |x: &str| format!("engram.{s}.{x}");
                    NaiveSite {
                        layer: s,
                        wk: matrix(&p("wk")),
                        wv: matrix(&p("wv")),
                        conv: vector(&p("conv")),
                        norm_u: vector(&p("norm_u")),
                        norm_k: vector(&p("norm_k")),
                    }
                })
                .collect(),
        });
        NaiveModel {
            vocab: c.vocab,
            hidden: c.hidden,
            layers: c.layers,
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            hadamard_dim: c.hadamard_dim,
            rope_theta: c.rope_theta,
            sink: c.sink,
            window: c.window,
            sinkhorn_iters: c.sinkhorn_iters,
            embed: matrix("embed"),
            final_norm: vector("final_norm"),
            phi_pre: matrix("mhc.phi_pre"),
            phi_post: matrix("mhc.phi_post"),
            phi_res: matrix("mhc.phi_res"),
            a_pre: vector("mhc.a_pre"),
            a_post: vector("mhc.a_post"),
            a_res: vector("mhc.a_res"),
            b_pre: vector("mhc.b_pre"),
            b_post: vector("mhc.b_post"),
            b_res: vector("mhc.b_res"),
            layer_w,
            engram,
        }
    }
}

// ---------------------------------------------------------------------------
// SPEC §4.2: the engram hash.

/// FNV-1a 64 over the little-endian bytes of the u32 sequence
/// `n, h, tok[t−n+1], …, tok[t]` (`0xFFFFFFFF` before position 0).
pub fn engram_hash(n: usize, h: usize, tokens: &[u32], t: usize) -> u64 {
    let mut words = vec![n as u32, h as u32];
    for p in (t as i64 - n as i64 + 1)..=(t as i64) {
        words.push(if p < 0 {
            0xFFFF_FFFF
        } else {
            tokens[p as usize]
        });
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            hash ^= b as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

// ---------------------------------------------------------------------------
// SPEC §4.3: int8 KV entries.

/// One vector quantized per SPEC: `scale = max(1e-12, max|x|) / 127`,
/// `code = clamp(round_half_to_even(x / scale), −127, 127)`.
#[derive(Debug, Clone)]
pub struct Int8Vec {
    pub codes: Vec<i8>,
    pub scale: f64,
}

impl Int8Vec {
    pub fn quantize(x: &[f64]) -> Int8Vec {
        let amax = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let scale = amax.max(1e-12) / 127.0;
        let codes = x
            .iter()
            .map(|v| (v / scale).round_ties_even().clamp(-127.0, 127.0) as i8)
            .collect();
        Int8Vec { codes, scale }
    }
}

/// The cache entry of one position in one layer: per KV head, K and V.
#[derive(Debug, Clone)]
struct KvEntry {
    k: Vec<Int8Vec>,
    v: Vec<Int8Vec>,
}

/// Intermediate tensors of the last step, for comparisons with the engine's probe.
#[derive(Debug, Clone, Default)]
pub struct Capture {
    /// The gathered engram vector `e` (empty without engram).
    pub e: Vec<f64>,
    /// `(site layer, value_s)` per site.
    pub values: Vec<(usize, Vec<f64>)>,
    /// `(site layer, key_s)` per site.
    pub keys: Vec<(usize, Vec<f64>)>,
    /// The lanes (`4·hidden`, lane 0 first) after each layer.
    pub lanes: Vec<Vec<f64>>,
}

/// The incremental state of the naive reference.
pub struct NaiveState<'a> {
    m: &'a NaiveModel,
    tokens: Vec<u32>,
    /// `kv[l][p]`: layer `l`, logical position `p` (unbounded, no ring).
    kv: Vec<Vec<KvEntry>>,
    /// `site_v[i][p]`: the raw `v` of site `i` at logical position `p`.
    site_v: Vec<Vec<Vec<f64>>>,
    /// Intermediates of the last step.
    pub capture: Capture,
}

impl<'a> NaiveState<'a> {
    pub fn new(m: &'a NaiveModel) -> NaiveState<'a> {
        let sites = m.engram.as_ref().map_or(0, |e| e.sites.len());
        NaiveState {
            m,
            tokens: Vec::new(),
            kv: vec![Vec::new(); m.layers],
            site_v: vec![Vec::new(); sites],
            capture: Capture::default(),
        }
    }

    /// Tokens processed so far.
    pub fn position(&self) -> usize {
        self.tokens.len()
    }

    /// The SPEC §4.3 attended set `S` at position `t`, ascending.
    pub fn attended(&self, t: usize) -> Vec<usize> {
        let (sink, window) = (self.m.sink as i64, self.m.window as i64);
        let lo = sink.max(t as i64 - window + 1);
        (0..=t as i64)
            .filter(|&p| p < sink || p >= lo)
            .map(|p| p as usize)
            .collect()
    }

    /// One token step (SPEC §4); returns the logits for the next token.
    pub fn step(&mut self, token: u32) -> Vec<f64> {
        let m = self.m;
        assert!((token as usize) < m.vocab, "token out of range");
        let t = self.tokens.len();
        self.tokens.push(token);
        let h = m.hidden;
        let hd = m.head_dim;
        let mut cap = Capture::default();

        // 4.1 Embedding.
        let sq = (h as f64).sqrt();
        let x0: Vec<f64> = m.embed.row(token as usize).iter().map(|v| v * sq).collect();
        let mut lanes: Vec<Vec<f64>> = vec![x0; 4];

        // 4.2 Engram.
        let mut site_kv: Vec<(usize, Vec<f64>, Vec<f64>)> = Vec::new();
        if let Some(eg) = &m.engram {
            let mut e = Vec::new();
            let mut k = 0;
            for &n in &eg.orders {
                for hh in 0..eg.hash_heads {
                    let table = &eg.tables[k];
                    let row = (engram_hash(n, hh, &self.tokens, t) % table.rows as u64) as usize;
                    assert_eq!(table.cols, eg.dim);
                    e.extend_from_slice(table.row(row));
                    k += 1;
                }
            }
            for (i, site) in eg.sites.iter().enumerate() {
                let v = site.wv.matvec(&e);
                let key = site.wk.matvec(&e);
                assert_eq!(self.site_v[i].len(), t);
                self.site_v[i].push(v.clone());
                let mut mm = vec![0.0; h];
                for j in 0..eg.taps {
                    let d = j * eg.dilation;
                    if t >= d {
                        let vp = &self.site_v[i][t - d];
                        for c in 0..h {
                            mm[c] += site.conv[j * h + c] * vp[c];
                        }
                    }
                }
                let value: Vec<f64> = v.iter().zip(&mm).map(|(a, b)| a + silu(*b)).collect();
                cap.keys.push((site.layer, key.clone()));
                cap.values.push((site.layer, value.clone()));
                site_kv.push((site.layer, key, value));
            }
            cap.e = e;
        }

        // RoPE angles at position t, in f64.
        let half = hd / 2;
        let rope: Vec<(f64, f64)> = (0..half)
            .map(|i| {
                let theta = t as f64 * m.rope_theta.powf(-2.0 * i as f64 / hd as f64);
                (theta.cos(), theta.sin())
            })
            .collect();
        let apply_rope = |x: &mut [f64]| {
            for i in 0..half {
                let (c, s) = rope[i];
                let (a, b) = (x[i], x[i + half]);
                x[i] = a * c - b * s;
                x[i + half] = a * s + b * c;
            }
        };
        let attended = self.attended(t);
        let group = m.heads / m.kv_heads;

        // 4.3 Layers.
        for l in 0..m.layers {
            let lw = &m.layer_w[l];
            let cat: Vec<f64> = lanes.concat();
            let xhat = rms_unit(&cat);
            let p_pre = m.phi_pre.matvec_rows(&xhat, 4 * l, 4);
            let p_post = m.phi_post.matvec_rows(&xhat, 4 * l, 4);
            let p_res = m.phi_res.matvec_rows(&xhat, 16 * l, 16);
            let off = |i: usize| if i == l % 4 { 4.0 } else { -4.0 };
            let hpre: Vec<f64> = (0..4)
                .map(|i| sigmoid(m.a_pre[l] * p_pre[i] + m.b_pre[l * 4 + i] + off(i)))
                .collect();
            let mut u = vec![0.0; h];
            for i in 0..4 {
                for c in 0..h {
                    u[c] += hpre[i] * lanes[i][c];
                }
            }

            // Block input.
            let mut b = u.clone();
            if let Some((_, key, value)) = site_kv.iter().find(|(s, _, _)| *s == l) {
                let site = m
                    .engram
                    .as_ref()
                    .and_then(|e| e.sites.iter().find(|s| s.layer == l))
                    .expect("site weights");
                let zu = zcrms(&u, &site.norm_u);
                let zk = zcrms(key, &site.norm_k);
                let alpha = sigmoid(dot(&zu, &zk) / sq);
                for c in 0..h {
                    b[c] = u[c] + alpha * value[c];
                }
            }

            // Attention.
            let a = zcrms(&b, &lw.attn_norm);
            let mut q = lw.wq.matvec(&a);
            let mut k = lw.wk.matvec(&a);
            let v = lw.wv.matvec(&a);
            let g = lw.wg.matvec(&a);
            for hq in 0..m.heads {
                let qh = &mut q[hq * hd..(hq + 1) * hd];
                let z = zcrms(qh, &lw.q_norm);
                qh.copy_from_slice(&z);
                apply_rope(qh);
            }
            for j in 0..m.kv_heads {
                let kh = &mut k[j * hd..(j + 1) * hd];
                let z = zcrms(kh, &lw.k_norm);
                kh.copy_from_slice(&z);
                apply_rope(kh);
            }
            let entry = KvEntry {
                k: (0..m.kv_heads)
                    .map(|j| Int8Vec::quantize(&k[j * hd..(j + 1) * hd]))
                    .collect(),
                v: (0..m.kv_heads)
                    .map(|j| Int8Vec::quantize(&v[j * hd..(j + 1) * hd]))
                    .collect(),
            };
            assert_eq!(self.kv[l].len(), t);
            self.kv[l].push(entry);
            let cache = &self.kv[l];
            let mut o = vec![0.0; m.heads * hd];
            for hq in 0..m.heads {
                let j = hq / group;
                let qh = &q[hq * hd..(hq + 1) * hd];
                let scores: Vec<f64> = attended
                    .iter()
                    .map(|&p| {
                        let kq = &cache[p].k[j];
                        let s: f64 = (0..hd).map(|d| qh[d] * kq.codes[d] as f64).sum();
                        s * kq.scale / (hd as f64).sqrt()
                    })
                    .collect();
                let mx = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                let sum: f64 = ex.iter().sum();
                let oh = &mut o[hq * hd..(hq + 1) * hd];
                for (&p, e) in attended.iter().zip(&ex) {
                    let w = e / sum;
                    let vq = &cache[p].v[j];
                    for d in 0..hd {
                        oh[d] += w * vq.scale * vq.codes[d] as f64;
                    }
                }
                for d in 0..hd {
                    oh[d] *= sigmoid(g[hq * hd + d]);
                }
            }
            let attn = lw.wo.matvec(&o);
            let za = zcrms(&attn, &lw.attn_post_norm);
            let after: Vec<f64> = (0..h).map(|c| b[c] + lw.attn_out_scale * za[c]).collect();

            // Hadamard MLP.
            let mut z = zcrms(&after, &lw.mlp_norm);
            z.resize(m.hadamard_dim, 0.0);
            for (x, d) in z.iter_mut().zip(&lw.d1) {
                *x *= d;
            }
            let mut z = nwht(&z);
            for (x, d) in z.iter_mut().zip(&lw.d2) {
                *x = silu(d * *x);
            }
            let mut z = nwht(&z);
            for (x, d) in z.iter_mut().zip(&lw.d3) {
                *x *= d;
            }
            let out: Vec<f64> = (0..h).map(|c| after[c] + z[c]).collect();
            let update: Vec<f64> = (0..h).map(|c| out[c] - u[c]).collect();

            // Routing.
            let hpost: Vec<f64> = (0..4)
                .map(|i| 2.0 * sigmoid(m.a_post[l] * p_post[i] + m.b_post[l * 4 + i] + off(i)))
                .collect();
            let mut lm = [[0.0f64; 4]; 4];
            for i in 0..4 {
                for j in 0..4 {
                    lm[i][j] = m.a_res[l] * p_res[4 * i + j] + m.b_res[l * 16 + 4 * i + j];
                }
            }
            for _ in 0..m.sinkhorn_iters {
                for row in lm.iter_mut() {
                    let s = lse(row);
                    for x in row.iter_mut() {
                        *x -= s;
                    }
                }
                for j in 0..4 {
                    let col = [lm[0][j], lm[1][j], lm[2][j], lm[3][j]];
                    let s = lse(&col);
                    for row in lm.iter_mut() {
                        row[j] -= s;
                    }
                }
            }
            let mut next = vec![vec![0.0; h]; 4];
            for i in 0..4 {
                for c in 0..h {
                    let mut acc = 0.0;
                    for j in 0..4 {
                        acc += lm[i][j].exp() * lanes[j][c];
                    }
                    next[i][c] = acc + hpost[i] * update[c];
                }
            }
            lanes = next;
            cap.lanes.push(lanes.concat());
        }

        // 4.4 Logits.
        let hs: Vec<f64> = (0..h)
            .map(|c| (lanes[0][c] + lanes[1][c] + lanes[2][c] + lanes[3][c]) / 4.0)
            .collect();
        let f = zcrms(&hs, &m.final_norm);
        self.capture = cap;
        m.embed.matvec(&f)
    }
}

// ---------------------------------------------------------------------------
// Comparison helpers.

/// `‖a − b‖ / ‖b‖` with `b` the reference.
pub fn rel_l2(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    num.sqrt() / den.sqrt()
}

/// Index of the largest value (first on ties) and the gap to the second largest.
pub fn argmax_margin(v: &[f64]) -> (usize, f64) {
    let mut best = 0;
    for i in 1..v.len() {
        if v[i] > v[best] {
            best = i;
        }
    }
    let second = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != best)
        .map(|(_, x)| *x)
        .fold(f64::NEG_INFINITY, f64::max);
    (best, v[best] - second)
}
