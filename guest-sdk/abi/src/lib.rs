//! The `spear` hostcall ABI as data: errno values, `cchat_ctl` commands, `cchat_send`
//! flags, the epoll and `spear_fd_ctl` numbers and every import's signature.
//!
//! This crate is the one place these numbers are written. The host and the Rust guest SDK
//! use its constants and [`spear_imports!`]; the C header's constants and import
//! declarations are generated from it; tests check `docs/abi.md` and
//! `wit/spear.wit` against it. It has no dependencies and no `std`, so a guest pays
//! nothing for it.
#![no_std]

pub mod c;
mod errno;

pub use c::write_header_block as write_c_header_block;
pub use errno::Errno;

/// The wasm import module every hostcall lives in.
pub const IMPORT_MODULE: &str = "spear";

/// A named number of the ABI, with what it means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Named {
    pub name: &'static str,
    pub value: i32,
    pub meaning: &'static str,
}

/// `cchat_ctl` commands.
pub mod ctl {
    use super::Named;

    /// On a session: `{"key": K, "value": V}`, its length in `*arg_len_ptr`.
    pub const SET_PARAM: i32 = 1;
    /// On a response fd: the metrics JSON, with the output buffer protocol.
    pub const GET_METRICS: i32 = 2;
    /// On a session: one chat message object, its length in `*arg_len_ptr`.
    pub const ADD_MESSAGE: i32 = 3;
    /// On a session: the messages as a JSON array, with the output buffer protocol.
    pub const GET_MESSAGES: i32 = 4;

    /// Every command, in value order.
    pub const ALL: &[Named] = &[
        Named {
            name: "SET_PARAM",
            value: SET_PARAM,
            meaning: "set a session param",
        },
        Named {
            name: "GET_METRICS",
            value: GET_METRICS,
            meaning: "read a response's metrics",
        },
        Named {
            name: "ADD_MESSAGE",
            value: ADD_MESSAGE,
            meaning: "append a message object",
        },
        Named {
            name: "GET_MESSAGES",
            value: GET_MESSAGES,
            meaning: "read the session's messages",
        },
    ];
}

/// `cchat_send` flag bits.
pub mod send_flags {
    use super::Named;

    /// Metrics are always collected; the bit is accepted for SPEAR compatibility.
    pub const METRICS: i32 = 1;
    /// The host runs the model's tool calls and loops until the model answers.
    pub const AUTO_TOOL_CALL: i32 = 2;
    /// Every bit the host accepts; any other bit is `-EINVAL`.
    pub const KNOWN: i32 = METRICS | AUTO_TOOL_CALL;

    /// Every flag, in value order.
    pub const ALL: &[Named] = &[
        Named {
            name: "METRICS",
            value: METRICS,
            meaning: "ask for metrics",
        },
        Named {
            name: "AUTO_TOOL_CALL",
            value: AUTO_TOOL_CALL,
            meaning: "run the tool-call loop in the host",
        },
    ];
}

/// `log` levels.
pub mod log_level {
    use super::Named;

    pub const TRACE: i32 = 0;
    pub const DEBUG: i32 = 1;
    pub const INFO: i32 = 2;
    pub const WARN: i32 = 3;
    pub const ERROR: i32 = 4;

    /// Every level, in value order.
    pub const ALL: &[Named] = &[
        Named {
            name: "TRACE",
            value: TRACE,
            meaning: "",
        },
        Named {
            name: "DEBUG",
            value: DEBUG,
            meaning: "",
        },
        Named {
            name: "INFO",
            value: INFO,
            meaning: "",
        },
        Named {
            name: "WARN",
            value: WARN,
            meaning: "",
        },
        Named {
            name: "ERROR",
            value: ERROR,
            meaning: "",
        },
    ];
}

/// `spear_epoll_ctl` operations (SPEAR's numbers).
pub mod epoll_op {
    use super::Named;

    pub const ADD: i32 = 1;
    pub const MOD: i32 = 2;
    pub const DEL: i32 = 3;

    /// Every operation, in value order.
    pub const ALL: &[Named] = &[
        Named {
            name: "ADD",
            value: ADD,
            meaning: "watch an fd for the given events",
        },
        Named {
            name: "MOD",
            value: MOD,
            meaning: "change the events of a watched fd",
        },
        Named {
            name: "DEL",
            value: DEL,
            meaning: "stop watching an fd",
        },
    ];
}

/// Readiness bits of `spear_epoll_ctl` and the records of `spear_epoll_wait` (SPEAR's, which
/// are Linux's).
pub mod epoll_events {
    use super::Named;

    /// The fd has something to read (a response, a call's answer).
    pub const IN: i32 = 0x001;
    /// The fd accepts a request.
    pub const OUT: i32 = 0x004;
    /// The work behind the fd failed; reading it says how.
    pub const ERR: i32 = 0x008;
    /// The fd was closed.
    pub const HUP: i32 = 0x010;
    /// Every bit the host knows; others are ignored, as in SPEAR.
    pub const KNOWN: i32 = IN | OUT | ERR | HUP;

    /// Every bit, in value order.
    pub const ALL: &[Named] = &[
        Named {
            name: "IN",
            value: IN,
            meaning: "readable",
        },
        Named {
            name: "OUT",
            value: OUT,
            meaning: "writable",
        },
        Named {
            name: "ERR",
            value: ERR,
            meaning: "failed; always reported",
        },
        Named {
            name: "HUP",
            value: HUP,
            meaning: "closed; always reported",
        },
    ];
}

/// `spear_fd_ctl` commands (SPEAR's numbers).
pub mod fd_ctl {
    use super::Named;

    /// `{"set": ["O_NONBLOCK"], "clear": []}`, its length in `*arg_len_ptr`.
    pub const SET_FLAGS: i32 = 1;
    /// `{"flags": [...]}`, with the output buffer protocol.
    pub const GET_FLAGS: i32 = 2;
    /// `{"kind": "ChatSession"}`, with the output buffer protocol.
    pub const GET_KIND: i32 = 3;
    /// `{"kind", "flags", "poll_mask", "closed"}`, with the output buffer protocol.
    pub const GET_STATUS: i32 = 4;
    /// The fd's metrics JSON (`{}` for most kinds), with the output buffer protocol.
    pub const GET_METRICS: i32 = 5;

    /// Every command, in value order.
    pub const ALL: &[Named] = &[
        Named {
            name: "SET_FLAGS",
            value: SET_FLAGS,
            meaning: "set or clear O_NONBLOCK",
        },
        Named {
            name: "GET_FLAGS",
            value: GET_FLAGS,
            meaning: "read the fd's flags",
        },
        Named {
            name: "GET_KIND",
            value: GET_KIND,
            meaning: "read the fd's kind",
        },
        Named {
            name: "GET_STATUS",
            value: GET_STATUS,
            meaning: "read kind, flags and readiness",
        },
        Named {
            name: "GET_METRICS",
            value: GET_METRICS,
            meaning: "read the fd's metrics",
        },
    ];
}

/// User streams (SPEAR's `user_stream_*`): the directions of `user_stream_open` and the
/// kinds of the 8-byte events `user_stream_ctl_read` returns.
pub mod user_stream {
    use super::Named;

    /// Client to guest: the fd reads.
    pub const DIR_INBOUND: i32 = 1;
    /// Guest to client: the fd writes.
    pub const DIR_OUTBOUND: i32 = 2;
    /// Both.
    pub const DIR_BIDIRECTIONAL: i32 = 3;

    /// Every direction, in value order.
    pub const DIRECTIONS: &[Named] = &[
        Named {
            name: "INBOUND",
            value: DIR_INBOUND,
            meaning: "client to guest: the fd reads",
        },
        Named {
            name: "OUTBOUND",
            value: DIR_OUTBOUND,
            meaning: "guest to client: the fd writes",
        },
        Named {
            name: "BIDIRECTIONAL",
            value: DIR_BIDIRECTIONAL,
            meaning: "both",
        },
    ];

    /// A client sent its first frame on the event's stream id.
    pub const CTL_EVENT_STREAM_CONNECTED: i32 = 1;
    /// The client went away (or never can come); no stream carries more.
    pub const CTL_EVENT_SESSION_CLOSED: i32 = 2;

    /// Every control event kind, in value order.
    pub const CTL_EVENTS: &[Named] = &[
        Named {
            name: "STREAM_CONNECTED",
            value: CTL_EVENT_STREAM_CONNECTED,
            meaning: "a client sent its first frame on stream_id",
        },
        Named {
            name: "SESSION_CLOSED",
            value: CTL_EVENT_SESSION_CLOSED,
            meaning: "the client went away",
        },
    ];

    /// The bytes of one control event: `stream_id: u32, kind: u32`, little-endian.
    pub const CTL_EVENT_BYTES: u32 = 8;

    /// SSF v1 (Spear Stream Frame), the one frame a read returns and a write takes: a
    /// 32-byte little-endian header `magic "SPST", version u16 = 1, header_len u16 >= 32,
    /// msg_type u16, flags u16, stream_id u32, seq u64, meta_len u32, data_len u32`, then
    /// `header_len - 32` ignored bytes, `meta_len` bytes of metadata and `data_len` of data.
    pub mod ssf {
        pub const MAGIC: [u8; 4] = *b"SPST";
        pub const VERSION: u16 = 1;
        pub const HEADER_BYTES: usize = 32;
        /// SPEAR's `DATA` message type.
        pub const MSG_DATA: u16 = 2;
    }
}

/// A core wasm value type of a hostcall signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValType {
    I32,
    I64,
}

/// One hostcall import of the `spear` module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Import {
    pub name: &'static str,
    /// Parameter names, as the docs write them; every parameter is an `i32`.
    pub params: &'static [&'static str],
    /// `None` for a call that returns nothing (`sleep_ms`).
    pub result: Option<ValType>,
}

/// Expands `$callback! { $( fn name(param, ...) -> ty; )* }` with every `spear` import,
/// so that declarations of the imports (the Rust SDK's `extern` block, its native
/// fallbacks, the [`IMPORTS`] table) are all generated from this one list. Every
/// parameter is an `i32`; `ty` is `i32`, `i64` or `()`.
#[macro_export]
macro_rules! spear_imports {
    ($callback:ident) => {
        $callback! {
            fn log(level, ptr, len) -> i32;
            fn time_now_ms() -> i64;
            fn mcp_open(server_id_ptr, server_id_len) -> i32;
            fn mcp_list_tools(fd, out_ptr, out_len_ptr) -> i32;
            fn mcp_call_tool(fd, name_ptr, name_len, args_ptr, args_len, out_ptr, out_len_ptr) -> i32;
            fn mcp_close(fd) -> i32;
            fn mcp_registry_list(out_ptr, out_len_ptr) -> i32;
            fn mcp_registry_get(server_id_ptr, server_id_len, out_ptr, out_len_ptr) -> i32;
            fn mcp_list_resources(fd, out_ptr, out_len_ptr) -> i32;
            fn mcp_list_resource_templates(fd, out_ptr, out_len_ptr) -> i32;
            fn mcp_read_resource(fd, uri_ptr, uri_len, out_ptr, out_len_ptr) -> i32;
            fn mcp_list_prompts(fd, out_ptr, out_len_ptr) -> i32;
            fn mcp_get_prompt(fd, name_ptr, name_len, args_ptr, args_len, out_ptr, out_len_ptr) -> i32;
            fn mcp_set_param(fd, param_ptr, param_len) -> i32;
            fn mcp_call_start(fd, name_ptr, name_len, args_ptr, args_len) -> i32;
            fn mcp_call_recv(call_fd, out_ptr, out_len_ptr) -> i32;
            fn mcp_elicit_fn(fd, fn_offset, arena_ptr, arena_len) -> i32;
            fn cchat_create() -> i32;
            fn cchat_write_msg(fd, role_ptr, role_len, content_ptr, content_len) -> i32;
            fn cchat_write_fn(fd, fn_offset, fn_json_ptr, fn_json_len) -> i32;
            fn cchat_ctl(fd, cmd, arg_ptr, arg_len_ptr) -> i32;
            fn cchat_send(fd, flags) -> i32;
            fn cchat_recv(response_fd, out_ptr, out_len_ptr) -> i32;
            fn cchat_close(fd) -> i32;
            fn wall_time_s() -> i64;
            fn sleep_ms(ms) -> ();
            fn random_i64() -> i64;
            fn spear_epoll_create() -> i32;
            fn spear_epoll_ctl(epfd, op, fd, events) -> i32;
            fn spear_epoll_wait(epfd, out_ptr, out_len_ptr, timeout_ms) -> i32;
            fn spear_epoll_close(epfd) -> i32;
            fn spear_fd_ctl(fd, cmd, arg_ptr, arg_len_ptr) -> i32;
            fn user_stream_open(stream_id, direction) -> i32;
            fn user_stream_read(fd, out_ptr, out_len_ptr) -> i32;
            fn user_stream_write(fd, buf_ptr, buf_len) -> i32;
            fn user_stream_close(fd) -> i32;
            fn user_stream_ctl_open() -> i32;
            fn user_stream_ctl_read(fd, out_ptr, out_len_ptr) -> i32;
            fn mic_create() -> i32;
            fn mic_ctl(fd, cmd, arg_ptr, arg_len_ptr) -> i32;
            fn mic_read(fd, out_ptr, out_len_ptr) -> i32;
            fn mic_close(fd) -> i32;
            fn rtasr_create() -> i32;
            fn rtasr_ctl(fd, cmd, arg_ptr, arg_len_ptr) -> i32;
            fn rtasr_write(fd, buf_ptr, buf_len) -> i32;
            fn rtasr_read(fd, out_ptr, out_len_ptr) -> i32;
            fn rtasr_close(fd) -> i32;
        }
    };
}

macro_rules! import_table {
    ($( fn $name:ident($($param:ident),*) -> $ret:tt; )*) => {
        /// Every `spear` import, in declaration order.
        pub const IMPORTS: &[Import] = &[$(
            Import {
                name: stringify!($name),
                params: &[$(stringify!($param)),*],
                result: import_table!(@ty $ret),
            },
        )*];
    };
    (@ty i32) => { Some(ValType::I32) };
    (@ty i64) => { Some(ValType::I64) };
    (@ty ()) => { None };
}

spear_imports!(import_table);

/// The import named `name`.
pub fn import(name: &str) -> Option<&'static Import> {
    IMPORTS.iter().find(|i| i.name == name)
}
