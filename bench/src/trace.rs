//! A production trace replayed on the dev grid's Slurm or Grid Engine,
//! side by side in one run: the trace alone (the baseline), the trace with
//! a sweep through gleaner, and the trace with the same sweep as the batch
//! system's own scavenging does it (on Slurm a job array in the
//! `scavenger` partition, which the trace's jobs preempt and requeue; on
//! Grid Engine an array job in `scavenger.q`, subordinated to the trace's
//! queue, so suspended where that is full).
//!
//! The trace's jobs are submitted as the cluster's users would (`sbatch
//! -p batch -n P --time T`, `qsub -q g1.q -pe make P -l h_rt=T`), each a
//! `sleep` at its submit time in the trace's window divided by the
//! compression, with its run time and requested time divided by it too,
//! and its processors scaled from the traced machine's to the grid's
//! cores. Each job stamps its start and end into a directory, and each run
//! of a sweep task its start, end, the seconds of work it did (a task
//! suspended does none) and whether it completed, so that every figure is
//! read off what ran, the same way for every arm; `slurmctld`'s RPCs come
//! from `sdiag`, the batch master's CPU time from `/proc`.

use std::{
    collections::BTreeMap,
    io::Read,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, bail, ensure};
use gleaner_simulator::workload::{Swf, WorkloadJob, parse_swf};
use gleaner_testkit::{Gleaner, SlurmCluster, qsub, sbatch, sge, slurm};

use crate::{
    measure::wait_until_serving,
    slurm::{daemon_cpu_s, rpc_total},
};

/// The partition of the cluster's own users: a higher `PriorityTier` than
/// `scavenger`'s, whose jobs it preempts, and than gleaner's, which
/// yields to it through its kcm.
const SITE_PARTITION: &str = SlurmCluster::SITE;

/// Grid Engine's queues on the dev grid's hosts (`deploy/sge/hosts.sh`):
/// the cluster's own users' (gleaner's placeholders go there too, at the
/// lowest priority) and the one subordinated to it.
const SGE_SITE_QUEUE: &str = "g1.q";
const SGE_SCAVENGER_QUEUE: &str = "scavenger.q";

/// The batch system a window is replayed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Batch {
    Slurm,
    Sge,
}

impl Batch {
    fn name(self) -> &'static str {
        match self {
            Self::Slurm => "slurm",
            Self::Sge => "sge",
        }
    }

    /// The batch master's daemon.
    fn master(self) -> &'static str {
        match self {
            Self::Slurm => "slurmctld",
            Self::Sge => "sge_qmaster",
        }
    }

    /// Slots of the cluster's own users' partition or queue.
    fn cores(self, cluster: &SlurmCluster) -> u32 {
        match self {
            Self::Slurm => cluster.cores(SITE_PARTITION),
            // `qstat -f`: `queue@host BIP resv/used/tot. …`.
            Self::Sge => sge("qstat", &["-f", "-q", SGE_SITE_QUEUE])
                .lines()
                .filter(|l| l.starts_with(&format!("{SGE_SITE_QUEUE}@")))
                .filter_map(|l| {
                    l.split_whitespace()
                        .nth(2)?
                        .rsplit('/')
                        .next()?
                        .parse::<u32>()
                        .ok()
                })
                .sum(),
        }
    }

    /// gleaner's cluster, its placeholders' walltimes as `placeholders`
    /// says (on Grid Engine `-l h_rt`; it has no time range), its kcm
    /// reading the batch system as often in the trace's time as it does
    /// by default at a site (every 2 s busy, 15 s idle), `compress` times
    /// faster.
    fn gleaner_cluster(self, placeholders: &Placeholders, compress: f64) -> String {
        let walltime = humantime::format_duration(placeholders.walltime);
        let every = |site_s: f64| {
            let ms = (1000.0 * site_s / compress.max(1.0)).max(100.0);
            humantime::format_duration(Duration::from_millis(ms as u64))
        };
        let polls = format!(
            "poll_interval = \"{}\"\nidle_poll_interval = \"{}\"\n",
            every(2.0),
            every(15.0)
        );
        match self {
            Self::Slurm => format!(
                "[[cluster]]\nname = \"trace\"\nbackend = \"slurm\"\npartition = \"{}\"\n\
                 walltime = \"{walltime}\"\nmin_walltime = \"{}\"\n{polls}",
                SlurmCluster::PARTITION,
                humantime::format_duration(placeholders.min_walltime),
            ),
            Self::Sge => format!(
                "[[cluster]]\nname = \"trace\"\nbackend = \"sge\"\nqueue = \"{SGE_SITE_QUEUE}\"\n\
                 walltime = \"{walltime}\"\n{polls}"
            ),
        }
    }

    /// Submits a trace job: `script` with its stamps, as its user would.
    fn submit_trace(self, job: &TraceJob, script: &Path, start: &Path, end: &Path) {
        let run = job.run_s.to_string();
        let name = format!("trace-{}", job.id);
        let (script, start, end) = (
            script.display().to_string(),
            start.display().to_string(),
            end.display().to_string(),
        );
        match self {
            Self::Slurm => {
                sbatch(&[
                    "-p",
                    SITE_PARTITION,
                    &format!("-n{}", job.procs),
                    &format!("--time={}", job.limit_s / 60),
                    &format!("--job-name={name}"),
                    &script,
                    &start,
                    &run,
                    &end,
                ]);
            }
            Self::Sge => {
                let procs = job.procs.to_string();
                let mut args = vec!["-q", SGE_SITE_QUEUE, "-N", &name, "-l"];
                let limit = format!("h_rt={}", job.limit_s);
                args.push(&limit);
                if job.procs > 1 {
                    args.extend(["-pe", "make", &procs]);
                }
                args.extend([script.as_str(), &start, &run, &end]);
                qsub(&args);
            }
        }
    }

    /// Submits the sweep as the batch system's own scavenging: one array
    /// job of `tasks` tasks, each running `script` with its number.
    fn submit_scavenger(self, tasks: u32, script: &Path) -> String {
        let script = script.display().to_string();
        let range = format!("1-{tasks}");
        match self {
            Self::Slurm => sbatch(&[
                "-p",
                SlurmCluster::SCAVENGER,
                "-n1",
                "--requeue",
                &format!("--array={range}"),
                &script,
            ]),
            Self::Sge => qsub(&["-q", SGE_SCAVENGER_QUEUE, "-t", &range, &script]),
        }
    }

    fn cancel(self, id: &str) {
        match self {
            Self::Slurm => {
                slurm("scancel", &[id]);
            }
            Self::Sge => {
                sge("qdel", &["-f", id]);
            }
        }
    }

    /// What gleaner or the scavenging left goes before the next arm.
    fn clear(self, cluster: &SlurmCluster) -> anyhow::Result<()> {
        match self {
            Self::Slurm => cluster.clear(),
            Self::Sge => {
                let deadline = Instant::now() + Duration::from_secs(120);
                loop {
                    let jobs: Vec<String> = sge(
                        "qstat",
                        &[
                            "-u",
                            "*",
                            "-q",
                            &format!("{SGE_SITE_QUEUE},{SGE_SCAVENGER_QUEUE}"),
                        ],
                    )
                    .lines()
                    .skip(2)
                    .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
                    .collect();
                    if jobs.is_empty() {
                        break;
                    }
                    ensure!(
                        Instant::now() < deadline,
                        "jobs {jobs:?} stay in Grid Engine's queues"
                    );
                    let mut args = vec!["-f"];
                    args.extend(jobs.iter().map(String::as_str));
                    let _ = std::process::Command::new("qdel").args(&args).output();
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        Ok(())
    }

    /// RPCs the batch master served so far, where it counts them.
    fn rpcs(self) -> Option<u64> {
        (self == Self::Slurm).then(rpc_total)
    }
}

/// A job of the trace's window, as submitted to the grid.
#[derive(Debug, Clone)]
struct TraceJob {
    id: u64,
    /// When it is submitted, seconds after the run's start.
    at_s: f64,
    run_s: u64,
    limit_s: u64,
    procs: u32,
}

/// Where the trace's window comes from and how it is shrunk to the grid.
#[derive(Debug, Clone)]
pub struct Window {
    pub trace: PathBuf,
    /// Its start and length in the trace, seconds.
    pub from_s: f64,
    pub length_s: f64,
    /// Trace seconds per second of the run.
    pub compress: f64,
}

/// The sweep run beside the trace: `tasks` tasks of `min_s` to `max_s`.
#[derive(Debug, Clone, Copy)]
pub struct SweepShape {
    pub tasks: u32,
    pub min_s: u32,
    pub max_s: u32,
}

/// What gleaner's placeholders ask for: `--time` and `--time-min`.
#[derive(Debug, Clone, Copy)]
pub struct Placeholders {
    pub walltime: Duration,
    pub min_walltime: Duration,
}

/// How the sweep is run beside the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arm {
    Baseline,
    Gleaner,
    Scavenger,
}

impl Arm {
    fn label(self) -> &'static str {
        match self {
            Self::Baseline => "trace alone",
            Self::Gleaner => "trace + sweep through gleaner",
            Self::Scavenger => "trace + sweep as a scavenger job array",
        }
    }

    fn stem(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::Gleaner => "gleaner",
            Self::Scavenger => "scavenger",
        }
    }
}

/// Reads a trace, gzipped or not.
fn read_trace(path: &Path) -> anyhow::Result<Swf> {
    let file = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut text = String::new();
    if path.extension().is_some_and(|e| e == "gz") {
        flate2::read::GzDecoder::new(file).read_to_string(&mut text)
    } else {
        std::io::BufReader::new(file).read_to_string(&mut text)
    }
    .with_context(|| format!("{}", path.display()))?;
    parse_swf(&text).with_context(|| format!("{}", path.display()))
}

/// The window's jobs, shrunk to `cores`: when each is submitted, how long
/// it runs and asks for (at least a second, and its limit at least a
/// minute past its run, Slurm's granularity), and its processors scaled
/// from the traced machine's `machine` (rounded up). Jobs wider than the
/// grid even so are left out; their count is returned.
fn window_jobs(
    jobs: &[WorkloadJob],
    machine: u32,
    window: &Window,
    cores: u32,
) -> (Vec<TraceJob>, usize) {
    let mut kept = Vec::new();
    let mut skipped = 0;
    let end = window.from_s + window.length_s;
    for job in jobs
        .iter()
        .filter(|j| (window.from_s..end).contains(&j.submit_s))
    {
        let procs = (u64::from(job.procs) * u64::from(cores)).div_ceil(u64::from(machine.max(1)));
        let Ok(procs) = u32::try_from(procs.max(1)) else {
            skipped += 1;
            continue;
        };
        if procs > cores {
            skipped += 1;
            continue;
        }
        let run_s = (job.run_s / window.compress).ceil().max(1.0) as u64;
        let asked_s = (job.requested_s.max(job.run_s) / window.compress).ceil() as u64;
        kept.push(TraceJob {
            id: job.id,
            at_s: (job.submit_s - window.from_s) / window.compress,
            run_s,
            limit_s: asked_s.max(run_s + 60).div_ceil(60) * 60,
            procs,
        });
    }
    (kept, skipped)
}

/// Seconds since the epoch, as the stamps have them.
fn epoch_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// The script each sweep task runs, with its number as `$1`: its length
/// in seconds of sleep, a second at a time (so that a task suspended
/// counts no work while it is), stamped into `dir/<n>` as `start end
/// done|killed seconds-of-work`. Every arm runs the same.
fn task_script(dir: &Path, shape: SweepShape) -> String {
    let span = shape.max_s.saturating_sub(shape.min_s) + 1;
    format!(
        "#!/bin/sh\nn=$1\nd=$(( {min} + (n * 7919) % {span} ))\ns=$(date +%s.%N)\ni=0\n\
         trap 'echo \"$s $(date +%s.%N) killed $i\" >> {dir}/$n; exit 143' TERM INT USR1\n\
         while [ \"$i\" -lt \"$d\" ]; do sleep 1 & wait $!; i=$((i + 1)); done\n\
         echo \"$s $(date +%s.%N) done $i\" >> {dir}/$n\n",
        min = shape.min_s,
        dir = dir.display(),
    )
}

/// A trace job's script: its start stamp into `$1`, a sleep of `$2`
/// seconds, its end stamp into `$3`.
const TRACE_JOB_SCRIPT: &str =
    "#!/bin/sh\ndate +%s.%N > \"$1\"\nsleep \"$2\"\ndate +%s.%N > \"$3\"\n";

/// An array task of the scavenging arm: the sweep's task of its number.
fn array_task_script(task: &Path) -> String {
    format!(
        "#!/bin/sh\nexec sh {} \"${{SLURM_ARRAY_TASK_ID:-$SGE_TASK_ID}}\"\n",
        task.display()
    )
}

/// What one arm's run left: the trace jobs' submit, start and end times
/// (seconds since the epoch) and processors; the sweep's runs; the
/// run's bounds; the batch master's RPCs and CPU seconds during it.
struct RunRecord {
    arm: Arm,
    started: f64,
    window_end: f64,
    trace: Vec<(f64, f64, f64, u32)>,
    /// Every run of a sweep task.
    sweep: Vec<TaskRun>,
    /// The batch master's RPCs, where it counts them, and CPU seconds.
    rpcs: Option<u64>,
    master_cpu_s: f64,
    took_s: f64,
}

/// One run of a sweep task: when it started and ended, whether it
/// completed, and the seconds of work it did.
#[derive(Debug, Clone, Copy)]
struct TaskRun {
    start: f64,
    end: f64,
    done: bool,
    work_s: f64,
}

impl TaskRun {
    /// Its work within `[from, to]`: its time there, in the share of its
    /// time it worked (it may have been suspended for the rest).
    fn work_within(&self, from: f64, to: f64) -> f64 {
        let share = match self.end - self.start {
            ran if ran > 0.0 => (self.work_s / ran).min(1.0),
            _ => 0.0,
        };
        overlap(self.start, self.end, from, to) * share
    }
}

fn read_stamp(path: &Path) -> Option<f64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Runs the trace with `arm`'s sweep beside it; the sweep is stopped at
/// the window's end, the run ends when the trace's last job has.
#[allow(clippy::too_many_arguments)]
fn run_arm(
    exe: &Path,
    batch: Batch,
    cluster: &SlurmCluster,
    jobs: &[TraceJob],
    window: &Window,
    shape: SweepShape,
    placeholders: &Placeholders,
    arm: Arm,
) -> anyhow::Result<RunRecord> {
    let dir = tempfile::Builder::new()
        .prefix("gleaner-trace-")
        .tempdir()?;
    let stamps = dir.path().join("trace");
    let runs = dir.path().join("runs");
    std::fs::create_dir_all(&stamps)?;
    std::fs::create_dir_all(&runs)?;
    let script = dir.path().join("task.sh");
    std::fs::write(&script, task_script(&runs, shape))?;
    let array_script = dir.path().join("array-task.sh");
    std::fs::write(&array_script, array_task_script(&script))?;
    let trace_script = dir.path().join("trace-job.sh");
    std::fs::write(&trace_script, TRACE_JOB_SCRIPT)?;
    for script in [&script, &array_script, &trace_script] {
        std::fs::set_permissions(script, std::fs::Permissions::from_mode(0o755))?;
    }
    // Every account may write the stamps: nothing here is secret.
    for path in [dir.path(), &stamps, &runs] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777))?;
    }
    let length = Duration::from_secs_f64(window.length_s / window.compress);

    let mut g = None;
    if arm == Arm::Gleaner {
        let mut gleaner =
            Gleaner::new(&format!("bench-trace-{}-{}", batch.name(), arm.stem()), exe);
        gleaner.write(
            "gleaner.toml",
            &batch.gleaner_cluster(placeholders, window.compress),
        );
        gleaner.start("up", &["up"]);
        wait_until_serving(&gleaner);
        g = Some(gleaner);
    }

    let rpcs_before = batch.rpcs();
    let cpu_before = daemon_cpu_s(batch.master());
    let started = epoch_s();
    let clock = Instant::now();
    let mut job = None;
    let mut array = None;
    match (arm, &g) {
        (Arm::Gleaner, Some(g)) => {
            job = Some(g.submit(&format!(
                "name = \"harvest\"\n[sweep]\ncommand = \"sh {} {{n}}\"\nparams = {{ n = {{ from = 1, to = {} }} }}\n",
                script.display(),
                shape.tasks
            )));
        }
        (Arm::Scavenger, _) => {
            array = Some(batch.submit_scavenger(shape.tasks, &array_script));
        }
        _ => {}
    }
    let mut submitted = BTreeMap::new();
    for trace_job in jobs {
        let due = Duration::from_secs_f64(trace_job.at_s.max(0.0));
        if let Some(wait) = due.checked_sub(clock.elapsed()) {
            std::thread::sleep(wait);
        }
        let start = stamps.join(format!("{}.start", trace_job.id));
        let end = stamps.join(format!("{}.end", trace_job.id));
        let at = epoch_s();
        batch.submit_trace(trace_job, &trace_script, &start, &end);
        submitted.insert(trace_job.id, (at, trace_job.procs));
    }
    if let Some(wait) = length.checked_sub(clock.elapsed()) {
        std::thread::sleep(wait);
    }
    // The window is over: the sweep stops.
    let window_end = epoch_s();
    if let (Some(g), Some(job)) = (&g, &job) {
        let _ = g.run(&["cancel", job]);
    }
    if let Some(array) = &array {
        batch.cancel(array);
    }
    let deadline = Instant::now() + Duration::from_secs(1800);
    while !submitted
        .keys()
        .all(|id| stamps.join(format!("{id}.end")).exists())
    {
        ensure!(
            Instant::now() < deadline,
            "the trace's jobs did not all end"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let took_s = epoch_s() - started;
    let rpcs = batch
        .rpcs()
        .zip(rpcs_before)
        .map(|(after, before)| after.saturating_sub(before));
    let master_cpu_s = daemon_cpu_s(batch.master()) - cpu_before;
    drop(g);
    // What gleaner or the array left goes before the next arm.
    batch.clear(cluster)?;
    let mut trace = Vec::new();
    for (id, (at, procs)) in &submitted {
        let start = read_stamp(&stamps.join(format!("{id}.start")));
        let end = read_stamp(&stamps.join(format!("{id}.end")));
        let (Some(start), Some(end)) = (start, end) else {
            bail!("trace job {id} left no stamps");
        };
        trace.push((*at, start, end, *procs));
    }
    let mut sweep = Vec::new();
    for entry in std::fs::read_dir(&runs)?.flatten() {
        for line in std::fs::read_to_string(entry.path())?.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if let [start, end, how, work] = fields[..]
                && let (Ok(start), Ok(end), Ok(work_s)) = (
                    start.parse::<f64>(),
                    end.parse::<f64>(),
                    work.parse::<f64>(),
                )
            {
                sweep.push(TaskRun {
                    start,
                    end,
                    done: how == "done",
                    work_s,
                });
            }
        }
    }
    Ok(RunRecord {
        arm,
        started,
        window_end,
        trace,
        sweep,
        rpcs,
        master_cpu_s,
        took_s,
    })
}

/// Seconds of `[a, b]` within `[from, to]`.
fn overlap(a: f64, b: f64, from: f64, to: f64) -> f64 {
    (b.min(to) - a.max(from)).max(0.0)
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n => sorted[((n as f64 * p).ceil() as usize).clamp(1, n) - 1],
    }
}

/// What a run's figures are made of.
struct Figures {
    busy_core_s: f64,
    harvested_core_s: f64,
    lost_core_s: f64,
    tasks_done: usize,
    waits: Vec<f64>,
    slowdowns: Vec<f64>,
}

/// A job's bounded slowdown: its response over its run, runs shorter
/// than 10 s counted as 10 s.
const SLOWDOWN_BOUND_S: f64 = 10.0;

fn figures(run: &RunRecord) -> Figures {
    let (from, to) = (run.started, run.window_end);
    let busy_core_s = run
        .trace
        .iter()
        .map(|(_, start, end, procs)| overlap(*start, *end, from, to) * f64::from(*procs))
        .sum();
    // A run killed at the window's end was cut by the measurement, not
    // lost to the trace's jobs.
    let cut = to - 1.0;
    let harvested_core_s = run
        .sweep
        .iter()
        .filter(|r| r.done)
        .map(|r| r.work_within(from, to))
        .sum::<f64>()
        // An empty sum is -0.
        .abs();
    let lost_core_s = run
        .sweep
        .iter()
        .filter(|r| !r.done && r.end < cut)
        .map(|r| r.work_within(from, to))
        .sum::<f64>()
        // An empty sum is -0.
        .abs();
    let tasks_done = run.sweep.iter().filter(|r| r.done && r.end <= to).count();
    let waits: Vec<f64> = run
        .trace
        .iter()
        .map(|(at, start, _, _)| (start - at).max(0.0))
        .collect();
    let slowdowns = run
        .trace
        .iter()
        .map(|(at, start, end, _)| {
            let ran = end - start;
            ((end - at) / ran.max(SLOWDOWN_BOUND_S)).max(1.0)
        })
        .collect();
    Figures {
        busy_core_s,
        harvested_core_s,
        lost_core_s,
        tasks_done,
        waits,
        slowdowns,
    }
}

/// Cores of the trace's jobs and of the sweep over the run, a point a
/// second, as a PNG at `path`.
fn plot_cores(run: &RunRecord, cores: u32, path: &Path) -> anyhow::Result<()> {
    let seconds = (run.window_end - run.started).ceil().max(1.0) as usize;
    let mut trace = vec![0.0; seconds];
    let mut sweep = vec![0.0; seconds];
    for (second, (t, s)) in trace.iter_mut().zip(sweep.iter_mut()).enumerate() {
        let (a, b) = (
            run.started + second as f64,
            run.started + second as f64 + 1.0,
        );
        *t = run
            .trace
            .iter()
            .map(|(_, start, end, procs)| overlap(*start, *end, a, b) * f64::from(*procs))
            .sum();
        *s = run.sweep.iter().map(|r| r.work_within(a, b)).sum();
    }
    let points = |values: &[f64]| -> Vec<(f64, f64)> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| (i as f64, *v))
            .collect()
    };
    let idle: Vec<f64> = trace
        .iter()
        .zip(&sweep)
        .map(|(t, s)| (f64::from(cores) - t - s).max(0.0))
        .collect();
    let mut series = vec![("trace jobs".to_owned(), points(&trace))];
    if run.arm != Arm::Baseline {
        series.push(("sweep".to_owned(), points(&sweep)));
    }
    series.push(("idle".to_owned(), points(&idle)));
    gleaner_simulator::plot::lines(
        &format!("cores over time: {}", run.arm.label()),
        ("seconds", "cores"),
        &series,
        path,
    )
    .map_err(anyhow::Error::msg)
}

/// The same window through `gleaner simulate`: one cluster of `cores`
/// nodes whose batch system backfills conservatively, the trace's jobs
/// to its own queue, the sweep's tasks each of the sweep's mean length;
/// the run alone and with the sweep through gleaner.
fn simulate_window(
    jobs: &[TraceJob],
    cores: u32,
    shape: SweepShape,
    length_s: f64,
) -> anyhow::Result<[Figures; 2]> {
    let dir = tempfile::tempdir()?;
    let swf = dir.path().join("window.swf");
    let workload: Vec<WorkloadJob> = jobs
        .iter()
        .map(|j| WorkloadJob {
            id: j.id,
            submit_s: j.at_s,
            run_s: j.run_s as f64,
            procs: j.procs,
            requested_s: j.limit_s as f64,
            user: None,
        })
        .collect();
    std::fs::write(&swf, gleaner_simulator::workload::to_swf(&workload, cores))?;
    let task_s = f64::from(shape.min_s + shape.max_s) / 2.0;
    let scenario = format!(
        "name = \"trace window\"\nduration = \"{length}s\"\nseed = 1\n\n[timing]\nkcm_poll = \"2s\"\nsample = \"1s\"\n\n\
         [[cluster]]\nname = \"trace\"\nnodes = {cores}\nbatch_scheduler = \"conservative\"\n\n\
         [grid_jobs]\nworkload = \"trace\"\ntrace = {{ swf = {swf:?}, through_gleaner = 0.0 }}\n\n\
         [[job]]\nname = \"harvest\"\ntasks = {tasks}\ntask_duration = \"{task_s}s\"\n",
        length = length_s.ceil(),
        swf = swf.display().to_string(),
        tasks = shape.tasks,
    );
    let scenario = gleaner_simulator::Scenario::from_toml(&scenario)?;
    let figures = |run: &gleaner_simulator::Run| {
        let waits: Vec<f64> = run.local_waits.values().copied().collect();
        let busy: f64 = run.samples.iter().map(|s| f64::from(s.local)).sum();
        let done = run.jobs.iter().map(|j| j.done).sum::<u64>() as f64;
        Figures {
            busy_core_s: busy,
            harvested_core_s: done * task_s,
            lost_core_s: run.jobs.iter().map(|j| j.lost_hours * 3600.0).sum(),
            tasks_done: done as usize,
            slowdowns: Vec::new(),
            waits,
        }
    };
    let alone = gleaner_simulator::simulate(&scenario, None);
    let with =
        gleaner_simulator::simulate(&scenario, Some(gleaner_policy::share::CsPolicy::default()));
    Ok([figures(&alone), figures(&with)])
}

/// Replays the window on the dev grid's `batch` alone and beside each of
/// `arms`, one after the other, and prints a Markdown row per run (and
/// the plots under `out`).
pub fn replay(
    exe: &Path,
    batch: Batch,
    window: &Window,
    shape: SweepShape,
    placeholders: &Placeholders,
    arms: &[Arm],
    out: &Path,
) -> anyhow::Result<()> {
    let swf = read_trace(&window.trace)?;
    let Some(machine) = swf.max_procs else {
        bail!(
            "{}: the trace's header gives no MaxProcs or MaxNodes",
            window.trace.display()
        );
    };
    // Held on Grid Engine too: Slurm's nodes are the same test hosts.
    let cluster = SlurmCluster::lock();
    let cores = batch.cores(&cluster);
    ensure!(
        cores > 0,
        "no cores for the cluster's own jobs on {}",
        batch.name()
    );
    let (jobs, skipped) = window_jobs(&swf.jobs, machine, window, cores);
    ensure!(!jobs.is_empty(), "no job of the trace in its window");
    eprintln!(
        "trace: {} jobs in the window ({skipped} wider than the grid left out), {machine} processors → {cores} cores, {}× faster",
        jobs.len(),
        window.compress
    );
    std::fs::create_dir_all(out)?;
    let mut records: Vec<RunRecord> = Vec::new();
    let arms =
        std::iter::once(Arm::Baseline).chain(arms.iter().copied().filter(|a| *a != Arm::Baseline));
    for arm in arms {
        let run = run_arm(
            exe,
            batch,
            &cluster,
            &jobs,
            window,
            shape,
            placeholders,
            arm,
        )?;
        let plot = format!("trace-{}-{}.png", batch.name(), arm.stem());
        plot_cores(&run, cores, &out.join(plot))?;
        records.push(run);
        let (first, run) = (&records[0], &records[records.len() - 1]);
        let base = figures(first);
        let idle = f64::from(cores) * (first.window_end - first.started) - base.busy_core_s;
        let f = figures(run);
        let per_minute = |r: &RunRecord| r.rpcs.map(|n| n as f64 / (r.took_s / 60.0));
        let rpcs = match (per_minute(run), per_minute(first)) {
            (Some(run), Some(alone)) => format!("{run:.0} ({:+.0})", run - alone),
            _ => "—".to_owned(),
        };
        println!(
            "| {} | {} | {:.2} ({:+.1} %) | {:.0} | {rpcs} | {:.2} |",
            run.arm.label(),
            columns(&f, &base, idle, jobs.len()),
            mean(&f.slowdowns),
            relative(mean(&f.slowdowns), mean(&base.slowdowns)),
            run.took_s,
            run.master_cpu_s,
        );
    }
    let base = figures(&records[0]);
    let length = records[0].window_end - records[0].started;
    let idle = f64::from(cores) * length - base.busy_core_s;
    // The simulator on the same window, and how far its figures are from
    // the grid's.
    let [alone, with] = simulate_window(&jobs, cores, shape, length)?;
    let sim_idle = f64::from(cores) * length - alone.busy_core_s;
    for (label, f) in [
        ("simulated: trace alone", &alone),
        ("simulated: trace + sweep through gleaner", &with),
    ] {
        println!(
            "| {label} | {} | | | | |",
            columns(f, &alone, sim_idle, jobs.len())
        );
    }
    eprintln!(
        "simulator against the grid: idle {:+.1} %, trace jobs' mean wait alone {:+.1} %",
        relative(sim_idle, idle),
        relative(mean(&alone.waits), mean(&base.waits)),
    );
    if let Some(real) = records.iter().find(|r| r.arm == Arm::Gleaner).map(figures) {
        eprintln!(
            "simulator against the grid with gleaner: harvested {:+.1} %, trace jobs' mean wait {:+.1} %",
            relative(with.harvested_core_s, real.harvested_core_s),
            relative(mean(&with.waits), mean(&real.waits)),
        );
    }
    Ok(())
}

/// The simulator alone on the trace at its own size: the window's jobs on
/// the whole traced machine, in the trace's own time, beside a sweep of
/// `shape`; a Markdown row alone and one with the sweep through gleaner.
pub fn simulate_full(window: &Window, shape: SweepShape) -> anyhow::Result<()> {
    let swf = read_trace(&window.trace)?;
    let Some(machine) = swf.max_procs else {
        bail!(
            "{}: the trace's header gives no MaxProcs or MaxNodes",
            window.trace.display()
        );
    };
    let (jobs, skipped) = window_jobs(&swf.jobs, machine, window, machine);
    ensure!(!jobs.is_empty(), "no job of the trace in its window");
    eprintln!(
        "trace: {} jobs in the window ({skipped} wider than the machine left out), {machine} processors",
        jobs.len()
    );
    let length = window.length_s / window.compress;
    let [alone, with] = simulate_window(&jobs, machine, shape, length)?;
    let idle = f64::from(machine) * length - alone.busy_core_s;
    for (label, f) in [
        ("simulated at full size: trace alone", &alone),
        (
            "simulated at full size: trace + sweep through gleaner",
            &with,
        ),
    ] {
        println!("| {label} | {} |", columns(f, &alone, idle, jobs.len()));
    }
    Ok(())
}

/// A row's columns from the trace's jobs to the 95th percentile of their
/// waits: `f` of a run against `base`, the same window's run alone, which
/// left `idle` core-seconds.
fn columns(f: &Figures, base: &Figures, idle: f64, jobs: usize) -> String {
    format!(
        "{jobs} | {idle:.0} | {:.0} ({:.1} %) | {:.0} | {} | {:.1} ({:+.1} %) | {:.1} ({:+.1} %)",
        f.harvested_core_s,
        100.0 * f.harvested_core_s / idle.max(1.0),
        f.lost_core_s,
        f.tasks_done,
        mean(&f.waits),
        relative(mean(&f.waits), mean(&base.waits)),
        percentile(&f.waits, 0.95),
        relative(percentile(&f.waits, 0.95), percentile(&base.waits, 0.95)),
    )
}

/// `value` against `base`, in percent.
fn relative(value: f64, base: f64) -> f64 {
    if base <= 0.0 {
        return 0.0;
    }
    100.0 * (value - base) / base
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, submit_s: f64, run_s: f64, procs: u32) -> WorkloadJob {
        WorkloadJob {
            id,
            submit_s,
            run_s,
            procs,
            requested_s: run_s,
            user: None,
        }
    }

    #[test]
    fn a_window_is_shrunk_to_the_grid_and_its_time_compressed() {
        let window = Window {
            trace: PathBuf::new(),
            from_s: 1000.0,
            length_s: 3000.0,
            compress: 10.0,
        };
        let jobs = [
            job(1, 999.0, 100.0, 1),
            job(2, 1000.0, 95.0, 128),
            job(3, 2000.0, 5.0, 1),
            job(4, 3999.0, 600.0, 11),
            job(5, 4000.0, 100.0, 1),
            job(6, 1500.0, 100.0, 256),
        ];
        let (kept, skipped) = window_jobs(&jobs, 128, &window, 12);
        let shapes: Vec<(u64, f64, u64, u64, u32)> = kept
            .iter()
            .map(|j| (j.id, j.at_s, j.run_s, j.limit_s, j.procs))
            .collect();
        assert_eq!(
            shapes,
            [
                (2, 0.0, 10, 120, 12),
                (3, 100.0, 1, 120, 1),
                (4, 299.9, 60, 120, 2),
            ]
        );
        assert_eq!(skipped, 1, "a job wider than the traced machine");
    }

    #[test]
    fn the_simulator_runs_the_window_with_and_without_the_sweep() {
        let jobs: Vec<TraceJob> = (0..6)
            .map(|i| TraceJob {
                id: i,
                at_s: 20.0 * i as f64,
                run_s: 30,
                limit_s: 60,
                procs: 4,
            })
            .collect();
        let shape = SweepShape {
            tasks: 500,
            min_s: 5,
            max_s: 15,
        };
        let [alone, with] = simulate_window(&jobs, 12, shape, 200.0).unwrap();
        assert_eq!(alone.waits.len(), 6, "every trace job started");
        assert_eq!(with.waits.len(), 6);
        assert_eq!(alone.tasks_done, 0, "no sweep alone");
        assert!(with.tasks_done > 0, "the sweep harvested the idle nodes");
        assert!(with.harvested_core_s <= 12.0 * 200.0 - alone.busy_core_s);
    }

    #[test]
    fn figures_count_only_the_window_and_what_completed() {
        let run = RunRecord {
            arm: Arm::Gleaner,
            started: 100.0,
            window_end: 200.0,
            trace: vec![(100.0, 110.0, 150.0, 2), (120.0, 120.0, 260.0, 1)],
            sweep: [
                (100.0, 110.0, true, 10.0),
                (150.0, 170.0, false, 20.0),
                (190.0, 199.5, false, 9.0),
                (195.0, 205.0, true, 10.0),
                // Suspended for half of its run.
                (120.0, 140.0, true, 10.0),
            ]
            .map(|(start, end, done, work_s)| TaskRun {
                start,
                end,
                done,
                work_s,
            })
            .to_vec(),
            rpcs: None,
            master_cpu_s: 0.0,
            took_s: 160.0,
        };
        let f = figures(&run);
        assert_eq!(f.busy_core_s, 2.0 * 40.0 + 80.0);
        assert_eq!(f.harvested_core_s, 10.0 + 5.0 + 10.0);
        assert_eq!(
            f.lost_core_s, 20.0,
            "the run cut at the window's end is not lost"
        );
        assert_eq!(f.tasks_done, 2);
        assert_eq!(f.waits, [10.0, 0.0]);
        assert_eq!(f.slowdowns, [50.0 / 40.0, 1.0]);
    }
}
