//! What a kcm needs from a batch system, whichever it is.

use std::future::Future;

use gleaner_protocol::ComponentSpec;
use gleaner_manifest::JobId;
use gleaner_policy::local::WaitingJob;

/// Slot counts come from the batch system: added without overflowing.
fn saturating_sum(slots: impl IntoIterator<Item = u32>) -> u32 {
    slots.into_iter().fold(0, u32::saturating_add)
}

/// A gleaner placeholder in the batch system: one launcher, running or waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    /// The batch system's id (`4711.3`); the launcher's id is `<cluster>-<this>`.
    pub id: String,
    pub job: JobId,
    pub slots: u32,
    pub running: bool,
}

/// A grid job's component in the batch system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentRun {
    /// The batch system's id.
    pub id: String,
    pub job: JobId,
    pub component: u32,
    pub slots: u32,
    pub running: bool,
}

/// Where a component's wrapper leaves its output and exit status, in the
/// kcm's spool directory (which the nodes must see).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentFiles {
    pub stdout: std::path::PathBuf,
    pub stderr: std::path::PathBuf,
    pub exit: std::path::PathBuf,
}

impl ComponentFiles {
    pub fn new(spool: &std::path::Path, job: &JobId, component: u32) -> Self {
        let base = format!("{job}.{component}");
        Self {
            stdout: spool.join(format!("{base}.out")),
            stderr: spool.join(format!("{base}.err")),
            exit: spool.join(format!("{base}.exit")),
        }
    }

    /// The shell script that runs a component and records how it ended.
    pub fn script(&self, spec: &ComponentSpec) -> String {
        let mut script = String::from("#!/bin/sh\n# gleaner grid job component\n");
        for (key, value) in &spec.env {
            script.push_str(&format!("export {key}={}\n", quote(value)));
        }
        if let Some(dir) = &spec.workdir {
            script.push_str(&format!("cd {} || exit 1\n", quote(dir)));
        }
        script.push_str(&format!(
            "/bin/sh -c {} > {} 2> {}\necho $? > {}\n",
            quote(&spec.command),
            quote(&self.stdout.to_string_lossy()),
            quote(&self.stderr.to_string_lossy()),
            quote(&self.exit.to_string_lossy()),
        ));
        script
    }
}

/// Quotes for `/bin/sh`.
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The name a grid job's component has in the batch system: `gg-<job>.<n>`.
pub fn component_name(job: &JobId, component: u32) -> String {
    format!("{COMPONENT_PREFIX}{job}.{component}")
}

pub const COMPONENT_PREFIX: &str = "gg-";

/// The job and component a batch job name belongs to, if it is a component.
pub fn parse_component_name(name: &str) -> Option<(JobId, u32)> {
    let (job, component) = name.strip_prefix(COMPONENT_PREFIX)?.rsplit_once('.')?;
    Some((job.parse().ok()?, component.parse().ok()?))
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
    /// Grid job components, running or waiting.
    pub components: Vec<ComponentRun>,
    /// Something wrong in the batch system worth reporting (a queue in error).
    pub problem: Option<String>,
}

impl Snapshot {
    /// Slots nobody uses or has claimed (pending placeholders claim theirs).
    pub fn idle_slots(&self) -> u32 {
        let claimed = saturating_sum(self.placeholders.iter().map(|p| p.slots));
        self.total_slots.saturating_sub(saturating_sum([
            self.local_running,
            self.grid_running,
            claimed,
        ]))
    }

    /// Slots free right now: what a waiting job could start on.
    pub fn free_slots(&self) -> u32 {
        let running = saturating_sum(
            self.placeholders
                .iter()
                .filter(|p| p.running)
                .map(|p| p.slots),
        );
        self.total_slots.saturating_sub(saturating_sum([
            self.local_running,
            self.grid_running,
            running,
        ]))
    }

    /// Slots asked for by the waiting local jobs.
    pub fn local_waiting(&self) -> u32 {
        saturating_sum(self.waiting.iter().map(|w| w.slots))
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

    /// Removes placeholders or components by id, running or not.
    fn remove(&mut self, ids: &[String]) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Submits a grid job's component as an ordinary batch job running
    /// `files.script(spec)`.
    fn submit_component(
        &mut self,
        spec: &ComponentSpec,
        files: &ComponentFiles,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

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
