//! The task book: which tasks have a final state, and what to do with each
//! result that arrives. Pure bookkeeping, no I/O.
//!
//! Delivery is at-least-once, so the same result (or an old attempt's) can
//! arrive more than once; the book keeps the first final result of a task and
//! counts the rest as duplicates.

use gleaner_protocol::{ResultMsg, RunStatus, TaskCounts};
use serde::{Deserialize, Serialize};

/// A task's final state, as the results index records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalStatus {
    Succeeded,
    Failed,
    TimedOut,
    /// Killed for using more memory than it asked for.
    Oom,
    Lost,
    Cancelled,
}

impl FinalStatus {
    /// As the index and `job.json` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::Oom => "oom",
            Self::Lost => "lost",
            Self::Cancelled => "cancelled",
        }
    }
}

impl FinalStatus {
    /// The figure of `counts` that tasks ending so count in; one out of
    /// memory counts with the failures.
    pub fn counter(self, counts: &mut TaskCounts) -> &mut u64 {
        match self {
            Self::Succeeded => &mut counts.succeeded,
            Self::Failed | Self::Oom => &mut counts.failed,
            Self::TimedOut => &mut counts.timed_out,
            Self::Lost => &mut counts.lost,
            Self::Cancelled => &mut counts.cancelled,
        }
    }
}

impl From<RunStatus> for FinalStatus {
    fn from(status: RunStatus) -> Self {
        match status {
            RunStatus::Succeeded => Self::Succeeded,
            RunStatus::Failed => Self::Failed,
            RunStatus::TimedOut => Self::TimedOut,
            RunStatus::Oom => Self::Oom,
        }
    }
}

/// What to do with an incoming result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The task is done with this status: record it.
    Final(FinalStatus),
    /// The run failed and attempts remain: publish the task again with this attempt number.
    Retry { attempt: u32 },
    /// The task already has a final state, or this is an older attempt.
    Duplicate,
}

#[derive(Debug, Clone)]
pub struct TaskBook {
    /// Entries are numbered `0..entries`; those left out of the job (a
    /// rerun's other tasks) count as finished but in no figure.
    entries: u64,
    max_attempts: u32,
    finished: Vec<u64>,
    /// The attempt most recently published for tasks that were retried.
    retried: std::collections::HashMap<u64, u32>,
    counts: TaskCounts,
    duplicates: u64,
}

impl TaskBook {
    pub fn new(total: u64, max_attempts: u32) -> Self {
        Self {
            entries: total,
            max_attempts,
            finished: vec![0; total.div_ceil(64) as usize],
            retried: Default::default(),
            counts: TaskCounts {
                total,
                pending: total,
                ..TaskCounts::default()
            },
            duplicates: 0,
        }
    }

    /// Leaves every entry below `below` that `keep` does not name out of
    /// the job, before anything is recorded.
    pub fn keep_only(&mut self, keep: &gleaner_manifest::TaskSet, below: u64) {
        for task in 0..below {
            if !keep.contains(task) && !self.is_finished(task) {
                self.finished[(task / 64) as usize] |= 1 << (task % 64);
                self.counts.total -= 1;
            }
        }
        self.set_running(self.counts.running);
    }

    /// `count` more entries, unfinished, numbered after the last.
    pub fn extend(&mut self, count: u64) {
        self.entries += count;
        self.finished.resize(self.entries.div_ceil(64) as usize, 0);
        self.counts.total += count;
        self.set_running(self.counts.running);
    }

    pub fn is_finished(&self, task: u64) -> bool {
        task >= self.entries || self.finished[(task / 64) as usize] & (1 << (task % 64)) != 0
    }

    /// Records a final state; `false` if the task already had one.
    pub fn finish(&mut self, task: u64, status: FinalStatus) -> bool {
        if self.is_finished(task) {
            return false;
        }
        self.finished[(task / 64) as usize] |= 1 << (task % 64);
        self.retried.remove(&task);
        *status.counter(&mut self.counts) += 1;
        self.set_running(self.counts.running);
        true
    }

    /// Decides what a result means. Does not record it: the caller records a
    /// `Final` once it is safely written.
    pub fn judge(&mut self, result: &ResultMsg) -> Verdict {
        let stale = self
            .retried
            .get(&result.task)
            .is_some_and(|&latest| result.attempt < latest);
        if self.is_finished(result.task) || stale {
            self.duplicates += 1;
            return Verdict::Duplicate;
        }
        match result.status {
            RunStatus::Succeeded => Verdict::Final(FinalStatus::Succeeded),
            // Another run would need the same memory and end the same way.
            RunStatus::Oom => Verdict::Final(FinalStatus::Oom),
            _ if result.attempt < self.max_attempts => {
                let attempt = result.attempt + 1;
                self.retried.insert(result.task, attempt);
                Verdict::Retry { attempt }
            }
            status => Verdict::Final(status.into()),
        }
    }

    /// Every task without a final state, in order.
    pub fn unfinished(&self) -> impl Iterator<Item = u64> + '_ {
        std::iter::successors(self.next_unfinished(0), |&task| {
            self.next_unfinished(task + 1)
        })
    }

    /// The first unfinished task from `from` on; a word of finished tasks
    /// at a time, so that a sweep of millions mostly done is crossed fast.
    pub fn next_unfinished(&self, from: u64) -> Option<u64> {
        let mut task = from;
        while task < self.entries {
            let word = (task / 64) as usize;
            let below = (1u64 << (task % 64)) - 1;
            let open = !(self.finished[word] | below);
            if open != 0 {
                let found = word as u64 * 64 + u64::from(open.trailing_zeros());
                return (found < self.entries).then_some(found);
            }
            task = (word as u64 + 1) * 64;
        }
        None
    }

    /// How many tasks below `end` are unfinished.
    pub fn unfinished_below(&self, end: u64) -> u64 {
        let end = end.min(self.entries);
        let (whole, rest) = ((end / 64) as usize, end % 64);
        let mut finished: u64 = self.finished[..whole]
            .iter()
            .map(|w| u64::from(w.count_ones()))
            .sum();
        if rest > 0 {
            finished += u64::from((self.finished[whole] & ((1u64 << rest) - 1)).count_ones());
        }
        end - finished
    }

    pub fn is_complete(&self) -> bool {
        self.counts.finished() == self.counts.total
    }

    /// Tasks running right now, as the launchers last reported.
    pub fn set_running(&mut self, running: u64) {
        let c = &mut self.counts;
        c.running = running.min(c.unfinished());
        c.pending = c.unfinished() - c.running;
    }

    pub fn counts(&self) -> TaskCounts {
        self.counts
    }

    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gleaner_protocol::Captured;

    fn result(task: u64, attempt: u32, status: RunStatus) -> ResultMsg {
        ResultMsg {
            peak_memory_mb: None,
            job: "j-0000000000000000".parse().unwrap(),
            task,
            attempt,
            preemptions: 0,
            status,
            exit_code: Some(0),
            signal: None,
            runtime_ms: 1,
            launcher: "l".into(),
            cluster: "c".into(),
            host: "h".into(),
            stdout: Captured::default(),
            stderr: Captured::default(),
            outputs: vec![],
            error: None,
            parted: None,
        }
    }

    #[test]
    fn unfinished_tasks_are_found_across_words_of_finished_ones() {
        let mut book = TaskBook::new(200, 1);
        for task in (0..200).filter(|t| ![3, 64, 130, 199].contains(t)) {
            book.finish(task, FinalStatus::Succeeded);
        }
        assert_eq!(book.unfinished().collect::<Vec<_>>(), [3, 64, 130, 199]);
        assert_eq!(book.next_unfinished(65), Some(130));
        assert_eq!(book.next_unfinished(200), None);
        assert_eq!(book.unfinished_below(0), 0);
        assert_eq!(book.unfinished_below(64), 1);
        assert_eq!(book.unfinished_below(65), 2);
        assert_eq!(book.unfinished_below(1000), 4);
        let mut all = TaskBook::new(128, 1);
        (0..128).for_each(|t| {
            all.finish(t, FinalStatus::Succeeded);
        });
        assert_eq!(all.next_unfinished(0), None);
    }

    #[test]
    fn success_is_final_once() {
        let mut book = TaskBook::new(3, 3);
        let r = result(1, 1, RunStatus::Succeeded);
        assert_eq!(book.judge(&r), Verdict::Final(FinalStatus::Succeeded));
        assert!(book.finish(1, FinalStatus::Succeeded));
        assert_eq!(book.judge(&r), Verdict::Duplicate);
        assert!(!book.finish(1, FinalStatus::Succeeded));
        assert_eq!(book.counts().succeeded, 1);
        assert_eq!(book.duplicates(), 1);
        assert_eq!(book.unfinished().collect::<Vec<_>>(), [0, 2]);
    }

    #[test]
    fn failures_retry_until_max_attempts() {
        let mut book = TaskBook::new(1, 3);
        assert_eq!(
            book.judge(&result(0, 1, RunStatus::Failed)),
            Verdict::Retry { attempt: 2 }
        );
        assert_eq!(
            book.judge(&result(0, 2, RunStatus::TimedOut)),
            Verdict::Retry { attempt: 3 }
        );
        assert_eq!(
            book.judge(&result(0, 3, RunStatus::TimedOut)),
            Verdict::Final(FinalStatus::TimedOut)
        );
    }

    #[test]
    fn an_older_attempt_arriving_late_is_a_duplicate() {
        let mut book = TaskBook::new(1, 3);
        assert_eq!(
            book.judge(&result(0, 1, RunStatus::Failed)),
            Verdict::Retry { attempt: 2 }
        );
        assert_eq!(
            book.judge(&result(0, 1, RunStatus::Failed)),
            Verdict::Duplicate
        );
    }

    #[test]
    fn a_rerun_keeps_only_its_tasks() {
        let mut book = TaskBook::new(10, 1);
        book.keep_only(&"2,5-6".parse().unwrap(), 10);
        assert_eq!(book.counts().total, 3);
        assert_eq!(book.counts().pending, 3);
        assert_eq!(book.unfinished().collect::<Vec<_>>(), [2, 5, 6]);
        assert_eq!(
            book.judge(&result(0, 1, RunStatus::Succeeded)),
            Verdict::Duplicate,
            "a task left out is no task of the job"
        );
        for task in [2, 5, 6] {
            assert!(book.finish(task, FinalStatus::Succeeded));
        }
        assert!(book.is_complete());
        assert_eq!(book.counts().succeeded, 3);
    }

    #[test]
    fn completion_and_counts() {
        let mut book = TaskBook::new(130, 1);
        book.set_running(5);
        assert_eq!((book.counts().pending, book.counts().running), (125, 5));
        for task in 0..129 {
            book.finish(task, FinalStatus::Failed);
        }
        assert!(!book.is_complete());
        assert_eq!(
            book.counts().running,
            1,
            "running is capped by what is unfinished"
        );
        book.finish(129, FinalStatus::Lost);
        assert!(book.is_complete());
        assert_eq!(book.counts().unfinished(), 0);
        assert!(
            book.is_finished(1000),
            "out-of-range tasks count as finished"
        );
    }
}
