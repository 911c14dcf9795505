//! The scheduler service at grid scale over the real broker: every cluster
//! reports each second, every job at the runners' heartbeat. How long a
//! message waits in the scheduler's inbox, and what the scheduler costs.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use gleaner_broker::{
    Broker,
    topology::{self, JobQueues, SCHEDULER_QUEUE},
};
use gleaner_manifest::{JobId, JobKind};
use gleaner_protocol::SchedulerMsg;
use gleaner_testkit::Gleaner;
use lapin::{
    options::QueueDeclareOptions,
    types::{AMQPValue, FieldTable},
};

use crate::{decide, measure};

/// Messages go out in this many slices a second, as reports arrive spread
/// over the second from independent clusters and runners.
const SLICES: u32 = 20;

/// How often the inbox's depth is read.
const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// Runs the load against the scheduler of each `(label, gleaner binary)`.
pub fn lag(
    builds: &[(&str, &Path)],
    clusters: usize,
    jobs: usize,
    job_report: Duration,
    seconds: u64,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    for (label, exe) in builds {
        let mut g = Gleaner::new("bench-inbox", *exe);
        let pid = g.start("scheduler", &["scheduler"]);
        let row = runtime.block_on(drive(&g, pid, clusters, jobs, job_report, seconds))?;
        println!("| {label} {row}");
    }
    Ok(())
}

async fn drive(
    g: &Gleaner,
    pid: u32,
    clusters: usize,
    jobs: usize,
    job_report: Duration,
    seconds: u64,
) -> anyhow::Result<String> {
    let broker = Broker::new(&[g.vhost.url()], "bench")?;
    let connection = broker.connect().await?;
    let channel = connection.channel().await?;
    topology::declare_core(connection.lapin()).await?;
    let ids: Vec<JobId> = (0..jobs).map(|i| JobId::new("sweep", i as u64)).collect();
    // The runners' control queues, where the offers go: bounded, nobody reads them.
    let mut bounded = FieldTable::default();
    bounded.insert("x-max-length".into(), AMQPValue::LongLongInt(16));
    for id in &ids {
        let queue = JobQueues::new(id).control;
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::default(),
                bounded.clone(),
            )
            .await?;
    }
    let publisher = connection.publisher().await?;
    let updates: Vec<SchedulerMsg> = ids
        .iter()
        .map(|id| SchedulerMsg::JobUpdate(decide::report(id.clone(), JobKind::Scavenge, vec![])))
        .collect();
    let reports: Vec<SchedulerMsg> = (0..clusters)
        .map(|c| SchedulerMsg::ClusterStatus(decide::cluster_report(c, &ids)))
        .collect();
    publisher.send_all(SCHEDULER_QUEUE, &updates).await?;
    wait_until_read(&channel, 0).await?;
    // Each slice of a second: a share of the clusters' reports and of the
    // jobs' (each job reports once per `job_report`).
    let slices = (job_report.as_secs_f64() * f64::from(SLICES))
        .round()
        .max(1.0) as usize;
    let per_slice = |all: &[SchedulerMsg], n: usize, slice: usize| -> Vec<SchedulerMsg> {
        all.iter().skip(slice % n).step_by(n).cloned().collect()
    };
    let started = Instant::now();
    let cpu_before = measure::cpu(pid).own;
    let mut sent: Vec<(Instant, u64)> = Vec::new();
    let mut read: Vec<(Instant, u64)> = Vec::new();
    let mut total = 0u64;
    let mut max_depth = 0u32;
    let slice_length = Duration::from_secs(1) / SLICES;
    let mut next_slice = started;
    let mut next_sample = started;
    let mut slice = 0usize;
    while started.elapsed() < Duration::from_secs(seconds) {
        if Instant::now() >= next_slice {
            let mut mail = per_slice(&reports, SLICES as usize, slice);
            mail.extend(per_slice(&updates, slices, slice));
            slice += 1;
            next_slice += slice_length;
            publisher.send_all(SCHEDULER_QUEUE, &mail).await?;
            total += mail.len() as u64;
            sent.push((Instant::now(), total));
        }
        if Instant::now() >= next_sample {
            next_sample += SAMPLE_EVERY;
            let depth = depth(&channel).await?;
            max_depth = max_depth.max(depth);
            read.push((Instant::now(), total.saturating_sub(u64::from(depth))));
        }
        tokio::time::sleep_until(next_slice.min(next_sample).into()).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = measure::cpu(pid).own - cpu_before;
    // Until every message sent has been read, so that each has a lag, or
    // for a minute: a scheduler that fell behind may never catch up.
    let deadline = Instant::now() + Duration::from_secs(60);
    while read.last().is_none_or(|(_, n)| *n < total) && Instant::now() < deadline {
        tokio::time::sleep(SAMPLE_EVERY).await;
        let depth = depth(&channel).await?;
        read.push((Instant::now(), total.saturating_sub(u64::from(depth))));
    }
    let unread = total.saturating_sub(read.last().map_or(0, |(_, n)| *n));
    let oldest_unread = sent
        .iter()
        .find(|(_, n)| *n > total - unread)
        .map(|(at, _)| at.elapsed().as_secs_f64());
    connection.close().await;
    let mut lags = lags(&sent, &read);
    // Slices never read wait longer than the oldest of them has so far.
    lags.resize(sent.len(), f64::INFINITY);
    lags.sort_by(f64::total_cmp);
    let at = |q: f64| match lags.get(((lags.len() as f64 - 1.0) * q) as usize) {
        Some(lag) if lag.is_finite() => format!("{lag:.2}"),
        _ => format!("> {:.0}", oldest_unread.unwrap_or(f64::NAN)),
    };
    let mut lag = format!("{} / {} / {}", at(0.5), at(0.99), at(1.0));
    if unread > 0 {
        lag.push_str(&format!(" ({unread} never read)"));
    }
    Ok(format!(
        "| {clusters} | {jobs} | {:.0} | {lag} | {max_depth} | {:.0} % |",
        total as f64 / elapsed,
        100.0 * cpu / elapsed,
    ))
}

/// Messages ready in the scheduler's inbox (not counting the few hundred
/// it has taken and not yet acknowledged).
async fn depth(channel: &lapin::Channel) -> anyhow::Result<u32> {
    let queue = channel
        .queue_declare(
            SCHEDULER_QUEUE.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok(queue.message_count())
}

async fn wait_until_read(channel: &lapin::Channel, left: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while depth(channel).await? > left {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the scheduler does not read its inbox"
        );
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    Ok(())
}

/// Each slice's wait in the inbox: from when the broker had its last
/// message until the scheduler had read that far.
fn lags(sent: &[(Instant, u64)], read: &[(Instant, u64)]) -> Vec<f64> {
    let mut reads = read.iter().peekable();
    sent.iter()
        .filter_map(|(at, n)| {
            while reads.peek().is_some_and(|(_, r)| r < n) {
                reads.next();
            }
            reads
                .peek()
                .map(|(t, _)| t.saturating_duration_since(*at).as_secs_f64())
        })
        .collect()
}
