//! `private_key_jwt` client authentication (RFC 7523 §2.2): the client proves who it is
//! with a short-lived JWT signed by its private key instead of sending a secret.
//!
//! Signed with `ring`, which rustls already builds: rmcp's own JWT support pulls in
//! jsonwebtoken with aws-lc-sys, a heavy C build. The key file is read and parsed once,
//! when the host config is loaded, so a bad file fails the host at start with its path
//! and the fix; the key's bytes never reach a log, an error or a guest.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{self, EcdsaKeyPair, RsaKeyPair};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject;
use serde::Deserialize;

use crate::defaults;

/// The JWS algorithm of the client assertion (`signing_alg` in `[auth.NAME]`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub enum SigningAlg {
    /// ECDSA with P-256 and SHA-256.
    #[serde(rename = "ES256")]
    Es256,
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    #[serde(rename = "RS256")]
    Rs256,
}

impl SigningAlg {
    pub(crate) fn name(self) -> &'static str {
        match self {
            SigningAlg::Es256 => "ES256",
            SigningAlg::Rs256 => "RS256",
        }
    }
}

/// A `private_key_file` that cannot be used. It names the file and the fix, never its
/// contents.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyFileError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is larger than {max} bytes; it should hold one PKCS#8 PEM private key", path.display())]
    TooLarge { path: PathBuf, max: u64 },
    #[error(
        "{} holds no PKCS#8 PEM private key (-----BEGIN PRIVATE KEY-----); convert a key with \
         `openssl pkcs8 -topk8 -nocrypt -in KEY.pem -out KEY.p8.pem`", path.display()
    )]
    NotPkcs8 { path: PathBuf },
    #[error("{}: the key is not usable for {alg} ({reason}); ES256 needs an EC P-256 key, RS256 an RSA key of 2048 bits or more", path.display(), alg = alg.name())]
    WrongKey {
        path: PathBuf,
        alg: SigningAlg,
        reason: String,
    },
    #[error(
        "{}: the key is neither EC P-256 (ES256) nor RSA of 2048 bits or more (RS256)",
        path.display()
    )]
    Unsupported { path: PathBuf },
}

/// Signing failed (no randomness, or ring refused); nothing about the key is shown.
#[derive(Debug, thiserror::Error)]
#[error("cannot sign the client assertion")]
pub(crate) struct SignError;

enum KeyPair {
    Ec(EcdsaKeyPair),
    Rsa(RsaKeyPair),
}

/// A client's private key, ready to sign assertions.
pub(crate) struct ClientKey {
    alg: SigningAlg,
    key: KeyPair,
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientKey({}, <redacted>)", self.alg.name())
    }
}

impl ClientKey {
    /// Reads the PKCS#8 PEM key at `path` for `alg` (or, without one, ES256 for an EC
    /// P-256 key and RS256 for an RSA key).
    pub(crate) fn load(path: &Path, alg: Option<SigningAlg>) -> Result<Self, KeyFileError> {
        let read = |source| KeyFileError::Read {
            path: path.to_owned(),
            source,
        };
        let max = defaults::OAUTH_PRIVATE_KEY_MAX_BYTES;
        let mut pem = Vec::new();
        std::fs::File::open(path)
            .map_err(read)?
            .take(max.saturating_add(1))
            .read_to_end(&mut pem)
            .map_err(read)?;
        if pem.len() as u64 > max {
            return Err(KeyFileError::TooLarge {
                path: path.to_owned(),
                max,
            });
        }
        let der = PrivatePkcs8KeyDer::from_pem_slice(&pem).map_err(|_| KeyFileError::NotPkcs8 {
            path: path.to_owned(),
        })?;
        let der = der.secret_pkcs8_der();
        let ec = || {
            EcdsaKeyPair::from_pkcs8(
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                der,
                &SystemRandom::new(),
            )
        };
        let wrong = |alg, reason: ring::error::KeyRejected| KeyFileError::WrongKey {
            path: path.to_owned(),
            alg,
            reason: reason.to_string(),
        };
        let (alg, key) = match alg {
            Some(SigningAlg::Es256) => (
                SigningAlg::Es256,
                KeyPair::Ec(ec().map_err(|e| wrong(SigningAlg::Es256, e))?),
            ),
            Some(SigningAlg::Rs256) => (
                SigningAlg::Rs256,
                KeyPair::Rsa(RsaKeyPair::from_pkcs8(der).map_err(|e| wrong(SigningAlg::Rs256, e))?),
            ),
            None => match (ec(), RsaKeyPair::from_pkcs8(der)) {
                (Ok(key), _) => (SigningAlg::Es256, KeyPair::Ec(key)),
                (_, Ok(key)) => (SigningAlg::Rs256, KeyPair::Rsa(key)),
                _ => {
                    return Err(KeyFileError::Unsupported {
                        path: path.to_owned(),
                    });
                }
            },
        };
        Ok(Self { alg, key })
    }

    pub(crate) fn alg(&self) -> SigningAlg {
        self.alg
    }

    /// A signed client assertion: `iss` = `sub` = `client_id`, `aud` = `audience` (the
    /// authorization server's issuer), `iat` now, `exp` a few minutes later, a random
    /// `jti`.
    pub(crate) fn assertion(&self, client_id: &str, audience: &str) -> Result<String, SignError> {
        let rng = SystemRandom::new();
        let mut jti = [0u8; 16];
        rng.fill(&mut jti).map_err(|_| SignError)?;
        let iat = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let header = serde_json::json!({"alg": self.alg.name(), "typ": "JWT"});
        let claims = serde_json::json!({
            "iss": client_id,
            "sub": client_id,
            "aud": audience,
            "iat": iat,
            "exp": iat.saturating_add(defaults::OAUTH_CLIENT_ASSERTION_LIFETIME.as_secs()),
            "jti": jti.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = match &self.key {
            KeyPair::Ec(key) => key
                .sign(&rng, signing_input.as_bytes())
                .map_err(|_| SignError)?
                .as_ref()
                .to_vec(),
            KeyPair::Rsa(key) => {
                let mut signature = vec![0; key.public().modulus_len()];
                key.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    signing_input.as_bytes(),
                    &mut signature,
                )
                .map_err(|_| SignError)?;
                signature
            }
        };
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature)
        ))
    }
}

#[cfg(test)]
mod tests {
    use ring::signature::{KeyPair as _, UnparsedPublicKey};

    use super::*;

    fn pem(label: &str, der: &[u8]) -> String {
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }

    #[test]
    fn an_es256_assertion_verifies_and_carries_the_claims() {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap();
        let dir = std::env::temp_dir().join(format!("quiver-jwt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key.pem");
        std::fs::write(&path, pem("PRIVATE KEY", pkcs8.as_ref())).unwrap();
        let key = ClientKey::load(&path, None).unwrap();
        assert_eq!(key.alg(), SigningAlg::Es256);
        assert_eq!(format!("{key:?}"), "ClientKey(ES256, <redacted>)");

        let jwt = key.assertion("quiver", "https://as.example").unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let public = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8.as_ref(),
            &rng,
        )
        .unwrap()
        .public_key()
        .as_ref()
        .to_vec();
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, public)
            .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
            .expect("the signature verifies");
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["iss"], "quiver");
        assert_eq!(claims["sub"], "quiver");
        assert_eq!(claims["aud"], "https://as.example");
        let (iat, exp) = (
            claims["iat"].as_u64().unwrap(),
            claims["exp"].as_u64().unwrap(),
        );
        assert_eq!(exp - iat, 300);
        assert_eq!(claims["jti"].as_str().unwrap().len(), 32);
        assert_ne!(
            key.assertion("quiver", "x").unwrap(),
            key.assertion("quiver", "x").unwrap()
        );

        // The same key asked to sign RS256, a SEC1 file and garbage: clear errors, no bytes.
        let wrong = ClientKey::load(&path, Some(SigningAlg::Rs256)).unwrap_err();
        assert!(
            wrong.to_string().contains("not usable for RS256"),
            "{wrong}"
        );
        std::fs::write(&path, pem("EC PRIVATE KEY", pkcs8.as_ref())).unwrap();
        let sec1 = ClientKey::load(&path, None).unwrap_err().to_string();
        assert!(sec1.contains("openssl pkcs8 -topk8"), "{sec1}");
        assert!(!sec1.contains("MI"), "{sec1}");
        std::fs::write(&path, pem("PRIVATE KEY", b"not a key")).unwrap();
        let garbage = ClientKey::load(&path, None).unwrap_err().to_string();
        assert!(garbage.contains("neither EC P-256"), "{garbage}");
        let missing = ClientKey::load(&dir.join("nope.pem"), None).unwrap_err();
        assert!(missing.to_string().contains("cannot read"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
