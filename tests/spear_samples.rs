//! SPEAR's own prebuilt C samples (fixtures/spear-samples, vendored unchanged) under the real
//! `quiver run` with default log flags, against the scripted LLM over real HTTP and, for
//! `mcp_fs`, the npm filesystem MCP server.
//!
//! The samples print through SPEAR's `printf`, which is the `log` hostcall with a 1 KiB
//! buffer (the line is cut at 1023 bytes): the model's answer must be in what they print,
//! and the printed lines must be the guest's own, not host log lines.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use quiver_tests::llm::{Reply, ScriptedLlm, tool_results};
use quiver_tests::{RegistryDir, quiver_cli, workspace};
use serde_json::json;

fn sample(name: &str) -> PathBuf {
    workspace()
        .join("fixtures/spear-samples")
        .join(format!("{name}.wasm"))
}

/// `quiver run` of `sample` with no log flags, the default backend on `llm`.
fn quiver_run(llm: Option<&ScriptedLlm>, extra: &[&str], sample: &Path) -> Output {
    let mut command = Command::new(quiver_cli());
    command
        .env_remove("QUIVER_LOG")
        .env_remove("QUIVER_CONFIG")
        .env_remove("QUIVER_REGISTRY")
        .env_remove("RUST_LOG")
        .env("OPENAI_API_KEY", "sk-test")
        .args(["run", "--no-cache"])
        .args(extra)
        .arg(sample);
    match llm {
        Some(llm) => command.env("OPENAI_BASE_URL", llm.base_url()),
        None => command.env_remove("OPENAI_BASE_URL"),
    };
    command.output().expect("run quiver")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The printed line that starts with `prefix`, up to the next line the guest printed.
fn printed<'a>(stderr: &'a str, prefix: &str) -> &'a str {
    let start = stderr
        .find(prefix)
        .unwrap_or_else(|| panic!("no `{prefix}` in:\n{stderr}"));
    let rest = &stderr[start..];
    rest.split_once('\n').map_or(rest, |(line, _)| line)
}

/// Asserts the model's `answer` is in the JSON the sample printed after `prefix`. (The
/// sample's own 1 KiB print buffer bounds the line, so its length proves nothing.)
fn assert_answer_printed(stderr: &str, prefix: &str, answer: &str) {
    let line = printed(stderr, prefix);
    let escaped = serde_json::to_string(answer).unwrap();
    let escaped = &escaped[1..escaped.len() - 1];
    assert!(
        line.contains(&format!(r#""content":"{escaped}""#)),
        "the answer is not in what the guest printed:\n{line}"
    );
}

#[test]
fn hello_prints_its_own_lines_and_nothing_else() {
    let output = quiver_run(None, &[], &sample("hello"));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(
        text(&output.stdout),
        "",
        "SPEAR's printf is the log hostcall"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert_eq!(lines[0], "hello spear wasm");
    let now: u64 = lines[1]
        .strip_prefix("time_now_ms: ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(now > 1_700_000_000_000, "{now}");
}

#[test]
fn chat_completion_prints_the_answer_and_finds_the_backend() {
    let answer = "My name is Quiver's scripted model, and this reply is long enough to matter.";
    let llm = ScriptedLlm::start_blocking(vec![Reply::text(answer)]);
    let output = quiver_run(Some(&llm), &[], &sample("chat_completion"));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(llm.request(0)["model"], "gpt-4o-mini");
    assert!(stderr.starts_with("debug_model=gpt-4o-mini\n"), "{stderr}");
    assert_answer_printed(&stderr, "response_json=", answer);
    // It looks for `"_spear"` and then `"backend":"` in the whole body.
    assert!(stderr.contains("\ndebug_backend=openai\n"), "{stderr}");
}

#[test]
fn chat_completion_tool_sum_runs_its_tool_and_prints_the_answer() {
    let answer = "7 + 35 = 42";
    let llm = ScriptedLlm::start_blocking(vec![
        Reply::tool_call("call_sum", "sum", json!({"a": 7, "b": 35})),
        Reply::text(answer),
    ]);
    let output = quiver_run(Some(&llm), &[], &sample("chat_completion_tool_sum"));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("\nsum invoked: a=7 b=35 sum=42 cap="),
        "{stderr}"
    );
    assert_eq!(
        tool_results(&llm.request(1)),
        [("call_sum".to_owned(), r#"{"sum":42}"#.to_owned())]
    );
    // One printf: the count, a newline the guest wrote, and the body.
    let head = printed(&stderr, "chat response (");
    assert!(head.ends_with(" bytes):"), "{head}");
    assert_answer_printed(&stderr, "{\"choices\"", answer);
}

#[test]
fn mcp_fs_reads_through_the_filesystem_server_and_prints_the_answer() {
    let npm_bin = workspace().join("fixtures/npm/node_modules/.bin/mcp-server-filesystem");
    assert!(
        npm_bin.exists(),
        "{} is missing: run scripts/setup.sh",
        npm_bin.display()
    );
    let files = tempfile::tempdir().unwrap();
    let root = files.path().canonicalize().unwrap();
    let manifest = "[package]\nname = \"spear-sample\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n";
    std::fs::write(root.join("Cargo.toml"), manifest).unwrap();
    // The registry allows every tool, so the sample's own allowlist (`read_*`, `list_*`)
    // leaves the write tools out: a decision log that used to push the answer past 1 KiB.
    let registry = RegistryDir::new();
    registry.write(
        "fs.toml",
        &format!(
            "server_id = \"fs\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = {:?}\nargs = [{:?}]\n[budgets]\ntool_timeout_ms = 30000\n",
            npm_bin.to_str().unwrap(),
            root.to_str().unwrap()
        ),
    );
    let task = files.path().join("task.json");
    let spec = json!({
        "task_id": "mcp_fs",
        "config": {"mcp.enabled": "true", "mcp.allowed_server_ids": "[\"fs\"]"},
        "limits": {"deadline_ms": 120000}
    });
    std::fs::write(&task, spec.to_string()).unwrap();

    let answer = "[package] name = spear-sample, version = 0.1.0, edition = 2021. MCP_OK";
    let path = root.join("Cargo.toml");
    let llm = ScriptedLlm::start_blocking(vec![
        Reply::tool_call("read_1", "mcp__fs__read_text_file", json!({"path": path})),
        Reply::text(answer),
    ]);
    let output = quiver_run(
        Some(&llm),
        &[
            "--registry",
            registry.path().to_str().unwrap(),
            "--task",
            task.to_str().unwrap(),
        ],
        &sample("mcp_fs"),
    );
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let offered = quiver_tests::llm::tool_names(&llm.request(0));
    assert!(
        offered.contains(&"mcp__fs__read_text_file".to_owned())
            && !offered.iter().any(|t| t.contains("write")),
        "{offered:?}"
    );
    let results = tool_results(&llm.request(1));
    assert!(
        results[0].1.contains("name = \"spear-sample\""),
        "the file came from the real server: {results:?}"
    );
    assert_answer_printed(&stderr, "response_json=", answer);
    assert!(
        !stderr.contains("decisions"),
        "the decision log is opt-in: {stderr}"
    );
}
