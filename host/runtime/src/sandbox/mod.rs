//! The sandbox: the engine, the compiled-module cache, each task's store with its limits,
//! deadline, fd table, guest memory and WASI grants.
//!
//! It knows no hostcall's meaning. Capabilities (MCP, chat) reach a task's sandbox through
//! [`SandboxView`], the way wasmtime-wasi's `WasiView` does: the host's store data
//! implements it, so each capability borrows only what it needs and the borrow checker
//! keeps guest memory and task state apart.
//!
//! Each task's [`MemoryBudget`] lives here too: capabilities charge it through the same view
//! for the host state a guest grows, and [`heap`] says what that state costs.

mod absent;
mod background;
mod budget;
mod cache;
mod capture;
mod clock;
mod deadline;
mod epoll;
mod fd;
mod fd_ctl;
mod guest_log;
mod guest_memory;
pub mod heap;
mod hostcall;
mod memory;
mod misc;
mod off_fiber;
mod poll;
mod run;
mod runtime;
mod wasi;

use std::sync::Arc;

use wasmtime::{AsContextMut, Caller, Func, Instance, Linker, Memory, Ref, Table, TypedFunc};
use wasmtime_wasi::p1::WasiP1Ctx;

use guest_log::GuestLogSink;

pub use background::{Background, BackgroundWork};
pub use budget::{Charge, HostMemory, HostMemoryStatus, HostMemoryUse, MemoryBudget};
pub use capture::CapturedOutput;
pub use deadline::{Deadline, DeadlineExceeded};
pub use epoll::{EpollFd, EpollSet};
#[cfg(test)]
pub(crate) use fd::FD_STATE_BYTES;
pub use fd::{FdKindOf, FdTable};
pub use guest_log::flush_guest_stderr;
pub use guest_memory::{
    GuestMemoryExhausted, GuestMemoryHold, GuestMemoryStatus, GuestMemoryTotal,
};
pub use hostcall::{HostcallError, before_deadline, finish, off_stack};
pub use memory::{GuestMemory, OutBuf, guest};
pub use off_fiber::{HandedOff, OffFiber};
pub use poll::{Pollable, ReadySignal};
pub use run::TaskFailure;
pub use runtime::{ModuleOrigin, Runtime, RuntimeOptions, default_cache_dir};
pub(crate) use wasi::Grants;
pub use wasi::{GuestLogs, Preopen, SandboxSetupError};

/// One task's sandbox: everything of a store that is not a capability's.
pub struct Sandbox<K> {
    pub task_id: Arc<str>,
    pub deadline: Deadline,
    /// The host memory this task's guest may make the host hold (`limits.host_memory_bytes`).
    pub budget: MemoryBudget,
    pub fds: FdTable<K>,
    /// The guest's exported memory, looked up once after instantiation.
    pub memory: Option<Memory>,
    /// The guest's instance, set once it is instantiated.
    pub instance: Option<Instance>,
    /// The guest's funcref table (for guest tools), looked up when a guest tool is first
    /// called: most tasks call none, and finding a table exported under another name than
    /// the usual two walks every export.
    funcref_table: Option<Option<Table>>,
    /// The callback [`guest_callback`] typed last, by the address of its function
    /// reference: that address names one function, of one type, for the store's life, so
    /// a guest that registers and calls the same tool send after send has it typed once
    /// (typing takes the engine's type-registry lock).
    last_callback: Option<(usize, GuestCallback)>,
    /// Guest tools running now, one inside another (each holds a fiber stack of the host's
    /// shared pool); at most [`MAX_GUEST_TOOL_NESTING`](crate::defaults::MAX_GUEST_TOOL_NESTING).
    pub guest_tool_depth: u32,
    /// Permits of the host's share of stacks for guest tools ([`guest_tool_stacks`]) that
    /// this task's store holds: one per guest tool running, plus one for the stack wasmtime
    /// keeps cached in the store after a guest tool returns (until the task ends). Dropped
    /// with the store, after wasmtime has given the stacks back.
    ///
    /// [`guest_tool_stacks`]: crate::defaults::guest_tool_stacks
    pub guest_tool_stacks: Vec<tokio::sync::OwnedSemaphorePermit>,
    /// The task's background work, and the signal that wakes its `spear_epoll_wait`.
    pub work: BackgroundWork,
    /// Requests its hostcalls run off its fiber stack.
    pub off_fiber: OffFiber,
    /// Open epoll sets, at most [`MAX_EPOLL_SETS`](crate::defaults::MAX_EPOLL_SETS).
    epoll_sets: usize,
    /// Where the guest's `log` lines go.
    guest_log: GuestLogSink,
    /// `None` for a module that imports no WASI.
    wasi: Option<WasiP1Ctx>,
    limits: guest_memory::Limits,
}

impl<K> Sandbox<K> {
    /// Enters a call back into the guest (a guest tool, an elicitation callback) at
    /// nesting `depth`: it runs on a fiber stack of the host's shared pool, so it needs a
    /// permit of `stacks` unless the task holds one for the stack wasmtime kept cached in
    /// the store after an earlier call. `false` when every permit is taken.
    pub fn enter_guest_call(&mut self, depth: u32, stacks: &Arc<tokio::sync::Semaphore>) -> bool {
        if self.guest_tool_stacks.len() <= depth as usize {
            let Ok(permit) = stacks.clone().try_acquire_owned() else {
                return false;
            };
            self.guest_tool_stacks.push(permit);
        }
        self.guest_tool_depth = depth + 1;
        true
    }

    /// Leaves a call entered with [`Self::enter_guest_call`]. Its stack stays cached in the
    /// store (replacing any cached before), so its permit stays with the task: `depth`
    /// calls running plus one.
    pub fn leave_guest_call(&mut self, depth: u32) {
        self.guest_tool_depth = depth;
        self.guest_tool_stacks.truncate(depth as usize + 1);
    }
}

/// A call back into the guest: `(args_ptr, args_len, out_ptr, out_len_ptr) -> rc`.
pub type GuestCallback = TypedFunc<(i32, i32, i32, i32), i32>;

/// The guest function at `table_index` of the task's funcref table, if it has the type of
/// a call back into the guest, `(i32, i32, i32, i32) -> i32` (guest tools and elicitation
/// callbacks, `docs/abi.md`). Looked up at each call, as the guest may change its table.
pub fn guest_callback<T: SandboxView>(
    caller: &mut Caller<'_, T>,
    table_index: u32,
) -> Option<GuestCallback> {
    if !is_guest_callback(caller, table_index) {
        return None;
    }
    let sandbox = caller.data_mut().sandbox();
    sandbox
        .last_callback
        .as_ref()
        .map(|(_, callback)| callback.clone())
}

/// Whether [`guest_callback`] finds a callback at `table_index`; typed here, unless it is
/// the one typed last, and kept as the last one.
pub fn is_guest_callback<T: SandboxView>(caller: &mut Caller<'_, T>, table_index: u32) -> bool {
    let Some((address, func)) = table_func(caller, table_index) else {
        return false;
    };
    if matches!(&caller.data_mut().sandbox().last_callback, Some((known, _)) if *known == address) {
        return true;
    }
    let Ok(callback) = func.typed(&*caller) else {
        return false;
    };
    caller.data_mut().sandbox().last_callback = Some((address, callback));
    true
}

/// The function at `table_index` of the task's funcref table, with the address of its
/// function reference.
fn table_func<T: SandboxView>(
    caller: &mut Caller<'_, T>,
    table_index: u32,
) -> Option<(usize, Func)> {
    let sandbox = caller.data_mut().sandbox();
    let table = match sandbox.funcref_table {
        Some(table) => table,
        None => {
            let instance = sandbox.instance?;
            let table = funcref_table(&instance, &mut *caller);
            caller.data_mut().sandbox().funcref_table = Some(table);
            table
        }
    }?;
    match table.get(&mut *caller, u64::from(table_index))? {
        Ref::Func(Some(func)) => Some((func.to_raw(&mut *caller) as usize, func)),
        _ => None,
    }
}

/// The table guest tools are called through: `__indirect_function_table`, else `table`,
/// else the first exported table.
fn funcref_table(instance: &Instance, mut store: impl AsContextMut) -> Option<Table> {
    for name in ["__indirect_function_table", "table"] {
        if let Some(table) = instance.get_table(&mut store, name) {
            return Some(table);
        }
    }
    instance
        .exports(&mut store)
        .find_map(|export| export.into_table())
}

/// Store data that has a sandbox; every capability's view builds on it.
pub trait SandboxView: Send + 'static {
    /// What the fd table holds (the host's `FdKind`).
    type Fd: Send;
    fn sandbox(&mut self) -> &mut Sandbox<Self::Fd>;
}

/// The sandbox's own imports: WASI preview 1, `log`, the clocks, `sleep_ms`, `random_i64`
/// and the `-ENOSYS` stand-ins for SPEAR's `mic_*` and `rtasr_*`.
pub fn add_to_linker<T: SandboxView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    // Only a module that imports WASI can call it, and such a task got its context at start;
    // an empty one (nothing granted) keeps this total.
    wasmtime_wasi::p1::add_to_linker_async(linker, |state: &mut T| {
        state.sandbox().wasi.get_or_insert_with(|| {
            tracing::error!("a task without a WASI context called WASI; it gets an empty one");
            wasmtime_wasi::WasiCtxBuilder::new().build_p1()
        })
    })?;
    misc::add_to_linker(linker)?;
    clock::add_to_linker(linker)?;
    absent::add_to_linker(linker)
}

/// `spear_epoll_*` and `spear_fd_ctl`, for a store whose fd kinds report their readiness
/// and can hold an epoll set.
pub fn add_fd_to_linker<T>(linker: &mut Linker<T>) -> wasmtime::Result<()>
where
    T: SandboxView,
    T::Fd: EpollFd,
{
    epoll::add_to_linker(linker)?;
    fd_ctl::add_to_linker(linker)
}

#[cfg(test)]
mod funcref_table_tests {
    use wasmtime::{Engine, Instance, Module, Store};

    use super::funcref_table;

    fn exported(tables: &str) -> (Store<()>, Instance) {
        let engine = Engine::default();
        let module = Module::new(&engine, format!("(module {tables})")).unwrap();
        let mut store = Store::new(&engine, ());
        let instance = Instance::new(&mut store, &module, &[]).unwrap();
        (store, instance)
    }

    #[test]
    fn the_usual_name_wins_then_any_exported_table() {
        let (mut store, instance) = exported(
            r#"(table (export "other") 1 funcref) (table (export "__indirect_function_table") 2 funcref)"#,
        );
        let table = funcref_table(&instance, &mut store).unwrap();
        assert_eq!(table.size(&store), 2);
        let (mut store, instance) = exported(r#"(table (export "funcs") 3 funcref)"#);
        let table = funcref_table(&instance, &mut store).unwrap();
        assert_eq!(table.size(&store), 3);
        let (mut store, instance) = exported(r#"(memory (export "memory") 1)"#);
        assert!(funcref_table(&instance, &mut store).is_none());
    }
}
