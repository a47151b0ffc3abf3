//! The spans of the chat loop (OpenTelemetry GenAI conventions): one `chat {model}`
//! client span per model request, one `execute_tool {name}` span per guest tool call.
//! They hold names, models, token counts and finish reasons, never prompts, messages,
//! arguments or results; every text the backend controls is cut to
//! [`defaults::MAX_SPAN_ATTRIBUTE_BYTES`].

use tracing::field::Empty;

use super::llm::{Backend, LlmError};
use super::wire::ChatCompletion;
use crate::defaults;
use crate::text::cut;

/// The span of one request of `model` to `backend`.
pub(super) fn model_request(backend: &Backend, model: &str) -> tracing::Span {
    let model = cut(model, defaults::MAX_SPAN_ATTRIBUTE_BYTES);
    tracing::info_span!(
        "llm_request",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = backend.provider(),
        gen_ai.request.model = model,
        gen_ai.response.model = Empty,
        gen_ai.response.id = Empty,
        gen_ai.response.finish_reasons = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        quiver.backend = backend.name(),
        error.type = Empty,
    )
}

/// What the backend answered: its model, id, finish reasons and token usage.
pub(super) fn record_reply(span: &tracing::Span, reply: &ChatCompletion) {
    // Nothing listens: skip cutting texts and encoding the finish reasons.
    if span.is_disabled() {
        return;
    }
    if let Some(model) = reply.model() {
        span.record(
            "gen_ai.response.model",
            cut(model, defaults::MAX_SPAN_ATTRIBUTE_BYTES),
        );
    }
    if let Some(id) = reply.id() {
        span.record(
            "gen_ai.response.id",
            cut(id, defaults::MAX_SPAN_ATTRIBUTE_BYTES),
        );
    }
    // A string array in the conventions; `tracing` has none, so the exporter turns this
    // JSON array back into one.
    let reasons: Vec<&str> = reply
        .choices
        .iter()
        .take(defaults::MAX_SPAN_FINISH_REASONS)
        .filter_map(|c| c.finish_reason.as_ref().and_then(Option::as_deref))
        .map(|r| cut(r, 64))
        .collect();
    if !reasons.is_empty() {
        let reasons = serde_json::to_string(&reasons).unwrap_or_default();
        span.record("gen_ai.response.finish_reasons", reasons);
    }
    if let Some(usage) = reply.usage() {
        if let Some(n) = usage.prompt_tokens {
            span.record("gen_ai.usage.input_tokens", n);
        }
        if let Some(n) = usage.completion_tokens {
            span.record("gen_ai.usage.output_tokens", n);
        }
    }
}

/// A request that failed: its error code (`llm_timeout`, ...) is the `error.type`.
pub(super) fn record_error(span: &tracing::Span, error: &LlmError) {
    span.record("otel.status_code", "error");
    span.record("error.type", error.code());
}

/// The span of one call of the guest tool `name` the model asked for.
pub(super) fn guest_tool(name: &str, call_id: &str) -> tracing::Span {
    let name = cut(name, defaults::MAX_TOOL_NAME_BYTES);
    tracing::info_span!(
        "guest_tool",
        otel.name = %format_args!("execute_tool {name}"),
        otel.status_code = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = name,
        gen_ai.tool.type = "function",
        gen_ai.tool.call.id = cut(call_id, defaults::MAX_SPAN_ATTRIBUTE_BYTES),
        error.type = Empty,
    )
}

/// A guest tool that answered with a failure.
pub(super) fn record_tool_error(span: &tracing::Span) {
    span.record("otel.status_code", "error");
    span.record("error.type", "tool_error");
}
