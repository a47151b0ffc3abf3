//! The node's tasks: each submission becomes a record here and a Tokio task running
//! [`Host::run_task`](quiver::Host::run_task). Records are bounded in number (finished ones
//! are forgotten after a TTL, or sooner, oldest first, to make room), their kept output is
//! cut to a bound, and cancelling aborts the Tokio task, which drops the run's future and
//! so gives its queue place or running slot back at once.
//!
//! A record remembers the client that submitted it: a client holding only `submit` sees,
//! waits for and cancels its own tasks alone ([`Scope`]).
//!
//! A drain closes the table ([`TaskTable::close`]): the check and the insert of a
//! submission happen under the same lock as the close, so a request that was let in before
//! the drain but submits after it is refused, never started behind the drain's back. A
//! record holds its abort handle from the moment it is visible, so no cancel can miss it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;

use quiver::{GuestModule, Host, HostError, TaskOutcome, TaskSpec, UserStreams};

/// Where a task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TaskPhase {
    Queued,
    Running,
    /// The guest ran to its end (any exit code).
    Finished,
    /// The guest trapped or ran out of time, or the task could not start.
    Failed,
    Cancelled,
}

impl TaskPhase {
    pub(crate) fn is_done(self) -> bool {
        matches!(self, Self::Finished | Self::Failed | Self::Cancelled)
    }
}

/// What `GET /v1/tasks/{id}` shows.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TaskView {
    pub(crate) id: String,
    pub(crate) task_id: String,
    pub(crate) module: String,
    /// Who the task acts for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) principal: Option<String>,
    /// The client that submitted it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) client: Option<String>,
    pub(crate) status: TaskPhase,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) exit_code: Option<i32>,
    /// Guest stdout, lossy UTF-8, cut to `[serve] max_output_bytes`.
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) stdout_truncated: bool,
    pub(crate) stderr_truncated: bool,
    #[serde(rename = "_spear")]
    pub(crate) spear: TaskSummary,
}

/// How the run went, like the `_spear` object of a chat response.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct TaskSummary {
    /// Unix time of the submission, in milliseconds.
    pub(crate) submitted_at_ms: u64,
    /// Time waited for a running slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) queued_ms: Option<u64>,
    /// Time from getting a slot to the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) elapsed_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) host_memory: Option<HostMemoryView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) failure: Option<FailureView>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct HostMemoryView {
    pub(crate) limit_bytes: u64,
    pub(crate) peak_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct FailureView {
    /// `trap`, `deadline`, `busy`, `setup` or `cancelled`.
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

struct Record {
    view: TaskView,
    /// The client that submitted it (`None`: a caller without a token).
    owner: Option<Arc<str>>,
    phase: watch::Sender<TaskPhase>,
    abort: Option<AbortHandle>,
    /// When it ended, for the TTL.
    ended: Option<Instant>,
    /// Order of submission, to forget the oldest finished first.
    seq: u64,
    /// The task's user streams, which its submitter attaches to over a WebSocket; taken
    /// when the task ends, so a finished record holds no frames.
    streams: Option<UserStreams>,
}

/// Which tasks a caller may see and cancel.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scope<'a> {
    All,
    /// Only those this client submitted (`None`: a caller without a token).
    SubmittedBy(Option<&'a str>),
}

impl Scope<'_> {
    fn covers(self, record: &Record) -> bool {
        match self {
            Scope::All => true,
            Scope::SubmittedBy(client) => record.owner.as_deref() == client,
        }
    }
}

/// Why a submission was refused.
pub(crate) enum Refused {
    /// Every record is a task still queued or running.
    Full { max: u32 },
    /// The node is draining.
    Closed,
}

#[derive(Default)]
struct Records {
    by_id: HashMap<String, Record>,
    /// Set by a drain: no submission is taken after it.
    closed: bool,
}

/// Every task of the node.
pub(crate) struct TaskTable {
    records: Mutex<Records>,
    next: AtomicU64,
    /// Woken whenever a task ends, for a drain waiting on the last one.
    ended: Notify,
    salt: [u8; 16],
    max_tasks: usize,
    max_output_bytes: usize,
    finished_ttl: Duration,
}

impl TaskTable {
    pub(crate) fn new(max_tasks: u32, max_output_bytes: u64, finished_ttl: Duration) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let mut salt = [0u8; 16];
        salt.copy_from_slice(&now.to_le_bytes());
        salt[..4].copy_from_slice(&std::process::id().to_le_bytes());
        Self {
            records: Mutex::default(),
            next: AtomicU64::new(0),
            ended: Notify::new(),
            salt,
            max_tasks: usize::try_from(max_tasks).unwrap_or(usize::MAX).max(1),
            max_output_bytes: usize::try_from(max_output_bytes).unwrap_or(usize::MAX),
            finished_ttl,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh id: 24 hex digits, unique to this process and unlike any earlier node's.
    fn new_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let digest = Sha256::new()
            .chain_update(self.salt)
            .chain_update(n.to_le_bytes())
            .finalize();
        digest[..12].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Records `task` as queued and starts it on `host`; its id.
    pub(crate) fn submit(
        self: &Arc<Self>,
        host: &Host,
        module_sha: &str,
        module: GuestModule,
        mut task: TaskSpec,
        owner: Option<Arc<str>>,
    ) -> Result<String, Refused> {
        let streams = UserStreams::new();
        task.user_streams = Some(streams.clone());
        let id = self.new_id();
        let mut records = self.lock();
        if records.closed {
            return Err(Refused::Closed);
        }
        self.make_room(&mut records.by_id)?;
        let seq = self.next.load(Ordering::Relaxed);
        let submitted_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX);
        let view = TaskView {
            id: id.clone(),
            task_id: task.task_id.clone(),
            module: module_sha.to_owned(),
            principal: task.principal.clone(),
            client: task.client.clone(),
            status: TaskPhase::Queued,
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            spear: TaskSummary {
                submitted_at_ms,
                ..TaskSummary::default()
            },
        };
        let (phase, _) = watch::channel(TaskPhase::Queued);
        let table = self.clone();
        let host = host.clone();
        let run_id = id.clone();
        // Spawned under the lock: the run reports back through the same lock, so it
        // cannot touch its record before the record (with its abort handle) exists.
        let handle = tokio::spawn(async move {
            let admitted = || table.set_phase(&run_id, TaskPhase::Running);
            let result = host.run_task_reporting(&module, &task, admitted).await;
            table.finish(&run_id, result);
        });
        records.by_id.insert(
            id.clone(),
            Record {
                view,
                owner,
                phase,
                abort: Some(handle.abort_handle()),
                ended: None,
                seq,
                streams: Some(streams),
            },
        );
        Ok(id)
    }

    /// Forgets expired finished tasks, then the oldest finished ones while full.
    fn make_room(&self, records: &mut HashMap<String, Record>) -> Result<(), Refused> {
        let ttl = self.finished_ttl;
        records.retain(|_, r| r.ended.is_none_or(|ended| ended.elapsed() < ttl));
        while records.len() >= self.max_tasks {
            let Some(oldest) = records
                .iter()
                .filter(|(_, r)| r.ended.is_some())
                .min_by_key(|(_, r)| r.seq)
                .map(|(id, _)| id.clone())
            else {
                return Err(Refused::Full {
                    max: u32::try_from(self.max_tasks).unwrap_or(u32::MAX),
                });
            };
            records.remove(&oldest);
        }
        Ok(())
    }

    fn set_phase(&self, id: &str, phase: TaskPhase) {
        if let Some(record) = self.lock().by_id.get_mut(id)
            && !record.view.status.is_done()
        {
            record.view.status = phase;
            record.phase.send_replace(phase);
        }
    }

    fn finish(&self, id: &str, result: Result<TaskOutcome, HostError>) {
        let mut records = self.lock();
        let Some(record) = records.by_id.get_mut(id) else {
            return;
        };
        if record.view.status.is_done() {
            return;
        }
        let view = &mut record.view;
        let phase = match result {
            Ok(outcome) => {
                view.exit_code = Some(outcome.exit_code);
                (view.stdout, view.stdout_truncated) = self.kept(&outcome.stdout);
                (view.stderr, view.stderr_truncated) = self.kept(&outcome.stderr);
                view.spear.queued_ms = Some(millis(outcome.queued));
                view.spear.elapsed_ms = Some(millis(outcome.elapsed));
                view.spear.host_memory = Some(HostMemoryView {
                    limit_bytes: outcome.host_memory.limit_bytes,
                    peak_bytes: outcome.host_memory.peak_bytes,
                });
                match &outcome.failure {
                    None => TaskPhase::Finished,
                    Some(failure) => {
                        let kind = match failure {
                            quiver::TaskFailure::Trap(_) => "trap",
                            quiver::TaskFailure::Deadline(_) => "deadline",
                        };
                        view.spear.failure = Some(FailureView {
                            kind,
                            message: failure.to_string(),
                        });
                        TaskPhase::Failed
                    }
                }
            }
            Err(error) => {
                let kind = match error {
                    HostError::Busy { .. } => "busy",
                    _ => "setup",
                };
                view.spear.failure = Some(FailureView {
                    kind,
                    message: error.to_string(),
                });
                TaskPhase::Failed
            }
        };
        tracing::info!(id, task_id = %view.task_id, status = ?phase, exit_code = ?view.exit_code, "task ended");
        view.status = phase;
        record.ended = Some(Instant::now());
        record.abort = None;
        if let Some(streams) = record.streams.take() {
            streams.end();
        }
        record.phase.send_replace(phase);
        self.ended.notify_waiters();
    }

    /// At most `max_output_bytes` of `bytes` as text, and whether it was cut.
    fn kept(&self, bytes: &[u8]) -> (String, bool) {
        let cut = bytes.len() > self.max_output_bytes;
        let kept = bytes.get(..self.max_output_bytes).unwrap_or(bytes);
        (String::from_utf8_lossy(kept).into_owned(), cut)
    }

    /// The task's view and a receiver of its phase changes, if it exists in `scope`.
    pub(crate) fn watch(
        &self,
        id: &str,
        scope: Scope<'_>,
    ) -> Option<(TaskView, watch::Receiver<TaskPhase>)> {
        self.lock()
            .by_id
            .get(id)
            .filter(|r| scope.covers(r))
            .map(|r| (r.view.clone(), r.phase.subscribe()))
    }

    /// The user streams of a task that `client` submitted, if it exists: `None` inside
    /// once it has ended.
    pub(crate) fn streams(&self, id: &str, client: Option<&str>) -> Option<Option<UserStreams>> {
        self.lock()
            .by_id
            .get(id)
            .filter(|r| Scope::SubmittedBy(client).covers(r))
            .map(|r| r.streams.clone())
    }

    /// The task's view, if it exists in `scope`.
    pub(crate) fn view(&self, id: &str, scope: Scope<'_>) -> Option<TaskView> {
        self.lock()
            .by_id
            .get(id)
            .filter(|r| scope.covers(r))
            .map(|r| r.view.clone())
    }

    /// Cancels a queued or running task in `scope` at once; a task already done is left as
    /// it is. Its view after, if it exists in `scope`.
    pub(crate) fn cancel(&self, id: &str, scope: Scope<'_>, why: &str) -> Option<TaskView> {
        let mut records = self.lock();
        let record = records.by_id.get_mut(id).filter(|r| scope.covers(r))?;
        if !record.view.status.is_done() {
            Self::cancel_record(id, record, why);
            self.ended.notify_waiters();
        }
        Some(record.view.clone())
    }

    fn cancel_record(id: &str, record: &mut Record, why: &str) {
        if let Some(abort) = record.abort.take() {
            abort.abort();
        }
        record.view.status = TaskPhase::Cancelled;
        record.view.spear.failure = Some(FailureView {
            kind: "cancelled",
            message: why.to_owned(),
        });
        record.ended = Some(Instant::now());
        // A client attached to a task cancelled in the queue is told at once.
        if let Some(streams) = record.streams.take() {
            streams.end();
        }
        record.phase.send_replace(TaskPhase::Cancelled);
        tracing::info!(id, task_id = %record.view.task_id, "task cancelled: {why}");
    }

    /// Returns once no task is queued or running.
    pub(crate) async fn all_ended(&self) {
        loop {
            let ended = self.ended.notified();
            if self.active() == 0 {
                return;
            }
            ended.await;
        }
    }

    /// Takes no more submissions and cancels the tasks still queued: a drain's grace is
    /// for tasks already running, and a queued one starting in it would only be cut off
    /// at its end. How many were cancelled.
    pub(crate) fn close(&self, why: &str) -> usize {
        let mut records = self.lock();
        records.closed = true;
        let mut cancelled = 0usize;
        for (id, record) in &mut records.by_id {
            if record.view.status == TaskPhase::Queued {
                Self::cancel_record(id, record, why);
                cancelled = cancelled.saturating_add(1);
            }
        }
        self.ended.notify_waiters();
        cancelled
    }

    /// Takes no more submissions and cancels every task still queued or running.
    pub(crate) fn cancel_all(&self, why: &str) {
        let mut records = self.lock();
        records.closed = true;
        for (id, record) in &mut records.by_id {
            if !record.view.status.is_done() {
                Self::cancel_record(id, record, why);
            }
        }
        self.ended.notify_waiters();
    }

    /// Tasks queued or running.
    pub(crate) fn active(&self) -> usize {
        self.lock()
            .by_id
            .values()
            .filter(|r| !r.view.status.is_done())
            .count()
    }

    /// Whether one more task could be held now.
    pub(crate) fn has_room(&self) -> bool {
        let records = self.lock();
        records.by_id.len() < self.max_tasks || records.by_id.values().any(|r| r.ended.is_some())
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
