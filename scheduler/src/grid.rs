//! Grid jobs waiting for placement, and the slots promised to those placed.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use gleaner_manifest::{JobId, Priority};
use gleaner_policy::placement::{GridJob, Weights, upgraded};
use gleaner_protocol::{ClusterName, JobReport, JobState};
use serde::{Deserialize, Serialize};

/// Grid job placement settings (keys of `[scheduler]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct GridConfig {
    /// How often each placement queue is scanned per round.
    #[serde(rename = "placement_weights")]
    pub weights: Weights,
    /// Failed placement tries after which a job moves up one queue (0: never).
    pub upgrade_after: u32,
    /// Failed placement tries after which a job is aborted (0: never).
    pub max_tries: u32,
    /// How long slots stay promised to a placed job whose components the
    /// cluster has not reported yet.
    #[serde(with = "humantime_serde")]
    pub reservation_timeout: Duration,
}

impl Default for GridConfig {
    fn default() -> Self {
        Self {
            weights: Weights::default(),
            upgrade_after: 30,
            max_tries: 0,
            reservation_timeout: Duration::from_secs(120),
        }
    }
}

#[derive(Debug)]
struct Entry {
    report: JobReport,
    seen: Instant,
    queue: Priority,
    tries: u32,
    placed: Option<Instant>,
}

#[derive(Debug)]
struct Reservation {
    job: JobId,
    cluster: ClusterName,
    slots: u32,
    issued: Instant,
}

#[derive(Debug, Default)]
pub struct GridBook {
    entries: BTreeMap<JobId, Entry>,
    reservations: Vec<Reservation>,
}

/// A placed job's runner gets this long to report the placement before the
/// job counts as waiting again.
const PLACEMENT_ANSWER: Duration = Duration::from_secs(60);

impl GridBook {
    /// Records a grid job's report; `true` if the job is new here.
    pub fn update(&mut self, report: JobReport, now: Instant) -> bool {
        match self.entries.get_mut(&report.job) {
            Some(entry) => {
                if report.state != JobState::Waiting {
                    entry.placed.get_or_insert(now);
                } else if entry.report.state != JobState::Waiting {
                    // A component was withdrawn, or lost with the whole run:
                    // placed again at once, and that was a try.
                    entry.placed = None;
                    entry.tries += 1;
                    self.reservations.retain(|r| r.job != report.job);
                }
                entry.report = report;
                entry.seen = now;
                false
            }
            None => {
                let queue = report.priority;
                let placed = (report.state != JobState::Waiting).then_some(now);
                self.entries.insert(
                    report.job.clone(),
                    Entry {
                        report,
                        seen: now,
                        queue,
                        tries: 0,
                        placed,
                    },
                );
                true
            }
        }
    }

    pub fn done(&mut self, job: &JobId) {
        self.entries.remove(job);
        self.reservations.retain(|r| &r.job != job);
    }

    /// Forgets silent jobs, and promises the clusters have made good on
    /// (`held` says what a cluster reports a job's components hold).
    pub fn expire(
        &mut self,
        now: Instant,
        stale: Duration,
        config: &GridConfig,
        held: impl Fn(&ClusterName, &JobId) -> u32,
    ) {
        let gone: Vec<JobId> = self
            .entries
            .iter()
            .filter(|(_, e)| now.duration_since(e.seen) > stale)
            .map(|(id, _)| id.clone())
            .collect();
        for job in gone {
            self.done(&job);
        }
        let mut promised: BTreeMap<(ClusterName, JobId), u32> = BTreeMap::new();
        for r in &self.reservations {
            *promised
                .entry((r.cluster.clone(), r.job.clone()))
                .or_default() += r.slots;
        }
        self.reservations.retain(|r| {
            let reported = held(&r.cluster, &r.job);
            let total = promised[&(r.cluster.clone(), r.job.clone())];
            reported < total && now.duration_since(r.issued) <= config.reservation_timeout
        });
    }

    /// Slots promised to placed jobs on a cluster.
    pub fn reserved(&self, cluster: &ClusterName) -> u32 {
        self.reservations
            .iter()
            .filter(|r| &r.cluster == cluster)
            .map(|r| r.slots)
            .sum()
    }

    /// Jobs to place this round, oldest first.
    pub fn waiting(&self, now: Instant) -> Vec<GridJob> {
        let mut waiting: Vec<(&Entry, GridJob)> = self
            .entries
            .values()
            .filter(|e| e.report.state == JobState::Waiting)
            .filter(|e| {
                e.placed
                    .is_none_or(|at| now.duration_since(at) > PLACEMENT_ANSWER)
            })
            .map(|e| {
                let job = GridJob {
                    id: e.report.job.clone(),
                    queue: e.queue,
                    components: e.report.components.clone(),
                };
                (e, job)
            })
            .collect();
        waiting.sort_by_key(|(e, job)| (e.report.started_at, job.id.clone()));
        waiting.into_iter().map(|(_, job)| job).collect()
    }

    /// A job was placed: its slots are promised until the clusters show them.
    pub fn placed(&mut self, job: &JobId, clusters: &[ClusterName], now: Instant) {
        let Some(entry) = self.entries.get_mut(job) else {
            return;
        };
        entry.placed = Some(now);
        for (slots, cluster) in entry.report.components.iter().zip(clusters) {
            self.reservations.push(Reservation {
                job: job.clone(),
                cluster: cluster.clone(),
                slots: *slots,
                issued: now,
            });
        }
    }

    /// A job could not be placed this round. Returns why it is aborted, if
    /// it used up its tries.
    pub fn failed_try(&mut self, job: &JobId, config: &GridConfig) -> Option<String> {
        let entry = self.entries.get_mut(job)?;
        entry.tries += 1;
        entry.queue = upgraded(entry.queue, entry.tries, config.upgrade_after);
        if config.max_tries > 0 && entry.tries >= config.max_tries {
            let tries = entry.tries;
            self.done(job);
            return Some(format!("not placed after {tries} tries"));
        }
        None
    }

    pub fn reports(&self) -> impl Iterator<Item = &JobReport> {
        self.entries.values().map(|e| &e.report)
    }
}
