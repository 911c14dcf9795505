//! What the scheduler hears on `gleaner.scheduler`: jobs' and clusters' reports.

use super::*;

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
