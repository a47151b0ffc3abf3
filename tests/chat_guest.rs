//! The Rust `chat-tools` example guest, built from `examples/`, end to end: against the
//! scripted OpenAI-wire server through the library, through the `quiver` binary with the
//! zero-config backend and `--record`, and offline with the shipped replay transcript.

use std::process::Command;

use quiver_tests::chat_wat::scripted_host;
use quiver_tests::llm::{Reply, ScriptedLlm, Wire, tool_names, tool_results};
use quiver_tests::{
    RegistryDir, example_guest, fixture_server, mcp_task, quiver_cli, run, workspace,
};
use serde_json::json;

fn script() -> Vec<Reply> {
    vec![
        Reply::tool_calls([
            ("w", "get_weather", json!({"city": "Paris"})),
            ("a", "mcp__fixture__add", json!({"a": 2, "b": 3})),
        ]),
        Reply::text("Sunny in Paris; 2+3=5."),
    ]
}

#[tokio::test]
async fn the_rust_chat_guest_runs_a_guest_tool_and_an_mcp_tool() {
    let llm = ScriptedLlm::start(script()).await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["add"], "");
    let host = scripted_host(&registry, &llm);
    let out = run(
        &host,
        &example_guest("chat-tools"),
        &mcp_task("chat-tools", &["fixture"]),
    )
    .await;
    assert!(out.success(), "{}{}", out.stdout_text(), out.stderr_text());
    assert_eq!(
        out.stdout_text(),
        "Sunny in Paris; 2+3=5.\ntools used: get_weather (guest), mcp__fixture__add (mcp)\n"
    );
    let first = llm.request(0);
    assert_eq!(tool_names(&first), ["get_weather", "mcp__fixture__add"]);
    let weather = &first["tools"][0]["function"];
    assert_eq!(weather["parameters"]["required"], json!(["city"]));
    assert_eq!(
        tool_results(&llm.request(1)),
        [
            ("w".to_owned(), "Sunny, 21°C in Paris".to_owned()),
            ("a".to_owned(), "5".to_owned())
        ]
    );
    host.shutdown().await;
}

/// The same guest, unchanged, on every wire format: the same output, and every request one
/// its API accepts (the scripted servers refuse the rest).
#[tokio::test]
async fn the_rust_chat_guest_runs_unchanged_on_every_backend_kind() {
    for wire in [Wire::OpenAi, Wire::Responses, Wire::Anthropic, Wire::Gemini] {
        let llm = ScriptedLlm::start_wire(script(), wire);
        let registry = RegistryDir::new();
        registry.fixture("fixture", &["add"], "");
        let host = scripted_host(&registry, &llm);
        let out = run(
            &host,
            &example_guest("chat-tools"),
            &mcp_task("chat-tools", &["fixture"]),
        )
        .await;
        assert!(
            out.success(),
            "{wire:?}: {}{}",
            out.stdout_text(),
            out.stderr_text()
        );
        assert_eq!(
            out.stdout_text(),
            "Sunny in Paris; 2+3=5.\ntools used: get_weather (guest), mcp__fixture__add (mcp)\n",
            "{wire:?}"
        );
        assert_eq!(llm.request_count(), 2, "{wire:?}");
        let second = llm.request(1).to_string();
        assert!(
            second.contains("Sunny, 21°C in Paris"),
            "{wire:?}: the guest tool's result goes back: {second}"
        );
        host.shutdown().await;
    }
}

fn quiver() -> Command {
    let mut cmd = Command::new(quiver_cli());
    cmd.current_dir(workspace())
        .env("QUIVER_FIXTURE_SERVER", fixture_server())
        .env_remove("QUIVER_CONFIG")
        .env_remove("OPENAI_MODEL")
        .args([
            "run",
            "--no-cache",
            "--task",
            "fixtures/tasks/chat.json",
            "--registry",
            "fixtures/registry",
        ]);
    cmd
}

#[test]
fn the_cli_uses_the_zero_config_backend_and_records_a_transcript_that_replays() {
    let llm = ScriptedLlm::start_blocking(script());
    let dir = tempfile::tempdir().unwrap();
    let transcript = dir.path().join("recorded.json");
    let output = quiver()
        .arg(example_guest("chat-tools"))
        .arg("--record")
        .arg(&transcript)
        .env("OPENAI_BASE_URL", llm.base_url())
        .env("OPENAI_API_KEY", "sk-test-123")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.starts_with("Sunny in Paris; 2+3=5.\n"), "{stdout}");
    let recorded = llm.recorded();
    assert_eq!(
        recorded[0].header("authorization"),
        Some("Bearer sk-test-123")
    );
    assert_eq!(
        recorded[0].body["model"], "gpt-4o-mini",
        "the zero-config default model"
    );
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("sk-test-123"),
        "the key is never logged"
    );

    std::fs::write(dir.path().join("quiver.toml"), "default_backend = \"again\"\n[backends.again]\nkind = \"replay\"\ntranscript = \"recorded.json\"\n").unwrap();
    let replayed = quiver()
        .arg(example_guest("chat-tools"))
        .arg("--config")
        .arg(dir.path().join("quiver.toml"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&replayed.stdout),
        stdout,
        "{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    assert_eq!(llm.request_count(), 2, "the replay made no request");
}

#[test]
fn the_offline_demo_runs_on_the_shipped_transcript() {
    let output = quiver()
        .arg(example_guest("chat-tools"))
        .args(["--config", "fixtures/quiver.toml"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout,
        "In Paris it is sunny and 21°C, and 2 + 3 = 5.\ntools used: get_weather (guest), mcp__fixture__add (mcp)\n"
    );
}

#[test]
fn a_bad_host_config_names_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("quiver.toml");
    std::fs::write(
        &config,
        "[backends.x]\nkind = \"replay\"\ntransscript = \"t.json\"\n",
    )
    .unwrap();
    let output = quiver()
        .arg(example_guest("chat-tools"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("quiver.toml")
            && stderr.contains("backends.x")
            && stderr.contains("transscript"),
        "{stderr}"
    );
}
