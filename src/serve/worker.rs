//! The engine side of the server: `--parallel` worker threads, each owning a
//! [`Session`] (its own KV cache, engram rings and sampler over the weights every
//! worker shares), taking jobs from one bounded queue and sending what they
//! generate back as [`Event`]s. A client that hangs up closes its channel, and
//! its job stops at the next token. A worker whose job panics sends an error for
//! that job and rebuilds its session.

use super::metrics::{Metrics, TokenClock};
use crate::constrain::{Constraint, ToolCall};
use crate::error::Result;
use crate::sample::{Sampler, SamplerConfig};
use crate::session::{Session, Stop};
use crate::tokenizer::{TextStream, TextTokenizer};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use tokio::sync::mpsc::UnboundedSender;

/// Why a generation ended, as the API says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// EOS, a stop string, or a complete constrained output.
    Stop,
    /// `max_tokens`.
    Length,
    /// The output is tool calls.
    ToolCalls,
}

impl Finish {
    /// The API's `finish_reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
        }
    }
}

/// What a job sends back.
#[derive(Debug)]
pub enum Event {
    /// More text (never a partial character, never part of a stop string).
    Text(String),
    /// The end: why, the token counts, the whole text, the parsed tool calls.
    Done {
        /// Why it ended.
        finish: Finish,
        /// Generated tokens.
        completion_tokens: usize,
        /// The whole generated text (stop string excluded).
        text: String,
        /// The calls, for a tool constraint whose output called tools.
        tool_calls: Vec<ToolCall>,
    },
    /// The engine failed on this request (the server keeps serving).
    Failed(String),
}

/// One request for a worker.
pub struct Job {
    /// The prompt ids (BOS first).
    pub ids: Vec<u32>,
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Stop strings.
    pub stops: Vec<String>,
    /// A compiled constraint, if the request has one; `stream_text`: whether its
    /// text may be streamed as it comes (not for tool calls, whose shape is known
    /// only at the end).
    pub constraint: Option<Constraint>,
    /// Stream text events as tokens come (else only `Done`).
    pub stream_text: bool,
    /// Where the events go.
    pub events: UnboundedSender<Event>,
    /// When the request arrived (the time to first token counts from here).
    pub arrived: std::time::Instant,
}

/// The queue and the workers.
pub struct Workers {
    queue: Mutex<mpsc::Sender<Job>>,
    /// Jobs queued or running.
    inflight: Arc<AtomicUsize>,
    limit: usize,
    stopping: Arc<AtomicBool>,
}

/// What every worker shares: the jobs queued or running, the shutdown flag and
/// the metrics.
pub(super) struct Shared {
    pub(super) inflight: Arc<AtomicUsize>,
    pub(super) stopping: Arc<AtomicBool>,
    pub(super) metrics: Arc<Metrics>,
}

impl Shared {
    /// A job left (finished, failed or abandoned).
    pub(super) fn done(&self) {
        self.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The test hook `CQLM_SERVE_PANIC_TOKEN=ID`: an engine pass that is fed token
/// `ID` panics, so that tests can see a failed worker replaced (the request gets
/// a 500, the next one is served). Unset, nothing panics.
pub(crate) fn panics_on(ids: &[u32]) -> bool {
    static TOKEN: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let t = TOKEN.get_or_init(|| {
        std::env::var("CQLM_SERVE_PANIC_TOKEN")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    t.is_some_and(|t| ids.contains(&t))
}

/// A [`Session`] factory (one per worker, and again after a panic).
pub type SessionFactory = Arc<dyn Fn() -> Result<Session> + Send + Sync>;

/// What runs the requests.
pub enum Engines {
    /// One worker thread and session per parallel sequence (any backend).
    Sessions(SessionFactory),
    /// One thread stepping every parallel sequence in one pass (the CPU engine's
    /// continuous batching, [`super::batcher`]).
    Batch(super::batcher::BatchFactory),
}

impl Workers {
    /// `parallel` workers over sessions from `make`, with room for `max_queue`
    /// waiting jobs; they count what they run in `metrics`.
    ///
    /// # Errors
    /// The first session (or the batch engine) that cannot be built.
    pub fn start(
        parallel: usize,
        max_queue: usize,
        engines: Engines,
        tok: Arc<TextTokenizer>,
        metrics: Arc<Metrics>,
    ) -> Result<Workers> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let inflight = Arc::new(AtomicUsize::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let shared = || Shared {
            inflight: Arc::clone(&inflight),
            stopping: Arc::clone(&stopping),
            metrics: Arc::clone(&metrics),
        };
        let make = match engines {
            Engines::Sessions(make) => make,
            Engines::Batch(make) => {
                // Built here, so a batch that can't be is an error before serving.
                let batch = make()?;
                let (rx, tok, sh) = (Arc::clone(&rx), Arc::clone(&tok), shared());
                std::thread::Builder::new()
                    .name("cqlm-serve-batch".into())
                    .spawn(move || super::batcher::run(batch, &make, &rx, &tok, &sh))
                    .map_err(|e| {
                        crate::Error::InvalidArgument(format!("cannot start a worker: {e}"))
                    })?;
                return Ok(Workers {
                    queue: Mutex::new(tx),
                    inflight,
                    limit: parallel.max(1) + max_queue,
                    stopping,
                });
            }
        };
        for i in 0..parallel.max(1) {
            let session = make()?;
            let (rx, make, tok) = (Arc::clone(&rx), Arc::clone(&make), Arc::clone(&tok));
            let sh = shared();
            std::thread::Builder::new()
                .name(format!("cqlm-serve-{i}"))
                .spawn(move || worker(session, &rx, &make, &tok, &sh))
                .map_err(|e| {
                    crate::Error::InvalidArgument(format!("cannot start a worker: {e}"))
                })?;
        }
        Ok(Workers {
            queue: Mutex::new(tx),
            inflight,
            limit: parallel.max(1) + max_queue,
            stopping,
        })
    }

    /// Queue `job`; false (the job dropped) when `parallel + max_queue` jobs are
    /// already queued or running, or the workers are gone.
    pub fn submit(&self, job: Job) -> bool {
        if self.inflight.fetch_add(1, Ordering::SeqCst) >= self.limit {
            self.inflight.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        let q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let sent = q.send(job).is_ok();
        if !sent {
            self.inflight.fetch_sub(1, Ordering::SeqCst);
        }
        sent
    }

    /// Jobs queued or running.
    pub fn in_flight(&self) -> usize {
        self.inflight.load(Ordering::SeqCst)
    }

    /// Stop every running job at its next token (shutdown).
    pub fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }
}

fn worker(
    mut session: Session,
    rx: &Mutex<mpsc::Receiver<Job>>,
    make: &SessionFactory,
    tok: &TextTokenizer,
    sh: &Shared,
) {
    loop {
        let job = {
            let r = rx.lock().unwrap_or_else(|e| e.into_inner());
            match r.recv() {
                Ok(j) => j,
                Err(_) => return,
            }
        };
        let events = job.events.clone();
        sh.metrics.started(job.ids.len());
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_job(&mut session, job, tok, sh)
        }));
        sh.metrics.ended();
        match run {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = events.send(Event::Failed(e.to_string()));
            }
            Err(_) => {
                let _ = events.send(Event::Failed("the engine worker failed".into()));
                match make() {
                    Ok(s) => session = s,
                    Err(e) => {
                        log::error!("cannot rebuild a worker's session: {e}");
                        sh.done();
                        return;
                    }
                }
            }
        }
        sh.done();
    }
}

fn run_job(session: &mut Session, job: Job, tok: &TextTokenizer, sh: &Shared) -> Result<()> {
    let Job {
        ids,
        sampler,
        max_tokens,
        stops,
        mut constraint,
        stream_text,
        events,
        arrived,
    } = job;
    let mut clock = TokenClock::new(arrived);
    assert!(!panics_on(&ids), "CQLM_SERVE_PANIC_TOKEN");
    session.reset();
    session.prefill(&ids)?;
    let mut sampler = Sampler::new(sampler)?;
    let mut text = TextStream::new(tok, stops);
    let mut failed = None;
    let mut gone = false;
    let mut on_token = |id: u32| {
        clock.tick(&sh.metrics);
        if sh.stopping.load(Ordering::Relaxed) {
            return false;
        }
        match text.push(id) {
            Ok(Some(delta)) if stream_text => {
                if events.send(Event::Text(delta)).is_err() {
                    gone = true;
                    return false;
                }
            }
            Ok(_) => {
                if events.is_closed() {
                    gone = true;
                    return false;
                }
            }
            Err(e) => {
                failed = Some(e);
                return false;
            }
        }
        !text.stopped()
    };
    let stop = match constraint.as_mut() {
        Some(c) => {
            session
                .generate_constrained(&mut sampler, max_tokens, c, &mut on_token)?
                .0
        }
        None => session.generate(&mut sampler, max_tokens, &mut on_token)?,
    };
    if let Some(e) = failed {
        return Err(e);
    }
    if gone {
        return Ok(());
    }
    let full = text.full()?;
    let mut finish = match stop {
        Stop::Length => Finish::Length,
        _ => Finish::Stop,
    };
    let mut tool_calls = Vec::new();
    // A stop string may cut a call short: its text is the answer, with no call.
    if let (Some(c), Finish::Stop, false) = (&constraint, finish, text.stopped()) {
        tool_calls = c.tool_calls(&full)?;
        if !tool_calls.is_empty() {
            finish = Finish::ToolCalls;
        }
    }
    let _ = events.send(Event::Done {
        finish,
        completion_tokens: text.len(),
        text: full,
        tool_calls,
    });
    Ok(())
}
