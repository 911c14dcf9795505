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
mod tests {
    #[test]
    fn plain_commands_skip_the_shell_and_the_rest_keep_it() {
        assert_eq!(super::plain_words("true"), Some(vec!["true"]));
        assert_eq!(
            super::plain_words("./solve  --seed 3\t--alpha=0.5 out/x,y"),
            Some(vec!["./solve", "--seed", "3", "--alpha=0.5", "out/x,y"])
        );
        for shell in [
            "echo -e 'a\\tb'",
            "a=1 ./solve",
            "./solve > out",
            "./solve $HOME",
            "cd x",
            "./solve *.dat",
            "./a && ./b",
            "./solve 'two words'",
            "exit 3",
            "./solve # comment",
            "./solve ~/x",
            "",
            "   ",
        ] {
            assert_eq!(super::plain_words(shell), None, "{shell:?}");
        }
    }

    #[test]
    fn programs_are_found_as_the_shell_finds_them() {
        let cwd = std::path::Path::new("/");
        assert_eq!(
            super::find_program("sh", cwd, Some("/nonexistent::/bin")),
            Some(std::path::PathBuf::from("/bin/sh"))
        );
        assert_eq!(
            super::find_program("no-such-program", cwd, Some("/bin:/usr/bin")),
            None
        );
        assert_eq!(
            super::find_program("sh", cwd, None),
            None,
            "no PATH, no search"
        );
        assert!(
            super::find_program("bin/sh", cwd, None).is_some(),
            "relative to the task's directory"
        );
        assert_eq!(
            super::find_program("sh", cwd, Some("bin")),
            None,
            "relative PATH entries are the shell's"
        );
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("no-hashbang");
        std::fs::write(&script, "echo hi\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        assert_eq!(
            super::find_program("./no-hashbang", dir.path(), None),
            None,
            "a script for the shell"
        );
        assert_eq!(
            super::find_program("etc/passwd", cwd, None),
            None,
            "not executable"
        );
    }

    #[test]
    fn a_directory_tree_is_measured_up_to_the_limit() {
        let dir = std::env::temp_dir().join(format!("gleaner-size-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("one"), [0u8; 100]).unwrap();
        std::fs::write(dir.join("a/b/two"), [0u8; 200]).unwrap();
        std::os::unix::fs::symlink("/usr", dir.join("link")).unwrap();
        assert!(!super::size_over(&dir, 300), "links are not followed");
        assert!(super::size_over(&dir, 299));
        assert!(!super::size_over(&dir.join("missing"), 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    use super::*;

    fn task<'a>(command: &'a str, dir: &Path) -> TaskRun<'a> {
        TaskRun {
            command,
            env: &[],
            walltime: None,
            outputs: &[],
            workdir: None,
            sandbox: dir.join("sandbox"),
            preempt: None,
            memory_mb: None,
            streams: Streams::default(),
        }
    }

    #[test]
    fn a_tasks_variables_replace_the_launchers_and_each_other() {
        let own = task_vars([
            (OsStr::new("HOME"), OsStr::new("/root")),
            (OsStr::new("PATH"), OsStr::new("/bin")),
        ])
        .unwrap();
        let set = task_vars([
            (OsStr::new("PATH"), OsStr::new("/opt/bin")),
            (OsStr::new("X"), OsStr::new("1")),
            (OsStr::new("X"), OsStr::new("2")),
        ])
        .unwrap();
        let env: Vec<&str> = task_env(&own, &set)
            .into_iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(env, ["HOME=/root", "PATH=/opt/bin", "X=2"]);
        let nul = task_vars([(OsStr::new("Y"), OsStr::new("a\0b"))]).err();
        assert!(nul.is_some_and(|e| e.to_string().contains("$Y")));
    }

    fn never() -> watch::Receiver<bool> {
        watch::channel(false).1
    }

    #[tokio::test]
    async fn a_running_tasks_output_is_seen_before_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let streams = Streams::default();
        let run = TaskRun {
            streams: streams.clone(),
            ..task("echo early; echo warn >&2; sleep 30", dir.path())
        };
        let (stop, stopped) = watch::channel(false);
        let running =
            tokio::spawn(async move { super::run(run, Limits::default(), stopped).await });
        let deadline = Instant::now() + Duration::from_secs(20);
        let [out, err] = loop {
            let [out, err] = streams.since([0, 0]);
            if out.data == b"early\n" && err.data == b"warn\n" || Instant::now() > deadline {
                break [out, err];
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(out.data, b"early\n");
        assert_eq!(err.data, b"warn\n");
        assert_eq!(streams.since([6, 5])[0].data, b"");
        stop.send_replace(true);
        assert!(running.await.unwrap().is_none());
    }

    #[tokio::test]
    async fn success_captures_output_and_removes_the_sandbox() {
        let dir = tempfile::tempdir().unwrap();
        let env = [("GREETING".to_owned(), "hello".to_owned())];
        let run = TaskRun {
            env: &env,
            ..task("echo $GREETING; echo oops >&2; pwd", dir.path())
        };
        let run = TaskRun {
            command: "echo $GREETING; echo oops >&2; pwd; mkdir -p junk/deep; touch junk/deep/f left",
            ..run
        };
        let outcome = super::run(run, Limits::default(), never()).await.unwrap();
        assert_eq!(outcome.status, RunStatus::Succeeded);
        assert_eq!(outcome.exit_code, Some(0));
        let stdout = String::from_utf8(outcome.stdout.data).unwrap();
        assert!(stdout.starts_with("hello\n"), "{stdout}");
        assert!(stdout.contains("sandbox"), "ran in the sandbox: {stdout}");
        assert_eq!(outcome.stderr.data, b"oops\n");
        let sandbox = dir.path().join("sandbox");
        assert!(reset_sandbox(&sandbox));
        assert_eq!(
            std::fs::read_dir(&sandbox).unwrap().count(),
            0,
            "emptied for the next task"
        );
    }

    /// Tasks yield to their launcher, and to whatever else runs on the node.
    #[tokio::test]
    async fn a_task_runs_nicer_than_its_launcher() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            nice: 3,
            ..Limits::default()
        };
        let outcome = super::run(
            task("cut -d' ' -f19 /proc/self/stat", dir.path()),
            limits,
            never(),
        )
        .await
        .unwrap();
        // SAFETY: reads this thread's niceness.
        let own = unsafe { nix::libc::getpriority(nix::libc::PRIO_PROCESS, 0) };
        assert_eq!(
            String::from_utf8(outcome.stdout.data).unwrap().trim(),
            (own + 3).min(19).to_string()
        );
    }

    /// A command without shell syntax runs as its program, as `sh -c`
    /// would have run it: in the sandbox, with `PWD` saying so.
    #[tokio::test]
    async fn a_plain_command_runs_directly_with_the_shells_result() {
        let dir = tempfile::tempdir().unwrap();
        let run = task("printenv PWD GLEANER_SANDBOX", dir.path());
        let sandbox = run.sandbox.display().to_string();
        let outcome = super::run(run, Limits::default(), never()).await.unwrap();
        assert_eq!(outcome.status, RunStatus::Succeeded);
        assert_eq!(
            String::from_utf8(outcome.stdout.data).unwrap(),
            format!("{sandbox}\n{sandbox}\n")
        );
        let outcome = super::run(task("false", dir.path()), Limits::default(), never())
            .await
            .unwrap();
        assert_eq!(
            (outcome.status, outcome.exit_code),
            (RunStatus::Failed, Some(1))
        );
        let outcome = super::run(
            task("no-such-program x", dir.path()),
            Limits::default(),
            never(),
        )
        .await
        .unwrap();
        assert_eq!(outcome.exit_code, Some(127), "the shell's answer");
        assert!(String::from_utf8_lossy(&outcome.stderr.data).contains("not found"));
    }

    #[tokio::test]
    async fn failure_missing_executable_and_signals() {
        let dir = tempfile::tempdir().unwrap();
        let outcome = super::run(task("exit 3", dir.path()), Limits::default(), never())
            .await
            .unwrap();
        assert_eq!(
            (outcome.status, outcome.exit_code),
            (RunStatus::Failed, Some(3))
        );
        let outcome = super::run(
            task("./no-such-program", dir.path()),
            Limits::default(),
            never(),
        )
        .await
        .unwrap();
        assert_eq!(
            (outcome.status, outcome.exit_code),
            (RunStatus::Failed, Some(127))
        );
        assert!(String::from_utf8_lossy(&outcome.stderr.data).contains("not found"));
        let outcome = super::run(task("kill -9 $$", dir.path()), Limits::default(), never())
            .await
            .unwrap();
        assert_eq!(
            (outcome.status, outcome.signal),
            (RunStatus::Failed, Some(9))
        );
    }

    #[tokio::test]
    async fn a_task_over_its_memory_is_killed_as_out_of_memory_with_its_peak() {
        assert!(orphans::contain().is_ok(), "task cgroups are allowed here");
        let dir = tempfile::tempdir().unwrap();
        // 200 MiB held in a child of the shell, escaped from its group:
        // its cgroup still counts it.
        let hog =
            "setsid python3 -c 'b = bytearray(200 << 20); import time; time.sleep(30)' & wait";
        let run = TaskRun {
            memory_mb: Some(64),
            ..task(hog, dir.path())
        };
        let started = Instant::now();
        let outcome = super::run(run, Limits::default(), never()).await.unwrap();
        assert_eq!(outcome.status, RunStatus::Oom, "{outcome:?}");
        assert!(outcome.peak_memory_mb.unwrap() > 64, "{outcome:?}");
        assert!(outcome.error.unwrap().contains("64 MiB"));
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "killed, not waited for"
        );

        orphans::release();
    }

    #[tokio::test]
    async fn memory_forked_workers_share_is_counted_once() {
        assert!(orphans::contain().is_ok(), "task cgroups are allowed here");
        let dir = tempfile::tempdir().unwrap();
        // 80 MiB, then three forked workers sharing it: 320 MiB resident
        // all told, 80 MiB in fact.
        let workers = "python3 -c 'import os, time
b = bytearray(80 << 20)
for _ in range(3):
    if os.fork() == 0:
        time.sleep(2)
        os._exit(0)
time.sleep(2)
os.wait()'";
        let run = TaskRun {
            memory_mb: Some(200),
            ..task(workers, dir.path())
        };
        let outcome = super::run(run, Limits::default(), never()).await.unwrap();
        assert_eq!(outcome.status, RunStatus::Succeeded, "{outcome:?}");
        let peak = outcome.peak_memory_mb.unwrap_or(0);
        assert!((60..200).contains(&peak), "counted once: {peak} MiB");
        orphans::release();
    }

    #[tokio::test]
    async fn without_task_cgroups_memory_is_counted_over_the_tasks_descendants() {
        let dir = tempfile::tempdir().unwrap();
        let hog = "sh -c \"python3 -c 'b = bytearray(200 << 20); import time; time.sleep(30)'\"";
        let run = TaskRun {
            memory_mb: Some(64),
            ..task(hog, dir.path())
        };
        let outcome = super::run(run, Limits::default(), never()).await.unwrap();
        assert_eq!(outcome.status, RunStatus::Oom, "{outcome:?}");

        let small = TaskRun {
            memory_mb: Some(64),
            ..task("python3 -c 'b = bytearray(8 << 20)'", dir.path())
        };
        let outcome = super::run(small, Limits::default(), never()).await.unwrap();
        assert_eq!(outcome.status, RunStatus::Succeeded, "{outcome:?}");
        assert!(outcome.peak_memory_mb.is_some());
    }

    #[tokio::test]
    async fn walltime_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("survivor");
        let command = format!("(sleep 3; touch {}) & sleep 30", marker.display());
        let run = TaskRun {
            walltime: Some(Duration::from_millis(300)),
            ..task(&command, dir.path())
        };
        let started = Instant::now();
        let outcome = super::run(run, Limits::default(), never()).await.unwrap();
        assert_eq!(outcome.status, RunStatus::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(
            !marker.exists(),
            "the background child was killed with its group"
        );
    }

    #[tokio::test]
    async fn output_is_kept_when_an_escaped_daemon_holds_the_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let run = task("echo before; setsid sleep 5 & echo after", dir.path());
        let outcome = super::run(run, Limits::default(), never()).await.unwrap();
        assert_eq!(outcome.status, RunStatus::Succeeded);
        assert_eq!(outcome.stdout.data, b"before\nafter\n");
    }

    #[tokio::test]
    async fn processes_that_leave_the_group_end_with_the_task() {
        assert!(orphans::adopt(), "the subreaper is allowed here");
        let dir = tempfile::tempdir().unwrap();
        // Unique among the tests running at once.
        let daemon = format!("sleep 41.{}", std::process::id());
        // Out of the group before the task ends, which the group kill misses.
        let command =
            format!("setsid {daemon} & setsid sh -c '{daemon} & wait' & sleep 0.3; echo started");
        let outcome = super::run(task(&command, dir.path()), Limits::default(), never())
            .await
            .unwrap();
        assert_eq!(outcome.stdout.data, b"started\n");
        let left = std::process::Command::new("pgrep")
            .args(["-f", &daemon])
            .output()
            .unwrap();
        assert!(
            left.stdout.is_empty(),
            "escaped processes outlived their task: {}",
            String::from_utf8_lossy(&left.stdout)
        );
    }

    #[tokio::test]
    async fn a_running_tasks_orphan_lives_until_that_task_ends() {
        assert!(orphans::adopt(), "the subreaper is allowed here");
        assert!(orphans::contain().is_ok(), "cgroup v2 is writable here");
        let dir = tempfile::tempdir().unwrap();
        let daemon = format!("sleep 43.{}", std::process::id());
        // The daemon's own command line, not the task's shell's.
        let running = |daemon: &str| {
            let found = std::process::Command::new("pgrep")
                .args(["-f", &format!("^{daemon}$")])
                .output()
                .unwrap();
            !found.stdout.is_empty()
        };
        // Orphaned at once (its parent subshell ends), out of the group,
        // while its task still runs.
        let long = tokio::spawn({
            let (command, sandbox) = (
                format!("(setsid {daemon} &); sleep 2"),
                dir.path().join("a"),
            );
            async move { super::run(task(&command, &sandbox), Limits::default(), never()).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(running(&daemon), "the orphan started");
        // Another task ending sweeps the strays; the orphan is not one.
        let short = super::run(
            task("true", &dir.path().join("b")),
            Limits::default(),
            never(),
        )
        .await
        .unwrap();
        assert_eq!(short.status, RunStatus::Succeeded);
        assert!(
            running(&daemon),
            "another task's end spared a running task's orphan"
        );
        let outcome = long.await.unwrap().unwrap();
        assert_eq!(outcome.status, RunStatus::Succeeded);
        assert!(!running(&daemon), "the orphan ended with its task");
        orphans::release();
    }

    #[tokio::test]
    async fn stop_kills_and_returns_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = watch::channel(false);
        let handle = tokio::spawn({
            let sandbox = dir.path().to_path_buf();
            async move { super::run(task("sleep 30", &sandbox), Limits::default(), rx).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        tx.send(true).unwrap();
        assert_eq!(handle.await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_preempted_task_gets_its_signal_and_grace_before_the_kill() {
        let dir = tempfile::tempdir().unwrap();
        let saved = dir.path().join("saved");
        let command = format!(
            "trap 'sleep 0.3; echo state > {}; exit 0' USR1; sleep 30 & wait",
            saved.display()
        );
        let (tx, rx) = watch::channel(false);
        let handle = tokio::spawn({
            let sandbox = dir.path().to_path_buf();
            async move {
                let run = TaskRun {
                    preempt: Some((Signal::SIGUSR1, Duration::from_secs(5))),
                    ..task(&command, &sandbox)
                };
                super::run(run, Limits::default(), rx).await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let asked = Instant::now();
        tx.send(true).unwrap();
        assert_eq!(handle.await.unwrap(), None, "preempted: no outcome");
        assert_eq!(
            std::fs::read_to_string(&saved).unwrap_or_default(),
            "state\n"
        );
        assert!(
            asked.elapsed() < Duration::from_secs(4),
            "no longer than it took"
        );
    }

    #[tokio::test]
    async fn output_is_bounded_and_outputs_collected() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            stream_bytes: 10,
            file_bytes: 4,
            ..Limits::default()
        };
        let outputs = ["*.txt".to_owned(), "sub/*".to_owned()];
        let run = TaskRun {
            outputs: &outputs,
            ..task(
                "seq 1 100000; echo 123456 > a.txt; mkdir sub; echo hi > sub/b; ln -s /etc/passwd c.txt",
                dir.path(),
            )
        };
        let outcome = super::run(run, limits, never()).await.unwrap();
        assert_eq!(outcome.stdout.data.len(), 10);
        assert!(outcome.stdout.data.ends_with(b"100000\n"));
        assert!(outcome.stdout.dropped > 0);
        let names: Vec<&str> = outcome.outputs.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["a.txt", "sub/b"]);
        assert_eq!(outcome.outputs[0].data, b"1234");
        assert_eq!(outcome.outputs[0].dropped, 3);
    }
}
