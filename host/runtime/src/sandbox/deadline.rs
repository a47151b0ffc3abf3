//! A task's wall-clock deadline, computed once when the task starts.
//!
//! Guest code is stopped by the epoch callback, a waiting hostcall by racing its future,
//! and an outgoing request gets at most what is left; all three read this one value.

use std::time::{Duration, Instant};

use crate::defaults;

/// When a task must end.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    at: Instant,
    after: Duration,
}

/// The trap that ends a task at its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the task's deadline of {} ms passed", after.as_millis())]
pub struct DeadlineExceeded {
    pub after: Duration,
}

impl Deadline {
    /// `after` from now, cut to [`defaults::TASK_DEADLINE_MAX`] (a task's deadline is
    /// untrusted input, and `Instant` arithmetic panics on overflow).
    pub fn after(after: Duration) -> Self {
        let after = after.min(defaults::TASK_DEADLINE_MAX);
        Self {
            at: Instant::now() + after,
            after,
        }
    }

    /// The budget the task was given.
    pub fn budget(&self) -> Duration {
        self.after
    }

    pub fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    /// Time left; zero once passed.
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// The deadline on tokio's clock, for `timeout_at`.
    pub fn instant(&self) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.at)
    }

    pub fn exceeded(&self) -> DeadlineExceeded {
        DeadlineExceeded { after: self.after }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_deadline_is_cut_instead_of_overflowing_the_clock() {
        let deadline = Deadline::after(Duration::from_millis(u64::MAX));
        assert_eq!(deadline.budget(), defaults::TASK_DEADLINE_MAX);
        assert!(!deadline.passed());
        // What the runner computes from it must not overflow either.
        let _ = deadline.instant() + defaults::EPOCH_TICK * 50;
    }
}
