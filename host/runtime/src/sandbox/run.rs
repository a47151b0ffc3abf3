//! Running one instance to its end: the store with its limits and deadline, the entry
//! call, and what the way it ended means (exit code, trap, deadline).

use std::time::Duration;

use tracing::Instrument;
use wasmtime::{InstancePre, Store, UpdateDeadline};
use wasmtime_wasi::I32Exit;

use super::{DeadlineExceeded, Runtime, SandboxSetupError, SandboxView};
use crate::defaults;

/// Why a task ended without a normal exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskFailure {
    /// The guest trapped (including a memory-limit trap); the message has the wasm
    /// backtrace and the cause.
    Trap(String),
    /// The task's wall-clock deadline passed.
    Deadline(Duration),
}

impl std::fmt::Display for TaskFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskFailure::Trap(message) => write!(f, "the guest trapped: {message}"),
            TaskFailure::Deadline(after) => {
                write!(
                    f,
                    "the task's deadline of {} ms passed (limits.deadline_ms)",
                    after.as_millis()
                )
            }
        }
    }
}

/// How an instance's run ended.
pub struct TaskRun {
    /// The guest's exit status; 124 after a deadline and 134 after a trap, as shells do.
    pub exit_code: i32,
    pub failure: Option<TaskFailure>,
}

impl<T: SandboxView> Runtime<T> {
    /// The store a task runs in: `data` with its limits and its deadline. Built apart from
    /// [`Runtime::run`] so the task's state never sits in a future (each waiting task's
    /// future is on the heap for as long as it waits).
    pub fn store(&self, mut data: T) -> Store<T> {
        let deadline = data.sandbox().deadline;
        let mut store = Store::new(self.engine(), data);
        store.limiter(|state| &mut state.sandbox().limits);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if deadline.passed() {
                Err(wasmtime::Error::new(deadline.exceeded()))
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        store
    }

    /// Instantiates `pre` in `store` and calls `entry` (a `() -> ()` export) until it
    /// returns, traps or the deadline passes. An `Err` means the task could not start.
    pub async fn run(
        &self,
        pre: &InstancePre<T>,
        mut store: Store<T>,
        entry: &str,
        span: tracing::Span,
    ) -> Result<TaskRun, SandboxSetupError> {
        let deadline = store.data_mut().sandbox().deadline;
        // No driver for a start function: one that makes MCP requests runs them inline.
        let instance = pre
            .instantiate_async(&mut store)
            .instrument(span.clone())
            .await
            .map_err(|source| SandboxSetupError::Instantiate { source })?;
        let memory = instance.get_memory(&mut store, "memory");
        let sandbox = store.data_mut().sandbox();
        sandbox.memory = memory;
        sandbox.instance = Some(instance);
        let off_fiber = sandbox.off_fiber.clone();
        let func = instance
            .get_typed_func::<(), ()>(&mut store, entry)
            .map_err(|source| SandboxSetupError::NoEntry {
                entry: entry.to_owned(),
                source,
            })?;
        // Epochs and hostcall races stop the task at its deadline; this outer bound only
        // matters if something between them never yields.
        let grace = defaults::EPOCH_TICK * 50;
        let run = off_fiber.drive(func.call_async(&mut store, ()).instrument(span));
        let result = tokio::time::timeout_at(deadline.instant() + grace, run).await;
        let (exit_code, failure) = match result {
            Ok(Ok(())) => (0, None),
            Ok(Err(error)) => classify(error),
            Err(_) => (124, Some(TaskFailure::Deadline(deadline.budget()))),
        };
        Ok(TaskRun { exit_code, failure })
    }
}

fn classify(error: wasmtime::Error) -> (i32, Option<TaskFailure>) {
    if let Some(exit) = error.downcast_ref::<I32Exit>() {
        return (exit.0, None);
    }
    if let Some(deadline) = error.downcast_ref::<DeadlineExceeded>() {
        return (124, Some(TaskFailure::Deadline(deadline.after)));
    }
    // `{:#}` is the wasm backtrace and the cause chain; `{:?}` would add the host's own Rust
    // backtrace, whose symbolisation costs every trapping task tens of MB and much time.
    (134, Some(TaskFailure::Trap(format!("{error:#}"))))
}
