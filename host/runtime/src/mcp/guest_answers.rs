//! A guest that answers its servers' questions (MCP elicitation) itself: `mcp_elicit_fn`
//! registers a function of the guest's funcref table and an arena on an MCP session fd,
//! and from then on a question a server asks during a blocking request on that fd
//! (`mcp_call_tool`, `mcp_read_resource`, `mcp_get_prompt`, and the calls of
//! `mcp_call_start` while the guest waits in `mcp_call_recv`) is put to that function
//! before the host's approver is ever asked.
//!
//! Why a callback and not a question fd: the guest is blocked inside the hostcall while
//! the server asks, so it could never read an fd; the hostcall is still running, so it can
//! call the guest, the way the chat loop calls guest tools (same arena protocol, same
//! nesting bound and stack permits). The question travels from whoever holds the request
//! (the `input_required` rounds, or the connection's handler for a 2025-era server's
//! `elicitation/create`) to the waiting hostcall over a channel in the request's
//! [`Asker`](super::input::Asker); the hostcall calls the guest and sends the answer back.
//! The answer goes through the same checks as an approver's (the form, its defaults, the
//! size cap); a guest that fails, answers garbage, names another question, or answers
//! after the approval timeout or the task's deadline has the question declined.

use std::future::Future;

use quiver_abi::Errno;
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};
use wasmtime::{Caller, Linker};

use super::session::{McpSession, McpView};
use crate::approval::{ElicitationAnswer, ElicitationRequest};
use crate::defaults;
use crate::observe::unix_seconds;
use crate::sandbox::{HostcallError, finish, guest, guest_callback, is_guest_callback, off_stack};

/// What `mcp_elicit_fn` registered on a session fd: the guest's function and its arena.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Answerer {
    table_index: u32,
    arena: (u32, u32),
}

/// One question on its way to the guest, with where its answer goes (`None`: declined).
pub(crate) struct Question {
    pub(crate) request: ElicitationRequest,
    pub(crate) reply: oneshot::Sender<Option<ElicitationAnswer>>,
}

/// Where a request's questions go to reach its guest.
pub(crate) type ToGuest = mpsc::Sender<Question>;

/// The receiving end, held by the hostcall that waits for the request.
pub(crate) struct FromServer {
    answerer: Answerer,
    /// The session fd the request came through, told to the guest with each question.
    fd: i32,
    questions: mpsc::Receiver<Question>,
}

/// A channel for one request on a session fd whose guest answers, if it does.
pub(crate) fn channel(
    answerer: Option<Answerer>,
    fd: i32,
) -> (Option<ToGuest>, Option<FromServer>) {
    let Some(answerer) = answerer else {
        return (None, None);
    };
    let (to_guest, questions) = mpsc::channel(1);
    (
        Some(to_guest),
        Some(FromServer {
            answerer,
            fd,
            questions,
        }),
    )
}

pub(super) fn add_to_linker<T: McpView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "spear",
        "mcp_elicit_fn",
        |mut caller: Caller<'_, T>, fd: i32, fn_offset: i32, arena_ptr: i32, arena_len: i32| {
            finish(register(&mut caller, fd, fn_offset, (arena_ptr, arena_len)))
        },
    )?;
    Ok(())
}

/// `mcp_elicit_fn(fd, fn_offset, arena_ptr, arena_len)`: `fn_offset` -1 (with an empty
/// arena) opts out again. A function that is not in the table with the callback's type is
/// `-EINVAL`; an arena outside memory or too small for any question `-EFAULT`/`-EINVAL`.
fn register<T: McpView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    fn_offset: i32,
    (arena_ptr, arena_len): (i32, i32),
) -> Result<i32, HostcallError> {
    let task_id = caller.data_mut().sandbox().task_id.clone();
    let _span = tracing::debug_span!("mcp_elicit_fn", task_id = %task_id, fd).entered();
    caller.data_mut().sandbox().fds.get_as::<McpSession>(fd)?;
    if fn_offset == -1 && arena_len == 0 {
        caller
            .data_mut()
            .sandbox()
            .fds
            .get_as::<McpSession>(fd)?
            .answerer = None;
        return Ok(0);
    }
    let table_index = u32::try_from(fn_offset).map_err(|_| Errno::EINVAL)?;
    if !is_guest_callback(caller, table_index) {
        tracing::info!(
            table_index,
            "no function of type (i32, i32, i32, i32) -> i32 at this table index"
        );
        return Err(Errno::EINVAL.into());
    }
    let (mem, _) = guest(caller)?;
    // The whole arena must be the guest's memory now; it is checked again at each use.
    mem.bytes(arena_ptr, arena_len)?;
    let arena = (arena_ptr as u32, arena_len as u32);
    if arena.1 < defaults::MIN_ELICIT_ARENA_BYTES {
        tracing::info!(
            arena_len = arena.1,
            min = defaults::MIN_ELICIT_ARENA_BYTES,
            "the elicitation arena is too small"
        );
        return Err(Errno::EINVAL.into());
    }
    caller
        .data_mut()
        .sandbox()
        .fds
        .get_as::<McpSession>(fd)?
        .answerer = Some(Answerer { table_index, arena });
    Ok(0)
}

/// Waits for `work` (a request to a server) while putting the questions the server asks
/// during it to the guest. Without `from_server` it only waits. A trap of the guest's
/// function (its deadline, a bug) ends the hostcall with it.
pub(super) async fn serving<T: McpView, F: Future>(
    caller: &mut Caller<'_, T>,
    from_server: Option<FromServer>,
    work: F,
) -> Result<F::Output, HostcallError> {
    let Some(FromServer {
        answerer,
        fd,
        mut questions,
    }) = from_server
    else {
        return Ok(work.await);
    };
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            biased;
            done = &mut work => return Ok(done),
            Some(question) = questions.recv() => {
                // Boxed: calling the guest back is rare, and its future would make every
                // waiting hostcall's larger.
                let answer = off_stack(|| ask(caller, answerer, fd, &question.request)).await?;
                // The asker may have stopped waiting (its timeout); then nobody needs it.
                let _ = question.reply.send(answer);
            }
        }
    }
}

/// The question as the guest reads it.
#[derive(Serialize)]
struct Shown<'a> {
    id: &'a str,
    fd: i32,
    server_id: &'a str,
    method: &'a str,
    name: &'a str,
    message: &'a str,
    requested_schema: &'a Value,
    #[serde(serialize_with = "unix_seconds")]
    expires_at: std::time::SystemTime,
}

/// Calls the guest's function with `request`; its answer, or `None` (declined) when it
/// failed or answered something that is not one. The host checks the content against
/// the form afterwards, as for an approver's answer.
async fn ask<T: McpView>(
    caller: &mut Caller<'_, T>,
    answerer: Answerer,
    fd: i32,
    request: &ElicitationRequest,
) -> Result<Option<ElicitationAnswer>, HostcallError> {
    let shown = super::hostcalls::encode(&Shown {
        id: &request.id,
        fd,
        server_id: &request.server_id,
        method: request.method,
        name: &request.name,
        message: &request.message,
        requested_schema: &request.requested_schema,
        expires_at: request.expires_at,
    });
    let output = call(caller, answerer, &shown).await?;
    Ok(match output.and_then(|bytes| parse(&request.id, &bytes)) {
        Ok(answer) => Some(answer),
        Err(why) => {
            tracing::info!(id = %request.id, why, "the guest gave no answer to the server's question");
            None
        }
    })
}

/// An answer as the guest writes it: `{"id": ..., "action": ..., "content": {...}}`.
fn parse(id: &str, bytes: &[u8]) -> Result<ElicitationAnswer, String> {
    let mut object: Map<String, Value> = crate::json::from_slice(bytes).map_err(|e| {
        format!(
            "the answer is not a JSON object (line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    match object.remove("id") {
        Some(Value::String(answered)) if answered == id => {}
        Some(_) => return Err("the answer names another question's `id`".into()),
        None => return Err("the answer has no `id`".into()),
    }
    // serde's message quotes the offending value, which is the guest's answer: only its
    // position and category reach the log.
    serde_json::from_value(Value::Object(object)).map_err(|e| {
        format!(
            "the answer does not have the expected shape ({:?})",
            e.classify()
        )
    })
}

/// The arena protocol of guest tools: the question (NUL-terminated) at the arena's start,
/// the answer's capacity at the next 4-byte boundary, the answer after it. The guest
/// returns the answer's length (stored at the length pointer too) or a negative errno.
async fn call<T: McpView>(
    caller: &mut Caller<'_, T>,
    answerer: Answerer,
    question: &[u8],
) -> Result<Result<Vec<u8>, String>, HostcallError> {
    let Answerer {
        table_index,
        arena: (arena_ptr, arena_len),
    } = answerer;
    let Some(func) = guest_callback(caller, table_index) else {
        return Ok(Err(format!("no callback at table index {table_index}")));
    };
    let arena_end = u64::from(arena_ptr) + u64::from(arena_len);
    let len_ptr = (u64::from(arena_ptr) + question.len() as u64 + 1).next_multiple_of(4);
    let out_ptr = len_ptr + 4;
    if out_ptr > arena_end || arena_end > u64::from(u32::MAX) {
        return Ok(Err(format!(
            "the question ({} bytes) does not fit the elicitation arena ({arena_len} bytes)",
            question.len()
        )));
    }
    let capacity = ((arena_end - out_ptr) as u32).min(defaults::MAX_GUEST_ELICIT_ANSWER_BYTES);
    let prepared = guest(caller).and_then(|(mut mem, _)| {
        mem.write(arena_ptr, question)?;
        mem.write(arena_ptr + question.len() as u32, &[0])?;
        mem.write_u32(len_ptr as u32, capacity)
    });
    if prepared.is_err() {
        return Ok(Err("the elicitation arena lies outside guest memory".into()));
    }
    let depth = caller.data_mut().sandbox().guest_tool_depth;
    if depth >= defaults::MAX_GUEST_TOOL_NESTING {
        return Ok(Err(format!(
            "guest callbacks may run inside one another at most {} deep",
            defaults::MAX_GUEST_TOOL_NESTING
        )));
    }
    let stacks = caller.data().mcp().guest_callbacks.clone();
    if !caller.data_mut().sandbox().enter_guest_call(depth, &stacks) {
        return Ok(Err(
            "the host's stacks for guest callbacks are all in use by other tasks".into(),
        ));
    }
    let params = (
        arena_ptr as i32,
        question.len() as i32,
        out_ptr as i32,
        len_ptr as i32,
    );
    let rc = func.call_async(&mut *caller, params).await;
    caller.data_mut().sandbox().leave_guest_call(depth);
    let rc = rc.map_err(HostcallError::Trap)?;
    let (mem, _) = guest(caller)?;
    let Ok(len) = mem.read_u32(len_ptr as u32) else {
        return Ok(Err("the elicitation arena lies outside guest memory".into()));
    };
    Ok(match rc {
        rc if rc < 0 => Err(format!("the guest's callback failed with errno {}", -rc)),
        _ if len > capacity => Err(format!(
            "the answer ({len} bytes) is larger than the {capacity} bytes the host takes"
        )),
        _ => mem
            .bytes(out_ptr as i32, len as i32)
            .map(<[u8]>::to_vec)
            .map_err(|_| "the answer lies outside guest memory".to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_answer_names_its_question_and_is_read_strictly() {
        let ok = parse("q1", br#"{"id":"q1","action":"accept","content":{"a":1}}"#).unwrap();
        assert!(matches!(ok, ElicitationAnswer::Accept { .. }));
        assert_eq!(
            parse("q1", br#"{"id":"q1","action":"decline"}"#).unwrap(),
            ElicitationAnswer::Decline
        );
        for wrong in [
            json!({"id": "q2", "action": "accept"}),
            json!({"action": "accept"}),
            json!({"id": 1, "action": "accept"}),
            json!({"id": "q1", "action": "maybe"}),
            json!({"id": "q1", "action": "decline", "content": {}}),
            json!({"id": "q1", "action": "accept", "extra": true}),
            json!(["q1"]),
        ] {
            assert!(
                parse("q1", wrong.to_string().as_bytes()).is_err(),
                "{wrong}"
            );
        }
        assert!(parse("q1", b"\xff\xfe").is_err());
    }
}
