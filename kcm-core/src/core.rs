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
mod tests;
