//! The manifest's fields, exactly as users write them.

use std::{path::PathBuf, time::Duration};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::{
    JobId, ManifestError, ParamSpec, TaskList, TaskSet,
    expand::{ENV_ENTRY_BYTES, MAX_TASK_BYTES},
    job_id::is_valid_name,
    moldable::{Moldable, Slots, Speedup},
    needs::{MAX_TASK_GPUS, Memory, Needs, TaskShape},
    table::Table,
};

fn default_max_attempts() -> u32 {
    3
}

fn default_weight() -> u32 {
    1
}

fn default_max_preemptions() -> u32 {
    3
}

fn is_default_max_preemptions(n: &u32) -> bool {
    *n == default_max_preemptions()
}

fn is_default_weight(weight: &u32) -> bool {
    *weight == 1
}

/// The longest a preempted task may take to save its state.
pub const MAX_PREEMPT_GRACE: Duration = Duration::from_secs(60);

/// How long a grid job's components wait at the start barrier by default.
pub const DEFAULT_BARRIER_TIMEOUT: Duration = Duration::from_secs(600);

/// The longest a grid job may take to gather: started components hold
/// their slots idle meanwhile.
pub const MAX_BARRIER_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The signal a manifest's `preempt_signal` names (`TERM`, `SIGUSR1`…).
pub fn preempt_signal_number(name: &str) -> Option<i32> {
    match name.trim_start_matches("SIG") {
        "TERM" => Some(15),
        "INT" => Some(2),
        "HUP" => Some(1),
        "USR1" => Some(10),
        "USR2" => Some(12),
        _ => None,
    }
}

/// The most a sweep's weight may be: more is a typo, not a share.
pub const MAX_WEIGHT: u32 = 1000;

/// The most slots one task may take: a whole large host.
pub const MAX_TASK_SLOTS: u32 = 1024;

/// The most tasks one message may carry: a bundle that dies with its
/// launcher is run again whole, so it stays a few seconds of work.
pub const MAX_BUNDLE: u32 = 1000;

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A job as submitted. Unknown fields are refused rather than ignored: a
/// misspelt `walltim` silently dropped would cost a user a whole sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    #[serde(default)]
    pub kind: JobKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    #[serde(default, with = "walltime", skip_serializing_if = "Option::is_none")]
    pub walltime: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<PathBuf>,
    #[serde(
        default,
        deserialize_with = "crate::bounded::env",
        skip_serializing_if = "IndexMap::is_empty"
    )]
    pub env: IndexMap<String, String>,
    #[serde(
        default,
        deserialize_with = "crate::bounded::outputs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub outputs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<PathBuf>,
    /// A preempted task gets `preempt_signal` (default `TERM`) and this long
    /// to save its state (in `$GLEANER_CHECKPOINT`) before it is killed;
    /// unset, it is killed at once.
    #[serde(default, with = "walltime", skip_serializing_if = "Option::is_none")]
    pub preempt_grace: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_signal: Option<String>,
    /// A task preempted this many times is spared when its launcher could
    /// be chosen to give slots back, unless no other launcher frees them.
    #[serde(
        default = "default_max_preemptions",
        skip_serializing_if = "is_default_max_preemptions"
    )]
    pub max_preemptions: u32,
    /// Scavenging jobs: the most launcher slots the job holds at once, all
    /// clusters together (a launcher of S slots counts S); unlimited when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_launchers: Option<u32>,
    /// Scavenging jobs: its weight in fair shares (2: twice the slots of a
    /// weight-1 job, where both could use more).
    #[serde(default = "default_weight", skip_serializing_if = "is_default_weight")]
    pub weight: u32,
    /// Scavenging jobs: slots each task takes (the cores of a threaded
    /// task), all on one launcher; `$GLEANER_SLOTS` and `$OMP_NUM_THREADS`.
    #[serde(default = "default_weight", skip_serializing_if = "is_one")]
    pub slots: u32,
    /// Scavenging jobs: memory each task needs (`"8G"`): its placeholder
    /// asks the batch system for it, and a task over it is killed as `oom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// Scavenging jobs: GPUs each task needs, its own devices in
    /// `$CUDA_VISIBLE_DEVICES`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpus: u32,
    /// Scavenging jobs: tasks published as one message, for tasks too short
    /// (well under a second) to pay the broker a message each. A launcher
    /// runs a bundle's tasks side by side in its slots and settles it once
    /// each has its result; retries and preempted tasks travel alone.
    /// Unset, the runner sizes bundles from the run times it measures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<u32>,
    #[serde(default, rename = "task", skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskDef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<Sweep>,
    #[serde(
        default,
        rename = "component",
        deserialize_with = "crate::bounded::components",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub components: Vec<Component>,
    /// Run once after every task has a final state (a merge step).
    #[serde(default, rename = "final", skip_serializing_if = "Option::is_none")]
    pub final_step: Option<FinalStep>,
    /// Tasks may be added while it runs (`gleaner submit --job`); it ends
    /// once closed (`gleaner close`) and every task has ended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open: bool,
    /// Grid jobs: a component that fails (exits non-zero) stops the others
    /// and sends the job back to placement whole, while runs are left
    /// (`max_attempts`); otherwise the job ends failed with it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restart_on_failure: bool,
    /// Grid jobs: how long after its placement the job may take to gather
    /// (every component started, waiting at the start barrier) — KOALA's
    /// Job Start Time. Past it, the components that started are stopped
    /// and the job is placed again, a try. Default [`DEFAULT_BARRIER_TIMEOUT`].
    #[serde(default, with = "walltime", skip_serializing_if = "Option::is_none")]
    pub barrier_timeout: Option<Duration>,
    /// Grid jobs: KOALA's claiming threshold T, in (0, 1]. At a claiming
    /// try, once this fraction of the components has started, the others
    /// are withdrawn from their clusters and placed again; at 1 (the
    /// default) the job waits for all of them where they were placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_threshold: Option<f64>,
    /// Grid jobs: files every component reads (absolute paths). A
    /// component goes where they are (a cluster that shares their file
    /// system) or where its cluster's staging command can copy them
    /// before it starts (KOALA's Close-to-Files placement).
    #[serde(
        default,
        deserialize_with = "crate::bounded::inputs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub inputs: Vec<String>,
    /// Some of another job's tasks run again (`gleaner resubmit`): the
    /// same sweep, only these task numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun: Option<Rerun>,
}

/// `[rerun]`: which job's tasks run again, and which of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rerun {
    /// The job whose tasks these are.
    pub of: String,
    /// Their numbers, as in that job.
    pub tasks: TaskSet,
    /// That job's results directory, linked from this one's as `rerun-of`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<String>,
}

/// `[final]`: a command run once, like a task, after every task has a
/// final state, with the results directory as `GLEANER_RESULTS`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinalStep {
    pub command: String,
    #[serde(default)]
    pub when: FinalWhen,
    /// Slots, memory and GPUs of its own (a merge needing more than a
    /// task); unset, the job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
}

/// Whether the final step runs when some task did not succeed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FinalWhen {
    /// Only if every task succeeded; otherwise it is skipped.
    #[default]
    AllSucceeded,
    Always,
}

/// Scavenging jobs grow and shrink over idle slots; grid jobs are rigid and
/// placed whole, by priority.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobKind {
    #[default]
    Scavenge,
    Grid,
}

/// Placement priority of a grid job. `SuperLow` is where scavenging jobs live;
/// users cannot ask for it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Priority {
    SuperLow,
    #[default]
    Low,
    High,
    SuperHigh,
}

impl Priority {
    /// As manifests spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::SuperLow => "super-low",
            Self::Low => "low",
            Self::High => "high",
            Self::SuperHigh => "super-high",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskDef {
    pub command: String,
}

/// A cartesian product of parameters substituted into one command template:
/// the rows of a CSV file, the lines of a file, and ranges or lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    pub command: String,
    #[serde(
        default,
        deserialize_with = "crate::bounded::params",
        skip_serializing_if = "IndexMap::is_empty"
    )]
    pub params: IndexMap<String, ParamSpec>,
    /// A CSV file, relative to the manifest: its header names parameters,
    /// each row is a task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv: Option<String>,
    /// A file of lines, relative to the manifest: each line is a task, as
    /// `{line}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<String>,
    /// The rows of `csv` and `lines`, read by `gleaner submit`.
    #[serde(
        default,
        deserialize_with = "crate::bounded::tables",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tables: Vec<Table>,
}

impl Sweep {
    /// The rows read from `source`.
    pub fn table(&self, source: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.source == source)
    }
}

/// One rigid part of a grid job, run as an ordinary batch job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Component {
    /// A number, or `{ min, max }` for a moldable component with a
    /// `speedup`: the scheduler picks per cluster.
    pub slots: Slots,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup: Option<Speedup>,
    pub command: String,
    /// Memory the whole component needs (`"64G"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// GPUs the whole component needs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpus: u32,
    /// Files it reads, besides the job's `inputs`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
}

impl Component {
    /// Its range and walltime curve, if it is moldable and they are right
    /// (`walltime`: the job's).
    pub fn moldable(&self, walltime: Option<Duration>) -> Option<Moldable> {
        let speedup = self.speedup.as_ref()?;
        Moldable::read(self.slots, speedup, walltime).ok()
    }

    pub fn needs(&self) -> Needs {
        Needs {
            memory_mb: self.memory.map_or(0, |m| m.0),
            gpus: self.gpus,
        }
    }
}

impl Manifest {
    /// A job of this name with every other key at its default (and no
    /// tasks yet: add them before it is valid).
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            kind: JobKind::default(),
            priority: None,
            max_attempts: default_max_attempts(),
            walltime: None,
            results: None,
            env: IndexMap::new(),
            outputs: Vec::new(),
            workdir: None,
            preempt_grace: None,
            preempt_signal: None,
            max_preemptions: default_max_preemptions(),
            max_launchers: None,
            weight: default_weight(),
            slots: 1,
            memory: None,
            gpus: 0,
            bundle: None,
            tasks: Vec::new(),
            sweep: None,
            components: Vec::new(),
            final_step: None,
            open: false,
            restart_on_failure: false,
            barrier_timeout: None,
            claim_threshold: None,
            inputs: Vec::new(),
            rerun: None,
        }
    }

    /// Checks everything that parsing alone cannot. Each error names its field.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if !is_valid_name(&self.name) {
            return Err(ManifestError::invalid(
                "name",
                format!(
                    "{:?} must be 1 to 64 characters from A-Z a-z 0-9 . _ -",
                    self.name
                ),
            ));
        }
        if self.max_attempts == 0 {
            return Err(ManifestError::invalid("max_attempts", "must be at least 1"));
        }
        if self.walltime == Some(Duration::ZERO) {
            return Err(ManifestError::invalid("walltime", "must be longer than 0s"));
        }
        if let Some(key) = self.env.keys().find(|key| !is_env_name(key)) {
            return Err(ManifestError::invalid(
                format!("env.{key}"),
                "is not a valid environment variable name (letters, digits and '_', not starting with a digit)",
            ));
        }
        for (i, pattern) in self.outputs.iter().enumerate() {
            if pattern.is_empty()
                || pattern.starts_with('/')
                || pattern.split('/').any(|p| p == "..")
            {
                return Err(ManifestError::invalid(
                    format!("outputs[{i}]"),
                    format!("{pattern:?} must be a relative pattern inside the task's sandbox"),
                ));
            }
        }
        if let Some(results) = &self.results
            && (results.as_os_str().is_empty()
                || !results.components().all(|c| {
                    matches!(
                        c,
                        std::path::Component::Normal(_) | std::path::Component::CurDir
                    )
                }))
        {
            return Err(ManifestError::invalid(
                "results",
                format!(
                    "{results:?} must be a relative directory without `..` in it (results stay under the runner's results root)"
                ),
            ));
        }
        match self.kind {
            JobKind::Scavenge => self.validate_scavenge(),
            JobKind::Grid => self.validate_grid(),
        }
    }

    fn validate_scavenge(&self) -> Result<(), ManifestError> {
        if self.priority.is_some() {
            return Err(ManifestError::invalid(
                "priority",
                "only grid jobs have a priority; scavenging jobs use idle slots",
            ));
        }
        if !self.components.is_empty() {
            return Err(ManifestError::invalid(
                "component",
                "components belong to grid jobs (kind = \"grid\")",
            ));
        }
        if self.restart_on_failure {
            return Err(ManifestError::invalid(
                "restart_on_failure",
                "grid jobs restart whole; a sweep's tasks are retried up to max_attempts",
            ));
        }
        for (field, given) in [
            ("barrier_timeout", self.barrier_timeout.is_some()),
            ("claim_threshold", self.claim_threshold.is_some()),
            ("inputs", !self.inputs.is_empty()),
        ] {
            if given {
                return Err(ManifestError::invalid(
                    field,
                    "only grid jobs gather their components at a start barrier",
                ));
            }
        }
        if self.preempt_grace.is_some_and(|g| g > MAX_PREEMPT_GRACE) {
            return Err(ManifestError::invalid(
                "preempt_grace",
                format!(
                    "at most {}s: a cluster's users wait for the slot meanwhile",
                    MAX_PREEMPT_GRACE.as_secs()
                ),
            ));
        }
        if let Some(signal) = &self.preempt_signal
            && preempt_signal_number(signal).is_none()
        {
            return Err(ManifestError::invalid(
                "preempt_signal",
                format!("{signal:?} is none of TERM, INT, HUP, USR1, USR2"),
            ));
        }
        if !(1..=MAX_WEIGHT).contains(&self.weight) {
            return Err(ManifestError::invalid(
                "weight",
                format!("must be from 1 to {MAX_WEIGHT}"),
            ));
        }
        if self
            .bundle
            .is_some_and(|bundle| !(1..=MAX_BUNDLE).contains(&bundle))
        {
            return Err(ManifestError::invalid(
                "bundle",
                format!("must be from 1 to {MAX_BUNDLE}"),
            ));
        }
        if !(1..=MAX_TASK_SLOTS).contains(&self.slots) {
            return Err(ManifestError::invalid(
                "slots",
                format!("must be from 1 to {MAX_TASK_SLOTS}"),
            ));
        }
        if self.gpus > MAX_TASK_GPUS {
            return Err(ManifestError::invalid(
                "gpus",
                format!("must be from 0 to {MAX_TASK_GPUS}"),
            ));
        }
        if self.max_launchers.is_some_and(|max| max < self.slots) {
            return Err(ManifestError::invalid(
                "max_launchers",
                format!(
                    "{} slots cannot run one task of {} slots",
                    self.max_launchers.unwrap_or_default(),
                    self.slots
                ),
            ));
        }
        if self.max_launchers == Some(0) {
            return Err(ManifestError::invalid(
                "max_launchers",
                "must be at least 1 (leave it out for no limit)",
            ));
        }
        if let Some(step) = &self.final_step {
            if step.command.trim().is_empty() {
                return Err(ManifestError::invalid("final.command", "is empty"));
            }
            if step
                .slots
                .is_some_and(|slots| !(1..=MAX_TASK_SLOTS).contains(&slots))
            {
                return Err(ManifestError::invalid(
                    "final.slots",
                    format!("must be from 1 to {MAX_TASK_SLOTS}"),
                ));
            }
            if step.gpus.is_some_and(|gpus| gpus > MAX_TASK_GPUS) {
                return Err(ManifestError::invalid(
                    "final.gpus",
                    format!("must be from 0 to {MAX_TASK_GPUS}"),
                ));
            }
            if let (Some(max), Some(slots)) = (self.max_launchers, step.slots)
                && max < slots
            {
                return Err(ManifestError::invalid(
                    "max_launchers",
                    format!("{max} slots cannot run a final step of {slots} slots"),
                ));
            }
        }
        for (i, task) in self.tasks.iter().enumerate() {
            if task.command.trim().is_empty() {
                return Err(ManifestError::invalid(
                    format!("task[{i}].command"),
                    "is empty",
                ));
            }
        }
        let tasks = TaskList::new(self)?;
        self.check_task_bytes(&tasks, 0)?;
        if let Some(step) = &self.final_step {
            let bytes = self
                .task_base_bytes()
                .saturating_add(step.command.len())
                .saturating_add(FINAL_ENV_BYTES);
            if bytes > MAX_TASK_BYTES {
                return Err(too_heavy("final.command", "the final step", bytes));
            }
        }
        if self.open && self.rerun.is_some() {
            return Err(ManifestError::invalid(
                "open",
                "a rerun runs the tasks it names; add tasks to a job of its own",
            ));
        }
        if tasks.is_empty() && !self.open {
            return Err(ManifestError::invalid(
                "task",
                "the job has no tasks: add [[task]] entries or a [sweep]",
            ));
        }
        if let Some(rerun) = &self.rerun {
            if rerun.of.parse::<JobId>().is_err() {
                return Err(ManifestError::invalid(
                    "rerun.of",
                    format!("{:?} is not a job id", rerun.of),
                ));
            }
            if let Some(beyond) = rerun.tasks.last().filter(|&last| last >= tasks.len()) {
                return Err(ManifestError::invalid(
                    "rerun.tasks",
                    format!(
                        "task {beyond} is not one of the job's {} tasks (they are numbered from 0)",
                        tasks.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_grid(&self) -> Result<(), ManifestError> {
        if self.priority == Some(Priority::SuperLow) {
            return Err(ManifestError::invalid(
                "priority",
                "must be super-high, high or low",
            ));
        }
        if !self.tasks.is_empty() || self.sweep.is_some() {
            return Err(ManifestError::invalid(
                "task",
                "grid jobs run [[component]] entries, not tasks",
            ));
        }
        if self.weight != 1 {
            return Err(ManifestError::invalid(
                "weight",
                "grid jobs are placed by priority; weights share scavenged slots",
            ));
        }
        if self.slots != 1 {
            return Err(ManifestError::invalid(
                "slots",
                "grid jobs give each [[component]] its slots",
            ));
        }
        if self.bundle.is_some_and(|bundle| bundle != 1) {
            return Err(ManifestError::invalid(
                "bundle",
                "grid jobs run [[component]] entries, not tasks",
            ));
        }
        for (field, given) in [("memory", self.memory.is_some()), ("gpus", self.gpus != 0)] {
            if given {
                return Err(ManifestError::invalid(
                    field,
                    format!("grid jobs give each [[component]] its {field}"),
                ));
            }
        }
        if self.final_step.is_some() {
            return Err(ManifestError::invalid(
                "final",
                "a final step follows the tasks of a sweep; grid jobs have none",
            ));
        }
        if self.open {
            return Err(ManifestError::invalid(
                "open",
                "grid jobs run their [[component]] entries; tasks are added to sweeps",
            ));
        }
        if self.rerun.is_some() {
            return Err(ManifestError::invalid(
                "rerun",
                "grid jobs have no tasks to run again; submit the job again",
            ));
        }
        if self
            .barrier_timeout
            .is_some_and(|t| t.is_zero() || t > MAX_BARRIER_TIMEOUT)
        {
            return Err(ManifestError::invalid(
                "barrier_timeout",
                format!(
                    "must be longer than 0s and at most {}: components that started hold their slots meanwhile",
                    humantime::format_duration(MAX_BARRIER_TIMEOUT)
                ),
            ));
        }
        if self.claim_threshold.is_some_and(|t| !(t > 0.0 && t <= 1.0)) {
            return Err(ManifestError::invalid(
                "claim_threshold",
                "must be more than 0 and at most 1 (the fraction of components that must have started)",
            ));
        }
        if self.components.is_empty() {
            return Err(ManifestError::invalid(
                "component",
                "a grid job needs at least one [[component]]",
            ));
        }
        if self.components.len() > MAX_COMPONENTS {
            return Err(ManifestError::invalid(
                "component",
                format!(
                    "{} components; a grid job has at most {MAX_COMPONENTS}",
                    self.components.len()
                ),
            ));
        }
        for (i, component) in self.components.iter().enumerate() {
            if component.slots.min() == 0 {
                return Err(ManifestError::invalid(
                    format!("component[{i}].slots"),
                    "must be at least 1",
                ));
            }
            match (&component.speedup, component.slots) {
                (None, Slots::Range { .. }) => {
                    return Err(ManifestError::invalid(
                        format!("component[{i}].speedup"),
                        "a moldable component (slots = { min, max }) needs a speedup: \"amdahl:F\" or runtimes by slots",
                    ));
                }
                (Some(speedup), slots) => {
                    Moldable::read(slots, speedup, self.walltime).map_err(|e| {
                        ManifestError::invalid(format!("component[{i}].speedup"), e)
                    })?;
                }
                (None, Slots::Fixed(_)) => {}
            }
            if component.gpus > MAX_TASK_GPUS.saturating_mul(component.slots.min()) {
                return Err(ManifestError::invalid(
                    format!("component[{i}].gpus"),
                    format!("at most {MAX_TASK_GPUS} per slot"),
                ));
            }
            if component.command.trim().is_empty() {
                return Err(ManifestError::invalid(
                    format!("component[{i}].command"),
                    "is empty",
                ));
            }
            check_inputs(&format!("component[{i}].inputs"), &component.inputs)?;
        }
        check_inputs("inputs", &self.inputs)?;
        let copies = self.input_copies_bytes();
        if copies > MAX_INPUT_BYTES {
            return Err(ManifestError::invalid(
                "inputs",
                format!(
                    "the components' input paths come to {:.1} MiB (the job's `inputs` for each of its {} components, and their own); at most {} MiB: name directories rather than files",
                    copies as f64 / f64::from(1 << 20),
                    self.components.len(),
                    MAX_INPUT_BYTES >> 20
                ),
            ));
        }
        Ok(())
    }

    /// The bytes of every component's input paths, the job's counted for
    /// each: what the components' orders to their kcms and placement's
    /// copies hold.
    pub fn input_copies_bytes(&self) -> usize {
        let weigh = |inputs: &[String]| -> usize {
            inputs
                .iter()
                .map(|i| i.len() + ENV_ENTRY_BYTES)
                .fold(0, usize::saturating_add)
        };
        let shared = weigh(&self.inputs);
        self.components
            .iter()
            .map(|c| shared.saturating_add(weigh(&c.inputs)))
            .fold(0, usize::saturating_add)
    }

    /// Grid jobs: the files component `i` reads, the job's and its own.
    pub fn component_inputs(&self, i: usize) -> Vec<String> {
        let own = self.components.get(i).map(|c| c.inputs.as_slice());
        self.inputs
            .iter()
            .chain(own.unwrap_or_default())
            .cloned()
            .collect()
    }

    /// The results directory, relative to the runner's results root (or,
    /// with many users, to the owner's area in it).
    pub fn results_dir(&self, job: &str) -> PathBuf {
        self.results
            .clone()
            .unwrap_or_else(|| Self::default_results_dir(job))
    }

    /// Where a job's results go when its manifest does not say.
    pub fn default_results_dir(job: &str) -> PathBuf {
        PathBuf::from("results").join(job)
    }

    /// Each of its tasks' slots and needs.
    pub fn task_shape(&self) -> TaskShape {
        TaskShape {
            slots: self.slots,
            needs: self.task_needs(),
        }
    }

    /// The final step's shape, where it has one of its own unlike the
    /// tasks'.
    pub fn final_shape(&self) -> Option<TaskShape> {
        let step = self.final_step.as_ref()?;
        let tasks = self.task_shape();
        let shape = TaskShape {
            slots: step.slots.unwrap_or(tasks.slots),
            needs: Needs {
                memory_mb: step.memory.map_or(tasks.needs.memory_mb, |m| m.0),
                gpus: step.gpus.unwrap_or(tasks.needs.gpus),
            },
        };
        (shape != tasks).then_some(shape)
    }

    /// What each of its tasks needs beside its slots.
    pub fn task_needs(&self) -> Needs {
        Needs {
            memory_mb: self.memory.map_or(0, |m| m.0),
            gpus: self.gpus,
        }
    }

    /// What every task of the job weighs alike as a message (as
    /// `TaskMsg::weight` counts it): its environment, outputs and
    /// directory, and room for the rest.
    pub fn task_base_bytes(&self) -> usize {
        let env: usize = self
            .env
            .iter()
            .map(|(k, v)| k.len() + v.len() + ENV_ENTRY_BYTES)
            .sum();
        let outputs: usize = self.outputs.iter().map(|o| o.len() + ENV_ENTRY_BYTES).sum();
        let workdir = self.workdir.as_ref().map_or(0, |w| w.as_os_str().len());
        env + outputs + workdir + TASK_FIXED_BYTES
    }

    /// Refuses `tasks` (numbered from `first` in the job) if the heaviest
    /// of them, with what every task of this job carries, weighs more
    /// than [`MAX_TASK_BYTES`] as a message: the user hears which, at
    /// submit or at add, rather than the runner failing to publish it.
    pub fn check_task_bytes(&self, tasks: &TaskList, first: u64) -> Result<(), ManifestError> {
        let Some((index, bytes)) = tasks.largest() else {
            return Ok(());
        };
        let bytes = self.task_base_bytes().saturating_add(bytes);
        if bytes <= MAX_TASK_BYTES {
            return Ok(());
        }
        let field = match index < tasks.fixed_len() {
            true => format!("task[{index}].command"),
            false => "sweep.command".to_owned(),
        };
        let task = format!("task {}", first.saturating_add(index));
        Err(too_heavy(&field, &task, bytes))
    }

    /// The priority this job is placed with.
    /// Grid jobs: how long the job may take to gather after its placement.
    pub fn barrier_timeout(&self) -> Duration {
        self.barrier_timeout.unwrap_or(DEFAULT_BARRIER_TIMEOUT)
    }

    /// Grid jobs: the fraction of components that must have started for
    /// a claiming try to place the others again (KOALA's T).
    pub fn claim_threshold(&self) -> f64 {
        self.claim_threshold.unwrap_or(1.0)
    }

    pub fn effective_priority(&self) -> Priority {
        match self.kind {
            JobKind::Scavenge => Priority::SuperLow,
            JobKind::Grid => self.priority.unwrap_or_default(),
        }
    }
}

/// Walltimes are written as humantime durations (`"10m"`, `"1h30m"`).
mod walltime {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        humantime::parse_duration(&text).map(Some).map_err(|e| {
            D::Error::custom(format!(
                "walltime: {text:?} is not a duration ({e}); write it like \"90s\", \"10m\" or \"1h30m\""
            ))
        })
    }
}

/// What `TaskMsg::weight` allows a task for its fixed fields.
const TASK_FIXED_BYTES: usize = 256;

/// A final step's own variables: `GLEANER_FINAL` and `GLEANER_RESULTS`
/// (its results directory, a path).
const FINAL_ENV_BYTES: usize = 2 * ENV_ENTRY_BYTES + 64 + 4096;

/// Why `what` (a task, the final step) may not run: it weighs `bytes`.
fn too_heavy(field: &str, what: &str, bytes: usize) -> ManifestError {
    ManifestError::invalid(
        field,
        format!(
            "{what} would take {:.1} MiB as a message (its command, parameters and environment); a task may take at most {} MiB: pass large data in files",
            bytes as f64 / f64::from(1 << 20),
            MAX_TASK_BYTES >> 20
        ),
    )
}

/// The most components a grid job may have: its placement, its report
/// and `job.json` hold something of each.
pub const MAX_COMPONENTS: usize = 1024;

/// The most bytes of input paths a grid job's components name together,
/// the job's `inputs` counted once for each: a component's order to its
/// kcm carries its own, and the scheduler holds each component's.
pub const MAX_INPUT_BYTES: usize = 4 << 20;

/// The most input files a grid job may name.
pub const MAX_INPUTS: usize = 1000;

/// Input paths are absolute, without `..`, and printable: a staging
/// command gets them as arguments.
fn check_inputs(field: &str, inputs: &[String]) -> Result<(), ManifestError> {
    if inputs.len() > MAX_INPUTS {
        return Err(ManifestError::invalid(
            field,
            format!("at most {MAX_INPUTS} files"),
        ));
    }
    for input in inputs {
        let path = std::path::Path::new(input);
        let plain = input.len() <= 4096
            && !input.chars().any(char::is_control)
            && path.is_absolute()
            && path
                .components()
                .all(|c| !matches!(c, std::path::Component::ParentDir));
        if !plain {
            return Err(ManifestError::invalid(
                field,
                format!("{input:?} is not an absolute path without `..`"),
            ));
        }
    }
    Ok(())
}

/// A name a shell can export: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_env_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests;
