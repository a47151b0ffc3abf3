//! The exporter: spans go from the `tracing` layer into a bounded queue (full: the span is
//! dropped and counted, the task never waits), one background task sends them in batches
//! over OTLP, and [`Telemetry::shutdown`] sends what is left within a bound.
//!
//! Every text attribute, event and span name is cut to
//! [`defaults::TELEMETRY_MAX_ATTRIBUTE_BYTES`] and loses every secret resolved in this
//! process ([`quiver::registry::redact_known`]), as log lines do.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use quiver::registry::redact_known;
use quiver::telemetry::ExtraLayer;
use tokio::sync::{mpsc, oneshot};
use tracing_subscriber::Layer;

use super::config::{Protocol, SamplerKind, Sampling, TelemetrySettings};
use super::propagate::OtelPropagator;
use crate::defaults;

/// The exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("telemetry: cannot build the OTLP exporter for {endpoint}: {message}")]
pub struct TelemetryError {
    endpoint: String,
    message: String,
}

/// Counts since the process started (one exporter per process), for `/metrics`.
static DROPPED: AtomicU64 = AtomicU64::new(0);
static EXPORTED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

/// The exporter's counters as OpenMetrics text (no `# EOF`), for a node's `/metrics`.
pub fn metrics_text() -> String {
    let mut text = String::new();
    for (name, help, value) in [
        (
            "quiver_telemetry_spans_dropped",
            "Spans dropped because the export queue was full (telemetry.max_queue_size)",
            &DROPPED,
        ),
        (
            "quiver_telemetry_spans_exported",
            "Spans the collector accepted",
            &EXPORTED,
        ),
        (
            "quiver_telemetry_export_failures",
            "Export requests that failed (their spans are lost)",
            &FAILED,
        ),
    ] {
        text.push_str(&format!(
            "# HELP {name} {help}.\n# TYPE {name} counter\n{name}_total {}\n",
            value.load(Ordering::Relaxed)
        ));
    }
    text
}

/// A running exporter. Keep it for the life of the process and call
/// [`Telemetry::shutdown`] before exiting, so the last spans are sent.
pub struct Telemetry {
    provider: SdkTracerProvider,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
}

impl Telemetry {
    /// Starts the exporter on the current tokio runtime and installs the process's trace
    /// propagator; the layer goes to [`quiver::telemetry::init_with`].
    pub fn start(settings: &TelemetrySettings) -> Result<(Self, ExtraLayer), TelemetryError> {
        let fail = |message: String| TelemetryError {
            endpoint: settings.endpoint.clone(),
            message,
        };
        let mut exporter = match settings.protocol {
            Protocol::HttpProtobuf => {
                quiver::ensure_tls_provider();
                let client = reqwest::Client::builder()
                    .no_proxy()
                    .redirect(reqwest::redirect::Policy::none())
                    .connect_timeout(settings.export_timeout)
                    .build()
                    .map_err(|e| fail(e.to_string()))?;
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_endpoint(&settings.endpoint)
                    .with_headers(settings.headers.clone())
                    .with_timeout(settings.export_timeout)
                    .build()
            }
            Protocol::Grpc => {
                let mut metadata = tonic::metadata::MetadataMap::new();
                for (key, value) in &settings.headers {
                    let key = tonic::metadata::MetadataKey::from_bytes(key.as_bytes())
                        .map_err(|_| fail("a header name is not valid gRPC metadata".into()))?;
                    let value = value
                        .parse()
                        .map_err(|_| fail("a header value is not valid gRPC metadata".into()))?;
                    metadata.insert(key, value);
                }
                opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(&settings.endpoint)
                    .with_metadata(metadata)
                    .with_timeout(settings.export_timeout)
                    .build()
            }
        }
        .map_err(|e| fail(e.to_string()))?;
        let resource = Resource::builder()
            .with_service_name(settings.service_name.clone())
            .build();
        exporter.set_resource(&resource);
        let (queue, spans) = mpsc::channel(settings.max_queue_size);
        let (stop, stopped) = oneshot::channel();
        let done = tokio::spawn(export_loop(exporter, spans, stopped));
        let provider = provider(QueueProcessor { queue }, settings.sampling, resource);
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("quiver"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(tracing_subscriber::filter::filter_fn(exported))
            .boxed();
        quiver::telemetry::set_propagator(OtelPropagator);
        Ok((
            Self {
                provider,
                stop: Some(stop),
                done,
            },
            layer,
        ))
    }

    /// Sends the spans still queued, waiting at most `within` (an unreachable collector
    /// does not hold the exit longer).
    pub async fn shutdown(mut self, within: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(within, &mut self.done).await;
        self.done.abort();
        let _ = self.provider.shutdown();
    }
}

fn provider(queue: QueueProcessor, sampling: Sampling, resource: Resource) -> SdkTracerProvider {
    let ratio = Sampler::TraceIdRatioBased(sampling.ratio);
    let sampler = match sampling.kind {
        SamplerKind::AlwaysOn => Sampler::AlwaysOn,
        SamplerKind::AlwaysOff => Sampler::AlwaysOff,
        SamplerKind::Traceidratio => ratio,
        SamplerKind::ParentbasedAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        SamplerKind::ParentbasedAlwaysOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        SamplerKind::ParentbasedTraceidratio => Sampler::ParentBased(Box::new(ratio)),
    };
    SdkTracerProvider::builder()
        .with_span_processor(queue)
        .with_sampler(sampler)
        .with_resource(resource)
        .build()
}

/// The host's own spans and events at info and above; not the per-server connection spans,
/// which live as long as a server and belong to no task, nor a guest's log lines.
fn exported(meta: &tracing::Metadata<'_>) -> bool {
    let target = meta.target();
    (target == "quiver" || target.starts_with("quiver::") || target.starts_with("quiver_node"))
        && !target.starts_with("quiver::guest")
        && *meta.level() <= tracing::Level::INFO
        && !(meta.is_span() && matches!(meta.name(), "mcp_server" | "mcp_server_stderr"))
}

/// The fields of a log event that may go to a collector: names, ids and codes. Free text
/// (`error`, `detail`, `message` of a server or model, a resource URI) may echo argument
/// values, so an event keeps only these.
const EVENT_FIELDS: &[&str] = &[
    "task_id",
    "action",
    "via",
    "server_id",
    "tool",
    "reason",
    "code",
    "error.type",
    "status",
    "principal",
    "backend",
    "model",
    "level",
    "target",
];

/// Queues each ended span, cleaned; a full queue drops it (counted).
#[derive(Debug)]
struct QueueProcessor {
    queue: mpsc::Sender<SpanData>,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, mut span: SpanData) {
        clean(&mut span);
        if self.queue.try_send(span).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Sends batches of at most [`defaults::TELEMETRY_MAX_BATCH`] spans, each once it is full
/// or [`defaults::TELEMETRY_BATCH_DELAY`] after its first span; on `stop`, what is queued.
async fn export_loop(
    exporter: opentelemetry_otlp::SpanExporter,
    mut spans: mpsc::Receiver<SpanData>,
    mut stop: oneshot::Receiver<()>,
) {
    let exporter = Arc::new(exporter);
    loop {
        let first = tokio::select! {
            span = spans.recv() => span,
            _ = &mut stop => break,
        };
        let Some(first) = first else { break };
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + defaults::TELEMETRY_BATCH_DELAY;
        while batch.len() < defaults::TELEMETRY_MAX_BATCH {
            match tokio::time::timeout_at(until, spans.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        send(&exporter, batch).await;
    }
    let mut rest = Vec::new();
    while let Ok(span) = spans.try_recv() {
        rest.push(span);
        if rest.len() == defaults::TELEMETRY_MAX_BATCH {
            send(&exporter, std::mem::take(&mut rest)).await;
        }
    }
    if !rest.is_empty() {
        send(&exporter, rest).await;
    }
}

async fn send(exporter: &opentelemetry_otlp::SpanExporter, batch: Vec<SpanData>) {
    let count = batch.len() as u64;
    match exporter.export(batch).await {
        Ok(()) => EXPORTED.fetch_add(count, Ordering::Relaxed),
        // Not logged per failure: a collector that is down would flood the log; the
        // counter says it, and the error text could name the endpoint's query.
        Err(_) => FAILED.fetch_add(1, Ordering::Relaxed),
    };
}

/// Cuts and redacts every text of `span`, and turns the JSON string arrays `tracing`
/// cannot carry (`gen_ai.response.finish_reasons`) into real arrays.
fn clean(span: &mut SpanData) {
    span.name = Cow::Owned(clean_text(&span.name));
    for attribute in &mut span.attributes {
        clean_attribute(attribute);
    }
    for event in &mut span.events.events {
        event.name = Cow::Owned(clean_text(&event.name));
        event
            .attributes
            .retain(|a| EVENT_FIELDS.contains(&a.key.as_str()));
        for attribute in &mut event.attributes {
            clean_attribute(attribute);
        }
    }
}

fn clean_attribute(attribute: &mut KeyValue) {
    let Value::String(text) = &attribute.value else {
        return;
    };
    if attribute.key.as_str() == "gen_ai.response.finish_reasons"
        && let Ok(list) = serde_json::from_str::<Vec<String>>(text.as_str())
    {
        let list = list
            .iter()
            .map(|r| StringValue::from(clean_text(r)))
            .collect();
        attribute.value = Value::Array(Array::String(list));
        return;
    }
    attribute.value = Value::String(clean_text(text.as_str()).into());
}

fn clean_text(text: &str) -> String {
    let redacted = redact_known(text);
    quiver::text::cut(&redacted, defaults::TELEMETRY_MAX_ATTRIBUTE_BYTES).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_redacted_cut_and_reasons_become_an_array() {
        let _secrets = quiver::registry::Secrets::new(["otel-secret-77f1"]);
        let mut reasons =
            KeyValue::new("gen_ai.response.finish_reasons", r#"["tool_calls","stop"]"#);
        clean_attribute(&mut reasons);
        assert_eq!(
            reasons.value,
            Value::Array(Array::String(vec!["tool_calls".into(), "stop".into()]))
        );
        let mut detail = KeyValue::new("detail", "token otel-secret-77f1 refused");
        clean_attribute(&mut detail);
        assert_eq!(detail.value.as_str(), "token [redacted] refused");
        let mut long = KeyValue::new("x", "y".repeat(100_000));
        clean_attribute(&mut long);
        assert!(long.value.as_str().len() <= defaults::TELEMETRY_MAX_ATTRIBUTE_BYTES);
    }

    #[test]
    fn a_full_queue_drops_and_counts_never_waits() {
        use opentelemetry::InstrumentationScope;
        use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
        use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
        let span = || SpanData {
            span_context: SpanContext::empty_context(),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "task".into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::default(),
        };
        // Nothing reads the queue, as when the collector hangs.
        let (queue, _spans) = mpsc::channel(2);
        let processor = QueueProcessor { queue };
        let before = DROPPED.load(Ordering::Relaxed);
        let started = std::time::Instant::now();
        for _ in 0..5 {
            processor.on_end(span());
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(DROPPED.load(Ordering::Relaxed) - before, 3);
        assert!(metrics_text().contains("quiver_telemetry_spans_dropped_total "));
    }

    /// Spans each sampler records: a root, and a child of a caller's sampled and
    /// unsampled remote span.
    #[test]
    fn the_sampler_decides_what_is_queued() {
        use opentelemetry::trace::{
            Span as _, SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
            Tracer,
        };
        let recorded = |kind, ratio| {
            let (queue, mut spans) = mpsc::channel(16);
            let sampling = Sampling { kind, ratio };
            let provider = provider(
                QueueProcessor { queue },
                sampling,
                Resource::builder().build(),
            );
            let tracer = provider.tracer("test");
            let caller = |flags| {
                Context::new().with_remote_span_context(SpanContext::new(
                    TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
                    SpanId::from_hex("00f067aa0ba902b7").unwrap(),
                    flags,
                    true,
                    TraceState::default(),
                ))
            };
            let mut names = Vec::new();
            for (name, parent) in [
                ("root", Context::new()),
                ("sampled", caller(TraceFlags::SAMPLED)),
                ("unsampled", caller(TraceFlags::default())),
            ] {
                tracer.start_with_context(name, &parent).end();
                if let Ok(span) = spans.try_recv() {
                    names.push(span.name.into_owned());
                }
            }
            names
        };
        use SamplerKind::*;
        assert_eq!(recorded(ParentbasedAlwaysOn, 1.0), ["root", "sampled"]);
        assert_eq!(recorded(AlwaysOn, 1.0), ["root", "sampled", "unsampled"]);
        assert_eq!(recorded(AlwaysOff, 1.0), Vec::<String>::new());
        assert_eq!(recorded(ParentbasedAlwaysOff, 1.0), ["sampled"]);
        assert_eq!(recorded(Traceidratio, 0.0), Vec::<String>::new());
        assert_eq!(recorded(ParentbasedTraceidratio, 0.0), ["sampled"]);
        assert_eq!(recorded(ParentbasedTraceidratio, 1.0), ["root", "sampled"]);
    }
}
