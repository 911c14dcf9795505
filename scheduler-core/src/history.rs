//! Ended jobs and refused submissions, so that a user can still ask about
//! a job after its end (where its results are, how it ended) or learn why
//! a runner refused it. Runners' `done` and `rejected` events are copied by
//! the broker into the `gleaner.history` stream, which every scheduler
//! reads from its start; this keeps what it read, bounded by age and count.
//!
//! Entries are kept by job and owner: ids are public, and a refusal of
//! Bob's submission under Alice's id must not stand in for her job. Each
//! owner keeps at most [`MAX_PER_OWNER`], so that one user's flood of
//! refused submissions pushes out only their own.

use std::{
    collections::{BTreeSet, HashMap},
    time::Duration,
};

use gleaner_manifest::JobId;
use gleaner_protocol::{EndedJob, Millis};

/// The most entries kept in all; the oldest go first.
pub const MAX_ENDED: usize = 20_000;
/// The most entries one owner keeps; their oldest go first.
pub const MAX_PER_OWNER: usize = 1_000;

type Key = (JobId, String);

#[derive(Debug, Default)]
pub struct History {
    entries: HashMap<Key, EndedJob>,
    /// (when it ended, key): the oldest first.
    order: BTreeSet<(Millis, Key)>,
    /// Per owner, likewise.
    by_owner: HashMap<String, BTreeSet<(Millis, JobId)>>,
}

impl History {
    /// Keeps `ended` (read again after a restart: it replaces itself), and
    /// forgets what ended more than `retention` before `now_ms`.
    pub fn record(&mut self, ended: EndedJob, now_ms: Millis, retention: Duration) {
        let key = (ended.job.clone(), ended.owner.clone());
        self.remove(&key);
        self.order.insert((ended.ended_at, key.clone()));
        let own = self.by_owner.entry(key.1.clone()).or_default();
        own.insert((ended.ended_at, key.0.clone()));
        let owners_oldest = (own.len() > MAX_PER_OWNER)
            .then(|| own.first().map(|(_, job)| (job.clone(), key.1.clone())))
            .flatten();
        self.entries.insert(key, ended);
        if let Some(oldest) = owners_oldest {
            self.remove(&oldest);
        }
        let retention = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
        let horizon = now_ms.saturating_sub(retention);
        while let Some((at, key)) = self.order.first().cloned()
            && (at < horizon || self.order.len() > MAX_ENDED)
        {
            self.remove(&key);
        }
    }

    fn remove(&mut self, key: &Key) {
        let Some(old) = self.entries.remove(key) else {
            return;
        };
        self.order.remove(&(old.ended_at, key.clone()));
        if let Some(own) = self.by_owner.get_mut(&key.1) {
            own.remove(&(old.ended_at, key.0.clone()));
            if own.is_empty() {
                self.by_owner.remove(&key.1);
            }
        }
    }

    /// The entries of `job`: its end, and any refused submission of its id.
    pub fn of(&self, job: &JobId) -> impl Iterator<Item = &EndedJob> {
        self.entries
            .iter()
            .filter(move |((id, _), _)| id == job)
            .map(|(_, ended)| ended)
    }

    /// `job` ran and ended.
    pub fn has_ended(&self, job: &JobId, owner: &str) -> bool {
        self.entries
            .get(&(job.clone(), owner.to_owned()))
            .is_some_and(|e| e.report().is_some())
    }

    /// The latest first.
    pub fn latest(&self) -> impl Iterator<Item = &EndedJob> {
        self.order
            .iter()
            .rev()
            .filter_map(|(_, key)| self.entries.get(key))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gleaner_protocol::{Ending, JobState};

    const DAY: Millis = 86_400_000;

    fn ended(name: &str, at: Millis) -> EndedJob {
        let mut report = crate::state::tests::job_report(name, 0);
        report.job = JobId::new(name, 1);
        report.state = JobState::Done;
        EndedJob {
            job: report.job.clone(),
            owner: report.owner.clone(),
            ended_at: at,
            ending: Ending::Done(Box::new(report)),
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
        let names: Vec<_> = history.latest().map(|e| e.job.to_string()).collect();
        assert_eq!(names.len(), 2);
        assert!(
            names[0].starts_with("c-") && names[1].starts_with("b-"),
            "{names:?}"
        );
        // Six days on, b is past the week.
        history.record(ended("d", now + 6 * DAY), now + 6 * DAY, week);
        assert_eq!(history.of(&JobId::new("b", 1)).count(), 0);
        assert_eq!(history.of(&JobId::new("c", 1)).count(), 1);
    }

    #[test]
    fn one_owners_refusals_neither_replace_nor_push_out_anothers_jobs() {
        let mut history = History::default();
        let forever = Duration::from_secs(u64::MAX / 4_000);
        let hers = ended("a", 1);
        let job = hers.job.clone();
        history.record(hers, 1, forever);
        for n in 0..=MAX_PER_OWNER as u64 {
            let refused = EndedJob {
                job: if n == 0 {
                    job.clone()
                } else {
                    JobId::new("x", n)
                },
                owner: "bob".into(),
                ended_at: 2 + n,
                ending: Ending::Refused {
                    reason: "no".into(),
                },
            };
            history.record(refused, 2 + n, forever);
        }
        assert!(history.has_ended(&job, "alice"), "hers stays");
        assert!(!history.has_ended(&job, "bob"));
        assert_eq!(history.len(), 1 + MAX_PER_OWNER, "bob's oldest went");
        assert_eq!(
            history.of(&job).count(),
            1,
            "bob's refusal of her id went first"
        );
    }

    #[test]
    fn bounded_by_count() {
        let mut history = History::default();
        let forever = Duration::from_secs(u64::MAX / 4_000);
        for n in 0..=MAX_ENDED as u64 {
            let mut e = ended("j", n);
            e.job = JobId::new("j", n);
            e.owner = format!("user{}", n % 100);
            history.record(e, n, forever);
        }
        assert_eq!(history.len(), MAX_ENDED);
        assert_eq!(
            history.of(&JobId::new("j", 0)).count(),
            0,
            "the oldest went"
        );
    }
}
