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

/// Largest `tools/list` a server may give, counted over all its pages as the tools' JSON;
/// more is `mcp_output_too_large` rather than a list that could fill the host. Generous:
/// large servers list a few hundred tools of a few KiB each. Registry
/// `budgets.max_tool_list_bytes` overrides it per server.
pub const MAX_TOOL_LIST_BYTES: u64 = 4 * 1024 * 1024;

/// Largest message a server may send that is not an answer to `tools/call` or `tools/list`
/// (the `initialize` answer, notifications, requests to the host). Those carry no payload
/// worth more; a larger one is dropped like an unparsable line.
pub const MAX_MCP_MESSAGE_BYTES: u64 = 1024 * 1024;

/// Bytes a server's message may carry on top of the payload cap that applies to it: the
/// JSON-RPC envelope, and whitespace or escapes that re-encoding removes. The transports read
/// at most cap + envelope bytes of one message into memory.
pub const MCP_ENVELOPE_BYTES: u64 = 64 * 1024;

/// Bytes of a Streamable HTTP server's error answer (a non-2xx status) read for the
/// JSON-RPC error it may hold; past this the request fails as the server's error, unread.
pub const MCP_MAX_HTTP_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Notifications and requests a server may send per second on one connection (also the
/// burst allowed at once); more are dropped. Progress and log messages come far slower.
pub const MCP_SERVER_MESSAGES_PER_SEC: u32 = 1_000;

/// Messages from a server that the host drops (unparsable, oversized with no answerable id,
/// answers to unknown ids, over the rate above) that a connection tolerates; the allowance
/// refills at a tenth of this per second. Past it the server is flooding: the connection is
/// closed, its pending calls fail with `mcp_unavailable`, and the next call restarts it.
pub const MCP_MAX_DROPPED_MESSAGES: u32 = 1_000;

/// Bytes of one over-cap message the host reads past, throwing them away, to reach the
/// next message. Past this the server is stuck writing one endless message: the connection
/// is closed, its pending calls fail with `mcp_unavailable`, and the next call restarts it.
pub const MCP_MAX_DISCARD_BYTES: u64 = 64 * 1024 * 1024;

/// Longest wait before resuming a Streamable HTTP event stream that the server closed. The
/// server's SSE `retry:` field sets the wait (the spec says to honour it; the conformance
/// suite wants 500 ms kept to within 200 ms); a larger value is cut to this, so a server
/// cannot park a reconnect for days. Calls are bounded by their tool timeout anyway.
pub const MAX_SSE_RETRY: Duration = Duration::from_secs(10);

/// How long a server's `tools/list` answer is reused before it is asked again, at most: a
/// server's own `ttlMs` (SEP-2549) shortens it, never lengthens it, and a
/// `notifications/tools/list_changed` from the server drops it sooner.
pub const TOOLS_CACHE_TTL: Duration = Duration::from_secs(300);

/// Time to spawn a stdio server (or reach a remote one) and finish the MCP `initialize`
/// handshake. Generous because `npx`/`uvx` servers may download themselves on first use.
/// [`HostBuilder::with_connect_timeout`](crate::HostBuilder::with_connect_timeout) changes it
/// for the host; registry `budgets.connect_timeout_ms` overrides that per server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Pages of `tools/list` read before a server is considered to be paging forever.
pub const MAX_TOOL_LIST_PAGES: usize = 100;

/// Time a stopping stdio server gets at each step: after its stdin closes, for the server
/// to exit; after SIGTERM to its process group, for the whole group to exit; then the group
/// gets SIGKILL.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// How often a stopping server's process group is checked for having exited.
pub const PROCESS_EXIT_POLL: Duration = Duration::from_millis(10);

/// MCP calls (`tools/call`, `tools/list`) in flight at once across the whole host, in front
/// of each server's own `max_concurrency`, at least: a host gets
/// [`max_concurrent_mcp_calls`] of its task slots. Waiting for a slot counts against the
/// call's `tool_timeout_ms`. An in-flight call costs a few KiB of host memory, so the cap
/// bounds that to tens of MiB while never being what limits an I/O-bound host first.
pub const MAX_CONCURRENT_MCP_CALLS: usize = 4096;

/// MCP calls in flight across the host when `[mcp] max_concurrent_calls` is not set: room
/// for every running task to have 4 at once (at least [`MAX_CONCURRENT_MCP_CALLS`]). A cap
/// below the slots made the tasks past it wait in waves: 10 000 tasks on 10 000 slots
/// took 3 waves of a 2 s tool against a cap of 4096 (BENCHMARKS.md).
pub fn max_concurrent_mcp_calls(slots: u32) -> usize {
    (slots as usize)
        .saturating_mul(4)
        .max(MAX_CONCURRENT_MCP_CALLS)
}

/// Stdio MCP server processes the host runs at once. When a new server must start at the
/// cap, the least recently used server with no call in flight is stopped; if every one is
/// busy, the call fails with `mcp_unavailable`. More than a registry usually names, yet a
/// bound on host memory: a Node.js server alone takes 50-100 MiB.
pub const MAX_SERVER_PROCESSES: usize = 64;

/// A stdio server with no call for this long is stopped (the next call starts it again),
/// so servers a host used once do not hold memory forever. Long enough that a server in
/// regular use (starting one costs about 650 ms for Node.js) stays up. Registry
/// `stdio.idle_timeout_ms` overrides it per server; zero means never.
pub const SERVER_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// Resolved `${ENV:..}` values shorter than this are not treated as secrets: no credential
/// is that short, and cutting such values (a port, `1`, `on`) out of every message would
/// garble the log.
pub const MIN_SECRET_BYTES: usize = 4;

/// Open fds one task may hold; one more is `-EMFILE`.
pub const MAX_FDS_PER_TASK: usize = 1024;

/// Epoll sets one task may hold open; one more `spear_epoll_create` is `-EMFILE`.
pub const MAX_EPOLL_SETS: usize = 64;

/// Fds one epoll set may watch; one more `spear_epoll_ctl` ADD is `-ENOSPC` (as Linux's
/// `max_user_watches`). As many as a task may open by default.
pub const MAX_EPOLL_WATCHES: usize = MAX_FDS_PER_TASK;

/// User streams one task may have (stream ids a guest opened or a client sent on); a
/// client's frame on one more is refused, a guest's open is `-EMFILE`.
pub const MAX_USER_STREAMS: usize = 16;

/// The largest SSF frame a user stream carries either way (SPEAR's `max_frame_bytes`).
pub const USER_STREAM_MAX_FRAME_BYTES: usize = 256 * 1024;

/// Bytes queued per user stream and direction: past them a guest's write is `-EAGAIN`
/// and a client's send waits. Charged to the task's host memory budget as they queue.
pub const USER_STREAM_QUEUE_BYTES: usize = 1024 * 1024;

/// Frames queued per user stream and direction, so tiny frames cannot pile up either.
pub const USER_STREAM_QUEUE_FRAMES: usize = 256;

/// Background work (nonblocking chat sends, MCP calls in flight) one task may have running
/// at once; one more is `-EAGAIN`.
pub const MAX_IN_FLIGHT: usize = 64;

/// One task's share of a server's `budgets.max_concurrency` with MCP calls in flight, as a
/// divisor (at least one call): half, so one task starting calls cannot hold every permit
/// of a server other tasks share. One more call to that server is `-EAGAIN`.
pub const IN_FLIGHT_SERVER_SHARE: u32 = 2;

/// Charged to a task's memory budget per piece of background work while it runs: its
/// future and task (an MCP call's future is about 22 KB), besides what the work charges.
pub const IN_FLIGHT_BYTES: u64 = 32 * 1024;

/// Entries of a task's WASI table (open files, directories, streams) beyond its `max_fds`
/// and its preopens: room for the standard streams and the few a call holds for a moment.
/// One more open is an error to the guest, not a host descriptor.
pub const WASI_TABLE_SLACK: usize = 16;

/// Wall-clock time a task may run when its task file names no deadline.
pub const TASK_DEADLINE: Duration = Duration::from_secs(300);

/// How long a task's end waits for its background work (nonblocking sends and calls),
/// aborted when the task ended, to be dropped (a worker drops it at its next turn), so
/// that the memory and the events the task reports are final.
pub const TASK_WORK_DRAIN: Duration = Duration::from_secs(1);

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

/// Host memory all tasks of a host may hold for their guests together, when
/// `[tasks] host_memory_total_bytes` does not say: half of the machine's physical memory
/// (the rest is for linear memories, servers and everything else), or
/// [`HOST_MEMORY_TOTAL_FALLBACK`] where that cannot be read. Without it, per-task budgets
/// times running tasks (1024 x 64 MiB) would be the only bound.
pub fn host_memory_total() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page_size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    match (u64::try_from(pages), u64::try_from(page_size)) {
        (Ok(pages), Ok(size)) if pages > 0 && size > 0 => pages.saturating_mul(size) / 2,
        _ => HOST_MEMORY_TOTAL_FALLBACK,
    }
}

/// [`host_memory_total`] where the machine's memory cannot be read.
pub const HOST_MEMORY_TOTAL_FALLBACK: u64 = 4 * 1024 * 1024 * 1024;

/// Guest linear memory all running tasks may hold together, when
/// `[tasks] guest_memory_total_bytes` does not say: half of the machine's physical memory
/// (or [`HOST_MEMORY_TOTAL_FALLBACK`]), read as [`host_memory_total`] reads it. Without
/// it [`TASK_MEMORY_BYTES`] times [`MAX_CONCURRENT_TASKS`] (512 GiB) was the only bound: six
/// tasks touching 500 MiB each took a node from 79 MB to 3.15 GB. Tasks beyond it wait in
/// the queue for their module's initial memory; a grow beyond it traps.
pub fn guest_memory_total() -> u64 {
    host_memory_total()
}

/// The smallest `[tasks] guest_memory_total_bytes` a config file may set: room for a small
/// guest's initial memory.
pub const GUEST_MEMORY_TOTAL_MIN: u64 = 1024 * 1024;

/// Guest tools that may run inside one another: a guest tool whose `cchat_send` makes the
/// model call a guest tool again, and so on. Every level holds a fiber stack from the
/// host's shared pool (the task itself holds one more), so without a bound one recursing
/// guest takes the stacks every other task needs. A deeper call is a `tool_exec_failed`
/// result the model sees; 4 leaves room for a tool that runs a sub-conversation of its own.
pub const MAX_GUEST_TOOL_NESTING: u32 = 4;

/// The longest guest tool definition a task keeps after `cchat_write_fn` accepted it, so
/// that writing the same definition again (in the next session) skips parsing and checking
/// it. One is kept per task, charged to its budget.
pub const MAX_REUSED_TOOL_DEFINITION_BYTES: usize = 4096;

/// Fiber stacks the engine reserves for guest tool calls, as a percentage of the running
/// slots, at least one. Each
/// guest tool call runs on a stack of its own; the host hands these out with a permit, so
/// guest tools can never take the stack a newly admitted task needs (a call finding none
/// left fails alone). Every stack is two kernel mappings and the kernel caps them
/// (`vm.max_map_count`, 65530 by default): at 10 000 slots one extra stack per slot
/// already made instantiation fail.
pub const GUEST_TOOL_STACKS_PERCENT: u32 = 25;

/// Stacks for guest tool calls on a host running `slots` tasks at once.
pub fn guest_tool_stacks(slots: u32) -> u32 {
    (slots.saturating_mul(GUEST_TOOL_STACKS_PERCENT) / 100).max(1)
}

/// Patterns a session may set in one list: a chat session's `mcp.tool_allowlist` or
/// `mcp.tool_denylist`, an MCP fd's `mcp_set_param` lists. Every send or listing matches
/// each pattern against every name, in host time the deadline does not interrupt.
pub const MAX_SESSION_PATTERNS: usize = 64;

/// Patterns in one `mcp.*_allowlist` / `mcp.*_denylist` of a task's config; more is a task
/// config error. Higher than a session's, since an operator writes it, but bounded for the
/// same reason: tasks may come from `quiver serve`'s API.
pub const MAX_TASK_PATTERNS: usize = 256;

/// Longest pattern of a task or session list, in bytes: far longer than any tool name a
/// model accepts (64), and a longer resource URI is matched with `*`.
pub const MAX_PATTERN_BYTES: usize = 256;

/// Period of the engine's epoch clock. Guest code is checked against its deadline (and
/// yields to other tasks) once per tick, so this bounds how late a deadline can fire.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Largest single input (tool arguments, names) a guest may pass to a hostcall; more is
/// `-ENOMEM` rather than a host-side copy of arbitrary size.
pub const MAX_GUEST_INPUT_BYTES: u32 = 16 * 1024 * 1024;

/// Longest server id, in bytes (ids are `[A-Za-z0-9_-]`, so bytes and characters agree):
/// safe in file names, log fields and model-facing tool names. A longer id from a guest is
/// `-EINVAL` before it is copied anywhere.
pub const MAX_SERVER_ID_BYTES: usize = 64;

/// Longest `task_id`, in bytes: it is in every log and audit line of the task.
pub const MAX_TASK_ID_BYTES: usize = 128;

/// Longest principal name, in bytes ([`check_principal`](crate::check_principal)): room
/// for an email address or a service account's name, short enough for every audit line.
pub const MAX_PRINCIPAL_BYTES: usize = 128;

/// Longest MCP tool name, in bytes: the MCP spec's limit (SEP-986: 1 to 128 characters of
/// `A-Za-z0-9_-.`, so bytes and characters agree). A longer name from a guest is `-EINVAL`;
/// the connection's table of pending requests keeps no more of any name.
pub const MAX_TOOL_NAME_BYTES: usize = 128;

/// Tools of one connection whose invalid `x-mcp-header` declarations are noted between two
/// listings (for the decision log); a server listing more gets the rest left out unnamed.
pub const MAX_LEFT_OUT_TOOLS: usize = 256;

/// Most tool pins one registry record may hold (`pins`): far more tools than a model can
/// use, and it bounds what a load and every definition check cost.
pub const MAX_TOOL_PINS: usize = 1024;

/// Longest resource URI a guest may pass to `mcp_read_resource`, in bytes (longer is
/// `-EINVAL`): generous for real URIs, and it bounds the policy match and the log lines.
pub const MAX_RESOURCE_URI_BYTES: usize = 4096;

/// At most this many top-level argument keys are kept in a tool call's summary for
/// observers and the audit log; the rest are counted, not kept.
pub const MAX_SUMMARY_KEYS: usize = 32;

/// Each summarised argument key is cut to this many bytes (keys come from a guest or a
/// model).
pub const MAX_SUMMARY_KEY_BYTES: usize = 64;

/// Quiet time after a change in the registry directory before the watcher reloads it:
/// an editor's save (write, rename, delete a backup) lands within it as one reload.
pub const REGISTRY_RELOAD_DEBOUNCE: Duration = Duration::from_millis(300);

/// Without the `watch` feature a directory store has no file events, so a follower lists
/// it this often to see changes; a listing reads every record, so not much more often.
#[cfg(not(feature = "watch"))]
pub const REGISTRY_DIR_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Longest the watcher puts a reload off while the directory keeps changing.
pub const REGISTRY_RELOAD_MAX_DELAY: Duration = Duration::from_secs(3);

/// How often a node following a registry store lists it even without a watch event: the
/// fallback for a watch that silently stopped delivering (a replaced directory, a proxy
/// that drops idle streams). Rare, since a listing of a large store is not free.
pub const REGISTRY_POLL_INTERVAL: Duration = Duration::from_secs(30);

/// Each poll interval is moved by up to this many percent either way, so the nodes of a
/// fleet started together do not list the store in lockstep.
pub const REGISTRY_POLL_JITTER_PERCENT: u32 = 20;

/// Longest one store call (list, opening a watch) may take before the store counts as
/// unreachable for this attempt; keeps a hung store from holding the follower.
pub const REGISTRY_STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// Directory registry store: longest a write waits for the directory's write lock
/// (`.quiver-write.lock`, held by another node or a `quiver registry` command writing the
/// same directory) before it fails as unreachable. A write holds it for milliseconds, so
/// this only runs out when a writer is stuck; below `REGISTRY_STORE_TIMEOUT`.
pub const REGISTRY_DIR_LOCK_WAIT: Duration = Duration::from_secs(4);

/// Directory registry store: pause between two tries of a write lock another process
/// holds (the lock cannot be waited on with a deadline, so it is polled).
pub const REGISTRY_DIR_LOCK_RETRY: Duration = Duration::from_millis(20);

/// Wait before listing an unreachable store (or reopening a broken watch) again: short,
/// so a node is back within about a second of its store answering.
pub const REGISTRY_STORE_RETRY: Duration = Duration::from_secs(1);

/// Registry store: largest stored document (a server record or profile), in bytes. A real
/// record is a few KiB; this refuses a runaway value without reading it into a snapshot.
pub const REGISTRY_STORE_MAX_DOC_BYTES: usize = 256 * 1024;

/// Registry store: most documents one listing returns; more is refused with an error rather
/// than building a snapshot of unbounded size.
pub const REGISTRY_STORE_MAX_DOCS: usize = 10_000;

/// Registry store: largest answer (one listing, one batch of watch events) read from the
/// store, in bytes. Bounds the memory of a node following a store someone flooded.
pub const REGISTRY_STORE_MAX_LIST_BYTES: usize = 64 * 1024 * 1024;

/// Errors of a refused reload named in `RegistryHealth::last_reload_error`; the rest are counted. Keeps a health answer small.
pub const MAX_RELOAD_ERRORS_SHOWN: usize = 8;

/// Audit log lines waiting for the writer thread. Observers are called on the task's path,
/// so a full queue drops lines (counted, and reported as an `audit_dropped` line) rather
/// than slow tasks down; at a few hundred bytes a line this is at most a few MiB.
pub const AUDIT_QUEUE_CAPACITY: usize = 8192;

/// Largest argument text whose values the audit log keeps for a server with
/// `audit_arguments = true`; a larger call is logged with its keys and size only.
pub const AUDIT_ARGUMENT_VALUES_MAX_BYTES: usize = 16 * 1024;

/// Most audit log bytes held for a file that refuses writes (a full disk) before further
/// lines are dropped and counted.
pub const AUDIT_BUFFER_BYTES: usize = 1024 * 1024;

/// Longest [`Host::shutdown`](crate::Host::shutdown) waits for the audit log to be written
/// out, and dropping the log waits for its writer; a disk that stalls longer must not hold
/// the stop.
pub const AUDIT_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest `traceparent` accepted (a later W3C version may append fields to the 55
/// bytes of version 00; anything longer is refused as malformed).
pub const MAX_TRACEPARENT_BYTES: usize = 256;

/// Longest `tracestate` passed on; W3C lets a vendor drop one that is longer.
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// Longest text a span attribute holds (a model name, an error type, a session id): the
/// rest is cut, so a hostile server or backend cannot make spans large.
pub const MAX_SPAN_ATTRIBUTE_BYTES: usize = 256;

/// Most finish reasons (one per choice) a model request's span lists.
pub const MAX_SPAN_FINISH_REASONS: usize = 8;

/// Longest guest log line kept; the rest is cut with a marker.
pub const MAX_LOG_LINE_BYTES: usize = 16 * 1024;

/// Guest output waiting for the host's stderr (`log` lines and the guest's own stderr
/// writes, in one queue that keeps their order), in bytes of memory (each line's or
/// write's bytes plus its bookkeeping, so empty lines count too), across all tasks of the
/// process. One thread writes it so no hostcall or WASI write waits on a slow stderr; past
/// this, lines and writes are dropped and the count is reported on stderr instead.
pub const GUEST_STDERR_QUEUE_BYTES: usize = 1024 * 1024;

/// Longest `quiver run` waits, before it exits, for queued guest output (`log` lines and
/// stderr writes) to reach a slow stderr; also the longest a host log line waits for the
/// guest output queued before it, so it keeps its place after that output.
pub const GUEST_STDERR_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest line of a server's stderr kept in the host log.
pub const MAX_SERVER_STDERR_LINE_BYTES: usize = 4 * 1024;

/// Tasks running at once: the pooling allocator reserves one instance, linear memory, table
/// and fiber stack per running task, and admission control never starts more. 5000 lets a
/// 2-core host run 10 000 tasks that each wait 3 s on I/O in two waves, under 10 s (a
/// waiting task costs about 40 KiB of resident memory, see BENCHMARKS.md). Each slot
/// reserves about 4 GiB of address space and no memory until used: 5000 slots take 20 TiB
/// of the 128 TiB a process may address, so about six such hosts fit in one process.
/// `HostBuilder::with_max_concurrent_tasks`, `[tasks] max_concurrent`.
pub const MAX_CONCURRENT_TASKS: u32 = 5000;

/// Tasks that may wait for a running slot when all are taken; one more gets
/// `HostError::Busy` at once. A waiting task holds no slot and no guest memory, only its
/// caller's future, so the queue can be deep. `HostBuilder::with_task_queue_capacity`,
/// `[tasks] queue_capacity`.
pub const TASK_QUEUE_CAPACITY: u32 = 16 * 1024;

/// Longest time a task waits in the queue for a running slot before it gets
/// `HostError::Busy`; its own `limits.deadline_ms` bounds the wait too. Long enough for a
/// full queue of I/O-bound tasks to drain, short enough that a scheduler learns of an
/// overloaded host. `HostBuilder::with_task_queue_timeout`, `[tasks] queue_timeout_ms`.
pub const TASK_QUEUE_TIMEOUT: Duration = Duration::from_secs(60);

/// Address space reserved per running task for its linear memory: all a 32-bit memory can
/// address, so compiled guests need no bounds checks. Reserved, not committed.
pub const TASK_MEMORY_RESERVATION: u64 = 4 * 1024 * 1024 * 1024;

/// Unmapped guard after each task's memory reservation; accesses at a static offset below
/// it need no bounds check.
pub const TASK_MEMORY_GUARD: u64 = 32 * 1024 * 1024;

/// Bytes of each task slot's fiber stack, and at most as many of its linear memory, reset
/// in place (memset) when a task ends instead of given back to the kernel; the rest is
/// given back. A task that stays within them (an empty task touches a few KiB of stack; a
/// task waiting on an MCP call about 12 KiB, its request running off the fiber) starts the
/// next one on pages that are already mapped: no TLB flush across cores when it ends, no
/// page faults when the next starts. The cost is memory: every stack a task has used keeps
/// this much resident (memset touches it all), and it is in the peak of a burst of waiting
/// tasks; 8 KiB keeps that below what a waiting task's stack holds anyway (BENCHMARKS.md,
/// issue 25). `[tasks] keep_resident_bytes`, `HostBuilder::with_keep_resident`; 0 gives
/// everything back.
pub const TASK_KEEP_RESIDENT: usize = 8 * 1024;

/// Fiber stack of a running task: the guest's own stack (wasmtime's 512 KiB) plus room for
/// the host code of async hostcalls, which runs on it. Only touched pages are resident.
pub const TASK_STACK_BYTES: usize = 2 * 1024 * 1024;

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

/// Largest response body read from an LLM backend; a larger one is
/// `llm_response_too_large`, read no further. Also the largest response a replay
/// transcript may hold.
pub const LLM_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Base URL of `kind = "anthropic"` backends that set none (`/messages` is appended).
pub const ANTHROPIC_DEFAULT_BASE_URL: &str = "https://api.anthropic.com/v1";

/// Model of `kind = "anthropic"` backends that set neither `default_model` nor
/// `ANTHROPIC_MODEL`.
pub const ANTHROPIC_DEFAULT_MODEL: &str = "claude-sonnet-4-5";

/// The `anthropic-version` header: the API version whose wire format the translation speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `max_tokens` of an Anthropic request whose session set none: the API requires one, and
/// this fits every current model's output limit.
pub const ANTHROPIC_MAX_TOKENS: u32 = 4096;

/// Longest base64 string (bytes) of one image sent to a model; a longer one reaches it as
/// a text note. The Anthropic API's limit is 5 MB of base64, not of decoded bytes.
pub const LLM_IMAGE_MAX_BASE64_BYTES: usize = 5 * 1024 * 1024;

/// Images one Anthropic request carries at most: the newest this many of the conversation
/// go as images, older ones as text notes. With more than 20 the API lowers every image's
/// size limit (to 2000 px a side), and a session re-sends its images on every turn.
pub const ANTHROPIC_MAX_IMAGES_PER_REQUEST: usize = 20;

/// Base64 bytes of images one Anthropic request carries at most (newest first, like
/// [`ANTHROPIC_MAX_IMAGES_PER_REQUEST`]): the API refuses requests over 32 MB, and this
/// leaves the rest for text.
pub const ANTHROPIC_MAX_IMAGE_BYTES_PER_REQUEST: usize = 20 * 1000 * 1000;

/// Longest tool call id (bytes) sent back to an Anthropic model as is; a longer, invalid
/// (not `^[a-zA-Z0-9_-]+$`) or repeated one is replaced by `toolu_quiver_<n>`. Real ids
/// are about 30 bytes; without a bound a model's 8 MiB id would be echoed every turn.
pub const ANTHROPIC_TOOL_ID_MAX_BYTES: usize = 128;

/// Images one OpenAI Responses or Gemini request carries at most, newest first (as
/// [`ANTHROPIC_MAX_IMAGES_PER_REQUEST`]): a session re-sends its images on every turn.
pub const LLM_MAX_IMAGES_PER_REQUEST: usize = 20;

/// Base64 bytes of images one OpenAI Responses request carries at most, newest first: the
/// API takes 50 MB of images per request, and this leaves room for the rest.
pub const RESPONSES_MAX_IMAGE_BYTES_PER_REQUEST: usize = 20 * 1000 * 1000;

/// The least `max_output_tokens` the Responses API takes; a smaller `max_tokens` is raised
/// to it rather than refused.
pub const RESPONSES_MIN_OUTPUT_TOKENS: u64 = 16;

/// Longest tool call id (bytes) sent back to an OpenAI Responses or Gemini model as is; a
/// longer, invalid (not `^[a-zA-Z0-9_-]+$`) or repeated one is replaced by
/// `call_quiver_<n>`.
pub const LLM_TOOL_ID_MAX_BYTES: usize = 64;

/// Models a stateless `kind = "openai_responses"` backend asks for encrypted reasoning items
/// (carried to the next turn of a send), as `reasoning_models` patterns; OpenAI refuses the
/// request for models without reasoning.
pub const RESPONSES_REASONING_MODELS: &[&str] = &["o1*", "o3*", "o4*", "gpt-5*", "codex-*"];

/// Base URL of `kind = "gemini"` backends that set none.
pub const GEMINI_DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com/v1beta";

/// Model of `kind = "gemini"` backends that set neither `default_model` nor `GEMINI_MODEL`.
pub const GEMINI_DEFAULT_MODEL: &str = "gemini-2.5-flash";

/// Gemini models that take images inside a function response (Gemini 3; Gemini 2 answers
/// 400), as `image_result_models` patterns; others get a text note.
pub const GEMINI_IMAGE_RESULT_MODELS: &[&str] = &["gemini-3*"];

/// Base64 bytes of images one Gemini request carries at most, newest first: the API refuses
/// requests over 20 MB, and this leaves the rest for text.
pub const GEMINI_MAX_IMAGE_BYTES_PER_REQUEST: usize = 14 * 1000 * 1000;

/// Model requests per `cchat_send` with AUTO_TOOL_CALL (session param `max_iterations`).
pub const CHAT_MAX_ITERATIONS: u32 = 8;

/// Tool calls per `cchat_send` (session param `max_total_tool_calls`).
pub const CHAT_MAX_TOTAL_TOOL_CALLS: u32 = 32;

/// Largest `max_iterations` a session may set; a larger SET_PARAM is clamped to it.
pub const CHAT_MAX_ITERATIONS_CAP: u32 = 64;

/// Largest `max_total_tool_calls` a session may set; a larger SET_PARAM is clamped to it.
pub const CHAT_MAX_TOTAL_TOOL_CALLS_CAP: u32 = 1024;

/// Tool calls one model reply may ask for at once, whatever the session params say; more
/// end the send like `max_total_tool_calls`. Bounds the results one turn holds at once.
pub const MAX_TOOL_CALLS_PER_TURN: u32 = 128;

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

/// Shortest time an OAuth access token is cached, whatever `expires_in` says: an
/// `expires_in` of 0 or 1 would otherwise make every MCP request fetch a new token. A token
/// that really expires sooner is replaced once the server answers 401.
pub const OAUTH_TOKEN_MIN_LIFETIME: Duration = Duration::from_secs(10);

/// Token lifetime assumed when the token response has no `expires_in` (RFC 6749 makes it
/// optional): an hour, the common default of authorization servers; a token revoked
/// earlier is replaced on the server's 401.
pub const OAUTH_TOKEN_DEFAULT_LIFETIME: Duration = Duration::from_secs(60 * 60);

/// How long before its expiry a cached token is replaced, so a request does not leave with
/// a token that expires on the way: 30 s, or a tenth of a shorter token's lifetime.
pub const OAUTH_TOKEN_REFRESH_MARGIN: Duration = Duration::from_secs(30);

/// Characters of a token endpoint's `error` code kept in an error message. Real codes
/// (`invalid_client`, `invalid_scope`) are under 30; a hostile server's long text is cut.
pub const OAUTH_ERROR_CODE_MAX_CHARS: usize = 100;

/// Longest one OAuth request (protected-resource or authorization-server metadata, token
/// endpoint) may take, body included: a metadata server that trickles bytes cannot hold a
/// connect past it. rmcp suggests the same 30 s.
pub const OAUTH_HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest the whole OAuth metadata discovery of one server may take: the probe, the
/// protected-resource and authorization-server documents, each capped at
/// [`OAUTH_HTTP_TIMEOUT`]. A healthy discovery takes well under a second; without this, a
/// server answering each of its ten or so requests just in time would hold that server's
/// token lock (and every call waiting on it) for minutes.
pub const OAUTH_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest a caller whose refresh of a user grant failed waits for another caller's
/// refreshed tokens to appear in the grant store (two nodes of a fleet refreshing at once;
/// with rotating refresh tokens the authorization server refuses the second). The winner
/// saves within a round trip to the store; a refresh token that was really refused costs
/// this much before the call fails.
pub const GRANT_REFRESH_RACE_WAIT: Duration = Duration::from_secs(2);

/// Longest revoking a grant's tokens at its authorization server (RFC 7009) may take:
/// discovery and the two requests. The grant is forgotten locally whatever happens; this
/// bounds how long `quiver mcp logout` or `DELETE /v1/authorizations/...` waits for a slow
/// or hostile authorization server.
pub const OAUTH_REVOCATION_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a failed OAuth discovery is remembered: calls to that server meanwhile fail at
/// once with the same error instead of each running discovery again; the first call after
/// it tries again. Short, so a fixed authorization server is picked up quickly.
pub const OAUTH_DISCOVERY_RETRY_AFTER: Duration = Duration::from_secs(10);

/// Largest OAuth response body read (metadata documents, token responses); a larger one
/// fails discovery or the token request. Real documents are a few KiB; rmcp caps at 1 MiB.
pub const OAUTH_MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// Lifetime of a `private_key_jwt` client assertion (its `exp` minus `iat`): one token
/// request, with room for clock skew; 300 s as rmcp and most authorization servers use.
pub const OAUTH_CLIENT_ASSERTION_LIFETIME: Duration = Duration::from_secs(300);

/// Times one request is retried with a new token after a 403 `insufficient_scope` asks for
/// more scopes (client credentials: a new token with the union of scopes). One is what
/// the spec's step-up needs; more would let a server make the host loop.
pub const OAUTH_STEP_UP_ATTEMPTS: u32 = 1;

/// Most OAuth scopes one token request asks for: what a server's challenge or metadata
/// may add when `scopes` is not configured, and `scopes` plus `step_up_scopes` when they
/// are. Real clients need a handful; without a cap, each 403 naming new scopes would grow
/// the request for the connection's whole life.
pub const OAUTH_MAX_SCOPES: usize = 64;

/// Largest `private_key_file` read (a PKCS#8 PEM key is under 4 KiB even for RSA-4096).
/// Bytes of a failed authorization step's error shown (in errors, logs and to guests):
/// enough for rmcp's message and an OAuth error code, not an authorization server's page.
pub const OAUTH_FLOW_ERROR_MAX_BYTES: usize = 400;

/// Largest grant file the directory grant store reads: a grant is a registration and a
/// token response, a few KiB.
pub const GRANT_MAX_BYTES: u64 = 64 * 1024;

pub const OAUTH_PRIVATE_KEY_MAX_BYTES: u64 = 64 * 1024;

/// Longest subject token a task may carry for token exchange (RFC 8693). ID tokens with
/// many claims run to a few KiB; this leaves room and bounds what a client can make the
/// host hold and send.
pub const MAX_SUBJECT_TOKEN_BYTES: usize = 16 * 1024;

/// Longest a tool call waits for its approval (servers with `approval_policy` `always` or
/// `policy`) before it is denied as timed out; the task's deadline bounds it too. Long
/// enough for a person to read the request and answer. Registry `approval_timeout_ms`
/// overrides it per server.
pub const APPROVAL_TIMEOUT: Duration = Duration::from_secs(300);

/// Approvals an [`ApprovalQueue`](crate::approval::ApprovalQueue) holds waiting for a
/// decision; one more is denied at once. Bounds the memory a flood of calls can pin and
/// keeps the list a person reads short.
pub const APPROVAL_QUEUE_CAPACITY: usize = 256;

/// One task may hold at most this fraction (1/N, at least one request) of an
/// [`ApprovalQueue`](crate::approval::ApprovalQueue)'s capacity; its next request is denied
/// at once. A guest looping over calls that need approval then cannot fill the queue and
/// starve every other task of approvals.
pub const APPROVAL_QUEUE_TASK_SHARE_DIVISOR: usize = 4;

/// Characters of an unknown approval id quoted back in an error (the id may come from an
/// HTTP client; real ids are 17).
pub const MAX_APPROVAL_ID_CHARS_SHOWN: usize = 64;

/// [`ApprovalQueue`](crate::ApprovalQueue): ids of requests that stopped waiting (decided,
/// timed out, task ended) remembered, so a late decision is told "too late"
/// ([`ApprovalError::NoLongerWaiting`](crate::ApprovalError::NoLongerWaiting)) rather than
/// "unknown". A few ids of 17 bytes each; the oldest is forgotten first.
pub const APPROVAL_QUEUE_ENDED_IDS: usize = 1024;

/// Bytes of an approver's reason kept (it may come from an HTTP client); the rest is cut.
pub const MAX_APPROVAL_REASON_BYTES: usize = 512;

/// Bytes of an answer line [`TerminalApprover`](crate::approval::TerminalApprover) reads
/// (`y`, `yes`, anything else denies); the rest of a longer line is ignored, so a stuck key
/// cannot grow the buffer.
pub const MAX_TERMINAL_ANSWER_BYTES: usize = 256;

/// Distinct tool labels the tool-call metrics keep per server id (guest tools, with
/// `server_id=""`, have their own bucket); calls of any other tool are counted under
/// `tool="_other"` of their server. Tool names come from servers, guests and models: without
/// a cap a server listing thousands of tools (or a guest calling made-up names through an
/// `allowed_tools = ["*"]` record) would grow every scrape without bound. Per server, so one
/// guest or server cannot use up the others' series; the registry bounds the server ids.
/// 100 covers the tools of real servers; each series costs a few KiB of histogram buckets.
pub const MAX_METRIC_TOOL_SERIES: usize = 100;

/// Upper bounds, in seconds, of the tool-call duration histogram's buckets: from a fast
/// local call (5 ms) to the default `tool_timeout_ms` and beyond.
pub const METRIC_DURATION_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds, in bytes, of the tool-output histogram's buckets: 64 B to the default
/// `max_tool_output_bytes` (1 MiB), by factors of 4.
pub const METRIC_OUTPUT_BUCKETS: [f64; 8] = [
    64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
];

/// Recent answered calls per MCP server whose latencies give its health's p50/p95.
/// 256 × 4 bytes per server; enough for a stable p95 and recent enough to follow change.
pub const SERVER_LATENCY_WINDOW: usize = 256;

/// How long a server-side failure (a lost connection, a timeout, a JSON-RPC error) keeps a
/// connected server's health `degraded`.
pub const SERVER_DEGRADED_FOR: Duration = Duration::from_secs(60);

/// Longest part of an error kept as `last_error` in a server's health, in bytes (cut at a
/// character boundary, then escaped by [`crate::text::printable`], which can lengthen it);
/// errors can quote whatever a server wrote.
pub const MAX_SERVER_ERROR_BYTES: usize = 512;

/// Longest text of an error saying a model's answer has another shape than a completion,
/// in bytes: serde's text quotes a misplaced string whole, and an answer may be
/// [`LLM_MAX_RESPONSE_BYTES`] long.
pub const MAX_SHAPE_ERROR_BYTES: usize = 512;

/// Tool names a connection test ([`Host::probe_server`](crate::Host::probe_server)) shows:
/// a summary for a person, not the listing (`GET .../tools` gives all of them). Keeps the
/// answer small whatever the server lists.
pub const PROBE_TOOL_NAMES: usize = 20;

/// Times a DPoP request (token or MCP) is made again with the nonce a `use_dpop_nonce`
/// answer gives (RFC 9449 §8, §9): one is what a nonce needs; more would let a server that
/// keeps asking make the host loop.
pub const DPOP_NONCE_RETRIES: u32 = 1;

/// Largest `DPoP-Nonce` the host sends back; a server's longer one is refused.
pub const DPOP_MAX_NONCE_BYTES: usize = 512;

/// `input_required` rounds (SEP-2322) one `tools/call`, `prompts/get` or `resources/read`
/// may take before the host fails it (`tool_exec_failed`): a server that keeps asking would
/// otherwise hold the call until its timeout. rmcp and the other SDKs use 10.
pub const MAX_INPUT_ROUNDS: usize = 10;

/// Input requests one `input_required` answer may carry; more fail the call. A server needs
/// a few (a question, the roots); hundreds would make the host ask its approver hundreds
/// of times.
pub const MAX_INPUT_REQUESTS: usize = 16;

/// Longest wait before retrying an `input_required` answer that asked for nothing (only
/// `requestState`: the server sheds load); the wait starts at 50 ms and doubles.
pub const INPUT_STATE_ONLY_BACKOFF_MAX: Duration = Duration::from_millis(1_000);

/// Largest elicitation schema (`requestedSchema` as JSON) the host passes to whoever
/// answers; a larger one is declined. The spec's schemas are flat forms of a few fields.
pub const MAX_ELICITATION_SCHEMA_BYTES: usize = 64 * 1024;

/// Fields one elicitation form may have; more is declined.
pub const MAX_ELICITATION_FIELDS: usize = 64;

/// Longest elicitation `message` shown to an approver, in bytes (cut at a character
/// boundary, then made printable).
pub const MAX_ELICITATION_MESSAGE_BYTES: usize = 4 * 1024;

/// Largest elicitation answer (`content` as JSON) the host sends a server; a larger one is
/// declined instead.
pub const MAX_ELICITATION_ANSWER_BYTES: usize = 64 * 1024;

/// Largest answer a guest's elicitation callback may write (`mcp_elicit_fn`): the content
/// cap plus room for its `id` and `action`; a larger one is declined.
pub const MAX_GUEST_ELICIT_ANSWER_BYTES: u32 = MAX_ELICITATION_ANSWER_BYTES as u32 + 1024;

/// Roots one task may declare to its MCP servers (`roots`); a server needs a few.
pub const MAX_TASK_ROOTS: usize = 16;

/// Longest root URI a task may declare, in bytes.
pub const MAX_ROOT_URI_BYTES: usize = 1024;

/// Longest root name a task may declare, in bytes.
pub const MAX_ROOT_NAME_BYTES: usize = 256;

/// Smallest arena `mcp_elicit_fn` takes: room for a small question and its answer. A
/// question that does not fit the guest's arena is declined.
pub const MIN_ELICIT_ARENA_BYTES: u32 = 4096;

/// Longest a request on a 2025-era Streamable HTTP session waits for the session's
/// standalone GET stream to open (once per session): a server may send its questions
/// during a call there, and a question sent before the stream is open is lost.
pub const COMMON_STREAM_WAIT: Duration = Duration::from_millis(500);

/// Shortest wait between two `tasks/get` polls of a server's task (the tasks extension,
/// SEP-2663), whatever `pollIntervalMs` the server asks for (`0` included): a task is
/// never polled in a busy loop.
pub const TASK_POLL_INTERVAL_MIN: Duration = Duration::from_millis(50);

/// Longest wait between two polls, whatever the server asks for: a huge `pollIntervalMs`
/// cannot park a call past this between looks (the call's timeout still ends it).
pub const TASK_POLL_INTERVAL_MAX: Duration = Duration::from_secs(5);

/// The wait between polls when the server suggests none.
pub const TASK_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Longest task id (`taskId`) the host accepts from a server; a longer or empty one fails
/// the call (and is not polled). Ids are server-minted handles, a UUID or so.
pub const MAX_SERVER_TASK_ID_BYTES: usize = 256;

/// Longest task `statusMessage` passed to observers (cut at a character boundary, then
/// made printable).
pub const MAX_TASK_STATUS_MESSAGE_BYTES: usize = 1024;

/// Status changes of one server task reported to observers (and the audit log); later
/// ones are only logged, so a server that changes its message at every poll cannot flood
/// them.
pub const MAX_TASK_STATUS_REPORTS: usize = 32;

/// How long a `tasks/cancel` for a task the host gave up on (a timeout, the guest's call
/// or the task ended) may take; it is sent in the background, best effort.
pub const TASK_CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest `maxTokens` a server's sampling request may ask for when its record's
/// `[sampling]` sets no `max_tokens`; a larger one is refused.
pub const SAMPLING_MAX_TOKENS: u32 = 4_096;

/// Sampling requests one task answers for one server when its record's `[sampling]` sets
/// no `max_requests`; more are refused.
pub const SAMPLING_MAX_REQUESTS: u32 = 16;

/// Tokens (prompt and completion, over every server) a task's sampling may use; a task's
/// `mcp.sampling_max_tokens` can only lower it. Before a request the host reserves its
/// `maxTokens` and an estimate of its prompt, and refuses it when they do not fit.
pub const SAMPLING_TASK_MAX_TOKENS: u64 = 100_000;

/// Messages one sampling request may hold; more are refused before anything is built.
pub const SAMPLING_MAX_MESSAGES: usize = 256;

/// Bytes one sampling request's messages, system prompt, tools and stop sequences may
/// hold together (text, base64 image and audio data, tool inputs and schemas as JSON);
/// more are refused before anything is built.
pub const SAMPLING_MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;

/// Tools one sampling request may offer the model (SEP-1577); more are refused.
pub const SAMPLING_MAX_TOOLS: usize = 64;

/// Stop sequences one sampling request may give; more are refused.
pub const SAMPLING_MAX_STOP_SEQUENCES: usize = 16;

/// Prompt tokens a sampling request's image or audio block is reckoned at before the
/// backend reports what it used (a typical image costs one to two thousand).
pub const SAMPLING_MEDIA_TOKENS: u64 = 1_500;

/// Longest backend or model name a registry record's `[sampling]` may give, in bytes.
pub const MAX_MODEL_NAME_BYTES: usize = 256;
