//! One way to run a test HTTP server (axum) on `127.0.0.1:<random port>` in the background:
//! its own thread and Tokio runtime, so it keeps answering whatever the test's runtime is
//! doing, and a graceful stop when dropped.

use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use tokio::sync::watch;

/// How long in-flight requests may take to finish after the server is dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

thread_local! {
    static SERVER_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is one of these servers' own, so a test that counts the
/// host's allocations can leave the servers' memory out. Allocation-free.
pub fn on_server_thread() -> bool {
    SERVER_THREAD
        .try_with(std::cell::Cell::get)
        .unwrap_or(false)
}

/// A bound listener, before the router exists (so state can know the address).
pub struct Bound {
    listener: std::net::TcpListener,
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    /// Resolves to `true` when the server is being dropped (e.g. to cut long replies short).
    pub stopping: watch::Receiver<bool>,
}

/// A running background server; dropping it stops the server and joins its thread.
pub struct BackgroundServer {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl Bound {
    /// Binds `127.0.0.1:0`.
    pub fn new(what: &str) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("{what}: bind 127.0.0.1:0: {e}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("{what}: set_nonblocking: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("{what}: local_addr: {e}"));
        let (stop, stopping) = watch::channel(false);
        Self {
            listener,
            addr,
            stop,
            stopping,
        }
    }

    /// Serves `router` on a thread named after `what` until the server is dropped.
    pub fn serve(self, what: &str, router: Router) -> BackgroundServer {
        let Bound {
            listener,
            addr,
            stop,
            stopping,
        } = self;
        let name = format!("{what}-{}", addr.port());
        let what = what.to_owned();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                SERVER_THREAD.with(|flag| flag.set(true));
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap_or_else(|e| panic!("{what}: tokio runtime: {e}"));
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .unwrap_or_else(|e| panic!("{what}: listener: {e}"));
                    // Small responses must not wait for delayed ACKs (Nagle): 40 ms per call otherwise.
                    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                    let mut graceful = stopping.clone();
                    let serve = axum::serve(listener, router).with_graceful_shutdown(async move {
                        let _ = graceful.wait_for(|stop| *stop).await;
                    });
                    let mut deadline = stopping;
                    tokio::select! {
                        result = serve => {
                            if let Err(e) = result {
                                eprintln!("{what} on {addr}: server error: {e}");
                            }
                        }
                        _ = async {
                            let _ = deadline.wait_for(|stop| *stop).await;
                            tokio::time::sleep(SHUTDOWN_GRACE).await;
                        } => {}
                    }
                });
                // Dropping the runtime here cancels any connection still open.
            })
            .expect("spawn the server thread");
        BackgroundServer {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl BackgroundServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            // The thread ends within SHUTDOWN_GRACE; a panic there was already printed.
            let _ = thread.join();
        }
    }
}

/// A raw HTTP/1.1 client for the test servers' own unit tests (no HTTP client dependency).
#[cfg(test)]
pub(crate) mod raw_http {
    use std::net::SocketAddr;

    use serde_json::Value;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A minimal HTTP/1.1 exchange: (status, lower-case headers, body).
    pub struct Answer {
        pub status: u16,
        pub headers: Vec<(String, String)>,
        pub body: String,
    }

    impl Answer {
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }

        pub fn json(&self) -> Value {
            serde_json::from_str(&self.body)
                .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
        }
    }

    pub async fn send(
        addr: SocketAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("read");
        let raw = String::from_utf8(raw).expect("utf-8 response");
        let (head, body) = raw.split_once("\r\n\r\n").expect("header/body separator");
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Answer {
            status,
            headers,
            body: body.to_owned(),
        }
    }
}
