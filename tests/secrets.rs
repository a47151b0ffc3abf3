//! A secret a registry record takes from the environment (`${ENV:..}` in `http.url`,
//! `http.headers`, `stdio.args`, `stdio.env`, `stdio.command`) reaches no guest and no
//! log line, however its server fails.
//!
//! One run of the real `quiver` CLI at trace level, with five servers that fail in
//! different ways: an unreachable URL, a 401, a process that prints its secret and exits,
//! a command that does not exist, and a server that echoes its secret in every call error.
//! The guest calls each of them and runs a chat send whose model calls the last one; then
//! every channel is searched for the secret: stdout, stderr (every log line, the guest's
//! output, `--explain-policy`, the decision log in `_spear.mcp.decisions`) and what the
//! model was sent.

use std::process::Command;

use quiver_tests::chat_wat::ChatGuest;
use quiver_tests::llm::{Reply, ScriptedLlm, tool_results};
use quiver_tests::{FixtureHttp, RegistryDir, quiver_cli};
use serde_json::{Value, json};

const SERVERS: [&str; 6] = ["web", "denied", "broken", "absent", "echoing", "hosted"];

fn registry(secret_server: &FixtureHttp) -> RegistryDir {
    let registry = RegistryDir::new();
    registry.write(
        "web.toml",
        r#"server_id = "web"
transport = "streamable_http"
allowed_tools = ["*"]
[http]
url = "http://qv:${ENV:QV_SECRET}@127.0.0.1:1/mcp/${ENV:QV_SECRET}?key=${ENV:QV_SECRET}"
headers = { "X-Key" = "${ENV:QV_SECRET}", "Authorization" = "Bearer ${ENV:QV_SECRET}" }
"#,
    );
    registry.write(
        "denied.toml",
        &format!(
            r#"server_id = "denied"
transport = "streamable_http"
allowed_tools = ["*"]
[http]
url = "{}?token=${{ENV:QV_SECRET}}"
headers = {{ "x-api-key" = "${{ENV:QV_SECRET}}" }}
"#,
            secret_server.url()
        ),
    );
    registry.write(
        "broken.toml",
        r#"server_id = "broken"
transport = "stdio"
allowed_tools = ["*"]
[stdio]
command = "/bin/sh"
args = ["-c", "echo \"cannot start with $1 and $TOKEN\" >&2; printf '%4082s%s\\n' pad \"$TOKEN\" >&2; exit 3", "sh", "${ENV:QV_SECRET}"]
env = { TOKEN = "${ENV:QV_SECRET}" }
"#,
    );
    registry.write(
        "absent.toml",
        r#"server_id = "absent"
transport = "stdio"
allowed_tools = ["*"]
[stdio]
command = "/nonexistent/${ENV:QV_SECRET}/server"
"#,
    );
    registry.fixture_with_args(
        "echoing",
        &["*"],
        &[
            "--fail-calls-with",
            "upstream refused token ${ENV:QV_SECRET}",
        ],
        r#"env = { API_TOKEN = "${ENV:QV_SECRET}" }"#,
    );
    // The URL parser lowercases a host name, secret and all.
    registry.write(
        "hosted.toml",
        r#"server_id = "hosted"
transport = "streamable_http"
allowed_tools = ["*"]
[http]
url = "http://${ENV:QV_SECRET}.invalid/mcp"
"#,
    );
    registry
}

/// Calls `echo` on every server and emits each answer, then runs one chat send with
/// automatic tool calls and emits its response.
fn guest() -> String {
    let mut guest = ChatGuest::new();
    let (tool, tool_len) = guest.bytes(b"echo");
    let (args, args_len) = guest.bytes(br#"{"text":"hi"}"#);
    for server in SERVERS {
        let (id, id_len) = guest.bytes(server.as_bytes());
        guest = guest.raw(&format!(
            "(call $cap (i32.const 8192) (i32.const 65536))
             (call $out (call $mcp_call_tool (call $mcp_open (i32.const {id}) (i32.const {id_len}))
               (i32.const {tool}) (i32.const {tool_len}) (i32.const {args}) (i32.const {args_len})
               (i32.const 16384) (i32.const 8192)))
             (call $emit (i32.const 16384) (call $len (i32.const 8192)))"
        ));
    }
    guest
        .param("mcp.decision_log", json!(true))
        .msg("user", "use the tools")
        .send(2)
        .recv()
        .build()
}

#[test]
fn no_resolved_secret_reaches_a_guest_a_model_or_a_log_line() {
    let secret = format!("qv-secret-{}-Zx9", std::process::id());
    let rejecting = FixtureHttp::spawn(
        "http",
        &[
            "--api-key-header",
            "x-api-key",
            "--api-key",
            "the-right-key",
        ],
    );
    let registry = registry(&rejecting);
    let llm = ScriptedLlm::start_blocking(vec![
        Reply::tool_call("c1", "mcp__echoing__echo", json!({"text": "hi"})),
        Reply::text("done"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("quiver.toml");
    std::fs::write(
        &config,
        format!(
            "default_backend = \"scripted\"\n[backends.scripted]\nbase_url = {:?}\ndefault_model = \"m\"\n[egress]\nallow_private = [\"127.0.0.0/8\"]\n",
            llm.base_url()
        ),
    )
    .unwrap();
    let task = dir.path().join("task.json");
    let spec = json!({
        "task_id": "secrets",
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": json!(SERVERS).to_string()},
        "limits": {"deadline_ms": 120000}
    });
    std::fs::write(&task, spec.to_string()).unwrap();
    let module = dir.path().join("guest.wat");
    std::fs::write(&module, guest()).unwrap();
    let output = Command::new(quiver_cli())
        .env("QV_SECRET", &secret)
        .env("RUST_LOG", "trace")
        .env_remove("QUIVER_LOG")
        .env_remove("QUIVER_REGISTRY")
        .args([
            "--log-level",
            "trace",
            "run",
            "--no-cache",
            "--explain-policy",
        ])
        .arg(&module)
        .arg("--task")
        .arg(&task)
        .arg("--registry")
        .arg(registry.path())
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let model_saw = serde_json::to_string(&llm.requests()).unwrap();
    // Any 12 bytes of it count: a line cut at its length limit may carry only the start,
    // and a URL host carries it lowercased (the start is lowercase).
    let start = &secret[..12];
    for (channel, text) in [
        ("stdout", &*stdout),
        ("stderr", &*stderr),
        ("the model's requests", &model_saw),
    ] {
        if let Some(at) = text.find(start) {
            let from = text[..at].rfind('\n').map_or(0, |i| i + 1);
            let to = text[at..].find('\n').map_or(text.len(), |i| at + i);
            panic!("the secret reached {channel}: {}", &text[from..to]);
        }
    }

    // The secret was really there to leak, in each place looked at.
    // The guest's lines share stderr with the log; a log line may follow on the same line.
    let emitted: Vec<Value> = stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| {
            serde_json::Deserializer::from_str(l)
                .into_iter()
                .next()?
                .ok()
        })
        .collect();
    assert_eq!(emitted.len(), SERVERS.len() + 1, "{stderr}");
    for (server, answer) in SERVERS.iter().zip(&emitted) {
        let message = answer["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{server}: {answer}"));
        if ["web", "absent", "echoing", "hosted"].contains(server) {
            assert!(message.contains("[redacted]"), "{server}: {message}");
        }
    }
    assert!(
        emitted[4]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("upstream refused token [redacted]"),
        "{}",
        emitted[4]
    );
    let decisions = &emitted[SERVERS.len()]["_spear"]["mcp"]["decisions"];
    for server in ["web", "denied", "broken", "absent", "hosted"] {
        assert!(
            decisions
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["server_id"] == server && d["reason"] == "list_failed"),
            "{server} missing from {decisions}"
        );
    }
    assert!(decisions.to_string().contains("[redacted]"), "{decisions}");
    let results = tool_results(&llm.request(1));
    assert!(
        results[0].1.contains("upstream refused token [redacted]"),
        "the tool result the model saw: {results:?}"
    );
    assert!(stderr.contains("excluded web: list_failed"), "{stderr}");
    assert!(
        stderr.contains("cannot start with [redacted] and [redacted]"),
        "the server's own stderr line, cleaned: {stderr}"
    );
}
