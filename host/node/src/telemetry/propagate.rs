//! The host's [`Propagator`]: W3C context in and out of `tracing` spans through the
//! `tracing-opentelemetry` layer.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use quiver::TraceContext;
use quiver::telemetry::Propagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub(super) struct OtelPropagator;

impl Propagator for OtelPropagator {
    fn context_of(&self, span: &tracing::Span) -> Option<TraceContext> {
        let context = span.context();
        let span = context.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return None;
        }
        let traceparent = format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        );
        let state = sc.trace_state().header();
        TraceContext::parse(&traceparent, Some(state.as_str()).filter(|s| !s.is_empty())).ok()
    }

    fn set_parent(&self, span: &tracing::Span, parent: &TraceContext) {
        let (Ok(trace_id), Ok(span_id)) = (
            TraceId::from_hex(parent.trace_id()),
            SpanId::from_hex(parent.span_id()),
        ) else {
            return;
        };
        let flags = if parent.sampled() {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let state = parent
            .tracestate()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let remote = SpanContext::new(trace_id, span_id, flags, true, state);
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
}
