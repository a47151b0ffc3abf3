//! Prometheus metrics of a host, kept with the `prometheus-client` crate.
//!
//! Every [`Host`](crate::Host) owns one [`Metrics`], its first tool observer, so tool calls
//! and policy denials are counted from the same events the audit log and an embedder's
//! observers see. The host adds what no tool event carries: tasks ending, LLM requests and
//! tokens, chat budget hits, registry loads. Server and task gauges are read when scraped
//! (from the pool's health and admission control), so they can never drift.
//!
//! Every label set is bounded: server ids and backends come from the registry and the host
//! config, outcomes and reasons are fixed lists, and tool names, which servers, guests and
//! models choose, are capped at [`MAX_METRIC_TOOL_SERIES`](crate::defaults::MAX_METRIC_TOOL_SERIES)
//! distinct tools per server id; calls of any other tool count under `tool="_other"` of that
//! server. The cap is per server so that one guest calling made-up names cannot take the
//! series of every other server (the registry bounds the server ids). Guest tools (functions
//! a guest registered with its chat session) count with `server_id=""`, a bucket of their
//! own under the same cap.
//!
//! Where the host config has `[principals]`, the per-call counters (tool calls, policy
//! denials) also carry a `principal` label: the principal's name if it has an entry of its
//! own there, else `other`, so a flood of made-up names cannot add series. Without the
//! section they carry no such label.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::{PolicyDenial, ToolCall, ToolCallEnd, ToolObserver};
use crate::defaults;
use crate::text::cut;

/// The tool label of calls past the series cap.
pub const OTHER_TOOL: &str = "_other";

type Labels<const N: usize> = [(&'static str, String); N];
/// The labels of a per-call counter: fixed ones, then `principal` where it is bounded.
type CallLabels = Vec<(&'static str, String)>;

/// The `principal` label of a principal without an entry of its own in `[principals]`.
pub const OTHER_PRINCIPAL: &str = "other";
type Histograms = Family<Labels<2>, Histogram, fn() -> Histogram>;
/// A per-server counter read at scrape time: name, help, value.
type ServerCounter = (&'static str, &'static str, fn(&ServerGauges) -> u64);

/// The outcomes of `quiver_tasks_total` (README, metrics).
const TASK_OUTCOMES: [&str; 7] = [
    "ok",
    "exit_nonzero",
    "trapped",
    "deadline",
    "cancelled",
    "busy",
    "setup_failed",
];

/// A host's metrics. Cheap to clone; clones share everything.
///
/// Serve [`encode`](Self::encode) with [`CONTENT_TYPE`](Self::CONTENT_TYPE), or hand
/// [`registry`](Self::registry) to your own exporter, e.g.
/// `prometheus_client::encoding::text::encode(&mut text, host.metrics().registry())`.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    tool_calls: Family<CallLabels, Counter>,
    tool_duration: Histograms,
    tool_output: Histograms,
    tasks: Family<Labels<1>, Counter>,
    /// Each outcome's series of `tasks`, resolved at its first use (an unused outcome has
    /// no series), so a task's end is an atomic add.
    task_outcomes: [OnceLock<Counter>; TASK_OUTCOMES.len()],
    llm_requests: Family<Labels<2>, Counter>,
    llm_tokens: Family<Labels<2>, Counter>,
    /// Each backend's series of a request that went well, resolved at its first one (the
    /// backends are the operator's, so their number is bounded), so a chat request's end
    /// is a map lookup and three atomic adds, not six label sets built and hashed.
    llm_series: RwLock<HashMap<String, Arc<LlmSeries>>>,
    budget_hits: Family<Labels<1>, Counter>,
    policy_denials: Family<CallLabels, Counter>,
    /// The principals labelled by name (those listed in `[principals]`); `None`: no
    /// `principal` label at all.
    principals: Option<BTreeSet<String>>,
    /// The tools given their own series so far, by server id (`""`: guest tools), with
    /// their series resolved, so a call's end is a map lookup and a few atomics.
    series: RwLock<HashMap<String, ServerSeries>>,
    /// Tools with their own series per server id.
    max_series: usize,
    live: Arc<Live>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// A backend's series of a request that went well, each resolved at its first use (a
/// backend that reports no usage has no token series, as before they were cached).
#[derive(Default)]
struct LlmSeries {
    ok: OnceLock<Counter>,
    prompt: OnceLock<Counter>,
    completion: OnceLock<Counter>,
}

/// What the host reports at scrape time, in the metrics' own terms (the host maps its
/// status types to these, so observing depends on nothing it observes).
pub(crate) struct LiveStatus {
    pub(crate) servers: Vec<ServerGauges>,
    /// Tasks holding a running slot.
    pub(crate) tasks_running: u32,
    /// Tasks waiting for a running slot.
    pub(crate) tasks_queued: u32,
    /// Guest linear memory the running tasks hold, against the host's total.
    pub(crate) guest_memory: crate::sandbox::GuestMemoryStatus,
    /// The registry serves its last snapshot because the newest could not be read or built.
    pub(crate) registry_degraded: bool,
}

/// One MCP server at scrape time.
pub(crate) struct ServerGauges {
    pub(crate) server_id: String,
    /// Connected (its state `connected` or `degraded`).
    pub(crate) up: bool,
    /// Connections made to it so far.
    pub(crate) connections: u64,
    /// Connections made after a lost one.
    pub(crate) reconnects: u64,
}

type LiveSource = dyn Fn() -> Option<LiveStatus> + Send + Sync;

/// The scrape-time part: a source set once the host exists, and the registry's load count.
#[derive(Default)]
struct Live {
    source: OnceLock<Box<LiveSource>>,
    /// Loads so far and the revision of the last.
    registry: Mutex<(u64, String)>,
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("quiver host status")
    }
}

impl Metrics {
    /// The content type of [`encode`](Self::encode)'s text (OpenMetrics 1.0).
    pub const CONTENT_TYPE: &'static str =
        "application/openmetrics-text; version=1.0.0; charset=utf-8";

    /// Metrics keeping at most `max_tool_series` tool series per server id, labelling the
    /// per-call counters with `principals` by name (others as `other`) if given.
    pub(crate) fn new(max_tool_series: usize, principals: Option<BTreeSet<String>>) -> Self {
        let mut registry = Registry::default();
        let tool_calls = Family::default();
        registry.register(
            "quiver_mcp_tool_calls",
            "Tool calls by server (\"\" for guest tools), tool and outcome (ok, tool_error, error, timeout, cancelled), and principal where [principals] lists it",
            tool_calls.clone(),
        );
        let tool_duration: Histograms =
            Family::new_with_constructor(|| Histogram::new(defaults::METRIC_DURATION_BUCKETS));
        registry.register_with_unit(
            "quiver_mcp_tool_call_duration",
            "Time from sending a tool call to its end, whatever the outcome",
            Unit::Seconds,
            tool_duration.clone(),
        );
        // A histogram rather than a counter: its _sum is the byte counter, and its buckets
        // also show which tools return large results (the budget to tune).
        let tool_output: Histograms =
            Family::new_with_constructor(|| Histogram::new(defaults::METRIC_OUTPUT_BUCKETS));
        registry.register_with_unit(
            "quiver_mcp_tool_output",
            "Bytes of each tool result as the guest or model receives it (before truncation)",
            Unit::Bytes,
            tool_output.clone(),
        );
        let tasks = Family::default();
        registry.register(
            "quiver_tasks",
            "Tasks ended, by outcome (ok, exit_nonzero, trapped, deadline, cancelled, busy, setup_failed)",
            tasks.clone(),
        );
        let llm_requests = Family::default();
        registry.register(
            "quiver_llm_requests",
            "LLM exchanges by backend and outcome (ok or the error code); retries inside one exchange are not counted apart",
            llm_requests.clone(),
        );
        let llm_tokens = Family::default();
        registry.register(
            "quiver_llm_tokens",
            "Tokens the LLM backends reported, by kind (prompt, completion)",
            llm_tokens.clone(),
        );
        let budget_hits = Family::default();
        registry.register(
            "quiver_chat_budget_hits",
            "Chat sends ended by a budget (max_iterations, max_total_tool_calls, max_tool_calls_per_turn, host_memory, max_tokens), and servers' sampling requests refused by one (sampling_max_tokens, sampling_requests, sampling_tokens)",
            budget_hits.clone(),
        );
        let policy_denials = Family::default();
        registry.register(
            "quiver_policy_denials",
            "Servers or tools policy refused to a task, by reason, and principal where [principals] lists it",
            policy_denials.clone(),
        );
        let live = Arc::new(Live::default());
        registry.register_collector(Box::new(live.clone()));
        Self {
            inner: Arc::new(Inner {
                registry,
                tool_calls,
                tool_duration,
                tool_output,
                tasks,
                task_outcomes: Default::default(),
                llm_requests,
                llm_tokens,
                llm_series: RwLock::new(HashMap::new()),
                budget_hits,
                policy_denials,
                principals,
                series: RwLock::new(HashMap::new()),
                max_series: max_tool_series,
                live,
            }),
        }
    }

    /// Every metric as OpenMetrics text (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail; a collector error would end the text early.
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, self.registry()) {
            tracing::error!(%error, "cannot encode the metrics");
        }
        text
    }

    /// The underlying registry, to encode or forward with `prometheus-client`.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Where server and task gauges come from at scrape time; set once, by the host.
    pub(crate) fn watch(&self, source: Box<LiveSource>) {
        let _ = self.inner.live.source.set(source);
    }

    /// A registry snapshot was loaded (at build time and on every reload).
    pub(crate) fn registry_loaded(&self, revision: &str) {
        let mut registry = self
            .inner
            .live
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        registry.0 = registry.0.saturating_add(1);
        revision.clone_into(&mut registry.1);
    }

    /// A task ended (or was refused) with `outcome`, one of a fixed set.
    pub(crate) fn task_finished(&self, outcome: &'static str) {
        let series = || {
            self.inner
                .tasks
                .get_or_create(&[("outcome", outcome.into())])
                .clone()
        };
        match TASK_OUTCOMES.iter().position(|known| *known == outcome) {
            Some(at) => self.inner.task_outcomes[at].get_or_init(series).inc(),
            None => series().inc(),
        };
    }

    /// One LLM exchange with `backend` ended with `outcome` (`ok` or an error code).
    pub(crate) fn llm_request(&self, backend: &str, outcome: &'static str) {
        if outcome == "ok" {
            let series = self.llm_series(backend);
            let labels = || [("backend", backend.to_owned()), ("outcome", "ok".into())];
            let family = &self.inner.llm_requests;
            series
                .ok
                .get_or_init(|| family.get_or_create(&labels()).clone())
                .inc();
            return;
        }
        let labels = [("backend", backend.to_owned()), ("outcome", outcome.into())];
        self.inner.llm_requests.get_or_create(&labels).inc();
    }

    /// Tokens `backend` reported using.
    pub(crate) fn llm_tokens(&self, backend: &str, prompt: u64, completion: u64) {
        let series = self.llm_series(backend);
        let family = &self.inner.llm_tokens;
        for (counter, kind, n) in [
            (&series.prompt, "prompt", prompt),
            (&series.completion, "completion", completion),
        ] {
            let labels = || [("backend", backend.to_owned()), ("kind", kind.into())];
            counter
                .get_or_init(|| family.get_or_create(&labels()).clone())
                .inc_by(n);
        }
    }

    fn llm_series(&self, backend: &str) -> Arc<LlmSeries> {
        let known = self
            .inner
            .llm_series
            .read()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(series) = known.get(backend) {
            return series.clone();
        }
        drop(known);
        let mut known = self
            .inner
            .llm_series
            .write()
            .unwrap_or_else(|e| e.into_inner());
        known.entry(backend.to_owned()).or_default().clone()
    }

    /// A chat send stopped at `budget`.
    pub(crate) fn budget_hit(&self, budget: &'static str) {
        let labels = [("budget", budget.into())];
        self.inner.budget_hits.get_or_create(&labels).inc();
    }

    /// The series of `tool` of `server_id`: its own while that server's series cap has
    /// room or it already has them, else the server's [`OTHER_TOOL`] series.
    fn tool_series(&self, server_id: &str, tool: &str) -> Arc<ToolSeries> {
        let tool = cut(tool, defaults::MAX_TOOL_NAME_BYTES);
        {
            let series = self.inner.series.read().unwrap_or_else(|e| e.into_inner());
            let max = self.inner.max_series;
            if let Some(found) = series.get(server_id).and_then(|s| s.find(tool, max)) {
                return found;
            }
        }
        let mut series = self.inner.series.write().unwrap_or_else(|e| e.into_inner());
        let server = match series.get_mut(server_id) {
            Some(server) => server,
            None => series.entry(server_id.to_owned()).or_default(),
        };
        if let Some(found) = server.find(tool, self.inner.max_series) {
            return found;
        }
        if server.tools.len() < self.inner.max_series {
            let own = Arc::new(self.resolve(server_id, tool));
            server.tools.insert(tool.to_owned(), own.clone());
            return own;
        }
        server
            .other
            .get_or_insert_with(|| Arc::new(self.resolve(server_id, OTHER_TOOL)))
            .clone()
    }

    fn resolve(&self, server_id: &str, tool: &str) -> ToolSeries {
        let labels = [
            ("server_id", server_id.to_owned()),
            ("tool", tool.to_owned()),
        ];
        ToolSeries {
            duration: self.inner.tool_duration.get_or_create(&labels).clone(),
            output: self.inner.tool_output.get_or_create(&labels).clone(),
            calls: Default::default(),
            labels,
        }
    }
}

/// One server's tool series: those of the tools with their own, and the shared one of the
/// rest once the cap is reached.
#[derive(Default)]
struct ServerSeries {
    tools: HashMap<String, Arc<ToolSeries>>,
    other: Option<Arc<ToolSeries>>,
}

impl ServerSeries {
    /// The series `tool` counts under, if resolved already (`max`: the cap).
    fn find(&self, tool: &str, max: usize) -> Option<Arc<ToolSeries>> {
        match self.tools.get(tool) {
            Some(own) => Some(own.clone()),
            None if self.tools.len() >= max => self.other.clone(),
            None => None,
        }
    }
}

impl Metrics {
    /// The `principal` label of an event of `principal`, if the host labels principals.
    fn principal_label(&self, principal: Option<&str>) -> Option<(&'static str, String)> {
        let listed = self.inner.principals.as_ref()?;
        let name = principal
            .filter(|name| listed.contains(*name))
            .unwrap_or(OTHER_PRINCIPAL);
        Some(("principal", name.to_owned()))
    }
}

/// The resolved series of one tool label of one server.
struct ToolSeries {
    labels: Labels<2>,
    duration: Histogram,
    output: Histogram,
    /// The call counters by outcome, resolved on first use; only where calls carry no
    /// `principal` label (with one, the label set varies per call).
    calls: [OnceLock<Counter>; OUTCOMES],
}

/// How many [`ToolOutcome`](super::ToolOutcome) labels there are.
const OUTCOMES: usize = 5;

fn outcome_index(outcome: super::ToolOutcome) -> usize {
    use super::ToolOutcome;
    match outcome {
        ToolOutcome::Ok => 0,
        ToolOutcome::ToolError => 1,
        ToolOutcome::Failed(_) => 2,
        ToolOutcome::Timeout => 3,
        ToolOutcome::Cancelled => 4,
    }
}

impl ToolObserver for Metrics {
    fn after_tool_call(&self, call: &ToolCall, end: &ToolCallEnd) {
        let server_id = call.server_id().unwrap_or("");
        let series = self.tool_series(server_id, &call.tool);
        let counter_labels = || {
            let [server, tool] = series.labels.clone();
            let mut counted = vec![server, tool, ("outcome", end.outcome.label().to_owned())];
            counted.extend(self.principal_label(call.principal.as_deref()));
            counted
        };
        if self.inner.principals.is_some() {
            self.inner.tool_calls.get_or_create(&counter_labels()).inc();
        } else {
            series.calls[outcome_index(end.outcome)]
                .get_or_init(|| {
                    self.inner
                        .tool_calls
                        .get_or_create(&counter_labels())
                        .clone()
                })
                .inc();
        }
        series.duration.observe(end.duration.as_secs_f64());
        series.output.observe(end.output_bytes as f64);
    }

    fn policy_denied(&self, denial: &PolicyDenial) {
        let reason = serde_json::to_value(denial.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let mut labels = vec![("reason", reason)];
        labels.extend(self.principal_label(denial.principal.as_deref()));
        self.inner.policy_denials.get_or_create(&labels).inc();
    }
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let (generation, revision) = self
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut gauge = encoder.encode_descriptor(
            "quiver_registry_revision",
            "Registry loads so far (changes on every reload); the label is the loaded revision",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(generation).encode(gauge.encode_family(&[("revision", revision)])?)?;
        let Some(live) = self.source.get().and_then(|source| source()) else {
            return Ok(());
        };
        let degraded = encoder.encode_descriptor(
            "quiver_registry_degraded",
            "1 while the registry serves its last snapshot because the store is unreachable or its newest listing was refused (see /v1/registry), else 0",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(live.registry_degraded)).encode(degraded)?;
        for (name, help, value) in [
            (
                "quiver_tasks_running",
                "Tasks holding a running slot",
                live.tasks_running,
            ),
            (
                "quiver_tasks_queued",
                "Tasks waiting for a running slot",
                live.tasks_queued,
            ),
        ] {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::from(value)).encode(metric)?;
        }
        for (name, help, value) in [
            (
                "quiver_guest_memory_bytes",
                "Guest linear memory the running tasks hold (reserved at admission, grown since)",
                live.guest_memory.used_bytes,
            ),
            (
                "quiver_guest_memory_limit_bytes",
                "The host's total of guest linear memory ([tasks] guest_memory_total_bytes)",
                live.guest_memory.limit_bytes,
            ),
        ] {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(metric)?;
        }
        let mut up = encoder.encode_descriptor(
            "quiver_mcp_server_up",
            "1 while the server is connected (state connected or degraded), else 0",
            None,
            MetricType::Gauge,
        )?;
        for server in &live.servers {
            let labels = [("server_id", server.server_id.as_str())];
            ConstGauge::new(i64::from(server.up)).encode(up.encode_family(&labels)?)?;
        }
        let counters: [ServerCounter; 2] = [
            (
                "quiver_mcp_server_connects",
                "Connections made to the server",
                |s| s.connections,
            ),
            (
                "quiver_mcp_server_restarts",
                "Connections made after the previous one was lost (crash, broken transport)",
                |s| s.reconnects,
            ),
        ];
        for (name, help, value) in counters {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for server in &live.servers {
                let labels = [("server_id", server.server_id.as_str())];
                ConstCounter::new(value(server)).encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::observe::{ArgumentsSummary, ToolKind, ToolOutcome, Via};

    fn call(server_id: Option<&str>, tool: &str) -> ToolCall {
        ToolCall {
            task_id: "t".into(),
            principal: None,
            client: None,
            session_fd: Some(3),
            via: Via::McpCall,
            kind: server_id.map_or(ToolKind::Guest, |s| ToolKind::Mcp {
                server_id: s.into(),
            }),
            tool: tool.into(),
            arguments: ArgumentsSummary::default(),
            argument_values: None,
            started_at: SystemTime::now(),
        }
    }

    fn end(outcome: ToolOutcome) -> ToolCallEnd {
        ToolCallEnd {
            outcome,
            duration: Duration::from_millis(30),
            output_bytes: 100,
        }
    }

    /// Past the cap every new tool of a server counts as `_other`; tools already given a
    /// series keep it, and guest tools count with an empty server id.
    #[test]
    fn tool_series_are_capped_and_named_as_documented() {
        let metrics = Metrics::new(2, None);
        for tool in ["a", "b", "c", "d", "a"] {
            metrics.after_tool_call(&call(Some("s"), tool), &end(ToolOutcome::Ok));
        }
        metrics.after_tool_call(&call(None, "w"), &end(ToolOutcome::ToolError));
        metrics.registry_loaded("abc");
        metrics.registry_loaded("def");
        let text = metrics.encode();
        for line in [
            r#"quiver_mcp_tool_calls_total{server_id="s",tool="a",outcome="ok"} 2"#,
            r#"quiver_mcp_tool_calls_total{server_id="s",tool="b",outcome="ok"} 1"#,
            r#"quiver_mcp_tool_calls_total{server_id="s",tool="_other",outcome="ok"} 2"#,
            r#"quiver_mcp_tool_calls_total{server_id="",tool="w",outcome="tool_error"} 1"#,
            r#"quiver_mcp_tool_call_duration_seconds_bucket{le="0.05",server_id="s",tool="a"} 2"#,
            r#"quiver_mcp_tool_output_bytes_sum{server_id="s",tool="b"} 100.0"#,
            r#"quiver_registry_revision{revision="def"} 2"#,
        ] {
            assert!(text.contains(line), "no {line} in\n{text}");
        }
        assert!(!text.contains(r#"tool="c""#), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    /// A guest calling made-up names fills only its own bucket (and a busy server only its
    /// own): another server's tools still get their series.
    #[test]
    fn the_series_cap_is_per_server() {
        let metrics = Metrics::new(2, None);
        for tool in ["made", "up", "names", "galore"] {
            metrics.after_tool_call(&call(None, tool), &end(ToolOutcome::Ok));
            metrics.after_tool_call(&call(Some("s"), tool), &end(ToolOutcome::Ok));
        }
        metrics.after_tool_call(&call(Some("t"), "read"), &end(ToolOutcome::Ok));
        let text = metrics.encode();
        for line in [
            r#"quiver_mcp_tool_calls_total{server_id="t",tool="read",outcome="ok"} 1"#,
            r#"quiver_mcp_tool_calls_total{server_id="",tool="up",outcome="ok"} 1"#,
            r#"quiver_mcp_tool_calls_total{server_id="",tool="_other",outcome="ok"} 2"#,
            r#"quiver_mcp_tool_calls_total{server_id="s",tool="_other",outcome="ok"} 2"#,
        ] {
            assert!(text.contains(line), "no {line} in\n{text}");
        }
    }

    /// Only principals listed in `[principals]` get a series of their own; any other name
    /// (or none) counts as `other`.
    #[test]
    fn principal_labels_are_bounded_by_the_listed_names() {
        let listed = ["alice".to_owned()].into_iter().collect();
        let metrics = Metrics::new(2, Some(listed));
        for principal in [Some("alice"), Some("mallory-1"), Some("mallory-2"), None] {
            let call = ToolCall {
                principal: principal.map(Into::into),
                ..call(Some("s"), "a")
            };
            metrics.after_tool_call(&call, &end(ToolOutcome::Ok));
        }
        let text = metrics.encode();
        for line in [
            r#"quiver_mcp_tool_calls_total{server_id="s",tool="a",outcome="ok",principal="alice"} 1"#,
            r#"quiver_mcp_tool_calls_total{server_id="s",tool="a",outcome="ok",principal="other"} 3"#,
        ] {
            assert!(text.contains(line), "no {line} in\n{text}");
        }
        assert!(!text.contains("mallory"), "{text}");
    }
}
