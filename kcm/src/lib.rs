//! The cluster manager (kcm): one per cluster, on its head node.
//!
//! It turns grow requests into placeholder jobs in the cluster's batch
//! system, watches the batch system every `poll_interval`, reports the
//! cluster's state to the scheduler, and removes placeholders that must go.
//!
//! Every decision is made in [`core`], without I/O; this file is its shell:
//! the inbox and the poll timer, the backend's commands, the spool directory
//! and publishing.

mod backend;
mod claims;
mod config;
mod contain;
pub use gleaner_kcm_core::core;
mod local;
mod qstat;
mod sge;
mod slurm;
use gleaner_kcm_core::snapshot;
mod squeue;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use gleaner_broker::{
    Broker, BrokerError, Connection, ConsumeOptions, Inbox, Publisher, sleep_until,
    topology::{self, JobQueues, SCHEDULER_QUEUE, kcm_queue},
};
use gleaner_kcm_core::io::{Io, LauncherOrder, carry_out};
use gleaner_manifest::JobId;
use gleaner_protocol::{
    Captured, ComponentOutcome, ComponentSpec, ControlMsg, Credentials, KcmMsg, SchedulerMsg,
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error_span, info};

use crate::contain::Account;

pub use backend::{Backend, BackendError, ComponentFiles, LauncherCommand, RunAs};
pub use config::ClusterSettings;
pub use gleaner_kcm_core::Cap;
pub use gleaner_kcm_core::config::{BackendKind, ClusterConfig};
pub use local::{LocalBackend, hostname};
pub use sge::{SgeBackend, SgeConfig};
pub use slurm::{SlurmBackend, SlurmConfig};
pub use snapshot::{ComponentRun, Host, Placeholder, Snapshot, Timing};

use crate::core::{Core, CoreConfig, Event, KcmCore, Now, SpooledExit, SpooledStart};

/// What a kcm runs with, derived from its [`ClusterConfig`]: what its
/// core decides by, and what only its shell needs.
#[derive(Debug, Clone)]
pub struct KcmConfig {
    pub core: CoreConfig,
    /// Where grid components leave their output and exit status; the
    /// cluster's nodes must see it at the same path.
    pub spool_dir: std::path::PathBuf,
    /// The cluster's `stage_command` for grid jobs' inputs, and its limit.
    pub stage_command: Vec<String>,
    pub stage_timeout: Duration,
}

/// Bytes of a component's stdout and stderr sent back (the tail).
const COMPONENT_OUTPUT: u64 = 1 << 20;

struct Kcm<B> {
    core: KcmCore,
    shell: Shell<B>,
}

/// What the kcm's commands act on: its backend and spool.
struct Shell<B> {
    config: KcmConfig,
    backend: B,
    /// Stagings under way, each ending in the event that answers it.
    staging: tokio::task::JoinSet<Event>,
}

/// The shell and the broker's publisher, as the core's effects reach them.
struct ShellIo<'a, B> {
    shell: &'a mut Shell<B>,
    publisher: &'a Publisher,
}

/// Serves the cluster until `shutdown`, reconnecting after broker outages.
/// Everything it logs names the cluster (a span).
pub async fn run<B: Backend>(
    broker: Broker,
    config: KcmConfig,
    backend: B,
    shutdown: CancellationToken,
) {
    let span = error_span!("kcm", cluster = %config.core.cluster);
    serve(broker, config, backend, shutdown)
        .instrument(span)
        .await;
}

async fn serve<B: Backend>(
    broker: Broker,
    config: KcmConfig,
    backend: B,
    shutdown: CancellationToken,
) {
    let core = KcmCore::new(config.core.clone());
    let mut kcm = Kcm {
        core,
        shell: Shell {
            config,
            backend,
            staging: tokio::task::JoinSet::new(),
        },
    };
    broker
        .supervise(&shutdown, async |connection| {
            kcm.session(&connection, &shutdown).await
        })
        .await;
    kcm.shell.backend.shutdown().await;
    // The spool goes once nothing is left in it (a restarted kcm still
    // finds what running jobs need): its launchers' settings directory,
    // itself, and the directory made for it.
    let spool = &kcm.shell.config.spool_dir;
    for dir in [
        Some(spool.join("launchers").as_path()),
        Some(spool.as_path()),
        spool.parent(),
    ]
    .into_iter()
    .flatten()
    {
        let _ = std::fs::remove_dir(dir);
    }
    info!("kcm stopped");
}

impl<B: Backend> Kcm<B> {
    async fn session(
        &mut self,
        connection: &Connection,
        shutdown: &CancellationToken,
    ) -> Result<(), BrokerError> {
        topology::declare_core(connection.lapin()).await?;
        topology::declare_kcm(connection.lapin(), &self.shell.config.core.cluster).await?;
        let publisher = connection.publisher().await?;
        let mut inbox: Inbox<KcmMsg> = connection
            .inbox(
                &publisher,
                &kcm_queue(&self.shell.config.core.cluster),
                ConsumeOptions {
                    tag: connection.identity(),
                    prefetch: 16,
                    exclusive: false,
                },
            )
            .await?;
        info!(backend = self.shell.backend.kind(), "kcm serving");
        self.core.handle(Event::Connected, Now::read());
        if self.apply(&publisher).await? {
            self.poll(&publisher).await?;
        }
        loop {
            tokio::select! {
                message = inbox.next() => match message {
                    Some(Ok(incoming)) => {
                        self.core.handle(Event::Message(incoming.msg.clone()), Now::read());
                        let poll_now = self.apply(&publisher).await?;
                        incoming.ack().await?;
                        if poll_now {
                            self.poll(&publisher).await?;
                        }
                    }
                    Some(Err(e)) => return Err(e),
                    None => return Err(BrokerError::NoQueue(kcm_queue(&self.shell.config.core.cluster))),
                },
                () = sleep_until(self.core.poll_timeout()) => {
                    self.core.handle_timeout(Now::read());
                    if self.apply(&publisher).await? {
                        self.poll(&publisher).await?;
                    }
                }
                Some(staged) = self.shell.staging.join_next(), if !self.shell.staging.is_empty() => {
                    if let Ok(event) = staged {
                        self.core.handle(event, Now::read());
                        self.apply(&publisher).await?;
                    }
                }
                () = shutdown.cancelled() => return Ok(()),
            }
        }
    }

    /// Reads the batch system and the spool, and lets the core decide
    /// (and report).
    async fn poll(&mut self, publisher: &Publisher) -> Result<(), BrokerError> {
        let snapshot = self.shell.backend.snapshot().await;
        let (spooled, started) = if snapshot.is_ok() {
            spooled(&self.shell.config.spool_dir, |job, component| {
                self.core.expects_start(job, component)
            })
        } else {
            (Vec::new(), Vec::new())
        };
        self.core.handle(
            Event::Polled {
                snapshot,
                spooled,
                started,
            },
            Now::read(),
        );
        self.apply(publisher).await?;
        Ok(())
    }

    /// Carries out the core's effects, handing each command's outcome back
    /// at once; `true` when the core asked for a poll.
    async fn apply(&mut self, publisher: &Publisher) -> Result<bool, BrokerError> {
        let mut io = ShellIo {
            shell: &mut self.shell,
            publisher,
        };
        carry_out(&mut self.core, &mut io).await
    }
}

impl<B: Backend> Io for ShellIo<'_, B> {
    type Error = BrokerError;

    fn now(&self) -> Now {
        Now::read()
    }

    async fn submit_launchers(&mut self, order: LauncherOrder<'_>) -> Result<u32, BackendError> {
        let shell = &mut *self.shell;
        let (job, slots, task) = (order.job, order.slots, order.task);
        match shell.run_as(order.owner, order.account)? {
            None => shell.backend.submit(job, slots, task, None).await,
            Some(account) => {
                let settings = shell.owner_settings(job, &account, order.credentials)?;
                let run_as = RunAs {
                    account: &account,
                    settings: &settings,
                };
                shell.backend.submit(job, slots, task, Some(run_as)).await
            }
        }
    }

    async fn remove(&mut self, ids: &[String]) -> Result<(), BackendError> {
        self.shell.backend.remove(ids).await
    }

    fn delete_spool_entry(&mut self, job: &JobId, component: u32) {
        let spool = &self.shell.config.spool_dir;
        let dir = component_dir(spool, job);
        let files = ComponentFiles::new(&dir, job, component);
        for file in files.all() {
            let _ = std::fs::remove_file(file);
        }
        if dir != *spool {
            // The job's directory, once its last component's files are gone.
            let _ = std::fs::remove_dir(&dir);
        }
    }

    fn stop_component(&mut self, job: &JobId, component: u32, stop: &str) {
        let dir = component_dir(&self.shell.config.spool_dir, job);
        let files = ComponentFiles::new(&dir, job, component);
        if let Err(e) = write_spool_file(&files.stop, stop) {
            tracing::warn!(job = %job, component, error = %e, "cannot stop a grid component");
        }
    }

    fn release_component(&mut self, job: &JobId, component: u32, go: &str, hosts: &str) {
        let dir = component_dir(&self.shell.config.spool_dir, job);
        let files = ComponentFiles::new(&dir, job, component);
        // The host file first: once `go` is there, the command runs.
        if let Err(e) =
            write_spool_file(&files.hosts, hosts).and_then(|()| write_spool_file(&files.go, go))
        {
            tracing::warn!(job = %job, component, error = %e, "cannot let a grid component pass its barrier");
        }
    }

    fn stage_inputs(&mut self, spec: ComponentSpec, inputs: Vec<String>, account: Option<String>) {
        self.shell.stage(spec, inputs, account);
    }

    /// Submits a component whose wrapper writes to the spool directory,
    /// or, submitted as its owner, to its job's directory in it
    /// (`<spool>/<job>`, the owner's, mode 0700), which the kcm reads as
    /// hostile ([`read_tail`]): an owner writes there for their own job
    /// only (nobody else makes entries in the spool).
    async fn submit_component(
        &mut self,
        spec: &ComponentSpec,
        one_host: bool,
        account: Option<&str>,
    ) -> Result<(), BackendError> {
        let shell = &mut *self.shell;
        let run_as = shell.run_as(&spec.owner, account)?;
        let spool = &shell.config.spool_dir;
        let failed = |message: String| BackendError {
            command: format!("mkdir {}", spool.display()),
            message,
        };
        std::fs::create_dir_all(spool).map_err(|e| failed(e.to_string()))?;
        let owners = run_as
            .as_ref()
            .filter(|account| !account.is_me() && shell.backend.components_as_owner());
        let dir = match owners {
            Some(account) => gleaner_contain::shared::private_dir(
                spool,
                spec.job.as_str(),
                (account.uid, account.gid),
                nix::unistd::geteuid(),
                0o700,
            )
            .map_err(|e| failed(e.to_string()))?,
            None => spool.clone(),
        };
        let files = ComponentFiles::new(&dir, &spec.job, spec.component);
        shell
            .backend
            .submit_component(spec, &files, one_host, run_as.as_ref())
            .await
    }

    async fn tell(&mut self, job: &JobId, message: ControlMsg) -> Result<(), BrokerError> {
        tell_job(self.publisher, job, message).await
    }

    async fn report_component_end(
        &mut self,
        job: &JobId,
        mut outcome: ComponentOutcome,
    ) -> Result<(), BrokerError> {
        let dir = component_dir(&self.shell.config.spool_dir, job);
        let files = ComponentFiles::new(&dir, job, outcome.component);
        let owner = dir_owner(&dir);
        outcome.stdout = read_tail(&files.stdout, owner);
        outcome.stderr = read_tail(&files.stderr, owner);
        tell_job(self.publisher, job, ControlMsg::ComponentEnded(outcome)).await
    }

    async fn to_scheduler(&mut self, message: SchedulerMsg) -> Result<(), BrokerError> {
        self.publisher.send(SCHEDULER_QUEUE, &message).await
    }

    async fn announce(&mut self, event: gleaner_protocol::Event) -> Result<(), BrokerError> {
        self.publisher.event(&event).await
    }

    fn forget_launcher_settings(&mut self, job: &JobId) {
        let _ = std::fs::remove_file(self.shell.owner_settings_file(job));
    }
}

impl<B: Backend> Shell<B> {
    /// The account the core chose for a job of `owner`'s, looked up: one
    /// only a kcm running as root (or as that very account) can start
    /// jobs as; `None`, the kcm's own.
    fn run_as(&self, owner: &str, account: Option<&str>) -> Result<Option<Account>, BackendError> {
        let Some(account) = account else {
            return Ok(None);
        };
        let refused = |message: String| BackendError {
            command: format!("run as the owner of the job ({owner})"),
            message,
        };
        let account = Account::lookup(account).map_err(refused)?;
        // Root writes there, and reads back: only root (or this kcm's
        // account) may have put anything in it.
        trusted_dir(&self.config.spool_dir).map_err(refused)?;
        if !account.is_me() && !nix::unistd::geteuid().is_root() {
            return Err(refused(format!(
                "this kcm runs as uid {}, not root, so it cannot start {}'s launchers (run it as root, or configure [users] single = true)",
                nix::unistd::geteuid(),
                account.name
            )));
        }
        Ok(Some(account))
    }

    /// Where a job's launchers find their settings when they run as its
    /// owner: the job's launcher account, in a file of the owner's that
    /// nobody else may read, in the spool directory (which the nodes see).
    fn owner_settings_file(&self, job: &JobId) -> std::path::PathBuf {
        self.config
            .spool_dir
            .join("launchers")
            .join(format!("{job}.toml"))
    }

    /// Writes [`Shell::owner_settings_file`] (again: a runner taking the job
    /// over renews its password).
    fn owner_settings(
        &self,
        job: &JobId,
        account: &Account,
        credentials: Option<&Credentials>,
    ) -> Result<std::path::PathBuf, BackendError> {
        let path = self.owner_settings_file(job);
        let failed = |message: String| BackendError {
            command: format!("write {}", path.display()),
            message,
        };
        // The core starts no launchers of such a job.
        let credentials =
            credentials.ok_or_else(|| failed("the job has no launcher account".to_owned()))?;
        let text = self.backend.launcher_command().owner_settings(credentials);
        write_private(&path, &text, account).map_err(|e| failed(e.to_string()))?;
        Ok(path)
    }

    /// Runs the cluster's staging command for a component's inputs, as
    /// the account it runs as, beside the kcm's loop.
    fn stage(&mut self, spec: ComponentSpec, inputs: Vec<String>, account: Option<String>) {
        let run_as = match self.run_as(&spec.owner, account.as_deref()) {
            Ok(run_as) => run_as,
            Err(e) => {
                let event = Event::InputsStaged {
                    spec,
                    account,
                    result: Err(e),
                };
                self.staging.spawn(async move { event });
                return;
            }
        };
        let Some((program, first)) = self.config.stage_command.split_first() else {
            return;
        };
        let mut args = first.to_vec();
        args.extend([spec.job.to_string(), spec.component.to_string()]);
        args.extend(inputs);
        let (program, args) = backend::as_account(program, &args, run_as.as_ref());
        let timeout = self.config.stage_timeout;
        self.staging.spawn(async move {
            let result = run_staging(&program, &args, timeout).await;
            Event::InputsStaged {
                spec,
                account,
                result,
            }
        });
    }
}

/// Runs a staging command to its end or its timeout, and how long it
/// took. Its output goes nowhere: it runs as a job's owner, who could
/// make it endless, and what it says is the job's business, not the
/// cluster's report's.
async fn run_staging(
    program: &str,
    args: &[String],
    timeout: Duration,
) -> Result<Duration, BackendError> {
    let failed = |message: String| BackendError {
        command: "stage_command".to_owned(),
        message,
    };
    let started = std::time::Instant::now();
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| failed(format!("cannot start: {e}")))?;
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(started.elapsed()),
        Ok(Ok(status)) => Err(failed(format!("ended with {status}"))),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(_) => Err(failed(format!("took longer than {timeout:?}"))),
    }
}

/// The components whose exit status waits in the spool or in their
/// job's directory in it, and those that started (their hosts); in a
/// job's directory, that job's only. Started files are read only
/// where `expects_start` says they are news, and a job's directory only
/// so far: it is its owner's to fill.
fn spooled(
    spool: &Path,
    expects_start: impl Fn(&JobId, u32) -> bool,
) -> (Vec<SpooledExit>, Vec<SpooledStart>) {
    let (mut exits, mut starts) = (Vec::new(), Vec::new());
    for (dir, only) in spool_dirs(spool) {
        let owner = dir_owner(&dir);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        // A job's directory is its owner's to fill: a bounded look.
        let limit = match only {
            Some(_) => MAX_JOB_SPOOL_ENTRIES,
            None => usize::MAX,
        };
        for entry in entries.flatten().take(limit) {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let theirs = |job: &JobId| only.as_ref().is_none_or(|only| only == job);
            if let Some((job, component)) =
                ComponentFiles::parse_exit(&name).filter(|(job, _)| theirs(job))
            {
                let text = read_head(&entry.path(), owner, 32).unwrap_or_default();
                exits.push(SpooledExit {
                    job,
                    component,
                    exit_code: text.trim().parse().ok(),
                    preempted: text.trim() == backend::PREEMPTED,
                });
            } else if let Some((job, component)) = ComponentFiles::parse_started(&name)
                .filter(|(job, component)| theirs(job) && expects_start(job, *component))
            {
                // A byte more than may be read: one that long is refused.
                let hosts = read_head(&entry.path(), owner, STARTED_FILE + 1)
                    .ok_or_else(|| "not a readable file of its owner's".to_owned())
                    .and_then(|text| backend::parse_started(&text));
                starts.push(SpooledStart {
                    job,
                    component,
                    hosts,
                });
            }
        }
    }
    (exits, starts)
}

/// Makes `dir` if needed, and checks that nobody but root or this process
/// could have put anything in it or on the way to it (a link, a file the
/// kcm then writes through as root): [`gleaner_contain::shared`], and the
/// spool itself writable by nobody else, sticky or not.
fn trusted_dir(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    gleaner_contain::shared::open_private(dir, nix::unistd::geteuid())
        .map(|_| ())
        .map_err(|e| {
            format!(
                "the spool directory {} is not safe for many users: {e}",
                dir.display()
            )
        })
}

/// Replaces `path` with `text`, readable and writable by `account` only.
fn write_private(path: &std::path::Path, text: &str, account: &Account) -> std::io::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    std::os::unix::fs::fchown(
        &file,
        Some(account.uid.as_raw()),
        Some(account.gid.as_raw()),
    )?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Sends to a job's runner; a job that is gone no longer needs to hear.
async fn tell_job(
    publisher: &Publisher,
    job: &JobId,
    message: ControlMsg,
) -> Result<(), BrokerError> {
    publisher
        .deliver(&JobQueues::new(job).control, &message)
        .await
        .map(|_| ())
}

/// The spool, and the directories in it of jobs whose components run as
/// their owner, each with the job whose files alone it may hold (nobody
/// but the kcm makes entries in the spool).
fn spool_dirs(spool: &Path) -> Vec<(PathBuf, Option<JobId>)> {
    let mut dirs = vec![(spool.to_path_buf(), None)];
    if let Ok(entries) = std::fs::read_dir(spool) {
        dirs.extend(entries.flatten().filter_map(|e| {
            let job = e.file_name().to_str()?.parse::<JobId>().ok()?;
            e.file_type()
                .is_ok_and(|t| t.is_dir())
                .then(|| (e.path(), Some(job)))
        }));
    }
    dirs
}

/// Where a job's component files are: its directory in the spool if it
/// has one (its components run as their owner), the spool otherwise.
fn component_dir(spool: &Path, job: &JobId) -> PathBuf {
    let dir = spool.join(job.as_str());
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.is_dir() => dir,
        _ => spool.to_path_buf(),
    }
}

/// Who owns a directory of component files (whose files they must be).
fn dir_owner(dir: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(dir).ok().map(|m| m.uid())
}

/// A component's file, opened only if it is a regular file of `owner`'s,
/// not through a link and not a pipe that would keep the kcm waiting:
/// in a directory of the component's owner, they could have put anything
/// in its place.
fn open_component_file(path: &Path, owner: Option<u32>) -> Option<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    (meta.is_file() && Some(meta.uid()) == owner).then_some(file)
}

/// The first `limit` bytes of a component's file ([`open_component_file`]),
/// as text.
fn read_head(path: &Path, owner: Option<u32>, limit: u64) -> Option<String> {
    use std::io::Read;
    let file = open_component_file(path, owner)?;
    let mut text = String::new();
    file.take(limit).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The most of a started file read: a host list of thousands of nodes.
const STARTED_FILE: u64 = backend::MAX_STARTED_BYTES as u64;

/// The most entries of a job's spool directory looked at in a poll: far
/// more than its components' files.
const MAX_JOB_SPOOL_ENTRIES: usize = 4096;

/// Writes a file the kcm hands a component (in its owner's directory, if
/// that is where its files are): under a name nobody could have
/// prepared, never through a link, then renamed into place whole, so the
/// wrapper never reads half of it.
fn write_spool_file(path: &Path, text: &str) -> std::io::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let tmp = path.with_extension(format!("kcm-{:016x}", rand::random::<u64>()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .mode(0o644)
        .open(&tmp)?;
    file.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The last bytes of a component's file ([`open_component_file`]), and
/// how many came before them.
fn read_tail(path: &Path, owner: Option<u32>) -> Captured {
    use std::io::{Read, Seek, SeekFrom};
    let Some(mut file) = open_component_file(path, owner) else {
        return Captured::default();
    };
    let length = file.metadata().map_or(0, |m| m.len());
    let dropped = length.saturating_sub(COMPONENT_OUTPUT);
    let mut data = Vec::new();
    if file.seek(SeekFrom::Start(dropped)).is_ok() {
        let _ = file.take(COMPONENT_OUTPUT).read_to_end(&mut data);
    }
    Captured { data, dropped }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn only_the_started_files_of_components_waiting_to_be_heard_of_are_read() {
        let spool = tempfile::tempdir().unwrap();
        let job: JobId = "j-0000000000000001".parse().unwrap();
        let dir = spool.path().join(job.as_str());
        std::fs::create_dir(&dir).unwrap();
        // The owner's made-up files: thousands of big host lists.
        let big = "a 1\n".repeat(60_000);
        for component in 0..50 {
            std::fs::write(dir.join(format!("{job}.{component}.started")), &big).unwrap();
        }
        let (_, starts) = spooled(spool.path(), |_, component| component == 7);
        assert_eq!(starts.len(), 1, "component 7 only");
        assert_eq!(
            (starts[0].component, starts[0].hosts.as_ref().map(Vec::len)),
            (7, Ok(60_000))
        );
        let (_, starts) = spooled(spool.path(), |_, _| false);
        assert!(starts.is_empty());
    }

    #[tokio::test]
    async fn a_staging_command_says_how_it_ended_and_nothing_of_what_it_printed() {
        let args = |script: &str| vec!["-c".to_owned(), script.to_owned()];
        let took = run_staging("/bin/sh", &args("true"), Duration::from_secs(10)).await;
        assert!(took.is_ok(), "{took:?}");
        let noisy = "head -c 50000000 /dev/zero; echo /home/alice/secret >&2; exit 3";
        let error = run_staging("/bin/sh", &args(noisy), Duration::from_secs(30))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("exit status: 3"), "{error}");
        assert!(!error.contains("secret") && error.len() < 200, "{error}");
        let slow = run_staging("/bin/sh", &args("sleep 5"), Duration::from_millis(200)).await;
        assert!(slow.unwrap_err().to_string().contains("longer than"));
    }

    #[test]
    fn a_components_files_are_read_only_if_they_are_its_owners_own() {
        let dir = tempfile::tempdir().unwrap();
        let owner = dir_owner(dir.path());
        let file = dir.path().join("j.0.out");
        std::fs::write(&file, "output").unwrap();
        assert_eq!(read_tail(&file, owner).data, b"output");
        let link = dir.path().join("j.1.out");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(open_component_file(&link, owner).is_none(), "a link");
        let pipe = dir.path().join("j.2.out");
        nix::unistd::mkfifo(&pipe, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(open_component_file(&pipe, owner).is_none(), "a pipe");
        let someone = Some(std::fs::metadata(&file).unwrap().uid() + 1);
        assert!(open_component_file(&file, someone).is_none(), "another's");
    }
}
