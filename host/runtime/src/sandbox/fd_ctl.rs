//! `spear_fd_ctl`: SPEAR's generic fd controls, for every kind of fd.
//!
//! SET_FLAGS takes `{"set": [...], "clear": [...]}` (both optional) with flag names; the
//! one flag is `O_NONBLOCK`, and any other name, key or shape is `-EINVAL` (SPEAR ignores
//! unknown names; a typo here would silently leave a call blocking). The GET commands
//! answer JSON with the output buffer protocol: GET_FLAGS `{"flags": [...]}`, GET_KIND
//! `{"kind": "..."}`, GET_STATUS `{"kind", "flags", "poll_mask", "closed"}`, GET_METRICS
//! the fd's metrics (`{}` for kinds without).

use quiver_abi::epoll_events::{ERR, HUP, IN, OUT};
use quiver_abi::{Errno, fd_ctl};
use serde::Deserialize;
use serde_json::json;
use wasmtime::{Caller, Linker};

use super::epoll::EpollFd;
use super::fd::O_NONBLOCK;
use super::poll::Pollable;
use super::{HostcallError, SandboxView, finish, guest};

/// The one flag name, as SPEAR spells it.
const NONBLOCK: &str = "O_NONBLOCK";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetFlags {
    #[serde(default)]
    set: Vec<String>,
    #[serde(default)]
    clear: Vec<String>,
}

pub(super) fn add_to_linker<T>(linker: &mut Linker<T>) -> wasmtime::Result<()>
where
    T: SandboxView,
    T::Fd: EpollFd,
{
    linker
        .func_wrap(
            "spear",
            "spear_fd_ctl",
            |mut caller: Caller<'_, T>, fd: i32, cmd: i32, arg_ptr: i32, arg_len_ptr: i32| {
                finish(ctl(&mut caller, fd, cmd, arg_ptr, arg_len_ptr))
            },
        )
        .map(|_| ())
}

/// The flag names of `flags`.
fn flag_names(flags: u32) -> Vec<&'static str> {
    if flags & O_NONBLOCK != 0 {
        vec![NONBLOCK]
    } else {
        Vec::new()
    }
}

fn ctl<T>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    cmd: i32,
    arg_ptr: i32,
    arg_len_ptr: i32,
) -> Result<i32, HostcallError>
where
    T: SandboxView,
    T::Fd: EpollFd,
{
    let (mut mem, state) = guest(caller)?;
    let sandbox = state.sandbox();
    let _span = tracing::debug_span!("spear_fd_ctl", task_id = %sandbox.task_id, fd, cmd).entered();
    let flags = sandbox.fds.flags(fd)?;
    if cmd == fd_ctl::SET_FLAGS {
        let input = mem.bytes_at_len_ptr(arg_ptr, arg_len_ptr)?;
        let (value, _parsed) = sandbox
            .budget
            .parse_json("SET_FLAGS input", input)
            .map_err(|errno| match errno {
                // Input that is not JSON is a bad argument, as in SPEAR.
                Errno::EIO => Errno::EINVAL,
                other => other,
            })?;
        let change = SetFlags::deserialize(value).map_err(|error| {
            tracing::info!(%error, "spear_fd_ctl SET_FLAGS: the input must be {{\"set\": [names], \"clear\": [names]}}");
            Errno::EINVAL
        })?;
        let mut new = flags;
        for (names, set) in [(&change.set, true), (&change.clear, false)] {
            for name in names {
                if name != NONBLOCK {
                    tracing::info!(
                        flag = %crate::text::cut(name, 64),
                        "spear_fd_ctl SET_FLAGS: unknown flag; the only flag is O_NONBLOCK"
                    );
                    return Err(Errno::EINVAL.into());
                }
                if set {
                    new |= O_NONBLOCK;
                } else {
                    new &= !O_NONBLOCK;
                }
            }
        }
        sandbox.fds.set_flags(fd, new)?;
        return Ok(0);
    }
    if !(fd_ctl::GET_FLAGS..=fd_ctl::GET_METRICS).contains(&cmd) {
        return Err(Errno::EINVAL.into());
    }
    let out = mem.out_buf(arg_ptr, arg_len_ptr)?;
    let kind = sandbox.fds.get_mut(fd)?;
    let answer = match cmd {
        fd_ctl::GET_FLAGS => json!({ "flags": flag_names(flags) }),
        fd_ctl::GET_KIND => json!({ "kind": kind.kind_name() }),
        fd_ctl::GET_STATUS => {
            let ready = kind.readiness();
            let poll_mask: Vec<&str> = [
                (IN, "EPOLLIN"),
                (OUT, "EPOLLOUT"),
                (ERR, "EPOLLERR"),
                (HUP, "EPOLLHUP"),
            ]
            .into_iter()
            .filter(|(bit, _)| ready & bit != 0)
            .map(|(_, name)| name)
            .collect();
            json!({
                "kind": kind.kind_name(),
                "flags": flag_names(flags),
                "poll_mask": poll_mask,
                // An fd that is closed is not in the table: its calls are -EBADF.
                "closed": false,
            })
        }
        fd_ctl::GET_METRICS => {
            let metrics = kind.metrics();
            return Ok(mem.deliver(out, metrics.as_deref().unwrap_or(b"{}"))?);
        }
        _ => unreachable!("checked above"),
    };
    let bytes = serde_json::to_vec(&answer).map_err(|_| Errno::EIO)?;
    Ok(mem.deliver(out, &bytes)?)
}
