//! The example embedder (examples/embedder) is what the library promises a scheduler: it
//! builds from the library alone, with no HTTP server, gRPC, etcd, OpenTelemetry exporter
//! or CLI crate in its tree, and runs a real guest against a real MCP server with a store,
//! an approver and an observer of its own.

use std::process::Command;

use quiver_tests::{embedder, example_guest, fixture_server, workspace};

fn run_embedder(tool: &str, args: &str) -> (i32, String) {
    let guest = example_guest("mcp-explorer");
    let out = Command::new(embedder())
        .current_dir(workspace())
        .env("QUIVER_FIXTURE_SERVER", fixture_server())
        .arg(&guest)
        .args(["fixture", tool, args])
        .output()
        .expect("run the embedder");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn the_embedders_approver_observer_and_store_decide_a_real_guests_calls() {
    let (code, text) = run_embedder("add", r#"{"a":2,"b":3}"#);
    assert_eq!(code, 0, "{text}");
    for line in [
        "approver: fixture/add for task embedded-task: approved",
        "observer: calling add",
        "observer: add ended ok",
        "embedder: guest exited with 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert!(text.lines().any(|l| l.trim() == "5"), "the sum: {text}");

    let (code, text) = run_embedder("echo", r#"{"text":"hi"}"#);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("approver: fixture/echo for task embedded-task: denied"),
        "{text}"
    );
    assert!(
        text.contains("observer: denied Some(\"echo\")"),
        "the denial is observed: {text}"
    );
    assert!(text.contains("mcp_policy_denied"), "{text}");
    assert!(
        !text.contains("observer: calling echo"),
        "a denied call never starts: {text}"
    );
}

#[test]
fn the_library_alone_pulls_in_no_server_grpc_etcd_or_cli_crate() {
    let node = crate_names("quiver-node");
    assert!(
        node.iter().any(|n| n == "axum")
            && node.iter().any(|n| n == "etcd-client")
            && node.iter().any(|n| n == "opentelemetry-otlp"),
        "the check sees a node's server crates: {node:?}"
    );
    for package in ["quiver", "quiver-embedder"] {
        let names = crate_names(package);
        for forbidden in [
            "axum",
            "etcd-client",
            "tonic",
            "prost",
            "clap",
            "quiver-node",
            "opentelemetry",
            "opentelemetry_sdk",
            "opentelemetry-otlp",
            "tracing-opentelemetry",
        ] {
            assert!(
                !names.iter().any(|n| n == forbidden),
                "{package} depends on {forbidden}: {names:?}"
            );
        }
    }
}

/// Every crate `package` builds with (normal and build dependencies, not dev ones).
fn crate_names(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .current_dir(workspace())
        .args(["tree", "--offline", "--locked", "-e", "normal,build"])
        .args(["--prefix", "none", "--format", "{p}", "-p", package])
        .output()
        .expect("run cargo tree");
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && tree.contains("quiver"),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    tree.lines()
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect()
}
