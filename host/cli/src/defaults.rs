//! The `quiver` command's own tunables, declared once with their unit and reason; the
//! library's are in [`quiver::defaults`], a node's in [`quiver_node::defaults`].

use std::time::Duration;

/// Time `quiver mcp status --node` waits for the node's answer; also the default
/// `--timeout` of `quiver registry` commands (the whole command, node or store).
pub const CLI_NODE_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest answer `quiver mcp status --node` reads from a node.
pub const CLI_NODE_MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// `quiver registry`: largest bundle file `put` reads, and largest answer read from a node's
/// admin API: as much as one store listing may hold (`REGISTRY_STORE_MAX_LIST_BYTES`), so
/// any registry a node serves fits, and a hostile node cannot make the CLI hold more.
pub const CLI_REGISTRY_MAX_BYTES: usize = quiver::defaults::REGISTRY_STORE_MAX_LIST_BYTES;

/// Characters of a node's error body `quiver mcp status --node` quotes (controls removed):
/// enough for a JSON error naming its field, not a whole page of HTML.
pub const CLI_NODE_MAX_ERROR_CHARS: usize = 500;

/// How long `quiver mcp login` (and `--open-with`) waits for the browser to come back from
/// the authorization server, and for the `--open-with` command to exit.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(300);

/// Redirects to the loopback listener kept until a flow reads them; more are dropped (a
/// flow needs one).
pub const LOGIN_CALLBACKS_QUEUED: usize = 4;
