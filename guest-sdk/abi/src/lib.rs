//! The `spear` hostcall ABI as data: errno values, `cchat_ctl` commands, `cchat_send`
//! flags and every import's signature.
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
    pub result: ValType,
}

/// Expands `$callback! { $( fn name(param, ...) -> ty; )* }` with every `spear` import,
/// so that declarations of the imports (the Rust SDK's `extern` block, its native
/// fallbacks, the [`IMPORTS`] table) are all generated from this one list. Every
/// parameter is an `i32`; `ty` is `i32` or `i64`.
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
            fn cchat_create() -> i32;
            fn cchat_write_msg(fd, role_ptr, role_len, content_ptr, content_len) -> i32;
            fn cchat_write_fn(fd, fn_offset, fn_json_ptr, fn_json_len) -> i32;
            fn cchat_ctl(fd, cmd, arg_ptr, arg_len_ptr) -> i32;
            fn cchat_send(fd, flags) -> i32;
            fn cchat_recv(response_fd, out_ptr, out_len_ptr) -> i32;
            fn cchat_close(fd) -> i32;
        }
    };
}

macro_rules! import_table {
    ($( fn $name:ident($($param:ident),*) -> $ret:ident; )*) => {
        /// Every `spear` import, in declaration order.
        pub const IMPORTS: &[Import] = &[$(
            Import {
                name: stringify!($name),
                params: &[$(stringify!($param)),*],
                result: import_table!(@ty $ret),
            },
        )*];
    };
    (@ty i32) => { ValType::I32 };
    (@ty i64) => { ValType::I64 };
}

spear_imports!(import_table);

/// The import named `name`.
pub fn import(name: &str) -> Option<&'static Import> {
    IMPORTS.iter().find(|i| i.name == name)
}
