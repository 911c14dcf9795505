//! What a kcm needs from a batch system, whichever it is.

use std::future::Future;

use gleaner_manifest::JobId;
use gleaner_protocol::{ComponentSpec, naming::LauncherArgs};

use crate::snapshot::Snapshot;

/// Where a component's wrapper leaves its output and exit status, in the
/// kcm's spool directory (which the nodes must see).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentFiles {
    pub stdout: std::path::PathBuf,
    pub stderr: std::path::PathBuf,
    pub exit: std::path::PathBuf,
}

/// Suffix of the file holding a component's exit status; its presence means
/// the component ended.
const EXIT_SUFFIX: &str = ".exit";

impl ComponentFiles {
    pub fn new(spool: &std::path::Path, job: &JobId, component: u32) -> Self {
        let base = format!("{job}.{component}");
        Self {
            stdout: spool.join(format!("{base}.out")),
            stderr: spool.join(format!("{base}.err")),
            exit: spool.join(format!("{base}{EXIT_SUFFIX}")),
        }
    }

    /// The component whose exit status a spool file name holds, if it does.
    pub fn parse_exit(file_name: &str) -> Option<(JobId, u32)> {
        let (job, component) = file_name.strip_suffix(EXIT_SUFFIX)?.rsplit_once('.')?;
        Some((job.parse().ok()?, component.parse().ok()?))
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
    /// `files.script(spec)`, its slots on one host if `one_host`.
    fn submit_component(
        &mut self,
        spec: &ComponentSpec,
        files: &ComponentFiles,
        one_host: bool,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// The kcm is stopping. Placeholders that cannot outlive it (the local
    /// backend's child processes) are stopped; batch jobs stay, to be
    /// adopted by the next kcm.
    fn shutdown(&mut self) -> impl Future<Output = ()> + Send;
}

/// How to start a launcher: the `gleaner` binary and what it needs to reach
/// the broker. Backends add the per-launcher [`LauncherArgs`].
#[derive(Debug, Clone)]
pub struct LauncherCommand {
    pub program: std::path::PathBuf,
    /// Arguments before the per-launcher ones
    /// ([`LAUNCHER_SUBCOMMAND`](gleaner_protocol::naming::LAUNCHER_SUBCOMMAND)).
    pub args: Vec<String>,
    /// Environment the launcher needs (`GLEANER_BROKER_URL`, `RUST_LOG`, …).
    pub env: Vec<(String, String)>,
}

impl LauncherCommand {
    /// The full argument list for one launcher.
    pub fn arguments(&self, launcher: &LauncherArgs<'_>) -> Vec<String> {
        let mut args = self.args.clone();
        args.extend(launcher.to_vec());
        args
    }
}
