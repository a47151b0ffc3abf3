//! `log` and `time_now_ms`. Where a `log` line goes is [`super::guest_log`]'s business.

use std::time::{SystemTime, UNIX_EPOCH};

use quiver_abi::{Errno, log_level};
use wasmtime::{Caller, Linker};

use super::guest_log::GuestLogSink;
use super::{HostcallError, SandboxView, finish, guest};
use crate::{defaults, text};

pub(super) fn add_to_linker<T: SandboxView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "spear",
        "log",
        |mut caller: Caller<'_, T>, level: i32, ptr: i32, len: i32| {
            finish(log(&mut caller, level, ptr, len))
        },
    )?;
    linker.func_wrap("spear", "time_now_ms", || -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    })?;
    Ok(())
}

/// A guest log line, at level 0 trace .. 4 error: the guest's own output where its
/// [`GuestLogSink`] says, and a host log event with the task id.
fn log<T: SandboxView>(
    caller: &mut Caller<'_, T>,
    level: i32,
    ptr: i32,
    len: i32,
) -> Result<i32, HostcallError> {
    if !(log_level::TRACE..=log_level::ERROR).contains(&level) {
        return Err(Errno::EINVAL.into());
    }
    let (mem, state) = guest(caller)?;
    let text = mem.str(ptr, len)?;
    let cut = text::cut(text, defaults::MAX_LOG_LINE_BYTES);
    let marker = if cut.len() < text.len() { " [cut]" } else { "" };
    let sandbox = state.sandbox();
    let task_id = &*sandbox.task_id;
    if let GuestLogSink::Tracing = sandbox.guest_log {
        match level {
            log_level::TRACE => tracing::trace!(target: "quiver::guest", task_id, "{cut}{marker}"),
            log_level::DEBUG => tracing::debug!(target: "quiver::guest", task_id, "{cut}{marker}"),
            log_level::INFO => tracing::info!(target: "quiver::guest", task_id, "{cut}{marker}"),
            log_level::WARN => tracing::warn!(target: "quiver::guest", task_id, "{cut}{marker}"),
            _ => tracing::error!(target: "quiver::guest", task_id, "{cut}{marker}"),
        }
        return Ok(0);
    }
    // Shown on stderr already: the host log keeps it below the levels it shows by default.
    if level == log_level::TRACE {
        tracing::trace!(target: "quiver::guest", task_id, level, "{cut}{marker}");
    } else {
        tracing::debug!(target: "quiver::guest", task_id, level, "{cut}{marker}");
    }
    let line = if marker.is_empty() {
        std::borrow::Cow::Borrowed(cut)
    } else {
        std::borrow::Cow::Owned(format!("{cut}{marker}"))
    };
    sandbox.guest_log.write(&line).map_err(|_| Errno::ENOMEM)?;
    Ok(0)
}
