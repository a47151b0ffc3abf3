//! Registry loading: env references, unavailable servers, bad files named with their field,
//! duplicates, ignored files, defaults, revisions, and `quiver registry validate`.

use std::collections::HashMap;
use std::process::Command;

use quiver::registry::{Launch, Registry, Severity, Transport};
use quiver_tests::{RegistryDir, quiver_cli};

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

const GIT: &str = r#"
version = 1
server_id = "git"
transport = "stdio"
allowed_tools = ["read_*"]
[stdio]
command = "${ENV:GIT_MCP:-git-mcp}"
args = ["--token", "${ENV:GIT_TOKEN}"]
env = { API_TOKEN = "${ENV:GIT_TOKEN}", MODE = "ro" }
env_from = ["PASSED"]
"#;

#[test]
fn env_references_are_resolved_and_never_shown() {
    let dir = RegistryDir::new();
    dir.write("git.toml", GIT);
    let registry = Registry::load_dir_with_env(
        dir.path(),
        &env(&[("GIT_TOKEN", "s3cret"), ("PASSED", "p")]),
    )
    .unwrap();
    assert!(registry.problems().is_empty(), "{:?}", registry.problems());
    let git = registry.get("git").unwrap();
    let Ok(Launch::Stdio {
        command, args, env, ..
    }) = &git.launch
    else {
        panic!("{:?}", git.launch)
    };
    assert_eq!(command, "git-mcp", "the default applies");
    assert_eq!(args, &["--token", "s3cret"]);
    assert_eq!(env["API_TOKEN"], "s3cret");
    assert_eq!(env["MODE"], "ro");
    assert_eq!(env["PASSED"], "p");
    assert_eq!(
        git.record.stdio.as_ref().unwrap().env["API_TOKEN"],
        "${ENV:GIT_TOKEN}",
        "the record keeps the reference"
    );
    let shown = format!(
        "{:?} {}",
        git.launch,
        serde_json::to_string(&git.view()).unwrap()
    );
    assert!(!shown.contains("s3cret"), "{shown}");
}

#[test]
fn a_missing_variable_makes_only_that_server_unavailable() {
    let dir = RegistryDir::new();
    dir.write("git.toml", GIT);
    dir.write("fs.json", r#"{"server_id": "fs", "transport": "stdio", "allowed_tools": ["*"], "stdio": {"command": "fs-mcp"}}"#);
    let registry = Registry::load_dir_with_env(dir.path(), &env(&[("PASSED", "p")])).unwrap();
    let git = registry.get("git").unwrap();
    let reason = git.launch.as_ref().unwrap_err().to_string();
    assert!(
        reason.contains("GIT_TOKEN") && reason.contains("stdio.args[1]"),
        "{reason}"
    );
    assert!(!git.view().available);
    assert!(registry.get("fs").unwrap().launch.is_ok());
    let warning = &registry.problems()[0];
    assert_eq!(warning.severity, Severity::Warning);
    assert!(
        warning.to_string().contains("git.toml") && warning.to_string().contains("unavailable")
    );
}

#[test]
fn a_bad_file_is_named_with_its_field_and_the_others_still_load() {
    let dir = RegistryDir::new();
    dir.write(
        "a-good.toml",
        "server_id = \"good\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"x\"\n",
    );
    let cases = [
        (
            "typo.toml",
            "server_id = \"t\"\ntransport = \"stdio\"\nalowed_tools = []\n[stdio]\ncommand = \"x\"\n",
            None,
            "alowed_tools",
        ),
        (
            "budget.toml",
            "server_id = \"b\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"x\"\n[budgets]\ntool_timeout_ms = 0\n",
            Some("budgets.tool_timeout_ms"),
            "greater than 0",
        ),
        (
            "connect.toml",
            "server_id = \"c\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"x\"\n[budgets]\nconnect_timeout_ms = 0\n",
            Some("budgets.connect_timeout_ms"),
            "greater than 0",
        ),
        (
            "nested.json",
            r#"{"server_id":"n","transport":"stdio","stdio":{"command":"x","arg":[]}}"#,
            Some("stdio.arg"),
            "expected one of `command`",
        ),
        (
            "transport.toml",
            "server_id = \"tr\"\ntransport = \"carrier-pigeon\"\n",
            Some("transport"),
            "carrier-pigeon",
        ),
        (
            "http.toml",
            "server_id = \"h\"\ntransport = \"streamable_http\"\n",
            Some("http"),
            "needs an [http] table",
        ),
        (
            "id.toml",
            "server_id = \"has space\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"x\"\n",
            Some("server_id"),
            "letters, digits",
        ),
        (
            "ref.toml",
            "server_id = \"r\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"${ENV:OOPS\"\n",
            Some("stdio.command"),
            "closing",
        ),
        (
            "version.toml",
            "server_id = \"v\"\ntransport = \"stdio\"\nprotocol_version = \"2025-13-01\"\n[stdio]\ncommand = \"x\"\n",
            Some("protocol_version"),
            "use one of \"2024-11-05\", \"2025-03-26\", \"2025-06-18\", \"2025-11-25\"",
        ),
        (
            "modern.toml",
            "server_id = \"m\"\ntransport = \"stdio\"\nprotocol_version = \"2026-07-28\"\n[stdio]\ncommand = \"x\"\n",
            Some("protocol_version"),
            "no initialize handshake",
        ),
        (
            "discover.toml",
            "server_id = \"d\"\ntransport = \"stdio\"\nlifecycle = \"discover\"\nprotocol_version = \"2025-03-26\"\n[stdio]\ncommand = \"x\"\n",
            Some("protocol_version"),
            "lifecycle = \"discover\" never sends",
        ),
        ("syntax.toml", "server_id = \n", None, "invalid TOML"),
    ];
    for (file, contents, _, _) in &cases {
        dir.write(file, contents);
    }
    let registry = Registry::load_dir_with_env(dir.path(), &env(&[])).unwrap();
    assert_eq!(
        registry
            .servers()
            .map(|s| s.server_id())
            .collect::<Vec<_>>(),
        ["good"]
    );
    for (file, _, field, words) in cases {
        let problem = registry
            .problems()
            .iter()
            .find(|p| p.path.ends_with(file))
            .unwrap_or_else(|| panic!("no problem reported for {file}: {:?}", registry.problems()));
        assert_eq!(problem.severity, Severity::Error);
        if let Some(field) = field {
            assert_eq!(problem.field.as_deref(), Some(field), "{problem}");
        }
        assert!(problem.to_string().contains(words), "{file}: {problem}");
    }
}

#[test]
fn duplicates_last_file_wins_with_a_warning_naming_both() {
    let dir = RegistryDir::new();
    dir.write(
        "10-fs.toml",
        "server_id = \"fs\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"first\"\n",
    );
    dir.write(
        "20-fs.json",
        r#"{"server_id":"fs","transport":"stdio","stdio":{"command":"second"}}"#,
    );
    let registry = Registry::load_dir_with_env(dir.path(), &env(&[])).unwrap();
    let fs = registry.get("fs").unwrap();
    assert!(matches!(&fs.launch, Ok(Launch::Stdio { command, .. }) if command == "second"));
    let warning = registry
        .problems()
        .iter()
        .find(|p| p.field.as_deref() == Some("server_id"))
        .unwrap();
    let text = warning.to_string();
    assert!(
        text.contains("10-fs.toml") && text.contains("20-fs.json"),
        "{text}"
    );
}

#[test]
fn hidden_temp_foreign_and_symlinked_files_are_not_loaded() {
    let dir = RegistryDir::new();
    let record = |id: &str| {
        format!("server_id = \"{id}\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"x\"\n")
    };
    dir.write("real.toml", &record("real"));
    dir.write(".hidden.toml", &record("hidden"));
    dir.write("backup.toml~", &record("backup"));
    dir.write("notes.txt", "not a registry file");
    dir.write("#draft.toml#", &record("draft"));
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/nested.toml"), record("nested")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("linked.toml"), record("linked")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("linked.toml"),
        dir.path().join("linked.toml"),
    )
    .unwrap();
    let registry = Registry::load_dir_with_env(dir.path(), &env(&[])).unwrap();
    assert_eq!(
        registry
            .servers()
            .map(|s| s.server_id())
            .collect::<Vec<_>>(),
        ["real"]
    );
    assert!(
        registry
            .problems()
            .iter()
            .any(|p| p.path.ends_with("linked.toml") && p.message.contains("symbolic link"))
    );
}

#[test]
fn absent_budgets_and_fields_take_documented_defaults() {
    let dir = RegistryDir::new();
    dir.write("web.json", r#"{"server_id":"web","transport":"streamable_http","http":{"url":"https://example.test/mcp","headers":{"Authorization":"Bearer ${ENV:WEB_TOKEN:-none}"}}}"#);
    let registry = Registry::load_dir_with_env(dir.path(), &env(&[])).unwrap();
    let web = registry.get("web").unwrap();
    let r = &web.record;
    assert_eq!(r.transport, Transport::StreamableHttp);
    assert_eq!(r.display_name, "web");
    assert_eq!(r.tool_namespace, "mcp.web");
    assert!(
        r.allowed_tools.is_empty(),
        "absent allowed_tools means deny all"
    );
    assert_eq!(r.budgets.tool_timeout.as_millis(), 8000);
    assert!(r.budgets.max_concurrency > 0 && r.budgets.max_tool_output_bytes > 0);
    assert_eq!(r.budgets.max_tool_list_bytes, 4 * 1024 * 1024);
    assert_eq!(
        r.budgets.connect_timeout, None,
        "absent: the host's connect timeout"
    );
    assert_eq!(
        r.protocol_version, None,
        "absent: initialize asks for rmcp's newest version with a handshake"
    );
    assert!(
        matches!(&web.launch, Ok(Launch::Http { headers, .. }) if headers["Authorization"] == "Bearer none")
    );
}

#[test]
fn the_revision_changes_with_content_and_only_with_content() {
    let dir = RegistryDir::new();
    dir.write(
        "fs.toml",
        "server_id = \"fs\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"${ENV:FS_BIN}\"\n",
    );
    let load = |vars: &[(&str, &str)]| {
        Registry::load_dir_with_env(dir.path(), &env(vars))
            .unwrap()
            .revision()
            .to_owned()
    };
    let first = load(&[("FS_BIN", "a")]);
    assert_eq!(first, load(&[("FS_BIN", "a")]));
    assert_ne!(first, load(&[("FS_BIN", "b")]), "a resolved value changed");
    dir.write("fs.toml", "server_id = \"fs\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = \"${ENV:FS_BIN}\"\n");
    assert_ne!(first, load(&[("FS_BIN", "a")]), "a file changed");
}

#[test]
fn an_unreadable_directory_is_an_error_naming_it() {
    let err = Registry::load_dir("/definitely/not/here").unwrap_err();
    assert!(err.to_string().contains("/definitely/not/here"), "{err}");
}

#[test]
fn validate_prints_every_problem_and_exits_nonzero_on_errors() {
    let dir = RegistryDir::new();
    dir.write(
        "good.toml",
        "server_id = \"good\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"x\"\n",
    );
    let ok = Command::new(quiver_cli())
        .args(["registry", "validate"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("1 servers (good), 0 errors"));

    dir.write("bad.toml", "server_id = \"bad\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"x\"\n[budgets]\nmax_concurrency = 0\n");
    dir.write("worse.json", "{");
    let bad = Command::new(quiver_cli())
        .args(["registry", "validate"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("bad.toml: budgets.max_concurrency: must be greater than 0"),
        "{stdout}"
    );
    assert!(stdout.contains("worse.json: invalid JSON"), "{stdout}");
    assert!(stdout.contains("2 errors"), "{stdout}");
}

#[test]
fn mcp_tools_lists_what_the_registry_allows() {
    let dir = RegistryDir::new();
    dir.fixture("fixture", &["echo", "ad?"], "");
    let out = Command::new(quiver_cli())
        .args(["mcp", "tools", "fixture", "--registry"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("fixture (fixture): 2 tools"), "{stdout}");
    assert!(stdout.contains("  add — ") && stdout.contains("  echo — "));
    assert!(stdout.contains("hidden by allowed_tools:") && stdout.contains("crash"));

    let missing = Command::new(quiver_cli())
        .args(["mcp", "tools", "nope", "--registry"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no server `nope`"));

    dir.write("broken.toml", "server_id = \"broken\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = \"/no/such/binary\"\n");
    let broken = Command::new(quiver_cli())
        .args(["mcp", "tools", "broken", "--registry"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(broken.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&broken.stderr);
    assert!(
        stderr.contains("mcp_unavailable") && stderr.contains("/no/such/binary"),
        "{stderr}"
    );
}

/// A stdio record running a shell with a host secret, and one the rules allow.
const SHELL: &str = r#"
server_id = "shell"
transport = "stdio"
allowed_tools = ["*"]
[stdio]
command = "/bin/sh"
args = ["-c", "echo $A > /tmp/loot"]
env = { A = "${ENV:SECRET_X}" }
"#;

const LISTED: &str = r#"
server_id = "listed"
transport = "stdio"
allowed_tools = ["*"]
[stdio]
command = "${ENV:MCP_BIN:-/opt/mcp/listed}"
env_from = ["MCP_TOKEN"]
"#;

#[test]
fn records_the_launch_rules_refuse_are_left_out_and_reported_and_writes_refused() {
    use quiver::registry::{DocFormat, DocKind, StoredDoc, Write, check_changes_under};
    use quiver::{LaunchConfig, LaunchRules};
    let dir = RegistryDir::new();
    dir.write("shell.toml", SHELL).write("listed.toml", LISTED);
    let rules = LaunchRules::from_config(&LaunchConfig {
        commands: vec!["/opt/mcp/*".into()],
        env: vec!["MCP_*".into()],
        ..LaunchConfig::default()
    })
    .unwrap();
    let vars = env(&[("SECRET_X", "s3cret-x"), ("MCP_TOKEN", "t")]);
    let registry = Registry::load_dir_under(dir.path(), &vars, &rules).unwrap();
    assert!(registry.get("shell").is_none(), "left out");
    assert!(
        registry.get("listed").is_some(),
        "{:?}",
        registry.problems()
    );
    let problem = registry
        .problems()
        .iter()
        .find(|p| p.path.ends_with("shell.toml"))
        .expect("the shell is reported");
    assert_eq!(problem.severity, Severity::Error);
    assert_eq!(problem.field.as_deref(), Some("stdio.command"), "{problem}");
    assert!(
        problem.message.contains("[mcp.launch] commands"),
        "{problem}"
    );

    // A reference that resolves to an unlisted command is caught once resolved, and the
    // value it resolved to is not shown.
    let vars = env(&[("MCP_BIN", "/bin/s3cret-sh"), ("MCP_TOKEN", "t")]);
    let registry = Registry::load_dir_under(dir.path(), &vars, &rules).unwrap();
    assert!(registry.get("listed").is_none());
    let shown: Vec<String> = registry
        .problems()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        shown
            .iter()
            .any(|p| p.contains("listed.toml") && p.contains("stdio.command")),
        "{shown:?}"
    );
    assert!(!shown.iter().any(|p| p.contains("s3cret")), "{shown:?}");

    // The same rules refuse the write, naming the record and field; unrestricted, as a
    // library host over its own directory keeps, loads it.
    let put = Write::Put(StoredDoc {
        kind: DocKind::Server,
        name: "shell".into(),
        format: DocFormat::Toml,
        body: SHELL.as_bytes().to_vec(),
        revision: 0,
        updated_at: None,
    });
    let refused = check_changes_under(&[], "dir", std::slice::from_ref(&put), &rules)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("dir/servers/shell") && refused.contains("stdio.command"),
        "{refused}"
    );
    check_changes_under(&[], "dir", &[put], &LaunchRules::unrestricted()).unwrap();
    let vars = env(&[("SECRET_X", "s3cret-x"), ("MCP_TOKEN", "t")]);
    let open = Registry::load_dir_with_env(dir.path(), &vars).unwrap();
    assert!(open.get("shell").is_some());
}
