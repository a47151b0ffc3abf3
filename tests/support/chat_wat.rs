//! A builder for WAT chat guests: C-level ABI programs that drive `cchat_*` step by step,
//! carrying a few guest tools at fixed funcref table indices. Every step records its return
//! value with `$out`; `recv`, `metrics` and `messages` emit their JSON to stderr.

use serde_json::{Value, json};

use crate::wat;

/// Guest tools every chat guest carries, at fixed funcref table indices.
const TOOLS: &str = r#"
  (table (export "__indirect_function_table") 8 funcref)
  (elem (i32.const 1) $weather $echo_args $accents $trap $needs_room)
  ;; 1: writes "Sunny, 21C"
  (func $weather (param $a i32) (param $al i32) (param $o i32) (param $ol i32) (result i32)
    (memory.copy (local.get $o) (i32.const 99000) (i32.const 10))
    (i32.store (local.get $ol) (i32.const 10))
    (i32.const 0))
  ;; 2: echoes its arguments
  (func $echo_args (param $a i32) (param $al i32) (param $o i32) (param $ol i32) (result i32)
    (memory.copy (local.get $o) (local.get $a) (local.get $al))
    (i32.store (local.get $ol) (local.get $al))
    (i32.const 0))
  ;; 3: 300 bytes of "é"
  (func $accents (param $a i32) (param $al i32) (param $o i32) (param $ol i32) (result i32)
    (if (i32.lt_u (i32.load (local.get $ol)) (i32.const 300))
      (then (i32.store (local.get $ol) (i32.const 300)) (return (i32.const -28))))
    (memory.copy (local.get $o) (i32.const 99100) (i32.const 300))
    (i32.store (local.get $ol) (i32.const 300))
    (i32.const 0))
  ;; 4: traps
  (func $trap (param i32 i32 i32 i32) (result i32) unreachable)
  ;; 5: needs a 100-byte buffer and says so with ENOSPC
  (func $needs_room (param $a i32) (param $al i32) (param $o i32) (param $ol i32) (result i32)
    (if (i32.lt_u (i32.load (local.get $ol)) (i32.const 100))
      (then (i32.store (local.get $ol) (i32.const 100)) (return (i32.const -28))))
    (memory.fill (local.get $o) (i32.const 120) (i32.const 100))
    (i32.store (local.get $ol) (i32.const 100))
    (i32.const 0))
"#;

pub const WEATHER: u32 = 1;
pub const ECHO_ARGS: u32 = 2;
pub const ACCENTS: u32 = 3;
pub const TRAP: u32 = 4;
pub const NEEDS_ROOM: u32 = 5;
pub const ARENA: u32 = 196_608;

/// Builds a WAT chat guest step by step; every step records its return value with `$out`.
pub struct ChatGuest {
    data: Vec<(u32, Vec<u8>)>,
    next: u32,
    body: String,
}

impl Default for ChatGuest {
    fn default() -> Self {
        Self::new()
    }
}

impl ChatGuest {
    pub fn new() -> Self {
        let mut guest = Self {
            data: vec![
                (99_000, b"Sunny, 21C".to_vec()),
                (99_100, "é".repeat(150).into_bytes()),
            ],
            next: 100_000,
            body: String::new(),
        };
        guest
            .body
            .push_str("(local.set $s (call $cchat_create)) (call $out (local.get $s))\n");
        guest
    }

    pub fn bytes(&mut self, bytes: &[u8]) -> (u32, u32) {
        let at = self.next;
        self.data.push((at, bytes.to_vec()));
        self.next += (bytes.len() as u32).next_multiple_of(8) + 8;
        (at, bytes.len() as u32)
    }

    pub fn raw(mut self, wat: &str) -> Self {
        self.body.push_str(wat);
        self.body.push('\n');
        self
    }

    pub fn msg(mut self, role: &str, content: &str) -> Self {
        let (r, rl) = self.bytes(role.as_bytes());
        let (c, cl) = self.bytes(content.as_bytes());
        self.raw(&format!("(call $out (call $cchat_write_msg (local.get $s) (i32.const {r}) (i32.const {rl}) (i32.const {c}) (i32.const {cl})))"))
    }

    pub fn ctl_in(mut self, cmd: i32, arg: &[u8]) -> Self {
        let (p, l) = self.bytes(arg);
        self.raw(&format!("(call $cap (i32.const 8192) (i32.const {l})) (call $out (call $cchat_ctl (local.get $s) (i32.const {cmd}) (i32.const {p}) (i32.const 8192)))"))
    }

    pub fn param(self, key: &str, value: Value) -> Self {
        self.ctl_in(
            1,
            json!({"key": key, "value": value}).to_string().as_bytes(),
        )
    }

    pub fn add_message(self, message: Value) -> Self {
        self.ctl_in(3, message.to_string().as_bytes())
    }

    pub fn tool(mut self, index: u32, name: &str) -> Self {
        let definition = json!({"type": "function", "function": {"name": name, "description": format!("guest tool {name}"),
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        let (p, l) = self.bytes(definition.to_string().as_bytes());
        self.raw(&format!("(call $out (call $cchat_write_fn (local.get $s) (i32.const {index}) (i32.const {p}) (i32.const {l})))"))
    }

    pub fn arena(self) -> Self {
        self.param("tool_arena_ptr", json!(ARENA))
            .param("tool_arena_len", json!(16384))
    }

    pub fn send(self, flags: i32) -> Self {
        self.raw(&format!("(local.set $r (call $cchat_send (local.get $s) (i32.const {flags}))) (call $out (local.get $r))"))
    }

    /// Receives the last response into the output buffer and emits it.
    pub fn recv(self) -> Self {
        self.raw("(call $cap (i32.const 8192) (i32.const 65536)) (call $out (call $cchat_recv (local.get $r) (i32.const 16384) (i32.const 8192))) (call $emit (i32.const 16384) (call $len (i32.const 8192)))")
    }

    pub fn metrics(self) -> Self {
        self.raw("(call $cap (i32.const 8192) (i32.const 65536)) (call $out (call $cchat_ctl (local.get $r) (i32.const 2) (i32.const 16384) (i32.const 8192))) (call $emit (i32.const 16384) (call $len (i32.const 8192)))")
    }

    pub fn build(&self) -> String {
        let data: Vec<(u32, &[u8])> = self.data.iter().map(|(a, b)| (*a, b.as_slice())).collect();
        wat::guest(
            &data,
            &format!(
                "{TOOLS}\n(func $main (local $s i32) (local $r i32)\n{})",
                self.body
            ),
        )
    }
}

/// A host whose default LLM backend is `llm`.
pub fn scripted_host(registry: &crate::RegistryDir, llm: &crate::llm::ScriptedLlm) -> quiver::Host {
    scripted_host_builder(registry, llm).build().expect("host")
}

/// The builder behind [`scripted_host`], for tests that add options.
pub fn scripted_host_builder(
    registry: &crate::RegistryDir,
    llm: &crate::llm::ScriptedLlm,
) -> quiver::HostBuilder {
    let backend = quiver::llm::BackendConfig {
        kind: llm.wire().backend_kind(),
        base_url: Some(llm.base_url()),
        default_model: Some("scripted-default".into()),
        ..Default::default()
    };
    let config = quiver::HostConfig {
        default_backend: Some("scripted".into()),
        backends: std::collections::BTreeMap::from([("scripted".into(), backend)]),
        ..Default::default()
    };
    crate::host_builder(registry).with_config(config, ".")
}
