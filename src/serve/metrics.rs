//! What the server counts and logs: [`Metrics`] (served at `GET /metrics` in
//! the Prometheus/OpenMetrics text format: requests by endpoint and status,
//! prompt and generated tokens, active sequences, queue depth, time to first
//! token, inter-token latency and request duration) and [`Record`], one request's
//! log line on stderr (target `cqlm::request`), written once the response has
//! ended, streamed or not.

use axum::http::StatusCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The log target of the request lines (`RUST_LOG=cqlm::request=off` silences them).
pub const LOG_TARGET: &str = "cqlm::request";

/// The labels of `cqlm_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: String,
    status: u16,
}

/// The server's counters, gauges and histograms, shared by the HTTP side and the
/// engine workers; every update is a few atomic operations.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    prompt_tokens: Counter,
    generated_tokens: Counter,
    active: Gauge,
    queued: Gauge,
    read_back: Counter,
    cache: CacheMetrics,
    ttft: Histogram,
    itl: Histogram,
    duration: Histogram,
}

impl Metrics {
    /// Everything at zero.
    pub fn new() -> Metrics {
        let requests = Family::<RequestLabels, Counter>::default();
        let prompt_tokens = Counter::default();
        let generated_tokens = Counter::default();
        let active = Gauge::default();
        let queued = Gauge::default();
        let read_back = Counter::default();
        let cache = CacheMetrics::default();
        // 0.5 ms .. 33 s; 50 µs .. 3.3 s; 1 ms .. 65 s.
        let ttft = Histogram::new(exponential_buckets(0.0005, 2.0, 17));
        let itl = Histogram::new(exponential_buckets(0.00005, 2.0, 17));
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        let mut r = Registry::with_prefix("cqlm");
        r.register(
            "requests",
            "HTTP requests answered, by endpoint and status",
            requests.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens of the generations started",
            prompt_tokens.clone(),
        );
        r.register(
            "generated_tokens",
            "Tokens generated (sampled or forced by a constraint)",
            generated_tokens.clone(),
        );
        r.register(
            "active_sequences",
            "Sequences generating now",
            active.clone(),
        );
        r.register(
            "queue_depth",
            "Requests waiting for a sequence",
            queued.clone(),
        );
        r.register(
            "readback_bytes",
            "Bytes the engine copied back from the device (0 on the CPU): a few a \
             token for device readouts, the vocabulary's logits for a request that needs them",
            read_back.clone(),
        );
        cache.register(&mut r);
        r.register(
            "time_to_first_token_seconds",
            "From a generation request's arrival to its first token",
            ttft.clone(),
        );
        r.register(
            "inter_token_latency_seconds",
            "Between consecutive tokens of one sequence",
            itl.clone(),
        );
        r.register(
            "request_duration_seconds",
            "From a request's arrival to the end of its response",
            duration.clone(),
        );
        Metrics {
            registry: r,
            requests,
            prompt_tokens,
            generated_tokens,
            active,
            queued,
            read_back,
            cache,
            ttft,
            itl,
            duration,
        }
    }

    /// The text exposition, with `in_flight` requests queued or running (the queue
    /// depth is those not yet running).
    pub fn render(&self, in_flight: usize) -> String {
        let active = self.active.get().max(0);
        self.queued.set((in_flight as i64 - active).max(0));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// A generation of a `prompt`-token prompt starts (counts its prompt only).
    pub fn prompt(&self, prompt: usize) {
        self.prompt_tokens.inc_by(prompt as u64);
    }

    /// Set the running generations (the batch loop counts its slots each pass).
    pub fn set_active(&self, n: usize) {
        self.active.set(n as i64);
    }

    /// Set the bytes the engine has copied back from its device so far.
    pub fn set_read_back(&self, bytes: u64) {
        let have = self.read_back.get();
        if bytes > have {
            self.read_back.inc_by(bytes - have);
        }
    }

    /// Set the prompt cache's figures from its `stats`, `bytes` and `states`.
    pub fn set_cache(
        &self,
        stats: crate::session::prompt_cache::CacheStats,
        bytes: u64,
        states: usize,
    ) {
        let c = &self.cache;
        for (counter, now) in [
            (&c.hits, stats.hits),
            (&c.misses, stats.misses),
            (&c.tokens_reused, stats.tokens_reused),
            (&c.evictions, stats.evictions),
        ] {
            let have = counter.get();
            if now > have {
                counter.inc_by(now - have);
            }
        }
        c.bytes.set(bytes as i64);
        c.states.set(states as i64);
    }

    /// A response ended: count it and its duration.
    fn answered(&self, endpoint: &str, status: u16, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.to_string(),
                status,
            })
            .inc();
        self.duration.observe(took.as_secs_f64());
    }
}

/// The prompt cache's figures.
#[derive(Default)]
struct CacheMetrics {
    hits: Counter,
    misses: Counter,
    tokens_reused: Counter,
    evictions: Counter,
    bytes: Gauge,
    states: Gauge,
}

impl CacheMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "prompt_cache_hits",
            "Requests that started from a kept sequence state",
            self.hits.clone(),
        );
        r.register(
            "prompt_cache_misses",
            "Requests that found no kept state to start from",
            self.misses.clone(),
        );
        r.register(
            "prompt_cache_tokens_reused",
            "Prompt tokens not prefilled again thanks to a kept state",
            self.tokens_reused.clone(),
        );
        r.register(
            "prompt_cache_evictions",
            "Kept states dropped to stay within --cache-mb",
            self.evictions.clone(),
        );
        r.register(
            "prompt_cache_bytes",
            "Bytes of the kept states (device memory on a GPU)",
            self.bytes.clone(),
        );
        r.register(
            "prompt_cache_states",
            "Sequence states kept",
            self.states.clone(),
        );
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// One sequence's token clock: the first token's delay from the request's arrival
/// and the gaps between later ones go to the histograms.
pub struct TokenClock {
    arrived: Instant,
    last: Option<Instant>,
}

impl TokenClock {
    /// A clock for a request that arrived at `arrived`.
    pub fn new(arrived: Instant) -> TokenClock {
        TokenClock {
            arrived,
            last: None,
        }
    }

    /// A token was generated now.
    pub fn tick(&mut self, m: &Metrics) {
        let now = Instant::now();
        match self.last {
            None => m.ttft.observe((now - self.arrived).as_secs_f64()),
            Some(t) => m.itl.observe((now - t).as_secs_f64()),
        }
        m.generated_tokens.inc();
        self.last = Some(now);
    }
}

/// One request as it is logged: the middleware opens it, the handler fills in
/// what it knows, and the line is written (and the request counted) when the last
/// holder lets go: at once for a whole response, at the stream's end for SSE.
pub struct Record {
    metrics: Arc<Metrics>,
    endpoint: String,
    method: String,
    arrived: Instant,
    /// The response's status.
    pub status: StatusCode,
    /// The response's id (`chatcmpl-…`), for generations.
    pub id: Option<String>,
    /// Prompt tokens, for generations.
    pub prompt_tokens: usize,
    /// Prompt tokens a kept state covered (the prompt cache), for generations.
    pub cached_tokens: usize,
    /// Generated tokens, for generations.
    pub completion_tokens: usize,
    /// How the generation ended: `stop`, `length`, `tool_calls`, `failed`,
    /// `disconnected`; none for other requests.
    pub outcome: Option<&'static str>,
    /// Why the request was refused, for an error response.
    pub error: Option<String>,
}

/// A [`Record`] shared by the middleware, the handler and a stream's forwarder.
#[derive(Clone)]
pub struct Tracked(pub Arc<Mutex<Record>>);

impl Tracked {
    /// Open a record for a request to `endpoint` that arrived now.
    pub fn open(metrics: Arc<Metrics>, endpoint: String, method: String) -> Tracked {
        Tracked(Arc::new(Mutex::new(Record {
            metrics,
            endpoint,
            method,
            arrived: Instant::now(),
            status: StatusCode::OK,
            id: None,
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
            outcome: None,
            error: None,
        })))
    }

    /// When the request arrived.
    pub fn arrived(&self) -> Instant {
        self.with(|r| r.arrived)
    }

    /// Change the record.
    pub fn with<T>(&self, f: impl FnOnce(&mut Record) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let took = self.arrived.elapsed();
        let status = self.status.as_u16();
        self.metrics.answered(&self.endpoint, status, took);
        let mut line = format!("{} {}", self.method, self.endpoint);
        if let Some(id) = &self.id {
            line += &format!(" id={id}");
        }
        line += &format!(" status={status}");
        if self.id.is_some() {
            line += &format!(
                " prompt_tokens={} cached_tokens={} completion_tokens={}",
                self.prompt_tokens, self.cached_tokens, self.completion_tokens
            );
        }
        if let Some(o) = self.outcome {
            line += &format!(" finish={o}");
        }
        if let Some(e) = &self.error {
            line += &format!(" error={e:?}");
        }
        line += &format!(" latency_ms={:.1}", took.as_secs_f64() * 1e3);
        // Probes and scrapes come every few seconds: their lines only at debug.
        let level = match self.endpoint.as_str() {
            "/health" | "/v1/health" | "/metrics" => log::Level::Debug,
            _ => log::Level::Info,
        };
        log::log!(target: LOG_TARGET, level, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample line `name` (with its labels) in `text`.
    fn sample(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn counts_and_histograms_reach_the_exposition() {
        let m = Arc::new(Metrics::new());
        m.prompt(7);
        m.prompt(5);
        m.set_read_back(100);
        m.set_read_back(164);
        let mut clock = TokenClock::new(Instant::now());
        for _ in 0..3 {
            clock.tick(&m);
        }
        m.set_active(1);
        for status in [StatusCode::OK, StatusCode::OK, StatusCode::BAD_REQUEST] {
            let t = Tracked::open(Arc::clone(&m), "/v1/completions".into(), "POST".into());
            t.with(|r| r.status = status);
        }
        let text = m.render(4);
        let got = |n: &str| sample(&text, n).unwrap_or_else(|| panic!("no {n} in\n{text}"));
        assert_eq!(
            got("cqlm_requests_total{endpoint=\"/v1/completions\",status=\"200\"}"),
            2.0
        );
        assert_eq!(
            got("cqlm_requests_total{endpoint=\"/v1/completions\",status=\"400\"}"),
            1.0
        );
        assert_eq!(got("cqlm_prompt_tokens_total"), 12.0);
        assert_eq!(got("cqlm_generated_tokens_total"), 3.0);
        assert_eq!(got("cqlm_readback_bytes_total"), 164.0);
        assert_eq!(got("cqlm_active_sequences"), 1.0);
        // 4 in flight, 1 of them running.
        assert_eq!(got("cqlm_queue_depth"), 3.0);
        assert_eq!(got("cqlm_time_to_first_token_seconds_count"), 1.0);
        assert_eq!(got("cqlm_inter_token_latency_seconds_count"), 2.0);
        assert_eq!(got("cqlm_request_duration_seconds_count"), 3.0);
        assert!(text.trim_end().ends_with("# EOF"));
    }
}
