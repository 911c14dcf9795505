//! A cluster as the configuration describes it (`[[cluster]]`), and what a
//! kcm and its backend derive from it. Defaults live here and nowhere else.

use std::{path::PathBuf, time::Duration};

use gleaner_protocol::ClusterName;
use serde::{Deserialize, Serialize};

use crate::{KcmConfig, LauncherCommand, SgeConfig};

/// Which batch system runs the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Launchers as child processes of the kcm.
    Local,
    /// Son of Grid Engine: placeholders as array jobs.
    Sge,
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
    #[serde(default = "default_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
    /// `sge`: the cluster queue placeholders go to.
    #[serde(default)]
    pub queue: Option<String>,
    /// `sge`: walltime of each placeholder (`-l h_rt`).
    #[serde(default, with = "humantime_serde")]
    pub h_rt: Option<Duration>,
    /// `sge`: where placeholders' output goes (discarded when unset).
    #[serde(default)]
    pub log_dir: Option<PathBuf>,
    /// How long a batch-system command may take before it counts as failed.
    #[serde(default = "default_command_timeout", with = "humantime_serde")]
    pub command_timeout: Duration,
    /// Where grid job components leave their output and exit status; the
    /// cluster's nodes must see it (default: a directory under the system's
    /// temporary directory).
    #[serde(default)]
    pub spool_dir: Option<PathBuf>,
}

fn one() -> u32 {
    1
}

fn default_command_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_poll_interval() -> Duration {
    Duration::from_secs(1)
}

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
            poll_interval: default_poll_interval(),
            queue: None,
            h_rt: None,
            log_dir: None,
            command_timeout: default_command_timeout(),
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
        if self.poll_interval.is_zero() {
            return Err("cluster.poll_interval must be longer than 0s".to_owned());
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
            _ => Ok(()),
        }
    }

    /// The kcm's settings. A shrink for waiting local jobs gets the
    /// runners' `preempt_grace` and two polls to take effect before the same
    /// jobs are answered again; components spool under `default_spool`
    /// unless the cluster names a directory its nodes share.
    pub fn kcm(&self, preempt_grace: Duration, default_spool: PathBuf) -> KcmConfig {
        KcmConfig {
            cluster: self.name.clone(),
            poll_interval: self.poll_interval,
            job_end_grace: JOB_END_GRACE,
            local_settle: preempt_grace.saturating_add(self.poll_interval.saturating_mul(2)),
            spool_dir: self.spool_dir.clone().unwrap_or(default_spool),
        }
    }

    /// The Grid Engine backend's settings.
    pub fn sge(&self, launcher: LauncherCommand) -> SgeConfig {
        SgeConfig {
            cluster: self.name.clone(),
            queue: self.queue.clone().unwrap_or_default(),
            h_rt: self.h_rt,
            log_dir: self.log_dir.clone(),
            command_timeout: self.command_timeout,
            launcher,
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
        }
    }
}
