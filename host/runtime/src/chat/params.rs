//! Session params: the keys the host consumes, their types, and the narrowing rule for the
//! session's MCP settings.

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use super::session::SessionContent;
use crate::defaults;
use crate::json::{Key, misplaced_string};
use crate::policy::{ListKey, Narrowing, Pattern, TaskMcpPolicy};
use crate::sandbox::heap;
use crate::text::cut;

/// SET_PARAM's argument, `{"key": "...", "value": ...}`: other fields are skipped, a
/// repeated one's last value is read, an absent `value` is `null`. Anything but an object
/// is refused, a string without being quoted in the error (see [`misplaced_string`]).
pub(crate) struct ParamArg {
    pub(crate) key: String,
    pub(crate) value: Value,
}

impl<'de> Deserialize<'de> for ParamArg {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ArgVisitor;
        impl<'de> Visitor<'de> for ArgVisitor {
            type Value = ParamArg;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#"{"key": "...", "value": ...}"#)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ParamArg, A::Error> {
                let (mut key, mut value) = (None, Value::Null);
                while let Some(Key(name)) = map.next_key()? {
                    match &*name {
                        "key" => key = Some(map.next_value()?),
                        "value" => value = map.next_value()?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let key = key.ok_or_else(|| de::Error::missing_field("key"))?;
                Ok(ParamArg { key, value })
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<ParamArg, E> {
                Err(misplaced_string(&self))
            }
        }
        deserializer.deserialize_any(ArgVisitor)
    }
}

/// Host-consumed settings of a session.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) model: Option<String>,
    pub(crate) backend: Option<String>,
    pub(crate) timeout_ms: Option<u64>,
    pub(crate) tool_arena_ptr: Option<u32>,
    pub(crate) tool_arena_len: Option<u32>,
    pub(crate) max_iterations: u32,
    pub(crate) max_total_tool_calls: u32,
    pub(crate) max_tool_output_bytes: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            model: None,
            backend: None,
            timeout_ms: None,
            tool_arena_ptr: None,
            tool_arena_len: None,
            max_iterations: defaults::CHAT_MAX_ITERATIONS,
            max_total_tool_calls: defaults::CHAT_MAX_TOTAL_TOOL_CALLS,
            max_tool_output_bytes: defaults::CHAT_MAX_TOOL_OUTPUT_BYTES,
        }
    }
}

/// The session layer of MCP policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SessionMcp {
    pub(crate) enabled: bool,
    pub(crate) server_ids: Vec<String>,
    /// `mcp.tool_allowlist` / `mcp.tool_denylist`; a chat offers no resources or prompts,
    /// so their lists stay empty.
    pub(crate) narrowing: Narrowing,
    /// `mcp.decision_log`: copy the decision log into `_spear.mcp` (off: it can be large,
    /// and guests printing a response through a small buffer would lose the answer).
    pub(crate) decision_log: bool,
}

impl SessionMcp {
    pub(crate) fn from_task(task: &TaskMcpPolicy) -> Self {
        Self {
            enabled: task.enabled,
            server_ids: task.default_server_ids.clone(),
            narrowing: Narrowing::default(),
            decision_log: false,
        }
    }
}

/// Why a SET_PARAM was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParamError {
    /// Wrong value type or value (`-EINVAL`), with the reason for the log.
    #[error("invalid param: {0}")]
    Invalid(String),
    /// Wider than the task allows, or a host-owned key (`-EACCES`).
    #[error("param denied: {0}")]
    Denied(String),
}

/// At most this much of a guest's key or value goes into a message (they may be megabytes).
const SHOWN: usize = 80;

/// The start of `text`, for a message.
pub(crate) fn shown(text: &str) -> String {
    if text.len() <= SHOWN {
        return text.to_owned();
    }
    format!("{}… ({} bytes)", cut(text, SHOWN), text.len())
}

/// The start of `value` as JSON, for a message, without serialising all of it.
fn shown_json(value: &Value) -> String {
    struct Prefix(Vec<u8>);
    impl std::io::Write for Prefix {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let room = (SHOWN + 4).saturating_sub(self.0.len());
            self.0.extend_from_slice(&bytes[..bytes.len().min(room)]);
            if bytes.len() > room {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut prefix = Prefix(Vec::new());
    let whole = serde_json::to_writer(&mut prefix, value).is_ok();
    let text = String::from_utf8_lossy(&prefix.0);
    if whole {
        text.into_owned()
    } else {
        shown(&format!("{text}…"))
    }
}

fn positive(key: &str, value: &Value) -> Result<u32, ParamError> {
    value
        .as_u64()
        .filter(|&v| v > 0 && v <= u32::MAX as u64)
        .map(|v| v as u32)
        .ok_or_else(|| {
            ParamError::Invalid(format!(
                "{key} must be a positive integer, got {}",
                shown_json(value)
            ))
        })
}

fn non_negative(key: &str, value: &Value) -> Result<u32, ParamError> {
    value
        .as_u64()
        .filter(|&v| v <= u32::MAX as u64)
        .map(|v| v as u32)
        .ok_or_else(|| {
            ParamError::Invalid(format!(
                "{key} must be a non-negative integer, got {}",
                shown_json(value)
            ))
        })
}

fn string(key: &str, value: &Value) -> Result<String, ParamError> {
    value.as_str().map(str::to_owned).ok_or_else(|| {
        ParamError::Invalid(format!("{key} must be a string, got {}", shown_json(value)))
    })
}

fn strings(key: &str, value: &Value) -> Result<Vec<String>, ParamError> {
    let items = value.as_array().ok_or_else(|| {
        ParamError::Invalid(format!(
            "{key} must be an array of strings, got {}",
            shown_json(value)
        ))
    })?;
    items
        .iter()
        .map(|item| {
            item.as_str().map(str::to_owned).ok_or_else(|| {
                ParamError::Invalid(format!(
                    "{key} must be an array of strings, found {}",
                    shown_json(item)
                ))
            })
        })
        .collect()
}

fn patterns(key: ListKey, value: &Value) -> Result<Vec<Pattern>, ParamError> {
    Pattern::session_list(key, value).map_err(ParamError::Invalid)
}

/// Where a param's value is kept, for what it costs.
enum Slot {
    Model,
    Backend,
    ServerIds,
    Allowlist,
    Denylist,
    Upstream,
    /// Kept in a fixed-size field, or not kept at all.
    Inline,
}

fn slot(key: &str) -> Slot {
    match key {
        "model" => Slot::Model,
        "backend" => Slot::Backend,
        "mcp.server_ids" => Slot::ServerIds,
        "mcp.tool_allowlist" => Slot::Allowlist,
        "mcp.tool_denylist" => Slot::Denylist,
        "timeout_ms"
        | "tool_arena_ptr"
        | "tool_arena_len"
        | "max_iterations"
        | "max_total_tool_calls"
        | "max_tool_calls"
        | "max_tool_output_bytes"
        | "mcp.enabled"
        | "messages"
        | "tools"
        | "functions"
        | "stream" => Slot::Inline,
        k if k.starts_with("mcp.") => Slot::Inline,
        _ => Slot::Upstream,
    }
}

/// At least what setting `key` to `value` makes the session hold (the exact cost is
/// [`SessionContent::param_cost`] once it is set).
pub(crate) fn new_param_cost(key: &str, value: &Value) -> u64 {
    match slot(key) {
        Slot::Inline => 0,
        Slot::Upstream if value.is_null() => 0,
        Slot::Upstream => heap::object_entry(key, value),
        Slot::Model | Slot::Backend | Slot::ServerIds | Slot::Allowlist | Slot::Denylist => {
            heap::json(value)
        }
    }
}

fn patterns_cost(patterns: &[Pattern]) -> u64 {
    heap::strings(patterns.iter().map(Pattern::as_str))
}

impl SessionContent {
    /// What the session holds for param `key` now.
    pub(crate) fn param_cost(&self, key: &str) -> u64 {
        let text = |s: &Option<String>| s.as_ref().map_or(0, |s| heap::string(s.len() as u64));
        match slot(key) {
            Slot::Model => text(&self.settings.model),
            Slot::Backend => text(&self.settings.backend),
            Slot::ServerIds => heap::strings(self.mcp.server_ids.iter().map(String::as_str)),
            Slot::Allowlist => {
                let tools = &self.mcp.narrowing.tools;
                tools.allow.as_deref().map_or(0, patterns_cost)
            }
            Slot::Denylist => patterns_cost(&self.mcp.narrowing.tools.deny),
            Slot::Upstream => self
                .upstream
                .get(key)
                .map_or(0, |value| heap::object_entry(key, value)),
            Slot::Inline => 0,
        }
    }

    /// Applies one SET_PARAM. `null` clears a forwarded key.
    pub(crate) fn apply_param(
        &mut self,
        key: &str,
        value: Value,
        task: &TaskMcpPolicy,
    ) -> Result<(), ParamError> {
        let s = &mut self.settings;
        match key {
            "model" => s.model = Some(string(key, &value)?),
            "backend" => s.backend = Some(string(key, &value)?),
            "timeout_ms" => s.timeout_ms = Some(positive(key, &value)? as u64),
            "tool_arena_ptr" => s.tool_arena_ptr = Some(non_negative(key, &value)?),
            "tool_arena_len" => s.tool_arena_len = Some(non_negative(key, &value)?),
            "max_iterations" => {
                s.max_iterations = positive(key, &value)?.min(defaults::CHAT_MAX_ITERATIONS_CAP)
            }
            "max_total_tool_calls" | "max_tool_calls" => {
                s.max_total_tool_calls =
                    positive(key, &value)?.min(defaults::CHAT_MAX_TOTAL_TOOL_CALLS_CAP)
            }
            "max_tool_output_bytes" => s.max_tool_output_bytes = positive(key, &value)?,
            "mcp.enabled" => {
                let enabled = value.as_bool().ok_or_else(|| {
                    ParamError::Invalid(format!(
                        "mcp.enabled must be a boolean, got {}",
                        shown_json(&value)
                    ))
                })?;
                if enabled && !task.enabled {
                    return Err(ParamError::Denied(
                        "the task does not enable MCP (mcp.enabled)".into(),
                    ));
                }
                self.mcp.enabled = enabled;
            }
            "mcp.server_ids" => {
                let mut ids = strings(key, &value)?;
                if let Some(outside) = ids.iter().find(|id| !task.allowed_server_ids.contains(id)) {
                    return Err(ParamError::Denied(format!(
                        "server `{}` is not in the task's mcp.allowed_server_ids",
                        shown(outside)
                    )));
                }
                // Repeats add nothing but work for every send.
                let mut seen = std::collections::HashSet::new();
                ids.retain(|id| seen.insert(id.clone()));
                self.mcp.server_ids = ids;
            }
            "mcp.decision_log" => {
                self.mcp.decision_log = value.as_bool().ok_or_else(|| {
                    ParamError::Invalid(format!(
                        "mcp.decision_log must be a boolean, got {}",
                        shown_json(&value)
                    ))
                })?;
            }
            "mcp.tool_allowlist" | "mcp.tool_denylist" => {
                let key = ListKey::parse(key).expect("matched above");
                let patterns = patterns(key, &value)?;
                self.mcp.narrowing.set(key, patterns);
            }
            k if k.starts_with("mcp.task_") => {
                return Err(ParamError::Denied(format!(
                    "{} is set by the host from the task",
                    shown(k)
                )));
            }
            k if k.starts_with("mcp.") => {
                return Err(ParamError::Invalid(format!(
                    "unknown MCP session key {}",
                    shown(k)
                )));
            }
            "messages" | "tools" | "functions" => {
                return Err(ParamError::Invalid(format!(
                    "{key} is built by the host; use cchat_write_msg / cchat_write_fn"
                )));
            }
            "stream" if value.as_bool() == Some(true) => {
                return Err(ParamError::Invalid(
                    "stream: true is not supported; responses are always whole".into(),
                ));
            }
            "stream" => {}
            _ if value.is_null() => {
                self.upstream.remove(key);
            }
            _ => {
                self.upstream.insert(key.to_owned(), value);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::*;
    use crate::chat::ChatSession;
    use crate::chat::session::SetParamError;
    use crate::sandbox::MemoryBudget;

    fn session() -> ChatSession {
        ChatSession::new(&task(), &MemoryBudget::unlimited())
    }

    #[test]
    fn a_set_param_argument_reads_as_the_object_it_is() {
        use quiver_abi::Errno;
        let budget = MemoryBudget::unlimited();
        let read = |text: &str| {
            budget
                .parse_json_as::<ParamArg>("t", text.as_bytes())
                .map(|(arg, _)| (arg.key, arg.value))
        };
        let pair = |key: &str, value: Value| Ok((key.to_owned(), value));
        assert_eq!(
            read(r#"{"key": "model", "value": "m"}"#),
            pair("model", json!("m"))
        );
        assert_eq!(read(r#"{"value": [1], "key": "k"}"#), pair("k", json!([1])));
        assert_eq!(read(r#"{"key": "k"}"#), pair("k", Value::Null));
        assert_eq!(
            read(r#"{"key": "a", "other": {"x": 1}, "key": "b", "value": 1, "value": 2}"#),
            pair("b", json!(2)),
            "other fields skipped, a repeated one's last value"
        );
        assert_eq!(
            read(r#"{"k\u0065y": "escaped"}"#),
            pair("escaped", Value::Null)
        );
        for shape in [
            r#"{"key": 5}"#,
            r#"{"value": 1}"#,
            r#"["k", 1]"#,
            r#""key""#,
            "null",
            "7",
        ] {
            assert_eq!(read(shape).err(), Some(Errno::EINVAL), "{shape}");
        }
        for broken in ["{", r#"{"key": "k",}"#, "", "nope"] {
            assert_eq!(read(broken).err(), Some(Errno::EIO), "{broken}");
        }
    }

    fn invalid(result: Result<(), SetParamError>) -> bool {
        matches!(result, Err(SetParamError::Param(ParamError::Invalid(_))))
    }

    fn denied(result: Result<(), SetParamError>) -> bool {
        matches!(result, Err(SetParamError::Param(ParamError::Denied(_))))
    }

    /// A task allowing `fs` (its default) and `git`; the chat tests' common policy.
    pub(crate) fn task() -> TaskMcpPolicy {
        TaskMcpPolicy {
            enabled: true,
            default_server_ids: vec!["fs".into()],
            allowed_server_ids: vec!["fs".into(), "git".into()],
            narrowing: Narrowing::default(),
            profile: None,
            principal: None,
        }
    }

    #[test]
    fn consumed_keys_are_typed_and_others_forwarded() {
        let mut session = session();
        session.set_param("model", json!("m"), &task()).unwrap();
        session
            .set_param("max_tool_calls", json!(3), &task())
            .unwrap();
        session
            .set_param("temperature", json!(0.2), &task())
            .unwrap();
        session
            .set_param("tool_choice", json!("none"), &task())
            .unwrap();
        assert_eq!(session.settings.model.as_deref(), Some("m"));
        assert_eq!(session.settings.max_total_tool_calls, 3);
        assert!(!session.mcp.decision_log, "the decision log is opt-in");
        session
            .set_param("mcp.decision_log", json!(true), &task())
            .unwrap();
        assert!(session.mcp.decision_log);
        assert_eq!(
            session.upstream.keys().collect::<Vec<_>>(),
            ["temperature", "tool_choice"]
        );
        session
            .set_param("temperature", json!(null), &task())
            .unwrap();
        assert!(!session.upstream.contains_key("temperature"));
        for (key, value) in [
            ("model", json!(1)),
            ("max_iterations", json!(0)),
            ("timeout_ms", json!("5")),
            ("mcp.server_ids", json!("fs")),
            ("stream", json!(true)),
            ("tools", json!([])),
            ("mcp.tool_allowlist", json!(vec!["a*"; 65])),
            ("mcp.tool_denylist", json!(["x".repeat(257)])),
            ("mcp.decision_log", json!("yes")),
        ] {
            assert!(invalid(session.set_param(key, value, &task())), "{key}");
        }
    }

    #[test]
    fn loop_limits_are_clamped_to_the_host_caps() {
        let mut session = session();
        for key in ["max_iterations", "max_total_tool_calls"] {
            session.set_param(key, json!(u32::MAX), &task()).unwrap();
        }
        assert_eq!(
            session.settings.max_iterations,
            defaults::CHAT_MAX_ITERATIONS_CAP
        );
        assert_eq!(
            session.settings.max_total_tool_calls,
            defaults::CHAT_MAX_TOTAL_TOOL_CALLS_CAP
        );
    }

    #[test]
    fn messages_show_only_the_start_of_a_huge_key_or_value() {
        let mut session = session();
        let huge = "\u{0}".repeat(1_000_000);
        for (key, value) in [
            ("max_iterations", json!([huge.clone()])),
            ("model", json!({"a": huge.clone()})),
            ("mcp.server_ids", json!([huge.clone()])),
        ] {
            let message = match session.set_param(key, value, &task()) {
                Err(SetParamError::Param(ParamError::Invalid(m) | ParamError::Denied(m))) => m,
                other => panic!("{key}: {other:?}"),
            };
            assert!(message.len() < 300, "{key}: {} bytes", message.len());
        }
        let key = format!("mcp.{huge}");
        let Err(SetParamError::Param(ParamError::Invalid(message))) =
            session.set_param(&key, json!(1), &task())
        else {
            panic!("an unknown mcp key is invalid");
        };
        assert!(
            message.len() < 300 && message.contains("1000004 bytes"),
            "{message}"
        );
    }

    #[test]
    fn repeated_server_ids_are_kept_once() {
        let mut session = session();
        session
            .set_param(
                "mcp.server_ids",
                json!(["git", "fs", "git"].repeat(1000)),
                &task(),
            )
            .unwrap();
        assert_eq!(session.mcp.server_ids, ["git", "fs"]);
    }

    #[test]
    fn mcp_keys_only_narrow() {
        let mut session = session();
        assert_eq!(session.mcp.server_ids, ["fs"]);
        session
            .set_param("mcp.server_ids", json!(["git"]), &task())
            .unwrap();
        assert!(denied(session.set_param(
            "mcp.server_ids",
            json!(["web"]),
            &task()
        )));
        assert!(denied(session.set_param(
            "mcp.task_tool_allowlist",
            json!(["*"]),
            &task()
        )));
        let disabled = TaskMcpPolicy {
            enabled: false,
            ..task()
        };
        assert!(denied(session.set_param(
            "mcp.enabled",
            json!(true),
            &disabled
        )));
        session
            .set_param("mcp.enabled", json!(false), &disabled)
            .unwrap();
    }
}
