//! User authorization through a node (`/v1/authorizations`, `/oauth/callback`): a real
//! `quiver_node::Node` over a host whose server needs a user's grant, the real
//! authorization server of [`TokenServer`] in front of the fixture MCP server, and an HTTP
//! client playing the person's browser (it opens the authorization URL, and follows the
//! authorization server's redirect to the node's callback). Covers the grant reaching a
//! task of that principal only, who may start, read and revoke, and forged, replayed and
//! expired `state`s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use quiver::{AuthConfig, DirGrantStore, EgressConfig, GrantStore, Host, HostConfig};
use quiver_node::{EtcdGrantStore, EtcdStore, GrantSealKey, Node, NodeConfig, NodeControl, Role};
use quiver_tests::etcd::Etcd;
use quiver_tests::oauth::{AsOptions, TokenServer, USER_HEADER};
use quiver_tests::{FixtureHttp, RegistryDir, host_builder, unique_id, wat};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const SERVER: &str = "users";
const PORTAL: &str = "portal-token-node-authorize";
const OTHER: &str = "other-token-node-authorize";
const SUBMIT_ONLY: &str = "submit-token-node-authorize";
const ANN: &str = "ann@example.com";
const BOB: &str = "bob@example.com";

struct Fixture {
    base: String,
    control: NodeControl,
    host: Host,
    tokens: TokenServer,
    registry: RegistryDir,
    _server: FixtureHttp,
    _grants: tempfile::TempDir,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.control.stop_now();
    }
}

fn host_config() -> HostConfig {
    let auth: AuthConfig =
        toml::from_str("kind = \"oauth_authorization_code\"\nservers = [\"users\"]\n").unwrap();
    HostConfig {
        auth: BTreeMap::from([("people".to_owned(), auth)]),
        egress: EgressConfig {
            allow_private: vec!["127.0.0.0/8".into()],
            ..EgressConfig::default()
        },
        ..HostConfig::default()
    }
}

/// A free loopback port for the node, known before it binds (its public URL names it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A host over `registry` keeping grants in `grants`.
fn user_host(registry: &RegistryDir, grants: Arc<dyn GrantStore>) -> Host {
    host_builder(registry)
        .with_config(host_config(), ".")
        .with_connect_timeout(Duration::from_secs(10))
        .with_grant_store(grants)
        .build()
        .unwrap()
}

/// A node whose client `portal` may authorize for `*@example.com`, `other` only for
/// itself, and `submit` may not authorize at all; grants in a directory.
async fn start(timeout: Duration) -> Fixture {
    let grants = tempfile::tempdir().unwrap();
    let store = Arc::new(DirGrantStore::new(grants.path()));
    start_with(timeout, store, grants).await
}

async fn start_with(
    timeout: Duration,
    store: Arc<dyn GrantStore>,
    grants: tempfile::TempDir,
) -> Fixture {
    start_with_as(timeout, store, grants, AsOptions::default()).await
}

/// [`start_with`] whose authorization server behaves as `options` say.
async fn start_with_as(
    timeout: Duration,
    store: Arc<dyn GrantStore>,
    grants: tempfile::TempDir,
    options: AsOptions,
) -> Fixture {
    quiver_tests::init_logging();
    let tokens = TokenServer::start_with("unused", "unused", Duration::from_secs(3600), options);
    let server = FixtureHttp::spawn(
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
            "server_id = {SERVER:?}\ntransport = \"streamable_http\"\nallowed_tools = [\"*\"]\n[http]\nurl = {:?}\nauth_ref = \"people\"\n[budgets]\ntool_timeout_ms = 5000\n",
            server.url()
        ),
    );
    let host = user_host(&registry, store);
    let port = free_port();
    let config = NodeConfig::new(format!("127.0.0.1:{port}").parse().unwrap())
        .with_client("portal", PORTAL, &[Role::Submit, Role::Authorize])
        .with_act_for("portal", &["*@example.com"])
        .with_client("other", OTHER, &[Role::Submit, Role::Authorize])
        .with_client("submit", SUBMIT_ONLY, &[Role::Submit])
        .with_public_url(&format!("http://127.0.0.1:{port}"))
        .with_authorization_timeout(timeout);
    let node = Node::bind(host.clone(), config).await.unwrap();
    let base = format!("http://{}", node.local_addr());
    let control = node.control();
    tokio::spawn(node.run());
    Fixture {
        base,
        control,
        host,
        tokens,
        registry,
        _server: server,
        _grants: grants,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

impl Fixture {
    async fn call(&self, method: Method, path: &str, token: &str) -> (StatusCode, Value) {
        let answer = client()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let text = answer.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    fn path(principal: &str) -> String {
        format!(
            "/v1/authorizations/{SERVER}/{}",
            principal.replace('@', "%40")
        )
    }

    /// Starts a flow; the node URL a person opens.
    async fn start_flow(&self, token: &str, principal: &str) -> String {
        let (status, body) = self.call(Method::POST, &Self::path(principal), token).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let url = body["authorization_url"].as_str().unwrap().to_owned();
        assert!(
            url.starts_with(&format!("{}/oauth/authorize/", self.base)),
            "the start answers a node URL, not the authorization server's: {url}"
        );
        url
    }

    /// The person opens the node URL and presses its button, as a browser does (the page
    /// cross-site from a link, the form same-origin): the authorization server's URL it is
    /// sent on to, and the cookie it got (`name=value`).
    async fn proceed(&self, url: &str, principal: &str) -> (String, String) {
        let page = client()
            .get(url)
            .header("sec-fetch-site", "cross-site")
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), StatusCode::OK, "{page:?}");
        let text = page.text().await.unwrap();
        assert!(
            text.contains(&format!("Continue only if you are {principal}"))
                && text.contains("<form method=\"post\""),
            "{text}"
        );
        let answer = client()
            .post(url)
            .header("origin", &self.base)
            .header("sec-fetch-site", "same-origin")
            .header("content-type", "application/x-www-form-urlencoded")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::SEE_OTHER, "{answer:?}");
        let location = answer.headers()[reqwest::header::LOCATION]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(location.starts_with(&self.tokens.issuer()), "{location}");
        let set = answer.headers()[reqwest::header::SET_COOKIE]
            .to_str()
            .unwrap()
            .to_owned();
        for attribute in ["Path=/", "Secure", "HttpOnly", "SameSite=Lax"] {
            assert!(set.contains(attribute), "{set}");
        }
        assert!(set.starts_with("__Host-"), "{set}");
        let cookie = set.split(';').next().unwrap().to_owned();
        (location, cookie)
    }

    /// The person logs in at the authorization URL as `user`; where the authorization
    /// server sends the browser (the node's callback).
    async fn log_in(&self, url: &str, user: &str) -> String {
        let answer = client()
            .get(url)
            .header(USER_HEADER, user)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::FOUND, "{answer:?}");
        let location = answer.headers()[reqwest::header::LOCATION]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            location.starts_with(&format!("{}/oauth/callback?", self.base)),
            "{location}"
        );
        location
    }

    /// The browser follows the redirect to the node, as a browser does after another
    /// site's redirect (cross-site, no token), with `cookie` if it has one.
    async fn follow(&self, location: &str, cookie: Option<&str>) -> (StatusCode, String) {
        let mut request = client()
            .get(location)
            .header("sec-fetch-site", "cross-site");
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status();
        (status, answer.text().await.unwrap())
    }

    /// The whole flow for `principal` in one browser, logging in as `user`: the
    /// callback's page.
    async fn authorize(&self, principal: &str, user: &str) -> (StatusCode, String) {
        let url = self.start_flow(PORTAL, principal).await;
        let (authorization, cookie) = self.proceed(&url, principal).await;
        let location = self.log_in(&authorization, user).await;
        self.follow(&location, Some(&cookie)).await
    }

    /// Runs a task submitted by `token` for `principal` that calls the server's `whoami`;
    /// the task's stderr (the call's result, when it succeeded).
    async fn whoami_task(&self, token: &str, principal: &str) -> String {
        let wasm = wat::mcp_calls(&[(SERVER, "whoami", "{}")], 1).into_bytes();
        let sha = quiver_tests::node::sha256_hex(&wasm);
        let put = client()
            .put(format!("{}/v1/modules/{sha}", self.base))
            .bearer_auth(token)
            .header("content-type", "application/wasm")
            .body(wasm)
            .send()
            .await
            .unwrap();
        assert!(put.status().is_success(), "{put:?}");
        let task = json!({
            "task_id": unique_id("node-authorize"),
            "config": {"mcp.enabled": "true", "mcp.default_server_ids": json!([SERVER]).to_string()},
            "limits": {"deadline_ms": 60000},
        });
        let submitted = client()
            .post(format!("{}/v1/tasks", self.base))
            .bearer_auth(token)
            .json(&json!({"module": sha, "task": task, "principal": principal}))
            .send()
            .await
            .unwrap();
        assert_eq!(submitted.status(), StatusCode::ACCEPTED, "{submitted:?}");
        let id = submitted.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let (_, done) = self
            .call(Method::GET, &format!("/v1/tasks/{id}?wait=50"), token)
            .await;
        assert_eq!(done["status"], "finished", "{done}");
        done["stderr"].as_str().unwrap_or_default().to_owned()
    }
}

#[tokio::test]
async fn a_person_authorizes_through_the_node_and_only_that_principal_gets_the_grant() {
    let fx = start(Duration::from_secs(120)).await;

    // Nothing yet: the status says so, and a task of Ann's is refused naming the fix.
    let (status, body) = fx.call(Method::GET, &Fixture::path(ANN), PORTAL).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["authorized"], false, "{body}");

    let url = fx.start_flow(PORTAL, ANN).await;
    let (_, pending) = fx.call(Method::GET, &Fixture::path(ANN), PORTAL).await;
    assert_eq!(pending["pending"], true, "{pending}");
    let (authorization, cookie) = fx.proceed(&url, ANN).await;
    let location = fx.log_in(&authorization, ANN).await;
    let (status, page) = fx.follow(&location, Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Authorized"), "{page}");

    let (status, body) = fx.call(Method::GET, &Fixture::path(ANN), PORTAL).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["authorized"], true, "{body}");
    assert_eq!(body["pending"], false, "{body}");
    assert!(body["expires_at"].as_u64().is_some(), "{body}");
    let shown = body.to_string();
    for token in fx.tokens.all_tokens() {
        assert!(!shown.contains(&token), "the status shows a token: {shown}");
    }

    // Ann's task calls the server with Ann's token; Bob's gets nothing of it.
    let ann = fx.whoami_task(PORTAL, ANN).await;
    assert!(ann.contains("ann@ex"), "{ann}");
    let bob = fx.whoami_task(PORTAL, BOB).await;
    assert!(!bob.contains("ann@ex"), "{bob}");
    let refused = whoami(&fx.host, BOB).await.unwrap_err();
    assert!(
        refused.contains(BOB) && refused.contains("authoriz"),
        "{refused}"
    );

    // The callback's URL again (a replay): refused, and Ann's grant stands.
    let (status, page) = fx.follow(&location, Some(&cookie)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("already used"), "{page}");

    // Revoked: gone, and Ann's next task no longer has it.
    let (status, body) = fx.call(Method::DELETE, &Fixture::path(ANN), PORTAL).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["revoked"], true, "{body}");
    let (_, body) = fx.call(Method::GET, &Fixture::path(ANN), PORTAL).await;
    assert_eq!(body["authorized"], false, "{body}");
    let ann = fx.whoami_task(PORTAL, ANN).await;
    assert!(
        ann.contains("mcp_policy_denied") && ann.contains("has not given it"),
        "{ann}"
    );
}

#[tokio::test]
async fn only_a_client_that_may_act_for_the_principal_may_start_read_or_revoke() {
    let fx = start(Duration::from_secs(120)).await;
    for method in [Method::POST, Method::GET, Method::DELETE] {
        // `other` has no act_for: Ann is not its to authorize.
        let (status, body) = fx.call(method.clone(), &Fixture::path(ANN), OTHER).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {body}");
        assert!(body.to_string().contains("act_for"), "{body}");
        // Another client's name is never a principal one may act for.
        let (status, body) = fx
            .call(method.clone(), &Fixture::path("other"), PORTAL)
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {body}");
        // Without the role.
        let (status, body) = fx
            .call(method.clone(), &Fixture::path("submit"), SUBMIT_ONLY)
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {body}");
        assert!(body.to_string().contains("authorize"), "{body}");
        let (status, _) = fx.call(method.clone(), &Fixture::path(ANN), "wrong").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method}");
    }
    // A client acting as itself may.
    let url = fx.start_flow(OTHER, "other").await;
    let (authorization, _) = fx.proceed(&url, "other").await;
    assert!(authorization.contains("state="), "{authorization}");
    // An unknown server is named.
    let (status, body) = fx
        .call(Method::POST, "/v1/authorizations/nope/other", OTHER)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["field"], "server_id", "{body}");
}

#[tokio::test]
async fn forged_and_expired_states_are_refused_with_a_page() {
    let fx = start(Duration::from_secs(4)).await;
    let url = fx.start_flow(PORTAL, ANN).await;
    let (authorization, cookie) = fx.proceed(&url, ANN).await;
    let location = fx.log_in(&authorization, ANN).await;

    // A forged state, no state, hostile text: a 400 page that echoes nothing unescaped.
    for query in [
        "code=x&state=forged".to_owned(),
        "code=x".to_owned(),
        "state=%3Cscript%3E&error=%3Cb%3E".to_owned(),
        format!("state={}", "a".repeat(5000)),
    ] {
        let (status, page) = fx
            .follow(
                &format!("{}/oauth/callback?{query}", fx.base),
                Some(&cookie),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {page}");
        assert!(
            !page.contains("<script>") && !page.contains("<b>"),
            "{page}"
        );
    }
    // The real redirect with a parameter repeated: refused, whichever value is the real one.
    for extra in [
        "&code=again",
        "&state=again",
        "&iss=again",
        "&error=a&error=b",
    ] {
        let (status, page) = fx
            .follow(&format!("{location}{extra}"), Some(&cookie))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {page}");
        assert!(page.contains("repeats"), "{page}");
    }
    // The real redirect, after the flow expired.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let (status, page) = fx.follow(&location, Some(&cookie)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("expired"), "{page}");
    let (_, body) = fx.call(Method::GET, &Fixture::path(ANN), PORTAL).await;
    assert_eq!(body["authorized"], false, "{body}");

    // The authorization server's error comes back escaped.
    let url = fx.start_flow(PORTAL, ANN).await;
    let (authorization, cookie) = fx.proceed(&url, ANN).await;
    let state = reqwest::Url::parse(&authorization)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "state")
        .unwrap()
        .1
        .into_owned();
    let (status, page) = fx
        .follow(&format!(
            "{}/oauth/callback?state={state}&error=access_denied&error_description=%3Cimg%20src%3Dx%3E",
            fx.base
        ), Some(&cookie))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("access_denied"), "{page}");
    assert!(page.contains("&lt;img") && !page.contains("<img"), "{page}");
}

#[tokio::test]
async fn a_leaked_authorization_server_url_is_refused_in_another_browser() {
    let fx = start(Duration::from_secs(120)).await;
    let url = fx.start_flow(PORTAL, ANN).await;
    let (authorization, cookie) = fx.proceed(&url, ANN).await;

    // Mallory got the authorization server's URL and logs in with her own account: the
    // node refuses her browser, which has no cookie of the flow, or a forged one.
    let stolen = fx.log_in(&authorization, "mallory").await;
    let name = cookie.split('=').next().unwrap();
    for forged in [None, Some(format!("{name}={}", "0".repeat(64)))] {
        let (status, page) = fx.follow(&stolen, forged.as_deref()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
        assert!(page.contains("did not start"), "{page}");
    }
    let (_, body) = fx.call(Method::GET, &Fixture::path(ANN), PORTAL).await;
    assert_eq!(body["authorized"], false, "{body}");

    // The node URL is single use: nobody gets a second cookie from it.
    let again = client()
        .post(&url)
        .header("origin", &fx.base)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::BAD_REQUEST);
    assert!(again.headers().get(reqwest::header::SET_COOKIE).is_none());
    let (status, page) = fx.follow(&url, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    // A form posted from another site is refused before it uses anything.
    let url = fx.start_flow(PORTAL, BOB).await;
    let cross = client()
        .post(&url)
        .header("origin", "http://attacker.example")
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
    fx.proceed(&url, BOB).await;

    // Ann, in the browser that proceeded, finishes; the node asked for the consent screen,
    // and clears the cookie.
    let location = fx.log_in(&authorization, ANN).await;
    let done = client()
        .get(&location)
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    let cleared = done.headers()[reqwest::header::SET_COOKIE]
        .to_str()
        .unwrap();
    assert!(
        cleared.starts_with(&format!("{name}=;")) && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
    assert!(
        fx.tokens
            .authorizations()
            .iter()
            .all(|a| a.prompt.as_deref() == Some("consent")),
        "{:?}",
        fx.tokens.authorizations()
    );
    assert_eq!(whoami(&fx.host, ANN).await.unwrap(), "ann@ex");
}

#[tokio::test]
async fn one_client_cannot_take_every_pending_place() {
    let fx = start(Duration::from_secs(120)).await;
    for i in 0..16 {
        fx.start_flow(PORTAL, &format!("u{i}@example.com")).await;
    }
    let (status, body) = fx
        .call(Method::POST, &Fixture::path("u16@example.com"), PORTAL)
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(body.to_string().contains("client `portal`"), "{body}");
    // Restarting one of its own replaces it, and another client still may start.
    fx.start_flow(PORTAL, "u3@example.com").await;
    fx.start_flow(OTHER, "other").await;
}

/// `whoami` called by the library as `principal`: the token's first 6 characters.
async fn whoami(host: &Host, principal: &str) -> Result<String, String> {
    let mut task = quiver::TaskSpec::new(unique_id("whoami"))
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", json!([SERVER]));
    task.principal = Some(principal.to_owned());
    match host
        .call_tool(&task, quiver::ToolCallRequest::new(SERVER, "whoami"))
        .await
    {
        Ok(out) => Ok(out.result.content[0].as_text().unwrap().text.clone()),
        Err(e) => Err(e.to_string()),
    }
}

const SEAL_KEY: &str = "7d1f3a9c0b2e4d6f8a1c3e5b7d9f0a2c4e6b8d0f1a3c5e7b9d2f4a6c8e0b1d3f";

async fn etcd_grants(etcd: &Etcd, prefix: &str, key: &str) -> Arc<dyn GrantStore> {
    let store = EtcdStore::connect(vec![etcd.endpoint()], prefix.into())
        .await
        .unwrap();
    Arc::new(EtcdGrantStore::new(
        &store,
        GrantSealKey::from_hex(key).unwrap(),
    ))
}

#[tokio::test]
async fn a_grant_made_through_one_node_serves_another_from_etcd_sealed() {
    let etcd = Etcd::start();
    let prefix = unique_id("grants");
    let dir = tempfile::tempdir().unwrap();
    let fx = start_with(
        Duration::from_secs(120),
        etcd_grants(&etcd, &prefix, SEAL_KEY).await,
        dir,
    )
    .await;
    let (status, page) = fx.authorize(ANN, ANN).await;
    assert_eq!(status, StatusCode::OK, "{page}");

    // Another node of the fleet, same etcd and key: Ann's grant serves it.
    let other = user_host(&fx.registry, etcd_grants(&etcd, &prefix, SEAL_KEY).await);
    assert_eq!(whoami(&other, ANN).await.unwrap(), "ann@ex");
    other.shutdown().await;

    // etcd holds no token, and not Ann's name either.
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
    assert_eq!(listed.kvs().len(), 1, "one grant");
    let raw = String::from_utf8_lossy(listed.kvs()[0].value()).into_owned();
    let key = String::from_utf8_lossy(listed.kvs()[0].key()).into_owned();
    for token in fx.tokens.all_tokens() {
        assert!(!raw.contains(&token), "etcd holds a token: {raw}");
    }
    assert!(!raw.contains(ANN) && !key.contains(ANN), "{key}: {raw}");

    // A node with another key cannot open it, and says why.
    let wrong = SEAL_KEY.replace('7', "8");
    let stranger = user_host(&fx.registry, etcd_grants(&etcd, &prefix, &wrong).await);
    let refused = whoami(&stranger, ANN).await.unwrap_err();
    assert!(refused.contains("grant_key_env"), "{refused}");
    for token in fx.tokens.all_tokens() {
        assert!(!refused.contains(&token), "{refused}");
    }
    stranger.shutdown().await;

    // Ann's grant copied to Bob's key does not open as Bob's.
    let bob_key = key.replace(key.rsplit('/').next().unwrap(), &{
        use sha2::Digest;
        let hash = sha2::Sha256::digest(BOB.as_bytes());
        hash[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    });
    client
        .put(bob_key, listed.kvs()[0].value().to_vec(), None)
        .await
        .unwrap();
    let refused = whoami(&fx.host, BOB).await.unwrap_err();
    assert!(refused.contains("grant_key_env"), "{refused}");
}

fn sample_grant(principal: &str) -> quiver::Grant {
    serde_json::from_value(json!({
        "server_id": SERVER, "principal": principal,
        "registration": {"client_id": "c1"}
    }))
    .unwrap()
}

#[tokio::test]
async fn a_grant_revoked_or_changed_by_one_node_is_not_written_back_by_another() {
    let etcd = Etcd::start();
    let prefix = unique_id("grants-race");
    let a = etcd_grants(&etcd, &prefix, SEAL_KEY).await;
    let b = etcd_grants(&etcd, &prefix, SEAL_KEY).await;
    let ann = quiver::GrantKey::new(SERVER, ANN);
    a.save(sample_grant(ANN)).await.unwrap();

    // Node B loads Ann's grant to refresh it; node A revokes it meanwhile. B's save is
    // refused, and the grant stays revoked.
    let loaded = b.load(&ann).await.unwrap().unwrap();
    assert!(a.remove(&ann).await.unwrap());
    let refused = b.save(loaded).await.unwrap_err().to_string();
    assert!(refused.contains("changed in etcd"), "{refused}");
    assert!(a.load(&ann).await.unwrap().is_none());

    // Two nodes refresh the same grant: the later save fails instead of overwriting.
    a.save(sample_grant(ANN)).await.unwrap();
    let on_a = a.load(&ann).await.unwrap().unwrap();
    let on_b = b.load(&ann).await.unwrap().unwrap();
    a.save(on_a).await.unwrap();
    assert!(b.save(on_b).await.is_err());
    // Read again, B's save goes through; a grant made anew where one exists does not.
    let again = b.load(&ann).await.unwrap().unwrap();
    b.save(again).await.unwrap();
    assert!(a.save(sample_grant(ANN)).await.is_err());
}

/// The access and refresh token the last authorization code grant issued.
fn issued_by_code(tokens: &TokenServer) -> (String, String) {
    let request = tokens
        .token_requests()
        .into_iter()
        .rfind(|r| r.grant_type == "authorization_code" && r.issued.is_some())
        .expect("an authorization code grant");
    (request.issued.unwrap(), request.refresh_issued.unwrap())
}

#[tokio::test]
async fn a_revocation_revokes_the_tokens_at_the_authorization_server_too() {
    let fx = start(Duration::from_secs(120)).await;
    let (status, page) = fx.authorize(ANN, ANN).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let (access, refresh) = issued_by_code(&fx.tokens);
    assert!(fx.tokens.is_active(&access));

    let (status, body) = fx.call(Method::DELETE, &Fixture::path(ANN), PORTAL).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["revoked"], true, "{body}");
    // RFC 7009: the refresh token, then the access token, as the client the grant was
    // made with (a public client registered dynamically: its client_id in the form).
    let revocations = fx.tokens.revocations();
    let seen: Vec<_> = revocations
        .iter()
        .map(|r| {
            (
                r.token.as_str(),
                r.token_type_hint.as_deref(),
                r.revoked.as_deref(),
                r.auth_method.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                refresh.as_str(),
                Some("refresh_token"),
                Some("refresh_token"),
                "none"
            ),
            (
                access.as_str(),
                Some("access_token"),
                Some("access_token"),
                "none"
            ),
        ]
    );
    assert!(
        revocations
            .iter()
            .all(|r| r.client_id.as_deref() == Some("dyn-1"))
    );
    assert!(!fx.tokens.is_active(&access));
}

#[tokio::test]
async fn a_slow_revocation_endpoint_is_bounded_and_the_grant_is_gone_all_the_same() {
    let grants = tempfile::tempdir().unwrap();
    let store = Arc::new(DirGrantStore::new(grants.path()));
    let options = AsOptions {
        revocation_delay: Duration::from_secs(300),
        ..AsOptions::default()
    };
    let fx = start_with_as(Duration::from_secs(120), store, grants, options).await;
    let (status, page) = fx.authorize(ANN, ANN).await;
    assert_eq!(status, StatusCode::OK, "{page}");

    let started = std::time::Instant::now();
    let (status, body) = fx.call(Method::DELETE, &Fixture::path(ANN), PORTAL).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["revoked"], true, "{body}");
    assert!(
        took >= quiver::defaults::OAUTH_REVOCATION_TIMEOUT
            && took < quiver::defaults::OAUTH_REVOCATION_TIMEOUT + Duration::from_secs(20),
        "the revocation took {took:?}"
    );
    let (_, body) = fx.call(Method::GET, &Fixture::path(ANN), PORTAL).await;
    assert_eq!(body["authorized"], false, "{body}");
    let refused = whoami(&fx.host, ANN).await.unwrap_err();
    assert!(refused.contains("authoriz"), "{refused}");
}

#[tokio::test]
async fn two_nodes_refreshing_one_grant_at_once_both_go_on_with_the_winners_tokens() {
    let etcd = Etcd::start();
    let prefix = unique_id("grants-refresh");
    let dir = tempfile::tempdir().unwrap();
    // Refresh tokens rotate, a used one is refused, and each refresh takes a while, so
    // the two nodes' refreshes overlap at the authorization server.
    let options = AsOptions {
        refresh_delay: Duration::from_secs(2),
        ..AsOptions::default()
    };
    let fx = start_with_as(
        Duration::from_secs(120),
        etcd_grants(&etcd, &prefix, SEAL_KEY).await,
        dir,
        options,
    )
    .await;
    let (status, page) = fx.authorize(ANN, ANN).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let other = user_host(&fx.registry, etcd_grants(&etcd, &prefix, SEAL_KEY).await);
    assert_eq!(whoami(&fx.host, ANN).await.unwrap(), "ann@ex");
    assert_eq!(whoami(&other, ANN).await.unwrap(), "ann@ex");

    // The access token stops working: both nodes' next calls refresh at once.
    fx.tokens.revoke_all();
    let (here, there) = tokio::join!(whoami(&fx.host, ANN), whoami(&other, ANN));
    let refreshes: Vec<bool> = fx
        .tokens
        .token_requests()
        .iter()
        .filter(|r| r.grant_type == "refresh_token")
        .map(|r| r.issued.is_some())
        .collect();
    assert_eq!(
        refreshes,
        [true, false],
        "one refresh won, the other's refresh token was already used"
    );
    assert_eq!(here.unwrap(), "ann@ex");
    assert_eq!(there.unwrap(), "ann@ex");

    // The grant stands with the winner's tokens, which serve both nodes from now on.
    let (_, body) = fx.call(Method::GET, &Fixture::path(ANN), PORTAL).await;
    assert_eq!(body["authorized"], true, "{body}");
    assert_eq!(whoami(&other, ANN).await.unwrap(), "ann@ex");
    assert_eq!(whoami(&fx.host, ANN).await.unwrap(), "ann@ex");
    assert_eq!(fx.tokens.refresh_count(), 1);
    other.shutdown().await;
}
