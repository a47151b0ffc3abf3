//! Every tunable default of the host, declared once with its unit and the reason for it.
//!
//! Registry files, task files and the [`HostBuilder`](crate::HostBuilder) override these;
//! nothing else in the crate hard-codes a timeout, a cap or a TTL.

use std::time::Duration;

/// Time one MCP `tools/call` (or one `tools/list`) may take before it fails with
/// `mcp_timeout`. Registry `budgets.tool_timeout_ms` overrides it per server.
pub const TOOL_TIMEOUT: Duration = Duration::from_millis(8_000);

/// Tool calls one server runs at once, across every task of the host. Registry
/// `budgets.max_concurrency` overrides it per server.
pub const MAX_CONCURRENCY: u32 = 8;

/// Largest serialised MCP tool result handed to a guest; larger results become an
/// `mcp_output_too_large` error instead of flooding guest memory. Registry
/// `budgets.max_tool_output_bytes` overrides it per server.
pub const MAX_TOOL_OUTPUT_BYTES: u64 = 1024 * 1024;

/// How long a server's `tools/list` answer is reused before it is asked again (a
/// `notifications/tools/list_changed` from the server drops it sooner).
pub const TOOLS_CACHE_TTL: Duration = Duration::from_secs(300);

/// Time to spawn a stdio server and finish the MCP `initialize` handshake. Generous because
/// `npx`/`uvx` servers may download themselves on first use.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Pages of `tools/list` read before a server is considered to be paging forever.
pub const MAX_TOOL_LIST_PAGES: usize = 100;

/// Time given to MCP server processes to exit on shutdown before they are killed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Open fds one task may hold; one more is `-EMFILE`.
pub const MAX_FDS_PER_TASK: usize = 1024;

/// Wall-clock time a task may run when its task file names no deadline.
pub const TASK_DEADLINE: Duration = Duration::from_secs(300);

/// Longest deadline a task may ask for; larger `limits.deadline_ms` values are cut to it, so
/// adding a deadline to the clock can never overflow.
pub const TASK_DEADLINE_MAX: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Linear memory a task may grow to when its task file names no limit.
pub const TASK_MEMORY_BYTES: u64 = 512 * 1024 * 1024;

/// Host memory one task's guest may make the host hold for it: chat messages, params and
/// tools, kept MCP outputs, response bodies, captured output and the copies a `cchat_send`
/// makes while it runs. Past it hostcalls fail with `-ENOMEM` instead of growing the host.
/// 64 MiB holds a long conversation with large tool results (a send briefly needs about
/// twice its session) and a few inputs of [`MAX_GUEST_INPUT_BYTES`], while a flood from one
/// guest stays an eighth of the linear memory ([`TASK_MEMORY_BYTES`]) a task may already
/// use. `HostBuilder::with_task_host_memory` changes it per host; a task's
/// `limits.host_memory_bytes` may only lower it.
pub const TASK_HOST_MEMORY_BYTES: u64 = 64 * 1024 * 1024;

/// Guest tools that may run inside one another: a guest tool whose `cchat_send` makes the
/// model call a guest tool again, and so on. Every level holds a fiber stack from the
/// host's shared pool (the task itself holds one more), so without a bound one recursing
/// guest takes the stacks every other task needs. A deeper call is a `tool_exec_failed`
/// result the model sees; 4 leaves room for a tool that runs a sub-conversation of its own.
pub const MAX_GUEST_TOOL_NESTING: u32 = 4;

/// Tool patterns a chat session may set in `mcp.tool_allowlist` or `mcp.tool_denylist`.
/// Every send matches each pattern against every offered MCP tool, in host time the
/// deadline does not interrupt.
pub const MAX_SESSION_PATTERNS: usize = 64;

/// Longest session tool pattern; far longer than any tool name a model accepts (64).
pub const MAX_PATTERN_BYTES: usize = 256;

/// Period of the engine's epoch clock. Guest code is checked against its deadline (and
/// yields to other tasks) once per tick, so this bounds how late a deadline can fire.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Largest single input (tool arguments, names) a guest may pass to a hostcall; more is
/// `-ENOMEM` rather than a host-side copy of arbitrary size.
pub const MAX_GUEST_INPUT_BYTES: u32 = 16 * 1024 * 1024;

/// Longest guest log line kept; the rest is cut with a marker.
pub const MAX_LOG_LINE_BYTES: usize = 16 * 1024;

/// Longest line of a server's stderr kept in the host log.
pub const MAX_SERVER_STDERR_LINE_BYTES: usize = 4 * 1024;

/// Guest instances the pooling allocator reserves room for, i.e. tasks running at once.
pub const MAX_CONCURRENT_TASKS: u32 = 64;

/// Time one request to an LLM backend may take when neither the backend config nor the
/// session's `timeout_ms` says otherwise. Generous: long completions are slow.
pub const LLM_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Retries of one LLM request after a 429, a 5xx or a network error.
pub const LLM_MAX_RETRIES: u32 = 3;

/// First retry delay; it doubles per retry up to [`LLM_BACKOFF_MAX`].
pub const LLM_BACKOFF_BASE: Duration = Duration::from_millis(200);

/// Longest delay between retries when the backend gives no `Retry-After`.
pub const LLM_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Longest `Retry-After` honoured; a backend asking for more gets its error reported.
pub const LLM_RETRY_AFTER_MAX: Duration = Duration::from_secs(30);

/// Largest response body read from an LLM backend.
pub const LLM_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Model requests per `cchat_send` with AUTO_TOOL_CALL (session param `max_iterations`).
pub const CHAT_MAX_ITERATIONS: u32 = 8;

/// Tool calls per `cchat_send` (session param `max_total_tool_calls`).
pub const CHAT_MAX_TOTAL_TOOL_CALLS: u32 = 32;

/// Bytes of one tool result shown to the model (session param `max_tool_output_bytes`).
pub const CHAT_MAX_TOOL_OUTPUT_BYTES: u32 = 64 * 1024;

/// Model used by the zero-config OpenAI backend when `OPENAI_MODEL` is not set.
pub const OPENAI_DEFAULT_MODEL: &str = "gpt-4o-mini";

/// Base URL of the zero-config OpenAI backend when `OPENAI_BASE_URL` is not set.
pub const OPENAI_DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// First wait after a failed connection to an MCP server before the next attempt; it
/// doubles per consecutive failure up to [`RECONNECT_BACKOFF_MAX`]. Calls meanwhile fail
/// fast with `mcp_unavailable` instead of hammering a server that is down.
pub const RECONNECT_BACKOFF_BASE: Duration = Duration::from_millis(250);

/// Longest wait between connection attempts to an MCP server.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Longest OAuth access-token lifetime believed; a token endpoint's larger `expires_in` is
/// cut to it, so the token is fetched again at least daily and the clock cannot overflow.
pub const OAUTH_TOKEN_MAX_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
