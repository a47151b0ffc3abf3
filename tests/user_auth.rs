//! User authorization (`[auth.NAME] kind = "oauth_authorization_code"`) end to end: a real
//! authorization server ([`TokenServer`]: PKCE, dynamic registration, rotating refresh
//! tokens, introspection) in front of the real fixture MCP server over HTTP, driven through
//! the library (a [`UserAuthorizer`] that plays the person's browser) and through the
//! `quiver` CLI (`mcp login --open-with` a curl script). Covers per-principal tokens,
//! missing grants, refresh, revocation, grants on disk, and hostile authorization servers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use quiver::{
    AuthConfig, AuthorizationPrompt, AuthorizeError, DirGrantStore, EgressConfig, Host, HostConfig,
    McpError, TaskSpec, ToolCallError, ToolCallRequest, UserAuthorizer,
};
use quiver_tests::oauth::{AsOptions, TokenServer, USER_HEADER};
use quiver_tests::{FixtureHttp, RegistryDir, host_builder, quiver_cli};

const SERVER: &str = "users";

/// The fixture behind `tokens`, announcing it as its authorization server (RFC 9728).
fn protected_fixture(tokens: &TokenServer) -> FixtureHttp {
    FixtureHttp::spawn(
        "http",
        &[
            "--bearer-introspect",
            &tokens.introspect_url(),
            "--protected-resource",
            &tokens.issuer(),
        ],
    )
}

fn registry_for(server: &FixtureHttp) -> RegistryDir {
    let registry = RegistryDir::new();
    registry.write(
        "users.toml",
        &format!(
            "server_id = {SERVER:?}\ntransport = \"streamable_http\"\nallowed_tools = [\"*\"]\n[http]\nurl = {:?}\nauth_ref = \"people\"\n[budgets]\ntool_timeout_ms = 5000\n",
            server.url()
        ),
    );
    registry
}

const AUTH_TOML: &str = "kind = \"oauth_authorization_code\"\nservers = [\"users\"]\n";

fn host_config() -> HostConfig {
    let auth: AuthConfig = toml::from_str(AUTH_TOML).unwrap();
    HostConfig {
        auth: BTreeMap::from([("people".to_owned(), auth)]),
        egress: EgressConfig {
            allow_private: vec!["127.0.0.0/8".into()],
            ..EgressConfig::default()
        },
        ..HostConfig::default()
    }
}

/// A host keeping grants in `grants`, asking `browser` (if any) when a person is needed.
fn user_host(
    registry: &RegistryDir,
    grants: &Path,
    browser: Option<Arc<Browser>>,
    audit: Option<&Path>,
) -> Host {
    quiver_tests::init_logging();
    let mut builder = host_builder(registry)
        .with_config(host_config(), ".")
        .with_connect_timeout(Duration::from_secs(10))
        .with_grant_store(Arc::new(DirGrantStore::new(grants)));
    if let Some(browser) = browser {
        builder = builder.with_user_authorizer(browser);
    }
    if let Some(audit) = audit {
        builder = builder.with_audit_log(audit);
    }
    builder.build().unwrap()
}

/// A person's browser: logs in at the authorization URL as the prompt's principal (the
/// [`USER_HEADER`]) and hands back where the authorization server redirected it.
#[derive(Default)]
struct Browser {
    prompts: Mutex<Vec<AuthorizationPrompt>>,
}

impl UserAuthorizer for Browser {
    fn redirect_uri(&self) -> String {
        // Nothing listens there: the browser returns the redirect instead of following it.
        "http://127.0.0.1:9/callback".into()
    }

    fn authorize(
        &self,
        prompt: AuthorizationPrompt,
    ) -> BoxFuture<'_, Result<String, AuthorizeError>> {
        Box::pin(async move {
            self.prompts.lock().unwrap().push(prompt.clone());
            let client = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            let answer = client
                .get(&prompt.url)
                .header(USER_HEADER, &prompt.principal)
                .send()
                .await
                .map_err(|e| AuthorizeError(format!("GET authorization URL: {e}")))?;
            match answer.headers().get(reqwest::header::LOCATION) {
                Some(location) => Ok(location.to_str().unwrap().to_owned()),
                None => Err(AuthorizeError(format!(
                    "the authorization server answered {}: {}",
                    answer.status(),
                    answer.text().await.unwrap_or_default()
                ))),
            }
        })
    }
}

impl Browser {
    fn prompt_count(&self) -> usize {
        self.prompts.lock().unwrap().len()
    }
}

fn task_as(principal: &str) -> TaskSpec {
    let mut task = TaskSpec::new(format!("as-{principal}"))
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", serde_json::json!([SERVER]));
    task.principal = Some(principal.to_owned());
    task
}

async fn whoami(host: &Host, task: &TaskSpec) -> Result<String, McpError> {
    let request = ToolCallRequest::new(SERVER, "whoami");
    match host.call_tool(task, request).await {
        Ok(out) => Ok(out.result.content[0].as_text().unwrap().text.clone()),
        Err(ToolCallError::Failed(error) | ToolCallError::Timeout(error)) => Err(error),
        Err(refused) => panic!("whoami was not called: {refused}"),
    }
}

/// Every grant file under `dir`.
fn grant_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(grant_files(&path));
        } else if path.extension().is_some_and(|e| e == "json") {
            files.push(path);
        }
    }
    files
}

fn assert_no_token_in(tokens: &TokenServer, what: &str, text: &str) {
    for token in tokens.all_tokens() {
        assert!(!text.contains(&token), "{what} shows a token: {text}");
    }
}

#[tokio::test]
async fn two_principals_on_one_host_each_call_with_their_own_token() {
    let tokens = TokenServer::start("unused", "unused", Duration::from_secs(3600)).await;
    let server = protected_fixture(&tokens);
    let registry = registry_for(&server);
    let grants = tempfile::tempdir().unwrap();
    let audit = grants.path().join("audit.jsonl");
    let browser = Arc::new(Browser::default());
    let host = user_host(
        &registry,
        grants.path(),
        Some(browser.clone()),
        Some(&audit),
    );

    host.authorize_server(SERVER, "alice").await.unwrap();
    host.authorize_server(SERVER, "bob").await.unwrap();
    assert_eq!(browser.prompt_count(), 2);
    let authorizations = tokens.authorizations();
    assert_eq!(
        authorizations
            .iter()
            .map(|a| a.user.as_str())
            .collect::<Vec<_>>(),
        ["alice", "bob"]
    );
    assert!(
        authorizations.iter().all(|a| a.resource == server.url()),
        "the resource parameter names the server: {authorizations:?}"
    );

    for _ in 0..2 {
        assert_eq!(whoami(&host, &task_as("alice")).await.unwrap(), "alice-");
        assert!(
            whoami(&host, &task_as("bob"))
                .await
                .unwrap()
                .starts_with("bob-")
        );
    }
    assert_eq!(
        browser.prompt_count(),
        2,
        "grants are reused, nobody is asked again"
    );
    assert_eq!(tokens.issued_count(), 2, "one token each");
    host.shutdown().await;

    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let principals: Vec<&str> = lines
        .iter()
        .filter(|l| l.to_string().contains("whoami"))
        .filter_map(|l| l["principal"].as_str())
        .collect();
    assert_eq!(principals.len(), 4, "{lines:?}");
    assert_eq!(principals.iter().filter(|p| **p == "alice").count(), 2);
    assert_eq!(principals.iter().filter(|p| **p == "bob").count(), 2);
    let audit_text = std::fs::read_to_string(&audit).unwrap();
    assert_no_token_in(&tokens, "the audit log", &audit_text);

    use std::os::unix::fs::PermissionsExt;
    let files: Vec<PathBuf> = grant_files(grants.path())
        .into_iter()
        .filter(|p| p != &audit)
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    for file in files {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }
}

#[tokio::test]
async fn a_principal_without_a_grant_fails_clearly_on_a_host_that_cannot_ask() {
    let tokens = TokenServer::start("unused", "unused", Duration::from_secs(3600)).await;
    let server = protected_fixture(&tokens);
    let registry = registry_for(&server);
    let grants = tempfile::tempdir().unwrap();
    let host = user_host(&registry, grants.path(), None, None);

    let started = Instant::now();
    let error = whoami(&host, &task_as("carol")).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "no hang");
    for part in ["`users`", "`carol`", "quiver mcp login users --as carol"] {
        assert!(error.message.contains(part), "{part}: {error}");
    }
    assert!(
        tokens.authorizations().is_empty() && tokens.token_request_count() == 0,
        "no flow started"
    );
    let error = host.authorize_server(SERVER, "carol").await.unwrap_err();
    assert!(error.to_string().contains("quiver mcp login"), "{error}");
    assert!(tokens.authorizations().is_empty());
    host.shutdown().await;
}

#[tokio::test]
async fn an_expired_or_rejected_token_is_refreshed_and_the_call_succeeds() {
    // Tokens live 2 s: the client refreshes before use once they expired.
    let tokens = TokenServer::start("unused", "unused", Duration::from_secs(2)).await;
    let server = protected_fixture(&tokens);
    let registry = registry_for(&server);
    let grants = tempfile::tempdir().unwrap();
    let browser = Arc::new(Browser::default());
    let host = user_host(&registry, grants.path(), Some(browser.clone()), None);
    host.authorize_server(SERVER, "alice").await.unwrap();
    let task = task_as("alice");
    assert_eq!(whoami(&host, &task).await.unwrap(), "alice-");

    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(whoami(&host, &task).await.unwrap(), "alice-");
    let after_expiry = tokens.refresh_count();
    assert!(after_expiry >= 1, "an expired token is refreshed");

    // The server rejects the token (401): one refresh, and the call is retried.
    tokens.revoke_all();
    assert_eq!(whoami(&host, &task).await.unwrap(), "alice-");
    assert!(
        tokens.refresh_count() > after_expiry,
        "a 401 is answered by a refresh"
    );
    assert_eq!(browser.prompt_count(), 1, "nobody is asked again");
    host.shutdown().await;
}

#[tokio::test]
async fn a_revoked_grant_fails_that_principal_only() {
    let tokens = TokenServer::start("unused", "unused", Duration::from_secs(3600)).await;
    let server = protected_fixture(&tokens);
    let registry = registry_for(&server);
    let grants = tempfile::tempdir().unwrap();
    // A person authorizes on one host (the CLI); tasks run on another that cannot ask.
    let login = user_host(&registry, grants.path(), Some(Arc::default()), None);
    login.authorize_server(SERVER, "alice").await.unwrap();
    login.authorize_server(SERVER, "bob").await.unwrap();
    login.shutdown().await;
    let host = user_host(&registry, grants.path(), None, None);
    assert!(
        whoami(&host, &task_as("bob"))
            .await
            .unwrap()
            .starts_with("bob-")
    );

    tokens.revoke_user("bob");
    let started = Instant::now();
    // The call on the open session fails saying what to do (the refusal of the refresh
    // inside the transport is carried out of the ended session), not "went away".
    let first = whoami(&host, &task_as("bob")).await.unwrap_err();
    assert_eq!(first.code, quiver::McpErrorCode::PolicyDenied, "{first}");
    assert!(
        first.message.contains("`bob`") && first.message.contains("quiver mcp login"),
        "{first}"
    );
    assert_no_token_in(&tokens, "the error", &first.to_string());
    // The next connection asks the grant first and says what to do.
    let error = whoami(&host, &task_as("bob")).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "no hang");
    assert!(
        error.message.contains("`bob`") && error.message.contains("quiver mcp login"),
        "{error}"
    );
    assert_no_token_in(&tokens, "the error", &error.to_string());
    assert_eq!(whoami(&host, &task_as("alice")).await.unwrap(), "alice-");
    host.shutdown().await;
}

#[tokio::test]
async fn idle_per_principal_connections_are_closed_and_reopen_on_the_next_call() {
    let tokens = TokenServer::start("unused", "unused", Duration::from_secs(3600)).await;
    let server = protected_fixture(&tokens);
    let registry = registry_for(&server);
    let grants = tempfile::tempdir().unwrap();
    let login = user_host(&registry, grants.path(), Some(Arc::default()), None);
    login.authorize_server(SERVER, "alice").await.unwrap();
    login.authorize_server(SERVER, "bob").await.unwrap();
    login.shutdown().await;
    let host = host_builder(&registry)
        .with_config(host_config(), ".")
        .with_connect_timeout(Duration::from_secs(10))
        .with_grant_store(Arc::new(DirGrantStore::new(grants.path())))
        .with_server_idle_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let connected = |host: &Host| {
        host.status()
            .mcp_servers
            .iter()
            .any(|s| s.server_id == SERVER)
    };
    assert_eq!(whoami(&host, &task_as("alice")).await.unwrap(), "alice-");
    assert!(
        whoami(&host, &task_as("bob"))
            .await
            .unwrap()
            .starts_with("bob-")
    );
    assert!(connected(&host), "each principal holds a connection");
    // Unused past the idle timeout: both principals' connections are gone.
    let until = Instant::now() + Duration::from_secs(20);
    while connected(&host) {
        assert!(
            Instant::now() < until,
            "idle per-principal connections stay open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The next call connects again with the principal's grant.
    assert_eq!(whoami(&host, &task_as("alice")).await.unwrap(), "alice-");
    host.shutdown().await;
}

// ---- The CLI ----

/// A browser for `--open-with`: logs in as `$QUIVER_TEST_BROWSER_USER` and follows the
/// redirect to quiver's loopback callback.
fn browser_script(dir: &Path) -> String {
    let path = dir.join("browser.sh");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nset -e\nloc=$(curl -sS -o /dev/null -w '%{{redirect_url}}' -H \"{USER_HEADER}: $QUIVER_TEST_BROWSER_USER\" \"$1\")\n[ -n \"$loc\" ]\ncurl -sSf -o /dev/null \"$loc\"\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_str().unwrap().to_owned()
}

fn quiver(registry: &RegistryDir, config: &Path, user: &str, args: &[&str]) -> Output {
    Command::new(quiver_cli())
        .args(["mcp"])
        .args(args)
        .arg("--registry")
        .arg(registry.path())
        .arg("--config")
        .arg(config)
        .env("QUIVER_TEST_BROWSER_USER", user)
        .env("RUST_LOG", "debug")
        .env_remove("QUIVER_REGISTRY")
        .env_remove("QUIVER_CONFIG")
        .output()
        .unwrap()
}

#[test]
fn the_cli_logs_in_calls_and_logs_out_per_principal_without_showing_tokens() {
    let tokens = TokenServer::start_blocking("unused", "unused", Duration::from_secs(3600));
    let server = protected_fixture(&tokens);
    let registry = registry_for(&server);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("quiver.toml");
    std::fs::write(
        &config,
        format!("[auth.people]\n{AUTH_TOML}\n[egress]\nallow_private = [\"127.0.0.0/8\"]\n"),
    )
    .unwrap();
    let browser = browser_script(dir.path());
    let mut outputs = Vec::new();
    for user in ["alice", "bob"] {
        let out = quiver(
            &registry,
            &config,
            user,
            &["login", SERVER, "--as", user, "--open-with", &browser],
        );
        assert!(out.status.success(), "{user}: {out:?}");
        outputs.push(out);
    }
    for user in ["alice", "bob"] {
        let out = quiver(
            &registry,
            &config,
            user,
            &["call", SERVER, "whoami", "--as", user],
        );
        assert!(out.status.success(), "{user}: {out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(&format!("{user}-")), "{user}: {stdout}");
        outputs.push(out);
    }
    assert_eq!(tokens.authorizations().len(), 2);

    let grants = registry.path().join(".grants");
    assert_eq!(grant_files(&grants).len(), 2);
    let out = quiver(
        &registry,
        &config,
        "bob",
        &["logout", SERVER, "--as", "bob"],
    );
    assert!(out.status.success(), "{out:?}");
    outputs.push(out);
    assert_eq!(grant_files(&grants).len(), 1, "bob's grant file is gone");
    // Bob's refresh and access tokens were revoked at the authorization server (RFC 7009).
    let revoked: Vec<(String, String)> = tokens
        .revocations()
        .into_iter()
        .filter_map(|r| Some((r.revoked?, r.token)))
        .collect();
    assert_eq!(revoked.len(), 2, "{revoked:?}");
    assert_eq!(revoked[0].0, "refresh_token");
    assert!(revoked[0].1.starts_with("rt-bob-"), "{revoked:?}");
    assert_eq!(revoked[1].0, "access_token");
    assert!(revoked[1].1.starts_with("bob-"), "{revoked:?}");
    let out = quiver(
        &registry,
        &config,
        "bob",
        &["call", SERVER, "whoami", "--as", "bob"],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("quiver mcp login users --as bob"),
        "{stderr}"
    );
    outputs.push(out);
    let out = quiver(
        &registry,
        &config,
        "alice",
        &["call", SERVER, "whoami", "--as", "alice"],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("alice-"),
        "{out:?}"
    );
    outputs.push(out);

    for out in &outputs {
        assert_no_token_in(&tokens, "stderr", &String::from_utf8_lossy(&out.stderr));
        assert_no_token_in(&tokens, "stdout", &String::from_utf8_lossy(&out.stdout));
    }
}

#[test]
fn logout_forgets_the_grant_when_the_authorization_server_does_not_answer_the_revocation() {
    let options = AsOptions {
        revocation_delay: Duration::from_secs(300),
        ..AsOptions::default()
    };
    let tokens = TokenServer::start_with("unused", "unused", Duration::from_secs(3600), options);
    let server = protected_fixture(&tokens);
    let registry = registry_for(&server);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("quiver.toml");
    std::fs::write(
        &config,
        format!("[auth.people]\n{AUTH_TOML}\n[egress]\nallow_private = [\"127.0.0.0/8\"]\n"),
    )
    .unwrap();
    let browser = browser_script(dir.path());
    let login = quiver(
        &registry,
        &config,
        "alice",
        &["login", SERVER, "--as", "alice", "--open-with", &browser],
    );
    assert!(login.status.success(), "{login:?}");
    let grants = registry.path().join(".grants");
    assert_eq!(grant_files(&grants).len(), 1);

    let started = Instant::now();
    let out = quiver(
        &registry,
        &config,
        "alice",
        &["logout", SERVER, "--as", "alice"],
    );
    let took = started.elapsed();
    assert!(out.status.success(), "{out:?}");
    assert!(
        took < quiver::defaults::OAUTH_REVOCATION_TIMEOUT + Duration::from_secs(20),
        "logout took {took:?}"
    );
    assert!(grant_files(&grants).is_empty(), "the grant is gone here");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("could not be revoked at the authorization server")
            && stderr.contains("did not answer within"),
        "{stderr}"
    );
    assert_no_token_in(&tokens, "stderr", &stderr);
    assert_eq!(tokens.revocations().len(), 0, "none answered");
}

const SEAL_KEY: &str = "3b8e1f0a9c2d4e6f8a0b1c3d5e7f9a1b2c4d6e8f0a1b3c5d7e9f1a2b4c6d8e0f";

/// `quiver mcp ARGS --registry REGISTRY [--config CONFIG]`, the browser logging in as
/// `user`, with the fleet's grant key in `QV_GRANT_KEY`.
fn quiver_on(registry: &str, config: Option<&Path>, user: &str, args: &[&str]) -> Output {
    let mut command = Command::new(quiver_cli());
    command
        .args(["mcp"])
        .args(args)
        .args(["--registry", registry]);
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    command
        .env("QUIVER_TEST_BROWSER_USER", user)
        .env("QV_GRANT_KEY", SEAL_KEY)
        .env_remove("QUIVER_REGISTRY")
        .env_remove("QUIVER_CONFIG")
        .output()
        .unwrap()
}

/// `quiver mcp login` against an etcd registry keeps the grant in the fleet's etcd grant
/// store (sealed with `[etcd] grant_key_env`, as a node does): a node's host with the same
/// etcd and key calls the server as that principal, etcd holds no token, and `logout`
/// there revokes it for the whole fleet.
#[tokio::test]
async fn the_cli_logs_in_to_an_etcd_registry_and_the_fleet_uses_the_grant() {
    let tokens = TokenServer::start("unused", "unused", Duration::from_secs(3600)).await;
    let server = protected_fixture(&tokens);
    let registry = registry_for(&server);
    let etcd = quiver_tests::etcd::Etcd::start();
    let prefix = quiver_tests::unique_id("cli-grants");
    let store = quiver_node::EtcdStore::connect(vec![etcd.endpoint()], format!("/{prefix}"))
        .await
        .unwrap();
    let record = std::fs::read(registry.path().join("users.toml")).unwrap();
    use quiver::registry::RegistryStore as _;
    store
        .upsert(
            quiver::registry::DocKind::Server,
            SERVER,
            quiver::registry::DocFormat::Toml,
            record,
        )
        .await
        .unwrap();
    let url = format!(
        "etcd://{}/{prefix}",
        etcd.endpoint().trim_start_matches("http://")
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("quiver.toml");
    std::fs::write(
        &config,
        format!(
            "[auth.people]\n{AUTH_TOML}\n[egress]\nallow_private = [\"127.0.0.0/8\"]\n[etcd]\ngrant_key_env = \"QV_GRANT_KEY\"\n"
        ),
    )
    .unwrap();
    let browser = browser_script(dir.path());

    // Without the nodes' config there is no key: refused, saying what to pass.
    let out = quiver_on(&url, None, "alice", &["login", SERVER, "--as", "alice"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--config") && stderr.contains("grant_key_env"),
        "{stderr}"
    );

    let out = quiver_on(
        &url,
        Some(&config),
        "alice",
        &["login", SERVER, "--as", "alice", "--open-with", &browser],
    );
    assert!(out.status.success(), "{out:?}");
    assert_no_token_in(&tokens, "stderr", &String::from_utf8_lossy(&out.stderr));
    assert!(
        grant_files(&registry.path().join(".grants")).is_empty(),
        "nothing on disk"
    );

    // A node of the fleet: same etcd, same key.
    let sealed = quiver_node::GrantSealKey::from_hex(SEAL_KEY).unwrap();
    let node_host = host_builder(&registry)
        .with_config(host_config(), ".")
        .with_connect_timeout(Duration::from_secs(10))
        .with_grant_store(Arc::new(quiver_node::EtcdGrantStore::new(&store, sealed)))
        .build()
        .unwrap();
    assert_eq!(
        whoami(&node_host, &task_as("alice")).await.unwrap(),
        "alice-"
    );
    let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    let listed = client
        .get(
            format!("/{prefix}-grants/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(listed.kvs().len(), 1, "alice's grant is in etcd");
    assert_no_token_in(
        &tokens,
        "etcd",
        &String::from_utf8_lossy(listed.kvs()[0].value()),
    );

    // Logout from the terminal: gone for the fleet, and revoked at the authorization server.
    let out = quiver_on(
        &url,
        Some(&config),
        "alice",
        &["logout", SERVER, "--as", "alice"],
    );
    assert!(out.status.success(), "{out:?}");
    node_host.shutdown().await;
    let node_host = host_builder(&registry)
        .with_config(host_config(), ".")
        .with_grant_store(Arc::new(quiver_node::EtcdGrantStore::new(
            &store,
            quiver_node::GrantSealKey::from_hex(SEAL_KEY).unwrap(),
        )))
        .build()
        .unwrap();
    let refused = whoami(&node_host, &task_as("alice")).await.unwrap_err();
    assert!(refused.message.contains("quiver mcp login"), "{refused}");
    assert_eq!(
        tokens
            .revocations()
            .iter()
            .filter(|r| r.revoked.is_some())
            .count(),
        2
    );
    node_host.shutdown().await;
}

// ---- Hostile authorization servers ----

/// Authorizes `alice` against a server whose authorization server behaves as `options`
/// say; the error, how long it took, and the authorization server.
async fn authorize_against(options: AsOptions) -> (String, Duration, TokenServer) {
    let tokens = TokenServer::start_with("unused", "unused", Duration::from_secs(3600), options);
    let server = protected_fixture(&tokens);
    let registry = registry_for(&server);
    let grants = tempfile::tempdir().unwrap();
    let host = user_host(&registry, grants.path(), Some(Arc::default()), None);
    let started = Instant::now();
    let error = host
        .authorize_server(SERVER, "alice")
        .await
        .expect_err("a hostile authorization server is refused");
    let elapsed = started.elapsed();
    assert!(
        grant_files(grants.path()).iter().all(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            !text.contains("access_token")
        }),
        "no tokens kept"
    );
    host.shutdown().await;
    (error.to_string(), elapsed, tokens)
}

#[tokio::test]
async fn huge_authorization_server_metadata_is_refused() {
    let (error, elapsed, tokens) = authorize_against(AsOptions {
        metadata_padding: 2 * 1024 * 1024,
        ..AsOptions::default()
    })
    .await;
    // The reason (over the 1 MiB cap) is lost inside rmcp's discovery error; the URL stays.
    assert!(
        error.contains("`users`") && error.contains("metadata discovery"),
        "{error}"
    );
    assert!(
        error.len() < 2000,
        "the document is not echoed: {} bytes",
        error.len()
    );
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
    assert!(tokens.authorizations().is_empty() && tokens.issued_count() == 0);
}

/// serde_json (with `raw_value`, as the host is built) would read the string under its
/// reserved key as the JSON it holds; rmcp parses the metadata, so the host refuses it first.
#[tokio::test]
async fn metadata_hiding_values_in_a_string_is_refused() {
    let (error, _, tokens) = authorize_against(AsOptions {
        metadata_hidden_values: true,
        ..AsOptions::default()
    })
    .await;
    assert!(
        error.contains("`users`") && error.contains("metadata discovery"),
        "{error}"
    );
    assert!(tokens.authorizations().is_empty() && tokens.issued_count() == 0);
}

#[tokio::test]
async fn a_slow_metadata_endpoint_is_bounded_by_the_discovery_deadline() {
    let (error, elapsed, tokens) = authorize_against(AsOptions {
        metadata_delay: Duration::from_secs(120),
        ..AsOptions::default()
    })
    .await;
    assert!(error.contains("`users`"), "{error}");
    assert!(elapsed < Duration::from_secs(45), "{elapsed:?}: {error}");
    assert!(tokens.authorizations().is_empty() && tokens.issued_count() == 0);
}

#[tokio::test]
async fn a_wrong_iss_in_the_authorization_response_is_refused() {
    let (error, _, tokens) = authorize_against(AsOptions {
        authorize_iss: Some("http://evil.example".into()),
        ..AsOptions::default()
    })
    .await;
    assert!(
        error.contains("`users`") && error.contains("iss"),
        "{error}"
    );
    assert_eq!(tokens.authorizations().len(), 1, "the person was asked");
    assert_eq!(
        tokens.token_request_count(),
        0,
        "the code was never exchanged"
    );
}

#[tokio::test]
async fn metadata_redirecting_to_another_host_is_not_followed() {
    let elsewhere = TokenServer::start("unused", "unused", Duration::from_secs(3600)).await;
    let (error, _, tokens) = authorize_against(AsOptions {
        metadata_redirect: Some(format!(
            "http://localhost:{}/.well-known/oauth-authorization-server",
            elsewhere.addr().port()
        )),
        ..AsOptions::default()
    })
    .await;
    assert!(error.contains("`users`"), "{error}");
    assert_eq!(
        elsewhere.metadata_count(),
        0,
        "the redirect was not followed"
    );
    assert!(tokens.authorizations().is_empty() && tokens.issued_count() == 0);
}

// DPoP (`dpop = true`): sender-constrained tokens, and authorization and MCP servers that
// do not bind them, ask for nonces forever or give unusable ones.

/// A host whose credential asks for DPoP-bound tokens, with a browser to ask.
fn dpop_host(registry: &RegistryDir, grants: &Path, browser: Arc<Browser>) -> Host {
    quiver_tests::init_logging();
    let auth: AuthConfig = toml::from_str(&format!("{AUTH_TOML}dpop = true\n")).unwrap();
    let config = HostConfig {
        auth: BTreeMap::from([("people".to_owned(), auth)]),
        ..host_config()
    };
    host_builder(registry)
        .with_config(config, ".")
        .with_connect_timeout(Duration::from_secs(10))
        .with_grant_store(Arc::new(DirGrantStore::new(grants)))
        .with_user_authorizer(browser)
        .build()
        .unwrap()
}

fn dpop_server(dpop: Option<quiver_tests::oauth::DpopMode>) -> TokenServer {
    TokenServer::start_with(
        "unused",
        "unused",
        Duration::from_secs(3600),
        AsOptions {
            dpop,
            ..AsOptions::default()
        },
    )
}

fn code_requests(tokens: &TokenServer) -> usize {
    tokens
        .token_requests()
        .iter()
        .filter(|r| r.grant_type == "authorization_code")
        .count()
}

#[tokio::test]
async fn dpop_is_refused_where_the_authorization_server_does_not_bind_tokens() {
    use quiver_tests::oauth::DpopMode;
    let huge_nonce = "n".repeat(600);
    let cases: [(Option<DpopMode>, &str, usize); 4] = [
        // No DPoP offered: refused before a person is asked.
        (
            None,
            "dpop = true, and the authorization server offers DPoP with [] (dpop_signing_alg_values_supported), not ES256",
            0,
        ),
        // A bearer token despite the proof: no silent downgrade.
        (Some(DpopMode::Unbound), "not DPoP-bound", 1),
        // A nonce asked for again and again: one retry, then the flow's error.
        (Some(DpopMode::NonceLoop), "use_dpop_nonce", 2),
        // A nonce no one should send back: not retried.
        (
            Some(DpopMode::Bind {
                nonce: Some(huge_nonce.clone()),
            }),
            "use_dpop_nonce",
            1,
        ),
    ];
    for (mode, expected, code_requests_made) in cases {
        let asked = mode.is_some();
        let tokens = dpop_server(mode.clone());
        let server = protected_fixture(&tokens);
        let registry = registry_for(&server);
        let grants = tempfile::tempdir().unwrap();
        let browser = Arc::new(Browser::default());
        let host = dpop_host(&registry, grants.path(), browser.clone());
        let error = whoami(&host, &task_as("alice")).await.unwrap_err();
        assert!(
            error.message.contains(expected),
            "{mode:?}: {}",
            error.message
        );
        assert!(!error.message.contains(&huge_nonce), "{}", error.message);
        assert_eq!(browser.prompt_count(), usize::from(asked), "{mode:?}");
        assert_eq!(code_requests(&tokens), code_requests_made, "{mode:?}");
        if asked {
            // Every token request carried a proof the server could check.
            assert!(
                tokens
                    .dpop_outcomes()
                    .iter()
                    .all(|o| o.is_ok() || o.as_ref().unwrap_err() == "no nonce"),
                "{mode:?}: {:?}",
                tokens.dpop_outcomes()
            );
        }
        assert_no_token_in(&tokens, "the error", &error.message);
        host.shutdown().await;
    }
}

/// An MCP server behind `issuer` that takes DPoP tokens only, and answers every one with a
/// new `use_dpop_nonce` challenge; the headers of each request are kept.
fn nonce_demanding_server(
    issuer: String,
) -> (
    String,
    quiver_tests::serve::BackgroundServer,
    Arc<Mutex<Vec<axum::http::HeaderMap>>>,
) {
    use axum::http::{HeaderMap, StatusCode, header};
    let bound = quiver_tests::serve::Bound::new("nonce-demanding MCP server");
    let base = format!("http://{}", bound.addr);
    let url = format!("{base}/mcp");
    let metadata = format!("{base}/.well-known/oauth-protected-resource/mcp");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let resource = url.clone();
    let router = axum::Router::new()
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            axum::routing::get(move || async move {
                axum::Json(serde_json::json!({
                    "resource": resource, "authorization_servers": [issuer],
                }))
            }),
        )
        .route(
            "/mcp",
            axum::routing::any(move |headers: HeaderMap| {
                let kept = kept.clone();
                let metadata = metadata.clone();
                async move {
                    let authorized = headers.contains_key(header::AUTHORIZATION);
                    kept.lock().unwrap().push(headers);
                    let nonce = format!("nonce-{}", kept.lock().unwrap().len());
                    let challenge = match authorized {
                        false => format!("DPoP resource_metadata=\"{metadata}\""),
                        true => format!(
                            "DPoP error=\"use_dpop_nonce\", resource_metadata=\"{metadata}\""
                        ),
                    };
                    (
                        StatusCode::UNAUTHORIZED,
                        [
                            (header::WWW_AUTHENTICATE, challenge),
                            (header::HeaderName::from_static("dpop-nonce"), nonce),
                        ],
                    )
                }
            }),
        );
    (url, bound.serve("nonce-demanding MCP server", router), seen)
}

#[tokio::test]
async fn a_server_that_keeps_asking_for_dpop_nonces_fails_the_call_after_one_retry() {
    use quiver_tests::oauth::{DpopMode, jwt_claims};
    let tokens = dpop_server(Some(DpopMode::Bind {
        nonce: Some("as-nonce".into()),
    }));
    let (url, _server, seen) = nonce_demanding_server(tokens.issuer());
    let registry = RegistryDir::new();
    registry.write(
        "users.toml",
        &format!(
            "server_id = {SERVER:?}\ntransport = \"streamable_http\"\nallowed_tools = [\"*\"]\n[http]\nurl = {url:?}\nauth_ref = \"people\"\n[budgets]\ntool_timeout_ms = 5000\n"
        ),
    );
    let grants = tempfile::tempdir().unwrap();
    let browser = Arc::new(Browser::default());
    let host = dpop_host(&registry, grants.path(), browser.clone());
    let error = whoami(&host, &task_as("alice")).await.unwrap_err();
    assert!(
        error
            .message
            .contains("asks for a DPoP nonce (use_dpop_nonce)"),
        "{}",
        error.message
    );
    host.shutdown().await;

    // The token came after one nonce retry at the authorization server, bound to the key.
    let outcomes = tokens.dpop_outcomes();
    assert_eq!(outcomes[0], Err("no nonce".into()), "{outcomes:?}");
    let jkt = outcomes[1].clone().expect("the retried proof was good");
    let token = tokens
        .token_requests()
        .iter()
        .find_map(|r| r.issued.clone())
        .expect("a token");

    // Each try at the server: `DPoP <token>`, a fresh proof for the request bound to the
    // token, the server's last nonce in the retry; and no more than a nonce retry's worth.
    let seen = seen.lock().unwrap();
    let authorized: Vec<_> = seen
        .iter()
        .filter(|h| h.contains_key(axum::http::header::AUTHORIZATION))
        .collect();
    assert!(
        (2..=6).contains(&authorized.len()),
        "{} authorized requests",
        authorized.len()
    );
    let mut jtis = std::collections::HashSet::new();
    for headers in &authorized {
        let authorization = headers[axum::http::header::AUTHORIZATION].to_str().unwrap();
        assert_eq!(authorization, format!("DPoP {token}"));
        let proof = headers["dpop"].to_str().unwrap();
        let claims = jwt_claims(proof).unwrap();
        assert_eq!(claims["htu"], url.as_str());
        assert!(claims["ath"].is_string());
        assert!(
            jtis.insert(claims["jti"].as_str().unwrap().to_owned()),
            "replayed jti"
        );
    }
    assert!(
        authorized.iter().any(
            |h| jwt_claims(h["dpop"].to_str().unwrap()).unwrap()["nonce"]
                .as_str()
                .is_some_and(|n| n.starts_with("nonce-"))
        ),
        "the server's nonce was sent back"
    );
    // The key stays in the grant, beside the token bound to it; neither in the error.
    let files = grant_files(grants.path());
    let grant = std::fs::read_to_string(&files[0]).unwrap();
    let stored: serde_json::Value = serde_json::from_str(&grant).unwrap();
    let key = stored["dpop_key"].as_str().expect("the key is kept");
    assert!(!error.message.contains(key));
    assert!(!jkt.is_empty());
    assert_no_token_in(&tokens, "the error", &error.message);
}
