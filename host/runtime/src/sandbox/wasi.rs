//! The WASI grants of a task: args, env, preopens, stdin and where output goes (the guest's
//! `log` lines with its stderr, through one ordered queue when that is the host's).
//! Everything not granted by the task spec is denied.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use wasmtime::StoreLimitsBuilder;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder, WasiView};

use super::guest_log::{GuestLogSink, HostStderr};
use super::guest_memory::Limits;
use super::{
    BackgroundWork, CapturedOutput, Deadline, FdTable, GuestMemoryHold, MemoryBudget, OffFiber,
    Sandbox,
};
use crate::defaults;

/// One directory the guest may see.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Preopen {
    /// Host directory; relative paths are relative to the task file.
    pub host: PathBuf,
    /// Path the guest sees, e.g. `/data`.
    pub guest: String,
    /// When true the guest may read but not create, write or delete.
    #[serde(default)]
    pub read_only: bool,
}

/// Where a task's `log` lines go. Guests use `log` as their `printf`, so by default a line is
/// the guest's own output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GuestLogs {
    /// The guest's stderr, one line per call as written (control characters escaped): the
    /// task's captured stderr when output is captured, else the host's stderr. The host's
    /// own log gets a `debug`/`trace` event (target `quiver::guest`) for each line.
    #[default]
    Stderr,
    /// Only host log events at the guest's level (target `quiver::guest`, with the task id),
    /// for embedders that collect guest lines with their own logs.
    Tracing,
}

/// What a task's sandbox grants its guest, as the task's spec says
/// ([`TaskSpec::grants`](crate::TaskSpec)); nothing else reaches the guest.
pub(crate) struct Grants<'a> {
    /// The guest's args after its module name.
    pub(crate) args: &'a [String],
    pub(crate) env: &'a BTreeMap<String, String>,
    pub(crate) preopens: &'a [Preopen],
    pub(crate) inherit_stdin: bool,
    pub(crate) capture_output: bool,
    pub(crate) guest_logs: GuestLogs,
    pub(crate) max_fds: usize,
    pub(crate) deadline: Duration,
}

/// A task whose sandbox cannot be set up as its spec asks; names the task field at fault.
#[derive(Debug, thiserror::Error)]
pub enum SandboxSetupError {
    /// A `preopens` directory cannot be opened.
    #[error("preopens: cannot open {}: {source}", path.display())]
    Preopen {
        path: std::path::PathBuf,
        #[source]
        source: wasmtime::Error,
    },
    /// The module cannot be instantiated (e.g. an import the host does not provide).
    #[error("cannot instantiate: {source:#}")]
    Instantiate {
        #[source]
        source: wasmtime::Error,
    },
    /// The task's entry point is missing or has another type.
    #[error("the module has no export `{entry}` of type () -> (): {source:#}")]
    NoEntry {
        entry: String,
        #[source]
        source: wasmtime::Error,
    },
}

impl<K> Sandbox<K> {
    /// The sandbox `task` is granted; `argv0` is the module's name, `imports_wasi` whether it
    /// imports WASI preview 1 (else it gets no WASI context), `memory_limit` the linear
    /// memory it may grow to, `guest_memory` its share of the host's total of it, and
    /// `budget` its host memory budget. The error names the task field at fault.
    pub(crate) fn for_task(
        task: &Grants<'_>,
        argv0: &str,
        imports_wasi: bool,
        memory_limit: u64,
        guest_memory: GuestMemoryHold,
        budget: MemoryBudget,
    ) -> Result<(Self, Option<CapturedOutput>), SandboxSetupError> {
        // The budget's own copy of the id: one allocation fewer per task.
        let task_id = budget.task_id().clone();
        let captured = task.capture_output.then(|| CapturedOutput::new(&budget));
        // A module that imports no WASI never reaches a WASI context: building one (two
        // seeded random generators, the std streams, the table) was a tenth of its start.
        // Preopens are still opened, so a wrong one fails the task whatever the module.
        let wasi = if imports_wasi || !task.preopens.is_empty() {
            Some(wasi_ctx(task, argv0, captured.as_ref())?)
        } else {
            None
        };
        let guest_log = match (task.guest_logs, &captured) {
            (GuestLogs::Tracing, _) => GuestLogSink::Tracing,
            (GuestLogs::Stderr, Some(out)) => GuestLogSink::Captured(out.stderr()),
            (GuestLogs::Stderr, None) => GuestLogSink::Stderr,
        };
        let sandbox = Sandbox {
            task_id,
            deadline: Deadline::after(task.deadline),
            fds: FdTable::new(task.max_fds, &budget),
            budget,
            memory: None,
            instance: None,
            funcref_table: None,
            last_callback: None,
            guest_tool_depth: 0,
            guest_tool_stacks: Vec::new(),
            work: BackgroundWork::default(),
            off_fiber: OffFiber::default(),
            epoll_sets: 0,
            guest_log,
            wasi,
            limits: Limits {
                task: StoreLimitsBuilder::new()
                    .memory_size(usize::try_from(memory_limit).unwrap_or(usize::MAX))
                    .instances(1)
                    .trap_on_grow_failure(true)
                    .build(),
                guest_memory,
            },
        };
        Ok((sandbox, captured))
    }
}

/// The WASI context `task` grants: its args after `argv0`, env, preopens and stdin, and
/// output to `captured` or the host's (stderr through the `log` lines' queue, so the two
/// keep the guest's order).
fn wasi_ctx(
    task: &Grants<'_>,
    argv0: &str,
    captured: Option<&CapturedOutput>,
) -> Result<WasiP1Ctx, SandboxSetupError> {
    let mut wasi = WasiCtxBuilder::new();
    wasi.arg(argv0);
    for arg in task.args {
        wasi.arg(arg);
    }
    for (key, value) in task.env {
        wasi.env(key, value);
    }
    for preopen in task.preopens {
        let perms = if preopen.read_only {
            FsPerms::ReadOnly
        } else {
            FsPerms::ReadWrite
        };
        wasi.preopened_dir(&preopen.host, &preopen.guest, perms)
            .map_err(|source| SandboxSetupError::Preopen {
                path: preopen.host.clone(),
                source,
            })?;
    }
    if task.inherit_stdin {
        wasi.inherit_stdin();
    }
    match captured {
        Some(out) => {
            let (stdout, stderr) = out.pipes();
            wasi.stdout(stdout);
            wasi.stderr(stderr);
        }
        None => {
            wasi.inherit_stdout();
            wasi.stderr(HostStderr);
        }
    }
    let mut wasi = wasi.build_p1();
    // WASI's table holds every file, directory and stream the guest opens, each a real
    // host descriptor: bounded like the task's own fds, so one guest opening files in a
    // loop cannot use up the process's descriptors that every other task needs.
    let wasi_cap = task
        .max_fds
        .saturating_add(task.preopens.len())
        .saturating_add(defaults::WASI_TABLE_SLACK);
    wasi.ctx().table.set_max_capacity(wasi_cap);
    Ok(wasi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_preopen_that_cannot_be_opened_names_the_field_and_no_env_value() {
        let env = BTreeMap::from([("API_TOKEN".to_owned(), "s3cret-value".to_owned())]);
        let preopens = [Preopen {
            host: "/nonexistent/quiver-unit-test".into(),
            guest: "/data".into(),
            read_only: true,
        }];
        let grants = Grants {
            args: &[],
            env: &env,
            preopens: &preopens,
            inherit_stdin: false,
            capture_output: false,
            guest_logs: GuestLogs::Stderr,
            max_fds: 8,
            deadline: Duration::from_secs(1),
        };
        let Err(error) = Sandbox::<()>::for_task(
            &grants,
            "guest.wasm",
            false,
            1 << 20,
            crate::sandbox::GuestMemoryTotal::new(1 << 20)
                .try_reserve(0)
                .unwrap(),
            MemoryBudget::new(Arc::from("t"), 1 << 20),
        ) else {
            panic!("the preopen does not exist");
        };
        assert!(
            error
                .to_string()
                .starts_with("preopens: cannot open /nonexistent/quiver-unit-test: "),
            "{error}"
        );
        assert!(std::error::Error::source(&error).is_some());
        for text in [error.to_string(), format!("{error:?}")] {
            assert!(!text.contains("s3cret"), "{text}");
        }
    }

    fn sandbox(imports_wasi: bool, preopens: &[Preopen]) -> Sandbox<()> {
        let grants = Grants {
            args: &[],
            env: &BTreeMap::new(),
            preopens,
            inherit_stdin: false,
            capture_output: true,
            guest_logs: GuestLogs::Stderr,
            max_fds: 8,
            deadline: Duration::from_secs(1),
        };
        let total = crate::sandbox::GuestMemoryTotal::new(1 << 20);
        let budget = MemoryBudget::new(Arc::from("t"), 1 << 20);
        Sandbox::for_task(
            &grants,
            "guest.wasm",
            imports_wasi,
            1 << 20,
            total.try_reserve(0).unwrap(),
            budget,
        )
        .unwrap()
        .0
    }

    #[test]
    fn only_a_module_that_imports_wasi_or_is_granted_a_directory_gets_a_wasi_context() {
        let dir = tempfile::tempdir().unwrap();
        let preopen = Preopen {
            host: dir.path().to_owned(),
            guest: "/data".into(),
            read_only: true,
        };
        assert!(sandbox(true, &[]).wasi.is_some());
        assert!(sandbox(false, &[]).wasi.is_none());
        assert!(sandbox(false, &[preopen]).wasi.is_some());
        // The `log` lines still reach the captured stderr without one.
        assert!(matches!(
            sandbox(false, &[]).guest_log,
            GuestLogSink::Captured(_)
        ));
    }
}
