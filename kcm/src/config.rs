//! What the kcm's shell derives from a cluster's configuration
//! ([`ClusterConfig`], in the core crate with what the core derives): its
//! own settings and its backend's.

use std::{path::PathBuf, time::Duration};

use gleaner_kcm_core::config::{ClusterConfig, MIN_WALLTIME};

use crate::{KcmConfig, LauncherCommand, SgeConfig, SlurmConfig};

/// A cluster's settings for the kcm's shell and its backends.
pub trait ClusterSettings {
    /// The kcm's settings; components spool under `default_spool` unless
    /// the cluster names a directory its nodes share.
    fn kcm(&self, preempt_grace: Duration, default_spool: PathBuf) -> KcmConfig;
    /// The Grid Engine backend's settings.
    fn sge(&self, launcher: LauncherCommand) -> SgeConfig;
    /// The Slurm backend's settings.
    fn slurm(&self, launcher: LauncherCommand) -> SlurmConfig;
}

impl ClusterSettings for ClusterConfig {
    fn kcm(&self, preempt_grace: Duration, default_spool: PathBuf) -> KcmConfig {
        KcmConfig {
            core: self.core(preempt_grace, crate::local::account_name()),
            stage_command: self.stage_command.clone(),
            stage_timeout: self.stage_timeout,
            spool_dir: self.spool_dir.clone().unwrap_or(default_spool),
        }
    }

    fn sge(&self, launcher: LauncherCommand) -> SgeConfig {
        SgeConfig {
            cluster: self.name.clone(),
            queue: self.queue.clone().unwrap_or_default(),
            launcher_slots: self.launcher_slots.max(1),
            reserve_hosts: self.reserve_hosts.clone(),
            pe_one_host: self.pe_one_host.clone(),
            pe_spread: self.pe_spread.clone(),
            h_rt: self.h_rt,
            log_dir: self.log_dir.clone(),
            memory_resource: self.memory_resource.clone(),
            gpu_resource: self.gpu_resource.clone(),
            command_timeout: self.command_timeout,
            launcher,
        }
    }

    fn slurm(&self, launcher: LauncherCommand) -> SlurmConfig {
        SlurmConfig {
            cluster: self.name.clone(),
            partition: self.partition.clone().unwrap_or_default(),
            qos: self.qos.clone(),
            account: self.account.clone(),
            nice: self.nice,
            launcher_slots: self.launcher_slots.max(1),
            reserve_hosts: self.reserve_hosts.clone(),
            walltime: self.h_rt,
            min_walltime: self
                .h_rt
                .map(|walltime| self.min_walltime.unwrap_or(MIN_WALLTIME).min(walltime)),
            log_dir: self.log_dir.clone(),
            gpu_resource: self.gpu_resource.clone(),
            command_timeout: self.command_timeout,
            launcher,
        }
    }
}
