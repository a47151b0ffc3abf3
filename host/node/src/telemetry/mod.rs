//! OpenTelemetry trace export for `quiver run` and `quiver serve` (docs/telemetry.md).
//!
//! The library emits `tracing` spans only; this module turns them into OTLP traces: a
//! `tracing-opentelemetry` layer over the SDK's tracer, a bounded queue that drops (and
//! counts) spans rather than ever making a task wait, one background task exporting
//! batches over OTLP (HTTP/protobuf or gRPC), and the [`Propagator`](quiver::telemetry::Propagator)
//! that lets the host continue a caller's trace and send `traceparent` on.
//!
//! Configured the way OpenTelemetry users expect (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`, `OTEL_SDK_DISABLED`) and by
//! `[telemetry]` in `quiver.toml` ([`TelemetryConfig`]), which wins where it says
//! something. Off when neither names an endpoint.

mod config;
mod export;
mod propagate;

pub use config::{Protocol, SamplerKind, Sampling, TelemetryConfig, TelemetrySettings};
pub use export::{Telemetry, TelemetryError, metrics_text};
