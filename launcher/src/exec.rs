//! Running one task: a fresh sandbox, the command in its own process group,
//! the walltime enforced, output captured within bounds, the node left as it
//! was found.

use std::{
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use gleaner_protocol::{Captured, OutputFile, RunStatus};
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt},
    process::Command,
    sync::watch,
};
use tracing::debug;

use crate::orphans;

/// Size bounds on what a task sends back (keys of `[launcher]`).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Bytes kept of stdout and of stderr each (the tail).
    #[serde(rename = "max_stream_bytes")]
    pub stream_bytes: usize,
    /// Bytes kept of each declared output file (the head).
    #[serde(rename = "max_file_bytes")]
    pub file_bytes: usize,
    /// Bytes of output files per task in all.
    #[serde(rename = "max_outputs_bytes")]
    pub outputs_bytes: usize,
    /// Between SIGTERM and SIGKILL when a walltime ends.
    #[serde(with = "humantime_serde")]
    pub kill_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            stream_bytes: 1 << 20,
            file_bytes: 16 << 20,
            outputs_bytes: 64 << 20,
            kill_grace: Duration::from_secs(2),
        }
    }
}

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
}

/// Runs a task until it ends, its walltime passes, or `stop` turns true (then
/// `None`: the task was killed and its result is not wanted).
pub async fn run(
    task: TaskRun<'_>,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) -> Option<Outcome> {
    let started = Instant::now();
    if let Err(e) = std::fs::create_dir_all(&task.sandbox) {
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

async fn supervise(
    task: &TaskRun<'_>,
    cwd: &Path,
    limits: Limits,
    stop: &mut watch::Receiver<bool>,
    started: Instant,
) -> Option<Outcome> {
    let mut command = Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(task.command)
        .current_dir(cwd)
        .envs(task.env.iter().map(|(k, v)| (k, v)))
        .env("GLEANER_SANDBOX", &task.sandbox)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match orphans::spawn(&mut command) {
        Ok(child) => child,
        Err(e) => {
            return Some(Outcome::not_started(
                format!("cannot start /bin/sh in {}: {e}", cwd.display()),
                started,
            ));
        }
    };
    let group = child.id().map(|id| Pid::from_raw(id as i32));
    let stdout = TailReader::start(child.stdout.take(), limits.stream_bytes);
    let stderr = TailReader::start(child.stderr.take(), limits.stream_bytes);
    let walltime = async {
        match task.walltime {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let mut timed_out = false;
    let status = tokio::select! {
        status = child.wait() => status,
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
            orphans::ended(group.map(|g| g.as_raw() as u32));
            return None;
        }
    };
    // Whatever the command left running in the background goes too, in its
    // group or escaped from it.
    signal_group(group, Signal::SIGKILL);
    orphans::ended(group.map(|g| g.as_raw() as u32));
    let runtime = started.elapsed();
    let stdout = stdout.finish().await;
    let stderr = stderr.finish().await;
    Some(match status {
        Ok(status) => Outcome::ended(status, timed_out, runtime, stdout, stderr),
        Err(e) => Outcome {
            error: Some(format!("lost track of the command: {e}")),
            ..Outcome::not_started(String::new(), started)
        },
    })
}

/// Resolves once `stop` turns true; never, if its sender is gone.
async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn signal_group(group: Option<Pid>, signal: Signal) {
    if let Some(group) = group {
        let _ = killpg(group, signal);
    }
}

impl Outcome {
    fn not_started(error: String, started: Instant) -> Self {
        Self {
            status: RunStatus::Failed,
            exit_code: None,
            signal: None,
            runtime: started.elapsed(),
            stdout: Captured::default(),
            stderr: Captured::default(),
            outputs: Vec::new(),
            error: Some(error),
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
        }
    }
}

/// The last bytes of a stream read so far, and how many came before them.
#[derive(Default)]
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
    fn start(stream: Option<impl AsyncRead + Unpin + Send + 'static>, limit: usize) -> Self {
        let tail = Arc::new(Mutex::new(Tail::default()));
        let sink = tail.clone();
        let task = tokio::spawn(async move {
            let Some(mut stream) = stream else { return };
            let mut buffer = [0u8; 16 * 1024];
            while let Ok(n) = stream.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
                if let Ok(mut tail) = sink.lock() {
                    tail.push(&buffer[..n], limit);
                }
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

/// Reads the files matching the declared patterns, within the size limits.
fn collect_outputs(cwd: &Path, patterns: &[String], limits: Limits) -> Vec<OutputFile> {
    let mut files = Vec::new();
    let mut budget = limits.outputs_bytes;
    let base = glob::Pattern::escape(&cwd.to_string_lossy());
    for pattern in patterns {
        let Ok(paths) = glob::glob(&format!("{base}/{pattern}")) else {
            continue;
        };
        for path in paths.flatten() {
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
        }
    }

    fn never() -> watch::Receiver<bool> {
        watch::channel(false).1
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
