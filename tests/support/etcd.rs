//! A real single-member etcd for the registry store tests: the `etcd` binary (Debian's
//! `etcd-server`, installed by scripts/setup.sh) on loopback ports, its data in a temporary
//! directory. It can be stopped and started again on the same data and ports, and is
//! killed and reaped on drop. [`Etcd::start_tls`] serves clients over TLS only, requiring a
//! client certificate signed by the test's own CA ([`Pki`], made with rcgen).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
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
    /// With TLS: the PKI's directory, and the plaintext port `/health` is served on.
    tls: Option<(PathBuf, u16)>,
}

/// A test PKI written to a temporary directory as PEM files: `ca.pem` (the CA etcd trusts),
/// `server.pem`/`server-key.pem` (for 127.0.0.1 and localhost), `client.pem`/`client-key.pem`
/// (CN `quiver-node`, signed by the CA), and `other-ca.pem`/`other-client.pem`/
/// `other-client-key.pem`, a CA etcd does not trust and a client certificate it signed.
pub struct Pki {
    dir: TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair,
        };
        let dir = tempfile::tempdir().expect("pki dir");
        let write = |name: &str, pem: String| {
            std::fs::write(dir.path().join(name), pem).expect("write a pem file");
        };
        let new_ca = |name: &str| {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            let key = KeyPair::generate().expect("ca key");
            let cert = params.self_signed(&key).expect("ca cert");
            (cert.pem(), Issuer::new(params, key))
        };
        let leaf = |issuer: &Issuer<'_, KeyPair>,
                    names: &[&str],
                    cn: &str,
                    usage: ExtendedKeyUsagePurpose| {
            let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
            let mut params = CertificateParams::new(names).expect("leaf params");
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().expect("leaf key");
            let cert = params.signed_by(&key, issuer).expect("leaf cert");
            (cert.pem(), key.serialize_pem())
        };
        let (ca_pem, ca) = new_ca("quiver test etcd CA");
        write("ca.pem", ca_pem);
        let (cert, key) = leaf(
            &ca,
            &["127.0.0.1", "localhost"],
            "etcd",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        write("server.pem", cert);
        write("server-key.pem", key);
        let (cert, key) = leaf(&ca, &[], "quiver-node", ExtendedKeyUsagePurpose::ClientAuth);
        write("client.pem", cert);
        write("client-key.pem", key);
        let (other_pem, other) = new_ca("a CA etcd does not trust");
        write("other-ca.pem", other_pem);
        let (cert, key) = leaf(
            &other,
            &[],
            "quiver-node",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        write("other-client.pem", cert);
        write("other-client-key.pem", key);
        Pki { dir }
    }

    /// The directory holding the PEM files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The path of one of the PEM files.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

impl Etcd {
    /// Starts etcd on two free loopback ports and waits until it is healthy. Panics, naming
    /// scripts/setup.sh, when the `etcd` binary is missing: these tests must not pass
    /// silently on a machine without it.
    pub fn start() -> Etcd {
        Self::start_with(None)
    }

    /// As [`start`](Self::start), serving clients over TLS with `pki`'s server certificate
    /// and requiring client certificates signed by its CA (`--client-cert-auth`).
    pub fn start_tls(pki: &Pki) -> Etcd {
        Self::start_with(Some(pki.dir()))
    }

    fn start_with(tls: Option<&Path>) -> Etcd {
        let mut last = String::new();
        // A port picked free can be taken before etcd binds it; pick again a few times.
        for _ in 0..3 {
            let mut etcd = Etcd {
                child: None,
                stderr: Arc::default(),
                data: tempfile::tempdir().expect("etcd data dir"),
                client_port: free_port(),
                peer_port: free_port(),
                tls: tls.map(|dir| (dir.to_owned(), free_port())),
            };
            match etcd.spawn() {
                Ok(()) => return etcd,
                Err(why) => last = why,
            }
        }
        panic!("etcd did not start: {last}");
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS), the client URL.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// `127.0.0.1:PORT`, the client address.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
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
        // SIGSTOP lands as each thread is next scheduled: on a loaded machine a request can
        // still be answered in between, so wait until every thread is stopped.
        let pid = self.child.as_ref().expect("etcd is running").id();
        let stopped = || {
            let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                return false;
            };
            threads.flatten().all(|thread| {
                std::fs::read_to_string(thread.path().join("stat")).is_ok_and(|stat| {
                    // The state follows the parenthesised command name.
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('T'))
                })
            })
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !stopped() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
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
        let mut command = Command::new("etcd");
        let health_port = match &self.tls {
            Some((dir, metrics_port)) => {
                command
                    .arg("--cert-file")
                    .arg(dir.join("server.pem"))
                    .arg("--key-file")
                    .arg(dir.join("server-key.pem"))
                    .arg("--trusted-ca-file")
                    .arg(dir.join("ca.pem"))
                    .arg("--client-cert-auth")
                    // `/health` in plaintext, beside the TLS-only client port.
                    .args([
                        "--listen-metrics-urls",
                        &format!("http://127.0.0.1:{metrics_port}"),
                    ]);
                *metrics_port
            }
            None => self.client_port,
        };
        let mut child = command
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
            if healthy(health_port) {
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
