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

#[cfg(test)]
mod tests {
    use quiver_abi::{IMPORTS, ValType};
    use wasmtime::{Engine, Linker, Module};

    use super::add_to_linker;
    use crate::runtime::TaskState;

    /// A module importing every `spear` function of the ABI crate with `result` as the
    /// type of `time_now_ms`.
    fn importer(time_result: &str) -> String {
        let imports: String = IMPORTS
            .iter()
            .map(|import| {
                let params = " i32".repeat(import.params.len());
                let result = match (import.name, import.result) {
                    ("time_now_ms", _) => time_result,
                    (_, ValType::I32) => "i32",
                    (_, ValType::I64) => "i64",
                };
                format!(
                    "(import \"spear\" \"{}\" (func (param{params}) (result {result})))\n",
                    import.name
                )
            })
            .collect();
        format!("(module {imports} (memory (export \"memory\") 1))")
    }

    #[test]
    fn the_host_defines_every_import_with_the_abi_signature() {
        let engine = Engine::default();
        let mut linker = Linker::<TaskState>::new(&engine);
        add_to_linker(&mut linker).unwrap();
        let module = Module::new(&engine, importer("i64")).unwrap();
        linker
            .instantiate_pre(&module)
            .expect("every ABI import resolves with its signature");
        let wrong = Module::new(&engine, importer("i32")).unwrap();
        assert!(
            linker.instantiate_pre(&wrong).is_err(),
            "a signature mismatch must be caught"
        );
    }
}
