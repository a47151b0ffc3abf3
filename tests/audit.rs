//! The audit log after real calls: WAT guests calling the fixture MCP server directly and
//! through the chat loop (the scripted LLM over HTTP). The file must hold exactly one line
//! per call and per denial, each naming the task's principal, argument values only for
//! the record that opts in, never a secret; and a writer stuck on a pipe nobody reads must not hold up the task.

use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use quiver::registry::Registry;
use quiver::{Host, HostBuilder, TaskSpec};
use quiver_tests::chat_wat::{ChatGuest, scripted_host_builder};
use quiver_tests::errno::{EACCES, EINVAL, ENOENT};
use quiver_tests::llm::{Reply, ScriptedLlm};
use quiver_tests::wat;
use quiver_tests::{RegistryDir, fixture_toml, host_builder, init_logging, mcp_task};
use serde_json::{Value, json};
use tempfile::TempDir;

const SECRET: &str = "tok-5ecret-value-0042";

/// `audited` opts in to argument values and launches with a secret from `${ENV:..}`;
/// `plain` does neither and allows only `echo` and `read_text`.
fn registry() -> (RegistryDir, Registry) {
    let dir = RegistryDir::new();
    dir.write(
        "audited.toml",
        &format!(
            "audit_arguments = true\n{}",
            fixture_toml(
                "audited",
                &["*"],
                "env = { TOKEN = \"${ENV:QUIVER_AUDIT_TOKEN}\" }"
            )
        ),
    );
    dir.fixture("plain", &["echo", "read_text"], "");
    let env = |name: &str| (name == "QUIVER_AUDIT_TOKEN").then(|| SECRET.to_owned());
    let registry = Registry::load_dir_with_env(dir.path(), &env).unwrap();
    assert!(registry.problems().is_empty(), "{:?}", registry.problems());
    (dir, registry)
}

/// A host from `builder` (given the registry directory) on [`registry`], writing its
/// audit log to a fresh file: the host, the file, and the directories to keep until the
/// test ends.
fn audited_host(
    builder: impl FnOnce(&RegistryDir) -> HostBuilder,
) -> (Host, PathBuf, (RegistryDir, TempDir)) {
    let (dir, registry) = registry();
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("audit.jsonl");
    let host = builder(&dir)
        .with_registry(registry)
        .with_audit_log(&log)
        .build()
        .unwrap();
    (host, log, (dir, log_dir))
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_holds_one_line_per_call_and_denial_with_values_only_where_opted_in() {
    init_logging();
    let llm = ScriptedLlm::start(vec![
        Reply::tool_calls([
            ("c1", "mcp__plain__delete_file", json!({"path": "/x"})),
            ("c2", "mcp__plain__echo", json!({"text": "from the model"})),
        ]),
        Reply::text("done"),
    ])
    .await;
    let (host, path, _dirs) = audited_host(|dir| scripted_host_builder(dir, &llm));
    let secret_args = json!({"text": SECRET, "n": 1}).to_string();
    let steps = [
        ("audited", "echo", secret_args.as_str()),
        ("plain", "echo", r#"{"text":"hello"}"#),
        (
            "plain",
            "read_text",
            r#"{"path":"/nonexistent/quiver-audit"}"#,
        ),
        ("plain", "delete_file", r#"{"path":"/x"}"#),
    ];
    // Who submitted each task, as a node sets it: on every line of the task.
    let mut task = mcp_task("audit-direct", &["audited", "plain"]);
    task.principal = Some("ci".into());
    let run = wat::run_ok(&host, &wat::mcp_calls(&steps, 1), &task).await;
    let fd = run.results[0];
    let returned = [run.results[1], run.results[3], run.results[5]];
    assert!(returned.iter().all(|&n| n > 0), "{:?}", run.results);
    assert_eq!(run.results[7], EACCES, "{:?}", run.results);

    let chat = ChatGuest::new().msg("user", "go").send(2).recv();
    let mut chat_task = mcp_task("audit-chat", &["plain"]);
    chat_task.principal = Some("ci".into());
    let run = wat::run_ok(&host, &chat.build(), &chat_task).await;
    let chat_fd = run.results[0];
    host.shutdown().await;

    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(SECRET), "{text}");
    let lines = lines(&path);
    let shape: Vec<(String, String, String, String)> = lines
        .iter()
        .map(|l| {
            let s = |k: &str| l[k].as_str().unwrap_or("-").to_owned();
            (s("event"), s("task_id"), s("tool"), s("outcome"))
        })
        .collect();
    let row = |e: &str, t: &str, tool: &str, o: &str| (e.into(), t.into(), tool.into(), o.into());
    assert_eq!(
        shape,
        [
            row("tool_call", "audit-direct", "echo", "ok"),
            row("tool_call", "audit-direct", "echo", "ok"),
            row("tool_call", "audit-direct", "read_text", "tool_error"),
            row("policy_denied", "audit-direct", "delete_file", "-"),
            row("policy_denied", "audit-chat", "delete_file", "-"),
            row("tool_call", "audit-chat", "echo", "ok"),
        ]
    );
    assert!(
        lines.iter().all(|l| l["principal"] == "ci"),
        "every line names the principal: {lines:?}"
    );
    let (audited, plain, denied, chat_denied, via_chat) =
        (&lines[0], &lines[1], &lines[3], &lines[4], &lines[5]);
    assert_eq!(audited["server_id"], "audited");
    assert_eq!(audited["via"], "mcp_call");
    assert_eq!(audited["session_fd"], fd);
    assert_eq!(
        audited["arguments"]["keys"],
        json!(["text", "n"]),
        "in the order the guest wrote them"
    );
    assert_eq!(audited["arguments"]["bytes"], secret_args.len());
    assert_eq!(
        audited["argument_values"],
        json!({"text": quiver::registry::REDACTED, "n": 1})
    );
    assert!(audited["output_bytes"].as_u64().unwrap() > 0);
    assert!(audited["duration"].as_f64().unwrap() >= 0.0);
    assert!(audited["time"].as_f64().unwrap() >= audited["started_at"].as_f64().unwrap());
    assert_eq!(plain["server_id"], "plain");
    assert!(plain.get("argument_values").is_none(), "{plain}");
    assert_eq!(plain["arguments"], json!({"keys": ["text"], "bytes": 16}));
    assert_eq!(denied["action"], "mcp_call_tool");
    assert_eq!(denied["server_id"], "plain");
    assert_eq!(chat_denied["action"], "cchat_send");
    assert_eq!(via_chat["via"], "chat");
    assert_eq!(via_chat["session_fd"], chat_fd);
    assert_eq!(via_chat["server_id"], "plain");
    assert_eq!(via_chat["arguments"]["keys"], json!(["text"]));
    assert!(via_chat.get("argument_values").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stuck_on_a_full_pipe_does_not_hold_up_the_task() {
    init_logging();
    let (dir, registry) = registry();
    let log_dir = tempfile::tempdir().unwrap();
    let fifo = log_dir.path().join("audit.fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    // Opened (not read) first, so the host's open for writing does not wait for a reader.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let host = host_builder(&dir)
        .with_registry(registry)
        .with_audit_log(&fifo)
        .build()
        .unwrap();
    // 300 calls of about 700 bytes a line: far more than a pipe holds unread.
    const CALLS: u32 = 300;
    let args = json!({"text": "x".repeat(400)}).to_string();
    let guest = wat::mcp_calls(&[("plain", "echo", &args)], CALLS);
    let task = mcp_task("flood", &["plain"]).with_deadline(Duration::from_secs(120));
    let run = tokio::time::timeout(Duration::from_secs(150), wat::run_ok(&host, &guest, &task))
        .await
        .expect("the task finishes while nobody reads the audit log");
    assert_eq!(run.results.len(), 2 * CALLS as usize);

    let reading = std::thread::spawn(move || {
        let mut text = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => return String::from_utf8(text).unwrap(),
                Ok(n) => text.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("{e}"),
            }
        }
    });
    host.shutdown().await;
    drop(host);
    let text = reading.join().unwrap();
    let calls = text
        .lines()
        .filter(|l| l.contains(r#""event":"tool_call""#))
        .count();
    assert_eq!(
        calls, CALLS as usize,
        "every call is logged once the pipe is read"
    );
    assert!(!text.contains("audit_dropped"), "the queue held them all");
}

/// Empty or blank argument text is sent as `{}`, and logged as the `{}` it is, not as a
/// string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blank_arguments_are_logged_as_the_empty_object_sent() {
    init_logging();
    let (host, path, _dirs) = audited_host(host_builder);
    let steps = [("audited", "echo", ""), ("audited", "echo", " \n ")];
    let run = wat::run_ok(
        &host,
        &wat::mcp_calls(&steps, 1),
        &mcp_task("blank", &["audited"]),
    )
    .await;
    assert!(run.results.iter().all(|&r| r >= 0), "{:?}", run.results);
    host.shutdown().await;
    let lines = lines(&path);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in &lines {
        assert_eq!(line["argument_values"], json!({}), "{line}");
        assert_eq!(line["arguments"]["keys"], json!([]), "{line}");
    }
}

/// A server id longer than any the registry allows is `-EINVAL` before it is read, so a
/// guest cannot push guest-sized strings into denials; a 64-byte unknown id is an ordinary
/// `-ENOENT` denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlong_server_id_is_refused_before_it_reaches_a_denial() {
    init_logging();
    let (host, path, _dirs) = audited_host(host_builder);
    let id = "a".repeat(65);
    let guest = wat::guest(
        &[(1024, id.as_bytes())],
        "(func $main
           (call $out (call $mcp_open (i32.const 1024) (i32.const 65)))
           (call $out (call $mcp_open (i32.const 16384) (i32.const 200000)))
           (call $cap (i32.const 8192) (i32.const 4096))
           (call $out (call $mcp_registry_get (i32.const 1024) (i32.const 65) (i32.const 20000) (i32.const 8192)))
           (call $out (call $mcp_open (i32.const 1024) (i32.const 64))))",
    );
    let run = wat::run_ok(&host, &guest, &mcp_task("long-id", &["plain"])).await;
    assert_eq!(run.results, [EINVAL, EINVAL, EINVAL, ENOENT]);
    host.shutdown().await;
    let lines = lines(&path);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["event"], "policy_denied");
    assert_eq!(lines[0]["action"], "mcp_open");
    assert_eq!(lines[0]["server_id"], id[..64]);
}

/// A resource or prompt the registry or a profile leaves out is one `policy_denied` line,
/// naming the hostcall, the URI or prompt, and the layer in its detail; the server is not
/// asked (the fixture server has no prompts at all). The task and session layers are
/// checked the same way against the npm everything server (`tests/reference_servers.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_and_prompt_denials_name_their_layer() {
    init_logging();
    let dir = RegistryDir::new();
    dir.write(
        "docs.toml",
        &format!(
            "allowed_resources = [\"fixture://*\"]\nallowed_prompts = [\"*\"]\n{}",
            fixture_toml("docs", &["echo"], "")
        ),
    );
    std::fs::create_dir(dir.path().join("profiles")).unwrap();
    dir.write(
        "profiles/readers.toml",
        "name = \"readers\"\nserver_ids = [\"docs\"]\nresource_denylist = [\"*giant\"]\nprompt_allowlist = [\"summary-*\"]\n",
    );
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("audit.jsonl");
    let host = host_builder(&dir).with_audit_log(&log).build().unwrap();
    let (giant, outside, prompt) = ("fixture://giant", "file:///etc/passwd", "other");
    let guest = wat::guest(
        &[
            (1024, b"docs"),
            (1100, giant.as_bytes()),
            (1200, outside.as_bytes()),
            (1300, prompt.as_bytes()),
        ],
        &format!(
            "(func $main (local $fd i32)
               (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 4)))
               (call $cap (i32.const 8192) (i32.const 4096))
               (call $out (call $mcp_read_resource (local.get $fd) (i32.const 1100) (i32.const {}) (i32.const 16384) (i32.const 8192)))
               (call $out (call $mcp_read_resource (local.get $fd) (i32.const 1200) (i32.const {}) (i32.const 16384) (i32.const 8192)))
               (call $out (call $mcp_get_prompt (local.get $fd) (i32.const 1300) (i32.const {}) (i32.const 0) (i32.const 0) (i32.const 16384) (i32.const 8192))))",
            giant.len(),
            outside.len(),
            prompt.len()
        ),
    );
    let task = TaskSpec::new("profiled")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.profile", "readers")
        .with_captured_output();
    let run = wat::run_ok(&host, &guest, &task).await;
    assert_eq!(run.results, [EACCES, EACCES, EACCES]);
    host.shutdown().await;
    let denials: Vec<(String, String, String, String)> = lines(&log)
        .iter()
        .map(|l| {
            assert_eq!(l["event"], "policy_denied", "{l}");
            assert_eq!(l["server_id"], "docs", "{l}");
            let s = |k: &str| l[k].as_str().unwrap().to_owned();
            (s("action"), s("tool"), s("reason"), s("detail"))
        })
        .collect();
    let row = |action: &str, name: &str, reason: &str, detail: &str| {
        (action.into(), name.into(), reason.into(), detail.into())
    };
    assert_eq!(
        denials,
        [
            row(
                "mcp_read_resource",
                giant,
                "denied_by_pattern",
                "matches the profile's resource deny pattern `*giant`"
            ),
            row(
                "mcp_read_resource",
                outside,
                "not_in_allowlist",
                "not in the registry's allowed_resources for this server"
            ),
            row(
                "mcp_get_prompt",
                prompt,
                "not_in_allowlist",
                "not in the profile's prompt allowlist"
            ),
        ]
    );
}
