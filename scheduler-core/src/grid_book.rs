//! Grid jobs waiting for placement, and the slots promised to those placed.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use gleaner_manifest::{JobId, Priority};
use gleaner_policy::{
    placement::{GridJob, Rule, StopRules, Weights, upgraded},
    reallocation::{Algorithm, Heuristic},
};
use gleaner_protocol::{
    ClusterName, GridPlacement, GridReservation, GridSnapshot, JobReport, JobState, Millis, Now,
};
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
    /// When a running grid job may be stopped for one of higher priority.
    #[serde(flatten)]
    pub stop: StopRules,
    /// Where components go: `mct` (where they complete first, waiting in
    /// a batch queue if need be) or `worst-fit` (free slots now only).
    #[serde(rename = "grid_placement")]
    pub placement: Rule,
    /// How often waiting components are reallocated (seed 002); 0: never.
    #[serde(with = "humantime_serde")]
    pub reallocate_every: Duration,
    /// The least a move must bring a component's completion forward.
    #[serde(with = "humantime_serde")]
    pub reallocate_gain: Duration,
    /// `regular` or `all-cancellation`.
    #[serde(rename = "reallocation_algorithm")]
    pub reallocation: Algorithm,
    /// `mct` or `minmin`.
    pub reallocation_heuristic: Heuristic,
}

impl Default for GridConfig {
    fn default() -> Self {
        Self {
            weights: Weights::default(),
            upgrade_after: 30,
            max_tries: 0,
            reservation_timeout: Duration::from_secs(120),
            stop: StopRules::default(),
            placement: Rule::default(),
            reallocate_every: Duration::from_secs(3600),
            reallocate_gain: Duration::from_secs(60),
            reallocation: Algorithm::default(),
            reallocation_heuristic: Heuristic::default(),
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
    /// Why its last try did not place it.
    unplaced_because: Option<String>,
    /// When it was asked to step aside, and for which job of higher
    /// priority.
    asked_aside: Option<(Instant, JobId)>,
    /// It stepped aside for this job: it is not placed again before it.
    behind: Option<JobId>,
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
    /// Placements handed over by the previous active scheduler for jobs
    /// that have not reported here yet, and when they were handed over.
    carried: BTreeMap<JobId, (GridPlacement, Instant)>,
}

/// A placed job's runner gets this long to report the placement before the
/// job counts as waiting again.
const PLACEMENT_ANSWER: Duration = Duration::from_secs(60);

/// A job asked to step aside gets this long (the longest grace, and the
/// time its components take to be reported) before more are stopped.
const STEP_ASIDE_ANSWER: Duration = Duration::from_secs(180);

impl GridBook {
    /// Records a grid job's report; `true` if the job is new here.
    pub fn update(&mut self, report: JobReport, now: Instant) -> bool {
        match self.entries.get_mut(&report.job) {
            Some(entry) => {
                if report.state != JobState::Waiting {
                    entry.placed.get_or_insert(now);
                } else if let Some((_, for_job)) = entry.asked_aside.take() {
                    // Stopped for a job of higher priority: back to its
                    // own queue, behind that job, and that was no try.
                    entry.behind = Some(for_job);
                    entry.placed = None;
                    entry.queue = report.priority;
                    self.reservations.retain(|r| r.job != report.job);
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
                let mut entry = Entry {
                    queue: report.priority,
                    placed: (report.state != JobState::Waiting).then_some(now),
                    report,
                    seen: now,
                    tries: 0,
                    unplaced_because: None,
                    asked_aside: None,
                    behind: None,
                };
                if let Some((placement, at)) = self.carried.remove(&entry.report.job) {
                    entry.carry_on(&placement, at);
                }
                self.entries.insert(entry.report.job.clone(), entry);
                true
            }
        }
    }

    pub fn done(&mut self, job: &JobId) {
        self.entries.remove(job);
        self.carried.remove(job);
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
        self.carried
            .retain(|_, (_, at)| now.duration_since(*at) <= stale);
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

    /// Grid jobs running whole that have not been asked to step aside.
    pub fn running(&self) -> impl Iterator<Item = &JobReport> {
        self.entries
            .values()
            .filter(|e| e.report.state == JobState::Running && e.asked_aside.is_none())
            .map(|e| &e.report)
    }

    pub fn report_of(&self, job: &JobId) -> Option<&JobReport> {
        self.entries.get(job).map(|e| &e.report)
    }

    /// `job` was asked to step aside for `for_job`.
    pub fn ask_aside(&mut self, job: &JobId, for_job: &JobId, now: Instant) {
        if let Some(entry) = self.entries.get_mut(job) {
            entry.asked_aside = Some((now, for_job.clone()));
        }
    }

    /// Some job asked to step aside has not yet (its components take
    /// their grace to stop); after [`STEP_ASIDE_ANSWER`], it is not waited for.
    pub fn stepping_aside(&self, now: Instant) -> bool {
        self.entries.values().any(|e| {
            e.asked_aside
                .as_ref()
                .is_some_and(|(at, _)| now.duration_since(*at) <= STEP_ASIDE_ANSWER)
        })
    }

    /// Slots promised to placed jobs on a cluster.
    pub fn reserved(&self, cluster: &ClusterName) -> u32 {
        self.reservations
            .iter()
            .filter(|r| &r.cluster == cluster)
            .map(|r| r.slots)
            .sum()
    }

    /// Jobs to place this round, oldest first; one that stepped aside
    /// for another waits while that one does.
    pub fn waiting(&self, now: Instant) -> Vec<GridJob> {
        let still_waiting = |job: &JobId| {
            self.entries
                .get(job)
                .is_some_and(|e| e.report.state == JobState::Waiting)
        };
        let mut waiting: Vec<(&Entry, GridJob)> = self
            .entries
            .values()
            .filter(|e| e.report.state == JobState::Waiting)
            .filter(|e| e.behind.as_ref().is_none_or(|job| !still_waiting(job)))
            .filter(|e| {
                e.placed
                    .is_none_or(|at| now.duration_since(at) > PLACEMENT_ANSWER)
            })
            .map(|e| {
                let job = GridJob {
                    id: e.report.job.clone(),
                    queue: e.queue,
                    components: e.report.components.clone(),
                    avoid: e.report.avoid.clone(),
                    inputs: e.report.inputs_by_component(),
                    walltime_ms: e
                        .report
                        .gathering
                        .as_ref()
                        .and_then(|g| g.walltime_s)
                        .map(|s| (s * 1000.0) as u64),
                    moldable: e.report.moldable.clone(),
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
    /// Says why a job's try did not place it.
    pub fn unplaced_because(&mut self, job: &JobId, because: String) {
        if let Some(entry) = self.entries.get_mut(job) {
            entry.unplaced_because = Some(because);
        }
    }

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

    /// Waiting grid jobs' placements so far.
    pub fn placements(&self, now: Instant) -> Vec<GridPlacement> {
        self.entries
            .values()
            .filter(|e| e.report.state == JobState::Waiting)
            .map(|e| e.placement(now))
            .collect()
    }

    /// What a scheduler taking over needs and no report carries: tries
    /// count for running jobs too (a rigid job that loses a component
    /// waits again, one try more).
    pub fn snapshot(
        &self,
        Now {
            instant: now,
            wall_ms,
        }: Now,
    ) -> GridSnapshot {
        let carried = self.carried.values().map(|(placement, at)| GridPlacement {
            placed_ms_ago: placement
                .placed_ms_ago
                .map(|ago| ago.saturating_add(millis(now.duration_since(*at)))),
            ..placement.clone()
        });
        GridSnapshot {
            taken_ms: wall_ms,
            placements: self
                .entries
                .values()
                .map(|e| e.placement(now))
                .chain(carried)
                .collect(),
            reservations: self
                .reservations
                .iter()
                .map(|r| GridReservation {
                    job: r.job.clone(),
                    cluster: r.cluster.clone(),
                    slots: r.slots,
                    age_ms: millis(now.duration_since(r.issued)),
                })
                .collect(),
        }
    }

    /// Takes over the previous active scheduler's bookkeeping, which is
    /// newer than anything this one kept. Ages count from when it was
    /// taken, on the wall clock (the only one two hosts share).
    pub fn restore(
        &mut self,
        snapshot: GridSnapshot,
        Now {
            instant: now,
            wall_ms,
        }: Now,
    ) {
        let since = Duration::from_millis(wall_ms.saturating_sub(snapshot.taken_ms));
        let ago = |ms: Millis| now.checked_sub(since + Duration::from_millis(ms));
        for mut placement in snapshot.placements {
            placement.placed_ms_ago = placement
                .placed_ms_ago
                .map(|ms| ms.saturating_add(millis(since)));
            match self.entries.get_mut(&placement.job) {
                Some(entry) => entry.carry_on(&placement, now),
                None => {
                    self.carried.insert(placement.job.clone(), (placement, now));
                }
            }
        }
        self.reservations = snapshot
            .reservations
            .into_iter()
            .filter_map(|r| {
                Some(Reservation {
                    issued: ago(r.age_ms)?,
                    job: r.job,
                    cluster: r.cluster,
                    slots: r.slots,
                })
            })
            .collect();
    }
}

impl Entry {
    fn placement(&self, now: Instant) -> GridPlacement {
        GridPlacement {
            job: self.report.job.clone(),
            queue: self.queue,
            tries: self.tries,
            placed_ms_ago: self.placed.map(|at| millis(now.duration_since(at))),
            unplaced_because: self.unplaced_because.clone(),
        }
    }

    /// Goes on from a placement handed over at `at`.
    fn carry_on(&mut self, placement: &GridPlacement, at: Instant) {
        self.tries = placement.tries;
        self.queue = placement.queue;
        if self.report.state == JobState::Waiting {
            self.placed = placement
                .placed_ms_ago
                .and_then(|ms| at.checked_sub(Duration::from_millis(ms)));
        }
    }
}

fn millis(d: Duration) -> Millis {
    Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}
