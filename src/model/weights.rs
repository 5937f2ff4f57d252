//! A typed view of every tensor of SPEC §3, and the [`Model`] that owns them.

use crate::archive::{self, engram_table_names, RawArchive, Tensor};
use crate::constrain::ToolMarkers;
use crate::cq::{CqMatrix, FastSet};
use crate::error::{ArchiveError, Error, Result};
use crate::model::config::Config;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// The mHC routing weights of all layers (SPEC §3, §4.3 steps 2–3 and 8).
#[derive(Debug, Clone)]
pub struct MhcWeights {
    /// `[layers·4, 4·hidden]`: pre-mix logits, rows `4l..4l+4` for layer `l`.
    pub phi_pre: CqMatrix,
    /// `[layers·4, 4·hidden]`: post-mix logits.
    pub phi_post: CqMatrix,
    /// `[layers·16, 4·hidden]`: residual-route logits.
    pub phi_res: CqMatrix,
    /// `[layers]` scales of the three logits.
    pub a_pre: Vec<f32>,
    /// `[layers]`.
    pub a_post: Vec<f32>,
    /// `[layers]`.
    pub a_res: Vec<f32>,
    /// `[layers, 4]` biases.
    pub b_pre: Vec<f32>,
    /// `[layers, 4]`.
    pub b_post: Vec<f32>,
    /// `[layers, 16]`.
    pub b_res: Vec<f32>,
}

/// One layer's tensors (prefix `layers.{l}.`).
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// `[hidden]` ZCRMS gain before attention.
    pub attn_norm: Vec<f32>,
    /// `[hidden]` ZCRMS gain of the attention output.
    pub attn_post_norm: Vec<f32>,
    /// `[hidden]` ZCRMS gain before the MLP.
    pub mlp_norm: Vec<f32>,
    /// `[q_dim, hidden]`.
    pub wq: CqMatrix,
    /// `[kv_dim, hidden]`.
    pub wk: CqMatrix,
    /// `[kv_dim, hidden]`.
    pub wv: CqMatrix,
    /// `[q_dim, hidden]` output gate.
    pub wg: CqMatrix,
    /// `[hidden, q_dim]`.
    pub wo: CqMatrix,
    /// `[head_dim]` per-head query ZCRMS gain.
    pub q_norm: Vec<f32>,
    /// `[head_dim]` per-head key ZCRMS gain.
    pub k_norm: Vec<f32>,
    /// Scalar residual gate of attention.
    pub attn_out_scale: f32,
    /// `[hadamard_dim]` MLP diagonals.
    pub mlp_d1: Vec<f32>,
    /// `[hadamard_dim]`.
    pub mlp_d2: Vec<f32>,
    /// `[hadamard_dim]`.
    pub mlp_d3: Vec<f32>,
}

/// One engram site's tensors (prefix `engram.{s}.`).
#[derive(Debug, Clone)]
pub struct SiteWeights {
    /// The layer index `s`.
    pub layer: usize,
    /// `[hidden, E]` key projection.
    pub wk: CqMatrix,
    /// `[hidden, E]` value projection.
    pub wv: CqMatrix,
    /// `[taps, hidden]` depthwise causal convolution.
    pub conv: Vec<f32>,
    /// `[hidden]` ZCRMS gain of `u` in the gate.
    pub norm_u: Vec<f32>,
    /// `[hidden]` ZCRMS gain of the key in the gate.
    pub norm_k: Vec<f32>,
}

/// The engram tables and sites.
#[derive(Debug, Clone)]
pub struct EngramWeights {
    /// Tables in gather order: orders as listed, heads ascending (`[T, dim]` each).
    pub tables: Vec<CqMatrix>,
    /// Sites in ascending layer order.
    pub sites: Vec<SiteWeights>,
}

/// Every tensor of a model, typed.
#[derive(Debug, Clone)]
pub struct Weights {
    /// `[vocab, hidden]`: token embedding and output head.
    pub embed: CqMatrix,
    /// `[hidden]` ZCRMS gain before the logits.
    pub final_norm: Vec<f32>,
    /// mHC routing.
    pub mhc: MhcWeights,
    /// `layers` layers.
    pub layers: Vec<LayerWeights>,
    /// Engram, when the config has one.
    pub engram: Option<EngramWeights>,
}

/// A loaded model: validated config, typed weights and the optional tokenizer text.
#[derive(Debug, Clone)]
pub struct Model {
    /// The config (SPEC §1).
    pub config: Config,
    /// The weights (SPEC §3).
    pub weights: Weights,
    /// The embedded Hugging Face `tokenizer.json`, if any.
    pub tokenizer: Option<String>,
    /// The embedded chat template (`cqlm.chat_template`), if any.
    pub chat_template: Option<String>,
    /// The tool-call markers: the archive's `cqlm.tool_call_markers`, else the
    /// default `<tool_call>` … `</tool_call>`.
    pub tool_markers: ToolMarkers,
    /// The fused §6.1 fast forms of the CQ products, built by the CPU engine
    /// the first time one runs in fast precision (`crate::cpu`), then shared by
    /// every engine of this model.
    pub(crate) fast: OnceLock<Arc<FastSet>>,
}

struct Take<'a> {
    map: &'a mut BTreeMap<String, Tensor>,
}

impl Take<'_> {
    fn cq(&mut self, name: &str) -> std::result::Result<CqMatrix, ArchiveError> {
        match self.map.remove(name) {
            Some(Tensor::Cq(m)) => Ok(m),
            _ => Err(ArchiveError::MissingTensor(name.to_string())),
        }
    }
    fn f32(&mut self, name: &str) -> std::result::Result<Vec<f32>, ArchiveError> {
        match self.map.remove(name) {
            Some(Tensor::F32 { data, .. }) => Ok(data),
            _ => Err(ArchiveError::MissingTensor(name.to_string())),
        }
    }
}

impl Model {
    /// Load and validate the archive at `path` (memory-mapped).
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::Archive`] naming the file and the tensor or field at fault.
    pub fn load(path: &Path) -> Result<Model> {
        let raw = archive::read_archive_file(path)?;
        Self::from_raw(raw).map_err(|kind| Error::Archive {
            archive: path.display().to_string(),
            kind,
        })
    }

    /// Load from archive bytes in memory; `source` names it in errors.
    ///
    /// # Errors
    /// [`Error::Archive`] if the bytes break SPEC §1–§5.
    pub fn from_bytes(bytes: &[u8], source: &str) -> Result<Model> {
        let raw = archive::read_archive(bytes, source)?;
        Self::from_raw(raw).map_err(|kind| Error::Archive {
            archive: source.to_string(),
            kind,
        })
    }

    /// Assemble typed weights from a validated archive.
    ///
    /// # Errors
    /// [`ArchiveError::MissingTensor`] if a tensor is absent or of the wrong kind.
    pub fn from_raw(raw: RawArchive) -> std::result::Result<Model, ArchiveError> {
        let RawArchive {
            config,
            tokenizer,
            chat_template,
            tool_markers,
            mut tensors,
        } = raw;
        let mut t = Take { map: &mut tensors };
        let c = &config;
        let mhc = MhcWeights {
            phi_pre: t.cq("mhc.phi_pre")?,
            phi_post: t.cq("mhc.phi_post")?,
            phi_res: t.cq("mhc.phi_res")?,
            a_pre: t.f32("mhc.a_pre")?,
            a_post: t.f32("mhc.a_post")?,
            a_res: t.f32("mhc.a_res")?,
            b_pre: t.f32("mhc.b_pre")?,
            b_post: t.f32("mhc.b_post")?,
            b_res: t.f32("mhc.b_res")?,
        };
        let mut layers = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let p = |s: &str| format!("layers.{l}.{s}");
            let scale = t.f32(&p("attn_out_scale"))?;
            layers.push(LayerWeights {
                attn_norm: t.f32(&p("attn_norm"))?,
                attn_post_norm: t.f32(&p("attn_post_norm"))?,
                mlp_norm: t.f32(&p("mlp_norm"))?,
                wq: t.cq(&p("wq"))?,
                wk: t.cq(&p("wk"))?,
                wv: t.cq(&p("wv"))?,
                wg: t.cq(&p("wg"))?,
                wo: t.cq(&p("wo"))?,
                q_norm: t.f32(&p("q_norm"))?,
                k_norm: t.f32(&p("k_norm"))?,
                attn_out_scale: scale.first().copied().unwrap_or(0.0),
                mlp_d1: t.f32(&p("mlp_d1"))?,
                mlp_d2: t.f32(&p("mlp_d2"))?,
                mlp_d3: t.f32(&p("mlp_d3"))?,
            });
        }
        let engram = match &c.engram {
            None => None,
            Some(e) => {
                let tables = engram_table_names(c)
                    .iter()
                    .map(|n| t.cq(n))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let mut sites = Vec::with_capacity(e.sites.len());
                for &s in &e.sites {
                    let p = |x: &str| format!("engram.{s}.{x}");
                    sites.push(SiteWeights {
                        layer: s,
                        wk: t.cq(&p("wk"))?,
                        wv: t.cq(&p("wv"))?,
                        conv: t.f32(&p("conv"))?,
                        norm_u: t.f32(&p("norm_u"))?,
                        norm_k: t.f32(&p("norm_k"))?,
                    });
                }
                Some(EngramWeights { tables, sites })
            }
        };
        let weights = Weights {
            embed: t.cq("embed")?,
            final_norm: t.f32("final_norm")?,
            mhc,
            layers,
            engram,
        };
        Ok(Model {
            config,
            weights,
            tokenizer,
            chat_template,
            tool_markers: tool_markers.unwrap_or_default(),
            fast: OnceLock::new(),
        })
    }

    /// Bytes of weights read by one decode step that wants logits: every CQ matrix
    /// and F32 tensor once, except the engram tables, of which only the gathered
    /// rows are read, and the mHC Φ matrices, read whole over the layers.
    pub fn weight_bytes_per_step(&self) -> usize {
        let w = &self.weights;
        let mut b = w.embed.stored_bytes() + w.final_norm.len() * 4;
        let m = &w.mhc;
        b += m.phi_pre.stored_bytes() + m.phi_post.stored_bytes() + m.phi_res.stored_bytes();
        for l in &w.layers {
            b += [&l.wq, &l.wk, &l.wv, &l.wg, &l.wo]
                .iter()
                .map(|m| m.stored_bytes())
                .sum::<usize>();
            b += (l.attn_norm.len() * 3 + l.q_norm.len() * 2 + l.mlp_d1.len() * 3 + 1) * 4;
        }
        if let Some(e) = &w.engram {
            for t in &e.tables {
                b += t.row_bytes() + t.groups() * 2 + t.codebook().len() * 4;
            }
            for s in &e.sites {
                b += s.wk.stored_bytes() + s.wv.stored_bytes();
                b += (s.conv.len() + s.norm_u.len() * 2) * 4;
            }
        }
        b
    }
}
