//! A simulation scenario: clusters, scavenging jobs and background load.

use std::{path::PathBuf, time::Duration};

use gleaner_kcm_core::{config::ClusterConfig, core::CoreConfig};
use gleaner_launcher_core::LauncherSettings;
use gleaner_manifest::{Manifest, TaskList};
use gleaner_policy::share::CsPolicy;
use gleaner_protocol::ClusterName;
use gleaner_runner_core::JobSettings;
use gleaner_scheduler_core::{SchedulerConfig, state::StateConfig};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// Seeds the background load; the same seed gives the same local and
    /// grid jobs under every policy.
    #[serde(default)]
    pub seed: u64,
    /// Policies to compare; gleaner's two (site and grid equipartition)
    /// when empty.
    #[serde(default)]
    pub policies: Vec<CsPolicy>,
    #[serde(default)]
    pub timing: Timing,
    /// Where KOALA-CS chose otherwise than gleaner (seed 000): gleaner's
    /// choices when left out.
    #[serde(default)]
    pub choices: Choices,
    /// The scheduler's settings, as `[scheduler]` of `gleaner.toml` has
    /// them (but the policy, which `policies` names): those left out keep
    /// the scheduler's defaults.
    #[serde(default)]
    pub scheduler: StateConfig,
    #[serde(rename = "cluster")]
    pub clusters: Vec<ClusterSpec>,
    #[serde(rename = "job")]
    pub jobs: Vec<JobSpec>,
    #[serde(default)]
    pub local_jobs: LocalJobs,
    #[serde(default)]
    pub grid_jobs: GridJobs,
    /// Seed 002's experiment on a `trace` workload: this many seeds, each
    /// run without reallocation and with each (algorithm, heuristic) pair.
    #[serde(default)]
    pub reallocation_seeds: u64,
}

/// The shortest of a scenario's periodic intervals: the simulator wakes up
/// at each, and one of nothing would hold its clock still.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// How fast the simulated system reacts. The services' intervals default
/// to the services' own defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timing {
    /// How often each kcm reads its batch system (`poll_interval`).
    #[serde(with = "humantime_serde")]
    pub kcm_poll: Duration,
    /// How often the scheduler runs a round (`round_interval`).
    #[serde(with = "humantime_serde")]
    pub scheduler_round: Duration,
    /// From a grow to the launcher taking its first task (the batch
    /// system's dispatch and the launcher's start).
    #[serde(with = "humantime_serde")]
    pub launcher_start: Duration,
    /// From a launcher's leaving (preempted, drained, idle or its job
    /// over) to its slot being free.
    #[serde(with = "humantime_serde")]
    pub preempt_delay: Duration,
    /// The runner's `preempt_grace`: how long a preempted launcher has
    /// before the kcm removes it.
    #[serde(with = "humantime_serde")]
    pub preempt_grace: Duration,
    /// How often each job's runner reports to the scheduler (the runner's
    /// `heartbeat`).
    #[serde(with = "humantime_serde")]
    pub job_report: Duration,
    /// How often each launcher tells its runner it is alive (the
    /// launcher's `heartbeat`, from which the runner's silence rule follows).
    #[serde(with = "humantime_serde")]
    pub launcher_heartbeat: Duration,
    /// How long a launcher with no task waits for one before it gives its
    /// slot back (the launcher's `idle_timeout`).
    #[serde(with = "humantime_serde")]
    pub launcher_idle: Duration,
    /// Resolution of the load plot.
    #[serde(with = "humantime_serde")]
    pub sample: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        let runner = JobSettings::default();
        Self {
            kcm_poll: Duration::from_secs(1),
            scheduler_round: SchedulerConfig::default().round_interval,
            launcher_start: Duration::from_secs(2),
            preempt_delay: Duration::from_secs(1),
            preempt_grace: runner.preempt_grace,
            job_report: runner.heartbeat,
            launcher_heartbeat: LauncherSettings::default().heartbeat,
            launcher_idle: LauncherSettings::default().idle_timeout,
            sample: Duration::from_secs(30),
        }
    }
}

impl Timing {
    /// The settings of the kcm of `cluster`'s core, derived as the kcm
    /// derives them; the kcm's account is the one the simulated batch
    /// system shows gleaner's jobs as.
    pub fn kcm(&self, cluster: &ClusterSpec) -> CoreConfig {
        let config = ClusterConfig {
            poll_interval: Some(self.kcm_poll),
            speed: cluster.speed,
            ..ClusterConfig::local(cluster.name.as_str(), cluster.nodes)
        };
        config.core(
            self.preempt_grace,
            crate::batch::SIMULATED_ACCOUNT.to_owned(),
        )
    }

    /// The `[launcher]` settings of every simulated launcher.
    pub fn launcher(&self) -> LauncherSettings {
        LauncherSettings {
            heartbeat: self.launcher_heartbeat,
            idle_timeout: self.launcher_idle,
            ..LauncherSettings::default()
        }
    }

    /// The settings of every job's runner, resolved as the runner's are.
    pub fn runner(&self) -> JobSettings {
        JobSettings {
            heartbeat: self.job_report,
            launcher_heartbeat: self.launcher_heartbeat,
            preempt_grace: self.preempt_grace,
            ..JobSettings::default()
        }
    }
}

/// Choices KOALA-CS made otherwise than gleaner, to rerun its thesis's
/// fairness experiments (seed 000, sections 3.7.2 and 4.4) as it ran
/// them; each draws from the scenario's `seed`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Choices {
    /// Which task a launcher that asks for work gets.
    pub task: TaskChoice,
    /// Which of a job's launchers on a cluster a shrink takes back.
    pub preemption: PreemptionChoice,
    /// Each running launcher dies silently (its placeholder gone as a
    /// crashed job, nothing said to its runner) at this Poisson rate: its
    /// runner finds out by its missing heartbeats, as KOALA-CS's runners
    /// counted launcher time-outs, and its task runs again.
    pub launcher_failures_per_hour: f64,
}

/// Which task a launcher gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskChoice {
    /// The head of the job's task queue, as the broker hands it out.
    #[default]
    Queue,
    /// Any task of those waiting, at random: KOALA-CS's Single task
    /// Launcher Pull.
    Random,
}

/// Which launchers a shrink takes back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PreemptionChoice {
    /// The runner's: idle ones first, then those losing least work.
    #[default]
    Gleaner,
    /// A random set of the job's launchers there: KOALA-CS's launcher
    /// preemption policy.
    Random,
}

impl Choices {
    /// How the runner of the job numbered `job` chooses the launchers a
    /// shrink takes back.
    pub fn victims(&self, seed: u64, job: usize) -> gleaner_policy::preempt::VictimChoice {
        use gleaner_policy::preempt::VictimChoice;
        match self.preemption {
            PreemptionChoice::Gleaner => VictimChoice::LeastLoss,
            PreemptionChoice::Random => VictimChoice::Random {
                seed: mix(seed, draw::PREEMPTION, job as u64),
            },
        }
    }
}

/// What each of the simulation's own draws is for (see [`mix`]).
pub mod draw {
    /// Which launchers die, and when.
    pub const FAILURES: u64 = 0x6661_696c_7572_6573;
    /// Which task a launcher gets.
    pub const TASKS: u64 = 0x7461_736b_7321_2121;
    /// Which launchers a shrink takes back.
    pub const PREEMPTION: u64 = 0x7072_6565_6d70_7421;
}

/// A seed of its own for each use (`what`, of [`draw`]) and job or
/// cluster (`n`), so that one draw does not shift another's, nor the
/// background load's.
pub fn mix(seed: u64, what: u64, n: u64) -> u64 {
    let mut state = seed ^ what ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    gleaner_policy::preempt::splitmix64(&mut state)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub name: ClusterName,
    pub nodes: u32,
    /// Task speed relative to the reference node (a task of duration `d`
    /// takes `d / speed`).
    #[serde(default = "one")]
    pub speed: f64,
    /// Mean fraction of the nodes the cluster's own jobs use.
    #[serde(default)]
    pub local_load: f64,
    /// Nodes of the `nodes` with a GPU each: the batch system counts the
    /// GPUs, gives them to the jobs that ask, and others' jobs there only
    /// once the other nodes are full.
    #[serde(default)]
    pub gpu_nodes: u32,
    /// How its batch system orders its queue by walltimes (`fcfs`,
    /// `easy`, `conservative`); without one, grid components go first and
    /// local jobs follow in order as they fit.
    #[serde(default)]
    pub batch_scheduler: Option<gleaner_policy::ect::Discipline>,
}

fn one() -> f64 {
    1.0
}

/// A scavenging job: a sweep of `tasks` tasks, as its runner's core
/// opens it.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "JobToml")]
pub struct JobSpec {
    pub name: String,
    /// On a node of speed 1.
    pub task_duration: Duration,
    /// Its tasks save their state when preempted and resume from it.
    pub checkpoints: bool,
    /// When it is submitted, into the run: its runner starts then, and
    /// holds nothing before.
    pub start_after: Duration,
    pub manifest: Manifest,
    pub task_list: TaskList,
}

/// A `[[job]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobToml {
    name: String,
    tasks: u64,
    #[serde(with = "humantime_serde")]
    task_duration: Duration,
    /// Its weight in fair shares, as a manifest's `weight`.
    #[serde(default = "weight_one")]
    weight: u32,
    /// Its tasks save their state when preempted (`$GLEANER_CHECKPOINT`)
    /// and resume from it.
    #[serde(default)]
    checkpoints: bool,
    /// GPUs each task needs, as a manifest's `gpus` (0 or 1: a task takes
    /// one node).
    #[serde(default)]
    gpus: u32,
    /// When it is submitted, into the run (`0s`: at the start), as jobs
    /// started by hand one after the other are.
    #[serde(default, with = "humantime_serde")]
    start_after: Duration,
}

fn weight_one() -> u32 {
    1
}

impl TryFrom<JobToml> for JobSpec {
    type Error = String;

    /// The manifest is made, and refused, here: the simulation cannot
    /// fail once it has its scenario.
    fn try_from(job: JobToml) -> Result<Self, String> {
        let last = job
            .tasks
            .checked_sub(1)
            .ok_or_else(|| format!("job {}: at least one task is needed", job.name))?;
        if job.gpus > 1 {
            return Err(format!(
                "job {}: a simulated task takes one node, of one GPU at most",
                job.name
            ));
        }
        let text = format!(
            "name = {}\nweight = {}\ngpus = {}\n[sweep]\ncommand = \"task {{i}}\"\nparams = {{ i = {{ from = 0, to = {last} }} }}\n",
            toml::Value::from(job.name.as_str()),
            job.weight,
            job.gpus
        );
        let invalid = |e: gleaner_manifest::ManifestError| format!("job {}: {e}", job.name);
        let manifest = Manifest::from_toml(&text).map_err(invalid)?;
        let task_list = TaskList::new(&manifest).map_err(invalid)?;
        Ok(Self {
            name: job.name,
            task_duration: job.task_duration,
            checkpoints: job.checkpoints,
            start_after: job.start_after,
            manifest,
            task_list,
        })
    }
}

/// The cluster's own jobs: Poisson arrivals sized to `local_load`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalJobs {
    /// Nodes per job, drawn uniformly from this range.
    pub nodes: [u32; 2],
    /// Mean run time (exponentially distributed).
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// The fraction of them that want GPU nodes only.
    pub gpu_share: f64,
}

impl Default for LocalJobs {
    fn default() -> Self {
        Self {
            nodes: [1, 8],
            duration: Duration::from_secs(600),
            gpu_share: 0.0,
        }
    }
}

/// Which background grid jobs run (seed 000, section 4.4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GridWorkload {
    /// None but the cluster's own.
    #[default]
    Free,
    /// One job in each period, at a random moment in it.
    Block,
    /// One job at the start of each period.
    Spike,
    /// KOALA's co-allocation experiment (seed 001, section 5): `jobs` jobs
    /// arriving as a Poisson process, each of one of `sizes` nodes split
    /// into one of `component_counts` equal components of at least
    /// `min_component` nodes, running between the two `lengths_s`, of
    /// high priority with `high_share`'s odds (low otherwise).
    Poisson,
    /// Seed 002's: the rigid jobs of a workload ([`Trace`]), a share of
    /// them through gleaner as one-component grid jobs with their
    /// requested walltimes, the others to a cluster's own queue.
    Trace,
}

/// A workload to replay: a Standard Workload Format log or the Lublin-
/// Feitelson model, each job through gleaner with `through_gleaner`'s
/// odds, else to a cluster it fits on, picked at random.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    #[serde(default)]
    pub swf: Option<PathBuf>,
    #[serde(default)]
    pub lublin: Option<crate::workload::Lublin>,
    #[serde(default = "one")]
    pub through_gleaner: f64,
    /// The log's jobs, read when the scenario is.
    #[serde(skip)]
    pub loaded: Vec<crate::workload::WorkloadJob>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GridJobs {
    pub workload: GridWorkload,
    #[serde(with = "humantime_serde")]
    pub period: Duration,
    /// Nodes of each grid job, split into `components` equal components.
    pub nodes: u32,
    pub components: u32,
    #[serde(with = "humantime_serde")]
    pub length: Duration,
    /// `poisson`: how many jobs, and their mean interarrival time.
    pub jobs: u32,
    #[serde(with = "humantime_serde")]
    pub interarrival: Duration,
    pub sizes: Vec<u32>,
    pub component_counts: Vec<u32>,
    pub min_component: u32,
    pub lengths_s: [f64; 2],
    /// High-priority jobs' lengths, where they differ (seed 003's short
    /// jobs that may stop long ones).
    pub high_lengths_s: Option<[f64; 2]>,
    pub high_share: f64,
    /// Every grid job's `claim_threshold` (KOALA's T) and `barrier_timeout`.
    pub claim_threshold: f64,
    #[serde(with = "humantime_serde")]
    pub barrier_timeout: Duration,
    /// `trace`: the workload.
    pub trace: Option<Trace>,
}

impl Default for GridJobs {
    fn default() -> Self {
        Self {
            workload: GridWorkload::Free,
            period: Duration::from_secs(1200),
            nodes: 100,
            components: 4,
            length: Duration::from_secs(600),
            jobs: 0,
            interarrival: Duration::from_secs(60),
            sizes: vec![36, 72],
            component_counts: vec![3, 4, 6, 8],
            min_component: 9,
            lengths_s: [30.0, 192.0],
            high_lengths_s: None,
            high_share: 0.0,
            claim_threshold: 1.0,
            barrier_timeout: Duration::from_secs(600),
            trace: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("{0}")]
    Parse(String),
    #[error("{0}")]
    Invalid(String),
}

impl Scenario {
    pub fn from_toml(text: &str) -> Result<Self, ScenarioError> {
        let mut scenario: Scenario =
            toml::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
        let table: toml::Table =
            toml::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
        if let Some(scheduler) = table.get("scheduler").and_then(toml::Value::as_table) {
            check_scheduler_keys(scheduler)?;
        }
        scenario.validate()?;
        if let Some(trace) = scenario.grid_jobs.trace.as_mut()
            && let Some(path) = &trace.swf
        {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ScenarioError::Invalid(format!("cannot read {}: {e}", path.display()))
            })?;
            trace.loaded = crate::workload::parse_swf(&text)
                .map_err(|e| ScenarioError::Invalid(format!("{}: {e}", path.display())))?
                .jobs;
        }
        Ok(scenario)
    }

    fn validate(&self) -> Result<(), ScenarioError> {
        let invalid = |m: String| Err(ScenarioError::Invalid(m));
        let workload = self.grid_jobs.workload != GridWorkload::Free;
        if self.clusters.is_empty() || (self.jobs.is_empty() && !workload) {
            return invalid(
                "a scenario needs at least one [[cluster]], and one [[job]] or grid jobs".into(),
            );
        }
        // Each is a wake-up of its own: time must move on between two.
        let timing = &self.timing;
        for (key, every) in [
            ("kcm_poll", timing.kcm_poll),
            ("scheduler_round", timing.scheduler_round),
            ("job_report", timing.job_report),
            ("launcher_heartbeat", timing.launcher_heartbeat),
            ("sample", timing.sample),
        ] {
            if every < MIN_INTERVAL {
                return invalid(format!(
                    "timing.{key} must be at least {} ms",
                    MIN_INTERVAL.as_millis()
                ));
            }
        }
        if self.grid_jobs.workload == GridWorkload::Trace {
            let Some(trace) = &self.grid_jobs.trace else {
                return invalid("the trace workload needs [grid_jobs.trace]".into());
            };
            if !(0.0..=1.0).contains(&trace.through_gleaner) {
                return invalid("grid_jobs.trace.through_gleaner must be between 0 and 1".into());
            }
            match (&trace.swf, &trace.lublin) {
                (Some(_), None) => {}
                (None, Some(lublin)) => lublin
                    .check()
                    .map_err(|e| ScenarioError::Invalid(e.to_string()))?,
                _ => return invalid("grid_jobs.trace needs one of swf and lublin".into()),
            }
        }
        for c in &self.clusters {
            if c.nodes == 0
                || c.speed <= 0.0
                || !(0.0..1.0).contains(&c.local_load)
                || c.gpu_nodes > c.nodes
            {
                return invalid(format!(
                    "cluster {}: nodes > 0, speed > 0, 0 <= local_load < 1 and gpu_nodes <= nodes are needed",
                    c.name
                ));
            }
        }
        for j in &self.jobs {
            if gleaner_manifest::JobId::new(&j.name, 0)
                .to_string()
                .parse::<gleaner_manifest::JobId>()
                .is_err()
            {
                return invalid(format!(
                    "job name {:?} must be [A-Za-z0-9._-]{{1,64}}",
                    j.name
                ));
            }
            if j.task_duration.is_zero() {
                return invalid(format!(
                    "job {}: task_duration must be longer than 0s",
                    j.name
                ));
            }
            if j.start_after >= self.duration {
                return invalid(format!(
                    "job {}: start_after must be before the end of the run",
                    j.name
                ));
            }
        }
        let failures = self.choices.launcher_failures_per_hour;
        if !(failures.is_finite() && failures >= 0.0) {
            return invalid("choices.launcher_failures_per_hour must be 0 or more".into());
        }
        if !(0.0..=1.0).contains(&self.scheduler.policy.load_cap) {
            return invalid("scheduler.load_cap must be between 0 and 1".into());
        }
        let [low, high] = self.local_jobs.nodes;
        if low == 0 || high < low {
            return invalid("local_jobs.nodes must be [min, max] with 1 <= min <= max".into());
        }
        if !(0.0..=1.0).contains(&self.local_jobs.gpu_share) {
            return invalid("local_jobs.gpu_share must be between 0 and 1".into());
        }
        let g = &self.grid_jobs;
        if matches!(g.workload, GridWorkload::Block | GridWorkload::Spike)
            && (g.components == 0 || g.nodes < g.components || g.period.is_zero())
        {
            return invalid("grid_jobs: nodes >= components >= 1 and a period are needed".into());
        }
        if g.workload == GridWorkload::Poisson {
            let splits = g.sizes.iter().all(|size| {
                g.component_counts
                    .iter()
                    .any(|n| *n > 0 && size / n >= g.min_component.max(1))
            });
            if g.jobs == 0
                || g.interarrival.is_zero()
                || !splits
                || !(0.0..=1.0).contains(&g.high_share)
                || !(g.claim_threshold > 0.0 && g.claim_threshold <= 1.0)
                || g.barrier_timeout.is_zero()
                || [Some(g.lengths_s), g.high_lengths_s]
                    .iter()
                    .flatten()
                    .any(|[a, b]| !(0.0 < *a && a <= b))
            {
                return invalid(
                    "grid_jobs (poisson): jobs, an interarrival, sizes each split by some component count into components of min_component nodes, 0 < lengths_s[0] <= lengths_s[1], high_share in [0, 1]".into(),
                );
            }
        }
        Ok(())
    }

    /// The scheduler's configuration for a run under `policy`.
    pub fn state_config(&self, policy: CsPolicy) -> StateConfig {
        let mut config = self.scheduler.clone();
        config.policy.policy = policy;
        config
    }

    /// The policies to run: those named, or gleaner's two.
    pub fn policies(&self) -> Vec<CsPolicy> {
        if self.policies.is_empty() {
            vec![CsPolicy::SiteEquipartition, CsPolicy::GridEquipartition]
        } else {
            self.policies.clone()
        }
    }
}

/// The scheduler's settings flatten several types into one table, which
/// serde cannot hold to known keys: they are checked against the
/// settings' own defaults, written out. The policy is not among them: a
/// scenario names the policies it compares in `policies`.
fn check_scheduler_keys(given: &toml::Table) -> Result<(), ScenarioError> {
    let known = serde_json::to_value(StateConfig::default())
        .map_err(|e| ScenarioError::Invalid(e.to_string()))?;
    for key in given.keys() {
        if key == "policy" {
            return Err(ScenarioError::Invalid(
                "the policies to compare go in `policies`, not `scheduler.policy`".into(),
            ));
        }
        if known.get(key).is_none() {
            return Err(ScenarioError::Invalid(format!(
                "unknown setting `scheduler.{key}`"
            )));
        }
    }
    Ok(())
}
