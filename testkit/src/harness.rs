//! A test's gleaner: its directory, its processes (removed when it ends)
//! and the CLI; waiting for outcomes, and small manifests.

use std::{
    collections::BTreeMap,
    io::Read,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use serde_json::Value;

use crate::*;

/// One test's gleaner: a directory, a vhost, and the processes started in it.
pub struct Gleaner {
    pub vhost: Vhost,
    pub dir: tempfile::TempDir,
    exe: PathBuf,
    services: Vec<Child>,
}

impl Gleaner {
    /// `exe` is the `gleaner` binary under test.
    pub fn new(test: &str, exe: impl Into<PathBuf>) -> Self {
        Self::on(BrokerAccess::local(), test, exe)
    }

    /// A gleaner on another broker (the replicated one).
    pub fn on(broker: BrokerAccess, test: &str, exe: impl Into<PathBuf>) -> Self {
        Self {
            vhost: Vhost::on(broker, test),
            dir: tempfile::tempdir().expect("tempdir"),
            exe: exe.into(),
            services: Vec::new(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Opens the test's directory to every account and runs the services
    /// from a binary in it: their launchers and components run as other
    /// accounts (alice, bob), which must reach both wherever the checkout
    /// is (under root's home, say).
    pub fn open_to_every_account(&mut self) {
        std::fs::set_permissions(
            self.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        let reachable = self.path().join("gleaner");
        std::fs::hard_link(&self.exe, &reachable)
            .or_else(|_| std::fs::copy(&self.exe, &reachable).map(drop))
            .expect("the gleaner binary in the test's directory");
        self.exe = reachable;
    }

    /// A gleaner command for this test's vhost and directory.
    pub fn command(&self, args: &[&str]) -> Command {
        self.prepare(Command::new(&self.exe), args)
    }

    /// A shell script run as a newcomer runs it, but against this test's
    /// vhost and with this build's binary (`GLEANER_BIN`).
    pub fn script(&self, script: &Path, args: &[&str]) -> Command {
        let mut command = Command::new("bash");
        command.arg(script);
        let mut command = self.prepare(command, args);
        command
            .env("GLEANER_BIN", &self.exe)
            .env_remove("GLEANER_USERS__SINGLE");
        command
    }

    /// `command` (which runs gleaner) set up for this test.
    fn prepare(&self, mut command: Command, args: &[&str]) -> Command {
        command
            .args(args)
            .current_dir(self.path())
            .env("GLEANER_BROKER_URL", self.vhost.url())
            .env("GLEANER_BROKER_URLS", self.vhost.urls().join(","))
            .env("GLEANER_LAUNCHER__IDLE_TIMEOUT", "2s")
            .env("GLEANER_LAUNCHER__HEARTBEAT", "1s")
            .env("GLEANER_RUNNER__HEARTBEAT", "1s")
            .env("GLEANER_RUNNER__PREEMPT_GRACE", "3s")
            .env("GLEANER_USERS__SINGLE", "true")
            .env_remove("GLEANER_CONFIG")
            .env("RUST_LOG", "info");
        command
    }

    /// Starts a long-running service; its log goes to `<dir>/<name>.log`.
    pub fn start(&mut self, name: &str, args: &[&str]) -> u32 {
        self.start_with(name, args, &[])
    }

    /// [`Gleaner::start`] with extra environment variables.
    pub fn start_with(&mut self, name: &str, args: &[&str], env: &[(&str, &str)]) -> u32 {
        let mut command = self.command(args);
        command.envs(env.iter().copied());
        self.spawn(name, command)
    }

    /// [`Gleaner::start`] on a test host of its own.
    pub fn start_on(&mut self, island: &Island, name: &str, args: &[&str]) -> u32 {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &island.namespace()])
            .arg(&self.exe);
        let command = self.prepare(command, args);
        self.spawn(name, command)
    }

    /// A gleaner command as the Unix account `account` (through
    /// `runuser`), in `dir`, with nothing of this process's environment
    /// but `env`, a plain `PATH` and the account's `HOME`: what a user
    /// without root runs on a login node. The binary must be one the
    /// account reaches ([`Gleaner::open_to_every_account`]).
    pub fn command_as(
        &self,
        account: &str,
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Command {
        let home = nix::unistd::User::from_name(account)
            .ok()
            .flatten()
            .map_or_else(|| PathBuf::from("/"), |user| user.dir);
        let mut command = Command::new("runuser");
        command
            .args([
                "-u",
                account,
                "--",
                "env",
                "-i",
                "PATH=/usr/local/bin:/usr/bin:/bin",
                "RUST_LOG=info",
            ])
            .arg(format!("HOME={}", home.display()))
            .args(env.iter().map(|(key, value)| format!("{key}={value}")))
            .arg(&self.exe)
            .args(args)
            .current_dir(dir);
        command
    }

    /// Starts `command` as one of this test's services: stopped with
    /// them, its output in `<dir>/<name>.log`.
    pub fn start_command(&mut self, name: &str, command: Command) -> u32 {
        self.spawn(name, command)
    }

    fn spawn(&mut self, name: &str, mut command: Command) -> u32 {
        let log = std::fs::File::create(self.path().join(format!("{name}.log"))).expect("log");
        let child = command
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start gleaner");
        let pid = child.id();
        self.services.push(child);
        pid
    }

    pub fn up(&mut self, slots: u32) -> u32 {
        self.start("up", &["up", "--slots", &slots.to_string()])
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path().join(name);
        std::fs::write(&path, text).expect("write file");
        path
    }

    /// Runs a client command to its end.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run gleaner")
    }

    /// Runs a client command to its end as `user` (their broker account).
    pub fn run_as(&self, user: &users::BrokerUser, args: &[&str]) -> Output {
        self.command(args)
            .env("GLEANER_BROKER_URL", user.url())
            .env("GLEANER_BROKER_URLS", user.url())
            .env("RUST_LOG", "warn")
            .output()
            .expect("run gleaner")
    }

    /// `gleaner submit` without waiting; returns the job id.
    pub fn submit(&self, manifest: &str) -> String {
        let path = self.write(&format!("job-{}.toml", rand_suffix()), manifest);
        let output = self.run(&["submit", path.to_str().unwrap()]);
        assert!(
            output.status.success(),
            "submit failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// `gleaner submit --wait` as a child, to be waited for later.
    pub fn submit_waiting(&self, manifest: &str) -> Child {
        let path = self.write(&format!("job-{}.toml", rand_suffix()), manifest);
        self.client(&["submit", path.to_str().unwrap(), "--wait"])
    }

    /// A client command as a child with its output piped, to be waited for
    /// later ([`finish`]).
    pub fn client(&self, args: &[&str]) -> Child {
        self.command(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gleaner")
    }

    pub fn results_dir(&self, job: &str) -> PathBuf {
        self.path().join("results").join(job)
    }

    /// The results index of a job, one JSON value per line.
    /// Waits (3 minutes at most) for a sweep of `tasks` tasks to end, and
    /// asserts that every task succeeded at its first attempt.
    pub fn assert_all_done_once(&self, job: &str, tasks: usize) {
        assert_eq!(self.wait_for_end(job, Duration::from_secs(180)), "done");
        let index = by_task(&self.index(job));
        assert_eq!(index.len(), tasks);
        assert!(
            index
                .values()
                .all(|t| t["status"] == "succeeded" && t["attempts"] == 1),
            "every task once, none failed: {index:?}"
        );
    }

    /// Its complete lines: a runner may be writing the last one.
    pub fn index(&self, job: &str) -> Vec<Value> {
        let text =
            std::fs::read_to_string(self.results_dir(job).join("index.jsonl")).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .map(|l| serde_json::from_str(l).expect("index line is JSON"))
            .collect()
    }

    pub fn job_file(&self, job: &str) -> Option<Value> {
        let text = std::fs::read_to_string(self.results_dir(job).join("job.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// A task's stdout, once it has ended ([`task_stream`]).
    pub fn stdout(&self, job: &str, task: u64) -> Option<String> {
        task_stream(&self.results_dir(job), task, false)
    }

    /// A task's stderr, once it has ended ([`task_stream`]).
    pub fn stderr(&self, job: &str, task: u64) -> Option<String> {
        task_stream(&self.results_dir(job), task, true)
    }

    pub fn job_state(&self, job: &str) -> Option<String> {
        self.job_file(job)?["state"].as_str().map(str::to_owned)
    }

    /// Waits until the job has ended (per job.json), or panics after `timeout`.
    pub fn wait_for_end(&self, job: &str, timeout: Duration) -> String {
        let mut state = None;
        wait_for(&format!("job {job} to end"), timeout, || {
            state = self
                .job_state(job)
                .filter(|s| s == "done" || s == "cancelled");
            state.is_some()
        });
        state.unwrap_or_default()
    }

    /// `gleaner status --json`.
    pub fn status(&self) -> Option<Value> {
        let output = self.run(&["status", "--json"]);
        serde_json::from_slice(&output.stdout).ok()
    }

    /// Launcher processes of a job (their pids). A launcher's child between
    /// its fork and the exec of a task's shell still has the launcher's
    /// command line: it is not one.
    pub fn launchers(&self, job: &str) -> Vec<u32> {
        let output = Command::new("pgrep")
            .args(["-f", &format!("launcher --job {job} ")])
            .output()
            .expect("pgrep");
        let matched: Vec<u32> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        matched
            .iter()
            .copied()
            .filter(|pid| parent(*pid).is_none_or(|parent| !matched.contains(&parent)))
            .collect()
    }

    /// Waits until `busy` tasks of the job run on as many launchers, then
    /// sends `signal` to one of those launchers; returns its pid.
    pub fn signal_busy_launcher(&self, job: &str, busy: u64, signal: Signal) -> u32 {
        let mut victim = None;
        wait_for("busy launchers", Duration::from_secs(60), || {
            let launchers = self.launchers(job);
            victim = launchers.first().copied();
            launchers.len() as u64 >= busy
                && self
                    .job_file(job)
                    .is_some_and(|f| f["tasks"]["running"].as_u64() >= Some(busy))
        });
        let victim = victim.unwrap_or_default();
        nix::sys::signal::kill(Pid::from_raw(victim as i32), signal).expect("signal a launcher");
        victim
    }

    /// Stops a service started with [`Gleaner::start`] with `signal`.
    /// Signals a service; one killed or told to stop is waited for.
    pub fn signal(&mut self, pid: u32, signal: Signal) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), signal);
        if let Some(child) = self.services.iter_mut().find(|c| c.id() == pid)
            && matches!(signal, Signal::SIGKILL | Signal::SIGTERM)
        {
            let _ = child.wait();
        }
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path().join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Gleaner {
    /// The last lines of every service's log, on stderr.
    pub fn print_logs(&self) {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(self.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
            .collect();
        logs.sort();
        for path in logs {
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            let name = path.file_stem().unwrap_or_default().to_string_lossy();
            if !log.is_empty() {
                let tail: Vec<&str> = log.lines().rev().take(60).collect();
                eprintln!("---- {name}.log (last lines) ----");
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }

    /// Asks every service still running to stop, as a service manager
    /// would (SIGTERM to the service alone, nothing else in its process
    /// group), and waits for them, `timeout` at most.
    pub fn stop_services(&mut self, timeout: Duration) {
        for child in &mut self.services {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + timeout;
        for child in &mut self.services {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Gleaner {
    fn drop(&mut self) {
        for child in &self.services {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for child in &mut self.services {
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_)) | Err(_)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        if std::thread::panicking() {
            self.print_logs();
        }
    }
}

/// A process's parent.
fn parent(pid: u32) -> Option<u32> {
    let stat = procfs::process::Process::new(i32::try_from(pid).ok()?)
        .ok()?
        .stat()
        .ok()?;
    u32::try_from(stat.ppid).ok()
}

/// Whether a process runs: it exists and is not a zombie (dead, waiting
/// for its parent to reap it).
pub fn runs(pid: i32) -> bool {
    procfs::process::Process::new(pid)
        .and_then(|process| process.stat())
        .is_ok_and(|stat| stat.state != 'Z')
}

pub fn rand_suffix() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// Polls `condition` every 100 ms until it holds; panics after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for a `submit --wait` of `tasks` tasks and asserts that every one
/// succeeded; returns its output (the job id on stdout).
pub fn finish_all_succeeded(child: Child, tasks: u32, timeout: Duration) -> Output {
    let output = finish(child, timeout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "submit --wait failed: {stderr}");
    assert!(
        stderr.contains(&format!("{tasks} of {tasks} tasks succeeded")),
        "{stderr}"
    );
    output
}

/// Waits for a child with a timeout, returning its output.
pub fn finish(mut child: Child, timeout: Duration) -> Output {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            panic!(
                "command did not finish in time; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    Output {
        status: child.wait().expect("status"),
        stdout: stdout.into_bytes(),
        stderr: stderr.into_bytes(),
    }
}

/// Every file and directory under `dir` (none if it cannot be read).
pub fn entries_under(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|read| {
            read.flatten()
                .map(|e| {
                    1 + match e.file_type() {
                        Ok(kind) if kind.is_dir() => entries_under(&e.path()),
                        _ => 0,
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// A task's captured stream (`stderr` or stdout) in the results
/// directory `results`, read where its index line says it is in
/// `output.log`; `None` until the task has ended, empty if it printed
/// nothing there.
pub fn task_stream(results: &Path, task: u64, stderr: bool) -> Option<String> {
    let index = std::fs::read_to_string(results.join("index.jsonl")).ok()?;
    let line = index
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .rfind(|l| l["task"] == task)?;
    let span = &line[if stderr { "stderr" } else { "stdout" }];
    let (Some(offset), Some(bytes)) = (span["offset"].as_u64(), span["bytes"].as_u64()) else {
        return Some(String::new());
    };
    let log = std::fs::read(results.join("output.log")).ok()?;
    let data = log.get(offset as usize..(offset + bytes) as usize)?;
    Some(String::from_utf8_lossy(data).into_owned())
}

/// Index lines by task number; panics on a duplicate.
pub fn by_task(index: &[Value]) -> BTreeMap<u64, Value> {
    let mut tasks = BTreeMap::new();
    for line in index {
        let task = line["task"].as_u64().expect("task number");
        assert!(
            tasks.insert(task, line.clone()).is_none(),
            "task {task} twice in the index"
        );
    }
    tasks
}

/// A sweep manifest: `command` once for each `n` in 1..=`tasks`.
pub fn sweep(name: &str, tasks: u32, command: &str) -> String {
    format!(
        "name = \"{name}\"\n[sweep]\ncommand = \"{command}\"\nparams = {{ n = {{ from = 1, to = {tasks} }} }}\n"
    )
}

/// An exclusive lock on a file in the temporary directory, held by one
/// test at a time of all the test processes sharing something.
pub(crate) fn exclusive(name: &str) -> nix::fcntl::Flock<std::fs::File> {
    let path = std::env::temp_dir().join(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .expect("lock file");
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("lock {}: {e}", path.display()))
}
