//! How a person authorizes an MCP server from the terminal, as a native app does it
//! (RFC 8252): the redirect comes back to a listener on the loopback interface, and the
//! authorization URL is printed for the person (and opened with `--open-with CMD`).
//! `quiver mcp login` / `logout`, and `--open-with` on `quiver mcp call` / `tools` for a
//! server that asks for authorization (or more scopes) in the middle of a command.

use std::sync::Arc;

use axum::extract::State;
use axum::http::Uri;
use axum::routing::get;
use futures::future::BoxFuture;
use quiver::{AuthorizationPrompt, AuthorizeError, UserAuthorizer};
use tokio::sync::{Mutex, mpsc};

use crate::defaults;

/// Listens on `127.0.0.1` for the authorization server's redirect to `/callback`.
pub(crate) struct LoopbackAuthorizer {
    port: u16,
    /// Redirects as they arrive (the full URL); one flow reads them at a time.
    callbacks: Mutex<mpsc::Receiver<String>>,
    /// Run with the URL as its one argument, e.g. `xdg-open`.
    open_with: Option<String>,
}

impl LoopbackAuthorizer {
    /// Binds the listener (a free port) and serves it on the current runtime.
    pub(crate) async fn start(open_with: Option<String>) -> std::io::Result<Arc<Self>> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let (tx, rx) = mpsc::channel(defaults::LOGIN_CALLBACKS_QUEUED);
        let app = axum::Router::new()
            .route("/callback", get(callback))
            .with_state(Arc::new((tx, port)));
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "the login callback listener stopped");
            }
        });
        Ok(Arc::new(Self {
            port,
            callbacks: Mutex::new(rx),
            open_with,
        }))
    }
}

/// The redirect: handed to the waiting flow whole (its query has `code`, `state` and
/// maybe `iss`, or `error`); the browser gets a page saying it may close.
async fn callback(State(state): State<Arc<(mpsc::Sender<String>, u16)>>, uri: Uri) -> &'static str {
    let (tx, port) = &*state;
    let _ = tx.try_send(format!("http://127.0.0.1:{port}{uri}"));
    "Quiver received the authorization. You can close this window."
}

impl UserAuthorizer for LoopbackAuthorizer {
    fn redirect_uri(&self) -> String {
        format!("http://127.0.0.1:{}/callback", self.port)
    }

    fn authorize(
        &self,
        prompt: AuthorizationPrompt,
    ) -> BoxFuture<'_, Result<String, AuthorizeError>> {
        Box::pin(async move {
            let mut callbacks = self.callbacks.lock().await;
            // Redirects of an earlier, abandoned flow are not this one's.
            while callbacks.try_recv().is_ok() {}
            eprintln!(
                "quiver: server `{}` needs `{}` to authorize it; open this URL in a browser:\n  {}",
                prompt.server_id, prompt.principal, prompt.url
            );
            if let Some(command) = &self.open_with {
                open(command, &prompt.url).await?;
            }
            // Only the redirect of this flow (its `state`) ends the wait: anything else on
            // the loopback port (another process, a web page's request) is passed over.
            let state = query_param(&prompt.url, "state");
            let timeout = defaults::LOGIN_TIMEOUT;
            let ours = async {
                while let Some(url) = callbacks.recv().await {
                    if state.is_none() || query_param(&url, "state") == state {
                        return Some(url);
                    }
                    tracing::warn!("ignored a login callback of another flow");
                }
                None
            };
            match tokio::time::timeout(timeout, ours).await {
                Ok(Some(url)) => Ok(url),
                Ok(None) => Err(AuthorizeError("the login callback listener stopped".into())),
                Err(_) => Err(AuthorizeError(format!(
                    "no authorization came back within {} s; run the command again and open the URL it prints",
                    timeout.as_secs()
                ))),
            }
        })
    }
}

/// Runs `command URL` through `sh`, the URL passed as an argument (never spliced into
/// the shell text), and waits for it within the login timeout.
async fn open(command: &str, url: &str) -> Result<(), AuthorizeError> {
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{command} \"$1\""))
        .arg("quiver-open")
        .arg(url)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| AuthorizeError(format!("--open-with: cannot run `{command}`: {e}")))?;
    match tokio::time::timeout(defaults::LOGIN_TIMEOUT, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(AuthorizeError(format!(
            "--open-with: `{command}` exited with {status}"
        ))),
        Ok(Err(e)) => Err(AuthorizeError(format!("--open-with: `{command}`: {e}"))),
        Err(_) => Err(AuthorizeError(format!(
            "--open-with: `{command}` did not exit within {} s",
            defaults::LOGIN_TIMEOUT.as_secs()
        ))),
    }
}

/// The value of `name` in `url`'s query.
fn query_param(url: &str, name: &str) -> Option<String> {
    let url = reqwest::Url::parse(url).ok()?;
    url.query_pairs()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}
