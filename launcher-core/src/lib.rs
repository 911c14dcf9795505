//! A launcher's core: what it decides (which task to take, when to ask
//! for more, when to leave, what to send back together) as a state machine
//! of events and time, with the settings and outcomes its shell shares.
//! Nothing here does I/O: the shell (`gleaner-launcher`) runs the tasks,
//! talks to the broker and carries out the effects.

pub mod consumers;
pub mod core;
mod gpus;
pub mod io;
pub mod packing;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use gleaner_manifest::JobId;
use gleaner_protocol::{ClusterName, LauncherId};

/// Everything a launcher needs to know; the kcm passes most of it on the
/// command line.
#[derive(Debug, Clone)]
pub struct LauncherConfig {
    pub job: JobId,
    pub cluster: ClusterName,
    /// Unique among live launchers; names the launcher's own queue.
    pub id: LauncherId,
    pub host: String,
    /// The batch system's name for this slot (`3`, `4711.2`), for the consumer tag.
    pub slot: String,
    /// Slots it holds.
    pub slots: u32,
    /// Slots each task takes (`$GLEANER_SLOTS`): `slots / task_slots`
    /// tasks run at once.
    pub task_slots: u32,
    /// Memory and GPUs each task needs: a task over its memory is killed
    /// as `oom`; each gets its own devices.
    pub task_needs: gleaner_manifest::Needs,
    /// Where its GPUs come from, if its tasks need any.
    pub gpu_source: GpuSource,
    pub idle_timeout: Duration,
    pub heartbeat: Duration,
    /// When the placeholder's walltime ends, if it has one.
    pub deadline: Option<Instant>,
    /// The walltime its cluster's placeholders ask for: the longest a task
    /// may take there, though the batch system may have given this one
    /// less (`deadline`).
    pub walltime: Option<Duration>,
    /// Running tasks are preempted this long before `deadline`, so that the
    /// batch system's kill never costs a task its retry budget.
    pub deadline_margin: Duration,
    /// Where sandboxes are created.
    pub scratch: PathBuf,
    /// Where each task's `$GLEANER_CHECKPOINT` is (`<checkpoints>/<job>/<task>`),
    /// kept across its preemptions and retries, removed once it succeeded.
    pub checkpoints: PathBuf,
    pub limits: Limits,
}

impl LauncherConfig {
    /// Its consumers' tag, as the management UI shows it.
    pub fn consumer_tag(&self) -> String {
        format!("launcher@{}/{}", self.host, self.slot)
    }

    /// Tasks it runs at once: whole tasks of `task_slots` in its slots.
    pub fn tasks_at_once(&self) -> u32 {
        (self.slots / self.task_slots.max(1)).max(1)
    }
}

/// `[launcher]` of the configuration: what every launcher of a deployment
/// shares, with its defaults here and nowhere else. A launcher's own
/// [`LauncherConfig`] adds what its kcm tells it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LauncherSettings {
    /// A launcher with no task for this long gives its slot back.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Where task sandboxes are made: each account's launchers in a
    /// directory of their own under it (`<scratch>/<uid>`, mode 0700). Made
    /// like `/tmp` (mode 1777) if missing, so that every account may.
    pub scratch: PathBuf,
    /// Where tasks keep state across preemptions and retries
    /// (`$GLEANER_CHECKPOINT`), per account like `scratch`: on a file system
    /// every host of a cluster shares, a task resumes on whichever launcher
    /// runs it next.
    pub checkpoints: PathBuf,
    #[serde(flatten)]
    pub limits: Limits,
    /// How long before its placeholder's walltime a launcher preempts its
    /// own tasks (they are republished, not lost to the batch system's kill).
    #[serde(with = "humantime_serde")]
    pub deadline_margin: Duration,
}

impl Default for LauncherSettings {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(5),
            heartbeat: gleaner_protocol::LAUNCHER_HEARTBEAT,
            scratch: std::env::temp_dir().join("gleaner-sandboxes"),
            checkpoints: std::env::temp_dir().join("gleaner-checkpoints"),
            limits: Limits::default(),
            deadline_margin: Duration::from_secs(10),
        }
    }
}

/// Why a launcher left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// No task came within `idle_timeout`.
    Idle,
    /// The job's task queue is gone: the job ended or was cancelled.
    JobOver,
    /// Preempted (message or signal): running tasks were republished.
    Preempted,
    /// Drained: running tasks finished, no new ones taken.
    Drained,
    /// The placeholder's walltime is ending.
    Walltime,
    /// Its job's next task needs launchers of another shape (a final step
    /// of its own).
    Reshaped,
}

impl Exit {
    /// Whether what the job's tasks kept for another run (`$GLEANER_CHECKPOINT`)
    /// outlives this launcher: not once the job is over.
    pub fn keeps_checkpoints(self) -> bool {
        self != Self::JobOver
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::JobOver => "job over",
            Self::Preempted => "preempted",
            Self::Drained => "drained",
            Self::Walltime => "walltime",
            Self::Reshaped => "another shape needed",
        }
    }
}

/// Size bounds on what a task sends back (keys of `[launcher]`).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Bytes kept of stdout and of stderr each (the tail).
    #[serde(rename = "max_stream_bytes")]
    pub stream_bytes: usize,
    /// Bytes kept of each declared output file (the head).
    #[serde(rename = "max_file_bytes")]
    pub file_bytes: usize,
    /// Bytes of output files per task in all.
    #[serde(rename = "max_outputs_bytes")]
    pub outputs_bytes: usize,
    /// Between SIGTERM and SIGKILL when a walltime ends.
    #[serde(with = "humantime_serde")]
    pub kill_grace: Duration,
    /// Bytes a task's `$GLEANER_CHECKPOINT` may hold after a run that did
    /// not succeed; a bigger one is removed, and the next run starts over.
    #[serde(rename = "max_checkpoint_bytes")]
    pub checkpoint_bytes: u64,
    /// Added to the launcher's niceness for its tasks (0 to 19): a
    /// launcher serves all its slots from one thread, and a task that ends
    /// waits for it to start the next; behind its own busy tasks it would
    /// come last.
    #[serde(rename = "task_nice")]
    pub nice: i32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            stream_bytes: 1 << 20,
            file_bytes: 16 << 20,
            outputs_bytes: 64 << 20,
            kill_grace: Duration::from_secs(2),
            checkpoint_bytes: 1 << 30,
            nice: 10,
        }
    }
}

/// Where a launcher's devices come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSource {
    /// The batch system set `$CUDA_VISIBLE_DEVICES` for the placeholder.
    BatchSystem,
    /// The host's devices, to claim from.
    Claim(Vec<String>),
    /// Devices the kcm claimed for this launcher, each claim an open file
    /// it inherited (by descriptor number).
    Given {
        devices: Vec<String>,
        claims: Vec<i32>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_outlive_a_launcher_unless_its_job_is_over() {
        for exit in [Exit::Idle, Exit::Preempted, Exit::Drained, Exit::Walltime] {
            assert!(exit.keeps_checkpoints(), "{exit:?}");
        }
        assert!(!Exit::JobOver.keeps_checkpoints());
    }
}
