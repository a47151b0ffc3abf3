//! How a node reaches its etcd: `[etcd]` of `quiver.toml` as written ([`EtcdConfig`]) and
//! resolved ([`EtcdAccess`]): TLS (a CA, optionally a client certificate for mutual TLS),
//! an etcd user whose password comes from an environment variable, and whether an
//! endpoint off loopback may go without them.
//!
//! Whoever can write the registry runs commands on every node of the fleet, so a node
//! refuses an etcd endpoint that is not loopback unless the connection is both encrypted
//! (TLS) and authenticated (a user or a client certificate), or the operator wrote
//! `allow_insecure = true`. The password never leaves [`EtcdAccess`]: it is not in its
//! `Debug`, in an error or in the store's description.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use etcd_client::{Certificate, Identity, TlsOptions};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use quiver::config::ConfigError;

use crate::defaults;

/// `[etcd]` in `quiver.toml`: how the node connects to an `--registry etcd://...` store.
/// Relative file paths are relative to the directory of `quiver.toml`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// PEM file of the CA that signed etcd's certificate; setting it turns TLS on.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with `key_file`; needs `ca_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// etcd user the node logs in as (with `password_env`).
    pub username: Option<String>,
    /// Name of the environment variable holding that user's password (never the password).
    pub password_env: Option<String>,
    /// Accept an endpoint off loopback without TLS or without authentication. Anyone who
    /// reaches such an etcd can make every node run what they write; leave it off.
    #[serde(default)]
    pub allow_insecure: bool,
    /// Name of the environment variable holding the key grants of user authorization are
    /// sealed with in etcd (32 bytes as 64 hex digits); required when a `[auth.NAME]` has
    /// `kind = "oauth_authorization_code"` and the registry is in etcd.
    pub grant_key_env: Option<String>,
}

impl EtcdConfig {
    /// The settings resolved: the PEM files read and checked, the password read from its
    /// variable. Every error names `file`, the field and the fix, never the password.
    pub fn resolve(&self, file: &Path) -> Result<EtcdAccess, ConfigError> {
        let err = |field: &str, message: String| ConfigError::new(file, field, message);
        let base = file.parent().unwrap_or(Path::new("."));
        let read = |field: &str, path: &Path| -> Result<Vec<u8>, ConfigError> {
            let path = base.join(path);
            let max = defaults::ETCD_MAX_PEM_BYTES;
            let bytes = read_bounded(&path, max).map_err(|e| {
                err(
                    field,
                    format!("cannot read {}: {e}; name a PEM file", path.display()),
                )
            })?;
            Ok(bytes)
        };
        let tls = match (&self.ca_file, &self.cert_file, &self.key_file) {
            (None, None, None) => None,
            (None, _, _) => {
                return Err(err(
                    "etcd.ca_file",
                    "is needed with `cert_file`/`key_file`: name the CA that signed etcd's \
                     certificate (a client certificate only goes over TLS)"
                        .into(),
                ));
            }
            (Some(_), Some(_), None) | (Some(_), None, Some(_)) => {
                return Err(err(
                    "etcd.cert_file",
                    "and `etcd.key_file` go together: give both for mutual TLS, or neither".into(),
                ));
            }
            (Some(ca), cert, key) => {
                let ca = read("etcd.ca_file", ca)?;
                if CertificateDer::pem_slice_iter(&ca)
                    .next()
                    .is_none_or(|c| c.is_err())
                {
                    return Err(err(
                        "etcd.ca_file",
                        "holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)".into(),
                    ));
                }
                let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
                if let (Some(cert), Some(key)) = (cert, key) {
                    let cert = read("etcd.cert_file", cert)?;
                    if CertificateDer::pem_slice_iter(&cert)
                        .next()
                        .is_none_or(|c| c.is_err())
                    {
                        return Err(err(
                            "etcd.cert_file",
                            "holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)".into(),
                        ));
                    }
                    let key = read("etcd.key_file", key)?;
                    // The parse error is not shown: it could quote the key.
                    if PrivateKeyDer::from_pem_slice(&key).is_err() {
                        return Err(err(
                            "etcd.key_file",
                            "holds no PEM private key (`-----BEGIN PRIVATE KEY-----`)".into(),
                        ));
                    }
                    tls = tls.identity(Identity::from_pem(cert, key));
                }
                Some(tls)
            }
        };
        let user = match (&self.username, &self.password_env) {
            (None, None) => None,
            (Some(name), Some(var)) => {
                if name.trim().is_empty() || name.len() > 256 {
                    return Err(err(
                        "etcd.username",
                        "must be the etcd user's name (1 to 256 bytes)".into(),
                    ));
                }
                let password = std::env::var(var)
                    .ok()
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| {
                        err(
                            "etcd.password_env",
                            format!(
                                "the environment variable `{var}` is unset or empty; set it \
                                 to the password of etcd user `{name}`"
                            ),
                        )
                    })?;
                Some((name.clone(), Password(password)))
            }
            (Some(_), None) => {
                return Err(err(
                    "etcd.password_env",
                    "is needed with `username`: name the environment variable holding the \
                     password (the password itself never goes in the file)"
                        .into(),
                ));
            }
            (None, Some(_)) => {
                return Err(err(
                    "etcd.username",
                    "is needed with `password_env`: name the etcd user".into(),
                ));
            }
        };
        Ok(EtcdAccess {
            client_cert: self.cert_file.is_some(),
            tls,
            user,
            allow_insecure: self.allow_insecure,
        })
    }
}

/// `[etcd]` resolved: what [`EtcdStore::connect_with_access`](crate::EtcdStore) uses. The
/// default is plaintext, no user, and refuses endpoints off loopback.
#[derive(Clone, Default)]
pub struct EtcdAccess {
    pub(crate) tls: Option<TlsOptions>,
    /// Whether `tls` carries a client certificate (which etcd can take as the user).
    pub(crate) client_cert: bool,
    pub(crate) user: Option<(String, Password)>,
    pub(crate) allow_insecure: bool,
}

impl fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("tls", &self.tls.is_some())
            .field("client_cert", &self.client_cert)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("allow_insecure", &self.allow_insecure)
            .finish()
    }
}

impl EtcdAccess {
    /// Why `endpoint` (`HOST:PORT`) may not be used with these settings, if it may not:
    /// off loopback it needs TLS and a user or client certificate, or `allow_insecure`.
    pub(crate) fn refusal(&self, endpoint: &str) -> Option<String> {
        if self.allow_insecure || is_loopback(endpoint) {
            return None;
        }
        let missing = match (self.tls.is_some(), self.user.is_some() || self.client_cert) {
            (true, true) => return None,
            (false, true) => "plaintext (no `etcd.ca_file`)",
            (true, false) => {
                "unauthenticated (no `etcd.username`/`password_env` or client certificate)"
            }
            (false, false) => "plaintext and unauthenticated",
        };
        Some(format!(
            "etcd endpoint `{endpoint}` is not loopback and the connection would be \
             {missing}: whoever reaches it could write records every node runs. Set \
             `[etcd] ca_file` and `username`/`password_env` (or `cert_file`/`key_file`), \
             or `[etcd] allow_insecure = true` to accept that risk"
        ))
    }
}

/// An etcd password: never printed.
#[derive(Clone)]
pub(crate) struct Password(pub(crate) String);

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

/// Whether `endpoint` (`HOST:PORT`, `[V6]:PORT`, maybe with a scheme) is a loopback
/// address or `localhost`. A name that merely resolves to loopback does not count: DNS
/// can change under the node.
fn is_loopback(endpoint: &str) -> bool {
    let rest = endpoint
        .trim_start_matches("http://")
        .trim_start_matches("https://");
    let host = rest.rsplit_once(':').map_or(rest, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The file at `path`, refused when larger than `max` bytes.
fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "larger than {max} bytes, too large for a PEM file"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_told_apart_from_the_rest() {
        for yes in [
            "127.0.0.1:2379",
            "http://localhost:2379",
            "[::1]:2379",
            "127.8.0.1:1",
        ] {
            assert!(is_loopback(yes), "{yes}");
        }
        for no in [
            "10.0.0.1:2379",
            "etcd.internal:2379",
            "[::ffff:10.0.0.1]:1",
            "0.0.0.0:2379",
        ] {
            assert!(!is_loopback(no), "{no}");
        }
    }

    #[test]
    fn off_loopback_needs_tls_and_a_user_or_the_explicit_opt_in() {
        let plain = EtcdAccess::default();
        assert!(plain.refusal("127.0.0.1:2379").is_none());
        let why = plain.refusal("10.0.0.5:2379").expect("refused");
        assert!(
            why.contains("allow_insecure") && why.contains("plaintext"),
            "{why}"
        );
        let with_user = EtcdAccess {
            user: Some(("quiver".into(), Password("hunter2".into()))),
            ..EtcdAccess::default()
        };
        let why = with_user.refusal("10.0.0.5:2379").expect("refused");
        assert!(
            why.contains("etcd.ca_file") && !why.contains("hunter2"),
            "{why}"
        );
        assert!(!format!("{with_user:?}").contains("hunter2"));
        let tls_only = EtcdAccess {
            tls: Some(TlsOptions::new()),
            ..EtcdAccess::default()
        };
        assert!(
            tls_only
                .refusal("10.0.0.5:2379")
                .unwrap()
                .contains("unauthenticated")
        );
        let both = EtcdAccess {
            tls: Some(TlsOptions::new()),
            ..with_user
        };
        assert!(both.refusal("10.0.0.5:2379").is_none());
        let opted_in = EtcdAccess {
            allow_insecure: true,
            ..EtcdAccess::default()
        };
        assert!(opted_in.refusal("10.0.0.5:2379").is_none());
    }

    #[test]
    fn the_etcd_table_names_its_fields_and_never_the_password() {
        let file = Path::new("/nonexistent/quiver.toml");
        let typo = toml::from_str::<EtcdConfig>("password = \"x\"").unwrap_err();
        assert!(
            typo.to_string().contains("unknown field `password`"),
            "{typo}"
        );
        let half = EtcdConfig {
            username: Some("quiver".into()),
            ..EtcdConfig::default()
        };
        let err = half.resolve(file).unwrap_err().to_string();
        assert!(err.contains("etcd.password_env"), "{err}");
        let unset = EtcdConfig {
            username: Some("quiver".into()),
            password_env: Some("QUIVER_TEST_SURELY_UNSET_ETCD_PASSWORD".into()),
            ..EtcdConfig::default()
        };
        let err = unset.resolve(file).unwrap_err().to_string();
        assert!(
            err.contains("QUIVER_TEST_SURELY_UNSET_ETCD_PASSWORD"),
            "{err}"
        );
        let cert_alone = EtcdConfig {
            cert_file: Some("c.pem".into()),
            ..EtcdConfig::default()
        };
        let err = cert_alone.resolve(file).unwrap_err().to_string();
        assert!(err.contains("etcd.ca_file"), "{err}");
        let missing_ca = EtcdConfig {
            ca_file: Some("ca.pem".into()),
            ..EtcdConfig::default()
        };
        let err = missing_ca.resolve(file).unwrap_err().to_string();
        assert!(
            err.contains("etcd.ca_file") && err.contains("/nonexistent/ca.pem"),
            "{err}"
        );
    }
}
