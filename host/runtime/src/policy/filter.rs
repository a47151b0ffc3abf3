//! The name filters of one server: each layer's allow and deny lists for tools, resource
//! URIs and prompts, checked by one generic [`Filter`].
//!
//! Tools, resources and prompts are narrowed the same way by the same layers, so one type
//! does it for all three; the type parameter only keeps a tool filter from being asked
//! about a resource URI.

use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;

use super::pattern::{Pattern, any_match};
use super::{Denial, Layer, TaskMcpPolicy};
use crate::registry::Profile;

/// What a filter's patterns name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Tool,
    Resource,
    Prompt,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Tool, Kind::Resource, Kind::Prompt];

    /// The registry field that bounds every task (empty allows none).
    pub fn registry_field(self) -> &'static str {
        match self {
            Kind::Tool => "allowed_tools",
            Kind::Resource => "allowed_resources",
            Kind::Prompt => "allowed_prompts",
        }
    }

    /// How a denial names it: "tool", "resource", "prompt".
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Tool => "tool",
            Kind::Resource => "resource",
            Kind::Prompt => "prompt",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.noun())
    }
}

/// One kind of name as a type (sealed): [`Tools`], [`Resources`] or [`Prompts`].
pub trait Names:
    Clone + Copy + fmt::Debug + Default + PartialEq + Eq + Send + Sync + sealed::Sealed + 'static
{
    const KIND: Kind;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Tools {}
    impl Sealed for super::Resources {}
    impl Sealed for super::Prompts {}
}

/// MCP-native tool names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tools;
/// Resource URIs (and, for listing, `uriTemplate` texts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources;
/// Prompt names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prompts;

impl Names for Tools {
    const KIND: Kind = Kind::Tool;
}
impl Names for Resources {
    const KIND: Kind = Kind::Resource;
}
impl Names for Prompts {
    const KIND: Kind = Kind::Prompt;
}

/// One layer's lists for one kind of name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lists {
    /// `None` leaves the other layers' lists in charge; `Some(vec![])` allows nothing.
    pub allow: Option<Vec<Pattern>>,
    /// A veto over every allowlist.
    pub deny: Vec<Pattern>,
}

/// One layer's lists for every kind of name: what a profile, a task or a session narrows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Narrowing {
    pub tools: Lists,
    pub resources: Lists,
    pub prompts: Lists,
}

impl Narrowing {
    /// A profile's lists as the policy's profile layer.
    pub fn of_profile(profile: &Profile) -> Self {
        let lists = |allow: &Option<Vec<String>>, deny: &[String]| Lists {
            allow: allow.as_ref().map(|l| l.iter().map(Pattern::new).collect()),
            deny: deny.iter().map(Pattern::new).collect(),
        };
        Self {
            tools: lists(&profile.tool_allowlist, &profile.tool_denylist),
            resources: lists(&profile.resource_allowlist, &profile.resource_denylist),
            prompts: lists(&profile.prompt_allowlist, &profile.prompt_denylist),
        }
    }

    pub fn lists(&self, kind: Kind) -> &Lists {
        match kind {
            Kind::Tool => &self.tools,
            Kind::Resource => &self.resources,
            Kind::Prompt => &self.prompts,
        }
    }

    fn lists_mut(&mut self, kind: Kind) -> &mut Lists {
        match kind {
            Kind::Tool => &mut self.tools,
            Kind::Resource => &mut self.resources,
            Kind::Prompt => &mut self.prompts,
        }
    }

    /// Replaces the list `key` names.
    pub fn set(&mut self, key: ListKey, patterns: Vec<Pattern>) {
        let lists = self.lists_mut(key.kind);
        if key.deny {
            lists.deny = patterns;
        } else {
            lists.allow = Some(patterns);
        }
    }

    /// Every pattern held, for what they cost.
    pub fn patterns(&self) -> impl Iterator<Item = &Pattern> {
        Kind::ALL.into_iter().flat_map(|kind| {
            let lists = self.lists(kind);
            lists.allow.iter().flatten().chain(&lists.deny)
        })
    }
}

/// A list as task config and session params name it: `mcp.<kind>_allowlist` or
/// `mcp.<kind>_denylist`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListKey {
    pub kind: Kind,
    pub deny: bool,
}

impl ListKey {
    pub const ALL: [ListKey; 6] = [
        ListKey::allow(Kind::Tool),
        ListKey::deny(Kind::Tool),
        ListKey::allow(Kind::Resource),
        ListKey::deny(Kind::Resource),
        ListKey::allow(Kind::Prompt),
        ListKey::deny(Kind::Prompt),
    ];

    pub const fn allow(kind: Kind) -> Self {
        Self { kind, deny: false }
    }

    pub const fn deny(kind: Kind) -> Self {
        Self { kind, deny: true }
    }

    pub fn parse(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == key)
    }

    pub fn name(self) -> &'static str {
        match (self.kind, self.deny) {
            (Kind::Tool, false) => "mcp.tool_allowlist",
            (Kind::Tool, true) => "mcp.tool_denylist",
            (Kind::Resource, false) => "mcp.resource_allowlist",
            (Kind::Resource, true) => "mcp.resource_denylist",
            (Kind::Prompt, false) => "mcp.prompt_allowlist",
            (Kind::Prompt, true) => "mcp.prompt_denylist",
        }
    }
}

/// The filter of one server for one kind of name: every layer's allowlist must match, no
/// denylist may.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter<N> {
    allow: Vec<(Layer, Vec<Pattern>)>,
    deny: Vec<(Layer, Vec<Pattern>)>,
    names: PhantomData<N>,
}

pub type ToolFilter = Filter<Tools>;
pub type ResourceFilter = Filter<Resources>;
pub type PromptFilter = Filter<Prompts>;

impl<N: Names> Filter<N> {
    /// Registry ∩ profile ∩ task; `registry_allowed` is the record's field for this kind.
    pub fn new(registry_allowed: &[String], task: &TaskMcpPolicy) -> Self {
        let mut filter = Self {
            allow: vec![(
                Layer::Registry,
                registry_allowed.iter().map(Pattern::new).collect(),
            )],
            deny: Vec::new(),
            names: PhantomData,
        };
        if let Some(profile) = &task.profile {
            filter.push(Layer::Profile, profile.narrowing.lists(N::KIND));
        }
        filter.push(Layer::Task, task.narrowing.lists(N::KIND));
        filter
    }

    /// Narrowed by a session's lists, in place of any it had before: a session may change
    /// its lists, never get past the layers above.
    #[must_use]
    pub fn with_session(mut self, session: &Narrowing) -> Self {
        self.allow.retain(|(layer, _)| *layer != Layer::Session);
        self.deny.retain(|(layer, _)| *layer != Layer::Session);
        self.push(Layer::Session, session.lists(N::KIND));
        self
    }

    fn push(&mut self, layer: Layer, lists: &Lists) {
        if let Some(allow) = &lists.allow {
            self.allow.push((layer, allow.clone()));
        }
        if !lists.deny.is_empty() {
            self.deny.push((layer, lists.deny.clone()));
        }
    }

    /// Whether `name` passes every layer; denylists are checked first.
    pub fn check(&self, name: &str) -> Result<(), Denial> {
        for (layer, patterns) in &self.deny {
            if let Some(p) = any_match(patterns, name) {
                return Err(Denial::DeniedByPattern(N::KIND, *layer, p));
            }
        }
        for (layer, patterns) in &self.allow {
            if any_match(patterns, name).is_none() {
                return Err(Denial::NotInAllowlist(N::KIND, *layer));
            }
        }
        Ok(())
    }

    pub fn permits(&self, name: &str) -> bool {
        self.check(name).is_ok()
    }
}
