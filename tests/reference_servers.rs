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

/// One step of a WAT guest on fd `$fd`, with the label its `$out` result is asserted by.
struct Steps {
    data: Vec<(u32, Vec<u8>)>,
    next: u32,
    body: String,
    labels: Vec<String>,
}

impl Steps {
    fn new() -> Self {
        Self {
            data: Vec::new(),
            next: 1024,
            body: String::new(),
            labels: Vec::new(),
        }
    }

    /// Places `bytes` in the test data area (1024..4096) and returns (address, length).
    fn put(&mut self, bytes: &[u8]) -> (u32, usize) {
        let at = self.next;
        self.next += bytes.len() as u32;
        assert!(self.next <= 4096, "test data overflows its area");
        self.data.push((at, bytes.to_vec()));
        (at, bytes.len())
    }

    /// Records the result of the WAT `call` as `label`; with `emit`, the answer is written to
    /// stderr too.
    fn call(&mut self, label: &str, call: &str, emit: bool) -> &mut Self {
        self.body += &format!(
            "\n      (call $cap (i32.const 8192) (i32.const 200000))\n      (call $out {call})"
        );
        if emit {
            self.body += "\n      (call $emit (i32.const 16384) (call $len (i32.const 8192)))";
        }
        self.labels.push(label.to_owned());
        self
    }

    fn read(&mut self, label: &str, uri: &str) -> &mut Self {
        let (at, len) = self.put(uri.as_bytes());
        let call = format!(
            "(call $mcp_read_resource (local.get $fd) (i32.const {at}) (i32.const {len}) (i32.const 16384) (i32.const 8192))"
        );
        self.call(label, &call, false)
    }

    fn get(&mut self, label: &str, prompt: &str) -> &mut Self {
        let (at, len) = self.put(prompt.as_bytes());
        let call = format!(
            "(call $mcp_get_prompt (local.get $fd) (i32.const {at}) (i32.const {len}) (i32.const 0) (i32.const 0) (i32.const 16384) (i32.const 8192))"
        );
        self.call(label, &call, false)
    }

    /// `mcp_set_param` with `param` at `at`, or placed in the data area.
    fn set_at(&mut self, label: &str, param: &str, at: Option<u32>) -> &mut Self {
        let (at, len) = match at {
            Some(at) => (at, param.len()),
            None => self.put(param.as_bytes()),
        };
        let call =
            format!("(call $mcp_set_param (local.get $fd) (i32.const {at}) (i32.const {len}))");
        self.call(label, &call, false)
    }

    fn set(&mut self, label: &str, param: &str) -> &mut Self {
        self.set_at(label, param, None)
    }

    fn list(&mut self, label: &str, hostcall: &str) -> &mut Self {
        let call = format!("(call ${hostcall} (local.get $fd) (i32.const 16384) (i32.const 8192))");
        self.call(label, &call, true)
    }

    /// The guest: `$main` opens `server` as `$fd`, then runs the steps.
    fn guest(&mut self, server: &str, extra: &[(u32, &[u8])]) -> String {
        let (at, len) = self.put(server.as_bytes());
        let body = format!(
            "(func $main (local $fd i32)\n      (local.set $fd (call $mcp_open (i32.const {at}) (i32.const {len}))){})",
            self.body
        );
        let mut data: Vec<(u32, &[u8])> = self.data.iter().map(|(at, b)| (*at, &b[..])).collect();
        data.extend_from_slice(extra);
        wat::guest(&data, &body)
    }

    /// The result recorded under `label`.
    fn result(&self, results: &[i32], label: &str) -> i32 {
        let i = self.labels.iter().position(|l| l == label).unwrap();
        *results
            .get(i)
            .unwrap_or_else(|| panic!("no result for {label}: {results:?}"))
    }
}

/// The layers above the registry narrow the everything server's resources and prompts for
/// a real guest: a task denylist vetoes dynamic resources and a prompt, an fd's own
/// allowlists (`mcp_set_param`) narrow reads, gets and listings further and can never lift
/// the task's veto, hostile lists are `-EINVAL` and leave the fd as it was, and every
/// refusal reaches the audit log naming its layer.
#[tokio::test]
async fn task_and_session_lists_narrow_what_a_guest_reads_and_gets() {
    let registry = RegistryDir::new();
    registry.write(
        "everything.toml",
        &format!(
            "allowed_resources = [\"demo://resource/*\"]\nallowed_prompts = [\"*\"]\n{}",
            stdio_record(
                "everything",
                &npm_bin("mcp-server-everything"),
                &[],
                &["echo"]
            )
        ),
    );
    let audit_dir = tempfile::tempdir().unwrap();
    let audit = audit_dir.path().join("audit.jsonl");
    let host = quiver_tests::host_builder(&registry)
        .with_audit_log(&audit)
        .build()
        .unwrap();
    let architecture = "demo://resource/static/document/architecture.md";
    let structure = "demo://resource/static/document/structure.md";
    let dynamic = "demo://resource/dynamic/text/3";
    let param =
        |key: &str, value: Value| serde_json::json!({"key": key, "value": value}).to_string();
    // 40 KB, past the small data area and the output buffers, within the 4 pages.
    const HUGE_AT: u32 = 220_000;
    let huge = param(
        "mcp.resource_allowlist",
        serde_json::json!(["x".repeat(40_000)]),
    );
    let mut steps = Steps::new();
    steps
        .list("resources", "mcp_list_resources")
        .list("templates", "mcp_list_resource_templates")
        .read("task vetoes dynamic", dynamic)
        .read("static read", architecture)
        .get("task vetoes completable", "completable-prompt")
        .set(
            "narrow resources",
            &param(
                "mcp.resource_allowlist",
                serde_json::json!(["*/architecture.md"]),
            ),
        )
        .set(
            "narrow prompts",
            &param("mcp.prompt_allowlist", serde_json::json!(["simple-*"])),
        )
        .read("session leaves out structure", structure)
        .read("session keeps architecture", architecture)
        .list("narrowed resources", "mcp_list_resources")
        .list("narrowed prompts", "mcp_list_prompts")
        .get("session leaves out args", "args-prompt")
        .get("session keeps simple", "simple-prompt")
        .set(
            "not a list",
            &param("mcp.resource_allowlist", serde_json::json!("*")),
        )
        .set(
            "a list of numbers",
            &param("mcp.prompt_allowlist", serde_json::json!([1, 2])),
        )
        .set(
            "too many",
            &param("mcp.resource_allowlist", serde_json::json!(vec!["*"; 65])),
        )
        .set(
            "a pattern too long",
            &param(
                "mcp.resource_allowlist",
                serde_json::json!(["*".repeat(257)]),
            ),
        )
        .set(
            "a server key",
            &param("mcp.server_ids", serde_json::json!(["everything"])),
        )
        .set(
            "a task key",
            &param("mcp.task_resource_allowlist", serde_json::json!(["*"])),
        )
        .set("not json", "{\"key\": ")
        .set_at("huge", &huge, Some(HUGE_AT))
        .read("unchanged after hostile lists", structure)
        .set(
            "widen resources",
            &param("mcp.resource_allowlist", serde_json::json!(["*"])),
        )
        .read("the task's veto stands", dynamic)
        .read("the session's own list was replaced", structure);
    let guest = steps.guest("everything", &[(HUGE_AT, huge.as_bytes())]);
    let task = mcp_task("layers", &["everything"])
        .with_config(
            "mcp.resource_denylist",
            serde_json::json!(["demo://resource/dynamic/*"]),
        )
        .with_config("mcp.prompt_denylist", serde_json::json!(["completable-*"]));
    let run = wat::run(&host, &guest, &task).await;
    host.shutdown().await;
    let (r, e) = (&run.results, &run.emitted);
    let at = |label: &str| steps.result(r, label);
    let json = |i: usize| -> Value { serde_json::from_str(&e[i]).expect(&e[i]) };
    let names = |listing: Value, field: &str, key: &str| -> Vec<String> {
        listing[field]
            .as_array()
            .unwrap_or_else(|| panic!("{listing}"))
            .iter()
            .map(|item| item[key].as_str().unwrap().to_owned())
            .collect()
    };
    use quiver_tests::errno::{EACCES, EINVAL, EIO};

    let listed = names(json(0), "resources", "uri");
    assert!(
        listed.len() >= 2 && listed.contains(&structure.to_owned()),
        "{listed:?}"
    );
    assert!(
        listed
            .iter()
            .all(|uri| !uri.starts_with("demo://resource/dynamic/"))
    );
    assert!(
        names(json(1), "resourceTemplates", "uriTemplate").is_empty(),
        "the task's denylist hides the dynamic templates: {}",
        e[1]
    );
    assert_eq!(at("task vetoes dynamic"), EACCES, "{r:?}");
    assert!(at("static read") > 0, "{r:?}");
    assert_eq!(at("task vetoes completable"), EACCES, "{r:?}");
    assert_eq!(at("narrow resources"), 0, "{r:?}");
    assert_eq!(at("narrow prompts"), 0, "{r:?}");
    assert_eq!(at("session leaves out structure"), EACCES, "{r:?}");
    assert!(at("session keeps architecture") > 0, "{r:?}");
    assert_eq!(names(json(2), "resources", "uri"), [architecture]);
    assert_eq!(names(json(3), "prompts", "name"), ["simple-prompt"]);
    assert_eq!(at("session leaves out args"), EACCES, "{r:?}");
    assert!(at("session keeps simple") > 0, "{r:?}");
    for hostile in [
        "not a list",
        "a list of numbers",
        "too many",
        "a pattern too long",
        "a server key",
        "a task key",
        "huge",
    ] {
        assert_eq!(at(hostile), EINVAL, "{hostile}: {r:?}");
    }
    assert_eq!(at("not json"), EIO, "{r:?}");
    assert_eq!(at("unchanged after hostile lists"), EACCES, "{r:?}");
    assert_eq!(at("widen resources"), 0, "{r:?}");
    assert_eq!(at("the task's veto stands"), EACCES, "{r:?}");
    assert!(at("the session's own list was replaced") > 0, "{r:?}");

    // Every refusal is one audit line naming what was refused and the layer that did it.
    let denials: Vec<(String, String, String, String)> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["event"] == "policy_denied")
        .map(|l| {
            let s = |k: &str| l[k].as_str().unwrap().to_owned();
            (s("action"), s("tool"), s("reason"), s("detail"))
        })
        .collect();
    let row = |action: &str, name: &str, reason: &str, detail: &str| {
        (action.into(), name.into(), reason.into(), detail.into())
    };
    let task_vetoed = row(
        "mcp_read_resource",
        dynamic,
        "denied_by_pattern",
        "matches the task's resource deny pattern `demo://resource/dynamic/*`",
    );
    let session_left_out = row(
        "mcp_read_resource",
        structure,
        "not_in_allowlist",
        "not in the session's resource allowlist",
    );
    assert_eq!(
        denials,
        [
            task_vetoed.clone(),
            row(
                "mcp_get_prompt",
                "completable-prompt",
                "denied_by_pattern",
                "matches the task's prompt deny pattern `completable-*`"
            ),
            session_left_out.clone(),
            row(
                "mcp_get_prompt",
                "args-prompt",
                "not_in_allowlist",
                "not in the session's prompt allowlist"
            ),
            session_left_out,
            task_vetoed,
        ]
    );
}

/// Tool schemas reach a guest exactly as the server wrote them, key order included: the
/// everything server writes `$schema`, `type`, `properties`, `required` (and `type` before
/// `description` inside a property), which a sorted map would reorder.
#[tokio::test]
async fn a_tool_schema_reaches_the_guest_in_the_servers_own_key_order() {
    let registry = RegistryDir::new();
    registry.write(
        "everything.toml",
        &stdio_record(
            "everything",
            &npm_bin("mcp-server-everything"),
            &[],
            &["echo"],
        ),
    );
    let host = host(&registry);
    let body = r#"(func $main (local $fd i32)
      (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 10)))
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_list_tools (local.get $fd) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192))))"#;
    let guest = wat::guest(&[(1024, b"everything")], body);
    let run = wat::run(&host, &guest, &mcp_task("schema", &["everything"])).await;
    host.shutdown().await;
    assert!(run.results[0] > 0, "{:?} {:?}", run.results, run.emitted);
    let listing = &run.emitted[0];
    let schema_at = listing.find(r#""inputSchema":"#).expect("a schema");
    let schema = &listing[schema_at..];
    let position = |key: &str| {
        schema
            .find(&format!("\"{key}\":"))
            .unwrap_or_else(|| panic!("no {key} in {schema}"))
    };
    let order = ["$schema", "type", "properties", "required"].map(position);
    assert!(
        order.is_sorted(),
        "keys out of the server's order: {schema}"
    );
    assert!(
        schema.contains(r#""message":{"type":"string","description":"Message to echo"}"#),
        "{schema}"
    );
}
