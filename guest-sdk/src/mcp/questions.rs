//! Answering a server's questions (MCP elicitation) in the guest: [`Mcp::answer_questions`]
//! registers a plain function that the host calls while the guest waits in a blocking
//! request on that session (`call_tool`, `read_resource_json`, `get_prompt_json`), before
//! it would ask its own approver. The host checks the answer against the server's form
//! (fields, types, required fields, size) and fills in the form's defaults; an answer that
//! does not fit is declined, as is one that comes after the approval timeout.
//!
//! The host calls one entry point for every session; it copies the question out of the
//! SDK's arena before the answerer runs, so an answerer may itself make MCP requests (and
//! be asked again, a few levels deep).

use std::cell::RefCell;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::Mcp;
use crate::buffer::check;
use crate::{Errno, Result, sys};

/// Size of the arena the SDK lends the host for questions and answers: a question (a form
/// of up to 64 KiB and its message) and an answer (up to 65 KiB) fit.
pub const QUESTION_ARENA_BYTES: usize = 192 * 1024;

/// A server's question, as the host puts it to the guest.
#[derive(Clone, Debug, Deserialize)]
#[non_exhaustive]
pub struct Question {
    /// The question's id (the host's).
    pub id: String,
    /// The MCP session fd the request that brought it came through.
    pub fd: i32,
    /// The server that asks.
    pub server_id: String,
    /// `tools/call`, `resources/read` or `prompts/get`.
    pub method: String,
    /// The tool, resource URI or prompt.
    pub name: String,
    /// The server's text (cut and made printable by the host).
    pub message: String,
    /// The form: `{"type": "object", "properties": {...}, "required": [...]}`.
    pub requested_schema: Value,
    /// When the host stops waiting and declines (Unix seconds).
    pub expires_at: f64,
}

/// What an answerer says to a [`Question`].
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// The fields filled in; the host adds the form's defaults for fields left out.
    Accept(Map<String, Value>),
    /// The guest will not answer this one.
    Decline,
    /// The guest stops the exchange.
    Cancel,
}

/// A function that answers questions.
pub type Answerer = fn(&Question) -> Answer;

thread_local! {
    /// Each opted-in session's answerer, by fd.
    static ANSWERERS: RefCell<HashMap<i32, Answerer>> = RefCell::new(HashMap::new());
}

/// The arena lent to the host: allocated once and never freed, so the host may write into
/// it whenever it calls [`entry`], and no Rust reference to it exists.
fn arena() -> (i32, i32) {
    static ARENA: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let ptr = *ARENA.get_or_init(|| {
        let raw = Box::into_raw(vec![0u8; QUESTION_ARENA_BYTES].into_boxed_slice());
        raw.cast::<u8>().expose_provenance()
    });
    (ptr as i32, QUESTION_ARENA_BYTES as i32)
}

impl Mcp {
    /// From now on, the server's questions during this session's blocking requests are
    /// answered by `answerer` (instead of the host's approver).
    ///
    /// ```no_run
    /// use quiver_guest::Mcp;
    /// use quiver_guest::mcp::{Answer, Question};
    ///
    /// fn answer(question: &Question) -> Answer {
    ///     let mut content = serde_json::Map::new();
    ///     content.insert("name".into(), "Ada".into());
    ///     Answer::Accept(content)
    /// }
    ///
    /// # fn main() -> quiver_guest::Result<()> {
    /// let asks = Mcp::open("asks")?;
    /// asks.answer_questions(answer)?;
    /// let result = asks.call_tool("ask_name", serde_json::json!({}))?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Errno::EBADF`] if the session is closed; [`Errno::ENOSYS`] outside a Quiver host.
    pub fn answer_questions(&self, answerer: Answerer) -> Result<()> {
        let (arena_ptr, arena_len) = arena();
        let entry: extern "C" fn(i32, i32, i32, i32) -> i32 = entry;
        // SAFETY: the arena is the SDK's, lent for good; `entry` is a function of the table.
        let ret =
            unsafe { sys::mcp_elicit_fn(self.fd, entry as usize as i32, arena_ptr, arena_len) };
        check(|| format!("mcp_elicit_fn({:?})", self.server_id), ret)?;
        ANSWERERS.with(|a| a.borrow_mut().insert(self.fd, answerer));
        Ok(())
    }

    /// Stops answering: the host's approver answers this session's questions again.
    ///
    /// # Errors
    ///
    /// [`Errno::EBADF`] if the session is closed.
    pub fn stop_answering(&self) -> Result<()> {
        // SAFETY: no memory is passed.
        let ret = unsafe { sys::mcp_elicit_fn(self.fd, -1, 0, 0) };
        ANSWERERS.with(|a| a.borrow_mut().remove(&self.fd));
        check(|| format!("mcp_elicit_fn({:?}, off)", self.server_id), ret).map(drop)
    }
}

/// Forgets the answerer of a closed session.
pub(super) fn forget(fd: i32) {
    let _ = ANSWERERS.try_with(|a| a.borrow_mut().remove(&fd));
}

/// The answer's JSON for question `id`.
fn encode(id: &str, answer: Answer) -> Vec<u8> {
    let value = match answer {
        Answer::Accept(content) => json!({"id": id, "action": "accept", "content": content}),
        Answer::Decline => json!({"id": id, "action": "decline"}),
        Answer::Cancel => json!({"id": id, "action": "cancel"}),
    };
    value.to_string().into_bytes()
}

/// What the host calls: the question at `q_ptr`, the answer's buffer at `out_ptr` with its
/// capacity at `out_len_ptr`. Returns the answer's length, or `-errno`.
extern "C" fn entry(q_ptr: i32, q_len: i32, out_ptr: i32, out_len_ptr: i32) -> i32 {
    let ptr = |value: i32| value as u32 as usize;
    let out_len_ptr = std::ptr::with_exposed_provenance_mut::<u32>(ptr(out_len_ptr));
    if out_len_ptr.is_null() || q_ptr == 0 || out_ptr == 0 {
        return -Errno::EFAULT.raw();
    }
    // Copied out first: the answerer may make requests whose questions reuse the arena.
    // SAFETY: the host calls this with the question inside the SDK's arena.
    let question = unsafe {
        std::slice::from_raw_parts(
            std::ptr::with_exposed_provenance::<u8>(ptr(q_ptr)),
            ptr(q_len),
        )
    }
    .to_vec();
    let Ok(question) = serde_json::from_slice::<Question>(&question) else {
        return -Errno::EINVAL.raw();
    };
    let Some(answerer) = ANSWERERS.with(|a| a.borrow().get(&question.fd).copied()) else {
        return -Errno::ENOENT.raw();
    };
    let bytes = encode(&question.id, answerer(&question));
    // SAFETY: the host stored the capacity at `out_len_ptr`, inside the arena.
    let cap = unsafe { out_len_ptr.read_unaligned() } as usize;
    if bytes.len() > cap {
        // SAFETY: as above.
        unsafe { out_len_ptr.write_unaligned(bytes.len() as u32) };
        return -Errno::ENOSPC.raw();
    }
    // SAFETY: the host lent `cap` writable bytes at `out_ptr`, inside the arena.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            std::ptr::with_exposed_provenance_mut::<u8>(ptr(out_ptr)),
            bytes.len(),
        );
        out_len_ptr.write_unaligned(bytes.len() as u32);
    }
    bytes.len() as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_name_their_question() {
        let accept = encode("q1", Answer::Accept(Map::new()));
        assert_eq!(
            serde_json::from_slice::<Value>(&accept).unwrap(),
            json!({"id": "q1", "action": "accept", "content": {}})
        );
        assert_eq!(
            serde_json::from_slice::<Value>(&encode("q2", Answer::Decline)).unwrap(),
            json!({"id": "q2", "action": "decline"})
        );
    }
}
