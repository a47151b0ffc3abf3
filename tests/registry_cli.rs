//! `quiver registry list/get/put/delete/diff`: the real binary against a registry
//! directory, a real node (through its admin API), a real etcd, and hostile nodes. Records
//! are shown as written (`${ENV:..}` references, never their values), an invalid file
//! names its record and field and writes nothing, and a node that hangs or floods cannot
//! hang the CLI or make it hold more than its cap.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use quiver_tests::etcd::Etcd;
use quiver_tests::node::Node;
use quiver_tests::{RegistryDir, fixture_toml, quiver_cli, unique_id, wat};
use serde_json::{Value, json};

/// What one run of the CLI did.
#[derive(Debug)]
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Longest any one CLI run may take before the test calls it hung (generous: a loaded
/// two-core machine).
const HUNG: Duration = Duration::from_secs(120);

/// Runs `quiver registry <args>` with `env` set; panics if it does not exit within
/// [`HUNG`].
fn registry(args: &[&str], env: &[(&str, &str)]) -> Out {
    let start = Instant::now();
    let child = start_registry(args, env);
    finish(child, args, start)
}

/// Starts `quiver registry <args>` with `env` set, output piped.
fn start_registry(args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut command = Command::new(quiver_cli());
    command
        .arg("registry")
        .args(args)
        .env_remove("QUIVER_LOG")
        .env_remove("QUIVER_REGISTRY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    command.spawn().expect("start quiver")
}

/// Waits for a started command; panics if it does not exit within [`HUNG`].
fn finish(child: Child, args: &[&str], start: Instant) -> Out {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(output) = rx.recv_timeout(HUNG) else {
        // SAFETY: kill(2) on our own child, which has not been reaped (its waiter waits).
        unsafe { libc::kill(libc::pid_t::try_from(pid).expect("pid"), libc::SIGKILL) };
        panic!("quiver registry {args:?} hung for {HUNG:?}");
    };
    let output = output.expect("wait for quiver");
    Out {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        took: start.elapsed(),
    }
}

/// `args` followed by `--registry <dir>`.
fn on_dir(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> Out {
    let dir = dir.to_str().expect("UTF-8 temp path");
    let mut all = args.to_vec();
    all.extend(["--registry", dir]);
    registry(&all, env)
}

/// The file every writer to a registry directory locks (docs/registry.md).
const WRITE_LOCK: &str = ".quiver-write.lock";

/// The names in `dir`, but the write lock's file, which a write leaves behind.
fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name != WRITE_LOCK)
        .collect();
    names.sort();
    names
}

const SECRET: &str = "cli-s3cret-never-printed";

/// A bundle of two servers (one with a secret reference) and a profile naming one.
fn bundle() -> String {
    r#"
[[servers]]
server_id = "alpha"
transport = "stdio"
allowed_tools = ["echo"]
[servers.stdio]
command = "/bin/true"
env = { TOKEN = "${ENV:QV_CLI_SECRET}" }

[[servers]]
server_id = "beta"
transport = "stdio"
allowed_tools = ["*"]
[servers.stdio]
command = "/bin/true"

[[profiles]]
name = "dev"
server_ids = ["alpha"]
"#
    .to_owned()
}

/// A single JSON record, spaced as a person wrote it: stored and printed byte for byte.
const GAMMA: &str = "{\n  \"server_id\":   \"gamma\",\n  \"transport\": \"stdio\",\n  \"stdio\": {\"command\": \"/bin/true\"}\n}\n";

#[test]
fn a_bundle_put_into_a_directory_is_listed_read_diffed_and_deleted() {
    let reg = RegistryDir::new();
    let files = tempfile::tempdir().expect("tempdir");
    let bundle_file = files.path().join("bundle.toml");
    std::fs::write(&bundle_file, bundle()).expect("write bundle");
    let bundle_file = bundle_file.to_str().expect("UTF-8");

    let dry = on_dir(&["put", bundle_file, "--dry-run"], reg.path(), &[]);
    assert_eq!(dry.code, Some(0), "{dry:?}");
    assert_eq!(
        dry.stdout.lines().take(3).collect::<Vec<_>>(),
        ["+ server alpha", "+ server beta", "+ profile dev"],
        "{dry:?}"
    );
    assert!(dry.stdout.contains("nothing written"), "{dry:?}");
    assert!(
        file_names(reg.path()).is_empty(),
        "a dry run writes nothing"
    );

    let put = on_dir(&["put", bundle_file], reg.path(), &[]);
    assert_eq!(put.code, Some(0), "{put:?}");
    assert!(put.stdout.contains("3 added"), "{put:?}");
    assert_eq!(
        file_names(reg.path()),
        ["alpha.toml", "beta.toml", "profiles"]
    );
    assert_eq!(file_names(&reg.path().join("profiles")), ["dev.toml"]);
    let again = on_dir(&["put", bundle_file], reg.path(), &[]);
    assert_eq!(again.code, Some(0), "{again:?}");
    assert!(
        !again.stdout.contains("+ ") && again.stdout.contains("3 unchanged"),
        "{again:?}"
    );

    let gamma = files.path().join("gamma.json");
    std::fs::write(&gamma, GAMMA).expect("write gamma");
    let put = on_dir(&["put", gamma.to_str().expect("UTF-8")], reg.path(), &[]);
    assert_eq!(put.code, Some(0), "{put:?}");

    let table = on_dir(&["list"], reg.path(), &[]);
    assert_eq!(table.code, Some(0), "{table:?}");
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(
        lines[0].starts_with("KIND") && lines[0].contains("REVISION"),
        "{table:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("server") && l.contains("gamma") && l.contains("json")),
        "{table:?}"
    );
    let listed = on_dir(&["list", "--json"], reg.path(), &[]);
    let listed: Value = serde_json::from_str(&listed.stdout).expect("list --json");
    let records: Vec<(String, String)> = listed["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap_or_default().to_owned(),
                r["name"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let expected = [
        ("server", "alpha"),
        ("server", "beta"),
        ("server", "gamma"),
        ("profile", "dev"),
    ]
    .map(|(k, n)| (k.to_owned(), n.to_owned()));
    assert_eq!(records, expected);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let written = listed["records"][0]["updated_at"].as_u64();
    assert!(
        written.is_some_and(|t| t.abs_diff(now) < 3600),
        "a file's mtime: {listed}"
    );

    // As written: the reference, not the value of the variable set for the CLI.
    let alpha = on_dir(&["get", "alpha"], reg.path(), &[("QV_CLI_SECRET", SECRET)]);
    assert_eq!(alpha.code, Some(0), "{alpha:?}");
    assert!(alpha.stdout.contains("${ENV:QV_CLI_SECRET}"), "{alpha:?}");
    assert!(!alpha.stdout.contains(SECRET) && !alpha.stderr.contains(SECRET));
    let on_disk = std::fs::read_to_string(reg.path().join("alpha.toml")).expect("alpha.toml");
    assert_eq!(alpha.stdout, on_disk);
    let gamma = on_dir(&["get", "gamma"], reg.path(), &[]);
    assert_eq!(gamma.stdout, GAMMA, "a single record is kept byte for byte");
    let dev = on_dir(&["get", "dev", "--profile"], reg.path(), &[]);
    assert!(dev.stdout.contains("server_ids = [\"alpha\"]"), "{dev:?}");
    let missing = on_dir(&["get", "nope"], reg.path(), &[]);
    assert_eq!(missing.code, Some(1), "{missing:?}");
    assert!(missing.stderr.contains("no server `nope`"), "{missing:?}");

    // A directory holding the same records, whatever their spacing: equal.
    let same = tempfile::tempdir().expect("tempdir");
    for name in ["alpha.toml", "beta.toml"] {
        std::fs::copy(reg.path().join(name), same.path().join(name)).expect("copy");
    }
    std::fs::write(
        same.path().join("gamma.json"),
        r#"{"stdio":{"command":"/bin/true"},"transport":"stdio","server_id":"gamma"}"#,
    )
    .expect("write");
    std::fs::create_dir(same.path().join("profiles")).expect("mkdir");
    std::fs::copy(
        reg.path().join("profiles/dev.toml"),
        same.path().join("profiles/dev.toml"),
    )
    .expect("copy");
    let equal = on_dir(
        &["diff", same.path().to_str().expect("UTF-8")],
        reg.path(),
        &[],
    );
    assert_eq!(
        (equal.code, equal.stdout.as_str()),
        (Some(0), ""),
        "{equal:?}"
    );

    // Changed, added and missing records, one line each.
    std::fs::write(
        same.path().join("beta.toml"),
        "server_id = \"beta\"\ntransport = \"stdio\"\nallowed_tools = [\"echo\"]\n[stdio]\ncommand = \"/bin/true\"\n",
    )
    .expect("write");
    std::fs::write(
        same.path().join("delta.toml"),
        "server_id = \"delta\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"/bin/true\"\n",
    )
    .expect("write");
    std::fs::remove_file(same.path().join("profiles/dev.toml")).expect("rm");
    let differ = on_dir(
        &["diff", same.path().to_str().expect("UTF-8")],
        reg.path(),
        &[],
    );
    assert_eq!(differ.code, Some(1), "{differ:?}");
    assert_eq!(
        differ.stdout.lines().collect::<Vec<_>>(),
        ["~ server beta", "+ server delta", "- profile dev"],
        "{differ:?}"
    );
    let no_dir = on_dir(&["diff", "/nonexistent/quiver-diff"], reg.path(), &[]);
    assert_eq!(no_dir.code, Some(2), "{no_dir:?}");

    // A server a profile still names stays; the refusal names the profile's field.
    let refused = on_dir(&["delete", "alpha"], reg.path(), &[]);
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains("dev") && refused.stderr.contains("server_ids"),
        "{refused:?}"
    );
    assert!(reg.path().join("alpha.toml").is_file());
    for args in [&["delete", "dev", "--profile"][..], &["delete", "alpha"]] {
        let deleted = on_dir(args, reg.path(), &[]);
        assert_eq!(deleted.code, Some(0), "{deleted:?}");
    }
    assert_eq!(
        file_names(reg.path()),
        ["beta.toml", "gamma.json", "profiles"]
    );
    assert!(file_names(&reg.path().join("profiles")).is_empty());
    let gone = on_dir(&["delete", "alpha"], reg.path(), &[]);
    assert_eq!(gone.code, Some(1), "{gone:?}");
}

/// Each command is its own process with its own store over the directory: revisions still
/// only grow from one run to the next, and a write waits for the lock another process
/// holds, then goes on, or gives up naming the lock.
#[test]
fn directory_revisions_grow_across_runs_and_a_put_waits_for_another_writers_lock() {
    let reg = RegistryDir::new();
    let files = tempfile::tempdir().expect("tempdir");
    let record = |id: &str| {
        let path = files.path().join(format!("{id}.json"));
        std::fs::write(&path, GAMMA.replace("gamma", id)).expect("write");
        path.to_str().expect("UTF-8").to_owned()
    };
    let revision = || {
        let out = on_dir(&["list", "--json"], reg.path(), &[]);
        assert_eq!(out.code, Some(0), "{out:?}");
        let listed: Value = serde_json::from_str(&out.stdout).expect("JSON");
        listed["revision"].as_u64().expect("revision")
    };
    let first = revision();
    let put = on_dir(&["put", &record("gamma")], reg.path(), &[]);
    assert_eq!(put.code, Some(0), "{put:?}");
    let second = revision();
    assert!(second > first, "{first} then {second}");

    // Another process's writer, through the real file.
    let holder = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(reg.path().join(WRITE_LOCK))
        .expect("open the lock");
    holder.lock().expect("lock");
    let delta = record("delta");
    let args = [
        "put",
        &delta,
        "--registry",
        reg.path().to_str().expect("UTF-8"),
    ];
    let start = Instant::now();
    let mut waiting = start_registry(&args, &[]);
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        waiting.try_wait().expect("try_wait").is_none(),
        "the put waits for the lock"
    );
    assert!(!reg.path().join("delta.json").exists());
    drop(holder);
    let put = finish(waiting, &args, start);
    assert_eq!(put.code, Some(0), "{put:?}");
    assert!(reg.path().join("delta.json").is_file());
    assert!(revision() > second);

    let holder = std::fs::File::open(reg.path().join(WRITE_LOCK)).expect("open the lock");
    holder.lock().expect("lock");
    let stuck = on_dir(&["put", &record("epsilon")], reg.path(), &[]);
    assert_ne!(stuck.code, Some(0), "{stuck:?}");
    assert!(
        stuck.stderr.contains(WRITE_LOCK) && stuck.stderr.contains("try again"),
        "{stuck:?}"
    );
    assert!(!reg.path().join("epsilon.json").exists());
}

#[test]
fn an_invalid_put_names_the_record_and_field_and_writes_nothing() {
    let reg = RegistryDir::new();
    let files = tempfile::tempdir().expect("tempdir");
    for (name, text, expect) in [
        (
            "empty-command.toml",
            "[[servers]]\nserver_id = \"good\"\ntransport = \"stdio\"\n[servers.stdio]\ncommand = \"/bin/true\"\n\
             [[servers]]\nserver_id = \"bad\"\ntransport = \"stdio\"\n[servers.stdio]\ncommand = \"\"\n",
            &["servers/bad", "stdio.command"][..],
        ),
        (
            "typo.json",
            r#"{"servers":[{"server_id":"typo","transprot":"stdio"}]}"#,
            &["servers/typo", "transprot"],
        ),
        (
            "profile.toml",
            "[[profiles]]\nname = \"p\"\nserver_ids = [\"ghost\"]\n",
            &["profiles/p", "server_ids", "ghost"],
        ),
        (
            "unnamed.toml",
            "[[servers]]\ntransport = \"stdio\"\n",
            &["servers[0].server_id"],
        ),
    ] {
        let path = files.path().join(name);
        std::fs::write(&path, text).expect("write");
        let out = on_dir(&["put", path.to_str().expect("UTF-8")], reg.path(), &[]);
        assert_eq!(out.code, Some(1), "{name}: {out:?}");
        for part in expect {
            assert!(out.stderr.contains(part), "{name}: {part}: {out:?}");
        }
        assert!(out.stdout.is_empty(), "{name}: {out:?}");
        assert!(file_names(reg.path()).is_empty(), "{name} wrote something");
    }
    let yaml = files.path().join("servers.yaml");
    std::fs::write(&yaml, "server_id: x\n").expect("write");
    let out = on_dir(&["put", yaml.to_str().expect("UTF-8")], reg.path(), &[]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains(".toml or .json"), "{out:?}");
}

const ADMIN: &str = "registry-cli-admin-token";
const TASKS: &str = "registry-cli-task-token";

fn admin_node(reg: &RegistryDir) -> Node {
    Node::start(
        reg,
        Some(
            "[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\n[admin]\ntoken_env = \"QUIVER_TEST_ADMIN\"\n",
        ),
        &[("QUIVER_TEST_TOKEN", TASKS), ("QUIVER_TEST_ADMIN", ADMIN)],
    )
}

/// `args` against `node` with the admin token in `QV_ADMIN`.
fn on_node(args: &[&str], node: &Node, token: &str) -> Out {
    let mut all = args.to_vec();
    all.extend(["--node", &node.base, "--token-env", "QV_ADMIN"]);
    let out = registry(&all, &[("QV_ADMIN", token)]);
    for secret in [ADMIN, TASKS] {
        assert!(
            !out.stdout.contains(secret) && !out.stderr.contains(secret),
            "a token was printed: {out:?}"
        );
    }
    out
}

/// Runs a task on `node` calling `server`'s `echo`, which connects the server.
async fn echo(node: &Node, server: &str) {
    let args = json!({"text": "hi"}).to_string();
    let module = node
        .upload(wat::mcp_calls(&[(server, "echo", &args)], 1).as_bytes())
        .await;
    let task = json!({
        "task_id": unique_id("cli"),
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": json!([server]).to_string()},
        "limits": {"deadline_ms": 120000},
    });
    let id = node.submit_ok(&module, task).await;
    let done = node.task(&id, 60).await;
    assert_eq!(done.json["status"], "finished", "{done:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_node_put_list_get_and_delete_go_through_its_admin_api() {
    let reg = RegistryDir::new();
    let node = admin_node(&reg);
    let files = tempfile::tempdir().expect("tempdir");
    let record = fixture_toml("fx", &["echo"], "");
    let bundle = format!(
        "[[servers]]\n{}\n[[profiles]]\nname = \"team\"\nserver_ids = [\"fx\"]\n",
        record
            .replace("[stdio]", "[servers.stdio]")
            .replace("\n\n\n", "\n")
    );
    let path = files.path().join("fleet.toml");
    std::fs::write(&path, &bundle).expect("write");
    let path = path.to_str().expect("UTF-8");

    let dry = on_node(&["put", path, "--dry-run"], &node, ADMIN);
    assert_eq!(dry.code, Some(0), "{dry:?}\n{}", node.stderr());
    assert!(
        dry.stdout.contains("+ server fx") && dry.stdout.contains("+ profile team"),
        "{dry:?}"
    );
    assert!(
        file_names(reg.path()).is_empty(),
        "a dry run writes nothing"
    );
    let put = on_node(&["put", path], &node, ADMIN);
    assert_eq!(put.code, Some(0), "{put:?}\n{}", node.stderr());
    assert!(reg.path().join("fx.toml").is_file());
    assert!(reg.path().join("profiles/team.toml").is_file());

    echo(&node, "fx").await;
    let listed = on_node(&["list", "--json"], &node, ADMIN);
    assert_eq!(listed.code, Some(0), "{listed:?}");
    let listed: Value = serde_json::from_str(&listed.stdout).expect("JSON");
    let records = listed["records"].as_array().expect("records");
    let fx = records
        .iter()
        .find(|r| r["name"] == "fx")
        .expect("fx listed");
    assert_eq!(
        (&fx["kind"], &fx["state"], &fx["format"]),
        (&json!("server"), &json!("connected"), &json!("toml")),
        "{fx}"
    );
    assert!(
        records
            .iter()
            .any(|r| r["name"] == "team" && r["kind"] == "profile"),
        "{listed}"
    );
    let table = on_node(&["list"], &node, ADMIN);
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.starts_with("server") && l.contains("fx") && l.contains("connected")),
        "{table:?}"
    );
    let got = on_node(&["get", "fx"], &node, ADMIN);
    let on_disk = std::fs::read_to_string(reg.path().join("fx.toml")).expect("fx.toml");
    assert_eq!(got.stdout, on_disk);

    let wrong = on_node(&["list"], &node, "not-the-admin-token");
    assert_eq!(wrong.code, Some(2), "{wrong:?}");
    assert!(
        wrong.stderr.contains("401") && wrong.stderr.contains("unauthorized"),
        "{wrong:?}"
    );
    let bad = files.path().join("bad.toml");
    std::fs::write(
        &bad,
        "server_id = \"bad\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"\"\n",
    )
    .expect("write");
    let refused = on_node(&["put", bad.to_str().expect("UTF-8")], &node, ADMIN);
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains("422 invalid_record") && refused.stderr.contains("stdio.command"),
        "{refused:?}"
    );
    assert!(!reg.path().join("bad.toml").exists());

    for args in [&["delete", "team", "--profile"][..], &["delete", "fx"]] {
        let deleted = on_node(args, &node, ADMIN);
        assert_eq!(deleted.code, Some(0), "{deleted:?}");
    }
    assert!(!reg.path().join("fx.toml").exists());
    let empty = on_node(&["list", "--json"], &node, ADMIN);
    let empty: Value = serde_json::from_str(&empty.stdout).expect("JSON");
    assert_eq!(empty["records"], json!([]));
    let gone = on_node(&["delete", "fx"], &node, ADMIN);
    assert_eq!(gone.code, Some(1), "{gone:?}");
    assert!(gone.stderr.contains("no server `fx`"), "{gone:?}");
}

#[test]
fn against_etcd_put_list_and_diff_use_the_store_directly() {
    let etcd = Etcd::start();
    let host = etcd.endpoint().trim_start_matches("http://").to_owned();
    let url = format!("etcd://{host}/{}", unique_id("cli"));
    let files = tempfile::tempdir().expect("tempdir");
    let path = files.path().join("bundle.toml");
    std::fs::write(&path, bundle()).expect("write");
    let path = path.to_str().expect("UTF-8");

    let put = registry(&["put", path, "--registry", &url], &[]);
    assert_eq!(put.code, Some(0), "{put:?}\netcd: {}", etcd.stderr());
    assert!(put.stdout.contains("3 added"), "{put:?}");
    let listed = registry(&["list", "--json", "--registry", &url], &[]);
    let listed: Value = serde_json::from_str(&listed.stdout).expect("JSON");
    let revision = listed["revision"].as_u64().expect("revision");
    let names: Vec<&str> = listed["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            assert!(r["revision"].as_u64().is_some_and(|r| r <= revision), "{r}");
            assert!(
                r["updated_at"].as_u64().is_some(),
                "etcd keeps the time: {r}"
            );
            r["name"].as_str().unwrap_or_default()
        })
        .collect();
    assert_eq!(names, ["alpha", "beta", "dev"]);
    let alpha = registry(
        &["get", "alpha", "--registry", &url],
        &[("QV_CLI_SECRET", SECRET)],
    );
    assert!(
        alpha.stdout.contains("${ENV:QV_CLI_SECRET}") && !alpha.stdout.contains(SECRET),
        "{alpha:?}"
    );

    // The same records written out as a directory: equal; one changed: a difference.
    let dir = tempfile::tempdir().expect("tempdir");
    let wrote = on_dir(&["put", path], dir.path(), &[]);
    assert_eq!(wrote.code, Some(0), "{wrote:?}");
    let dir_arg = dir.path().to_str().expect("UTF-8");
    let equal = registry(&["diff", dir_arg, "--registry", &url], &[]);
    assert_eq!(
        (equal.code, equal.stdout.as_str()),
        (Some(0), ""),
        "{equal:?}"
    );
    std::fs::remove_file(dir.path().join("beta.toml")).expect("rm");
    let differ = registry(&["diff", dir_arg, "--registry", &url], &[]);
    assert_eq!(
        (differ.code, differ.stdout.as_str()),
        (Some(1), "- server beta\n"),
        "{differ:?}"
    );

    // etcd itself checks only syntax; the CLI makes the node's check before deleting.
    let refused = registry(&["delete", "alpha", "--registry", &url], &[]);
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stderr.contains("server_ids"), "{refused:?}");
    for args in [&["delete", "dev", "--profile"][..], &["delete", "alpha"]] {
        let mut args = args.to_vec();
        args.extend(["--registry", &url]);
        let deleted = registry(&args, &[]);
        assert_eq!(deleted.code, Some(0), "{deleted:?}");
    }
    let listed = registry(&["list", "--json", "--registry", &url], &[]);
    let listed: Value = serde_json::from_str(&listed.stdout).expect("JSON");
    assert_eq!(
        listed["records"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
}

/// A fake node on a loopback port: each connection's request head is read, then `answer`
/// gets the stream. Serves a few connections on its own thread.
fn raw_node(answer: fn(TcpStream)) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4).flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                answer(stream);
            });
        }
    });
    format!("http://{addr}")
}

fn hostile(url: &str) -> Out {
    registry(
        &[
            "list",
            "--node",
            url,
            "--token-env",
            "QV_ADMIN",
            "--timeout",
            "3",
        ],
        &[("QV_ADMIN", ADMIN)],
    )
}

#[test]
fn a_node_that_never_answers_is_an_error_after_the_timeout() {
    let url = raw_node(|stream| {
        std::thread::sleep(Duration::from_secs(60));
        drop(stream);
    });
    let out = hostile(&url);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("no answer"), "{out:?}");
    assert!(!out.stderr.contains(ADMIN), "{out:?}");
    assert!(out.took < Duration::from_secs(60), "{out:?}");
}

#[test]
fn a_node_that_answers_without_end_is_cut_at_the_cap() {
    let url = raw_node(|mut stream| {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n[";
        let chunk = vec![b' '; 1 << 16];
        if stream.write_all(head.as_bytes()).is_ok() {
            while stream.write_all(&chunk).is_ok() {}
        }
    });
    let out = registry(
        &["list", "--node", &url, "--token-env", "QV_ADMIN"],
        &[("QV_ADMIN", ADMIN)],
    );
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr.contains(&format!(
            "over {} bytes",
            quiver::defaults::REGISTRY_STORE_MAX_LIST_BYTES
        )),
        "{out:?}"
    );
}

#[test]
fn a_node_error_is_shown_as_its_code_message_and_field_without_escapes() {
    let url = raw_node(|mut stream| {
        let body = json!({"error": {"code": "invalid_record",
            "message": "stdio.command: must not be empty\u{1b}[2J\u{202e}", "field": "body"}})
        .to_string();
        let answer = format!(
            "HTTP/1.1 422 Unprocessable Entity\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes());
    });
    let out = hostile(&url);
    assert_eq!(out.code, Some(1), "a refusal: {out:?}");
    assert!(
        out.stderr
            .contains("HTTP 422 invalid_record (field `body`): stdio.command: must not be empty"),
        "{out:?}"
    );
    assert!(
        !out.stderr.contains('\u{1b}') && !out.stderr.contains('\u{202e}'),
        "{out:?}"
    );
}
