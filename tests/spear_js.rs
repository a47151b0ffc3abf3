//! SPEAR's JavaScript samples (`samples/wasm-js/*`): SPEAR's Boa runner (`spear-boa`,
//! boa_engine 0.19) with each sample's `entry.mjs` built in, as SPEAR's `make samples` builds
//! them, vendored under fixtures/spear-samples/js by scripts/build-spear-js.sh. They run
//! unchanged under the real `quiver run` with default log flags against the scripted LLM
//! over real HTTP.
//!
//! The runner's `console.log` is the `log` hostcall (stderr under `quiver run`); the text
//! the sample's `main` returns is printed with `println!` (the guest's stdout).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use quiver_tests::llm::{Reply, ScriptedLlm, messages, tool_names, tool_results};
use quiver_tests::node::sha256_hex;
use quiver_tests::{quiver_cli, workspace};
use serde_json::json;

/// The vendored files and the sha256 recorded for each (also in the directory's README).
const VENDORED: [(&str, &str); 3] = [
    (
        "js-chat_completion.wasm",
        "4ac3040ca8f1369afff9fb1f2f5d67c3dbc7f655aec4e2dccdc4db1f4602fa1e",
    ),
    (
        "js-chat_completion_tool_sum.wasm",
        "c6aaf804fbbd0219d5ff61c50a7b64866f90eb40752ab3bee6c5e806519ab1a6",
    ),
    (
        "js-user_stream_echo.wasm",
        "996001b563aa6ae06282629c4722f1c20b0ea8621067d519bc06bcf50b69d407",
    ),
];

fn dir() -> PathBuf {
    workspace().join("fixtures/spear-samples/js")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `quiver run` of the vendored `file` with no log flags and the default backend on `llm`,
/// with `flag` and `stdin` when given.
fn quiver_run(llm: &ScriptedLlm, file: &str, flag: Option<&str>, stdin: &[u8]) -> Output {
    let mut command = Command::new(quiver_cli());
    command
        .env_remove("QUIVER_LOG")
        .env_remove("QUIVER_CONFIG")
        .env_remove("QUIVER_REGISTRY")
        .env_remove("RUST_LOG")
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", llm.base_url())
        .args(["run", "--no-cache"]);
    if let Some(flag) = flag {
        command.arg(flag);
    }
    let mut child = command
        .arg(dir().join(file))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run quiver");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().expect("quiver ends")
}

#[test]
fn vendored_samples_are_the_recorded_builds() {
    let readme = std::fs::read_to_string(dir().join("README.md")).unwrap();
    for (file, recorded) in VENDORED {
        let bytes = std::fs::read(dir().join(file)).unwrap();
        let sha256 = sha256_hex(&bytes);
        assert_eq!(
            sha256, recorded,
            "{file} is not the build recorded here: rebuild it with scripts/build-spear-js.sh, \
             or record the new build's sha256 here and in the README"
        );
        assert!(
            readme.contains(&format!("| `{file}` | `{recorded}` |")),
            "the README's table does not record {file} as {recorded}"
        );
    }
}

#[test]
fn js_chat_completion_logs_and_returns_the_answer() {
    let answer = "Hi! I am Quiver's scripted model, answering SPEAR's JS sample.";
    let llm = ScriptedLlm::start_blocking(vec![Reply::text(answer)]);
    let output = quiver_run(&llm, "js-chat_completion.wasm", None, b"");
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let request = llm.request(0);
    assert_eq!(request["model"], "gpt-4o-mini");
    assert_eq!(
        messages(&request),
        &vec![json!({"role": "user", "content": "Hi"})]
    );
    // `console.log(resp.text())`, then `main`'s result printed by the runner.
    assert_eq!(stderr, format!("{answer}\n"));
    assert_eq!(text(&output.stdout), format!("{answer}\n"));
}

#[test]
fn js_chat_completion_tool_sum_runs_its_js_tool() {
    let answer = "7 + 35 = 42, and 123456 + 654321 = 777777.";
    let llm = ScriptedLlm::start_blocking(vec![
        Reply::tool_calls([
            ("call_1", "sum", json!({"a": 7, "b": 35})),
            ("call_2", "sum", json!({"a": 123456, "b": 654321})),
        ]),
        Reply::text(answer),
    ]);
    let output = quiver_run(&llm, "js-chat_completion_tool_sum.wasm", None, b"");
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(tool_names(&llm.request(0)), ["sum"]);
    assert_eq!(
        llm.request(0)["tools"][0]["function"]["parameters"]["required"],
        json!(["a", "b"])
    );
    // The JS handler's own result, as JSON, for each call.
    assert_eq!(
        tool_results(&llm.request(1)),
        [
            ("call_1".to_owned(), r#"{"sum":42}"#.to_owned()),
            ("call_2".to_owned(), r#"{"sum":777777}"#.to_owned()),
        ]
    );
    assert_eq!(
        stderr,
        "sum invoked: a= 7 b= 35\nsum invoked: a= 123456 b= 654321\n"
    );
    assert_eq!(text(&output.stdout), format!("{answer}\n"));
    assert_eq!(llm.remaining(), 0);
}

/// The echo sample on user stream 0, bound to the terminal: each line comes back, and the
/// sample ends when the session closes (stdin's end).
#[test]
fn js_user_stream_echo_echoes_and_ends_when_the_session_closes() {
    let llm = ScriptedLlm::start_blocking(vec![]);
    let output = quiver_run(
        &llm,
        "js-user_stream_echo.wasm",
        Some("--user-stream-stdio"),
        b"ping\npong\n",
    );
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(text(&output.stdout), "ping\npong\n", "{stderr}");
    for line in [
        "user_stream_echo(js) started",
        "stream connected: 0",
        "session closed",
    ] {
        assert!(stderr.contains(line), "{line:?} not in {stderr}");
    }
    assert_eq!(llm.request_count(), 0);
}
