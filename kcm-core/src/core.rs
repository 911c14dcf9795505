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

mod accounts;
mod components;
mod starts;
mod withdrawals;

#[cfg(test)]
mod tests;
