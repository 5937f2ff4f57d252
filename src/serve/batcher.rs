//! The batch loop: one thread owns the server's [`BatchEngine`] (the CPU's
//! [`crate::CpuBatch`] or the GPU's [`crate::GpuBatch`]); every engine pass
//! steps one token (or a prompt chunk, or a run of forced tokens) of every
//! active sequence together. A new request takes a free slot at the next pass,
//! a finished one frees its slot. Each slot runs a [`Generation`], the one
//! generation state machine the CLI and library use too, so a sequence's tokens
//! are what it would generate alone; each item of a pass reads out only what
//! its sampler needs (on the GPU, the argmax or top-k on the device).
//!
//! The prompt cache: when a slot has fed its whole prompt, and when it
//! finishes, its state is saved ([`BatchEngine::save`]) into a
//! [`PromptCache`] keyed by the tokens it has processed; a new request whose
//! prompt extends kept tokens starts from a copy of that state
//! ([`BatchEngine::restore`]) and feeds only the rest.

use super::job::{panics_on, pass_delay, Event, ProfileJob, ProfileOutcome, Shared, Work};
use super::metrics::TokenClock;
use crate::engine::{BatchEngine, Readout, SlotStep};
use crate::error::Result;
use crate::session::builder::BatchFactory;
use crate::session::prompt_cache::PromptCache;
use crate::session::sample::Sampler;
use crate::session::tokenizer::{TextStream, TextTokenizer};
use crate::session::{Generation, Next, Progress};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

/// Prompt tokens a slot feeds per pass.
const PROMPT_CHUNK: usize = 64;

/// One active request.
struct Active<'t> {
    generation: Generation<'t>,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
    stream_text: bool,
    clock: TokenClock,
    /// The ids of this pass (a copy of the generation's) and their readout.
    feed: Vec<u32>,
    next: Option<Next>,
    /// Whether the state after the whole prompt has been offered to the cache.
    prompt_kept: bool,
    /// When text or logprobs last went out ([`deliver`]).
    sent_at: Option<Instant>,
}

/// What becomes of a slot.
enum Slot {
    Continue,
    Finished,
    Failed(String),
    Gone,
}

pub(super) fn run(
    mut batch: Box<dyn BatchEngine>,
    make: &BatchFactory,
    rx: &mpsc::Receiver<Work>,
    tok: &TextTokenizer,
    sh: &Shared,
    mut cache: PromptCache,
) {
    let mut slots: Vec<Option<Active<'_>>> = (0..batch.slots()).map(|_| None).collect();
    loop {
        // Counted before admitting too: an idle loop waits there for a job.
        sh.metrics.set_active(slots.iter().flatten().count());
        if !admit(&mut slots, batch.as_mut(), rx, tok, sh, &mut cache) {
            return;
        }
        sh.metrics.set_active(slots.iter().flatten().count());
        // What each slot feeds this pass.
        for (i, slot) in slots.iter_mut().enumerate() {
            let Some(a) = slot.as_mut() else {
                continue;
            };
            let s = prepare(a, sh);
            if matches!(s, Slot::Finished) {
                keep(a, batch.as_mut(), i, &mut cache, false);
            }
            settle(slot, s, sh);
        }
        let work: Vec<SlotStep<'_>> = slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let a = s.as_ref()?;
                let next = a.next?;
                let mask = next.masked.then(|| a.generation.current_mask()).flatten();
                Some(SlotStep::new(i, &a.feed, next.readout).masked(mask))
            })
            .collect();
        if work.is_empty() {
            continue;
        }
        if let Some(d) = pass_delay() {
            std::thread::sleep(d);
        }
        let items: Vec<usize> = work.iter().map(|w| w.slot).collect();
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert!(
                !work.iter().any(|w| panics_on(w.ids)),
                "CQLM_SERVE_PANIC_TOKEN"
            );
            batch.step(&work)
        }));
        drop(work);
        let (failure, panicked) = match stepped {
            Ok(Ok(())) => (None, false),
            Ok(Err(e)) => (Some(e.to_string()), false),
            Err(_) => (Some("the engine pass failed".to_string()), true),
        };
        sh.metrics.set_read_back(batch.bytes_read_back());
        if let Some(msg) = failure {
            // The pass failed (or panicked): every sequence in it fails, alone;
            // a panic also rebuilds the engine.
            for &i in &items {
                settle(&mut slots[i], Slot::Failed(msg.clone()), sh);
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
        for (k, &i) in items.iter().enumerate() {
            let Some(a) = slots[i].as_mut() else {
                continue;
            };
            let s = match advance(a, batch.as_mut(), k) {
                Ok(()) => deliver(a, sh),
                Err(e) => Slot::Failed(e.to_string()),
            };
            if !matches!(s, Slot::Failed(_) | Slot::Gone) {
                keep(
                    a,
                    batch.as_mut(),
                    i,
                    &mut cache,
                    matches!(s, Slot::Continue),
                );
            }
            settle(&mut slots[i], s, sh);
        }
        sh.metrics
            .set_cache(cache.stats(), cache.bytes(), cache.len());
    }
}

/// Offer slot `i`'s state to the cache: once its whole prompt is in (while it
/// `goes_on`), and when it has finished (the tokens it has processed, when
/// they reach past the prompt). A state that can't be saved is only logged.
fn keep(
    a: &mut Active<'_>,
    batch: &mut dyn BatchEngine,
    i: usize,
    cache: &mut PromptCache,
    goes_on: bool,
) {
    let (pos, prompt) = (batch.position(i) as usize, a.generation.prompt_len());
    let at_prompt = !a.prompt_kept && pos == prompt;
    // A going slot keeps only its prompt's state; a finished one also the
    // state past its prompt.
    let past_prompt = !goes_on && pos > prompt;
    if !at_prompt && !past_prompt {
        return;
    }
    a.prompt_kept |= at_prompt;
    let Some(tokens) = a.generation.tokens().get(..pos) else {
        return;
    };
    if !cache.wants(tokens) {
        return;
    }
    match batch.save(i) {
        Ok(saved) => cache.insert(tokens.to_vec(), saved),
        Err(e) => log::warn!("prompt cache: cannot save a sequence: {e}"),
    }
}

/// Give waiting jobs the free slots (block for one only when nothing runs);
/// false when the queue is gone.
fn admit<'t>(
    slots: &mut [Option<Active<'t>>],
    batch: &mut dyn BatchEngine,
    rx: &mpsc::Receiver<Work>,
    tok: &'t TextTokenizer,
    sh: &Shared,
    cache: &mut PromptCache,
) -> bool {
    let idle = slots.iter().all(Option::is_none);
    let (vocab, eos) = {
        let c = &batch.model().config;
        (c.vocab, c.eos)
    };
    for (i, slot) in slots.iter_mut().enumerate() {
        if slot.is_some() {
            continue;
        }
        // A profile runs on this free slot at once; then the slot takes the next work.
        let job = loop {
            let work = if idle && i == 0 {
                match rx.recv() {
                    Ok(w) => w,
                    Err(_) => return false,
                }
            } else {
                match rx.try_recv() {
                    Ok(w) => w,
                    Err(mpsc::TryRecvError::Empty) => return true,
                    Err(mpsc::TryRecvError::Disconnected) => return false,
                }
            };
            match work {
                Work::Generate(j) => break *j,
                Work::Profile(p) => profile(batch, i, p),
            }
        };
        let sampler = match Sampler::new(job.sampler) {
            Ok(s) => s,
            Err(e) => {
                let _ = job.events.send(Event::Failed(e.to_string()));
                sh.done();
                continue;
            }
        };
        batch.reset(i);
        sh.metrics.prompt(job.ids.len());
        // The longest kept state the prompt extends, put into the slot.
        let cached = match cache.lookup(&job.ids) {
            Some((saved, n)) => match batch.restore(i, saved) {
                Ok(()) => n,
                Err(e) => {
                    log::warn!("prompt cache: cannot restore a sequence: {e}");
                    batch.reset(i);
                    0
                }
            },
            None => 0,
        };
        let _ = job.events.send(Event::Started {
            cached_tokens: cached,
        });
        let mut generation = Generation::new(job.ids, sampler, eos, job.max_tokens)
            .with_prompt_in_engine(cached)
            .with_text(TextStream::new(tok, job.stops));
        if let Some(c) = job.constraint {
            generation = generation.with_constraint(c, vocab);
        }
        if let Some(top) = job.logprobs {
            generation = generation.with_logprobs(top);
        }
        *slot = Some(Active {
            generation,
            events: job.events,
            stream_text: job.stream_text,
            clock: TokenClock::new(job.arrived),
            feed: Vec::new(),
            next: None,
            prompt_kept: false,
            sent_at: None,
        });
    }
    true
}

/// Before a pass: the slot's next step (its mask computed), or its end.
fn prepare(a: &mut Active<'_>, sh: &Shared) -> Slot {
    a.next = None;
    if a.events.is_closed() {
        return Slot::Gone;
    }
    if sh.stopping.load(Ordering::Relaxed) {
        a.generation.cancel();
        return Slot::Finished;
    }
    let next = match a.generation.next(PROMPT_CHUNK) {
        Ok(n) => n,
        Err(e) => return Slot::Failed(e.to_string()),
    };
    // A forced start may have been emitted (and may have ended the generation).
    match deliver(a, sh) {
        Slot::Continue => {}
        other => return other,
    }
    let Some(next) = next else {
        return Slot::Finished;
    };
    if next.masked {
        if let Err(e) = a.generation.mask() {
            return Slot::Failed(e.to_string());
        }
    }
    a.feed.clear();
    a.feed.extend_from_slice(a.generation.ids());
    a.next = Some(next);
    Slot::Continue
}

/// After a pass: hand item `k`'s readout to the slot's generation (with the
/// full logits when a top-p draw needs them).
fn advance(a: &mut Active<'_>, batch: &mut dyn BatchEngine, k: usize) -> Result<()> {
    if a.generation.advance(batch.out(k))? == Progress::NeedLogits {
        let mask = a.generation.current_mask();
        let out = batch.reread(k, Readout::Logits, mask)?;
        a.generation.advance(out)?;
    }
    Ok(())
}

/// Tick the token clock for the tokens emitted since the last call and send
/// their logprobs and text, at most once per [`Shared::stream_interval`]
/// (the first at once; what waits stays in the generation and goes out with a
/// later call or the end); say whether the slot goes on.
fn deliver(a: &mut Active<'_>, sh: &Shared) -> Slot {
    for _ in a.generation.take_emitted() {
        a.clock.tick(&sh.metrics);
    }
    let done = a.generation.is_done();
    let due = done || a.sent_at.is_none_or(|t| t.elapsed() >= sh.stream_interval);
    if due {
        let logprobs = a.generation.take_logprobs();
        let delta = a.generation.take_delta();
        let sends = !logprobs.is_empty() || (a.stream_text && !delta.is_empty());
        if !logprobs.is_empty() && a.events.send(Event::Logprobs(logprobs)).is_err() {
            return Slot::Gone;
        }
        if a.stream_text && !delta.is_empty() && a.events.send(Event::Text(delta)).is_err() {
            return Slot::Gone;
        }
        if sends {
            a.sent_at = Some(Instant::now());
        }
    }
    if done {
        Slot::Finished
    } else {
        Slot::Continue
    }
}

/// Act on what became of a slot: send its end and free it, or keep it.
fn settle(slot: &mut Option<Active<'_>>, s: Slot, sh: &Shared) {
    let event = match s {
        Slot::Continue => return,
        Slot::Gone => None,
        Slot::Failed(msg) => Some(Event::Failed(msg)),
        Slot::Finished => slot.as_ref().map(|a| match a.generation.output() {
            Ok(out) => Event::Done(out),
            Err(e) => Event::Failed(e.to_string()),
        }),
    };
    if let Some(a) = slot.take() {
        // Free the place first: a client that gets its end and at once asks
        // again (or asks for a profile) finds it free.
        sh.done();
        if let Some(ev) = event {
            let _ = a.events.send(ev);
        }
    }
}

/// Run `p` on free slot `i` (reset before and after) and send its outcome.
fn profile(batch: &mut dyn BatchEngine, i: usize, p: ProfileJob) {
    let timing = crate::engine::profile::Timing::Auto;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::engine::profile::profile_batch(batch, &[i], p.prompt_len, p.passes, timing)
    }));
    batch.reset(i);
    let outcome = match outcome {
        Ok(Ok(profile)) => ProfileOutcome::Done {
            profile,
            backend: batch.describe(),
            precision: batch.precision().as_str().to_string(),
        },
        Ok(Err(e)) => ProfileOutcome::Failed(e.to_string()),
        Err(_) => ProfileOutcome::Failed("the profile pass failed".into()),
    };
    let _ = p.reply.send(outcome);
}
