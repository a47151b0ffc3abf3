//! A real single-member etcd for the registry store tests: the `etcd` binary (Debian's
//! `etcd-server`, installed by scripts/setup.sh) on loopback ports, its data in a temporary
//! directory. It can be stopped and started again on the same data and ports, and is
//! killed and reaped on drop.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::collect_stderr;

/// How long a fresh etcd gets to answer `/health` on a loaded machine.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A running (or stopped) etcd.
pub struct Etcd {
    child: Option<Child>,
    stderr: Arc<Mutex<String>>,
    data: TempDir,
    client_port: u16,
    peer_port: u16,
}

impl Etcd {
    /// Starts etcd on two free loopback ports and waits until it is healthy. Panics, naming
    /// scripts/setup.sh, when the `etcd` binary is missing: these tests must not pass
    /// silently on a machine without it.
    pub fn start() -> Etcd {
        let mut last = String::new();
        // A port picked free can be taken before etcd binds it; pick again a few times.
        for _ in 0..3 {
            let mut etcd = Etcd {
                child: None,
                stderr: Arc::default(),
                data: tempfile::tempdir().expect("etcd data dir"),
                client_port: free_port(),
                peer_port: free_port(),
            };
            match etcd.spawn() {
                Ok(()) => return etcd,
                Err(why) => last = why,
            }
        }
        panic!("etcd did not start: {last}");
    }

    /// `http://127.0.0.1:PORT`, the client URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Kills etcd and reaps it; the data stays for [`restart`](Self::restart).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes etcd (SIGSTOP): its port stays open and nothing answers, like a hung peer.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a frozen etcd run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let child = self.child.as_ref().expect("etcd is running");
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) on our own, not yet reaped child.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal etcd");
    }

    /// Starts etcd again on the same data directory and ports, and waits until healthy.
    pub fn restart(&mut self) {
        self.stop();
        if let Err(why) = self.spawn() {
            panic!("etcd did not restart: {why}");
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut child = Command::new("etcd")
            .args(["--name", "quiver-test"])
            .arg("--data-dir")
            .arg(self.data.path().join("member"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("quiver-test={peer}")])
            .args([
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
                "--log-level",
                "warn",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    panic!(
                        "the `etcd` binary is not on PATH: run scripts/setup.sh (it installs \
                         the etcd-server package) before the etcd registry store tests"
                    );
                }
                format!("spawn etcd: {e}")
            })?;
        self.stderr = collect_stderr(&mut child);
        self.child = Some(child);
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let stderr = self.stderr();
                self.child = None;
                return Err(format!("etcd exited with {status}; stderr:\n{stderr}"));
            }
            if healthy(self.client_port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let stderr = self.stderr();
        self.stop();
        Err(format!(
            "etcd was not healthy within {READY_WITHIN:?}; stderr:\n{stderr}"
        ))
    }

    /// Everything etcd wrote to stderr since it was last started.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

/// `GET /health` on the client port answers `"health":"true"`.
fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}
