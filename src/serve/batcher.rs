//! Continuous batching: one thread owns a [`BatchEngine`] (the CPU's
//! [`crate::CpuBatch`] or the GPU's [`crate::GpuBatch`]) of
//! `--parallel` slots; every engine pass steps one token (or a prompt chunk, or a
//! run of forced tokens) of every active sequence together. A new request takes
//! a free slot at the next pass, a finished one frees its slot; each slot has its
//! own sampler, constraint and stop strings, and its tokens are what a session
//! alone would choose (the batched pass is bit-identical per sequence).

use super::metrics::{Metrics, TokenClock};
use super::worker::{Event, Finish, Job, Shared};
use crate::constrain::TokenMask;
use crate::engine::BatchEngine;
use crate::error::Result;
use crate::sample::Sampler;
use crate::tokenizer::TextStream;
use crate::tokenizer::TextTokenizer;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};

/// Prompt tokens a slot feeds per pass (the CPU engine's prefill chunk).
const PROMPT_CHUNK: usize = 64;

/// A batch factory (again after a panic).
pub type BatchFactory = std::sync::Arc<dyn Fn() -> Result<Box<dyn BatchEngine>> + Send + Sync>;

/// One active request.
struct Active<'t> {
    job: Job,
    sampler: Sampler,
    /// Prompt ids not yet fed.
    prompt: Vec<u32>,
    /// Ids the next pass feeds (a prompt chunk, a chosen token and what the
    /// constraint forces after it).
    feed: Vec<u32>,
    /// Prompt and generated ids (the repetition penalty's history).
    history: Vec<u32>,
    text: TextStream<'t>,
    /// Whether the constraint's forced start has been taken.
    started: bool,
    mask: TokenMask,
    masked: Vec<f32>,
    clock: TokenClock,
}

/// What a slot does after a pass.
enum Next {
    Continue,
    Finish(Finish),
    Gone,
}

pub(super) fn run(
    mut batch: Box<dyn BatchEngine>,
    make: &BatchFactory,
    rx: &Mutex<mpsc::Receiver<Job>>,
    tok: &TextTokenizer,
    sh: &Shared,
) {
    let stopping = &*sh.stopping;
    let vocab = batch.model().config.vocab;
    let eos = batch.model().config.eos;
    let mut slots: Vec<Option<Active<'_>>> = (0..batch.slots()).map(|_| None).collect();
    loop {
        sh.metrics.set_active(slots.iter().flatten().count());
        // Admit waiting jobs into free slots (block only when nothing runs).
        let idle = slots.iter().all(Option::is_none);
        {
            let r = rx.lock().unwrap_or_else(|e| e.into_inner());
            for (i, slot) in slots.iter_mut().enumerate() {
                if slot.is_some() {
                    continue;
                }
                let job = if idle && i == 0 {
                    match r.recv() {
                        Ok(j) => j,
                        Err(_) => return,
                    }
                } else {
                    match r.try_recv() {
                        Ok(j) => j,
                        Err(mpsc::TryRecvError::Empty) => break,
                        Err(mpsc::TryRecvError::Disconnected) => return,
                    }
                };
                batch.reset(i);
                let sampler = match Sampler::new(job.sampler.clone()) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = job.events.send(Event::Failed(e.to_string()));
                        sh.done();
                        continue;
                    }
                };
                sh.metrics.prompt(job.ids.len());
                let mut prompt = job.ids.clone();
                let feed: Vec<u32> = prompt.drain(..prompt.len().min(PROMPT_CHUNK)).collect();
                *slot = Some(Active {
                    history: job.ids.clone(),
                    sampler,
                    prompt,
                    feed,
                    text: TextStream::new(tok, job.stops.clone()),
                    started: job.constraint.is_none(),
                    mask: TokenMask::none(vocab),
                    masked: Vec::new(),
                    clock: TokenClock::new(job.arrived),
                    job,
                });
            }
        }
        sh.metrics.set_active(slots.iter().flatten().count());
        let work: Vec<(usize, Vec<u32>)> = slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.as_mut().map(|a| (i, std::mem::take(&mut a.feed))))
            .filter(|(_, f)| !f.is_empty())
            .collect();
        if work.is_empty() {
            continue;
        }
        let refs: Vec<(usize, &[u32])> = work.iter().map(|(i, f)| (*i, &f[..])).collect();
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert!(
                !refs.iter().any(|(_, f)| super::worker::panics_on(f)),
                "CQLM_SERVE_PANIC_TOKEN"
            );
            batch.step(&refs).map(|_| ())
        }));
        let (failure, panicked) = match stepped {
            Ok(Ok(())) => (None, false),
            Ok(Err(e)) => (Some(e.to_string()), false),
            Err(_) => (Some("the engine worker failed".to_string()), true),
        };
        if let Some(msg) = failure {
            // The pass failed (or panicked): every sequence in it fails, alone;
            // a panic also rebuilds the engine.
            for (i, _) in &work {
                if let Some(a) = slots[*i].take() {
                    let _ = a.job.events.send(Event::Failed(msg.clone()));
                    sh.done();
                }
            }
            if panicked {
                match make() {
                    Ok(b) => batch = b,
                    Err(e) => {
                        log::error!("cannot rebuild the batch engine: {e}");
                        return;
                    }
                }
            }
            continue;
        }
        let logits = batch.last_logits();
        for (k, (i, _)) in work.iter().enumerate() {
            let Some(a) = slots[*i].as_mut() else {
                continue;
            };
            let row = &logits[k * vocab..(k + 1) * vocab];
            let next = advance(a, row, eos, stopping, &sh.metrics);
            match next {
                Ok(Next::Continue) => {}
                Ok(Next::Finish(finish)) => {
                    let a = slots[*i].take().expect("active");
                    finish_job(a, finish);
                    sh.done();
                }
                Ok(Next::Gone) => {
                    slots[*i] = None;
                    sh.done();
                }
                Err(e) => {
                    let a = slots[*i].take().expect("active");
                    let _ = a.job.events.send(Event::Failed(e.to_string()));
                    sh.done();
                }
            }
        }
    }
}

/// After a pass whose last logits for this slot are `row`: feed more prompt, or
/// choose the next token and emit its text; say whether the slot goes on.
fn advance(
    a: &mut Active<'_>,
    row: &[f32],
    eos: u32,
    stopping: &AtomicBool,
    m: &Metrics,
) -> Result<Next> {
    if stopping.load(Ordering::Relaxed) {
        return Ok(Next::Finish(Finish::Length));
    }
    if a.job.events.is_closed() {
        return Ok(Next::Gone);
    }
    // Generated tokens fed this pass (not the prompt) were emitted when chosen.
    if !a.prompt.is_empty() {
        let n = a.prompt.len().min(PROMPT_CHUNK);
        a.feed = a.prompt.drain(..n).collect();
        return Ok(Next::Continue);
    }
    if !a.started {
        // The constraint's forced start, fed as its own chunk before any choice.
        a.started = true;
        let c = a.job.constraint.as_mut().expect("constrained");
        let forced = c.take_forced();
        if !forced.is_empty() {
            let done = c.is_stopped();
            return emit(a, forced, done, m);
        }
    }
    let generated = a.text.len();
    if generated >= a.job.max_tokens {
        return Ok(Next::Finish(Finish::Length));
    }
    let id = match a.job.constraint.as_mut() {
        Some(c) => {
            c.mask_into(&mut a.mask)?;
            a.mask.apply_into(row, &mut a.masked);
            a.sampler.sample(&a.masked, &a.history)
        }
        None => a.sampler.sample(row, &a.history),
    };
    if id == eos {
        return Ok(Next::Finish(Finish::Stop));
    }
    let (ids, done) = match a.job.constraint.as_mut() {
        Some(c) => {
            c.commit(id)?;
            let mut ids = vec![id];
            ids.extend(c.take_forced());
            (ids, c.is_stopped())
        }
        None => (vec![id], false),
    };
    emit(a, ids, done, m)
}

/// Emit `ids` (to feed next), up to the token limit; `done`: the constraint's
/// output is complete after them (unless the limit cut them: then it is not).
fn emit(a: &mut Active<'_>, mut ids: Vec<u32>, done: bool, m: &Metrics) -> Result<Next> {
    let room = a.job.max_tokens - a.text.len();
    let cut = ids.len() > room;
    ids.truncate(room);
    for &id in &ids {
        a.clock.tick(m);
        a.history.push(id);
        if let Some(delta) = a.text.push(id)? {
            if a.job.stream_text && a.job.events.send(Event::Text(delta)).is_err() {
                return Ok(Next::Gone);
            }
        }
        if a.text.stopped() {
            return Ok(Next::Finish(Finish::Stop));
        }
    }
    if cut {
        return Ok(Next::Finish(Finish::Length));
    }
    if done {
        return Ok(Next::Finish(Finish::Stop));
    }
    if a.text.len() >= a.job.max_tokens {
        return Ok(Next::Finish(Finish::Length));
    }
    a.feed = ids;
    Ok(Next::Continue)
}

fn finish_job(a: Active<'_>, mut finish: Finish) {
    let full = match a.text.full() {
        Ok(t) => t,
        Err(e) => {
            let _ = a.job.events.send(Event::Failed(e.to_string()));
            return;
        }
    };
    let mut tool_calls = Vec::new();
    // A stop string may cut a call short: its text is the answer, with no call.
    if let (Some(c), Finish::Stop, false) = (&a.job.constraint, finish, a.text.stopped()) {
        match c.tool_calls(&full) {
            Ok(calls) => tool_calls = calls,
            Err(e) => {
                let _ = a.job.events.send(Event::Failed(e.to_string()));
                return;
            }
        }
        if !tool_calls.is_empty() {
            finish = Finish::ToolCalls;
        }
    }
    let _ = a.job.events.send(Event::Done {
        finish,
        completion_tokens: a.text.len(),
        text: full,
        tool_calls,
    });
}
