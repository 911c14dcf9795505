//! What a kcm needs from a batch system, whichever it is.

use std::future::Future;

use gleaner_manifest::JobId;
use gleaner_policy::local::WaitingJob;

/// A gleaner placeholder in the batch system: one launcher, running or waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    /// The batch system's id (`4711.3`); the launcher's id is `<cluster>-<this>`.
    pub id: String,
    pub job: JobId,
    pub slots: u32,
    pub running: bool,
}

/// The cluster's state at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub total_slots: u32,
    /// Slots running jobs that are not gleaner's.
    pub local_running: u32,
    /// Jobs that are not gleaner's, waiting for slots of this cluster.
    pub waiting: Vec<WaitingJob>,
    /// Slots running grid job components.
    pub grid_running: u32,
    pub placeholders: Vec<Placeholder>,
    /// Something wrong in the batch system worth reporting (a queue in error).
    pub problem: Option<String>,
}

impl Snapshot {
    /// Slots nobody uses or has claimed (pending placeholders claim theirs).
    pub fn idle_slots(&self) -> u32 {
        let claimed: u32 = self.placeholders.iter().map(|p| p.slots).sum();
        self.total_slots
            .saturating_sub(self.local_running + self.grid_running + claimed)
    }

    /// Slots free right now: what a waiting job could start on.
    pub fn free_slots(&self) -> u32 {
        let running: u32 = self
            .placeholders
            .iter()
            .filter(|p| p.running)
            .map(|p| p.slots)
            .sum();
        self.total_slots
            .saturating_sub(self.local_running + self.grid_running + running)
    }

    /// Slots asked for by the waiting local jobs.
    pub fn local_waiting(&self) -> u32 {
        self.waiting.iter().map(|w| w.slots).sum()
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{command}: {message}")]
pub struct BackendError {
    /// The batch-system command that failed, as run.
    pub command: String,
    /// What went wrong, with the command's own output.
    pub message: String,
}

/// One batch system. Implementations log nothing themselves: the kcm logs
/// and reports their errors with the cluster's name.
pub trait Backend: Send + 'static {
    /// `local`, `sge`, …
    fn kind(&self) -> &'static str;

    fn snapshot(&mut self) -> impl Future<Output = Result<Snapshot, BackendError>> + Send;

    /// Submits launchers for `job` covering up to `slots` slots; returns the
    /// slots actually submitted.
    fn submit(
        &mut self,
        job: &JobId,
        slots: u32,
    ) -> impl Future<Output = Result<u32, BackendError>> + Send;

    /// Removes placeholders by id, running or not.
    fn remove(&mut self, ids: &[String]) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// The kcm is stopping. Placeholders that cannot outlive it (the local
    /// backend's child processes) are stopped; batch jobs stay, to be
    /// adopted by the next kcm.
    fn shutdown(&mut self) -> impl Future<Output = ()> + Send;
}

/// How to start a launcher: the `gleaner` binary and what it needs to reach
/// the broker. Backends add the job, cluster, id and slot.
#[derive(Debug, Clone)]
pub struct LauncherCommand {
    pub program: std::path::PathBuf,
    /// Arguments before the per-launcher ones (`launcher`).
    pub args: Vec<String>,
    /// Environment the launcher needs (`GLEANER_BROKER_URL`, `RUST_LOG`, …).
    pub env: Vec<(String, String)>,
}

impl LauncherCommand {
    /// The full argument list for one launcher.
    pub fn arguments(
        &self,
        job: &JobId,
        cluster: &str,
        id: &str,
        slot: &str,
        slots: u32,
    ) -> Vec<String> {
        let mut args = self.args.clone();
        args.extend([
            "--job".to_owned(),
            job.to_string(),
            "--cluster".to_owned(),
            cluster.to_owned(),
            "--id".to_owned(),
            id.to_owned(),
            "--slot".to_owned(),
            slot.to_owned(),
            "--slots".to_owned(),
            slots.to_string(),
        ]);
        args
    }
}
