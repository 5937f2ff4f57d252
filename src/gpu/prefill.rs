//! [`PrefillPlan`]: how a prefill chunk runs its tokens. Token `j` sits in slot
//! `j` of the per-token buffers. Each matvec (the engram sites' too; its inputs
//! prepared once by a dispatch before it where that saves work), the MLP,
//! the lane pre-mix and the lane routing run as one dispatch for the whole chunk,
//! so the weights are decoded once for all tokens (built per chunk length,
//! cached); the head's gathers of every slot are one `gather_many` dispatch.
//! The head's engram convolutions and the attention kernels are the step's
//! dispatches rebound to each slot's windows (built once) and run in token
//! order, so each token's attention sees exactly the cache rows its own step
//! would, across the window wrap too, and the logits are bit-identical to one
//! step per token of the standard program. Whichever program was chosen, a
//! pass of several tokens runs this plan (the lean program's fused kernels are
//! for one token; [`super::program::StepProgram`]), and a pass of one token
//! runs the chosen program's decode step rebound to the slot.

use super::kernels::engram::EngramConvParams;
use super::kernels::mlp::MlpKernels;
use super::layout::Slots;
use super::matvec_plan::MatvecPlan;
use super::program::{Kernels, StepProgram};
use super::recorder::Op;
use super::state::DeviceState;
use super::upload::GpuWeights;
use super::{Dispatch, GpuContext, Window};

/// The per-slot dispatches, built on the first prefill.
struct PerSlot {
    /// Slot 0's whole decode step and tail ([`StepProgram::decode`]), rebound
    /// to it. A pass of one token runs it: the lean program's fused kernels
    /// where it was chosen, else the standard step's single-token matvecs
    /// instead of the batched ones over one slot, which are slower on some
    /// devices (lavapipe), with the same logits bit for bit.
    single: Option<(Vec<Dispatch>, Vec<Dispatch>)>,
    /// Head dispatches per slot: those before the engram sites' matvecs (the
    /// gathers) and those after them (the convolutions, on the sequence's rings).
    head: Vec<(Vec<Dispatch>, Vec<Dispatch>)>,
    /// Per layer, per slot: qk_store, attend.
    per_token: Vec<Vec<[Dispatch; 2]>>,
    /// The tail per slot.
    tail: Vec<Vec<Dispatch>>,
}

/// One layer's dispatches over every token slot of a chunk: the matvecs (each
/// one or more dispatches), the lane pre-mix, the MLP and the lane routing.
struct BatchedLayer {
    phi: Vec<Dispatch>,
    premix: Dispatch,
    qkvg: Vec<Dispatch>,
    wo: Vec<Dispatch>,
    mlp: Dispatch,
    route: Dispatch,
}

/// The head's dispatches over every token slot of a chunk.
struct BatchedHead {
    /// Every slot's gathers in one dispatch ([`StepProgram::head_gathers`]);
    /// `None`: each slot runs its own.
    gathers: Option<Dispatch>,
    /// The engram sites' value and key matvecs.
    sites: Vec<Dispatch>,
}

/// Which sequence's buffers (KV cache, rings, scores, logits) a plan's
/// per-slot dispatches are bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeqBinding {
    /// Every slot to sequence `s`: a prefill chunk of that sequence, or its
    /// tokens in any slots of a [`super::GpuBatch`] pass.
    Every(usize),
    /// No per-slot dispatches: only the batched ones, shared by every sequence,
    /// and the vocabulary projection of every slot in one matvec (slot `j`'s
    /// logits in window `j` of the logits buffer).
    Batched,
}

/// The prefill's dispatches: per slot, and batched per chunk length.
pub(crate) struct PrefillPlan {
    slots: Slots,
    binding: SeqBinding,
    per_slot: Option<PerSlot>,
    /// Per chunk length built so far: the head's gathers over every slot (when
    /// they fit one dispatch), the engram sites' matvecs, and per layer.
    batched: Vec<(usize, BatchedHead, Vec<BatchedLayer>)>,
    /// Under [`SeqBinding::Batched`], per slot count built so far: the
    /// vocabulary projection of every slot in one batched matvec.
    tails: Vec<(usize, Vec<Dispatch>)>,
    /// Under [`SeqBinding::Batched`], per count `d` built so far, the dispatches
    /// that run slots `0..d` (of distinct sequences, see [`distinct_prefix`])
    /// at once.
    distinct: Vec<(usize, Distinct)>,
}

/// What a pass runs once for its leading slots of distinct sequences, each
/// slot on its own sequence's rings and cache (found from its step input).
struct Distinct {
    /// The engram convolutions, one dispatch a site.
    convs: Vec<Dispatch>,
    /// Per layer: qk_store and attend.
    layers: Vec<[Dispatch; 2]>,
}

impl PrefillPlan {
    /// An empty plan (nothing is built before the first chunk) whose slots are
    /// bound to sequences as `binding` says.
    pub(crate) fn new(slots: Slots, binding: SeqBinding) -> PrefillPlan {
        PrefillPlan {
            slots,
            binding,
            per_slot: None,
            batched: Vec::new(),
            tails: Vec::new(),
            distinct: Vec::new(),
        }
    }

    /// Build the per-slot dispatches (once; none for [`SeqBinding::Batched`]).
    pub(crate) fn prepare_slots(
        &mut self,
        ctx: &GpuContext,
        program: &StepProgram,
        state: &DeviceState,
    ) {
        let SeqBinding::Every(seq) = self.binding else {
            return;
        };
        if self.per_slot.is_none() {
            let count = self.slots.count;
            let std = &program.standard;
            let mut p = PerSlot {
                single: None,
                head: Vec::with_capacity(count),
                per_token: vec![Vec::with_capacity(count); program.plan.len()],
                tail: Vec::with_capacity(count),
            };
            for j in 0..count {
                let w = self.windows(state, j, seq);
                let re = |ds: &[Dispatch]| -> Vec<Dispatch> {
                    ds.iter().map(|d| d.rebound(ctx, &w)).collect()
                };
                if j == 0 {
                    let decode = program.decode();
                    let all = decode.head.iter().chain(decode.layers.iter().flatten());
                    let step = all.map(|d| d.rebound(ctx, &w)).collect();
                    p.single = Some((step, re(&decode.tail)));
                }
                let sites = &program.head_sites;
                p.head
                    .push((re(&std.head[..sites.start]), re(&std.head[sites.end..])));
                p.tail.push(re(&std.tail));
                for (l, lp) in program.plan.iter().enumerate() {
                    let r = |d: &Dispatch| d.rebound(ctx, &w);
                    p.per_token[l].push([r(&lp.qk_store), r(&lp.attend)]);
                }
            }
            self.per_slot = Some(p);
        }
    }

    /// Build the batched dispatches for `n` tokens (once per `n`; and, for
    /// [`SeqBinding::Batched`], the vocabulary projection of `n` slots).
    pub(crate) fn prepare_batched(
        &mut self,
        ctx: &GpuContext,
        program: &StepProgram,
        kernels: &Kernels,
        weights: &GpuWeights,
        state: &DeviceState,
        n: usize,
    ) {
        let batched_only = self.binding == SeqBinding::Batched;
        if !self.batched.iter().any(|(k, ..)| *k == n) {
            let mlp: &MlpKernels = &kernels.mlp;
            let (lanes, act, vectors) = (&state.lanes, &state.act, &weights.vectors);
            let b = program
                .plan
                .iter()
                .map(|lp| {
                    let mv = |m: &MatvecPlan| m.dispatches(&kernels.cq, ctx, &weights.arenas, n);
                    BatchedLayer {
                        phi: mv(&lp.phi),
                        premix: kernels
                            .mhc
                            .premix(ctx, &lp.premix, lanes, act, vectors)
                            .over_slots(n),
                        qkvg: mv(&lp.qkvg),
                        wo: mv(&lp.wo),
                        mlp: mlp.mlp(ctx, &lp.mlp, act, vectors).over_slots(n),
                        route: kernels
                            .mhc
                            .route(ctx, &lp.route, lanes, act, vectors)
                            .over_slots(n),
                    }
                })
                .collect();
            let sites = program
                .head_site_plans
                .iter()
                .flat_map(|m| m.dispatches(&kernels.cq, ctx, &weights.arenas, n))
                .collect();
            let gathers = program
                .head_gathers
                .as_ref()
                .map(|one| one.clone().over_slots(n));
            self.batched.push((n, BatchedHead { gathers, sites }, b));
        }
        if batched_only && !self.tails.iter().any(|(k, _)| *k == n) {
            let d = program
                .tail_plan
                .dispatches(&kernels.cq, ctx, &weights.arenas, n);
            self.tails.push((n, d));
        }
    }

    /// Under [`SeqBinding::Batched`], build (once per `d`) what slots `0..d`
    /// (of distinct sequences) run at once: the engram convolutions with the
    /// rings' sequence stride, and qk_store and attend (the step's dispatches,
    /// which bind the whole buffers), each one dispatch over `d` slots.
    /// Nothing for `d < 2`.
    pub(crate) fn prepare_distinct(
        &mut self,
        ctx: &GpuContext,
        program: &StepProgram,
        kernels: &Kernels,
        weights: &GpuWeights,
        state: &DeviceState,
        d: usize,
    ) {
        if self.binding != SeqBinding::Batched
            || d < 2
            || self.distinct.iter().any(|(k, _)| *k == d)
        {
            return;
        }
        let over = |one: Dispatch| one.over_slots(d);
        let convs = program
            .head_conv_params
            .iter()
            .map(|cp| {
                let cp = EngramConvParams {
                    ring_seq_stride: state.rings_stride() as u32,
                    ..*cp
                };
                let (act, step, rings) = (&state.act, &state.step, &state.rings);
                let one = kernels
                    .engram
                    .conv(ctx, &cp, act, &weights.vectors, step, rings);
                over(one)
            })
            .collect();
        let layers = program
            .plan
            .iter()
            .map(|lp| [over(lp.qk_store.clone()), over(lp.attend.clone())])
            .collect();
        self.distinct.push((d, Distinct { convs, layers }));
    }

    /// The windows of slot `j` of the per-token buffers, and of sequence `seq`'s.
    fn windows<'a>(&self, s: &'a DeviceState, j: usize, seq: usize) -> Vec<Window<'a>> {
        let w = |buffer, stride: usize| Window {
            buffer,
            offset: (j * stride * 4) as u64,
            size: (stride * 4) as u64,
        };
        let mut ws = vec![
            w(&s.act, self.slots.act),
            w(&s.lanes, self.slots.lanes),
            w(&s.step, self.slots.step),
        ];
        ws.extend(s.seq_windows(seq));
        ws
    }
}

/// How many leading slots of a pass hold tokens of distinct sequences (`plans[j]`
/// is slot `j`'s plan, one per sequence): their attention can run in one
/// dispatch, every slot at once, since none reads what another writes.
pub(crate) fn distinct_prefix(plans: &[&PrefillPlan]) -> usize {
    plans
        .iter()
        .enumerate()
        .position(|(j, p)| plans[..j].iter().any(|q| q.binding == p.binding))
        .unwrap_or(plans.len())
}

/// The ops of a pass of `plans.len()` tokens, token `j` in slot `j` with the
/// per-slot dispatches of `plans[j]` (the plan bound to its sequence; a
/// sequence's tokens in ascending slots, so each sees its earlier ones in the
/// cache), the batched dispatches of `shared` (prepared for that many tokens),
/// and the vocabulary projection either of each slot in `tails` (into its
/// sequence's logits window) or, with `batched_tail` (`shared` a
/// [`SeqBinding::Batched`] plan), of every slot in one matvec (slot `j` into
/// window `j`). The engram convolutions and the attention of the
/// [`distinct_prefix`] run as one dispatch each of `shared`'s when it prepared
/// them for that count, the other slots' in order after them. A pass of one token runs its plan's decode step instead (its
/// projection, if any, into its sequence's logits window: never `batched_tail`).
/// `None` if something was not prepared.
pub(crate) fn mixed_ops<'a>(
    shared: &'a PrefillPlan,
    plans: &[&'a PrefillPlan],
    tails: &[usize],
    batched_tail: bool,
) -> Option<Vec<Op<'a>>> {
    let n = plans.len();
    let slot = |j: usize| plans[j].per_slot.as_ref();
    let mut ops = Vec::new();
    fn run<'a>(ops: &mut Vec<Op<'a>>, ds: &'a [Dispatch]) {
        ops.extend(ds.iter().map(Op::Run));
    }
    if let (1, Some((step, tail))) = (n, &slot(0)?.single) {
        run(&mut ops, step);
        if !tails.is_empty() {
            run(&mut ops, tail);
        }
        return Some(ops);
    }
    let (_, head, batched) = shared.batched.iter().find(|(k, ..)| *k == n)?;
    let d = distinct_prefix(plans);
    let together = shared
        .distinct
        .iter()
        .find(|(k, _)| *k == d)
        .map(|(_, x)| x);
    let first_alone = if together.is_some() { d } else { 0 };
    // The gathers of every slot (one dispatch for all when they fit it: a
    // slot's gathers read only its step input), the engram sites' matvecs for
    // all of them at once, then the convolutions: the distinct prefix's at
    // once, the other slots' in token order (each writes its ring row, which
    // the sequence's next tokens read).
    match &head.gathers {
        Some(all) => ops.push(Op::Run(all)),
        None => {
            for j in 0..n {
                run(&mut ops, &slot(j)?.head.get(j)?.0);
            }
        }
    }
    run(&mut ops, &head.sites);
    if let Some(x) = together {
        run(&mut ops, &x.convs);
    }
    for j in first_alone..n {
        run(&mut ops, &slot(j)?.head.get(j)?.1);
    }
    // The per-token kernels run after the batched dispatch that feeds them and
    // before the one that reads them, tokens in order.
    for (l, b) in batched.iter().enumerate() {
        let per = |j: usize| -> Option<&'a [Dispatch; 2]> { slot(j)?.per_token.get(l)?.get(j) };
        run(&mut ops, &b.phi);
        ops.push(Op::Run(&b.premix));
        run(&mut ops, &b.qkvg);
        if let Some(x) = together {
            let [qk_store, attend] = x.layers.get(l)?;
            ops.push(Op::Run(qk_store));
            ops.push(Op::Run(attend));
        }
        for j in first_alone..n {
            let [qk_store, attend] = per(j)?;
            ops.push(Op::Run(qk_store));
            ops.push(Op::Run(attend));
        }
        run(&mut ops, &b.wo);
        ops.push(Op::Run(&b.mlp));
        ops.push(Op::Run(&b.route));
    }
    if batched_tail {
        let (_, d) = shared.tails.iter().find(|(k, _)| *k == n)?;
        run(&mut ops, d);
    } else {
        for &j in tails {
            run(&mut ops, slot(j)?.tail.get(j)?);
        }
    }
    Some(ops)
}
