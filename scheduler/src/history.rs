//! Ended jobs, so that a user can still ask about a job after its end:
//! where its results are, how it ended. Runners' `done` events are copied
//! by the broker into the `gleaner.history` stream, which every scheduler
//! reads from its start; this keeps what it read, bounded by age and count.

use std::{
    collections::{BTreeSet, HashMap},
    time::Duration,
};

use gleaner_manifest::JobId;
use gleaner_protocol::{EndedJob, Millis};

/// The most ended jobs kept; the oldest go first.
pub const MAX_ENDED: usize = 20_000;

#[derive(Debug, Default)]
pub struct History {
    jobs: HashMap<JobId, EndedJob>,
    /// (when it ended, job): the oldest first.
    order: BTreeSet<(Millis, JobId)>,
}

impl History {
    /// Keeps `ended` (read again after a restart: it replaces itself), and
    /// forgets what ended more than `retention` before `now_ms`.
    pub fn record(&mut self, ended: EndedJob, now_ms: Millis, retention: Duration) {
        let job = ended.report.job.clone();
        if let Some(old) = self.jobs.remove(&job) {
            self.order.remove(&(old.ended_at, job.clone()));
        }
        self.order.insert((ended.ended_at, job.clone()));
        self.jobs.insert(job, ended);
        let horizon =
            now_ms.saturating_sub(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX));
        while let Some((at, job)) = self.order.first().cloned()
            && (at < horizon || self.order.len() > MAX_ENDED)
        {
            self.order.pop_first();
            self.jobs.remove(&job);
        }
    }

    pub fn get(&self, job: &JobId) -> Option<&EndedJob> {
        self.jobs.get(job)
    }

    /// The latest first.
    pub fn latest(&self) -> impl Iterator<Item = &EndedJob> {
        self.order
            .iter()
            .rev()
            .filter_map(|(_, job)| self.jobs.get(job))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.jobs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gleaner_protocol::JobState;

    const DAY: Millis = 86_400_000;

    fn ended(name: &str, at: Millis) -> EndedJob {
        let mut report = crate::state::tests::job_report(name, 0);
        report.job = JobId::new(name, 1);
        report.state = JobState::Done;
        EndedJob {
            report,
            ended_at: at,
        }
    }

    #[test]
    fn kept_latest_first_once_each_and_forgotten_after_the_retention() {
        let mut history = History::default();
        let week = Duration::from_secs(7 * 86_400);
        let now = 100 * DAY;
        history.record(ended("a", now - 8 * DAY), now, week);
        assert_eq!(history.len(), 0, "older than the retention");
        history.record(ended("b", now - 2 * DAY), now, week);
        history.record(ended("c", now - DAY), now, week);
        // Read again after a restart: still one entry.
        history.record(ended("b", now - 2 * DAY), now, week);
        let names: Vec<_> = history.latest().map(|e| e.report.job.to_string()).collect();
        assert_eq!(names.len(), 2);
        assert!(
            names[0].starts_with("c-") && names[1].starts_with("b-"),
            "{names:?}"
        );
        // A day later b is past the week.
        history.record(ended("d", now + 6 * DAY), now + 6 * DAY, week);
        assert!(history.get(&JobId::new("b", 1)).is_none());
        assert!(history.get(&JobId::new("c", 1)).is_some());
    }

    #[test]
    fn bounded_by_count() {
        let mut history = History::default();
        let forever = Duration::from_secs(u64::MAX / 4_000);
        for n in 0..=MAX_ENDED as u64 {
            let mut e = ended("j", n);
            e.report.job = JobId::new("j", n);
            history.record(e, n, forever);
        }
        assert_eq!(history.len(), MAX_ENDED);
        assert!(
            history.get(&JobId::new("j", 0)).is_none(),
            "the oldest went"
        );
    }
}
