//! Benchmarks on the dev grid's Slurm (`deploy/slurm/setup.sh`: three
//! 4-CPU test hosts).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::ensure;
use gleaner_protocol::naming::placeholder_name;
use gleaner_testkit::{Gleaner, SlurmCluster, sbatch, slurm, sweep, wait_for};

use crate::measure::{run_job, wait_until_serving, waits_to_start};

const POLL: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_secs(900);

fn config(partition: &str) -> String {
    format!("[[cluster]]\nname = \"bench\"\nbackend = \"slurm\"\npartition = \"{partition}\"\n")
}

/// A partition of its own on some of the test hosts, deleted at the end.
struct Partition {
    name: String,
}

impl Partition {
    fn new(name: &str, nodes: &str) -> anyhow::Result<Self> {
        slurm(
            "scontrol",
            &[
                "create",
                &format!("PartitionName={name}"),
                &format!("Nodes={nodes}"),
                "MaxTime=INFINITE",
                "State=UP",
            ],
        );
        let shown = slurm("scontrol", &["show", "partition", name]);
        ensure!(
            shown.contains(&format!("PartitionName={name}")),
            "no partition {name}"
        );
        Ok(Self {
            name: name.to_owned(),
        })
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        slurm(
            "scontrol",
            &["delete", &format!("PartitionName={}", self.name)],
        );
    }
}

fn until_empty(cluster: &SlurmCluster) -> anyhow::Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    while !cluster.jobs().is_empty() {
        ensure!(Instant::now() < deadline, "the Slurm queue did not empty");
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// Seed 000, Table 4.1 on Slurm: the same tasks through gleaner's
/// launchers, by one `sbatch` per task, and as one `sbatch --array` job,
/// on 8 CPUs (two test hosts).
pub fn launchers_vs_direct(exe: &std::path::Path, tasks: u32, seconds: u32) -> anyhow::Result<()> {
    let cluster = SlurmCluster::lock();
    let partition = Partition::new("glbench", "node[1-2]")?;
    let part = partition.name.as_str();
    let slots = 8;
    let ideal = f64::from(tasks * seconds) / f64::from(slots);
    let wrap = format!("sleep {seconds}");

    let started = Instant::now();
    for _ in 0..tasks {
        sbatch(&["-p", part, "-n1", "--wrap", &wrap]);
    }
    until_empty(&cluster)?;
    let direct = started.elapsed().as_secs_f64();

    let started = Instant::now();
    sbatch(&[
        "-p",
        part,
        "-n1",
        &format!("--array=1-{tasks}"),
        "--wrap",
        &wrap,
    ]);
    until_empty(&cluster)?;
    let array = started.elapsed().as_secs_f64();

    let mut g = Gleaner::new("bench-slurm-launchers", exe);
    g.write("gleaner.toml", &config(part));
    g.start("up", &["up"]);
    wait_until_serving(&g);
    let (gleaner, _) = run_job(&g, &sweep("launchers", tasks, &wrap))?;
    drop(g);
    until_empty(&cluster)?;

    let row = |how: &str, makespan: f64| {
        println!(
            "| {how} | {tasks} × `sleep {seconds}` | {slots} | {ideal:.1} | {makespan:.2} | {:.3} |",
            makespan / ideal
        );
    };
    row("one `sbatch` per task", direct);
    row("one `sbatch --array` job", array);
    row("gleaner launchers", gleaner);
    Ok(())
}

/// A local job shape: `jobs` jobs of `cpus` CPUs, on one node each.
struct Shape {
    jobs: u32,
    cpus: u32,
    label: &'static str,
}

/// Seed 000, Table 4.2 on Slurm: local jobs of each shape (`sbatch -p local
/// -N1 -n N sleep 10`) on the empty partition, then on the partition full
/// of launchers of a 100,000-task sweep.
pub fn local_delay(exe: &std::path::Path) -> anyhow::Result<()> {
    let cluster = SlurmCluster::lock();
    let shapes = [
        Shape {
            jobs: 1,
            cpus: 4,
            label: "a whole node",
        },
        Shape {
            jobs: 2,
            cpus: 2,
            label: "half a node",
        },
        Shape {
            jobs: 4,
            cpus: 1,
            label: "one CPU",
        },
    ];
    let mut alone = Vec::new();
    for shape in &shapes {
        alone.push(local_waits(&cluster, shape)?);
    }
    let mut g = Gleaner::new("bench-slurm-delay", exe);
    g.write("gleaner.toml", &config(SlurmCluster::PARTITION));
    g.start("up", &["up"]);
    wait_until_serving(&g);
    let job = g.submit(&sweep("load", 100_000, "sleep 60"));
    let full = || running_placeholders(&cluster, &job) == 12;
    for (shape, alone) in shapes.iter().zip(&alone) {
        wait_for(
            "gleaner to fill the partition",
            Duration::from_secs(120),
            full,
        );
        std::thread::sleep(Duration::from_secs(3));
        let loaded = local_waits(&cluster, shape)?;
        let max = |w: &[f64]| w.iter().cloned().fold(0.0, f64::max);
        let mean = |w: &[f64]| w.iter().sum::<f64>() / w.len() as f64;
        println!(
            "| {} × {} ({}) | {:.2} | {:.2} | {:.2} | {:.2} |",
            shape.jobs,
            shape.cpus,
            shape.label,
            max(alone),
            max(&loaded),
            mean(&loaded) - mean(alone),
            max(&loaded) - max(alone),
        );
    }
    g.run(&["cancel", &job]);
    Ok(())
}

/// Submits a shape's local jobs; returns how long each waited to start
/// (seconds). They are cancelled once started.
fn local_waits(cluster: &SlurmCluster, shape: &Shape) -> anyhow::Result<Vec<f64>> {
    let cpus = format!("-n{}", shape.cpus);
    let submitted: Vec<(String, Instant)> = (0..shape.jobs)
        .map(|_| {
            let id = sbatch(&[
                "-p",
                SlurmCluster::LOCAL,
                "-N1",
                &cpus,
                "--wrap",
                "sleep 10",
            ]);
            (id, Instant::now())
        })
        .collect();
    let waits = waits_to_start(&submitted, || {
        cluster
            .jobs()
            .into_iter()
            .filter(|j| j.state == "RUNNING")
            .map(|j| j.id)
            .collect()
    })?;
    let ids: Vec<&str> = submitted.iter().map(|(id, _)| id.as_str()).collect();
    slurm("scancel", &ids);
    wait_for("the local jobs to go", Duration::from_secs(60), || {
        cluster.jobs().iter().all(|j| !ids.contains(&j.id.as_str()))
    });
    Ok(waits)
}

/// Placeholders of `job` running.
fn running_placeholders(cluster: &SlurmCluster, job: &str) -> usize {
    cluster
        .jobs()
        .iter()
        .filter(|j| j.name == placeholder_name(job) && j.state == "RUNNING")
        .count()
}

/// `sdiag`'s count of RPCs by message type, summed.
pub fn rpc_total() -> u64 {
    rpc_counts().values().sum()
}

/// `sdiag`'s count of RPCs for each message type.
fn rpc_counts() -> BTreeMap<String, u64> {
    slurm("sdiag", &[])
        .lines()
        .skip_while(|l| !l.contains("by message type"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let kind = l.split_whitespace().next()?;
            let count = l.split("count:").nth(1)?;
            let count = count.split_whitespace().next()?.parse::<u64>().ok()?;
            Some((kind.to_owned(), count))
        })
        .collect()
}

/// `slurmctld`'s CPU time so far, seconds.
fn ctld_cpu_s() -> f64 {
    daemon_cpu_s("slurmctld")
}

/// The CPU time so far of the processes called `daemon`, seconds.
pub fn daemon_cpu_s(daemon: &str) -> f64 {
    let Ok(processes) = procfs::process::all_processes() else {
        return 0.0;
    };
    let ticks = procfs::ticks_per_second() as f64;
    processes
        .flatten()
        .filter_map(|p| p.stat().ok())
        .filter(|s| s.comm == daemon)
        .map(|s| (s.utime + s.stime) as f64 / ticks)
        .sum()
}

/// What `slurmctld` served over a span, each a minute's worth: RPCs, by
/// message type, and the CPU seconds it took.
struct MasterMinute {
    rpcs: f64,
    by_type: BTreeMap<String, f64>,
    cpu_s: f64,
}

impl MasterMinute {
    fn over(span: Duration) -> Self {
        let (before, cpu) = (rpc_counts(), ctld_cpu_s());
        std::thread::sleep(span);
        let minutes = span.as_secs_f64() / 60.0;
        let by_type: BTreeMap<String, f64> = rpc_counts()
            .into_iter()
            .map(|(kind, count)| {
                let earlier = before.get(&kind).copied().unwrap_or(0);
                (kind, count.saturating_sub(earlier) as f64 / minutes)
            })
            .filter(|(_, count)| *count > 0.0)
            .collect();
        Self {
            rpcs: by_type.values().sum(),
            by_type,
            cpu_s: (ctld_cpu_s() - cpu) / minutes,
        }
    }

    /// The message types beyond `alone`'s, most first.
    fn beyond(&self, alone: &Self) -> String {
        let mut more: Vec<(&String, f64)> = self
            .by_type
            .iter()
            .map(|(kind, count)| {
                (
                    kind,
                    count - alone.by_type.get(kind).copied().unwrap_or(0.0),
                )
            })
            .filter(|(_, more)| *more >= 0.5)
            .collect();
        more.sort_by(|a, b| b.1.total_cmp(&a.1));
        more.iter()
            .map(|(kind, count)| format!("{kind} {count:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What gleaner costs `slurmctld` with `queued` jobs of the cluster's own
/// users held in the queue: RPCs a minute and its CPU, over `span` each,
/// without gleaner, with an idle gleaner (reading every 500 ms as it
/// used to, then as it does), and with a gleaner whose sweep fills the
/// partition.
pub fn master_load(exe: &std::path::Path, queued: u32, span: Duration) -> anyhow::Result<()> {
    let cluster = SlurmCluster::lock();
    let submitters = 4;
    std::thread::scope(|scope| {
        for part in 0..submitters {
            scope.spawn(move || {
                for _ in (part..queued).step_by(submitters as usize) {
                    sbatch(&[
                        "--hold",
                        "-p",
                        SlurmCluster::LOCAL,
                        "-n1",
                        "--wrap",
                        "sleep 1",
                    ]);
                }
            });
        }
    });
    let held = cluster.jobs().len();
    ensure!(held >= queued as usize, "{held} of {queued} jobs queued");
    let mut breakdown = Vec::new();
    let mut row = |what: &str, minute: &MasterMinute, alone: &MasterMinute| {
        println!(
            "| {held} | {what} | {:.0} | {:+.0} | {:.2} | {:+.1} % |",
            minute.rpcs,
            minute.rpcs - alone.rpcs,
            minute.cpu_s,
            100.0 * (minute.cpu_s - alone.cpu_s) / alone.cpu_s.max(f64::EPSILON)
        );
        breakdown.push(format!("{what}: {}", minute.beyond(alone)));
    };
    let alone = MasterMinute::over(span);
    row("no gleaner", &alone, &alone);
    for (what, intervals) in [
        (
            "an idle gleaner, reading every 500 ms (as before)",
            "poll_interval = \"500ms\"\nidle_poll_interval = \"500ms\"\n",
        ),
        ("an idle gleaner", ""),
    ] {
        let mut g = Gleaner::new("bench-slurm-master", exe);
        g.write(
            "gleaner.toml",
            &format!("{}{intervals}", config(SlurmCluster::PARTITION)),
        );
        g.start("up", &["up"]);
        wait_until_serving(&g);
        row(what, &MasterMinute::over(span), &alone);
        if intervals.is_empty() {
            let job = g.submit(&sweep("load", 10_000, "sleep 600"));
            let full = || running_placeholders(&cluster, &job) == 12;
            wait_for("gleaner to fill the partition", TIMEOUT, full);
            // The nodes' own RPCs for starting 12 jobs are Slurm's cost of
            // any 12 jobs: they pass before the minute measured.
            std::thread::sleep(Duration::from_secs(30));
            row(
                "a gleaner whose sweep fills the partition",
                &MasterMinute::over(span),
                &alone,
            );
            g.run(&["cancel", &job]);
        }
    }
    println!("\nRPCs a minute beyond those without gleaner, by message type:");
    for line in breakdown.iter().skip(1) {
        println!("- {line}");
    }
    cluster.clear();
    Ok(())
}
