//! `mic_*` and `rtasr_*`: SPEAR's microphone and realtime speech recognition, which Quiver
//! has no hardware or service for. They are linked with SPEAR's signatures so a guest that
//! imports them instantiates, and each answers `-ENOSYS`, so the guest can fall back.

use quiver_abi::Errno;
use wasmtime::{Caller, Linker};

use super::SandboxView;

const ENOSYS: i32 = Errno::ENOSYS.ret();

fn refused<T: SandboxView>(caller: &mut Caller<'_, T>, name: &'static str) -> i32 {
    let task_id = &caller.data_mut().sandbox().task_id;
    let _span = tracing::debug_span!("absent_hostcall", task_id = %task_id, name).entered();
    tracing::debug!("{name}: this host has no microphone or speech recognition (-ENOSYS)");
    ENOSYS
}

pub(super) fn add_to_linker<T: SandboxView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    for name in ["mic_create", "rtasr_create"] {
        linker.func_wrap("spear", name, move |mut c: Caller<'_, T>| {
            refused(&mut c, name)
        })?;
    }
    for name in ["mic_ctl", "rtasr_ctl"] {
        linker.func_wrap(
            "spear",
            name,
            move |mut c: Caller<'_, T>, _fd: i32, _cmd: i32, _arg_ptr: i32, _arg_len_ptr: i32| {
                refused(&mut c, name)
            },
        )?;
    }
    // (fd, out_ptr, out_len_ptr) for the reads, (fd, buf_ptr, buf_len) for rtasr_write.
    for name in ["mic_read", "rtasr_read", "rtasr_write"] {
        linker.func_wrap(
            "spear",
            name,
            move |mut c: Caller<'_, T>, _fd: i32, _ptr: i32, _len: i32| refused(&mut c, name),
        )?;
    }
    for name in ["mic_close", "rtasr_close"] {
        linker.func_wrap("spear", name, move |mut c: Caller<'_, T>, _fd: i32| {
            refused(&mut c, name)
        })?;
    }
    Ok(())
}
