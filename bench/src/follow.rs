//! `gleaner logs --follow`: how long a line a task prints takes to reach
//! its follower's terminal, through the launcher, the broker, the job's
//! runner and the broker again. The task prints the time (ns since the
//! epoch) every tenth of a second; the follower subtracts it from the time
//! each line arrives (one machine, one clock), for the lines printed
//! after the follower started.

use std::{
    io::{BufRead, BufReader},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::ensure;
use gleaner_testkit::Gleaner;

use crate::measure::wait_until_serving;

/// Lines the task prints.
const LINES: u32 = 300;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The `q`-th quantile of sorted samples.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(at).copied().unwrap_or(f64::NAN)
}

pub fn follow(exe: &std::path::Path, slots: u32) -> anyhow::Result<()> {
    let mut g = Gleaner::new("bench-follow", exe);
    g.up(slots);
    wait_until_serving(&g);
    let manifest = format!(
        "name = \"followed\"\n[[task]]\ncommand = \"for i in $(seq {LINES}); do date +%s%N; sleep 0.1; done\"\n"
    );
    let job = g.submit(&manifest);
    // Following a task that already runs: the first line's wait includes
    // the CLI's start and the follow's way to the launcher.
    let running = Instant::now();
    while g.index(&job).is_empty() && g.job_state(&job).as_deref() != Some("running") {
        ensure!(
            running.elapsed() < Duration::from_secs(60),
            "job {job} never ran"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let (asked, asked_ns) = (Instant::now(), now_ns());
    let mut follower = g.client(&["logs", &job, "0", "--follow"]);
    let Some(out) = follower.stdout.take() else {
        let _ = follower.kill();
        follower.wait()?;
        anyhow::bail!("the follower has no stdout");
    };
    let mut first = None;
    let mut latencies = Vec::new();
    for line in BufReader::new(out).lines() {
        let arrived = now_ns();
        first.get_or_insert_with(|| asked.elapsed().as_secs_f64());
        // Lines printed before the follow come at once, late: not counted.
        if let Ok(printed) = line?.trim().parse::<u128>()
            && printed >= asked_ns
        {
            latencies.push(arrived.saturating_sub(printed) as f64 / 1e6);
        }
    }
    ensure!(follower.wait()?.success(), "the follower failed");
    ensure!(
        latencies.len() > 10,
        "only {} lines followed",
        latencies.len()
    );
    latencies.sort_by(f64::total_cmp);
    println!(
        "| {} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} |",
        latencies.len(),
        first.unwrap_or(f64::NAN),
        quantile(&latencies, 0.5),
        quantile(&latencies, 0.95),
        quantile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN),
    );
    Ok(())
}
