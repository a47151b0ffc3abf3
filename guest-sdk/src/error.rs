//! Error numbers returned by hostcalls, and the crate's [`Error`] type.

use std::fmt;

/// An error number returned by a hostcall (as `-errno`), from the ABI crate where the
/// values are defined once for the host and every SDK. An unknown value is kept as is and
/// displayed as `errno N`.
///
/// ```
/// use quiver_guest::Errno;
///
/// assert_eq!(Errno::from_ret(-2), Some(Errno::ENOENT));
/// assert_eq!(Errno::from_ret(3), None);
/// assert!(Errno::ENOENT.to_string().starts_with("ENOENT (2): unknown name"));
/// ```
pub use quiver_abi::Errno;

/// The error type of every fallible call in this crate.
///
/// Each variant names the operation that failed, with its main argument, e.g.
/// `mcp_open("fs")`, so that the [`Display`](fmt::Display) output alone is a useful
/// diagnostic:
///
/// ```text
/// mcp_open("nope") failed: ENOENT (2): unknown name
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The hostcall returned `-errno`, or the SDK rejected the arguments before calling
    /// the host (then the errno is [`Errno::EINVAL`]).
    Errno {
        /// The operation, e.g. `mcp_call_tool("fs", "read_file")`.
        op: String,
        /// The error number.
        errno: Errno,
    },
    /// The host returned bytes that are not the JSON the call promises.
    Json {
        /// The operation, e.g. `mcp_list_tools("fs")`.
        op: String,
        /// The decode error.
        source: serde_json::Error,
    },
}

impl Error {
    pub(crate) fn from_errno(op: impl Into<String>, errno: Errno) -> Error {
        Error::Errno {
            op: op.into(),
            errno,
        }
    }

    pub(crate) fn from_json(op: impl Into<String>, source: serde_json::Error) -> Error {
        Error::Json {
            op: op.into(),
            source,
        }
    }

    /// The operation that failed, e.g. `mcp_open("fs")`.
    pub fn op(&self) -> &str {
        match self {
            Error::Errno { op, .. } | Error::Json { op, .. } => op,
        }
    }

    /// The error number, if the failure was a hostcall error.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Errno { errno, .. } => Some(*errno),
            Error::Json { .. } => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Errno { op, errno } => write!(f, "{op} failed: {errno}"),
            Error::Json { op, source } => write!(f, "{op} returned invalid JSON: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Errno { .. } => None,
            Error::Json { source, .. } => Some(source),
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_names_and_display() {
        assert_eq!(Errno::ENOSPC.raw(), 28);
        assert_eq!(Errno::ENOTCONN.name(), Some("ENOTCONN"));
        assert_eq!(
            Errno::ETIMEDOUT.to_string(),
            "ETIMEDOUT (110): a timeout passed"
        );
        assert_eq!(Errno::from_raw(99).to_string(), "errno 99");
        assert_eq!(format!("{:?}", Errno::EACCES), "EACCES");
        assert_eq!(format!("{:?}", Errno::from_raw(99)), "Errno(99)");
    }

    #[test]
    fn errno_from_ret() {
        assert_eq!(Errno::from_ret(0), None);
        assert_eq!(Errno::from_ret(7), None);
        assert_eq!(Errno::from_ret(-13), Some(Errno::EACCES));
        assert_eq!(Errno::from_ret(i32::MIN), Some(Errno::from_raw(i32::MAX)));
    }

    #[test]
    fn error_display() {
        let err = Error::from_errno(r#"mcp_open("fs")"#, Errno::ENOENT);
        assert_eq!(
            err.to_string(),
            r#"mcp_open("fs") failed: ENOENT (2): unknown name, e.g. an MCP server id the registry does not have"#
        );
        assert_eq!(err.op(), r#"mcp_open("fs")"#);
        assert_eq!(err.errno(), Some(Errno::ENOENT));

        let source = serde_json::from_slice::<serde_json::Value>(b"{").unwrap_err();
        let err = Error::from_json("mcp_registry_list()", source);
        assert!(
            err.to_string()
                .starts_with("mcp_registry_list() returned invalid JSON: ")
        );
        assert!(std::error::Error::source(&err).is_some());
        assert_eq!(err.errno(), None);
    }
}
