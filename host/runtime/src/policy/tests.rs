use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::registry::{EnvRefError, Launch, LaunchUnavailable, Profile, ServerEntry, ServerRecord};

pub(crate) fn entry(id: &str, allowed: &[&str], tags: &[&str], available: bool) -> ServerEntry {
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
                vars: Default::default(),
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

pub(crate) fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn task(allowed: &[&str], defaults: &[&str]) -> TaskMcpPolicy {
    TaskMcpPolicy {
        enabled: true,
        default_server_ids: ids(defaults),
        allowed_server_ids: ids(allowed),
        narrowing: Narrowing::default(),
        profile: None,
        principal: None,
    }
}

pub(crate) fn lists(allow: Option<&[&str]>, deny: &[&str]) -> Lists {
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
    let policy = config.clone().resolve(&registry).unwrap();
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
    // Defaults alone stand for the allowlist, so they too stay within the profile.
    let wider_defaults = TaskMcpConfig {
        default_server_ids: Some(ids(&["gitlab", "web"])),
        ..config.clone()
    };
    let err = wider_defaults.resolve(&registry).unwrap_err();
    assert_eq!(err.key, "mcp.default_server_ids");
    assert!(
        err.message
            .contains("`web` is not in the profile's servers"),
        "{}",
        err.message
    );
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

fn principals(toml: &str) -> PrincipalRules {
    let config: BTreeMap<String, PrincipalConfig> = toml::from_str(toml).expect("toml");
    PrincipalRules::from_config(&config).expect("rules")
}

/// The principal layer only narrows: a server the task allows but the principal may not
/// use is left out with a reason naming the principal, the server and the entry to edit;
/// unlisted principals get `*`, and without `*` nothing.
#[test]
fn the_principal_layer_narrows_servers_by_entry_then_star_then_nothing() {
    let registry = Registry::from_entries(
        vec![
            entry("fs", &["*"], &[], true),
            entry("web", &["*"], &[], true),
        ],
        vec![],
    );
    let requested = ids(&["fs", "web"]);
    let granted = |rules: &PrincipalRules, who: Option<&str>| {
        let t = TaskMcpPolicy {
            principal: Some(rules.layer(who)),
            ..task(&["fs", "web"], &["fs", "web"])
        };
        let e = effective(&registry, &t, &SessionRequest::single(&requested));
        let servers: Vec<String> = e
            .servers
            .iter()
            .map(|g| g.entry.server_id().to_owned())
            .collect();
        (servers, e.decisions)
    };
    let rules = principals("[alice]\nservers = [\"w*\"]\n[\"*\"]\nservers = [\"fs\"]\n");
    let (servers, decisions) = granted(&rules, Some("alice"));
    assert_eq!(servers, ["web"]);
    assert_eq!(decisions[0].reason, Reason::NotAllowedForPrincipal);
    let detail = &decisions[0].detail;
    assert!(
        detail.contains("principal `alice` may not use server `fs`")
            && detail.contains("[principals.alice] servers"),
        "{detail}"
    );
    assert_eq!(granted(&rules, Some("bob")).0, ["fs"]);
    assert_eq!(granted(&rules, None).0, ["fs"]);
    let strict = principals("[alice]\nservers = [\"*\"]\n");
    assert_eq!(granted(&strict, Some("alice")).0, ["fs", "web"]);
    let (servers, decisions) = granted(&strict, Some("bob"));
    assert!(servers.is_empty());
    assert!(
        decisions[0].detail.contains("no entry for it"),
        "{:?}",
        decisions[0]
    );
    assert!(granted(&strict, None).0.is_empty());
    assert_eq!(strict.names().collect::<Vec<_>>(), ["alice"]);
}

#[test]
fn a_profile_outside_the_principals_patterns_is_a_task_config_error() {
    let registry = Registry::from_entries(vec![entry("fs", &["*"], &[], true)], vec![]);
    let rules = principals("[alice]\nservers = [\"*\"]\nprofiles = [\"read*\"]\n");
    let config = TaskMcpConfig {
        enabled: true,
        profile: Some("admin".into()),
        ..TaskMcpConfig::default()
    };
    let error = config
        .resolve_for(&registry, Some(rules.layer(Some("alice"))))
        .expect_err("admin is not a read* profile");
    assert_eq!(error.key, "mcp.profile");
    assert!(
        error
            .message
            .contains("principal `alice` may not use profile `admin`"),
        "{error}"
    );
}

#[test]
fn principal_entries_are_checked_naming_the_field() {
    for (toml, field) in [
        ("[\"a\\u0007\"]\nservers = []\n", "principals.a\\x07"),
        ("[alice]\nservers = [\"\"]\n", "principals.alice.servers"),
        ("[alice]\nprofiles = [\"\"]\n", "principals.alice.profiles"),
    ] {
        let config: BTreeMap<String, PrincipalConfig> = toml::from_str(toml).expect("toml");
        let error = PrincipalRules::from_config(&config).expect_err(toml);
        assert_eq!(error.field, field, "{error}");
    }
    let typo: Result<BTreeMap<String, PrincipalConfig>, _> =
        toml::from_str("[alice]\nserver = []\n");
    assert!(typo.is_err());
}
