//! [`PrefillPlan`]: how a prefill chunk runs its tokens. Token `j` sits in slot
//! `j` of the per-token buffers; the step's per-token dispatches are rebound to
//! each slot's windows (built once), and each matvec (and the MLP) runs as one
//! dispatch for the whole chunk, so its weights are decoded once for all tokens
//! (built per chunk length, cached). The per-token kernels run in token order,
//! so each token's attention sees exactly the cache rows its own step would,
//! across the window wrap too, and the logits are bit-identical to one step per
//! token. The lean program ([`super::lean`]) runs a chunk as its decode steps,
//! one after another in one submit, each rebound to its token's slot.

use super::kernels::mlp::MlpKernels;
use super::layout::Slots;
use super::lean::ProgramKind;
use super::program::{Kernels, MatvecPlan, StepProgram};
use super::recorder::Op;
use super::state::DeviceState;
use super::upload::GpuWeights;
use super::{Dispatch, GpuContext, Window};

/// The per-slot dispatches, built on the first prefill.
struct PerSlot {
    /// The lean program: each slot's whole decode step (head and layers) and
    /// tail, rebound to it; a chunk runs them token after token in one submit,
    /// so its logits are those of one step per token, bit for bit.
    lean: Option<Vec<(Vec<Dispatch>, Vec<Dispatch>)>>,
    /// Head dispatches per slot.
    head: Vec<Vec<Dispatch>>,
    /// Per layer, per slot: premix, qk_store, attend, route.
    per_token: Vec<Vec<[Dispatch; 4]>>,
    /// The tail per slot.
    tail: Vec<Vec<Dispatch>>,
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
    /// Per chunk length built so far, per layer: phi, qkvg and wo, and the MLP.
    batched: Vec<(usize, Vec<[Vec<Dispatch>; 4]>)>,
    /// Under [`SeqBinding::Batched`], per slot count built so far: the
    /// vocabulary projection of every slot in one batched matvec.
    tails: Vec<(usize, Vec<Dispatch>)>,
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
        }
    }

    /// Build the per-slot dispatches (once) and the batched ones for chunks of
    /// `n` tokens (once per `n`).
    pub(crate) fn prepare(
        &mut self,
        ctx: &GpuContext,
        program: &StepProgram,
        kernels: &Kernels,
        weights: &GpuWeights,
        state: &DeviceState,
        n: usize,
    ) {
        self.prepare_slots(ctx, program, state);
        self.prepare_batched(ctx, program, kernels, weights, state, n);
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
            let lean = program.kind == ProgramKind::Lean;
            let mut p = PerSlot {
                lean: lean.then(|| Vec::with_capacity(count)),
                head: Vec::with_capacity(count),
                per_token: vec![Vec::with_capacity(count); program.plan.len()],
                tail: Vec::with_capacity(count),
            };
            for j in 0..count {
                let w = self.windows(state, j, seq);
                let re = |ds: &[Dispatch]| -> Vec<Dispatch> {
                    ds.iter().map(|d| d.rebound(ctx, &w)).collect()
                };
                if let Some(steps) = &mut p.lean {
                    let step: Vec<Dispatch> = program
                        .head
                        .iter()
                        .chain(program.layers.iter().flatten())
                        .cloned()
                        .collect();
                    steps.push((re(&step), re(&program.tail)));
                    continue;
                }
                p.head.push(re(&program.head));
                p.tail.push(re(&program.tail));
                for (l, lp) in program.plan.iter().enumerate() {
                    let r = |d: &Dispatch| d.rebound(ctx, &w);
                    p.per_token[l].push([
                        r(&lp.premix),
                        r(&lp.qk_store),
                        r(&lp.attend),
                        r(&lp.route),
                    ]);
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
        let lean = program.kind == ProgramKind::Lean;
        if !lean && !self.batched.iter().any(|(k, _)| *k == n) {
            let mlp: &MlpKernels = &kernels.mlp;
            let b = program
                .plan
                .iter()
                .map(|lp| {
                    let mv = |m: &MatvecPlan| m.dispatches(&kernels.cq, ctx, &weights.arenas, n);
                    let mlp = mlp.mlp_tokens(ctx, &lp.mlp, &state.act, &weights.vectors, n);
                    [mv(&lp.phi), mv(&lp.qkvg), mv(&lp.wo), vec![mlp]]
                })
                .collect();
            self.batched.push((n, b));
        }
        if !lean && batched_only && !self.tails.iter().any(|(k, _)| *k == n) {
            let d = program
                .tail_plan
                .dispatches(&kernels.cq, ctx, &weights.arenas, n);
            self.tails.push((n, d));
        }
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

    /// The ops of a chunk of `n` tokens (after [`PrefillPlan::prepare`] for `n`),
    /// with the vocabulary projection of the last token when `tail`; `None` if
    /// the chunk was not prepared.
    pub(crate) fn ops(&self, n: usize, tail: bool) -> Option<Vec<Op<'_>>> {
        let plans = vec![self; n];
        let tails = if tail { vec![n - 1] } else { Vec::new() };
        mixed_ops(self, &plans, &tails, false)
    }
}

/// The ops of a pass of `plans.len()` tokens, token `j` in slot `j` with the
/// per-slot dispatches of `plans[j]` (the plan bound to its sequence; a
/// sequence's tokens in ascending slots, so each sees its earlier ones in the
/// cache), the batched dispatches of `shared` (prepared for that many tokens),
/// and the vocabulary projection either of each slot in `tails` (into its
/// sequence's logits window) or, with `batched_tail` (`shared` a
/// [`SeqBinding::Batched`] plan), of every slot in one matvec (slot `j` into
/// window `j`). `None` if something was not prepared.
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
    if slot(0)?.lean.is_some() {
        for j in 0..n {
            run(&mut ops, &slot(j)?.lean.as_ref()?.get(j)?.0);
        }
        for &j in tails {
            run(&mut ops, &slot(j)?.lean.as_ref()?.get(j)?.1);
        }
        return Some(ops);
    }
    let (_, batched) = shared.batched.iter().find(|(k, _)| *k == n)?;
    for j in 0..n {
        run(&mut ops, slot(j)?.head.get(j)?);
    }
    // Each per-token kernel runs after the batched dispatch that feeds it and
    // before the one that reads it, tokens in order.
    for (l, [phi, qkvg, wo, mlp]) in batched.iter().enumerate() {
        let per = |j: usize| -> Option<&'a [Dispatch; 4]> { slot(j)?.per_token.get(l)?.get(j) };
        run(&mut ops, phi);
        for j in 0..n {
            ops.push(Op::Run(&per(j)?[0]));
        }
        run(&mut ops, qkvg);
        for j in 0..n {
            let d = per(j)?;
            ops.push(Op::Run(&d[1]));
            ops.push(Op::Run(&d[2]));
        }
        run(&mut ops, wo);
        run(&mut ops, mlp);
        for j in 0..n {
            ops.push(Op::Run(&per(j)?[3]));
        }
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
