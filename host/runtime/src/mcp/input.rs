//! Multi round-trip requests (SEP-2322): a server may answer `tools/call`, `prompts/get`
//! or `resources/read` with `resultType: "input_required"`, asking the client questions
//! (`elicitation/create`), for a model's completion (`sampling/createMessage`) or for its
//! roots (`roots/list`). The host answers them for the task the request belongs to and
//! sends the request again: with a fresh JSON-RPC id (rmcp numbers every request), the
//! answers as `inputResponses`, and `requestState` echoed exactly as the server sent it
//! (and only if it sent one). Nothing of one request's rounds reaches another: each
//! [`rounds`] holds its own state.
//!
//! Who answers, for the task ([`Asker`]): a question goes to the host's elicitor (by
//! default its [approver](crate::approval)), within the server's `approval_timeout_ms` and
//! the task's deadline, else it is declined; its form is checked and bounded before it is
//! shown, and an accepted answer is checked against it, the form's defaults filled in for
//! fields left out (SEP-1034), or it is declined. Roots are the task's declared ones
//! (`TaskSpec::roots`, none by default; they widen nothing). Sampling is answered by the
//! task's model when the server's record allows it ([`super::sampling`]); a refused one
//! fails the request (`mcp_policy_denied` when policy refused it), since an
//! `inputResponses` entry cannot carry an error. Each round, with what became of each input
//! request, reaches the observers (and so the audit log).
//!
//! Rounds are bounded ([`defaults::MAX_INPUT_ROUNDS`]), as are the input requests of one
//! round; each round is one request to the server with its own `tool_timeout_ms`, so time
//! a person takes to answer is not the server's: it is bounded by the approval timeout and
//! the task's deadline instead.
//!
//! Servers of the 2025 protocol ask the same questions as requests of their own during a
//! call; the connection's handler routes them here too ([`InFlight`]).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rmcp::model::{
    ElicitRequestParams, ElicitResult, ElicitationAction, InputRequest, InputRequests,
    InputRequiredResult, InputResponses,
};
use serde_json::Value;

use super::guest_answers::{Question, ToGuest};
use super::sampling::{self, Generation, TaskSampler};
use super::{McpError, McpErrorCode};
use crate::approval::{
    Approvals, ElicitationAnswer, ElicitationRequest, check_answer, next_id, timeout_of,
};
use crate::defaults;
use crate::observe::{InputAnswered, InputRound, Observers, Via};
use crate::registry::ServerEntry;
use crate::sandbox::{Deadline, off_stack};
use crate::text::{cut, printable};

/// Who answers the input requests of one task's request.
#[derive(Clone, Debug)]
pub(crate) struct Asker {
    pub(crate) task_id: Arc<str>,
    pub(crate) observers: Observers,
    pub(crate) approvals: Approvals,
    /// Answers the server's sampling requests for the task.
    pub(crate) sampler: Arc<dyn TaskSampler>,
    pub(crate) session_fd: Option<i32>,
    pub(crate) via: Via,
    pub(crate) deadline: Deadline,
    /// The guest's own answerer, when it opted in on the fd (`mcp_elicit_fn`): asked
    /// instead of the host's elicitor.
    pub(crate) to_guest: Option<ToGuest>,
    /// The task's declared roots, the answer to `roots/list`.
    pub(crate) roots: Arc<[crate::TaskRoot]>,
}

/// What the server answered one round.
pub(crate) enum Round<T> {
    Complete(T),
    InputRequired(InputRequiredResult),
}

/// The request being made, for errors, questions and observers.
#[derive(Clone, Copy)]
pub(crate) struct Asked<'a> {
    pub(crate) entry: &'a ServerEntry,
    /// `tools/call`, `prompts/get` or `resources/read`.
    pub(crate) method: &'static str,
    /// The tool, prompt or URI.
    pub(crate) name: &'a str,
}

/// Sends a request until the server completes it: `send` makes one round, given the
/// previous round's answers and the server's `requestState` (both `None` the first time).
pub(crate) async fn rounds<T, F, Fut>(
    asker: &Asker,
    asked: Asked<'_>,
    mut send: F,
) -> Result<T, McpError>
where
    F: FnMut(Option<InputResponses>, Option<String>) -> Fut,
    Fut: Future<Output = Result<Round<T>, McpError>>,
{
    let (mut responses, mut state) = (None, None);
    let mut backoff = Duration::from_millis(50);
    for round in 1..=defaults::MAX_INPUT_ROUNDS {
        let input = match send(responses.take(), state.take()).await? {
            Round::Complete(done) => return Ok(done),
            Round::InputRequired(input) => input,
        };
        let requests = input.input_requests.unwrap_or_default();
        if requests.is_empty() {
            // Only `requestState`: the server sheds load; wait a little before retrying.
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(defaults::INPUT_STATE_ONLY_BACKOFF_MAX);
        } else {
            // Off the stack: answering is rare, and its future would make every request's
            // larger (see `off_stack`).
            let answers = off_stack(|| asker.answer(asked, round as u32, requests)).await?;
            responses = Some(answers);
        }
        state = input.request_state;
    }
    Err(McpError::new(
        McpErrorCode::ToolExecFailed,
        format!(
            "server `{}` still asked for input after {} rounds of {} `{}`; the host gives up (at most {} rounds)",
            asked.entry.server_id(),
            defaults::MAX_INPUT_ROUNDS,
            asked.method,
            cut(asked.name, defaults::MAX_TOOL_NAME_BYTES),
            defaults::MAX_INPUT_ROUNDS,
        ),
    ))
}

impl Asker {
    /// Answers one round's `requests`, and reports the round to the observers. `Err` when
    /// one was refused (sampling), or there are too many. Also answers a server task's
    /// input requests (`tasks/update`, see the pool's `tasks`).
    pub(crate) async fn answer(
        &self,
        asked: Asked<'_>,
        round: u32,
        requests: InputRequests,
    ) -> Result<InputResponses, McpError> {
        let server_id = asked.entry.server_id();
        if requests.len() > defaults::MAX_INPUT_REQUESTS {
            let error = McpError::new(
                McpErrorCode::ToolExecFailed,
                format!(
                    "server `{server_id}` asked for {} inputs at once during {}; at most {} are answered",
                    requests.len(),
                    asked.method,
                    defaults::MAX_INPUT_REQUESTS
                ),
            );
            self.report(asked, round, Vec::new());
            return Err(error);
        }
        let mut responses = InputResponses::new();
        let mut inputs = Vec::with_capacity(requests.len());
        let mut refused = None;
        for (key, request) in requests {
            let shown_key = cut(&key, defaults::MAX_TOOL_NAME_BYTES).to_owned();
            match request {
                InputRequest::Elicitation(request) => {
                    let (result, by) = self.elicit(asked, request.params).await;
                    inputs.push(InputAnswered {
                        key: shown_key,
                        kind: "elicitation",
                        outcome: action_name(&result.action),
                        by,
                    });
                    responses.insert(key, to_json(&result));
                }
                InputRequest::ListRoots(_) => {
                    inputs.push(InputAnswered {
                        key: shown_key,
                        kind: "roots",
                        outcome: "answered",
                        by: "host",
                    });
                    responses.insert(key, serde_json::json!({"roots": &*self.roots}));
                }
                InputRequest::CreateMessage(request) => {
                    let sampled = self
                        .sample(asked, Generation::InputRequired, request.params)
                        .await;
                    let (outcome, by) = match sampled {
                        Ok(result) => {
                            responses.insert(key, to_json(&result));
                            ("answered", "model")
                        }
                        Err(why) => {
                            refused.get_or_insert(sampling::to_mcp_error(asked, &why));
                            ("refused", "host")
                        }
                    };
                    inputs.push(InputAnswered {
                        key: shown_key,
                        kind: "sampling",
                        outcome,
                        by,
                    });
                }
                _ => {
                    inputs.push(InputAnswered {
                        key: shown_key,
                        kind: "unknown",
                        outcome: "refused",
                        by: "host",
                    });
                    refused.get_or_insert(McpError::new(
                        McpErrorCode::ToolExecFailed,
                        format!(
                            "server `{server_id}` asked for input of a kind this host does not know during {} `{}`",
                            asked.method,
                            cut(asked.name, defaults::MAX_TOOL_NAME_BYTES),
                        ),
                    ));
                }
            }
        }
        tracing::info!(task_id = %self.task_id, server_id, method = asked.method, round, inputs = ?inputs, "answered the server's input requests");
        self.report(asked, round, inputs);
        match refused {
            Some(error) => Err(error),
            None => Ok(responses),
        }
    }

    fn report(&self, asked: Asked<'_>, round: u32, inputs: Vec<InputAnswered>) {
        self.observers.input_round(&InputRound {
            task_id: self.task_id.clone(),
            // Set by the observers from the task's.
            principal: None,
            client: None,
            session_fd: self.session_fd,
            via: self.via,
            server_id: asked.entry.server_id().to_owned(),
            method: asked.method,
            name: cut(asked.name, defaults::MAX_RESOURCE_URI_BYTES).to_owned(),
            round,
            inputs,
            at: SystemTime::now(),
        });
    }

    /// One question's answer and who gave it: the elicitor's, checked, or a decline.
    pub(crate) async fn elicit(
        &self,
        asked: Asked<'_>,
        params: ElicitRequestParams,
    ) -> (ElicitResult, &'static str) {
        let server_id = asked.entry.server_id();
        let decline = |why: &str| {
            tracing::info!(task_id = %self.task_id, server_id, why, "declined the server's question");
            (ElicitResult::new(ElicitationAction::Decline), "host")
        };
        let (message, schema) = match params {
            ElicitRequestParams::FormElicitationParams {
                message,
                requested_schema,
                ..
            } => (message, requested_schema),
            // The host opens no page a server names.
            _ => return decline("a URL elicitation"),
        };
        let schema = match check_schema(&schema) {
            Ok(schema) => schema,
            Err(why) => return decline(&why),
        };
        let timeout = timeout_of(asked.entry).min(self.deadline.remaining());
        let requested_at = SystemTime::now();
        let request = ElicitationRequest {
            id: next_id(),
            task_id: self.task_id.clone(),
            principal: self.observers.principal().cloned(),
            client: self.observers.client().cloned(),
            via: self.via,
            server_id: server_id.to_owned(),
            method: asked.method,
            name: printable(cut(asked.name, defaults::MAX_RESOURCE_URI_BYTES)),
            message: printable(cut(&message, defaults::MAX_ELICITATION_MESSAGE_BYTES)),
            requested_schema: schema.clone(),
            requested_at,
            expires_at: requested_at.checked_add(timeout).unwrap_or(requested_at),
        };
        let until = tokio::time::Instant::now() + timeout;
        let (answer, by) = match &self.to_guest {
            Some(to_guest) => (ask_guest(to_guest, request, until).await, "guest"),
            None => (self.approvals.elicit(request, until).await, "approver"),
        };
        match answer {
            None if by == "guest" => {
                tracing::info!(task_id = %self.task_id, server_id, "declined the server's question: the guest gave no answer in time");
                (ElicitResult::new(ElicitationAction::Decline), by)
            }
            None => decline("nobody answers servers' questions on this host"),
            Some(ElicitationAnswer::Decline) => (ElicitResult::new(ElicitationAction::Decline), by),
            Some(ElicitationAnswer::Cancel) => (ElicitResult::new(ElicitationAction::Cancel), by),
            Some(ElicitationAnswer::Accept { content }) => match check_answer(&schema, content) {
                Ok(content) => (
                    ElicitResult::new(ElicitationAction::Accept)
                        .with_content(Value::Object(content)),
                    by,
                ),
                Err(why) => {
                    tracing::info!(task_id = %self.task_id, server_id, by, why, "declined the server's question: the answer does not fit the form");
                    (ElicitResult::new(ElicitationAction::Decline), by)
                }
            },
        }
    }
}

/// Puts `request` to the guest's callback through the hostcall waiting for the request;
/// `None` when it gives no answer by `until` (or the hostcall is gone).
async fn ask_guest(
    to_guest: &ToGuest,
    request: ElicitationRequest,
    until: tokio::time::Instant,
) -> Option<ElicitationAnswer> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let asked = async {
        to_guest.send(Question { request, reply }).await.ok()?;
        answer.await.ok().flatten()
    };
    let answer = tokio::time::timeout_at(until, asked).await.ok().flatten();
    // The hostcall polls this only once the guest's callback has returned: an answer that
    // came after the time passed is too late all the same.
    answer.filter(|_| tokio::time::Instant::now() <= until)
}

fn action_name(action: &ElicitationAction) -> &'static str {
    match action {
        ElicitationAction::Accept => "accept",
        ElicitationAction::Decline => "decline",
        _ => "cancel",
    }
}

/// `value` as JSON; `null` if it does not serialise (rmcp's types always do), which the
/// callers treat as a declined answer or a form too large to show.
fn to_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// The form as JSON, if it is within the host's bounds (rmcp has already refused one that
/// is not a flat object of primitive fields).
fn check_schema(schema: &rmcp::model::ElicitationSchema) -> Result<Value, String> {
    if schema.properties.len() > defaults::MAX_ELICITATION_FIELDS {
        return Err(format!(
            "the form has {} fields; at most {} are shown",
            schema.properties.len(),
            defaults::MAX_ELICITATION_FIELDS
        ));
    }
    let json = to_json(schema);
    let size = serde_json::to_vec(&json).map_or(usize::MAX, |b| b.len());
    if json.is_null() || size > defaults::MAX_ELICITATION_SCHEMA_BYTES {
        return Err(format!(
            "the form takes {size} bytes as JSON; at most {} are shown",
            defaults::MAX_ELICITATION_SCHEMA_BYTES
        ));
    }
    Ok(json)
}

/// The questions servers of the 2025 protocol ask during a call, as requests of their own:
/// the requests in flight on one connection, so its handler can tell whose call a
/// question belongs to. The protocol does not say which call it came with; the host asks
/// a task only when that task's one request is the only request in flight on the
/// connection (listings count, with no task), and declines otherwise: a question can never
/// reach another task, or another principal, than the one whose request it came with.
#[derive(Default)]
pub(crate) struct InFlight {
    next: std::sync::atomic::AtomicU64,
    requests: Mutex<Vec<(u64, Option<InFlightRequest>)>>,
}

/// A request's place in [`InFlight`], left when dropped.
pub(crate) struct Entered<'a> {
    in_flight: &'a InFlight,
    id: u64,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut requests = self
            .in_flight
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        requests.retain(|(id, request)| {
            let ended = *id == self.id;
            if let (true, Some(request)) = (ended, request) {
                // A question the server asked during it has nobody to answer for now.
                request.ended.cancel();
            }
            !ended
        });
    }
}

impl InFlight {
    /// `asking` keeps the time the request's questions wait for an answer, which its
    /// timeout does not count ([`timeout_besides_questions`]).
    pub(crate) fn enter(
        &self,
        asker: &Asker,
        entry: &Arc<ServerEntry>,
        (method, name): (&'static str, &str),
        asking: &Arc<Asking>,
    ) -> Entered<'_> {
        let request = InFlightRequest {
            asker: Arc::new(asker.clone()),
            entry: entry.clone(),
            method,
            name: cut(name, defaults::MAX_RESOURCE_URI_BYTES).to_owned(),
            questions: Arc::default(),
            asking: asking.clone(),
            ended: tokio_util::sync::CancellationToken::new(),
        };
        self.push(Some(request))
    }

    /// A request no task answers for (a listing): while it is in flight, no question is
    /// put to anyone.
    pub(crate) fn enter_unowned(&self) -> Entered<'_> {
        self.push(None)
    }

    fn push(&self, request: Option<InFlightRequest>) -> Entered<'_> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        requests.push((id, request));
        Entered {
            in_flight: self,
            id,
        }
    }

    /// The request in flight when it is the only one and a task's (`None` otherwise).
    pub(crate) fn sole(&self) -> Option<InFlightRequest> {
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        match requests.as_slice() {
            [(_, Some(only))] => Some(only.clone()),
            _ => None,
        }
    }
}

/// One request in flight on a connection, with whoever answers for its task.
#[derive(Clone)]
pub(crate) struct InFlightRequest {
    pub(crate) asker: Arc<Asker>,
    pub(crate) entry: Arc<ServerEntry>,
    pub(crate) method: &'static str,
    pub(crate) name: String,
    /// Questions the server asked during it, at most [`defaults::MAX_INPUT_REQUESTS`].
    questions: Arc<std::sync::atomic::AtomicUsize>,
    /// The time its questions waited, which its timeout does not count.
    asking: Arc<Asking>,
    /// Cancelled when the request ends (answered, timed out, its fd closed, its task gone).
    pub(crate) ended: tokio_util::sync::CancellationToken,
}

impl InFlightRequest {
    /// Counts one more question during this request; false past the cap.
    pub(crate) fn may_ask(&self) -> bool {
        self.questions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            < defaults::MAX_INPUT_REQUESTS
    }

    pub(crate) fn asked(&self) -> Asked<'_> {
        Asked {
            entry: &self.entry,
            method: self.method,
            name: &self.name,
        }
    }

    /// The task's roots, for a `roots/list` the server sent during this request (2025
    /// protocol); reported to the observers as a round of its own.
    pub(crate) fn list_roots(&self) -> Value {
        let input = InputAnswered {
            key: "roots/list".into(),
            kind: "roots",
            outcome: "answered",
            by: "host",
        };
        let number = self.questions.load(std::sync::atomic::Ordering::Relaxed) as u32;
        self.asker.report(self.asked(), number, vec![input]);
        serde_json::json!({"roots": &*self.asker.roots})
    }

    /// Answers a question the server asked during this request (2025 protocol) for its
    /// task, as an `input_required` round's would be: the wait is not counted against the
    /// request's timeout, and the question and its outcome reach the observers (and so
    /// the audit log) as a round of its own.
    pub(crate) async fn elicit(&self, params: ElicitRequestParams) -> ElicitResult {
        let number = self.questions.load(std::sync::atomic::Ordering::Relaxed) as u32;
        let (result, by) = {
            let _waiting = self.asking.start();
            self.asker.elicit(self.asked(), params).await
        };
        let input = InputAnswered {
            key: "elicitation/create".into(),
            kind: "elicitation",
            outcome: action_name(&result.action),
            by,
        };
        tracing::info!(task_id = %self.asker.task_id, server_id = self.entry.server_id(), method = self.method, question = number, input = ?input, "answered the server's question");
        self.asker.report(self.asked(), number, vec![input]);
        result
    }
}

/// The time a request's questions (2025 protocol) have waited for an answer so far.
#[derive(Debug, Default)]
pub(crate) struct Asking {
    state: Mutex<AskingState>,
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct AskingState {
    waited: Duration,
    /// Since when a question waits now; one at a time per connection.
    since: Option<tokio::time::Instant>,
}

/// A question waiting; its time is added when it is dropped.
pub(crate) struct Waiting<'a>(&'a Asking);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(since) = state.since.take() {
            state.waited += since.elapsed();
        }
        drop(state);
        self.0.changed.notify_one();
    }
}

impl Asking {
    fn start(&self) -> Waiting<'_> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.since.get_or_insert_with(tokio::time::Instant::now);
        drop(state);
        self.changed.notify_one();
        Waiting(self)
    }

    /// The time waited so far, and whether a question waits now.
    fn waited(&self) -> (Duration, bool) {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (state.waited, state.since.is_some())
    }
}

/// `work` within `limit`, not counting the time its questions wait for an answer (bounded
/// by the approval timeout and the task's deadline instead): a person's answer time is not
/// the server's. `Err` when it passed.
pub(crate) async fn timeout_besides_questions<F: Future>(
    limit: Duration,
    asking: &Asking,
    work: F,
) -> Result<F::Output, ()> {
    let started = tokio::time::Instant::now();
    let mut work = std::pin::pin!(work);
    loop {
        let (waited, now_asking) = asking.waited();
        let until = started + limit + waited;
        tokio::select! {
            done = &mut work => return Ok(done),
            () = asking.changed.notified() => {}
            () = tokio::time::sleep_until(until), if !now_asking => {
                if asking.waited() == (waited, false) {
                    return Err(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_time_a_question_waits_does_not_count_against_the_timeout() {
        let limit = Duration::from_millis(200);
        let asking = Asking::default();
        let asks = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            {
                let _waiting = asking.start();
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            "answered"
        };
        assert_eq!(
            timeout_besides_questions(limit, &asking, asks).await,
            Ok("answered")
        );
        let slow = async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            "late"
        };
        let asking = Asking::default();
        assert_eq!(
            timeout_besides_questions(limit, &asking, slow).await,
            Err(())
        );
    }
}
