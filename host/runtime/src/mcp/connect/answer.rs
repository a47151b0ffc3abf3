//! A server's answer to a pending `tools/call`, read as the type that request asked for.
//!
//! rmcp reads any message as an untagged union: the whole line is buffered into serde's
//! `Content`, buffered again for each flattened part, and the result is then tried against
//! every `ServerResult` variant in turn (`CallToolResult` is the 16th). The guard knows
//! what each pending id asked for, so an answer to a call is read here in one pass: a
//! borrowed envelope, then `CallToolResult` from the raw `result`. Anything else (an
//! error, a request or notification, an id that is not a pending call, a `resultType`
//! other than `complete`, a stray key of the JSON-RPC shape, a result that does not parse)
//! returns `None` and takes rmcp's generic path, so its shape checks and the input-required
//! and task answers stay as they are. Caps are not this module's: the line was read within
//! them before it gets here, and so is serde_json's reserved key (`crate::json`).

use rmcp::model::{
    CallToolResult, JsonRpcMessage, JsonRpcResponse, JsonRpcVersion2_0, RequestId,
    ServerJsonRpcMessage, ServerResult,
};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

/// The top level of a message, with `result` left unparsed.
#[derive(Deserialize)]
struct Envelope<'a> {
    /// Parsed to refuse another version.
    #[serde(rename = "jsonrpc")]
    _jsonrpc: JsonRpcVersion2_0,
    id: Option<RequestId>,
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    /// Present at all (even `null`): not a plain answer.
    #[serde(default)]
    error: Present,
    #[serde(default)]
    method: Present,
}

/// Whether a key was there, whatever its value.
#[derive(Default)]
struct Present(bool);

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(deserializer).map(|_| Present(true))
    }
}

/// `line` as the answer to a pending `tools/call`, if it plainly is one (see the module
/// docs); `is_call` says whether an id is a call still pending.
pub(super) fn call_answer(
    line: &[u8],
    is_call: impl FnOnce(&RequestId) -> bool,
) -> Option<ServerJsonRpcMessage> {
    let envelope: Envelope = serde_json::from_slice(line).ok()?;
    if envelope.error.0 || envelope.method.0 {
        return None;
    }
    let (id, result) = (envelope.id?, envelope.result?);
    if !is_call(&id) {
        return None;
    }
    let result: CallToolResult = serde_json::from_str(result.get()).ok()?;
    Some(JsonRpcMessage::Response(JsonRpcResponse {
        jsonrpc: JsonRpcVersion2_0,
        id,
        result: ServerResult::CallToolResult(result),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(line: &str) -> Option<ServerJsonRpcMessage> {
        call_answer(line.as_bytes(), |id| {
            matches!(id, RequestId::Number(7)) || matches!(id, RequestId::String(s) if &**s == "7")
        })
    }

    /// What rmcp's generic parse makes of `line`.
    fn generic(line: &str) -> Option<ServerJsonRpcMessage> {
        serde_json::from_str(line).ok()
    }

    #[test]
    fn a_plain_call_answer_reads_as_rmcp_reads_it() {
        for line in [
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hi"}]}}"#,
            r#"{"result":{"content":[],"isError":true,"_meta":{"k":1},"extra":2},"id":"7","jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete","structuredContent":null}}"#,
        ] {
            let fast = typed(line).unwrap_or_else(|| panic!("typed: {line}"));
            let generic = generic(line).expect("rmcp reads it too");
            assert!(
                matches!(generic, JsonRpcMessage::Response(ref r) if matches!(r.result, ServerResult::CallToolResult(_))),
                "{line}"
            );
            let json = |m: &ServerJsonRpcMessage| serde_json::to_value(m).unwrap();
            assert_eq!(json(&fast), json(&generic), "{line}");
        }
    }

    #[test]
    fn everything_else_takes_the_generic_path() {
        for line in [
            // Both result and error: rmcp's shape check refuses it (#1283).
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":[]},"error":{"code":1,"message":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":[]},"error":null}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":[]},"method":"x"}"#,
            // Not complete: an input-required round or a task.
            r#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"input_required","inputRequests":{}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"task","task":{}}}"#,
            // Not a pending call, no id, another version, no known field, a duplicate key.
            r#"{"jsonrpc":"2.0","id":8,"result":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","result":{"content":[]}}"#,
            r#"{"jsonrpc":"1.0","id":7,"result":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"tools":[]}}"#,
            r#"{"jsonrpc":"2.0","id":7,"id":7,"result":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":null}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":7}}"#,
            "not json",
        ] {
            assert!(typed(line).is_none(), "{line}");
        }
    }
}
