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

/// Resources of the everything server under a registry `allowed_resources`: lists are
/// filtered, static and template resources read, a URI outside the patterns is `-EACCES`
/// before the server sees it, a small buffer gets the needed length and the kept answer,
/// and a resource over `max_tool_output_bytes` is a bounded error object.
#[tokio::test]
async fn a_guest_lists_and_reads_the_everything_servers_resources_within_allowed_resources() {
    let registry = RegistryDir::new();
    let everything = npm_bin("mcp-server-everything");
    let allowed = "allowed_resources = [\"demo://resource/static/document/architecture.md\", \"demo://resource/dynamic/text/*\"]\n";
    registry.write(
        "everything.toml",
        &format!(
            "{allowed}{}",
            stdio_record("everything", &everything, &[], &["echo"])
        ),
    );
    registry.write(
        "tiny.toml",
        &format!(
            "{allowed}{}max_tool_output_bytes = 300\n",
            stdio_record("tiny", &everything, &[], &["echo"])
        ),
    );
    let host = host(&registry);
    let static_uri = "demo://resource/static/document/architecture.md";
    let dynamic_uri = "demo://resource/dynamic/text/3";
    let denied_uri = "demo://resource/static/document/structure.md";
    // Records the result and the length slot, and emits the answer when it fitted.
    let read = |uri_at: u32, uri: &str, cap: u32| {
        format!(
            "(call $cap (i32.const 8192) (i32.const {cap}))
      (call $out (call $mcp_read_resource (local.get $fd) (i32.const {uri_at}) (i32.const {}) (i32.const 16384) (i32.const 8192)))
      (call $out (call $len (i32.const 8192)))
      (if (i32.le_u (call $len (i32.const 8192)) (i32.const {cap}))
        (then (call $emit (i32.const 16384) (call $len (i32.const 8192)))))",
            uri.len()
        )
    };
    let body = format!(
        r#"(func $main (local $fd i32)
      (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 10)))
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_list_resources (local.get $fd) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_list_resource_templates (local.get $fd) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))
      {}
      {}
      {}
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_read_resource (local.get $fd) (i32.const 1300) (i32.const {})
        (i32.const 16384) (i32.const 8192)))
      (call $out (call $mcp_read_resource (local.get $fd) (i32.const 1400) (i32.const 5000)
        (i32.const 16384) (i32.const 8192)))
      (local.set $fd (call $mcp_open (i32.const 1040) (i32.const 4)))
      {})"#,
        read(1100, static_uri, 16),
        read(1100, static_uri, 200000),
        read(1200, dynamic_uri, 200000),
        denied_uri.len(),
        read(1100, static_uri, 200000),
    );
    let guest = wat::guest(
        &[
            (1024, b"everything"),
            (1040, b"tiny"),
            (1100, static_uri.as_bytes()),
            (1200, dynamic_uri.as_bytes()),
            (1300, denied_uri.as_bytes()),
        ],
        &body,
    );
    let task = mcp_task("resources", &["everything", "tiny"]);
    let run = wat::run(&host, &guest, &task).await;
    let (r, e) = (&run.results, &run.emitted);
    let json = |i: usize| -> Value { serde_json::from_str(&e[i]).expect(&e[i]) };

    let listed = json(0);
    let uris: Vec<_> = listed["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert_eq!(
        uris,
        [static_uri],
        "filtered by allowed_resources: {listed}"
    );
    let templates: Vec<_> = json(1)["resourceTemplates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["uriTemplate"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(templates, ["demo://resource/dynamic/text/{resourceId}"]);

    // Too small: -ENOSPC with the needed length; the retry gets the kept answer whole.
    assert_eq!(r[2], quiver_tests::errno::ENOSPC, "{r:?}");
    let needed = r[3];
    assert!(needed > 16, "{r:?}");
    assert_eq!(r[4], needed, "{r:?}");
    let document = json(2);
    assert_eq!(document["contents"][0]["uri"], static_uri);
    assert_eq!(document["contents"][0]["mimeType"], "text/markdown");
    assert!(document["contents"][0]["text"].as_str().unwrap().len() > 100);

    let dynamic = json(3);
    assert!(
        dynamic["contents"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Resource 3"),
        "{dynamic}"
    );
    // Outside allowed_resources, and a URI over the length cap.
    assert_eq!(r[8], quiver_tests::errno::EACCES, "{r:?}");
    assert_eq!(r[9], quiver_tests::errno::EINVAL, "{r:?}");
    // The `tiny` record caps output at 300 bytes: an error object, not a cut document.
    assert!(r[10] > 0, "{r:?}");
    let too_large = json(4);
    assert_eq!(
        too_large["error"]["code"], "mcp_output_too_large",
        "{too_large}"
    );
    assert!(e[4].len() < 1000);
    host.shutdown().await;
}

/// Prompts of the everything server under a registry `allowed_prompts`: the list is
/// filtered, `args-prompt` gets the guest's city, an unlisted prompt is `-EACCES`, a small
/// buffer gets the kept answer on retry, and non-string arguments are an error object.
#[tokio::test]
async fn a_guest_lists_and_gets_the_everything_servers_prompts_within_allowed_prompts() {
    let registry = RegistryDir::new();
    registry.write(
        "everything.toml",
        &format!(
            "allowed_prompts = [\"simple-prompt\", \"args-*\"]\n{}",
            stdio_record(
                "everything",
                &npm_bin("mcp-server-everything"),
                &[],
                &["echo"]
            )
        ),
    );
    let host = host(&registry);
    let args = br#"{"city": "Lisbon"}"#;
    let bad_args = br#"{"city": 5}"#;
    let body = format!(
        r#"(func $main (local $fd i32)
      (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 10)))
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_list_prompts (local.get $fd) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))
      (call $cap (i32.const 8192) (i32.const 8))
      (call $out (call $mcp_get_prompt (local.get $fd) (i32.const 1100) (i32.const 11) (i32.const 1200) (i32.const {args_len}) (i32.const 16384) (i32.const 8192)))
      (call $out (call $len (i32.const 8192)))
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_get_prompt (local.get $fd) (i32.const 1100) (i32.const 11) (i32.const 1200) (i32.const {args_len}) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))
      (call $out (call $mcp_get_prompt (local.get $fd) (i32.const 1300) (i32.const 18) (i32.const 0) (i32.const 0) (i32.const 16384) (i32.const 8192)))
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_get_prompt (local.get $fd) (i32.const 1100) (i32.const 11) (i32.const 1400) (i32.const {bad_len}) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192))))"#,
        args_len = args.len(),
        bad_len = bad_args.len(),
    );
    let guest = wat::guest(
        &[
            (1024, b"everything"),
            (1100, b"args-prompt"),
            (1200, args),
            (1300, b"completable-prompt"),
            (1400, bad_args),
        ],
        &body,
    );
    let run = wat::run(&host, &guest, &mcp_task("prompts", &["everything"])).await;
    let (r, e) = (&run.results, &run.emitted);
    let json = |i: usize| -> Value { serde_json::from_str(&e[i]).expect(&e[i]) };
    let names: Vec<_> = json(0)["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["simple-prompt", "args-prompt"], "{r:?} {e:?}");

    assert_eq!(r[1], quiver_tests::errno::ENOSPC, "{r:?}");
    assert_eq!(r[3], r[2], "the retry gets the needed length: {r:?}");
    let prompt = json(1);
    let text = prompt["messages"][0]["content"]["text"].as_str().unwrap();
    assert!(text.contains("Lisbon"), "{prompt}");

    assert_eq!(r[4], quiver_tests::errno::EACCES, "{r:?}");
    assert_eq!(json(2)["error"]["code"], "mcp_invalid_arguments", "{e:?}");
    host.shutdown().await;
}
