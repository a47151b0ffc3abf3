//! One `cchat_send`: the request, and with AUTO_TOOL_CALL the tool-call loop.
//!
//! A send reads its session through a snapshot that shares it, and charges the task's memory
//! budget for what it holds meanwhile: the messages it adds, its tool set, each request body
//! (the copy and its serialised form) and the tool results of a turn. At the limit the send
//! is `-ENOMEM` and adds nothing to the session.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value};
use tracing::Instrument;

use quiver_abi::Errno;

use super::images::Image;
use super::llm::{Backend, Backends, LlmError, Payload};
use super::message::{Message, value_copy_cost};
use super::request::{self, RequestBody};
use super::response::{self, SendError, ToolCallSummary};
use super::results::{
    ToolErrorCode, ToolFailure, mcp_result_images, mcp_result_text, truncate_output,
};
use super::spans;
use super::tools::{Resolution, Route, ToolCache, ToolSet};
use super::wire::{ChatCompletion, ToolCall};
use super::{ChatResponse, ChatSession, Metrics};
use crate::defaults;
use crate::mcp::call::{self, Ended, Origin};
use crate::mcp::{McpError, McpErrorCode, McpTask, ToolCallOutput};
use crate::observe::{self, ArgumentsSummary, Metrics as HostMetrics, ToolKind, ToolOutcome, Via};
use crate::sandbox::{Charge, Deadline, DeadlineExceeded, HostcallError, MemoryBudget, heap};

/// Runs guest tools. The `cchat_*` glue implements it on the task's store; this module never
/// touches wasm.
pub(crate) trait GuestTools: Send {
    /// Calls the guest function at `table_index` with JSON `args`. `Ok(Ok(text))` is its
    /// result with the charge for holding it (taken before it was copied), `Ok(Err(reason))`
    /// a failure the model is told about, `Err` a trap that ends the task.
    fn call(
        &mut self,
        table_index: u32,
        args: &str,
    ) -> impl Future<Output = Result<Result<(String, Charge), String>, wasmtime::Error>> + Send;
}

/// What a send may use besides the session.
pub(crate) struct SendContext<'a> {
    pub(crate) task_id: &'a str,
    pub(crate) session_fd: i32,
    pub(crate) mcp: &'a McpTask,
    pub(crate) backends: &'a Backends,
    /// The host's Prometheus metrics (LLM requests, tokens, budget hits).
    pub(crate) metrics: &'a HostMetrics,
    pub(crate) deadline: Deadline,
    pub(crate) budget: &'a MemoryBudget,
    /// The task's last MCP half of a tool set.
    pub(crate) tool_cache: &'a ToolCache,
}

/// The response, and the messages the send adds to its session (already charged).
pub(crate) struct SendOutcome {
    pub(crate) response: ChatResponse,
    pub(crate) added: Vec<Message>,
    pub(crate) added_charge: Charge,
}

/// The messages a send adds, charged as they are added.
struct Added {
    messages: Vec<Message>,
    charge: Charge,
}

/// A request body's fixed parts beyond what the session and the send already hold (its
/// top-level object, the model name's copy, the messages array's spare room).
const REQUEST_OVERHEAD: u64 = 4096;

/// A tool call the model asked for, as planned before running.
struct Planned<'a> {
    id: String,
    name: String,
    step: Step<'a>,
}

enum Step<'a> {
    Guest {
        table_index: u32,
        args: String,
        /// For the observers (an MCP call's gate makes its own).
        summary: ArgumentsSummary,
    },
    Mcp {
        route: &'a Route,
        tool: String,
    },
    Refused {
        kind: &'static str,
        failure: ToolFailure,
    },
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// What a send has done so far: its counters, the messages it adds (charged as added) and
/// the summary of each tool call it ran.
struct Progress {
    metrics: Metrics,
    added: Added,
    summary: Vec<ToolCallSummary>,
    /// The charge of the model's latest answer, held while the answer is: through the tool
    /// turn it asked for (which reads its calls from it), or until the send's response is
    /// built from it.
    answer: Option<Charge>,
}

/// Sends `session`. Tool failures and upstream errors end up in the response; an `Err` is
/// a trap in a guest tool, or `-ENOMEM` when the budget cannot hold what the send needs.
pub(crate) async fn send<G: GuestTools>(
    session: &ChatSession,
    ctx: &SendContext<'_>,
    guest: &mut G,
    auto_tool_call: bool,
) -> Result<SendOutcome, HostcallError> {
    let started = Instant::now();
    let mut progress = Progress {
        metrics: Metrics::default(),
        added: Added {
            messages: Vec::new(),
            charge: ctx.budget.empty("cchat_send messages"),
        },
        summary: Vec::new(),
        answer: None,
    };
    let backend = match ctx.backends.get(session.settings.backend.as_deref()) {
        Ok(backend) => backend,
        Err(error) => {
            let body = response::no_backend(session.settings.backend.as_deref(), &error);
            return Ok(finish(body, progress, started, ctx.budget)?);
        }
    };
    let model = session
        .settings
        .model
        .clone()
        .unwrap_or_else(|| backend.default_model().to_owned());
    let (tools, _tools_charge) = charged_tool_set(session, ctx).await?;
    let send = Loop {
        session,
        ctx,
        backend: &backend,
        model: &model,
        tools: &tools,
        auto_tool_call,
    };
    let outcome = send.run(&mut progress, guest).await?;
    let body = {
        let spear = response::spear(
            backend.name(),
            &model,
            &progress.metrics,
            &progress.summary,
            &tools,
            session.mcp.decision_log,
        );
        response::body(outcome, &spear)
    };
    Ok(finish(body, progress, started, ctx.budget)?)
}

/// The send's tool set, charged to the budget for what it holds beyond the session; every
/// policy decision behind it is logged.
async fn charged_tool_set<'s>(
    session: &'s ChatSession,
    ctx: &SendContext<'_>,
) -> Result<(ToolSet<'s>, Charge), HostcallError> {
    let tools = ToolSet::build(session, ctx.mcp, Some((ctx.tool_cache, ctx.budget))).await;
    let charge = ctx.budget.charge("cchat_send tool set", tools.held())?;
    if tracing::enabled!(tracing::Level::INFO) {
        for decision in tools.decisions() {
            tracing::info!(task_id = ctx.task_id, session_fd = ctx.session_fd, server_id = %decision.server_id, tool = decision.tool.as_deref(), reason = ?decision.reason, detail = %decision.detail, "MCP policy decision");
        }
    }
    if session.mcp.enabled && tools.servers().is_empty() && !session.mcp.server_ids.is_empty() {
        tracing::warn!(
            task_id = ctx.task_id,
            session_fd = ctx.session_fd,
            "no MCP server is usable for this chat session; continuing without MCP tools"
        );
    }
    Ok((tools, charge))
}

/// One send's request loop: ask the model, run the tools it wants, ask again.
struct Loop<'a, 'c> {
    session: &'a ChatSession,
    ctx: &'a SendContext<'c>,
    backend: &'a Backend,
    model: &'a str,
    tools: &'a ToolSet<'a>,
    auto_tool_call: bool,
}

impl Loop<'_, '_> {
    /// The model's last answer, or why the send ended without one.
    async fn run<G: GuestTools>(
        &self,
        progress: &mut Progress,
        guest: &mut G,
    ) -> Result<Result<ChatCompletion, SendError>, HostcallError> {
        let (session, ctx) = (self.session, self.ctx);
        let mut total_calls = 0u32;
        loop {
            progress.metrics.iterations += 1;
            let completion = match self.ask(progress).await? {
                Ok((completion, charge)) => {
                    progress.answer = Some(charge);
                    completion
                }
                Err(error) => return Ok(Err(error)),
            };
            let Some(message) = completion.message() else {
                let error = LlmError::InvalidResponse {
                    backend: self.backend.name().to_owned(),
                    message: "no choices[0].message".into(),
                    source: None,
                };
                return Ok(Err(error.into()));
            };
            let calls = message.tool_calls();
            if calls.is_empty() {
                let message = Message::assistant(message, &mut progress.added.charge)?;
                progress.added.messages.push(message);
                return Ok(Ok(completion));
            }
            if !self.auto_tool_call {
                // The guest runs the tools and appends this message itself (manual loop).
                return Ok(Ok(completion));
            }
            if completion.finish_reason() == Some("length") {
                ctx.metrics.budget_hit("max_tokens");
                return Ok(Err(SendError::ToolCallsTruncated {
                    last_response: Box::new(completion),
                }));
            }
            let wanted = u32::try_from(calls.len()).unwrap_or(u32::MAX);
            if let Some((limit, max)) =
                turn_limit(session, progress.metrics.iterations, wanted, total_calls)
            {
                ctx.metrics.budget_hit(limit);
                return Ok(Err(SendError::limit(limit, max, completion)));
            }
            total_calls += wanted;
            // The message goes into the session as it came (charged first); the turn reads
            // its calls from the answer, which stays charged until the turn ends.
            let assistant = Message::assistant(message, &mut progress.added.charge)?;
            let calls: Vec<Call<'_>> = calls.iter().map(Call::of).collect();
            let at = progress.added.messages.len();
            let tools_started = Instant::now();
            let turn = Turn {
                rich_results: self.backend.takes_rich_results(),
                tools: self.tools,
                session,
                ctx,
                metrics: &mut progress.metrics,
                summary: &mut progress.summary,
                added: &mut progress.added,
            };
            run_tool_calls(&calls, turn, guest).await?;
            progress.added.messages.insert(at, assistant);
            progress.answer = None;
            progress.metrics.latency_ms.tools += ms(tools_started.elapsed());
        }
    }

    /// One request with the session, what the send added and the tool set. Its body
    /// borrows them; its JSON text is charged as it is written (a backend that translates
    /// the body gets a copy as a value, charged with its serialised form).
    async fn ask(
        &self,
        progress: &mut Progress,
    ) -> Result<Result<(ChatCompletion, Charge), SendError>, HostcallError> {
        let (session, ctx, backend) = (self.session, self.ctx, self.backend);
        let tools = self.tools;
        let body = RequestBody {
            upstream: &session.upstream,
            tool_choice: session
                .upstream
                .get("tool_choice")
                .and_then(|c| tools.map_tool_choice(c)),
            model: self.model,
            messages: &session.messages,
            added: &progress.added.messages,
            tools: tools.definitions(),
            plain: backend.drops_rich_results(),
        };
        let mut request_charge = ctx.budget.empty("cchat_send request");
        let reply = if backend.sends_json_as_is() {
            let json = request::encode(&body, &mut request_charge).map_err(|_| Errno::ENOMEM)?;
            let body = Payload::Json(json.into());
            self.request(body, &mut progress.metrics).await
        } else {
            // The session, what the send added and the MCP tools' definitions, copied into
            // the value.
            let copied = value_copy_cost(
                session
                    .charged_bytes()
                    .saturating_add(progress.added.charge.bytes()),
                session.messages.iter().chain(&progress.added.messages),
                &session.guest_tools,
            )
            .saturating_add(tools.mcp_value_cost());
            request_charge.grow(copied.saturating_add(REQUEST_OVERHEAD))?;
            let value = serde_json::to_value(&body).unwrap_or_default();
            // The backend serialises what it translates this into.
            request_charge.grow(heap::alloc(heap::json_len(&value)))?;
            self.request(Payload::Value(&value), &mut progress.metrics)
                .await
        };
        drop(request_charge);
        match reply {
            // As for the request: the guest learns that its budget is spent.
            Err(LlmError::AnswerOverBudget { .. }) => Err(Errno::ENOMEM.into()),
            reply => Ok(reply.map_err(SendError::from)),
        }
    }

    async fn request(
        &self,
        body: Payload<'_>,
        metrics: &mut Metrics,
    ) -> Result<(ChatCompletion, Charge), LlmError> {
        let (backend, session, ctx) = (self.backend, self.session, self.ctx);
        let configured = session
            .settings
            .timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(backend.timeout());
        let remaining = ctx.deadline.remaining();
        let started = Instant::now();
        let span = spans::model_request(backend, self.model);
        let mut answer = ctx.budget.empty("cchat_send answer");
        let reply = backend
            .send(body, configured.min(remaining), &mut answer)
            .instrument(span.clone())
            .await;
        metrics.latency_ms.llm += ms(started.elapsed());
        match &reply {
            Ok(reply) => spans::record_reply(&span, &reply.body),
            Err(failure) => spans::record_error(&span, &failure.error),
        }
        match reply {
            Ok(reply) => {
                metrics.llm_requests += 1 + reply.retries;
                metrics.llm_retries += reply.retries;
                ctx.metrics.llm_request(backend.name(), "ok");
                if let Some(usage) = reply.body.usage() {
                    metrics.add_usage(usage);
                    let tokens = |n: Option<u64>| n.unwrap_or(0);
                    ctx.metrics.llm_tokens(
                        backend.name(),
                        tokens(usage.prompt_tokens),
                        tokens(usage.completion_tokens),
                    );
                }
                Ok((reply.body, answer))
            }
            Err(failure) => {
                ctx.metrics
                    .llm_request(backend.name(), failure.error.code());
                metrics.llm_requests += 1 + failure.retries;
                metrics.llm_retries += failure.retries;
                metrics.llm_errors += 1;
                tracing::warn!(task_id = ctx.task_id, backend = backend.name(), error = %failure.error, "LLM request failed");
                Err(failure.error)
            }
        }
    }
}

/// The limit the next turn's `wanted` tool calls would pass, with its value, if any.
fn turn_limit(
    session: &ChatSession,
    iterations: u32,
    wanted: u32,
    total_calls: u32,
) -> Option<(&'static str, u32)> {
    let settings = &session.settings;
    if iterations >= settings.max_iterations {
        Some(("max_iterations", settings.max_iterations))
    } else if wanted > defaults::MAX_TOOL_CALLS_PER_TURN {
        Some(("max_tool_calls_per_turn", defaults::MAX_TOOL_CALLS_PER_TURN))
    } else if total_calls.saturating_add(wanted) > settings.max_total_tool_calls {
        Some(("max_total_tool_calls", settings.max_total_tool_calls))
    } else {
        None
    }
}

fn finish(
    body: Vec<u8>,
    mut progress: Progress,
    started: Instant,
    budget: &MemoryBudget,
) -> Result<SendOutcome, Errno> {
    progress.metrics.latency_ms.total = ms(started.elapsed());
    Ok(SendOutcome {
        response: ChatResponse::new(body, progress.metrics, budget)?,
        added: progress.added.messages,
        added_charge: progress.added.charge,
    })
}

/// A tool call of the assistant message a turn runs, read from that message.
struct Call<'a> {
    id: Option<&'a str>,
    name: &'a str,
    arguments: &'a str,
}

impl<'a> Call<'a> {
    fn of(call: &'a ToolCall) -> Self {
        Self {
            id: call.id(),
            name: &call.function.name,
            arguments: &call.function.arguments,
        }
    }
}

/// Arguments for an MCP tool, with the charge for holding them.
type McpArguments = (Map<String, Value>, Charge);

/// The model's arguments for an MCP tool, parsed with their cost charged to the task.
fn mcp_arguments(raw: &str, budget: &MemoryBudget) -> Result<McpArguments, ToolFailure> {
    if raw.trim().is_empty() {
        return Ok((Map::new(), budget.empty("cchat_send tool arguments")));
    }
    match budget.parse_json("cchat_send tool arguments", raw.as_bytes()) {
        Ok((Value::Object(map), charge)) => Ok((map, charge)),
        Ok(_) => Err(McpError::new(
            McpErrorCode::InvalidArguments,
            "tool arguments must be a JSON object",
        )
        .into()),
        Err(Errno::ENOMEM) => Err(budget_exhausted("the tool arguments")),
        Err(_) => {
            // Why, without building anything: IgnoredAny holds no value.
            let why = serde_json::from_str::<serde::de::IgnoredAny>(raw)
                .err()
                .map_or_else(String::new, |e| format!(": {e}"));
            Err(McpError::new(
                McpErrorCode::InvalidArguments,
                format!("tool arguments are not valid JSON{why}"),
            )
            .into())
        }
    }
}

/// The failure the model sees when the task's host memory budget cannot hold `what`.
fn budget_exhausted(what: &str) -> ToolFailure {
    ToolFailure::new(
        ToolErrorCode::Mcp(McpErrorCode::OutputTooLarge),
        format!(
            "{what} do not fit: the host memory budget of the task is exhausted (limits.host_memory_bytes)"
        ),
    )
}

/// The bytes a tool's result holds: its text and its images' data.
fn result_bytes(text: &str, images: &[Image]) -> u64 {
    let bytes = images.iter().fold(text.len(), |sum, image| {
        sum.saturating_add(image.data.len())
    });
    heap::string(bytes as u64)
}

/// The event of `planned`'s call of a guest tool, for the observers.
fn observed_guest_call(
    ctx: &SendContext<'_>,
    planned: &Planned<'_>,
    arguments: &ArgumentsSummary,
) -> observe::ToolCall {
    observe::ToolCall {
        task_id: ctx.task_id.into(),
        // Set by the observers from the task's.
        principal: None,
        client: None,
        session_fd: Some(ctx.session_fd),
        via: Via::Chat,
        kind: ToolKind::Guest,
        tool: planned.name.clone(),
        arguments: arguments.clone(),
        argument_values: None,
        started_at: SystemTime::now(),
    }
}

/// The server's answer to an MCP call the gate ran, or the failure the model is told of.
fn answered(
    ended: Result<Ended, DeadlineExceeded>,
    server_id: &str,
    tool: &str,
) -> Result<ToolCallOutput, ToolFailure> {
    match ended {
        Ok(Ended::Answered(output)) => Ok(output),
        Ok(Ended::Failed { error, .. }) => Err(error.into()),
        Ok(Ended::Refused(refusal)) => Err(call::refused(server_id, tool, &refusal).into()),
        Err(exceeded) => Err(McpError::new(
            McpErrorCode::Timeout,
            format!("tool `{tool}` of server `{server_id}`: {exceeded}"),
        )
        .into()),
    }
}

/// Each planned call's result (its text and the image blocks kept for the model) and time.
type ToolResults = Vec<Option<(Result<(String, Vec<Image>), ToolFailure>, Duration)>>;

/// What one turn of tool calls works with, and where its results go.
struct Turn<'a, 'c> {
    /// The backend sends images of MCP results to the model, so tool messages keep them.
    rich_results: bool,
    tools: &'a ToolSet<'a>,
    session: &'a ChatSession,
    ctx: &'a SendContext<'c>,
    metrics: &'a mut Metrics,
    summary: &'a mut Vec<ToolCallSummary>,
    added: &'a mut Added,
}

/// Runs one turn's tool calls: MCP calls concurrently (each server's `max_concurrency`
/// bounds them), guest tools one at a time alongside; adds the `tool` messages in the
/// model's order. Each result is charged as it arrives (a guest tool's before it is
/// copied); one the budget cannot hold fails that call alone, and each is given back once
/// cut for its message.
async fn run_tool_calls<G: GuestTools>(
    calls: &[Call<'_>],
    turn: Turn<'_, '_>,
    guest: &mut G,
) -> Result<(), HostcallError> {
    let Turn {
        rich_results,
        tools,
        session,
        ctx,
        metrics,
        summary,
        added,
    } = turn;
    // MCP arguments, parsed and charged, by call index; each is moved into its call.
    let mut mcp_args: Vec<Option<Result<McpArguments, ToolFailure>>> =
        calls.iter().map(|_| None).collect();
    // The chat loop's MCP calls go through the same gate as a guest's `mcp_call_tool`.
    let origin = &Origin {
        task_id: Arc::from(ctx.task_id),
        session_fd: Some(ctx.session_fd),
        via: Via::Chat,
        deadline: ctx.deadline,
        // A guest's callback is called only from its own waiting hostcall.
        to_guest: None,
    };
    let planned: Vec<Planned<'_>> = calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let id = call.id.map_or_else(|| format!("call_{i}"), str::to_owned);
            let name = call.name.to_owned();
            let raw = call.arguments;
            let step = match tools.resolve(&name) {
                Resolution::Route(Route::Guest { table_index }) => Step::Guest {
                    table_index: *table_index,
                    args: raw.to_owned(),
                    summary: ArgumentsSummary::of_json_text(raw),
                },
                Resolution::Route(route @ Route::Mcp { tool, .. }) => {
                    mcp_args[i] = Some(mcp_arguments(raw, ctx.budget));
                    Step::Mcp {
                        route,
                        tool: tool.clone(),
                    }
                }
                Resolution::Denied {
                    server_id,
                    tool,
                    reason,
                    why,
                } => {
                    origin.report_denial(ctx.mcp, (&server_id, &tool), reason, why.clone());
                    let message = format!("tool `{tool}` of server `{server_id}` is not available in this chat session: {why}");
                    Step::Refused {
                        kind: "denied",
                        failure: McpError::new(McpErrorCode::PolicyDenied, message).into(),
                    }
                }
                Resolution::Unknown => Step::Refused {
                    kind: "unknown",
                    failure: ToolFailure::new(
                        ToolErrorCode::UnknownTool,
                        format!("no tool named `{name}` was offered in this session"),
                    ),
                },
            };
            Planned { id, name, step }
        })
        .collect();

    // Each result is charged as it arrives, so a turn's results never sit in the host
    // uncharged while its other calls run; one the budget cannot hold fails that call.
    let mcp_calls = planned
        .iter()
        .zip(mcp_args)
        .enumerate()
        .filter_map(|(i, (p, args))| match (&p.step, args) {
            (
                Step::Mcp {
                    route:
                        Route::Mcp {
                            entry, approval, ..
                        },
                    tool,
                },
                Some(args),
            ) => Some(async move {
                let started = Instant::now();
                let result = match args {
                    Ok((args, args_charge)) => {
                        let raw = calls[i].arguments.as_bytes();
                        let ended =
                            call::run(ctx.mcp, origin, entry, tool, *approval, args, raw).await;
                        drop(args_charge);
                        answered(ended, entry.server_id(), tool)
                            .and_then(|out| {
                                let text = mcp_result_text(&out.result)?;
                                let images = if rich_results {
                                    mcp_result_images(&out.result)
                                } else {
                                    Vec::new()
                                };
                                Ok((text, images))
                            })
                            .and_then(|(text, images)| {
                                match ctx
                                    .budget
                                    .charge("cchat_send tool results", result_bytes(&text, &images))
                                {
                                    Ok(charge) => Ok(((text, images), charge)),
                                    Err(_) => Err(budget_exhausted("the tool's result")),
                                }
                            })
                    }
                    Err(failure) => Err(failure),
                };
                (i, result, started.elapsed())
            }),
            _ => None,
        });
    let mut outputs = ctx.budget.empty("cchat_send tool results");
    let guest_outputs = &mut outputs;
    let guest_calls = async {
        let mut done = Vec::new();
        for (i, p) in planned.iter().enumerate() {
            if let Step::Guest {
                table_index,
                args,
                summary,
            } = &p.step
            {
                let started = Instant::now();
                let observed = ctx
                    .mcp
                    .observers
                    .start(observed_guest_call(ctx, p, summary));
                let span = spans::guest_tool(&p.name, &p.id);
                let result = guest
                    .call(*table_index, args)
                    .instrument(span.clone())
                    .await
                    .map_err(HostcallError::Trap)?;
                match &result {
                    Ok((text, _)) => observed.finish(ToolOutcome::Ok, text.len() as u64),
                    Err(_) => {
                        spans::record_tool_error(&span);
                        observed.finish(ToolOutcome::ToolError, 0)
                    }
                }
                let result = result
                    .map(|(text, charge)| {
                        guest_outputs.absorb(charge);
                        (text, Vec::new())
                    })
                    .map_err(ToolFailure::exec);
                done.push((i, result, started.elapsed()));
            }
        }
        Ok::<_, HostcallError>(done)
    };
    let (mcp_done, guest_done) = tokio::join!(futures::future::join_all(mcp_calls), guest_calls);
    let guest_done = guest_done?;
    let mut results: ToolResults = planned.iter().map(|_| None).collect();
    for (i, result, elapsed) in mcp_done {
        let result = result.map(|(text, charge)| {
            outputs.absorb(charge);
            text
        });
        results[i] = Some((result, elapsed));
    }
    for (i, result, elapsed) in guest_done {
        results[i] = Some((result, elapsed));
    }

    let max = session.settings.max_tool_output_bytes as usize;
    for (p, result) in planned.iter().zip(results) {
        let mut images = Vec::new();
        // `held`: what `outputs` holds for this result.
        let (entry, content, held) = match (&p.step, result) {
            (Step::Refused { kind, failure }, _) => {
                match *kind {
                    "denied" => metrics.tool_calls.denied += 1,
                    _ => metrics.tool_calls.unknown += 1,
                }
                let entry = ToolCallSummary::new(&p.id, &p.name, kind, false);
                (entry, failure.to_content(), 0)
            }
            (step, Some((result, elapsed))) => {
                let mut entry = match step {
                    Step::Guest { .. } => {
                        metrics.tool_calls.guest += 1;
                        ToolCallSummary::new(&p.id, &p.name, "guest", result.is_ok())
                    }
                    Step::Mcp { route, tool } => {
                        metrics.tool_calls.mcp += 1;
                        let mut entry = ToolCallSummary::new(&p.id, &p.name, "mcp", result.is_ok());
                        if let Route::Mcp { entry: server, .. } = route {
                            entry.server_id = Some(server.server_id().to_owned());
                        }
                        entry.tool = Some(tool.clone());
                        entry
                    }
                    Step::Refused { kind, .. } => {
                        ToolCallSummary::new(&p.id, &p.name, kind, result.is_ok())
                    }
                };
                entry.ms = Some(ms(elapsed));
                match result {
                    Ok((text, found)) => {
                        let held = result_bytes(&text, &found);
                        images = found;
                        (entry, text, held)
                    }
                    Err(failure) => {
                        metrics.tool_calls.failed += 1;
                        entry.error = Some(failure.code.as_str());
                        (entry, failure.to_content(), 0)
                    }
                }
            }
            (_, None) => unreachable!("every planned call ran"),
        };
        summary.push(entry);
        // The full result goes once cut; its message is charged on its own.
        let content = truncate_output(content, max);
        // Images share the result's bytes with its text, in their order, while they fit.
        let mut room = max.saturating_sub(content.len());
        images.retain(|image| {
            let fits = image.data.len() <= room;
            if fits {
                room -= image.data.len();
            }
            fits
        });
        let blocks = images.into_iter().map(Image::into_block).collect();
        let message = Message::tool_result(&p.id, &content, blocks, &mut added.charge)?;
        outputs.shrink(held);
        added.messages.push(message);
    }
    Ok(())
}
