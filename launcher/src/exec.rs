//! Running one task: a fresh sandbox, the command in its own process group,
//! the walltime enforced, output captured within bounds, the node left as it
//! was found.

use std::{
    ffi::{CStr, CString, OsStr, OsString},
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    process::ExitStatus,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use gleaner_protocol::{Captured, MAX_OUTPUT_FILES, OutputFile, RunStatus, StreamPiece};
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt},
    sync::watch,
};
use tracing::debug;

use crate::{Limits, orphans};

/// What to run.
#[derive(Debug, Clone)]
pub struct TaskRun<'a> {
    pub command: &'a str,
    pub env: &'a [(String, String)],
    pub walltime: Option<Duration>,
    pub outputs: &'a [String],
    pub workdir: Option<&'a Path>,
    /// An empty directory for this run; emptied again afterwards.
    pub sandbox: PathBuf,
    /// When stopped (preempted): this signal, and this long to save state
    /// before the kill; `None` kills at once.
    pub preempt: Option<(Signal, Duration)>,
    /// Mebibytes its processes may hold together: over it, it is killed
    /// as out of memory.
    pub memory_mb: Option<u64>,
    /// Where its output is read into, for the launcher to send while it
    /// runs when someone follows it.
    pub streams: Streams,
}

/// A run's stdout and stderr as they are read, shared between the run and
/// the launcher.
#[derive(Debug, Clone, Default)]
pub struct Streams {
    stdout: Arc<Mutex<Tail>>,
    stderr: Arc<Mutex<Tail>>,
}

impl Streams {
    /// What stdout and stderr printed from these offsets on.
    pub fn since(&self, from: [u64; 2]) -> [StreamPiece; 2] {
        let piece = |tail: &Arc<Mutex<Tail>>, from| match tail.lock() {
            Ok(tail) => StreamPiece::since(&tail.data, tail.dropped, from),
            Err(_) => StreamPiece::default(),
        };
        [piece(&self.stdout, from[0]), piece(&self.stderr, from[1])]
    }
}

/// How a run ended, when it ended by itself (not killed by the launcher).
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub runtime: Duration,
    pub stdout: Captured,
    pub stderr: Captured,
    pub outputs: Vec<OutputFile>,
    pub error: Option<String>,
    /// The most its processes held together, when it had a memory limit.
    pub peak_memory_mb: Option<u64>,
}

/// Runs a task until it ends, its walltime passes, or `stop` turns true (then
/// `None`: the task was killed and its result is not wanted).
pub async fn run(
    task: TaskRun<'_>,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) -> Option<Outcome> {
    let started = Instant::now();
    // One call where the sandbox is a reused one, as it mostly is.
    let made = match std::fs::create_dir(&task.sandbox) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && task.sandbox.is_dir() => Ok(()),
        Err(_) => std::fs::create_dir_all(&task.sandbox),
        made => made,
    };
    if let Err(e) = made {
        return Some(Outcome::not_started(
            format!("cannot create sandbox {}: {e}", task.sandbox.display()),
            started,
        ));
    }
    let cwd = task.workdir.unwrap_or(&task.sandbox).to_path_buf();
    let mut outcome = supervise(&task, &cwd, limits, &mut stop, started).await?;
    if outcome.error.is_none() {
        outcome.outputs = collect_outputs(&cwd, task.outputs, limits);
    }
    Some(outcome)
}

/// Whether the files under `dir` (not following links) hold more than
/// `limit` bytes; it stops counting as soon as they do.
pub fn size_over(dir: &Path, limit: u64) -> bool {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
                if total > limit {
                    return true;
                }
            }
        }
    }
    false
}

/// Empties a sandbox after a run so the next task finds it as fresh as a new
/// one (reusing the directory spares the filesystem an inode per task).
/// `false` if it could not be emptied: the caller should not reuse it.
pub fn reset_sandbox(sandbox: &Path) -> bool {
    let entries = match std::fs::read_dir(sandbox) {
        Ok(entries) => entries,
        Err(e) => {
            debug!(sandbox = %sandbox.display(), error = %e, "sandbox unreadable");
            return false;
        }
    };
    let mut clean = true;
    for entry in entries.flatten() {
        let path = entry.path();
        let removed = match entry.file_type() {
            Ok(kind) if kind.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        if let Err(e) = removed {
            debug!(path = %path.display(), error = %e, "cannot clean the sandbox");
            clean = false;
        }
    }
    clean
}

/// Shell builtins and keywords (dash's): a command starting with one runs
/// through the shell, where it means what the user expects (`echo -e`,
/// `cd`). `true` and `false` are not here: their programs do the same.
const SHELL_WORDS: &[&str] = &[
    ".", ":", "[", "alias", "bg", "break", "case", "cd", "chdir", "command", "continue", "do",
    "done", "echo", "elif", "else", "esac", "eval", "exec", "exit", "export", "fc", "fg", "fi",
    "for", "function", "getopts", "hash", "if", "in", "jobs", "kill", "local", "printf", "pwd",
    "read", "readonly", "return", "set", "shift", "test", "then", "times", "trap", "type",
    "ulimit", "umask", "unalias", "unset", "until", "wait", "while",
];

/// The words of a command that needs no shell: no quotes, expansions,
/// redirections, operators, globs, comments or assignments, and no builtin
/// or keyword first. Such a command is run directly, with the same result
/// as through `sh -c` and one process fewer to start.
fn plain_words(command: &str) -> Option<Vec<&str>> {
    const SPECIAL: &[char] = &[
        '|', '&', ';', '<', '>', '(', ')', '$', '`', '\\', '"', '\'', '*', '?', '[', ']', '#', '~',
        '{', '}', '!', '\n', '\r',
    ];
    if command.contains(SPECIAL) {
        return None;
    }
    let words: Vec<&str> = command
        .split([' ', '\t'])
        .filter(|w| !w.is_empty())
        .collect();
    let program = *words.first()?;
    (!program.contains('=') && !SHELL_WORDS.contains(&program)).then_some(words)
}

/// Where `program` is, as the shell would find it: relative to `cwd` if it
/// names a directory, else in the absolute directories of `path` (the
/// shell would look for relative ones in the task's directory; it does).
/// Only an executable file that the kernel runs by itself counts: one
/// without `#!` the shell would run as a script.
fn find_program(program: &str, cwd: &Path, path: Option<&str>) -> Option<PathBuf> {
    use std::{io::Read, os::unix::fs::PermissionsExt};
    let runnable = |p: &Path| {
        let executable =
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        let mut magic = [0u8; 4];
        executable
            && std::fs::File::open(p)
                .and_then(|mut f| f.read_exact(&mut magic))
                .is_ok_and(|()| magic.starts_with(b"#!") || magic == *b"\x7fELF")
    };
    if program.contains('/') {
        let found = std::path::absolute(cwd.join(program)).ok()?;
        return runnable(&found).then_some(found);
    }
    path?
        .split(':')
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| Path::new(dir).join(program))
        .find(|p| runnable(p))
}

/// The process a task's command runs as: its program directly when it
/// needs no shell and is found, else `sh -c` (which also says what is
/// wrong with a program that is not there); its arguments, first word
/// included; and whether it is the program itself (the shell sets `PWD`
/// for the programs it starts).
fn task_program(task: &TaskRun<'_>, cwd: &Path) -> (PathBuf, Vec<OsString>, bool) {
    let path = task
        .env
        .iter()
        .rev()
        .find(|(key, _)| key == "PATH")
        .map(|(_, value)| value.clone())
        .or_else(|| std::env::var("PATH").ok());
    let direct = plain_words(task.command).and_then(|words| {
        let program = find_program(words[0], cwd, path.as_deref())?;
        Some((program, words))
    });
    match direct {
        Some((program, words)) => (
            program,
            words.into_iter().map(OsString::from).collect(),
            true,
        ),
        None => (
            PathBuf::from("/bin/sh"),
            ["sh", "-c", task.command].map(OsString::from).into(),
            false,
        ),
    }
}

/// A variable as the kernel takes it, `NAME=value`, rendered once.
struct Variable {
    entry: CString,
    /// The name's length.
    name: usize,
}

impl Variable {
    fn new(name: &OsStr, value: &OsStr) -> std::io::Result<Self> {
        let entry =
            CString::new([name.as_bytes(), b"=", value.as_bytes()].concat()).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("${} holds a NUL byte", name.to_string_lossy()),
                )
            })?;
        Ok(Self {
            entry,
            name: name.len(),
        })
    }

    fn name(&self) -> &[u8] {
        &self.entry.as_bytes()[..self.name]
    }
}

/// The launcher's own environment, rendered once: short tasks start by
/// the thousand a second, and each would otherwise copy all of it.
fn own_env() -> &'static [Variable] {
    static OWN: OnceLock<Vec<Variable>> = OnceLock::new();
    OWN.get_or_init(|| {
        std::env::vars_os()
            .filter_map(|(name, value)| Variable::new(&name, &value).ok())
            .collect()
    })
}

/// The variables a task sets, in order: a later value of a name replaces
/// an earlier one.
fn task_vars<'a>(
    set: impl IntoIterator<Item = (&'a OsStr, &'a OsStr)>,
) -> std::io::Result<Vec<Variable>> {
    let mut vars: Vec<Variable> = Vec::new();
    for (name, value) in set {
        let var = Variable::new(name, value)?;
        match vars.iter_mut().find(|v| v.name() == var.name()) {
            Some(earlier) => *earlier = var,
            None => vars.push(var),
        }
    }
    Ok(vars)
}

/// The environment a task starts with: the launcher's, less the names the
/// task sets, then what it sets.
fn task_env<'a>(own: &'a [Variable], set: &'a [Variable]) -> Vec<&'a CStr> {
    own.iter()
        .filter(|v| !set.iter().any(|s| s.name() == v.name()))
        .chain(set)
        .map(|v| v.entry.as_c_str())
        .collect()
}

async fn supervise(
    task: &TaskRun<'_>,
    cwd: &Path,
    limits: Limits,
    stop: &mut watch::Receiver<bool>,
    started: Instant,
) -> Option<Outcome> {
    let (program, argv, direct) = task_program(task, cwd);
    let pwd = direct.then(|| std::path::absolute(cwd).unwrap_or_else(|_| cwd.to_owned()));
    let set = task_vars(
        task.env
            .iter()
            .map(|(k, v)| (OsStr::new(k), OsStr::new(v)))
            .chain([(OsStr::new("GLEANER_SANDBOX"), task.sandbox.as_os_str())])
            .chain(pwd.iter().map(|pwd| (OsStr::new("PWD"), pwd.as_os_str()))),
    );
    let argv: Vec<&OsStr> = argv.iter().map(OsString::as_os_str).collect();
    let spawned = set.and_then(|set| {
        orphans::spawn(
            &program,
            &argv,
            &task_env(own_env(), &set),
            cwd,
            limits.nice,
        )
    });
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            return Some(Outcome::not_started(
                format!("cannot start the task in {}: {e}", cwd.display()),
                started,
            ));
        }
    };
    let group = Pid::from_raw(child.id());
    let stdout = TailReader::start(
        child.stdout.take(),
        &task.streams.stdout,
        limits.stream_bytes,
    );
    let stderr = TailReader::start(
        child.stderr.take(),
        &task.streams.stderr,
        limits.stream_bytes,
    );
    let walltime = async {
        match task.walltime {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let mut timed_out = false;
    let mut peak = 0;
    let mut out_of_memory = false;
    let status = tokio::select! {
        status = child.wait() => status,
        () = watch_memory(group.as_raw(), task.memory_mb, &mut peak) => {
            out_of_memory = true;
            signal_group(group, Signal::SIGKILL);
            child.wait().await
        }
        () = walltime => {
            timed_out = true;
            signal_group(group, Signal::SIGTERM);
            match tokio::time::timeout(limits.kill_grace, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    signal_group(group, Signal::SIGKILL);
                    child.wait().await
                }
            }
        }
        () = stop_requested(stop) => {
            if let Some((signal, grace)) = task.preempt {
                signal_group(group, signal);
                let _ = tokio::time::timeout(grace, child.wait()).await;
            }
            signal_group(group, Signal::SIGKILL);
            let _ = child.wait().await;
            orphans::ended(group.as_raw());
            return None;
        }
    };
    // Whatever the command left running in the background goes too, in its
    // group or escaped from it.
    signal_group(group, Signal::SIGKILL);
    orphans::ended(group.as_raw());
    let runtime = started.elapsed();
    let stdout = stdout.finish().await;
    let stderr = stderr.finish().await;
    let mut outcome = match status {
        Ok(status) => Outcome::ended(status, timed_out, runtime, stdout, stderr),
        Err(e) => Outcome {
            error: Some(format!("lost track of the command: {e}")),
            ..Outcome::not_started(String::new(), started)
        },
    };
    if let Some(limit) = task.memory_mb {
        outcome.peak_memory_mb = Some(peak);
        if out_of_memory {
            outcome.status = RunStatus::Oom;
            outcome.error = Some(format!(
                "killed: its processes held {peak} MiB, over the {limit} MiB it asked for (memory)"
            ));
        }
    }
    Some(outcome)
}

/// How often a task's memory is measured, where it asked for a limit.
const MEMORY_WATCH: Duration = Duration::from_millis(100);

/// Resolves once the task's processes hold more than `limit_mb` together,
/// keeping the most they held in `peak`; never without a limit. Measured
/// by the launcher, so that a limit holds whatever the host's cgroups.
async fn watch_memory(task: i32, limit_mb: Option<u64>, peak: &mut u64) {
    let Some(limit_mb) = limit_mb else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(MEMORY_WATCH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let held = orphans::resident_bytes(task) >> 20;
        *peak = (*peak).max(held);
        if held > limit_mb {
            return;
        }
    }
}

/// Resolves once `stop` turns true; never, if its sender is gone.
async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn signal_group(group: Pid, signal: Signal) {
    let _ = killpg(group, signal);
}

impl Outcome {
    /// A run that could not start, for `error`.
    pub fn not_started(error: String, started: Instant) -> Self {
        Self {
            status: RunStatus::Failed,
            exit_code: None,
            signal: None,
            runtime: started.elapsed(),
            stdout: Captured::default(),
            stderr: Captured::default(),
            outputs: Vec::new(),
            error: Some(error),
            peak_memory_mb: None,
        }
    }

    fn ended(
        status: ExitStatus,
        timed_out: bool,
        runtime: Duration,
        stdout: Captured,
        stderr: Captured,
    ) -> Self {
        use std::os::unix::process::ExitStatusExt;
        let run_status = if timed_out {
            RunStatus::TimedOut
        } else if status.success() {
            RunStatus::Succeeded
        } else {
            RunStatus::Failed
        };
        Self {
            status: run_status,
            exit_code: status.code(),
            signal: status.signal(),
            runtime,
            stdout,
            stderr,
            outputs: Vec::new(),
            error: None,
            peak_memory_mb: None,
        }
    }
}

/// The last bytes of a stream read so far, and how many came before them.
#[derive(Debug, Default)]
struct Tail {
    data: Vec<u8>,
    dropped: u64,
}

impl Tail {
    fn push(&mut self, bytes: &[u8], limit: usize) {
        self.data.extend_from_slice(bytes);
        // Trim only once the excess is large, to keep appends cheap.
        if self.data.len() > limit.saturating_mul(2).max(64 * 1024) {
            self.trim(limit);
        }
    }

    fn trim(&mut self, limit: usize) {
        if self.data.len() > limit {
            let excess = self.data.len() - limit;
            self.data.drain(..excess);
            self.dropped += excess as u64;
        }
    }
}

/// A stream being read into a shared tail, so that what was read survives
/// a reader that has to be abandoned.
struct TailReader {
    tail: Arc<Mutex<Tail>>,
    task: tokio::task::JoinHandle<()>,
    limit: usize,
}

impl TailReader {
    fn start(
        stream: Option<impl AsyncRead + Unpin + Send + 'static>,
        tail: &Arc<Mutex<Tail>>,
        limit: usize,
    ) -> Self {
        let tail = tail.clone();
        let sink = tail.clone();
        let task = tokio::spawn(async move {
            let Some(mut stream) = stream else { return };
            // On the heap and not zeroed: most tasks write nothing, and a
            // buffer in the future would be copied as it is spawned.
            let mut buffer = Vec::with_capacity(16 * 1024);
            while let Ok(n) = stream.read_buf(&mut buffer).await {
                if n == 0 {
                    break;
                }
                if let Ok(mut tail) = sink.lock() {
                    tail.push(&buffer, limit);
                }
                buffer.clear();
            }
        });
        Self { tail, task, limit }
    }

    /// Waits for the end of the stream, but not forever: a background
    /// process that escaped the process group may still hold the pipe open.
    async fn finish(self) -> Captured {
        let abort = self.task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(1), self.task)
            .await
            .is_err()
        {
            abort.abort();
        }
        let mut tail = self
            .tail
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        tail.trim(self.limit);
        Captured {
            data: tail.data,
            dropped: tail.dropped,
        }
    }
}

/// Reads the files matching the declared patterns, within the size limits
/// and the first [`MAX_OUTPUT_FILES`] of them.
fn collect_outputs(cwd: &Path, patterns: &[String], limits: Limits) -> Vec<OutputFile> {
    let mut files = Vec::new();
    let mut budget = limits.outputs_bytes;
    let base = glob::Pattern::escape(&cwd.to_string_lossy());
    for pattern in patterns {
        let Ok(paths) = glob::glob(&format!("{base}/{pattern}")) else {
            continue;
        };
        for path in paths.flatten() {
            if files.len() == MAX_OUTPUT_FILES {
                return files;
            }
            // Symlinks could point anywhere on the node; only real files count.
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let Ok(relative) = path.strip_prefix(cwd) else {
                continue;
            };
            if !meta.file_type().is_file()
                || files
                    .iter()
                    .any(|f: &OutputFile| Path::new(&f.path) == relative)
            {
                continue;
            }
            let keep = (meta.len() as usize).min(limits.file_bytes).min(budget);
            let data = read_head(&path, keep);
            budget -= data.len();
            files.push(OutputFile {
                path: relative.to_string_lossy().into_owned(),
                dropped: meta.len().saturating_sub(data.len() as u64),
                data,
            });
        }
    }
    files
}

fn read_head(path: &Path, limit: usize) -> Vec<u8> {
    use std::io::Read;
    let mut data = Vec::with_capacity(limit);
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.take(limit as u64).read_to_end(&mut data);
    }
    data
}

#[cfg(test)]
mod tests;
