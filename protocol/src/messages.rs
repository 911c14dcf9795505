//! Every message gleaner's components exchange, one type per queue.
//!
//! Bodies are MessagePack maps (rmp-serde `to_vec_named`) inside an
//! [`Envelope`]; fields added later carry `#[serde(default)]` so that mixed
//! versions keep talking. Enums are tagged with a `kind` field, which is also
//! the AMQP `type` property, so the management UI shows what a message is.

use std::collections::BTreeMap;

use gleaner_manifest::{Addition, JobId, JobKind, Manifest, Moldable, Needs, Priority, TaskShape};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{ClusterName, GrantId, LauncherId};

/// Version of the wire format; bumped only for changes old readers cannot skip.
pub const PROTOCOL_VERSION: u16 = 1;

/// What travels in every message body: the protocol version, who sent it, and the message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope<M> {
    pub v: u16,
    pub from: String,
    pub msg: M,
}

/// A message body type; `kind` becomes the AMQP `type` property. For tagged
/// enums it is the serde tag, so the management UI and the body agree (the
/// tests hold every variant to that).
pub trait Message: Serialize + DeserializeOwned + Send + Sync {
    fn kind(&self) -> &'static str;
}

/// Milliseconds since the Unix epoch; the unit of every timestamp on the wire.
pub type Millis = u64;

// ---------------------------------------------------------------- gleaner.submit

/// A manifest on `gleaner.submit`, as `gleaner submit` sends it. Manifests
/// published by hand as JSON carry no envelope; the runner names those itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Submission {
    pub job: JobId,
    pub manifest: Manifest,
    pub submitted_at: Millis,
}

impl Message for Submission {
    fn kind(&self) -> &'static str {
        "submit"
    }
}

// -------------------------------------------------------------- gleaner.requests

/// What a user asks of gleaner, through the `gleaner.user` exchange to the
/// active scheduler, which answers to the AMQP `reply_to`. Who asks is the
/// message's `user_id`, which the broker checks against the connection's
/// user; a user sees and cancels their own jobs only (admins: all).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RequestMsg {
    /// `gleaner status`: answered with a [`StatusReply`]; with `job`, of
    /// that job alone, running or ended.
    Status {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job: Option<JobId>,
    },
    /// `gleaner cancel`: answered with an [`ActionReply`].
    Cancel { job: JobId },
    /// `gleaner submit --job JOB`: tasks for an open job, answered with an
    /// [`ActionReply`].
    AddTasks { job: JobId, addition: Addition },
    /// `gleaner close`: an open job takes no more tasks, and ends once
    /// they have; answered with an [`ActionReply`].
    Close { job: JobId },
    /// `gleaner logs JOB TASK --follow`: the task's output as it is
    /// printed, for [`FOLLOW_LEASE_MS`] (the asker renews it sooner).
    /// Answered with an [`ActionReply`] as for a cancel, then with
    /// [`Followed::Output`] pieces from the job's runner.
    Follow { job: JobId, task: u64 },
}

impl Message for RequestMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Status { .. } => "status",
            Self::Cancel { .. } => "cancel",
            Self::AddTasks { .. } => "add_tasks",
            Self::Close { .. } => "close",
            Self::Follow { .. } => "follow",
        }
    }
}

/// How long a follow lasts unless renewed: a follower that went away
/// costs the runner and the launcher this long at most.
pub const FOLLOW_LEASE_MS: u64 = 10_000;

/// The most bytes of one stream in one [`OutputPiece`]: a task printing
/// faster than a follower is sent skips ahead.
pub const MAX_PIECE_BYTES: usize = 64 * 1024;

/// What a follower hears on its direct reply-to: the scheduler's answer
/// (an [`ActionReply`], whose variants these first three are), then the
/// task's output as its runner relays it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Followed {
    Accepted {},
    NotRunning {},
    Refused { reason: String },
    Output(OutputPiece),
}

impl Message for Followed {
    fn kind(&self) -> &'static str {
        match self {
            Self::Output(_) => "output",
            _ => "action_reply",
        }
    }
}

/// Output a followed task printed since the last piece, from the launcher
/// running it, through its runner to the followers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputPiece {
    pub task: u64,
    /// The run it is from, with `preemptions` and `launcher`: a task run
    /// again (retried, preempted, or redelivered elsewhere) prints from
    /// the start.
    pub attempt: u32,
    #[serde(default)]
    pub preemptions: u32,
    #[serde(default)]
    pub launcher: String,
    pub stdout: StreamPiece,
    pub stderr: StreamPiece,
    /// The run ended: nothing more comes of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended: bool,
}

impl OutputPiece {
    /// Within [`MAX_PIECE_BYTES`] a stream: a larger one is forged.
    pub fn is_bounded(&self) -> bool {
        self.stdout.data.len() <= MAX_PIECE_BYTES && self.stderr.data.len() <= MAX_PIECE_BYTES
    }
}

/// Bytes of a stream, from `offset` (bytes the run printed before them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPiece {
    pub offset: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

impl StreamPiece {
    /// The bytes of a stream from offset `from` on, given the last bytes
    /// kept (`data`) and how many came before them: at most
    /// [`MAX_PIECE_BYTES`], the last ones (a follower far behind skips
    /// ahead).
    pub fn since(data: &[u8], dropped: u64, from: u64) -> Self {
        let end = dropped.saturating_add(data.len() as u64);
        let start = from
            .max(dropped)
            .max(end.saturating_sub(MAX_PIECE_BYTES as u64))
            .min(end);
        let skip = usize::try_from(start - dropped).unwrap_or(data.len());
        Self {
            offset: start,
            data: data.get(skip..).unwrap_or_default().to_vec(),
        }
    }

    /// The end of what a run kept of a stream, as a piece.
    pub fn rest_of(captured: &Captured) -> Self {
        Self::since(&captured.data, captured.dropped, 0)
    }
}

/// The scheduler's answer to [`RequestMsg::Cancel`], `AddTasks` and `Close`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ActionReply {
    /// The job's runner has been told.
    Accepted {},
    /// No such job is running (it ended, or no runner has it yet).
    NotRunning {},
    /// The job is someone else's.
    Refused { reason: String },
}

impl Message for ActionReply {
    fn kind(&self) -> &'static str {
        "action_reply"
    }
}

// ------------------------------------------------------------- gleaner.scheduler

/// The scheduler's inbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SchedulerMsg {
    /// A runner's periodic report on one job; also how a job registers.
    JobUpdate(JobReport),
    /// The job ended; its slots may go to others.
    JobDone { job: JobId },
    /// A kcm's periodic report on its cluster.
    ClusterStatus(ClusterReport),
    /// A runner's answer to a grow offer: it took `accepted` of the offered slots.
    GrowAck {
        grant: GrantId,
        job: JobId,
        cluster: ClusterName,
        accepted: u32,
    },
}

impl Message for SchedulerMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::JobUpdate(_) => "job_update",
            Self::JobDone { .. } => "job_done",
            Self::ClusterStatus(_) => "cluster_status",
            Self::GrowAck { .. } => "grow_ack",
        }
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Tasks are being published.
    Starting,
    /// A grid job waiting to be placed.
    Waiting,
    Running,
    /// Every task has a final state.
    Done,
    Cancelled,
}

/// Task counts of a job. `pending + running + finished() == total`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCounts {
    pub total: u64,
    pub pending: u64,
    pub running: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub timed_out: u64,
    pub lost: u64,
    pub cancelled: u64,
}

impl TaskCounts {
    /// Tasks with a final state.
    pub fn finished(&self) -> u64 {
        [self.failed, self.timed_out, self.lost, self.cancelled]
            .into_iter()
            .fold(self.succeeded, u64::saturating_add)
    }

    /// Tasks that still need a slot, now or later.
    pub fn unfinished(&self) -> u64 {
        self.total.saturating_sub(self.finished())
    }

    /// Work that holds or wants a slot: pending and running, which for a
    /// job with a final step counts the step too (not one of `total`).
    pub fn to_run(&self) -> u64 {
        self.pending.saturating_add(self.running)
    }
}

/// A runner's view of one job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobReport {
    pub job: JobId,
    /// The user who submitted it (the broker-checked `user_id`).
    #[serde(default)]
    pub owner: String,
    pub kind: JobKind,
    pub priority: Priority,
    pub state: JobState,
    pub runner: String,
    pub tasks: TaskCounts,
    /// Slots of the launchers that announced themselves, per cluster.
    pub launchers: BTreeMap<ClusterName, u32>,
    /// Finished tasks per second over the last minute.
    pub throughput: f64,
    pub preemptions: u64,
    pub started_at: Millis,
    pub results: String,
    /// Grid jobs: the slots of each component still to place, in component
    /// order (all of them until the job is placed; one withdrawn from a
    /// cluster's queue is placed again).
    #[serde(default)]
    pub components: Vec<u32>,
    /// The most slots the job's launchers may hold (`max_launchers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_slots: Option<u32>,
    /// Why the job is stalled, if it is (its results cannot be written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Its weight in fair shares: twice the slots of a weight-1 job at 2.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: u32,
    /// Slots each of its tasks takes (a manifest's `slots`).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub task_slots: u32,
    /// Memory and GPUs each of its tasks needs.
    #[serde(default, skip_serializing_if = "Needs::is_none")]
    pub task_needs: Needs,
    /// Tasks may still be added to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open: bool,
    /// Grid jobs: how they gathered their components.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gathering: Option<Gathering>,
    /// Grid jobs: the input files every component reads (the manifest's
    /// `inputs`), once, while some component is still to place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// Grid jobs: the input files of each component still to place besides
    /// `inputs`, in the order of `components` (empty when none has any).
    /// A report of an older runner held `inputs` in each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub component_inputs: Vec<Vec<String>>,
    /// Grid jobs: of the components still to place, in the order of
    /// `components` (which holds their fewest slots), the moldable ones'
    /// ranges and walltimes (empty when none is moldable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moldable: Vec<Option<Moldable>>,
    /// Grid jobs: clusters where this run's components did not start when
    /// claimed; the components still to place go elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid: Vec<ClusterName>,
}

impl JobReport {
    /// The input files of each component still to place, the job's and
    /// its own (empty when none has any).
    pub fn inputs_by_component(&self) -> Vec<Vec<String>> {
        if self.inputs.is_empty() {
            return self.component_inputs.clone();
        }
        (0..self.components.len())
            .map(|i| {
                let own = self.component_inputs.get(i).map_or(&[][..], Vec::as_slice);
                self.inputs.iter().chain(own).cloned().collect()
            })
            .collect()
    }

    /// The report without the inputs, which only placement reads: what
    /// watchers, the history and `gleaner status` get.
    pub fn without_inputs(mut self) -> Self {
        self.inputs = Vec::new();
        self.component_inputs = Vec::new();
        self
    }

    /// One task's slots and needs.
    pub fn task_shape(&self) -> TaskShape {
        TaskShape {
            slots: self.task_slots,
            needs: self.task_needs,
        }
    }
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A kcm's view of its cluster. Slots held by gleaner are counted per job;
/// everything else in the batch system is "local".
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterReport {
    pub cluster: ClusterName,
    pub backend: String,
    pub total_slots: u32,
    /// Slots neither local jobs nor gleaner use, as far as sweeps may
    /// have them (the admins' `max_scavenged` and `reserve_hosts`).
    pub idle_slots: u32,
    /// Slots neither local jobs nor gleaner use, whatever the caps on
    /// scavenging: room for grid jobs' components, which run as ordinary
    /// batch jobs. `None` from a kcm that does not say (then `idle_slots`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_slots: Option<u32>,
    /// Which grid jobs' input files its nodes see.
    #[serde(default, skip_serializing_if = "InputAccess::is_default")]
    pub inputs: InputAccess,
    /// Slots running local (non-gleaner) jobs.
    pub local_slots: u32,
    /// Slots that waiting local jobs ask for.
    pub local_waiting: u32,
    /// Of those, the slots of jobs the batch system starts before any
    /// placeholder submitted now, backfilling placeholders only around
    /// them (Slurm, gleaner's partition in a lower priority tier): they
    /// need not hold back offers.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub local_waiting_first: u32,
    /// Slots running grid job components.
    pub grid_slots: u32,
    /// Slots held by each scavenging job's placeholders.
    pub jobs: BTreeMap<JobId, Holding>,
    /// Slots held by each grid job's components.
    #[serde(default)]
    pub grid: BTreeMap<JobId, Holding>,
    /// Grants the kcm has acted on since its previous report.
    #[serde(default)]
    pub applied_grants: Vec<GrantId>,
    /// The last batch-system failure, if the last attempt failed.
    #[serde(default)]
    pub error: Option<String>,
    /// Consecutive launcher start failures that are the cluster's (of two
    /// accounts or more, or of the one user): they exclude it.
    #[serde(default)]
    pub failed_starts: u32,
    /// Consecutive failures of each job's account, while they bar its
    /// jobs here: one user's failures are theirs, not the cluster's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub job_failures: BTreeMap<JobId, u32>,
    pub at: Millis,
    /// The cluster's execution hosts (empty from a kcm that does not say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostReport>,
    /// Memory and GPUs nobody holds, all hosts together, where the batch
    /// system counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_gpus: Option<u32>,
    /// When grid components would complete here (seed 002's ECT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foresight: Option<Foresight>,
}

impl ClusterReport {
    /// Slots of waiting local jobs that a placeholder submitted now could
    /// hold up: gleaner makes room for them, and offers none of theirs.
    pub fn local_waiting_ahead(&self) -> u32 {
        self.local_waiting.saturating_sub(self.local_waiting_first)
    }
}

/// How an estimate was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EctSource {
    /// The batch system's own prediction (Slurm's backfill scheduler).
    BatchSystem,
    /// The kcm's model: running jobs end at their time limits, waiting ones
    /// start in queue order by conservative backfilling.
    #[default]
    Model,
}

/// What a kcm foresees of its cluster, from the report's `at` on: enough
/// for the scheduler to estimate any component's completion time here
/// without asking.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Foresight {
    /// The cluster's speed: a walltime here is the manifest's divided by it.
    pub speed: f64,
    /// Free slots over time with gleaner's waiting components left out:
    /// `(ms after at, free)` steps, ascending (placeholders count as free:
    /// they give way).
    pub free: Vec<(u64, u32)>,
    /// Each grid component waiting here, oldest first.
    pub waiting: Vec<WaitingComponent>,
}

/// A grid component waiting in a cluster's batch queue, and when it would
/// start there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingComponent {
    pub job: JobId,
    pub component: u32,
    pub slots: u32,
    /// Its predicted start, ms after the report's `at`.
    pub start_ms: u64,
    /// Its time limit here (`None`: it has none).
    pub walltime_ms: Option<u64>,
    pub source: EctSource,
}

/// Slots of one execution host, as its cluster's kcm last saw them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostReport {
    pub name: String,
    pub slots: u32,
    /// Held by local (non-gleaner) jobs.
    pub local: u32,
    /// Held by grid job components.
    pub grid: u32,
    /// Held by running launchers.
    pub scavenged: u32,
    /// The scavenged slots by job, so that a grid job's component that
    /// needs this host shrinks only the jobs with launchers here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub jobs: BTreeMap<JobId, u32>,
    /// Memory and GPUs nobody holds here, where the batch system counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_gpus: Option<u32>,
    /// Memory and GPUs gleaner's launchers hold here.
    #[serde(default, skip_serializing_if = "Needs::is_none")]
    pub scavenged_needs: Needs,
    /// GPUs a launcher here found claimed, lately, while the batch system
    /// counted them free, when more were claimed than gleaner's launchers
    /// here hold: a process outside gleaner holds them (all of them, or
    /// those beyond gleaner's, where its launchers run too). Those are not
    /// in `free_gpus`: for the admin to see, counted against no one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub squatted_gpus: Vec<String>,
}

impl HostReport {
    /// Slots nobody uses right now.
    pub fn free(&self) -> u32 {
        self.slots.saturating_sub(
            self.local
                .saturating_add(self.grid)
                .saturating_add(self.scavenged),
        )
    }
}

/// Slots a job holds on one cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holding {
    pub running: u32,
    pub pending: u32,
}

impl Holding {
    pub fn total(&self) -> u32 {
        self.running.saturating_add(self.pending)
    }

    /// Counts `slots` more, running or pending; batch-system counts
    /// saturate rather than wrap.
    pub fn add(&mut self, running: bool, slots: u32) {
        let count = if running {
            &mut self.running
        } else {
            &mut self.pending
        };
        *count = count.saturating_add(slots);
    }
}

/// The scheduler's answer to [`RequestMsg::Status`]: the clusters, and
/// the jobs the asking user may see.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StatusReply {
    pub scheduler: String,
    pub policy: String,
    pub clusters: Vec<ClusterView>,
    pub jobs: Vec<JobReport>,
    /// Grid jobs not placed yet: how long they have been trying.
    #[serde(default)]
    pub placements: Vec<GridPlacement>,
    /// Jobs left out: other users' (their slots still show in the clusters).
    #[serde(default)]
    pub hidden: u32,
    /// Ended jobs the user may see, the latest first: the one asked for,
    /// or the most recent.
    #[serde(default)]
    pub ended: Vec<EndedJob>,
}

/// A job that ended, or a submission a runner refused, and when.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EndedJob {
    pub job: JobId,
    /// Its owner; of a refused submission, its sender.
    pub owner: String,
    pub ended_at: Millis,
    pub ending: Ending,
}

/// How a job ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Ending {
    /// It ran: its last report.
    Done(Box<JobReport>),
    /// A runner refused it, for this reason.
    Refused { reason: String },
}

impl EndedJob {
    /// What the history keeps of an event: a job's end or a refusal.
    pub fn of(event: &Event, ended_at: Millis) -> Option<Self> {
        let (job, owner, ending) = match event {
            Event::Done(report) => {
                let mut report = report.clone();
                // Nothing is left to place of a job that ended.
                report.components = Vec::new();
                (
                    report.job.clone(),
                    report.owner.clone(),
                    Ending::Done(Box::new(report)),
                )
            }
            Event::Rejected { live_job: true, .. } => return None,
            Event::Rejected {
                job, owner, reason, ..
            } => (
                job.parse().ok()?,
                owner.clone(),
                Ending::Refused {
                    reason: reason.clone(),
                },
            ),
            Event::Progress(_) | Event::Cluster(_) => return None,
        };
        Some(Self {
            job,
            owner,
            ended_at,
            ending,
        })
    }

    /// Its last report, if it ran.
    pub fn report(&self) -> Option<&JobReport> {
        match &self.ending {
            Ending::Done(report) => Some(report),
            Ending::Refused { .. } => None,
        }
    }
}

impl Message for StatusReply {
    fn kind(&self) -> &'static str {
        "status_reply"
    }
}

/// A grid job's placement so far, as the scheduler keeps it: in no report,
/// so it is handed to the scheduler that takes over ([`GridSnapshot`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GridPlacement {
    pub job: JobId,
    /// The placement queue it waits in: its priority, upgraded after tries.
    pub queue: Priority,
    /// Rounds in which it could not be placed.
    pub tries: u32,
    /// It was placed this long ago, and its runner has not answered yet.
    #[serde(default)]
    pub placed_ms_ago: Option<Millis>,
    /// Why its last try did not place it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unplaced_because: Option<String>,
}

/// Slots promised to a placed grid job that its cluster does not show yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GridReservation {
    pub job: JobId,
    pub cluster: ClusterName,
    pub slots: u32,
    pub age_ms: Millis,
}

// ------------------------------------------------------------ gleaner.scheduler.grid

/// The active scheduler's grid bookkeeping (the latest only is kept): what
/// no report carries, so that a scheduler taking over goes on counting tries
/// and keeps promised slots promised instead of starting again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GridSnapshot {
    /// When it was taken; its ages count from here.
    pub taken_ms: Millis,
    pub placements: Vec<GridPlacement>,
    pub reservations: Vec<GridReservation>,
}

impl Message for GridSnapshot {
    fn kind(&self) -> &'static str {
        "grid_snapshot"
    }
}

/// A cluster as the scheduler sees it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterView {
    pub report: ClusterReport,
    pub excluded: bool,
    /// No report for longer than the staleness limit.
    pub stale: bool,
}

// ------------------------------------------------------------ gleaner.kcm.<cluster>

/// A cluster manager's inbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KcmMsg {
    /// Submit launchers for `job` covering `slots` slots (one placeholder
    /// array job), as `owner`'s Unix account where users are kept apart.
    StartLaunchers {
        job: JobId,
        grant: GrantId,
        slots: u32,
        /// Slots each of the job's tasks takes: every launcher holds a
        /// multiple of it.
        #[serde(default = "one", skip_serializing_if = "is_one")]
        task_slots: u32,
        /// Memory and GPUs each task needs: the placeholders ask for them.
        #[serde(default, skip_serializing_if = "Needs::is_none")]
        task_needs: Needs,
        #[serde(default)]
        owner: String,
        /// The job's launcher account, where users are kept apart: its
        /// launchers connect as it, not as the kcm.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credentials: Option<Credentials>,
    },
    /// Make sure these launchers are gone after `grace_ms` (preempted ones that
    /// may not have exited by themselves).
    Release {
        job: JobId,
        launchers: Vec<LauncherId>,
        grace_ms: u64,
    },
    /// The job ended: withdraw every placeholder it still has, and stop its
    /// grid components.
    JobEnded { job: JobId },
    /// Run one component of a grid job as an ordinary batch job.
    SubmitComponent(ComponentSpec),
    /// Every component of a grid job started: this one's command runs
    /// now, knowing where all of them are (`hosts`, in component order).
    Go {
        job: JobId,
        component: u32,
        hosts: Vec<Vec<HostSlots>>,
    },
    /// Stop every component of a grid job here: `signal` to its command,
    /// killed `grace_ms` later; each ends as preempted.
    PreemptComponents {
        job: JobId,
        signal: String,
        grace_ms: u64,
    },
    /// Remove one component of a grid job, running at its barrier or
    /// waiting, without reporting its end: it is placed again elsewhere.
    WithdrawComponent { job: JobId, component: u32 },
    /// A launcher of `job` reached the broker: its placeholder started
    /// well. One that leaves the batch system without saying so is a
    /// failed start. The job is its runner's, which relays it: a launcher
    /// speaks for its own job's placeholders only.
    LauncherUp { job: JobId, launcher: LauncherId },
    /// A launcher of `job` could not claim its GPUs: others held them
    /// ([`GpusHeld`], relayed by its runner as `LauncherUp` is).
    GpusHeld { job: JobId, held: GpusHeld },
}

/// A broker account and its password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    /// Never the password, in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// One rigid component of a grid job, as the kcm submits it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentSpec {
    pub job: JobId,
    pub component: u32,
    pub slots: u32,
    /// Memory and GPUs the whole component needs.
    #[serde(default, skip_serializing_if = "Needs::is_none")]
    pub needs: Needs,
    pub command: String,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    #[serde(default)]
    pub walltime_ms: Option<u64>,
    #[serde(default)]
    pub workdir: Option<String>,
    /// The job's owner: the component runs as their Unix account where
    /// users are kept apart.
    #[serde(default)]
    pub owner: String,
    /// Files it reads: staged to the cluster first where its nodes do not
    /// see them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// Its `$GLEANER_CHECKPOINT`: kept across runs, so that a component
    /// stopped for a job of higher priority resumes from what it saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

impl Message for KcmMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::StartLaunchers { .. } => "start_launchers",
            Self::Release { .. } => "release",
            Self::JobEnded { .. } => "job_ended",
            Self::SubmitComponent(_) => "submit_component",
            Self::Go { .. } => "go",
            Self::WithdrawComponent { .. } => "withdraw_component",
            Self::PreemptComponents { .. } => "preempt_components",
            Self::LauncherUp { .. } => "launcher_up",
            Self::GpusHeld { .. } => "gpus_held",
        }
    }
}

// --------------------------------------------------------- gleaner.job.<job>.owner

/// Whose a job id is. Ids are public (`qstat` shows them), so the first
/// runner to hold a job's lock keeps this in the job's `owner` queue, and
/// every runner compares it before it takes the job over, purges its
/// queues or publishes into them: a redelivery of the same submission
/// matches; another user's submission of the id, or a second submission of
/// it, does not, and is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobClaim {
    /// The broker user who submitted the job.
    pub owner: String,
    /// A fingerprint of the submission's body as it came.
    pub submission: u64,
}

impl JobClaim {
    /// Why a submission claiming `self` may not run a job claimed by
    /// `held`, if it may not.
    pub fn refusal(&self, job: &str, held: &Self) -> Option<String> {
        if held.owner != self.owner {
            Some(format!(
                "job id {job} belongs to another user; a job id is never taken over"
            ))
        } else if held.submission != self.submission {
            Some(format!(
                "job {job} was already submitted; each submission gets a job id of its own"
            ))
        } else {
            None
        }
    }
}

impl Message for JobClaim {
    fn kind(&self) -> &'static str {
        "job_claim"
    }
}

// ------------------------------------------------------- gleaner.job.<job>.control

/// A job runner's inbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ControlMsg {
    /// The scheduler offers up to `slots` slots on `cluster`.
    GrowOffer {
        grant: GrantId,
        cluster: ClusterName,
        slots: u32,
    },
    /// Give back `slots` slots on `cluster`, from launchers on `hosts`
    /// (anywhere on the cluster when empty): a local job that needs its
    /// slots on one host is helped by launchers there only.
    Shrink {
        cluster: ClusterName,
        slots: u32,
        mode: ShrinkMode,
        reason: String,
        #[serde(default)]
        hosts: Vec<String>,
    },
    LauncherUp(LauncherInfo),
    LauncherStatus(LauncherStatus),
    /// A launcher that cannot start because GPUs the batch system counted
    /// free are claimed: said instead of [`ControlMsg::LauncherUp`], for
    /// its kcm to judge.
    GpusHeld(GpusHeld),
    LauncherGone {
        launcher: LauncherId,
        cluster: ClusterName,
        reason: String,
    },
    /// `gleaner cancel`.
    Cancel {
        reason: String,
    },
    /// `gleaner submit --job`: more tasks for an open job.
    AddTasks(Addition),
    /// `gleaner close`: no more tasks for an open job.
    Close {},
    /// `gleaner logs --follow`: relay `task`'s output to the asker.
    Follow {
        task: u64,
        /// The asker's direct reply-to: the AMQP `reply_to` of the message
        /// that carried this, set by the shell that received it, never read
        /// from the body (anyone who may write to the queue could fill it).
        #[serde(skip)]
        reply_to: Option<String>,
    },
    /// Output of a followed task, from the launcher running it.
    Output(OutputPiece),
    /// The scheduler placed a grid job: the `i`-th of the components its
    /// report says are still to place goes to `clusters[i]` (all of them,
    /// unless one was withdrawn and is placed again).
    Place {
        clusters: Vec<ClusterName>,
        /// How long the components' inputs are expected to take to stage
        /// (KOALA's FTT), from what the clusters measured.
        #[serde(default, skip_serializing_if = "is_zero_u64")]
        stage_ms: u64,
        /// When the last component is expected to start, ms from now (it
        /// waits in a batch queue until then): the run's start time is
        /// that much later.
        #[serde(default, skip_serializing_if = "is_zero_u64")]
        start_ms: u64,
        /// The slots chosen for each moldable component, in the order of
        /// `clusters` (0: not moldable); empty when none is.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        slots: Vec<u32>,
    },
    /// Reallocation (seed 002): a component waiting in `from`'s batch
    /// queue would complete earlier on `to`. It is submitted there, and
    /// withdrawn from `from` once `to` has it queued; if it starts on
    /// `from` first, it stays.
    Move {
        component: u32,
        from: ClusterName,
        to: ClusterName,
        /// Its expected start on `to`, ms from now.
        #[serde(default)]
        start_ms: u64,
    },
    /// A kcm's batch system accepted a component: it waits in its queue.
    ComponentQueued {
        component: u32,
        cluster: ClusterName,
    },
    /// The scheduler gave up placing a grid job.
    PlacementFailed {
        reason: String,
    },
    /// A kcm saw a grid job's component end.
    ComponentEnded(ComponentOutcome),
    /// A kcm withdrew a component that waited in its batch queue too long:
    /// it did not run and is to be placed again.
    ComponentWithdrawn {
        component: u32,
        cluster: ClusterName,
        reason: String,
    },
    /// A job of higher priority needs this grid job's slots: its
    /// components are stopped (their `preempt_signal`, then the grace, to
    /// save their state in `$GLEANER_CHECKPOINT`) and it goes back to its
    /// placement queue, to run again from its checkpoints.
    StepAside {
        reason: String,
    },
    /// A kcm saw a grid job's component start: it holds `hosts` and waits
    /// at the start barrier, its command not run until its runner says go.
    ComponentStarted {
        component: u32,
        cluster: ClusterName,
        hosts: Vec<HostSlots>,
    },
}

/// Which input files a cluster's nodes see: those under its shared paths
/// as they are; others only once its staging command copied them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InputAccess {
    /// Path prefixes its nodes see as the submitters do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<String>,
    /// It has a staging command for the others.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stages: bool,
    /// Seconds its stagings took, on average, once it has staged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_s: Option<f64>,
}

impl InputAccess {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The inputs its nodes see as they are.
    pub fn sees(&self, input: &str) -> bool {
        let path = std::path::Path::new(input);
        self.shared.iter().any(|prefix| path.starts_with(prefix))
    }

    /// It can run a component reading `inputs`: it sees them, or stages.
    pub fn can_read(&self, inputs: &[String]) -> bool {
        self.stages || inputs.iter().all(|i| self.sees(i))
    }
}

fn is_zero_u64(x: &u64) -> bool {
    *x == 0
}

/// A host a started grid component holds, and its slots there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSlots {
    pub host: String,
    pub slots: u32,
}

/// The most a grid job's host lists may take in a `Go`, which carries
/// every component's to each: well within [`MAX_MESSAGE_BYTES`]. The
/// lists come from files their owner writes, so a job whose lists would
/// pass it fails rather than have a `Go` that cannot be sent.
pub const MAX_GO_HOSTS_BYTES: usize = 8 << 20;

impl HostSlots {
    /// What `hosts` take in a message at most: each entry is a map of its
    /// name and a `u32` under their field names (19 bytes beside the
    /// name, 20 counted), the list a length.
    pub fn listed_bytes(hosts: &[Self]) -> usize {
        hosts
            .iter()
            .map(|h| h.host.len().saturating_add(20))
            .fold(5, usize::saturating_add)
    }
}

/// How a grid job gathered its components (KOALA's figures): what `job.json`,
/// `gleaner status` and the metrics show.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Gathering {
    /// Components started and waiting at the start barrier for the others.
    #[serde(default)]
    pub at_barrier: u32,
    /// Claiming tries made, over every placement.
    #[serde(default)]
    pub claiming_tries: u32,
    /// Seconds from submission to the job's last placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_s: Option<f64>,
    /// Seconds the first component to start waited at the barrier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub barrier_s: Option<f64>,
    /// Seconds from the job's last placement to its start (the go).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_delay_s: Option<f64>,
    /// When the run now going was let go (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_since: Option<Millis>,
    /// Seconds that run had gone on when the report was made: the
    /// scheduler weighs stopping it by this, reading no clock of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_s: Option<f64>,
    /// The job's walltime, which the scheduler weighs preemptions by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walltime_s: Option<f64>,
    /// Runs stopped for jobs of higher priority.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub preemptions: u32,
    /// Components moved to a cluster where they would complete earlier
    /// (reallocation), all runs together.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moves: u32,
}

/// How a grid job's component ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentOutcome {
    pub component: u32,
    pub cluster: ClusterName,
    /// `None` when the batch system did not say (the job was removed).
    pub exit_code: Option<i32>,
    pub runtime_ms: u64,
    pub stdout: Captured,
    pub stderr: Captured,
    /// It was stopped at its job's asking (`preempt_signal`, then the
    /// grace), to run again from its checkpoint later.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preempted: bool,
}

impl Message for ControlMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::GrowOffer { .. } => "grow_offer",
            Self::Shrink { .. } => "shrink",
            Self::LauncherUp(_) => "launcher_up",
            Self::LauncherStatus(_) => "launcher_status",
            Self::GpusHeld(_) => "gpus_held",
            Self::LauncherGone { .. } => "launcher_gone",
            Self::Cancel { .. } => "cancel",
            Self::AddTasks(_) => "add_tasks",
            Self::Close {} => "close",
            Self::Follow { .. } => "follow",
            Self::Output(_) => "output",
            Self::Place { .. } => "place",
            Self::PlacementFailed { .. } => "placement_failed",
            Self::ComponentEnded(_) => "component_ended",
            Self::ComponentWithdrawn { .. } => "component_withdrawn",
            Self::ComponentStarted { .. } => "component_started",
            Self::StepAside { .. } => "step_aside",
            Self::Move { .. } => "move",
            Self::ComponentQueued { .. } => "component_queued",
        }
    }
}

/// How a shrink frees slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShrinkMode {
    /// Now: running tasks are killed and republished (a local or grid job waits).
    Preempt,
    /// When the current task ends (fair-share rebalancing; no work is lost).
    Drain,
}

/// What a launcher that could not claim the GPUs its tasks need found,
/// where the batch system counts GPUs but does not say which are whose
/// (Grid Engine): the host's devices that another process had claimed.
/// Its kcm knows how many of them gleaner's launchers there hold; more
/// than that are held outside gleaner, a failure of nobody's. A task can
/// send this (it holds its launcher's account): the kcm takes it for its
/// job's own placeholders only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpusHeld {
    pub launcher: LauncherId,
    pub cluster: ClusterName,
    #[serde(deserialize_with = "crate::ids::host_name")]
    pub host: String,
    /// The devices it found claimed by another process.
    #[serde(deserialize_with = "crate::ids::device_names")]
    pub devices: Vec<String>,
}

/// A launcher announcing itself to its job's runner.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LauncherInfo {
    pub launcher: LauncherId,
    pub cluster: ClusterName,
    #[serde(deserialize_with = "crate::ids::host_name")]
    pub host: String,
    pub slots: u32,
    pub started_at: Millis,
    /// When its placeholder's walltime ends, if it has one.
    #[serde(default)]
    pub deadline: Option<Millis>,
    /// How often it reports: its runner judges its silence by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<u64>,
}

/// How often a launcher sends its [`LauncherStatus`] unless configured
/// otherwise; runners judge a launcher's silence by the same interval.
/// Each beat is a message through the job's replicated control queue, so
/// it is the per-launcher cost of a big job; a change (the first task
/// after idleness) is told at once, not a beat later.
pub const LAUNCHER_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(5);

/// A launcher's heartbeat: what it is running right now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LauncherStatus {
    pub launcher: LauncherId,
    pub cluster: ClusterName,
    /// Where it runs, so that a runner that missed its announcement can
    /// still choose it for a shrink on its host.
    #[serde(default, deserialize_with = "crate::ids::host_name")]
    pub host: String,
    pub running: Vec<RunningTask>,
    pub completed: u64,
    /// As in [`LauncherInfo`], for a runner that missed the announcement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunningTask {
    pub task: u64,
    pub started_at: Millis,
    /// Times it was preempted before this run: a runner spares a task
    /// preempted often when it must give slots back.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub preemptions: u32,
}

// ---------------------------------------------------------- gleaner.job.<job>.tasks

/// One run of one task. Self-contained, so a launcher needs nothing else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskMsg {
    pub job: JobId,
    pub task: u64,
    /// 1 for the first run; retries after a failure count up to `max_attempts`.
    pub attempt: u32,
    /// Times this task was preempted and republished; not failures.
    #[serde(default)]
    pub preemptions: u32,
    pub command: String,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    #[serde(default)]
    pub walltime_ms: Option<u64>,
    #[serde(default)]
    pub outputs: Vec<String>,
    #[serde(default)]
    pub workdir: Option<String>,
    /// When preempted, the task gets this signal (a name: `TERM`, `USR1`…)
    /// and `preempt_grace_ms` to save its state before it is killed;
    /// without them it is killed at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_grace_ms: Option<u64>,
    /// The job's `max_attempts` (0: not said): after a failed last attempt
    /// nothing runs the task again, and its checkpoint can go.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_attempts: u32,
    /// A shape unlike its job's tasks' (a final step's own): only a
    /// launcher of this shape runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<TaskShape>,
}

impl Message for TaskMsg {
    fn kind(&self) -> &'static str {
        "task"
    }
}

impl TaskMsg {
    /// About what it weighs in a message: its variable parts, with room
    /// for the fixed ones.
    pub fn weight(&self) -> usize {
        self.command.len()
            + self
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>()
            + self.outputs.iter().map(|o| o.len() + 8).sum::<usize>()
            + self.workdir.as_ref().map_or(0, String::len)
            + 256
    }
}

/// What one bundle of tasks weighs at most ([`TaskMsg::weight`]), unless
/// its one task alone weighs more: well within [`MAX_MESSAGE_BYTES`], and
/// what a launcher's prefetch holds stays small.
pub const BUNDLE_BYTES: usize = 4 << 20;

/// A message of many `$item`s in `$field` that also reads a lone `$item`
/// as a list of one: single messages still queued across an upgrade, and
/// retries, which travel alone, decode as the same type.
macro_rules! many_or_one {
    ($many:ident, $field:ident, $item:ident) => {
        impl<'de> Deserialize<'de> for $many {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                #[serde(untagged)]
                enum Either {
                    Many { $field: Vec<$item> },
                    One(Box<$item>),
                }
                Ok(match Either::deserialize(d)? {
                    Either::Many { $field } => Self { $field },
                    Either::One(one) => Self { $field: vec![*one] },
                })
            }
        }
    };
}

/// Tasks published as one message (a manifest's `bundle`): one publish,
/// delivery and ack for all of them. A launcher acks it once every task in
/// it has its result with the broker or is back in the queue alone.
#[derive(Debug, Clone, Serialize)]
pub struct TaskBundle {
    pub tasks: Vec<TaskMsg>,
}

many_or_one!(TaskBundle, tasks, TaskMsg);

impl Message for TaskBundle {
    fn kind(&self) -> &'static str {
        "tasks"
    }
}

// -------------------------------------------------------- gleaner.job.<job>.results

/// How one run of a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Succeeded,
    Failed,
    TimedOut,
    /// Killed for using more memory than the task asked for: running it
    /// again would end the same way.
    Oom,
}

/// The outcome of one run of a task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResultMsg {
    pub job: JobId,
    pub task: u64,
    pub attempt: u32,
    pub preemptions: u32,
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    /// The signal that ended the command, if one did.
    #[serde(default)]
    pub signal: Option<i32>,
    pub runtime_ms: u64,
    pub launcher: LauncherId,
    pub cluster: ClusterName,
    #[serde(deserialize_with = "crate::ids::host_name")]
    pub host: String,
    pub stdout: Captured,
    pub stderr: Captured,
    #[serde(default)]
    pub outputs: Vec<OutputFile>,
    /// Why the task could not even start (sandbox, spawn), if so.
    #[serde(default)]
    pub error: Option<String>,
    /// The most memory its processes held together, where the task asked
    /// for memory (the launcher watches only then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_mb: Option<u64>,
    /// Set when the run's output went ahead of it in [`ResultPart`]s: the
    /// data of its streams and files is then empty here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parted: Option<Parted>,
}

impl ResultMsg {
    /// Bytes of captured output it carries.
    pub fn output_bytes(&self) -> usize {
        self.stdout.data.len()
            + self.stderr.data.len()
            + self.outputs.iter().map(|f| f.data.len()).sum::<usize>()
    }

    /// What it weighs in a message: its output, and its other variable
    /// parts (paths, error) with room for the fixed ones.
    pub fn weight(&self) -> usize {
        self.output_bytes()
            + self
                .outputs
                .iter()
                .map(|f| f.path.len() + 32)
                .sum::<usize>()
            + self.error.as_ref().map_or(0, String::len)
            + 256
    }

    /// Splits a run whose output is over [`RESULT_MESSAGE_BYTES`] into
    /// parts of at most [`RESULT_PART_BYTES`] and the result without the
    /// data, which says how much each part's target holds. `run` tells
    /// this run's parts from another run's of the same task.
    pub fn into_parts(mut self, run: u64) -> (Vec<ResultPart>, ResultMsg) {
        if self.output_bytes() <= RESULT_MESSAGE_BYTES {
            return (Vec::new(), self);
        }
        let datas = [&mut self.stdout.data, &mut self.stderr.data]
            .into_iter()
            .chain(self.outputs.iter_mut().map(|f| &mut f.data));
        let mut parts = Vec::new();
        let mut sizes = Vec::new();
        for (target, data) in datas.enumerate() {
            let data = std::mem::take(data);
            sizes.push(data.len() as u64);
            for (index, chunk) in data.chunks(RESULT_PART_BYTES).enumerate() {
                parts.push(ResultPart {
                    job: self.job.clone(),
                    task: self.task,
                    run,
                    target: target as u32,
                    offset: (index * RESULT_PART_BYTES) as u64,
                    data: chunk.to_vec(),
                });
            }
        }
        self.parted = Some(Parted { run, sizes });
        (parts, self)
    }
}

/// Bytes of captured output a message of results holds at most (a run
/// with more goes in parts): with the runner's prefetch, what a job's
/// results can make it hold at once.
pub const RESULT_MESSAGE_BYTES: usize = 1 << 20;
/// Bytes of one [`ResultPart`].
pub const RESULT_PART_BYTES: usize = 1 << 20;
/// The most output one parted run may declare: what the launcher's
/// largest limits allow, with room.
pub const MAX_PARTED_BYTES: u64 = 1 << 30;
/// Output files one run sends back at most.
pub const MAX_OUTPUT_FILES: usize = 1000;
/// Targets of a parted run at most: the two streams and the output files.
pub const MAX_PARTED_TARGETS: usize = 2 + MAX_OUTPUT_FILES;
/// The largest message of results a launcher sends: its output is at most
/// [`RESULT_MESSAGE_BYTES`], and the rest (paths of up to
/// [`MAX_OUTPUT_FILES`] files, errors) well within the remainder.
pub const MAX_RESULTS_MESSAGE_BYTES: usize = 8 << 20;

/// The largest message a gleaner component sends, and the broker's own
/// `max_message_size` (`deploy/rabbitmq/50-gleaner.conf`): a consumer
/// holds at most its prefetch times this.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Where a parted run's data went: a run id, and the bytes of each
/// target (stdout, stderr, then the output files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parted {
    pub run: u64,
    pub sizes: Vec<u64>,
}

/// A piece of a parted run's output, sent ahead of its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultPart {
    pub job: JobId,
    pub task: u64,
    pub run: u64,
    /// 0 stdout, 1 stderr, then the output files in order.
    pub target: u32,
    pub offset: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

impl Message for ResultMsg {
    fn kind(&self) -> &'static str {
        "result"
    }
}

/// Results of a launcher's runs that ended about together, as one message:
/// one publish, one confirm, one delivery and one ack for all of them.
/// Or a part of a run's output, which comes alone.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ResultBatch {
    pub results: Vec<ResultMsg>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part: Option<ResultPart>,
}

impl<'de> Deserialize<'de> for ResultBatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Many {
                results: Vec<ResultMsg>,
                #[serde(default)]
                part: Option<ResultPart>,
            },
            One(Box<ResultMsg>),
        }
        Ok(match Either::deserialize(d)? {
            Either::Many { results, part } => Self { results, part },
            Either::One(one) => Self {
                results: vec![*one],
                part: None,
            },
        })
    }
}

impl Message for ResultBatch {
    fn kind(&self) -> &'static str {
        "results"
    }
}

/// A captured stream: its last bytes, and how many earlier ones were dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Captured {
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    pub dropped: u64,
}

/// A declared output file collected from the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    /// Relative to the sandbox.
    pub path: String,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Bytes beyond the size limit that were not kept.
    pub dropped: u64,
}

// ------------------------------------------------------------ gleaner.launcher.<id>

/// A launcher's own inbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LauncherMsg {
    /// Kill the running tasks, republish them, exit.
    Preempt { reason: String },
    /// Finish the running tasks, take no more, exit.
    Drain { reason: String },
    /// Report your status now (you have been silent for a while).
    Poll {},
    /// Send `task`'s output as it is printed, for `for_ms`, if it runs
    /// here or starts here meanwhile.
    Follow { task: u64, for_ms: u64 },
}

impl Message for LauncherMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Preempt { .. } => "preempt",
            Self::Drain { .. } => "drain",
            Self::Poll {} => "poll",
            Self::Follow { .. } => "follow",
        }
    }
}

// ---------------------------------------------------------------- gleaner.events

/// Published on the `gleaner.events` topic exchange for `--wait` and dashboards.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// `job.<owner>.<job>.progress`
    Progress(JobReport),
    /// `job.<owner>.<job>.done`: every task has a final state (or the job was cancelled).
    Done(JobReport),
    /// `job.<owner>.<job>.rejected`: the manifest was invalid, or its
    /// sender may not run it.
    Rejected {
        job: String,
        #[serde(default)]
        owner: String,
        reason: String,
        /// The refused submission's fingerprint (of its body, as its
        /// sender can work out): one id may be submitted more than once,
        /// and a refusal is news to the sender of that submission only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        submission: Option<u64>,
        /// The refused submission reused the id of a job that runs: news
        /// to its sender only, and no end of that job's (the history keeps
        /// none, so nobody's `wait` or `status` takes it for one).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        live_job: bool,
    },
    /// `cluster.<name>.status`
    Cluster(ClusterReport),
}

impl Message for Event {
    fn kind(&self) -> &'static str {
        match self {
            Self::Progress(_) => "progress",
            Self::Done(_) => "done",
            Self::Rejected { .. } => "rejected",
            Self::Cluster(_) => "cluster",
        }
    }
}

impl Event {
    /// The routing key on `gleaner.events`. A job's events carry its
    /// owner, so that a topic permission (`^job\.{username}\.`) lets each
    /// user follow their own jobs only.
    pub fn routing_key(&self) -> String {
        match self {
            Self::Progress(r) => job_events(&r.owner, r.job.as_str(), "progress"),
            Self::Done(r) => job_events(&r.owner, r.job.as_str(), "done"),
            Self::Rejected { job, owner, .. } => job_events(owner, job, "rejected"),
            Self::Cluster(c) => format!("cluster.{}.status", c.cluster),
        }
    }
}

/// The owner word of a job whose sender is unknown (a manifest published
/// by hand without `user_id`).
pub const UNKNOWN_OWNER: &str = "_";

/// `job.<owner>.<job>.<event>`; `event` may be a pattern (`#`).
pub fn job_events(owner: &str, job: &str, event: &str) -> String {
    let owner = if owner.is_empty() {
        UNKNOWN_OWNER
    } else {
        owner
    };
    format!("job.{owner}.{job}.{event}")
}

#[cfg(test)]
mod tests;
