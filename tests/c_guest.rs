//! C guests built with clang against `guest-sdk/c/spear.h`, run by the real host against
//! the scripted OpenAI-wire server and the fixture MCP server: the example
//! `examples/c-chat-tools`, a program written the way SPEAR's C samples are
//! (`tests/c/spear_compat.c`), and the header's own work on hostile input
//! (`tests/c/header_edges.c`).
//!
//! They need clang, wasm-ld and wasi-libc; without them they fail and say to run
//! `scripts/setup.sh`.

use std::process::Command;

use quiver_tests::c::c_guest;
use quiver_tests::chat_wat::scripted_host;
use quiver_tests::llm::{Reply, ScriptedLlm, tool_names, tool_results};
use quiver_tests::{RegistryDir, fixture_server, mcp_task, quiver_cli, run, workspace};
use serde_json::{Value, json};

#[tokio::test]
async fn the_c_example_calls_mcp_directly_and_chats_with_a_c_tool_and_an_mcp_tool() {
    let guest = c_guest("examples/c-chat-tools/main.c", "c-chat-tools", &[]);
    let llm = ScriptedLlm::start(vec![
        Reply::tool_calls([
            ("w", "get_weather", json!({"city": "Pa\"ris \\ Ω"})),
            ("a", "mcp__fixture__add", json!({"a": 2, "b": 3})),
        ]),
        Reply::text("Sunny in Paris; 2+3=5.\nBye \"now\"."),
    ])
    .await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["add", "big", "count"], "");
    let host = scripted_host(&registry, &llm);
    let out = run(&host, &guest, &mcp_task("c-chat-tools", &["fixture"])).await;
    assert!(out.success(), "{}{}", out.stdout_text(), out.stderr_text());
    assert_eq!(
        out.stdout_text(),
        "registry: fixture\n\
         mcp add(2, 3) = 5\n\
         mcp big(50000): 50000 bytes of text\n\
         mcp count = 3\n\
         Sunny in Paris; 2+3=5.\nBye \"now\".\n\
         tools used: get_weather (guest), mcp__fixture__add (mcp)\n"
    );

    let first = llm.request(0);
    assert_eq!(
        tool_names(&first),
        [
            "get_weather",
            "mcp__fixture__add",
            "mcp__fixture__big",
            "mcp__fixture__count"
        ]
    );
    assert_eq!(
        first["tools"][0]["function"]["parameters"]["required"],
        json!(["city"])
    );
    assert_eq!(first["messages"][0]["role"], "system");
    assert_eq!(
        first["messages"][1]["content"],
        "What's the weather in Paris, and what is 2+3?"
    );
    assert_eq!(
        tool_results(&llm.request(1)),
        [
            ("w".to_owned(), "Sunny, 21°C in Pa\"ris \\ Ω".to_owned()),
            ("a".to_owned(), "5".to_owned())
        ],
        "the C tool's result and the MCP result reach the model"
    );
    host.shutdown().await;
}

/// The guest's log lines (level, message) from the JSON host log of `quiver run`: a debug
/// event per line, with the guest's level (2 info, 4 error).
fn guest_logs(stderr: &str) -> Vec<(u64, String)> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["target"] == "quiver::guest" && l["level"] == "DEBUG")
        .map(|l| {
            (
                l["fields"]["level"].as_u64().unwrap_or(99),
                l["fields"]["message"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_spear_style_c_program_builds_against_the_header_and_runs_unchanged() {
    let guest = c_guest("tests/c/spear_compat.c", "spear-compat", &[]);
    let llm = ScriptedLlm::start_blocking(vec![
        Reply::tool_call("call_sum", "sum", json!({"a": 7, "b": 35})),
        Reply::text("7 + 35 = 42"),
    ]);
    let output = Command::new(quiver_cli())
        .current_dir(workspace())
        .env("QUIVER_FIXTURE_SERVER", fixture_server())
        .env("OPENAI_BASE_URL", llm.base_url())
        .env("OPENAI_API_KEY", "sk-test")
        .env_remove("QUIVER_CONFIG")
        .env_remove("QUIVER_LOG")
        .args([
            "--log-level",
            "quiver::guest=debug",
            "--log-format",
            "json",
            "run",
            "--no-cache",
        ])
        .arg(&guest)
        .output()
        .expect("run quiver");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "",
        "printf went to the log"
    );
    let expected = [
        (2, "time_now_ms_plausible=1"),
        (2, "set_model_rc=0"),
        (2, "set_timeout_rc=0"),
        (2, "set_hostile_rc=0"),
        (2, "set_hostile_key_rc=0"),
        (2, "set_json_rc=0"),
        (2, "malformed_json_is_internal=1 eio=1"),
        (2, "write_msg_rc=0"),
        (2, "write_fn_rc=0"),
        (2, "sum invoked: a=7 b=35 nul_after_args=1"),
        (2, "response_len_matches=1"),
        (2, "response_has_answer=1"),
        (2, "small_recv_enospc=1 needed_is_len=1"),
        (4, "stderr goes to the error level"),
        (2, "puts goes to the info level"),
    ];
    let logged = guest_logs(&stderr);
    let logged: Vec<(u64, &str)> = logged.iter().map(|(l, m)| (*l, m.trim_end())).collect();
    assert_eq!(logged, expected, "{stderr}");
    // The lines themselves are the guest's output on stderr, as written, whatever the host
    // log shows.
    let shown: Vec<&str> = stderr.lines().filter(|l| !l.starts_with('{')).collect();
    let lines: Vec<&str> = expected.iter().map(|(_, m)| *m).collect();
    assert_eq!(shown, lines, "{stderr}");

    let first = llm.request(0);
    assert_eq!(first["model"], "compat-model");
    assert_eq!(first["temperature"], 0.25);
    assert_eq!(first["user"], "q\"uote \\back\nnl\ttab\u{1}\u{1f} café }{");
    assert_eq!(first["x-\"key\\\n"], "v");
    assert_eq!(tool_names(&first), ["sum"]);
    assert_eq!(
        tool_results(&llm.request(1)),
        [("call_sum".to_owned(), "{\"sum\":42}".to_owned())]
    );
}

#[tokio::test]
async fn the_headers_helpers_escape_grow_bound_and_report_errors() {
    let guest = c_guest(
        "tests/c/header_edges.c",
        "header-edges",
        &["-DSPEAR_ALLOC_MAX=100000"],
    );
    let llm = ScriptedLlm::start(vec![Reply::text("scripted hello")]).await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["add", "big", "count"], "");
    let host = scripted_host(&registry, &llm);
    let out = run(&host, &guest, &mcp_task("header-edges", &["fixture"])).await;
    assert!(out.success(), "{}{}", out.stdout_text(), out.stderr_text());
    assert_eq!(
        out.stdout_text(),
        "hostile_value=0\nhostile_key=0\nu32_max=0\nvalue_json=0\nlong_value=0\n\
         null_key_internal=1\nnull_msg_invalid_ptr=1\nbad_role_einval=1\n\
         recv=1\nmessages_has_answer=1\nrecv_bad_fd_null=1\n\
         registry_get_unknown=1\nregistry_get=1\nopen_unknown=1\ncall_bad_fd=1\n\
         big_grown=1\nbig_over_alloc_max_enomem=1\nmalformed_args_eio=1\ndenied_tool_eacces=1\n\
         count=3\n\
         tool_output_enospc=1 needed=6\nlong_log=2000\nbad_level_einval=1\n",
        "{}",
        out.stderr_text()
    );

    let hostile: String = (1u8..0x20)
        .map(char::from)
        .chain("\"\\/'}{é🦀".chars())
        .collect();
    let sent = llm.request(0);
    assert_eq!(sent["hostile"], hostile.as_str());
    assert_eq!(sent[hostile.as_str()], "key");
    assert_eq!(sent["max_u32"], u32::MAX);
    assert_eq!(sent["seed"], json!([1, {"a": null}]));
    assert_eq!(sent["long"], "v".repeat(60_000));
    host.shutdown().await;
}

#[tokio::test]
async fn a_c_guest_waits_for_three_mcp_calls_at_once_with_sp_ep() {
    let guest = c_guest("tests/c/epoll_calls.c", "epoll-calls", &[]);
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["slow"], "");
    let host = quiver_tests::host(&registry);
    // A first run starts the server, so the second times the calls alone.
    let task = mcp_task("epoll-calls", &["fixture"]);
    run(&host, &guest, &task).await;
    let out = run(&host, &guest, &task).await;
    host.shutdown().await;
    assert!(out.success(), "{}{}", out.stdout_text(), out.stderr_text());
    let stdout = out.stdout_text();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    for line in &lines[..3] {
        let answer: Value = serde_json::from_str(line).expect("a CallToolResult");
        assert_eq!(answer["content"][0]["text"], "slept 300ms");
    }
    let took: u64 = lines[3]
        .strip_prefix("took ")
        .and_then(|t| t.strip_suffix(" ms"))
        .and_then(|t| t.parse().ok())
        .expect("took N ms");
    assert!(
        (300..600).contains(&took),
        "three 300 ms calls took {took} ms: they did not overlap"
    );
}
