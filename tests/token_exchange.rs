//! Token exchange (RFC 8693, `kind = "oauth_token_exchange"`): a task's subject token is
//! exchanged at a real authorization server for a token the real fixture server checks by
//! introspection; tasks with different subject tokens get different tokens; a task without
//! one, and hostile token answers, fail clearly and leak nothing.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use quiver::{AuthConfig, EgressConfig, Host, HostConfig, McpErrorCode, SubjectToken};
use quiver::{TaskSpec, ToolCallError, ToolCallRequest};
use quiver_tests::oauth::{AsOptions, TokenServer};
use quiver_tests::{FixtureHttp, RegistryDir, host_builder, library_task, quiver_cli};

const SECRET: &str = "xchg-s3cret";
const ALICE: &str = "eyJhbGice.subject-token-of-alice.sig";
const BOB: &str = "eyJbob.subject-token-of-bob.sig";

fn registry(url: &str) -> RegistryDir {
    let registry = RegistryDir::new();
    registry.write(
        "secure.toml",
        &format!(
            "server_id = \"secure\"\ntransport = \"streamable_http\"\nallowed_tools = [\"*\"]\n[http]\nurl = {url:?}\nauth_ref = \"xchg\"\n[budgets]\ntool_timeout_ms = 5000\n"
        ),
    );
    registry
}

fn exchange_table(lines: &str) -> String {
    format!(
        "kind = \"oauth_token_exchange\"\nservers = [\"secure\"]\nclient_id = \"quiver\"\n{lines}"
    )
}

fn host(registry: &RegistryDir, table: &str) -> Host {
    quiver_tests::init_logging();
    let auth: BTreeMap<String, AuthConfig> =
        BTreeMap::from([("xchg".to_owned(), toml::from_str(table).unwrap())]);
    let config = HostConfig {
        auth,
        egress: EgressConfig {
            allow_private: vec!["127.0.0.0/8".into()],
            ..EgressConfig::default()
        },
        ..HostConfig::default()
    };
    host_builder(registry)
        .with_config(config, ".")
        .with_connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn task(subject: Option<&str>) -> TaskSpec {
    let mut task = library_task("secure");
    task.subject_token = subject.map(|s| SubjectToken::new(s).unwrap());
    task
}

async fn whoami(host: &Host, task: &TaskSpec) -> Result<String, quiver::McpError> {
    let request = ToolCallRequest::new("secure", "whoami");
    match host.call_tool(task, request).await {
        Ok(out) => Ok(out.result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default()),
        Err(ToolCallError::Failed(error) | ToolCallError::Timeout(error)) => Err(error),
        Err(refused) => panic!("not called: {refused}"),
    }
}

fn shows_no_secret(text: &str) {
    for secret in [SECRET, ALICE, BOB, "subject-token-of"] {
        assert!(!text.contains(secret), "{secret} shown in: {text}");
    }
}

#[tokio::test]
async fn tasks_with_different_subject_tokens_get_their_own_exchanged_tokens() {
    let tokens = TokenServer::start("quiver", SECRET, Duration::from_secs(3600)).await;
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    // SAFETY: tests in this binary use distinct variable names.
    unsafe { std::env::set_var("QUIVER_TEST_XCHG_SECRET", SECRET) };
    let registry = registry(server.url());
    let host = host(
        &registry,
        &exchange_table(&format!(
            "client_secret_env = \"QUIVER_TEST_XCHG_SECRET\"\nissuer = {:?}\naudience = \"mcp-secure\"\nsubject_token_type = \"id_token\"\n",
            tokens.issuer()
        )),
    );

    assert_eq!(whoami(&host, &task(Some(ALICE))).await.unwrap(), "tok-1-");
    assert_eq!(
        whoami(&host, &task(Some(ALICE))).await.unwrap(),
        "tok-1-",
        "the same subject token reuses its exchanged token"
    );
    assert_eq!(tokens.token_request_count(), 1);
    assert_eq!(
        whoami(&host, &task(Some(BOB))).await.unwrap(),
        "tok-2-",
        "another subject token is exchanged for its own token"
    );
    let requests = tokens.token_requests();
    assert_eq!(requests.len(), 2);
    for (request, subject) in requests.iter().zip([ALICE, BOB]) {
        assert_eq!(
            request.grant_type,
            "urn:ietf:params:oauth:grant-type:token-exchange"
        );
        assert_eq!(request.subject_token.as_deref(), Some(subject));
        assert_eq!(request.audience.as_deref(), Some("mcp-secure"));
        assert_eq!(request.resource.as_deref(), Some(server.url()));
        assert_eq!(request.auth_method, "client_secret_basic");
        assert!(request.issued.is_some());
    }

    // No subject token: no exchange, and the error says what is missing and for whom.
    let error = whoami(&host, &task(None)).await.unwrap_err();
    assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
    assert!(
        error.message.contains("server `secure`")
            && error.message.contains("oauth_token_exchange auth `xchg`")
            && error.message.contains("subject token")
            && error.message.contains("--subject-token-env"),
        "{}",
        error.message
    );
    shows_no_secret(&error.message);
    assert_eq!(tokens.token_request_count(), 2);
    host.shutdown().await;
}

/// A token endpoint answering with `body` (status 200) to every request.
fn answering(body: String) -> (String, quiver_tests::serve::BackgroundServer) {
    let bound = quiver_tests::serve::Bound::new("hostile token endpoint");
    let base = format!("http://{}", bound.addr);
    let router = axum::Router::new().route(
        "/token",
        axum::routing::post(move || async move {
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                body,
            )
        }),
    );
    let server = bound.serve("hostile token endpoint", router);
    (format!("{base}/token"), server)
}

#[tokio::test]
async fn hostile_token_answers_and_a_token_endpoint_in_clear_are_refused() {
    let tokens = TokenServer::start("quiver", SECRET, Duration::from_secs(3600)).await;
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    let registry = registry(server.url());
    let huge = format!(
        "{{\"access_token\":\"tok-h\",\"pad\":\"{}\"}}",
        "x".repeat(2 * 1024 * 1024)
    );
    let wrong_type = serde_json::json!({
        "access_token": "tok-w", "token_type": "Bearer",
        "issued_token_type": "urn:ietf:params:oauth:token-type:refresh_token\u{1b}[31m",
    })
    .to_string();
    let untyped = serde_json::json!({"access_token": "tok-u", "token_type": "Bearer"}).to_string();
    let dpop = serde_json::json!({
        "access_token": "tok-d", "token_type": "DPoP",
        "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
    })
    .to_string();
    for (body, expected) in [
        (huge, "larger than 1048576 bytes"),
        (
            wrong_type,
            "issued a token of type urn:ietf:params:oauth:token-type:refresh_token[31m, not the urn:ietf:params:oauth:token-type:access_token asked for",
        ),
        (untyped, "issued a token of type none"),
        (dpop, "token_type DPoP, not Bearer"),
    ] {
        let (token_url, _endpoint) = answering(body);
        let host = host(
            &registry,
            &exchange_table(&format!("token_url = {token_url:?}\n")),
        );
        let error = whoami(&host, &task(Some(ALICE))).await.unwrap_err();
        assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
        assert!(error.message.contains(expected), "{}", error.message);
        assert!(!error.message.contains('\u{1b}'), "{}", error.message);
        shows_no_secret(&error.message);
        host.shutdown().await;
    }

    // A plain-http token endpoint for an https server never gets the subject token.
    let host = host(
        &registry_https(),
        &exchange_table(&format!("token_url = {:?}\n", tokens.token_url())),
    );
    let error = whoami(&host, &task(Some(ALICE))).await.unwrap_err();
    assert!(
        error
            .message
            .contains("is plain http while https://127.0.0.1:9/mcp is https"),
        "{}",
        error.message
    );
    shows_no_secret(&error.message);
    assert_eq!(tokens.token_request_count(), 0, "nothing was sent");
    host.shutdown().await;
}

fn registry_https() -> RegistryDir {
    registry("https://127.0.0.1:9/mcp")
}

#[test]
fn exchange_tables_name_the_field_and_the_fix() {
    let load = |table: &str| {
        let config: AuthConfig = toml::from_str(&exchange_table(table)).unwrap();
        let host = HostConfig {
            auth: BTreeMap::from([("xchg".to_owned(), config)]),
            ..HostConfig::default()
        };
        host_builder(&RegistryDir::new())
            .with_config(host, ".")
            .build()
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(load(""), None, "a public client needs nothing more");
    let both = load("token_endpoint_auth = \"none\"\nclient_secret_env = \"S\"\n").unwrap();
    assert!(
        both.contains("auth.xchg.token_endpoint_auth") && both.contains("drop client_secret_env"),
        "{both}"
    );
    let unknown = toml::from_str::<AuthConfig>(&exchange_table("subject_token_type = \"saml\"\n"))
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("unknown variant `saml`"), "{unknown}");
    let cc: AuthConfig = toml::from_str(
        "kind = \"oauth_client_credentials\"\nservers = [\"secure\"]\nclient_id = \"q\"\ntoken_endpoint_auth = \"none\"\n",
    )
    .unwrap();
    let host = HostConfig {
        auth: BTreeMap::from([("cc".to_owned(), cc)]),
        ..HostConfig::default()
    };
    let error = host_builder(&RegistryDir::new())
        .with_config(host, ".")
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("auth.cc.token_endpoint_auth")
            && error.contains("none is for oauth_token_exchange"),
        "{error}"
    );
}

/// `quiver mcp call --subject-token-env`: the real CLI exchanges the variable's token with
/// a public client (`none`); a bad or missing variable is refused naming it, not its value.
#[test]
fn the_cli_takes_the_subject_token_from_the_variable_it_names() {
    let tokens = TokenServer::start_with(
        "quiver",
        SECRET,
        Duration::from_secs(3600),
        AsOptions {
            auth_methods: vec!["none".into()],
            ..AsOptions::default()
        },
    );
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    let registry = registry(server.url());
    let config = registry.path().join("quiver.toml");
    std::fs::write(
        &config,
        format!(
            "[egress]\nallow_private = [\"127.0.0.0/8\"]\n[auth.xchg]\n{}",
            exchange_table(&format!("issuer = {:?}\n", tokens.issuer()))
        ),
    )
    .unwrap();
    let call = |var: &str, value: Option<&str>| {
        let mut command = Command::new(quiver_cli());
        command
            .args([
                "mcp",
                "call",
                "secure",
                "whoami",
                "--subject-token-env",
                var,
            ])
            .arg("--registry")
            .arg(registry.path())
            .arg("--config")
            .arg(&config);
        match value {
            Some(value) => command.env(var, value),
            None => command.env_remove(var),
        };
        let out = command.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (status, stdout, stderr) = call("PLATFORM_TOKEN", Some(ALICE));
    assert_eq!(status, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("tok-1-"), "{stdout}");
    shows_no_secret(&stderr);
    let requests = tokens.token_requests();
    assert_eq!(requests[0].subject_token.as_deref(), Some(ALICE));
    assert_eq!(requests[0].auth_method, "none");

    let (status, _, stderr) = call("PLATFORM_TOKEN", None);
    assert_eq!(status, Some(2));
    assert!(
        stderr.contains("environment variable `PLATFORM_TOKEN` is not set"),
        "{stderr}"
    );
    let (status, _, stderr) = call("PLATFORM_TOKEN", Some("Bearer eyJsubject-token-of-x"));
    assert_eq!(status, Some(2));
    assert!(stderr.contains("without `Bearer `"), "{stderr}");
    shows_no_secret(&stderr);
    assert_eq!(tokens.token_request_count(), 1);
}

/// `quiver serve`: the subject token comes in the `Quiver-Subject-Token` header of
/// `POST /v1/tasks`, reaches the exchange, and appears in no answer or log line; a bad
/// one is refused naming the header and the rule.
#[tokio::test]
async fn the_node_takes_the_subject_token_from_its_header_and_never_shows_it() {
    use quiver_tests::node::Node;
    let tokens = TokenServer::start("quiver", SECRET, Duration::from_secs(3600)).await;
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    let registry = registry(server.url());
    let config = format!(
        "[egress]\nallow_private = [\"127.0.0.0/8\"]\n[auth.xchg]\n{}",
        exchange_table(&format!(
            "client_secret_env = \"QUIVER_TEST_NODE_XCHG\"\nissuer = {:?}\n",
            tokens.issuer()
        ))
    );
    let node = Node::start(
        &registry,
        Some(&config),
        &[("QUIVER_TEST_NODE_XCHG", SECRET)],
    );
    let guest = quiver_tests::wat::mcp_calls(&[("secure", "whoami", "{}")], 1);
    let module = node.upload(guest.as_bytes()).await;
    let task = serde_json::json!({
        "task_id": "exchanging",
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": "[\"secure\"]"},
        "limits": {"deadline_ms": 120000},
    });
    let submit = |subject: &str| {
        Node::send(
            node.request(reqwest::Method::POST, "/v1/tasks")
                .header("Quiver-Subject-Token", subject)
                .json(&serde_json::json!({"module": module, "task": task})),
        )
    };
    let answer = submit(ALICE).await;
    assert_eq!(answer.status, 202, "{answer:?}");
    let id = answer.json["id"].as_str().unwrap().to_owned();
    let done = node.task(&id, 60).await;
    assert_eq!(done.json["status"], "finished", "{done:?}");
    assert!(
        done.json["stderr"]
            .as_str()
            .unwrap_or_default()
            .contains("tok-1-"),
        "{done:?}"
    );
    assert_eq!(
        tokens.token_requests()[0].subject_token.as_deref(),
        Some(ALICE)
    );
    shows_no_secret(&done.json.to_string());

    let refused = submit("Bearer eyJsubject-token-of-carol").await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.field(), "Quiver-Subject-Token");
    assert!(
        refused.json.to_string().contains("without `Bearer `"),
        "{refused:?}"
    );
    shows_no_secret(&refused.json.to_string());
    shows_no_secret(&node.stderr());
}

// Enterprise-managed authorization (`kind = "oauth_enterprise_managed"`): the task's ID
// token is exchanged at a real IdP for an ID-JAG, redeemed at the server's real
// authorization server for the token the fixture checks.

const IDP_SECRET: &str = "idp-s3cret";
const ID_JAG: &str = "urn:ietf:params:oauth:token-type:id-jag";

fn ema_table(issuer: &str, idp: &str, idp_token_url: &str, extra: &str) -> String {
    format!(
        "kind = \"oauth_enterprise_managed\"\nservers = [\"secure\"]\norigins = [\"http://127.0.0.1:*\"]\nclient_id = \"quiver\"\nclient_secret_env = \"QUIVER_TEST_EMA_SECRET\"\nissuer = {issuer:?}\nidp_issuer = {idp:?}\nidp_token_url = {idp_token_url:?}\nidp_client_id = \"quiver-idp\"\n{extra}"
    )
}

fn shows_no_ema_secret(text: &str) {
    shows_no_secret(text);
    assert!(!text.contains(IDP_SECRET), "{text}");
    assert!(!text.contains("eyJ"), "a token in: {text}");
}

#[tokio::test]
async fn an_id_token_becomes_an_id_jag_at_the_idp_then_a_token_at_the_servers_authorization_server()
{
    let idp = TokenServer::start_with(
        "quiver-idp",
        IDP_SECRET,
        Duration::from_secs(3600),
        AsOptions {
            id_jag_client_id: Some("quiver".into()),
            ..AsOptions::default()
        },
    );
    let tokens = TokenServer::start("quiver", SECRET, Duration::from_secs(3600)).await;
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    // SAFETY: tests in this binary use distinct variable names.
    unsafe {
        std::env::set_var("QUIVER_TEST_EMA_SECRET", SECRET);
        std::env::set_var("QUIVER_TEST_EMA_IDP_SECRET", IDP_SECRET);
    }
    let registry = registry(server.url());
    let host = host(
        &registry,
        &ema_table(
            &tokens.issuer(),
            &idp.issuer(),
            &idp.token_url(),
            "idp_client_secret_env = \"QUIVER_TEST_EMA_IDP_SECRET\"\n",
        ),
    );

    assert_eq!(whoami(&host, &task(Some(ALICE))).await.unwrap(), "tok-1-");
    assert_eq!(whoami(&host, &task(Some(ALICE))).await.unwrap(), "tok-1-");
    assert_eq!(whoami(&host, &task(Some(BOB))).await.unwrap(), "tok-2-");

    let at_idp = idp.token_requests();
    assert_eq!(at_idp.len(), 2, "one ID-JAG per ID token: {at_idp:?}");
    let at_as = tokens.token_requests();
    assert_eq!(at_as.len(), 2, "{at_as:?}");
    for ((exchange, redemption), subject) in at_idp.iter().zip(&at_as).zip([ALICE, BOB]) {
        assert_eq!(
            exchange.grant_type,
            "urn:ietf:params:oauth:grant-type:token-exchange"
        );
        assert_eq!(exchange.subject_token.as_deref(), Some(subject));
        assert_eq!(exchange.requested_token_type.as_deref(), Some(ID_JAG));
        assert_eq!(exchange.audience.as_deref(), Some(tokens.issuer().as_str()));
        assert_eq!(exchange.resource.as_deref(), Some(server.url()));
        assert_eq!(exchange.auth_method, "client_secret_basic");
        let jag = exchange.issued.as_deref().expect("an ID-JAG");

        assert_eq!(
            redemption.grant_type,
            "urn:ietf:params:oauth:grant-type:jwt-bearer"
        );
        assert_eq!(redemption.assertion.as_deref(), Some(jag));
        assert_eq!(
            redemption.subject_token, None,
            "the ID token stays at the IdP"
        );
        assert_eq!(redemption.client_id.as_deref(), Some("quiver"));
        assert_eq!(redemption.auth_method, "client_secret_basic");
        assert!(redemption.issued.is_some());
    }

    let error = whoami(&host, &task(None)).await.unwrap_err();
    assert!(
        error
            .message
            .contains("oauth_enterprise_managed auth `xchg` exchanges the task's subject token"),
        "{}",
        error.message
    );
    host.shutdown().await;
}

#[tokio::test]
async fn hostile_idp_answers_are_refused_naming_the_step_and_nothing_is_redeemed() {
    let tokens = TokenServer::start("quiver", SECRET, Duration::from_secs(3600)).await;
    let server = FixtureHttp::spawn("http", &["--bearer-introspect", &tokens.introspect_url()]);
    // SAFETY: tests in this binary use distinct variable names.
    unsafe { std::env::set_var("QUIVER_TEST_EMA_SECRET", SECRET) };
    let registry = registry(server.url());
    let jag = |aud: &str| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let b64 = |v: serde_json::Value| quiver_tests::oauth::base64url(v.to_string().as_bytes());
        format!(
            "{}.{}.c2ln",
            b64(serde_json::json!({"alg": "ES256", "typ": "oauth-id-jag+jwt"})),
            b64(serde_json::json!({
                "iss": "http://127.0.0.1:1", "sub": "u", "aud": aud, "client_id": "quiver",
                "jti": "j", "iat": now, "exp": now + 300,
            })),
        )
    };
    let answer = |token: &str| {
        serde_json::json!({"access_token": token, "issued_token_type": ID_JAG, "token_type": "N_A"})
            .to_string()
    };
    let huge = format!(
        "{{\"access_token\":\"x\",\"pad\":\"{}\"}}",
        "x".repeat(2 * 1024 * 1024)
    );
    for (body, expected) in [
        (huge, "EMA request to IdentityProvider failed"),
        (answer("not-a-jwt"), "ID-JAG must be a compact signed JWT"),
        (
            answer(&jag("https://other-as.example")),
            "type, issuer, audience, client, subject, or JWT ID mismatch",
        ),
        (
            serde_json::json!({"access_token": "x", "issued_token_type": ID_JAG, "token_type": "Bearer"}).to_string(),
            "unsupported ID-JAG token type",
        ),
        ("[1,2".to_owned(), "malformed token response"),
    ] {
        let (idp_token_url, _idp) = answering(body);
        let host = host(
            &registry,
            &ema_table(&tokens.issuer(), "http://127.0.0.1:1", &idp_token_url, ""),
        );
        let error = whoami(&host, &task(Some(ALICE))).await.unwrap_err();
        assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
        assert!(
            error.message.contains("the IdP token endpoint (ID-JAG request)")
                && error.message.contains(&idp_token_url)
                && error.message.contains(expected),
            "{expected}: {}",
            error.message
        );
        shows_no_ema_secret(&error.message);
        host.shutdown().await;
    }
    assert_eq!(tokens.token_request_count(), 0, "no ID-JAG was redeemed");
}

#[test]
fn an_idp_outside_the_credentials_origins_never_gets_the_id_token() {
    let load = |table: &str| {
        let config: AuthConfig = toml::from_str(table).unwrap();
        let host = HostConfig {
            auth: BTreeMap::from([("xchg".to_owned(), config)]),
            ..HostConfig::default()
        };
        host_builder(&RegistryDir::new())
            .with_config(host, ".")
            .build()
            .err()
            .map(|e| e.to_string())
    };
    let elsewhere = ema_table(
        "http://127.0.0.1:2",
        "https://idp.example",
        "https://idp.example/token",
        "",
    );
    let error = load(&elsewhere).expect("refused");
    assert!(
        error.contains("auth.xchg.origins")
            && error.contains("add its origin \"https://idp.example\" to origins"),
        "{error}"
    );
    let in_clear = ema_table(
        "http://127.0.0.1:2",
        "https://127.0.0.1:3",
        "http://127.0.0.1:3/token",
        "",
    );
    let error = load(&in_clear).expect("refused");
    assert!(
        error.contains("auth.xchg.idp_token_url") && error.contains("travel in clear"),
        "{error}"
    );
    let unknown = toml::from_str::<AuthConfig>(&ema_table("a", "b", "c", "idp_secret = \"x\"\n"))
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("unknown field `idp_secret`"), "{unknown}");
}
