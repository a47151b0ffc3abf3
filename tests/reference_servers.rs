//! The public reference MCP servers from npm (`@modelcontextprotocol/server-filesystem`,
//! `server-everything`), installed by `scripts/setup.sh`, driven by real guests.

use std::path::{Path, PathBuf};

use quiver_tests::{RegistryDir, example_guest, host, mcp_task, run, wat, workspace};
use serde_json::Value;

fn npm_bin(name: &str) -> PathBuf {
    let bin = workspace()
        .join("fixtures/npm/node_modules/.bin")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: run scripts/setup.sh to install the reference servers",
        bin.display()
    );
    bin
}

fn stdio_record(server_id: &str, command: &Path, args: &[&str], allowed: &[&str]) -> String {
    let quote = |items: &[&str]| {
        items
            .iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "server_id = {server_id:?}\ntransport = \"stdio\"\nallowed_tools = [{}]\n[stdio]\ncommand = {:?}\nargs = [{}]\n[budgets]\ntool_timeout_ms = 30000\n",
        quote(allowed),
        command.display().to_string(),
        quote(args)
    )
}

#[tokio::test]
async fn a_guest_reads_a_file_through_the_filesystem_reference_server() {
    let files = tempfile::tempdir().unwrap();
    let root = files.path().canonicalize().unwrap();
    std::fs::write(
        root.join("note.txt"),
        "written by the test, read by the guest\n",
    )
    .unwrap();
    let registry = RegistryDir::new();
    registry.write(
        "fs.toml",
        &stdio_record(
            "fs",
            &npm_bin("mcp-server-filesystem"),
            &[root.to_str().unwrap()],
            &["read_*", "list_*"],
        ),
    );
    let host = host(&registry);
    let note = root.join("note.txt");
    let args = serde_json::json!({"path": note}).to_string();
    let task = mcp_task("fs-read", &["fs"]).with_args(["fs", "read_text_file", args.as_str()]);
    let out = run(&host, &example_guest("mcp-explorer"), &task).await;
    let stdout = out.stdout_text();
    assert!(out.success(), "{stdout}{}", out.stderr_text());
    assert!(stdout.contains("  read_text_file — "), "{stdout}");
    assert!(
        !stdout.contains("write_file"),
        "write tools are outside allowed_tools: {stdout}"
    );
    assert!(
        stdout
            .trim_end()
            .ends_with("written by the test, read by the guest"),
        "{stdout}"
    );

    // The registry's allowlist holds against a real server: writing is refused before it
    // reaches the server, and no file appears.
    let target = root.join("new.txt");
    let args = serde_json::json!({"path": target, "content": "x"}).to_string();
    let task = mcp_task("fs-write", &["fs"]).with_args(["fs", "write_file", args.as_str()]);
    let out = run(&host, &example_guest("mcp-explorer"), &task).await;
    assert_eq!(out.exit_code, 1);
    assert!(
        out.stderr_text().contains("EACCES"),
        "{}",
        out.stderr_text()
    );
    assert!(!target.exists());
    host.shutdown().await;
}

#[tokio::test]
async fn image_results_from_the_everything_reference_server_reach_the_guest_intact() {
    let registry = RegistryDir::new();
    registry.write(
        "everything.toml",
        &stdio_record(
            "everything",
            &npm_bin("mcp-server-everything"),
            &[],
            &["get-tiny-image"],
        ),
    );
    let host = host(&registry);
    let body = r#"(func $main (local $fd i32)
      (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 10)))
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_call_tool (local.get $fd) (i32.const 1100) (i32.const 14) (i32.const 1200) (i32.const 2) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192))))"#;
    let guest = wat::guest(
        &[
            (1024, b"everything"),
            (1100, b"get-tiny-image"),
            (1200, b"{}"),
        ],
        body,
    );
    let run = wat::run(&host, &guest, &mcp_task("image", &["everything"])).await;
    assert!(run.results[0] > 0, "{:?} {:?}", run.results, run.emitted);
    let result: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    let image = result["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "image")
        .expect("an image part");
    assert_eq!(image["mimeType"], "image/png");
    assert!(image["data"].as_str().unwrap().len() > 100);
    host.shutdown().await;
}
