//! What a kcm needs from a batch system, whichever it is.

use std::{future::Future, process::Stdio, time::Duration};

use gleaner_manifest::{JobId, Needs, TaskShape, is_env_name};
use gleaner_protocol::{
    ClusterName, ComponentSpec, Credentials, HostSlots,
    naming::{LauncherArgs, launcher_id_word},
};
use tokio::{io::AsyncWriteExt, process::Command};
use tracing::warn;

pub use gleaner_kcm_core::BackendError;

use crate::{contain::Account, snapshot::Snapshot};

/// Where a component's wrapper leaves its output and exit status, in the
/// kcm's spool directory (which the nodes must see), and where it meets
/// the start barrier: it writes the hosts it holds to `started`, then
/// waits for the kcm to write `go` (its ranks) and `hosts` (every
/// component's hosts) before it runs the command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentFiles {
    pub stdout: std::path::PathBuf,
    pub stderr: std::path::PathBuf,
    pub exit: std::path::PathBuf,
    pub started: std::path::PathBuf,
    pub go: std::path::PathBuf,
    pub hosts: std::path::PathBuf,
    /// Written by the kcm to stop the component for a job of higher
    /// priority: the signal's number and the grace, in seconds.
    pub stop: std::path::PathBuf,
}

/// What a stopped component's wrapper writes as its exit status.
pub const PREEMPTED: &str = "preempted";

/// Suffix of the file holding a component's exit status; its presence means
/// the component ended.
const EXIT_SUFFIX: &str = ".exit";

/// Suffix of the file listing the hosts a started component holds; its
/// presence means the component waits at its barrier (or has passed it).
const STARTED_SUFFIX: &str = ".started";

/// How a started component's wrapper finds the hosts it holds, as lines
/// of `host slots` ([`parse_started`] reads them back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComponentHosts {
    /// Grid Engine's `$PE_HOSTFILE` (`host slots queue processors`), or
    /// this host alone for a job without a parallel environment.
    GridEngine,
    /// Slurm's `$SLURM_JOB_NODELIST`, expanded by `scontrol`, and
    /// `$SLURM_TASKS_PER_NODE` (`2(x3),1`).
    Slurm,
    /// This host, with all the component's slots.
    ThisHost,
}

impl ComponentHosts {
    fn lines(self, slots: u32) -> String {
        let this_host = format!("echo \"$(hostname) {slots}\"");
        match self {
            Self::GridEngine => format!(
                "if [ -r \"$PE_HOSTFILE\" ]; then while read h n rest; do echo \"$h $n\"; done < \"$PE_HOSTFILE\"; else {this_host}; fi"
            ),
            Self::Slurm => format!(
                "if [ -n \"$SLURM_JOB_NODELIST\" ]; then echo \"{TASKS_PER_NODE} $SLURM_TASKS_PER_NODE\"; scontrol show hostnames \"$SLURM_JOB_NODELIST\"; else {this_host}; fi"
            ),
            Self::ThisHost => this_host,
        }
    }
}

/// The first line of a Slurm component's started file: the slots on each
/// of the host lines that follow, in Slurm's compressed form.
const TASKS_PER_NODE: &str = "tasks-per-node";

/// The most hosts a started file may name; more is not a real component.
const MAX_COMPONENT_HOSTS: usize = 65_536;

/// The most of a started file read, a host list of thousands of nodes: one
/// longer is refused, not cut (its last host would be half a name). Its
/// hosts then take at most a few MiB of the runner's `Go`, whose whole
/// bound ([`gleaner_protocol::MAX_GO_HOSTS_BYTES`]) the runner keeps.
pub const MAX_STARTED_BYTES: usize = 1 << 20;

/// The hosts a component's started file lists, or why they cannot be read:
/// the file is its owner's to write, so nothing in it is trusted.
pub fn parse_started(text: &str) -> Result<Vec<HostSlots>, String> {
    if text.len() > MAX_STARTED_BYTES {
        return Err(format!(
            "more than {} KiB of hosts",
            MAX_STARTED_BYTES >> 10
        ));
    }
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let per_node = match text.trim_start().starts_with(TASKS_PER_NODE) {
        true => {
            let spec = lines.next().unwrap_or_default();
            Some(tasks_per_node(
                spec.trim_start_matches(TASKS_PER_NODE).trim(),
            )?)
        }
        false => None,
    };
    let mut hosts = Vec::new();
    for (i, line) in lines.enumerate() {
        if hosts.len() == MAX_COMPONENT_HOSTS {
            return Err(format!("more than {MAX_COMPONENT_HOSTS} hosts"));
        }
        let mut words = line.split_whitespace();
        let host = words.next().unwrap_or_default();
        if !is_host_name(host) {
            return Err(format!("{host:?} is not a host name"));
        }
        let slots = match &per_node {
            Some(per_node) => per_node.get(i).copied(),
            None => words.next().and_then(|n| n.parse().ok()),
        }
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("no slot count for {host}"))?;
        hosts.push(HostSlots {
            host: host.to_owned(),
            slots,
        });
    }
    match hosts.is_empty() {
        true => Err("no host".to_owned()),
        false => Ok(hosts),
    }
}

/// Slurm's `2(x3),1` as `[2, 2, 2, 1]`.
fn tasks_per_node(spec: &str) -> Result<Vec<u32>, String> {
    let bad = || format!("{spec:?} is not a count of tasks per node");
    let mut counts = Vec::new();
    for part in spec.split(',') {
        let (count, times) = match part.split_once("(x") {
            Some((count, times)) => (count, times.strip_suffix(')').ok_or_else(bad)?),
            None => (part, "1"),
        };
        let count: u32 = count.parse().map_err(|_| bad())?;
        let times: usize = times.parse().map_err(|_| bad())?;
        if counts.len().saturating_add(times) > MAX_COMPONENT_HOSTS {
            return Err(bad());
        }
        counts.extend(std::iter::repeat_n(count, times));
    }
    Ok(counts)
}

/// A host name as batch systems print them: letters, digits, `.`, `-`, `_`.
fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl ComponentFiles {
    pub fn new(spool: &std::path::Path, job: &JobId, component: u32) -> Self {
        let base = format!("{job}.{component}");
        Self {
            stdout: spool.join(format!("{base}.out")),
            stderr: spool.join(format!("{base}.err")),
            exit: spool.join(format!("{base}{EXIT_SUFFIX}")),
            started: spool.join(format!("{base}{STARTED_SUFFIX}")),
            go: spool.join(format!("{base}.go")),
            hosts: spool.join(format!("{base}.hosts")),
            stop: spool.join(format!("{base}.stop")),
        }
    }

    /// Every file of the component's spool entry.
    pub fn all(&self) -> [&std::path::Path; 7] {
        [
            &self.stdout,
            &self.stderr,
            &self.exit,
            &self.started,
            &self.go,
            &self.hosts,
            &self.stop,
        ]
    }

    /// The component whose exit status a spool file name holds, if it does.
    pub fn parse_exit(file_name: &str) -> Option<(JobId, u32)> {
        Self::parse_name(file_name, EXIT_SUFFIX)
    }

    /// The component whose started file a spool file name is, if it is.
    pub fn parse_started(file_name: &str) -> Option<(JobId, u32)> {
        Self::parse_name(file_name, STARTED_SUFFIX)
    }

    fn parse_name(file_name: &str, suffix: &str) -> Option<(JobId, u32)> {
        let (job, component) = file_name.strip_suffix(suffix)?.rsplit_once('.')?;
        Some((job.parse().ok()?, component.parse().ok()?))
    }

    /// The shell script that runs a component and records how it ended.
    ///
    /// No line of it comes from the job: Grid Engine reads every `#$` line
    /// of a script as options and Slurm its leading `#SBATCH` lines, so the
    /// command, directory and variables are written as [`literal`]s,
    /// printable ASCII that only the shell turns back into them.
    ///
    /// The command waits at the start barrier: the wrapper says where it
    /// runs (`started`), then holds its slots until the kcm lets it go,
    /// with where every component runs (`GLEANER_HOSTFILE`, the ranks).
    /// It runs in a process group of its own, which a `stop` file from
    /// the kcm signals, and kills after the grace; the exit status is then
    /// [`PREEMPTED`].
    ///
    /// With `run_as`, the wrapper (the kcm's account, root) opens and
    /// reads the spool files and does nothing else: the owner's shell gets
    /// a clean environment (`setpriv --reset-env`), then the job's
    /// variables and directory, so nothing of the job's reaches root, nor
    /// anything of the kcm's the job.
    pub fn script(
        &self,
        spec: &ComponentSpec,
        run_as: Option<&Account>,
        hosts: ComponentHosts,
    ) -> String {
        // Its output files are the owner's business only.
        let mut script = String::from("#!/bin/sh\n# gleaner grid job component\numask 077\n");
        let mut command = spec.command.clone();
        if let Some(dir) = &spec.workdir {
            command = format!("cd {} || exit 1\n{command}", quote(dir));
        }
        if let Some(dir) = &spec.checkpoint {
            // Made by the owner's shell, whoever runs the wrapper; where
            // the nodes do not see the results directory, there is none.
            command = format!("mkdir -p {} 2> /dev/null\n{command}", quote(dir));
        }
        script.push_str(&literal("gleaner_command", &command));
        let started = quote(&self.started.to_string_lossy());
        let go = quote(&self.go.to_string_lossy());
        script.push_str(&format!(
            "{{ {}; }} > {started}.tmp 2> /dev/null; mv -f {started}.tmp {started}\n\
             while [ ! -s {go} ]; do sleep 0.1; done\n\
             read gleaner_rank gleaner_ranks gleaner_components < {go}\n",
            hosts.lines(spec.slots)
        ));
        let ours = [
            ("GLEANER_COMPONENT", spec.component.to_string()),
            ("GLEANER_COMPONENTS", "$gleaner_components".to_owned()),
            ("GLEANER_RANK", "$gleaner_rank".to_owned()),
            ("GLEANER_RANKS", "$gleaner_ranks".to_owned()),
            ("GLEANER_HOSTFILE", "$gleaner_hostfile".to_owned()),
            ("GLEANER_CHECKPOINT", "$gleaner_checkpoint".to_owned()),
        ];
        script.push_str(&literal(
            "gleaner_checkpoint",
            spec.checkpoint.as_deref().unwrap_or_default(),
        ));
        script.push_str(&literal("gleaner_hostfile", &self.hosts.to_string_lossy()));
        // Names the manifest checked; one that is not is dropped, not run.
        let env = spec.env.iter().filter(|(key, _)| is_env_name(key));
        let start = match run_as.filter(|a| !a.is_me()) {
            Some(account) => {
                let mut start = format!(
                    "/usr/bin/setpriv --reuid={} --regid={} --init-groups --reset-env -- /usr/bin/env",
                    account.uid, account.gid
                );
                for (i, (key, value)) in env.enumerate() {
                    let name = format!("gleaner_env{i}");
                    script.push_str(&literal(&name, &format!("{key}={value}")));
                    start.push_str(&format!(" \"${name}\""));
                }
                for (key, value) in ours {
                    start.push_str(&format!(" \"{key}={value}\""));
                }
                start + " "
            }
            None => {
                for (key, value) in env {
                    script.push_str(&literal(key, value));
                    script.push_str(&format!("export {key}\n"));
                }
                for (key, value) in ours {
                    script.push_str(&format!("export {key}=\"{value}\"\n"));
                }
                String::new()
            }
        };
        let stop = quote(&self.stop.to_string_lossy());
        let exit = quote(&self.exit.to_string_lossy());
        script.push_str(&format!(
            "setsid {start}/bin/sh -c \"$gleaner_command\" > {} 2> {} &\n\
             gleaner_pid=$!\n\
             while kill -0 $gleaner_pid 2> /dev/null && [ ! -s {stop} ]; do sleep 0.5; done\n\
             if [ -s {stop} ]; then\n\
             read gleaner_signal gleaner_grace < {stop}\n\
             kill -$gleaner_signal -$gleaner_pid 2> /dev/null\n\
             gleaner_waited=0\n\
             while kill -0 $gleaner_pid 2> /dev/null && [ $gleaner_waited -lt $gleaner_grace ]; do sleep 1; gleaner_waited=$((gleaner_waited + 1)); done\n\
             kill -KILL -$gleaner_pid 2> /dev/null\n\
             wait $gleaner_pid\n\
             echo {PREEMPTED} > {exit}\n\
             else\n\
             wait $gleaner_pid\n\
             echo $? > {exit}\n\
             fi\n",
            quote(&self.stdout.to_string_lossy()),
            quote(&self.stderr.to_string_lossy()),
        ));
        script
    }
}

/// A line that sets the shell variable `name` to exactly `text`, made of
/// printable ASCII whatever `text` holds: bytes other than letters, digits
/// and a few marks are written as octal escapes, which `printf %b` turns
/// back (the `x` keeps trailing newlines from `$(…)`, which drops them).
fn literal(name: &str, text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b" _-.,/:=+@".contains(&byte) {
            escaped.push(char::from(byte));
        } else {
            escaped.push_str(&format!("\\0{byte:03o}"));
        }
    }
    format!("{name}=$(printf '%bx' '{escaped}'); {name}=${{{name}%x}}\n")
}

/// `program args` as `run_as` where that is not this process's account:
/// through `runuser` (the kcm runs as root), so that the batch system sees
/// the job as the owner's.
pub fn as_account(
    program: &str,
    args: &[String],
    run_as: Option<&Account>,
) -> (String, Vec<String>) {
    match run_as.filter(|a| !a.is_me()) {
        Some(account) => {
            // `sbatch` passes its own environment on: not the kcm's settings.
            let mut wrapped = vec![
                "-u".to_owned(),
                account.name.clone(),
                "--".to_owned(),
                "env".to_owned(),
            ];
            for key in kcm_only() {
                wrapped.extend(["-u".to_owned(), key]);
            }
            wrapped.push(program.to_owned());
            wrapped.extend(args.iter().cloned());
            ("runuser".to_owned(), wrapped)
        }
        None => (program.to_owned(), args.to_vec()),
    }
}

/// Quotes for `/bin/sh`.
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// One batch system. Implementations log nothing themselves: the kcm logs
/// and reports their errors with the cluster's name.
pub trait Backend: Send + 'static {
    /// `local`, `sge`, …
    fn kind(&self) -> &'static str;

    /// How this backend's placeholders start a launcher.
    fn launcher_command(&self) -> &LauncherCommand;

    fn snapshot(&mut self) -> impl Future<Output = Result<Snapshot, BackendError>> + Send;

    /// Submits launchers for `job` covering up to `slots` slots, as
    /// `run_as` (the job owner's account; `None`: the kcm's own); returns
    /// the slots actually submitted.
    fn submit(
        &mut self,
        job: &JobId,
        slots: u32,
        task: TaskShape,
        run_as: Option<RunAs<'_>>,
    ) -> impl Future<Output = Result<u32, BackendError>> + Send;

    /// Removes placeholders or components by id, running or not.
    fn remove(&mut self, ids: &[String]) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Whether it submits a component of another account's as that
    /// account (the batch system runs it as the owner, and accounts it to
    /// them), its files in a directory of the owner's; otherwise the
    /// kcm's account runs its wrapper, which switches to the owner for the
    /// command alone, its files in the spool itself.
    fn components_as_owner(&self) -> bool;

    /// Submits a grid job's component as an ordinary batch job running
    /// `files.script(spec, run_as)` (as `run_as` if it
    /// [`Backend::components_as_owner`]), its slots on one host if
    /// `one_host`.
    fn submit_component(
        &mut self,
        spec: &ComponentSpec,
        files: &ComponentFiles,
        one_host: bool,
        run_as: Option<&Account>,
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
    /// The broker's addresses, as the kcm reaches them.
    pub broker_urls: Vec<String>,
    /// The `[launcher]` settings, as TOML, for a launcher that may not read
    /// the kcm's configuration (one running as a job's owner).
    pub launcher_settings: String,
    /// Each host's GPUs, for launchers to claim theirs from where the
    /// batch system counts GPUs but does not assign them (empty: it does).
    pub gpu_devices: Vec<String>,
}

/// The kcm's settings in its environment, which a launcher running as a
/// job's owner must not see: its broker account, its configuration file,
/// and every other `GLEANER_*` variable (a launcher of the owner's reads
/// its settings file, which has what it needs).
pub fn kcm_only() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(key, _)| key.into_string().ok())
        .filter(|key| key.starts_with("GLEANER_"))
        .collect()
}

/// Whom launchers run for: the job owner's account, and the settings file
/// they read instead of the kcm's (with the job's launcher account).
#[derive(Debug, Clone, Copy)]
pub struct RunAs<'a> {
    pub account: &'a Account,
    pub settings: &'a std::path::Path,
}

impl LauncherCommand {
    /// The command for launchers running as `run_as`, if given.
    pub fn for_run_as(&self, run_as: Option<RunAs<'_>>) -> Self {
        match run_as {
            Some(run_as) => self.for_owner(run_as.settings),
            None => self.clone(),
        }
    }

    /// The command for launchers running as a job's owner: none of the
    /// kcm's environment (its broker account, its configuration, whatever
    /// else its `GLEANER_*` variables say), `settings` read instead, which
    /// holds all a launcher needs (`[launcher]` as the kcm has it).
    pub fn for_owner(&self, settings: &std::path::Path) -> Self {
        Self {
            env: vec![("GLEANER_CONFIG".to_owned(), settings.display().to_string())],
            ..self.clone()
        }
    }

    /// What a job's launchers read when they run as its owner: the broker's
    /// addresses with the job's launcher account, and `[launcher]`.
    pub fn owner_settings(&self, credentials: &Credentials) -> String {
        let urls: Vec<String> = self
            .broker_urls
            .iter()
            .map(|url| {
                let (scheme, rest) = url.split_once("://").unwrap_or(("amqp", url));
                let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                format!(
                    "{scheme}://{}:{}@{host}",
                    credentials.user, credentials.password
                )
            })
            .collect();
        format!(
            "# gleaner: this job's launcher account; readable by its owner only\nbroker_urls = {:?}\n\n{}",
            urls, self.launcher_settings
        )
    }
    /// The full argument list for one launcher.
    pub fn arguments(&self, launcher: &LauncherArgs<'_>) -> Vec<String> {
        let mut args = self.args.clone();
        args.extend(launcher.to_vec());
        args
    }

    /// A placeholder's job script: one launcher of `slots` slots, named
    /// after its array task, whose id only the batch system knows when it
    /// runs; `batch_id` spells it for the shell (`"$JOB_ID.$SGE_TASK_ID"`).
    pub fn script(
        &self,
        cluster: &ClusterName,
        job: &JobId,
        slots: u32,
        task: TaskShape,
        time: PlaceholderTime<'_>,
        batch_id: &str,
    ) -> String {
        let PlaceholderTime { walltime, ends_at } = time;
        let mut script = String::from("#!/bin/sh\n# gleaner placeholder: one launcher\n");
        for (key, value) in &self.env {
            script.push_str(&format!("export {key}={}\n", quote(value)));
        }
        // What a launcher reads beside gleaner's settings, which the batch
        // system does not pass on (`--export=NONE`, `qsub` without `-V`):
        // its log filter and the certificates it trusts.
        for key in ["RUST_LOG", "SSL_CERT_FILE", "SSL_CERT_DIR"] {
            if let Ok(value) = std::env::var(key) {
                script.push_str(&format!("export {key}={}\n", quote(&value)));
            }
        }
        if let Some(GivenEnd { command, least }) = ends_at {
            // Asked again while the controller does not answer; then the
            // least it may have given, never the walltime asked.
            script.push_str(&format!(
                "for gleaner_try in 1 2 3; do\n    gleaner_ends_at=$({{ {command}; }} 2>/dev/null | tr -dc 0-9)\n    [ -n \"$gleaner_ends_at\" ] && break\n    sleep 1\ndone\n[ -n \"$gleaner_ends_at\" ] || gleaner_ends_at=$(( $(date +%s) + {} ))\n",
                least.as_secs()
            ));
        }
        let mut line = format!("exec {}", quote(&self.program.to_string_lossy()));
        for arg in &self.args {
            line.push(' ');
            line.push_str(&quote(arg));
        }
        let cluster = quote(cluster.as_str());
        // Each quoted: joined by commas, the shell reads one word of them.
        let gpu_devices: Vec<String> = self.gpu_devices.iter().map(|d| quote(d)).collect();
        let launcher = LauncherArgs {
            job: &quote(job.as_str()),
            cluster: &cluster,
            id: &launcher_id_word(&cluster, batch_id),
            slot: batch_id,
            slots,
            task_slots: task.slots,
            task_needs: task.needs,
            gpu_devices: &gpu_devices,
            gpu_claims: &[],
            walltime,
            ends_at: ends_at.map(|_| "\"$gleaner_ends_at\""),
        };
        for arg in launcher.to_vec() {
            line.push(' ');
            line.push_str(&arg);
        }
        script.push_str(&line);
        script.push('\n');
        script
    }
}

/// The time a placeholder asks for, and how its launcher learns the time
/// it was given.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlaceholderTime<'a> {
    pub walltime: Option<Duration>,
    /// Where the batch system may give a placeholder less than `walltime`.
    pub ends_at: Option<GivenEnd<'a>>,
}

/// How a placeholder learns the end the batch system gave it.
#[derive(Debug, Clone, Copy)]
pub struct GivenEnd<'a> {
    /// A command that prints it, in seconds since the epoch, for the
    /// launcher to take only tasks that end before it.
    pub command: &'a str,
    /// The least the batch system may have given: the end taken when the
    /// command cannot say (a busy controller), so that no task outlasts a
    /// placeholder that ends sooner than its walltime.
    pub least: Duration,
}

/// Memory a launcher holds itself, asked beside its tasks' where they ask
/// for memory: a batch system that enforces a placeholder's memory would
/// otherwise kill the launcher with tasks within their limits.
pub const LAUNCHER_MEMORY_MB: u64 = 64;

/// What a placeholder of `slots` slots asks for beside them: its whole
/// tasks' needs, and the launcher's own memory where they ask for memory.
pub fn placeholder_needs(task: TaskShape, slots: u32) -> Needs {
    let needs = task.needs_of(slots);
    Needs {
        memory_mb: match needs.memory_mb {
            0 => 0,
            mb => mb.saturating_add(LAUNCHER_MEMORY_MB),
        },
        ..needs
    }
}

/// The placeholder arrays covering `slots`: `(launchers, slots each)` —
/// whole launchers of `size`, and one smaller for the rest; each a
/// multiple of `task_slots` (a launcher runs whole tasks), `size` rounded
/// to one.
pub fn launcher_arrays(slots: u32, size: u32, task_slots: u32) -> Vec<(u32, u32)> {
    let task_slots = task_slots.max(1);
    let size = task_slots * (size / task_slots).max(1);
    let slots = slots - slots % task_slots;
    [
        (slots / size, size),
        (u32::from(!slots.is_multiple_of(size)), slots % size),
    ]
    .into_iter()
    .filter(|(count, _)| *count > 0)
    .collect()
}

/// Submits a grant of `slots` for `job` as arrays of whole launchers of
/// `size` (see [`launcher_arrays`]), one `submit(count, each)` after the
/// other; returns the slots submitted. A failure after some arrays went in
/// keeps those, and is logged.
pub async fn submit_arrays<F, Fut>(
    job: &JobId,
    slots: u32,
    size: u32,
    task_slots: u32,
    mut submit: F,
) -> Result<u32, BackendError>
where
    F: FnMut(u32, u32) -> Fut,
    Fut: Future<Output = Result<(), BackendError>>,
{
    let mut started = 0;
    for (count, each) in launcher_arrays(slots, size, task_slots) {
        if let Err(e) = submit(count, each).await {
            if started == 0 {
                return Err(e);
            }
            warn!(job = %job, started, error = %e, "only part of the launchers submitted");
            return Ok(started);
        }
        started += count * each;
    }
    Ok(started)
}

/// Removes batch jobs by id, a hundred per `remove` command; a job the
/// batch system no longer knows (its answer contains `gone`) ended
/// meanwhile, which is what was wanted.
pub async fn remove_all<F, Fut>(
    ids: &[String],
    gone: &str,
    mut remove: F,
) -> Result<(), BackendError>
where
    F: FnMut(Vec<String>) -> Fut,
    Fut: Future<Output = Result<String, BackendError>>,
{
    for chunk in ids.chunks(100) {
        match remove(chunk.to_vec()).await {
            Err(e) if !e.message.contains(gone) => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Runs a batch-system command with `env` added, `stdin` written to it;
/// its failure carries its own output, and one that does not answer
/// within `timeout` is killed and fails.
pub async fn run(
    program: &str,
    args: &[String],
    stdin: Option<&str>,
    env: &[(&str, &str)],
    timeout: Duration,
) -> Result<String, BackendError> {
    let shown = format!("{program} {}", args.join(" "));
    let failed = |message: String| BackendError {
        command: shown.clone(),
        message,
    };
    let mut command = Command::new(program);
    // Slurm's commands take options from these too: only the command line
    // (and what the backend passes) says what gleaner asks for or reads.
    for (key, _) in std::env::vars_os() {
        if let Some(key) = key.to_str()
            && ["SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_"]
                .iter()
                .any(|p| key.starts_with(p))
        {
            command.env_remove(key);
        }
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| failed(e.to_string()))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .await
            .map_err(|e| failed(format!("cannot write the job script: {e}")))?;
    }
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| failed(format!("no answer within {timeout:?}")))?
        .map_err(|e| failed(e.to_string()))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let said = format!("{} {}", stderr.trim(), stdout.trim());
        return Err(failed(format!("{}: {}", output.status, said.trim())));
    }
    Ok(stdout)
}

#[cfg(test)]
pub(crate) mod tests;
