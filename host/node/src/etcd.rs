//! The etcd v3 registry store: the one registry a fleet of nodes shares.
//!
//! Layout: one key per document, `<prefix>/servers/<server_id>` and
//! `<prefix>/profiles/<name>`. A key holds a JSON envelope `{"format":"toml","body":"..."}`
//! so the document's text and format travel together under the name the issue fixes (a
//! key suffix would let one name exist twice, as `.toml` and `.json`). The store revision
//! is etcd's header revision and a document's revision is its `mod_revision`, so a follower
//! lists at one revision and watches from the next one without a gap.
//!
//! Every write puts a guard key, `<prefix>/_meta/guard` (not a document: listings and
//! watches pass over it), in the same transaction, so the guard's `mod_revision` is the
//! revision of the last write. A checked write ([`RegistryStore::apply`]) compares it with
//! the listing its check was made on and makes all its documents in one transaction, so a
//! check and its write cannot be split by another node's write. A writer outside Quiver
//! (`etcdctl put`) does not move the guard and is not caught.
//!
//! etcd is outside the node, so its answers are bounded like any other input: every call
//! has a deadline ([`defaults::ETCD_CALL_TIMEOUT`]) after which it fails as unreachable; a
//! listing is capped in keys and bytes; a value larger than
//! [`quiver::defaults::REGISTRY_STORE_MAX_DOC_BYTES`] is refused. A key under the prefix that is
//! not a document (another name, a bad envelope) is skipped with a warning: in a listing it
//! is absent and a watch reports it as deleted, so both views agree. Endpoints with
//! credentials are refused, so neither [`describe`](RegistryStore::describe) nor an error
//! can show one.
//!
//! TLS, the etcd user and what may go without them come from [`EtcdAccess`] (`[etcd]` of
//! `quiver.toml`): an endpoint off loopback needs TLS and authentication unless the
//! operator allowed otherwise. The store logs in on its first call, not at connect (a node
//! may start while etcd is down), and once more when etcd no longer takes its token
//! (expired, or etcd restarted), retrying that call.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, KvClient, Txn, TxnOp,
    WatchClient, WatchOptions, WatchResponse,
};
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use quiver::Cause;
use quiver::registry::{
    DocFormat, DocKind, Listing, RegistryStore, StoreError, StoreEvent, StoreFuture, StoredDoc,
    Write, is_valid_server_id,
};

use crate::defaults;
use crate::etcd_access::{EtcdAccess, Password};

/// Checks a document before it is written: `(kind, name, format, body)`, an error names the
/// field and the fix. The directory loader's full check plugs in here through
/// [`EtcdStore::connect_with`].
pub type DocValidator =
    Arc<dyn Fn(DocKind, &str, DocFormat, &[u8]) -> Result<(), String> + Send + Sync>;

/// A registry store in etcd v3. Cheap to clone; connections are shared.
#[derive(Clone)]
pub struct EtcdStore {
    pub(crate) kv: KvClient,
    watch: WatchClient,
    /// `/<prefix>`: no trailing slash; document keys go below it.
    pub(crate) root: String,
    /// For messages: endpoints and prefix, never credentials (refused at connect).
    describe: String,
    validate: DocValidator,
    timeout: Duration,
    /// The etcd user, when `[etcd]` names one.
    login: Option<Arc<Login>>,
    /// What to check when a TLS connection fails (TLS hides why behind a closed stream).
    tls_hint: Option<&'static str>,
}

/// The etcd user a store logs in as. Logging in sets the token every client of the
/// connection sends; it happens on first use and again when etcd refuses the token.
struct Login {
    name: String,
    password: Password,
    client: tokio::sync::Mutex<Client>,
    /// Whether the token held is believed good; cleared when etcd refuses it.
    fresh: AtomicBool,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("store", &self.describe)
            .finish_non_exhaustive()
    }
}

/// What a key holds. Read leniently: a key unknown here is ignored, so a record written by
/// a newer node with a new envelope field stays readable on an older one in a rolling
/// upgrade (the document inside is still checked strictly).
#[derive(Serialize, Deserialize)]
struct Envelope {
    format: String,
    body: String,
    /// When the write was made (unix seconds); absent in envelopes written before it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    updated_at: Option<u64>,
}

impl EtcdStore {
    /// A store on `endpoints` (`host:port` or `http://host:port`) under `prefix` (`quiver`
    /// and `/quiver/` are the same), checking documents for syntax and a matching
    /// `server_id` before writing. Does not contact etcd: a node can start while etcd is
    /// down and follow it once it is back.
    pub async fn connect(endpoints: Vec<String>, prefix: String) -> Result<Self, StoreError> {
        Self::connect_with(endpoints, prefix, Arc::new(check_syntax)).await
    }

    /// As [`connect`](Self::connect), over TLS and as the etcd user `access` names
    /// (`[etcd]` of `quiver.toml`, see [`EtcdConfig`](crate::EtcdConfig)). An endpoint
    /// that is not loopback is refused unless `access` has TLS and a user or client
    /// certificate, or allows insecure connections.
    pub async fn connect_with_access(
        endpoints: Vec<String>,
        prefix: String,
        access: &EtcdAccess,
    ) -> Result<Self, StoreError> {
        Self::connect_inner(
            endpoints,
            prefix,
            Arc::new(check_syntax),
            access,
            defaults::ETCD_CALL_TIMEOUT,
        )
        .await
    }

    /// As [`connect`](Self::connect), with `validate` run on every document before it is
    /// written (the registry loader's own checks).
    pub async fn connect_with(
        endpoints: Vec<String>,
        prefix: String,
        validate: DocValidator,
    ) -> Result<Self, StoreError> {
        let access = EtcdAccess::default();
        Self::connect_inner(
            endpoints,
            prefix,
            validate,
            &access,
            defaults::ETCD_CALL_TIMEOUT,
        )
        .await
    }

    async fn connect_inner(
        endpoints: Vec<String>,
        prefix: String,
        validate: DocValidator,
        access: &EtcdAccess,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let trimmed = prefix.trim_matches('/');
        let shown: Vec<&str> = endpoints
            .iter()
            .map(|e| {
                e.trim_start_matches("http://")
                    .trim_start_matches("https://")
            })
            .collect();
        let describe = format!("etcd://{}/{trimmed}", shown.join(","));
        let invalid = |message: String| StoreError::Invalid(format!("{describe}: {message}"));
        if endpoints.is_empty() {
            return Err(invalid(
                "no etcd endpoint given; name at least one HOST:PORT".into(),
            ));
        }
        if endpoints.iter().any(|e| e.contains('@')) {
            // Never echo the endpoint: it may hold the credentials being refused.
            return Err(StoreError::Invalid(
                "etcd endpoint with credentials (`user:password@`) is not supported; \
                 give HOST:PORT only"
                    .into(),
            ));
        }
        if trimmed.is_empty() {
            return Err(invalid(
                "empty key prefix; give one such as `quiver` so the registry does not \
                 share etcd's root with other data"
                    .into(),
            ));
        }
        for endpoint in &endpoints {
            if let Some(why) = access.refusal(endpoint) {
                return Err(invalid(why));
            }
            let scheme_clash = match access.tls {
                Some(_) => endpoint.starts_with("http://").then_some(
                    "is `http://` but `[etcd] ca_file` turns TLS on; give HOST:PORT or https://",
                ),
                None => endpoint.starts_with("https://").then_some(
                    "is `https://`: name the CA that signed etcd's certificate in `[etcd] ca_file`",
                ),
            };
            if let Some(why) = scheme_clash {
                return Err(invalid(format!("endpoint `{endpoint}` {why}")));
            }
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(
                defaults::ETCD_KEEPALIVE_INTERVAL,
                defaults::ETCD_KEEPALIVE_TIMEOUT,
            );
        if let Some(tls) = &access.tls {
            options = options.with_tls(tls.clone());
        }
        // No user in `options`: etcd-client would log in inside `connect`, which a node
        // started while etcd is down cannot do. `Login` does it on the first call.
        let client = tokio::time::timeout(timeout, Client::connect(&endpoints, Some(options)))
            .await
            .map_err(|_| unreachable(&describe, timeout_message(timeout)))?
            .map_err(|e| map_err(&describe, e))?;
        Ok(Self {
            kv: client
                .kv_client()
                .max_decoding_message_size(quiver::defaults::REGISTRY_STORE_MAX_LIST_BYTES),
            watch: client
                .watch_client()
                .max_decoding_message_size(quiver::defaults::REGISTRY_STORE_MAX_LIST_BYTES),
            login: access.user.as_ref().map(|(name, password)| {
                Arc::new(Login {
                    name: name.clone(),
                    password: password.clone(),
                    client: tokio::sync::Mutex::new(client.clone()),
                    fresh: AtomicBool::new(false),
                })
            }),
            tls_hint: access.tls.as_ref().map(|_| {
                if access.client_cert {
                    " (over TLS: check that `[etcd] ca_file` is the CA that signed etcd's \
                     certificate, and that etcd trusts the CA of `[etcd] cert_file`)"
                } else {
                    " (over TLS: check that `[etcd] ca_file` is the CA that signed etcd's \
                     certificate, and set `[etcd] cert_file`/`key_file` if etcd requires \
                     client certificates)"
                }
            }),
            root: format!("/{trimmed}"),
            describe,
            validate,
            timeout,
        })
    }

    /// The same store with another per-call deadline (tests shorten it).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn key(&self, kind: DocKind, name: &str) -> String {
        format!("{}/{}/{name}", self.root, dir_of(kind))
    }

    /// The write guard: every write of this store puts it in the same transaction, so its
    /// `mod_revision` is the revision of the last write, and a checked write compares it
    /// with the listing it was checked against.
    fn guard(&self) -> String {
        format!("{}/_meta/guard", self.root)
    }

    /// The kind and name a key under the prefix stands for, if it is a document key.
    fn parse_key<'k>(&self, key: &'k [u8]) -> Option<(DocKind, &'k str)> {
        let rest = key.strip_prefix(self.root.as_bytes())?.strip_prefix(b"/")?;
        let rest = std::str::from_utf8(rest).ok()?;
        let (dir, name) = rest.split_once('/')?;
        let kind = match dir {
            "servers" => DocKind::Server,
            "profiles" => DocKind::Profile,
            _ => return None,
        };
        is_valid_server_id(name).then_some((kind, name))
    }

    /// A stored key-value as a document; `None` (with a warning) when it is not one.
    fn decode(&self, kv: &KeyValue) -> Result<Option<StoredDoc>, StoreError> {
        let Some((kind, name)) = self.parse_key(kv.key()) else {
            if kv.key() == self.guard().as_bytes() {
                return Ok(None);
            }
            tracing::warn!(store = %self.describe, key = %String::from_utf8_lossy(kv.key()),
                "skipping a key under the registry prefix that is not a document key");
            return Ok(None);
        };
        let revision = revision(&self.describe, kv.mod_revision())?;
        match decode_value(kv.value()) {
            Ok((format, body, updated_at)) => Ok(Some(StoredDoc {
                kind,
                name: name.to_owned(),
                format,
                body,
                revision,
                updated_at,
            })),
            Err(why) => {
                tracing::warn!(store = %self.describe, ?kind, name, "skipping document: {why}");
                Ok(None)
            }
        }
    }

    /// Runs one etcd call under the store's deadline, logged in first when the store has
    /// a user; a call whose token etcd refused is made once more after a new login.
    pub(crate) async fn call<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.log_in().await?;
        match self.deadline(op()).await? {
            Err(e) if is_token_refused(&e) && self.login.is_some() => {
                if let Some(login) = &self.login {
                    login.fresh.store(false, Ordering::Release);
                }
                self.log_in().await?;
                self.deadline(op()).await?.map_err(|e| self.map_err(e))
            }
            answer => answer.map_err(|e| self.map_err(e)),
        }
    }

    /// `fut` under the store's deadline.
    async fn deadline<T>(&self, fut: impl Future<Output = T>) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| unreachable(&self.describe, timeout_message(self.timeout)))
    }

    /// Logs in as the store's etcd user unless a good token is held.
    async fn log_in(&self) -> Result<(), StoreError> {
        let Some(login) = &self.login else {
            return Ok(());
        };
        if login.fresh.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut client = login.client.lock().await;
        if login.fresh.load(Ordering::Acquire) {
            return Ok(());
        }
        let user = Some((login.name.clone(), login.password.0.clone()));
        self.deadline(client.update_user(user))
            .await?
            .map_err(|e| match self.map_err(e) {
                error @ StoreError::Other { .. } => error.map_message(|message| {
                    format!(
                        "cannot log in as etcd user `{}`: {message}",
                        login.name.escape_debug()
                    )
                }),
                other => other,
            })?;
        login.fresh.store(true, Ordering::Release);
        Ok(())
    }

    /// [`map_err`] with the fix for what etcd's access control refused.
    fn map_err(&self, e: etcd_client::Error) -> StoreError {
        let hint = match &e {
            etcd_client::Error::GRpcStatus(status) => match status.code() {
                tonic::Code::PermissionDenied => format!(
                    "; the etcd user needs a role granting readwrite on the keys under `{}/` \
                     (etcdctl role grant-permission ROLE readwrite --prefix=true {}/)",
                    self.root, self.root
                ),
                tonic::Code::InvalidArgument
                    if status.message().contains("authentication failed") =>
                {
                    "; check `[etcd] username` and the password in the variable \
                     `[etcd] password_env` names"
                        .into()
                }
                tonic::Code::InvalidArgument | tonic::Code::Unauthenticated
                    if status.message().contains("user name is empty")
                        || status.message().contains("token") =>
                {
                    "; etcd has authentication on: set `[etcd] username` and `password_env`".into()
                }
                _ => String::new(),
            },
            _ => String::new(),
        };
        match map_err(&self.describe, e) {
            error @ StoreError::Other { .. } => error.map_message(|message| message + &hint),
            error @ StoreError::Unreachable { .. } => {
                error.map_message(|message| message + self.tls_hint.unwrap_or_default())
            }
            other => other,
        }
    }

    async fn list_inner(&self) -> Result<Listing, StoreError> {
        let max = quiver::defaults::REGISTRY_STORE_MAX_DOCS;
        let limit = i64::try_from(max.saturating_add(1)).unwrap_or(i64::MAX);
        let resp = self
            .call(|| {
                let mut kv = self.kv.clone();
                let prefix = format!("{}/", self.root);
                async move {
                    kv.get(
                        prefix,
                        Some(GetOptions::new().with_prefix().with_limit(limit)),
                    )
                    .await
                }
            })
            .await?;
        if resp.more() || resp.kvs().len() > max {
            return Err(self.other(format!(
                "more than {max} keys under the registry prefix; remove unused ones \
                 (the cap keeps a node's snapshot bounded)"
            )));
        }
        let revision = header_revision(&self.describe, resp.header())?;
        let mut docs = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            docs.extend(self.decode(kv)?);
        }
        Ok(Listing { revision, docs })
    }

    async fn get_inner(&self, kind: DocKind, name: &str) -> Result<Option<StoredDoc>, StoreError> {
        if !is_valid_server_id(name) {
            return Ok(None);
        }
        let resp = self
            .call(|| {
                let mut kv = self.kv.clone();
                let key = self.key(kind, name);
                async move { kv.get(key, None).await }
            })
            .await?;
        match resp.kvs().first() {
            Some(kv) => self.decode(kv),
            None => Ok(None),
        }
    }

    /// A document as the value its key holds, after the size, name and validator checks.
    fn encode(
        &self,
        kind: DocKind,
        name: &str,
        format: DocFormat,
        body: Vec<u8>,
    ) -> Result<Vec<u8>, StoreError> {
        check_name(kind, name)?;
        if body.len() > quiver::defaults::REGISTRY_STORE_MAX_DOC_BYTES {
            return Err(StoreError::Invalid(format!(
                "{kind:?} `{name}` is {} bytes, more than the {} a registry document may have",
                body.len(),
                quiver::defaults::REGISTRY_STORE_MAX_DOC_BYTES
            )));
        }
        (self.validate)(kind, name, format, &body).map_err(StoreError::Invalid)?;
        let body = String::from_utf8(body)
            .map_err(|e| StoreError::Invalid(format!("{kind:?} `{name}` is not UTF-8: {e}")))?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        serde_json::to_vec(&Envelope {
            format: format_name(format).to_owned(),
            body,
            updated_at: now.ok().map(|d| d.as_secs()),
        })
        .map_err(|e| self.other(format!("cannot encode the document: {e}")))
    }

    /// `ops` and a put of the guard in one transaction, made only if every compare holds;
    /// whether it was, and the revision etcd answered at.
    async fn txn(
        &self,
        when: Vec<Compare>,
        mut ops: Vec<TxnOp>,
    ) -> Result<(bool, u64), StoreError> {
        ops.push(TxnOp::put(self.guard(), Vec::new(), None));
        let txn = Txn::new().when(when).and_then(ops);
        let resp = self
            .call(|| {
                let mut kv = self.kv.clone();
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await?;
        Ok((
            resp.succeeded(),
            header_revision(&self.describe, resp.header())?,
        ))
    }

    async fn upsert_inner(
        &self,
        kind: DocKind,
        name: &str,
        format: DocFormat,
        body: Vec<u8>,
        expected: Option<u64>,
    ) -> Result<u64, StoreError> {
        let value = self.encode(kind, name, format, body)?;
        let key = self.key(kind, name);
        // A missing key has mod_revision 0, so `expected` 0 means "still absent".
        let when = match expected {
            Some(expected) => vec![Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                self.etcd_revision(expected)?,
            )],
            None => Vec::new(),
        };
        let (succeeded, revision) = self.txn(when, vec![TxnOp::put(key, value, None)]).await?;
        if !succeeded {
            let current = self.get_inner(kind, name).await?.map_or(0, |d| d.revision);
            return Err(StoreError::Conflict {
                kind,
                name: name.to_owned(),
                current,
            });
        }
        Ok(revision)
    }

    async fn delete_inner(&self, kind: DocKind, name: &str) -> Result<Option<u64>, StoreError> {
        if !is_valid_server_id(name) {
            return Ok(None);
        }
        let key = self.key(kind, name);
        // Only while the key exists (version > 0), so a delete of nothing writes nothing.
        let when = vec![Compare::version(key.clone(), CompareOp::Greater, 0)];
        let ops = vec![TxnOp::delete(key, None)];
        let (deleted, revision) = self.txn(when, ops).await?;
        Ok(deleted.then_some(revision))
    }

    async fn apply_inner(&self, writes: Vec<Write>, listed_at: u64) -> Result<u64, StoreError> {
        let max = defaults::ETCD_MAX_TXN_WRITES;
        if writes.len() > max {
            return Err(StoreError::Invalid(format!(
                "{} documents in one write, more than the {max} one etcd transaction takes \
                 (its --max-txn-ops); split it (an import: into bundles of at most {max})",
                writes.len()
            )));
        }
        let mut puts = Vec::new();
        let mut deletes = Vec::new();
        for write in writes {
            match write {
                Write::Put(doc) => {
                    let key = self.key(doc.kind, &doc.name);
                    let value = self.encode(doc.kind, &doc.name, doc.format, doc.body)?;
                    puts.push(TxnOp::put(key, value, None));
                }
                Write::Delete { kind, name } => {
                    check_name(kind, &name)?;
                    deletes.push(TxnOp::delete(self.key(kind, &name), None));
                }
            }
        }
        puts.extend(deletes);
        // The guard moved past the listing iff a write came after it.
        let after = listed_at
            .checked_add(1)
            .ok_or_else(|| self.other(format!("revision {listed_at} is out of etcd's range")))?;
        let when = vec![Compare::mod_revision(
            self.guard(),
            CompareOp::Less,
            self.etcd_revision(after)?,
        )];
        match self.txn(when, puts).await? {
            (true, revision) => Ok(revision),
            (false, _) => Err(StoreError::Changed {
                store: self.describe.clone(),
            }),
        }
    }

    fn etcd_revision(&self, revision: u64) -> Result<i64, StoreError> {
        i64::try_from(revision)
            .map_err(|_| self.other(format!("revision {revision} is out of etcd's range")))
    }

    async fn watch_inner(
        &self,
        since: u64,
    ) -> Result<BoxStream<'static, Result<StoreEvent, StoreError>>, StoreError> {
        let start = since
            .checked_add(1)
            .and_then(|r| i64::try_from(r).ok())
            .ok_or_else(|| self.other(format!("revision {since} is out of etcd's range")))?;
        let stream = self
            .call(|| {
                let mut client = self.watch.clone();
                let prefix = format!("{}/", self.root);
                async move {
                    client
                        .watch(
                            prefix,
                            Some(WatchOptions::new().with_prefix().with_start_revision(start)),
                        )
                        .await
                }
            })
            .await?;
        let store = self.clone();
        // Each etcd answer becomes a batch of events; the first error ends the stream.
        let batches = stream::unfold(Some(stream), move |state| {
            let store = store.clone();
            async move {
                let mut stream = state?;
                match stream.message().await {
                    Ok(Some(resp)) => match store.events(since, &resp) {
                        Ok(events) => Some((events, Some(stream))),
                        Err(e) => Some((vec![Err(e)], None)),
                    },
                    Ok(None) => Some((
                        vec![Err(unreachable(
                            &store.describe,
                            "the watch was closed".into(),
                        ))],
                        None,
                    )),
                    Err(e) => Some((vec![Err(map_watch_err(&store.describe, e))], None)),
                }
            }
        });
        Ok(batches.flat_map(stream::iter).boxed())
    }

    /// The events of one watch answer, or why the watch cannot go on.
    fn events(
        &self,
        since: u64,
        resp: &WatchResponse,
    ) -> Result<Vec<Result<StoreEvent, StoreError>>, StoreError> {
        if resp.compact_revision() > 0 {
            return Err(StoreError::Compacted {
                store: self.describe.clone(),
                revision: since,
            });
        }
        if resp.canceled() {
            return Err(self.other(format!("etcd canceled the watch: {}", resp.cancel_reason())));
        }
        let mut events = Vec::with_capacity(resp.events().len());
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            let Some((kind, name)) = self.parse_key(kv.key()) else {
                continue;
            };
            let revision = revision(&self.describe, kv.mod_revision())?;
            // A deleted key has version 0 (etcd's rule); `Event::event_type` would panic
            // on an event type it does not know, so it is not asked.
            let doc = if kv.version() == 0 {
                None
            } else {
                self.decode(kv)?
            };
            events.push(Ok(match doc {
                Some(doc) => StoreEvent::Put(doc),
                None => StoreEvent::Deleted {
                    kind,
                    name: name.to_owned(),
                    revision,
                },
            }));
        }
        Ok(events)
    }

    fn other(&self, message: String) -> StoreError {
        StoreError::Other {
            store: self.describe.clone(),
            message,
            source: None,
        }
    }
}

impl RegistryStore for EtcdStore {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn list(&self) -> StoreFuture<'_, Listing> {
        let span = tracing::debug_span!("etcd_list", store = %self.describe);
        Box::pin(self.list_inner().instrument(span))
    }

    fn get(&self, kind: DocKind, name: &str) -> StoreFuture<'_, Option<StoredDoc>> {
        let name = name.to_owned();
        let span = tracing::debug_span!("etcd_get", store = %self.describe, ?kind, name);
        Box::pin(async move { self.get_inner(kind, &name).await }.instrument(span))
    }

    fn upsert(
        &self,
        kind: DocKind,
        name: &str,
        format: DocFormat,
        body: Vec<u8>,
    ) -> StoreFuture<'_, u64> {
        let name = name.to_owned();
        let span = tracing::debug_span!("etcd_upsert", store = %self.describe, ?kind, name);
        Box::pin(
            async move { self.upsert_inner(kind, &name, format, body, None).await }
                .instrument(span),
        )
    }

    fn upsert_if(
        &self,
        kind: DocKind,
        name: &str,
        format: DocFormat,
        body: Vec<u8>,
        expected: u64,
    ) -> StoreFuture<'_, u64> {
        let name = name.to_owned();
        let span =
            tracing::debug_span!("etcd_upsert_if", store = %self.describe, ?kind, name, expected);
        Box::pin(
            async move {
                self.upsert_inner(kind, &name, format, body, Some(expected))
                    .await
            }
            .instrument(span),
        )
    }

    fn apply(&self, writes: Vec<Write>, listed_at: u64) -> StoreFuture<'_, u64> {
        let span = tracing::debug_span!("etcd_apply", store = %self.describe, writes = writes.len(), listed_at);
        Box::pin(self.apply_inner(writes, listed_at).instrument(span))
    }

    fn delete(&self, kind: DocKind, name: &str) -> StoreFuture<'_, Option<u64>> {
        let name = name.to_owned();
        let span = tracing::debug_span!("etcd_delete", store = %self.describe, ?kind, name);
        Box::pin(async move { self.delete_inner(kind, &name).await }.instrument(span))
    }

    fn watch(
        &self,
        since: u64,
    ) -> StoreFuture<'_, BoxStream<'static, Result<StoreEvent, StoreError>>> {
        let span = tracing::debug_span!("etcd_watch", store = %self.describe, since);
        Box::pin(self.watch_inner(since).instrument(span))
    }
}

fn dir_of(kind: DocKind) -> &'static str {
    match kind {
        DocKind::Server => "servers",
        DocKind::Profile => "profiles",
    }
}

fn format_name(format: DocFormat) -> &'static str {
    match format {
        DocFormat::Toml => "toml",
        DocFormat::Json => "json",
    }
}

fn check_name(kind: DocKind, name: &str) -> Result<(), StoreError> {
    if is_valid_server_id(name) {
        return Ok(());
    }
    Err(StoreError::Invalid(format!(
        "{kind:?} name `{}` is not valid: use 1 to {} of A-Z, a-z, 0-9, `_` and `-`",
        name.escape_debug(),
        quiver::defaults::MAX_SERVER_ID_BYTES
    )))
}

fn decode_value(value: &[u8]) -> Result<(DocFormat, Vec<u8>, Option<u64>), String> {
    if value.len() > quiver::defaults::REGISTRY_STORE_MAX_DOC_BYTES {
        return Err(format!(
            "value is {} bytes, more than {}",
            value.len(),
            quiver::defaults::REGISTRY_STORE_MAX_DOC_BYTES
        ));
    }
    let envelope: Envelope = serde_json::from_slice(value)
        .map_err(|e| format!("not a `{{\"format\":..,\"body\":..}}` envelope: {e}"))?;
    let format = match envelope.format.as_str() {
        "toml" => DocFormat::Toml,
        "json" => DocFormat::Json,
        _ => return Err("`format` is neither `toml` nor `json`".into()),
    };
    Ok((format, envelope.body.into_bytes(), envelope.updated_at))
}

/// The default check before a write: the text parses in its format and a server record's
/// `server_id` is the name it is stored under.
fn check_syntax(kind: DocKind, name: &str, format: DocFormat, body: &[u8]) -> Result<(), String> {
    let text =
        std::str::from_utf8(body).map_err(|e| format!("{kind:?} `{name}`: not UTF-8: {e}"))?;
    let value: serde_json::Value = match format {
        DocFormat::Toml => quiver::json::from_toml(text)
            .map_err(|e| format!("{kind:?} `{name}`: invalid TOML: {e}"))?,
        DocFormat::Json => quiver::json::from_str(text)
            .map_err(|e| format!("{kind:?} `{name}`: invalid JSON: {e}"))?,
    };
    let Some(table) = value.as_object() else {
        return Err(format!(
            "{kind:?} `{name}`: the document must be a table of fields"
        ));
    };
    if kind == DocKind::Server {
        match table.get("server_id").and_then(|v| v.as_str()) {
            Some(id) if id == name => {}
            Some(id) => {
                return Err(format!(
                    "server `{name}`: field `server_id` is `{}`; it must equal the name the \
                     record is stored under",
                    id.escape_debug()
                ));
            }
            None => return Err(format!("server `{name}`: field `server_id` is missing")),
        }
    }
    Ok(())
}

fn timeout_message(timeout: Duration) -> String {
    format!("no answer within {} ms", timeout.as_millis())
}

fn unreachable(store: &str, message: String) -> StoreError {
    StoreError::Unreachable {
        store: store.to_owned(),
        message,
        source: None,
    }
}

/// [`unreachable`] for a client error: `context`, then `error`, kept as the source.
fn cut_off(
    store: &str,
    context: &str,
    error: impl std::error::Error + Send + Sync + 'static,
) -> StoreError {
    // A transport error's own text is bare ("transport error"); the why (a refused
    // certificate, a reset) is in its sources.
    let mut message = format!("{context}{error}");
    let mut cause = std::error::Error::source(&error);
    while let Some(next) = cause {
        let text = next.to_string();
        if !message.ends_with(&text) {
            message = format!("{message}: {text}");
        }
        cause = next.source();
    }
    StoreError::Unreachable {
        store: store.to_owned(),
        message,
        source: Some(Cause::new(error)),
    }
}

fn revision(store: &str, rev: i64) -> Result<u64, StoreError> {
    u64::try_from(rev).map_err(|_| StoreError::Other {
        store: store.to_owned(),
        message: format!("etcd answered with a negative revision {rev}"),
        source: None,
    })
}

fn header_revision(
    store: &str,
    header: Option<&etcd_client::ResponseHeader>,
) -> Result<u64, StoreError> {
    match header {
        Some(h) => revision(store, h.revision()),
        None => Err(StoreError::Other {
            store: store.to_owned(),
            message: "etcd answered without a response header".into(),
            source: None,
        }),
    }
}

/// Whether etcd refused the call's auth token (expired, or etcd restarted): a new login
/// may fix it.
fn is_token_refused(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::Unauthenticated
            || (s.code() == tonic::Code::InvalidArgument && s.message().contains("auth token")))
}

/// Connection trouble is `Unreachable` (the follower retries and keeps its snapshot);
/// anything etcd itself refused is `Other`.
fn map_err(store: &str, e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::GRpcStatus(status) => match status.code() {
            // tonic reports a connection that broke under a call as `Unknown`.
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                unreachable(store, status.message().to_owned())
            }
            Code::OutOfRange | Code::ResourceExhausted => StoreError::Other {
                store: store.to_owned(),
                message: format!(
                    "etcd's answer is larger than {} bytes; remove unused keys under the \
                     prefix",
                    quiver::defaults::REGISTRY_STORE_MAX_LIST_BYTES
                ),
                source: None,
            },
            code => StoreError::Other {
                store: store.to_owned(),
                message: format!("{code:?}: {}", status.message()),
                source: None,
            },
        },
        E::TransportError(e) => cut_off(store, "", e),
        E::IoError(e) => cut_off(store, "", e),
        other => StoreError::Other {
            store: store.to_owned(),
            message: other.to_string(),
            source: Some(Cause::new(other)),
        },
    }
}

/// A watch that broke mid-stream: anything but a size refusal means the connection went.
fn map_watch_err(store: &str, e: etcd_client::Error) -> StoreError {
    let too_large = matches!(&e, etcd_client::Error::GRpcStatus(s)
        if matches!(s.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted));
    if too_large {
        return map_err(store, e);
    }
    cut_off(store, "the watch broke: ", e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_check_names_the_mismatched_server_id() {
        let err = check_syntax(
            DocKind::Server,
            "alpha",
            DocFormat::Toml,
            b"server_id = \"beta\"\ntransport = \"stdio\"\n",
        )
        .unwrap_err();
        assert!(err.contains("server_id") && err.contains("beta"), "{err}");
        assert!(
            check_syntax(
                DocKind::Server,
                "alpha",
                DocFormat::Json,
                br#"{"server_id":"alpha"}"#
            )
            .is_ok()
        );
        let err = check_syntax(DocKind::Profile, "p", DocFormat::Json, b"{not json").unwrap_err();
        assert!(err.contains("invalid JSON"), "{err}");
    }

    #[test]
    fn envelope_round_trip_and_refusals() {
        let value = serde_json::to_vec(&Envelope {
            format: "json".into(),
            body: "{}".into(),
            updated_at: Some(1_700_000_000),
        })
        .unwrap();
        assert_eq!(
            decode_value(&value).unwrap(),
            (DocFormat::Json, b"{}".to_vec(), Some(1_700_000_000))
        );
        // Written before `updated_at` existed: still read, the time unknown.
        assert_eq!(
            decode_value(br#"{"format":"toml","body":""}"#).unwrap(),
            (DocFormat::Toml, Vec::new(), None)
        );
        assert!(decode_value(br#"{"format":"yaml","body":""}"#).is_err());
        // A field a newer node adds is ignored; the format and body stay required.
        assert_eq!(
            decode_value(br#"{"format":"toml","body":"x","extra":{"a":1}}"#).unwrap(),
            (DocFormat::Toml, b"x".to_vec(), None)
        );
        assert!(decode_value(br#"{"format":"toml"}"#).is_err());
        assert!(decode_value(br#"{"body":""}"#).is_err());
        assert!(decode_value(br#"{"format":"toml","body":3}"#).is_err());
        assert!(decode_value(b"server_id = 'x'").is_err());
        let huge = vec![b' '; quiver::defaults::REGISTRY_STORE_MAX_DOC_BYTES + 1];
        assert!(decode_value(&huge).unwrap_err().contains("bytes"));
    }

    #[tokio::test]
    async fn connect_refuses_credentials_without_echoing_them() {
        let err = EtcdStore::connect(
            vec!["http://root:hunter2@127.0.0.1:2379".into()],
            "quiver".into(),
        )
        .await
        .unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(matches!(err, StoreError::Invalid(_)));
        let err = EtcdStore::connect(vec!["127.0.0.1:2379".into()], "/".into())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("prefix"), "{err}");
    }

    #[tokio::test]
    async fn keys_map_to_documents_and_nothing_else() {
        let store = EtcdStore::connect(vec!["127.0.0.1:1".into()], "/q/".into())
            .await
            .unwrap();
        assert_eq!(store.describe(), "etcd://127.0.0.1:1/q");
        assert_eq!(store.key(DocKind::Server, "a"), "/q/servers/a");
        assert_eq!(
            store.parse_key(b"/q/profiles/p"),
            Some((DocKind::Profile, "p"))
        );
        for key in [
            &b"/q/servers/a/b"[..],
            b"/q/other/a",
            b"/qq/servers/a",
            b"/q/servers/",
        ] {
            assert_eq!(
                store.parse_key(key),
                None,
                "{}",
                String::from_utf8_lossy(key)
            );
        }
    }
}
