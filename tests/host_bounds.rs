//! Bounds for the whole host, not just per task (issue 20): the host-wide total of guest
//! linear memory, and outbound HTTP that no proxy from the environment can take around the
//! egress rules. Also what a task slot carries from one task to the next (issue 25): the
//! host's stacks for guest tools a store keeps, and linear memory reset between tasks.
//!
//! The memory tests run real guests that grow and touch their memory at once against a
//! small total, and read the host's own counter while they run. The proxy tests run a
//! library host in a child process (this test binary again) whose environment names a
//! real local proxy: proxy variables are process-wide, so they are never set here.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quiver::{BusyReason, Host, HostConfig, HostError, TaskFailure, TaskSpec};
use quiver_tests::RegistryDir;

const PAGE: u64 = 64 * 1024;
const MIB: u64 = 1024 * 1024;

/// A guest that starts with `initial` pages, grows by `grow` pages, writes to each of
/// them and then holds them for `hold_ms` (spinning on the clock).
fn grower(initial: u32, grow: u32, hold_ms: u32) -> String {
    format!(
        r#"(module
  (import "spear" "time_now_ms" (func $now (result i64)))
  (memory (export "memory") {initial})
  (func (export "_start") (local $base i32) (local $i i32) (local $end i64)
    (local.set $base (memory.grow (i32.const {grow})))
    (if (i32.lt_s (local.get $base) (i32.const 0)) (then unreachable))
    (block $done (loop $touch
      (br_if $done (i32.ge_u (local.get $i) (i32.const {grow})))
      (i32.store (i32.mul (i32.add (local.get $base) (local.get $i)) (i32.const 65536))
        (i32.const 1))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $touch)))
    (local.set $end (i64.add (call $now) (i64.const {hold_ms})))
    (loop $spin (br_if $spin (i64.lt_u (call $now) (local.get $end))))))
"#
    )
}

fn host(total: u64, queue_timeout: Duration) -> Host {
    quiver_tests::init_logging();
    Host::builder()
        .without_disk_cache()
        .with_max_concurrent_tasks(32)
        .with_task_queue_timeout(queue_timeout)
        .with_guest_memory_total(total)
        .build()
        .expect("host")
}

/// Samples the host's guest memory counter until `stop`, returning the most it saw.
fn watch_usage(host: &Host, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    let host = host.clone();
    tokio::spawn(async move {
        let mut most = 0;
        while !stop.load(Ordering::SeqCst) {
            most = most.max(host.status().guest_memory.used_bytes);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        most
    })
}

/// Twelve guests that each grow 4 MiB at once against a total of 10 MiB: the counter never
/// passes the total, the grows that do not fit trap with an error naming the setting, the
/// others finish, and all of it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guests_growing_at_once_never_pass_the_total_and_give_it_all_back() {
    let total = 10 * MIB;
    let host = host(total, Duration::from_secs(30));
    let module = host
        .load_module("grower.wat", grower(1, 64, 300).as_bytes())
        .expect("compiles");
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_usage(&host, stop.clone());
    let runs = (0..12).map(|i| {
        let (host, module) = (host.clone(), module.clone());
        tokio::spawn(async move {
            host.run_task(&module, &TaskSpec::new(format!("grow-{i}")))
                .await
                .expect("admitted")
        })
    });
    let outcomes = futures::future::join_all(runs).await;
    stop.store(true, Ordering::SeqCst);
    let most = watcher.await.unwrap();
    let (mut ok, mut refused) = (0, 0);
    for outcome in outcomes {
        let outcome = outcome.unwrap();
        match &outcome.failure {
            None => ok += 1,
            Some(TaskFailure::Trap(message)) => {
                assert!(
                    message.contains("[tasks] guest_memory_total_bytes")
                        && message.contains("memory.grow"),
                    "{message}"
                );
                refused += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(ok >= 2, "{ok} finished, {refused} refused");
    assert!(refused >= 1, "{ok} finished, {refused} refused");
    let status = host.status().guest_memory;
    assert!(most <= total && most > 4 * MIB, "{most} of {total}");
    assert!(status.peak_bytes <= total, "{status:?}");
    assert_eq!(status.used_bytes, 0, "everything is given back");
    assert_eq!(status.limit_bytes, total);
}

/// Tasks whose initial memory does not fit wait in the queue until running tasks leave
/// room, and then run; a wait that runs out, and a module that can never fit, are refused
/// with the reason and the setting to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_wait_for_room_for_their_initial_memory() {
    let total = 8 * MIB;
    let host = host(total, Duration::from_secs(30));
    // 64 pages (4 MiB) to start with: two fit at once.
    let module = host
        .load_module("big.wat", grower(64, 0, 300).as_bytes())
        .expect("compiles");
    let runs: Vec<_> = (0..4)
        .map(|i| {
            let (host, module) = (host.clone(), module.clone());
            tokio::spawn(async move {
                host.run_task(&module, &TaskSpec::new(format!("big-{i}")))
                    .await
                    .expect("admitted")
            })
        })
        .collect();
    quiver_tests::until("two tasks waiting for guest memory", || {
        host.status().tasks.queued == 2
    })
    .await;
    assert_eq!(host.status().guest_memory.used_bytes, total);
    let mut waited = 0;
    for run in runs {
        let outcome = run.await.unwrap();
        assert!(outcome.success(), "{outcome:?}");
        if outcome.queued >= Duration::from_millis(200) {
            waited += 1;
        }
    }
    assert_eq!(waited, 2, "two tasks waited for the first two to end");
    assert_eq!(host.status().guest_memory.used_bytes, 0);

    // A wait that runs out names the total.
    let short = self::host(total, Duration::from_millis(100));
    let module = short
        .load_module("big.wat", grower(128, 0, 500).as_bytes())
        .unwrap();
    let holder = {
        let (host, module) = (short.clone(), module.clone());
        tokio::spawn(async move { host.run_task(&module, &TaskSpec::new("holder")).await })
    };
    quiver_tests::until("the holder runs", || {
        short.status().guest_memory.used_bytes == total
    })
    .await;
    let error = short
        .run_task(&module, &TaskSpec::new("late"))
        .await
        .expect_err("no room within the queue timeout");
    assert!(
        matches!(
            error,
            HostError::Busy {
                reason: BusyReason::GuestMemory { needed, .. },
                ..
            } if needed == 128 * PAGE
        ),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("[tasks] guest_memory_total_bytes"),
        "{error}"
    );
    assert!(holder.await.unwrap().unwrap().success());
    assert_eq!(short.status().tasks.queued, 0);

    // More than the whole total never runs: refused at once.
    let huge = short
        .load_module("huge.wat", grower(256, 0, 0).as_bytes())
        .unwrap();
    let started = std::time::Instant::now();
    let error = short
        .run_task(&huge, &TaskSpec::new("huge"))
        .await
        .expect_err("never fits");
    assert!(
        matches!(
            error,
            HostError::Busy {
                reason: BusyReason::GuestMemoryTooSmall { .. },
                ..
            }
        ),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(short.status().guest_memory.used_bytes, 0);
}

/// A task cancelled while it holds guest memory (its future dropped) and a task that
/// traps give everything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_trapping_tasks_give_their_memory_back() {
    let host = host(64 * MIB, Duration::from_secs(30));
    let slow = host
        .load_module("slow.wat", grower(1, 64, 10_000).as_bytes())
        .unwrap();
    let running = {
        let (host, slow) = (host.clone(), slow.clone());
        tokio::spawn(async move { host.run_task(&slow, &TaskSpec::new("slow")).await })
    };
    quiver_tests::until("the slow task has grown", || {
        host.status().guest_memory.used_bytes >= 65 * PAGE
    })
    .await;
    running.abort();
    let _ = running.await;
    quiver_tests::until("the cancelled task's memory is back", || {
        host.status().guest_memory.used_bytes == 0
    })
    .await;
    // Past its own limit (2 MiB) a grow traps; what it had comes back too.
    let trapping = host
        .load_module("trap.wat", grower(1, 64, 0).as_bytes())
        .unwrap();
    let outcome = host
        .run_task(&trapping, &TaskSpec::new("trap").with_memory_limit(2 * MIB))
        .await
        .unwrap();
    assert!(
        matches!(outcome.failure, Some(TaskFailure::Trap(_))),
        "{outcome:?}"
    );
    assert_eq!(host.status().guest_memory.used_bytes, 0);
}

/// A loopback HTTP proxy that counts connections and what they asked for, and answers 502.
struct Proxy {
    port: u16,
    seen: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (counter, log) = (seen.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut head = [0u8; 2048];
                let n = stream.read(&mut head).unwrap_or(0);
                let text = String::from_utf8_lossy(&head[..n]);
                log.lock()
                    .unwrap()
                    .push(text.lines().next().unwrap_or("").to_owned());
                let _ = stream.write_all(
                    b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        Self {
            port,
            seen,
            requests,
        }
    }

    fn url(&self, host: &str) -> String {
        format!("http://{host}:{}", self.port)
    }
}

/// What [`proxy_child`] reports: the error of reaching `target` from a host configured
/// with `egress` (TOML), with every proxy variable set to `env_proxy`.
fn in_child(env_proxy: &str, target: &str, egress: &str) -> String {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["proxy_child", "--exact", "--nocapture", "--test-threads=1"])
        .env("QUIVER_TEST_PROXY_TARGET", target)
        .env("QUIVER_TEST_PROXY_EGRESS", egress)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .envs(
            [
                "HTTP_PROXY",
                "HTTPS_PROXY",
                "ALL_PROXY",
                "http_proxy",
                "https_proxy",
                "all_proxy",
            ]
            .map(|name| (name, env_proxy)),
        )
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .find_map(|line| line.split_once("CHILD-RESULT: ").map(|(_, result)| result))
        .unwrap_or_else(|| panic!("no result from the child: {stdout}"))
        .to_owned()
}

/// Runs only as [`in_child`]'s child: lists the tools of a remote server at the target.
#[tokio::test]
async fn proxy_child() {
    let Ok(target) = std::env::var("QUIVER_TEST_PROXY_TARGET") else {
        return;
    };
    let egress = std::env::var("QUIVER_TEST_PROXY_EGRESS").unwrap();
    let registry = RegistryDir::new();
    registry.write(
        "remote.toml",
        &format!(
            "server_id = \"remote\"\ntransport = \"streamable_http\"\nallowed_tools = [\"*\"]\n[http]\nurl = {target:?}\n"
        ),
    );
    let config: HostConfig = toml::from_str(&egress).expect("egress TOML");
    let host = quiver_tests::host_builder(&registry)
        .with_config(config, ".")
        .with_connect_timeout(Duration::from_secs(2))
        .build()
        .expect("host");
    let problems: Vec<String> = host
        .registry()
        .problems()
        .iter()
        .map(|p| p.to_string())
        .collect();
    let result = match host.server_tools("remote").await {
        Ok(tools) => format!("ok: {} tools", tools.len()),
        Err(error) => format!("error: {error} {problems:?}"),
    };
    println!("CHILD-RESULT: {}", result.replace('\n', " "));
}

/// Proxy variables in the environment are ignored: requests go direct, where the egress
/// resolver sees the real target, and the proxy never hears of them. (Before, the public
/// target went to the proxy, which would have resolved and reached anything.)
#[test]
fn proxy_variables_in_the_environment_are_ignored() {
    let proxy = Proxy::start();
    for (target, expected) in [
        // TEST-NET-1: passes the rules, so it is tried directly and fails there.
        ("http://192.0.2.1:9/mcp", "error:"),
        ("http://localhost:9/mcp", "loopback"),
    ] {
        let result = in_child(&proxy.url("127.0.0.1"), target, "");
        assert_eq!(
            proxy.seen.load(Ordering::SeqCst),
            0,
            "{target}: the proxy saw {:?}; the child said {result}",
            proxy.requests.lock().unwrap()
        );
        assert!(
            result.starts_with("error:") && result.contains(expected),
            "{target}: {result}"
        );
    }
}

/// With `[egress] proxy`, a private target is refused before anything reaches the proxy,
/// and an allowed one goes through the configured proxy, never the environment's. The
/// proxy named by host name is reachable although it is on loopback: the address rules
/// are for targets.
#[test]
fn a_configured_proxy_only_gets_targets_that_pass_the_rules() {
    let configured = Proxy::start();
    let from_env = Proxy::start();
    let egress = format!("[egress]\nproxy = {:?}\n", configured.url("localhost"));
    for target in [
        "http://localhost:9/mcp",
        "http://10.0.0.1/mcp",
        "http://[64:ff9b::a9fe:a9fe]/latest",
        "http://[::ffff:127.0.0.1]:9/mcp",
    ] {
        let result = in_child(&from_env.url("127.0.0.1"), target, &egress);
        // An address literal is refused when the record loads, a name when it resolves.
        assert!(
            result.starts_with("error:")
                && (result.contains("egress policy") || result.contains("[egress] allow_private")),
            "{target}: {result}"
        );
        assert_eq!(
            configured.seen.load(Ordering::SeqCst),
            0,
            "{target}: {:?}",
            configured.requests.lock().unwrap()
        );
    }
    let allowed = format!("{egress}allow_private = [\"127.0.0.0/8\"]\n");
    let result = in_child(
        &from_env.url("127.0.0.1"),
        "http://127.0.0.1:9/mcp",
        &allowed,
    );
    assert!(
        result.starts_with("error:"),
        "the proxy answers 502: {result}"
    );
    let requests = configured.requests.lock().unwrap().clone();
    assert!(
        requests
            .iter()
            .any(|line| line.contains("http://127.0.0.1:9/mcp")),
        "{requests:?}"
    );
    assert_eq!(from_env.seen.load(Ordering::SeqCst), 0);
}

/// A chat guest whose one send (AUTO_TOOL_CALL) runs the guest tool `weather` if the model
/// asks for it, and which then waits `ms` in the fixture's `slow` tool.
fn tool_then_wait(ms: u32) -> String {
    use quiver_tests::chat_wat::{ChatGuest, WEATHER};
    let mut guest = ChatGuest::new()
        .msg("user", "hi")
        .arena()
        .param("max_iterations", serde_json::json!(2))
        .tool(WEATHER, "weather");
    let (server, server_len) = guest.bytes(b"fixture");
    let (tool, tool_len) = guest.bytes(b"slow");
    let (args, args_len) = guest.bytes(format!(r#"{{"ms":{ms}}}"#).as_bytes());
    guest.send(2).raw(&format!(
        "(local.set $r (call $mcp_open (i32.const {server}) (i32.const {server_len}))) (call $out (local.get $r))
         (call $cap (i32.const 8192) (i32.const 65536))
         (call $out (call $mcp_call_tool (local.get $r) (i32.const {tool}) (i32.const {tool_len}) (i32.const {args}) (i32.const {args_len}) (i32.const 16384) (i32.const 8192)))"
    ))
    .build()
}

/// wasmtime keeps the fiber stack of a guest tool that returned cached in the task's store
/// until the task ends, so that stack's permit stays with the task too. On a host with 8
/// slots (2 stacks for guest tools), 8 tasks that each run a guest tool and then wait: the
/// first two keep theirs, the other six are refused cleanly (the model is told why), and all
/// eight run to the end. Counting only running tools, the pool ran out of stacks while the
/// permits said there were some, and the sixth task failed to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_tool_stack_cached_in_the_store_keeps_its_permit_until_the_task_ends() {
    use quiver_tests::llm::{Reply, ScriptedLlm};
    let llm = ScriptedLlm::start(vec![]).await;
    let registry = RegistryDir::new();
    registry.fixture(
        "fixture",
        &["slow"],
        "[budgets]\nmax_concurrency = 64\ntool_timeout_ms = 60000\n",
    );
    let host = quiver_tests::chat_wat::scripted_host_builder(&registry, &llm)
        .with_max_concurrent_tasks(8)
        .build()
        .expect("host");
    let waiting = host
        .load_module("wait.wat", tool_then_wait(5_000).as_bytes())
        .expect("module");
    let mut tasks = Vec::new();
    for i in 0..8 {
        llm.push(Reply::tool_call(
            format!("c{i}"),
            "weather",
            serde_json::json!({}),
        ));
        llm.push(Reply::text("done"));
        let (host, module) = (host.clone(), waiting.clone());
        let task = quiver_tests::mcp_task(&format!("wait-{i}"), &["fixture"]);
        let running = tokio::spawn(async move { host.run_task(&module, &task).await });
        // The second request carries the tool's result: the tool has returned and its
        // stack is cached in the task's store while the task goes on to wait.
        quiver_tests::until("the task's guest tool returned", || {
            llm.request_count() >= 2 * (i + 1) || running.is_finished()
        })
        .await;
        tasks.push(running);
    }
    for (i, running) in tasks.into_iter().enumerate() {
        match running.await.unwrap() {
            Ok(outcome) => {
                assert!(outcome.failure.is_none(), "task {i}: {:?}", outcome.failure);
                let results = quiver_tests::wat::results(&outcome.stdout);
                assert!(
                    results.iter().all(|&r| r >= 0),
                    "task {i}: {results:?} {}",
                    outcome.stderr_text()
                );
            }
            Err(error) => panic!("task {i} could not start: {error}"),
        }
    }
    let results: Vec<String> = llm
        .requests()
        .iter()
        .flat_map(quiver_tests::llm::tool_results)
        .map(|(_, content)| content)
        .collect();
    let ran = results.iter().filter(|c| c.contains("Sunny")).count();
    let refused = results
        .iter()
        .filter(|c| c.contains("stacks for guest tool calls are all in use"))
        .count();
    assert_eq!((ran, refused), (2, 6), "{results:?}");
    // Every permit came back with its task: a guest tool runs again.
    llm.clear_recorded();
    llm.push(Reply::tool_call("again", "weather", serde_json::json!({})));
    llm.push(Reply::text("done"));
    let again = host
        .load_module("again.wat", tool_then_wait(0).as_bytes())
        .expect("module");
    let outcome = host
        .run_task(&again, &quiver_tests::mcp_task("again", &["fixture"]))
        .await
        .expect("task starts");
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    let answered = llm.requests().iter().any(|request| {
        quiver_tests::llm::tool_results(request)
            .iter()
            .any(|(_, content)| content.contains("Sunny"))
    });
    assert!(answered, "{:?}", llm.requests());
    host.shutdown().await;
}

/// `dirty` writes a byte into every 4 KiB page of its two pages of memory and of a third it
/// grows, and over its data segment; `check` exits 1 if it finds any of those bytes, 2 if
/// the data segment is not as the module has it, 3 if the memory is not back to two pages.
const DIRTY_THEN_CHECK: &str = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 2 4)
  (data (i32.const 100) "image")
  (func (export "dirty") (local $at i32)
    (drop (memory.grow (i32.const 1)))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $at) (i32.const 196608)))
      (i32.store8 (i32.add (local.get $at) (i32.const 7)) (i32.const 171))
      (local.set $at (i32.add (local.get $at) (i32.const 4096)))
      (br $next)))
    (i32.store8 (i32.const 100) (i32.const 88)))
  (func (export "check") (local $at i32)
    (if (i32.ne (memory.size) (i32.const 2)) (then (call $exit (i32.const 3))))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $at) (i32.const 131072)))
      (if (i32.load8_u (i32.add (local.get $at) (i32.const 7))) (then (call $exit (i32.const 1))))
      (local.set $at (i32.add (local.get $at) (i32.const 4096)))
      (br $next)))
    (if (i32.ne (i32.load8_u (i32.const 100)) (i32.const 105)) (then (call $exit (i32.const 2))))))
"#;

/// A slot's linear memory is reset between tasks however much of it is kept resident: on a
/// one-slot host, a task that finds what the task before it wrote (inside the bytes reset in
/// place, past them, in its data segment or in a page it grew) exits non-zero.
#[tokio::test]
async fn the_next_task_in_a_slot_never_sees_what_the_last_one_wrote() {
    for keep_resident in [0, quiver::defaults::TASK_KEEP_RESIDENT, 1 << 20] {
        let host = Host::builder()
            .without_disk_cache()
            .with_max_concurrent_tasks(1)
            .with_keep_resident(keep_resident)
            .build()
            .expect("host");
        let module = host
            .load_module("dirty.wat", DIRTY_THEN_CHECK.as_bytes())
            .expect("module");
        for round in 0..3 {
            for entry in ["dirty", "check"] {
                let task = TaskSpec::new(entry).with_entry(entry);
                let outcome = host.run_task(&module, &task).await.expect("task starts");
                assert!(
                    outcome.success(),
                    "keep_resident {keep_resident}, round {round}, {entry}: {outcome:?}"
                );
            }
        }
    }
}
