//! Admission control with real guests and the real fixture server: with default settings a
//! thousand tasks wait on MCP calls at once; past the capacity tasks queue, a full queue or a
//! wait that runs out is `HostError::Busy`, and a cancelled caller gives its place back.
//!
//! Nothing here depends on timing. The tasks wait on a fixture server that the test has
//! stopped (SIGSTOP): every call stays in flight until the test continues the server, so
//! "all of them are running now" is a state the test waits for, not a race it hopes to win.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use quiver::{BusyReason, GuestModule, Host, HostError, HostStatus, TaskOutcome, TaskSpec};
use quiver_tests::{RegistryDir, host_builder, init_logging, mcp_task, wat};
use tokio::task::JoinHandle;

/// A guest that calls the fixture's `echo` once and records the result.
fn echo_guest() -> String {
    wat::guest(
        &[
            (1024, b"fixture"),
            (1100, b"echo"),
            (1200, br#"{"text":"hi"}"#),
        ],
        r#"(func $main (local $fd i32)
          (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))
          (call $cap (i32.const 8192) (i32.const 4096))
          (call $out (call $mcp_call_tool (local.get $fd) (i32.const 1100) (i32.const 4)
            (i32.const 1200) (i32.const 13) (i32.const 16384) (i32.const 8192))))"#,
    )
}

/// The fixture server as `fixture`, allowing as many calls at once as any test makes, with
/// a tool timeout no test reaches.
fn registry() -> RegistryDir {
    let registry = RegistryDir::new();
    registry.fixture(
        "fixture",
        &["echo"],
        "[budgets]\nmax_concurrency = 4096\ntool_timeout_ms = 600000\n",
    );
    registry
}

/// The fixture server's process, stopped: calls to it wait until [`Paused::resume`] (or
/// the drop, so a failing test never leaves it stopped).
struct Paused {
    pid: libc::pid_t,
    /// Set once continued, so the drop never signals a pid that may have been reused.
    resumed: AtomicBool,
}

impl Paused {
    /// Connects the server with one call, then stops it.
    async fn server(host: &Host, module: &GuestModule) -> Paused {
        assert_echoed(&host.run_task(module, &task("connect")).await.unwrap());
        let pid = host
            .status()
            .mcp_servers
            .iter()
            .find(|s| s.server_id == "fixture")
            .and_then(|s| s.pid)
            .expect("the fixture server is connected");
        let pid = libc::pid_t::try_from(pid).unwrap();
        // SAFETY: kill has no memory-safety preconditions; the pid is our live child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        // A stop takes effect as each thread next enters the kernel, which on a loaded
        // machine can be after a request arrived; wait until every thread has stopped.
        let started = Instant::now();
        while !stopped(pid) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the fixture server {pid} did not stop"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        Paused {
            pid,
            resumed: AtomicBool::new(false),
        }
    }

    /// Panics if the server runs again before [`Paused::resume`].
    fn assert_stopped(&self) {
        assert!(
            stopped(self.pid),
            "the fixture server {} runs again",
            self.pid
        );
    }

    fn resume(&self) {
        if !self.resumed.swap(true, Ordering::SeqCst) {
            // SAFETY: as above; the child is still alive (the host has not shut down).
            unsafe { libc::kill(self.pid, libc::SIGCONT) };
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        self.resume();
    }
}

/// Whether every thread of `pid` is stopped (state `T` in `/proc/PID/task/*/stat`).
fn stopped(pid: libc::pid_t) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    threads.flatten().all(|thread| {
        let stat = std::fs::read_to_string(thread.path().join("stat")).unwrap_or_default();
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('T'))
    })
}

fn task(task_id: &str) -> TaskSpec {
    mcp_task(task_id, &["fixture"]).with_deadline(Duration::from_secs(600))
}

fn spawn(
    host: &Host,
    module: &GuestModule,
    task: TaskSpec,
) -> JoinHandle<Result<TaskOutcome, HostError>> {
    let (host, module) = (host.clone(), module.clone());
    tokio::spawn(async move { host.run_task(&module, &task).await })
}

/// Waits until `status` holds for the host's status; a generous bound turns a hang into a
/// failure that shows the last status.
async fn wait_for(host: &Host, what: &str, status: impl Fn(&HostStatus) -> bool) {
    let started = Instant::now();
    loop {
        let now = host.status();
        if status(&now) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "waited 300 s for {what}; status: {:?}",
            now.tasks
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The guest ran to its end and `mcp_call_tool` delivered a result (its length).
fn assert_echoed(outcome: &TaskOutcome) {
    assert!(outcome.success(), "{outcome:?}");
    let results = wat::results(&outcome.stdout);
    assert!(matches!(results[..], [n] if n > 0), "{results:?}");
}

/// With default settings 1000 tasks wait on MCP calls at the same time, none queued and
/// none refused, and all finish once the server answers. (With the old pool of 64 slots the
/// 65th failed to instantiate.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tasks_wait_on_mcp_calls_at_once_with_defaults() {
    init_logging();
    const TASKS: u32 = 1000;
    let registry = registry();
    let host = host_builder(&registry).build().unwrap();
    let defaults = host.status().tasks;
    assert_eq!(defaults.capacity, quiver::defaults::MAX_CONCURRENT_TASKS);
    assert!(defaults.capacity >= TASKS, "{defaults:?}");
    let module = host
        .load_module("echo.wat", echo_guest().as_bytes())
        .unwrap();
    let server = Paused::server(&host, &module).await;

    let mut tasks: Vec<_> = (0..TASKS)
        .map(|i| spawn(&host, &module, task(&format!("t{i}"))))
        .collect();
    let started = Instant::now();
    while host.status().tasks.running < TASKS {
        server.assert_stopped();
        // No task can end while the server is stopped; one that did shows why.
        if let Some(done) = tasks.iter().position(JoinHandle::is_finished) {
            let outcome = tasks.swap_remove(done).await.unwrap();
            panic!("a task ended while the server was stopped: {outcome:?}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "waited 300 s for every task to be running; status: {:?}",
            host.status().tasks
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = host.status().tasks;
    assert_eq!((status.running, status.queued), (TASKS, 0), "{status:?}");

    server.resume();
    for task in tasks {
        let outcome = task.await.unwrap().unwrap();
        assert_echoed(&outcome);
    }
    let status = host.status().tasks;
    assert_eq!((status.running, status.queued), (0, 0), "{status:?}");
    host.shutdown().await;
}

/// Past the capacity tasks queue; past the queue they are refused with a `Busy` error that
/// names the limits and the options that raise them; a cancelled waiter's place is free
/// again at once, and queued tasks run when slots free up.
#[tokio::test]
async fn a_full_queue_refuses_and_a_cancelled_waiter_gives_its_place_back() {
    init_logging();
    let registry = registry();
    let host = host_builder(&registry)
        .with_max_concurrent_tasks(1)
        .with_task_queue_capacity(1)
        .build()
        .unwrap();
    let module = host
        .load_module("echo.wat", echo_guest().as_bytes())
        .unwrap();
    let server = Paused::server(&host, &module).await;

    let running = spawn(&host, &module, task("running"));
    wait_for(&host, "the first task to run", |s| s.tasks.running == 1).await;
    let waiting = spawn(&host, &module, task("waiting"));
    wait_for(&host, "the second task to queue", |s| s.tasks.queued == 1).await;

    let refused = host.run_task(&module, &task("refused")).await.unwrap_err();
    match &refused {
        HostError::Busy {
            task_id,
            capacity: 1,
            queue_capacity: 1,
            reason: BusyReason::QueueFull,
        } if task_id == "refused" => {}
        other => panic!("{other:?}"),
    }
    let message = refused.to_string();
    for needle in [
        "with_max_concurrent_tasks",
        "with_task_queue_capacity",
        "[tasks]",
        "1 running slots",
        "1 queue places",
    ] {
        assert!(message.contains(needle), "{needle}: {message}");
    }

    // Cancelling the waiting caller frees its place: the next task can queue again.
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    assert_eq!(host.status().tasks.queued, 0);
    let queued = spawn(&host, &module, task("queued"));
    wait_for(&host, "the replacement to queue", |s| s.tasks.queued == 1).await;

    server.resume();
    assert_echoed(&running.await.unwrap().unwrap());
    let queued = queued.await.unwrap().unwrap();
    assert_echoed(&queued);
    assert!(queued.queued > Duration::ZERO);
    let status = host.status().tasks;
    assert_eq!((status.running, status.queued), (0, 0), "{status:?}");
    host.shutdown().await;
}

/// A wait for a slot ends at the queue timeout, or at the task's own deadline when that is
/// shorter; each refusal says which bound ran out and what raises it.
#[tokio::test]
async fn a_wait_for_a_slot_ends_at_the_queue_timeout_or_the_task_deadline() {
    init_logging();
    let registry = registry();
    let host = host_builder(&registry)
        .with_max_concurrent_tasks(1)
        .with_task_queue_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let module = host
        .load_module("echo.wat", echo_guest().as_bytes())
        .unwrap();
    let server = Paused::server(&host, &module).await;
    let running = spawn(&host, &module, task("running"));
    wait_for(&host, "the first task to run", |s| s.tasks.running == 1).await;

    let refused = host.run_task(&module, &task("late")).await.unwrap_err();
    let HostError::Busy { reason, .. } = &refused else {
        panic!("{refused:?}");
    };
    assert_eq!(
        *reason,
        BusyReason::QueueTimeout {
            after: Duration::from_millis(200)
        }
    );
    assert!(
        refused.to_string().contains("with_task_queue_timeout"),
        "{refused}"
    );

    let short = task("short").with_deadline(Duration::from_millis(50));
    let refused = host.run_task(&module, &short).await.unwrap_err();
    let HostError::Busy { reason, .. } = &refused else {
        panic!("{refused:?}");
    };
    assert_eq!(
        *reason,
        BusyReason::DeadlineInQueue {
            after: Duration::from_millis(50)
        }
    );
    assert!(
        refused.to_string().contains("limits.deadline_ms"),
        "{refused}"
    );
    assert_eq!(host.status().tasks.queued, 0);

    server.resume();
    assert_echoed(&running.await.unwrap().unwrap());
    host.shutdown().await;
}

/// Cancelling a running task gives its slot (and the engine's instance slot under it) back:
/// the next task starts at once instead of failing to instantiate.
#[tokio::test]
async fn a_cancelled_running_task_frees_its_slot() {
    init_logging();
    let registry = registry();
    let host = host_builder(&registry)
        .with_max_concurrent_tasks(1)
        .with_task_queue_capacity(0)
        .build()
        .unwrap();
    let module = host
        .load_module("echo.wat", echo_guest().as_bytes())
        .unwrap();
    let server = Paused::server(&host, &module).await;
    for round in 0..3 {
        let running = spawn(&host, &module, task(&format!("cancelled-{round}")));
        wait_for(&host, "the task to run", |s| s.tasks.running == 1).await;
        running.abort();
        assert!(running.await.unwrap_err().is_cancelled());
        assert_eq!(host.status().tasks.running, 0);
    }
    let last = spawn(&host, &module, task("last"));
    wait_for(&host, "the last task to run", |s| s.tasks.running == 1).await;
    server.resume();
    assert_echoed(&last.await.unwrap().unwrap());
    host.shutdown().await;
}
