//! HyperQueue beside gleaner, when `HQ` names an `hq` binary: a server and
//! one worker of the same slots run the same no-op tasks (`hq submit
//! --array`), on this machine, in the same run as gleaner's.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};

use crate::measure::cpu;

/// `hq --version`, for the table.
pub fn version(hq: &Path) -> String {
    Command::new(hq)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "hq (version unknown)".to_owned())
}

/// A server and a worker in a directory of their own, stopped when dropped.
struct Instance<'a> {
    hq: &'a Path,
    dir: tempfile::TempDir,
    server: Child,
    worker: Option<Child>,
}

impl Instance<'_> {
    fn command(&self) -> Command {
        let mut command = Command::new(self.hq);
        command.arg("--server-dir").arg(self.dir.path());
        command
    }

    fn spawn(&self, args: &[&str]) -> anyhow::Result<Child> {
        self.command()
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start hq")
    }
}

impl Drop for Instance<'_> {
    fn drop(&mut self) {
        let _ = self.command().args(["server", "stop"]).output();
        for child in [Some(&mut self.server), self.worker.as_mut()]
            .into_iter()
            .flatten()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Where HyperQueue puts its tasks' output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HqOutput {
    /// A file per task and stream (its default).
    Files,
    /// Every task's output in a few log files (`--stream`).
    Stream,
    /// Nowhere (`--stdout none --stderr none`).
    None,
}

impl HqOutput {
    pub const ALL: [Self; 3] = [Self::Files, Self::Stream, Self::None];

    /// How a row names it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Files => "",
            Self::Stream => ", --stream",
            Self::None => ", no capture",
        }
    }
}

/// One row: `tasks` × `/usr/bin/true` on one worker of `slots` CPUs, its
/// output captured as `output` says; returns its tasks per second.
pub fn throughput(hq: &Path, tasks: u32, slots: u32, output: HqOutput) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let server = Command::new(hq)
        .arg("--server-dir")
        .arg(dir.path())
        .args(["server", "start"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start the hq server")?;
    let mut instance = Instance {
        hq,
        dir,
        server,
        worker: None,
    };
    let started = Instant::now();
    while !instance
        .command()
        .args(["server", "info"])
        .output()?
        .status
        .success()
    {
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "the hq server did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    instance.worker = Some(instance.spawn(&["worker", "start", "--cpus", &slots.to_string()])?);
    let started = Instant::now();
    loop {
        let list = instance.command().args(["worker", "list"]).output()?;
        if String::from_utf8_lossy(&list.stdout).contains("RUNNING") {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "the hq worker did not connect"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let worker = instance.worker.as_ref().map(Child::id).unwrap_or_default();
    let (server_before, worker_before) = (cpu(instance.server.id()), cpu(worker));
    let array = format!("1-{tasks}");
    let mut submit = instance.command();
    // Its tasks' output files go to its own directory, not the checkout.
    submit
        .current_dir(instance.dir.path())
        .args(["submit", "--wait", "--array", &array]);
    let streamed = instance.dir.path().join("stream");
    match output {
        HqOutput::Files => {}
        HqOutput::Stream => {
            submit.arg("--stream").arg(&streamed);
        }
        HqOutput::None => {
            submit.args(["--stdout", "none", "--stderr", "none"]);
        }
    }
    let began = Instant::now();
    let submitted = submit
        .args(["--", "/usr/bin/true"])
        .stdout(Stdio::null())
        .status()
        .context("hq submit")?;
    let makespan = began.elapsed().as_secs_f64();
    ensure!(submitted.success(), "hq submit --wait failed");
    let (server_after, worker_after) = (cpu(instance.server.id()), cpu(worker));
    let per_k = 1000.0 / f64::from(tasks);
    let rate = f64::from(tasks) / makespan;
    println!(
        "| HyperQueue, 1 worker × {slots} | `/usr/bin/true`{} | – | {tasks} | {makespan:.2} | {rate:.0} | – | {:.2} | {:.2} |",
        output.label(),
        (server_after.own - server_before.own) * per_k,
        (worker_after.own + worker_after.children - worker_before.own - worker_before.children)
            * per_k,
    );
    Ok(rate)
}
