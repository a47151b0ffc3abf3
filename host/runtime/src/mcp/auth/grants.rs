//! Where user authorizations are kept: one [`Grant`] per server and principal, behind the
//! [`GrantStore`] trait so a directory, a fleet's store or an embedder's vault can hold
//! them. A grant holds tokens, so every store keeps it from other users (the directory
//! store writes files only its owner can read) and nothing here prints one.
//!
//! rmcp's authorization manager reads and writes tokens through its `CredentialStore`;
//! [`GrantCredentials`] is that view of one grant, and its refresh guard makes refreshes of
//! one grant single-flight within the process.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rmcp::transport::auth::{
    AuthError as RmcpAuthError, CredentialRefreshGuard, CredentialStore, StoredCredentials,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::defaults;

/// Whose authorization for which server.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GrantKey {
    pub server_id: String,
    pub principal: String,
}

impl GrantKey {
    pub fn new(server_id: impl Into<String>, principal: impl Into<String>) -> Self {
        Self {
            server_id: server_id.into(),
            principal: principal.into(),
        }
    }
}

/// The client a server's authorization server knows this host as, once registered.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Registration {
    pub client_id: String,
    /// Issued by dynamic registration to a confidential client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// The authorization server that registered it: a server that moves to another one
    /// gets a new registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
}

/// One principal's authorization of one server: the registration it was made with and the
/// tokens. Its `Debug` shows neither secret nor token.
#[derive(Clone, Serialize, Deserialize)]
pub struct Grant {
    pub server_id: String,
    pub principal: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration: Option<Registration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<StoredCredentials>,
    /// For `dpop = true`: the grant's DPoP private key (base64url PKCS#8, ES256), which
    /// its tokens are bound to; as secret as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpop_key: Option<String>,
    /// The store's version of the grant when it was loaded (etcd's `mod_revision`): a
    /// store shared by a fleet saves it only over that version, so a refresh cannot undo
    /// another node's revocation or update. Not kept in the value.
    #[serde(skip)]
    revision: Option<u64>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("server_id", &self.server_id)
            .field("principal", &self.principal)
            .field(
                "client_id",
                &self.registration.as_ref().map(|r| &r.client_id),
            )
            .field(
                "scopes",
                &self.credentials.as_ref().map(|c| &c.granted_scopes),
            )
            .finish_non_exhaustive()
    }
}

impl Grant {
    fn empty(key: &GrantKey) -> Self {
        Self {
            server_id: key.server_id.clone(),
            principal: key.principal.clone(),
            registration: None,
            credentials: None,
            dpop_key: None,
            revision: None,
        }
    }

    /// The store's version of this grant when it was loaded, if the store keeps one;
    /// `None` for a grant the store did not hold.
    pub fn revision(&self) -> Option<u64> {
        self.revision
    }

    /// Marks a grant a store loaded with the store's version of it (see
    /// [`revision`](Self::revision)).
    pub fn set_revision(&mut self, revision: Option<u64>) {
        self.revision = revision;
    }

    /// Whether it holds tokens (a registration alone authorizes nothing).
    pub fn has_tokens(&self) -> bool {
        self.credentials
            .as_ref()
            .is_some_and(|c| c.token_response.is_some())
    }

    /// What may be shown of it (scopes, expiry, refreshable), never a token; `None`
    /// without tokens.
    pub fn status(&self) -> Option<GrantStatus> {
        use oauth2::TokenResponse;
        let credentials = self.credentials.as_ref()?;
        let tokens = credentials.token_response.as_ref()?;
        let expires_at = credentials
            .token_received_at
            .zip(tokens.expires_in())
            .map(|(at, lifetime)| at.saturating_add(lifetime.as_secs()));
        Some(GrantStatus {
            scopes: credentials.granted_scopes.clone(),
            expires_at,
            refreshable: tokens.refresh_token().is_some(),
        })
    }
}

/// What a grant holds, without its tokens: for a status page or API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GrantStatus {
    /// The scopes granted.
    pub scopes: Vec<String>,
    /// When the access token expires (seconds since the Unix epoch), when the
    /// authorization server said.
    pub expires_at: Option<u64>,
    /// Whether it holds a refresh token, so an expired access token is renewed without a
    /// person.
    pub refreshable: bool,
}

/// A store that could not read or write a grant. Names the place, never a token.
#[derive(Debug, thiserror::Error)]
#[error("grant store: {0}")]
pub struct GrantStoreError(pub String);

/// Keeps grants. Implementations must keep them from anyone but the host (they hold
/// tokens) and may be shared by the hosts of a fleet.
pub trait GrantStore: Send + Sync + 'static {
    fn load(
        &self,
        key: &GrantKey,
    ) -> futures::future::BoxFuture<'_, Result<Option<Grant>, GrantStoreError>>;
    fn save(&self, grant: Grant) -> futures::future::BoxFuture<'_, Result<(), GrantStoreError>>;
    /// Removes a grant; whether there was one.
    fn remove(
        &self,
        key: &GrantKey,
    ) -> futures::future::BoxFuture<'_, Result<bool, GrantStoreError>>;
}

/// Grants in memory, gone when the process ends: the library's default.
#[derive(Default)]
pub struct MemoryGrantStore {
    grants: Mutex<HashMap<GrantKey, Grant>>,
}

impl MemoryGrantStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl GrantStore for MemoryGrantStore {
    fn load(
        &self,
        key: &GrantKey,
    ) -> futures::future::BoxFuture<'_, Result<Option<Grant>, GrantStoreError>> {
        let grant = self
            .grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned();
        Box::pin(async move { Ok(grant) })
    }

    fn save(&self, grant: Grant) -> futures::future::BoxFuture<'_, Result<(), GrantStoreError>> {
        let key = GrantKey::new(&grant.server_id, &grant.principal);
        self.grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, grant);
        Box::pin(async { Ok(()) })
    }

    fn remove(
        &self,
        key: &GrantKey,
    ) -> futures::future::BoxFuture<'_, Result<bool, GrantStoreError>> {
        let removed = self
            .grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
            .is_some();
        Box::pin(async move { Ok(removed) })
    }
}

/// Grants as files under a directory only its owner may enter: `DIR/SERVER/HASH.json`,
/// `HASH` the SHA-256 of the principal (a name may hold any printable character), each
/// written whole (a temporary file renamed) with mode 0600. A file that is a link, too
/// large, or not a grant of its key is refused.
pub struct DirGrantStore {
    dir: PathBuf,
}

pub use crate::registry::REGISTRY_GRANTS_DIR;

impl DirGrantStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The grants of the registry directory `registry`: `registry/.grants/`.
    pub fn in_registry(registry: impl AsRef<Path>) -> Self {
        Self::new(registry.as_ref().join(REGISTRY_GRANTS_DIR))
    }

    /// The directory grants go to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &GrantKey) -> PathBuf {
        let hash = Sha256::digest(key.principal.as_bytes());
        let name: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(&key.server_id).join(format!("{name}.json"))
    }

    fn error(&self, path: &Path, what: &str, e: impl std::fmt::Display) -> GrantStoreError {
        GrantStoreError(format!("{what} {}: {e}", path.display()))
    }

    fn read(&self, key: &GrantKey) -> Result<Option<Grant>, GrantStoreError> {
        let path = self.path(key);
        let mut file = match open_no_follow(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.error(&path, "cannot open", e)),
        };
        let mut text = Vec::new();
        (&mut file)
            .take(defaults::GRANT_MAX_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|e| self.error(&path, "cannot read", e))?;
        if text.len() as u64 > defaults::GRANT_MAX_BYTES {
            return Err(self.error(
                &path,
                "refusing",
                format!(
                    "larger than {} bytes; remove it and authorize again",
                    defaults::GRANT_MAX_BYTES
                ),
            ));
        }
        let grant: Grant = crate::json::from_slice(&text).map_err(|e| {
            self.error(
                &path,
                "cannot parse",
                format!("{e}; remove it and authorize again"),
            )
        })?;
        if grant.server_id != key.server_id || grant.principal != key.principal {
            return Err(self.error(&path, "refusing", "it is the grant of another key"));
        }
        Ok(Some(grant))
    }

    fn write(&self, grant: &Grant) -> Result<(), GrantStoreError> {
        let key = GrantKey::new(&grant.server_id, &grant.principal);
        let path = self.path(&key);
        let dir = path.parent().unwrap_or(&self.dir);
        create_private_dir(&self.dir, false).map_err(|e| self.error(&self.dir, "cannot use", e))?;
        // Grants beside a registry kept in git stay out of commits.
        let ignore = self.dir.join(".gitignore");
        if !ignore.exists() {
            let _ = std::fs::write(&ignore, "*\n");
        }
        create_private_dir(dir, true).map_err(|e| self.error(dir, "cannot use", e))?;
        let text = serde_json::to_vec(grant).map_err(|e| self.error(&path, "cannot encode", e))?;
        let mut temp = tempfile_in(dir).map_err(|e| self.error(dir, "cannot write in", e))?;
        temp.1
            .write_all(&text)
            .and_then(|()| temp.1.sync_all())
            .map_err(|e| self.error(&temp.0, "cannot write", e))?;
        std::fs::rename(&temp.0, &path).map_err(|e| {
            let _ = std::fs::remove_file(&temp.0);
            self.error(&path, "cannot replace", e)
        })
    }

    fn delete(&self, key: &GrantKey) -> Result<bool, GrantStoreError> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.error(&path, "cannot remove", e)),
        }
    }
}

impl GrantStore for DirGrantStore {
    fn load(
        &self,
        key: &GrantKey,
    ) -> futures::future::BoxFuture<'_, Result<Option<Grant>, GrantStoreError>> {
        let read = self.read(key);
        Box::pin(async move { read })
    }

    fn save(&self, grant: Grant) -> futures::future::BoxFuture<'_, Result<(), GrantStoreError>> {
        let written = self.write(&grant);
        Box::pin(async move { written })
    }

    fn remove(
        &self,
        key: &GrantKey,
    ) -> futures::future::BoxFuture<'_, Result<bool, GrantStoreError>> {
        let removed = self.delete(key);
        Box::pin(async move { removed })
    }
}

#[cfg(unix)]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

#[cfg(not(unix))]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

/// Creates `dir` (mode 0700) if need be and checks it: one that already exists must be
/// this user's (or root's) and writable by no one else; with `closed`, also closed to
/// others (the per-server directories, which name principals by hash).
fn create_private_dir(dir: &Path, closed: bool) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other("not a directory"));
    }
    // One made by someone else, or open to others, could hold grants planted for a
    // principal or show who authorized what.
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        let open_to = if closed { 0o077 } else { 0o022 };
        if (meta.uid() != me && meta.uid() != 0) || meta.mode() & open_to != 0 {
            return Err(std::io::Error::other(format!(
                "owned by uid {} with mode {:o}; it must be this user's (uid {me}) and {}: chown it and chmod 700 it, or remove it",
                meta.uid(),
                meta.mode() & 0o777,
                if closed {
                    "closed to others"
                } else {
                    "writable by no one else"
                },
            )));
        }
    }
    Ok(())
}

/// A new file only its owner may read, next to where it will be renamed to.
fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    for attempt in 0..16u32 {
        let name = format!(
            ".grant-{}-{}-{attempt}.tmp",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        );
        let path = dir.join(name);
        match options.open(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free temporary name"))
}

/// The host's grant store with a lock per grant, so one grant is refreshed by one call at
/// a time while the others wait for its result.
#[derive(Clone)]
pub(crate) struct Grants {
    pub(crate) store: Arc<dyn GrantStore>,
    locks: Arc<Mutex<HashMap<GrantKey, Arc<tokio::sync::Mutex<()>>>>>,
}

impl std::fmt::Debug for Grants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grants")
    }
}

impl Default for Grants {
    fn default() -> Self {
        Self::new(Arc::new(MemoryGrantStore::new()))
    }
}

impl Grants {
    pub(crate) fn new(store: Arc<dyn GrantStore>) -> Self {
        Self {
            store,
            locks: Arc::default(),
        }
    }

    fn lock_of(&self, key: &GrantKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        // Locks nobody holds are dropped, so the map stays as small as the grants in use.
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        locks.entry(key.clone()).or_default().clone()
    }

    /// Removes the grant of `key` under its refresh lock, so a refresh in flight cannot
    /// write it back after a logout: whether there was one, and what it held if it could
    /// be read (for revoking its tokens at the authorization server). One that cannot be
    /// read (damaged, sealed with another key) is removed all the same.
    pub(crate) async fn take(
        &self,
        key: &GrantKey,
    ) -> Result<(bool, Option<Grant>), GrantStoreError> {
        let _refreshing = self.lock_of(key).lock_owned().await;
        let held = match self.store.load(key).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(server_id = %key.server_id, principal = %key.principal, error = %e, "removing a grant that cannot be read; its tokens are not revoked at the authorization server");
                None
            }
        };
        let removed = self.store.remove(key).await?;
        Ok((removed, held.filter(|_| removed)))
    }

    /// rmcp's view of the grant of `key`.
    pub(crate) fn credentials(&self, key: GrantKey) -> GrantCredentials {
        GrantCredentials {
            grants: self.clone(),
            key,
            refresh: Arc::default(),
        }
    }
}

/// One grant as rmcp's `CredentialStore`: tokens go into the grant, beside its
/// registration.
pub(crate) struct GrantCredentials {
    grants: Grants,
    key: GrantKey,
    refresh: Arc<Mutex<Refresh>>,
}

/// Where a refresh is: rmcp takes the refresh guard, loads the grant, asks the
/// authorization server (which takes a while) and saves. The save must find the grant the
/// load found: another node may have revoked or refreshed it meanwhile.
#[derive(Default)]
enum Refresh {
    #[default]
    Idle,
    Guarded,
    /// The load inside the guard found the grant at this revision.
    Loaded(Option<u64>),
}

/// Ends the refresh state with the refresh guard.
struct RefreshGuard {
    _lock: tokio::sync::OwnedMutexGuard<()>,
    refresh: Arc<Mutex<Refresh>>,
}

impl Drop for RefreshGuard {
    fn drop(&mut self) {
        *self.refresh.lock().unwrap_or_else(|e| e.into_inner()) = Refresh::Idle;
    }
}

impl GrantCredentials {
    fn refresh(&self) -> std::sync::MutexGuard<'_, Refresh> {
        self.refresh.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn store_error(e: GrantStoreError) -> RmcpAuthError {
    RmcpAuthError::CredentialStoreError(e.0)
}

#[async_trait::async_trait]
impl CredentialStore for GrantCredentials {
    async fn load(&self) -> Result<Option<StoredCredentials>, RmcpAuthError> {
        let grant = self
            .grants
            .store
            .load(&self.key)
            .await
            .map_err(store_error)?;
        let mut refresh = self.refresh();
        if let (Some(found), Refresh::Guarded) = (&grant, &*refresh) {
            *refresh = Refresh::Loaded(found.revision);
        }
        drop(refresh);
        Ok(grant.and_then(|g| g.credentials))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), RmcpAuthError> {
        let store = &self.grants.store;
        let loaded = store.load(&self.key).await.map_err(store_error)?;
        let refreshed = {
            let mut refresh = self.refresh();
            match *refresh {
                Refresh::Loaded(revision) => {
                    *refresh = Refresh::Guarded;
                    Some(revision)
                }
                _ => None,
            }
        };
        if let Some(revision) = refreshed
            && loaded.as_ref().is_none_or(|g| g.revision != revision)
        {
            return Err(RmcpAuthError::CredentialStoreError(format!(
                "the grant of `{}` for `{}` changed while its tokens were refreshed (another node revoked, refreshed or re-authorized it); the next call reads it again",
                self.key.server_id, self.key.principal
            )));
        }
        let mut grant = loaded.unwrap_or_else(|| Grant::empty(&self.key));
        grant.credentials = Some(credentials);
        store.save(grant).await.map_err(store_error)
    }

    async fn clear(&self) -> Result<(), RmcpAuthError> {
        self.grants
            .store
            .remove(&self.key)
            .await
            .map(drop)
            .map_err(store_error)
    }

    async fn acquire_refresh_guard(&self) -> Result<Option<CredentialRefreshGuard>, RmcpAuthError> {
        let lock = self.grants.lock_of(&self.key).lock_owned().await;
        *self.refresh() = Refresh::Guarded;
        Ok(Some(CredentialRefreshGuard::new(RefreshGuard {
            _lock: lock,
            refresh: self.refresh.clone(),
        })))
    }
}

/// The DPoP key of the grant of `key`, made and saved if it has none. Tokens the grant
/// held without a key were not bound to it, so they are dropped with its making.
pub(crate) async fn dpop_key(
    store: &dyn GrantStore,
    key: &GrantKey,
) -> Result<super::dpop::DpopKey, GrantStoreError> {
    let mut grant = store.load(key).await?.unwrap_or_else(|| Grant::empty(key));
    if let Some(stored) = &grant.dpop_key {
        return super::dpop::DpopKey::from_stored(stored)
            .map_err(|e| GrantStoreError(format!("grant of `{}`: {e}", key.server_id)));
    }
    let made = super::dpop::DpopKey::generate().map_err(|e| GrantStoreError(e.to_string()))?;
    grant.dpop_key = Some(made.to_stored());
    grant.credentials = None;
    store.save(grant).await?;
    Ok(made)
}

/// Saves `registration` in the grant of `key`, dropping tokens made by another client.
pub(crate) async fn save_registration(
    store: &dyn GrantStore,
    key: &GrantKey,
    registration: Registration,
) -> Result<(), GrantStoreError> {
    let mut grant = store.load(key).await?.unwrap_or_else(|| Grant::empty(key));
    if grant
        .registration
        .as_ref()
        .is_none_or(|old| old.client_id != registration.client_id)
    {
        grant.credentials = None;
    }
    grant.registration = Some(registration);
    store.save(grant).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials() -> StoredCredentials {
        serde_json::from_value(serde_json::json!({"client_id": "c1", "token_response": null}))
            .unwrap()
    }

    #[tokio::test]
    async fn a_refresh_does_not_write_back_a_grant_revoked_meanwhile() {
        let grants = Grants::default();
        let key = GrantKey::new("gh", "alice");
        let mut held = grant("gh", "alice");
        held.credentials = Some(credentials());
        grants.store.save(held).await.unwrap();
        let rmcp = grants.credentials(key.clone());
        // rmcp's refresh: guard, load, (the authorization server), save.
        let guard = rmcp.acquire_refresh_guard().await.unwrap();
        assert!(rmcp.load().await.unwrap().is_some());
        // Another node revokes meanwhile (not through this node's lock).
        assert!(grants.store.remove(&key).await.unwrap());
        let refused = rmcp.save(credentials()).await.unwrap_err().to_string();
        assert!(
            refused.contains("changed while its tokens were refreshed"),
            "{refused}"
        );
        assert!(grants.store.load(&key).await.unwrap().is_none());
        drop(guard);
        // Outside a refresh (a new authorization) a save makes the grant.
        rmcp.save(credentials()).await.unwrap();
        assert!(grants.store.load(&key).await.unwrap().is_some());
    }

    fn grant(server: &str, principal: &str) -> Grant {
        Grant {
            registration: Some(Registration {
                client_id: "c1".into(),
                client_secret: Some("s3cret".into()),
                issuer: None,
            }),
            ..Grant::empty(&GrantKey::new(server, principal))
        }
    }

    #[tokio::test]
    async fn a_directory_store_keeps_grants_private_and_apart() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirGrantStore::new(dir.path().join("grants"));
        store.save(grant("gh", "alice")).await.unwrap();
        store.save(grant("gh", "../bob\n")).await.unwrap();
        let alice = GrantKey::new("gh", "alice");
        let loaded = store.load(&alice).await.unwrap().unwrap();
        assert_eq!(loaded.principal, "alice");
        assert!(!format!("{loaded:?}").contains("s3cret"));
        let bob = store
            .load(&GrantKey::new("gh", "../bob\n"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(bob.principal, "../bob\n");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let path = store.path(&alice);
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
            let dir_mode = std::fs::metadata(path.parent().unwrap())
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(dir_mode & 0o777, 0o700);
        }
        assert!(store.remove(&alice).await.unwrap());
        assert!(!store.remove(&alice).await.unwrap());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("grants/.gitignore")).unwrap(),
            "*\n"
        );
        // A grant directory others may enter is refused, naming the fix.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let server_dir = store.path(&alice).parent().unwrap().to_owned();
            std::fs::set_permissions(&server_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            let e = store
                .save(grant("gh", "alice"))
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains("chmod 700"), "{e}");
        }
        assert!(store.load(&alice).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_directory_store_refuses_links_giants_and_other_keys_grants() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirGrantStore::new(dir.path());
        let alice = GrantKey::new("gh", "alice");
        store.save(grant("gh", "mallory")).await.unwrap();
        // Mallory's file put where Alice's belongs.
        let mallory = store.path(&GrantKey::new("gh", "mallory"));
        std::fs::rename(&mallory, store.path(&alice)).unwrap();
        let e = store.load(&alice).await.unwrap_err().to_string();
        assert!(e.contains("grant of another key"), "{e}");
        std::fs::write(
            store.path(&alice),
            vec![b' '; defaults::GRANT_MAX_BYTES as usize + 10],
        )
        .unwrap();
        let e = store.load(&alice).await.unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        #[cfg(unix)]
        {
            std::fs::remove_file(store.path(&alice)).unwrap();
            std::os::unix::fs::symlink("/etc/passwd", store.path(&alice)).unwrap();
            assert!(store.load(&alice).await.is_err());
        }
    }
}
