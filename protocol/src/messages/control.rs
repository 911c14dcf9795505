//! What a job's runner hears on `gleaner.job.<job>.control`: offers, launchers' words, users' orders.

use super::*;

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
    pub(crate) fn is_default(&self) -> bool {
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
