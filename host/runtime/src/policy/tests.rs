use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::chat::{
    ChatSession,
    tools::{Resolution, Route, ToolSet},
};
use crate::mcp::Tool;
use crate::registry::{EnvRefError, Launch, LaunchUnavailable, Profile, ServerEntry, ServerRecord};
use crate::sandbox::MemoryBudget;

fn entry(id: &str, allowed: &[&str], tags: &[&str], available: bool) -> ServerEntry {
    ServerEntry {
        record: ServerRecord {
            allowed_tools: allowed.iter().map(|s| s.to_string()).collect(),
            tags: tags.iter().map(|s| s.to_string()).collect(),
            ..ServerRecord::for_tests(id)
        },
        source: format!("{id}.toml").into(),
        launch: if available {
            Ok(Launch::Stdio {
                command: "x".into(),
                args: vec![],
                env: BTreeMap::new(),
                cwd: None,
                secrets: Default::default(),
            })
        } else {
            Err(LaunchUnavailable::EnvRef {
                field: "stdio.args[0]".into(),
                source: EnvRefError::Missing("TOKEN".into()),
            })
        },
    }
}

fn patterns(list: &[&str]) -> Vec<Pattern> {
    list.iter().map(|p| Pattern::new(*p)).collect()
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn task(allowed: &[&str], defaults: &[&str]) -> TaskMcpPolicy {
    TaskMcpPolicy {
        enabled: true,
        default_server_ids: ids(defaults),
        allowed_server_ids: ids(allowed),
        narrowing: Narrowing::default(),
        profile: None,
    }
}

fn lists(allow: Option<&[&str]>, deny: &[&str]) -> Lists {
    Lists {
        allow: allow.map(patterns),
        deny: patterns(deny),
    }
}

#[test]
fn filter_layers_only_narrow_and_denylists_veto() {
    let mut t = task(&["fs"], &["fs"]);
    t.narrowing.tools = lists(Some(&["*"]), &["delete_*"]);
    let filter = ToolFilter::new(&ids(&["read_*", "delete_*"]), &t);
    assert!(filter.permits("read_text"));
    assert_eq!(
        filter.check("delete_file"),
        Err(Denial::DeniedByPattern(
            Kind::Tool,
            Layer::Task,
            Pattern::new("delete_*")
        ))
    );
    assert_eq!(
        filter.check("write_text"),
        Err(Denial::NotInAllowlist(Kind::Tool, Layer::Registry)),
        "the task's * cannot widen"
    );
    let session = |tools: Lists| Narrowing {
        tools,
        ..Narrowing::default()
    };
    let narrowed = filter
        .clone()
        .with_session(&session(lists(Some(&["read_a*"]), &[])));
    assert_eq!(
        narrowed.check("read_text"),
        Err(Denial::NotInAllowlist(Kind::Tool, Layer::Session))
    );
    let vetoed = filter.with_session(&session(lists(None, &["read_text"])));
    assert_eq!(
        vetoed.check("read_text"),
        Err(Denial::DeniedByPattern(
            Kind::Tool,
            Layer::Session,
            Pattern::new("read_text")
        ))
    );
    // A new session layer replaces the old one; it never stacks or widens past the task.
    let replaced = vetoed.with_session(&session(lists(Some(&["*"]), &[])));
    assert!(replaced.permits("read_text"));
    assert!(!replaced.permits("write_text"));
    assert_eq!(
        ToolFilter::new(&[], &t).check("echo"),
        Err(Denial::NotInAllowlist(Kind::Tool, Layer::Registry))
    );
}

#[test]
fn effective_logs_a_reason_for_every_server_left_out() {
    let registry = Registry::from_entries(
        vec![
            entry("fs", &["*"], &[], true),
            entry("gitlab", &["*"], &[], false),
            entry("locked", &[], &[], true),
            entry("web", &["*"], &[], true),
        ],
        vec![],
    );
    let t = task(&["fs", "gitlab", "locked"], &["fs"]);
    let requested = ids(&["fs", "gitlab", "locked", "web", "nope", "fs"]);
    let no_lists = Narrowing::default();
    let session = SessionRequest {
        enabled: true,
        server_ids: &requested,
        narrowing: &no_lists,
    };
    let effective = effective(&registry, &t, &session);
    assert_eq!(
        effective
            .servers
            .iter()
            .map(|g| g.entry.server_id())
            .collect::<Vec<_>>(),
        ["fs"]
    );
    let reasons: Vec<(String, Reason)> = effective
        .decisions
        .iter()
        .map(|d| (d.server_id.clone(), d.reason))
        .collect();
    assert_eq!(
        reasons,
        [
            ("gitlab".into(), Reason::EnvMissing),
            ("locked".into(), Reason::DenyAllServer),
            ("web".into(), Reason::NotAllowedByTask),
            ("nope".into(), Reason::UnknownServer),
        ]
    );
    let off = SessionRequest {
        enabled: false,
        ..session
    };
    assert!(
        effective_reasons(&registry, &t, &off)
            .iter()
            .all(|r| *r == Reason::Disabled || *r == Reason::UnknownServer)
    );
}

fn effective_reasons(
    registry: &Registry,
    t: &TaskMcpPolicy,
    s: &SessionRequest<'_>,
) -> Vec<Reason> {
    effective(registry, t, s)
        .decisions
        .iter()
        .map(|d| d.reason)
        .collect()
}

#[test]
fn profiles_select_by_id_and_tag_and_tasks_only_narrow_them() {
    let registry = Registry::from_entries(
        vec![
            entry("gitlab", &["*"], &["scm"], true),
            entry("github", &["*"], &["scm"], true),
            entry("fs", &["*"], &[], true),
            entry("web", &["*"], &["search"], true),
        ],
        vec![Profile {
            name: "code-review".into(),
            description: None,
            server_ids: ids(&["fs"]),
            tags: ids(&["scm"]),
            tool_allowlist: Some(ids(&["read_*", "list_*"])),
            tool_denylist: ids(&["delete_*"]),
            resource_allowlist: None,
            resource_denylist: vec![],
            prompt_allowlist: None,
            prompt_denylist: vec![],
        }],
    );
    let config = TaskMcpConfig {
        enabled: true,
        profile: Some("code-review".into()),
        ..TaskMcpConfig::default()
    };
    let policy = config.resolve(&registry).unwrap();
    assert_eq!(policy.allowed_server_ids, ["fs", "github", "gitlab"]);
    assert_eq!(policy.default_server_ids, policy.allowed_server_ids);
    let filter = ToolFilter::new(&ids(&["*"]), &policy);
    assert_eq!(
        filter.check("write_file"),
        Err(Denial::NotInAllowlist(Kind::Tool, Layer::Profile))
    );
    assert_eq!(filter.check("read_delete_me"), Ok(()));
    assert!(matches!(
        filter.check("delete_repo"),
        Err(Denial::DeniedByPattern(Kind::Tool, Layer::Profile, _))
    ));

    let narrowed = TaskMcpConfig {
        default_server_ids: Some(ids(&["gitlab"])),
        ..config.clone()
    }
    .resolve(&registry)
    .unwrap();
    assert_eq!(narrowed.default_server_ids, ["gitlab"]);
    let wider = TaskMcpConfig {
        allowed_server_ids: Some(ids(&["gitlab", "web"])),
        ..config.clone()
    };
    let err = wider.resolve(&registry).unwrap_err();
    assert_eq!(err.key, "mcp.allowed_server_ids");
    assert!(err.message.contains("`web`"));
    let unknown = TaskMcpConfig {
        profile: Some("nope".into()),
        ..config
    };
    assert_eq!(unknown.resolve(&registry).unwrap_err().key, "mcp.profile");
}

#[test]
fn enabled_with_no_default_is_a_warning() {
    assert_eq!(task(&[], &[]).warnings().len(), 1);
    assert!(task(&["fs"], &["fs"]).warnings().is_empty());
}

// ---------------------------------------------------------------------------------------
// Property: across random registries, tasks (with profiles), sessions and model-requested
// tool names, nothing outside every layer's allowlist or inside any denylist is ever
// offered to the model, routed for execution, or opened through `mcp_open`; and everything
// every layer allows is offered.

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
        let registry = case.registry();
        let task = case.task();
        let session = case.session(&task);
        let request = crate::chat::tools::session_request(&session);
        let effective = effective(&registry, &task, &request);
        let listings = effective.servers.iter().map(|_| Ok(listing())).collect();
        let tools = ToolSet::assemble(&session, &registry, effective, listings, false);

        // Offered: exactly what every layer allows.
        let offered: Vec<String> = tools.definitions.iter().map(|d| d["function"]["name"].as_str().unwrap().to_owned()).collect();
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
            let single = super::effective(&registry, &task, &SessionRequest::single(&requested));
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

fn docs_entry(resources: &[&str], prompts: &[&str]) -> Arc<ServerEntry> {
    let mut docs = entry("docs", &["*"], &[], true);
    docs.record.allowed_resources = ids(resources);
    docs.record.allowed_prompts = ids(prompts);
    Arc::new(docs)
}

#[test]
fn resources_and_prompts_are_denied_unless_the_registry_lists_them() {
    let grant = Grant::new(
        docs_entry(&[], &[]),
        &TaskMcpPolicy::default(),
        &Narrowing::default(),
    );
    // Empty lists (the default) allow nothing, even with every tool allowed.
    assert_eq!(
        grant.check_resource("file:///a"),
        Err(Denial::NotInAllowlist(Kind::Resource, Layer::Registry))
    );
    assert_eq!(
        grant.check_prompt("p"),
        Err(Denial::NotInAllowlist(Kind::Prompt, Layer::Registry))
    );
    let grant = Grant::new(
        docs_entry(&["demo://text/*"], &["args-?rompt"]),
        &TaskMcpPolicy::default(),
        &Narrowing::default(),
    );
    assert_eq!(grant.check_resource("demo://text/7"), Ok(()));
    assert!(grant.permits_template("demo://text/{id}"));
    assert_eq!(
        grant.check_resource("demo://blob/7"),
        Err(Denial::NotInAllowlist(Kind::Resource, Layer::Registry))
    );
    assert_eq!(grant.check_prompt("args-prompt"), Ok(()));
    assert!(grant.check_prompt("simple-prompt").is_err());
    assert_eq!(
        Denial::NotInAllowlist(Kind::Prompt, Layer::Registry).to_string(),
        "not in the registry's allowed_prompts for this server"
    );
}

/// Each layer narrows resources and prompts the way it narrows tools: registry, then
/// profile, then task, then session; an allowlist never widens what a layer above left
/// out, and a denylist anywhere vetoes. Every refusal names its kind and layer.
#[test]
fn every_layer_narrows_resources_and_prompts_and_a_denylist_vetoes() {
    let registry = Registry::from_entries(
        vec![Arc::try_unwrap(docs_entry(&["demo://*"], &["*"])).unwrap()],
        vec![Profile {
            name: "readers".into(),
            description: None,
            server_ids: ids(&["docs"]),
            tags: vec![],
            tool_allowlist: None,
            tool_denylist: vec![],
            resource_allowlist: Some(ids(&["demo://static/*", "demo://dynamic/*"])),
            resource_denylist: ids(&["*/secret*"]),
            prompt_allowlist: Some(ids(&["simple-*", "args-*", "complex-*"])),
            prompt_denylist: ids(&["complex-*"]),
        }],
    );
    let mut config = TaskMcpConfig {
        enabled: true,
        profile: Some("readers".into()),
        ..TaskMcpConfig::default()
    };
    config.narrowing.resources = lists(Some(&["*"]), &["demo://dynamic/*"]);
    config.narrowing.prompts = lists(Some(&["simple-*", "args-*", "file:*"]), &[]);
    let task = config.resolve(&registry).unwrap();
    let requested = ids(&["docs"]);
    let open = |session: &Narrowing| {
        let request = SessionRequest::single(&requested);
        let granted = effective(&registry, &task, &request);
        granted.grant("docs").unwrap().clone().with_session(session)
    };
    let grant = open(&Narrowing::default());
    let resource = |grant: &Grant, uri: &str| grant.check_resource(uri);
    let prompt = |grant: &Grant, name: &str| grant.check_prompt(name);
    use Kind::{Prompt, Resource};
    use Layer::{Profile as P, Registry as R, Session as S, Task as T};

    assert_eq!(resource(&grant, "demo://static/a"), Ok(()));
    assert_eq!(
        resource(&grant, "file:///etc/passwd"),
        Err(Denial::NotInAllowlist(Resource, R)),
        "the task's * cannot widen the registry"
    );
    assert_eq!(
        resource(&grant, "demo://other/a"),
        Err(Denial::NotInAllowlist(Resource, P))
    );
    assert!(matches!(
        resource(&grant, "demo://static/secret.txt"),
        Err(Denial::DeniedByPattern(Resource, P, _))
    ));
    assert!(matches!(
        resource(&grant, "demo://dynamic/1"),
        Err(Denial::DeniedByPattern(Resource, T, _))
    ));
    assert_eq!(prompt(&grant, "args-prompt"), Ok(()));
    assert!(matches!(
        prompt(&grant, "complex-prompt"),
        Err(Denial::DeniedByPattern(Prompt, P, _))
    ));
    assert_eq!(
        prompt(&grant, "resource-prompt"),
        Err(Denial::NotInAllowlist(Prompt, P))
    );
    assert_eq!(
        prompt(&grant, "file:x"),
        Err(Denial::NotInAllowlist(Prompt, P)),
        "the task's allowlist cannot widen the profile's"
    );
    assert!(!grant.permits_template("demo://dynamic/{id}"));

    let session = Narrowing {
        resources: lists(Some(&["demo://static/b*"]), &[]),
        prompts: lists(Some(&["*"]), &["args-*"]),
        ..Narrowing::default()
    };
    let narrowed = open(&session);
    assert_eq!(resource(&narrowed, "demo://static/b1"), Ok(()));
    assert_eq!(
        resource(&narrowed, "demo://static/a"),
        Err(Denial::NotInAllowlist(Resource, S))
    );
    assert!(
        matches!(
            resource(&narrowed, "demo://static/b/secret"),
            Err(Denial::DeniedByPattern(Resource, P, _))
        ),
        "the session's allowlist cannot lift the profile's veto"
    );
    assert_eq!(prompt(&narrowed, "simple-prompt"), Ok(()));
    let vetoed = prompt(&narrowed, "args-prompt").unwrap_err();
    assert_eq!(
        vetoed,
        Denial::DeniedByPattern(Prompt, S, Pattern::new("args-*"))
    );
    assert_eq!(vetoed.reason(), Reason::DeniedByPattern);
    assert_eq!(vetoed.layer(), Some(S));
    assert_eq!(
        vetoed.to_string(),
        "matches the session's prompt deny pattern `args-*`"
    );
    assert_eq!(
        Denial::NotInAllowlist(Resource, T).to_string(),
        "not in the task's resource allowlist"
    );
    // Tools are untouched by resource and prompt lists.
    assert!(narrowed.tools.permits("args-prompt"));
}
