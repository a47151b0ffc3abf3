//! A real trace backend for the telemetry tests: Arize Phoenix (`phoenix serve`, from PyPI,
//! installed by scripts/setup.sh into `fixtures/phoenix/venv`), on free loopback ports with
//! its SQLite data in a temporary directory; its OTLP/HTTP receiver (`/v1/traces`) and REST
//! API share one port. Killed (its whole process group) and reaped on drop.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::{collect_stderr, workspace};

/// A fresh Phoenix applies its database migrations first: seconds on a loaded machine.
const READY_WITHIN: Duration = Duration::from_secs(120);

pub struct Phoenix {
    child: Child,
    stderr: Arc<Mutex<String>>,
    port: u16,
    _data: TempDir,
}

impl Phoenix {
    /// Starts Phoenix and waits until `/healthz` answers. Panics, naming the fix, when the
    /// venv is missing.
    pub fn start() -> Phoenix {
        let bin = workspace().join("fixtures/phoenix/venv/bin/phoenix");
        assert!(
            bin.exists(),
            "{} is missing: run scripts/setup.sh (it installs arize-phoenix from PyPI)",
            bin.display()
        );
        let data = tempfile::tempdir().expect("phoenix dir");
        let port = free_port();
        let mut child = Command::new(&bin)
            .arg("serve")
            .env("PHOENIX_WORKING_DIR", data.path())
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", free_port().to_string())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("start phoenix");
        let stderr = collect_stderr(&mut child);
        let mut phoenix = Phoenix {
            child,
            stderr,
            port,
            _data: data,
        };
        phoenix.wait_ready();
        phoenix
    }

    fn wait_ready(&mut self) {
        let started = Instant::now();
        while started.elapsed() < READY_WITHIN {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("phoenix exited ({status}):\n{}", self.stderr());
            }
            if self.healthy() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "phoenix did not answer /healthz in {READY_WITHIN:?}:\n{}",
            self.stderr()
        );
    }

    /// `GET /healthz` answers 200 (plain HTTP/1.0 over a socket: the start is blocking).
    fn healthy(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let request = "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        let mut answer = String::new();
        stream.write_all(request.as_bytes()).is_ok()
            && stream.read_to_string(&mut answer).is_ok()
            && answer.starts_with("HTTP/1.1 200")
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What Phoenix logged so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The spans of `trace_id` (32 hex digits) Phoenix has stored, in OTLP JSON shape
    /// (`name`, `span_id`, `parent_span_id`, `attributes` as `{key, value}`), once at least
    /// `at_least` are there and no more arrived for a moment; panics after `within`.
    pub async fn trace(&self, trace_id: &str, at_least: usize, within: Duration) -> Vec<Value> {
        let client = reqwest::Client::new();
        let url = format!(
            "{}/v1/projects/default/spans/otlpv1?trace_id={trace_id}&limit=1000",
            self.base_url()
        );
        let started = Instant::now();
        let mut last = Vec::new();
        loop {
            let spans = match client.get(&url).send().await {
                Ok(response) if response.status().is_success() => response
                    .json::<Value>()
                    .await
                    .ok()
                    .and_then(|body| body["data"].as_array().cloned())
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            if spans.len() >= at_least && spans.len() == last.len() {
                return spans;
            }
            assert!(
                started.elapsed() < within,
                "phoenix holds {} spans of trace {trace_id}, expected at least {at_least}: {last:#?}\n{}",
                spans.len(),
                self.stderr()
            );
            last = spans;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group of our own, not yet reaped child.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// An attribute's value from an OTLP JSON span: the string, integer (as text) or a
/// string array (joined with `,`).
pub fn attribute(span: &Value, key: &str) -> Option<String> {
    let value = span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)?
        .get("value")?;
    if let Some(s) = value["string_value"].as_str() {
        return Some(s.to_owned());
    }
    if let Some(n) = value.get("int_value").filter(|v| !v.is_null()) {
        return Some(n.to_string().trim_matches('"').to_owned());
    }
    if let Some(values) = value["array_value"]["values"].as_array() {
        let items: Vec<&str> = values
            .iter()
            .filter_map(|v| v["string_value"].as_str())
            .collect();
        return Some(items.join(","));
    }
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
