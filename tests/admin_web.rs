//! The web admin page in a real headless Chromium, driven as a person would by
//! tests/browser/admin_page.mjs (puppeteer-core from fixtures/npm): sign in with the admin
//! token, add a stdio server with the form, see it listed, test it, see its tools with
//! their model-facing names, pin them (the record gains its `[pins]`, which the form then
//! keeps), edit it, edit a record whose arguments and environment the
//! form cannot show exactly (they stay read-only and come back byte-identical; a save
//! after another write is refused with a 412 the page explains), see a refused record's
//! error, delete it after the confirmation, see a record full of markup rendered as text, import a file (dry run,
//! then apply), and add and delete a profile. At each checkpoint this
//! test checks through the admin API that the page did what it showed.
//!
//! tests/browser/approvals_page.mjs signs in as a client holding only `approve`: the
//! registry views are not offered, a call that starts waiting after the page opened
//! appears without a reload (with its task, submitter, server, tool and argument shape),
//! and denying it with a reason reaches the task and the audit log, naming the approver.
//!
//! Also, over plain HTTP: the page's routes, content types and security headers.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use quiver_tests::node::{Answer, Node};
use quiver_tests::{RegistryDir, fixture_server, fixture_toml, hostile_server, wat, workspace};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const ADMIN: &str = "admin-web-token";
const CONFIG: &str = "[admin]\ntoken_env = \"QUIVER_TEST_ADMIN\"\n";
/// Would set a flag if the page ever parsed API data as HTML.
const MARKUP: &str = "<img src=x onerror=\"window.__quiverPwned=1\">";
/// The whole browser run, on a loaded machine.
const RUN: Duration = Duration::from_secs(300);

fn node(registry: &RegistryDir) -> Node {
    Node::start(registry, Some(CONFIG), &[("QUIVER_TEST_ADMIN", ADMIN)])
}

fn admin(node: &Node, method: Method, path: &str) -> reqwest::RequestBuilder {
    node.anonymous(method, &format!("/admin/api/mcp{path}"))
        .bearer_auth(ADMIN)
}

/// `name` from `$env` if set, else the first `name` on `PATH`.
fn program(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(PathBuf::from(path));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// What the browser test needs, or a panic saying how to get it: a machine without
/// Chromium must not pass this test by skipping it.
fn browser_tools() -> (PathBuf, PathBuf, PathBuf) {
    let setup = "run scripts/setup.sh (it installs chromium and fixtures/npm's puppeteer-core)";
    let node = program("QUIVER_NODE", "node")
        .unwrap_or_else(|| panic!("node (Node.js) is not on PATH; install it, then {setup}"));
    let chromium = program("QUIVER_CHROMIUM", "chromium")
        .unwrap_or_else(|| panic!("chromium is not on PATH (or QUIVER_CHROMIUM); {setup}"));
    let npm = workspace().join("fixtures/npm");
    assert!(
        npm.join("node_modules/puppeteer-core/package.json")
            .is_file(),
        "fixtures/npm/node_modules/puppeteer-core is missing; {setup}"
    );
    (node, chromium, npm)
}

/// A stdio record of the hostile fixture server whose display name and tool
/// descriptions are `MARKUP`.
fn hostile_record(id: &str) -> Value {
    let body = json!({
        "server_id": id,
        "display_name": MARKUP,
        "transport": "stdio",
        "allowed_tools": ["*"],
        "stdio": {
            "command": hostile_server().display().to_string(),
            "args": ["--description", MARKUP],
        },
    });
    json!({"format": "json", "body": serde_json::to_string_pretty(&body).expect("json")})
}

/// Launch values the form's line editor cannot show exactly: an empty argument, one with
/// spaces around it, one with a line break, and an environment value with a trailing space.
const SPACED_ARGS: [&str; 3] = ["", " spaced ", "two\nlines"];

/// A TOML record of server `spaced` with [`SPACED_ARGS`], named `display_name`.
fn spaced_record(display_name: &str) -> Value {
    let fixture = fixture_server().display().to_string();
    let args = serde_json::to_string(&SPACED_ARGS).expect("json");
    let body = format!(
        "server_id = \"spaced\"\ndisplay_name = {display_name:?}\ntransport = \"stdio\"\n\
         allowed_tools = [\"echo\"]\n\n[stdio]\ncommand = {fixture:?}\nargs = {args}\n\
         env = {{ QV_PAD = \"trail \", QV_OK = \"plain\" }}\n"
    );
    json!({"format": "toml", "body": body})
}

/// The driver's process, killed (with its Chromium, which exits with its pipe) when the
/// test ends early.
struct Driver {
    child: tokio::process::Child,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Checks, through the API, what the page claims at `checkpoint`; `Err` says what is off.
async fn check(node: &Node, checkpoint: &str, data: &Value) -> Result<(), String> {
    let fx = Node::send(admin(node, Method::GET, "/servers/fx")).await;
    match checkpoint {
        "created" => {
            let body = fx.json["body"].as_str().unwrap_or_default();
            let fields = &fx.json["fields"];
            let ok = fx.status == 200
                && fx.json["format"] == "toml"
                && body.contains(&fixture_server().display().to_string())
                && fields["allowed_tools"] == json!(["echo", "add"])
                && fields["stdio"]["args"] == json!(["--name", "fx"])
                && fields["stdio"]["env"] == json!({"QV_NOTE": r#"say "hi" \ ${ENV:HOME}"#})
                && fields["budgets"]["max_concurrency"] == 2
                && fields["budgets"]["tool_timeout_ms"] == 30000;
            ok.then_some(()).ok_or(format!("the form wrote {fx:?}"))
        }
        "tested" => {
            let test = Node::send(admin(node, Method::POST, "/servers/fx/test")).await;
            let same = test.json["ok"] == true && data["tool_count"] == test.json["tool_count"];
            same.then_some(())
                .ok_or(format!("the page showed {data}, the API says {test:?}"))
        }
        "tools" => {
            let tools = Node::send(admin(node, Method::GET, "/servers/fx/tools")).await;
            let names: Vec<Value> = tools.json["tools"]
                .as_array()
                .map(|t| t.iter().map(|t| t["model_name"].clone()).collect())
                .unwrap_or_default();
            (tools.status == 200 && names.len() == 2 && data["model_names"] == json!(names))
                .then_some(())
                .ok_or(format!("the page showed {data}, the API says {tools:?}"))
        }
        "pinned" => {
            let pins = &fx.json["fields"]["pins"];
            let ok = ["echo", "add"].iter().all(|tool| {
                pins[tool]
                    .as_str()
                    .is_some_and(quiver::registry::is_valid_pin)
            }) && pins.as_object().map(|p| p.len()) == Some(2);
            ok.then_some(())
                .ok_or(format!("after the pin the record is {fx:?}"))
        }
        "edited" => {
            let body = fx.json["body"].as_str().unwrap_or_default();
            // The form keeps a TOML record TOML.
            // The form keeps what it does not show: the pins stay.
            let ok = fx.json["format"] == "toml"
                && body.contains("allowed_tools = [\"echo\", \"add\", \"sleep\"]")
                && fx.json["fields"]["pins"].as_object().map(|p| p.len()) == Some(2)
                && fx.json["fields"]["display_name"] == "Fixture server";
            ok.then_some(())
                .ok_or(format!("after the edit the record is {fx:?}"))
        }
        "spaced-open" => {
            // Another writer moves the registry on while the page's editor is open.
            let put = admin(node, Method::PUT, "/servers/spaced").json(&spaced_record("Elsewhere"));
            let put = Node::send(put).await;
            (put.status == 200)
                .then_some(())
                .ok_or(format!("the other write answered {put:?}"))
        }
        "spaced-saved" => {
            let spaced = Node::send(admin(node, Method::GET, "/servers/spaced")).await;
            let fields = &spaced.json["fields"];
            let ok = spaced.status == 200
                && spaced.json["format"] == "toml"
                && fields["display_name"] == "Renamed"
                && fields["budgets"]["tool_timeout_ms"] == 45000
                && fields["stdio"]["args"] == json!(SPACED_ARGS)
                && fields["stdio"]["env"] == json!({"QV_PAD": "trail ", "QV_OK": "plain"})
                && fields["stdio"]["command"] == fixture_server().display().to_string()
                && fields["allowed_tools"] == json!(["echo"])
                && fields.get("approval_policy").is_none();
            ok.then_some(())
                .ok_or(format!("after the page's edit the record is {spaced:?}"))
        }
        "import-preview" | "imported" => {
            let imported = Node::send(admin(node, Method::GET, "/servers/imported")).await;
            let expected = if checkpoint == "imported" { 200 } else { 404 };
            (imported.status == expected)
                .then_some(())
                .ok_or(format!("at {checkpoint} the record is {imported:?}"))
        }
        "profile" => {
            let web = Node::send(admin(node, Method::GET, "/profiles/web")).await;
            let body = web.json["body"].as_str().unwrap_or_default();
            (web.status == 200 && web.json["format"] == "toml" && body.contains("hostile"))
                .then_some(())
                .ok_or(format!("the page's profile is {web:?}"))
        }
        "profile-deleted" => {
            let web = Node::send(admin(node, Method::GET, "/profiles/web")).await;
            (web.status == 404)
                .then_some(())
                .ok_or(format!("after the delete the profile is {web:?}"))
        }
        "deleted" => (fx.status == 404)
            .then_some(())
            .ok_or(format!("after the delete the record is {fx:?}")),
        other => Err(format!("unknown checkpoint {other}")),
    }
}

/// Runs the browser driver `script` (in tests/browser) against `node` with `envs`,
/// answering each of its checkpoints with what `check` says, until it prints `done`.
/// Panics with the driver's log, its screenshot and the node's stderr if it fails; returns
/// the checkpoints passed and the driver's log.
async fn drive(
    node: &Node,
    script: &str,
    envs: &[(&str, &std::ffi::OsStr)],
    scratch: &tempfile::TempDir,
    mut check: impl AsyncFnMut(&str, &Value) -> Result<(), String>,
) -> (Vec<String>, String) {
    let (node_js, chromium, npm) = browser_tools();
    let screenshot = scratch.path().join("admin_page_failure.png");
    let mut child = tokio::process::Command::new(&node_js)
        .arg(workspace().join("tests/browser").join(script))
        .env("QUIVER_URL", &node.base)
        .env("CHROMIUM", &chromium)
        .env("NPM_DIR", &npm)
        .env("SCREENSHOT", &screenshot)
        .envs(envs.iter().copied())
        // Chromium's profile and crash files stay in the scratch directory, even when
        // the run is killed.
        .env("HOME", scratch.path())
        .env("TMPDIR", scratch.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start node");
    let mut to_driver = child.stdin.take().expect("stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let stderr = child.stderr.take().expect("stderr");
    let progress = tokio::spawn(async move {
        let mut all = String::new();
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let mut driver = Driver { child };
    let start = Instant::now();
    let mut passed = Vec::new();
    let outcome: Result<(), String> = loop {
        let left = RUN.saturating_sub(start.elapsed());
        let line = match tokio::time::timeout(left, lines.next_line()).await {
            Err(_) => break Err(format!("the driver took longer than {RUN:?}")),
            Ok(Err(e)) => break Err(format!("reading the driver: {e}")),
            Ok(Ok(None)) => break Err("the driver ended without `done`".into()),
            Ok(Ok(Some(line))) => line,
        };
        if line == "done" {
            break Ok(());
        }
        let Some(rest) = line.strip_prefix("checkpoint ") else {
            continue;
        };
        let (name, data) = rest.split_once(' ').unwrap_or((rest, "null"));
        let data: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        let reply = match check(name, &data).await {
            Ok(()) => {
                passed.push(name.to_owned());
                "continue\n".to_owned()
            }
            Err(why) => {
                let _ = to_driver.write_all(b"fail api check\n").await;
                break Err(format!("checkpoint {name}: {why}"));
            }
        };
        if let Err(e) = to_driver.write_all(reply.as_bytes()).await {
            break Err(format!("writing to the driver: {e}"));
        }
    };
    let status = tokio::time::timeout(Duration::from_secs(30), driver.child.wait()).await;
    let log = tokio::time::timeout(Duration::from_secs(5), progress)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    if let Err(why) = outcome {
        // Keep the screenshot where the failure message points.
        let kept = workspace().join("target/admin_page_failure.png");
        let shot = std::fs::copy(&screenshot, &kept)
            .map(|_| kept.display().to_string())
            .unwrap_or_else(|_| "(none)".into());
        panic!(
            "{why}\npassed: {passed:?}\nscreenshot: {shot}\ndriver:\n{log}\nnode stderr:\n{}",
            node.stderr()
        );
    }
    let status = status
        .expect("the driver exits after `done`")
        .expect("wait");
    assert!(status.success(), "driver: {status:?}\n{log}");
    (passed, log)
}

#[tokio::test]
async fn a_person_manages_servers_from_the_admin_page() {
    let registry = RegistryDir::new();
    let node = node(&registry);
    let created =
        Node::send(admin(&node, Method::POST, "/servers").json(&hostile_record("hostile"))).await;
    assert_eq!(created.status, 201, "{created:?}");
    let spaced =
        Node::send(admin(&node, Method::POST, "/servers").json(&spaced_record("Spaced"))).await;
    assert_eq!(spaced.status, 201, "{spaced:?}");

    let scratch = tempfile::tempdir().expect("tempdir");
    let bundle = scratch.path().join("imported.toml");
    let fixture_path = fixture_server();
    let fixture = fixture_path.display().to_string();
    std::fs::write(
        &bundle,
        format!(
            "[[servers]]\nserver_id = \"imported\"\ntransport = \"stdio\"\nallowed_tools = [\"echo\"]\n\n[servers.stdio]\ncommand = {fixture:?}\nargs = [\"--name\", \"imported\"]\n"
        ),
    )
    .expect("write the bundle");
    let envs: [(&str, &std::ffi::OsStr); 5] = [
        ("QUIVER_ADMIN_TOKEN", ADMIN.as_ref()),
        ("FIXTURE_SERVER", fixture_path.as_os_str()),
        ("HOSTILE_ID", "hostile".as_ref()),
        ("HOSTILE_MARKUP", MARKUP.as_ref()),
        ("IMPORT_FILE", bundle.as_os_str()),
    ];
    let (passed, log) = drive(
        &node,
        "admin_page.mjs",
        &envs,
        &scratch,
        async |name: &str, data: &Value| check(&node, name, data).await,
    )
    .await;
    assert_eq!(
        passed,
        [
            "created",
            "tested",
            "tools",
            "pinned",
            "edited",
            "spaced-open",
            "spaced-saved",
            "deleted",
            "import-preview",
            "imported",
            "profile",
            "profile-deleted"
        ],
        "{log}"
    );
    // The record the page made is gone from the directory too.
    assert!(!registry.path().join("fx.toml").exists());
}

/// An approver's view: sign in, see a call arrive live, deny it with a reason.
#[tokio::test]
async fn an_approver_decides_a_waiting_call_from_the_page() {
    const SUBMIT: &str = "approvals-web-submit-token";
    const APPROVER: &str = "approvals-web-ops-token";
    const REASON: &str = "not <b>now</b>";
    let registry = RegistryDir::new();
    registry.write(
        "guarded.toml",
        &format!(
            "approval_policy = \"always\"\n{}",
            fixture_toml("guarded", &["*"], "")
        ),
    );
    let scratch = tempfile::tempdir().expect("tempdir");
    let audit = scratch.path().join("audit.jsonl");
    let node = Node::start_with_args(
        &registry,
        Some(
            "[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\n\
             [clients.ops]\ntoken_env = \"QV_OPS\"\nroles = [\"approve\"]\n",
        ),
        &[("QUIVER_TEST_TOKEN", SUBMIT), ("QV_OPS", APPROVER)],
        &["--audit-log".as_ref(), audit.as_os_str()],
    );
    let module = node
        .upload(wat::mcp_calls(&[("guarded", "echo", r#"{"text":"hi"}"#)], 1).as_bytes())
        .await;
    let task = json!({
        "task_id": "web-approval",
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": "[\"guarded\"]"},
        "limits": {"deadline_ms": 120000},
    });
    let mut task_id = String::new();
    let envs: [(&str, &std::ffi::OsStr); 2] = [
        ("APPROVER_TOKEN", APPROVER.as_ref()),
        ("REASON", REASON.as_ref()),
    ];
    let (passed, log) = drive(
        &node,
        "approvals_page.mjs",
        &envs,
        &scratch,
        async |name: &str, data: &Value| match name {
            "signed-in" => {
                let expected = json!({
                    "whoami": "ops: approve",
                    "servers_tab_hidden": true,
                    "profiles_tab_hidden": true,
                    "servers_view_hidden": true,
                    "empty_shown": true,
                });
                if *data != expected {
                    return Err(format!("the page shows {data}"));
                }
                // Only now does a call start waiting: the page must pick it up live.
                task_id = node.submit_ok(&module, task.clone()).await;
                Ok(())
            }
            "listed" => {
                let listed = Node::send(
                    node.anonymous(Method::GET, "/v1/approvals")
                        .bearer_auth(APPROVER),
                )
                .await;
                let pending = &listed.json["approvals"][0];
                let same = data["id"] == pending["id"]
                    && data["task"] == "web-approval"
                    && data["principal"] == "serve"
                    && data["server"] == "guarded"
                    && data["tool"] == "echo"
                    && data["arguments"]
                        .as_str()
                        .is_some_and(|a| a.starts_with("text;") && !a.contains("hi"));
                same.then_some(())
                    .ok_or(format!("the page shows {data}, the API {listed:?}"))
            }
            "denied" => {
                let done = node.task(&task_id, 60).await;
                let stderr = done.json["stderr"].as_str().unwrap_or_default();
                if done.json["status"] != "finished"
                    || !stderr.contains("mcp_policy_denied")
                    || !stderr.contains("not <b>now</b>")
                {
                    return Err(format!("the task ended as {done:?}"));
                }
                let start = Instant::now();
                loop {
                    let text = std::fs::read_to_string(&audit).unwrap_or_default();
                    let decided = text
                        .lines()
                        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                        .find(|l| l["event"] == "approval_decided");
                    if let Some(line) = decided {
                        let ok = line["decided_by"] == "ops"
                            && line["principal"] == "serve"
                            && line["approved"] == false
                            && line["reason"] == REASON;
                        return ok.then_some(()).ok_or(format!("the audit line: {line}"));
                    }
                    if start.elapsed() > Duration::from_secs(20) {
                        return Err(format!("no approval_decided line in {text}"));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            other => Err(format!("unknown checkpoint {other}")),
        },
    )
    .await;
    assert_eq!(passed, ["signed-in", "listed", "denied"], "{log}");
}

async fn get(node: &Node, path: &str) -> (Answer, String) {
    let response = node
        .anonymous(Method::GET, path)
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    (
        Answer {
            status,
            headers,
            json,
        },
        text,
    )
}

fn header<'a>(answer: &'a Answer, name: &str) -> &'a str {
    answer
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

#[tokio::test]
async fn the_page_is_served_without_a_token_with_strict_headers() {
    let registry = RegistryDir::new();
    let node = node(&registry);

    let (index, html) = get(&node, "/admin/").await;
    assert_eq!(index.status, 200, "{index:?}");
    assert!(header(&index, "content-type").starts_with("text/html"));
    assert!(html.contains("assets/app.js"), "{html}");
    let csp = header(&index, "content-security-policy");
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(header(&index, "x-frame-options"), "DENY");
    assert_eq!(header(&index, "x-content-type-options"), "nosniff");
    assert_eq!(header(&index, "cache-control"), "no-store");

    for (file, kind) in [("app.js", "text/javascript"), ("app.css", "text/css")] {
        let (asset, body) = get(&node, &format!("/admin/assets/{file}")).await;
        assert_eq!(asset.status, 200, "{file}: {asset:?}");
        assert!(
            header(&asset, "content-type").starts_with(kind),
            "{asset:?}"
        );
        assert_eq!(header(&asset, "x-content-type-options"), "nosniff");
        assert!(!body.is_empty());
    }
    for missing in [
        "/admin/assets/nope.js",
        "/admin/assets/..%2Fmod.rs",
        "/admin/assets/",
        "/admin/index.html",
    ] {
        let (answer, _) = get(&node, missing).await;
        assert_eq!(answer.status, 404, "{missing}: {answer:?}");
    }

    // `/admin` leads to `/admin/` (the client here does not follow redirects itself).
    let no_follow = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let redirect = no_follow
        .get(format!("{}/admin", node.base))
        .send()
        .await
        .expect("GET /admin");
    assert!(redirect.status().is_redirection(), "{redirect:?}");
    assert_eq!(redirect.headers()["location"], "/admin/");

    // The page is open; the data is not.
    let (listing, _) = get(&node, "/admin/api/mcp/servers").await;
    assert_eq!(listing.status, 401, "{listing:?}");
}

/// A free loopback port, known before the node binds it (its public URL names it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// User authorization through `quiver serve` in a real Chromium
/// (tests/browser/authorize_page.mjs): Authorize on the admin page opens the node's page,
/// whose button sets the `__Host-` cookie on `http://127.0.0.1` and sends the browser to
/// the authorization server's login page; a second browser context with that URL but
/// without the cookie is refused at the callback, and the first one's consent comes back
/// to `/oauth/callback` and makes the grant a task of that principal then uses at the
/// protected MCP server.
#[tokio::test]
async fn a_person_authorizes_a_server_from_the_admin_page_in_a_browser() {
    const PORTAL: &str = "authorize-web-portal-token";
    const ANN: &str = "ann@example.com";
    const MALLORY: &str = "mallory@example.com";
    let tokens = quiver_tests::oauth::TokenServer::start("unused", "unused", RUN).await;
    let server = quiver_tests::FixtureHttp::spawn(
        "http",
        &[
            "--bearer-introspect",
            &tokens.introspect_url(),
            "--protected-resource",
            &tokens.issuer(),
        ],
    );
    let registry = RegistryDir::new();
    registry.write(
        "users.toml",
        &format!(
            "server_id = \"users\"\ntransport = \"streamable_http\"\nallowed_tools = [\"*\"]\n[http]\nurl = {:?}\nauth_ref = \"people\"\n",
            server.url()
        ),
    );
    let listen = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "[serve]\npublic_url = \"http://{listen}\"\n\
         [clients.portal]\ntoken_env = \"QUIVER_TEST_TOKEN\"\nroles = [\"registry\", \"authorize\", \"submit\"]\nact_for = [\"*@example.com\"]\n\
         [auth.people]\nkind = \"oauth_authorization_code\"\nservers = [\"users\"]\n\
         [egress]\nallow_private = [\"127.0.0.0/8\"]\n"
    );
    let node = Node::start_listening(
        &listen,
        &registry,
        &config,
        &[("QUIVER_TEST_TOKEN", PORTAL)],
    );
    let status_path = "/v1/authorizations/users/ann%40example.com";
    let module = node
        .upload(wat::mcp_calls(&[("users", "whoami", "{}")], 1).as_bytes())
        .await;
    let whoami = async || {
        let task = json!({
            "task_id": quiver_tests::unique_id("authorize-web"),
            "config": {"mcp.enabled": "true", "mcp.default_server_ids": "[\"users\"]"},
            "limits": {"deadline_ms": 60000},
        });
        let submitted = Node::send(
            node.request(Method::POST, "/v1/tasks")
                .json(&json!({"module": module, "task": task, "principal": ANN})),
        )
        .await;
        let id = submitted.json["id"].as_str().unwrap_or_default().to_owned();
        let done = node.task(&id, 50).await;
        (
            done.json["status"].clone(),
            done.json["stderr"].as_str().unwrap_or_default().to_owned(),
        )
    };

    let scratch = tempfile::tempdir().expect("tempdir");
    let issuer = tokens.issuer();
    let envs: [(&str, &std::ffi::OsStr); 5] = [
        ("PORTAL_TOKEN", PORTAL.as_ref()),
        ("SERVER_ID", "users".as_ref()),
        ("PRINCIPAL", ANN.as_ref()),
        ("INTRUDER", MALLORY.as_ref()),
        ("AS_URL", issuer.as_ref()),
    ];
    let (passed, log) = drive(
        &node,
        "authorize_page.mjs",
        &envs,
        &scratch,
        async |name: &str, data: &Value| {
            let status = node.get_json(status_path).await;
            match name {
                "at-authorization-server" => {
                    // Chromium kept the node's __Host- cookie on plain-http loopback.
                    let cookie = &data["cookies"][0];
                    let ok = data["cookies"].as_array().map(Vec::len) == Some(1)
                        && cookie["secure"] == true
                        && cookie["http_only"] == true
                        && cookie["same_site"] == "Lax"
                        && cookie["path"] == "/"
                        && data["prompt"] == "consent"
                        && status["pending"] == true
                        && status["authorized"] == false;
                    ok.then_some(())
                        .ok_or(format!("the browser holds {data}; the node says {status}"))
                }
                "other-browser" => {
                    let text = data["text"].as_str().unwrap_or_default();
                    let ok = data["url_is_callback"] == true
                        && data["status"] == 400
                        && text.contains("This browser did not start this authorization")
                        && status["authorized"] == false
                        && status["pending"] == true;
                    ok.then_some(()).ok_or(format!(
                        "the other browser got {data}; the node says {status}"
                    ))
                }
                "authorized" => {
                    let text = data["text"].as_str().unwrap_or_default();
                    let page_ok = data["url_is_callback"] == true
                        && data["status"] == 200
                        && text.contains("Quiver may now use server `users` for `ann@example.com`")
                        && data["cookies_left"] == json!([]);
                    let granted = status["authorized"] == true
                        && status["pending"] == false
                        && status["refreshable"] == true;
                    if !(page_ok && granted) {
                        return Err(format!("the browser got {data}; the node says {status}"));
                    }
                    // Ann's task calls the protected server with her token.
                    let (task_status, stderr) = whoami().await;
                    (task_status == "finished"
                        && stderr.contains("ann@ex")
                        && !stderr.contains("mallory"))
                    .then_some(())
                    .ok_or(format!("Ann's task: {task_status} {stderr}"))
                }
                "grant-shown" => {
                    let summary = data["summary"].as_str().unwrap_or_default();
                    summary
                        .starts_with("authorized; scopes:")
                        .then_some(())
                        .ok_or(format!("the page shows {data}"))
                }
                other => Err(format!("unknown checkpoint {other}")),
            }
        },
    )
    .await;
    assert_eq!(
        passed,
        [
            "at-authorization-server",
            "other-browser",
            "authorized",
            "grant-shown"
        ],
        "{log}"
    );
    // Both people logged in at the authorization server; only Ann's code made the grant.
    let users: Vec<String> = tokens
        .authorizations()
        .into_iter()
        .map(|a| a.user)
        .collect();
    assert_eq!(users, [MALLORY, ANN]);
    let stderr = node.stderr();
    for token in tokens.all_tokens() {
        assert!(!stderr.contains(&token), "the node logged a token");
    }
}
