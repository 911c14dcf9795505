//! Sweeps at scale: one no-op sweep of each size through `gleaner up`,
//! sampled every second for what grows with it — the broker's memory, its
//! job queue and its data on disk, the services' memory — and the files
//! the job made. A sweep is published a window ahead of its launchers, so
//! none of these should grow with the number of tasks.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};
use gleaner_testkit::{Gleaner, entries_under, sweep};

use crate::measure::{broker_pid, makespan_of_success, memory_kib, wait_until_serving};

/// Where RabbitMQ keeps its data (queues' logs and message stores).
const BROKER_DATA: &str = "/var/lib/rabbitmq/mnesia";

/// The largest value of each figure over the run.
#[derive(Debug, Default)]
struct Peaks {
    broker_kib: u64,
    broker_disk: u64,
    up_kib: u64,
    ready: u64,
    queue_bytes: u64,
    /// The slowest answer of `gleaner status JOB` while the job ran, once
    /// the scheduler knew it.
    status_s: f64,
}

/// Bytes of the files under `dir`, as far as they can be read.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => dir_bytes(&entry.path()),
            Ok(_) => entry.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// `launcher_slots` is the slots a launcher holds: one is `gleaner up`'s
/// default; more make fewer, bigger launchers, each with one connection.
pub fn scale(exe: &Path, sizes: &[u32], slots: u32, launcher_slots: u32) -> anyhow::Result<()> {
    let broker = broker_pid().context("no beam.smp process: is RabbitMQ local?")?;
    for &tasks in sizes {
        let mut g = Gleaner::new(&format!("bench-scale-{tasks}"), exe);
        g.write(
            "gleaner.toml",
            &format!(
                "[[cluster]]\nname = \"local\"\nbackend = \"local\"\nslots = {slots}\nlauncher_slots = {launcher_slots}\n"
            ),
        );
        let up = g.start("up", &["up"]);
        wait_until_serving(&g);
        let (broker_idle, disk_idle) = (memory_kib(broker).0, dir_bytes(Path::new(BROKER_DATA)));
        let job = g.submit(&sweep("scale", tasks, "/usr/bin/true"));
        let queue = format!("gleaner.job.{job}.tasks");
        let mut peaks = Peaks::default();
        let mut known = false;
        let started = Instant::now();
        let timeout = Duration::from_secs(4 * 3600);
        loop {
            if let Some(state) = g.job_state(&job)
                && matches!(state.as_str(), "done" | "cancelled")
            {
                break;
            }
            ensure!(
                started.elapsed() < timeout,
                "{tasks} tasks took over {timeout:?}"
            );
            if let Some(q) = g.vhost.queue(&queue) {
                let field = |name: &str| q[name].as_u64().unwrap_or(0);
                peaks.ready = peaks.ready.max(field("messages_ready"));
                peaks.queue_bytes = peaks.queue_bytes.max(field("message_bytes"));
            }
            peaks.broker_kib = peaks.broker_kib.max(memory_kib(broker).0);
            peaks.broker_disk = peaks.broker_disk.max(dir_bytes(Path::new(BROKER_DATA)));
            peaks.up_kib = peaks.up_kib.max(memory_kib(up).0);
            // Timed once the scheduler knows the job: before its runner's
            // first report, `status JOB` asks again a second later.
            let asked = Instant::now();
            let answered = g.run(&["status", &job]).status.success();
            if answered && known {
                peaks.status_s = peaks.status_s.max(asked.elapsed().as_secs_f64());
            }
            known |= answered;
            std::thread::sleep(Duration::from_secs(1));
        }
        let makespan = makespan_of_success(&g.job_file(&job).context("job.json")?)?;
        let mib = |kib: u64| kib as f64 / 1024.0;
        println!(
            "| {tasks} | {} × {launcher_slots} | {makespan:.1} | {:.0} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {:.2} |",
            slots / launcher_slots.max(1),
            f64::from(tasks) / makespan,
            peaks.ready,
            peaks.queue_bytes as f64 / 1048576.0,
            mib(peaks.broker_kib),
            mib(peaks.broker_kib.saturating_sub(broker_idle)),
            peaks.broker_disk.saturating_sub(disk_idle) as f64 / 1048576.0,
            mib(peaks.up_kib),
            entries_under(&g.results_dir(&job)),
            peaks.status_s,
        );
    }
    Ok(())
}
