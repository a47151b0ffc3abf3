//! Typed views of what the host answers on an MCP session: the tool listing, the content
//! parts of a `CallToolResult`, and the host's error object. Decoding is lenient (see the
//! crate docs); unknown fields are kept in `extra`.

use serde::de::Deserializer;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::lenient::{field, is_empty, list, open_enum, serialize_tagged};

/// The answer to [`Mcp::list_tools`](crate::Mcp::list_tools).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ToolList {
    /// The server's registry id.
    #[serde(deserialize_with = "field")]
    pub server_id: String,
    /// The tools that pass the session's filters, with MCP-native names.
    #[serde(deserialize_with = "list")]
    pub tools: Vec<McpTool>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ToolList {
    /// The tool named `name`, if listed.
    pub fn get(&self, name: &str) -> Option<&McpTool> {
        self.tools.iter().find(|tool| tool.name == name)
    }
}

/// One tool of an MCP server, as the server describes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct McpTool {
    /// The MCP-native name.
    #[serde(deserialize_with = "field")]
    pub name: String,
    /// `title`, a display name.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `description`, for the model.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `inputSchema`: the JSON schema of the arguments (`Null` if the server sent none).
    #[serde(rename = "inputSchema", deserialize_with = "field")]
    pub input_schema: Value,
    /// `outputSchema`, the schema of `structuredContent`.
    #[serde(
        rename = "outputSchema",
        deserialize_with = "field",
        skip_serializing_if = "Option::is_none"
    )]
    pub output_schema: Option<Value>,
    /// `annotations` (hints such as `readOnlyHint`).
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Value>,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

/// One part of a tool result's `content`.
///
/// Decoded by its `type`; a part of another type (or not an object) is
/// [`Content::Other`], as sent. Serializes back to the MCP shape.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Content {
    /// `{"type": "text", "text": ..}`
    Text(TextContent),
    /// `{"type": "image", "data": <base64>, "mimeType": ..}`
    Image(MediaContent),
    /// `{"type": "audio", "data": <base64>, "mimeType": ..}`
    Audio(MediaContent),
    /// `{"type": "resource", "resource": {"uri", "text" | "blob", ..}}`
    Resource(EmbeddedResource),
    /// `{"type": "resource_link", "uri", "name", ..}`
    ResourceLink(ResourceLink),
    /// Any other part, as sent.
    Other(Value),
}

impl Content {
    /// The part's `type`, as sent (`""` if an [`Other`](Content::Other) part has none).
    pub fn kind(&self) -> &str {
        match self {
            Content::Text(_) => "text",
            Content::Image(_) => "image",
            Content::Audio(_) => "audio",
            Content::Resource(_) => "resource",
            Content::ResourceLink(_) => "resource_link",
            Content::Other(json) => json["type"].as_str().unwrap_or(""),
        }
    }

    /// The text of a text part.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Content::Text(text) => Some(&text.text),
            _ => None,
        }
    }

    /// Decodes one part (never fails: see [`Content`]).
    pub fn from_json(json: Value) -> Content {
        fn typed<T: for<'de> Deserialize<'de>>(mut json: Value) -> Result<T, Value> {
            if let Value::Object(map) = &mut json {
                let kind = map.remove("type");
                let decoded = T::deserialize(&json);
                return decoded.map_err(|_| {
                    if let (Value::Object(map), Some(kind)) = (&mut json, kind) {
                        map.insert("type".into(), kind);
                    }
                    json
                });
            }
            Err(json)
        }
        let kind = json["type"].as_str().unwrap_or("").to_owned();
        let decoded = match kind.as_str() {
            "text" => typed(json).map(Content::Text),
            "image" => typed(json).map(Content::Image),
            "audio" => typed(json).map(Content::Audio),
            "resource" => typed(json).map(Content::Resource),
            "resource_link" => typed(json).map(Content::ResourceLink),
            _ => Err(json),
        };
        decoded.unwrap_or_else(Content::Other)
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Content, D::Error> {
        Value::deserialize(d).map(Content::from_json)
    }
}

impl Serialize for Content {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Content::Text(part) => serialize_tagged(s, ("type", "text"), part),
            Content::Image(part) => serialize_tagged(s, ("type", "image"), part),
            Content::Audio(part) => serialize_tagged(s, ("type", "audio"), part),
            Content::Resource(part) => serialize_tagged(s, ("type", "resource"), part),
            Content::ResourceLink(part) => serialize_tagged(s, ("type", "resource_link"), part),
            Content::Other(json) => json.serialize(s),
        }
    }
}

/// A text part.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct TextContent {
    /// The text (`""` if missing).
    #[serde(deserialize_with = "field")]
    pub text: String,
    /// Every other field, as sent (`annotations`, `_meta`, ..).
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

/// An image or audio part.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct MediaContent {
    /// The bytes, base64-encoded, as sent.
    #[serde(deserialize_with = "field")]
    pub data: String,
    /// `mimeType`, e.g. `image/png`.
    #[serde(rename = "mimeType", deserialize_with = "field")]
    pub mime_type: String,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

/// A resource embedded in a result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct EmbeddedResource {
    /// The resource's contents.
    #[serde(deserialize_with = "field")]
    pub resource: ResourceContents,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

/// The contents of an embedded resource: text or a base64 blob.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ResourceContents {
    /// `uri`.
    #[serde(deserialize_with = "field")]
    pub uri: String,
    /// `mimeType`.
    #[serde(
        rename = "mimeType",
        deserialize_with = "field",
        skip_serializing_if = "Option::is_none"
    )]
    pub mime_type: Option<String>,
    /// `text`, for a text resource.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// `blob` (base64), for a binary resource.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub blob: Option<String>,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

/// A link to a resource the client may read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ResourceLink {
    /// `uri`.
    #[serde(deserialize_with = "field")]
    pub uri: String,
    /// `name`.
    #[serde(deserialize_with = "field")]
    pub name: String,
    /// `title`.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `description`.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `mimeType`.
    #[serde(
        rename = "mimeType",
        deserialize_with = "field",
        skip_serializing_if = "Option::is_none"
    )]
    pub mime_type: Option<String>,
    /// `size` in bytes.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

/// The host's error object: the host could not complete a tool call (`{"error": {"code",
/// "message", "retryable"}}`). The same shape is what the model sees for a failed tool
/// call in a chat.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct HostError {
    /// `code`.
    #[serde(deserialize_with = "field")]
    pub code: HostErrorCode,
    /// `message`, for people.
    #[serde(deserialize_with = "field")]
    pub message: String,
    /// Whether the same call may succeed later (`false` if the host did not say).
    #[serde(deserialize_with = "field")]
    pub retryable: bool,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for HostError {}

open_enum! {
    /// The `code` of a [`HostError`] (`docs/abi.md`, `mcp_call_tool`).
    pub enum HostErrorCode {
        /// The server could not be started, or died during the call (retryable).
        Unavailable = "mcp_unavailable",
        /// No answer within the server's `tool_timeout_ms` (retryable).
        Timeout = "mcp_timeout",
        /// The arguments are not an object, or the server rejected them or the name.
        InvalidArguments = "mcp_invalid_arguments",
        /// The server's approval policy needs an approval this host cannot give.
        PolicyDenied = "mcp_policy_denied",
        /// The result is larger than the server's `max_tool_output_bytes`.
        OutputTooLarge = "mcp_output_too_large",
        /// The server answered with another protocol error; in a chat, a guest tool failed.
        ToolExecFailed = "tool_exec_failed",
        /// In a chat: the model named a tool that does not exist.
        UnknownTool = "unknown_tool",
    }
}

/// The `CallToolResult` fields the SDK reads.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(crate) struct CallToolResult {
    #[serde(deserialize_with = "list")]
    pub(crate) content: Vec<Content>,
    #[serde(rename = "isError", deserialize_with = "field")]
    pub(crate) is_error: bool,
}
