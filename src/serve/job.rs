//! The engine side of the server as the HTTP side sees it: a [`Job`] per
//! request, the [`Event`]s it sends back, and the bounded [`Queue`] in front of
//! the one batch loop (`batcher.rs`) that runs them all. A client that
//! hangs up closes its channel, and its job stops at the next pass.

use super::metrics::Metrics;
use crate::constrain::Constraint;
use crate::error::{Error, Result};
use crate::session::builder::BatchFactory;
use crate::session::logprobs::TokenLogprob;
use crate::session::prompt_cache::PromptCache;
use crate::session::sample::SamplerConfig;
use crate::session::tokenizer::TextTokenizer;
use crate::session::Output;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use tokio::sync::mpsc::UnboundedSender;

/// What a job sends back.
#[derive(Debug)]
pub enum Event {
    /// The job took a sequence, starting from a kept state that covers this
    /// many prompt tokens (0: none; sent once, before anything else).
    Started {
        /// Prompt tokens that came from the prompt cache.
        cached_tokens: usize,
    },
    /// The logprobs of the tokens emitted since the last event (only for a
    /// job that asked for them; sent before the text those tokens add).
    Logprobs(Vec<TokenLogprob>),
    /// More text (never a partial character, never part of a stop string).
    Text(String),
    /// The end: why, the token count, the whole text, the parsed tool calls.
    Done(Output),
    /// The engine failed on this request (the server keeps serving).
    Failed(String),
}

/// One request for the batch loop.
pub struct Job {
    /// The prompt ids (BOS first).
    pub ids: Vec<u32>,
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Stop strings.
    pub stops: Vec<String>,
    /// A compiled constraint, if the request has one.
    pub constraint: Option<Constraint>,
    /// Report each token's logprob and this many alternatives
    /// ([`Event::Logprobs`]).
    pub logprobs: Option<usize>,
    /// Stream text events as tokens come (else only `Done`: tool calls, whose
    /// shape is known only at the end).
    pub stream_text: bool,
    /// Where the events go.
    pub events: UnboundedSender<Event>,
    /// When the request arrived (the time to first token counts from here).
    pub arrived: std::time::Instant,
}

/// A request for a profile of the serving engine (`GET /v1/cqlm/profile`):
/// the batch loop runs it on a free slot between passes.
pub struct ProfileJob {
    /// Passes to time (one token each).
    pub passes: usize,
    /// Prompt tokens fed first, unprofiled.
    pub prompt_len: usize,
    /// Where the profile goes .
    pub reply: tokio::sync::oneshot::Sender<ProfileOutcome>,
}

/// What a [`ProfileJob`] comes back with.
pub enum ProfileOutcome {
    /// The profile, with the engine in words and its precision.
    Done {
        /// The per-kernel timings.
        profile: crate::engine::profile::KernelProfile,
        /// The engine ([`crate::engine::BatchEngine::describe`]).
        backend: String,
        /// Its matvec arithmetic.
        precision: String,
    },
    /// The engine failed.
    Failed(String),
}

/// What the batch loop receives.
pub enum Work {
    /// A generation.
    Generate(Box<Job>),
    /// A profile of the engine.
    Profile(ProfileJob),
}

/// The queue in front of the batch loop.
pub struct Queue {
    /// Work for the batch loop (a `Sender` is `Sync`: every handler sends on it).
    sender: mpsc::Sender<Work>,
    shared: Arc<Shared>,
    limit: usize,
    slots: usize,
}

/// What the queue and the batch loop share: the jobs queued or running, the
/// shutdown flag and the metrics.
pub(super) struct Shared {
    inflight: AtomicUsize,
    pub(super) stopping: AtomicBool,
    pub(super) metrics: Arc<Metrics>,
    /// Shortest time between two text events of a stream.
    pub(super) stream_interval: std::time::Duration,
}

impl Shared {
    /// A job left (finished, failed or abandoned).
    pub(super) fn done(&self) {
        self.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The test hook `CQLM_SERVE_PANIC_TOKEN=ID`: an engine pass that is fed token
/// `ID` panics, so that tests can see a failed pass's requests answered with a
/// 500 and the next one served. Unset, nothing panics.
pub(crate) fn panics_on(ids: &[u32]) -> bool {
    static TOKEN: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let t = TOKEN.get_or_init(|| {
        std::env::var("CQLM_SERVE_PANIC_TOKEN")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    t.is_some_and(|t| ids.contains(&t))
}

/// The test hook `CQLM_SERVE_PASS_DELAY_MS=N`: every engine pass waits N
/// milliseconds first, so that a browser test sees a short answer stream over
/// seconds as a slow engine would send it. Unset (or 0), no pass waits.
pub(crate) fn pass_delay() -> Option<std::time::Duration> {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        std::env::var("CQLM_SERVE_PASS_DELAY_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&ms| ms > 0)
            .map(std::time::Duration::from_millis)
    })
}

impl Queue {
    /// Start the batch loop over `batch` (its slots are the sequences that
    /// generate at once; `make` builds another after a pass panicked), with
    /// room for `max_queue` waiting jobs beyond them and a prompt cache of
    /// `cache_bytes`, and at most one text event a stream per
    /// `stream_interval`; it counts what it runs in `metrics`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the loop's thread cannot be started.
    pub fn start(
        batch: Box<dyn crate::engine::BatchEngine>,
        make: BatchFactory,
        max_queue: usize,
        cache_bytes: u64,
        stream_interval: std::time::Duration,
        tok: Arc<TextTokenizer>,
        metrics: Arc<Metrics>,
    ) -> Result<Queue> {
        let batch_slots = batch.slots();
        let limit = batch_slots + max_queue;
        let (tx, rx) = mpsc::channel::<Work>();
        let shared = Arc::new(Shared {
            inflight: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            metrics,
            stream_interval,
        });
        let sh = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("cqlm-serve-batch".into())
            .spawn(move || {
                let cache = PromptCache::new(cache_bytes);
                super::batcher::run(batch, &make, &rx, &tok, &sh, cache)
            })
            .map_err(|e| Error::InvalidArgument(format!("cannot start the batch loop: {e}")))?;
        Ok(Queue {
            sender: tx,
            shared,
            limit,
            slots: batch_slots,
        })
    }

    /// Queue `job`; false (the job dropped) when the slots and `max_queue`
    /// places are all taken, or the batch loop is gone.
    pub fn submit(&self, job: Job) -> bool {
        let inflight = &self.shared.inflight;
        if inflight.fetch_add(1, Ordering::SeqCst) >= self.limit {
            inflight.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        let sent = self.sender.send(Work::Generate(Box::new(job))).is_ok();
        if !sent {
            inflight.fetch_sub(1, Ordering::SeqCst);
        }
        sent
    }

    /// Send a profile request to the batch loop (not counted as a job: it runs
    /// between passes); false when every slot is taken or the loop is gone.
    pub fn submit_profile(&self, job: ProfileJob) -> bool {
        self.in_flight() < self.slots && self.sender.send(Work::Profile(job)).is_ok()
    }

    /// Sequences that generate at once (the batch's slots).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Jobs queued or running.
    pub fn in_flight(&self) -> usize {
        self.shared.inflight.load(Ordering::SeqCst)
    }

    /// Stop every running job at its next pass (shutdown).
    pub fn stop_all(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
    }
}
