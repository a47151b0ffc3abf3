//! A fleet's etcd with TLS and authentication (issue 20, item 4): a real etcd serving
//! clients over TLS only, requiring client certificates from the test's CA (made with
//! rcgen), with etcd authentication on and a node user whose role covers one prefix. A
//! real `quiver serve` reads and follows records through it; a wrong password, a missing
//! client certificate and an untrusted CA each fail with a clear error and no secret in it;
//! a user limited to another prefix cannot read ours; and a plaintext endpoint off loopback
//! is refused unless `[etcd] allow_insecure` says otherwise.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, Identity, Permission, TlsOptions};
use quiver::registry::{DocFormat, DocKind, RegistryStore, StoreError};
use quiver_node::{EtcdConfig, EtcdStore};
use quiver_tests::etcd::{Etcd, Pki};
use quiver_tests::node::Node;
use quiver_tests::{fixture_toml, quiver_cli, unique_id};
use serde_json::Value;

const WITHIN: Duration = Duration::from_secs(30);
const NODE_PASSWORD: &str = "node-pw-7f3a9c-never-shown";
const ROOT_PASSWORD: &str = "root-pw-51d2e8";
const OTHER_PASSWORD: &str = "other-pw-0b6e44";

/// A client with `pki`'s client certificate, as `user` when given.
async fn admin_client(etcd: &Etcd, pki: &Pki, user: Option<(&str, &str)>) -> Client {
    let read = |name: &str| std::fs::read(pki.file(name)).expect("pem");
    let tls = TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read("ca.pem")))
        .identity(Identity::from_pem(
            read("client.pem"),
            read("client-key.pem"),
        ));
    let mut options = ConnectOptions::new()
        .with_tls(tls)
        .with_timeout(Duration::from_secs(10));
    if let Some((name, password)) = user {
        options = options.with_user(name, password);
    }
    Client::connect([etcd.endpoint()], Some(options))
        .await
        .expect("connect the test's etcd client")
}

/// Turns etcd authentication on: `root`; `quiver-node` (the client certificate's CN, so a
/// certificate alone is that user too) and `node` with readwrite on `/<prefix>/`; `other`
/// with readwrite on `/<other>/` only.
async fn enable_auth(etcd: &Etcd, pki: &Pki, prefix: &str, other: &str) {
    let mut client = admin_client(etcd, pki, None).await;
    for (role, key) in [("fleet", prefix), ("elsewhere", other)] {
        client.role_add(role).await.expect("role add");
        client
            .role_grant_permission(
                role,
                Permission::read_write(format!("/{key}/")).with_prefix(),
            )
            .await
            .expect("grant");
    }
    for (user, password, role) in [
        ("root", ROOT_PASSWORD, "root"),
        ("node", NODE_PASSWORD, "fleet"),
        ("other", OTHER_PASSWORD, "elsewhere"),
    ] {
        client
            .user_add(user, password, None)
            .await
            .expect("user add");
        client
            .user_grant_role(user, role)
            .await
            .expect("user grant");
    }
    client.auth_enable().await.expect("auth enable");
}

/// `[etcd]` trusting `pki`'s `ca`, with its client certificate when `with_cert`, as `user`
/// whose password is in `password_env`.
fn etcd_section(pki: &Pki, ca: &str, with_cert: bool, user: &str, password_env: &str) -> String {
    let mut section = format!(
        "[etcd]\nca_file = {:?}\nusername = {user:?}\npassword_env = {password_env:?}\n",
        pki.file(ca)
    );
    if with_cert {
        section += &format!(
            "cert_file = {:?}\nkey_file = {:?}\n",
            pki.file("client.pem"),
            pki.file("client-key.pem")
        );
    }
    section
}

/// The store `section` configures, resolved as a node resolves it, with `password` in the
/// variable it names.
async fn store_with(
    etcd: &Etcd,
    prefix: &str,
    section: &str,
    var: &str,
    password: &str,
) -> EtcdStore {
    // SAFETY: each test sets its own variable, named after the case, before reading it.
    unsafe { std::env::set_var(var, password) };
    let config: EtcdConfig = toml::from_str::<toml::Table>(section).expect("toml")["etcd"]
        .clone()
        .try_into()
        .expect("[etcd]");
    let access = config
        .resolve(Path::new("/nonexistent/quiver.toml"))
        .expect("resolve [etcd]");
    EtcdStore::connect_with_access(vec![etcd.address()], prefix.into(), &access)
        .await
        .expect("connect")
        .with_timeout(Duration::from_secs(10))
}

fn assert_no_secret(text: &str) {
    for secret in [NODE_PASSWORD, ROOT_PASSWORD, OTHER_PASSWORD, "PRIVATE KEY"] {
        assert!(!text.contains(secret), "a secret shows: {text}");
    }
}

async fn server_ids(node: &Node) -> Vec<String> {
    let servers = node.get_json("/v1/mcp/servers").await;
    servers["servers"]
        .as_array()
        .expect("servers array")
        .iter()
        .filter_map(|s| s["server_id"].as_str().map(str::to_owned))
        .collect()
}

async fn wait_servers(node: &Node, want: &[&str]) {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let ids = server_ids(node).await;
        if ids == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the node has {ids:?}, not {want:?}; stderr:\n{}",
            node.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reads_and_follows_records_over_tls_as_an_etcd_user() {
    let pki = Pki::new();
    let etcd = Etcd::start_tls(&pki);
    let prefix = unique_id("tlsfleet");
    enable_auth(&etcd, &pki, &prefix, "elsewhere").await;
    let root = admin_client(&etcd, &pki, Some(("root", ROOT_PASSWORD))).await;
    let mut kv = root.kv_client();

    let first = unique_id("tlsecho");
    let writer = store_with(
        &etcd,
        &prefix,
        &etcd_section(&pki, "ca.pem", true, "node", "QUIVER_TEST_ETCD_PW_WRITER"),
        "QUIVER_TEST_ETCD_PW_WRITER",
        NODE_PASSWORD,
    )
    .await;
    writer
        .upsert(
            DocKind::Server,
            &first,
            DocFormat::Toml,
            fixture_toml(&first, &["echo"], "").into_bytes(),
        )
        .await
        .expect("the node user writes under its prefix");

    let url = format!("etcd://{}/{prefix}", etcd.address());
    let config = etcd_section(&pki, "ca.pem", true, "node", "QUIVER_TEST_ETCD_PASSWORD");
    let node = Node::start_on(
        url.as_ref(),
        Some(&config),
        &[("QUIVER_TEST_ETCD_PASSWORD", NODE_PASSWORD)],
        &[],
    );
    wait_servers(&node, &[first.as_str()]).await;

    // Followed: a record put and one deleted afterwards reach it by the watch.
    let second = unique_id("tlsecho");
    writer
        .upsert(
            DocKind::Server,
            &second,
            DocFormat::Json,
            serde_json::to_vec(
                &toml::from_str::<Value>(&fixture_toml(&second, &["echo"], "")).unwrap(),
            )
            .unwrap(),
        )
        .await
        .expect("put the second");
    writer
        .delete(DocKind::Server, &first)
        .await
        .expect("delete")
        .expect("it was there");
    wait_servers(&node, &[second.as_str()]).await;
    let health = node.get_json("/v1/registry").await;
    assert_eq!(health["degraded"], false, "{health}");
    let ready = Node::send(node.anonymous(reqwest::Method::GET, "/readyz")).await;
    assert_no_secret(&format!("{ready:?} {health}"));
    assert_no_secret(&node.stderr());
    // The keys really are in this etcd, under the prefix.
    let keys = kv
        .get(
            format!("/{prefix}/servers/"),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await
        .expect("root lists");
    assert_eq!(keys.kvs().len(), 1);

    // `quiver registry` reaches the same etcd through the same `[etcd]` table.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("quiver.toml");
    std::fs::write(&file, &config).expect("write quiver.toml");
    let listed = Command::new(quiver_cli())
        .args(["registry", "list", "--json", "--registry", &url, "--config"])
        .arg(&file)
        .env("QUIVER_TEST_ETCD_PASSWORD", NODE_PASSWORD)
        .env_remove("QUIVER_CONFIG")
        .output()
        .expect("run quiver registry list");
    let stdout = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success() && stdout.contains(&second),
        "{listed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_certificates_and_prefixes_fail_clearly_without_secrets() {
    let pki = Pki::new();
    let etcd = Etcd::start_tls(&pki);
    let prefix = unique_id("tlsfleet");
    let other_prefix = unique_id("elsewhere");
    enable_auth(&etcd, &pki, &prefix, &other_prefix).await;

    // A wrong password: the login is refused, naming the user and the field to check.
    let wrong = store_with(
        &etcd,
        &prefix,
        &etcd_section(&pki, "ca.pem", true, "node", "QUIVER_TEST_ETCD_PW_WRONG"),
        "QUIVER_TEST_ETCD_PW_WRONG",
        "not-the-password-93c1",
    )
    .await;
    let err = wrong.list().await.expect_err("a wrong password");
    let text = err.to_string();
    assert!(
        text.contains("cannot log in as etcd user `node`") && text.contains("password_env"),
        "{text}"
    );
    assert!(!text.contains("not-the-password-93c1"), "{text}");
    assert_no_secret(&text);

    // No client certificate: etcd's TLS handshake refuses the connection.
    let no_cert = store_with(
        &etcd,
        &prefix,
        &etcd_section(&pki, "ca.pem", false, "node", "QUIVER_TEST_ETCD_PW_NOCERT"),
        "QUIVER_TEST_ETCD_PW_NOCERT",
        NODE_PASSWORD,
    )
    .await;
    let err = no_cert.list().await.expect_err("no client certificate");
    let text = err.to_string();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");
    assert!(
        text.contains(&etcd.address()) && text.contains("cert_file"),
        "{text}"
    );
    assert_no_secret(&text);

    // A CA that did not sign etcd's certificate: the node does not trust etcd.
    let untrusted = store_with(
        &etcd,
        &prefix,
        &etcd_section(&pki, "other-ca.pem", true, "node", "QUIVER_TEST_ETCD_PW_CA"),
        "QUIVER_TEST_ETCD_PW_CA",
        NODE_PASSWORD,
    )
    .await;
    let err = untrusted.list().await.expect_err("an untrusted CA");
    let text = err.to_string();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");
    assert!(
        text.contains("UnknownIssuer") && text.contains("ca_file"),
        "{text}"
    );
    assert_no_secret(&text);

    // A user whose role covers another prefix reads nothing of ours, and can write there.
    let other = store_with(
        &etcd,
        &prefix,
        &etcd_section(&pki, "ca.pem", true, "other", "QUIVER_TEST_ETCD_PW_OTHER"),
        "QUIVER_TEST_ETCD_PW_OTHER",
        OTHER_PASSWORD,
    )
    .await;
    let err = other.list().await.expect_err("another prefix's user");
    let text = err.to_string();
    assert!(
        text.contains("PermissionDenied") && text.contains("grant-permission"),
        "{text}"
    );
    assert_no_secret(&text);
    let own = store_with(
        &etcd,
        &other_prefix,
        &etcd_section(&pki, "ca.pem", true, "other", "QUIVER_TEST_ETCD_PW_OTHER2"),
        "QUIVER_TEST_ETCD_PW_OTHER2",
        OTHER_PASSWORD,
    )
    .await;
    own.list().await.expect("its own prefix reads");
}

/// `quiver serve` on `registry` with `config`; its exit status and stderr when it fails to
/// start within [`WITHIN`], or `None` when it announced an address (then it is killed).
fn serve_once(registry: &str, config: Option<&str>) -> Option<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(quiver_cli());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--registry", registry])
        .env_remove("QUIVER_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(config) = config {
        let file = dir.path().join("quiver.toml");
        std::fs::write(&file, config).expect("write quiver.toml");
        command.arg("--config").arg(file);
    }
    let mut child = command.spawn().expect("start quiver serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(WITHIN).unwrap_or_default();
    if line.starts_with("listening on ") {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    }
    let _ = child.kill();
    let output = child.wait_with_output().expect("wait");
    Some(String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn plaintext_off_loopback_is_refused_without_the_explicit_opt_in() {
    // TEST-NET-1: never routed, so nothing is reached either way.
    let registry = "etcd://192.0.2.1:2379/quiver";
    let refused = serve_once(registry, None).expect("refused to start");
    assert!(
        refused.contains("192.0.2.1:2379")
            && refused.contains("not loopback")
            && refused.contains("allow_insecure"),
        "{refused}"
    );
    // A user without TLS is still plaintext: the password would cross the network.
    let user_only = "[etcd]\nusername = \"node\"\npassword_env = \"QUIVER_TEST_ETCD_PW_PLAIN\"\n";
    // SAFETY: set before the child is spawned; only this test reads it.
    unsafe { std::env::set_var("QUIVER_TEST_ETCD_PW_PLAIN", NODE_PASSWORD) };
    let refused = serve_once(registry, Some(user_only)).expect("refused to start");
    assert!(
        refused.contains("plaintext") && refused.contains("etcd.ca_file"),
        "{refused}"
    );
    assert_no_secret(&refused);
    // Said explicitly: the node starts (and serves degraded until etcd answers).
    let allowed = serve_once(registry, Some("[etcd]\nallow_insecure = true\n"));
    assert!(allowed.is_none(), "{allowed:?}");
    // Loopback needs no opt-in.
    assert!(serve_once("etcd://127.0.0.1:9/quiver", None).is_none());
}

#[test]
fn user_authorization_on_an_etcd_registry_needs_a_grant_key_to_start() {
    let registry = "etcd://127.0.0.1:9/quiver";
    let user = "[auth.gh]\nkind = \"oauth_authorization_code\"\nservers = [\"gh\"]\n";
    let refused = serve_once(registry, Some(user)).expect("refused to start");
    assert!(
        refused.contains("etcd.grant_key_env") && refused.contains("openssl rand -hex 32"),
        "{refused}"
    );
    // A variable that holds no key is named, its value never shown.
    // SAFETY: set before the children are spawned; only this test reads them.
    unsafe {
        std::env::set_var("QUIVER_TEST_GRANT_KEY_BAD", "not-a-key-s3cr3t");
        std::env::set_var(
            "QUIVER_TEST_GRANT_KEY",
            "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        );
    }
    let bad = format!("{user}[etcd]\ngrant_key_env = \"QUIVER_TEST_GRANT_KEY_BAD\"\n");
    let refused = serve_once(registry, Some(&bad)).expect("refused to start");
    assert!(
        refused.contains("QUIVER_TEST_GRANT_KEY_BAD") && !refused.contains("s3cr3t"),
        "{refused}"
    );
    let good = format!("{user}[etcd]\ngrant_key_env = \"QUIVER_TEST_GRANT_KEY\"\n");
    assert_eq!(serve_once(registry, Some(&good)), None);
}
