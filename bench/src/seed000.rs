//! Seed 000's experiments on the real dev grid, at the thesis's scale and
//! shape, each table with the thesis's figures beside ours: Table 4.1
//! (launchers against direct submission), Table 4.2 (local jobs' delay)
//! and Table 4.3 (chunked grid jobs' delay).

use std::{
    path::Path,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, ensure};
use gleaner_protocol::naming::placeholder_name;
use gleaner_testkit::{Gleaner, SgeQueues, SlurmCluster, sbatch, sge, slurm, sweep};

use crate::measure::{run_job, wait_until_serving};

const POLL: Duration = Duration::from_millis(100);

/// The batch system of an experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Batch {
    Sge,
    Slurm,
    Local,
}

impl Batch {
    pub fn label(self) -> &'static str {
        match self {
            Self::Sge => "Grid Engine",
            Self::Slurm => "Slurm",
            Self::Local => "local backend",
        }
    }
}

/// The one cluster of Tables 4.1 and 4.2, the thesis's 68-node Delft
/// cluster: a queue on every test host of the Grid Engine grid
/// (`deploy/sge/hosts.sh`), or gleaner's partition of the Slurm grid
/// (`deploy/slurm/setup.sh`), whatever size they were deployed at.
pub enum Cluster {
    Sge { queues: SgeQueues, slots: u32 },
    Slurm { cluster: SlurmCluster, slots: u32 },
}

/// A batch job of the experiments: `width` slots (spread over hosts as
/// the batch system likes) sleeping `seconds`, `array` times over.
struct BatchJob<'a> {
    name: &'a str,
    width: u32,
    seconds: u32,
    array: u32,
    /// Slurm's partition (Grid Engine has one queue for all).
    partition: &'a str,
    /// Where the job writes its start time (ms since the epoch, by its own
    /// clock) to a file named by its id; none: the job prints nothing.
    stamps: Option<&'a Path>,
    /// The second since the epoch the job ends at, instead of after
    /// `seconds`.
    ends_at: Option<u64>,
}

impl BatchJob<'_> {
    /// The job's shell command, for a job that stamps or ends at a time.
    fn script(&self) -> Option<String> {
        let stamp = self.stamps.map_or("", |_| "date +%s%3N; ");
        let sleep = match self.ends_at {
            // To the millisecond: `ms` from now to then.
            Some(at) => format!(
                "ms=$(( {at}000 - $(date +%s%3N) )); exec sleep $((ms / 1000)).$(printf %03d $((ms % 1000)))"
            ),
            None if self.stamps.is_some() => format!("exec sleep {}", self.seconds),
            None => return None,
        };
        Some(format!("{stamp}{sleep}"))
    }
}

impl Cluster {
    /// The cluster at its deployed size, which must be `slots`.
    pub fn open(batch: Batch, slots: u32) -> anyhow::Result<Self> {
        match batch {
            Batch::Sge => {
                let hosts = sge("qconf", &["-shgrp_resolved", "@nodes"])
                    .split_whitespace()
                    .count() as u32;
                ensure!(
                    hosts > 0 && slots.is_multiple_of(hosts),
                    "{slots} slots do not split over the grid's {hosts} test hosts (deploy/sge/hosts.sh N S)"
                );
                Ok(Self::Sge {
                    queues: SgeQueues::on_nodes(1, slots / hosts),
                    slots,
                })
            }
            Batch::Slurm => {
                let lock = SlurmCluster::lock();
                let cpus = slurm_cpus(SlurmCluster::PARTITION)?;
                ensure!(
                    cpus == slots,
                    "Slurm's partition has {cpus} CPUs, not {slots} (deploy/slurm/setup.sh N S)"
                );
                Ok(Self::Slurm {
                    cluster: lock,
                    slots,
                })
            }
            Batch::Local => anyhow::bail!("the local backend has no batch queue to compare with"),
        }
    }

    pub fn slots(&self) -> u32 {
        match self {
            Self::Sge { slots, .. } | Self::Slurm { slots, .. } => *slots,
        }
    }

    /// `gleaner.toml` for a cluster of this one alone.
    pub fn config(&self) -> String {
        match self {
            Self::Sge { queues, .. } => format!(
                "[[cluster]]\nname = \"bench\"\nbackend = \"sge\"\nqueue = \"{}\"\nh_rt = \"2h\"\n",
                queues.names[0]
            ),
            Self::Slurm { .. } => format!(
                "[[cluster]]\nname = \"bench\"\nbackend = \"slurm\"\npartition = \"{}\"\n",
                SlurmCluster::PARTITION
            ),
        }
    }

    fn submit(&self, job: &BatchJob<'_>) -> anyhow::Result<String> {
        let sleep = job.seconds.to_string();
        let width = job.width.to_string();
        let array = format!("1-{}", job.array);
        match self {
            Self::Sge { queues, .. } => {
                let out = job.stamps.map(|dir| format!("{}/$JOB_ID", dir.display()));
                let script = job.script();
                let mut args = vec![
                    "-terse",
                    "-o",
                    out.as_deref().unwrap_or("/dev/null"),
                    "-e",
                    "/dev/null",
                    "-N",
                    job.name,
                    "-q",
                    &queues.names[0],
                ];
                if job.width > 1 {
                    args.extend(["-pe", "make", &width]);
                }
                if job.array > 1 {
                    args.extend(["-t", &array]);
                }
                match &script {
                    Some(script) => {
                        args.extend(["-b", "y", "-shell", "no", "/bin/sh", "-c", script])
                    }
                    None => args.extend(["-b", "y", "/bin/sleep", &sleep]),
                }
                let answer = sge("qsub", &args);
                let number = answer.trim().split('.').next().unwrap_or("").to_owned();
                ensure!(number.parse::<u64>().is_ok(), "qsub answered {answer:?}");
                Ok(number)
            }
            Self::Slurm { .. } => {
                let wrap = job.script().unwrap_or_else(|| format!("sleep {sleep}"));
                let cpus = format!("-n{width}");
                let array = format!("--array={array}");
                let out = job
                    .stamps
                    .map(|dir| format!("--output={}/%j", dir.display()));
                let mut args = vec!["-J", job.name, "-p", job.partition, &cpus];
                if job.array > 1 {
                    args.push(&array);
                }
                args.extend(out.as_deref());
                args.extend(["--wrap", &wrap]);
                Ok(sbatch(&args))
            }
        }
    }

    /// (id, name, running) of every job in the cluster's queue.
    fn jobs(&self) -> Vec<(String, String, bool)> {
        match self {
            Self::Sge { queues, .. } => queues
                .jobs(&queues.names[0])
                .into_iter()
                .map(|j| {
                    let running = j.state.contains('r');
                    (j.number, j.name, running)
                })
                .collect(),
            Self::Slurm { cluster, .. } => cluster
                .jobs()
                .into_iter()
                .map(|j| {
                    let running = j.state == "RUNNING";
                    (j.id, j.name, running)
                })
                .collect(),
        }
    }

    /// Waits until no job of these names is left; `timeout` at most.
    fn until_gone(&self, names: &[&str], timeout: Duration) -> anyhow::Result<()> {
        until(&format!("jobs {names:?} to end"), timeout, || {
            !self
                .jobs()
                .iter()
                .any(|(_, name, _)| names.contains(&name.as_str()))
        })
    }

    fn remove(&self, ids: &[&str]) -> anyhow::Result<()> {
        match self {
            Self::Sge { .. } => drop(sge("qdel", ids)),
            Self::Slurm { .. } => drop(slurm("scancel", ids)),
        }
        until(
            &format!("jobs {ids:?} to be removed"),
            Duration::from_secs(120),
            || {
                !self
                    .jobs()
                    .iter()
                    .any(|(id, _, _)| ids.contains(&id.as_str()))
            },
        )
    }

    /// Placeholders of `job` running now.
    fn placeholders_running(&self, job: &str) -> u32 {
        let name = placeholder_name(job);
        self.jobs()
            .iter()
            .filter(|(_, n, running)| *n == name && *running)
            .count() as u32
    }

    /// Waits until `job`'s placeholders hold every slot, then 3 s more
    /// for the kcm to settle.
    fn until_full(&self, job: &str, slots: u32) -> anyhow::Result<()> {
        until(
            "gleaner to fill the cluster",
            Duration::from_secs(300),
            || self.placeholders_running(job) >= slots,
        )?;
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    }
}

/// Waits for `done`, polling; an error after `timeout`.
pub fn until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// Total CPUs of a Slurm partition (`sinfo %C`: allocated/idle/other/total).
pub fn slurm_cpus(partition: &str) -> anyhow::Result<u32> {
    let answer = slurm("sinfo", &["-h", "-p", partition, "-o", "%C"]);
    answer
        .trim()
        .rsplit('/')
        .next()
        .and_then(|total| total.parse().ok())
        .with_context(|| format!("sinfo answered {answer:?}"))
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

fn spread(values: &[f64]) -> String {
    let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = values.iter().cloned().fold(0.0, f64::max);
    format!("{:.1} ({min:.1}–{max:.1})", mean(values))
}

/// The cells of a row of Table 4.2 or 4.3: our makespans without and with
/// launchers and what they add, then the thesis's.
fn beside_seed(alone: &[f64], loaded: &[f64], seed_alone: f64, seed_loaded: f64) -> String {
    format!(
        "{} | {} | {:+.1} | {seed_alone:.1} | {seed_loaded:.1} | {:+.1}",
        spread(alone),
        spread(loaded),
        mean(loaded) - mean(alone),
        seed_loaded - seed_alone,
    )
}

/// Table 4.1: `tasks` tasks of `seconds` on the whole cluster, by one
/// batch job per task, by one array job, and through gleaner's launchers,
/// side by side in one run; makespans and throughputs against the ideal.
pub fn table_4_1(
    exe: &Path,
    batch: Batch,
    slots: u32,
    tasks: u32,
    seconds: u32,
) -> anyhow::Result<()> {
    let cluster = Cluster::open(batch, slots)?;
    let ideal = f64::from(tasks.div_ceil(slots) * seconds);
    let one = BatchJob {
        name: "direct",
        width: 1,
        seconds,
        array: 1,
        partition: SlurmCluster::PARTITION,
        stamps: None,
        ends_at: None,
    };
    let timeout = Duration::from_secs(u64::from(seconds) * u64::from(tasks) / 4);

    let started = Instant::now();
    for _ in 0..tasks {
        cluster.submit(&one)?;
    }
    cluster.until_gone(&["direct"], timeout)?;
    let direct = started.elapsed().as_secs_f64();

    let started = Instant::now();
    cluster.submit(&BatchJob {
        name: "array",
        array: tasks,
        ..one
    })?;
    cluster.until_gone(&["array"], timeout)?;
    let array = started.elapsed().as_secs_f64();

    let mut g = Gleaner::new(&format!("bench-table-4-1-{batch:?}"), exe);
    g.write("gleaner.toml", &cluster.config());
    g.start("up", &["up"]);
    wait_until_serving(&g);
    let (gleaner, _) = run_job(&g, &sweep("table-4-1", tasks, &format!("sleep {seconds}")))?;
    drop(g);

    let ideal_rate = f64::from(tasks) / ideal;
    let row = |how: &str, makespan: f64, seed: &str| {
        let rate = f64::from(tasks) / makespan;
        println!(
            "| {} | {how} | {makespan:.2} | {:.1} % | {rate:.2} | {:.1} % | {seed} |",
            batch.label(),
            100.0 * makespan / ideal,
            100.0 * rate / ideal_rate,
        );
    };
    println!(
        "| {} | ideal ({tasks} × {seconds} s on {slots} slots) | {ideal:.2} | – | {ideal_rate:.2} | – | 450.00 / 2.22 |",
        batch.label()
    );
    let submit = match batch {
        Batch::Slurm => "`sbatch`",
        _ => "`qsub`",
    };
    row(
        &format!("one {submit} per task"),
        direct,
        "685.01 (152.2 %) / 1.46 (65.7 %)",
    );
    row(&format!("one {submit} array job"), array, "–");
    row(
        "gleaner's launchers",
        gleaner,
        "474.85 (105.5 %) / 2.11 (94.8 %)",
    );
    Ok(())
}

/// Table 4.2's jobs: 40 tasks of 60 s in chunks of 40, 20, 10, 4, 2 and 1
/// slots, with the thesis's makespans without and with a CS load.
const TABLE_4_2: [(u32, u32, f64, f64); 6] = [
    (1, 40, 67.932, 83.058),
    (2, 20, 66.696, 95.931),
    (4, 10, 68.586, 92.827),
    (10, 4, 76.076, 94.038),
    (20, 2, 82.477, 94.978),
    (40, 1, 90.188, 97.975),
];

/// Table 4.2: each local job `runs` times on the empty cluster, then `runs`
/// times on the cluster full of a sweep's launchers. A job's makespan runs
/// from its first chunk's submission to its last chunk's end: its last
/// chunk's start plus the chunk's `seconds` (a started chunk is removed at
/// once, as it would run its fixed time undisturbed). Each chunk writes
/// its start time by its own clock, so how long the batch system takes to
/// answer a poll on a loaded host is not counted. `shapes` (chunks,
/// width) chooses rows; none: all six.
pub fn table_4_2(
    exe: &Path,
    batch: Batch,
    slots: u32,
    runs: u32,
    seconds: u32,
    shapes: &[(u32, u32)],
) -> anyhow::Result<()> {
    let cluster = Cluster::open(batch, slots)?;
    let stamps = tempfile::tempdir()?;
    let makespan = |chunks: u32, width: u32| -> anyhow::Result<f64> {
        let job = BatchJob {
            name: "local",
            width,
            seconds: 3600,
            array: 1,
            partition: SlurmCluster::LOCAL,
            stamps: Some(stamps.path()),
            ends_at: None,
        };
        let first = epoch_ms();
        let mut submitted = Vec::new();
        for _ in 0..chunks {
            submitted.push(cluster.submit(&job)?);
        }
        let mut starts = Vec::new();
        until("the chunks to start", Duration::from_secs(120), || {
            starts = submitted
                .iter()
                .map_while(|id| start_stamp(&stamps.path().join(id)))
                .collect();
            starts.len() == submitted.len()
        })?;
        let ids: Vec<&str> = submitted.iter().map(String::as_str).collect();
        cluster.remove(&ids)?;
        let last = starts.into_iter().fold(first, f64::max);
        Ok((last - first) / 1000.0 + f64::from(seconds))
    };
    let rows = chosen(&TABLE_4_2, shapes);
    let mut alone = Vec::new();
    for (chunks, width, _, _) in rows.iter().copied() {
        let mut spans = Vec::new();
        for _ in 0..runs {
            spans.push(makespan(chunks, width)?);
        }
        alone.push(spans);
    }

    let mut g = Gleaner::new(&format!("bench-table-4-2-{batch:?}"), exe);
    g.write("gleaner.toml", &cluster.config());
    g.start("up", &["up"]);
    wait_until_serving(&g);
    let load = g.submit(&sweep("load", 100_000, "sleep 3600"));
    for ((chunks, width, seed_alone, seed_loaded), alone) in rows.into_iter().zip(&alone) {
        let mut loaded = Vec::new();
        for _ in 0..runs {
            cluster.until_full(&load, cluster.slots())?;
            loaded.push(makespan(chunks, width)?);
        }
        println!(
            "| {} | {chunks} × {width} | {} |",
            batch.label(),
            beside_seed(alone, &loaded, seed_alone, seed_loaded)
        );
    }
    g.run(&["cancel", &load]);
    Ok(())
}

/// The batch system's own handover, without gleaner: every slot is
/// taken by one-slot jobs that all end at the same second, and a job of
/// `width` slots waits for them; its handover is from that second to its
/// start by its own clock. `runs` times for each width.
pub fn handover(batch: Batch, slots: u32, widths: &[u32], runs: u32) -> anyhow::Result<()> {
    let cluster = Cluster::open(batch, slots)?;
    let stamps = tempfile::tempdir()?;
    for &width in widths {
        let mut handovers = Vec::new();
        for _ in 0..runs {
            // Long enough to submit every filler and see them run.
            let ends_at = (epoch_ms() / 1000.0) as u64 + 10 + u64::from(slots / 10);
            let filler = BatchJob {
                name: "filler",
                width: 1,
                seconds: 0,
                array: 1,
                partition: SlurmCluster::LOCAL,
                stamps: None,
                ends_at: Some(ends_at),
            };
            let fillers = (0..slots)
                .map(|_| cluster.submit(&filler))
                .collect::<anyhow::Result<Vec<_>>>()?;
            until("the fillers to run", Duration::from_secs(60), || {
                let running = cluster.jobs();
                fillers
                    .iter()
                    .all(|id| running.iter().any(|(j, _, r)| j == id && *r))
            })?;
            ensure!(
                epoch_ms() < (ends_at - 1) as f64 * 1000.0,
                "the fillers took too long to start"
            );
            let waiting = cluster.submit(&BatchJob {
                name: "waiting",
                width,
                seconds: 3600,
                stamps: Some(stamps.path()),
                ends_at: None,
                ..filler
            })?;
            let mut started = None;
            until("the waiting job to start", Duration::from_secs(120), || {
                started = start_stamp(&stamps.path().join(&waiting));
                started.is_some()
            })?;
            cluster.remove(&[waiting.as_str()])?;
            cluster.until_gone(&["filler"], Duration::from_secs(60))?;
            let started = started.context("start")?;
            handovers.push((started - ends_at as f64 * 1000.0) / 1000.0);
        }
        println!(
            "| {} | {width} | {runs} | {} |",
            batch.label(),
            spread(&handovers)
        );
    }
    Ok(())
}

/// A table's rows of these `shapes` (its first two columns), or all of
/// them.
fn chosen(table: &[(u32, u32, f64, f64)], shapes: &[(u32, u32)]) -> Vec<(u32, u32, f64, f64)> {
    table
        .iter()
        .copied()
        .filter(|(count, width, _, _)| shapes.is_empty() || shapes.contains(&(*count, *width)))
        .collect()
}

/// Now in ms since the epoch, as `date +%s%3N` prints it.
fn epoch_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// The start time a chunk wrote to `file`, once it has.
fn start_stamp(file: &Path) -> Option<f64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Table 4.3's grid jobs: 80 slots in components of 20, 10 and 5, with the
/// thesis's makespans without and with a CS load.
const TABLE_4_3: [(u32, u32, f64, f64); 3] = [
    (4, 20, 91.425, 99.919),
    (8, 10, 87.533, 87.428),
    (16, 5, 141.150, 149.387),
];

/// Slots of each of Table 4.3's three clusters: the 80-slot jobs need at
/// least two of them.
const TABLE_4_3_CLUSTER_SLOTS: u32 = 40;

/// Table 4.3: each grid job `runs` times on three empty Grid Engine
/// clusters, then `runs` times with them full of a sweep's launchers. Its
/// makespan runs from its submission to the start of its last component
/// (all start together) plus the components' `seconds`. `shapes`
/// (components, width) chooses rows; none: all three.
pub fn table_4_3(exe: &Path, runs: u32, seconds: u32, shapes: &[(u32, u32)]) -> anyhow::Result<()> {
    let queues = SgeQueues::new(3, TABLE_4_3_CLUSTER_SLOTS);
    let mut g = Gleaner::new("bench-table-4-3", exe);
    let config: String = queues
        .names
        .iter()
        .enumerate()
        .map(|(i, queue)| {
            format!(
                "[[cluster]]\nname = \"c{}\"\nbackend = \"sge\"\nqueue = \"{queue}\"\nh_rt = \"2h\"\n",
                i + 1
            )
        })
        .collect();
    g.write("gleaner.toml", &config);
    g.start("up", &["up"]);
    wait_until_serving(&g);
    let makespan = |g: &Gleaner, count: u32, width: u32| -> anyhow::Result<f64> {
        // Each component prints when it started (ms since the epoch).
        let component = format!("[[component]]\nslots = {width}\ncommand = \"date +%s%3N\"\n");
        let manifest = format!(
            "name = \"chunked\"\nkind = \"grid\"\npriority = \"high\"\n{}",
            component.repeat(count as usize)
        );
        let job = g.submit(&manifest);
        let state = g.wait_for_end(&job, Duration::from_secs(600));
        ensure!(state == "done", "grid job {job} ended {state}");
        let file = g.job_file(&job).context("job.json")?;
        let submitted = file["submitted_at"].as_f64().context("submitted_at")?;
        let mut last: f64 = 0.0;
        for i in 0..count {
            let out = g
                .stdout(&job, u64::from(i))
                .context("a component's output")?;
            let started: f64 = out.trim().parse().context("component start time")?;
            last = last.max(started);
        }
        Ok((last - submitted) / 1000.0 + f64::from(seconds))
    };
    let full = |load: &str| -> anyhow::Result<()> {
        let name = placeholder_name(load);
        let slots = TABLE_4_3_CLUSTER_SLOTS * 3;
        until(
            "gleaner to fill the clusters",
            Duration::from_secs(300),
            || {
                queues
                    .names
                    .iter()
                    .flat_map(|q| queues.jobs(q))
                    .filter(|j| j.name == name && j.state.contains('r'))
                    .count() as u32
                    == slots
            },
        )?;
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    };
    let rows = chosen(&TABLE_4_3, shapes);
    let mut alone = Vec::new();
    for (count, width, _, _) in rows.iter().copied() {
        let mut spans = Vec::new();
        for _ in 0..runs {
            spans.push(makespan(&g, count, width)?);
        }
        alone.push(spans);
    }
    let load = g.submit(&sweep("load", 100_000, "sleep 3600"));
    for ((count, width, seed_alone, seed_loaded), alone) in rows.into_iter().zip(&alone) {
        let mut loaded = Vec::new();
        for _ in 0..runs {
            full(&load)?;
            loaded.push(makespan(&g, count, width)?);
        }
        println!(
            "| {count} × {width} | {} |",
            beside_seed(alone, &loaded, seed_alone, seed_loaded)
        );
    }
    g.run(&["cancel", &load]);
    Ok(())
}
