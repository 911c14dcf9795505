//! Orders to a cluster's kcm on `gleaner.kcm.<cluster>`.

use super::*;

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
