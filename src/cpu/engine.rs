//! [`CpuEngine`]: the SPEC §4 token step in plain f32 on the CPU.

use super::block;
use super::prefill::{Batch, DEFAULT_CHUNK};
use super::prep::PrepCache;
use crate::config::Config;
use crate::cq::CqMatrix;
use crate::engine::{host_readout, Engine, Readout, StepOut};
use crate::engram::{table_rows_for, TokenHistory};
use crate::error::{Error, Result};
use crate::kernels::kv::{attended_ranges, physical_slot};
use crate::kernels::mlp::hadamard_mlp;
use crate::kernels::norm::{rms_unit_into, zcrms_into};
use crate::kernels::rope::rope_table;
use crate::profile::{bytes, KernelTimer};
use crate::weights::Model;
use std::sync::Arc;
use std::time::Instant;

/// Receives named intermediate tensors of a step (for parity tools and tests).
/// `layer` is `None` for tensors outside the layer loop. Names: `x0`, `engram.e`,
/// `engram.value.{s}`, `engram.key.{s}`, and per layer `u`, `block_in`, `q`, `k`, `v`
/// (after ZCRMS and RoPE for q/k), `attn_o` (gated head outputs), `after_attn`,
/// `mlp_out`, `update`, `route` (16 values), `lanes` (4·hidden, after the layer),
/// and `logits`.
pub trait Probe {
    /// Called with each tensor as soon as it is final.
    fn tensor(&mut self, name: &str, layer: Option<usize>, data: &[f32]);
}

/// Incremental state: everything a step reads from earlier steps.
#[derive(Debug)]
pub(super) struct State {
    pub(super) history: TokenHistory,
    /// `[layers, kv_heads, sink+window, head_dim]` key codes.
    pub(super) k_codes: Vec<i8>,
    /// Same layout as `k_codes`.
    pub(super) v_codes: Vec<i8>,
    /// `[layers, kv_heads, sink+window]`.
    pub(super) k_scale: Vec<f32>,
    /// Same layout as `k_scale`.
    pub(super) v_scale: Vec<f32>,
    /// Per engram site: `[ring, hidden]` raw value projections.
    pub(super) rings: Vec<Vec<f32>>,
}

/// Per-step work buffers, allocated once.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    lanes: Vec<f32>,
    next_lanes: Vec<f32>,
    xhat: Vec<f32>,
    u: Vec<f32>,
    b: Vec<f32>,
    pub(super) a: Vec<f32>,
    tmp: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    o: Vec<f32>,
    attn: Vec<f32>,
    after: Vec<f32>,
    out: Vec<f32>,
    z: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    pub(super) scores: Vec<f32>,
    slots: Vec<usize>,
    pub(super) codes: Vec<i8>,
    e: Vec<f32>,
    m: Vec<f32>,
    table_idx: Vec<usize>,
    site_key: Vec<Vec<f32>>,
    site_value: Vec<Vec<f32>>,
    p: [f32; 24],
    pub(super) prep: PrepCache,
}

/// The CPU reference engine. Weights are shared through an [`Arc`], so many
/// engines (sessions) can run one loaded model.
#[derive(Debug)]
pub struct CpuEngine {
    pub(super) model: Arc<Model>,
    pub(super) table_rows: Vec<usize>,
    pub(super) pos: u64,
    pub(super) state: State,
    pub(super) s: Scratch,
    pub(super) logits: Vec<f32>,
    /// Whether `logits` hold the last step's logits.
    pub(super) logits_valid: bool,
    /// Work buffers of the batched prefill (empty until the first one).
    pub(super) batch: Batch,
    /// Tokens per prefill chunk.
    pub(super) prefill_chunk: usize,
    /// The candidates of the last top-k or nucleus readout.
    candidates: Vec<(f32, u32)>,
}

fn alloc<T: Clone + Default>(what: &str, n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::Alloc {
        what: what.to_string(),
        bytes: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    })?;
    v.resize(n, T::default());
    Ok(v)
}

impl CpuEngine {
    /// A fresh engine (position 0) for `model`.
    ///
    /// # Errors
    /// [`Error::Alloc`] if the KV cache or scratch buffers can't be allocated.
    pub fn new(model: Arc<Model>) -> Result<CpuEngine> {
        let c = &model.config;
        let rows = c.cache_rows();
        let cells = c
            .layers
            .checked_mul(c.kv_heads)
            .and_then(|n| n.checked_mul(rows))
            .ok_or_else(|| Error::Alloc {
                what: "KV cache".into(),
                bytes: u64::MAX,
            })?;
        let codes = cells.checked_mul(c.head_dim).ok_or_else(|| Error::Alloc {
            what: "KV cache".into(),
            bytes: u64::MAX,
        })?;
        let (rings, table_rows, e_dim, sites) = match (&c.engram, &model.weights.engram) {
            (Some(e), Some(w)) => (
                (0..e.sites.len())
                    .map(|_| alloc("engram ring", e.ring() * c.hidden))
                    .collect::<Result<Vec<_>>>()?,
                w.tables.iter().map(|t| t.rows()).collect(),
                e.e_dim(),
                e.sites.len(),
            ),
            _ => (Vec::new(), Vec::new(), 0, 0),
        };
        let state = State {
            history: TokenHistory::default(),
            k_codes: alloc("KV cache keys", codes)?,
            v_codes: alloc("KV cache values", codes)?,
            k_scale: alloc("KV cache key scales", cells)?,
            v_scale: alloc("KV cache value scales", cells)?,
            rings,
        };
        let h = c.hidden;
        let s = Scratch {
            lanes: alloc("lanes", 4 * h)?,
            next_lanes: alloc("lanes", 4 * h)?,
            xhat: alloc("lanes", 4 * h)?,
            u: vec![0.0; h],
            b: vec![0.0; h],
            a: vec![0.0; h],
            tmp: vec![0.0; h],
            q: vec![0.0; c.q_dim()],
            k: vec![0.0; c.kv_dim()],
            v: vec![0.0; c.kv_dim()],
            g: vec![0.0; c.q_dim()],
            o: vec![0.0; c.q_dim()],
            attn: vec![0.0; h],
            after: vec![0.0; h],
            out: vec![0.0; h],
            z: alloc("MLP scratch", c.hadamard_dim)?,
            cos: vec![0.0; c.head_dim / 2],
            sin: vec![0.0; c.head_dim / 2],
            scores: alloc("attention scores", c.heads * rows)?,
            slots: Vec::with_capacity(rows),
            codes: vec![0; c.head_dim],
            e: vec![0.0; e_dim],
            m: vec![0.0; h],
            table_idx: Vec::with_capacity(table_rows.len()),
            site_key: vec![vec![0.0; h]; sites],
            site_value: vec![vec![0.0; h]; sites],
            p: [0.0; 24],
            prep: PrepCache::default(),
        };
        let logits = alloc("logits", c.vocab)?;
        Ok(CpuEngine {
            model,
            table_rows,
            pos: 0,
            state,
            s,
            logits,
            logits_valid: false,
            batch: Batch::default(),
            prefill_chunk: DEFAULT_CHUNK,
            candidates: Vec::new(),
        })
    }

    /// The model this engine runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// [`Engine::step`] that also hands every intermediate tensor to `probe`.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] if `token >= vocab`; the state is then unchanged.
    pub fn step_probed(
        &mut self,
        token: u32,
        want_logits: bool,
        probe: Option<&mut dyn Probe>,
    ) -> Result<Option<&[f32]>> {
        self.step_inner(token, want_logits, probe, None)
    }

    /// [`Engine::step`] that reports each kernel of the step to `timer` with its wall
    /// time and byte estimate, cut where the GPU step has its dispatches (see
    /// [`crate::profile`]). Host work with no GPU kernel (RoPE table, attended
    /// slots) is not reported.
    ///
    /// # Errors
    /// As [`Engine::step`].
    pub fn step_timed(
        &mut self,
        token: u32,
        want_logits: bool,
        timer: &mut dyn KernelTimer,
    ) -> Result<Option<&[f32]>> {
        self.step_inner(token, want_logits, None, Some(timer))
    }

    fn step_inner(
        &mut self,
        token: u32,
        want_logits: bool,
        probe: Option<&mut dyn Probe>,
        timer: Option<&mut dyn KernelTimer>,
    ) -> Result<Option<&[f32]>> {
        let mut probe = Sink {
            probe,
            non_finite: None,
        };
        let model = Arc::clone(&self.model);
        let c = &model.config;
        if token as usize >= c.vocab {
            return Err(Error::TokenOutOfRange {
                token,
                vocab: c.vocab,
            });
        }
        let t = self.pos;
        let h = c.hidden;
        let w = &model.weights;
        let s = &mut self.s;
        let st = &mut self.state;
        let mut clk = Clock::new(timer);
        st.history.push(token);

        // 4.1 Embedding.
        block::embed_lanes(&w.embed, token, &mut s.lanes);
        emit(&mut probe, "x0", None, &s.lanes[..h]);
        clk.lap("gather", || bytes::gather(&w.embed, 4));

        // 4.2 Engram.
        if let (Some(ec), Some(ew)) = (&c.engram, &w.engram) {
            table_rows_for(&st.history, ec, &self.table_rows, &mut s.table_idx);
            for (k, (table, &row)) in ew.tables.iter().zip(&s.table_idx).enumerate() {
                table.dequantize_row_into(row, &mut s.e[k * ec.dim..(k + 1) * ec.dim]);
                clk.lap("gather", || bytes::gather(table, 1));
            }
            emit(&mut probe, "engram.e", None, &s.e);
            let ring = ec.ring();
            s.prep.clear();
            if clk.on() {
                let mats: Vec<&CqMatrix> = ew.sites.iter().flat_map(|x| [&x.wv, &x.wk]).collect();
                prepare_for(&mut s.prep, &s.e, &mats);
                clk.lap("prepare", || prepare_bytes(s.e.len(), 1, false, &mats));
            }
            for (i, site) in ew.sites.iter().enumerate() {
                let slot = (t % ring as u64) as usize;
                let vrow = &mut st.rings[i][slot * h..(slot + 1) * h];
                site.wv
                    .matvec_rows_prepared(s.prep.get(&s.e, &site.wv), 0, vrow);
                clk.lap_matvec(&site.wv, h);
                site.wk
                    .matvec_rows_prepared(s.prep.get(&s.e, &site.wk), 0, &mut s.site_key[i]);
                clk.lap_matvec(&site.wk, h);
                block::engram_value(
                    t,
                    ec,
                    &site.conv,
                    &st.rings[i],
                    &mut s.m,
                    &mut s.site_value[i],
                );
                clk.lap("engram_conv", || bytes::engram_conv(h, ec.taps));
                if probe.is_probed() {
                    emit(
                        &mut probe,
                        &format!("engram.key.{}", site.layer),
                        None,
                        &s.site_key[i],
                    );
                    emit(
                        &mut probe,
                        &format!("engram.value.{}", site.layer),
                        None,
                        &s.site_value[i],
                    );
                }
            }
        }

        // RoPE table of this position, shared by all layers.
        rope_table(t, c.rope_theta, c.head_dim, &mut s.cos, &mut s.sin);
        let slot = physical_slot(t, c.sink, c.window);
        s.slots.clear();
        for range in attended_ranges(t, c.sink, c.window) {
            s.slots
                .extend(range.map(|p| physical_slot(p, c.sink, c.window)));
        }
        let hd = c.head_dim;
        clk.mark();

        for (l, lw) in w.layers.iter().enumerate() {
            let lo = Some(l);
            // 1–3: mHC pre-mix.
            rms_unit_into(&s.lanes, &mut s.xhat);
            s.prep.clear();
            let m = &w.mhc;
            if clk.on() {
                let mats = [&m.phi_pre, &m.phi_post, &m.phi_res];
                prepare_for(&mut s.prep, &s.xhat, &mats);
                clk.lap("prepare", || prepare_bytes(4 * h, 1, false, &mats));
            }
            let (pp, rest) = s.p.split_at_mut(4);
            let (pq, pr) = rest.split_at_mut(4);
            m.phi_pre
                .matvec_rows_prepared(s.prep.get(&s.xhat, &m.phi_pre), 4 * l, pp);
            clk.lap_matvec(&m.phi_pre, 4);
            m.phi_post
                .matvec_rows_prepared(s.prep.get(&s.xhat, &m.phi_post), 4 * l, pq);
            clk.lap_matvec(&m.phi_post, 4);
            m.phi_res
                .matvec_rows_prepared(s.prep.get(&s.xhat, &m.phi_res), 16 * l, pr);
            clk.lap_matvec(&m.phi_res, 16);
            block::mix_pre(l, m, &s.lanes, pp, &mut s.u);
            emit(&mut probe, "u", lo, &s.u);

            // 4: engram gate.
            s.b.copy_from_slice(&s.u);
            let mut site_here = false;
            if let Some(ew) = &w.engram {
                if let Some(i) = ew.sites.iter().position(|x| x.layer == l) {
                    site_here = true;
                    block::engram_gate(
                        &ew.sites[i],
                        &s.u,
                        &s.site_key[i],
                        &s.site_value[i],
                        &mut s.a,
                        &mut s.tmp,
                        &mut s.b,
                    );
                }
            }
            clk.lap("premix", || bytes::premix(h, site_here));
            emit(&mut probe, "block_in", lo, &s.b);

            // 5: attention.
            zcrms_into(&s.b, &lw.attn_norm, &mut s.a);
            s.prep.clear();
            if clk.on() {
                let mats = [&lw.wq, &lw.wk, &lw.wv, &lw.wg];
                prepare_for(&mut s.prep, &s.a, &mats);
                clk.lap("prepare", || prepare_bytes(h, 1, true, &mats));
            }
            lw.wq
                .matvec_rows_prepared(s.prep.get(&s.a, &lw.wq), 0, &mut s.q);
            clk.lap_matvec(&lw.wq, c.q_dim());
            lw.wk
                .matvec_rows_prepared(s.prep.get(&s.a, &lw.wk), 0, &mut s.k);
            clk.lap_matvec(&lw.wk, c.kv_dim());
            lw.wv
                .matvec_rows_prepared(s.prep.get(&s.a, &lw.wv), 0, &mut s.v);
            clk.lap_matvec(&lw.wv, c.kv_dim());
            lw.wg
                .matvec_rows_prepared(s.prep.get(&s.a, &lw.wg), 0, &mut s.g);
            clk.lap_matvec(&lw.wg, c.q_dim());
            block::qk_norm_rope(lw, hd, &s.cos, &s.sin, &mut s.q, &mut s.k);
            emit(&mut probe, "q", lo, &s.q);
            emit(&mut probe, "k", lo, &s.k);
            emit(&mut probe, "v", lo, &s.v);
            block::store_kv(c, st, l, slot, &s.k, &s.v, &mut s.codes);
            clk.lap("qk_store", || bytes::qk_store(c.heads, c.kv_heads, hd));
            block::attend(c, st, l, &s.q, &s.g, &s.slots, &mut s.o, &mut s.scores);
            clk.lap("attend", || bytes::attend(c.heads, hd, s.slots.len()));
            emit(&mut probe, "attn_o", lo, &s.o);
            s.prep.clear();
            if clk.on() {
                prepare_for(&mut s.prep, &s.o, &[&lw.wo]);
                clk.lap("prepare", || prepare_bytes(c.q_dim(), 1, false, &[&lw.wo]));
            }
            lw.wo
                .matvec_rows_prepared(s.prep.get(&s.o, &lw.wo), 0, &mut s.attn);
            clk.lap_matvec(&lw.wo, h);
            block::after_attention(lw, &s.b, &mut s.attn, &mut s.after);
            emit(&mut probe, "after_attn", lo, &s.after);

            // 6: Hadamard MLP.
            hadamard_mlp(
                &s.after,
                &lw.mlp_norm,
                &lw.mlp_d1,
                &lw.mlp_d2,
                &lw.mlp_d3,
                &mut s.z,
                &mut s.out,
            );
            emit(&mut probe, "mlp_out", lo, &s.out);

            // 7: update = out − u.
            for (o, u) in s.out.iter_mut().zip(&s.u) {
                *o -= u;
            }
            clk.lap("mlp", || bytes::mlp(h, c.hadamard_dim));
            emit(&mut probe, "update", lo, &s.out);

            // 8–9: routing.
            let route = block::route_lanes(
                l,
                m,
                c.sinkhorn_iters,
                pq,
                pr,
                &s.lanes,
                &s.out,
                &mut s.next_lanes,
            );
            if probe.is_probed() {
                let flat: Vec<f32> = route.iter().flatten().copied().collect();
                emit(&mut probe, "route", lo, &flat);
            }
            std::mem::swap(&mut s.lanes, &mut s.next_lanes);
            clk.lap("route", || bytes::route(h));
            emit(&mut probe, "lanes", lo, &s.lanes);
        }
        self.pos += 1;
        self.logits_valid = false;

        if !want_logits {
            return non_finite_check(probe.non_finite, t).map(|_| None);
        }
        // 4.4 Logits.
        block::final_hidden(&s.lanes, &w.final_norm, &mut s.a);
        s.prep.clear();
        if clk.on() {
            prepare_for(&mut s.prep, &s.a, &[&w.embed]);
            clk.lap("prepare", || prepare_bytes(h, 4, true, &[&w.embed]));
        }
        w.embed
            .matvec_rows_prepared(s.prep.get(&s.a, &w.embed), 0, &mut self.logits);
        clk.lap_matvec(&w.embed, c.vocab);
        emit(&mut probe, "logits", None, &self.logits);
        non_finite_check(probe.non_finite, t)?;
        self.logits_valid = true;
        Ok(Some(&self.logits))
    }
}

impl CpuEngine {
    /// The readout of the last step's logits (none for [`Readout::None`]).
    fn readout(&mut self, readout: Readout) -> Result<StepOut<'_>> {
        if !(readout.needs_logits() && self.logits_valid) {
            return Ok(StepOut::None);
        }
        host_readout(&self.logits, readout, &mut self.candidates)
    }
}

/// The error for the first non-finite tensor of the step at position `t`, if any.
fn non_finite_check(bad: Option<(String, Option<usize>)>, t: u64) -> Result<()> {
    match bad {
        None => Ok(()),
        Some((tensor, layer)) => Err(Error::NonFinite {
            tensor: match layer {
                Some(l) => format!("layer {l} {tensor}"),
                None => tensor,
            },
            position: t,
        }),
    }
}

/// Kernel-boundary clock of a timed step: every method is a no-op without a timer.
struct Clock<'a> {
    timer: Option<&'a mut dyn KernelTimer>,
    last: Option<Instant>,
}

impl<'a> Clock<'a> {
    fn new(timer: Option<&'a mut dyn KernelTimer>) -> Self {
        let last = timer.as_ref().map(|_| Instant::now());
        Clock { timer, last }
    }

    fn on(&self) -> bool {
        self.timer.is_some()
    }

    /// Start the next kernel now (the time since the last boundary is not reported).
    fn mark(&mut self) {
        if self.timer.is_some() {
            self.last = Some(Instant::now());
        }
    }

    /// Kernel `name` ran from the last boundary until now.
    fn lap(&mut self, name: &'static str, bytes: impl FnOnce() -> u64) {
        if let Some(t) = self.timer.as_deref_mut() {
            let now = Instant::now();
            let secs = self.last.map_or(0.0, |t0| (now - t0).as_secs_f64());
            t.kernel(name, secs, bytes());
            self.last = Some(now);
        }
    }

    /// A matvec of `rows` rows of `m` ran from the last boundary until now.
    fn lap_matvec(&mut self, m: &CqMatrix, rows: usize) {
        self.lap(bytes::matvec_name(m.bits()), || bytes::matvec(m, rows));
    }
}

/// Fill the prepare cache for every matrix of `mats` (so their matvecs time only
/// the matvec, as on the GPU where prepare is its own dispatch).
fn prepare_for(prep: &mut PrepCache, x: &[f32], mats: &[&CqMatrix]) {
    for m in mats {
        prep.get(x, m);
    }
}

/// Bytes of the prepares for `mats`: one per distinct (group, padded), as on the GPU.
fn prepare_bytes(n: usize, lanes: usize, gain: bool, mats: &[&CqMatrix]) -> u64 {
    let mut seen: Vec<(usize, usize)> = Vec::new();
    let mut total = 0;
    for m in mats {
        let key = (m.group(), m.padded());
        if !seen.contains(&key) {
            seen.push(key);
            total += bytes::prepare(n, lanes, gain, m.padded());
        }
    }
    total
}

/// Where a step's intermediates go: the optional probe, and the first tensor that
/// went non-finite (checked at every probe point, probe or not: one scan of each
/// activation, small beside the matvecs).
struct Sink<'a> {
    probe: Option<&'a mut dyn Probe>,
    non_finite: Option<(String, Option<usize>)>,
}

impl Sink<'_> {
    fn is_probed(&self) -> bool {
        self.probe.is_some()
    }
}

fn emit(sink: &mut Sink, name: &str, layer: Option<usize>, data: &[f32]) {
    if sink.non_finite.is_none() && !data.iter().all(|v| v.is_finite()) {
        sink.non_finite = Some((name.to_string(), layer));
    }
    if let Some(p) = sink.probe.as_deref_mut() {
        p.tensor(name, layer, data);
    }
}

impl Engine for CpuEngine {
    fn config(&self) -> &Config {
        &self.model.config
    }

    fn step(&mut self, token: u32, readout: Readout) -> Result<StepOut<'_>> {
        readout.validate()?;
        self.step_probed(token, readout.needs_logits(), None)?;
        self.readout(readout)
    }

    fn last_logits(&mut self) -> Result<Option<&[f32]>> {
        Ok(self.logits_valid.then_some(&self.logits[..]))
    }

    /// The batched prefill (see [`CpuEngine::set_prefill_chunk`]): the same
    /// logits, bit for bit, as one [`Engine::step`] per id, computed layer by
    /// layer for chunks of ids. An id `>= vocab` is an error after the ids
    /// before it have been appended. A NaN or infinity anywhere in a chunk is
    /// reported (as [`Error::NonFinite`] at its position) after the whole chunk.
    fn step_many(&mut self, ids: &[u32], readout: Readout) -> Result<StepOut<'_>> {
        readout.validate()?;
        let vocab = self.model.config.vocab;
        let bad = ids.iter().position(|&t| t as usize >= vocab);
        let ok = &ids[..bad.unwrap_or(ids.len())];
        if !ok.is_empty() {
            self.prefill_ids(ok, readout.needs_logits() && bad.is_none())?;
        }
        if let Some(i) = bad {
            return Err(Error::TokenOutOfRange {
                token: ids[i],
                vocab,
            });
        }
        if ids.is_empty() {
            return Ok(StepOut::None);
        }
        self.readout(readout)
    }

    fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    fn reset(&mut self) {
        self.pos = 0;
        self.logits_valid = false;
        self.state.history.clear();
        // Stale cache rows and ring rows are never read before being rewritten:
        // attention reads only slots of positions <= t, and the ring only rows
        // of positions >= 0, both written earlier in the same run.
    }

    fn position(&self) -> u64 {
        self.pos
    }

    fn describe(&self) -> String {
        format!("cpu ({} threads)", crate::pool::Pool::global().threads())
    }
}
