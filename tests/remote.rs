//! Remote MCP servers on loopback: the fixture server over Streamable HTTP and legacy
//! HTTP+SSE, behind API keys and OAuth client credentials (a real token endpoint with
//! introspection), plus failures: bad secrets, a server down at start, a server killed
//! mid-call, a missing header variable, and egress denials (including URLs a hostile server
//! or its OAuth metadata names after the connection is allowed).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;

use quiver::HostConfig;
use quiver::{AuthConfig, EgressConfig, McpErrorCode};
use quiver::{Host, PreviewError, ToolCallError, ToolCallRequest};
use quiver_tests::oauth::{AsOptions, TokenServer};
use quiver_tests::{
    FixtureHttp, RegistryDir, example_guest, host_builder, library_task, mcp_task, quiver_cli, run,
};

fn remote_record(server_id: &str, transport: &str, url: &str, extra_http: &str) -> String {
    format!(
        "server_id = {server_id:?}\ntransport = {transport:?}\nallowed_tools = [\"*\"]\n[http]\nurl = {url:?}\n{extra_http}\n[budgets]\ntool_timeout_ms = 5000\n"
    )
}

fn loopback_egress() -> EgressConfig {
    EgressConfig {
        allow_private: vec!["127.0.0.0/8".into()],
        ..EgressConfig::default()
    }
}

fn remote_host(
    registry: &RegistryDir,
    auth: BTreeMap<String, AuthConfig>,
    egress: EgressConfig,
) -> Host {
    quiver_tests::init_logging();
    let config = HostConfig {
        auth,
        egress,
        ..HostConfig::default()
    };
    host_builder(registry)
        .with_config(config, ".")
        .with_connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn oauth(token_server: &TokenServer, secret_env: &str) -> BTreeMap<String, AuthConfig> {
    let text = format!(
        "kind = \"oauth_client_credentials\"\nservers = [\"secure\"]\nclient_id = \"quiver\"\nclient_secret_env = {secret_env:?}\nissuer = {:?}\nscopes = [\"mcp:tools\"]\n",
        token_server.issuer()
    );
    BTreeMap::from([("corp".to_owned(), toml::from_str(&text).unwrap())])
}

async fn call_text(
    host: &Host,
    server_id: &str,
    tool: &str,
    args: serde_json::Value,
) -> Result<String, quiver::McpError> {
    let request = ToolCallRequest::new(server_id, tool).with_arguments(args);
    match host.call_tool(&library_task(server_id), request).await {
        Ok(out) => Ok(out.result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default()),
        Err(ToolCallError::Failed(error) | ToolCallError::Timeout(error)) => Err(error),
        Err(refused) => panic!("{server_id}/{tool} was not called: {refused}"),
    }
}

#[tokio::test]
async fn a_guest_uses_a_streamable_http_server_and_a_legacy_sse_server() {
    let http = FixtureHttp::spawn("http", &[]);
    let sse = FixtureHttp::spawn("sse", &[]);
    let registry = RegistryDir::new();
    registry.write(
        "web.toml",
        &remote_record("web", "streamable_http", http.url(), ""),
    );
    registry.write(
        "old.toml",
        &remote_record("old", "http_sse_legacy", sse.url(), ""),
    );
    let host = remote_host(&registry, BTreeMap::new(), loopback_egress());
    for server in ["web", "old"] {
        let task = mcp_task("remote", &[server]).with_args([server, "add", r#"{"a":20,"b":22}"#]);
        let out = run(&host, &example_guest("mcp-explorer"), &task).await;
        let stdout = out.stdout_text();
        assert!(out.success(), "{server}: {stdout}{}", out.stderr_text());
        assert!(
            stdout.contains("  echo — ") && stdout.trim_end().ends_with("42"),
            "{server}: {stdout}"
        );
    }
    // Pages, list_changed and images work over HTTP too.
    assert!(host.server_tools("old").await.unwrap().len() > 8);
    host.shutdown().await;
}

#[tokio::test]
async fn oauth_client_credentials_tokens_are_cached_refreshed_and_retried_once_on_401() {
    let tokens = TokenServer::start("quiver", "s3cret-value", Duration::from_secs(2)).await;
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    let registry = RegistryDir::new();
    registry.write(
        "secure.toml",
        &remote_record(
            "secure",
            "streamable_http",
            server.url(),
            "auth_ref = \"corp\"",
        ),
    );
    // SAFETY: tests in this binary use distinct variable names.
    unsafe { std::env::set_var("QUIVER_TEST_OAUTH_SECRET", "s3cret-value") };
    let host = remote_host(
        &registry,
        oauth(&tokens, "QUIVER_TEST_OAUTH_SECRET"),
        loopback_egress(),
    );

    assert_eq!(
        call_text(&host, "secure", "whoami", serde_json::json!({}))
            .await
            .unwrap(),
        "tok-1-"
    );
    call_text(
        &host,
        "secure",
        "echo",
        serde_json::json!({"text": "again"}),
    )
    .await
    .unwrap();
    assert_eq!(tokens.token_request_count(), 1, "the token is cached");
    let request = &tokens.token_requests()[0];
    assert_eq!(request.scope.as_deref(), Some("mcp:tools"));
    assert_eq!(
        request.resource.as_deref(),
        Some(server.url()),
        "the resource parameter names the server"
    );

    tokio::time::sleep(Duration::from_millis(2100)).await;
    call_text(
        &host,
        "secure",
        "echo",
        serde_json::json!({"text": "after expiry"}),
    )
    .await
    .unwrap();
    assert_eq!(
        tokens.token_request_count(),
        2,
        "refreshed before use after expiry"
    );

    tokens.revoke_all();
    assert_eq!(
        call_text(
            &host,
            "secure",
            "echo",
            serde_json::json!({"text": "revoked"})
        )
        .await
        .unwrap(),
        "revoked"
    );
    assert_eq!(
        tokens.token_request_count(),
        3,
        "a 401 triggered one refresh and the call was retried"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn a_bad_client_secret_fails_that_server_clearly_and_never_leaks() {
    let tokens = TokenServer::start("quiver", "right-secret", Duration::from_secs(60)).await;
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    let open = FixtureHttp::spawn("http", &[]);
    let registry = RegistryDir::new();
    registry.write(
        "secure.toml",
        &remote_record(
            "secure",
            "streamable_http",
            server.url(),
            "auth_ref = \"corp\"",
        ),
    );
    registry.write(
        "open.toml",
        &remote_record("open", "streamable_http", open.url(), ""),
    );
    unsafe { std::env::set_var("QUIVER_TEST_WRONG_SECRET", "wrong-secret-xyz") };
    let host = remote_host(
        &registry,
        oauth(&tokens, "QUIVER_TEST_WRONG_SECRET"),
        loopback_egress(),
    );
    let error = call_text(&host, "secure", "echo", serde_json::json!({"text": "x"}))
        .await
        .unwrap_err();
    assert_eq!(error.code, McpErrorCode::Unavailable);
    assert!(
        error.message.contains("`secure`") && error.message.contains("oauth_client_credentials"),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("invalid_client"),
        "{}",
        error.message
    );
    assert!(!error.message.contains("wrong-secret-xyz"));
    assert_eq!(
        call_text(&host, "open", "echo", serde_json::json!({"text": "fine"}))
            .await
            .unwrap(),
        "fine",
        "other servers are unaffected"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn api_keys_go_in_their_header() {
    let server = FixtureHttp::spawn(
        "sse",
        &["--api-key-header", "X-Api-Key", "--api-key", "k-123"],
    );
    let registry = RegistryDir::new();
    registry.write(
        "keyed.toml",
        &remote_record(
            "keyed",
            "http_sse_legacy",
            server.url(),
            "auth_ref = \"key\"",
        ),
    );
    registry.write(
        "nokey.toml",
        &remote_record("nokey", "http_sse_legacy", server.url(), ""),
    );
    unsafe { std::env::set_var("QUIVER_TEST_API_KEY", "k-123") };
    let auth = BTreeMap::from([(
        "key".to_owned(),
        toml::from_str(
            "kind = \"api_key\"\nservers = [\"keyed\"]\nheader = \"X-Api-Key\"\nvalue_env = \"QUIVER_TEST_API_KEY\"\n",
        )
        .unwrap(),
    )]);
    let host = remote_host(&registry, auth, loopback_egress());
    assert_eq!(
        call_text(&host, "keyed", "echo", serde_json::json!({"text": "in"}))
            .await
            .unwrap(),
        "in"
    );
    let error = call_text(&host, "nokey", "echo", serde_json::json!({"text": "x"}))
        .await
        .unwrap_err();
    assert!(error.message.contains("401"), "{}", error.message);
    host.shutdown().await;
}

#[tokio::test]
async fn a_server_down_at_start_is_reached_once_it_is_up() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/mcp");
    let registry = RegistryDir::new();
    registry.write(
        "late.toml",
        &remote_record("late", "streamable_http", &url, ""),
    );
    let host = remote_host(&registry, BTreeMap::new(), loopback_egress());
    let error = call_text(&host, "late", "echo", serde_json::json!({"text": "x"}))
        .await
        .unwrap_err();
    assert_eq!(error.code, McpErrorCode::Unavailable);
    let again = call_text(&host, "late", "echo", serde_json::json!({"text": "x"}))
        .await
        .unwrap_err();
    assert!(
        again.message.contains("next connection attempt in"),
        "backs off: {}",
        again.message
    );

    let _server = FixtureHttp::spawn("http", &["--http", &format!("127.0.0.1:{port}")]);
    let started = Instant::now();
    loop {
        match call_text(&host, "late", "echo", serde_json::json!({"text": "up"})).await {
            Ok(text) => break assert_eq!(text, "up"),
            Err(e) if started.elapsed() < Duration::from_secs(10) => {
                assert_eq!(e.code, McpErrorCode::Unavailable);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("never connected: {e}"),
        }
    }
    host.shutdown().await;
}

#[tokio::test]
async fn a_server_killed_mid_call_yields_an_error_result_not_a_hang() {
    let mut server = FixtureHttp::spawn("http", &[]);
    let registry = RegistryDir::new();
    registry.write(
        "fragile.toml",
        &remote_record("fragile", "streamable_http", server.url(), ""),
    );
    let host = remote_host(&registry, BTreeMap::new(), loopback_egress());
    assert_eq!(
        call_text(
            &host,
            "fragile",
            "echo",
            serde_json::json!({"text": "warm"})
        )
        .await
        .unwrap(),
        "warm"
    );
    let started = Instant::now();
    let (result, ()) = tokio::join!(
        call_text(&host, "fragile", "slow", serde_json::json!({"ms": 3000})),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            server.kill();
        }
    );
    let error = result.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
    host.shutdown().await;
}

#[test]
fn a_missing_header_variable_and_egress_denials_are_reported_plainly() {
    let server = FixtureHttp::spawn("http", &[]);
    let registry = RegistryDir::new();
    registry.write(
        "hdr.toml",
        &remote_record(
            "hdr",
            "streamable_http",
            server.url(),
            "headers = { X-Token = \"${ENV:QUIVER_TEST_HEADER_UNSET}\" }",
        ),
    );
    registry.write(
        "metadata.toml",
        &remote_record(
            "metadata",
            "streamable_http",
            "http://169.254.169.254/mcp",
            "",
        ),
    );
    let by_name = server.url().replace("127.0.0.1", "localhost");
    registry.write(
        "rebind.toml",
        &remote_record("rebind", "streamable_http", &by_name, ""),
    );
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("quiver.toml");
    std::fs::write(&config, "[egress]\nallow = [\"http://*:*\"]\n").unwrap();
    let tools = |server_id: &str| {
        let out = Command::new(quiver_cli())
            .args(["mcp", "tools", server_id, "--registry"])
            .arg(registry.path())
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{server_id}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let hdr = tools("hdr");
    assert!(
        hdr.contains("QUIVER_TEST_HEADER_UNSET") && hdr.contains("http.headers.X-Token"),
        "{hdr}"
    );
    let metadata = tools("metadata");
    assert!(
        metadata.contains("egress policy")
            && metadata.contains("169.254.169.254")
            && metadata.contains("link-local"),
        "{metadata}"
    );
    let rebind = tools("rebind");
    assert!(
        rebind.contains("egress policy refuses localhost") && rebind.contains("loopback"),
        "{rebind}"
    );

    std::fs::write(
        &config,
        "[egress]\nallow = [\"https://*.example.com\"]\nallow_private = [\"127.0.0.0/8\"]\n",
    )
    .unwrap();
    let rule = tools("metadata");
    assert!(rule.contains("not in the egress allowlist"), "{rule}");

    std::fs::write(&config, "[egress]\nallow_private = [\"127.0.0.0/8\"]\n").unwrap();
    let out = Command::new(quiver_cli())
        .args([
            "mcp",
            "call",
            "rebind",
            "echo",
            "--args",
            r#"{"text":"allowed"}"#,
            "--registry",
        ])
        .arg(registry.path())
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("\"allowed\""),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn every_lifecycle_mode_reaches_a_2026_07_28_capable_server() {
    let server = FixtureHttp::spawn("http", &[]);
    let registry = RegistryDir::new();
    for mode in ["initialize", "discover", "auto"] {
        let record = remote_record(mode, "streamable_http", server.url(), "").replace(
            "allowed_tools",
            &format!("lifecycle = {mode:?}\nallowed_tools"),
        );
        registry.write(&format!("{mode}.toml"), &record);
    }
    let host = remote_host(&registry, BTreeMap::new(), loopback_egress());
    for mode in ["initialize", "discover", "auto"] {
        assert_eq!(
            call_text(&host, mode, "echo", serde_json::json!({"text": mode}))
                .await
                .unwrap(),
            mode
        );
    }
    host.shutdown().await;
}

/// A background server that counts every request it gets, whatever the path.
struct Counting {
    addr: std::net::SocketAddr,
    hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    _server: quiver_tests::serve::BackgroundServer,
}

impl Counting {
    fn start() -> Self {
        let bound = quiver_tests::serve::Bound::new("counting server");
        let addr = bound.addr;
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        let router = axum::Router::new().fallback(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { "ok" }
        });
        Self {
            addr,
            hits,
            _server: bound.serve("counting-server", router),
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Serves `router` on loopback in the background; returns `http://127.0.0.1:PORT`.
fn serve(
    what: &str,
    router: impl FnOnce(String) -> axum::Router,
) -> (String, quiver_tests::serve::BackgroundServer) {
    let bound = quiver_tests::serve::Bound::new(what);
    let base = format!("http://{}", bound.addr);
    let server = bound.serve(what, router(base.clone()));
    (base, server)
}

fn egress_allowing(origins: &[&str]) -> EgressConfig {
    EgressConfig {
        allow: origins.iter().map(|o| o.to_string()).collect(),
        allow_private: vec!["127.0.0.0/8".into()],
        proxy: None,
    }
}

#[tokio::test]
async fn a_legacy_sse_endpoint_outside_the_egress_rules_is_refused() {
    // A hostile legacy server: its event stream announces an endpoint on another host.
    let elsewhere = Counting::start();
    let endpoint = format!(
        "http://{}/messages?sessionId=s3cret-session",
        elsewhere.addr
    );
    let (base, _hostile) = serve("hostile-sse", move |_| {
        axum::Router::new().route(
            "/sse",
            axum::routing::get(move || {
                let event = format!("event: endpoint\ndata: {endpoint}\n\n");
                async move {
                    let stream = futures::stream::once(async move {
                        Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(event))
                    })
                    .chain(futures::stream::pending());
                    axum::response::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(axum::body::Body::from_stream(stream))
                        .unwrap()
                }
            }),
        )
    });
    let registry = RegistryDir::new();
    registry.write(
        "old.toml",
        &remote_record("old", "http_sse_legacy", &format!("{base}/sse"), ""),
    );
    let host = remote_host(&registry, BTreeMap::new(), egress_allowing(&[&base]));
    let Err(PreviewError::Unavailable(error)) = host.server_tools("old").await else {
        panic!("the listing went through");
    };
    assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
    let message = &error.message;
    assert!(
        message.contains("egress policy")
            && message.contains(&elsewhere.addr.to_string())
            && message.contains("[egress] allow"),
        "{message}"
    );
    assert!(!message.contains("s3cret-session"), "{message}");
    assert_eq!(elsewhere.hits(), 0, "the announced endpoint got nothing");
    host.shutdown().await;
}

#[tokio::test]
async fn a_token_endpoint_from_metadata_outside_the_egress_rules_never_gets_the_secret() {
    let tokens = TokenServer::start("quiver", "metadata-s3cret", Duration::from_secs(60)).await;
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    // An authorization server whose metadata sends the token request to another host.
    let token_endpoint = tokens.token_url();
    let (issuer, _metadata) = serve("as-metadata", move |issuer| {
        let body = serde_json::json!({"issuer": issuer, "token_endpoint": token_endpoint});
        axum::Router::new().route(
            "/.well-known/oauth-authorization-server",
            axum::routing::get(move || async move { axum::Json(body) }),
        )
    });
    let registry = RegistryDir::new();
    registry.write(
        "secure.toml",
        &remote_record(
            "secure",
            "streamable_http",
            server.url(),
            "auth_ref = \"corp\"",
        ),
    );
    // SAFETY: tests in this binary use distinct variable names.
    unsafe { std::env::set_var("QUIVER_TEST_METADATA_SECRET", "metadata-s3cret") };
    let auth = || {
        let text = format!(
            "kind = \"oauth_client_credentials\"\nservers = [\"secure\"]\nclient_id = \"quiver\"\nclient_secret_env = \"QUIVER_TEST_METADATA_SECRET\"\nissuer = {issuer:?}\n"
        );
        BTreeMap::from([("corp".to_owned(), toml::from_str(&text).unwrap())])
    };

    let host = remote_host(
        &registry,
        auth(),
        egress_allowing(&[server.base(), &issuer]),
    );
    let error = call_text(&host, "secure", "echo", serde_json::json!({"text": "x"}))
        .await
        .unwrap_err();
    assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
    let message = &error.message;
    assert!(
        message.contains("token endpoint")
            && message.contains("egress policy")
            && message.contains(&tokens.addr().to_string()),
        "{message}"
    );
    assert!(!message.contains("metadata-s3cret"), "{message}");
    assert_eq!(tokens.token_request_count(), 0, "the secret was never sent");
    host.shutdown().await;

    // The same setup with the token endpoint allowed works: the refusal was the rule.
    let host = remote_host(
        &registry,
        auth(),
        egress_allowing(&[server.base(), &issuer, &tokens.issuer()]),
    );
    assert_eq!(
        call_text(&host, "secure", "echo", serde_json::json!({"text": "x"}))
            .await
            .unwrap(),
        "x"
    );
    assert_eq!(tokens.token_request_count(), 1);
    host.shutdown().await;
}

// ---- MCP authorization by the spec: discovery, client authentication, step-up ----

/// An `[auth.corp]` table from TOML lines.
fn auth_table(lines: &str) -> BTreeMap<String, AuthConfig> {
    let text = format!(
        "kind = \"oauth_client_credentials\"\nservers = [\"secure\"]\nclient_id = \"quiver\"\n{lines}"
    );
    BTreeMap::from([("corp".to_owned(), toml::from_str(&text).unwrap())])
}

fn secure_registry(url: &str) -> RegistryDir {
    let registry = RegistryDir::new();
    registry.write(
        "secure.toml",
        &remote_record("secure", "streamable_http", url, "auth_ref = \"corp\""),
    );
    registry
}

#[tokio::test]
async fn a_plain_http_token_endpoint_for_an_https_server_never_gets_the_secret() {
    let tokens = TokenServer::start("quiver", "clear-s3cret", Duration::from_secs(60)).await;
    // SAFETY: tests in this binary use distinct variable names.
    unsafe { std::env::set_var("QUIVER_TEST_CLEAR_SECRET", "clear-s3cret") };
    let auth = || {
        auth_table(&format!(
            "client_secret_env = \"QUIVER_TEST_CLEAR_SECRET\"\ntoken_url = {:?}\n",
            tokens.token_url()
        ))
    };
    // The default egress rules allow plain http anywhere; the https server is what counts.
    let https_url = "https://127.0.0.1:9/mcp";
    let host = remote_host(&secure_registry(https_url), auth(), loopback_egress());
    let error = call_text(&host, "secure", "echo", serde_json::json!({"text": "x"}))
        .await
        .unwrap_err();
    assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
    let message = &error.message;
    assert!(
        message.contains(&format!(
            "token endpoint {} is plain http while {https_url} is https",
            tokens.token_url()
        )) && message.contains("use an https token endpoint"),
        "{message}"
    );
    assert!(!message.contains("clear-s3cret"), "{message}");
    assert_eq!(tokens.token_request_count(), 0, "the secret was never sent");
    host.shutdown().await;

    // The same token endpoint for a plain-http server is used: the https server decided.
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    let host = remote_host(&secure_registry(server.url()), auth(), loopback_egress());
    assert_eq!(
        call_text(&host, "secure", "echo", serde_json::json!({"text": "x"}))
            .await
            .unwrap(),
        "x"
    );
    assert_eq!(tokens.token_request_count(), 1);
    host.shutdown().await;
}

#[tokio::test]
async fn a_configured_issuer_is_the_authorization_server_even_if_it_publishes_resource_metadata() {
    let tokens = TokenServer::start("quiver", "issuer-s3cret", Duration::from_secs(60)).await;
    // Would issue tokens too, to the same client: only its request count tells.
    let rogue = TokenServer::start("quiver", "issuer-s3cret", Duration::from_secs(60)).await;
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    let prm_hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = prm_hits.clone();
    let (rogue_issuer, token_url) = (rogue.issuer(), tokens.token_url());
    // The configured issuer: its own metadata names the real token endpoint, but it also
    // publishes protected-resource metadata for itself naming another authorization server.
    let (issuer, _issuer_server) = serve("issuer-with-prm", move |base| {
        let prm = serde_json::json!({"resource": base, "authorization_servers": [rogue_issuer]});
        let metadata = serde_json::json!({"issuer": base, "token_endpoint": token_url});
        axum::Router::new()
            .route(
                "/.well-known/oauth-protected-resource",
                axum::routing::get(move || {
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async move { axum::Json(prm) }
                }),
            )
            .route(
                "/.well-known/oauth-authorization-server",
                axum::routing::get(move || async move { axum::Json(metadata) }),
            )
    });
    // SAFETY: tests in this binary use distinct variable names.
    unsafe { std::env::set_var("QUIVER_TEST_ISSUER_SECRET", "issuer-s3cret") };
    let host = remote_host(
        &secure_registry(server.url()),
        auth_table(&format!(
            "client_secret_env = \"QUIVER_TEST_ISSUER_SECRET\"\nissuer = {issuer:?}\n"
        )),
        loopback_egress(),
    );
    assert_eq!(
        call_text(&host, "secure", "echo", serde_json::json!({"text": "own"}))
            .await
            .unwrap(),
        "own"
    );
    assert_eq!(tokens.token_request_count(), 1);
    assert_eq!(
        rogue.token_request_count(),
        0,
        "the other server got nothing"
    );
    assert_eq!(
        prm_hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no protected-resource metadata was read at the issuer"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn metadata_naming_another_issuer_than_the_configured_one_is_refused() {
    // The configured issuer has a path; only the origin's RFC 8414 document exists (rmcp's
    // last candidate), naming the origin as its issuer.
    let tokens = TokenServer::start("quiver", "tenant-s3cret", Duration::from_secs(60)).await;
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    let configured = format!("{}/tenant1", tokens.issuer());
    unsafe { std::env::set_var("QUIVER_TEST_TENANT_SECRET", "tenant-s3cret") };
    let host = remote_host(
        &secure_registry(server.url()),
        auth_table(&format!(
            "client_secret_env = \"QUIVER_TEST_TENANT_SECRET\"\nissuer = {configured:?}\n"
        )),
        loopback_egress(),
    );
    let error = call_text(&host, "secure", "echo", serde_json::json!({"text": "x"}))
        .await
        .unwrap_err();
    assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
    let message = &error.message;
    assert!(
        message.contains(&format!(
            "the metadata found for issuer {configured} names issuer {}",
            tokens.issuer()
        )) && message.contains("set issuer to exactly"),
        "{message}"
    );
    assert_eq!(tokens.token_request_count(), 0, "no credential was sent");
    host.shutdown().await;
}

#[tokio::test]
async fn metadata_named_by_the_401_challenge_and_only_at_the_path_based_uri_is_found() {
    let tokens = TokenServer::start("quiver", "challenge-s3cret", Duration::from_secs(60)).await;
    let server = FixtureHttp::spawn(
        "http",
        &[
            "--bearer-introspect",
            &tokens.introspect_url(),
            "--protected-resource",
            &tokens.issuer(),
            "--challenge-resource-metadata",
            "--require-scope",
            "mcp:tools",
        ],
    );
    let registry = secure_registry(server.url());
    // SAFETY: tests in this binary use distinct variable names.
    unsafe { std::env::set_var("QUIVER_TEST_CHALLENGE_SECRET", "challenge-s3cret") };
    let host = remote_host(
        &registry,
        auth_table(&format!(
            "client_secret_env = \"QUIVER_TEST_CHALLENGE_SECRET\"\norigins = [{:?}, {:?}]\n",
            server.base(),
            tokens.issuer()
        )),
        loopback_egress(),
    );
    assert_eq!(
        call_text(
            &host,
            "secure",
            "echo",
            serde_json::json!({"text": "found"})
        )
        .await
        .unwrap(),
        "found"
    );
    let requests = tokens.token_requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].auth_method, "client_secret_basic");
    assert_eq!(requests[0].resource.as_deref(), Some(server.url()));
    assert_eq!(
        requests[0].scope.as_deref(),
        Some("mcp:tools"),
        "the scope the 401 challenge named"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn metadata_only_at_the_path_based_uri_without_a_challenge_url_and_openid_only_as() {
    let tokens = TokenServer::start_with(
        "quiver",
        "openid-s3cret",
        Duration::from_secs(60),
        AsOptions {
            openid_only: true,
            ..AsOptions::default()
        },
    );
    let server = FixtureHttp::spawn(
        "http",
        &[
            "--bearer-introspect",
            &tokens.introspect_url(),
            "--protected-resource",
            &tokens.issuer(),
        ],
    );
    let registry = secure_registry(server.url());
    unsafe { std::env::set_var("QUIVER_TEST_OPENID_SECRET", "openid-s3cret") };
    let host = remote_host(
        &registry,
        auth_table(&format!(
            "client_secret_env = \"QUIVER_TEST_OPENID_SECRET\"\nscopes = [\"mcp:tools\"]\norigins = [{:?}, {:?}]\n",
            server.base(),
            tokens.issuer()
        )),
        loopback_egress(),
    );
    assert_eq!(
        call_text(&host, "secure", "echo", serde_json::json!({"text": "oidc"}))
            .await
            .unwrap(),
        "oidc"
    );
    let requests = tokens.token_requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].scope.as_deref(), Some("mcp:tools"));
    host.shutdown().await;
}

#[tokio::test]
async fn a_server_accepting_only_client_secret_post_gets_the_secret_in_the_form() {
    let tokens = TokenServer::start_with(
        "quiver",
        "post-s3cret",
        Duration::from_secs(60),
        AsOptions {
            auth_methods: vec!["client_secret_post".into()],
            ..AsOptions::default()
        },
    );
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    let registry = secure_registry(server.url());
    unsafe { std::env::set_var("QUIVER_TEST_POST_SECRET", "post-s3cret") };
    let host = remote_host(
        &registry,
        auth_table(&format!(
            "client_secret_env = \"QUIVER_TEST_POST_SECRET\"\nissuer = {:?}\n",
            tokens.issuer()
        )),
        loopback_egress(),
    );
    assert_eq!(
        call_text(&host, "secure", "echo", serde_json::json!({"text": "post"}))
            .await
            .unwrap(),
        "post"
    );
    let requests = tokens.token_requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].auth_method, "client_secret_post");
    host.shutdown().await;
}

/// A new EC P-256 key: (PKCS#8 PEM, public key as an uncompressed point).
fn p256_key() -> (String, Vec<u8>) {
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let public = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
        .unwrap()
        .public_key()
        .as_ref()
        .to_vec();
    let body = base64_standard(pkcs8.as_ref());
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        lines.join("\n")
    );
    (pem, public)
}

fn base64_standard(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test]
async fn private_key_jwt_authenticates_with_a_signed_assertion_and_a_bad_key_file_fails_the_host() {
    let (pem, public) = p256_key();
    let tokens = TokenServer::start_with(
        "quiver",
        "unused-secret",
        Duration::from_secs(60),
        AsOptions {
            auth_methods: vec!["private_key_jwt".into()],
            jwt_public_key: Some(public),
            ..AsOptions::default()
        },
    );
    let server = FixtureHttp::spawn(
        "http",
        &[
            "--bearer-introspect",
            &tokens.introspect_url(),
            "--protected-resource",
            &tokens.issuer(),
            "--challenge-resource-metadata",
        ],
    );
    let registry = secure_registry(server.url());
    let keys = tempfile::tempdir().unwrap();
    std::fs::write(keys.path().join("client.pem"), &pem).unwrap();
    let config = |file: &str| HostConfig {
        auth: auth_table(&format!(
            "private_key_file = {file:?}\norigins = [{:?}, {:?}]\n",
            server.base(),
            tokens.issuer()
        )),
        egress: loopback_egress(),
        ..HostConfig::default()
    };
    // Relative to the config's directory.
    let host = host_builder(&registry)
        .with_config(config("client.pem"), keys.path())
        .build()
        .unwrap();
    assert_eq!(
        call_text(
            &host,
            "secure",
            "echo",
            serde_json::json!({"text": "signed"})
        )
        .await
        .unwrap(),
        "signed"
    );
    let requests = tokens.token_requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].auth_method, "private_key_jwt");
    assert_eq!(requests[0].client_id.as_deref(), Some("quiver"));
    assert!(requests[0].issued.is_some(), "the assertion verified");
    host.shutdown().await;

    // A key file that is not a PKCS#8 key fails the host at build time, naming the
    // field, the file and the fix, and showing none of the file.
    std::fs::write(
        keys.path().join("bad.pem"),
        pem.replace("PRIVATE KEY", "EC PRIVATE KEY"),
    )
    .unwrap();
    let error = host_builder(&registry)
        .with_config(config("bad.pem"), keys.path())
        .build()
        .err()
        .expect("a bad key file is refused")
        .to_string();
    assert!(
        error.contains("auth.corp.private_key_file")
            && error.contains("bad.pem")
            && error.contains("openssl pkcs8"),
        "{error}"
    );
    let secret_line = pem.lines().nth(1).unwrap();
    assert!(!error.contains(secret_line), "{error}");
    let missing = host_builder(&registry)
        .with_config(config("missing.pem"), keys.path())
        .build()
        .err()
        .expect("a missing key file is refused")
        .to_string();
    assert!(
        missing.contains("cannot read") && missing.contains("missing.pem"),
        "{missing}"
    );
}

#[tokio::test]
async fn a_403_insufficient_scope_gets_a_token_for_the_union_only_within_step_up_scopes() {
    let tokens = TokenServer::start("quiver", "scope-s3cret", Duration::from_secs(60)).await;
    let server = FixtureHttp::spawn(
        "http",
        &[
            "--bearer-introspect",
            &tokens.introspect_url(),
            "--require-scope",
            "mcp:write",
        ],
    );
    let registry = secure_registry(server.url());
    unsafe { std::env::set_var("QUIVER_TEST_SCOPE_SECRET", "scope-s3cret") };
    let auth = |step_up: &str| {
        auth_table(&format!(
            "client_secret_env = \"QUIVER_TEST_SCOPE_SECRET\"\nissuer = {:?}\nscopes = [\"mcp:tools\"]\n{step_up}",
            tokens.issuer()
        ))
    };

    // Configured scopes are the most the host asks for unless step_up_scopes lists more.
    let host = remote_host(&registry, auth(""), loopback_egress());
    let error = call_text(&host, "secure", "echo", serde_json::json!({"text": "more"}))
        .await
        .unwrap_err();
    assert!(
        error
            .message
            .contains("asks for scopes [\"mcp:write\"] beyond the configured ones")
            && error.message.contains("step_up_scopes"),
        "{error}"
    );
    let scopes: Vec<Option<String>> = tokens
        .token_requests()
        .into_iter()
        .map(|r| r.scope)
        .collect();
    assert_eq!(
        scopes,
        [Some("mcp:tools".to_owned())],
        "no wider token asked"
    );
    host.shutdown().await;

    let host = remote_host(
        &registry,
        auth("step_up_scopes = [\"mcp:write\"]\n"),
        loopback_egress(),
    );
    assert_eq!(
        call_text(&host, "secure", "echo", serde_json::json!({"text": "more"}))
            .await
            .unwrap(),
        "more"
    );
    let scopes: Vec<Option<String>> = tokens
        .token_requests()
        .into_iter()
        .map(|r| r.scope)
        .collect();
    assert_eq!(
        scopes[1..],
        [
            Some("mcp:tools".to_owned()),
            Some("mcp:tools mcp:write".to_owned())
        ]
    );
    // The stepped-up token is kept: the next call needs no new one.
    call_text(
        &host,
        "secure",
        "echo",
        serde_json::json!({"text": "again"}),
    )
    .await
    .unwrap();
    assert_eq!(tokens.token_request_count(), 3);
    host.shutdown().await;
}

#[tokio::test]
async fn a_challenge_naming_metadata_outside_the_egress_rules_is_refused_unasked() {
    let elsewhere = Counting::start();
    let metadata_url = format!(
        "http://{}/.well-known/oauth-protected-resource",
        elsewhere.addr
    );
    let (base, _server) = serve("challenging-mcp", move |_| {
        axum::Router::new().fallback(move || {
            let challenge = format!("Bearer resource_metadata=\"{metadata_url}\"");
            async move {
                axum::response::Response::builder()
                    .status(401)
                    .header("www-authenticate", challenge)
                    .body(axum::body::Body::empty())
                    .unwrap()
            }
        })
    });
    let registry = secure_registry(&format!("{base}/mcp"));
    unsafe { std::env::set_var("QUIVER_TEST_UNASKED_SECRET", "unasked-s3cret") };
    let host = remote_host(
        &registry,
        auth_table("client_secret_env = \"QUIVER_TEST_UNASKED_SECRET\"\n"),
        egress_allowing(&[&base]),
    );
    let error = call_text(&host, "secure", "echo", serde_json::json!({"text": "x"}))
        .await
        .unwrap_err();
    assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
    let message = &error.message;
    assert!(
        message.contains("metadata discovery")
            && message.contains("egress policy")
            && message.contains(&elsewhere.addr.to_string()),
        "{message}"
    );
    assert!(!message.contains("unasked-s3cret"), "{message}");
    assert_eq!(elsewhere.hits(), 0, "the metadata host got nothing");
    host.shutdown().await;
}

#[tokio::test]
async fn hostile_authorization_server_metadata_fails_clearly_and_bounded() {
    let tokens = TokenServer::start("quiver", "hostile-s3cret", Duration::from_secs(60)).await;
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    let token_url = tokens.token_url();
    let (issuer, _hostile) = serve("hostile-as", move |base| {
        let huge = format!("{{\"pad\":\"{}\"}}", "x".repeat(3 * 1024 * 1024));
        let wrong = serde_json::json!({
            "issuer": "http://evil.example",
            "token_endpoint": token_url,
        });
        let _ = base;
        axum::Router::new()
            .route(
                "/.well-known/oauth-authorization-server/huge",
                axum::routing::get(move || async move { huge }),
            )
            .route(
                "/.well-known/oauth-authorization-server/wrong",
                axum::routing::get(move || async move { axum::Json(wrong) }),
            )
    });
    let registry = secure_registry(server.url());
    unsafe { std::env::set_var("QUIVER_TEST_HOSTILE_SECRET", "hostile-s3cret") };
    for (path, expected) in [
        ("huge", "larger than 1048576 bytes"),
        ("wrong", "issuer mismatch"),
    ] {
        let host = remote_host(
            &registry,
            auth_table(&format!(
                "client_secret_env = \"QUIVER_TEST_HOSTILE_SECRET\"\nissuer = \"{issuer}/{path}\"\n"
            )),
            loopback_egress(),
        );
        let started = Instant::now();
        let error = call_text(&host, "secure", "echo", serde_json::json!({"text": "x"}))
            .await
            .unwrap_err();
        assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
        assert!(
            error.message.contains("metadata discovery") && error.message.contains(expected),
            "{path}: {}",
            error.message
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{path}: bounded"
        );
        host.shutdown().await;
    }
    assert_eq!(tokens.token_request_count(), 0, "no credential was sent");
}

// ---- Credentials bound to where they may go ----

/// A plain TCP listener that keeps every byte sent to it and answers each connection with
/// a 500: whatever a host sends it (headers included) can be read back.
fn recording_listener() -> (String, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = seen.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let mut buf = [0u8; 8192];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                keep.lock().unwrap().extend_from_slice(&buf[..n]);
                if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let _ = stream.write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (base, seen)
}

#[tokio::test]
async fn an_api_key_never_reaches_a_server_or_url_outside_its_binding() {
    const KEY: &str = "bound-api-key-value";
    let (base, seen) = recording_listener();
    let url = format!("{base}/mcp");
    let registry = RegistryDir::new();
    // The operator bound `prod` to server `github` at the fixture's origin; `evil` names it
    // from another id, `github2` from the right id's sibling at a URL of its own.
    let server = FixtureHttp::spawn("http", &[]);
    registry.write(
        "github.toml",
        &remote_record(
            "github",
            "streamable_http",
            server.url(),
            "auth_ref = \"prod\"",
        ),
    );
    registry.write(
        "evil.toml",
        &remote_record("evil", "streamable_http", &url, "auth_ref = \"prod\""),
    );
    // SAFETY: tests in this binary use distinct variable names.
    unsafe { std::env::set_var("QUIVER_TEST_BOUND_KEY", KEY) };
    let auth = |origins: &str| {
        let text = format!(
            "kind = \"api_key\"\nheader = \"X-Api-Key\"\nvalue_env = \"QUIVER_TEST_BOUND_KEY\"\nservers = [\"github\"]\n{origins}"
        );
        BTreeMap::from([("prod".to_owned(), toml::from_str(&text).unwrap())])
    };
    let host = remote_host(&registry, auth(""), loopback_egress());
    let problems: Vec<String> = host
        .registry()
        .problems()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        problems.iter().any(|p| p.contains("evil.toml")
            && p.contains("http.auth_ref")
            && p.contains("[auth.prod] servers")),
        "{problems:?}"
    );
    assert!(host.registry().get("evil").is_none(), "left out");
    // The bound server gets its key: the binding, not a broken key, refused `evil`.
    assert_eq!(
        call_text(&host, "github", "echo", serde_json::json!({"text": "in"}))
            .await
            .unwrap(),
        "in"
    );
    host.shutdown().await;

    // The right id at another URL: `origins` keeps the key at the operator's origin.
    registry.write(
        "github.toml",
        &remote_record("github", "streamable_http", &url, "auth_ref = \"prod\""),
    );
    std::fs::remove_file(registry.path().join("evil.toml")).unwrap();
    let bound = format!("origins = [{:?}]\n", server.base());
    let host = remote_host(&registry, auth(&bound), loopback_egress());
    assert!(host.registry().get("github").is_none(), "left out");
    host.shutdown().await;

    // A registry built in code skips the load's check; the connector refuses before it
    // reads the key.
    let loaded = quiver::registry::Registry::load_dir(registry.path()).unwrap();
    let host = quiver_tests::host_builder(&registry)
        .with_registry(loaded)
        .with_config(
            HostConfig {
                auth: auth(&bound),
                egress: loopback_egress(),
                ..HostConfig::default()
            },
            ".",
        )
        .build()
        .unwrap();
    let error = call_text(&host, "github", "echo", serde_json::json!({"text": "x"}))
        .await
        .unwrap_err();
    assert!(
        error.message.contains("[auth.prod] origins") && !error.message.contains(KEY),
        "{error}"
    );
    host.shutdown().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    assert!(
        !seen.contains(KEY),
        "the key reached an unbound URL:\n{seen}"
    );
}

#[tokio::test]
async fn an_oauth_secret_never_reaches_a_discovered_token_endpoint_outside_the_binding() {
    let tokens = TokenServer::start("quiver", "bound-s3cret", Duration::from_secs(60)).await;
    let server = FixtureHttp::spawn(
        "http",
        &[
            "--bearer-introspect",
            &tokens.introspect_url(),
            "--protected-resource",
            &tokens.issuer(),
        ],
    );
    let registry = secure_registry(server.url());
    // SAFETY: tests in this binary use distinct variable names.
    unsafe { std::env::set_var("QUIVER_TEST_BOUND_SECRET", "bound-s3cret") };
    // Bound to the server only: its metadata may not pick where the secret goes.
    let host = remote_host(
        &registry,
        auth_table("client_secret_env = \"QUIVER_TEST_BOUND_SECRET\"\nscopes = [\"mcp:tools\"]\n"),
        loopback_egress(),
    );
    let error = call_text(&host, "secure", "echo", serde_json::json!({"text": "x"}))
        .await
        .unwrap_err();
    assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
    assert!(
        error.message.contains(&tokens.token_url())
            && error.message.contains("[auth.corp] origins")
            && !error.message.contains("bound-s3cret"),
        "{error}"
    );
    assert_eq!(tokens.token_request_count(), 0, "the secret was never sent");
    host.shutdown().await;

    // The authorization server's origin listed: the same discovery gets a token.
    let host = remote_host(
        &registry,
        auth_table(&format!(
            "client_secret_env = \"QUIVER_TEST_BOUND_SECRET\"\nscopes = [\"mcp:tools\"]\norigins = [{:?}, {:?}]\n",
            server.base(),
            tokens.issuer()
        )),
        loopback_egress(),
    );
    assert_eq!(
        call_text(&host, "secure", "echo", serde_json::json!({"text": "ok"}))
            .await
            .unwrap(),
        "ok"
    );
    assert_eq!(tokens.token_request_count(), 1);
    host.shutdown().await;
}
