//! [`ApprovalQueue`]: an approver that holds requests until someone else decides them
//! (an operator through `quiver serve`'s `/v1/approvals`, or an embedder's own UI).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::{ApprovalDecision, ApprovalFuture, ApprovalRequest, Approver};
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
}

struct Waiting {
    request: ApprovalRequest,
    reply: oneshot::Sender<ApprovalDecision>,
}

/// Holds approval requests until [`decide`](Self::decide) answers them; at most a capacity
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

    /// Answers the request `id`; an id not waiting is an error: `NoLongerWaiting` if it
    /// did wait lately (decided, timed out, its task gone), `NotPending` if not.
    pub fn decide(&self, id: &str, decision: ApprovalDecision) -> Result<(), ApprovalError> {
        let shown = || -> String {
            id.chars()
                .take(defaults::MAX_APPROVAL_ID_CHARS_SHOWN)
                .collect()
        };
        let mut queue = self.lock();
        let Some(waiting) = queue.waiting.remove(id) else {
            return Err(if queue.ended.iter().any(|ended| ended == id) {
                ApprovalError::NoLongerWaiting { id: shown() }
            } else {
                ApprovalError::NotPending { id: shown() }
            });
        };
        queue.end(id.to_owned());
        drop(queue);
        // The call may have stopped waiting just now, before it could leave the queue.
        waiting
            .reply
            .send(decision)
            .map_err(|_| ApprovalError::NoLongerWaiting { id: shown() })
    }
}

impl ApprovalQueue {
    /// Why `request` may not wait in the queue, if it may not.
    fn refusal(
        &self,
        waiting: &BTreeMap<String, Waiting>,
        request: &ApprovalRequest,
    ) -> Option<String> {
        if waiting.len() >= self.capacity {
            return Some(format!(
                "the approval queue is full ({} requests waiting, its capacity)",
                self.capacity
            ));
        }
        if waiting.contains_key(&request.id) {
            // Replacing it would leave the first call waiting for a decision it can never get.
            return Some("a request with this id is already waiting".to_owned());
        }
        let share = (self.capacity / defaults::APPROVAL_QUEUE_TASK_SHARE_DIVISOR).max(1);
        let task = request.task_id.as_ref();
        let held = waiting
            .values()
            .filter(|w| &*w.request.task_id == task)
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
        if queue.waiting.remove(&self.id).is_some() {
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
            if let Some(reason) = self.refusal(&queue.waiting, &request) {
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
}
