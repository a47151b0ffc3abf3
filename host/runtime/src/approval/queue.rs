//! [`ApprovalQueue`]: an approver that holds requests until someone else decides them
//! (an operator through `quiver serve`'s `/v1/approvals`, or an embedder's own UI), and
//! servers' questions (elicitations) until someone answers them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::{
    ApprovalDecision, ApprovalFuture, ApprovalRequest, Approver, ElicitationAnswer,
    ElicitationFuture, ElicitationRequest, check_answer,
};
use crate::defaults;

/// A decision that could not be delivered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// No request with this id is waiting, nor ended lately.
    #[error(
        "no pending approval `{id}`: unknown, or ended too long ago to remember; GET /v1/approvals lists the waiting ones"
    )]
    NotPending { id: String },
    /// The request existed but no longer waits: already decided, timed out, or its task
    /// ended.
    #[error(
        "approval `{id}` no longer waits: it was already decided, timed out, or its task ended"
    )]
    NoLongerWaiting { id: String },
    /// An answer to a question that does not fit its form (or a decision sent for a
    /// question, an answer for a call); nothing was sent, the question still waits.
    #[error("{why}")]
    Unfit { id: String, why: String },
}

struct Waiting {
    request: ApprovalRequest,
    reply: oneshot::Sender<ApprovalDecision>,
}

struct Question {
    request: ElicitationRequest,
    reply: oneshot::Sender<Option<ElicitationAnswer>>,
}

/// Holds approval requests until [`decide`](Self::decide) answers them, and servers'
/// questions until [`answer`](Self::answer) does; at most a capacity (of both together)
/// wait at once, and one more is denied at once, as is one more of a task already holding
/// its share (a [`defaults::APPROVAL_QUEUE_TASK_SHARE_DIVISOR`]th of the capacity, at least
/// one) and a request whose id is already waiting. A request leaves the queue when it is
/// decided, when it times out, and when its task ends.
///
/// `quiver serve` (or an embedder) keeps one `Arc<ApprovalQueue>`, gives it to
/// [`HostBuilder::with_approver`](crate::HostBuilder::with_approver), lists
/// [`pending`](Self::pending) and calls [`decide`](Self::decide).
pub struct ApprovalQueue {
    capacity: usize,
    /// By id; ids sort in the order they were made.
    waiting: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    waiting: BTreeMap<String, Waiting>,
    questions: BTreeMap<String, Question>,
    /// Ids that stopped waiting, newest last, at most [`defaults::APPROVAL_QUEUE_ENDED_IDS`].
    ended: VecDeque<String>,
}

impl Queue {
    fn end(&mut self, id: String) {
        if self.ended.len() >= defaults::APPROVAL_QUEUE_ENDED_IDS {
            self.ended.pop_front();
        }
        self.ended.push_back(id);
    }
}

impl std::fmt::Debug for ApprovalQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalQueue")
            .field("capacity", &self.capacity)
            .field("pending", &self.lock().waiting.len())
            .field("questions", &self.lock().questions.len())
            .finish()
    }
}

impl Default for ApprovalQueue {
    /// Holds up to [`defaults::APPROVAL_QUEUE_CAPACITY`] requests.
    fn default() -> Self {
        Self::with_capacity(defaults::APPROVAL_QUEUE_CAPACITY)
    }
}

impl ApprovalQueue {
    /// A queue holding at most `capacity` requests (0 denies every request).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            capacity,
            waiting: Mutex::new(Queue::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The requests waiting now, oldest first.
    pub fn pending(&self) -> Vec<ApprovalRequest> {
        self.lock()
            .waiting
            .values()
            .map(|w| w.request.clone())
            .collect()
    }

    /// The servers' questions waiting now, oldest first.
    pub fn pending_questions(&self) -> Vec<ElicitationRequest> {
        self.lock()
            .questions
            .values()
            .map(|q| q.request.clone())
            .collect()
    }

    /// Whether `id` is a question waiting now (rather than a call).
    pub fn is_question(&self, id: &str) -> bool {
        self.lock().questions.contains_key(id)
    }

    /// Answers the question `id`. An accepted answer is checked against the question's
    /// form first (its defaults filled in): one that does not fit is `Unfit`, nothing is
    /// sent and the question keeps waiting. An id not waiting is `NotPending` or
    /// `NoLongerWaiting`, as for [`decide`](Self::decide).
    pub fn answer(&self, id: &str, answer: ElicitationAnswer) -> Result<(), ApprovalError> {
        let mut queue = self.lock();
        let Some(question) = queue.questions.get(id) else {
            return Err(not_waiting(&queue, id));
        };
        let answer = match answer {
            ElicitationAnswer::Accept { content } => {
                match check_answer(&question.request.requested_schema, content) {
                    Ok(content) => ElicitationAnswer::Accept { content },
                    Err(why) => {
                        return Err(ApprovalError::Unfit {
                            id: shown(id),
                            why: format!("the answer does not fit the question's form: {why}"),
                        });
                    }
                }
            }
            other => other,
        };
        let question = queue.questions.remove(id).expect("looked up above");
        queue.end(id.to_owned());
        drop(queue);
        question
            .reply
            .send(Some(answer))
            .map_err(|_| ApprovalError::NoLongerWaiting { id: shown(id) })
    }

    /// Answers the request `id`; an id not waiting is an error: `NoLongerWaiting` if it
    /// did wait lately (decided, timed out, its task gone), `NotPending` if not.
    pub fn decide(&self, id: &str, decision: ApprovalDecision) -> Result<(), ApprovalError> {
        let mut queue = self.lock();
        let Some(waiting) = queue.waiting.remove(id) else {
            return Err(not_waiting(&queue, id));
        };
        queue.end(id.to_owned());
        drop(queue);
        // The call may have stopped waiting just now, before it could leave the queue.
        waiting
            .reply
            .send(decision)
            .map_err(|_| ApprovalError::NoLongerWaiting { id: shown(id) })
    }
}

/// `id` as an error shows it: cut.
fn shown(id: &str) -> String {
    id.chars()
        .take(defaults::MAX_APPROVAL_ID_CHARS_SHOWN)
        .collect()
}

/// Why `id` cannot be decided or answered: a question sent a decision, or a call sent an
/// answer, is `Unfit`; one that waited lately `NoLongerWaiting`; else `NotPending`.
fn not_waiting(queue: &Queue, id: &str) -> ApprovalError {
    if queue.questions.contains_key(id) {
        ApprovalError::Unfit {
            id: shown(id),
            why: "this is a server's question: answer it with {\"action\": \"accept\"|\"decline\"|\"cancel\", \"content\": {...}}".into(),
        }
    } else if queue.waiting.contains_key(id) {
        ApprovalError::Unfit {
            id: shown(id),
            why:
                "this is a tool call: decide it with {\"approve\": true|false, \"reason\": \"...\"}"
                    .into(),
        }
    } else if queue.ended.iter().any(|ended| ended == id) {
        ApprovalError::NoLongerWaiting { id: shown(id) }
    } else {
        ApprovalError::NotPending { id: shown(id) }
    }
}

impl ApprovalQueue {
    /// Why `request` may not wait in the queue, if it may not.
    /// Why a request `id` of `task` may not wait in the queue, if it may not: calls and
    /// questions count together.
    fn refusal(&self, queue: &Queue, id: &str, task: &str) -> Option<String> {
        if queue.waiting.len() + queue.questions.len() >= self.capacity {
            return Some(format!(
                "the approval queue is full ({} requests waiting, its capacity)",
                self.capacity
            ));
        }
        if queue.waiting.contains_key(id) || queue.questions.contains_key(id) {
            // Replacing it would leave the first call waiting for a decision it can never get.
            return Some("a request with this id is already waiting".to_owned());
        }
        let share = (self.capacity / defaults::APPROVAL_QUEUE_TASK_SHARE_DIVISOR).max(1);
        let held = queue
            .waiting
            .values()
            .filter(|w| &*w.request.task_id == task)
            .count()
            + queue
                .questions
                .values()
                .filter(|q| &*q.request.task_id == task)
                .count();
        (held >= share).then(|| {
            format!(
                "task `{task}` already has {held} requests waiting, its share of the approval queue (capacity {} / {})",
                self.capacity,
                defaults::APPROVAL_QUEUE_TASK_SHARE_DIVISOR
            )
        })
    }
}

/// Takes a request out of the queue when its wait ends for any reason.
struct Leave<'a> {
    queue: &'a ApprovalQueue,
    id: String,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let mut queue = self.queue.lock();
        if queue.waiting.remove(&self.id).is_some() || queue.questions.remove(&self.id).is_some() {
            let id = std::mem::take(&mut self.id);
            queue.end(id);
        }
    }
}

impl Approver for ApprovalQueue {
    fn ask(&self, request: ApprovalRequest) -> ApprovalFuture<'_> {
        let (reply, decided) = oneshot::channel();
        let id = request.id.clone();
        {
            let mut queue = self.lock();
            if let Some(reason) = self.refusal(&queue, &request.id, &request.task_id) {
                tracing::warn!(capacity = self.capacity, task_id = %request.task_id, server_id = %request.server_id, tool = %request.tool, %reason, "approval request refused by the queue");
                return Box::pin(std::future::ready(ApprovalDecision::deny(reason)));
            }
            queue.waiting.insert(id.clone(), Waiting { request, reply });
        }
        let leave = Leave { queue: self, id };
        Box::pin(async move {
            let _leave = leave;
            decided.await.unwrap_or_else(|_| {
                ApprovalDecision::deny("the approval queue dropped the request")
            })
        })
    }

    /// Holds the question until [`answer`](ApprovalQueue::answer) answers it; a question
    /// the queue has no room for is declined at once.
    fn elicit(&self, request: ElicitationRequest) -> ElicitationFuture<'_> {
        let (reply, answered) = oneshot::channel();
        let id = request.id.clone();
        {
            let mut queue = self.lock();
            if let Some(reason) = self.refusal(&queue, &request.id, &request.task_id) {
                tracing::warn!(capacity = self.capacity, task_id = %request.task_id, server_id = %request.server_id, %reason, "server's question refused by the approval queue");
                return Box::pin(std::future::ready(None));
            }
            queue
                .questions
                .insert(id.clone(), Question { request, reply });
        }
        let leave = Leave { queue: self, id };
        Box::pin(async move {
            let _leave = leave;
            answered.await.ok().flatten()
        })
    }
}
