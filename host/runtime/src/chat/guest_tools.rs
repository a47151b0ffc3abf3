//! The wasm side of guest tools: finding a tool function in the guest's funcref table and
//! calling it with the tool arena protocol of `docs/abi.md`. The loop reaches it only
//! through the [`GuestTools`] trait, so the loop never touches wasm. [`GuestTool`] is what
//! `cchat_write_fn` registers.

use std::sync::{Arc, Mutex};

use quiver_abi::Errno;
use serde_json::value::{RawValue, to_raw_value};
use serde_json::{Value, json};
use wasmtime::Caller;

use super::{ChatView, GuestTools};
use crate::defaults;
use crate::sandbox::{Charge, MemoryBudget, guest, guest_callback, heap};

/// Guest tools, called through the funcref table with the tool arena protocol.
pub(super) struct CallerTools<'a, 'b, T: 'static> {
    pub(super) caller: &'a mut Caller<'b, T>,
    pub(super) arena: Option<(u32, u32)>,
    pub(super) max_output: u32,
    /// Charged for each output before it is copied out of guest memory.
    pub(super) budget: MemoryBudget,
}

impl<T: ChatView> GuestTools for CallerTools<'_, '_, T> {
    async fn call(
        &mut self,
        table_index: u32,
        args: &str,
    ) -> Result<Result<(String, Charge), String>, wasmtime::Error> {
        let Some((arena_ptr, arena_len)) = self.arena else {
            return Ok(Err(
                "the guest set no tool arena (session params tool_arena_ptr and tool_arena_len)"
                    .into(),
            ));
        };
        let Some(func) = guest_callback(self.caller, table_index) else {
            return Ok(Err(format!(
                "no tool function at table index {table_index}"
            )));
        };
        let arena_end = u64::from(arena_ptr) + u64::from(arena_len);
        let len_ptr = (u64::from(arena_ptr) + args.len() as u64 + 1).next_multiple_of(4);
        let out_ptr = len_ptr + 4;
        if out_ptr > arena_end || arena_end > u64::from(u32::MAX) {
            return Ok(Err(format!(
                "the tool arguments ({} bytes) do not fit the tool arena ({arena_len} bytes)",
                args.len()
            )));
        }
        let room = (arena_end - out_ptr) as u32;
        let mut capacity = room.min(self.max_output);
        for attempt in 0..2 {
            let prepared = guest(self.caller).and_then(|(mut mem, _)| {
                mem.write(arena_ptr, args.as_bytes())?;
                mem.write(arena_ptr + args.len() as u32, &[0])?;
                mem.write_u32(len_ptr as u32, capacity)
            });
            if prepared.is_err() {
                return Ok(Err("the tool arena lies outside guest memory".into()));
            }
            let params = (
                arena_ptr as i32,
                args.len() as i32,
                out_ptr as i32,
                len_ptr as i32,
            );
            let depth = self.caller.data_mut().sandbox().guest_tool_depth;
            if depth >= defaults::MAX_GUEST_TOOL_NESTING {
                return Ok(Err(format!(
                    "guest tools may run inside one another at most {} deep (a guest tool's cchat_send called this one)",
                    defaults::MAX_GUEST_TOOL_NESTING
                )));
            }
            let stacks = self.caller.data().chat().guest_tool_stacks.clone();
            if !self
                .caller
                .data_mut()
                .sandbox()
                .enter_guest_call(depth, &stacks)
            {
                return Ok(Err(
                    "the host's stacks for guest tool calls are all in use by other tasks; try again later"
                        .into(),
                ));
            }
            let rc = func.call_async(&mut *self.caller, params).await;
            self.caller.data_mut().sandbox().leave_guest_call(depth);
            let rc = rc?;
            let Ok((mem, _)) = guest(self.caller) else {
                return Ok(Err("guest memory is gone".into()));
            };
            let Ok(len) = mem.read_u32(len_ptr as u32) else {
                return Ok(Err("the tool arena lies outside guest memory".into()));
            };
            let too_large = || {
                format!(
                    "the tool's output ({len} bytes) is larger than the host takes ({} bytes)",
                    defaults::MAX_GUEST_INPUT_BYTES
                )
            };
            return Ok(match rc {
                rc if rc == Errno::ENOSPC.ret()
                    && attempt == 0
                    && len > capacity
                    && len <= room
                    && len <= defaults::MAX_GUEST_INPUT_BYTES =>
                {
                    capacity = len;
                    continue;
                }
                rc if rc == Errno::ENOSPC.ret() && len > defaults::MAX_GUEST_INPUT_BYTES => {
                    Err(too_large())
                }
                rc if rc == Errno::ENOSPC.ret() => Err(format!(
                    "the tool's output ({len} bytes) does not fit the tool arena ({room} bytes for output)"
                )),
                rc if rc < 0 => Err(format!("the guest tool failed with errno {}", -rc)),
                _ if len > capacity => Err(format!(
                    "the guest tool reported {len} bytes in a {capacity}-byte buffer"
                )),
                _ if len > defaults::MAX_GUEST_INPUT_BYTES => Err(too_large()),
                _ => {
                    // Charged before the copy, so an output the budget cannot hold is never
                    // copied.
                    let Ok(charge) = self
                        .budget
                        .charge("cchat_send tool results", heap::string(u64::from(len)))
                    else {
                        return Ok(Err(format!(
                            "the tool's output ({len} bytes) does not fit: the host memory budget of the task is exhausted (limits.host_memory_bytes)"
                        )));
                    };
                    match mem.bytes(out_ptr as i32, len as i32) {
                        Err(_) => Err("the tool's output lies outside guest memory".into()),
                        Ok(bytes) => match std::str::from_utf8(bytes) {
                            Ok(text) => Ok((text.to_owned(), charge)),
                            Err(_) => Err("the guest tool's output is not UTF-8".into()),
                        },
                    }
                }
            });
        }
        unreachable!("the second attempt always returns")
    }
}

/// A tool the guest registered with `cchat_write_fn`.
#[derive(Clone, Debug)]
pub(crate) struct GuestTool {
    pub(crate) name: String,
    /// `{"type": "function", "function": {...}}`, the JSON text each request copies;
    /// shared by the copies of a session and by the task's [`LastTool`].
    pub(crate) definition: Arc<RawValue>,
    /// What the definition holds read back into a value, as a wire that translates the
    /// request body does.
    pub(crate) value_cost: u64,
    /// Index into the guest's funcref table.
    pub(crate) table_index: u32,
}

/// The last tool definition a task's `cchat_write_fn` accepted, as the guest wrote it and
/// as checked, so a guest that registers the same tool in every session (as most do) has it
/// parsed and checked once. Definitions above
/// [`MAX_REUSED_TOOL_DEFINITION_BYTES`](defaults::MAX_REUSED_TOOL_DEFINITION_BYTES) are not
/// kept; a kept one is charged to the task's budget (its text and what it parsed to),
/// and one the budget cannot hold is not kept.
#[derive(Default)]
pub(crate) struct LastTool(Mutex<Option<KeptTool>>);

/// A kept definition: the guest's text, the tool it defines, what holding both costs.
struct KeptTool {
    text: Box<[u8]>,
    tool: GuestTool,
    _charge: Charge,
}

impl LastTool {
    /// The tool `text` defines if it is the last one accepted (its table index is the
    /// caller's to set).
    pub(crate) fn reuse(&self, text: &[u8]) -> Option<GuestTool> {
        let last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let kept = last.as_ref().filter(|kept| *kept.text == *text)?;
        Some(kept.tool.clone())
    }

    /// Keeps `tool`, which `text` defines, unless `text` is too long to keep or `budget`
    /// cannot hold it.
    pub(crate) fn keep(&self, text: &[u8], tool: &GuestTool, budget: &MemoryBudget) {
        if text.len() > defaults::MAX_REUSED_TOOL_DEFINITION_BYTES {
            return;
        }
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // The one kept before is given back first.
        *last = None;
        let cost = heap::alloc(text.len() as u64).saturating_add(tool.definition_cost());
        if let Ok(charge) = budget.charge("kept guest tool definition", cost) {
            *last = Some(KeptTool {
                text: text.into(),
                tool: tool.clone(),
                _charge: charge,
            });
        }
    }
}

/// OpenAI's rule for function names.
pub(crate) fn is_valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl GuestTool {
    /// Checks an OpenAI tool definition from the guest.
    pub(crate) fn from_json(table_index: u32, mut value: Value) -> Result<Self, String> {
        if value["type"] != "function" {
            return Err("`type` must be \"function\"".into());
        }
        let Some(Value::Object(function)) = value.get_mut("function").map(Value::take) else {
            return Err("`function` must be an object".into());
        };
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or("`function.name` must be a string")?;
        if !is_valid_function_name(name) {
            return Err(format!(
                "function name {name:?} must match ^[a-zA-Z0-9_-]{{1,64}}$"
            ));
        }
        if name.starts_with("mcp__") {
            return Err(format!(
                "function name {name:?}: the prefix mcp__ is reserved for MCP tools"
            ));
        }
        if let Some(parameters) = function.get("parameters")
            && !parameters.is_object()
        {
            return Err("`function.parameters` must be a JSON Schema object".into());
        }
        let name = name.to_owned();
        let definition = json!({"type": "function", "function": function});
        let text = to_raw_value(&definition).map_err(|e| format!("not JSON: {e}"))?;
        Ok(Self {
            name,
            definition: Arc::from(text),
            value_cost: heap::json(&definition),
            table_index,
        })
    }

    /// What the tool holds in its session.
    pub(crate) fn cost(&self) -> u64 {
        heap::vec_slot::<GuestTool>()
            .saturating_add(heap::string(self.name.len() as u64))
            .saturating_add(self.definition_cost())
    }

    /// What the definition's text holds (with its `Arc`'s counts).
    pub(crate) fn definition_cost(&self) -> u64 {
        let counts = 2 * std::mem::size_of::<usize>();
        heap::alloc((self.definition.get().len() + counts) as u64)
    }

    /// [`from_json`](Self::from_json) of JSON text.
    #[cfg(test)]
    pub(crate) fn parse(table_index: u32, definition: &str) -> Result<Self, String> {
        let value = crate::json::from_str(definition).map_err(|e| format!("not JSON: {e}"))?;
        Self::from_json(table_index, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_tool_definitions_are_checked() {
        let ok = GuestTool::parse(3, r#"{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}"#).unwrap();
        assert_eq!(ok.name, "get_weather");
        assert_eq!(ok.table_index, 3);
        for bad in [
            "not json",
            r#"{"type":"function"}"#,
            r#"{"type":"other","function":{"name":"x"}}"#,
            r#"{"type":"function","function":{"name":"has space"}}"#,
            r#"{"type":"function","function":{"name":"mcp__fs__x"}}"#,
            r#"{"type":"function","function":{"name":"x","parameters":"nope"}}"#,
        ] {
            assert!(GuestTool::parse(0, bad).is_err(), "{bad}");
        }
    }
}
