//! `wall_time_s`, `sleep_ms` and `random_i64`, as SPEAR has them.
//!
//! `sleep_ms` waits on the async runtime, never a thread, and never past the task's
//! deadline: a sleep that would end after it ends the task at the deadline, as any waiting
//! hostcall does; a cancelled task drops the sleep with it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::rand::{SecureRandom, SystemRandom};
use wasmtime::{Caller, Linker};

use super::{SandboxView, before_deadline};

pub(super) fn add_to_linker<T: SandboxView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.func_wrap("spear", "wall_time_s", || -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    })?;
    linker.func_wrap("spear", "random_i64", || -> i64 {
        let mut bytes = [0u8; 8];
        // The system's generator does not fail on the platforms the host runs on; if it did,
        // the guest would get 0, never host memory.
        let _ = SystemRandom::new().fill(&mut bytes);
        i64::from_le_bytes(bytes)
    })?;
    linker.func_wrap_async(
        "spear",
        "sleep_ms",
        |mut caller: Caller<'_, T>, (ms,): (i32,)| {
            Box::new(async move {
                let sandbox = caller.data_mut().sandbox();
                let span = tracing::trace_span!("sleep_ms", task_id = %sandbox.task_id, ms);
                // A negative time is no time, as a zero one.
                let time = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
                let slept = before_deadline(sandbox.deadline, tokio::time::sleep(time));
                match tracing::Instrument::instrument(slept, span).await {
                    Ok(()) => Ok(()),
                    Err(super::HostcallError::Trap(error)) => Err(error),
                    Err(super::HostcallError::Errno(_)) => Ok(()),
                }
            })
        },
    )?;
    Ok(())
}
