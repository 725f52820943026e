//! Prometheus-style metrics (`GET /metrics`, the text exposition format).

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: String,
    pub status: u16,
}

/// Everything the server counts.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub prompt_tokens: Counter,
    pub generation_tokens: Counter,
    /// Requests waiting for a slot.
    pub queue_depth: Gauge,
    /// Sequences in the running decode batch.
    pub batch_size: Gauge,
    /// Decode slots the engine holds (`--max-batch`, or what `--slot-memory` fits).
    pub slots: Gauge,
    /// Device bytes the slots take.
    pub slot_bytes: Gauge,
    pub decode_steps: Counter,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub request_latency: Histogram,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nemotron");
        let requests = Family::<RequestLabels, Counter>::default();
        let prompt_tokens = Counter::default();
        let generation_tokens = Counter::default();
        let queue_depth = Gauge::default();
        let batch_size = Gauge::default();
        let slots = Gauge::default();
        let slot_bytes = Gauge::default();
        let decode_steps = Counter::default();
        // 100 µs … ≈ 1,700 s.
        let time_to_first_token = Histogram::new(exponential_buckets(1e-4, 2.0, 24));
        let inter_token_latency = Histogram::new(exponential_buckets(1e-4, 2.0, 20));
        let request_latency = Histogram::new(exponential_buckets(1e-3, 2.0, 22));
        registry.register(
            "requests",
            "HTTP requests by endpoint and status",
            requests.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens of admitted requests",
            prompt_tokens.clone(),
        );
        registry.register(
            "generation_tokens",
            "Tokens generated",
            generation_tokens.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for a decode slot",
            queue_depth.clone(),
        );
        registry.register(
            "batch_size",
            "Sequences in the running decode batch",
            batch_size.clone(),
        );
        registry.register("slots", "Decode slots the engine holds", slots.clone());
        registry.register(
            "slot_memory_bytes",
            "Device bytes the decode slots take",
            slot_bytes.clone(),
        );
        registry.register("decode_steps", "Engine steps run", decode_steps.clone());
        registry.register(
            "time_to_first_token_seconds",
            "From a request's arrival to its first token",
            time_to_first_token.clone(),
        );
        registry.register(
            "inter_token_latency_seconds",
            "Between consecutive tokens of one sequence",
            inter_token_latency.clone(),
        );
        registry.register(
            "request_latency_seconds",
            "From a request's arrival to its last token",
            request_latency.clone(),
        );
        Metrics {
            registry,
            requests,
            prompt_tokens,
            generation_tokens,
            queue_depth,
            batch_size,
            slots,
            slot_bytes,
            decode_steps,
            time_to_first_token,
            inter_token_latency,
            request_latency,
        }
    }

    pub fn count_request(&self, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.into(),
                status,
            })
            .inc();
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        if let Err(e) = encode(&mut s, &self.registry) {
            s = format!("# metrics could not be encoded: {e}\n");
        }
        s
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
