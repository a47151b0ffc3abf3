//! `log` and `time_now_ms`.

use std::time::{SystemTime, UNIX_EPOCH};

use quiver_abi::{Errno, log_level};
use wasmtime::{Caller, Linker};

use super::{HostcallError, SandboxView, finish, guest};
use crate::defaults;

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

/// A guest log line, at level 0 trace .. 4 error, into the host log with the task id.
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
    let cut = if text.len() > defaults::MAX_LOG_LINE_BYTES {
        let mut end = defaults::MAX_LOG_LINE_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        &text[..end]
    } else {
        text
    };
    let marker = if cut.len() < text.len() { " [cut]" } else { "" };
    let task_id = &*state.sandbox().task_id;
    match level {
        log_level::TRACE => tracing::trace!(target: "quiver::guest", task_id, "{cut}{marker}"),
        log_level::DEBUG => tracing::debug!(target: "quiver::guest", task_id, "{cut}{marker}"),
        log_level::INFO => tracing::info!(target: "quiver::guest", task_id, "{cut}{marker}"),
        log_level::WARN => tracing::warn!(target: "quiver::guest", task_id, "{cut}{marker}"),
        _ => tracing::error!(target: "quiver::guest", task_id, "{cut}{marker}"),
    }
    Ok(0)
}
