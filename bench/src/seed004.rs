//! Seed 004, Figure 4.4: how long a reservation takes to be ready, from
//! the grant of slots to every launcher on them connected, for 4 to 48
//! launchers (the thesis's range) and on to 500.

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, ensure};
use gleaner_testkit::{Gleaner, SgeQueues, SlurmCluster, sweep};

use crate::{
    measure::wait_until_serving,
    seed000::{Batch, slurm_cpus, until},
};

const POLL: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_secs(600);

/// What holds the slots: a Grid Engine queue of its own on this host,
/// gleaner's partition of the Slurm grid as deployed, or the local backend.
enum Slots {
    Sge(SgeQueues),
    Slurm(SlurmCluster),
    Local(u32),
}

impl Slots {
    fn config(&self) -> String {
        match self {
            Self::Sge(queues) => format!(
                "[[cluster]]\nname = \"bench\"\nbackend = \"sge\"\nqueue = \"{}\"\nh_rt = \"2h\"\n",
                queues.names[0]
            ),
            Self::Slurm(_) => format!(
                "[[cluster]]\nname = \"bench\"\nbackend = \"slurm\"\npartition = \"{}\"\n",
                SlurmCluster::PARTITION
            ),
            Self::Local(slots) => {
                format!("[[cluster]]\nname = \"bench\"\nbackend = \"local\"\nslots = {slots}\n")
            }
        }
    }

    /// Batch jobs still in the queue (placeholders leaving).
    fn queued(&self) -> usize {
        match self {
            Self::Sge(queues) => queues.jobs(&queues.names[0]).len(),
            Self::Slurm(cluster) => cluster.jobs().len(),
            Self::Local(_) => 0,
        }
    }
}

/// When a service log line was written (its leading RFC 3339 timestamp).
fn logged_at(line: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(line.split_whitespace().next()?.trim_end_matches('Z')).ok()
}

/// A field `name=value` of a log line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
}

/// One reservation of `launchers` slots: (grant to every launcher up,
/// submission to every launcher up, grant to the first launcher up).
fn reserve(g: &Gleaner, slots: &Slots, launchers: u32) -> anyhow::Result<(f64, f64, f64)> {
    let seen = g.log("up").len();
    let submitted = SystemTime::now();
    let job = g.submit(&sweep("reserve", launchers, "sleep 3600"));
    let deadline = Instant::now() + TIMEOUT;
    let (grant, first, all) = loop {
        ensure!(
            Instant::now() < deadline,
            "{launchers} launchers did not all connect"
        );
        let log = g.log("up");
        let new = log.get(seen..).unwrap_or_default();
        let grant = new
            .lines()
            .find(|l| l.contains("grow offer") && field(l, "job") == Some(&job))
            .and_then(logged_at);
        let mut up = BTreeSet::new();
        let mut first = None;
        let mut all = None;
        for line in new.lines().filter(|l| l.contains("launcher up")) {
            if let Some(launcher) = field(line, "launcher")
                && up.insert(launcher)
            {
                first = first.or_else(|| logged_at(line));
                if up.len() as u32 == launchers {
                    all = logged_at(line);
                }
            }
        }
        if let (Some(grant), Some(first), Some(all)) = (grant, first, all) {
            break (grant, first, all);
        }
        std::thread::sleep(POLL);
    };
    g.run(&["cancel", &job]);
    until("the launchers to leave", TIMEOUT, || {
        g.launchers(&job).is_empty() && slots.queued() == 0
    })?;
    let secs = |from: SystemTime, to: SystemTime| {
        to.duration_since(from)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    };
    Ok((secs(grant, all), secs(submitted, all), secs(grant, first)))
}

/// Figure 4.4 on one batch system: each count of launchers in turn, with
/// `runs` reservations each; one Markdown row per count.
pub fn figure_4_4(exe: &Path, batch: Batch, counts: &[u32], runs: u32) -> anyhow::Result<()> {
    let most = counts.iter().copied().max().context("no launcher counts")?;
    let slots = match batch {
        Batch::Sge => Slots::Sge(SgeQueues::new(1, most)),
        Batch::Slurm => {
            let cluster = SlurmCluster::lock();
            let cpus = slurm_cpus(SlurmCluster::PARTITION)?;
            ensure!(
                cpus >= most,
                "Slurm's partition has {cpus} CPUs, fewer than {most} (deploy/slurm/setup.sh N S)"
            );
            Slots::Slurm(cluster)
        }
        Batch::Local => Slots::Local(most),
    };
    let mut g = Gleaner::new(&format!("bench-figure-4-4-{batch:?}"), exe);
    g.write("gleaner.toml", &slots.config());
    g.start_with(
        "up",
        &["up"],
        &[("RUST_LOG", "info,gleaner_runner_core::sweep=debug")],
    );
    wait_until_serving(&g);
    for &launchers in counts {
        let mut figures = Vec::new();
        for run in 1..=runs {
            let (grant_all, submitted_all, grant_first) = reserve(&g, &slots, launchers)?;
            eprintln!(
                "figure-4-4 {} {launchers} launchers, run {run}: grant → all {grant_all:.2} s, submission → all {submitted_all:.2} s, grant → first {grant_first:.2} s",
                batch.label()
            );
            figures.push((grant_all, submitted_all, grant_first));
        }
        let mean = |pick: fn(&(f64, f64, f64)) -> f64| {
            figures.iter().map(pick).sum::<f64>() / figures.len().max(1) as f64
        };
        let seed = match launchers {
            48 => "about 7",
            4 | 8 | 16 | 32 => "in the figure",
            _ => "–",
        };
        println!(
            "| {} | {launchers} | {:.2} | {:.2} | {:.2} | {seed} |",
            batch.label(),
            mean(|f| f.0),
            mean(|f| f.1),
            mean(|f| f.2),
        );
    }
    Ok(())
}
