//! Browsers, hosts and origins: the layer in front of every route that keeps a web page
//! from driving the node through the user's browser (docs/security.md, "Browsers, hosts
//! and origins").
//!
//! - **Host**: the request must name the node as `localhost`, an IP address or a name in
//!   `[serve] allowed_hosts`. A DNS-rebinding page reaches the node under its own name
//!   (`attacker.example` pointed at 127.0.0.1), never under an IP address or `localhost`,
//!   so those stay allowed without configuration. The check applies with or without a
//!   token; `allowed_hosts = ["*"]` turns it off, and only a node with a token may do that.
//! - **Origin**: a request a browser marks with an `Origin` must come from the node's own
//!   origin (the `Host` it was sent to, over http or https) or one in
//!   `[serve] allowed_origins` (the origin a proxy serves the node under).
//! - **`Sec-Fetch-Site: cross-site`** is refused: a browser says so of a request another
//!   site started, even a plain link or form.
//!
//! Clients that are not browsers send neither `Origin` nor `Sec-Fetch-Site` and only need
//! a `Host` the node serves, which every HTTP/1.1 client sends.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::NodeState;
use super::error::ApiError;

/// The browser rules of a node, from `[serve] allowed_hosts` and `allowed_origins`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rules {
    /// Names served besides `localhost` and IP addresses, lowercase.
    hosts: Vec<String>,
    /// Every name is served (`allowed_hosts = ["*"]`).
    any_host: bool,
    /// Origins served besides the node's own, as `scheme://host[:port]`, lowercase.
    origins: Vec<String>,
}

impl Rules {
    /// The rules of `allowed_hosts` and `allowed_origins`, or the field at fault and why.
    pub(crate) fn new(
        hosts: Option<&[String]>,
        origins: Option<&[String]>,
    ) -> Result<Self, (&'static str, &'static str)> {
        let mut rules = Self::default();
        let hosts = hosts.unwrap_or_default();
        if hosts.iter().any(|h| h == "*") {
            if hosts.len() > 1 {
                return Err((
                    "serve.allowed_hosts",
                    "\"*\" allows every name, so it must be the list's only entry",
                ));
            }
            rules.any_host = true;
        } else {
            let names = hosts.iter().map(|h| host_name(h).ok_or(BAD_HOST));
            rules.hosts = names.collect::<Result<_, _>>()?;
        }
        for origin in origins.unwrap_or_default() {
            rules.origins.push(origin_name(origin).ok_or(BAD_ORIGIN)?);
        }
        Ok(rules)
    }

    /// Whether the node answers to `name` (`host[:port]`) in `Host`.
    pub(crate) fn serves(&self, name: &str) -> bool {
        self.any_host || serves(&self.hosts, name)
    }

    /// Whether every `Host` is served (`allowed_hosts = ["*"]`).
    pub(crate) fn any_host(&self) -> bool {
        self.any_host
    }

    /// `None` when a request with these headers may reach the node, else the refusal.
    /// `navigation`: a browser follows a redirect from another site to this request (the
    /// authorization server's to `/oauth/callback`), so only its `Host` is checked.
    fn refusal(
        &self,
        headers: &HeaderMap,
        uri_authority: Option<&Authority>,
        navigation: bool,
    ) -> Option<ApiError> {
        let host = match only(headers, &header::HOST) {
            Ok(Some(host)) => host,
            Ok(None) => {
                return Some(host_refused(
                    "the request has no Host header; send the node's address in it",
                ));
            }
            Err(()) => return Some(host_refused("the request has more than one Host header")),
        };
        if !self.any_host {
            // An absolute-form request target names the host too, and wins over `Host`.
            let named = [Some(host), uri_authority.map(Authority::as_str)];
            for name in named.into_iter().flatten() {
                if !serves(&self.hosts, name) {
                    return Some(host_refused(&format!(
                        "the node does not serve the name in Host `{}`: it answers only localhost, IP addresses and the names in `[serve] allowed_hosts`, so a web page cannot reach it by DNS rebinding; if clients reach the node by this name, add it to `[serve] allowed_hosts` in quiver.toml",
                        shown(name)
                    )));
                }
            }
        }
        if navigation {
            return None;
        }
        match only(headers, &header::ORIGIN) {
            Ok(None) => {}
            Ok(Some(origin)) if self.same_origin(origin, host) => {}
            Ok(Some(origin)) => {
                return Some(
                    ApiError::new(
                        StatusCode::FORBIDDEN,
                        "cross_origin",
                        format!(
                            "a request from the web page at `{}` is refused: the node takes browser requests only from its own origin (http or https with the same Host) or one in `[serve] allowed_origins`; if a proxy serves the node under that origin, add it there in quiver.toml",
                            shown(origin)
                        ),
                    )
                    .with_field("Origin"),
                );
            }
            Err(()) => {
                return Some(
                    ApiError::new(
                        StatusCode::FORBIDDEN,
                        "cross_origin",
                        "the request has more than one Origin header",
                    )
                    .with_field("Origin"),
                );
            }
        }
        // `cross-site`, or a value no browser sends.
        let foreign =
            |v: &HeaderValue| !matches!(v.as_bytes(), b"same-origin" | b"same-site" | b"none");
        if headers.get_all(SEC_FETCH_SITE).iter().any(foreign) {
            return Some(
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    "cross_site",
                    "the browser marked this request as started by another site (Sec-Fetch-Site); the node takes none, open its pages directly instead",
                )
                .with_field("Sec-Fetch-Site"),
            );
        }
        None
    }

    /// `origin` is the node's own (same authority as `host`, http or https) or allowed.
    fn same_origin(&self, origin: &str, host: &str) -> bool {
        let Some(origin) = origin_name(origin) else {
            return false;
        };
        let authority = origin.split_once("://").map_or("", |(_, a)| a);
        authority.eq_ignore_ascii_case(host) || self.origins.contains(&origin)
    }
}

/// The request passes [`Rules`] or gets its refusal; runs before any token check.
pub(crate) async fn browsers(
    State(state): State<Arc<NodeState>>,
    request: Request,
    next: Next,
) -> Response {
    let rules = &state.config.browsers;
    // A person reaches the authorization page by a link from anywhere and the callback by
    // the authorization server's redirect; both are authorised by their own secrets (see
    // `authorize`), and the page's form posts same-origin, under the usual rules.
    let path = request.uri().path();
    let navigation = request.method() == axum::http::Method::GET
        && (path == CALLBACK_PATH
            || path
                .strip_prefix(START_PATH)
                .is_some_and(|rest| rest.starts_with('/')));
    match rules.refusal(request.headers(), request.uri().authority(), navigation) {
        None => next.run(request).await,
        Some(refusal) => {
            tracing::debug!(path = %request.uri().path(), "browser guard refused a request");
            refusal.into_response()
        }
    }
}

/// The node's OAuth redirect endpoint (user authorization, under `[serve] public_url`):
/// the one path a browser reaches by another site's redirect.
pub(crate) const CALLBACK_PATH: &str = "/oauth/callback";

/// The node's page of one user authorization (`START_PATH/{handle}`), which a person
/// opens from a link and which sends the browser on to the authorization server.
pub(crate) const START_PATH: &str = "/oauth/authorize";

const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

const BAD_HOST: (&str, &str) = (
    "serve.allowed_hosts",
    "each entry is a host name such as \"node.internal\" (no scheme, port or path), or the single entry \"*\" for any",
);

const BAD_ORIGIN: (&str, &str) = (
    "serve.allowed_origins",
    "each entry is an origin such as \"https://quiver.example.com\" (http or https, a host, an optional port, no path)",
);

/// The one value of header `name`, `None` without one, `Err` with several or a value that
/// is not text.
fn only<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Result<Option<&'h str>, ()> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(());
    }
    first.map(|v| v.to_str().map_err(|_| ())).transpose()
}

/// `value` (a `Host` or an authority) names `localhost`, an IP address or one of `names`.
fn serves(names: &[String], value: &str) -> bool {
    let Ok(authority) = value.parse::<Authority>() else {
        return false;
    };
    if authority.as_str().contains('@') {
        return false;
    }
    let host = authority.host();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        return true;
    }
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    host == "localhost" || names.contains(&host)
}

/// A configured host name, lowercase and without a trailing dot; `None` unless it is a
/// plain DNS name or IP address.
fn host_name(entry: &str) -> Option<String> {
    let name = entry
        .strip_suffix('.')
        .unwrap_or(entry)
        .to_ascii_lowercase();
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let dns = name.len() <= 253 && name.split('.').all(label);
    (dns || name.parse::<IpAddr>().is_ok()).then_some(name)
}

/// `origin` as `scheme://authority` in lowercase, when it is one (http or https, no
/// user, path, query or fragment).
fn origin_name(origin: &str) -> Option<String> {
    let origin = origin.to_ascii_lowercase();
    let (scheme, authority) = origin.split_once("://")?;
    let valid = matches!(scheme, "http" | "https")
        && !authority.is_empty()
        && !authority.contains(['@', '/', '?', '#'])
        && authority.parse::<Authority>().is_ok();
    valid.then_some(origin)
}

/// A client's header value as an error message quotes it: short and printable.
fn shown(value: &str) -> String {
    quiver::text::printable(&value.chars().take(100).collect::<String>())
}

fn host_refused(message: &str) -> ApiError {
    ApiError::new(StatusCode::MISDIRECTED_REQUEST, "host_not_allowed", message).with_field("Host")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().expect("value"));
        }
        map
    }

    fn passes(rules: &Rules, pairs: &[(&'static str, &'static str)]) -> bool {
        rules.refusal(&headers(pairs), None, false).is_none()
    }

    #[test]
    fn localhost_ip_addresses_and_configured_names_are_served() {
        let rules = Rules::new(Some(&["Node.Internal.".into()]), None).expect("rules");
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1:9",
            "[::1]:8080",
            "10.1.2.3",
            "node.internal",
            "node.internal.:443",
        ] {
            assert!(passes(&rules, &[("host", host)]), "{host}");
        }
        for host in [
            "attacker.example",
            "localhost.attacker.example",
            "node.internal.attacker.example",
            "user@localhost",
            "",
        ] {
            assert!(!passes(&rules, &[("host", host)]), "{host}");
        }
        assert!(!passes(&rules, &[]), "no Host");
        assert!(
            !passes(&rules, &[("host", "localhost"), ("host", "localhost")]),
            "two Hosts"
        );
        let absolute: Authority = "attacker.example".parse().expect("authority");
        assert!(
            rules
                .refusal(&headers(&[("host", "localhost")]), Some(&absolute), false)
                .is_some()
        );
    }

    #[test]
    fn a_star_serves_any_name_alone() {
        assert!(!Rules::default().any_host());
        assert!(!passes(&Rules::default(), &[("host", "attacker.example")]));
        let any = Rules::new(Some(&["*".into()]), None).expect("rules");
        assert!(any.any_host());
        assert!(passes(&any, &[("host", "attacker.example")]));
        let mixed = Rules::new(Some(&["*".into(), "a.example".into()]), None);
        assert_eq!(mixed.map_err(|e| e.0), Err("serve.allowed_hosts"));
        for bad in ["http://a.example", "a.example:80", "a/b", "", "-a.example"] {
            let rules = Rules::new(Some(&[bad.into()]), None);
            assert_eq!(rules.map_err(|e| e.0), Err("serve.allowed_hosts"), "{bad}");
        }
    }

    #[test]
    fn only_the_own_or_a_configured_origin_and_no_cross_site_request_pass() {
        let rules = Rules::new(None, Some(&["https://Quiver.Example.com".into()])).expect("rules");
        let host = ("host", "127.0.0.1:8080");
        assert!(passes(&rules, &[host, ("origin", "http://127.0.0.1:8080")]));
        assert!(passes(
            &rules,
            &[host, ("origin", "https://quiver.example.com")]
        ));
        assert!(passes(&rules, &[host, ("sec-fetch-site", "same-origin")]));
        assert!(passes(&rules, &[host, ("sec-fetch-site", "none")]));
        for origin in [
            "http://attacker.example",
            "http://127.0.0.1:8081",
            "null",
            "http://127.0.0.1:8080/path",
            "file://",
        ] {
            assert!(!passes(&rules, &[host, ("origin", origin)]), "{origin}");
        }
        assert!(!passes(&rules, &[host, ("sec-fetch-site", "cross-site")]));
        for bad in [
            "quiver.example.com",
            "ftp://a.example",
            "https://a.example/",
        ] {
            let rules = Rules::new(None, Some(&[bad.into()]));
            assert_eq!(
                rules.map_err(|e| e.0),
                Err("serve.allowed_origins"),
                "{bad}"
            );
        }
    }
}
