//! Every tunable default of a node (its HTTP listener, task API, admin API and etcd store),
//! declared once with its unit and the reason for it. `[serve]` in `quiver.toml` overrides
//! most of them; the library's own tunables are in [`quiver::defaults`].

use std::time::Duration;

/// etcd registry store: longest any one call (list, get, put, delete, opening a watch)
/// waits for etcd, connecting included; then it fails as unreachable, so a node that lost
/// etcd keeps serving its last snapshot instead of hanging.
pub const ETCD_CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// etcd registry store: HTTP/2 ping interval while a watch is open, so a watch on a
/// silently dead peer (no FIN, no RST) ends instead of waiting forever. etcd answers pings
/// more often than its `--grpc-keepalive-min-time` (5 s), or pings with no stream open,
/// by closing the connection; so this is above it and idle connections are not pinged.
pub const ETCD_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// etcd registry store: an unanswered ping after this long closes the connection.
pub const ETCD_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// `[etcd]`: largest CA, certificate or key file read (a PEM bundle of a few CAs fits).
pub const ETCD_MAX_PEM_BYTES: u64 = 1024 * 1024;

/// etcd registry store: most documents one checked write ([`RegistryStore::apply`], e.g.
/// an import) makes. They go in one transaction with the write guard, and etcd refuses a
/// transaction of more than `--max-txn-ops` operations (128 by default): 127 documents plus
/// the guard. A larger set is refused before it is sent (split the import).
///
/// [`RegistryStore::apply`]: quiver::registry::RegistryStore::apply
pub const ETCD_MAX_TXN_WRITES: usize = 127;

/// `quiver serve`: time running tasks get to finish after SIGTERM or SIGINT before the
/// rest are cancelled. Long enough for a short tool-using task, short enough for a
/// rolling restart. `[serve] drain_grace_ms`.
pub const SERVE_DRAIN_GRACE: Duration = Duration::from_secs(30);

/// `quiver serve`: largest module upload (`PUT /v1/modules/{sha256}`); a larger body is
/// `413` and read no further. Real guests are a few MiB. `[serve] max_module_bytes`.
pub const SERVE_MAX_MODULE_BYTES: u64 = 64 * 1024 * 1024;

/// `quiver serve`: compiled modules kept at once; one more evicts the least recently used
/// (tasks already holding it keep running). `[serve] max_modules`.
pub const SERVE_MAX_MODULES: u32 = 64;

/// `quiver serve`: memory the stored modules may take together, each counted as its
/// compiled image plus its upload size; one more module evicts the least recently used,
/// and a module larger than this alone is refused (`413 module_too_large`). Uploads are
/// kept nowhere else (not in the host's module cache, not on disk), so this is the
/// store's real bound. `[serve] max_module_store_bytes`.
pub const SERVE_MAX_MODULE_STORE_BYTES: u64 = 512 * 1024 * 1024;

/// `quiver serve`: largest `POST /v1/tasks` body. A task is a few KiB of JSON.
/// `[serve] max_request_bytes`.
pub const SERVE_MAX_REQUEST_BYTES: u64 = 1024 * 1024;

/// `quiver serve`: tasks the node holds at once, queued, running and finished together;
/// a submission past it (with no finished task left to forget) is `429`. With
/// [`SERVE_MAX_OUTPUT_BYTES`] this bounds kept output to 1024 x 2 x 64 KiB = 128 MiB.
/// `[serve] max_tasks`.
pub const SERVE_MAX_TASKS: u32 = 1024;

/// `quiver serve`: bytes of each of a task's stdout and stderr the node keeps for
/// `GET /v1/tasks/{id}`; the rest is cut and flagged. `[serve] max_output_bytes`.
pub const SERVE_MAX_OUTPUT_BYTES: u64 = 64 * 1024;

/// `quiver serve`: how long a finished task's result stays readable. `[serve]
/// finished_ttl_ms`.
pub const SERVE_FINISHED_TTL: Duration = Duration::from_secs(15 * 60);

/// `quiver serve`: longest `?wait=SECONDS` long-poll; a larger wait is cut to it so no
/// request holds a connection for long. `[serve] max_wait_ms`.
pub const SERVE_MAX_WAIT: Duration = Duration::from_secs(60);

/// `quiver serve`: time a client has to send a request body; a slower one gets `408`.
/// `[serve] body_timeout_ms`.
pub const SERVE_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// `quiver serve`: time a client has to send a request's headers, and to send the next
/// request on a kept-alive connection; then the connection is closed. Stops clients from
/// holding connections by sending slowly. `[serve] header_timeout_ms`.
pub const SERVE_HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// `quiver serve`: HTTP connections open at once; more wait in the kernel's backlog. Each
/// costs a task and a few KiB; long-polls hold one each. `[serve] max_connections`.
pub const SERVE_MAX_CONNECTIONS: usize = 1024;

/// `quiver serve`: module uploads read and compiled at once; one more gets `429` rather
/// than holding another up to [`SERVE_MAX_MODULE_BYTES`] in memory and another core busy
/// compiling. Two keep one slow upload from blocking every other.
pub const SERVE_CONCURRENT_UPLOADS: usize = 2;

/// `quiver serve`: wait after an accept error that is not the client's (out of fds, out of
/// memory) before accepting again, so the loop does not spin while the cause lasts.
pub const SERVE_ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// `quiver serve`: HTTP connections one client address holds at once (IPv6 counted per
/// /64, the block one host gets); one more is closed at once. Without it one client could
/// take all [`SERVE_MAX_CONNECTIONS`] with idle keep-alives to `/healthz`, which needs no
/// token. Behind a proxy every client is the proxy's address: raise it there.
/// `[serve] max_connections_per_ip`.
pub const SERVE_MAX_CONNECTIONS_PER_IP: usize = 64;

/// `quiver serve`: largest read buffer of one HTTP connection, which bounds the request
/// line and headers (hyper's default is about 400 KiB, times [`SERVE_MAX_CONNECTIONS`]
/// 400 MiB). 16 KiB fits any real request head (nginx allows 8 KiB by default); bodies
/// stream through it. Hyper's floor is 8 KiB.
pub const SERVE_MAX_BUF_BYTES: usize = 16 * 1024;

/// `quiver serve`: time in-flight HTTP requests get to finish once a drained node stops
/// listening.
pub const SERVE_HTTP_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// `quiver serve`: `Retry-After` (seconds) sent with `429` and `503` answers.
pub const SERVE_RETRY_AFTER_SECS: u64 = 1;

/// `quiver serve`: largest `POST /v1/approvals/{id}` body, in bytes. A decision is a bool
/// and a reason cut to [`MAX_APPROVAL_REASON_BYTES`]; this leaves room for JSON escapes
/// (`\uXXXX` is 6 bytes per character) and refuses anything bigger unread.
pub const SERVE_MAX_DECISION_BYTES: u64 = 16 * 1024;

/// Admin API: most records one `POST servers/import` may hold. The set is checked and
/// written as one, so this bounds an import's time; a bigger registry is imported in parts
/// (on etcd, an import changes at most [`ETCD_MAX_TXN_WRITES`] records).
pub const ADMIN_IMPORT_MAX_DOCS: usize = 500;

/// `[clients.NAME]`: longest client name. Names go into audit lines, logs and the admin
/// page, so they are short and plain.
pub const MAX_CLIENT_NAME_BYTES: usize = 64;

/// User authorization through the node (`POST /v1/authorizations/...`): how long a flow
/// waits for the person's browser to come back to `/oauth/callback`; its `state` expires
/// with it. Long enough to log in with a second factor. `[serve] authorization_timeout_ms`.
pub const AUTHORIZATION_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// User authorization through the node: flows waiting for a browser at once (one per
/// server and principal; a new one for the same pair replaces the old). One more is `429`,
/// so nobody can fill the node with pending flows.
pub const AUTHORIZATION_MAX_PENDING: usize = 64;

/// User authorization through the node: flows one client may have waiting for a browser
/// at once, so one client (or its leaked token) cannot take every place of
/// [`AUTHORIZATION_MAX_PENDING`] from the others.
pub const AUTHORIZATION_MAX_PENDING_PER_CLIENT: usize = 16;

/// User authorization through the node: longest a start waits for the authorization
/// URL (discovery and registration at the authorization server take up to the library's
/// `OAUTH_DISCOVERY_TIMEOUT`, 30 s, plus a registration request).
pub const AUTHORIZATION_START_TIMEOUT: Duration = Duration::from_secs(65);

/// User authorization through the node: longest the callback page waits for the code to
/// be exchanged for tokens before it answers (the token request has its own 30 s bound).
pub const AUTHORIZATION_FINISH_TIMEOUT: Duration = Duration::from_secs(45);

/// User authorization through the node: bytes of an authorization server's `error` and
/// `error_description` shown on the callback page (escaped), enough for a sentence.
pub const AUTHORIZATION_ERROR_MAX_BYTES: usize = 300;

/// Trace export: spans waiting to be sent; past it spans are dropped and counted
/// (`quiver_telemetry_spans_dropped_total`) so a slow collector never slows a task.
/// `[telemetry] max_queue_size`.
pub const TELEMETRY_MAX_QUEUE: usize = 4096;

/// Trace export: the largest `max_queue_size` accepted (a span is a few KiB at most).
pub const TELEMETRY_MAX_QUEUE_LIMIT: usize = 1 << 20;

/// Trace export: most spans in one export request.
pub const TELEMETRY_MAX_BATCH: usize = 512;

/// Trace export: longest a span waits for its batch to fill before it is sent.
pub const TELEMETRY_BATCH_DELAY: Duration = Duration::from_secs(1);

/// Trace export: longest one export request takes. `[telemetry] export_timeout_ms`.
pub const TELEMETRY_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Trace export: the largest `export_timeout_ms` accepted.
pub const TELEMETRY_EXPORT_TIMEOUT_MAX: Duration = Duration::from_secs(60);

/// Trace export: longest `quiver run` and `quiver serve` wait at exit for the last spans
/// to be sent; an unreachable collector holds the exit no longer.
pub const TELEMETRY_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);

/// Trace export: longest text attribute, event or span name sent; the rest is cut.
pub const TELEMETRY_MAX_ATTRIBUTE_BYTES: usize = 4096;

/// Trace export: longest `service.name`.
pub const TELEMETRY_MAX_SERVICE_NAME_BYTES: usize = 256;

/// The WebSocket subprotocol of a task's user streams (SPEAR's).
pub const STREAM_SUBPROTOCOL: &str = "spear.stream.v1";

/// Frames a stream client may send per second (a burst of as many is allowed); one more
/// closes its WebSocket with 1008.
pub const STREAM_MAX_FRAMES_PER_SEC: u32 = 500;

/// A stream WebSocket with no frame either way for this long is closed (1001).
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// How long a closing stream WebSocket waits to hand the client its close frame and to
/// read until the client's close reply.
pub const STREAM_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a stream session lasts after its task ended, for the client to read what the
/// guest wrote last; then it ends, read or not.
pub const STREAM_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// What a stream WebSocket buffers for a client before its sends wait on the socket: one
/// frame's worth, so a client that never reads holds the guest's writes in the task's
/// bounded queue, not here.
pub const STREAM_WRITE_BUFFER_BYTES: usize = 64 * 1024;
