//! Errno values: SPEAR's numbering, which is Linux's.

use core::fmt;

/// A guest-visible error number; hostcalls return its negation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Errno(i32);

macro_rules! errnos {
    ($($name:ident = $value:literal, $meaning:literal;)*) => {
        impl Errno {
            $(
                #[doc = concat!("`", $value, "`: ", $meaning, ".")]
                pub const $name: Errno = Errno($value);
            )*

            /// Every errno the ABI defines, in value order.
            pub const ALL: &'static [Errno] = &[$(Errno::$name),*];

            /// The symbolic name (`"ENOENT"`), if the ABI defines this value.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($value => Some(stringify!($name)),)*
                    _ => None,
                }
            }

            /// What the value means for a hostcall, if the ABI defines it.
            pub const fn meaning(self) -> Option<&'static str> {
                match self.0 {
                    $($value => Some($meaning),)*
                    _ => None,
                }
            }
        }
    };
}

errnos! {
    EPERM = 1, "not permitted by host configuration";
    ENOENT = 2, "unknown name, e.g. an MCP server id the registry does not have";
    EIO = 5, "malformed JSON argument, internal or upstream protocol failure";
    EBADF = 9, "not an open fd, or an fd of another kind";
    EAGAIN = 11, "try again: a nonblocking call's answer is not there yet";
    ENOMEM = 12, "the task's host memory budget is spent, or an input is over 16 MiB";
    EACCES = 13, "denied by policy (registry, profile, task or session layer)";
    EFAULT = 14, "pointer or length outside guest memory";
    EINVAL = 22, "invalid argument: bad level, invalid UTF-8, unknown command";
    EMFILE = 24, "the task's fd table is full";
    ENOSPC = 28, "output buffer too small";
    EPIPE = 32, "the peer went away";
    ENOSYS = 38, "no such hostcall: not running under a Quiver host (the SDKs' native stand-ins), or hardware the host lacks (`mic_*`, `rtasr_*`)";
    ENOTCONN = 107, "the backing service is not connected or cannot be started";
    ETIMEDOUT = 110, "a timeout passed";
}

impl Errno {
    /// Wraps a positive errno value (defined by the ABI or not).
    pub const fn from_raw(errno: i32) -> Errno {
        Errno(errno)
    }

    /// The positive number.
    pub const fn raw(self) -> i32 {
        self.0
    }

    /// What a hostcall returns for this error.
    pub const fn ret(self) -> i32 {
        -self.0
    }

    /// `Some(errno)` for a negative hostcall return value, `None` for success (`>= 0`).
    pub const fn from_ret(ret: i32) -> Option<Errno> {
        if ret < 0 {
            Some(Errno(ret.saturating_neg()))
        } else {
            None
        }
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "Errno({})", self.0),
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.0)?,
            None => return write!(f, "errno {}", self.0),
        }
        match self.meaning() {
            Some(meaning) => write!(f, ": {meaning}"),
            None => Ok(()),
        }
    }
}

impl core::error::Error for Errno {}
