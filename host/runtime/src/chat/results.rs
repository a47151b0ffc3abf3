//! What a tool call gives the model: a typed failure serialised once, the text of an MCP
//! result (with notes for parts a chat message cannot carry), and cutting long output at a
//! UTF-8 boundary so JSON stays JSON.

use std::fmt::Write;

use rmcp::model::{ContentBlock, ResourceContents};
use serde_json::{Value, json};

use super::images::Image;
use crate::mcp::{CallToolResult, McpError, McpErrorCode};
use crate::text::cut;

/// What kind of failure a tool call met: the `code` of its error result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ToolErrorCode {
    /// The model named a tool that was not offered.
    UnknownTool,
    /// A guest tool failed, or an MCP tool answered `isError`.
    ExecFailed,
    /// The host could not complete an MCP call (the codes of `mcp_call_tool`).
    Mcp(McpErrorCode),
}

impl ToolErrorCode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::UnknownTool => "unknown_tool",
            Self::ExecFailed => "tool_exec_failed",
            Self::Mcp(code) => code.as_str(),
        }
    }

    /// Whether trying the same call again later may succeed.
    pub(crate) fn retryable(self) -> bool {
        match self {
            Self::UnknownTool | Self::ExecFailed => false,
            Self::Mcp(code) => code.retryable(),
        }
    }
}

impl std::fmt::Display for ToolErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tool call that produced no result. The model sees it, serialised once by
/// [`to_content`](Self::to_content), as `{"error": {"code", "message", "retryable"}}`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub(crate) struct ToolFailure {
    pub(crate) code: ToolErrorCode,
    pub(crate) message: String,
}

impl ToolFailure {
    pub(crate) fn new(code: ToolErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `tool_exec_failed`.
    pub(crate) fn exec(message: impl Into<String>) -> Self {
        Self::new(ToolErrorCode::ExecFailed, message)
    }

    /// The text of the `tool` message.
    pub(crate) fn to_content(&self) -> String {
        json!({"error": {
            "code": self.code.as_str(),
            "message": self.message,
            "retryable": self.code.retryable(),
        }})
        .to_string()
    }
}

impl From<McpError> for ToolFailure {
    fn from(error: McpError) -> Self {
        Self::new(ToolErrorCode::Mcp(error.code), error.message)
    }
}

/// The text of an MCP result for a `tool` message: its text parts, and a short note for
/// each part chat tool messages cannot carry (images, audio, resources). A result the
/// server marked `isError` is a `tool_exec_failed` failure carrying that text. Read from
/// the typed parts: an image's data is measured, never copied.
pub(crate) fn mcp_result_text(result: &CallToolResult) -> Result<String, ToolFailure> {
    // Writing to a `String` cannot fail.
    let mut text = String::new();
    for (i, part) in result.content.iter().enumerate() {
        if i > 0 {
            text.push('\n');
        }
        let size = |data: &str| human_size(data.len() * 3 / 4);
        match part {
            ContentBlock::Text(part) => text.push_str(&part.text),
            ContentBlock::Image(image) => {
                let _ = write!(text, "[image: {}, {}]", image.mime_type, size(&image.data));
            }
            ContentBlock::Audio(audio) => {
                let _ = write!(text, "[audio: {}, {}]", audio.mime_type, size(&audio.data));
            }
            ContentBlock::ResourceLink(link) => {
                let _ = write!(text, "[resource link: {}]", link.uri);
            }
            ContentBlock::Resource(embedded) => match &embedded.resource {
                ResourceContents::TextResourceContents { text: body, .. } => text.push_str(body),
                ResourceContents::BlobResourceContents { uri, .. } => {
                    let _ = write!(text, "[embedded resource: {uri}]");
                }
                other => {
                    let uri = unknown_field(other, "uri");
                    let _ = write!(
                        text,
                        "[embedded resource: {}]",
                        uri.as_deref().unwrap_or("?")
                    );
                }
            },
            other => {
                let kind = unknown_field(other, "type");
                let _ = write!(text, "[{} content]", kind.as_deref().unwrap_or("unknown"));
            }
        }
    }
    if result.content.is_empty()
        && let Some(structured) = &result.structured_content
    {
        text = structured.to_string();
    }
    if result.is_error == Some(true) {
        Err(ToolFailure::exec(text))
    } else {
        Ok(text)
    }
}

/// String field `name` of a kind of part this host does not know yet, read from its JSON.
fn unknown_field(part: &impl serde::Serialize, name: &str) -> Option<String> {
    match serde_json::to_value(part) {
        Ok(Value::Object(mut fields)) => match fields.remove(name) {
            Some(Value::String(value)) => Some(value),
            _ => None,
        },
        _ => None,
    }
}

/// The image parts of an MCP result that a backend taking images may send, each one that
/// passes [`Image::checked`]; any other reaches the model as its text note only.
pub(crate) fn mcp_result_images(result: &CallToolResult) -> Vec<Image> {
    result
        .content
        .iter()
        .filter_map(|part| match part {
            ContentBlock::Image(image) => Image::checked(&image.mime_type, &image.data)
                .inspect_err(|why| tracing::debug!(%why, "MCP image kept as a text note"))
                .ok(),
            _ => None,
        })
        .collect()
}

fn human_size(bytes: usize) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

/// Cuts `text` to at most `max` bytes at a UTF-8 boundary with an explicit marker. JSON
/// stays JSON: it becomes `{"truncated": true, "original_bytes": N, "prefix": "..."}`.
pub(crate) fn truncate_output(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let original = text.len();
    if serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok() {
        let mut budget = max.saturating_sub(64);
        loop {
            let wrapped = json!({"truncated": true, "original_bytes": original, "prefix": cut(&text, budget)}).to_string();
            if wrapped.len() <= max || budget == 0 {
                return wrapped;
            }
            budget = budget.saturating_sub(wrapped.len() - max).min(budget - 1);
        }
    }
    let mut marker = format!(
        "\n[truncated: output was {original} bytes; the limit is max_tool_output_bytes = {max}]"
    );
    if marker.len() >= max {
        marker = "…[truncated]".to_owned();
    }
    if marker.len() > max {
        return cut(&text, max).to_owned();
    }
    let keep = cut(&text, max - marker.len());
    format!("{keep}{marker}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_utf8_and_json() {
        let text = "é".repeat(100); // 200 bytes of 2-byte chars
        let cut = truncate_output(text.clone(), 150);
        assert!(
            cut.len() <= 150 && cut.contains("[truncated: output was 200 bytes"),
            "{cut}"
        );
        assert!(cut.starts_with('é'));
        let json_text = serde_json::to_string(&json!({"items": vec!["ü"; 200]})).unwrap();
        let cut = truncate_output(json_text.clone(), 300);
        assert!(cut.len() <= 300, "{}", cut.len());
        let parsed: Value = serde_json::from_str(&cut).expect("still JSON");
        assert_eq!(parsed["truncated"], true);
        assert_eq!(parsed["original_bytes"], json_text.len());
        assert_eq!(truncate_output("short".into(), 300), "short");
        let tiny = truncate_output("x".repeat(100), 20);
        assert!(tiny.len() <= 20 && tiny.ends_with("[truncated]"), "{tiny}");
        assert_eq!(truncate_output("x".repeat(100), 5), "xxxxx");
    }

    #[test]
    fn only_checked_images_are_kept_for_the_model() {
        use base64::Engine as _;
        use rmcp::model::ContentBlock;
        let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.resize(64, 0);
        let png = encode(&png);
        let mut huge = b"\x89PNG\r\n\x1a\n".to_vec();
        huge.resize(4_500_000, 0);
        let huge = encode(&huge);
        assert_eq!(
            huge.len(),
            6_000_000,
            "decoded 4.3 MiB, but over 5 MB of base64"
        );
        let result = CallToolResult::success(vec![
            ContentBlock::text("pictures"),
            ContentBlock::image(png.clone(), "image/png"),
            ContentBlock::image(huge, "image/png"),
            ContentBlock::image(png.clone(), "image/jpeg"),
            ContentBlock::image(encode(b"<svg/>"), "image/svg+xml"),
        ]);
        let images = mcp_result_images(&result);
        assert_eq!(
            images,
            [Image {
                media_type: "image/png",
                data: png
            }]
        );
        let text = mcp_result_text(&result).unwrap();
        assert_eq!(
            text.matches("[image: ").count(),
            4,
            "every image keeps its note: {text}"
        );
    }

    #[test]
    fn every_kind_of_part_reaches_the_model_as_its_text_or_a_note() {
        use rmcp::model::{ContentBlock, Resource, ResourceContents};
        let result = CallToolResult::success(vec![
            ContentBlock::text("plain"),
            ContentBlock::image("A".repeat(2000), "image/png"),
            ContentBlock::audio("QUJD", "audio/wav"),
            ContentBlock::resource_link(Resource::new("file:///a.txt", "a")),
            ContentBlock::embedded_text("file:///b.txt", "inline body"),
            ContentBlock::resource(ResourceContents::blob("QUJD", "file:///c.bin")),
        ]);
        assert_eq!(
            mcp_result_text(&result).unwrap(),
            "plain\n[image: image/png, 1.5 KiB]\n[audio: audio/wav, 3 B]\n\
             [resource link: file:///a.txt]\ninline body\n[embedded resource: file:///c.bin]"
        );
        let mut structured = CallToolResult::success(vec![]);
        structured.structured_content = Some(json!({"n": 1}));
        assert_eq!(mcp_result_text(&structured).unwrap(), r#"{"n":1}"#);
        let failed = CallToolResult::error(vec![ContentBlock::text("bad input")]);
        assert_eq!(
            mcp_result_text(&failed).unwrap_err().to_string(),
            "tool_exec_failed: bad input"
        );
    }

    #[test]
    fn tool_failures_serialise_as_before() {
        let unknown = ToolFailure::new(ToolErrorCode::UnknownTool, "no tool named `x`");
        assert_eq!(
            unknown.to_content(),
            r#"{"error":{"code":"unknown_tool","message":"no tool named `x`","retryable":false}}"#
        );
        let timeout: ToolFailure = McpError::new(McpErrorCode::Timeout, "slow").into();
        assert_eq!(timeout.code.as_str(), "mcp_timeout");
        assert_eq!(
            serde_json::from_str::<Value>(&timeout.to_content()).unwrap(),
            McpError::new(McpErrorCode::Timeout, "slow").to_json(),
            "the same JSON as mcp_call_tool's error results"
        );
        assert_eq!(
            ToolFailure::exec("boom").to_string(),
            "tool_exec_failed: boom"
        );
    }
}
