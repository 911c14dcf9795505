//! A cluster as the configuration describes it (`[[cluster]]`), and what a
//! kcm's core derives from it (its backend's settings are the shell's,
//! `gleaner_kcm::ClusterSettings`). Defaults live here and nowhere else.

use std::{path::PathBuf, time::Duration};

use gleaner_manifest::Memory;
use gleaner_protocol::ClusterName;
use serde::{Deserialize, Serialize};

use crate::{Cap, core::CoreConfig};

/// Which batch system runs the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Launchers as child processes of the kcm.
    Local,
    /// Son of Grid Engine: placeholders as array jobs.
    Sge,
    /// Slurm: placeholders as array jobs.
    Slurm,
}

/// One `[[cluster]]` table.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub name: ClusterName,
    pub backend: BackendKind,
    /// `local`: slots of the cluster (tasks that may run at once).
    #[serde(default)]
    pub slots: Option<u32>,
    /// Slots of each launcher: 1 is a launcher per core; more is one per node.
    #[serde(default = "one")]
    pub launcher_slots: u32,
    /// How often the batch system is read while gleaner holds or waits for
    /// slots here: how soon a local job waiting behind a placeholder is
    /// seen. By default half a second on the local backend, which costs
    /// nobody, and 2 s on a batch system, whose master every user shares.
    #[serde(default, with = "humantime_serde")]
    pub poll_interval: Option<Duration>,
    /// How often while gleaner has nothing here: the reading only keeps the
    /// scheduler's view of the cluster fresh. By default `poll_interval`
    /// on the local backend, 15 s on a batch system.
    #[serde(default, with = "humantime_serde")]
    pub idle_poll_interval: Option<Duration>,
    /// `sge`: the cluster queue placeholders go to.
    #[serde(default)]
    pub queue: Option<String>,
    /// `sge`: the parallel environment that keeps a job's slots on one host
    /// (`allocation_rule $pe_slots`), for multi-slot launchers.
    #[serde(default = "default_pe_one_host")]
    pub pe_one_host: String,
    /// `sge`: the parallel environment for grid components, spread over
    /// hosts (`$round_robin` or `$fill_up`).
    #[serde(default = "default_pe_spread")]
    pub pe_spread: String,
    /// `sge`, `slurm`: walltime of each placeholder (`-l h_rt`, `--time`).
    #[serde(default, alias = "walltime", with = "humantime_serde")]
    pub h_rt: Option<Duration>,
    /// `slurm`: the least time a placeholder may be started with
    /// (`--time-min`), so that backfill starts it in a hole shorter than
    /// its walltime; its launcher then takes only tasks that end in the
    /// time given. 10 minutes by default, at most the walltime.
    #[serde(default, with = "humantime_serde")]
    pub min_walltime: Option<Duration>,
    /// `slurm`: the partition placeholders go to.
    #[serde(default)]
    pub partition: Option<String>,
    /// `slurm`: the QOS of placeholders.
    #[serde(default)]
    pub qos: Option<String>,
    /// `slurm`: the account placeholders are charged to.
    #[serde(default)]
    pub account: Option<String>,
    /// `slurm`: the nice value of placeholders (above 0: behind the
    /// cluster's own jobs).
    #[serde(default)]
    pub nice: Option<i32>,
    /// The `gleaner` binary on the cluster's nodes, when it is not where the
    /// kcm's own is (default: the kcm's own path).
    #[serde(default)]
    pub launcher_program: Option<PathBuf>,
    /// `sge`, `slurm`: where placeholders' output goes (discarded when unset).
    #[serde(default)]
    pub log_dir: Option<PathBuf>,
    /// How long a batch-system command may take before it counts as failed.
    #[serde(default = "default_command_timeout", with = "humantime_serde")]
    pub command_timeout: Duration,
    /// A placeholder or grid component waiting in the batch queue longer
    /// than this (a queue limit, a host down, a hold) is withdrawn: its
    /// slots are offered elsewhere, the component placed again.
    #[serde(default = "default_max_pending", with = "humantime_serde")]
    pub max_pending: Duration,
    /// Paths the cluster's nodes see as the submitters do: grid jobs'
    /// inputs under them need no staging here.
    #[serde(default)]
    pub shared_paths: Vec<PathBuf>,
    /// The program (and its first arguments) that copies a grid
    /// component's other inputs to where the nodes see them, run as the
    /// component's account with the job id, the component number and the
    /// input paths after them; without one, such a component cannot run
    /// here. The inputs' paths must then be the same on the nodes.
    #[serde(default)]
    pub stage_command: Vec<String>,
    /// How long a staging may take.
    #[serde(default = "default_stage_timeout", with = "humantime_serde")]
    pub stage_timeout: Duration,
    /// How fast the cluster's nodes run a job against a reference node (a
    /// grid job's walltime is for speed 1): estimates of completion times
    /// divide walltimes by it.
    #[serde(default = "default_speed")]
    pub speed: f64,
    /// At most this many of the cluster's slots are scavenged (`16`, or
    /// `"50%"` of them): the grid is not filled up entirely.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_scavenged: Option<Cap>,
    /// Hosts kept free of placeholders, for local jobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserve_hosts: Vec<String>,
    /// `local`: memory of the cluster that launchers may hold (`"16G"`);
    /// unset, memory is not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// `local`: the cluster's GPUs; `sge`: each host's GPUs (the same
    /// names on every host), from which a launcher claims those its
    /// placeholder was granted. Slurm assigns its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// `sge`: the consumable complex that counts memory per slot.
    #[serde(default = "default_memory_resource")]
    pub memory_resource: String,
    /// `sge`: the consumable complex that counts GPUs per job
    /// (`consumable JOB`); `slurm`: the generic resource (`--gres`).
    #[serde(default = "default_gpu_resource")]
    pub gpu_resource: String,
    /// Where grid job components leave their output and exit status; the
    /// cluster's nodes must see it (default: a directory under the system's
    /// temporary directory).
    #[serde(default)]
    pub spool_dir: Option<PathBuf>,
}

fn one() -> u32 {
    1
}

fn default_memory_resource() -> String {
    "mem_free".to_owned()
}

fn default_gpu_resource() -> String {
    "gpu".to_owned()
}

fn default_pe_one_host() -> String {
    "smp".to_owned()
}

fn default_pe_spread() -> String {
    "make".to_owned()
}

fn default_command_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_speed() -> f64 {
    1.0
}

fn default_max_pending() -> Duration {
    Duration::from_secs(60)
}

fn default_stage_timeout() -> Duration {
    Duration::from_secs(3600)
}

/// How soon a waiting local job is seen is how long gleaner keeps it
/// waiting before it starts giving back: a quarter of a second on average
/// on the local backend, a second on a batch system, where one reading
/// (`qstat`, or `squeue` and at times `sinfo`) every 2 s keeps gleaner's
/// queries to the master under one a second.
const LOCAL_POLL_INTERVAL: Duration = Duration::from_millis(500);
const BATCH_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Idle, a batch system is read only to keep the scheduler's view of it
/// fresh, well within the 30 s after which the scheduler gives a silent
/// cluster nothing.
const BATCH_IDLE_POLL_INTERVAL: Duration = Duration::from_secs(15);

/// The least time a Slurm placeholder is started with by default: a few
/// tasks of minutes, past the minute's warning before its end.
pub const MIN_WALLTIME: Duration = Duration::from_secs(600);

/// How long the launchers of an ended job have to leave by themselves
/// before their placeholders are removed.
const JOB_END_GRACE: Duration = Duration::from_secs(10);

impl ClusterConfig {
    /// A local-backend cluster of `slots` slots with every other setting at
    /// its default (what `gleaner up` runs).
    pub fn local(name: &str, slots: u32) -> Self {
        Self {
            name: name.into(),
            backend: BackendKind::Local,
            slots: Some(slots),
            launcher_slots: one(),
            poll_interval: None,
            idle_poll_interval: None,
            queue: None,
            pe_one_host: default_pe_one_host(),
            pe_spread: default_pe_spread(),
            h_rt: None,
            min_walltime: None,
            partition: None,
            qos: None,
            account: None,
            nice: None,
            launcher_program: None,
            log_dir: None,
            command_timeout: default_command_timeout(),
            max_pending: default_max_pending(),
            shared_paths: Vec::new(),
            stage_command: Vec::new(),
            stage_timeout: default_stage_timeout(),
            speed: default_speed(),
            max_scavenged: None,
            reserve_hosts: Vec::new(),
            memory: None,
            gpus: Vec::new(),
            memory_resource: default_memory_resource(),
            gpu_resource: default_gpu_resource(),
            spool_dir: None,
        }
    }

    /// Why this table cannot describe a cluster, if it cannot.
    pub fn validate(&self) -> Result<(), String> {
        let name = self.name.as_str();
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid {
            return Err(format!(
                "cluster name {name:?} must be made of A-Z a-z 0-9 . _ -"
            ));
        }
        if let Some(Cap::Fraction(f)) = self.max_scavenged
            && !(0.0..=1.0).contains(&f)
        {
            return Err(format!(
                "cluster {}: max_scavenged must be between 0% and 100%",
                self.name
            ));
        }
        let resource_name = |name: &str| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
        };
        if let Some(device) = self.gpus.iter().find(|d| !resource_name(d)) {
            return Err(format!(
                "cluster {}: GPU {device:?} must be named with A-Z a-z 0-9 . _ - :",
                self.name
            ));
        }
        for (field, name) in [
            ("memory_resource", &self.memory_resource),
            ("gpu_resource", &self.gpu_resource),
        ] {
            if !resource_name(name) || name.contains(':') {
                return Err(format!(
                    "cluster {}: {field} {name:?} must be made of A-Z a-z 0-9 . _ -",
                    self.name
                ));
            }
        }
        if self.max_pending.is_zero() {
            return Err("cluster.max_pending must be longer than 0s".to_owned());
        }
        if !(self.speed.is_finite() && (0.01..=100.0).contains(&self.speed)) {
            return Err(format!(
                "cluster {}: speed must be between 0.01 and 100, not {}",
                self.name, self.speed
            ));
        }
        if self.busy_poll().is_zero() {
            return Err("cluster.poll_interval must be longer than 0s".to_owned());
        }
        if self.idle_poll() < self.busy_poll() {
            return Err(format!(
                "cluster {}: idle_poll_interval must be at least poll_interval",
                self.name
            ));
        }
        match self.backend {
            BackendKind::Local if self.slots.is_none() => Err(format!(
                "cluster {}: the local backend needs `slots`",
                self.name
            )),
            BackendKind::Sge if self.queue.is_none() => Err(format!(
                "cluster {}: the sge backend needs `queue`",
                self.name
            )),
            BackendKind::Slurm if self.partition.is_none() => Err(format!(
                "cluster {}: the slurm backend needs `partition`",
                self.name
            )),
            _ => Ok(()),
        }
    }

    /// How often the batch system is read while gleaner holds or waits for
    /// slots here.
    pub fn busy_poll(&self) -> Duration {
        self.poll_interval.unwrap_or(match self.backend {
            BackendKind::Local => LOCAL_POLL_INTERVAL,
            BackendKind::Sge | BackendKind::Slurm => BATCH_POLL_INTERVAL,
        })
    }

    /// How often while gleaner has nothing here.
    pub fn idle_poll(&self) -> Duration {
        self.idle_poll_interval.unwrap_or(match self.backend {
            BackendKind::Local => self.busy_poll(),
            BackendKind::Sge | BackendKind::Slurm => BATCH_IDLE_POLL_INTERVAL.max(self.busy_poll()),
        })
    }

    /// The core's settings, `account` the kcm's own. A shrink for waiting
    /// local jobs gets the runners' `preempt_grace` and two polls to take
    /// effect before the same jobs are answered again.
    pub fn core(&self, preempt_grace: Duration, account: String) -> CoreConfig {
        let backend = match self.backend {
            BackendKind::Local => "local",
            BackendKind::Sge => "sge",
            BackendKind::Slurm => "slurm",
        };
        CoreConfig {
            cluster: self.name.clone(),
            backend: backend.to_owned(),
            job_end_grace: JOB_END_GRACE,
            local_settle: preempt_grace.saturating_add(self.busy_poll().saturating_mul(2)),
            poll_interval: self.busy_poll(),
            idle_poll_interval: self.idle_poll(),
            max_pending: self.max_pending,
            max_scavenged: self.max_scavenged,
            reserve_hosts: self.reserve_hosts.clone(),
            account,
            users: gleaner_policy::access::Users::default(),
            inputs: gleaner_protocol::InputAccess {
                shared: self
                    .shared_paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
                stages: !self.stage_command.is_empty(),
                stage_s: None,
            },
            speed: self.speed,
        }
    }

    /// One line for people: `c1 (sge queue c1.q)`.
    pub fn describe(&self) -> String {
        match self.backend {
            BackendKind::Local => {
                format!("{} (local, {} slots)", self.name, self.slots.unwrap_or(0))
            }
            BackendKind::Sge => format!(
                "{} (sge queue {})",
                self.name,
                self.queue.as_deref().unwrap_or("?")
            ),
            BackendKind::Slurm => format!(
                "{} (slurm partition {})",
                self.name,
                self.partition.as_deref().unwrap_or("?")
            ),
        }
    }
}
