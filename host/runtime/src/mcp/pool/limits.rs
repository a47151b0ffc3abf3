//! The pool's host-wide limits and the host config's `[mcp]` section that sets them.

use std::time::Duration;

use serde::Deserialize;

use crate::defaults;

/// Host-wide limits of the MCP pool; every field has its [`defaults`] value by default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolLimits {
    /// MCP calls in flight at once across the host.
    pub max_concurrent_calls: usize,
    /// Stdio server processes running at once.
    pub max_server_processes: usize,
    /// A stdio server with no call for this long is stopped; zero means never. A record's
    /// `stdio.idle_timeout_ms` overrides it.
    pub server_idle_timeout: Duration,
}

impl Default for PoolLimits {
    fn default() -> Self {
        Self {
            max_concurrent_calls: defaults::MAX_CONCURRENT_MCP_CALLS,
            max_server_processes: defaults::MAX_SERVER_PROCESSES,
            server_idle_timeout: defaults::SERVER_IDLE_TIMEOUT,
        }
    }
}

/// The host config's `[mcp]` section (`quiver.toml`). Absent fields keep the defaults;
/// [`HostBuilder`](crate::HostBuilder) options override the file.
///
/// ```toml
/// [mcp]
/// max_concurrent_calls = 4096
/// max_server_processes = 64
/// server_idle_timeout_ms = 600000   # 0: never stop an idle server
/// prewarm = ["fs"]                  # started (and listed) when the host starts
///
/// [mcp.launch]                      # what stdio records may run and read (docs/registry.md)
/// commands = ["/opt/mcp/bin/*"]     # absolute paths or patterns
/// cwd = ["/srv/mcp/*"]              # working directories records may set
/// env = ["GITHUB_TOKEN", "MCP_*"]   # host variables ${ENV:..} and env_from may read
/// # unrestricted = true             # any of them: only for a registry you alone write
/// ```
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct McpHostConfig {
    pub max_concurrent_calls: Option<usize>,
    pub max_server_processes: Option<usize>,
    pub server_idle_timeout_ms: Option<u64>,
    #[serde(default)]
    pub prewarm: Vec<String>,
    /// `[mcp.launch]`: what records may run and read. Absent, the host's default applies
    /// ([`HostBuilder::with_default_launch_rules`](crate::HostBuilder::with_default_launch_rules)).
    #[serde(default)]
    pub launch: Option<crate::mcp::LaunchConfig>,
}

impl McpHostConfig {
    /// The first field that cannot be used, with the reason.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let zero = "must be greater than 0; omit it for the default";
        if self.max_concurrent_calls == Some(0) {
            return Err(("mcp.max_concurrent_calls", zero.into()));
        }
        if self.max_server_processes == Some(0) {
            return Err(("mcp.max_server_processes", zero.into()));
        }
        if let Some(bad) = self
            .prewarm
            .iter()
            .find(|id| !crate::registry::is_valid_server_id(id))
        {
            return Err((
                "mcp.prewarm",
                format!("{bad:?} is not a server id (letters, digits, `_` and `-`)"),
            ));
        }
        Ok(())
    }
}
