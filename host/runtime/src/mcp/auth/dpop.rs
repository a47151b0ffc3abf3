//! DPoP (RFC 9449): sender-constrained tokens for `oauth_authorization_code` with
//! `dpop = true`. Each grant (server, principal) has its own ES256 key pair, made by the
//! host with `ring` and kept in the grant beside the tokens bound to it (same store, same
//! protection; revoking the grant drops it). Every token request carries a proof signed
//! with it, and so does every MCP request, which presents the token as
//! `Authorization: DPoP <token>` with the token's hash (`ath`) in the proof.
//!
//! Nonces (RFC 9449 §8, §9): a token endpoint's `use_dpop_nonce` answer and a server's
//! `use_dpop_nonce` challenge give a `DPoP-Nonce`; the request is made once more with it,
//! never more ([`defaults::DPOP_NONCE_RETRIES`]). A nonce is at most
//! [`defaults::DPOP_MAX_NONCE_BYTES`] of visible ASCII; any other is refused.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderName, HeaderValue};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use rmcp::transport::auth::{OAuthHttpClient, OAuthHttpClientFuture, OAuthHttpRequest};
use sha2::{Digest, Sha256};

use crate::defaults;
use crate::mcp::outbound::OutboundClient;

/// The `DPoP` request and `DPoP-Nonce` response headers.
pub(crate) const DPOP: HeaderName = HeaderName::from_static("dpop");
pub(crate) const DPOP_NONCE: HeaderName = HeaderName::from_static("dpop-nonce");

/// A grant's DPoP key pair, with the nonces its servers gave. The private key is never
/// shown: `Debug` prints nothing of it, and only [`DpopKey::pkcs8`] gives it, for the
/// grant store.
pub(crate) struct DpopKey {
    pair: EcdsaKeyPair,
    pkcs8: Vec<u8>,
    /// The public key as a JWK (`kty`, `crv`, `x`, `y`).
    jwk: serde_json::Value,
    /// The last nonce of the authorization server and of the MCP server.
    as_nonce: Mutex<Option<String>>,
    rs_nonce: Mutex<Option<String>>,
}

impl std::fmt::Debug for DpopKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DpopKey(ES256, <redacted>)")
    }
}

/// Making or reading a key failed; nothing of the key is shown.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DpopKeyError {
    #[error("cannot make a DPoP key pair")]
    Generate,
    #[error(
        "the grant's DPoP key is not an ES256 PKCS#8 key; remove the grant and authorize again"
    )]
    Unreadable,
    #[error("cannot sign a DPoP proof")]
    Sign,
}

impl DpopKey {
    /// A new ES256 key pair.
    pub(crate) fn generate() -> Result<Self, DpopKeyError> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| DpopKeyError::Generate)?;
        Self::from_pkcs8(pkcs8.as_ref()).map_err(|_| DpopKeyError::Generate)
    }

    /// The key a grant keeps (base64url of its PKCS#8 document).
    pub(crate) fn from_stored(stored: &str) -> Result<Self, DpopKeyError> {
        let der = URL_SAFE_NO_PAD
            .decode(stored)
            .map_err(|_| DpopKeyError::Unreadable)?;
        Self::from_pkcs8(&der)
    }

    /// What a grant keeps of it.
    pub(crate) fn to_stored(&self) -> String {
        URL_SAFE_NO_PAD.encode(&self.pkcs8)
    }

    fn from_pkcs8(der: &[u8]) -> Result<Self, DpopKeyError> {
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der, &SystemRandom::new())
                .map_err(|_| DpopKeyError::Unreadable)?;
        // An uncompressed P-256 point: 0x04, then x and y (32 bytes each).
        let point = pair.public_key().as_ref();
        if point.len() != 65 || point[0] != 4 {
            return Err(DpopKeyError::Unreadable);
        }
        let jwk = serde_json::json!({
            "kty": "EC",
            "crv": "P-256",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..]),
        });
        Ok(Self {
            pair,
            pkcs8: der.to_vec(),
            jwk,
            as_nonce: Mutex::default(),
            rs_nonce: Mutex::default(),
        })
    }

    /// A proof for `method` `url` (its query and fragment dropped, as `htu` wants), with the
    /// access token's hash when one is presented, and the server's nonce if it gave one.
    pub(crate) fn proof(
        &self,
        method: &str,
        url: &str,
        access_token: Option<&str>,
        nonce: Option<&str>,
    ) -> Result<String, DpopKeyError> {
        let rng = SystemRandom::new();
        let mut jti = [0u8; 16];
        rng.fill(&mut jti).map_err(|_| DpopKeyError::Sign)?;
        let htu = match reqwest::Url::parse(url) {
            Ok(mut url) => {
                url.set_query(None);
                url.set_fragment(None);
                url.to_string()
            }
            Err(_) => url.to_owned(),
        };
        let iat = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let header = serde_json::json!({"typ": "dpop+jwt", "alg": "ES256", "jwk": self.jwk});
        let mut claims = serde_json::json!({
            "jti": URL_SAFE_NO_PAD.encode(jti),
            "htm": method,
            "htu": htu,
            "iat": iat,
        });
        if let Some(token) = access_token {
            claims["ath"] = URL_SAFE_NO_PAD
                .encode(Sha256::digest(token.as_bytes()))
                .into();
        }
        if let Some(nonce) = nonce {
            claims["nonce"] = nonce.into();
        }
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self
            .pair
            .sign(&rng, signing_input.as_bytes())
            .map_err(|_| DpopKeyError::Sign)?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        ))
    }

    /// The MCP server's last nonce.
    pub(crate) fn rs_nonce(&self) -> Option<String> {
        self.rs_nonce
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_rs_nonce(&self, nonce: String) {
        *self.rs_nonce.lock().unwrap_or_else(|e| e.into_inner()) = Some(nonce);
    }

    fn as_nonce(&self) -> Option<String> {
        self.as_nonce
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_as_nonce(&self, nonce: String) {
        *self.as_nonce.lock().unwrap_or_else(|e| e.into_inner()) = Some(nonce);
    }

    /// The headers presenting `token` on a `method` request to `url`.
    pub(crate) fn present(
        &self,
        method: &str,
        url: &str,
        token: &str,
    ) -> Result<[(HeaderName, HeaderValue); 2], DpopKeyError> {
        let nonce = self.rs_nonce();
        let proof = self.proof(method, url, Some(token), nonce.as_deref())?;
        let mut authorization =
            HeaderValue::try_from(format!("DPoP {token}")).map_err(|_| DpopKeyError::Sign)?;
        authorization.set_sensitive(true);
        let proof = HeaderValue::try_from(proof).map_err(|_| DpopKeyError::Sign)?;
        Ok([(http::header::AUTHORIZATION, authorization), (DPOP, proof)])
    }
}

/// A server's `DPoP-Nonce`, if it is one this host will send back: at most
/// [`defaults::DPOP_MAX_NONCE_BYTES`] of visible ASCII (RFC 9449's `NQCHAR`s).
pub(crate) fn nonce_of(headers: &http::HeaderMap) -> Option<String> {
    let nonce = headers.get(DPOP_NONCE)?.to_str().ok()?;
    let usable = !nonce.is_empty()
        && nonce.len() <= defaults::DPOP_MAX_NONCE_BYTES
        && nonce
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
    usable.then(|| nonce.to_owned())
}

/// Whether a challenge or token error asks for a (new) nonce.
pub(crate) fn wants_nonce(text: &str) -> bool {
    text.contains("use_dpop_nonce")
}

/// The OAuth client of a DPoP grant: each POST to the token endpoint carries a proof and is
/// made once more with the nonce a `use_dpop_nonce` answer gives; a token that comes back
/// not DPoP-bound is refused (`dpop = true` asks for sender-constrained tokens only).
pub(crate) struct DpopHttp {
    pub(crate) inner: OutboundClient,
    pub(crate) key: Arc<DpopKey>,
    /// The token endpoint, once discovery found it.
    pub(crate) token_endpoint: Arc<Mutex<Option<String>>>,
}

impl DpopHttp {
    fn is_token_request(&self, request: &OAuthHttpRequest) -> bool {
        if request.request.method() != http::Method::POST {
            return false;
        }
        let endpoint = self
            .token_endpoint
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let uri = request.request.uri().to_string();
        endpoint.is_some_and(|endpoint| uri.split('?').next() == Some(endpoint.as_str()))
    }
}

/// A token endpoint answer as rmcp will read it: an OAuth error for a token that is not
/// DPoP-bound, so the flow fails naming why.
fn refuse_unbound(parts: &http::response::Parts, body: &[u8]) -> Option<http::Response<Vec<u8>>> {
    if !parts.status.is_success() {
        return None;
    }
    let token_type = crate::json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("token_type")?
        .as_str()?
        .to_owned();
    if token_type.eq_ignore_ascii_case("dpop") {
        return None;
    }
    let error = serde_json::json!({
        "error": "invalid_dpop_binding",
        "error_description": "the token endpoint issued a token that is not DPoP-bound, and [auth] dpop = true asks for DPoP-bound tokens only",
    });
    http::Response::builder()
        .status(http::StatusCode::BAD_REQUEST)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&error).ok()?)
        .ok()
}

impl OAuthHttpClient for DpopHttp {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        Box::pin(async move {
            if !self.is_token_request(&request) {
                return self.inner.execute(request).await;
            }
            let timeout = request.timeout;
            let (parts, body) = request.request.into_parts();
            let url = parts.uri.to_string();
            let mut nonce = self.key.as_nonce();
            let mut retries = 0;
            loop {
                let proof = self.key.proof("POST", &url, None, nonce.as_deref())?;
                let mut again = http::Request::from_parts(parts.clone(), body.clone());
                again
                    .headers_mut()
                    .insert(DPOP, HeaderValue::try_from(proof)?);
                let answer = self.inner.execute_http(again, timeout).await?;
                let (answer_parts, answer_body) = answer.into_parts();
                let given = nonce_of(&answer_parts.headers);
                if let Some(given) = &given {
                    self.key.set_as_nonce(given.clone());
                }
                let asks = answer_parts.status == http::StatusCode::BAD_REQUEST
                    && wants_nonce(&String::from_utf8_lossy(&answer_body));
                if asks && retries < defaults::DPOP_NONCE_RETRIES && given.is_some() {
                    retries += 1;
                    nonce = given;
                    continue;
                }
                if let Some(refused) = refuse_unbound(&answer_parts, &answer_body) {
                    return Ok(refused);
                }
                return Ok(http::Response::from_parts(answer_parts, answer_body));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(part: &str) -> serde_json::Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    #[test]
    fn a_proof_names_the_request_and_the_token_and_verifies() {
        let key = DpopKey::generate().unwrap();
        let proof = key
            .proof(
                "POST",
                "https://mcp.example/mcp?x=1#f",
                Some("tok"),
                Some("n1"),
            )
            .unwrap();
        let parts: Vec<&str> = proof.split('.').collect();
        let header = decode(parts[0]);
        assert_eq!(header["typ"], "dpop+jwt");
        assert_eq!(header["alg"], "ES256");
        assert!(header["jwk"].get("d").is_none(), "no private part");
        let claims = decode(parts[1]);
        assert_eq!(claims["htm"], "POST");
        assert_eq!(claims["htu"], "https://mcp.example/mcp");
        assert_eq!(claims["nonce"], "n1");
        assert_eq!(
            claims["ath"],
            URL_SAFE_NO_PAD.encode(Sha256::digest(b"tok")).as_str()
        );
        let other = key
            .proof("POST", "https://mcp.example/mcp", None, None)
            .unwrap();
        assert_ne!(
            decode(other.split('.').nth(1).unwrap())["jti"],
            claims["jti"]
        );
        // The signature verifies with the public key in the header.
        let point = [
            vec![4u8],
            URL_SAFE_NO_PAD
                .decode(header["jwk"]["x"].as_str().unwrap())
                .unwrap(),
            URL_SAFE_NO_PAD
                .decode(header["jwk"]["y"].as_str().unwrap())
                .unwrap(),
        ]
        .concat();
        ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, point)
            .verify(
                format!("{}.{}", parts[0], parts[1]).as_bytes(),
                &URL_SAFE_NO_PAD.decode(parts[2]).unwrap(),
            )
            .unwrap();
        // Kept and read back, it is the same key; never shown.
        let again = DpopKey::from_stored(&key.to_stored()).unwrap();
        assert_eq!(again.jwk, key.jwk);
        assert_eq!(format!("{key:?}"), "DpopKey(ES256, <redacted>)");
        assert!(DpopKey::from_stored("bm90IGEga2V5").is_err());
    }

    #[test]
    fn only_short_visible_nonces_are_sent_back() {
        let with = |value: &[u8]| {
            let mut headers = http::HeaderMap::new();
            headers.insert(DPOP_NONCE, HeaderValue::from_bytes(value).unwrap());
            nonce_of(&headers)
        };
        assert_eq!(with(b"abc-123_~."), Some("abc-123_~.".into()));
        assert_eq!(with(b"a b"), None);
        assert_eq!(with(b"a\"b"), None);
        assert_eq!(with(&vec![b'n'; defaults::DPOP_MAX_NONCE_BYTES + 1]), None);
        assert_eq!(nonce_of(&http::HeaderMap::new()), None);
    }
}
