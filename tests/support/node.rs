//! A real `quiver serve` process for the node's tests: started on `127.0.0.1:0`, its
//! address read from the `listening on` line it prints, its stderr kept, and an HTTP
//! client (with or without the token) to talk to it. The process is killed when dropped.
//! Also the guests and task.json the node's tests share, and the steps they repeat
//! (submit until running, cancel, long-poll, a clean exit).

use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};
use tempfile::TempDir;

use crate::{RegistryDir, collect_stderr, first_stdout_line, quiver_cli, workspace};

/// A guest that writes `hello` to stdout and exits 0.
pub const HELLO: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "hello\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 6))
    (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

/// A guest that spins forever (only a deadline or a cancel ends it).
pub const LOOP: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "_start") (loop $l (br $l))))"#;

/// A plain task.json for the node: id `id`, a deadline far beyond any test's.
pub fn task_json(id: &str) -> Value {
    serde_json::json!({"task_id": id, "limits": {"deadline_ms": 120000}})
}

/// `config` with the fixture servers' `[mcp.launch]` added, unless it has its own.
fn with_fixture_launch_rules(config: &str) -> String {
    if config.contains("[mcp.launch]") {
        config.to_owned()
    } else {
        format!("{config}{}", crate::fixture_launch_rules())
    }
}

/// A running `quiver serve`.
pub struct Node {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    stderr: Arc<Mutex<String>>,
    client: reqwest::Client,
    token: Option<String>,
    _config_dir: TempDir,
}

/// An answer: status, headers and the body as JSON (`Null` when it is not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub json: Value,
}

impl Answer {
    /// `error.field` of an error answer.
    pub fn field(&self) -> &str {
        self.json["error"]["field"].as_str().unwrap_or("")
    }

    /// `error.code` of an error answer.
    pub fn code(&self) -> &str {
        self.json["error"]["code"].as_str().unwrap_or("")
    }
}

impl Node {
    /// Starts `quiver serve --listen 127.0.0.1:0 --registry <registry>` with `config` (a
    /// quiver.toml body, written next to nothing else) and `env` set, and waits up to 30 s
    /// for its address.
    pub fn start(registry: &RegistryDir, config: Option<&str>, env: &[(&str, &str)]) -> Node {
        Self::start_with_args(registry, config, env, &[])
    }

    /// [`Node::start`] with more command-line arguments (e.g. `--audit-log FILE`).
    pub fn start_with_args(
        registry: &RegistryDir,
        config: Option<&str>,
        env: &[(&str, &str)],
        args: &[&std::ffi::OsStr],
    ) -> Node {
        Self::start_on(registry.path().as_os_str(), config, env, args)
    }

    /// [`Node::start_with_args`] with `--registry <registry>` as given: a directory or a
    /// store URL such as `etcd://127.0.0.1:2379/quiver`.
    pub fn start_on(
        registry: &std::ffi::OsStr,
        config: Option<&str>,
        env: &[(&str, &str)],
        args: &[&std::ffi::OsStr],
    ) -> Node {
        Self::start_launching(registry, config, env, args, true)
    }

    /// [`Node::start`] without the fixture servers' `[mcp.launch]`: a node with the
    /// default launch rules (no command, no variable) unless `config` sets its own.
    pub fn start_with_default_launch_rules(
        registry: &RegistryDir,
        config: Option<&str>,
        env: &[(&str, &str)],
    ) -> Node {
        Self::start_launching(registry.path().as_os_str(), config, env, &[], false)
    }

    /// [`Node::start`] listening on `listen` (e.g. `127.0.0.1:PORT`, for a node whose
    /// `[serve] public_url` names its port).
    pub fn start_listening(
        listen: &str,
        registry: &RegistryDir,
        config: &str,
        env: &[(&str, &str)],
    ) -> Node {
        Self::start_launching_on(
            listen,
            registry.path().as_os_str(),
            Some(config),
            env,
            &[],
            true,
        )
    }

    fn start_launching(
        registry: &std::ffi::OsStr,
        config: Option<&str>,
        env: &[(&str, &str)],
        args: &[&std::ffi::OsStr],
        fixtures: bool,
    ) -> Node {
        Self::start_launching_on("127.0.0.1:0", registry, config, env, args, fixtures)
    }

    fn start_launching_on(
        listen: &str,
        registry: &std::ffi::OsStr,
        config: Option<&str>,
        env: &[(&str, &str)],
        args: &[&std::ffi::OsStr],
        fixtures: bool,
    ) -> Node {
        let config_dir = tempfile::tempdir().expect("tempdir");
        let config = match (fixtures, config) {
            (true, Some(config)) => Some(with_fixture_launch_rules(config)),
            (true, None) => Some(with_fixture_launch_rules("")),
            (false, config) => config.map(str::to_owned),
        };
        let (child, base, stderr) =
            Self::spawn_on(listen, registry, config.as_deref(), &config_dir, env, args)
                .unwrap_or_else(|(status, err)| {
                    panic!("quiver serve did not start ({status:?}); stderr:\n{err}")
                });
        let token = env
            .iter()
            .find(|(k, _)| *k == "QUIVER_TEST_TOKEN")
            .map(|(_, v)| (*v).to_owned());
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            // A fresh connection per request: a node may close idle ones after its header
            // timeout, which a test sets short.
            .pool_max_idle_per_host(0)
            .build()
            .expect("HTTP client");
        Node {
            child,
            base,
            stderr,
            client,
            token,
            _config_dir: config_dir,
        }
    }

    /// Starts `quiver serve --listen <listen> <args>` (its quiver.toml written to
    /// `config_dir`) and, when it exits before announcing an address, returns its exit
    /// status and stderr.
    #[allow(clippy::type_complexity)]
    pub fn spawn(
        listen: &str,
        registry: &RegistryDir,
        config: Option<&str>,
        config_dir: &TempDir,
        env: &[(&str, &str)],
        args: &[&std::ffi::OsStr],
    ) -> Result<(Child, String, Arc<Mutex<String>>), (Option<ExitStatus>, String)> {
        let config = config.map(with_fixture_launch_rules);
        Self::spawn_on(
            listen,
            registry.path().as_os_str(),
            config.as_deref(),
            config_dir,
            env,
            args,
        )
    }

    /// [`Node::spawn`] with `--registry <registry>` as given.
    #[allow(clippy::type_complexity)]
    fn spawn_on(
        listen: &str,
        registry: &std::ffi::OsStr,
        config: Option<&str>,
        config_dir: &TempDir,
        env: &[(&str, &str)],
        args: &[&std::ffi::OsStr],
    ) -> Result<(Child, String, Arc<Mutex<String>>), (Option<ExitStatus>, String)> {
        let mut cmd = Command::new(quiver_cli());
        cmd.arg("serve")
            .arg("--listen")
            .arg(listen)
            .arg("--registry")
            .arg(registry)
            .arg("--cache-dir")
            .arg(workspace().join("target").join("test-module-cache"))
            .args(args)
            .env_remove("QUIVER_CONFIG")
            .env_remove("QUIVER_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(config) = config {
            let file = config_dir.path().join("quiver.toml");
            std::fs::write(&file, config).expect("write quiver.toml");
            cmd.arg("--config").arg(file);
        }
        for (key, value) in env {
            cmd.env(key, value);
        }
        let mut child = cmd.spawn().expect("start quiver serve");
        let stderr = collect_stderr(&mut child);
        let base = first_stdout_line(&mut child, Duration::from_secs(30))
            .ok()
            .and_then(|line| line.trim().strip_prefix("listening on ").map(str::to_owned));
        match base {
            Some(base) => Ok((child, base, stderr)),
            None => {
                let _ = child.kill();
                let status = child.wait().ok();
                // Let the stderr thread take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                let err = stderr.lock().unwrap_or_else(|e| e.into_inner()).clone();
                Err((status, err))
            }
        }
    }

    /// Everything the node wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the node.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        let pid = i32::try_from(self.child.id()).expect("pid");
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill");
    }

    /// Waits up to `within` for the node to exit.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < within {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// A request with the node's token (if it has one).
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.client.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// A request without any token.
    pub fn anonymous(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, format!("{}{path}", self.base))
    }

    /// Sends `request` and reads the answer. A large body goes the way curl sends one,
    /// with `Expect: 100-continue`: a node that refuses it early answers before any of it
    /// is written, where reqwest would race the node's close and see a broken pipe.
    pub async fn send(request: reqwest::RequestBuilder) -> Answer {
        let (client, request) = request.build_split();
        let request = request.expect("a well-formed request");
        let large = request
            .body()
            .and_then(|body| body.as_bytes())
            .is_some_and(|bytes| bytes.len() > EXPECT_CONTINUE_FROM);
        if large {
            return send_expecting_continue(request).await;
        }
        let response = client.execute(request).await.expect("request to the node");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.expect("answer body");
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Answer {
            status,
            headers,
            json,
        }
    }

    /// Uploads `bytes` as a module; its SHA-256.
    pub async fn upload(&self, bytes: &[u8]) -> String {
        let sha = sha256_hex(bytes);
        let answer = Self::send(
            self.request(reqwest::Method::PUT, &format!("/v1/modules/{sha}"))
                .header("content-type", "application/wasm")
                .body(bytes.to_vec()),
        )
        .await;
        assert!(
            answer.status == 201 || answer.status == 200,
            "upload: {answer:?}"
        );
        assert_eq!(answer.json["module"], sha.as_str());
        sha
    }

    /// Submits `task` for `module`; the answer.
    pub async fn submit(&self, module: &str, task: Value) -> Answer {
        Self::send(
            self.request(reqwest::Method::POST, "/v1/tasks")
                .json(&serde_json::json!({"module": module, "task": task})),
        )
        .await
    }

    /// Submits and expects `202`; the task's id.
    pub async fn submit_ok(&self, module: &str, task: Value) -> String {
        let answer = self.submit(module, task).await;
        assert_eq!(answer.status, 202, "submit: {answer:?}");
        answer.json["id"].as_str().expect("id").to_owned()
    }

    /// Submits `task` for `module` and waits up to 60 s for it to run; its id.
    pub async fn submit_running(&self, module: &str, task: Value) -> String {
        let id = self.submit_ok(module, task).await;
        let seen = self
            .wait_status(&id, "running", Duration::from_secs(60))
            .await;
        assert_eq!(seen.json["status"], "running", "{seen:?}");
        id
    }

    /// `GET /v1/tasks/{id}?wait=60` in the background, for a test that acts meanwhile.
    pub fn long_poll(&self, id: &str) -> tokio::task::JoinHandle<Answer> {
        tokio::spawn(Self::send(
            self.request(reqwest::Method::GET, &format!("/v1/tasks/{id}?wait=60")),
        ))
    }

    /// `DELETE /v1/tasks/{id}`.
    pub async fn cancel(&self, id: &str) -> Answer {
        Self::send(self.request(reqwest::Method::DELETE, &format!("/v1/tasks/{id}"))).await
    }

    /// Waits up to `within` for the node to exit, which it must, with status 0.
    pub fn assert_exits_0(&mut self, within: Duration) {
        let status = self.wait_exit(within).expect("the node exits");
        assert_eq!(status.code(), Some(0), "{}", self.stderr());
    }

    /// `GET /v1/tasks/{id}?wait=<wait_secs>`.
    pub async fn task(&self, id: &str, wait_secs: u32) -> Answer {
        Self::send(self.request(
            reqwest::Method::GET,
            &format!("/v1/tasks/{id}?wait={wait_secs}"),
        ))
        .await
    }

    /// `GET path` with the token, expecting `200`; the JSON body.
    pub async fn get_json(&self, path: &str) -> Value {
        let answer = Self::send(self.request(reqwest::Method::GET, path)).await;
        assert_eq!(answer.status, 200, "GET {path}: {answer:?}");
        answer.json
    }

    /// Polls `GET path` until `done` holds for its JSON body, for up to `within`; the
    /// last body.
    pub async fn poll_json(
        &self,
        path: &str,
        within: Duration,
        mut done: impl FnMut(&Value) -> bool,
    ) -> Value {
        let start = Instant::now();
        loop {
            let body = self.get_json(path).await;
            if done(&body) {
                return body;
            }
            assert!(
                start.elapsed() < within,
                "GET {path} never became what the test waits for; last: {body}\nnode stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls the task until its status is `status`, for up to `within`.
    pub async fn wait_status(&self, id: &str, status: &str, within: Duration) -> Answer {
        let start = Instant::now();
        loop {
            let answer = self.task(id, 0).await;
            if answer.json["status"] == status || start.elapsed() > within {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lowercase hex SHA-256 of `bytes`, as the node names modules.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Bodies larger than this are sent with `Expect: 100-continue`.
const EXPECT_CONTINUE_FROM: usize = 64 * 1024;

/// One HTTP/1.1 exchange over a fresh connection: the head with `Expect: 100-continue`,
/// the body only after `100 Continue`, then the final answer (read to its
/// `Content-Length`, or to the close).
async fn send_expecting_continue(request: reqwest::Request) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let url = request.url();
    let body = request
        .body()
        .and_then(|b| b.as_bytes())
        .unwrap_or_default();
    let address = format!(
        "{}:{}",
        url.host_str().expect("a host"),
        url.port_or_known_default().expect("a port")
    );
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: {address}\r\ncontent-length: {}\r\nexpect: 100-continue\r\nconnection: close\r\n",
        request.method(),
        match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        },
        body.len()
    );
    for (name, value) in request.headers() {
        head.push_str(&format!(
            "{name}: {}\r\n",
            value.to_str().expect("ASCII header")
        ));
    }
    head.push_str("\r\n");
    let mut stream = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connect to the node");
    stream
        .write_all(head.as_bytes())
        .await
        .expect("send the head");
    let mut received = Vec::new();
    loop {
        let (status, headers, body_at) = read_head(&mut stream, &mut received).await;
        if status == 100 {
            received.drain(..body_at);
            stream.write_all(body).await.expect("send the body");
            continue;
        }
        let length = headers
            .get(reqwest::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        while length.is_none_or(|n| received.len() - body_at < n) {
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await.expect("read the answer") {
                0 => break,
                n => received.extend_from_slice(&chunk[..n]),
            }
        }
        let json = serde_json::from_slice(&received[body_at..]).unwrap_or(Value::Null);
        return Answer {
            status,
            headers,
            json,
        };
    }
}

/// Reads until `received` holds a whole response head: its status, headers and where the
/// body starts.
async fn read_head(
    stream: &mut tokio::net::TcpStream,
    received: &mut Vec<u8>,
) -> (u16, reqwest::header::HeaderMap, usize) {
    use tokio::io::AsyncReadExt;

    let end = loop {
        if let Some(at) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await.expect("read the answer");
        assert!(n > 0, "the node closed the connection before answering");
        received.extend_from_slice(&chunk[..n]);
    };
    let text = std::str::from_utf8(&received[..end]).expect("an ASCII head");
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1)?.parse().ok())
        .expect("a status line");
    let mut headers = reqwest::header::HeaderMap::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').expect("a header line");
        headers.append(
            reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()).expect("a header name"),
            value.trim().parse().expect("a header value"),
        );
    }
    (status, headers, end)
}
