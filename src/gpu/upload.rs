//! [`GpuWeights`]: the model's weights on the device, uploaded once: every CQ
//! matrix into the weight arenas ([`super::arena`]), every F32 tensor into one
//! vector buffer, with a handle or element offset per tensor.

use super::arena::{ArenaBuilder, GpuCq};
use super::GpuContext;
use crate::cq::CqMatrix;
use crate::error::{Error, Result};
use crate::model::weights::Model;

/// Packs every F32 tensor into one buffer and remembers where each went.
#[derive(Default)]
struct Vectors {
    data: Vec<f32>,
}

impl Vectors {
    /// Append `v` (padded to 4 elements) and return its element offset.
    fn push(&mut self, v: &[f32]) -> usize {
        let at = self.data.len();
        self.data.extend_from_slice(v);
        self.data.resize(self.data.len().div_ceil(4) * 4, 0.0);
        at
    }
}

/// One layer's CQ matrices.
pub(crate) struct LayerCq {
    pub wq: GpuCq,
    pub wk: GpuCq,
    pub wv: GpuCq,
    pub wg: GpuCq,
    pub wo: GpuCq,
}

/// One layer's F32 tensors (element offsets in the vector buffer).
pub(crate) struct LayerVecs {
    pub attn_norm: usize,
    pub post_norm: usize,
    pub mlp_norm: usize,
    pub q_norm: usize,
    pub k_norm: usize,
    /// `attn_out_scale` (one element).
    pub scale: usize,
    /// `mlp_d1`, `mlp_d2`, `mlp_d3`.
    pub d: [usize; 3],
}

/// One engram site's weights.
pub(crate) struct SiteWeights {
    pub wk: GpuCq,
    pub wv: GpuCq,
    /// Element offsets of `conv`, `norm_u`, `norm_k`.
    pub conv: usize,
    pub norm_u: usize,
    pub norm_k: usize,
}

/// The mHC vectors (element offsets; per layer at `+ l`, `+ 4l` or `+ 16l`).
pub(crate) struct MhcVecs {
    pub a_pre: usize,
    pub a_post: usize,
    pub a_res: usize,
    pub b_pre: usize,
    pub b_post: usize,
    pub b_res: usize,
}

/// Every weight of a model on the device.
pub(crate) struct GpuWeights {
    /// The weight arenas the [`GpuCq`] handles point into.
    pub arenas: Vec<wgpu::Buffer>,
    /// Every F32 tensor.
    pub vectors: wgpu::Buffer,
    pub embed: GpuCq,
    pub phi_pre: GpuCq,
    pub phi_post: GpuCq,
    pub phi_res: GpuCq,
    pub layers: Vec<LayerCq>,
    pub tables: Vec<GpuCq>,
    pub sites: Vec<SiteWeights>,
    pub final_norm: usize,
    pub mhc: MhcVecs,
    pub layer_vecs: Vec<LayerVecs>,
}

impl GpuWeights {
    /// Upload `model`'s weights.
    ///
    /// # Errors
    /// [`Error::Gpu`] naming the tensor for a group over `max_group` columns
    /// (the kernels' staging array, [`super::kernels::cq::CqKernels::staging`]) or
    /// a row over the storage binding limit, or when the F32 tensors together
    /// exceed it.
    pub(crate) fn upload(ctx: &GpuContext, model: &Model, max_group: usize) -> Result<GpuWeights> {
        let w = &model.weights;
        let mut ab = ArenaBuilder::new(ctx.caps.max_storage_binding.min(1 << 30));
        let mut up = |name: &str, m: &CqMatrix| -> Result<GpuCq> {
            if m.group() > max_group {
                return Err(Error::Gpu(format!(
                    "tensor `{name}`: group {} exceeds the {max_group} columns that the kernels \
                     stage in {} bytes of workgroup memory (max_compute_workgroup_storage_size) on `{}`",
                    m.group(),
                    ctx.caps.max_workgroup_storage,
                    ctx.info.name,
                )));
            }
            ab.push_cq(m).ok_or_else(|| {
                Error::Gpu(format!(
                    "tensor `{name}`: one row does not fit the device's storage binding limit of {} bytes",
                    ctx.caps.max_storage_binding
                ))
            })
        };
        let embed = up("embed", &w.embed)?;
        let phi_pre = up("mhc.phi_pre", &w.mhc.phi_pre)?;
        let phi_post = up("mhc.phi_post", &w.mhc.phi_post)?;
        let phi_res = up("mhc.phi_res", &w.mhc.phi_res)?;
        let mut layers = Vec::with_capacity(w.layers.len());
        for (l, x) in w.layers.iter().enumerate() {
            layers.push(LayerCq {
                wq: up(&format!("layers.{l}.wq"), &x.wq)?,
                wk: up(&format!("layers.{l}.wk"), &x.wk)?,
                wv: up(&format!("layers.{l}.wv"), &x.wv)?,
                wg: up(&format!("layers.{l}.wg"), &x.wg)?,
                wo: up(&format!("layers.{l}.wo"), &x.wo)?,
            });
        }
        let mut tables = Vec::new();
        let mut site_cq = Vec::new();
        if let Some(e) = &w.engram {
            for (k, t) in e.tables.iter().enumerate() {
                tables.push(up(&format!("engram table {k}"), t)?);
            }
            for s in &e.sites {
                site_cq.push((
                    up(&format!("engram.{}.wk", s.layer), &s.wk)?,
                    up(&format!("engram.{}.wv", s.layer), &s.wv)?,
                ));
            }
        }
        let arenas = ab.upload(ctx, "weights arena")?;

        let mut vecs = Vectors::default();
        let final_norm = vecs.push(&w.final_norm);
        let m = &w.mhc;
        let mhc = MhcVecs {
            a_pre: vecs.push(&m.a_pre),
            a_post: vecs.push(&m.a_post),
            a_res: vecs.push(&m.a_res),
            b_pre: vecs.push(&m.b_pre),
            b_post: vecs.push(&m.b_post),
            b_res: vecs.push(&m.b_res),
        };
        let layer_vecs = w
            .layers
            .iter()
            .map(|x| LayerVecs {
                attn_norm: vecs.push(&x.attn_norm),
                post_norm: vecs.push(&x.attn_post_norm),
                mlp_norm: vecs.push(&x.mlp_norm),
                q_norm: vecs.push(&x.q_norm),
                k_norm: vecs.push(&x.k_norm),
                scale: vecs.push(&[x.attn_out_scale]),
                d: [
                    vecs.push(&x.mlp_d1),
                    vecs.push(&x.mlp_d2),
                    vecs.push(&x.mlp_d3),
                ],
            })
            .collect();
        let sites = w
            .engram
            .iter()
            .flat_map(|e| e.sites.iter())
            .zip(site_cq)
            .map(|(s, (wk, wv))| SiteWeights {
                wk,
                wv,
                conv: vecs.push(&s.conv),
                norm_u: vecs.push(&s.norm_u),
                norm_k: vecs.push(&s.norm_k),
            })
            .collect();
        if vecs.data.len() as u64 * 4 > ctx.caps.max_storage_binding {
            return Err(Error::Gpu(format!(
                "the model's F32 tensors take {} bytes, over the storage binding limit of {}",
                vecs.data.len() * 4,
                ctx.caps.max_storage_binding
            )));
        }
        let vectors = ctx.storage_init("f32 tensors", bytemuck::cast_slice(&vecs.data));
        Ok(GpuWeights {
            arenas,
            vectors,
            embed,
            phi_pre,
            phi_post,
            phi_res,
            layers,
            tables,
            sites,
            final_norm,
            mhc,
            layer_vecs,
        })
    }

    /// Bytes of the weight buffers.
    pub(crate) fn bytes(&self) -> u64 {
        self.vectors.size() + self.arenas.iter().map(wgpu::Buffer::size).sum::<u64>()
    }

    /// The longest prepared input (`groups · group`) of any matrix a step
    /// multiplies (not the gathered engram tables): what one token slot of the
    /// prepared-input buffer (`DeviceState::prep`) must hold.
    pub(crate) fn max_matvec_padded(&self) -> usize {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wg, &l.wo]);
        let sites = self.sites.iter().flat_map(|s| [&s.wk, &s.wv]);
        [&self.embed, &self.phi_pre, &self.phi_post, &self.phi_res]
            .into_iter()
            .chain(layers)
            .chain(sites)
            .map(GpuCq::padded)
            .max()
            .unwrap_or(0)
    }
}
