//! Logging setup: everything goes to stderr (stdout belongs to the guest), as text or as
//! JSON lines, filtered by `--log-level` (or `QUIVER_LOG`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber; `level` is a level (`info`) or a full filter
/// (`quiver=debug,rmcp=warn`). Calling it twice is harmless.
pub fn init(level: &str, format: LogFormat) {
    let (filter, bad_filter) = match EnvFilter::try_new(level) {
        Ok(filter) => (filter, None),
        Err(e) => (EnvFilter::new("warn"), Some(e)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if let Some(e) = bad_filter {
        tracing::warn!("--log-level {level:?} is not a level or filter ({e}); using warn");
    }
}
