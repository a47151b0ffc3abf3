//! User authorization grants of a fleet on etcd: every node of a fleet on one etcd
//! registry uses, refreshes and revokes the same grants.
//!
//! Layout: `<prefix>-grants/<server_id>/<hash>`, `hash` the first 16 bytes of the
//! SHA-256 of the principal in hex (a principal may hold any printable character), beside
//! the registry's `<prefix>/` so listings and watches of the registry never see them (the
//! etcd user needs readwrite on both prefixes). A grant holds tokens, so its value is
//! sealed with AES-256-GCM ([`ring::aead`]) under a key the operator gives every node
//! (`[etcd] grant_key_env`): `qg1` (the format), a random 96-bit nonce, the ciphertext
//! and its tag. The etcd key is the associated data, so a value copied to another key
//! (another principal's) fails to open. A value too large, not sealed with this key,
//! changed, or not the grant of its key is an error naming the key and the fix, never a
//! panic; nothing here shows a token.
//!
//! A grant is saved only over the `mod_revision` it was loaded at (an etcd transaction;
//! a new one only where the key is absent), so a node's refresh cannot write back a grant
//! another node revoked meanwhile, nor two refreshing nodes lose each other's update: the
//! later save fails, and the next call reads the grant again.

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, KvClient, Txn, TxnOp};
use futures::future::BoxFuture;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};

use quiver::{Grant, GrantKey, GrantStore, GrantStoreError};

use crate::EtcdStore;

/// The format tag every sealed value starts with.
const MAGIC: &[u8] = b"qg1";

/// The AES-256-GCM key grants are sealed with: 32 bytes, given as 64 hex digits
/// (`openssl rand -hex 32`). Its `Debug` shows nothing of it.
pub struct GrantSealKey(LessSafeKey);

impl std::fmt::Debug for GrantSealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrantSealKey(<redacted>)")
    }
}

impl GrantSealKey {
    /// The key of 64 hex digits (surrounding white space dropped); the error says the
    /// rule, never the text.
    pub fn from_hex(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let rule = "expected 32 random bytes as 64 hex digits, e.g. from `openssl rand -hex 32`";
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(rule.to_owned());
        }
        let bytes: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16))
            .collect::<Result<_, _>>()
            .map_err(|_| rule.to_owned())?;
        let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| rule.to_owned())?;
        Ok(Self(LessSafeKey::new(key)))
    }
}

/// Grants in etcd beside an [`EtcdStore`]'s registry, sealed with a [`GrantSealKey`].
pub struct EtcdGrantStore {
    store: EtcdStore,
    kv: KvClient,
    /// `<prefix>-grants`: no trailing slash.
    root: String,
    key: Arc<GrantSealKey>,
    random: SystemRandom,
}

impl EtcdGrantStore {
    /// Grants under `<prefix>-grants/` of `store`'s etcd, over its connection and login.
    pub fn new(store: &EtcdStore, key: GrantSealKey) -> Self {
        Self {
            kv: store.kv.clone(),
            root: format!("{}-grants", store.root),
            store: store.clone(),
            key: Arc::new(key),
            random: SystemRandom::new(),
        }
    }

    fn etcd_key(&self, key: &GrantKey) -> String {
        let hash = Sha256::digest(key.principal.as_bytes());
        let name: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("{}/{}/{name}", self.root, key.server_id)
    }

    fn error(&self, etcd_key: &str, message: impl std::fmt::Display) -> GrantStoreError {
        GrantStoreError(format!("etcd key {etcd_key}: {message}"))
    }

    /// The grant as the value its key holds.
    fn seal(&self, etcd_key: &str, grant: &Grant) -> Result<Vec<u8>, GrantStoreError> {
        let mut data = serde_json::to_vec(grant).map_err(|e| self.error(etcd_key, e))?;
        if data.len() as u64 > quiver::defaults::GRANT_MAX_BYTES {
            return Err(self.error(
                etcd_key,
                format!(
                    "the grant takes {} bytes, more than the {} a grant may",
                    data.len(),
                    quiver::defaults::GRANT_MAX_BYTES
                ),
            ));
        }
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| self.error(etcd_key, "no random bytes for a nonce"))?;
        self.key
            .0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(etcd_key.as_bytes()),
                &mut data,
            )
            .map_err(|_| self.error(etcd_key, "cannot seal the grant"))?;
        let mut value = Vec::with_capacity(MAGIC.len() + NONCE_LEN + data.len());
        value.extend_from_slice(MAGIC);
        value.extend_from_slice(&nonce);
        value.extend_from_slice(&data);
        Ok(value)
    }

    /// The grant a value holds, if it was sealed with this key for this etcd key and is
    /// the grant of `key`.
    fn open(&self, etcd_key: &str, value: &[u8], key: &GrantKey) -> Result<Grant, GrantStoreError> {
        let most = quiver::defaults::GRANT_MAX_BYTES as usize
            + MAGIC.len()
            + NONCE_LEN
            + AES_256_GCM.tag_len();
        if value.len() > most {
            return Err(self.error(
                etcd_key,
                format!(
                    "{} bytes, more than a grant takes; delete the key and authorize again",
                    value.len()
                ),
            ));
        }
        let sealed = value
            .strip_prefix(MAGIC)
            .filter(|rest| rest.len() >= NONCE_LEN + AES_256_GCM.tag_len())
            .ok_or_else(|| {
                self.error(
                    etcd_key,
                    "not a sealed grant; delete the key and authorize again",
                )
            })?;
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| self.error(etcd_key, "a bad nonce"))?;
        let mut data = ciphertext.to_vec();
        let plain = self
            .key
            .0
            .open_in_place(nonce, Aad::from(etcd_key.as_bytes()), &mut data)
            .map_err(|_| {
                self.error(
                    etcd_key,
                    "cannot open the grant with the key in `[etcd] grant_key_env`: it was sealed with another key, for another etcd key, or changed; give every node the same key, or revoke the grant and authorize again",
                )
            })?;
        // Where only: serde's message may quote the value, which holds tokens.
        let grant: Grant = quiver::json::from_slice(plain).map_err(|e| {
            self.error(
                etcd_key,
                format!(
                    "not a grant (at line {}, column {}); revoke it and authorize again",
                    e.line(),
                    e.column()
                ),
            )
        })?;
        if grant.server_id != key.server_id || grant.principal != key.principal {
            return Err(self.error(etcd_key, "it is the grant of another key"));
        }
        Ok(grant)
    }

    async fn load_inner(&self, key: &GrantKey) -> Result<Option<Grant>, GrantStoreError> {
        let etcd_key = self.etcd_key(key);
        let resp = self
            .store
            .call(|| {
                let mut kv = self.kv.clone();
                let etcd_key = etcd_key.clone();
                async move { kv.get(etcd_key, None).await }
            })
            .await
            .map_err(|e| self.error(&etcd_key, e))?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        let mut grant = self.open(&etcd_key, kv.value(), key)?;
        grant.set_revision(u64::try_from(kv.mod_revision()).ok());
        Ok(Some(grant))
    }

    async fn save_inner(&self, grant: Grant) -> Result<(), GrantStoreError> {
        let key = GrantKey::new(&grant.server_id, &grant.principal);
        let etcd_key = self.etcd_key(&key);
        let value = self.seal(&etcd_key, &grant)?;
        // Only over the version it was loaded at (a missing key has mod_revision 0, so a
        // new grant only where there is none): a node that refreshed a grant meanwhile
        // revoked or changed by another must not write it back.
        let expected = grant
            .revision()
            .and_then(|r| i64::try_from(r).ok())
            .unwrap_or(0);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                etcd_key.clone(),
                CompareOp::Equal,
                expected,
            )])
            .and_then([TxnOp::put(etcd_key.clone(), value, None)]);
        let resp = self
            .store
            .call(|| {
                let mut kv = self.kv.clone();
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await
            .map_err(|e| self.error(&etcd_key, e))?;
        if !resp.succeeded() {
            return Err(self.error(
                &etcd_key,
                "the grant changed in etcd since this node read it (another node refreshed, re-authorized or revoked it); it is read again on the next call",
            ));
        }
        Ok(())
    }

    async fn remove_inner(&self, key: &GrantKey) -> Result<bool, GrantStoreError> {
        let etcd_key = self.etcd_key(key);
        let resp = self
            .store
            .call(|| {
                let mut kv = self.kv.clone();
                let etcd_key = etcd_key.clone();
                async move { kv.delete(etcd_key, None).await }
            })
            .await
            .map_err(|e| self.error(&etcd_key, e))?;
        Ok(resp.deleted() > 0)
    }
}

impl GrantStore for EtcdGrantStore {
    fn load(&self, key: &GrantKey) -> BoxFuture<'_, Result<Option<Grant>, GrantStoreError>> {
        let key = key.clone();
        Box::pin(async move { self.load_inner(&key).await })
    }

    fn save(&self, grant: Grant) -> BoxFuture<'_, Result<(), GrantStoreError>> {
        Box::pin(self.save_inner(grant))
    }

    fn remove(&self, key: &GrantKey) -> BoxFuture<'_, Result<bool, GrantStoreError>> {
        let key = key.clone();
        Box::pin(async move { self.remove_inner(&key).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seal_key_is_64_hex_digits_and_never_shown() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let key = GrantSealKey::from_hex(&format!(" {hex}\n")).unwrap();
        assert!(!format!("{key:?}").contains("0011"));
        for bad in [
            "",
            "00",
            &hex[1..],
            &format!("{}zz", &hex[2..]),
            &format!("{hex}00"),
        ] {
            let error = GrantSealKey::from_hex(bad).unwrap_err();
            assert!(error.contains("openssl rand -hex 32"), "{error}");
        }
    }

    fn grant(principal: &str) -> Grant {
        serde_json::from_value(serde_json::json!({
            "server_id": "gh", "principal": principal,
            "registration": {"client_id": "c1", "client_secret": "s3cret-never-shown"}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_sealed_grant_opens_only_with_its_key_at_its_etcd_key() {
        let etcd = EtcdStore::connect(vec!["127.0.0.1:1".into()], "t".into())
            .await
            .unwrap();
        let hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let store = EtcdGrantStore::new(&etcd, GrantSealKey::from_hex(hex).unwrap());
        let (ann, bob) = (GrantKey::new("gh", "ann"), GrantKey::new("gh", "bob"));
        let (at_ann, at_bob) = (store.etcd_key(&ann), store.etcd_key(&bob));
        assert!(at_ann.starts_with("/t-grants/gh/"), "{at_ann}");
        let value = store.seal(&at_ann, &grant("ann")).unwrap();
        assert!(!String::from_utf8_lossy(&value).contains("s3cret"));
        assert_eq!(store.open(&at_ann, &value, &ann).unwrap().principal, "ann");
        // Moved to Bob's key: the associated data differs.
        let moved = store.open(&at_bob, &value, &bob).unwrap_err().to_string();
        assert!(moved.contains("grant_key_env"), "{moved}");
        // Another key.
        let other = EtcdGrantStore::new(
            &etcd,
            GrantSealKey::from_hex(&hex.replace('0', "1")).unwrap(),
        );
        assert!(other.open(&at_ann, &value, &ann).is_err());
        // Changed, cut, foreign or huge values are errors, never panics.
        let mut flipped = value.clone();
        *flipped.last_mut().unwrap() ^= 1;
        for bad in [
            flipped,
            value[..10].to_vec(),
            b"{\"server_id\":\"gh\"}".to_vec(),
            vec![b'q'; 200 * 1024],
            Vec::new(),
        ] {
            assert!(store.open(&at_ann, &bad, &ann).is_err());
        }
        // Sealed right, but another principal's grant under Ann's key.
        let planted = store.seal(&at_ann, &grant("bob")).unwrap();
        let e = store.open(&at_ann, &planted, &ann).unwrap_err().to_string();
        assert!(e.contains("another key"), "{e}");
    }
}
