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

/// Which sequence's buffers (KV cache, rings, scores, logits) each slot's
/// per-token dispatches are bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeqBinding {
    /// Every slot to sequence `s`: a prefill chunk of that sequence.
    Every(usize),
    /// Slot `j` to sequence `j`: one token of each sequence ([`super::GpuBatch`]).
    SlotIsSeq,
}

/// The prefill's dispatches: per slot, and batched per chunk length.
pub(crate) struct PrefillPlan {
    slots: Slots,
    binding: SeqBinding,
    per_slot: Option<PerSlot>,
    /// Per chunk length built so far, per layer: phi, qkvg and wo, and the MLP.
    batched: Vec<(usize, Vec<[Vec<Dispatch>; 4]>)>,
    /// Under [`SeqBinding::SlotIsSeq`], per slot count built so far: the
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
        if self.per_slot.is_none() {
            let count = match self.binding {
                SeqBinding::Every(_) => self.slots.count,
                SeqBinding::SlotIsSeq => self.slots.count.min(state.seqs),
            };
            let lean = program.kind == ProgramKind::Lean;
            let mut p = PerSlot {
                lean: lean.then(|| Vec::with_capacity(count)),
                head: Vec::with_capacity(count),
                per_token: vec![Vec::with_capacity(count); program.plan.len()],
                tail: Vec::with_capacity(count),
            };
            for j in 0..count {
                let w = self.windows(state, j);
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
        let lean = self.per_slot.as_ref().is_some_and(|p| p.lean.is_some());
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
        let slot_is_seq = self.binding == SeqBinding::SlotIsSeq;
        if !lean && slot_is_seq && !self.tails.iter().any(|(k, _)| *k == n) {
            let d = program
                .tail_plan
                .dispatches(&kernels.cq, ctx, &weights.arenas, n);
            self.tails.push((n, d));
        }
    }

    /// The windows of slot `j` of the per-token buffers, and of its sequence's.
    fn windows<'a>(&self, s: &'a DeviceState, j: usize) -> Vec<Window<'a>> {
        let w = |buffer, stride: usize| Window {
            buffer,
            offset: (j * stride * 4) as u64,
            size: (stride * 4) as u64,
        };
        let seq = match self.binding {
            SeqBinding::Every(seq) => seq,
            SeqBinding::SlotIsSeq => j,
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
        let tokens: Vec<usize> = (0..n).collect();
        let tails = if tail { &tokens[n - 1..] } else { &[] };
        self.ops_for(n, &tokens, tails)
    }

    /// The ops of one token in each slot of `active` (ascending; slot `j` is
    /// sequence `j` under [`SeqBinding::SlotIsSeq`]), each with its vocabulary
    /// projection, after [`PrefillPlan::prepare`] for `max(active) + 1`. The
    /// batched matvecs run over every slot up to the last active one; the slots
    /// between that are not active compute values nothing reads (their logits
    /// windows too: a slot's logits are read only after a pass it was in).
    pub(crate) fn decode_ops(&self, active: &[usize]) -> Option<Vec<Op<'_>>> {
        let n = active.last()? + 1;
        self.ops_for(n, active, active)
    }

    /// Batched dispatches over `n` slots, per-token ones for `tokens` (in order),
    /// the vocabulary projection for `tails`.
    fn ops_for(&self, n: usize, tokens: &[usize], tails: &[usize]) -> Option<Vec<Op<'_>>> {
        let p = self.per_slot.as_ref()?;
        let mut ops = Vec::new();
        fn run<'a>(ops: &mut Vec<Op<'a>>, ds: &'a [Dispatch]) {
            ops.extend(ds.iter().map(Op::Run));
        }
        if let Some(steps) = &p.lean {
            for &j in tokens {
                run(&mut ops, &steps.get(j)?.0);
            }
            for &j in tails {
                run(&mut ops, &steps.get(j)?.1);
            }
            return Some(ops);
        }
        let (_, batched) = self.batched.iter().find(|(k, _)| *k == n)?;
        for &j in tokens {
            run(&mut ops, p.head.get(j)?);
        }
        // Each per-token kernel runs after the batched dispatch that feeds it and
        // before the one that reads it, tokens in order.
        for (per_token, [phi, qkvg, wo, mlp]) in p.per_token.iter().zip(batched) {
            run(&mut ops, phi);
            for &j in tokens {
                ops.push(Op::Run(&per_token.get(j)?[0]));
            }
            run(&mut ops, qkvg);
            for &j in tokens {
                ops.push(Op::Run(&per_token[j][1]));
                ops.push(Op::Run(&per_token[j][2]));
            }
            run(&mut ops, wo);
            run(&mut ops, mlp);
            ops.extend(tokens.iter().map(|&j| Op::Run(&per_token[j][3])));
        }
        // Decode passes project every slot up to the last in one batched matvec
        // (each slot's logits in its sequence's window).
        if let Some((_, d)) = self.tails.iter().find(|(k, _)| *k == n) {
            if !tails.is_empty() {
                run(&mut ops, d);
            }
            return Some(ops);
        }
        for &j in tails {
            run(&mut ops, p.tail.get(j)?);
        }
        Some(ops)
    }
}
