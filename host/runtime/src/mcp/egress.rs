//! Egress policy for remote MCP servers: which `scheme://host:port` the host may reach,
//! checked on the URL and again on every address a name resolves to.
//!
//! Rules follow Spin's grammar: `https://api.example.com`, `https://*.example.com`,
//! `http://localhost:8080`, `*://*:*`. A missing port means the scheme's default (443/80).
//! On top of the rules, loopback, private, link-local (cloud metadata at 169.254.169.254),
//! CGNAT, multicast and unspecified addresses are refused unless an `allow_private` CIDR
//! covers them. The address check runs in the HTTP client's resolver, so a name that
//! resolves to a private address (DNS rebinding) is refused just like the literal address.
//!
//! The URL check runs on every request, not once per server: [`super::outbound`] owns the
//! only HTTP client and checks each URL before it sends.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use serde::Deserialize;

use crate::policy::Pattern;

/// `[egress]` of the host config.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EgressConfig {
    /// `scheme://host[:port]` rules; default: any host on http or https.
    #[serde(default = "default_allow")]
    pub allow: Vec<String>,
    /// CIDRs that may be reached although loopback/private/link-local, e.g. `127.0.0.0/8`.
    #[serde(default)]
    pub allow_private: Vec<String>,
}

fn default_allow() -> Vec<String> {
    vec!["https://*:*".into(), "http://*:*".into()]
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            allow: default_allow(),
            allow_private: Vec::new(),
        }
    }
}

/// An `[egress]` entry of the host config that does not parse. Names the entry as written
/// (rules and CIDRs are not secrets).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EgressRuleError {
    /// An `allow` rule.
    #[error("egress rule {rule:?}: {problem} (expected scheme://host[:port])")]
    Rule { rule: String, problem: RuleProblem },
    /// An `allow_private` entry whose address does not parse.
    #[error("{cidr:?} is not an IP address or CIDR")]
    NotAnAddress {
        cidr: String,
        #[source]
        source: std::net::AddrParseError,
    },
    /// An `allow_private` entry whose prefix length does not parse.
    #[error("{cidr:?}: bad prefix length")]
    BadPrefix {
        cidr: String,
        #[source]
        source: std::num::ParseIntError,
    },
    /// An `allow_private` entry whose prefix is longer than the address.
    #[error("{cidr:?}: prefix longer than {max}")]
    PrefixTooLong { cidr: String, max: u8 },
}

/// What is wrong with an `allow` rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuleProblem {
    #[error("no scheme")]
    NoScheme,
    #[error("paths are not allowed")]
    Path,
    #[error("bad port")]
    BadPort,
    #[error("no port and no default port for this scheme")]
    NoDefaultPort,
    #[error("empty host")]
    EmptyHost,
}

/// Why the policy refuses a destination. It names the scheme, host and port or the
/// address, never a URL's path or query (which may carry session ids or tokens).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EgressDenied {
    #[error("a {scheme} URL without a host is not allowed")]
    NoHost { scheme: String },
    /// No `allow` rule covers `scheme://host:port` (port 0: the scheme has no default).
    #[error("{scheme}://{host}:{port} is not in the egress allowlist ([egress] allow)")]
    NotAllowed {
        scheme: String,
        host: String,
        port: u16,
    },
    /// A loopback/private/link-local/... address no `allow_private` CIDR covers.
    #[error("{ip} is a {kind} address; add it to [egress] allow_private to reach it")]
    SpecialAddress { ip: IpAddr, kind: &'static str },
}

/// The resolver's refusal of a name: every address it resolved to is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EgressResolveError {
    #[error("egress policy refuses {host}: {denied}")]
    Refused {
        host: String,
        #[source]
        denied: EgressDenied,
    },
    #[error("egress policy refuses {host}: no addresses")]
    NoAddresses { host: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    scheme: Option<String>,
    host: Pattern,
    port: Option<u16>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    fn parse(text: &str) -> Result<Self, EgressRuleError> {
        let (addr, prefix) = text.split_once('/').unwrap_or((text, ""));
        let addr: IpAddr = addr
            .parse()
            .map_err(|source| EgressRuleError::NotAnAddress {
                cidr: text.to_owned(),
                source,
            })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if prefix.is_empty() {
            max
        } else {
            prefix
                .parse()
                .map_err(|source| EgressRuleError::BadPrefix {
                    cidr: text.to_owned(),
                    source,
                })?
        };
        if prefix > max {
            return Err(EgressRuleError::PrefixTooLong {
                cidr: text.to_owned(),
                max,
            });
        }
        Ok(Self { addr, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.prefix)
                };
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.prefix)
                };
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// A compiled egress policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressPolicy {
    rules: Vec<Rule>,
    allow_private: Vec<Cidr>,
}

impl Default for EgressPolicy {
    fn default() -> Self {
        Self::from_config(&EgressConfig::default()).expect("the default rules parse")
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    }
}

/// Why an address is special, if it is.
fn special(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => special_v4(v4),
            None => special_v6(v6),
        },
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        Some("link-local (cloud metadata lives here)")
    } else if a == 100 && (64..128).contains(&b) {
        Some("carrier-grade NAT")
    } else if ip.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if ip.is_multicast() || ip.is_broadcast() {
        Some("multicast/broadcast")
    } else {
        None
    }
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if first & 0xfe00 == 0xfc00 {
        Some("private (unique local)")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if ip.is_multicast() {
        Some("multicast")
    } else {
        None
    }
}

impl EgressPolicy {
    pub fn from_config(config: &EgressConfig) -> Result<Self, EgressRuleError> {
        let rules = config
            .allow
            .iter()
            .map(|r| parse_rule(r))
            .collect::<Result<_, _>>()?;
        let allow_private = config
            .allow_private
            .iter()
            .map(|c| Cidr::parse(c))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            rules,
            allow_private,
        })
    }

    /// Checks a URL against the rules, and a literal IP host against the address rules.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), EgressDenied> {
        let scheme = url.scheme();
        let host = url.host_str().ok_or_else(|| EgressDenied::NoHost {
            scheme: scheme.to_owned(),
        })?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = url.port_or_known_default();
        let allowed = self.rules.iter().any(|rule| {
            rule.scheme.as_deref().is_none_or(|s| s == scheme)
                && rule.host.matches(&host.to_ascii_lowercase())
                && rule.port.is_none_or(|p| Some(p) == port)
        });
        if !allowed {
            return Err(EgressDenied::NotAllowed {
                scheme: scheme.to_owned(),
                host: host.to_owned(),
                port: port.unwrap_or(0),
            });
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            self.check_ip(ip)?;
        }
        Ok(())
    }

    /// Refuses loopback/private/link-local/... addresses not covered by `allow_private`.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), EgressDenied> {
        match special(ip) {
            Some(kind) if !self.allow_private.iter().any(|c| c.contains(ip)) => {
                Err(EgressDenied::SpecialAddress { ip, kind })
            }
            _ => Ok(()),
        }
    }
}

fn parse_rule(text: &str) -> Result<Rule, EgressRuleError> {
    let bad = |problem| EgressRuleError::Rule {
        rule: text.to_owned(),
        problem,
    };
    let (scheme, rest) = text
        .split_once("://")
        .ok_or_else(|| bad(RuleProblem::NoScheme))?;
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') {
        return Err(bad(RuleProblem::Path));
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || rest.starts_with('[') => (host, Some(port)),
        _ => (rest, None),
    };
    let scheme = (scheme != "*").then(|| scheme.to_ascii_lowercase());
    let port = match port {
        Some("*") => None,
        Some(p) => Some(p.parse::<u16>().map_err(|_| bad(RuleProblem::BadPort))?),
        None => match &scheme {
            Some(s) => Some(default_port(s).ok_or_else(|| bad(RuleProblem::NoDefaultPort))?),
            None => None,
        },
    };
    if host.is_empty() {
        return Err(bad(RuleProblem::EmptyHost));
    }
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    Ok(Rule {
        scheme,
        host: Pattern::new(host),
        port,
    })
}

/// A DNS resolver that drops every address the policy refuses.
#[derive(Clone)]
pub(crate) struct EgressResolver {
    pub(crate) policy: Arc<EgressPolicy>,
}

impl reqwest::dns::Resolve for EgressResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let allowed = policy.resolve(name.as_str()).await??;
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

impl EgressPolicy {
    /// The addresses of `host` the policy lets a request reach, or the refusal naming the
    /// first address refused (the outer error is the lookup's own). The HTTP client's
    /// resolver and the connect-time check both go through here.
    pub(crate) async fn resolve(
        &self,
        host: &str,
    ) -> std::io::Result<Result<Vec<SocketAddr>, EgressResolveError>> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, 0)).await?.collect();
        let mut refused = Vec::new();
        let allowed: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|addr| match self.check_ip(addr.ip()) {
                Ok(()) => true,
                Err(why) => {
                    refused.push(why);
                    false
                }
            })
            .collect();
        if allowed.is_empty() {
            let host = host.to_owned();
            return Ok(Err(match refused.into_iter().next() {
                Some(denied) => EgressResolveError::Refused { host, denied },
                None => EgressResolveError::NoAddresses { host },
            }));
        }
        Ok(Ok(allowed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], private: &[&str]) -> EgressPolicy {
        EgressPolicy::from_config(&EgressConfig {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            allow_private: private.iter().map(|s| s.to_string()).collect(),
        })
        .unwrap()
    }

    fn url(u: &str) -> reqwest::Url {
        u.parse().unwrap()
    }

    #[test]
    fn rules_match_scheme_host_and_port() {
        let p = policy(
            &[
                "https://*.example.com",
                "http://localhost:8080",
                "*://api.test:*",
            ],
            &["127.0.0.0/8"],
        );
        assert!(p.check_url(&url("https://mcp.example.com/mcp")).is_ok());
        assert!(
            p.check_url(&url("https://example.com/")).is_err(),
            "*.example.com needs a subdomain"
        );
        assert!(
            p.check_url(&url("http://mcp.example.com/")).is_err(),
            "wrong scheme"
        );
        assert!(
            p.check_url(&url("https://mcp.example.com:8443/")).is_err(),
            "default port only"
        );
        assert!(p.check_url(&url("http://localhost:8080/sse")).is_ok());
        assert!(p.check_url(&url("http://localhost:8081/sse")).is_err());
        assert!(p.check_url(&url("ws://api.test:1/")).is_ok());
    }

    #[test]
    fn private_addresses_need_an_explicit_cidr() {
        let p = policy(&["*://*:*"], &[]);
        for denied in [
            "http://169.254.169.254/latest",
            "http://127.0.0.1:9/",
            "http://10.1.2.3/",
            "http://[::1]:80/",
            "http://[fe80::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://0.0.0.0/",
            "http://100.64.0.1/",
        ] {
            assert!(p.check_url(&url(denied)).is_err(), "{denied}");
        }
        assert!(p.check_url(&url("https://93.184.216.34/")).is_ok());
        let loopback = policy(&["*://*:*"], &["127.0.0.0/8", "::1"]);
        assert!(loopback.check_url(&url("http://127.0.0.1:9/")).is_ok());
        assert!(loopback.check_url(&url("http://[::1]:9/")).is_ok());
        assert!(loopback.check_url(&url("http://169.254.169.254/")).is_err());
    }

    #[test]
    fn bad_rules_are_reported() {
        for bad in [
            "example.com",
            "https://x.com/path",
            "gopher://x",
            "https://x.com:port",
        ] {
            assert!(
                EgressPolicy::from_config(&EgressConfig {
                    allow: vec![bad.into()],
                    allow_private: vec![]
                })
                .is_err(),
                "{bad}"
            );
        }
        assert!(
            EgressPolicy::from_config(&EgressConfig {
                allow: vec![],
                allow_private: vec!["10.0.0.0/99".into()]
            })
            .is_err()
        );
    }

    #[test]
    fn refusals_keep_their_text_and_show_no_credentials_path_or_query() {
        let p = policy(&["https://*.example.com"], &[]);
        let denied = p
            .check_url(&url("http://user:s3cret@evil.test:8080/t?token=s3cret"))
            .unwrap_err();
        assert_eq!(
            denied.to_string(),
            "http://evil.test:8080 is not in the egress allowlist ([egress] allow)"
        );
        assert!(!format!("{denied:?}").contains("s3cret"), "{denied:?}");
        assert_eq!(
            p.check_ip("169.254.169.254".parse().unwrap())
                .unwrap_err()
                .to_string(),
            "169.254.169.254 is a link-local (cloud metadata lives here) address; add it to \
             [egress] allow_private to reach it"
        );
        let rule = |allow: &str| {
            EgressPolicy::from_config(&EgressConfig {
                allow: vec![allow.into()],
                allow_private: vec![],
            })
            .unwrap_err()
        };
        assert_eq!(
            rule("https://x.com:port").to_string(),
            "egress rule \"https://x.com:port\": bad port (expected scheme://host[:port])"
        );
        let cidr = EgressPolicy::from_config(&EgressConfig {
            allow: vec![],
            allow_private: vec!["10.0.0.0/x".into()],
        })
        .unwrap_err();
        assert_eq!(cidr.to_string(), "\"10.0.0.0/x\": bad prefix length");
        assert!(std::error::Error::source(&cidr).is_some());
    }

    #[tokio::test]
    async fn the_resolver_refuses_names_that_resolve_to_private_addresses() {
        use reqwest::dns::Resolve;
        let resolver = EgressResolver {
            policy: Arc::new(policy(&["*://*:*"], &[])),
        };
        let err = resolver
            .resolve("localhost".parse().unwrap())
            .await
            .err()
            .expect("refused");
        assert!(err.to_string().contains("loopback"), "{err}");
        let allowed = EgressResolver {
            policy: Arc::new(policy(&["*://*:*"], &["127.0.0.0/8", "::1"])),
        };
        assert!(allowed.resolve("localhost".parse().unwrap()).await.is_ok());
    }
}
