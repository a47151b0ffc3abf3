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
    /// The HTTP proxy every request to a remote server goes through, `http://host:port`
    /// (or `https://`). Without it the host connects directly and ignores `HTTP_PROXY`,
    /// `HTTPS_PROXY` and `ALL_PROXY`: a proxy resolves names itself, so the address rules
    /// would never see the real target. With it, each target is resolved and checked
    /// before the request goes to the proxy.
    #[serde(default)]
    pub proxy: Option<String>,
}

fn default_allow() -> Vec<String> {
    vec!["https://*:*".into(), "http://*:*".into()]
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            allow: default_allow(),
            allow_private: Vec::new(),
            proxy: None,
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
    /// `proxy` is not an `http://host:port` or `https://host:port` URL. The URL itself is
    /// not repeated: it might carry a password.
    #[error("proxy: {problem} (expected http://host:port or https://host:port)")]
    Proxy { problem: &'static str },
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
    /// Through a proxy a name the host cannot resolve cannot be checked, so it is not sent.
    #[error(
        "egress policy refuses {host}: it does not resolve here ({reason}), so it cannot be checked before it is sent through [egress] proxy"
    )]
    Unresolved { host: String, reason: String },
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
    proxy: Option<reqwest::Url>,
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

/// Why an address is special, if it is. An IPv6 address that carries an IPv4 address to a
/// translator or tunnel is judged by the IPv4 address it reaches: `64:ff9b::10.0.0.1`
/// through a NAT64 gateway is 10.0.0.1.
fn special(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6).or_else(|| embedded_v4(v6).find_map(special_v4)),
    }
}

/// The IPv4 addresses an IPv6 address may reach: IPv4-mapped (`::ffff:a.b.c.d`) and
/// -compatible (`::a.b.c.d`), NAT64's well-known prefix (`64:ff9b::/96`, RFC 6052), 6to4
/// (`2002:aabb:ccdd::/48`, RFC 3056) and NAT64's local-use prefix (`64:ff9b:1::/48`, RFC
/// 8215). A local-use prefix may be /48 to /96 long, which the host cannot know: the /96
/// and the /48 places of RFC 6052 are both candidates and either being special refuses,
/// except a candidate in 0.0.0.0/8, which is the zero filler of the other layout.
fn embedded_v4(ip: Ipv6Addr) -> impl Iterator<Item = Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let at = |i: [usize; 4]| Ipv4Addr::new(o[i[0]], o[i[1]], o[i[2]], o[i[3]]);
    let last = at([12, 13, 14, 15]);
    let mut candidates = Vec::new();
    let mapped_or_compatible = s[..5] == [0; 5] && (s[5] == 0xffff || s[5] == 0);
    if mapped_or_compatible || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        candidates.push(last);
    } else if s[0] == 0x2002 {
        candidates.push(at([2, 3, 4, 5]));
    } else if s[..3] == [0x64, 0xff9b, 1] {
        candidates.extend(
            [at([6, 7, 9, 10]), last]
                .into_iter()
                .filter(|v4| v4.octets()[0] != 0),
        );
    }
    candidates.into_iter()
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
        let proxy = config.proxy.as_deref().map(parse_proxy).transpose()?;
        Ok(Self {
            rules,
            allow_private,
            proxy,
        })
    }

    /// The proxy requests go through (`[egress] proxy`), if any.
    pub(crate) fn proxy(&self) -> Option<&reqwest::Url> {
        self.proxy.as_ref()
    }

    /// Whether `host` is the configured proxy's: the operator named it, so the address
    /// rules (which are for targets) do not apply to reaching it.
    fn is_proxy_host(&self, host: &str) -> bool {
        self.proxy
            .as_ref()
            .and_then(|p| p.host_str())
            .is_some_and(|p| {
                p.trim_start_matches('[')
                    .trim_end_matches(']')
                    .eq_ignore_ascii_case(host)
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

/// `[egress] proxy`: an http(s) URL of a host and port, without credentials (they would
/// sit in the config file and its `Debug`), path or query.
fn parse_proxy(text: &str) -> Result<reqwest::Url, EgressRuleError> {
    let bad = |problem| EgressRuleError::Proxy { problem };
    let url = reqwest::Url::parse(text).map_err(|_| bad("not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(
            "credentials in the URL are not supported; let the proxy admit the node by its address",
        ));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(bad("paths and queries are not allowed"));
    }
    Ok(url)
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
            if policy.is_proxy_host(name.as_str()) {
                let addrs: Vec<SocketAddr> =
                    tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
                return Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs);
            }
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

    /// Before a request goes through the proxy, which resolves `host` itself: every address
    /// of `host` must pass the address rules (the proxy may pick any of them), and a name
    /// that does not resolve here is refused rather than sent unchecked.
    pub(crate) async fn check_through_proxy(&self, host: &str) -> Result<(), EgressResolveError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return self
                .check_ip(ip)
                .map_err(|denied| EgressResolveError::Refused {
                    host: host.to_owned(),
                    denied,
                });
        }
        let unresolved = |reason: String| EgressResolveError::Unresolved {
            host: host.to_owned(),
            reason,
        };
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
            .await
            .map_err(|e| unresolved(e.to_string()))?
            .collect();
        if addrs.is_empty() {
            return Err(unresolved("no addresses".into()));
        }
        for addr in addrs {
            self.check_ip(addr.ip())
                .map_err(|denied| EgressResolveError::Refused {
                    host: host.to_owned(),
                    denied,
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], private: &[&str]) -> EgressPolicy {
        EgressPolicy::from_config(&EgressConfig {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            allow_private: private.iter().map(|s| s.to_string()).collect(),
            proxy: None,
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

    /// Translators and tunnels reach the IPv4 address they embed, so that address decides.
    #[test]
    fn nat64_6to4_and_compatible_addresses_are_judged_by_the_ipv4_they_embed() {
        let p = policy(&["*://*:*"], &[]);
        let kind = |ip: &str| special(ip.parse().unwrap());
        for (ip, expected) in [
            ("64:ff9b::a00:1", "private"),           // NAT64 of 10.0.0.1
            ("64:ff9b::7f00:1", "loopback"),         // 127.0.0.1
            ("64:ff9b::a9fe:a9fe", "link-local"),    // 169.254.169.254
            ("2002:a00:1::1", "private"),            // 6to4 of 10.0.0.1
            ("2002:a9fe:a9fe::", "link-local"),      // 6to4 of 169.254.169.254
            ("::a00:1", "private"),                  // IPv4-compatible 10.0.0.1
            ("::ffff:a9fe:a9fe", "link-local"),      // IPv4-mapped
            ("64:ff9b:1:a00:0:100::", "private"),    // local-use /48: 10.0.0.1
            ("64:ff9b:1:0:0:0:c0a8:101", "private"), // local-use /96: 192.168.1.1
        ] {
            let found = kind(ip).unwrap_or_else(|| panic!("{ip} passed"));
            assert!(found.starts_with(expected), "{ip}: {found}");
            assert!(
                p.check_url(&url(&format!("http://[{ip}]/"))).is_err(),
                "{ip}"
            );
        }
        for public in [
            "64:ff9b::5db8:d822", // NAT64 of 93.184.216.34
            "2002:5db8:d822::1",  // 6to4 of 93.184.216.34
            "::5db8:d822",
            "2001:db8::a00:1", // only these prefixes embed an IPv4 address
        ] {
            assert_eq!(kind(public), None, "{public}");
        }
        assert_eq!(kind("::1"), Some("loopback"));
        assert_eq!(kind("::"), Some("unspecified"));
    }

    #[test]
    fn a_proxy_is_a_host_and_port_without_credentials() {
        let with = |proxy: &str| {
            EgressPolicy::from_config(&EgressConfig {
                proxy: Some(proxy.into()),
                ..EgressConfig::default()
            })
        };
        let ok = with("http://proxy.internal:3128").unwrap();
        assert!(ok.is_proxy_host("PROXY.internal"));
        assert!(!ok.is_proxy_host("other.internal"));
        assert!(with("https://[::1]:8443/").unwrap().is_proxy_host("::1"));
        for (bad, problem) in [
            ("proxy.internal:3128", "scheme"),
            ("socks5://proxy:1080", "scheme"),
            ("http://user:s3cret@proxy:3128", "credentials"),
            ("http://proxy:3128/path", "paths"),
            ("not a url", "not a URL"),
        ] {
            let error = with(bad).unwrap_err().to_string();
            assert!(
                error.starts_with("proxy: ") && error.contains(problem),
                "{bad}: {error}"
            );
            assert!(!error.contains("s3cret"), "{error}");
        }
        assert_eq!(EgressPolicy::default().proxy(), None);
    }

    #[tokio::test]
    async fn through_a_proxy_every_address_of_the_target_is_checked_first() {
        let p = policy(&["*://*:*"], &[]);
        for host in ["localhost", "127.0.0.1", "64:ff9b::a00:1"] {
            assert!(
                matches!(
                    p.check_through_proxy(host).await,
                    Err(EgressResolveError::Refused { .. })
                ),
                "{host}"
            );
        }
        assert_eq!(p.check_through_proxy("93.184.216.34").await, Ok(()));
        let loopback = policy(&["*://*:*"], &["127.0.0.0/8", "::1"]);
        assert_eq!(loopback.check_through_proxy("localhost").await, Ok(()));
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
                    allow_private: vec![],
                    proxy: None,
                })
                .is_err(),
                "{bad}"
            );
        }
        assert!(
            EgressPolicy::from_config(&EgressConfig {
                allow: vec![],
                allow_private: vec!["10.0.0.0/99".into()],
                proxy: None,
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
                proxy: None,
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
            proxy: None,
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
