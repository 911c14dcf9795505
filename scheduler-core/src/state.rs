//! The scheduler's picture of the grid, rebuilt from reports alone.
//!
//! Nothing here is durable: after a restart (or a standby's takeover) the
//! next job updates and cluster reports, a few seconds' worth, rebuild it.
//! Grants and drains in flight are accounted so that a slot is never offered
//! twice and a job is not drained twice for the same imbalance.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use gleaner_manifest::{JobId, JobKind};
use gleaner_policy::{
    access::Users,
    ect::{NEVER_MS, Profile, scaled},
    placement::{self, GridJob, HostRoom, Running, Site, SiteEct},
    reallocation::{self, Waiting},
    share::{self, ClusterInput, JobInput, PolicyConfig},
};
use gleaner_protocol::{
    ActionReply, ClusterName, ClusterReport, ClusterView, ControlMsg, EndedJob, GrantId,
    GridSnapshot, JobReport, MAX_MESSAGE_BYTES, Message, Now, RequestMsg, SchedulerMsg,
    StatusReply, codec,
};
use tracing::{debug, info};

use serde::{Deserialize, Serialize};

use crate::{
    grid_book::{GridBook, GridConfig},
    history::History,
};

/// The scheduler's decisions' settings: the keys of `[scheduler]` besides
/// the round interval. Defaults live here and nowhere else.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct StateConfig {
    #[serde(flatten)]
    pub policy: PolicyConfig,
    /// A cluster whose launchers failed to start this many times in a row gets no grows.
    pub max_consecutive_failures: u32,
    /// Reports older than this make a cluster (or a job) unknown again.
    #[serde(with = "humantime_serde")]
    pub stale_after: Duration,
    /// A grant neither applied nor refused by then is forgotten.
    #[serde(with = "humantime_serde")]
    pub grant_timeout: Duration,
    /// Slots are offered only once they have been idle this long: a slot
    /// just freed may be about to go to the cluster's own scheduler.
    #[serde(with = "humantime_serde")]
    pub idle_settle: Duration,
    /// While the cluster's own jobs waited this recently, its slots are
    /// offered only once idle this long (or `idle_settle`, if longer): its
    /// batch system may still be handing them to jobs that arrive one by
    /// one, and a launcher started there now would be taken back at once.
    #[serde(with = "humantime_serde")]
    pub local_wait_settle: Duration,
    /// An excluded cluster gets a one-slot trial grow this often, so that
    /// the success that readmits it can happen.
    #[serde(with = "humantime_serde")]
    pub probe_interval: Duration,
    #[serde(flatten)]
    pub grid: GridConfig,
    /// Ended jobs are remembered this long (within the history's bound),
    /// for `gleaner status`, `jobs`, `results` and `logs` after the end.
    #[serde(with = "humantime_serde")]
    pub history_retention: Duration,
}

/// Ended jobs in a status reply that names no job.
const RECENT_ENDED: usize = 50;

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            policy: PolicyConfig::default(),
            max_consecutive_failures: 3,
            stale_after: Duration::from_secs(30),
            grant_timeout: Duration::from_secs(30),
            idle_settle: Duration::ZERO,
            local_wait_settle: Duration::from_secs(3),
            probe_interval: Duration::from_secs(60),
            grid: GridConfig::default(),
            history_retention: Duration::from_secs(30 * 86_400),
        }
    }
}

/// What the service must send after a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Offer {
        job: JobId,
        grant: GrantId,
        cluster: ClusterName,
        slots: u32,
    },
    /// Give back slots without losing work (fair share), from launchers
    /// on `hosts` (anywhere when empty).
    Drain {
        job: JobId,
        cluster: ClusterName,
        slots: u32,
        hosts: Vec<String>,
    },
    /// Give back slots now: a grid job needs them (on `hosts`, when not
    /// empty).
    Preempt {
        job: JobId,
        cluster: ClusterName,
        slots: u32,
        reason: String,
        hosts: Vec<String>,
    },
    /// A grid job goes to these clusters (component `i` to `clusters[i]`),
    /// its inputs expected to take `stage_ms` to stage there.
    Place {
        job: JobId,
        clusters: Vec<ClusterName>,
        stage_ms: u64,
        /// When its last component is expected to start, ms from now.
        start_ms: u64,
        /// Moldable components' slots (0: not moldable; empty: none is).
        slots: Vec<u32>,
    },
    /// A waiting component moves where it would complete earlier.
    Move {
        job: JobId,
        component: u32,
        from: ClusterName,
        to: ClusterName,
        start_ms: u64,
        /// Its expected completion where it waits and where it goes.
        before_ms: u64,
        after_ms: u64,
    },
    /// A grid job will not be placed.
    Abort { job: JobId, reason: String },
    /// A running grid job stops, for one of higher priority, and goes
    /// back to be placed again.
    StepAside { job: JobId, reason: String },
}

/// What the service does about a message, besides acknowledging it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaction {
    Nothing,
    /// Run a round soon rather than at the next tick: a job is new and need
    /// not wait. Cluster reports only update the picture: at grid scale they
    /// arrive by the thousand each second.
    Round,
}

/// The answer to a user's request, and what it sets off.
#[derive(Debug, Clone)]
pub enum Answer {
    Status(StatusReply),
    /// The reply to a cancel, an addition or a close, and the message to
    /// send the job's runner if it is allowed.
    Action(ActionReply, Option<(JobId, ControlMsg)>),
}

/// When the next round is due: every `interval`, and sooner after news that
/// should not wait for the timer (a new job), but never sooner than
/// `min_gap` after the last round, so that a burst of news (every runner
/// reporting to a new scheduler) costs a few rounds, not one each.
#[derive(Debug, Clone, Copy)]
pub struct RoundClock {
    interval: Duration,
    min_gap: Duration,
    last: Instant,
    next: Instant,
}

impl RoundClock {
    pub fn new(interval: Duration, min_gap: Duration, now: Instant) -> Self {
        Self {
            interval,
            min_gap,
            last: now,
            next: now + interval,
        }
    }

    pub fn next(&self) -> Instant {
        self.next
    }

    /// Brings the next round forward, as far as `min_gap` allows.
    pub fn hurry(&mut self, now: Instant) {
        self.next = self.next.min(now.max(self.last + self.min_gap));
    }

    /// A round ran at `now`: the next one is a whole interval away.
    pub fn ran(&mut self, now: Instant) {
        self.last = now;
        self.next = now + self.interval;
    }
}

#[derive(Debug)]
struct ClusterEntry {
    report: ClusterReport,
    seen: Instant,
    first_seen: Instant,
    /// Recent idle counts, oldest first, for `idle_settle` and `local_wait_settle`.
    idle_history: std::collections::VecDeque<(Instant, u32)>,
    /// When a report last showed the cluster's own jobs waiting.
    local_waited: Option<Instant>,
    /// When the cluster last got a trial grow while excluded.
    probed: Option<Instant>,
}

impl ClusterEntry {
    /// What its kcm foresees, as of `now`: its speed, its free slots over
    /// time without gleaner's waiting components, and those components.
    fn foresight(&self, now: Instant) -> Option<(f64, Profile, Vec<Waiting>)> {
        let foresight = self.report.foresight.as_ref()?;
        let age = now.saturating_duration_since(self.seen).as_millis() as u64;
        let speed = foresight.speed;
        let profile =
            Profile::from_steps(self.report.total_slots, foresight.free.clone()).advanced(age);
        let waiting = foresight
            .waiting
            .iter()
            .map(|w| {
                let walltime = w.walltime_ms.unwrap_or(NEVER_MS);
                let here = scaled(walltime, speed);
                let start = w.start_ms.saturating_sub(age);
                Waiting {
                    job: w.job.clone(),
                    component: w.component,
                    slots: w.slots,
                    // Back to a walltime on a cluster of speed 1.
                    walltime: match walltime {
                        NEVER_MS => NEVER_MS,
                        _ => (walltime as f64 * speed) as u64,
                    },
                    cluster: self.report.cluster.clone(),
                    start,
                    completion: start.saturating_add(here),
                    barred: Vec::new(),
                }
            })
            .collect();
        Some((speed, profile, waiting))
    }

    /// How long a slot must have been idle to be offered: longer while the
    /// cluster's own jobs waited in the last `local_wait_settle`.
    fn settle(&self, now: Instant, config: &StateConfig) -> Duration {
        match self.local_waited {
            Some(at) if now.saturating_duration_since(at) < config.local_wait_settle => {
                config.idle_settle.max(config.local_wait_settle)
            }
            _ => config.idle_settle,
        }
    }

    /// The idle slots that stayed idle for all of the settle time.
    fn settled_idle(&self, now: Instant, config: &StateConfig) -> u32 {
        let settle = self.settle(now, config);
        if settle.is_zero() {
            return self.report.idle_slots;
        }
        if now.duration_since(self.first_seen) < settle {
            return 0;
        }
        self.idle_history
            .iter()
            .filter(|(at, _)| now.duration_since(*at) <= settle)
            .map(|(_, idle)| *idle)
            .chain(std::iter::once(self.report.idle_slots))
            .min()
            .unwrap_or(0)
    }
}

#[derive(Debug)]
struct JobEntry {
    report: JobReport,
    seen: Instant,
}

/// Slots promised to a job on a cluster that its placeholders do not show yet.
#[derive(Debug, Clone)]
struct Grant {
    job: JobId,
    cluster: ClusterName,
    slots: u32,
    issued: Instant,
}

#[derive(Debug, Clone)]
struct DrainOrder {
    job: JobId,
    cluster: ClusterName,
    slots: u32,
    held_before: u32,
    issued: Instant,
}

#[derive(Debug, Default)]
pub struct State {
    clusters: BTreeMap<ClusterName, ClusterEntry>,
    jobs: BTreeMap<JobId, JobEntry>,
    grants: BTreeMap<GrantId, Grant>,
    drains: Vec<DrainOrder>,
    next_grant: GrantId,
    grid: GridBook,
    history: History,
    /// When the next reallocation is due (none before the first round).
    next_reallocation: Option<Instant>,
}

impl State {
    /// Grant ids start from the clock so that a restarted scheduler does not
    /// reuse the ids of grants still in flight.
    pub fn new(first_grant: GrantId) -> Self {
        Self {
            next_grant: first_grant,
            ..Self::default()
        }
    }

    /// Takes in a message from the scheduler's inbox.
    pub fn on_message(
        &mut self,
        message: SchedulerMsg,
        now: Instant,
        config: &StateConfig,
    ) -> Reaction {
        match message {
            SchedulerMsg::JobUpdate(report) => {
                if self.on_job_update(report, now) {
                    Reaction::Round
                } else {
                    Reaction::Nothing
                }
            }
            SchedulerMsg::JobDone { job } => {
                info!(job = %job, "job done");
                self.on_job_done(&job);
                Reaction::Nothing
            }
            SchedulerMsg::ClusterStatus(report) => {
                self.on_cluster(report, now, config);
                Reaction::Nothing
            }
            SchedulerMsg::GrowAck {
                grant,
                job,
                cluster,
                accepted,
            } => {
                debug!(job = %job, cluster = %cluster, grant = %grant, accepted, "grow acknowledged");
                self.on_grow_ack(grant, accepted);
                Reaction::Nothing
            }
        }
    }

    /// Answers a user's request. `user` is the request's broker-checked
    /// `user_id`; what it may see and cancel is for `users` to say.
    pub fn on_request(
        &self,
        user: Option<&str>,
        request: RequestMsg,
        now: Instant,
        config: &StateConfig,
        users: &Users,
    ) -> Answer {
        match request {
            RequestMsg::Status { job } => {
                let mut reply = self.status("", now, config);
                // A report that came after the job's end is stale.
                reply
                    .jobs
                    .retain(|j| !self.history.has_ended(&j.job, &j.owner));
                if let Some(job) = &job {
                    reply.jobs.retain(|j| &j.job == job);
                    reply.placements.retain(|p| &p.job == job);
                }
                let before = reply.jobs.len();
                reply.jobs.retain(|j| users.may_act_on(user, &j.owner));
                // Inputs are placement's: a user's many grid jobs would
                // otherwise make a reply of all their paths.
                reply.jobs = std::mem::take(&mut reply.jobs)
                    .into_iter()
                    .map(JobReport::without_inputs)
                    .collect();
                let visible: std::collections::BTreeSet<&JobId> =
                    reply.jobs.iter().map(|j| &j.job).collect();
                reply.placements.retain(|p| visible.contains(&p.job));
                // Others' jobs stay in the clusters' figures, not by name.
                for view in &mut reply.clusters {
                    let report = &mut view.report;
                    report.jobs.retain(|job, _| visible.contains(job));
                    report.grid.retain(|job, _| visible.contains(job));
                    for host in &mut report.hosts {
                        host.jobs.retain(|job, _| visible.contains(job));
                    }
                }
                let mut hidden = before - reply.jobs.len();
                let visible = |e: &&EndedJob| users.may_act_on(user, &e.owner);
                reply.ended = match &job {
                    Some(job) => {
                        hidden += self.history.of(job).filter(|e| !visible(e)).count();
                        let mut ended: Vec<_> =
                            self.history.of(job).filter(visible).cloned().collect();
                        ended.sort_by_key(|e| std::cmp::Reverse(e.ended_at));
                        ended
                    }
                    None => self
                        .history
                        .latest()
                        .filter(visible)
                        .take(RECENT_ENDED)
                        .cloned()
                        .collect(),
                };
                reply.hidden = u32::try_from(hidden).unwrap_or(u32::MAX);
                Answer::Status(reply)
            }
            RequestMsg::Cancel { job } => {
                let by = user.unwrap_or("an unnamed user");
                let cancel = ControlMsg::Cancel {
                    reason: format!("cancelled by {by}"),
                };
                self.act(user, users, job, cancel)
            }
            RequestMsg::AddTasks { job, addition } => {
                self.act(user, users, job, ControlMsg::AddTasks(addition))
            }
            RequestMsg::Close { job } => self.act(user, users, job, ControlMsg::Close {}),
            RequestMsg::Follow { job, task } => {
                let follow = ControlMsg::Follow {
                    task,
                    reply_to: None,
                };
                self.act(user, users, job, follow)
            }
        }
    }

    /// A user's cancel, addition, close or follow of `job`: passed on to
    /// its runner if the job runs, is theirs, and (for an addition or a
    /// close) is open.
    fn act(&self, user: Option<&str>, users: &Users, job: JobId, msg: ControlMsg) -> Answer {
        let report = self
            .jobs
            .get(&job)
            .map(|j| &j.report)
            .or_else(|| self.grid.reports().find(|r| r.job == job));
        let Some(report) = report else {
            return Answer::Action(ActionReply::NotRunning {}, None);
        };
        let what = msg.kind();
        if !users.may_act_on(user, &report.owner) {
            info!(job = %job, user = user.unwrap_or("?"), owner = %report.owner, what, "refused: not the owner");
            let reason = format!("the job is {}'s", report.owner);
            return Answer::Action(ActionReply::Refused { reason }, None);
        }
        if !report.open && matches!(msg, ControlMsg::AddTasks(_) | ControlMsg::Close {}) {
            let reason = "the job is not open (tasks are added to jobs submitted with `open = true` or `--open`, until they are closed)".to_owned();
            return Answer::Action(ActionReply::Refused { reason }, None);
        }
        // What the user sent fit a message; as the scheduler encodes it
        // again (tasks sent as bare arrays get their field names) it may not.
        if let Err(bytes) = codec::fits(&msg) {
            info!(job = %job, user = user.unwrap_or("?"), what, bytes, "refused: too big to pass on");
            let reason = format!(
                "the tasks would make a message of {:.1} MiB for the job's runner, more than the {} MiB one may hold: add them in parts",
                bytes as f64 / f64::from(1 << 20),
                MAX_MESSAGE_BYTES >> 20
            );
            return Answer::Action(ActionReply::Refused { reason }, None);
        }
        info!(job = %job, user = user.unwrap_or("an unnamed user"), what, "passed on to the job's runner");
        Answer::Action(ActionReply::Accepted {}, Some((job, msg)))
    }

    /// Records a job's report; `true` if the job is new here.
    pub fn on_job_update(&mut self, report: JobReport, now: Instant) -> bool {
        if self.history.has_ended(&report.job, &report.owner) {
            debug!(job = %report.job, "a report of a job that has ended ignored");
            return false;
        }
        if report.kind == JobKind::Grid {
            return self.grid.update(report, now);
        }
        self.jobs
            .insert(report.job.clone(), JobEntry { report, seen: now })
            .is_none()
    }

    /// An ended job (or a refused submission) read from the history. A
    /// job's end may be read before its runner's `JobDone`: it is over
    /// either way.
    pub fn on_ended(&mut self, ended: EndedJob, now: Now, config: &StateConfig) {
        let done = ended.report().map(|report| report.job.clone());
        self.history
            .record(ended, now.wall_ms, config.history_retention);
        if let Some(job) = done {
            self.on_job_done(&job);
        }
    }

    pub fn on_job_done(&mut self, job: &JobId) {
        self.grid.done(job);
        self.jobs.remove(job);
        self.grants.retain(|_, g| &g.job != job);
        self.drains.retain(|d| &d.job != job);
    }

    pub fn on_cluster(&mut self, mut report: ClusterReport, now: Instant, config: &StateConfig) {
        for grant in std::mem::take(&mut report.applied_grants) {
            self.grants.remove(&grant);
        }
        let entry = self
            .clusters
            .entry(report.cluster.clone())
            .or_insert_with(|| ClusterEntry {
                report: ClusterReport::default(),
                seen: now,
                first_seen: now,
                idle_history: Default::default(),
                local_waited: None,
                probed: None,
            });
        entry.idle_history.push_back((now, report.idle_slots));
        if report.local_waiting_ahead() > 0 {
            entry.local_waited = Some(now);
        }
        let longest = config.idle_settle.max(config.local_wait_settle);
        while entry
            .idle_history
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > longest)
        {
            entry.idle_history.pop_front();
        }
        if report.failed_starts < config.max_consecutive_failures {
            entry.probed = None;
        }
        entry.report = report;
        entry.seen = now;
    }

    /// The runner took `accepted` of a grant's slots; the rest are free again.
    pub fn on_grow_ack(&mut self, grant: GrantId, accepted: u32) {
        if accepted == 0 {
            self.grants.remove(&grant);
        } else if let Some(g) = self.grants.get_mut(&grant) {
            g.slots = g.slots.min(accepted);
        }
    }

    /// Forgets what has gone quiet.
    pub fn expire(&mut self, now: Instant, config: &StateConfig) {
        let clusters = &self.clusters;
        self.grid
            .expire(now, config.stale_after, &config.grid, |cluster, job| {
                clusters
                    .get(cluster)
                    .and_then(|c| c.report.grid.get(job))
                    .map_or(0, |h| h.total())
            });
        let stale = config.stale_after;
        let gone: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, j)| now.duration_since(j.seen) > stale)
            .map(|(id, _)| id.clone())
            .collect();
        for job in gone {
            self.on_job_done(&job);
        }
        self.grants
            .retain(|_, g| now.duration_since(g.issued) <= config.grant_timeout);
        let clusters = &self.clusters;
        self.drains.retain(|d| {
            let held = clusters
                .get(&d.cluster)
                .map_or(0, |c| c.report.jobs.get(&d.job).map_or(0, |h| h.total()));
            held.saturating_add(d.slots) > d.held_before
                && now.duration_since(d.issued) <= config.grant_timeout
        });
    }

    /// Whether a cluster may grow this round, and by at most how many slots.
    fn growable(cluster: &mut ClusterEntry, now: Instant, config: &StateConfig) -> Option<u32> {
        if now.duration_since(cluster.seen) > config.stale_after {
            return None;
        }
        let idle = cluster.settled_idle(now, config);
        if cluster.report.failed_starts < config.max_consecutive_failures {
            return Some(idle);
        }
        // Excluded: a trial of one slot now and then.
        let due = cluster
            .probed
            .is_none_or(|at| now.duration_since(at) >= config.probe_interval);
        if due && idle > 0 {
            cluster.probed = Some(now);
            return Some(1);
        }
        None
    }

    /// One scheduling round: the policy's plan, turned into actions.
    pub fn round(&mut self, now: Instant, config: &StateConfig) -> Vec<Action> {
        self.expire(now, config);
        let mut actions = self.reallocate(now, config);
        actions.extend(self.place_grid_jobs(now, config));
        let clusters = self.policy_clusters(now, config);
        let jobs = self.policy_jobs();
        let plan = share::plan(&clusters, &jobs, &config.policy);
        for offer in plan.offers {
            let grant = self.next_grant;
            self.next_grant = grant.next();
            self.grants.insert(
                grant,
                Grant {
                    job: offer.job.clone(),
                    cluster: offer.cluster.clone(),
                    slots: offer.slots,
                    issued: now,
                },
            );
            actions.push(Action::Offer {
                job: offer.job,
                grant,
                cluster: offer.cluster,
                slots: offer.slots,
            });
        }
        for drain in plan.drains {
            let held_before = self.held(&drain.cluster, &drain.job);
            self.drains.push(DrainOrder {
                job: drain.job.clone(),
                cluster: drain.cluster.clone(),
                slots: drain.slots,
                held_before,
                issued: now,
            });
            actions.push(Action::Drain {
                job: drain.job,
                cluster: drain.cluster,
                slots: drain.slots,
                hosts: drain.hosts,
            });
        }
        actions
    }

    fn policy_clusters(&mut self, now: Instant, config: &StateConfig) -> Vec<ClusterInput> {
        let growable: BTreeMap<ClusterName, Option<u32>> = self
            .clusters
            .iter_mut()
            .map(|(name, entry)| (name.clone(), Self::growable(entry, now, config)))
            .collect();
        let mut grants: BTreeMap<&ClusterName, Vec<&Grant>> = BTreeMap::new();
        for grant in self.grants.values() {
            grants.entry(&grant.cluster).or_default().push(grant);
        }
        let mut drains: BTreeMap<&ClusterName, Vec<&DrainOrder>> = BTreeMap::new();
        for drain in &self.drains {
            drains.entry(&drain.cluster).or_default().push(drain);
        }
        self.clusters
            .iter()
            .map(|(name, entry)| {
                let growable = growable.get(name).copied().flatten();
                let report = &entry.report;
                let mut held: BTreeMap<JobId, u32> = report
                    .jobs
                    .iter()
                    .map(|(job, h)| (job.clone(), h.total()))
                    .collect();
                let mut promised = 0;
                for grant in grants.get(name).into_iter().flatten() {
                    *held.entry(grant.job.clone()).or_default() += grant.slots;
                    promised += grant.slots;
                }
                let mut draining = std::collections::BTreeSet::new();
                for drain in drains.get(name).into_iter().flatten() {
                    if let Some(h) = held.get_mut(&drain.job) {
                        *h = h.saturating_sub(drain.slots);
                    }
                    draining.insert(drain.job.clone());
                }
                ClusterInput {
                    name: name.clone(),
                    total: report.total_slots,
                    // Slots that waiting local jobs need, or that a placed
                    // grid job is about to take, are not ours to offer.
                    idle: growable
                        .unwrap_or(0)
                        .saturating_sub(promised)
                        .saturating_sub(self.grid.reserved(name))
                        .saturating_sub(report.local_waiting_ahead()),
                    others: report.local_slots + report.grid_slots,
                    held,
                    excluded: growable.is_none(),
                    draining,
                    barred: report
                        .job_failures
                        .iter()
                        .filter(|(_, failures)| **failures >= config.max_consecutive_failures)
                        .map(|(job, _)| job.clone())
                        .collect(),
                    gpu_hosts: gpu_hosts(&report.hosts),
                }
            })
            .collect()
    }

    /// Each scavenging job's demand: what it could still use beyond what
    /// its placeholders hold and its grants promise.
    fn policy_jobs(&self) -> Vec<JobInput> {
        let mut covered: BTreeMap<&JobId, u32> = BTreeMap::new();
        for cluster in self.clusters.values() {
            for (job, holding) in &cluster.report.jobs {
                let total = covered.entry(job).or_default();
                *total = holding.total().saturating_add(*total);
            }
        }
        for grant in self.grants.values() {
            let total = covered.entry(&grant.job).or_default();
            *total = grant.slots.saturating_add(*total);
        }
        self.jobs
            .values()
            .filter(|j| j.report.kind == JobKind::Scavenge)
            .map(|j| {
                let covered = covered.get(&j.report.job).copied().unwrap_or(0);
                JobInput {
                    id: j.report.job.clone(),
                    demand: share::demand(
                        share::Need {
                            unfinished: j.report.tasks.to_run(),
                            task_slots: j.report.task_slots,
                            max_slots: j.report.max_slots,
                        },
                        u64::from(covered),
                    ),
                    weight: j.report.weight,
                    task_slots: j.report.task_slots,
                    gpus: j.report.task_needs.gpus,
                }
            })
            .collect()
    }

    pub fn status(&self, scheduler: &str, now: Instant, config: &StateConfig) -> StatusReply {
        StatusReply {
            scheduler: scheduler.to_owned(),
            policy: config.policy.policy.name().to_owned(),
            clusters: self
                .clusters
                .values()
                .map(|c| ClusterView {
                    report: c.report.clone(),
                    excluded: c.report.failed_starts >= config.max_consecutive_failures,
                    stale: now.duration_since(c.seen) > config.stale_after,
                })
                .collect(),
            jobs: self
                .jobs
                .values()
                .map(|j| j.report.clone())
                .chain(self.grid.reports().cloned())
                .collect(),
            placements: self.grid.placements(now),
            hidden: 0,
            ended: Vec::new(),
        }
    }

    /// The grid bookkeeping a scheduler taking over needs ([`GridBook::snapshot`]).
    pub fn grid_snapshot(&self, now: Now) -> GridSnapshot {
        self.grid.snapshot(now)
    }

    /// Takes over the previous active scheduler's grid bookkeeping.
    pub fn restore_grid(&mut self, snapshot: GridSnapshot, now: Now) {
        info!(
            placements = snapshot.placements.len(),
            reservations = snapshot.reservations.len(),
            "grid bookkeeping taken over"
        );
        self.grid.restore(snapshot, now);
    }
}

/// The hosts whose GPUs the batch system counts, as the GPU share sees
/// them; `None` where no host's are.
fn gpu_hosts(hosts: &[gleaner_protocol::HostReport]) -> Option<Vec<share::GpuHost>> {
    let counted: Vec<share::GpuHost> = hosts
        .iter()
        .filter_map(|h| {
            Some(share::GpuHost {
                name: h.name.clone(),
                free_slots: h.free(),
                free_gpus: h.free_gpus?,
                held: h.jobs.clone(),
            })
        })
        .collect();
    (!counted.is_empty()).then_some(counted)
}

mod placing;

#[cfg(test)]
pub(crate) mod tests;
