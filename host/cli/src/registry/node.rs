//! The node side of a [`Target`](super::Target): the admin API of a running `quiver serve`
//! (`/admin/api/mcp/...`, docs/registry.md "Admin API").
//!
//! A node's answer is untrusted: a body is read up to `CLI_REGISTRY_MAX_BYTES` (the
//! command's `--timeout` bounds the time), and an error answer is shown as the node's
//! `{"error": {code, message, field}}`, cut and made printable. The admin token goes into
//! the `Authorization` header only; a URL carrying credentials is refused, so no message
//! can show one.

use futures::StreamExt;
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use quiver::text::printable;

use crate::defaults;
use quiver::registry::{Change, DocChange, DocFormat, DocKind, StoredDoc};

use super::{Bundle, Listed, Record, Written};

/// Why the node gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum NodeError {
    /// The URL is not repeated: it may hold credentials.
    #[error("--node: {0}")]
    Url(String),
    #[error("cannot build an HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("{endpoint}: cannot reach the node: {reason}")]
    Unreachable {
        endpoint: String,
        reason: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{endpoint}: the answer is over {max} bytes; is this a quiver node?")]
    TooLarge { endpoint: String, max: usize },
    #[error("{endpoint}: HTTP {status} {code}{}: {message}", field_note(.field))]
    Refused {
        endpoint: String,
        status: u16,
        code: String,
        field: Option<String>,
        message: String,
    },
    #[error("{endpoint}: HTTP {status}: {body}")]
    Failed {
        endpoint: String,
        status: u16,
        body: String,
    },
    /// `source` is the JSON error, when the answer did not parse.
    #[error("{endpoint}: not an answer of a quiver node's admin API: {reason}")]
    Unexpected {
        endpoint: String,
        reason: String,
        #[source]
        source: Option<serde_json::Error>,
    },
}

fn field_note(field: &Option<String>) -> String {
    field
        .as_deref()
        .map(|f| format!(" (field `{f}`)"))
        .unwrap_or_default()
}

impl NodeError {
    /// The node refused the record or knows no such name (not: it failed or was not
    /// reached).
    pub(super) fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::Refused {
                status: 404 | 409 | 412 | 422,
                ..
            }
        )
    }

    fn is_not_found(&self) -> bool {
        matches!(self, Self::Refused { status: 404, code, .. } if code == "not_found")
    }
}

/// A node's admin API.
pub(super) struct NodeClient {
    base: String,
    client: reqwest::Client,
    token: String,
}

impl NodeClient {
    pub(super) fn new(
        url: &str,
        token: String,
        timeout: std::time::Duration,
    ) -> Result<Self, NodeError> {
        let bad = NodeError::Url;
        let parsed = Url::parse(url).map_err(|e| bad(format!("not a URL ({e})")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(bad("use an http:// or https:// URL".into()));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(bad(
                "the URL has credentials; pass the admin token with --token-env instead".into(),
            ));
        }
        quiver::ensure_tls_provider();
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(NodeError::Client)?;
        Ok(Self {
            base: url.trim_end_matches('/').to_owned(),
            client,
            token,
        })
    }

    pub(super) fn base(&self) -> &str {
        &self.base
    }

    /// `path` under `/admin/api/mcp/`, answered with a 2xx and `T` as JSON.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<T, NodeError> {
        let url = format!("{}/admin/api/mcp/{path}", self.base);
        let endpoint = format!("{method} {url}");
        let mut request = self.client.request(method, &url).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let unreachable = |error: reqwest::Error| NodeError::Unreachable {
            endpoint: endpoint.clone(),
            reason: describe(&error),
            source: error,
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let max = defaults::CLI_REGISTRY_MAX_BYTES;
        let too_large = || NodeError::TooLarge {
            endpoint: endpoint.clone(),
            max,
        };
        if response.content_length().is_some_and(|n| n > max as u64) {
            return Err(too_large());
        }
        let mut bytes = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(unreachable)?;
            if bytes.len().saturating_add(chunk.len()) > max {
                return Err(too_large());
            }
            bytes.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(refusal(endpoint, status, &bytes));
        }
        quiver::json::from_slice(&bytes).map_err(|e| NodeError::Unexpected {
            endpoint,
            reason: cut(&e.to_string()),
            source: Some(e),
        })
    }

    /// Every server and profile of the node's registry, with the revision (the newer of
    /// the two listings').
    async fn all(&self) -> Result<(u64, Vec<(DocKind, Item)>), NodeError> {
        let servers: Servers = self.call(Method::GET, "servers", None).await?;
        let profiles: Profiles = self.call(Method::GET, "profiles", None).await?;
        let items = servers
            .servers
            .into_iter()
            .map(|s| (DocKind::Server, s))
            .chain(profiles.profiles.into_iter().map(|p| (DocKind::Profile, p)))
            .collect();
        Ok((servers.revision.max(profiles.revision), items))
    }

    pub(super) async fn list(&self) -> Result<Listed, NodeError> {
        let (revision, items) = self.all().await?;
        let records = items
            .into_iter()
            .map(|(kind, item)| Record {
                kind,
                name: item.name,
                format: item.format,
                revision: item.revision,
                updated_at: item.updated_at,
                state: item.state,
                tool_count: item.tool_count,
            })
            .collect();
        Ok(Listed { revision, records })
    }

    pub(super) async fn docs(&self) -> Result<Vec<StoredDoc>, NodeError> {
        let (_, items) = self.all().await?;
        Ok(items
            .into_iter()
            .map(|(kind, item)| item.into_doc(kind))
            .collect())
    }

    /// `name` must be a valid name (it goes into the path as is).
    pub(super) async fn get(
        &self,
        kind: DocKind,
        name: &str,
    ) -> Result<Option<StoredDoc>, NodeError> {
        match self
            .call::<Item>(Method::GET, &format!("{}/{name}", plural(kind)), None)
            .await
        {
            Ok(item) => Ok(Some(item.into_doc(kind))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `POST servers/import`: the node validates the whole file and writes it (servers
    /// first), or with `dry_run` only says what would change.
    pub(super) async fn put(&self, bundle: &Bundle, dry_run: bool) -> Result<Written, NodeError> {
        let path = if dry_run {
            "servers/import?dry_run=true"
        } else {
            "servers/import"
        };
        let body = json!({"format": bundle.format, "body": bundle.text});
        let imported: Imported = self.call(Method::POST, path, Some(body)).await?;
        if imported.dry_run != dry_run {
            return Err(NodeError::Unexpected {
                endpoint: format!("POST {}/admin/api/mcp/{path}", self.base),
                reason: format!("asked for dry_run={dry_run}, answered {}", imported.dry_run),
                source: None,
            });
        }
        Ok(Written {
            revision: imported.revision,
            changes: imported
                .changes
                .into_iter()
                .map(|c| DocChange {
                    kind: c.kind,
                    name: c.name,
                    change: c.change.into(),
                })
                .collect(),
        })
    }

    /// `name` must be a valid name. `None` when the node has no such record.
    pub(super) async fn delete(&self, kind: DocKind, name: &str) -> Result<Option<u64>, NodeError> {
        match self
            .call::<Revision>(Method::DELETE, &format!("{}/{name}", plural(kind)), None)
            .await
        {
            Ok(written) => Ok(Some(written.revision)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn plural(kind: DocKind) -> &'static str {
    match kind {
        DocKind::Server => "servers",
        DocKind::Profile => "profiles",
    }
}

/// A non-2xx answer: the node's JSON error if it is one, else the body's start.
fn refusal(endpoint: String, status: StatusCode, body: &[u8]) -> NodeError {
    #[derive(Deserialize)]
    struct Answer {
        error: Error,
    }
    #[derive(Deserialize)]
    struct Error {
        code: String,
        message: String,
        field: Option<String>,
    }
    match serde_json::from_slice::<Answer>(body) {
        Ok(Answer { error }) => NodeError::Refused {
            endpoint,
            status: status.as_u16(),
            code: cut(&error.code),
            field: error.field.as_deref().map(cut),
            message: cut(&error.message),
        },
        Err(_) => NodeError::Failed {
            endpoint,
            status: status.as_u16(),
            body: cut(&String::from_utf8_lossy(body)),
        },
    }
}

/// `text` cut to `CLI_NODE_MAX_ERROR_CHARS` and made printable.
fn cut(text: &str) -> String {
    let text: String = text
        .chars()
        .take(defaults::CLI_NODE_MAX_ERROR_CHARS)
        .collect();
    printable(&text)
}

/// A transport error with its causes (reqwest's own message says little), or that the
/// node did not answer in time.
fn describe(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return "no answer in time; raise --timeout if it is just slow".into();
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    cut(&text)
}

#[derive(Deserialize)]
struct Servers {
    revision: u64,
    servers: Vec<Item>,
}

#[derive(Deserialize)]
struct Profiles {
    revision: u64,
    profiles: Vec<Item>,
}

/// A server or profile as the admin API shows it (other fields ignored).
#[derive(Deserialize)]
struct Item {
    #[serde(alias = "server_id")]
    name: String,
    format: DocFormat,
    body: String,
    revision: u64,
    #[serde(default)]
    updated_at: Option<u64>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    tool_count: Option<u64>,
}

impl Item {
    fn into_doc(self, kind: DocKind) -> StoredDoc {
        StoredDoc {
            kind,
            name: self.name,
            format: self.format,
            body: self.body.into_bytes(),
            revision: self.revision,
            updated_at: self.updated_at,
        }
    }
}

#[derive(Deserialize)]
struct Revision {
    revision: u64,
}

#[derive(Deserialize)]
struct Imported {
    dry_run: bool,
    revision: u64,
    changes: Vec<ImportChange>,
}

#[derive(Deserialize)]
struct ImportChange {
    kind: DocKind,
    name: String,
    change: ChangeName,
}

/// An import never removes, so `remove` is not an answer.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum ChangeName {
    Add,
    Update,
    Unchanged,
}

impl From<ChangeName> for Change {
    fn from(change: ChangeName) -> Self {
        match change {
            ChangeName::Add => Self::Add,
            ChangeName::Update => Self::Update,
            ChangeName::Unchanged => Self::Unchanged,
        }
    }
}
