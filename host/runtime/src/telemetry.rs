//! Logging setup: everything goes to stderr (stdout belongs to the guest), as text or as
//! JSON lines, filtered by `--log-level` (or `QUIVER_LOG`), each line after the guest
//! output queued for stderr before it.
//!
//! Every line passes through [`RedactingWriter`] on its way out, which cuts out every value
//! a registry `${ENV:..}` reference resolved to: the pool cleans its own messages, but
//! libraries (rmcp, reqwest, hyper) log on their own, at debug and trace level with URLs.
//! Library users with their own subscriber can wrap their writer the same way.
//!
//! Traces: the host opens one `task` span per task with a child for each chat send, model
//! request, MCP request, guest tool call and approval wait, named and attributed after the
//! OpenTelemetry GenAI and MCP conventions (docs/telemetry.md). The library exports
//! nothing; [`init_with`] takes the exporting layer a binary builds, and a [`Propagator`]
//! lets the host continue a caller's trace and send `traceparent` on.

use std::io::{self, IsTerminal, Write};

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::defaults;
use crate::registry::redact_known;

pub use crate::sandbox::flush_guest_stderr;
pub use crate::trace::{InvalidTraceparent, Propagator, TraceContext, set_propagator};

/// A layer beside the log (an exporter's), with its own filter.
pub type ExtraLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// Every format, by the name [`FromStr`](std::str::FromStr) reads.
    pub const NAMES: [&'static str; 2] = ["text", "json"];
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "{other:?} is not a log format; use one of {}",
                Self::NAMES.join(", ")
            )),
        }
    }
}

/// Installs the global subscriber; `level` is a level (`info`) or a full filter
/// (`quiver=debug,rmcp=warn`). Calling it twice is harmless.
pub fn init(level: &str, format: LogFormat) {
    init_with(level, format, None);
}

/// [`init`], with `extra` beside the log: it sees every span and event its own filter
/// lets through, whatever `level` says (the log's filter is the log's alone).
pub fn init_with(level: &str, format: LogFormat, extra: Option<ExtraLayer>) {
    let (filter, bad_filter) = match EnvFilter::try_new(level) {
        Ok(filter) => (filter, None),
        Err(e) => (EnvFilter::new("warn"), Some(e)),
    };
    let log = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(RedactingWriter::new(stderr_after_guest_output));
    let log: ExtraLayer = match format {
        LogFormat::Text => log.with_filter(filter).boxed(),
        LogFormat::Json => log.json().with_filter(filter).boxed(),
    };
    let layers: Vec<ExtraLayer> = std::iter::once(log).chain(extra).collect();
    let _ = tracing_subscriber::registry().with(layers).try_init();
    if let Some(e) = bad_filter {
        tracing::warn!("--log-level {level:?} is not a level or filter ({e}); using warn");
    }
}

/// The host's stderr for one log line, once the guest output queued before it is written
/// ([`flush_guest_stderr`](crate::sandbox::flush_guest_stderr)): a line such as "task
/// failed" comes after what the guest wrote before it failed.
fn stderr_after_guest_output() -> io::Stderr {
    crate::sandbox::flush_guest_stderr(defaults::GUEST_STDERR_FLUSH_TIMEOUT);
    io::stderr()
}

/// A log writer that cuts every secret resolved so far in this process
/// ([`redact_known`]) out of each line before `inner` writes it.
pub struct RedactingWriter<M> {
    inner: M,
}

impl<M> RedactingWriter<M> {
    pub fn new(inner: M) -> Self {
        Self { inner }
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for RedactingWriter<M> {
    type Writer = Redacting<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        Redacting(self.inner.make_writer())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        Redacting(self.inner.make_writer_for(meta))
    }
}

/// One line's writer of [`RedactingWriter`]. The formatter hands it a whole line at once,
/// so a secret is never split across writes.
pub struct Redacting<W>(W);

impl<W: Write> Write for Redacting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.0.write_all(redact_known(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_lose_every_resolved_secret() {
        let _secrets = crate::registry::Secrets::new(["log-secret-5e2a"]);
        let mut out = Vec::new();
        let mut writer = Redacting(&mut out);
        writer
            .write_all(b"GET http://h/?k=log-secret-5e2a failed\n")
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET http://h/?k=[redacted] failed\n"
        );
    }
}
