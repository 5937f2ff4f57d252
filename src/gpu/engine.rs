//! [`GpuEngine`]: the SPEC §4 token step on the GPU. Everything is built at load
//! (weights uploaded once, pipelines, bind groups and per-dispatch parameters); a
//! step writes only the small step buffer, records the prebuilt dispatches into one
//! command encoder, submits once and, when logits are wanted, reads them back
//! through one staging buffer.
//!
//! The prefill ([`Engine::step_many`]) runs prompt tokens in chunks of up to
//! [`PREFILL_SLOTS`]: the per-token buffers (activations, lanes, step input) have
//! one slot per token, the step's per-token dispatches are rebound to each slot
//! (built once), and each matvec (and the MLP) runs as one dispatch for the whole
//! chunk, so its weights are decoded once for all tokens. The per-token kernels
//! run in token order, so the logits are bit-identical to one step per token.

use super::arena::{ArenaBuilder, GpuCq};
use super::kernels::attention::{AttentionKernels, AttnParams, KvCache};
use super::kernels::cq::{Batch, CqKernels, MatvecInput, PrepareMode};
use super::kernels::engram::{EngramConvParams, EngramKernels};
use super::kernels::mhc::{MhcKernels, PremixParams, RouteParams};
use super::kernels::mlp::{MlpKernels, MlpParams};
use super::kernels::sample::{
    decode_topk, ArgmaxParams, SampleKernels, TopkParams, MAX_K, TOPK_WORDS,
};
use super::step::StepLayout;
use super::{Dispatch, GpuContext, GpuOptions, Window};
use crate::config::Config;
use crate::cq::CqMatrix;
use crate::engine::{Engine, Nucleus};
use crate::engram::{table_rows_for, TokenHistory};
use crate::error::{Error, Result};
use crate::weights::Model;
use std::sync::Arc;

/// A deliberate bug, for testing that parity tools find it (never use otherwise).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Skip the `− u` of SPEC §4.3 step 7: the update is the block output itself.
    SkipMinusU,
    /// Rotate queries and keys by the physical cache slot instead of the logical position.
    RopeAtPhysicalSlot,
    /// Record one dispatch with more workgroups than the device allows (a wgpu
    /// validation error inside the step).
    InvalidDispatch,
}

/// One tensor copied out of a captured step.
#[derive(Debug, Clone, PartialEq)]
pub struct Captured {
    /// Name, as the CPU engine's [`crate::cpu::Probe`] names it.
    pub name: String,
    /// Layer, or `None` outside the layer loop.
    pub layer: Option<usize>,
    /// Values.
    pub data: Vec<f32>,
}

/// Where a capture point copies from: `(after dispatch index, name, layer, from lanes?, offset, len)`.
#[derive(Debug, Clone)]
struct CapturePoint {
    after: usize,
    name: String,
    layer: Option<usize>,
    lanes: bool,
    offset: usize,
    len: usize,
}

/// Bump allocator of element offsets in one f32 buffer.
#[derive(Debug, Default)]
struct Regions {
    len: usize,
}

impl Regions {
    /// Reserve `n` elements (16-element aligned) and return their offset.
    fn take(&mut self, n: usize) -> usize {
        let at = self.len;
        self.len += n.div_ceil(16) * 16;
        at
    }
}

/// Packs every F32 tensor into one buffer and remembers where each went.
struct Vectors {
    data: Vec<f32>,
}

impl Vectors {
    fn push(&mut self, v: &[f32]) -> usize {
        let at = self.data.len();
        self.data.extend_from_slice(v);
        self.data.resize(self.data.len().div_ceil(4) * 4, 0.0);
        at
    }
}

/// Most token slots a prefill chunk uses (fewer where the device's storage
/// binding limit can't hold that many copies of the per-token buffers).
pub const PREFILL_SLOTS: usize = 32;

/// A matvec of the step, kept so that its batched form (one dispatch per fused
/// geometry for all tokens of a prefill chunk) can be built for any chunk length.
struct MatvecPlan {
    items: Vec<(GpuCq, usize, usize, usize)>,
    mode: PrepareMode,
    n: usize,
    src: (wgpu::Buffer, usize),
    lane_stride: usize,
    gains: (wgpu::Buffer, usize),
    out: wgpu::Buffer,
    /// Elements between token slots of the input and of the output buffer.
    x_stride: usize,
    y_stride: usize,
}

/// One layer of the step as a prefill chunk runs it: three batched matvecs and
/// the per-token dispatches between them (slot-0 bindings; rebound per slot).
struct LayerPlan {
    phi: MatvecPlan,
    premix: Dispatch,
    qkvg: MatvecPlan,
    qk_store: Dispatch,
    attend: Dispatch,
    wo: MatvecPlan,
    /// The MLP's params (with the slot stride): one dispatch runs every token.
    mlp: MlpParams,
    route: Dispatch,
}

/// The per-token buffers of the step and their slot strides (elements).
struct Slots {
    /// Token slots allocated.
    count: usize,
    act: usize,
    lanes: usize,
    step: usize,
}

/// Everything a prefill chunk records, built on first use.
struct Prefill {
    /// Head dispatches per slot.
    head: Vec<Vec<Dispatch>>,
    /// Per layer, per slot: premix, qk_store, attend, route.
    per_token: Vec<Vec<[Dispatch; 4]>>,
    /// The tail per slot.
    tail: Vec<Vec<Dispatch>>,
    /// Per layer, the dispatches that serve all tokens of a chunk at once (the
    /// matvecs phi, qkvg and wo, and the MLP), per chunk length built so far.
    batched: Vec<(usize, Vec<[Vec<Dispatch>; 4]>)>,
}

/// The GPU engine. Weights and state live on the device for the engine's life.
pub struct GpuEngine {
    ctx: Arc<GpuContext>,
    model: Arc<Model>,
    layout: StepLayout,
    table_rows: Vec<usize>,
    history: TokenHistory,
    pos: u64,
    step_buf: wgpu::Buffer,
    step_words: Vec<u32>,
    lanes: wgpu::Buffer,
    logits: wgpu::Buffer,
    staging: wgpu::Buffer,
    head: Vec<Dispatch>,
    layers: Vec<Vec<Dispatch>>,
    tail: Vec<Dispatch>,
    logits_host: Vec<f32>,
    /// Where the last step's logits are.
    logits_at: LogitsAt,
    /// Greedy sampling: argmax of `logits` into `argmax_out` (2 u32), read back
    /// through `argmax_staging`.
    argmax: Dispatch,
    argmax_out: wgpu::Buffer,
    argmax_staging: wgpu::Buffer,
    /// Top-k selection for the last `k` asked (rebuilt when `k` changes), its
    /// output and staging buffers, and the words read back.
    sample: SampleKernels,
    /// The top-k dispatch of the last `(k, temperature bits)` asked for.
    topk: Option<((usize, u32), Dispatch)>,
    topk_out: wgpu::Buffer,
    topk_staging: wgpu::Buffer,
    topk_words: Vec<u32>,
    rows_scratch: Vec<usize>,
    cos_scratch: Vec<f32>,
    sin_scratch: Vec<f32>,
    gpu_bytes: u64,
    arenas: usize,
    fault: Option<Fault>,
    act: wgpu::Buffer,
    /// Capture points of the head, each layer and the tail (indices into their dispatch lists).
    captures: [Vec<CapturePoint>; 3],
    layer_captures: Vec<Vec<CapturePoint>>,
    /// The prefill: per-token buffer slots, the layers' plan, the kernels and
    /// arenas its batched matvecs need, and its dispatches once built.
    slots: Slots,
    prefill_chunk: usize,
    plan: Vec<LayerPlan>,
    cq: CqKernels,
    mlp_k: MlpKernels,
    vectors: wgpu::Buffer,
    arena_bufs: Vec<wgpu::Buffer>,
    prefill: Option<Prefill>,
    chunk_words: Vec<u32>,
    _keep: Vec<wgpu::Buffer>,
}

impl std::fmt::Debug for GpuEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuEngine")
            .field("device", &self.ctx.describe())
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

/// What a step records after the layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// Nothing (no logits wanted).
    None,
    /// The vocabulary projection and the copy of the logits to the staging buffer.
    Logits,
    /// The vocabulary projection, the device argmax and the copy of its 8 bytes.
    Argmax,
    /// The vocabulary projection, the device top-k (`GpuEngine::topk`) and the
    /// copy of its output.
    TopK,
}

/// Where the logits of the last step are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogitsAt {
    /// The last step computed none (or there was no step).
    Nowhere,
    /// In the device buffer only (after a greedy step).
    Device,
    /// Also in `logits_host`.
    Host,
}

impl GpuEngine {
    /// Open a device with `opts` and build an engine for `model`.
    ///
    /// # Errors
    /// [`Error::Gpu`] for a missing adapter or limit, or a model the kernels can't
    /// run (a group over 4096 columns).
    pub fn new(model: Arc<Model>, opts: &GpuOptions) -> Result<GpuEngine> {
        let c = &model.config;
        let needed = (c.vocab as u64 * 4).max(model.weights.embed.row_bytes() as u64 * 64);
        let ctx = GpuContext::new(opts, needed)?;
        Self::with_context(model, ctx)
    }

    /// Build an engine on an existing device (engines on one device share nothing but it).
    ///
    /// # Errors
    /// As [`GpuEngine::new`].
    pub fn with_context(model: Arc<Model>, ctx: Arc<GpuContext>) -> Result<GpuEngine> {
        Self::build(model, ctx, None)
    }

    /// [`GpuEngine::with_context`] with a deliberate bug (for testing parity tools).
    ///
    /// # Errors
    /// As [`GpuEngine::new`].
    #[doc(hidden)]
    pub fn with_fault(model: Arc<Model>, ctx: Arc<GpuContext>, fault: Fault) -> Result<GpuEngine> {
        Self::build(model, ctx, Some(fault))
    }

    fn build(model: Arc<Model>, ctx: Arc<GpuContext>, fault: Option<Fault>) -> Result<GpuEngine> {
        let c = model.config.clone();
        let w = &model.weights;
        let h = c.hidden;
        let cq = CqKernels::new(&ctx);
        let att = AttentionKernels::new(&ctx);
        let mhc = MhcKernels::new(&ctx);
        let mlp = MlpKernels::new(&ctx);
        let eng = EngramKernels::new(&ctx);

        // ---- weights: CQ matrices into arenas, F32 tensors into one vector buffer.
        let mut ab = ArenaBuilder::new(ctx.caps.max_storage_binding.min(1 << 30));
        let mut up = |name: &str, m: &CqMatrix| -> Result<GpuCq> {
            if m.group() > super::kernels::cq::MAX_GROUP {
                return Err(Error::Gpu(format!(
                    "tensor `{name}`: group {} exceeds the GPU limit of {}",
                    m.group(),
                    super::kernels::cq::MAX_GROUP
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
        let mut lw = Vec::with_capacity(c.layers);
        for (l, x) in w.layers.iter().enumerate() {
            lw.push([
                up(&format!("layers.{l}.wq"), &x.wq)?,
                up(&format!("layers.{l}.wk"), &x.wk)?,
                up(&format!("layers.{l}.wv"), &x.wv)?,
                up(&format!("layers.{l}.wg"), &x.wg)?,
                up(&format!("layers.{l}.wo"), &x.wo)?,
            ]);
        }
        let mut tables = Vec::new();
        let mut sites = Vec::new();
        if let Some(e) = &w.engram {
            for (k, t) in e.tables.iter().enumerate() {
                tables.push(up(&format!("engram table {k}"), t)?);
            }
            for s in &e.sites {
                sites.push((
                    up(&format!("engram.{}.wk", s.layer), &s.wk)?,
                    up(&format!("engram.{}.wv", s.layer), &s.wv)?,
                ));
            }
        }
        let arenas = ab.upload(&ctx, "weights arena")?;
        let mut vecs = Vectors { data: Vec::new() };
        let final_norm = vecs.push(&w.final_norm);
        let m = &w.mhc;
        let (a_pre, a_post, a_res) = (
            vecs.push(&m.a_pre),
            vecs.push(&m.a_post),
            vecs.push(&m.a_res),
        );
        let (b_pre, b_post, b_res) = (
            vecs.push(&m.b_pre),
            vecs.push(&m.b_post),
            vecs.push(&m.b_res),
        );
        struct LayerVec {
            attn_norm: usize,
            post_norm: usize,
            mlp_norm: usize,
            q_norm: usize,
            k_norm: usize,
            scale: usize,
            d: [usize; 3],
        }
        let layer_vecs: Vec<LayerVec> = w
            .layers
            .iter()
            .map(|x| LayerVec {
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
        let site_vecs: Vec<(usize, usize, usize)> = w
            .engram
            .iter()
            .flat_map(|e| e.sites.iter())
            .map(|s| {
                (
                    vecs.push(&s.conv),
                    vecs.push(&s.norm_u),
                    vecs.push(&s.norm_k),
                )
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

        // ---- activation regions.
        let mut act_r = Regions::default();
        let p_at = act_r.take(24);
        let u_at = act_r.take(h);
        let b_at = act_r.take(h);
        let q_at = act_r.take(c.q_dim());
        let k_at = act_r.take(c.kv_dim());
        let v_at = act_r.take(c.kv_dim());
        let g_at = act_r.take(c.q_dim());
        let o_at = act_r.take(c.q_dim());
        let attn_at = act_r.take(h);
        let after_at = act_r.take(h);
        let update_at = act_r.take(h);
        let z_at = act_r.take(c.hadamard_dim);
        let zero_at = act_r.take(h);
        let out_at = act_r.take(h);
        let route_at = act_r.take(16);
        let e_dim = c.engram.as_ref().map_or(0, |e| e.e_dim());
        let e_at = act_r.take(e_dim);
        let site_at: Vec<(usize, usize, usize)> = sites
            .iter()
            .map(|_| (act_r.take(h), act_r.take(h), act_r.take(h)))
            .collect();
        // Per-token buffers get one slot per token of a prefill chunk, each at
        // a stride the device can bind a window at; a decode step uses slot 0.
        let layout = StepLayout::new(&c);
        let align = (ctx.device.limits().min_storage_buffer_offset_alignment as usize / 4).max(1);
        let stride = |n: usize| n.div_ceil(align) * align;
        let (act_s, lanes_s, step_s) = (stride(act_r.len), stride(4 * h), stride(layout.words()));
        let fit = ctx.caps.max_storage_binding.min(ctx.caps.max_buffer) as usize
            / (4 * act_s.max(lanes_s).max(step_s));
        let slots = Slots {
            count: fit.clamp(1, PREFILL_SLOTS),
            act: act_s,
            lanes: lanes_s,
            step: step_s,
        };
        let act = ctx.storage_zeroed("activations", (slots.count * act_s) as u64 * 4)?;

        // ---- state.
        let lanes = ctx.storage_zeroed("lanes", (slots.count * lanes_s) as u64 * 4)?;
        let cache = KvCache::new(&ctx, c.layers, c.kv_heads, c.cache_rows(), c.head_dim)?;
        let rows = c.cache_rows();
        let scores = ctx.storage_zeroed("attention scores", (c.heads * rows) as u64 * 4)?;
        let ring = c.engram.as_ref().map_or(1, |e| e.ring());
        let rings =
            ctx.storage_zeroed("engram rings", (sites.len().max(1) * ring * h) as u64 * 4)?;
        let step_buf = ctx.storage_zeroed("step", (slots.count * step_s) as u64 * 4)?;
        let logits = ctx.storage_zeroed("logits", c.vocab as u64 * 4)?;
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("logits staging"),
            size: c.vocab as u64 * 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });

        // ---- dispatches.
        // Every matvec prepares its raw input itself (no prepare dispatches).
        let matvec = |items: &[(&GpuCq, usize, usize, usize)],
                      input: MatvecInput<'_>,
                      out: &wgpu::Buffer| {
            cq.matvec(&ctx, &arenas, items, input, out, Batch::single())
        };

        let mut head = cq.gather(
            &ctx,
            &arenas,
            &embed,
            (&step_buf, StepLayout::TOKEN),
            (h as f32).sqrt(),
            (&lanes, 0),
            4,
            h,
        )?;
        let mut head_caps = vec![CapturePoint {
            after: head.len(),
            name: "x0".into(),
            layer: None,
            lanes: true,
            offset: 0,
            len: h,
        }];
        if let Some(e) = &c.engram {
            for (k, t) in tables.iter().enumerate() {
                head.extend(cq.gather(
                    &ctx,
                    &arenas,
                    t,
                    (&step_buf, layout.rows_at() + k),
                    1.0,
                    (&act, e_at + k * e.dim),
                    1,
                    0,
                )?);
            }
            for (i, (wk, wv)) in sites.iter().enumerate() {
                let (v_s, key_s, _) = site_at[i];
                head.extend(matvec(
                    &[(wv, 0, h, v_s), (wk, 0, h, key_s)],
                    raw_input(PrepareMode::Copy, e_dim, (&act, e_at), h, (&vectors, 0)),
                    &act,
                ));
            }
            for (i, _) in sites.iter().enumerate() {
                let (v_s, _, value_s) = site_at[i];
                let p = EngramConvParams {
                    hidden: h as u32,
                    taps: e.taps as u32,
                    dilation: e.dilation as u32,
                    ring: ring as u32,
                    v: v_s as u32,
                    value: value_s as u32,
                    ring_off: (i * ring * h) as u32,
                    conv: site_vecs[i].0 as u32,
                };
                head.push(eng.conv(&ctx, &p, &act, &vectors, &step_buf, &rings));
            }
            let after = head.len();
            head_caps.push(CapturePoint {
                after,
                name: "engram.e".into(),
                layer: None,
                lanes: false,
                offset: e_at,
                len: e_dim,
            });
            for (i, &s_l) in e.sites.iter().enumerate() {
                for (name, off) in [("key", site_at[i].1), ("value", site_at[i].2)] {
                    head_caps.push(CapturePoint {
                        after,
                        name: format!("engram.{name}.{s_l}"),
                        layer: None,
                        lanes: false,
                        offset: off,
                        len: h,
                    });
                }
            }
        }

        let mut layers = Vec::with_capacity(c.layers);
        let mut layer_captures = Vec::with_capacity(c.layers);
        let mut plan = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let lv = &layer_vecs[l];
            let [wq, wk, wv, wg, wo] = &lw[l];
            let mv_plan = |items: Vec<(GpuCq, usize, usize, usize)>,
                           mode: PrepareMode,
                           n: usize,
                           src: (&wgpu::Buffer, usize),
                           gains: (&wgpu::Buffer, usize)| {
                let from_lanes = src.0 == &lanes;
                MatvecPlan {
                    items,
                    mode,
                    n,
                    src: (src.0.clone(), src.1),
                    lane_stride: h,
                    gains: (gains.0.clone(), gains.1),
                    out: act.clone(),
                    x_stride: if from_lanes { slots.lanes } else { slots.act },
                    y_stride: slots.act,
                }
            };
            let phi = mv_plan(
                vec![
                    (phi_pre.clone(), 4 * l, 4, p_at),
                    (phi_post.clone(), 4 * l, 4, p_at + 4),
                    (phi_res.clone(), 16 * l, 16, p_at + 8),
                ],
                PrepareMode::RmsUnit,
                4 * h,
                (&lanes, 0),
                (&vectors, 0),
            );
            let mut d = phi.dispatches(&cq, &ctx, &arenas, 1);
            let site = w
                .engram
                .as_ref()
                .and_then(|e| e.sites.iter().position(|s| s.layer == l));
            let (key, value, nu, nk) = match site {
                Some(i) => (site_at[i].1, site_at[i].2, site_vecs[i].1, site_vecs[i].2),
                None => (0, 0, 0, 0),
            };
            let pm = PremixParams {
                hidden: h as u32,
                layer: l as u32,
                site: site.is_some() as u32,
                p_pre: p_at as u32,
                u: u_at as u32,
                b: b_at as u32,
                key: key as u32,
                value: value as u32,
                a_pre: (a_pre + l) as u32,
                b_pre: (b_pre + 4 * l) as u32,
                norm_u: nu as u32,
                norm_k: nk as u32,
            };
            let premix = mhc.premix(&ctx, &pm, &lanes, &act, &vectors);
            d.push(premix.clone());
            let mut caps = Vec::new();
            let mut cap = |after: usize, name: &str, lanes: bool, offset: usize, len: usize| {
                caps.push(CapturePoint {
                    after,
                    name: name.into(),
                    layer: Some(l),
                    lanes,
                    offset,
                    len,
                })
            };
            cap(d.len(), "u", false, u_at, h);
            cap(d.len(), "block_in", false, b_at, h);
            let qkvg = mv_plan(
                vec![
                    (wq.clone(), 0, c.q_dim(), q_at),
                    (wk.clone(), 0, c.kv_dim(), k_at),
                    (wv.clone(), 0, c.kv_dim(), v_at),
                    (wg.clone(), 0, c.q_dim(), g_at),
                ],
                PrepareMode::Zcrms,
                h,
                (&act, b_at),
                (&vectors, lv.attn_norm),
            );
            d.extend(qkvg.dispatches(&cq, &ctx, &arenas, 1));
            let ap = AttnParams {
                layer: l as u32,
                heads: c.heads as u32,
                kv_heads: c.kv_heads as u32,
                head_dim: c.head_dim as u32,
                sink: c.sink as u32,
                window: c.window as u32,
                rows: rows as u32,
                words: c.head_dim.div_ceil(4) as u32,
                q_off: q_at as u32,
                k_off: k_at as u32,
                v_off: v_at as u32,
                g_off: g_at as u32,
                o_off: o_at as u32,
                q_norm_off: lv.q_norm as u32,
                k_norm_off: lv.k_norm as u32,
                cos_at: layout.cos_at() as u32,
                sin_at: layout.sin_at() as u32,
                _pad: [0; 3],
            };
            let qk_store = att.qk_store(&ctx, &ap, &act, &vectors, &step_buf, &cache);
            d.push(qk_store.clone());
            cap(d.len(), "q", false, q_at, c.q_dim());
            cap(d.len(), "k", false, k_at, c.kv_dim());
            cap(d.len(), "v", false, v_at, c.kv_dim());
            let attend = att.attend(&ctx, &ap, &act, &step_buf, &cache, &scores);
            d.push(attend.clone());
            cap(d.len(), "attn_o", false, o_at, c.q_dim());
            let wo = mv_plan(
                vec![(wo.clone(), 0, h, attn_at)],
                PrepareMode::Copy,
                c.q_dim(),
                (&act, o_at),
                (&vectors, 0),
            );
            d.extend(wo.dispatches(&cq, &ctx, &arenas, 1));
            let mp = MlpParams {
                hidden: h as u32,
                hd: c.hadamard_dim as u32,
                b: b_at as u32,
                u: if fault == Some(Fault::SkipMinusU) {
                    zero_at
                } else {
                    u_at
                } as u32,
                attn: attn_at as u32,
                after: after_at as u32,
                update: update_at as u32,
                z: z_at as u32,
                post_norm: lv.post_norm as u32,
                mlp_norm: lv.mlp_norm as u32,
                d1: lv.d[0] as u32,
                d2: lv.d[1] as u32,
                d3: lv.d[2] as u32,
                out_scale: lv.scale as u32,
                out: out_at as u32,
                tstride: slots.act as u32,
            };
            let mlp_d = mlp.mlp(&ctx, &mp, &act, &vectors);
            d.push(mlp_d.clone());
            cap(d.len(), "after_attn", false, after_at, h);
            cap(d.len(), "mlp_out", false, out_at, h);
            cap(d.len(), "update", false, update_at, h);
            let rp = RouteParams {
                hidden: h as u32,
                layer: l as u32,
                iters: c.sinkhorn_iters as u32,
                p_post: (p_at + 4) as u32,
                p_res: (p_at + 8) as u32,
                update: update_at as u32,
                a_post: (a_post + l) as u32,
                b_post: (b_post + 4 * l) as u32,
                a_res: (a_res + l) as u32,
                b_res: (b_res + 16 * l) as u32,
                route_out: route_at as u32,
                _pad: 0,
            };
            let route = mhc.route(&ctx, &rp, &lanes, &act, &vectors);
            d.push(route.clone());
            cap(d.len(), "route", false, route_at, 16);
            cap(d.len(), "lanes", true, 0, 4 * h);
            layers.push(d);
            layer_captures.push(caps);
            plan.push(LayerPlan {
                phi,
                premix,
                qkvg,
                qk_store,
                attend,
                wo,
                mlp: mp,
                route,
            });
        }

        let tail = matvec(
            &[(&embed, 0, c.vocab, 0)],
            raw_input(
                PrepareMode::MeanLanesZcrms,
                h,
                (&lanes, 0),
                h,
                (&vectors, final_norm),
            ),
            &logits,
        );

        let table_rows = w
            .engram
            .as_ref()
            .map_or(Vec::new(), |e| e.tables.iter().map(|t| t.rows()).collect());
        let n_arenas = arenas.len();
        let act_keep = act.clone();
        let arena_bufs = arenas.clone();
        let vectors_keep = vectors.clone();
        let mut keep = vec![vectors, act, scores, rings];
        keep.extend(arenas);
        keep.extend([
            cache.k_codes.clone(),
            cache.v_codes.clone(),
            cache.k_scale.clone(),
            cache.v_scale.clone(),
        ]);
        if fault == Some(Fault::InvalidDispatch) {
            if let Some(first) = head.first() {
                let mut bad = first.clone();
                bad.groups = [ctx.caps.max_workgroups_per_dim.saturating_add(1), 1, 1];
                head.push(bad);
            }
        }
        let argmax_out = ctx.storage_zeroed("argmax", 8)?;
        let argmax_staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("argmax staging"),
            size: 8,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let sample = SampleKernels::new(&ctx);
        let topk_out = ctx.storage_zeroed("top-k", TOPK_WORDS as u64 * 4)?;
        let topk_staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("top-k staging"),
            size: TOPK_WORDS as u64 * 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let argmax = sample.argmax(
            &ctx,
            &ArgmaxParams {
                n: c.vocab as u32,
                off: 0,
                _pad: [0; 2],
            },
            &logits,
            &argmax_out,
        );
        // A device lost or out of memory while uploading is reported here, not later.
        ctx.check_errors()?;
        let gpu_bytes = keep.iter().map(|b| b.size()).sum::<u64>()
            + lanes.size()
            + step_buf.size()
            + logits.size()
            + staging.size()
            + argmax_out.size()
            + argmax_staging.size()
            + topk_out.size()
            + topk_staging.size();
        Ok(GpuEngine {
            logits_host: vec![0.0; c.vocab],
            logits_at: LogitsAt::Nowhere,
            argmax,
            argmax_out,
            argmax_staging,
            sample,
            topk: None,
            topk_out,
            topk_staging,
            topk_words: vec![0; TOPK_WORDS],
            rows_scratch: Vec::with_capacity(table_rows.len()),
            cos_scratch: vec![0.0; c.head_dim / 2],
            sin_scratch: vec![0.0; c.head_dim / 2],
            step_words: vec![0; layout.words()],
            ctx,
            model,
            layout,
            table_rows,
            history: TokenHistory::default(),
            pos: 0,
            step_buf,
            lanes,
            logits,
            staging,
            head,
            layers,
            tail,
            gpu_bytes,
            arenas: n_arenas,
            fault,
            act: act_keep,
            captures: [head_caps, Vec::new(), Vec::new()],
            layer_captures,
            prefill_chunk: slots.count,
            slots,
            plan,
            cq,
            mlp_k: mlp,
            vectors: vectors_keep,
            arena_bufs,
            prefill: None,
            chunk_words: Vec::new(),
            _keep: keep,
        })
    }

    /// The device this engine runs on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Compute dispatches recorded per token: `(without logits, with logits)`.
    pub fn dispatches_per_token(&self) -> (usize, usize) {
        let base = self.head.len() + self.layers.iter().map(Vec::len).sum::<usize>();
        (base, base + self.tail.len())
    }

    /// Kernel names of layer `l`'s dispatches, in recording order.
    pub fn layer_dispatch_names(&self, l: usize) -> Vec<&'static str> {
        self.layers
            .get(l)
            .map_or(Vec::new(), |d| d.iter().map(|x| x.name).collect())
    }

    /// Dispatches recorded for one layer (the largest over layers).
    pub fn dispatches_per_layer(&self) -> usize {
        self.layers.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Number of weight arenas (storage buffers holding the CQ matrices).
    pub fn weight_arenas(&self) -> usize {
        self.arenas
    }

    /// Bytes of GPU buffers this engine allocated.
    pub fn gpu_buffer_bytes(&self) -> u64 {
        self.gpu_bytes
    }

    /// Fill `out` (the step buffer's words for one token) for `token` at position
    /// `pos`, appending it to the engram history.
    fn fill_step(&mut self, token: u32, pos: u64, out: &mut [u32]) {
        let c = &self.model.config;
        self.history.push(token);
        if let Some(e) = &c.engram {
            table_rows_for(&self.history, e, &self.table_rows, &mut self.rows_scratch);
        }
        let rope_pos = match self.fault {
            Some(Fault::RopeAtPhysicalSlot) => {
                crate::kernels::kv::physical_slot(pos, c.sink, c.window) as u64
            }
            _ => pos,
        };
        self.layout.fill(
            c,
            token,
            pos,
            rope_pos,
            &self.rows_scratch,
            &mut self.cos_scratch,
            &mut self.sin_scratch,
            out,
        );
    }

    fn write_step(&mut self, token: u32) {
        let mut words = std::mem::take(&mut self.step_words);
        self.fill_step(token, self.pos, &mut words[..self.layout.words()]);
        self.ctx.queue.write_buffer(
            &self.step_buf,
            0,
            bytemuck::cast_slice(&words[..self.layout.words()]),
        );
        self.step_words = words;
    }

    /// Token slots a prefill chunk can use on this device (at most [`PREFILL_SLOTS`]).
    pub fn prefill_slots(&self) -> usize {
        self.slots.count
    }

    /// Prompt tokens per prefill chunk of [`Engine::step_many`], clamped to
    /// `1..=`[`GpuEngine::prefill_slots`] (default: all slots). 1 runs one step per
    /// token; the logits are the same for every value, bit for bit.
    pub fn set_prefill_chunk(&mut self, n: usize) {
        self.prefill_chunk = n.clamp(1, self.slots.count);
    }

    /// The windows of slot `j` of the per-token buffers.
    fn windows(&self, j: usize) -> [Window<'_>; 3] {
        let w = |buffer, stride: usize| Window {
            buffer,
            offset: (j * stride * 4) as u64,
            size: (stride * 4) as u64,
        };
        [
            w(&self.act, self.slots.act),
            w(&self.lanes, self.slots.lanes),
            w(&self.step_buf, self.slots.step),
        ]
    }

    /// Build the prefill's per-slot dispatches (once) and its batched matvecs for
    /// chunks of `n` tokens (cached by `n`).
    fn prepare_prefill(&mut self, n: usize) {
        if self.prefill.is_none() {
            let slots = self.slots.count;
            let mut p = Prefill {
                head: Vec::with_capacity(slots),
                per_token: vec![Vec::with_capacity(slots); self.plan.len()],
                tail: Vec::with_capacity(slots),
                batched: Vec::new(),
            };
            for j in 0..slots {
                let w = self.windows(j);
                let re = |ds: &[Dispatch]| -> Vec<Dispatch> {
                    ds.iter().map(|d| d.rebound(&self.ctx, &w)).collect()
                };
                p.head.push(re(&self.head));
                p.tail.push(re(&self.tail));
                for (l, lp) in self.plan.iter().enumerate() {
                    let r = |d: &Dispatch| d.rebound(&self.ctx, &w);
                    p.per_token[l].push([
                        r(&lp.premix),
                        r(&lp.qk_store),
                        r(&lp.attend),
                        r(&lp.route),
                    ]);
                }
            }
            self.prefill = Some(p);
        }
        let have = self
            .prefill
            .as_ref()
            .is_some_and(|p| p.batched.iter().any(|(k, _)| *k == n));
        if !have {
            let b: Vec<[Vec<Dispatch>; 4]> = self
                .plan
                .iter()
                .map(|lp| {
                    let mv =
                        |m: &MatvecPlan| m.dispatches(&self.cq, &self.ctx, &self.arena_bufs, n);
                    let mlp =
                        self.mlp_k
                            .mlp_tokens(&self.ctx, &lp.mlp, &self.act, &self.vectors, n);
                    [mv(&lp.phi), mv(&lp.qkvg), mv(&lp.wo), vec![mlp]]
                })
                .collect();
            if let Some(p) = self.prefill.as_mut() {
                p.batched.push((n, b));
            }
        }
    }

    /// Run `ids` (all `< vocab`, at most [`GpuEngine::prefill_slots`]) as one
    /// prefill chunk: token `j` in slot `j`, the weights of each matvec read once
    /// for all of them, the per-token kernels in token order (so each token's
    /// attention sees exactly the cache rows its own step would, across the window
    /// wrap too), and with `tail` the logits of the last token.
    fn run_chunk(&mut self, ids: &[u32], tail: Tail) -> Result<()> {
        let n = ids.len();
        debug_assert!(n >= 1 && n <= self.slots.count);
        self.ctx.check_errors()?;
        let (stride, words) = (self.slots.step, self.layout.words());
        let mut all = std::mem::take(&mut self.chunk_words);
        all.clear();
        all.resize(n * stride, 0);
        for (j, &token) in ids.iter().enumerate() {
            let pos = self.pos + j as u64;
            self.fill_step(token, pos, &mut all[j * stride..j * stride + words]);
        }
        self.ctx
            .queue
            .write_buffer(&self.step_buf, 0, bytemuck::cast_slice(&all));
        self.chunk_words = all;
        self.prepare_prefill(n);
        let Some(p) = self.prefill.as_ref() else {
            return Err(Error::Gpu("the prefill dispatches are missing".into()));
        };
        let Some((_, batched)) = p.batched.iter().find(|(k, _)| *k == n) else {
            return Err(Error::Gpu("the batched prefill matvecs are missing".into()));
        };
        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("cqlm prefill chunk"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("cqlm prefill"),
                timestamp_writes: None,
            });
            for head in &p.head[..n] {
                head.iter().for_each(|d| d.record(&mut pass));
            }
            for (per_token, [phi, qkvg, wo, mlp]) in p.per_token.iter().zip(batched) {
                let tok = &per_token[..n];
                phi.iter().for_each(|d| d.record(&mut pass));
                tok.iter().for_each(|d| d[0].record(&mut pass));
                qkvg.iter().for_each(|d| d.record(&mut pass));
                for d in tok {
                    d[1].record(&mut pass);
                    d[2].record(&mut pass);
                }
                wo.iter().for_each(|d| d.record(&mut pass));
                mlp.iter().for_each(|d| d.record(&mut pass));
                tok.iter().for_each(|d| d[3].record(&mut pass));
            }
            if tail != Tail::None {
                p.tail[n - 1].iter().for_each(|d| d.record(&mut pass));
            }
        }
        if tail == Tail::Logits {
            self.encode_logits_copy(&mut enc);
        }
        self.ctx.queue.submit([enc.finish()]);
        self.pos += n as u64;
        self.logits_at = LogitsAt::Nowhere;
        self.ctx.check_errors()
    }

    /// Run one step and also copy every named intermediate out of it (the CPU
    /// probe's names: `x0`, `engram.e`, `engram.key.{s}`, `engram.value.{s}`, and per
    /// layer `u`, `block_in`, `q`, `k`, `v`, `attn_o`, `after_attn`, `mlp_out`,
    /// `update`, `route`, `lanes`; `logits` when asked). The copies run between the same dispatches
    /// as [`Engine::step`]; a normal step records none of them, so capture costs
    /// nothing when off.
    ///
    /// # Errors
    /// As [`Engine::step`].
    pub fn step_captured(
        &mut self,
        token: u32,
        want_logits: bool,
    ) -> Result<(Option<Vec<f32>>, Vec<Captured>)> {
        self.begin_step(token)?;
        let logits_point = CapturePoint {
            after: self.tail.len(),
            name: "logits".into(),
            layer: None,
            lanes: false,
            offset: 0,
            len: self.model.config.vocab,
        };
        let tail_caps = if want_logits {
            vec![logits_point]
        } else {
            Vec::new()
        };
        let mut segments: Vec<(&[Dispatch], &[CapturePoint])> =
            vec![(&self.head, &self.captures[0])];
        for (d, c) in self.layers.iter().zip(&self.layer_captures) {
            segments.push((d, c));
        }
        if want_logits {
            segments.push((&self.tail, &tail_caps));
        }
        let total: usize = segments
            .iter()
            .flat_map(|(_, c)| c.iter())
            .map(|c| c.len)
            .sum();
        let capture = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("capture"),
            size: (total.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        let mut cursor = 0usize;
        for (ds, caps) in &segments {
            let mut start = 0;
            for cp in caps.iter() {
                if cp.after > start {
                    record(&mut enc, &ds[start..cp.after]);
                    start = cp.after;
                }
                let src = if cp.name == "logits" {
                    &self.logits
                } else if cp.lanes {
                    &self.lanes
                } else {
                    &self.act
                };
                enc.copy_buffer_to_buffer(
                    src,
                    cp.offset as u64 * 4,
                    &capture,
                    cursor as u64 * 4,
                    cp.len as u64 * 4,
                );
                cursor += cp.len;
            }
            if start < ds.len() {
                record(&mut enc, &ds[start..]);
            }
        }
        self.ctx.queue.submit([enc.finish()]);
        let bytes = self.ctx.map_read(&capture, total as u64 * 4)?;
        let all: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
        let mut out = Vec::new();
        let mut at = 0;
        let mut logits = None;
        for cp in segments.iter().flat_map(|(_, c)| c.iter()) {
            let data = all[at..at + cp.len].to_vec();
            at += cp.len;
            if cp.name == "logits" {
                logits = Some(data.clone());
            }
            out.push(Captured {
                name: cp.name.clone(),
                layer: cp.layer,
                data,
            });
        }
        self.pos += 1;
        Ok((logits, out))
    }

    /// Every dispatch of a step with logits, in recording order (head, layers, tail).
    pub(crate) fn all_dispatches(&self) -> impl Iterator<Item = &Dispatch> {
        self.head
            .iter()
            .chain(self.layers.iter().flatten())
            .chain(&self.tail)
    }

    /// Validate `token` and write the step buffer for it (the position advances
    /// only through [`GpuEngine::advance`]). For tools that record the step themselves.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] if `token >= vocab`.
    pub(crate) fn begin_step(&mut self, token: u32) -> Result<()> {
        self.check_token(token)?;
        self.ctx.check_errors()?;
        self.write_step(token);
        Ok(())
    }

    /// Record the copy of the logits into the staging buffer (after the tail dispatches).
    pub(crate) fn encode_logits_copy(&self, enc: &mut wgpu::CommandEncoder) {
        enc.copy_buffer_to_buffer(&self.logits, 0, &self.staging, 0, self.staging.size());
    }

    /// Map the staging buffer filled by [`GpuEngine::encode_logits_copy`] and return the logits.
    ///
    /// # Errors
    /// [`Error::Gpu`] if mapping fails.
    pub(crate) fn fetch_logits(&mut self) -> Result<&[f32]> {
        self.ctx.map_read_into(
            &self.staging,
            bytemuck::cast_slice_mut(&mut self.logits_host),
        )?;
        Ok(&self.logits_host)
    }

    /// Read back the logits the last submitted work copied to staging, refusing
    /// non-finite ones (named at the last position).
    fn checked_logits(&mut self) -> Result<&[f32]> {
        let t = self.pos - 1;
        let logits = self.fetch_logits()?;
        if !logits.iter().all(|v| v.is_finite()) {
            return Err(non_finite_logits(t));
        }
        self.logits_at = LogitsAt::Host;
        Ok(&self.logits_host)
    }

    /// Count a step recorded by a tool as done.
    pub(crate) fn advance(&mut self) {
        self.pos += 1;
    }

    /// Run one step (with logits) dispatch by dispatch, one submit and wait each,
    /// and return each dispatch's kernel name and wall time in seconds. Slow and
    /// coarse (it includes submit and wait overhead): the fallback timing for
    /// adapters without timestamp queries.
    ///
    /// # Errors
    /// As [`Engine::step`].
    pub fn time_dispatches(&mut self, token: u32) -> Result<Vec<(&'static str, f64)>> {
        self.check_token(token)?;
        self.write_step(token);
        self.ctx.wait_idle()?;
        let mut out = Vec::new();
        let all: Vec<Dispatch> = self
            .head
            .iter()
            .chain(self.layers.iter().flatten())
            .chain(&self.tail)
            .cloned()
            .collect();
        for d in &all {
            let t0 = std::time::Instant::now();
            super::run_dispatches(&self.ctx, std::slice::from_ref(d))?;
            out.push((d.name, t0.elapsed().as_secs_f64()));
        }
        self.pos += 1;
        Ok(out)
    }

    /// Validate `token`, write the step buffer, record head and layers (and `tail`)
    /// into one encoder, submit it and advance the position; the caller reads back.
    fn run_step(&mut self, token: u32, tail: Tail) -> Result<()> {
        self.check_token(token)?;
        self.ctx.check_errors()?;
        self.write_step(token);
        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("cqlm token step"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("cqlm step"),
                timestamp_writes: None,
            });
            for d in self.head.iter().chain(self.layers.iter().flatten()) {
                d.record(&mut pass);
            }
            if tail != Tail::None {
                for d in &self.tail {
                    d.record(&mut pass);
                }
            }
            if tail == Tail::Argmax {
                self.argmax.record(&mut pass);
            }
            if let (Tail::TopK, Some((_, d))) = (tail, &self.topk) {
                d.record(&mut pass);
            }
        }
        match tail {
            Tail::None => {}
            Tail::Logits => self.encode_logits_copy(&mut enc),
            Tail::Argmax => {
                enc.copy_buffer_to_buffer(&self.argmax_out, 0, &self.argmax_staging, 0, 8)
            }
            Tail::TopK => enc.copy_buffer_to_buffer(
                &self.topk_out,
                0,
                &self.topk_staging,
                0,
                self.topk_staging.size(),
            ),
        }
        self.ctx.queue.submit([enc.finish()]);
        self.pos += 1;
        self.logits_at = LogitsAt::Nowhere;
        // wgpu reports validation errors of the recorded work at submit time.
        self.ctx.check_errors()
    }

    /// Run a step that ends in the device top-k (`k <= MAX_K`, with the softmax
    /// denominator at `temperature` when it is > 0): the candidates into `out`, the
    /// denominator returned (0 when not asked for).
    fn step_candidates(
        &mut self,
        token: u32,
        k: usize,
        temperature: f32,
        out: &mut Vec<(f32, u32)>,
    ) -> Result<f32> {
        self.check_token(token)?;
        let key = (k, temperature.to_bits());
        if self.topk.as_ref().is_none_or(|(have, _)| *have != key) {
            let p = TopkParams {
                n: self.model.config.vocab as u32,
                off: 0,
                k: k as u32,
                temperature,
            };
            let d = self
                .sample
                .topk(&self.ctx, &p, &self.logits, &self.topk_out);
            self.topk = Some((key, d));
        }
        self.run_step(token, Tail::TopK)?;
        self.ctx.map_read_into(
            &self.topk_staging,
            bytemuck::cast_slice_mut(&mut self.topk_words),
        )?;
        let Some(total) = decode_topk(&self.topk_words, out) else {
            return Err(non_finite_logits(self.pos - 1));
        };
        self.logits_at = LogitsAt::Device;
        Ok(total)
    }

    fn check_token(&self, token: u32) -> Result<()> {
        let vocab = self.model.config.vocab;
        if token as usize >= vocab {
            return Err(Error::TokenOutOfRange { token, vocab });
        }
        Ok(())
    }
}

impl MatvecPlan {
    /// The dispatches for `tokens` inputs in consecutive slots (1: the decode step's).
    fn dispatches(
        &self,
        cq: &CqKernels,
        ctx: &GpuContext,
        arenas: &[wgpu::Buffer],
        tokens: usize,
    ) -> Vec<Dispatch> {
        let items: Vec<(&GpuCq, usize, usize, usize)> = self
            .items
            .iter()
            .map(|(m, a, b, o)| (m, *a, *b, *o))
            .collect();
        let input = raw_input(
            self.mode,
            self.n,
            (&self.src.0, self.src.1),
            self.lane_stride,
            (&self.gains.0, self.gains.1),
        );
        let batch = Batch {
            tokens,
            x_stride: self.x_stride,
            y_stride: self.y_stride,
        };
        cq.matvec(ctx, arenas, &items, input, &self.out, batch)
    }
}

/// A raw matvec input (each workgroup prepares it), lanes `lane_stride` apart.
fn raw_input<'a>(
    mode: PrepareMode,
    n: usize,
    src: (&'a wgpu::Buffer, usize),
    lane_stride: usize,
    gains: (&'a wgpu::Buffer, usize),
) -> MatvecInput<'a> {
    MatvecInput::Raw {
        mode,
        n,
        src,
        lane_stride,
        gains,
    }
}

/// The error for non-finite logits at position `t`.
fn non_finite_logits(t: u64) -> Error {
    Error::NonFinite {
        tensor: "logits (`cqlm parity` names the first non-finite tensor)".into(),
        position: t,
    }
}

fn record(enc: &mut wgpu::CommandEncoder, ds: &[Dispatch]) {
    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: Some("cqlm step"),
        timestamp_writes: None,
    });
    for d in ds {
        d.record(&mut pass);
    }
}

impl Engine for GpuEngine {
    fn config(&self) -> &Config {
        &self.model.config
    }

    fn step(&mut self, token: u32, want_logits: bool) -> Result<Option<&[f32]>> {
        let tail = if want_logits {
            Tail::Logits
        } else {
            Tail::None
        };
        self.run_step(token, tail)?;
        if !want_logits {
            return Ok(None);
        }
        self.checked_logits().map(Some)
    }

    fn step_argmax(&mut self, token: u32) -> Result<u32> {
        self.run_step(token, Tail::Argmax)?;
        let mut out = [0u32; 2];
        self.ctx
            .map_read_into(&self.argmax_staging, bytemuck::cast_slice_mut(&mut out))?;
        if out[1] != 0 {
            return Err(non_finite_logits(self.pos - 1));
        }
        self.logits_at = LogitsAt::Device;
        Ok(out[0])
    }

    fn step_top_k(&mut self, token: u32, k: usize, out: &mut Vec<(f32, u32)>) -> Result<()> {
        if k == 0 || k > MAX_K {
            // Beyond the device kernel: the logits path.
            let l = self.step(token, true)?.unwrap_or_default();
            crate::sample::top_k_into(l, k, out);
            return Ok(());
        }
        self.step_candidates(token, k, 0.0, out).map(|_| ())
    }

    fn step_nucleus(
        &mut self,
        token: u32,
        temperature: f32,
        out: &mut Vec<(f32, u32)>,
    ) -> Result<Nucleus> {
        if !(temperature > 0.0 && temperature.is_finite()) {
            return Err(Error::InvalidArgument(format!(
                "step_nucleus: temperature {temperature} is not > 0"
            )));
        }
        let total = self.step_candidates(token, MAX_K, temperature, out)?;
        // The device sums f32 terms: WGSL's exp is within 3 + 2|x| ulp (below
        // 2e-5 relative for every term that matters against the largest, which
        // is 1), each invocation adds ceil(n / 256) terms in a row and a tree of 8
        // levels joins them (one rounding each); 4× that for safety.
        let n = self.model.config.vocab as f64;
        let rounding = ((n / 256.0).ceil() + 8.0) * f64::from(f32::EPSILON);
        Ok(Nucleus {
            total: f64::from(total),
            rel_err: 4.0 * (2e-5 + rounding),
        })
    }

    fn step_many(&mut self, ids: &[u32], want_logits: bool) -> Result<Option<&[f32]>> {
        let vocab = self.model.config.vocab;
        if let Some(bad) = ids.iter().position(|&t| t as usize >= vocab) {
            self.step_many(&ids[..bad], false)?;
            return Err(Error::TokenOutOfRange {
                token: ids[bad],
                vocab,
            });
        }
        if ids.is_empty() {
            return Ok(None);
        }
        let chunks = ids.len().div_ceil(self.prefill_chunk);
        for (i, part) in ids.chunks(self.prefill_chunk).enumerate() {
            let tail = if want_logits && i + 1 == chunks {
                Tail::Logits
            } else {
                Tail::None
            };
            if self.prefill_chunk == 1 {
                self.run_step(part[0], tail)?;
            } else {
                self.run_chunk(part, tail)?;
            }
        }
        if !want_logits {
            return Ok(None);
        }
        self.checked_logits().map(Some)
    }

    fn last_logits(&mut self) -> Result<Option<&[f32]>> {
        match self.logits_at {
            LogitsAt::Nowhere => Ok(None),
            LogitsAt::Host => Ok(Some(&self.logits_host)),
            LogitsAt::Device => {
                let mut enc = self.ctx.device.create_command_encoder(&Default::default());
                self.encode_logits_copy(&mut enc);
                self.ctx.queue.submit([enc.finish()]);
                self.fetch_logits()?;
                self.logits_at = LogitsAt::Host;
                Ok(Some(&self.logits_host))
            }
        }
    }

    fn reset(&mut self) {
        self.pos = 0;
        self.logits_at = LogitsAt::Nowhere;
        self.history.clear();
        // Cache and ring rows of earlier runs are never read before being rewritten
        // (attention reads only positions <= t, the ring only positions >= 0).
    }

    fn position(&self) -> u64 {
        self.pos
    }

    fn describe(&self) -> String {
        format!("gpu: {}", self.ctx.describe())
    }

    fn dispatches_per_token(&self) -> Option<usize> {
        Some(GpuEngine::dispatches_per_token(self).1)
    }

    fn device_bytes(&self) -> u64 {
        self.gpu_bytes
    }
}
