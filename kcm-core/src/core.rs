//! The kcm's decisions, without I/O.
//!
//! [`KcmCore`] is a state machine ([`Core`]): it takes an [`Event`] — a
//! message on the kcm's queue, a reading of the batch system with the
//! component exits found in the spool, the outcome of a command it asked
//! for — with the time as an argument, and keeps the [`Effect`]s to carry
//! out until its shell polls them. It never reads a clock, the batch system
//! or the spool, and never sends anything (it only logs), so it can be
//! driven by `lib.rs` (RabbitMQ and a real batch system) or by a simulator
//! (a simulated clock and cluster) alike, and tested by feeding it events.
//!
//! How a shell drives it:
//!
//! - a new broker session: `Event::Connected`; every message:
//!   `Event::Message`; when [`Core::poll_timeout`] comes: the time event;
//!   then their effects, where [`Effect::PollNow`] asks for a poll once
//!   the message at hand is acknowledged;
//! - every poll: read the batch system and the spool, `Event::Polled`, then
//!   its effects, which end with the report (after the answers to the
//!   poll's own commands, so that it carries their failures);
//! - effects in order; those that run a command are answered at once with
//!   the event they name, whose effects come before the remaining ones.
//!
//! Batch jobs are gleaner's by name and owner. Job ids are public and
//! anyone may name a job `gl-<job>` or `gg-<job>.<n>`, so a reading leaves
//! such jobs [`NamedJob`] and the core judges them: a component is gleaner's
//! if the kcm's own account submitted it, a placeholder if the account
//! the kcm submits its job's placeholders as did (the kcm's with one user,
//! the job owner's with many, learned from the job's grants). Anybody
//! else's counts as their local job: never removed, withdrawn, or taken
//! for a failed start of gleaner's.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use gleaner_manifest::{JobId, MAX_PREEMPT_GRACE, TaskShape};
use gleaner_policy::{
    access::Users,
    ect::NEVER_MS,
    local::{Answered, LocalState, on_local_wait},
    placement::component_on_one_host,
};
use gleaner_protocol::{
    Captured, ClusterName, ClusterReport, ComponentOutcome, ComponentSpec, ControlMsg, Credentials,
    GpusHeld, GrantId, Holding, HostSlots, InputAccess, KcmMsg, Outbox, SchedulerMsg, ShrinkMode,
    naming,
};
use tracing::{error, info, warn};

pub use crate::{
    BackendError,
    snapshot::{ComponentRun, Host, NamedJob, Placeholder, Snapshot},
};
use crate::{barrier, failures::StartFailures};
pub use gleaner_policy::local::WaitingJob;

/// What the core knows of its cluster.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub cluster: ClusterName,
    /// The batch system's kind (`local`, `sge`, …), for the report.
    pub backend: String,
    /// How long the launchers of an ended job have to leave by themselves.
    pub job_end_grace: Duration,
    /// How long a shrink for waiting local jobs gets to take effect before
    /// the same waiting jobs are answered again.
    pub local_settle: Duration,
    /// How often the batch system is read while gleaner holds or waits for
    /// slots here, and while it has nothing here.
    pub poll_interval: Duration,
    pub idle_poll_interval: Duration,
    /// How long a placeholder or component may wait in the batch queue
    /// before it is withdrawn.
    pub max_pending: Duration,
    /// The most slots gleaner may hold here.
    pub max_scavenged: Option<crate::Cap>,
    /// Hosts placeholders must leave alone.
    pub reserve_hosts: Vec<String>,
    /// The batch system's name of the kcm's own account (the process's
    /// effective user), which submits every grid component, and with one
    /// user every placeholder too.
    pub account: String,
    /// Whose accounts jobs run as (`[users]`): with many users, a job's
    /// placeholders are submitted as its owner's.
    pub users: Users,
    /// Which input files the nodes see (`shared_paths`), and whether a
    /// `stage_command` copies the others.
    pub inputs: InputAccess,
    /// How fast the cluster runs a job against a reference one: its
    /// estimates divide walltimes by it.
    pub speed: f64,
}

/// How long stagings took, for the scheduler's estimate of the next.
#[derive(Debug, Default)]
struct StageTimes {
    count: u32,
    total_s: f64,
}

impl StageTimes {
    fn add(&mut self, seconds: f64) {
        self.count = self.count.saturating_add(1);
        self.total_s += seconds;
    }

    fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.total_s / f64::from(self.count))
    }
}

pub use gleaner_protocol::{Core, Now};

/// A component's exit status found in the spool directory: that component
/// ended. The spool outlives a kcm restart, so these are found again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpooledExit {
    pub job: JobId,
    pub component: u32,
    /// `None` when the file holds no number.
    pub exit_code: Option<i32>,
    /// It says the component was stopped for a job of higher priority.
    pub preempted: bool,
}

/// A component's started file found in the spool: it waits at its start
/// barrier (or passed it), holding these hosts, or its file could not be
/// read as hosts (its owner's to write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpooledStart {
    pub job: JobId,
    pub component: u32,
    pub hosts: Result<Vec<HostSlots>, String>,
}

#[derive(Debug, Clone)]
pub enum Event {
    /// A session with the broker began: the batch system is read before
    /// the first order, so that an order that comes again (the last kcm
    /// died before acknowledging it) finds what it already made.
    Connected,
    /// A message on the kcm's queue.
    Message(KcmMsg),
    /// The batch system was read, or could not be; with the exits waiting
    /// in the spool (empty when the read failed).
    Polled {
        snapshot: Result<Snapshot, BackendError>,
        spooled: Vec<SpooledExit>,
        started: Vec<SpooledStart>,
    },
    /// Answers [`Effect::SubmitLaunchers`]: the slots actually submitted.
    LaunchersSubmitted {
        job: JobId,
        grant: GrantId,
        requested: u32,
        result: Result<u32, BackendError>,
    },
    /// Answers [`Effect::Remove`].
    Removed(Result<(), BackendError>),
    /// Answers [`Effect::StageInputs`]: how long it took, or why it failed.
    InputsStaged {
        spec: ComponentSpec,
        account: Option<String>,
        result: Result<Duration, BackendError>,
    },
    /// Answers [`Effect::SubmitComponent`].
    ComponentSubmitted {
        spec: ComponentSpec,
        result: Result<(), BackendError>,
    },
    /// Answers [`Effect::ReportComponentEnd`]: the job's queue has it (or
    /// the job is gone).
    ComponentReported { job: JobId, component: u32 },
}

#[derive(Debug, Clone)]
pub enum Effect {
    /// Submit launchers covering `slots` slots for a grant (one placeholder
    /// array); answer with [`Event::LaunchersSubmitted`].
    SubmitLaunchers {
        job: JobId,
        grant: GrantId,
        slots: u32,
        /// One task's slots and needs: launchers hold whole tasks.
        task: TaskShape,
        /// Whose job it is (the broker user).
        owner: String,
        /// The Unix account the launchers run as: the owner's where users
        /// are kept apart, the kcm's (`None`) with one user.
        account: Option<String>,
        /// The job's launcher account, for its launchers' settings file.
        credentials: Option<Credentials>,
    },
    /// Remove placeholders or components by batch id, running or not;
    /// answer with [`Event::Removed`].
    Remove { ids: Vec<String> },
    /// Delete a component's spool entry (output, exit status, barrier).
    DeleteSpoolEntry { job: JobId, component: u32 },
    /// Stop a running component: write `stop` to its stop file, which its
    /// wrapper reads (`ComponentFiles::stop`).
    StopComponent {
        job: JobId,
        component: u32,
        stop: String,
    },
    /// Let a component waiting at its start barrier run its command:
    /// write `hosts` to its spool entry's hosts file, then `go` to its go
    /// file (`barrier::go_text`, `barrier::hosts_text`).
    ReleaseComponent {
        job: JobId,
        component: u32,
        go: String,
        hosts: String,
    },
    /// Copy a component's inputs its cluster's nodes do not see there: the
    /// cluster's staging command, as the account the component runs as,
    /// given the job, the component and these paths; answer with
    /// [`Event::InputsStaged`] (it may take long: not in the kcm's loop).
    StageInputs {
        spec: ComponentSpec,
        inputs: Vec<String>,
        account: Option<String>,
    },
    /// Submit a grid job's component as an ordinary batch job, all on one
    /// host when it fits on one (as the scheduler placed it); answer with
    /// [`Event::ComponentSubmitted`].
    SubmitComponent {
        spec: ComponentSpec,
        one_host: bool,
        /// The account it is submitted as, as for launchers.
        account: Option<String>,
    },
    /// Send to a job's runner; a job that is gone no longer needs to hear.
    Tell { job: JobId, message: ControlMsg },
    /// Tell a job that its component ended, with `stdout` and `stderr`
    /// filled from the component's spool entry; answer with
    /// [`Event::ComponentReported`] once sent. Until then the component is
    /// kept, and reported again by the next poll.
    ReportComponentEnd {
        job: JobId,
        outcome: ComponentOutcome,
    },
    /// Send to the scheduler.
    ToScheduler(SchedulerMsg),
    /// Publish on the events exchange.
    Announce(gleaner_protocol::Event),
    /// Read the batch system and the spool (then report), as soon as the
    /// message at hand is acknowledged: the reading is due
    /// ([`Core::poll_timeout`]), or the scheduler should hear at once.
    PollNow,
    /// A job ended: the settings file its launchers started with goes.
    ForgetLauncherSettings { job: JobId },
}

/// A grid component this kcm submitted (or found), until its end is reported.
#[derive(Debug)]
struct TrackedComponent {
    since: Instant,
    /// Seen in the batch system at least once.
    seen: bool,
    /// Its job heard that it started (waits at its barrier).
    start_told: bool,
    /// The account it runs as, once seen.
    owner: Option<String>,
    /// Its walltime, if this kcm submitted it: killed at it, it ends for
    /// its own sake.
    walltime: Option<Duration>,
    /// Its end was judged: whose failure it was, if it was one.
    judged: bool,
}

/// A component ending this close to its walltime was killed for it.
const WALLTIME_MARGIN: Duration = Duration::from_secs(5);

/// A component absent from the batch system this long after its submission,
/// never seen and with no exit status, is reported as ended.
const COMPONENT_VANISHED: Duration = Duration::from_secs(60);

/// Grants remembered against redelivered orders: far more than a kcm gets
/// between a lost connection and the redelivery.
const RECENT_GRANTS: usize = 1024;

/// How long a launcher's word is kept for a placeholder not seen yet.
const HEARD_KEPT: Duration = Duration::from_secs(600);

/// How long GPUs found held outside gleaner are reported (and not offered)
/// after a launcher last said so: then a launcher tries them again.
const SQUAT_SHOWN: Duration = crate::failures::BARRED_FOR;

/// A placeholder whose end was counted as a failed start.
#[derive(Debug, Clone)]
struct Counted {
    job: JobId,
    /// The account it was counted against.
    owner: String,
    /// Where it ran, if it did.
    host: Option<String>,
    at: Instant,
}

/// GPUs of one host that a launcher found claimed beyond what gleaner's
/// launchers there hold.
#[derive(Debug, Clone)]
struct Squat {
    /// The devices it found claimed.
    devices: Vec<String>,
    /// How many of them no launcher of gleaner's accounts for.
    outside: u32,
    /// When a launcher last said so.
    at: Instant,
}

/// The account a job's placeholders are submitted as (with many users).
#[derive(Debug)]
struct JobAccount {
    /// The batch system's name of it.
    name: String,
    /// The job has ended: forgotten once none of its placeholders is left
    /// (those still running are removed after a grace, as its own).
    ended: bool,
}

/// Removals waiting for their grace period to pass.
#[derive(Debug)]
struct Removal {
    due: Instant,
    /// The job whose placeholders these are: a runner's word covers its
    /// own job's launchers only (a task can send its runner anything).
    job: JobId,
    ids: Vec<String>,
}

/// Grants acted on: those since the last report, and the latest ones
/// against redelivered orders.
#[derive(Debug, Default)]
struct GrantLog {
    /// Acted on since the previous report.
    applied: Vec<GrantId>,
    /// The latest acted on, oldest first: an order redelivered after a
    /// lost connection is acked, not carried out twice.
    recent: std::collections::VecDeque<GrantId>,
}

/// How placeholders have been starting: what the cluster's health (and
/// each account's) is judged by.
#[derive(Debug)]
struct StartHealth {
    /// Starts that failed, by account: refused by the batch system, or a
    /// placeholder that ended before its launcher reached the broker.
    /// Cleared only by a launcher that reached it.
    failures: StartFailures,
    /// Why the last placeholder that ended at once did.
    error: Option<String>,
    /// Placeholders whose launcher reached the broker, and when it said so.
    heard: BTreeMap<String, (JobId, Instant)>,
    /// Placeholders whose start has been counted as working.
    credited: BTreeSet<String>,
    /// Placeholders whose launcher found its GPUs held outside gleaner, and
    /// when: their end is a failure of no one's.
    excused: BTreeMap<String, Instant>,
    /// Placeholders whose end was lately counted as a failed start. Their
    /// launcher's word about GPUs held outside gleaner may come after it
    /// (through its runner), and then takes the failure back.
    counted: BTreeMap<String, Counted>,
    /// Placeholders withdrawn for waiting too long since one last ran:
    /// failed starts too, cleared only by a placeholder that runs.
    stuck: u32,
    /// Slots of withdrawn stuck placeholders, not reported idle (so not
    /// offered here again) until a placeholder runs or `max_pending` passed.
    blocked: Option<(u32, Instant)>,
}

/// The last failures of the kcm's own commands, reported until cleared.
#[derive(Debug, Default)]
struct CommandErrors {
    /// The last failed command (cleared by the next successful launcher submit).
    command: Option<String>,
    /// The last failure to read the batch system (cleared by the next read).
    read: Option<String>,
}

/// The kcm's state: the last reading of the batch system and what it has
/// decided since.
#[derive(Debug)]
pub struct KcmCore {
    config: CoreConfig,
    last: Snapshot,
    grants: GrantLog,
    removals: Vec<Removal>,
    errors: CommandErrors,
    /// Batch ids of the jobs named like gleaner's that are not, as last
    /// read (each is logged once).
    strangers: BTreeSet<String>,
    starts: StartHealth,
    /// Placeholders and components this kcm asked the batch system to
    /// remove.
    withdrawn: BTreeSet<String>,
    /// The first reading is done: what it found ran under an earlier kcm.
    adopted: bool,
    /// When each waiting placeholder or component was first seen waiting.
    pending_since: BTreeMap<String, Instant>,
    answered: Answered,
    components: BTreeMap<(JobId, u32), TrackedComponent>,
    /// How long its stagings took.
    staged: StageTimes,
    /// With many users, the account each job's placeholders are submitted
    /// as: learned from its grants, or for what a predecessor left, from
    /// the first reading ([`KcmCore::judge`]).
    accounts: BTreeMap<JobId, JobAccount>,
    /// Effects decided and not yet carried out.
    outbox: Outbox<Effect>,
    /// A poll was handled: its report goes once its effects are carried out.
    report_due: bool,
    /// GPUs held outside gleaner, by host, as launchers last found them.
    squats: BTreeMap<String, Squat>,
    /// When the batch system was last read.
    polled_at: Option<Instant>,
}

impl Core for KcmCore {
    type Event = Event;
    type Effect = Effect;

    fn handle(&mut self, event: Event, now: Now) {
        let answer = !matches!(
            event,
            Event::Connected | Event::Message(_) | Event::Polled { .. }
        );
        let effects = self.decide(event, now);
        for effect in &effects {
            if let Effect::Remove { ids } = effect {
                self.withdrawn.extend(ids.iter().cloned());
            }
        }
        if answer {
            self.outbox.push_front(effects);
        } else {
            self.outbox.push(effects);
        }
    }

    fn poll_effect(&mut self, now: Now) -> Option<Effect> {
        if self.outbox.is_empty() && std::mem::take(&mut self.report_due) {
            let report = self.report(now);
            self.outbox.push([
                Effect::ToScheduler(SchedulerMsg::ClusterStatus(report.clone())),
                Effect::Announce(gleaner_protocol::Event::Cluster(report)),
            ]);
        }
        self.outbox.pop()
    }

    /// When the batch system must be read next; `None` before the first
    /// reading, which [`Event::Connected`] asks for. Soon while gleaner
    /// holds or waits for slots here, or has removals to make: a local job
    /// may wait behind its placeholders. Seldom otherwise: the reading only
    /// keeps the scheduler's view of the cluster fresh, and each costs the
    /// batch master, which every user shares. An order to start launchers
    /// asks for a reading at once ([`Effect::PollNow`]).
    fn poll_timeout(&self) -> Option<Instant> {
        let busy = !self.last.placeholders.is_empty()
            || !self.last.components.is_empty()
            || !self.components.is_empty()
            || !self.removals.is_empty();
        let interval = match busy {
            true => self.config.poll_interval,
            false => self.config.idle_poll_interval,
        };
        self.polled_at.map(|at| at + interval)
    }

    fn handle_timeout(&mut self, now: Now) {
        if gleaner_protocol::is_due(self, now) {
            self.outbox.push([Effect::PollNow]);
        }
    }
}

impl KcmCore {
    /// A kcm that knows nothing yet: whatever its predecessor left in the
    /// batch system is adopted from the first [`Event::Polled`].
    pub fn new(config: CoreConfig) -> Self {
        let failures = StartFailures::new(config.users.is_single());
        Self {
            config,
            last: Snapshot::default(),
            grants: GrantLog::default(),
            removals: Vec::new(),
            errors: CommandErrors::default(),
            strangers: BTreeSet::new(),
            starts: StartHealth {
                failures,
                error: None,
                heard: BTreeMap::new(),
                credited: BTreeSet::new(),
                excused: BTreeMap::new(),
                counted: BTreeMap::new(),
                stuck: 0,
                blocked: None,
            },
            withdrawn: BTreeSet::new(),
            adopted: false,
            pending_since: BTreeMap::new(),
            answered: Answered::default(),
            components: BTreeMap::new(),
            staged: StageTimes::default(),
            accounts: BTreeMap::new(),
            outbox: Outbox::default(),
            report_due: false,
            squats: BTreeMap::new(),
            polled_at: None,
        }
    }

    fn decide(&mut self, event: Event, now: Now) -> Vec<Effect> {
        match event {
            Event::Connected => vec![Effect::PollNow],
            Event::Message(message) => self.on_message(message, now),
            Event::Polled {
                snapshot,
                spooled,
                started,
            } => {
                self.report_due = true;
                self.polled_at = Some(now.instant);
                self.on_poll(snapshot, &spooled, &started, now)
            }
            Event::LaunchersSubmitted {
                job,
                grant,
                requested,
                result,
            } => {
                match result {
                    Ok(started) => {
                        info!(job = %job, grant = %grant, requested, started, "launchers submitted");
                        self.errors.command = None;
                    }
                    Err(e) => {
                        let account = self
                            .placeholder_account(&job)
                            .unwrap_or_default()
                            .to_owned();
                        let failures = self.starts.failures.failed(&account, now.instant);
                        error!(job = %job, grant = %grant, account, error = %e, failures, "cannot submit launchers");
                        self.errors.command = Some(e.to_string());
                    }
                }
                Vec::new()
            }
            Event::Removed(result) => {
                if let Err(e) = result {
                    error!(error = %e, "cannot remove placeholders");
                    self.errors.command = Some(e.to_string());
                }
                Vec::new()
            }
            Event::ComponentSubmitted { spec, result } => {
                self.on_component_submitted(spec, result, now)
            }
            Event::InputsStaged {
                spec,
                account,
                result,
            } => match result {
                Ok(took) => {
                    info!(job = %spec.job, component = spec.component, seconds = took.as_secs_f64(), "inputs staged");
                    self.staged.add(took.as_secs_f64());
                    self.submit_component(spec, account)
                }
                // The job hears why; the cluster's report does not carry
                // one job's staging troubles.
                Err(e) => {
                    warn!(job = %spec.job, component = spec.component, error = %e, "cannot stage a grid component's inputs");
                    vec![Self::unstarted(spec, &self.config.cluster, &e)]
                }
            },
            Event::ComponentReported { job, component } => {
                // Forgotten only once its job has heard.
                self.components.remove(&(job.clone(), component));
                vec![Effect::DeleteSpoolEntry { job, component }]
            }
        }
    }

    fn on_message(&mut self, message: KcmMsg, now: Now) -> Vec<Effect> {
        match message {
            KcmMsg::StartLaunchers {
                job,
                grant,
                slots,
                task_slots,
                task_needs,
                owner,
                credentials,
            } => {
                if self.grants.recent.contains(&grant) {
                    info!(job = %job, grant = %grant, "grant already carried out; the order came again");
                    return Vec::new();
                }
                // A placeholder no host could hold would wait or be refused,
                // and count against the cluster as a failed start.
                let largest = self.last.hosts.iter().map(|h| h.slots).max();
                if largest.is_some_and(|largest| task_slots > largest) {
                    warn!(job = %job, grant = %grant, task_slots, largest, "the job's tasks need more slots than any host here has; grant not carried out");
                    return Vec::new();
                }
                if self.grants.recent.len() == RECENT_GRANTS {
                    self.grants.recent.pop_front();
                }
                self.grants.recent.push_back(grant);
                self.grants.applied.push(grant);
                // The runner and this kcm must agree on users: kept apart,
                // the job's launchers connect with an account of their own
                // and run as its owner.
                let disagreement = match (self.config.users.is_single(), credentials.is_some()) {
                    (true, true) => Some(
                        "the job's runner keeps users apart and this kcm does not ([users] single = true): its launchers would run as the kcm",
                    ),
                    (false, false) => Some(
                        "the job has no launcher account: its runner keeps no users apart ([users] single = true), this kcm does",
                    ),
                    _ => None,
                };
                if let Some(message) = disagreement {
                    let refused = Err(BackendError {
                        command: format!("run as the owner of the job ({owner})"),
                        message: message.to_owned(),
                    });
                    let answer = Event::LaunchersSubmitted {
                        job,
                        grant,
                        requested: slots,
                        result: refused,
                    };
                    return self.decide(answer, now);
                }
                let account = self.account_of(&owner);
                if let Some(name) = account.clone() {
                    self.accounts
                        .insert(job.clone(), JobAccount { name, ended: false });
                }
                vec![
                    Effect::SubmitLaunchers {
                        account,
                        job,
                        grant,
                        slots,
                        task: TaskShape {
                            slots: task_slots,
                            needs: task_needs,
                        },
                        owner,
                        credentials,
                    },
                    Effect::PollNow,
                ]
            }
            KcmMsg::Release {
                job,
                launchers,
                grace_ms,
            } => {
                let cluster = &self.config.cluster;
                let ids: Vec<String> = launchers
                    .iter()
                    .filter_map(|l| naming::batch_id(cluster, l).map(str::to_owned))
                    .collect();
                info!(job = %job, launchers = ?launchers, grace_ms, "will remove preempted launchers that do not leave");
                self.removals.push(Removal {
                    due: now.instant + Duration::from_millis(grace_ms),
                    job,
                    ids,
                });
                Vec::new()
            }
            KcmMsg::JobEnded { job } => {
                if let Some(account) = self.accounts.get_mut(&job) {
                    account.ended = true;
                }
                let mut effects = self.end_job(&job, now);
                effects.push(Effect::ForgetLauncherSettings { job });
                effects.push(Effect::PollNow);
                effects
            }
            KcmMsg::LauncherUp { job, launcher } => {
                let Some(id) = naming::batch_id(&self.config.cluster, &launcher) else {
                    warn!(launcher = %launcher, "a launcher of another cluster says it is up; ignored");
                    return Vec::new();
                };
                let placeholder = self.last.placeholders.iter().find(|p| p.id == id);
                let heard_for = self.starts.heard.get(id).map(|(heard, _)| heard);
                if placeholder.is_some_and(|p| p.job != job) || heard_for.is_some_and(|h| *h != job)
                {
                    warn!(job = %job, launcher = %launcher, "a launcher says it is up for a job whose placeholder it is not; ignored");
                    return Vec::new();
                }
                // A start counts once the placeholder is seen: a word about
                // one never seen (a forged id) clears no failure.
                let owner = placeholder.map(|p| p.owner.clone());
                self.starts.heard.insert(id.to_owned(), (job, now.instant));
                if let Some(owner) = owner {
                    self.credit(id, &owner);
                }
                Vec::new()
            }
            KcmMsg::GpusHeld { job, held } => {
                self.on_gpus_held(job, held, now);
                Vec::new()
            }
            KcmMsg::Go {
                job,
                component,
                hosts,
            } => self.release(job, component, &hosts),
            KcmMsg::WithdrawComponent { job, component } => self.withdraw_component(job, component),
            KcmMsg::PreemptComponents {
                job,
                signal,
                grace_ms,
            } => self.preempt_components(job, &signal, grace_ms),
            KcmMsg::SubmitComponent(spec) => {
                // A batch system that runs components as their owner has
                // them submitted as the owner's account: the order says
                // whose the job is, whatever an earlier reading adopted.
                let account = self.account_of(&spec.owner);
                if let Some(name) = account.clone() {
                    self.accounts
                        .insert(spec.job.clone(), JobAccount { name, ended: false });
                }
                // The order again (the kcm died before it acked it): the
                // component is in the batch system already, submitted by
                // gleaner (a job of that name by anyone else is theirs).
                let there = self.last.components.iter().any(|c| {
                    c.job == spec.job
                        && c.component == spec.component
                        && !self.withdrawn.contains(&c.id)
                        && (c.owner == self.config.account || account.as_ref() == Some(&c.owner))
                });
                if there {
                    info!(job = %spec.job, component = spec.component, "grid component already submitted; the order came again");
                    return vec![Effect::Tell {
                        job: spec.job,
                        message: ControlMsg::ComponentQueued {
                            component: spec.component,
                            cluster: self.config.cluster.clone(),
                        },
                    }];
                }
                let unseen: Vec<String> = spec
                    .inputs
                    .iter()
                    .filter(|i| !self.config.inputs.sees(i))
                    .cloned()
                    .collect();
                if !unseen.is_empty() {
                    if !self.config.inputs.stages {
                        let refused = BackendError {
                            command: "stage inputs".to_owned(),
                            message: format!(
                                "{} input(s) not on this cluster's shared paths (first: {}), and it has no stage_command",
                                unseen.len(),
                                unseen[0]
                            ),
                        };
                        warn!(job = %spec.job, component = spec.component, "a grid component's inputs are not here and cannot be staged");
                        return vec![Self::unstarted(spec, &self.config.cluster, &refused)];
                    }
                    info!(job = %spec.job, component = spec.component, inputs = unseen.len(), "staging a grid component's inputs");
                    return vec![Effect::StageInputs {
                        spec,
                        inputs: unseen,
                        account,
                    }];
                }
                self.submit_component(spec, account)
            }
        }
    }

    /// Submits a component, with no spool entry left from an earlier run.
    fn submit_component(&self, spec: ComponentSpec, account: Option<String>) -> Vec<Effect> {
        vec![
            // Left over from an earlier run of the same component.
            Effect::DeleteSpoolEntry {
                job: spec.job.clone(),
                component: spec.component,
            },
            Effect::SubmitComponent {
                one_host: component_on_one_host(spec.slots, self.last.largest_host()),
                spec,
                account,
            },
            Effect::PollNow,
        ]
    }

    fn on_component_submitted(
        &mut self,
        spec: ComponentSpec,
        result: Result<(), BackendError>,
        now: Now,
    ) -> Vec<Effect> {
        let cluster = &self.config.cluster;
        match result {
            Ok(()) => {
                info!(job = %spec.job, component = spec.component, slots = spec.slots, "grid component submitted");
                self.components.insert(
                    (spec.job.clone(), spec.component),
                    TrackedComponent {
                        since: now.instant,
                        seen: false,
                        start_told: false,
                        owner: None,
                        walltime: spec.walltime_ms.map(Duration::from_millis),
                        judged: false,
                    },
                );
                // Its job withdraws a component it moved here from where it
                // waited only once it hears this.
                vec![Effect::Tell {
                    job: spec.job,
                    message: ControlMsg::ComponentQueued {
                        component: spec.component,
                        cluster: cluster.clone(),
                    },
                }]
            }
            Err(e) => {
                error!(job = %spec.job, component = spec.component, error = %e, "cannot submit a grid component");
                self.errors.command = Some(e.to_string());
                vec![Self::unstarted(spec, cluster, &e)]
            }
        }
    }

    /// Tells a job that its component ended before it started, and why.
    fn unstarted(spec: ComponentSpec, cluster: &ClusterName, error: &BackendError) -> Effect {
        let outcome = ComponentOutcome {
            component: spec.component,
            cluster: cluster.clone(),
            exit_code: None,
            runtime_ms: 0,
            stdout: Captured::default(),
            stderr: Captured {
                data: error.to_string().into_bytes(),
                dropped: 0,
            },
            preempted: false,
        };
        Effect::Tell {
            job: spec.job,
            message: ControlMsg::ComponentEnded(outcome),
        }
    }

    /// A reading of the batch system: report ended components, make room
    /// for waiting local jobs, and carry out removals that are due (on the
    /// last good reading when this one failed).
    fn on_poll(
        &mut self,
        snapshot: Result<Snapshot, BackendError>,
        spooled: &[SpooledExit],
        started: &[SpooledStart],
        now: Now,
    ) -> Vec<Effect> {
        let mut effects = Vec::new();
        match snapshot {
            Ok(snapshot) => {
                let snapshot = self.judge(snapshot);
                if let Some(problem) = snapshot
                    .problem
                    .as_ref()
                    .filter(|p| Some(*p) != self.last.problem.as_ref())
                {
                    warn!(problem, "batch system problem");
                }
                self.errors.read = None;
                let ran: BTreeSet<&str> = self
                    .last
                    .placeholders
                    .iter()
                    .filter(|p| p.running())
                    .map(|p| p.id.as_str())
                    .collect();
                // A placeholder that started since: the cluster runs them.
                if snapshot
                    .placeholders
                    .iter()
                    .any(|p| p.running() && !ran.contains(p.id.as_str()))
                {
                    self.starts.stuck = 0;
                    self.starts.blocked = None;
                }
                self.count_early_ends(&snapshot, now);
                for placeholder in &snapshot.placeholders {
                    if self
                        .starts
                        .heard
                        .get(&placeholder.id)
                        .is_some_and(|(job, _)| *job == placeholder.job)
                    {
                        self.credit(&placeholder.id, &placeholder.owner);
                    }
                }
                self.starts
                    .credited
                    .retain(|id| snapshot.placeholders.iter().any(|p| &p.id == id));
                self.last = snapshot;
                // An ended job's account goes with its last batch job.
                let last = &self.last;
                self.accounts.retain(|job, account| {
                    !account.ended
                        || last.placeholders.iter().any(|p| &p.job == job)
                        || last.components.iter().any(|c| &c.job == job)
                });
                effects.extend(self.settle_components(spooled, now));
                effects.extend(self.tell_starts(started));
                effects.extend(self.make_room(now));
                effects.extend(self.withdraw_stuck(now));
            }
            Err(e) => {
                error!(error = %e, "cannot read the batch system");
                self.errors.read = Some(e.to_string());
            }
        }
        effects.extend(self.due_removals(now));
        effects
    }

    /// A placeholder of `owner`'s whose launcher reached the broker: its
    /// start worked, once (the cluster's failures and its account's are
    /// cleared).
    fn credit(&mut self, id: &str, owner: &str) {
        if !self.starts.credited.insert(id.to_owned()) {
            return;
        }
        let failures = self.starts.failures.cluster();
        if failures > 0 {
            info!(
                placeholder = id,
                failures, "a launcher reached the broker: starts work again"
            );
        }
        self.starts.failures.started(Some(owner));
        self.starts.error = None;
    }

    /// The reading with its jobs named like gleaner's judged by their
    /// owners ([`KcmCore::is_gleaners`]): anybody else's is a job like any
    /// other of theirs, which the kcm never removes, withdraws or counts
    /// as a start of its own. Each is logged once: someone may be
    /// impersonating gleaner.
    fn judge(&mut self, snapshot: Snapshot) -> Snapshot {
        if !self.adopted {
            self.adopt_accounts(&snapshot.named);
        }
        let mut strangers = BTreeSet::new();
        for named in snapshot.named.iter().filter(|n| !self.is_gleaners(n)) {
            if !named.ids.iter().any(|id| self.strangers.contains(id)) {
                let expected = match named.component {
                    Some(_) => Some(self.config.account.as_str()),
                    None => self.placeholder_account(&named.job),
                };
                warn!(job = %named.job, component = ?named.component, owner = %named.owner, expected = ?expected, batch_ids = ?named.ids, "a batch job named like gleaner's is not gleaner's: counted as a local job");
            }
            strangers.extend(named.ids.iter().cloned());
        }
        self.strangers = strangers;
        snapshot.judge(|named| self.is_gleaners(named))
    }

    /// Whether a job named like gleaner's is: submitted by the account
    /// that submits such jobs — the kcm's own for a grid component, the
    /// job's [`KcmCore::placeholder_account`] for a placeholder.
    fn is_gleaners(&self, named: &NamedJob) -> bool {
        let of_the_job = self.placeholder_account(&named.job) == Some(named.owner.as_str());
        match named.component {
            // The kcm's own where it submits components and switches to
            // the owner in their wrapper, the owner's where the batch
            // system runs them as the owner.
            Some(_) => named.owner == self.config.account || of_the_job,
            None => of_the_job,
        }
    }

    /// The account `job`'s placeholders (and, where the batch system runs
    /// them as their owner, its components) are submitted as: with one
    /// user the kcm's own; with many, its owner's, known from its grants
    /// and components (or adopted); `None` for a job the kcm has no
    /// account for.
    /// The account `owner`'s jobs run as: their own (`[users] accounts`
    /// maps broker users to Unix accounts) where users are kept apart, the
    /// kcm's (`None`) with one user.
    fn account_of(&self, owner: &str) -> Option<String> {
        let users = &self.config.users;
        (!users.is_single()).then(|| users.account(owner).to_owned())
    }

    fn placeholder_account(&self, job: &JobId) -> Option<&str> {
        if self.config.users.is_single() {
            return Some(&self.config.account);
        }
        self.accounts.get(job).map(|account| account.name.as_str())
    }

    /// With many users, at the first reading: the placeholders (and the
    /// components submitted as their owner) of a job the kcm has no
    /// account for (its predecessor's) are adopted if they all have one
    /// owner, which becomes the job's account; if two owners claim one
    /// job, none are, until a grant says whose it is. Later readings adopt
    /// nothing: a kcm learns a job's account before it submits anything
    /// for it, so a batch job of a job it has no account for is not its
    /// own.
    fn adopt_accounts(&mut self, named: &[NamedJob]) {
        if self.config.users.is_single() {
            return;
        }
        let mut owners: BTreeMap<&JobId, BTreeSet<&str>> = BTreeMap::new();
        for named in named.iter().filter(|n| {
            !self.accounts.contains_key(&n.job)
                && (n.component.is_none() || n.owner != self.config.account)
        }) {
            owners.entry(&named.job).or_default().insert(&named.owner);
        }
        for (job, owners) in owners {
            match owners.first() {
                Some(owner) if owners.len() == 1 => {
                    let name = (*owner).to_owned();
                    self.accounts
                        .insert(job.clone(), JobAccount { name, ended: false });
                }
                _ => {
                    warn!(job = %job, owners = ?owners, "placeholders of one job by different owners: none adopted until the job's next grant says whose");
                }
            }
        }
    }

    /// A launcher of `job`'s could not claim its GPUs: `held.devices` of its
    /// host were claimed, though the batch system counted them free.
    /// Gleaner's launchers there hold what their placeholders asked for;
    /// claims beyond that are held outside gleaner (a user's process took
    /// them), and the placeholder's end is a failure of no one's: counted
    /// against its owner it would bar them, and with another victim's it
    /// would exclude the cluster, all for one squatter. Claims within
    /// gleaner's count are the cluster's miscount (its `gpus` against the
    /// batch system's), and the end counts as failed starts do. A task can
    /// send this: it is taken for its own job's placeholders only, whose
    /// launcher did not say it is up.
    fn on_gpus_held(&mut self, job: JobId, held: GpusHeld, now: Now) {
        let Some(id) = naming::batch_id(&self.config.cluster, &held.launcher) else {
            warn!(launcher = %held.launcher, "a launcher of another cluster says its GPUs are held; ignored");
            return;
        };
        let placeholder = self.last.placeholders.iter().find(|p| p.id == id);
        let counted = self.starts.counted.get(id);
        let up = self.starts.heard.contains_key(id) || self.starts.credited.contains(id);
        if up || placeholder.is_some_and(|p| p.job != job) || counted.is_some_and(|c| c.job != job)
        {
            warn!(job = %job, launcher = %held.launcher, "GPUs said held for a placeholder that is not the job's, or whose launcher is up; ignored");
            return;
        }
        // Where the batch system ran it; the launcher's word only for one
        // the kcm has not seen run.
        let ran_on = placeholder
            .and_then(|p| p.host.clone())
            .or_else(|| counted.and_then(|c| c.host.clone()));
        let host = ran_on.clone().unwrap_or(held.host);
        let owner = placeholder
            .map(|p| p.owner.clone())
            .or_else(|| counted.map(|c| c.owner.clone()));
        let mut devices = held.devices;
        devices.sort();
        devices.dedup();
        let gleaners = self
            .last
            .placeholders
            .iter()
            .filter(|p| p.id != id && p.host.as_deref() == Some(host.as_str()))
            .fold(0, |sum: u32, p| sum.saturating_add(p.needs.gpus));
        let claimed = u32::try_from(devices.len()).unwrap_or(u32::MAX);
        let outside = claimed.saturating_sub(gleaners);
        let gpus = devices.join(",");
        if outside == 0 {
            warn!(job = %job, placeholder = id, owner = ?owner, host, gpus, gleaners, "a launcher found GPUs claimed that the batch system counted free, no more than gleaner's launchers there hold: the cluster's `gpus` and the batch system's count disagree");
            return;
        }
        warn!(job = %job, placeholder = id, owner = ?owner, host, gpus, outside, "GPUs of this host are held outside gleaner (`ss -xlp | grep gleaner-gpu` there, as root, says by whom): its launcher could not start, a failure of no one's");
        self.starts.excused.insert(id.to_owned(), now.instant);
        if let Some(counted) = self.starts.counted.remove(id) {
            self.starts.failures.forgive(&counted.owner);
            let about = format!("placeholder {id} ");
            if self
                .starts
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with(&about))
            {
                self.starts.error = None;
            }
        }
        // Shown, and not offered, where the batch system ran the
        // placeholder only: a task could send this, naming any host.
        if let Some(host) = ran_on.filter(|h| self.last.hosts.iter().any(|known| known.name == *h))
        {
            let at = now.instant;
            self.squats.insert(
                host,
                Squat {
                    devices,
                    outside,
                    at,
                },
            );
        }
    }

    /// Placeholders that left the batch system without their launcher ever
    /// reaching the broker, and not because this kcm removed them: the
    /// launcher cannot run there (a wrong path, a missing library, no
    /// route to the broker), so each is a failed start.
    fn count_early_ends(&mut self, next: &Snapshot, now: Now) {
        if !self.adopted {
            // An earlier kcm's: their launchers told it.
            self.adopted = true;
            for placeholder in next.placeholders.iter().filter(|p| p.running()) {
                self.starts.heard.insert(
                    placeholder.id.clone(),
                    (placeholder.job.clone(), now.instant),
                );
            }
            return;
        }
        let still: BTreeSet<&str> = next.placeholders.iter().map(|p| p.id.as_str()).collect();
        let gone: Vec<Placeholder> = self
            .last
            .placeholders
            .iter()
            .filter(|p| !still.contains(p.id.as_str()))
            .cloned()
            .collect();
        for placeholder in gone {
            let heard = self
                .starts
                .heard
                .remove(&placeholder.id)
                .is_some_and(|(job, _)| job == placeholder.job);
            if self.withdrawn.remove(&placeholder.id) || heard {
                continue;
            }
            let host = placeholder.host.as_deref().unwrap_or("before it ran");
            if self.starts.excused.remove(&placeholder.id).is_some() {
                info!(job = %placeholder.job, placeholder = %placeholder.id, owner = %placeholder.owner, host, "placeholder ended: its GPUs were held outside gleaner, a failure of no one's");
                continue;
            }
            let failures = self.starts.failures.failed(&placeholder.owner, now.instant);
            self.starts.counted.insert(
                placeholder.id.clone(),
                Counted {
                    job: placeholder.job.clone(),
                    owner: placeholder.owner.clone(),
                    host: placeholder.host.clone(),
                    at: now.instant,
                },
            );
            error!(job = %placeholder.job, placeholder = %placeholder.id, owner = %placeholder.owner, host, failures, "placeholder ended before its launcher reached the broker");
            self.starts.error = Some(format!(
                "placeholder {} ({host}) ended before its launcher reached the broker; its output (log_dir) says why",
                placeholder.id
            ));
        }
        // Forgotten once gone from the batch system, components as well.
        self.withdrawn.retain(|id| {
            still.contains(id.as_str()) || next.components.iter().any(|c| &c.id == id)
        });
        // A launcher may speak before the kcm sees its placeholder; one
        // never seen at all is forgotten after a while.
        self.starts.heard.retain(|id, (_, at)| {
            still.contains(id.as_str()) || now.instant.saturating_duration_since(*at) < HEARD_KEPT
        });
        let recent = |at: &Instant| now.instant.saturating_duration_since(*at) < HEARD_KEPT;
        self.starts
            .excused
            .retain(|id, at| still.contains(id.as_str()) || recent(at));
        self.starts.counted.retain(|_, counted| recent(&counted.at));
        self.squats
            .retain(|_, squat| now.instant.saturating_duration_since(squat.at) < SQUAT_SHOWN);
    }

    /// The components that left the batch system, to be reported to their
    /// jobs: those with an exit status in the spool, and those that vanished
    /// without one.
    fn settle_components(&mut self, spooled: &[SpooledExit], now: Now) -> Vec<Effect> {
        for run in &self.last.components {
            let tracked = self
                .components
                .entry((run.job.clone(), run.component))
                .or_insert(TrackedComponent {
                    since: now.instant,
                    seen: true,
                    start_told: false,
                    owner: None,
                    walltime: None,
                    judged: false,
                });
            tracked.seen = true;
            tracked.owner = Some(run.owner.clone());
        }
        let in_batch = |job: &JobId, component: u32| {
            self.last
                .components
                .iter()
                .any(|r| &r.job == job && r.component == component)
        };
        let mut ended: BTreeSet<(JobId, u32)> = spooled
            .iter()
            .filter(|exit| !in_batch(&exit.job, exit.component))
            .map(|exit| (exit.job.clone(), exit.component))
            .collect();
        ended.extend(
            self.components
                .iter()
                .filter(|((job, component), tracked)| {
                    !in_batch(job, *component)
                        && (tracked.seen
                            || now.instant.saturating_duration_since(tracked.since)
                                > COMPONENT_VANISHED)
                })
                .map(|(key, _)| key.clone()),
        );
        ended
            .into_iter()
            .map(|(job, component)| {
                let spooled = spooled
                    .iter()
                    .find(|exit| exit.job == job && exit.component == component);
                let exit_code = spooled.and_then(|exit| exit.exit_code);
                let preempted = spooled.is_some_and(|exit| exit.preempted);
                let runtime = self
                    .components
                    .get(&(job.clone(), component))
                    .map_or(Duration::ZERO, |t| {
                        now.instant.saturating_duration_since(t.since)
                    });
                info!(job = %job, component, exit_code = ?exit_code, preempted, "grid component ended");
                if !preempted {
                    self.judge_component_end(&job, component, exit_code, runtime, now);
                }
                let outcome = ComponentOutcome {
                    component,
                    cluster: self.config.cluster.clone(),
                    exit_code,
                    runtime_ms: runtime.as_millis() as u64,
                    stdout: Captured::default(),
                    stderr: Captured::default(),
                    preempted,
                };
                Effect::ReportComponentEnd { job, outcome }
            })
            .collect()
    }

    /// A component that ran and vanished without an exit status before its
    /// walltime was killed under it (its host lost, the batch system's
    /// doing): a failure of the cluster's, counted as failed starts are
    /// (by account); one that exited ran well, whatever its code.
    fn judge_component_end(
        &mut self,
        job: &JobId,
        component: u32,
        exit_code: Option<i32>,
        runtime: Duration,
        now: Now,
    ) {
        let Some(tracked) = self
            .components
            .get_mut(&(job.clone(), component))
            .filter(|t| !t.judged && t.seen)
        else {
            return;
        };
        tracked.judged = true;
        let owner = tracked.owner.clone().unwrap_or_default();
        let at_walltime = tracked
            .walltime
            .is_some_and(|w| runtime + WALLTIME_MARGIN >= w);
        match exit_code {
            Some(_) => self.starts.failures.started(Some(&owner)),
            None if at_walltime => {}
            None => {
                let failures = self.starts.failures.failed(&owner, now.instant);
                error!(job = %job, component, owner, failures, "grid component vanished without an exit status before its walltime: its host was lost, or the batch system killed it");
                self.starts.error = Some(format!(
                    "grid component {component} of {job} vanished without an exit status (host lost, or killed by the batch system)"
                ));
            }
        }
    }

    /// Whether a started file of this component is news: the component is
    /// this kcm's and its job has not heard it started. The shell reads
    /// no other, so an owner's made-up files cost it nothing.
    pub fn expects_start(&self, job: &JobId, component: u32) -> bool {
        self.components
            .get(&(job.clone(), component))
            .is_some_and(|t| !t.start_told)
    }

    /// Components that started since the last poll, told to their jobs
    /// once (again after a kcm restart: the runner takes a start once).
    fn tell_starts(&mut self, started: &[SpooledStart]) -> Vec<Effect> {
        let cluster = &self.config.cluster;
        let mut effects = Vec::new();
        for start in started {
            let Some(tracked) = self
                .components
                .get_mut(&(start.job.clone(), start.component))
                .filter(|t| !t.start_told)
            else {
                continue;
            };
            tracked.start_told = true;
            let hosts = match &start.hosts {
                Ok(hosts) => hosts.clone(),
                Err(e) => {
                    warn!(job = %start.job, component = start.component, error = %e, "a started grid component's hosts cannot be read; its job hears of none");
                    Vec::new()
                }
            };
            info!(job = %start.job, component = start.component, hosts = hosts.len(), "grid component started; waiting at its barrier");
            effects.push(Effect::Tell {
                job: start.job.clone(),
                message: ControlMsg::ComponentStarted {
                    component: start.component,
                    cluster: cluster.clone(),
                    hosts,
                },
            });
        }
        effects
    }

    /// Every component of `job` started: `component`'s command may run,
    /// its ranks after those of the components before it.
    fn release(&self, job: JobId, component: u32, hosts: &[Vec<HostSlots>]) -> Vec<Effect> {
        let slots = |hosts: &[HostSlots]| {
            hosts
                .iter()
                .map(|h| h.slots)
                .fold(0u32, u32::saturating_add)
        };
        let Some(before) = hosts.get(..component as usize) else {
            warn!(job = %job, component, "a go for a component its job does not have; ignored");
            return Vec::new();
        };
        let rank = before.iter().map(|h| slots(h)).fold(0, u32::saturating_add);
        let ranks = hosts.iter().map(|h| slots(h)).fold(0, u32::saturating_add);
        info!(job = %job, component, rank, ranks, "grid component passes its barrier");
        vec![Effect::ReleaseComponent {
            job,
            component,
            go: barrier::go_text(rank, ranks, hosts.len() as u32),
            hosts: barrier::hosts_text(hosts),
        }]
    }

    /// Stops the job's components here for a job of higher priority: each
    /// one's wrapper signals its command, and kills it after the grace.
    fn preempt_components(&mut self, job: JobId, signal: &str, grace_ms: u64) -> Vec<Effect> {
        let Some(number) = gleaner_manifest::preempt_signal_number(signal) else {
            warn!(job = %job, signal, "a stop with a signal no manifest may name; ignored");
            return Vec::new();
        };
        let grace = grace_ms.div_ceil(1000).min(MAX_PREEMPT_GRACE.as_secs());
        self.components
            .keys()
            .filter(|(j, _)| *j == job)
            .map(|(job, component)| {
                info!(job = %job, component, signal, grace_s = grace, "stopping a grid component for a job of higher priority");
                Effect::StopComponent {
                    job: job.clone(),
                    component: *component,
                    stop: format!("{number} {grace}\n"),
                }
            })
            .collect()
    }

    /// Removes one component, wherever it is, without telling its job:
    /// the job places it again.
    fn withdraw_component(&mut self, job: JobId, component: u32) -> Vec<Effect> {
        let ids: Vec<String> = self
            .last
            .components
            .iter()
            .filter(|c| c.job == job && c.component == component)
            .map(|c| c.id.clone())
            .collect();
        info!(job = %job, component, batch_ids = ?ids, "grid component withdrawn by its job, to be placed again");
        self.components.remove(&(job.clone(), component));
        self.last
            .components
            .retain(|c| !(c.job == job && c.component == component));
        let mut effects = vec![Effect::DeleteSpoolEntry { job, component }];
        if !ids.is_empty() {
            effects.push(Effect::Remove { ids });
        }
        effects
    }

    /// Local jobs wait: withdraw pending placeholders (but those the batch
    /// system keeps behind them anyway: they fill the holes its backfill
    /// finds), then order the scavenging jobs here to give back what is
    /// still missing, where the waiting jobs can use it.
    fn make_room(&mut self, now: Now) -> Vec<Effect> {
        let snapshot = &self.last;
        let yielding = snapshot.yielding();
        let pending: Vec<String> = snapshot
            .placeholders
            .iter()
            .filter(|p| !p.running() && !yielding.contains(p.id.as_str()))
            .map(|p| p.id.clone())
            .collect();
        let hosts = snapshot.host_loads();
        let planned = snapshot.starting_first();
        let state = LocalState {
            waiting: &snapshot.waiting,
            hosts: &hosts,
            pending_placeholders: &pending,
            planned: &planned,
        };
        let plan = on_local_wait(
            state,
            &mut self.answered,
            now.wall_ms,
            self.config.local_settle.as_millis() as u64,
        );
        let cluster = &self.config.cluster;
        let waiting = snapshot.waiting.len();
        let wanted = snapshot.local_waiting();
        let mut effects = Vec::new();
        for job in &plan.unplaceable {
            if let Some(w) = snapshot.waiting.iter().find(|w| &w.id == job) {
                info!(local_job = %job, slots = w.slots, together = w.together, exclusive = w.exclusive, "a local job waits that no host could take even without gleaner: nothing preempted for it");
            }
        }
        if !plan.withdraw.is_empty() {
            info!(
                placeholders = plan.withdraw.len(),
                waiting, "local jobs wait: withdrawing pending placeholders"
            );
            self.last
                .placeholders
                .retain(|p| !plan.withdraw.contains(&p.id));
            effects.push(Effect::Remove { ids: plan.withdraw });
        }
        for order in plan.shrink {
            info!(job = %order.job, slots = order.slots, hosts = ?order.hosts, waiting, wanted, "local jobs wait: shrinking");
            let message = ControlMsg::Shrink {
                cluster: cluster.clone(),
                slots: order.slots,
                mode: ShrinkMode::Preempt,
                reason: format!("{waiting} local job(s) wait for {wanted} slot(s) on {cluster}"),
                hosts: order.hosts,
            };
            effects.push(Effect::Tell {
                job: order.job,
                message,
            });
        }
        effects
    }

    /// Placeholders and components waiting in the batch queue for longer
    /// than `max_pending` (not for local jobs: those withdraw them at once,
    /// or the batch system keeps them behind; nor components whose turn is
    /// still to come by the estimates) wait
    /// for something gleaner cannot see; they are withdrawn. Both
    /// count as failed starts, and their slots are not reported idle for a
    /// while, so that the scheduler offers or places them elsewhere and, if
    /// it keeps happening, stops using this cluster; a withdrawn component
    /// is told to its job, to be placed again.
    fn withdraw_stuck(&mut self, now: Now) -> Vec<Effect> {
        let yielding = self.last.yielding();
        let waiting: BTreeSet<&str> = self
            .last
            .placeholders
            .iter()
            .filter(|p| !p.running() && !yielding.contains(p.id.as_str()))
            .map(|p| p.id.as_str())
            .chain(
                self.last
                    .components
                    .iter()
                    .filter(|c| !c.running)
                    .map(|c| c.id.as_str()),
            )
            .collect();
        self.pending_since
            .retain(|id, _| waiting.contains(id.as_str()));
        for id in waiting {
            self.pending_since
                .entry(id.to_owned())
                .or_insert(now.instant);
        }
        let limit = self.config.max_pending;
        let stuck = |id: &str| {
            self.pending_since
                .get(id)
                .is_some_and(|since| now.instant.saturating_duration_since(*since) > limit)
        };
        let placeholders: Vec<String> = self
            .last
            .placeholders
            .iter()
            .filter(|p| !p.running() && stuck(&p.id))
            .map(|p| p.id.clone())
            .collect();
        // A component the estimates have waiting its turn behind jobs
        // that end waits for slots, not for something unseen: it stays
        // (reallocation may move it).
        let foresight = self.last.foresight(now.wall_ms, self.config.speed);
        let in_turn: BTreeSet<(&JobId, u32)> = foresight
            .waiting
            .iter()
            .filter(|w| w.start_ms > 0 && w.start_ms < NEVER_MS / 2)
            .map(|w| (&w.job, w.component))
            .collect();
        let components: Vec<ComponentRun> = self
            .last
            .components
            .iter()
            .filter(|c| !c.running && stuck(&c.id) && !in_turn.contains(&(&c.job, c.component)))
            .cloned()
            .collect();
        if placeholders.is_empty() && components.is_empty() {
            return Vec::new();
        }
        let cluster = self.config.cluster.clone();
        self.starts.stuck += 1;
        let slots = self
            .last
            .placeholders
            .iter()
            .filter(|p| placeholders.contains(&p.id))
            .map(|p| p.slots)
            .chain(components.iter().map(|c| c.slots))
            .fold(0, u32::saturating_add);
        self.starts.blocked = Some((slots, now.instant + limit));
        let reason = format!("waited in {cluster}'s batch queue longer than {limit:?}: withdrawn");
        if !placeholders.is_empty() {
            let message = format!("{} placeholder(s) {reason}", placeholders.len());
            warn!(placeholders = ?placeholders, failures = self.starts.stuck, "{message}");
            self.errors.command = Some(message);
        }
        let mut effects = Vec::new();
        for run in &components {
            warn!(job = %run.job, component = run.component, owner = %run.owner, failures = self.starts.stuck, "grid component {reason}, to be placed again");
            self.components.remove(&(run.job.clone(), run.component));
            effects.push(Effect::Tell {
                job: run.job.clone(),
                message: ControlMsg::ComponentWithdrawn {
                    component: run.component,
                    cluster: cluster.clone(),
                    reason: reason.clone(),
                },
            });
        }
        let ids: Vec<String> = placeholders
            .into_iter()
            .chain(components.iter().map(|c| c.id.clone()))
            .collect();
        for id in &ids {
            self.pending_since.remove(id);
        }
        self.last.placeholders.retain(|p| !ids.contains(&p.id));
        self.last.components.retain(|c| !ids.contains(&c.id));
        effects.push(Effect::Remove { ids });
        effects
    }

    /// Removals whose grace has passed, of the placeholders still there.
    fn due_removals(&mut self, now: Now) -> Vec<Effect> {
        let (due, later): (Vec<Removal>, Vec<Removal>) = std::mem::take(&mut self.removals)
            .into_iter()
            .partition(|r| r.due <= now.instant);
        self.removals = later;
        let still_there: Vec<String> = due
            .into_iter()
            .flat_map(|r| {
                let placeholders = &self.last.placeholders;
                r.ids
                    .into_iter()
                    .filter(move |id| placeholders.iter().any(|p| &p.id == id && p.job == r.job))
            })
            .collect();
        if still_there.is_empty() {
            return Vec::new();
        }
        warn!(placeholders = ?still_there, "removing launchers that outstayed their grace period");
        vec![Effect::Remove { ids: still_there }]
    }

    /// Waiting placeholders of an ended job go now; running ones get a grace
    /// period to notice the end themselves.
    fn end_job(&mut self, job: &JobId, now: Now) -> Vec<Effect> {
        let (pending, running): (Vec<&Placeholder>, Vec<&Placeholder>) = self
            .last
            .placeholders
            .iter()
            .filter(|p| &p.job == job)
            .partition(|p| !p.running());
        let pending: Vec<String> = pending
            .iter()
            .map(|p| p.id.clone())
            .chain(
                // Components of a job that ended early (cancelled) go too.
                self.last
                    .components
                    .iter()
                    .filter(|c| &c.job == job)
                    .map(|c| c.id.clone()),
            )
            .collect();
        let running: Vec<String> = running.iter().map(|p| p.id.clone()).collect();
        // Its components are stopped, not ended: their job has stopped
        // listening for them (or will place them again).
        let stopped: Vec<u32> = self
            .components
            .keys()
            .filter(|(j, _)| j == job)
            .map(|(_, component)| *component)
            .collect();
        let mut effects: Vec<Effect> = stopped
            .into_iter()
            .map(|component| {
                self.components.remove(&(job.clone(), component));
                Effect::DeleteSpoolEntry {
                    job: job.clone(),
                    component,
                }
            })
            .collect();
        if !pending.is_empty() {
            info!(job = %job, placeholders = pending.len(), "withdrawing waiting placeholders of an ended job");
            effects.push(Effect::Remove { ids: pending });
        }
        if !running.is_empty() {
            self.removals.push(Removal {
                due: now.instant + self.config.job_end_grace,
                job: job.clone(),
                ids: running,
            });
        }
        effects
    }

    /// Of `idle` slots, those the admins' caps let gleaner take: no more
    /// than `max_scavenged` in all, none on reserved hosts.
    fn offerable(&self, idle: u32) -> u32 {
        let snapshot = &self.last;
        let reserved = &self.config.reserve_hosts;
        let on_reserved = |host: &str| reserved.iter().any(|r| naming::same_host(r, host));
        let allowed_hosts = snapshot
            .hosts
            .iter()
            .filter(|h| !on_reserved(&h.name))
            .fold(0, |all: u32, h| all.saturating_add(h.slots));
        let limit = self
            .config
            .max_scavenged
            .map_or(u32::MAX, |cap| cap.of(snapshot.total_slots()))
            .min(allowed_hosts);
        let held = snapshot
            .placeholders
            .iter()
            .fold(0, |all: u32, p| all.saturating_add(p.slots));
        idle.min(limit.saturating_sub(held))
    }

    /// Slots not to offer because placeholders there got stuck.
    fn blocked_slots(&mut self, now: Now) -> u32 {
        match self.starts.blocked {
            Some((slots, until)) if now.instant < until => slots,
            _ => {
                self.starts.blocked = None;
                0
            }
        }
    }

    fn report(&mut self, now: Now) -> ClusterReport {
        let blocked = self.blocked_slots(now);
        let snapshot = &self.last;
        let mut jobs: BTreeMap<JobId, Holding> = BTreeMap::new();
        for placeholder in &snapshot.placeholders {
            let holding = jobs.entry(placeholder.job.clone()).or_default();
            holding.add(placeholder.running(), placeholder.slots);
        }
        let mut grid: BTreeMap<JobId, Holding> = BTreeMap::new();
        for component in &snapshot.components {
            let holding = grid.entry(component.job.clone()).or_default();
            holding.add(component.running, component.slots);
        }
        let mut hosts = snapshot.host_reports();
        let mut squatted = 0u32;
        for host in &mut hosts {
            let Some(squat) = self
                .squats
                .get(&host.name)
                .filter(|s| now.instant.saturating_duration_since(s.at) < SQUAT_SHOWN)
            else {
                continue;
            };
            host.squatted_gpus = squat.devices.clone();
            if let Some(free) = &mut host.free_gpus {
                let taken = squat.outside.min(*free);
                *free -= taken;
                squatted = squatted.saturating_add(taken);
            }
        }
        ClusterReport {
            cluster: self.config.cluster.clone(),
            grid,
            backend: self.config.backend.clone(),
            total_slots: snapshot.total_slots(),
            idle_slots: self.offerable(snapshot.idle_slots().saturating_sub(blocked)),
            free_slots: Some(snapshot.idle_slots().saturating_sub(blocked)),
            inputs: InputAccess {
                stage_s: self.staged.mean(),
                ..self.config.inputs.clone()
            },
            local_slots: snapshot.local_running(),
            local_waiting: snapshot.local_waiting(),
            local_waiting_first: snapshot.local_waiting_first(),
            grid_slots: snapshot.grid_running(),
            hosts,
            free_memory_mb: snapshot.free_memory_mb(),
            // GPUs held outside gleaner are free to no one.
            free_gpus: snapshot.free_gpus().map(|f| f.saturating_sub(squatted)),
            foresight: Some(snapshot.foresight(now.wall_ms, self.config.speed)),
            jobs,
            applied_grants: std::mem::take(&mut self.grants.applied),
            error: self
                .errors
                .command
                .clone()
                .or_else(|| self.starts.error.clone())
                .or_else(|| self.errors.read.clone())
                .or_else(|| snapshot.problem.clone()),
            failed_starts: self
                .starts
                .failures
                .cluster()
                .saturating_add(self.starts.stuck),
            job_failures: self
                .accounts
                .iter()
                .map(|(job, account)| (job, account.name.as_str()))
                .chain(
                    snapshot
                        .placeholders
                        .iter()
                        .map(|p| (&p.job, p.owner.as_str())),
                )
                .map(|(job, account)| (job.clone(), self.starts.failures.of(account, now.instant)))
                .filter(|(_, failures)| *failures > 0)
                .collect(),
            at: now.wall_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use gleaner_protocol::{Event as Published, advance, drain};

    use super::*;
    use crate::snapshot::Standing;

    fn job(name: &str) -> JobId {
        format!("{name}-0000000000000000").parse().unwrap()
    }

    /// `preempt_grace` 3 s + 2 × a 1 s poll.
    const SETTLE: Duration = Duration::from_secs(5);
    const MAX_PENDING: Duration = Duration::from_secs(60);
    const BUSY_POLL: Duration = Duration::from_secs(2);
    const IDLE_POLL: Duration = Duration::from_secs(15);

    /// The account a job's launchers connect as, where users are kept apart.
    fn launcher_account() -> Credentials {
        Credentials {
            user: "gleaner-launcher-a".into(),
            password: "p".into(),
        }
    }

    fn core() -> KcmCore {
        KcmCore::new(CoreConfig {
            speed: 1.0,
            cluster: "c1".into(),
            backend: "sge".into(),
            job_end_grace: Duration::from_secs(10),
            local_settle: SETTLE,
            poll_interval: BUSY_POLL,
            idle_poll_interval: IDLE_POLL,
            max_pending: MAX_PENDING,
            max_scavenged: None,
            reserve_hosts: Vec::new(),
            account: "root".into(),
            users: Users::default(),
            inputs: InputAccess {
                shared: vec!["/shared".into()],
                stages: false,
                stage_s: None,
            },
        })
    }

    /// A simulated clock: `at(ms)` is `ms` milliseconds after its start.
    struct Clock(Instant);

    impl Clock {
        fn new() -> Self {
            Self(Instant::now())
        }

        fn at(&self, ms: u64) -> Now {
            Now {
                instant: self.0 + Duration::from_millis(ms),
                wall_ms: 1_700_000_000_000 + ms,
            }
        }
    }

    fn placeholder(id: &str, job: &JobId, running: bool) -> Placeholder {
        Placeholder {
            id: id.into(),
            job: job.clone(),
            slots: 1,
            host: running.then(|| "n1".to_owned()),
            owner: "alice".into(),
            needs: Default::default(),
        }
    }

    fn component(id: &str, job: &JobId, component: u32, slots: u32) -> ComponentRun {
        ComponentRun {
            id: id.into(),
            job: job.clone(),
            component,
            slots,
            running: true,
            owner: "root".into(),
            timing: Default::default(),
        }
    }

    fn spec(job: &JobId, component: u32, slots: u32) -> ComponentSpec {
        ComponentSpec {
            needs: Default::default(),
            job: job.clone(),
            component,
            slots,
            command: "mpirun ./solver".into(),
            env: Vec::new(),
            walltime_ms: None,
            workdir: None,
            owner: "alice".into(),
            checkpoint: None,
            inputs: Vec::new(),
        }
    }

    /// One host, `n1`, of `total_slots` slots.
    fn cluster(total_slots: u32, placeholders: Vec<Placeholder>) -> Snapshot {
        busy(total_slots, 0, 0, placeholders)
    }

    /// One host, `n1`, with local jobs and grid components on it.
    fn busy(slots: u32, local: u32, grid: u32, placeholders: Vec<Placeholder>) -> Snapshot {
        Snapshot {
            hosts: vec![Host {
                local,
                grid,
                ..Host::new("n1", slots)
            }],
            placeholders,
            ..Snapshot::default()
        }
    }

    #[test]
    fn the_batch_system_is_read_often_only_while_gleaner_holds_or_waits_for_slots() {
        let clock = Clock::new();
        let mut kcm = core();
        assert_eq!(
            kcm.poll_timeout(),
            None,
            "no timer before the first reading"
        );
        kcm.handle(Event::Connected, clock.at(0));
        assert!(matches!(
            drain(&mut kcm, clock.at(0))[..],
            [Effect::PollNow]
        ));
        poll(&mut kcm, cluster(4, Vec::new()), clock.at(0));
        assert_eq!(kcm.poll_timeout(), Some(clock.at(15_000).instant));
        assert!(
            advance(&mut kcm, clock.at(14_999)).is_empty(),
            "not yet due"
        );
        assert!(matches!(
            advance(&mut kcm, clock.at(15_000))[..],
            [Effect::PollNow]
        ));
        let job: JobId = "sweep-0000000000000001".parse().unwrap();
        let waiting = vec![placeholder("7.1", &job, false)];
        poll(&mut kcm, cluster(4, waiting), clock.at(1_000));
        assert_eq!(kcm.poll_timeout(), Some(clock.at(3_000).instant));
        let running = vec![placeholder("7.1", &job, true)];
        poll(&mut kcm, cluster(4, running), clock.at(3_000));
        assert_eq!(kcm.poll_timeout(), Some(clock.at(5_000).instant));
        poll(&mut kcm, cluster(4, Vec::new()), clock.at(5_000));
        assert_eq!(kcm.poll_timeout(), Some(clock.at(20_000).instant));
    }

    #[test]
    fn a_grant_for_tasks_bigger_than_any_host_is_not_carried_out() {
        let clock = Clock::new();
        let mut kcm = core();
        poll(&mut kcm, cluster(4, Vec::new()), clock.at(0));
        let grant = |grant, task_slots| KcmMsg::StartLaunchers {
            job: "sweep-0000000000000001".parse().unwrap(),
            grant: GrantId::new(grant),
            slots: 8,
            task_slots,
            task_needs: Default::default(),
            owner: "alice".into(),
            credentials: Some(launcher_account()),
        };
        let submits = |effects: Vec<Effect>| {
            effects
                .iter()
                .filter(|e| matches!(e, Effect::SubmitLaunchers { .. }))
                .count()
        };
        assert_eq!(submits(message(&mut kcm, grant(1, 8), clock.at(1))), 0);
        assert_eq!(submits(message(&mut kcm, grant(2, 4), clock.at(2))), 1);
    }

    fn waiting(jobs: &[(&str, u32)]) -> Vec<WaitingJob> {
        jobs.iter()
            .map(|(id, slots)| WaitingJob::anywhere(*id, *slots))
            .collect()
    }

    fn poll(core: &mut KcmCore, snapshot: Snapshot, now: Now) -> Vec<Effect> {
        poll_spool(core, snapshot, Vec::new(), now)
    }

    /// Hands the core `event` and takes every effect it then has, as a
    /// shell would with no answer to give.
    fn step(core: &mut KcmCore, event: Event, now: Now) -> Vec<Effect> {
        core.handle(event, now);
        std::iter::from_fn(|| core.poll_effect(now)).collect()
    }

    /// A kcm whose every failure is the cluster's: one user.
    fn single_user_core() -> KcmCore {
        KcmCore::new(CoreConfig {
            speed: 1.0,
            users: Users {
                single: Some(true),
                ..Users::default()
            },
            ..core().config
        })
    }

    /// A poll's effects before its report, which goes last, both to the
    /// scheduler and to the events exchange.
    fn poll_spool(
        core: &mut KcmCore,
        snapshot: Snapshot,
        spooled: Vec<SpooledExit>,
        now: Now,
    ) -> Vec<Effect> {
        poll_started(core, snapshot, spooled, Vec::new(), now)
    }

    /// [`poll_spool`], with started files in the spool too.
    fn poll_started(
        core: &mut KcmCore,
        snapshot: Snapshot,
        spooled: Vec<SpooledExit>,
        started: Vec<SpooledStart>,
        now: Now,
    ) -> Vec<Effect> {
        let snapshot = Ok(snapshot);
        let event = Event::Polled {
            snapshot,
            spooled,
            started,
        };
        let mut effects = step(core, event, now);
        let report = effects.split_off(effects.len().saturating_sub(2));
        let [
            Effect::ToScheduler(SchedulerMsg::ClusterStatus(report)),
            Effect::Announce(Published::Cluster(announced)),
        ] = report.as_slice()
        else {
            panic!("a poll ends with its report, sent and announced: {report:?}");
        };
        assert_eq!(format!("{report:?}"), format!("{announced:?}"));
        effects
    }

    fn message(core: &mut KcmCore, message: KcmMsg, now: Now) -> Vec<Effect> {
        step(core, Event::Message(message), now)
    }

    /// The report the next poll ends with.
    fn report(core: &mut KcmCore, now: Now) -> ClusterReport {
        core.report(now)
    }

    fn removed(effects: &[Effect]) -> Vec<Vec<String>> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Remove { ids } => Some(ids.clone()),
                _ => None,
            })
            .collect()
    }

    fn shrinks(effects: &[Effect]) -> Vec<(JobId, u32)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Tell {
                    job,
                    message:
                        ControlMsg::Shrink {
                            cluster,
                            slots,
                            mode: ShrinkMode::Preempt,
                            ..
                        },
                } if cluster.as_str() == "c1" => Some((job.clone(), *slots)),
                _ => None,
            })
            .collect()
    }

    fn ended(effects: &[Effect]) -> Vec<(JobId, ComponentOutcome)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::ReportComponentEnd { job, outcome } => Some((job.clone(), outcome.clone())),
                _ => None,
            })
            .collect()
    }

    fn failure(what: &str) -> BackendError {
        BackendError {
            command: what.into(),
            message: "exit status: 1: denied".into(),
        }
    }

    #[test]
    fn a_restarted_kcm_adopts_what_its_predecessor_left() {
        let clock = Clock::new();
        let mut kcm = core();
        let (a, g) = (job("a"), job("g"));
        let found = Snapshot {
            components: vec![component("9", &g, 0, 2)],
            ..busy(
                6,
                0,
                2,
                (1..=4)
                    .map(|t| placeholder(&format!("3.{t}"), &a, true))
                    .collect(),
            )
        };
        let effects = poll(&mut kcm, found.clone(), clock.at(0));
        assert!(
            effects.is_empty(),
            "nothing submitted or removed: {effects:?}"
        );
        let r = report(&mut kcm, clock.at(0));
        assert_eq!(
            r.jobs[&a],
            Holding {
                running: 4,
                pending: 0
            }
        );
        assert_eq!(
            r.grid[&g],
            Holding {
                running: 2,
                pending: 0
            }
        );
        assert_eq!(
            r.idle_slots, 0,
            "the scheduler sees no room for a second array"
        );
        assert!(r.applied_grants.is_empty());

        // A grant after the restart is one array, acknowledged once.
        let effects = message(
            &mut kcm,
            KcmMsg::StartLaunchers {
                job: a.clone(),
                grant: GrantId::new(7),
                slots: 2,
                task_slots: 1,
                task_needs: Default::default(),
                owner: "alice".into(),
                credentials: Some(launcher_account()),
            },
            clock.at(100),
        );
        let submits: Vec<_> = effects
            .iter()
            .filter(|e| matches!(e, Effect::SubmitLaunchers { .. }))
            .collect();
        assert!(matches!(
            submits.as_slice(),
            [Effect::SubmitLaunchers { job, grant, slots: 2, .. }] if *job == a && *grant == GrantId::new(7)
        ));
        assert_eq!(
            report(&mut kcm, clock.at(200)).applied_grants,
            [GrantId::new(7)]
        );
        assert!(report(&mut kcm, clock.at(300)).applied_grants.is_empty());

        // The adopted component is the kcm's to report when it ends.
        let gone = Snapshot {
            components: Vec::new(),
            ..cluster(6, found.placeholders.clone())
        };
        let ends = ended(&poll(&mut kcm, gone, clock.at(1_000)));
        assert_eq!(ends.len(), 1);
        assert_eq!(
            (&ends[0].0, ends[0].1.component, ends[0].1.exit_code),
            (&g, 0, None)
        );
        assert_eq!(
            ends[0].1.runtime_ms, 1_000,
            "counted from when it was found"
        );
    }

    #[test]
    fn waiting_local_jobs_withdraw_pending_placeholders_and_split_one_shrink() {
        let clock = Clock::new();
        let mut kcm = core();
        let (a, b) = (job("a"), job("b"));
        let mut placeholders: Vec<Placeholder> = (1..=4)
            .map(|t| placeholder(&format!("1.{t}"), &a, true))
            .chain((1..=4).map(|t| placeholder(&format!("2.{t}"), &b, true)))
            .collect();
        let running = placeholders.clone();
        placeholders.extend([placeholder("2.5", &b, false), placeholder("2.6", &b, false)]);
        let busy = |waits: &[(&str, u32)], placeholders: &[Placeholder]| Snapshot {
            waiting: waiting(waits),
            ..cluster(8, placeholders.to_vec())
        };

        let effects = poll(&mut kcm, busy(&[("9", 4)], &placeholders), clock.at(0));
        assert_eq!(removed(&effects), [["2.5", "2.6"]]);
        assert_eq!(
            shrinks(&effects),
            [(a.clone(), 2), (b.clone(), 2)],
            "4 in all, not 4 each"
        );
        let Some(Effect::Tell {
            message: ControlMsg::Shrink { reason, .. },
            ..
        }) = effects.last()
        else {
            panic!("{effects:?}");
        };
        assert_eq!(reason, "1 local job(s) wait for 4 slot(s) on c1");
        let r = report(&mut kcm, clock.at(0));
        assert_eq!(
            r.jobs[&b],
            Holding {
                running: 4,
                pending: 0
            },
            "withdrawn ones are gone"
        );
        assert_eq!(r.local_waiting, 4);

        // The launchers need time to leave: the same job is not answered again…
        let effects = poll(&mut kcm, busy(&[("9", 4)], &running), clock.at(1_000));
        assert!(effects.is_empty(), "{effects:?}");
        // …a new one is, for its own slots only…
        let effects = poll(
            &mut kcm,
            busy(&[("9", 4), ("10", 2)], &running),
            clock.at(2_000),
        );
        assert_eq!(shrinks(&effects), [(a.clone(), 1), (b.clone(), 1)]);
        let effects = poll(
            &mut kcm,
            busy(&[("9", 4), ("10", 2)], &running),
            clock.at(4_999),
        );
        assert!(shrinks(&effects).is_empty(), "{effects:?}");
        // …and once the settle time passed, a job still waiting is answered again.
        let effects = poll(
            &mut kcm,
            busy(&[("9", 4), ("10", 2)], &running),
            clock.at(5_000),
        );
        assert_eq!(shrinks(&effects), [(a, 2), (b, 2)]);
    }

    #[test]
    fn placeholders_the_queue_keeps_behind_waiting_local_jobs_wait_there() {
        let clock = Clock::new();
        let mut kcm = core();
        let a = job("a");
        let standing = |tier, priority| Standing { tier, priority };
        let queue = |waits: &[(&str, u32)], local_standing: Standing| Snapshot {
            waiting: waiting(waits),
            standings: BTreeMap::from([
                ("1.1".to_owned(), standing(1, 500)),
                ("9".to_owned(), local_standing),
            ]),
            ..busy(4, 4, 0, vec![placeholder("1.1", &a, false)])
        };
        let behind = || queue(&[("9", 4)], standing(10, 100));
        // Behind the waiting job in the queue: left to the batch system's
        // backfill, however long it waits.
        for at in [0, 1_000, MAX_PENDING.as_millis() as u64 * 3] {
            let effects = poll(&mut kcm, behind(), clock.at(at));
            assert!(removed(&effects).is_empty(), "{effects:?}");
        }
        // Ahead of it: withdrawn at once.
        let effects = poll(
            &mut kcm,
            queue(&[("9", 4)], standing(1, 400)),
            clock.at(200_000),
        );
        assert_eq!(removed(&effects), [["1.1"]]);
        // Once nothing waits, a placeholder still waiting is stuck after
        // `max_pending` counted from then.
        let mut kcm = core();
        poll(&mut kcm, behind(), clock.at(0));
        let alone = || queue(&[], standing(10, 100));
        let effects = poll(&mut kcm, alone(), clock.at(100_000));
        assert!(removed(&effects).is_empty(), "{effects:?}");
        let effects = poll(
            &mut kcm,
            alone(),
            clock.at(100_000 + MAX_PENDING.as_millis() as u64 + 1),
        );
        assert_eq!(removed(&effects), [["1.1"]]);
    }

    #[test]
    fn released_launchers_are_removed_after_their_grace_if_still_there() {
        let clock = Clock::new();
        let mut kcm = core();
        let a = job("a");
        let both = cluster(
            4,
            vec![placeholder("5.1", &a, true), placeholder("5.2", &a, true)],
        );
        poll(&mut kcm, both.clone(), clock.at(0));
        let effects = message(
            &mut kcm,
            KcmMsg::Release {
                job: a.clone(),
                launchers: vec!["c1-5.1".into(), "c1-5.2".into(), "c2-5.3".into()],
                grace_ms: 3_000,
            },
            clock.at(0),
        );
        assert!(effects.is_empty(), "no poll needed: {effects:?}");
        // Another job's runner cannot have a's launchers removed.
        let b = job("b");
        message(
            &mut kcm,
            KcmMsg::Release {
                job: b,
                launchers: vec!["c1-5.1".into(), "c1-5.2".into()],
                grace_ms: 0,
            },
            clock.at(0),
        );
        assert!(removed(&poll(&mut kcm, both.clone(), clock.at(1))).is_empty());
        assert!(removed(&poll(&mut kcm, both, clock.at(2_999))).is_empty());
        // 5.1 left by itself; 5.3 is another cluster's.
        let one = cluster(4, vec![placeholder("5.2", &a, true)]);
        assert_eq!(
            removed(&poll(&mut kcm, one.clone(), clock.at(3_000))),
            [["5.2"]]
        );
        assert!(
            removed(&poll(&mut kcm, one, clock.at(4_000))).is_empty(),
            "once"
        );
    }

    #[test]
    fn an_ended_job_goes_pending_and_components_now_running_after_grace() {
        let clock = Clock::new();
        let mut kcm = core();
        let (a, b, g) = (job("a"), job("b"), job("g"));
        let snapshot = Snapshot {
            components: vec![component("8", &g, 0, 2)],
            ..cluster(
                8,
                vec![
                    placeholder("1.1", &a, true),
                    placeholder("1.2", &a, false),
                    placeholder("2.1", &b, true),
                    placeholder("2.2", &b, false),
                ],
            )
        };
        poll(&mut kcm, snapshot.clone(), clock.at(0));
        let effects = message(&mut kcm, KcmMsg::JobEnded { job: a.clone() }, clock.at(0));
        assert_eq!(removed(&effects), [["1.2"]], "b's are not touched");
        assert!(matches!(effects.last(), Some(Effect::PollNow)));
        let effects = message(&mut kcm, KcmMsg::JobEnded { job: g }, clock.at(0));
        assert_eq!(
            removed(&effects),
            [["8"]],
            "a cancelled grid job's components go"
        );
        let running = Snapshot {
            components: Vec::new(),
            ..cluster(
                8,
                vec![placeholder("1.1", &a, true), placeholder("2.1", &b, true)],
            )
        };
        assert!(removed(&poll(&mut kcm, running.clone(), clock.at(9_999))).is_empty());
        assert_eq!(
            removed(&poll(&mut kcm, running, clock.at(10_000))),
            [["1.1"]]
        );
        let left = cluster(8, vec![placeholder("2.1", &b, true)]);
        let message_for_gone = message(&mut kcm, KcmMsg::JobEnded { job: a }, clock.at(11_000));
        assert!(removed(&message_for_gone).is_empty());
        assert!(removed(&poll(&mut kcm, left, clock.at(30_000))).is_empty());
    }

    #[test]
    fn a_grant_ordered_twice_is_carried_out_once() {
        let clock = Clock::new();
        let mut kcm = core();
        poll(&mut kcm, cluster(4, Vec::new()), clock.at(0));
        let order = || KcmMsg::StartLaunchers {
            job: job("a"),
            grant: GrantId::new(7),
            slots: 2,
            task_slots: 1,
            task_needs: Default::default(),
            owner: "alice".into(),
            credentials: Some(launcher_account()),
        };
        let first = message(&mut kcm, order(), clock.at(0));
        assert!(matches!(first[0], Effect::SubmitLaunchers { slots: 2, .. }));
        assert!(message(&mut kcm, order(), clock.at(1_000)).is_empty());
        assert_eq!(
            report(&mut kcm, clock.at(1_000)).applied_grants,
            [GrantId::new(7)]
        );
    }

    #[test]
    fn a_kcm_and_a_runner_that_disagree_on_users_start_no_launchers() {
        let clock = Clock::new();
        let single = Users {
            single: Some(true),
            ..Users::default()
        };
        let cases = [
            (single, Some(launcher_account()), "keeps users apart"),
            (Users::default(), None, "no launcher account"),
        ];
        for (users, credentials, why) in cases {
            let mut kcm = KcmCore::new(CoreConfig {
                speed: 1.0,
                users,
                ..core().config
            });
            poll(&mut kcm, cluster(4, Vec::new()), clock.at(0));
            let order = KcmMsg::StartLaunchers {
                job: job("a"),
                grant: GrantId::new(1),
                slots: 2,
                task_slots: 1,
                task_needs: Default::default(),
                owner: "alice".into(),
                credentials,
            };
            let effects = message(&mut kcm, order, clock.at(0));
            assert!(
                !effects
                    .iter()
                    .any(|e| matches!(e, Effect::SubmitLaunchers { .. })),
                "{why}: {effects:?}"
            );
            let error = report(&mut kcm, clock.at(0)).error.unwrap_or_default();
            assert!(error.contains(why), "{error}");
        }
    }

    #[test]
    fn failed_starts_are_counted_and_reported_until_one_succeeds() {
        let clock = Clock::new();
        let mut kcm = core();
        let a = job("a");
        poll(&mut kcm, cluster(4, Vec::new()), clock.at(0));
        for (grant, failures) in [(GrantId::new(1), 1), (GrantId::new(2), 2)] {
            let effects = message(
                &mut kcm,
                KcmMsg::StartLaunchers {
                    job: a.clone(),
                    grant,
                    slots: 4,
                    task_slots: 1,
                    task_needs: Default::default(),
                    owner: "alice".into(),
                    credentials: Some(launcher_account()),
                },
                clock.at(0),
            );
            assert!(matches!(
                effects.as_slice(),
                [Effect::SubmitLaunchers { .. }, Effect::PollNow]
            ));
            let result = Err(failure("qsub -t 1-4"));
            let event = Event::LaunchersSubmitted {
                job: a.clone(),
                grant,
                requested: 4,
                result,
            };
            assert!(step(&mut kcm, event, clock.at(0)).is_empty());
            let r = report(&mut kcm, clock.at(0));
            assert_eq!(r.failed_starts, 0, "alice's alone are not the cluster's");
            assert_eq!(r.job_failures.get(&a), Some(&failures));
            assert_eq!(
                r.error.as_deref(),
                Some("qsub -t 1-4: exit status: 1: denied")
            );
            assert_eq!(
                r.applied_grants,
                [grant],
                "a refused grant was still acted on"
            );
        }
        message(
            &mut kcm,
            KcmMsg::StartLaunchers {
                job: a.clone(),
                grant: GrantId::new(3),
                slots: 4,
                task_slots: 1,
                task_needs: Default::default(),
                owner: "alice".into(),
                credentials: Some(launcher_account()),
            },
            clock.at(0),
        );
        let event = Event::LaunchersSubmitted {
            job: a,
            grant: GrantId::new(3),
            requested: 4,
            result: Ok(4),
        };
        step(&mut kcm, event, clock.at(0));
        let r = report(&mut kcm, clock.at(0));
        assert_eq!(
            (r.job_failures.get(&job("a")), r.error),
            (Some(&2), None),
            "submitted is not started yet"
        );
        // Bob's start fails too: two accounts' failures are the cluster's.
        let b = job("b");
        message(
            &mut kcm,
            KcmMsg::StartLaunchers {
                job: b.clone(),
                grant: GrantId::new(4),
                slots: 1,
                task_slots: 1,
                task_needs: Default::default(),
                owner: "bob".into(),
                credentials: Some(launcher_account()),
            },
            clock.at(0),
        );
        let event = Event::LaunchersSubmitted {
            job: b.clone(),
            grant: GrantId::new(4),
            requested: 1,
            result: Err(failure("qsub")),
        };
        step(&mut kcm, event, clock.at(0));
        assert_eq!(report(&mut kcm, clock.at(0)).failed_starts, 3);
        let up = KcmMsg::LauncherUp {
            job: job("a"),
            launcher: naming::launcher_id(&"c1".into(), "7.1"),
        };
        message(&mut kcm, up, clock.at(1_000));
        assert_eq!(
            report(&mut kcm, clock.at(1_000)).failed_starts,
            3,
            "a placeholder not seen yet: its word clears nothing (it could be forged)"
        );
        poll(
            &mut kcm,
            cluster(4, vec![placeholder("7.1", &job("a"), true)]),
            clock.at(2_000),
        );
        let r = report(&mut kcm, clock.at(2_000));
        assert_eq!(r.failed_starts, 0, "seen: its start worked");
        assert_eq!(r.job_failures, [(b, 1)].into(), "bob's are still his");
    }

    /// Host `n1` with two GPUs the batch system counts free, and these
    /// placeholders.
    fn gpu_cluster(placeholders: Vec<Placeholder>) -> Snapshot {
        Snapshot {
            hosts: vec![Host {
                free_gpus: Some(2),
                ..Host::new("n1", 4)
            }],
            placeholders,
            ..Snapshot::default()
        }
    }

    /// A placeholder of `owner`'s for `job` needing `gpus`, running on `n1`
    /// or waiting.
    fn gpu_placeholder(
        id: &str,
        job: &JobId,
        owner: &str,
        gpus: u32,
        running: bool,
    ) -> Placeholder {
        Placeholder {
            owner: owner.into(),
            needs: gleaner_manifest::Needs { memory_mb: 0, gpus },
            ..placeholder(id, job, running)
        }
    }

    /// What alice's launcher in placeholder `id` says: `devices` of `n1`
    /// were claimed.
    fn gpus_held(job: &JobId, id: &str, devices: &[&str]) -> KcmMsg {
        KcmMsg::GpusHeld {
            job: job.clone(),
            held: GpusHeld {
                launcher: naming::launcher_id(&"c1".into(), id),
                cluster: "c1".into(),
                host: "n1".into(),
                devices: devices.iter().map(|d| d.to_string()).collect(),
            },
        }
    }

    #[test]
    fn gpus_held_outside_gleaner_are_a_failure_of_no_ones() {
        let clock = Clock::new();
        let mut kcm = core();
        let (a, b) = (job("a"), job("b"));
        poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(0));
        // Bob squats both GPUs of n1; alice's placeholder runs there, and
        // bob's own job's launchers are broken.
        let alices = gpu_placeholder("5.1", &a, "alice", 2, true);
        let bobs = gpu_placeholder("6.1", &b, "bob", 0, false);
        poll(&mut kcm, gpu_cluster(vec![alices, bobs]), clock.at(1_000));
        // Job b cannot speak for alice's placeholder.
        message(&mut kcm, gpus_held(&b, "5.1", &["0", "1"]), clock.at(1_100));
        assert!(
            report(&mut kcm, clock.at(1_100)).hosts[0]
                .squatted_gpus
                .is_empty()
        );
        message(&mut kcm, gpus_held(&a, "5.1", &["1", "0"]), clock.at(1_200));
        let r = report(&mut kcm, clock.at(1_200));
        assert_eq!(r.hosts[0].squatted_gpus, ["0", "1"], "shown to the admin");
        assert_eq!(r.hosts[0].free_gpus, Some(0), "free to no one");
        assert_eq!(r.free_gpus, Some(0));
        poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(2_000));
        let r = report(&mut kcm, clock.at(2_000));
        assert_eq!(
            kcm.starts.failures.of("alice", clock.at(2_000).instant),
            0,
            "not alice's"
        );
        assert_eq!(
            kcm.starts.failures.of("bob", clock.at(2_000).instant),
            1,
            "bob's own"
        );
        assert_eq!(
            r.failed_starts, 0,
            "bob's squat and his own failures do not exclude the cluster"
        );
        assert_eq!(r.error, Some("placeholder 6.1 (before it ran) ended before its launcher reached the broker; its output (log_dir) says why".into()));
        let later = clock.at(2_000 + SQUAT_SHOWN.as_millis() as u64);
        poll(&mut kcm, gpu_cluster(Vec::new()), later);
        let r = report(&mut kcm, later);
        assert!(r.hosts[0].squatted_gpus.is_empty(), "then tried again");
        assert_eq!(r.free_gpus, Some(2));
    }

    #[test]
    fn a_word_of_gpus_held_outside_gleaner_after_the_end_takes_the_failure_back() {
        let clock = Clock::new();
        let mut kcm = core();
        let a = job("a");
        poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(0));
        let alices = gpu_placeholder("5.1", &a, "alice", 1, true);
        poll(&mut kcm, gpu_cluster(vec![alices]), clock.at(1_000));
        // Gone before its launcher's word, relayed by its runner, came.
        poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(2_000));
        assert_eq!(kcm.starts.failures.of("alice", clock.at(2_000).instant), 1);
        message(&mut kcm, gpus_held(&a, "5.1", &["0"]), clock.at(2_100));
        assert_eq!(kcm.starts.failures.of("alice", clock.at(2_100).instant), 0);
        let r = report(&mut kcm, clock.at(2_100));
        assert_eq!(
            (r.error, r.hosts[0].squatted_gpus.clone()),
            (None, vec!["0".to_owned()])
        );
        // Said again, it takes nothing more back.
        message(&mut kcm, gpus_held(&a, "5.1", &["0"]), clock.at(2_200));
        assert_eq!(kcm.starts.failures.of("alice", clock.at(2_200).instant), 0);
    }

    #[test]
    fn a_word_for_a_placeholder_not_seen_running_excuses_it_and_names_no_host() {
        let clock = Clock::new();
        let mut kcm = core();
        let a = job("a");
        poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(0));
        let waiting = gpu_placeholder("7.1", &a, "alice", 2, false);
        poll(&mut kcm, gpu_cluster(vec![waiting]), clock.at(1_000));
        // It ran, and its launcher spoke, between two readings; the host
        // is its word only (a task could have sent it).
        message(&mut kcm, gpus_held(&a, "7.1", &["0", "1"]), clock.at(1_500));
        let r = report(&mut kcm, clock.at(1_500));
        assert!(r.hosts[0].squatted_gpus.is_empty());
        assert_eq!(r.free_gpus, Some(2));
        poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(2_000));
        assert_eq!(kcm.starts.failures.of("alice", clock.at(2_000).instant), 0);
    }

    #[test]
    fn gpus_claimed_within_gleaners_count_are_the_clusters_miscount() {
        let clock = Clock::new();
        let mut kcm = core();
        let (a, c) = (job("a"), job("c"));
        poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(0));
        // Carol's launcher holds both GPUs by right; alice's finds them
        // claimed (the batch system counted more than the cluster lists).
        let carols = gpu_placeholder("4.1", &c, "carol", 2, true);
        let alices = gpu_placeholder("5.1", &a, "alice", 2, true);
        poll(
            &mut kcm,
            gpu_cluster(vec![carols.clone(), alices]),
            clock.at(1_000),
        );
        message(&mut kcm, gpus_held(&a, "5.1", &["0", "1"]), clock.at(1_100));
        assert!(
            report(&mut kcm, clock.at(1_100)).hosts[0]
                .squatted_gpus
                .is_empty()
        );
        poll(&mut kcm, gpu_cluster(vec![carols]), clock.at(2_000));
        assert_eq!(kcm.starts.failures.of("alice", clock.at(2_000).instant), 1);
    }

    #[test]
    fn placeholders_that_end_before_their_launcher_speaks_are_failed_starts() {
        let clock = Clock::new();
        let mut kcm = core();
        let a = job("a");
        let at = |id: &str, host: Option<&str>| Placeholder {
            id: id.into(),
            job: a.clone(),
            slots: 1,
            host: host.map(str::to_owned),
            owner: "alice".into(),
            needs: Default::default(),
        };
        let b = job("b");
        let of_b = Placeholder {
            job: b.clone(),
            ..at("4.1", None)
        };
        // Adopted from an earlier kcm: ending is not news.
        poll(
            &mut kcm,
            cluster(4, vec![at("1.1", Some("n1"))]),
            clock.at(0),
        );
        let two = vec![at("2.1", None), at("2.2", None)];
        poll(&mut kcm, cluster(4, two), clock.at(1_000));
        assert_eq!(report(&mut kcm, clock.at(1_000)).failed_starts, 0);
        // 2.1 ran and ended unheard; 2.2 ended before it even ran.
        let next = vec![
            at("2.1", Some("n1")),
            at("2.2", None),
            at("3.1", None),
            of_b.clone(),
        ];
        poll(&mut kcm, cluster(4, next), clock.at(2_000));
        poll(
            &mut kcm,
            cluster(4, vec![at("3.1", None), of_b]),
            clock.at(3_000),
        );
        let r = report(&mut kcm, clock.at(3_000));
        assert_eq!(r.job_failures.get(&a), Some(&2), "alice's");
        assert_eq!(r.failed_starts, 0, "hers alone are not the cluster's");
        let error = r.error.unwrap_or_default();
        assert!(
            error.contains("before its launcher reached the broker"),
            "{error}"
        );
        // Job b's launchers cannot speak for a's placeholder 3.1.
        let forged = KcmMsg::LauncherUp {
            job: b.clone(),
            launcher: naming::launcher_id(&"c1".into(), "3.1"),
        };
        message(&mut kcm, forged, clock.at(3_200));
        assert_eq!(
            report(&mut kcm, clock.at(3_200)).job_failures.get(&a),
            Some(&2)
        );
        // 3.1's launcher speaks before the kcm sees it run, and clears the
        // count; 4.1 is removed by the kcm. Neither ending is a failure.
        let up = KcmMsg::LauncherUp {
            job: a.clone(),
            launcher: naming::launcher_id(&"c1".into(), "3.1"),
        };
        message(&mut kcm, up, clock.at(3_500));
        let effects = message(&mut kcm, KcmMsg::JobEnded { job: b }, clock.at(3_500));
        assert_eq!(removed(&effects), [["4.1"]]);
        poll(&mut kcm, cluster(4, Vec::new()), clock.at(4_000));
        let r = report(&mut kcm, clock.at(4_000));
        assert_eq!((r.failed_starts, r.error), (0, None));
    }

    #[test]
    fn errors_reported_commands_first_then_reads_then_the_batch_system() {
        let clock = Clock::new();
        let mut kcm = core();
        let troubled = Snapshot {
            problem: Some("c1.q@a is in state E".into()),
            ..cluster(4, Vec::new())
        };
        poll(&mut kcm, troubled.clone(), clock.at(0));
        let error = |kcm: &mut KcmCore| report(kcm, clock.at(0)).error;
        assert_eq!(error(&mut kcm).as_deref(), Some("c1.q@a is in state E"));
        let snapshot = Err(failure("qstat -xml"));
        step(
            &mut kcm,
            Event::Polled {
                snapshot,
                spooled: Vec::new(),
                started: Vec::new(),
            },
            clock.at(0),
        );
        assert_eq!(
            error(&mut kcm).as_deref(),
            Some("qstat -xml: exit status: 1: denied")
        );
        step(
            &mut kcm,
            Event::Removed(Err(failure("qdel 1.1"))),
            clock.at(0),
        );
        assert_eq!(
            error(&mut kcm).as_deref(),
            Some("qdel 1.1: exit status: 1: denied")
        );
        step(&mut kcm, Event::Removed(Ok(())), clock.at(0));
        assert!(
            error(&mut kcm).is_some(),
            "only a good submission clears a command error"
        );
        let fine = cluster(4, Vec::new());
        poll(&mut kcm, fine, clock.at(0));
        assert_eq!(
            error(&mut kcm).as_deref(),
            Some("qdel 1.1: exit status: 1: denied")
        );
    }

    #[test]
    fn component_ends_in_the_spool_are_reported_until_heard_then_deleted() {
        let clock = Clock::new();
        let mut kcm = core();
        let g = job("g");
        let spec = spec(&g, 1, 2);
        let effects = message(&mut kcm, KcmMsg::SubmitComponent(spec.clone()), clock.at(0));
        assert!(
            matches!(
                effects.as_slice(),
                [
                    Effect::DeleteSpoolEntry { component: 1, .. },
                    Effect::SubmitComponent { spec: submitted, one_host: false, .. },
                    Effect::PollNow,
                ] if *submitted == spec
            ),
            "no host seen yet: spread"
        );
        let answer = Event::ComponentSubmitted {
            spec,
            result: Ok(()),
        };
        assert!(
            matches!(
                &step(&mut kcm, answer, clock.at(0))[..],
                [Effect::Tell {
                    message: ControlMsg::ComponentQueued { component: 1, .. },
                    ..
                }]
            ),
            "its job hears it is queued"
        );
        let exit = SpooledExit {
            job: g.clone(),
            component: 1,
            exit_code: Some(3),
            preempted: false,
        };
        let running = Snapshot {
            components: vec![component("8", &g, 1, 2)],
            ..cluster(4, Vec::new())
        };
        // The wrapper wrote its exit status; the batch system still lists it.
        let effects = poll_spool(&mut kcm, running, vec![exit.clone()], clock.at(1_000));
        assert!(ended(&effects).is_empty(), "{effects:?}");

        let ends = ended(&poll_spool(
            &mut kcm,
            cluster(4, Vec::new()),
            vec![exit.clone()],
            clock.at(31_000),
        ));
        let outcome = ComponentOutcome {
            component: 1,
            cluster: "c1".into(),
            exit_code: Some(3),
            runtime_ms: 31_000,
            stdout: Captured::default(),
            stderr: Captured::default(),
            preempted: false,
        };
        assert_eq!(ends, [(g.clone(), outcome.clone())]);
        // Not heard yet (the send failed): still reported, spool entry kept.
        let effects = poll_spool(
            &mut kcm,
            cluster(4, Vec::new()),
            vec![exit],
            clock.at(32_000),
        );
        let again = ComponentOutcome {
            runtime_ms: 32_000,
            ..outcome
        };
        assert_eq!(ended(&effects), [(g.clone(), again)], "still tracked");
        assert!(
            !effects
                .iter()
                .any(|e| matches!(e, Effect::DeleteSpoolEntry { .. }))
        );
        // Heard: forgotten, and only now its spool entry goes.
        let effects = step(
            &mut kcm,
            Event::ComponentReported {
                job: g.clone(),
                component: 1,
            },
            clock.at(32_000),
        );
        assert!(matches!(
            effects.as_slice(),
            [Effect::DeleteSpoolEntry { job, component: 1 }] if *job == g
        ));
        assert!(ended(&poll(&mut kcm, cluster(4, Vec::new()), clock.at(33_000))).is_empty());
    }

    #[test]
    fn a_started_component_is_told_once_and_let_go_or_withdrawn_when_its_job_says() {
        let clock = Clock::new();
        let mut kcm = core();
        let g = job("g");
        let spec = spec(&g, 1, 2);
        message(&mut kcm, KcmMsg::SubmitComponent(spec.clone()), clock.at(0));
        let answer = Event::ComponentSubmitted {
            spec,
            result: Ok(()),
        };
        step(&mut kcm, answer, clock.at(0));
        let n1 = vec![HostSlots {
            host: "n1".into(),
            slots: 2,
        }];
        let started = |job: &JobId, hosts: Result<Vec<HostSlots>, String>| SpooledStart {
            job: job.clone(),
            component: 1,
            hosts,
        };
        let running = || Snapshot {
            components: vec![component("8", &g, 1, 2)],
            ..cluster(4, Vec::new())
        };
        let told = |effects: &[Effect]| -> Vec<(JobId, ControlMsg)> {
            effects
                .iter()
                .filter_map(|e| match e {
                    Effect::Tell { job, message } => Some((job.clone(), message.clone())),
                    _ => None,
                })
                .collect()
        };
        let stranger = job("h");
        let effects = poll_started(
            &mut kcm,
            running(),
            Vec::new(),
            vec![
                started(&g, Ok(n1.clone())),
                started(&stranger, Ok(n1.clone())),
            ],
            clock.at(1_000),
        );
        let [
            (
                job,
                ControlMsg::ComponentStarted {
                    component,
                    cluster: at,
                    hosts,
                },
            ),
        ] = &told(&effects)[..]
        else {
            panic!("{effects:?}");
        };
        assert_eq!((job, *component, at.as_str(), hosts), (&g, 1, "c1", &n1));
        let again = poll_started(
            &mut kcm,
            running(),
            Vec::new(),
            vec![started(&g, Err("garbage".into()))],
            clock.at(2_000),
        );
        assert!(told(&again).is_empty(), "told once");

        let a = vec![HostSlots {
            host: "a".into(),
            slots: 4,
        }];
        let go = |component| KcmMsg::Go {
            job: g.clone(),
            component,
            hosts: vec![a.clone(), n1.clone()],
        };
        let effects = message(&mut kcm, go(1), clock.at(3_000));
        let [
            Effect::ReleaseComponent {
                go: text, hosts, ..
            },
        ] = &effects[..]
        else {
            panic!("{effects:?}");
        };
        assert_eq!(text, "4 6 2\n", "ranks 4 and 5 of 6");
        assert_eq!(hosts, "a slots=4 # component 0\nn1 slots=2 # component 1\n");
        assert!(
            message(&mut kcm, go(3), clock.at(3_000)).is_empty(),
            "no such component"
        );

        let effects = message(
            &mut kcm,
            KcmMsg::WithdrawComponent {
                job: g.clone(),
                component: 1,
            },
            clock.at(4_000),
        );
        assert!(
            matches!(
                &effects[..],
                [Effect::DeleteSpoolEntry { component: 1, .. }, Effect::Remove { ids }] if *ids == ["8"]
            ),
            "{effects:?}"
        );
        let effects = poll_spool(
            &mut kcm,
            cluster(4, Vec::new()),
            Vec::new(),
            clock.at(5_000),
        );
        assert!(
            ended(&effects).is_empty(),
            "withdrawn, not ended: {effects:?}"
        );
    }

    #[test]
    fn inputs_the_nodes_do_not_see_are_staged_first_or_the_component_cannot_run() {
        let clock = Clock::new();
        let g = job("g");
        let mut reading = spec(&g, 0, 1);
        reading.inputs = vec!["/shared/a".into(), "/home/alice/b".into()];
        // No staging command: the component ends at once, unstarted.
        let mut kcm = core();
        let effects = message(
            &mut kcm,
            KcmMsg::SubmitComponent(reading.clone()),
            clock.at(0),
        );
        let [
            Effect::Tell {
                message: ControlMsg::ComponentEnded(outcome),
                ..
            },
        ] = &effects[..]
        else {
            panic!("{effects:?}");
        };
        assert_eq!((outcome.exit_code, outcome.runtime_ms), (None, 0));
        let error = String::from_utf8_lossy(&outcome.stderr.data).into_owned();
        assert!(
            error.contains("/home/alice/b") && !error.contains("/shared/a"),
            "{error}"
        );
        // With one: staged, then submitted; the time it took is reported.
        let mut kcm = KcmCore::new(CoreConfig {
            speed: 1.0,
            inputs: InputAccess {
                stages: true,
                ..core().config.inputs
            },
            ..core().config
        });
        let effects = message(
            &mut kcm,
            KcmMsg::SubmitComponent(reading.clone()),
            clock.at(0),
        );
        let [Effect::StageInputs { inputs, .. }] = &effects[..] else {
            panic!("{effects:?}");
        };
        assert_eq!(inputs, &["/home/alice/b".to_owned()]);
        let staged = Event::InputsStaged {
            spec: reading,
            account: None,
            result: Ok(Duration::from_secs(3)),
        };
        let effects = step(&mut kcm, staged, clock.at(3_000));
        assert!(
            effects
                .iter()
                .any(|e| matches!(e, Effect::SubmitComponent { .. })),
            "{effects:?}"
        );
        let r = report(&mut kcm, clock.at(3_000));
        assert_eq!((r.inputs.stages, r.inputs.stage_s), (true, Some(3.0)));
    }

    #[test]
    fn components_that_fit_on_one_host_are_kept_on_one() {
        let clock = Clock::new();
        let mut kcm = core();
        let g = job("g");
        let hosts = Snapshot {
            hosts: vec![Host::new("n1", 4), Host::new("n2", 8)],
            ..Snapshot::default()
        };
        poll(&mut kcm, hosts, clock.at(0));
        let layouts: Vec<(u32, bool)> = [1, 8, 9]
            .into_iter()
            .map(|slots| {
                let effects = message(
                    &mut kcm,
                    KcmMsg::SubmitComponent(spec(&g, 0, slots)),
                    clock.at(0),
                );
                let one_host = effects.iter().find_map(|e| match e {
                    Effect::SubmitComponent { one_host, .. } => Some(*one_host),
                    _ => None,
                });
                (slots, one_host.unwrap())
            })
            .collect();
        assert_eq!(layouts, [(1, true), (8, true), (9, false)]);
    }

    #[test]
    fn components_without_an_exit_status_end_once_gone_or_a_minute_unseen() {
        let clock = Clock::new();
        let mut kcm = single_user_core();
        let g = job("g");
        for component in [0, 1] {
            let submitted = Event::ComponentSubmitted {
                spec: spec(&g, component, 1),
                result: Ok(()),
            };
            step(&mut kcm, submitted, clock.at(0));
        }
        // Component 1 shows up, then leaves without an exit status (qdel).
        let seen = Snapshot {
            components: vec![component("8", &g, 1, 1)],
            ..cluster(4, Vec::new())
        };
        assert!(ended(&poll(&mut kcm, seen, clock.at(1_000))).is_empty());
        let ends = ended(&poll(&mut kcm, cluster(4, Vec::new()), clock.at(2_000)));
        let summary: Vec<_> = ends
            .iter()
            .map(|(_, o)| (o.component, o.exit_code, o.runtime_ms))
            .collect();
        assert_eq!(summary, [(1, None, 2_000)]);
        let r = report(&mut kcm, clock.at(2_000));
        assert_eq!(
            r.failed_starts, 1,
            "killed under it: the cluster's failure, counted once"
        );
        step(
            &mut kcm,
            Event::ComponentReported {
                job: g.clone(),
                component: 1,
            },
            clock.at(2_000),
        );
        // Component 0 never showed up: given up on after a minute.
        assert!(ended(&poll(&mut kcm, cluster(4, Vec::new()), clock.at(60_000))).is_empty());
        let ends = ended(&poll(&mut kcm, cluster(4, Vec::new()), clock.at(60_001)));
        let summary: Vec<_> = ends
            .iter()
            .map(|(_, o)| (o.component, o.exit_code, o.runtime_ms))
            .collect();
        assert_eq!(summary, [(0, None, 60_001)]);
        assert_eq!(
            report(&mut kcm, clock.at(60_001)).failed_starts,
            1,
            "never seen: the batch system lost it, or never had it"
        );
    }

    #[test]
    fn a_component_that_exits_or_meets_its_walltime_is_no_failure_of_the_clusters() {
        let clock = Clock::new();
        let mut kcm = single_user_core();
        let g = job("g");
        let mut timed = spec(&g, 0, 1);
        timed.walltime_ms = Some(10_000);
        for spec in [timed, spec(&g, 1, 1)] {
            let submitted = Event::ComponentSubmitted {
                spec,
                result: Ok(()),
            };
            step(&mut kcm, submitted, clock.at(0));
        }
        let seen = Snapshot {
            components: vec![component("8", &g, 0, 1), component("9", &g, 1, 1)],
            ..cluster(4, Vec::new())
        };
        poll(&mut kcm, seen, clock.at(1_000));
        let exit = SpooledExit {
            job: g.clone(),
            component: 1,
            exit_code: Some(7),
            preempted: false,
        };
        let ends = ended(&poll_spool(
            &mut kcm,
            cluster(4, Vec::new()),
            vec![exit],
            clock.at(9_000),
        ));
        assert_eq!(ends.len(), 2);
        assert_eq!(report(&mut kcm, clock.at(9_000)).failed_starts, 0);
    }

    #[test]
    fn a_component_that_cannot_be_submitted_ends_at_once_with_the_error() {
        let clock = Clock::new();
        let mut kcm = core();
        let g = job("g");
        let spec = spec(&g, 2, 64);
        let result = Err(failure("qsub -pe make 64"));
        let effects = step(
            &mut kcm,
            Event::ComponentSubmitted { spec, result },
            clock.at(0),
        );
        let [
            Effect::Tell {
                job,
                message: ControlMsg::ComponentEnded(outcome),
            },
        ] = effects.as_slice()
        else {
            panic!("{effects:?}");
        };
        assert_eq!((job, outcome.component, outcome.exit_code), (&g, 2, None));
        assert_eq!(
            outcome.stderr.data,
            b"qsub -pe make 64: exit status: 1: denied"
        );
        assert!(report(&mut kcm, clock.at(0)).error.is_some());
        assert!(
            ended(&poll(&mut kcm, cluster(4, Vec::new()), clock.at(120_000))).is_empty(),
            "not tracked"
        );
    }

    #[test]
    fn a_polls_report_carries_the_answers_to_its_own_commands() {
        let clock = Clock::new();
        let mut kcm = core();
        let a = job("a");
        let waiting = cluster(4, vec![placeholder("3.1", &a, false)]);
        poll(&mut kcm, waiting.clone(), clock.at(0));
        let now = clock.at(61_000);
        kcm.handle(
            Event::Polled {
                snapshot: Ok(waiting),
                spooled: Vec::new(),
                started: Vec::new(),
            },
            now,
        );
        let mut sent = Vec::new();
        while let Some(effect) = kcm.poll_effect(now) {
            if let Effect::Remove { .. } = effect {
                kcm.handle(Event::Removed(Err(failure("qdel 3.1"))), now);
            }
            sent.push(effect);
        }
        let reported = sent.iter().find_map(|e| match e {
            Effect::ToScheduler(SchedulerMsg::ClusterStatus(report)) => Some(report.clone()),
            _ => None,
        });
        assert_eq!(
            reported.and_then(|r| r.error).as_deref(),
            Some("qdel 3.1: exit status: 1: denied"),
            "{sent:?}"
        );
    }

    #[test]
    fn a_jobs_end_forgets_its_launchers_settings() {
        let clock = Clock::new();
        let mut kcm = core();
        let a = job("a");
        let effects = message(&mut kcm, KcmMsg::JobEnded { job: a.clone() }, clock.at(0));
        assert!(
            effects
                .iter()
                .any(|e| matches!(e, Effect::ForgetLauncherSettings { job } if *job == a)),
            "{effects:?}"
        );
    }

    #[test]
    fn placeholders_and_components_waiting_too_long_are_withdrawn() {
        let clock = Clock::new();
        let mut kcm = core();
        let (a, g) = (job("a"), job("g"));
        let waiting = Snapshot {
            components: vec![ComponentRun {
                running: false,
                ..component("9", &g, 1, 2)
            }],
            ..cluster(
                4,
                vec![placeholder("3.1", &a, true), placeholder("3.2", &a, false)],
            )
        };
        assert!(removed(&poll(&mut kcm, waiting.clone(), clock.at(0))).is_empty());
        assert!(removed(&poll(&mut kcm, waiting.clone(), clock.at(60_000))).is_empty());
        let effects = poll(&mut kcm, waiting.clone(), clock.at(61_000));
        assert_eq!(removed(&effects), [vec!["3.2".to_owned(), "9".to_owned()]]);
        let ends = ended(&effects);
        assert!(
            ends.is_empty(),
            "a withdrawn component is told, not reported from the spool"
        );
        assert!(effects.iter().any(|e| matches!(
            e,
            Effect::Tell { job, message: ControlMsg::ComponentWithdrawn { component: 1, reason, .. } }
                if job == &g && reason.contains("longer than")
        )));
        let r = report(&mut kcm, clock.at(61_000));
        assert_eq!(r.failed_starts, 1, "counted as a failed start");
        assert_eq!(
            r.idle_slots, 0,
            "one slot runs a launcher; the withdrawn three are not offered again"
        );
        assert!(r.error.unwrap().contains("longer than"));
        // A successful submit does not clear it; a placeholder that runs does.
        step(
            &mut kcm,
            Event::LaunchersSubmitted {
                job: a.clone(),
                grant: GrantId::new(8),
                requested: 1,
                result: Ok(1),
            },
            clock.at(62_000),
        );
        assert_eq!(report(&mut kcm, clock.at(62_000)).failed_starts, 1);
        let started = cluster(
            4,
            vec![placeholder("3.1", &a, true), placeholder("4.1", &a, true)],
        );
        poll(&mut kcm, started, clock.at(63_000));
        assert_eq!(report(&mut kcm, clock.at(63_000)).failed_starts, 0);
    }

    #[test]
    fn caps_limit_the_slots_offered() {
        let clock = Clock::new();
        let capped = |max_scavenged, reserve_hosts: &[&str]| {
            KcmCore::new(CoreConfig {
                speed: 1.0,
                max_scavenged,
                reserve_hosts: reserve_hosts.iter().map(|h| (*h).to_owned()).collect(),
                ..core().config
            })
        };
        let a = job("a");
        let grid = |placeholders: Vec<Placeholder>| Snapshot {
            hosts: vec![Host::new("n1", 4), Host::new("n2", 4), Host::new("n3", 4)],
            placeholders,
            ..Snapshot::default()
        };
        let idle = |kcm: &mut KcmCore, snapshot| {
            poll(kcm, snapshot, clock.at(0));
            report(kcm, clock.at(0)).idle_slots
        };
        let two = vec![placeholder("1.1", &a, true), placeholder("1.2", &a, false)];
        assert_eq!(idle(&mut capped(None, &[]), grid(two.clone())), 10);
        assert_eq!(
            idle(
                &mut capped(Some(crate::Cap::Slots(5)), &[]),
                grid(two.clone())
            ),
            3
        );
        assert_eq!(
            idle(
                &mut capped(Some(crate::Cap::Fraction(0.5)), &[]),
                grid(two.clone())
            ),
            4
        );
        assert_eq!(
            idle(&mut capped(None, &["n3.grid.example"]), grid(two.clone())),
            6,
            "n3's slots are not offered"
        );
        assert_eq!(
            idle(&mut capped(Some(crate::Cap::Slots(1)), &[]), grid(two)),
            0,
            "never below what is held"
        );
    }

    #[test]
    fn the_report_counts_slots_per_job_and_for_the_cluster() {
        let clock = Clock::new();
        let mut kcm = core();
        let (a, b, g) = (job("a"), job("b"), job("g"));
        let node = Placeholder {
            slots: 4,
            ..placeholder("2.1", &b, true)
        };
        let snapshot = Snapshot {
            components: vec![
                component("8", &g, 0, 4),
                ComponentRun {
                    running: false,
                    ..component("9", &g, 1, 2)
                },
            ],
            ..busy(
                16,
                3,
                4,
                vec![
                    placeholder("1.1", &a, true),
                    placeholder("1.2", &a, true),
                    placeholder("1.3", &a, false),
                    node,
                ],
            )
        };
        poll(&mut kcm, snapshot, clock.at(0));
        let r = report(&mut kcm, clock.at(1_234));
        assert_eq!((r.cluster.as_str(), r.backend.as_str()), ("c1", "sge"));
        assert_eq!((r.total_slots, r.local_slots, r.grid_slots), (16, 3, 4));
        assert_eq!(
            r.idle_slots, 0,
            "16 - 3 local - 4 grid - 7 claimed by placeholders - 2 by the waiting component"
        );
        assert_eq!(r.local_waiting, 0);
        assert_eq!(
            r.jobs,
            [
                (
                    a,
                    Holding {
                        running: 2,
                        pending: 1
                    }
                ),
                (
                    b,
                    Holding {
                        running: 4,
                        pending: 0
                    }
                ),
            ]
            .into()
        );
        assert_eq!(
            r.grid,
            [(
                g,
                Holding {
                    running: 4,
                    pending: 2
                }
            )]
            .into()
        );
        assert_eq!((r.error, r.failed_starts), (None, 0));
        assert_eq!(r.at, 1_700_000_001_234);
    }

    /// A job named like gleaner's, as a reading leaves it: one batch id
    /// of one slot, running on `n1` or waiting (on hold: no local job).
    fn named(id: &str, job: &JobId, component: Option<u32>, owner: &str, runs: bool) -> NamedJob {
        NamedJob {
            job: job.clone(),
            component,
            owner: owner.into(),
            ids: vec![id.into()],
            slots: 1,
            hosts: if runs {
                vec![("n1".into(), 1)]
            } else {
                Vec::new()
            },
            waiting: None,
            problem: None,
            needs: Default::default(),
            timing: Default::default(),
        }
    }

    /// One host, `n1`, of 4 slots, and jobs named like gleaner's.
    fn reading(named: Vec<NamedJob>) -> Snapshot {
        Snapshot {
            named,
            ..cluster(4, Vec::new())
        }
    }

    fn grant(job: &JobId, grant: u64, owner: &str) -> KcmMsg {
        KcmMsg::StartLaunchers {
            job: job.clone(),
            grant: GrantId::new(grant),
            slots: 1,
            task_slots: 1,
            task_needs: Default::default(),
            owner: owner.into(),
            credentials: Some(launcher_account()),
        }
    }

    /// Many users; the broker user `alice@lab` is the Unix account alice.
    fn many_users() -> KcmCore {
        let mut users = Users::default();
        users.accounts.insert("alice@lab".into(), "alice".into());
        KcmCore::new(CoreConfig {
            speed: 1.0,
            users,
            ..core().config
        })
    }

    #[test]
    fn launchers_and_components_run_as_their_owners_account_where_users_are_kept_apart() {
        let clock = Clock::new();
        let mut kcm = many_users();
        let h = job("h");
        poll(&mut kcm, reading(Vec::new()), clock.at(0));
        let accounts = |effects: &[Effect]| -> Vec<Option<String>> {
            effects
                .iter()
                .filter_map(|e| match e {
                    Effect::SubmitLaunchers { account, .. }
                    | Effect::SubmitComponent { account, .. } => Some(account.clone()),
                    _ => None,
                })
                .collect()
        };
        let effects = message(&mut kcm, grant(&h, 1, "alice@lab"), clock.at(0));
        assert_eq!(accounts(&effects), [Some("alice".to_owned())]);
        let submit = KcmMsg::SubmitComponent(ComponentSpec {
            needs: Default::default(),
            owner: "bob".into(),
            ..spec(&job("g"), 0, 1)
        });
        let effects = message(&mut kcm, submit, clock.at(0));
        assert_eq!(
            accounts(&effects),
            [Some("bob".to_owned())],
            "unmapped: the same name"
        );
        let mut single = single_user_core();
        poll(&mut single, reading(Vec::new()), clock.at(0));
        let mut order = grant(&h, 2, "alice@lab");
        if let KcmMsg::StartLaunchers { credentials, .. } = &mut order {
            *credentials = None;
        }
        let effects = message(&mut single, order, clock.at(0));
        assert_eq!(accounts(&effects), [None], "one user: the kcm's own");
    }

    #[test]
    fn a_component_submitted_as_its_owner_is_gleaners_and_no_one_elses_is() {
        let clock = Clock::new();
        let mut kcm = many_users();
        let h = job("h");
        poll(&mut kcm, reading(Vec::new()), clock.at(0));
        let submit = KcmMsg::SubmitComponent(ComponentSpec {
            needs: Default::default(),
            owner: "alice@lab".into(),
            ..spec(&h, 0, 1)
        });
        message(&mut kcm, submit, clock.at(0));
        let hers = named("9", &h, Some(0), "alice", true);
        let bobs = named("10", &h, Some(1), "bob", true);
        poll(&mut kcm, reading(vec![hers, bobs]), clock.at(1_000));
        let r = report(&mut kcm, clock.at(1_000));
        assert_eq!(
            r.grid[&h],
            Holding {
                running: 1,
                pending: 0
            },
            "alice's is the job's; bob's is his own local job"
        );
        assert_eq!(r.local_slots, 1);
    }

    /// Bob names a job of his like a component of Alice's grid job before
    /// the kcm's first reading, which adopts it for want of an order: her
    /// order still has her component submitted, and his is never taken
    /// for it (nor withdrawn as hers waiting too long).
    #[test]
    fn a_component_named_by_another_before_the_first_reading_is_not_the_jobs() {
        let clock = Clock::new();
        let mut kcm = many_users();
        let h = job("h");
        let bobs = named("10", &h, Some(0), "bob", false);
        poll(&mut kcm, reading(vec![bobs.clone()]), clock.at(0));
        let submit = KcmMsg::SubmitComponent(ComponentSpec {
            needs: Default::default(),
            owner: "alice@lab".into(),
            ..spec(&h, 0, 1)
        });
        let effects = message(&mut kcm, submit, clock.at(0));
        assert!(
            effects
                .iter()
                .any(|e| matches!(e, Effect::SubmitComponent { .. })),
            "{effects:?}"
        );
        let effects = poll(&mut kcm, reading(vec![bobs]), clock.at(120_000));
        assert!(removed(&effects).is_empty(), "{effects:?}");
        assert!(
            !effects.iter().any(|e| matches!(
                e,
                Effect::Tell {
                    message: ControlMsg::ComponentWithdrawn { .. },
                    ..
                }
            )),
            "{effects:?}"
        );
    }

    #[test]
    fn another_owners_jobs_named_like_gleaners_are_his_local_jobs() {
        let clock = Clock::new();
        let mut kcm = many_users();
        let (a, g) = (job("a"), job("g"));
        poll(&mut kcm, reading(Vec::new()), clock.at(0));
        message(&mut kcm, grant(&a, 1, "alice@lab"), clock.at(0));
        let submitted = Event::ComponentSubmitted {
            spec: spec(&g, 0, 1),
            result: Ok(()),
        };
        step(&mut kcm, submitted, clock.at(0));
        let hers = named("5.1", &a, None, "alice", true);
        let gleaners = named("8", &g, Some(0), "root", true);
        // Bob's: a held `gl-<a>`, a running `gg-<g>.0`.
        let held = named("6", &a, None, "bob", false);
        let fake = named("7", &g, Some(0), "bob", true);
        let all = vec![hers.clone(), held.clone(), fake, gleaners.clone()];
        assert!(removed(&poll(&mut kcm, reading(all), clock.at(1_000))).is_empty());
        let r = report(&mut kcm, clock.at(1_000));
        let one = Holding {
            running: 1,
            pending: 0,
        };
        assert_eq!((r.jobs[&a], r.grid[&g]), (one, one));
        assert_eq!(
            (r.local_slots, r.grid_slots, r.idle_slots),
            (1, 1, 1),
            "bob's component is a local job; his held one takes nothing"
        );

        // Bob's component ends; g's does not, nor is anything reported.
        let without = vec![hers.clone(), held.clone(), gleaners.clone()];
        assert!(ended(&poll(&mut kcm, reading(without.clone()), clock.at(2_000))).is_empty());
        // His placeholder waits far longer than max_pending, then runs
        // and ends without a launcher: never withdrawn, no failed start.
        let effects = poll(&mut kcm, reading(without), clock.at(120_000));
        assert!(removed(&effects).is_empty(), "{effects:?}");
        let ran = vec![
            hers.clone(),
            named("6", &a, None, "bob", true),
            gleaners.clone(),
        ];
        poll(&mut kcm, reading(ran), clock.at(121_000));
        let left = vec![hers.clone(), held.clone(), gleaners.clone()];
        poll(&mut kcm, reading(left.clone()), clock.at(122_000));
        let r = report(&mut kcm, clock.at(122_000));
        assert_eq!((r.failed_starts, r.error), (0, None));

        // Alice's job ends: hers go (after the grace), his never.
        let effects = message(
            &mut kcm,
            KcmMsg::JobEnded { job: a.clone() },
            clock.at(123_000),
        );
        assert!(removed(&effects).is_empty(), "{effects:?}");
        let effects = poll(&mut kcm, reading(left.clone()), clock.at(133_000));
        assert_eq!(removed(&effects), [["5.1"]]);
        // Her last placeholder gone, her job's account is forgotten: a
        // `gl-<a>` of hers now is one of her local jobs.
        poll(
            &mut kcm,
            reading(vec![held.clone(), gleaners.clone()]),
            clock.at(134_000),
        );
        let late = vec![named("9.1", &a, None, "alice", true), held, gleaners];
        assert!(removed(&poll(&mut kcm, reading(late), clock.at(135_000))).is_empty());
        let r = report(&mut kcm, clock.at(135_000));
        assert!(r.jobs.is_empty(), "{:?}", r.jobs);
        assert_eq!(r.local_slots, 1);
    }

    #[test]
    fn a_restarted_kcm_adopts_placeholders_of_one_owner_per_job() {
        let clock = Clock::new();
        let mut kcm = many_users();
        let (b, c, d) = (job("b"), job("c"), job("d"));
        let found = vec![
            named("1.1", &b, None, "carol", true),
            named("1.2", &b, None, "carol", false),
            named("2.1", &c, None, "alice", true),
            named("3", &c, None, "bob", false),
        ];
        poll(&mut kcm, reading(found.clone()), clock.at(0));
        let r = report(&mut kcm, clock.at(0));
        let jobs: Vec<&JobId> = r.jobs.keys().collect();
        assert_eq!(jobs, [&b], "two owners claim c: neither is adopted");
        assert_eq!(r.local_slots, 1, "c's running one counts as a local job");

        // c's grant says whose it is; d's placeholder comes after the
        // first reading, without a grant: not gleaner's.
        message(&mut kcm, grant(&c, 1, "alice@lab"), clock.at(100));
        let mut later = found;
        later.push(named("4.1", &d, None, "dave", true));
        poll(&mut kcm, reading(later), clock.at(1_000));
        let r = report(&mut kcm, clock.at(1_000));
        let held: Vec<(&JobId, u32, u32)> = r
            .jobs
            .iter()
            .map(|(job, h)| (job, h.running, h.pending))
            .collect();
        assert_eq!(held, [(&b, 1, 1), (&c, 1, 0)]);
        assert_eq!(r.local_slots, 1, "d's");
    }

    #[test]
    fn with_one_user_every_placeholder_is_the_kcms_own_accounts() {
        let clock = Clock::new();
        let mut kcm = KcmCore::new(CoreConfig {
            speed: 1.0,
            account: "gleaner".into(),
            users: Users {
                single: Some(true),
                ..Users::default()
            },
            ..core().config
        });
        let a = job("a");
        message(&mut kcm, grant(&a, 1, "alice"), clock.at(0));
        let found = vec![
            named("1.1", &a, None, "gleaner", true),
            named("2.1", &a, None, "alice", true),
            named("3", &a, Some(0), "alice", true),
        ];
        poll(&mut kcm, reading(found), clock.at(0));
        let r = report(&mut kcm, clock.at(0));
        assert_eq!(
            r.jobs[&a],
            Holding {
                running: 1,
                pending: 0
            }
        );
        assert!(r.grid.is_empty());
        assert_eq!(r.local_slots, 2);
    }
}
