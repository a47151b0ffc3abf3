//! The `spear` import module: decoding, errno and buffers for every hostcall.
//!
//! Each hostcall family lives in its own file and follows one shape: open a `tracing` span
//! named after the hostcall, check policy first, read guest input through [`memory`],
//! release guest memory across any await (racing the task deadline), and write the answer
//! back through the buffer protocol. A bad argument is an errno the guest sees; only a
//! deadline or a host-level failure becomes a trap that ends the task.

mod chat;
mod errno;
mod mcp;
mod memory;
mod misc;

use wasmtime::Linker;

pub use errno::Errno;

use crate::runtime::{DeadlineExceeded, TaskContext, TaskState};

/// How a hostcall ends when it does not succeed.
pub(crate) enum HostcallError {
    /// Returned to the guest as `-errno`.
    Errno(Errno),
    /// Ends the task.
    Trap(wasmtime::Error),
}

impl From<Errno> for HostcallError {
    fn from(errno: Errno) -> Self {
        Self::Errno(errno)
    }
}

/// Turns a hostcall's result into what wasmtime expects.
fn finish(result: Result<i32, HostcallError>) -> wasmtime::Result<i32> {
    match result {
        Ok(value) => Ok(value),
        Err(HostcallError::Errno(errno)) => Ok(errno.ret()),
        Err(HostcallError::Trap(error)) => Err(error),
    }
}

/// Runs `work` unless the task's deadline passes first; epochs stop guest code, this stops
/// a hostcall that is waiting on the outside world.
async fn before_deadline<F: Future>(
    ctx: &TaskContext,
    work: F,
) -> Result<F::Output, HostcallError> {
    tokio::time::timeout_at(ctx.deadline, work)
        .await
        .map_err(|_| {
            HostcallError::Trap(wasmtime::Error::new(DeadlineExceeded {
                after: ctx.deadline_after,
            }))
        })
}

/// Registers every `spear` import.
pub(crate) fn add_to_linker(linker: &mut Linker<TaskState>) -> wasmtime::Result<()> {
    misc::add_to_linker(linker)?;
    mcp::add_to_linker(linker)?;
    chat::add_to_linker(linker)?;
    Ok(())
}
