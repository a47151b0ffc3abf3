//! Guest log lines: the guest's own output.
//!
//! The host shows each line as written on the guest's stderr (its captured stderr when the
//! task's output is captured), and notes it in its own log with the task id and level. The level functions ([`info`], ..)
//! ignore failures, so that logging never changes a guest's control flow; use [`write()`]
//! to see them.
//!
//! ```no_run
//! use quiver_guest::log;
//!
//! log::info("starting");
//! log::warn(&format!("retrying after {} ms", 250));
//! ```

use crate::buffer::{arg, check};
use crate::{Result, sys};

/// A log level, as the `level` argument of the `log` hostcall.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i32)]
pub enum Level {
    /// `0`
    Trace = 0,
    /// `1`
    Debug = 1,
    /// `2`
    Info = 2,
    /// `3`
    Warn = 3,
    /// `4`
    Error = 4,
}

/// Writes `msg` at `level`, reporting the host's error if there is one.
pub fn write(level: Level, msg: &str) -> Result<()> {
    let op = "log()";
    let (ptr, len) = arg(op, msg.as_bytes())?;
    // SAFETY: `msg` is readable for `len` bytes during the call.
    let ret = unsafe { sys::log(level as i32, ptr, len) };
    check(|| op.to_owned(), ret).map(drop)
}

/// Writes `msg` at trace level.
pub fn trace(msg: &str) {
    let _ = write(Level::Trace, msg);
}

/// Writes `msg` at debug level.
pub fn debug(msg: &str) {
    let _ = write(Level::Debug, msg);
}

/// Writes `msg` at info level.
pub fn info(msg: &str) {
    let _ = write(Level::Info, msg);
}

/// Writes `msg` at warn level.
pub fn warn(msg: &str) {
    let _ = write(Level::Warn, msg);
}

/// Writes `msg` at error level.
pub fn error(msg: &str) {
    let _ = write(Level::Error, msg);
}
