//! The chat tool set against the policy: over random registries, profiles, tasks and
//! sessions, a model is offered, and a call is routed to, exactly what every layer allows
//! (the policy's own unit tests are in `policy/tests.rs`).

use std::sync::Arc;

use proptest::prelude::*;

use super::ChatSession;
use super::tools::{Resolution, Route, ToolSet};
use crate::mcp::Tool;
use crate::policy::tests::{entry, ids, lists};
use crate::policy::{
    Lists, Narrowing, Pattern, SessionRequest, TaskMcpPolicy, TaskProfile, effective,
};
use crate::registry::Registry;
use crate::sandbox::MemoryBudget;

const SERVERS: [&str; 4] = ["a", "b", "c", "d"];
const TOOLS: [&str; 6] = [
    "read_file",
    "read_dir",
    "write_file",
    "delete_file",
    "list",
    "search",
];
const PATTERNS: [&str; 8] = [
    "*",
    "read_*",
    "*_file",
    "list",
    "?ead_*",
    "delete_*",
    "write_file",
    "nomatch",
];

fn subset<T: Clone + std::fmt::Debug + 'static>(
    items: &'static [T],
) -> impl Strategy<Value = Vec<T>> {
    proptest::sample::subsequence(items, 0..=items.len())
}

fn maybe_patterns() -> impl Strategy<Value = Option<Vec<&'static str>>> {
    proptest::option::of(subset(&PATTERNS))
}

#[derive(Debug, Clone)]
struct Case {
    servers: Vec<(&'static str, Vec<&'static str>, bool)>,
    task_enabled: bool,
    task_allowed: Vec<&'static str>,
    task_allow: Option<Vec<&'static str>>,
    task_deny: Vec<&'static str>,
    profile: Option<(Option<Vec<&'static str>>, Vec<&'static str>)>,
    session_enabled: bool,
    session_servers: Vec<&'static str>,
    session_allow: Option<Vec<&'static str>>,
    session_deny: Vec<&'static str>,
    requested: Vec<String>,
}

fn case() -> impl Strategy<Value = Case> {
    let servers =
        proptest::collection::vec((subset(&PATTERNS), any::<bool>()), 4).prop_map(|per| {
            SERVERS
                .iter()
                .zip(per)
                .map(|(id, (allowed, available))| (*id, allowed, available))
                .collect::<Vec<_>>()
        });
    let requested = proptest::collection::vec(
        prop_oneof![
            (0..4usize, 0..6usize).prop_map(|(s, t)| format!("mcp__{}__{}", SERVERS[s], TOOLS[t])),
            (0..4usize, 0..6usize).prop_map(|(s, t)| format!("mcp.{}.{}", SERVERS[s], TOOLS[t])),
            (0..6usize).prop_map(|t| TOOLS[t].to_owned()),
            "[a-z_.]{0,12}",
        ],
        0..12,
    );
    (
        (
            servers,
            any::<bool>(),
            subset(&SERVERS),
            maybe_patterns(),
            subset(&PATTERNS),
        ),
        proptest::option::of((maybe_patterns(), subset(&PATTERNS))),
        (
            any::<bool>(),
            subset(&["a", "b", "c", "d", "z"]),
            maybe_patterns(),
            subset(&PATTERNS),
            requested,
        ),
    )
        .prop_map(
            |(
                (servers, task_enabled, task_allowed, task_allow, task_deny),
                profile,
                (session_enabled, session_servers, session_allow, session_deny, requested),
            )| Case {
                servers,
                task_enabled,
                task_allowed,
                task_allow,
                task_deny,
                profile,
                session_enabled,
                session_servers,
                session_allow,
                session_deny,
                requested,
            },
        )
}

fn any_matches(patterns: &[&str], name: &str) -> bool {
    patterns.iter().any(|p| Pattern::new(*p).matches(name))
}

impl Case {
    /// The reference answer, written independently of the code under test.
    fn allowed(&self, server: &str, tool: &str, via_session: bool) -> bool {
        let Some((_, registry_allow, available)) =
            self.servers.iter().find(|(id, ..)| *id == server)
        else {
            return false;
        };
        let layer_ok = |allow: &Option<Vec<&str>>, deny: &[&str]| {
            allow.as_ref().is_none_or(|a| any_matches(a, tool)) && !any_matches(deny, tool)
        };
        let profile_ok = self
            .profile
            .as_ref()
            .is_none_or(|(allow, deny)| layer_ok(allow, deny));
        let session_ok = !via_session
            || (self.session_enabled
                && self.session_servers.contains(&server)
                && self.session_allows(tool));
        *available
            && !registry_allow.is_empty()
            && any_matches(registry_allow, tool)
            && self.task_enabled
            && self.task_allowed.contains(&server)
            && profile_ok
            && layer_ok(&self.task_allow, &self.task_deny)
            && session_ok
    }

    /// Whether the session's own lists pass `name`.
    fn session_allows(&self, name: &str) -> bool {
        self.session_allow
            .as_ref()
            .is_none_or(|a| any_matches(a, name))
            && !any_matches(&self.session_deny, name)
    }

    fn registry(&self) -> Registry {
        Registry::from_entries(
            self.servers
                .iter()
                .map(|(id, allowed, available)| {
                    let mut server = entry(id, allowed, &[], *available);
                    server.record.allowed_resources = ids(allowed);
                    server.record.allowed_prompts = ids(allowed);
                    server
                })
                .collect(),
            vec![],
        )
    }

    fn task(&self) -> TaskMcpPolicy {
        TaskMcpPolicy {
            enabled: self.task_enabled,
            default_server_ids: vec![],
            allowed_server_ids: self.task_allowed.iter().map(|s| s.to_string()).collect(),
            narrowing: same_lists(lists(self.task_allow.as_deref(), &self.task_deny)),
            profile: self.profile.as_ref().map(|(allow, deny)| TaskProfile {
                name: "p".into(),
                narrowing: same_lists(lists(allow.as_deref(), deny)),
            }),
            principal: None,
        }
    }

    /// The session's lists, the same for tools, resources and prompts.
    fn session_narrowing(&self) -> Narrowing {
        same_lists(lists(self.session_allow.as_deref(), &self.session_deny))
    }

    fn session(&self, task: &TaskMcpPolicy) -> ChatSession {
        let mut session = ChatSession::new(task, &MemoryBudget::unlimited());
        let mcp = session.mcp_mut();
        mcp.enabled = self.session_enabled;
        mcp.server_ids = self.session_servers.iter().map(|s| s.to_string()).collect();
        mcp.narrowing.tools = self.session_narrowing().tools;
        session
    }
}

/// The same lists for every kind of name, so one reference answer covers all three.
fn same_lists(lists: Lists) -> Narrowing {
    Narrowing {
        tools: lists.clone(),
        resources: lists.clone(),
        prompts: lists,
    }
}

fn listing() -> Arc<[Tool]> {
    TOOLS
        .iter()
        .map(|t| Tool::new(*t, "a tool", Arc::new(serde_json::Map::new())))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn nothing_outside_every_layer_is_offered_or_executed(case in case()) {
        let registry = Arc::new(case.registry());
        let task = case.task();
        let session = case.session(&task);
        let request = crate::chat::tools::session_request(&session);
        let effective = effective(&registry, &task, &request);
        let listings = effective.servers.iter().map(|_| Ok(listing())).collect();
        let tools = ToolSet::assemble(&session, &registry, effective, listings, false);

        // Offered: exactly what every layer allows.
        let definitions = serde_json::to_value(tools.definitions()).unwrap();
        let offered: Vec<String> = definitions.as_array().unwrap().iter().map(|d| d["function"]["name"].as_str().unwrap().to_owned()).collect();
        for server in SERVERS {
            for tool in TOOLS {
                let name = format!("mcp__{server}__{tool}");
                prop_assert_eq!(offered.contains(&name), case.allowed(server, tool, true), "{}", name);
            }
        }
        // Executed: whatever the model asks for, a route leads only to an allowed tool.
        for name in &case.requested {
            if let Resolution::Route(Route::Mcp { entry, tool, .. }) = tools.resolve(name) {
                prop_assert!(case.allowed(entry.server_id(), tool, true), "{} routed to {}/{}", name, entry.server_id(), tool);
            }
        }
        // The hostcall path: mcp_open and its fd's filters (the registry's allowed_resources
        // and allowed_prompts equal its allowed_tools here), then narrowed by mcp_set_param.
        for server in SERVERS {
            let requested = [server.to_owned()];
            let single = crate::policy::effective(&registry, &task, &SessionRequest::single(&requested));
            match single.grant(server) {
                Some(grant) => {
                    let narrowed = grant.clone().with_session(&case.session_narrowing());
                    for tool in TOOLS {
                        let opened = case.allowed(server, tool, false);
                        prop_assert_eq!(grant.tools.permits(tool), opened, "{}/{}", server, tool);
                        prop_assert_eq!(grant.check_resource(tool).is_ok(), opened, "resource {}/{}", server, tool);
                        prop_assert_eq!(grant.check_prompt(tool).is_ok(), opened, "prompt {}/{}", server, tool);
                        let within = opened && case.session_allows(tool);
                        prop_assert_eq!(narrowed.tools.permits(tool), within, "{}/{}", server, tool);
                        prop_assert_eq!(narrowed.check_resource(tool).is_ok(), within, "resource {}/{}", server, tool);
                        prop_assert_eq!(narrowed.check_prompt(tool).is_ok(), within, "prompt {}/{}", server, tool);
                    }
                }
                None => prop_assert!(TOOLS.iter().all(|tool| !case.allowed(server, tool, false)) || !case.task_allowed.contains(&server)),
            }
        }
    }
}
