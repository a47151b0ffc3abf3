//! Who is calling and what they may do: the one place every request is authenticated (its
//! bearer token, compared in constant time with every client's) and authorised by role.
//!
//! A node without any client holding `submit`, `approve` or `observe` (no `[serve]
//! token_env`, no such `[clients]`) only listens on loopback, and there every request
//! gets those three roles without a token, as before roles existed; `registry` always
//! needs a client that holds it. Each route group is wrapped in [`require`] with its
//! role, which puts the [`Caller`] into the request for handlers that record who acted.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::NodeState;
use crate::config::{Client, NodeConfig, Role};
use crate::error::ApiError;
use quiver::Pattern;

/// The authenticated client of a request.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Caller {
    /// The client's name; `None` for a request without a token on a node that lets
    /// those in (loopback, no task token).
    pub(crate) client: Option<Arc<str>>,
    pub(crate) roles: Vec<Role>,
    /// The end users the client may submit tasks for (`[clients.NAME] act_for`).
    #[serde(skip)]
    pub(crate) act_for: Arc<[Pattern]>,
}

impl Caller {
    /// The name audit lines show for this caller.
    pub(crate) fn name(&self) -> &str {
        self.client.as_deref().unwrap_or("anonymous")
    }

    /// The principal of a task this caller submits naming `user` (or nobody): the user if
    /// the client's `act_for` matches it, the client itself without a user. A client that
    /// may not act for `user` is `403` naming the client and the fix; a caller without a
    /// token `401`.
    /// `clients` are the node's clients: a user may not be named as one of them (their
    /// names and end users' share one namespace, so acting for one would be acting as it).
    pub(crate) fn principal_for(
        &self,
        user: Option<&str>,
        clients: &[Client],
    ) -> Result<Option<String>, ApiError> {
        let Some(user) = user else {
            return Ok(self.client.as_deref().map(str::to_owned));
        };
        quiver::check_principal(user).map_err(|message| ApiError::bad("principal", message))?;
        let Some(client) = &self.client else {
            return Err(ApiError::unauthorized(
                "send `Authorization: Bearer <token>` of a client whose `act_for` allows this principal",
            ));
        };
        // Naming itself is not acting for anybody.
        if user == &**client {
            return Ok(Some(user.to_owned()));
        }
        if clients.iter().any(|other| &*other.name == user) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "client `{client}` may not submit tasks as `{user}`: that is another client of this node, with its own grants and policy"
                ),
            )
            .with_field("principal"));
        }
        if self.act_for.iter().any(|p| p.matches(user)) {
            return Ok(Some(user.to_owned()));
        }
        let why = if self.act_for.is_empty() {
            "has no `act_for`"
        } else {
            "has no `act_for` pattern matching it"
        };
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "client `{client}` may not submit tasks for `{user}`: it {why}; add a pattern matching the user to `[clients.{client}] act_for` in the node's quiver.toml, or leave `principal` out to act as the client"
            ),
        )
        .with_field("principal"))
    }
}

/// The roles a request without a token gets: none once some client holds a role of the
/// task API, else those of the task API (the node is then loopback only).
pub(crate) fn open_roles(config: &NodeConfig) -> Vec<Role> {
    let guarded = [Role::Submit, Role::Approve, Role::Observe];
    if guarded.iter().any(|role| config.has_role(*role)) {
        return Vec::new();
    }
    guarded.to_vec()
}

/// The caller of `request`: the client whose token it bears (its roles plus the open
/// ones), or anonymous with the open roles when it bears none. A wrong token is `401`,
/// and so is no token where nothing is open.
pub(crate) fn authenticate(config: &NodeConfig, request: &Request) -> Result<Caller, ApiError> {
    let open = open_roles(config);
    let Some(header) = request.headers().get(header::AUTHORIZATION) else {
        if open.is_empty() {
            return Err(ApiError::unauthorized(
                "send `Authorization: Bearer <token>`",
            ));
        }
        return Ok(Caller {
            client: None,
            roles: open,
            act_for: Arc::new([]),
        });
    };
    // A node with no client at all has no token to check (as before roles existed).
    if config.clients.is_empty() {
        return Ok(Caller {
            client: None,
            roles: open,
            act_for: Arc::new([]),
        });
    }
    let given = header
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        // RFC 7235: the scheme is case-insensitive.
        .and_then(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer").then_some(token))
        .ok_or_else(|| ApiError::unauthorized("send `Authorization: Bearer <token>`"))?;
    let given = Sha256::digest(given.trim().as_bytes());
    // Every client is compared, so the time taken does not tell which one matched.
    let mut found = None;
    for client in &config.clients {
        if same_digest(&given, &Sha256::digest(client.token.0.as_bytes())) {
            found = Some(client);
        }
    }
    let client = found.ok_or_else(|| ApiError::unauthorized("the token is wrong"))?;
    let mut roles = client.roles.clone();
    roles.extend(open);
    roles.sort_unstable();
    roles.dedup();
    Ok(Caller {
        client: Some(client.name.clone()),
        roles,
        act_for: client.act_for.clone(),
    })
}

/// A `403`: `caller` is known but lacks `role`.
fn forbidden(caller: &Caller, role: Role) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "client `{}` lacks the `{}` role this endpoint needs; use a client that holds it (`[clients.NAME] roles` in the node's quiver.toml)",
            caller.name(),
            role.name()
        ),
    )
    .with_field("Authorization")
}

/// Compares two SHA-256 digests without an early exit, so neither the time taken nor
/// where a guess went wrong tells how much of it was right, or how long the token is.
pub(crate) fn same_digest(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Lets the request through if its caller holds `role` (`403` naming it if not), with the
/// [`Caller`] in its extensions. The admin API without any `registry` client does not
/// exist (`404 admin_disabled`).
pub(crate) async fn require(
    State((state, role)): State<(Arc<NodeState>, Option<Role>)>,
    mut request: Request,
    next: Next,
) -> Response {
    if role == Some(Role::Registry) && !state.config.has_role(Role::Registry) {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "admin_disabled",
            "the admin API is off; give a client the `registry` role (`[clients.NAME]` or `[admin] token_env` in quiver.toml) to turn it on",
        )
        .with_field("path")
        .into_response();
    }
    let caller = match authenticate(&state.config, &request) {
        Ok(caller) => caller,
        Err(e) => return e.into_response(),
    };
    if let Some(role) = role
        && !caller.roles.contains(&role)
    {
        // Without a token, only a token can help.
        let refusal = match caller.client {
            None => ApiError::unauthorized("send `Authorization: Bearer <token>`"),
            Some(_) => forbidden(&caller, role),
        };
        return refusal.into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NodeConfig {
        NodeConfig::new("127.0.0.1:0".parse().expect("addr"))
    }

    fn bearing(token: Option<&str>) -> Request {
        let mut request = Request::new(axum::body::Body::empty());
        if let Some(token) = token {
            request.headers_mut().insert(
                header::AUTHORIZATION,
                format!("Bearer {token}").parse().expect("header"),
            );
        }
        request
    }

    #[test]
    fn digests_compare_by_content() {
        let (a, b) = (Sha256::digest(b"abc"), Sha256::digest(b"abd"));
        assert!(same_digest(&a, &a));
        assert!(!same_digest(&a, &b));
        assert!(!same_digest(&a, &a[..31]));
    }

    #[test]
    fn a_token_names_its_client_and_only_its_roles() {
        let config =
            config()
                .with_token("task-token")
                .with_client("ops", "ops-token", &[Role::Approve]);
        let ops = authenticate(&config, &bearing(Some("ops-token"))).expect("ops");
        assert_eq!(ops.client.as_deref(), Some("ops"));
        assert_eq!(ops.roles, [Role::Approve]);
        let serve = authenticate(&config, &bearing(Some("task-token"))).expect("serve");
        assert_eq!(serve.roles, [Role::Submit, Role::Observe]);
        assert!(authenticate(&config, &bearing(Some("ops-token "))).is_ok());
        assert!(authenticate(&config, &bearing(Some("ops-tokens"))).is_err());
        assert!(authenticate(&config, &bearing(None)).is_err());
    }

    #[test]
    fn a_client_acts_for_the_users_its_act_for_matches_only() {
        let config = config()
            .with_client("portal", "portal-token", &[Role::Submit])
            .with_act_for("portal", &["*@example.com", "c*"])
            .with_client("ci", "ci-token", &[Role::Submit]);
        let portal = authenticate(&config, &bearing(Some("portal-token"))).expect("portal");
        assert_eq!(
            portal
                .principal_for(Some("ann@example.com"), &config.clients)
                .ok()
                .flatten()
                .as_deref(),
            Some("ann@example.com")
        );
        assert_eq!(
            portal
                .principal_for(None, &config.clients)
                .ok()
                .flatten()
                .as_deref(),
            Some("portal")
        );
        let refused = portal
            .principal_for(Some("ann@evil.test"), &config.clients)
            .expect_err("not matched");
        assert_eq!(refused.into_response().status(), StatusCode::FORBIDDEN);
        // `c*` matches the client `ci`: acting for it would be acting as it.
        let as_ci = portal
            .principal_for(Some("ci"), &config.clients)
            .expect_err("another client");
        assert!(format!("{as_ci:?}").contains("another client"), "{as_ci:?}");
        let ci = authenticate(&config, &bearing(Some("ci-token"))).expect("ci");
        assert_eq!(
            ci.principal_for(Some("ci"), &config.clients)
                .ok()
                .flatten()
                .as_deref(),
            Some("ci")
        );
        let refused = ci
            .principal_for(Some("ann@example.com"), &config.clients)
            .expect_err("no act_for");
        assert!(
            format!("{refused:?}").contains("[clients.ci] act_for"),
            "{refused:?}"
        );
        let bad = portal
            .principal_for(Some("ann\u{202e}@example.com"), &config.clients)
            .expect_err("bidi");
        assert_eq!(bad.into_response().status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn without_task_clients_a_request_without_a_token_gets_the_task_roles_only() {
        let open = authenticate(&config(), &bearing(None)).expect("open");
        assert_eq!(open.roles, [Role::Submit, Role::Approve, Role::Observe]);
        let admin_only = config().with_admin_token("admin-token");
        let admin = authenticate(&admin_only, &bearing(Some("admin-token"))).expect("admin");
        assert_eq!(
            admin.roles,
            [Role::Submit, Role::Registry, Role::Approve, Role::Observe]
        );
        assert!(authenticate(&admin_only, &bearing(Some("wrong"))).is_err());
    }
}
