//! A stdio server's process group, from spawn until its last member is gone.
//!
//! A server runs as the leader of its own process group, so whatever it starts (the node
//! process behind `npx`, a shell's children) is stopped with it. Stopping always covers the
//! whole group, whichever member exits first: with the server's stdin closed (by the
//! transport), the leader gets [`defaults::SHUTDOWN_GRACE`] to exit; then the group gets
//! SIGTERM, another grace period, and SIGKILL. Dropping a process that was not stopped
//! SIGKILLs its group at once.
//!
//! If the host dies without cleaning up (SIGKILL, the OOM killer), two things still stop
//! the group. The leader has `PR_SET_PDEATHSIG` = SIGKILL. And each group has a watchdog: a
//! `/bin/sh` blocked reading a socket whose other end only the host holds (close-on-exec,
//! so no server inherits it). When the host dies, the read ends and the watchdog SIGKILLs
//! the group; a normal stop writes a newline first and the watchdog exits quietly. It is
//! a separate program rather than a fork of the host so that it pins none of the host's
//! memory, and it sits in its own process group so a terminal's Ctrl-C does not reach it.
//!
//! What is not covered: a member that leaves the group (`setsid`, a daemon's double fork);
//! a watchdog killed on its own, or a host without `/bin/sh` (then only the leader dies
//! with the host, and a warning says so).
//!
//! Group ids are safe to signal: the leader is reaped only by this module's own checks
//! (liveness checks while no pidfd watches it, and each stop step, try-wait it; a pidfd is
//! opened only while it is not yet reaped), after it exited, and the kernel
//! does not reuse a pid while the zombie holds it, so the id cannot name another group
//! before that. After it, the group is checked for members right before each signal.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::OwnedSemaphorePermit;

use crate::defaults;

/// A spawned server: its process group and its pipes.
pub(super) struct Spawned {
    pub(super) process: ServerProcess,
    pub(super) stdin: ChildStdin,
    pub(super) stdout: ChildStdout,
    pub(super) stderr: ChildStderr,
}

/// Spawns `cmd` as the leader of a new process group, with piped stdio, dying with the host.
/// `permit` (the pool's count of server processes) is held until the group is gone.
pub(super) fn spawn(mut cmd: Command, permit: Option<OwnedSemaphorePermit>) -> io::Result<Spawned> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    #[cfg(target_os = "linux")]
    {
        let host = std::process::id() as libc::pid_t;
        // SAFETY: the closure only calls prctl and getppid, which are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // The host may have died before the prctl; then nothing would fire.
                if libc::getppid() != host {
                    return Err(io::Error::other("the host exited during spawn"));
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn()?;
    let pgid = child
        .id()
        .and_then(|pid| libc::pid_t::try_from(pid).ok())
        .filter(|&pid| pid > 1)
        .ok_or_else(|| io::Error::other("the server exited before its pid was read"))?;
    let pipe = |what: &str| io::Error::other(format!("the server's {what} was not piped"));
    let stdin = child.stdin.take().ok_or_else(|| pipe("stdin"))?;
    let stdout = child.stdout.take().ok_or_else(|| pipe("stdout"))?;
    let stderr = child.stderr.take().ok_or_else(|| pipe("stderr"))?;
    let watchdog = match Watchdog::spawn(pgid) {
        Ok(watchdog) => Some(watchdog),
        Err(error) => {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(%error, "cannot start a watchdog for MCP server processes; if the host is killed, only each server's first process dies with it");
            }
            None
        }
    };
    Ok(Spawned {
        process: ServerProcess {
            pgid,
            state: Mutex::new(State {
                leader: Some(child),
                leader_reaped: false,
                gone: false,
            }),
            watchdog: Mutex::new(watchdog),
            permit: Mutex::new(permit),
            exit_watched: Arc::new(AtomicBool::new(false)),
        },
        stdin,
        stdout,
        stderr,
    })
}

/// Ends [`ServerProcess::exit_watched`] with the watch, however the watch ends (the
/// leader exited, the session ended first, or the task was dropped): liveness then asks
/// the kernel again.
struct Watching(Arc<AtomicBool>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

struct State {
    leader: Option<Child>,
    leader_reaped: bool,
    /// The group has no member left: nothing to signal any more.
    gone: bool,
}

/// A server's process group. Stop it with [`ServerProcess::stop`]; dropping it unstopped
/// kills the group.
pub(super) struct ServerProcess {
    /// The group's id: the leader's pid, always greater than 1.
    pgid: libc::pid_t,
    state: Mutex<State>,
    watchdog: Mutex<Option<Watchdog>>,
    /// The pool's count of this process, given back as soon as the group is gone (or
    /// SIGKILL was sent and waited for), not when the connection is dropped.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// A watch from [`exit_watch`](Self::exit_watch) is in place, until it ends: the
    /// leader's exit ends the session meanwhile, so liveness needs no `try_wait` of its own.
    exit_watched: Arc<AtomicBool>,
}

impl ServerProcess {
    /// The leader's pid.
    pub(super) fn pid(&self) -> u32 {
        self.pgid.unsigned_abs()
    }

    /// Whether the group's leader (the server itself) is not known to have exited. While
    /// its exit is watched, the watch ends the session when it exits, and the session's
    /// own check says so (within a scheduling of the watch): this then asks no syscall.
    pub(super) fn leader_running(&self) -> bool {
        if self.exit_watched.load(Ordering::Acquire) {
            return !self.state().leader_reaped;
        }
        !self.leader_exited()
    }

    /// Resolves when the leader exits, without reaping it; `None` where the kernel has
    /// no pidfd (before Linux 5.3). Lets the connection fail its calls at once when the
    /// server dies while a child of its keeps its stdout open (so no EOF comes).
    #[cfg(target_os = "linux")]
    pub(super) fn exit_watch(&self) -> Option<impl Future<Output = ()> + Send + use<>> {
        use tokio::io::Interest;
        use tokio::io::unix::AsyncFd;
        // Held until the watch is in place: a reaped leader's pid could name another process.
        let state = self.state();
        if state.leader_reaped {
            return None;
        }
        // SAFETY: pidfd_open(2) on our own child's pid; it returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pgid, 0) };
        let fd = libc::c_int::try_from(fd).ok().filter(|&fd| fd >= 0)?;
        // SAFETY: the descriptor was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: the OwnedFd moves into the AsyncFd and stays open until it is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()?;
        self.exit_watched.store(true, Ordering::Release);
        drop(state);
        let watching = Watching(self.exit_watched.clone());
        Some(async move {
            let _watching = watching;
            let _ = fd.readable().await;
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn exit_watch(&self) -> Option<std::future::Ready<()>> {
        None
    }

    /// Stops the whole group: waits `grace` for the leader to exit (its stdin is closed
    /// by then), sends SIGTERM to the group, waits `grace` for every member, then SIGKILL.
    /// Safe to call more than once and from several places; returns once the group is gone
    /// or SIGKILL was sent and waited for.
    pub(super) async fn stop(&self, server_id: &str, grace: Duration) {
        if !self.poll_until(grace, || self.leader_exited()).await {
            tracing::debug!(server_id, "server did not exit after its stdin closed");
        }
        if !self.group_gone() {
            self.signal(libc::SIGTERM);
            if !self.poll_until(grace, || self.group_gone()).await {
                tracing::warn!(
                    server_id,
                    grace_ms = grace.as_millis() as u64,
                    "server processes ignored SIGTERM; killing the group"
                );
                self.signal(libc::SIGKILL);
                if !self.poll_until(grace, || self.group_gone()).await {
                    tracing::warn!(server_id, "server processes outlived SIGKILL");
                }
            }
        }
        self.dismiss_watchdog();
        self.release_permit();
    }

    fn release_permit(&self) {
        self.permit.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Polls `done` until it holds or `limit` passes; whether it held.
    async fn poll_until(&self, limit: Duration, mut done: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        loop {
            if done() {
                return true;
            }
            if start.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(defaults::PROCESS_EXIT_POLL).await;
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the leader has exited; reaps it if so.
    fn leader_exited(&self) -> bool {
        let mut state = self.state();
        if state.leader_reaped {
            return true;
        }
        let exited = match state.leader.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => false,
            // Exited, or already reaped by tokio: either way it is no longer running.
            Some(Ok(Some(_)) | Err(_)) | None => true,
        };
        state.leader_reaped = exited;
        exited
    }

    /// Whether no member of the group is left. Reaps members that are the host's own
    /// children (when the host is a subreaper or PID 1, orphans come to it).
    fn group_gone(&self) -> bool {
        if !self.leader_exited() {
            return false;
        }
        let mut state = self.state();
        if state.gone {
            return true;
        }
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our own group id; it only writes `status`. The leader is
            // already reaped, so this takes nothing tokio is waiting for.
            let reaped =
                unsafe { libc::waitpid(-self.pgid, &mut status, libc::WNOHANG | libc::__WALL) };
            if reaped <= 0 {
                break;
            }
        }
        // SAFETY: signal 0 only checks whether the group has a member.
        let probe = unsafe { libc::kill(-self.pgid, 0) };
        state.gone = probe != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        state.gone
    }

    fn signal(&self, signal: libc::c_int) {
        let state = self.state();
        if state.gone {
            return;
        }
        // SAFETY: kill(2) on the group id, which is > 1 and still names this group (see the
        // module docs).
        unsafe { libc::kill(-self.pgid, signal) };
    }

    fn dismiss_watchdog(&self) {
        if let Some(watchdog) = self
            .watchdog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            watchdog.dismiss();
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let (gone, leader_reaped) = {
            let state = self.state();
            (state.gone, state.leader_reaped)
        };
        // While the leader's zombie is unreaped it reserves the group id; once reaped,
        // the group is checked for members first.
        if !gone && (!leader_reaped || !self.group_gone()) {
            self.signal(libc::SIGKILL);
        }
        // The leader itself is reaped by tokio once dropped.
        self.dismiss_watchdog();
    }
}

/// The watchdog of one group; see the module docs.
struct Watchdog {
    /// The host's end of the socket; the watchdog SIGKILLs the group when it reads EOF.
    host_end: OwnedFd,
    /// Kept so that tokio reaps the watchdog once it exits.
    _process: Child,
}

/// Reads one line; EOF (the host is gone) kills the group named by `$1`.
const WATCHDOG_SCRIPT: &str = r#"IFS= read -r _ || kill -s KILL -- "-$1""#;

impl Watchdog {
    fn spawn(pgid: libc::pid_t) -> io::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: socketpair writes two new descriptors into `fds`.
        let made = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if made != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (host_end, watch_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let process = Command::new("/bin/sh")
            .args(["-c", WATCHDOG_SCRIPT, "quiver-watchdog"])
            .arg(pgid.to_string())
            .env_clear()
            .stdin(Stdio::from(watch_end))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        Ok(Self {
            host_end,
            _process: process,
        })
    }

    /// Tells the watchdog the group is taken care of; it exits without killing.
    fn dismiss(self) {
        // SAFETY: send(2) of one byte from a live buffer on our own socket; MSG_NOSIGNAL
        // turns a dead watchdog into an error instead of SIGPIPE.
        unsafe {
            libc::send(
                self.host_end.as_raw_fd(),
                b"\n".as_ptr().cast(),
                1,
                libc::MSG_NOSIGNAL,
            )
        };
    }
}
