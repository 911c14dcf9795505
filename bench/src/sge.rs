//! Benchmarks on the single-host Grid Engine cell (`deploy/sge/setup.sh`).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};
use gleaner_protocol::naming::placeholder_name;
use gleaner_testkit::{Gleaner, SgeQueues, sge, wait_for};

use crate::measure::{run_job, sweep, wait_until_serving};

const POLL: Duration = Duration::from_millis(100);

fn qsub(args: &[&str]) -> anyhow::Result<String> {
    let answer = sge(
        "qsub",
        &[&["-terse", "-o", "/dev/null", "-e", "/dev/null"], args].concat(),
    );
    let number = answer.trim().split('.').next().unwrap_or("").to_owned();
    ensure!(number.parse::<u64>().is_ok(), "qsub answered {answer:?}");
    Ok(number)
}

fn config(queue: &str) -> String {
    format!(
        "[[cluster]]\nname = \"bench\"\nbackend = \"sge\"\nqueue = \"{queue}\"\nh_rt = \"1h\"\n"
    )
}

/// Seed 000, Table 4.1: the same tasks through gleaner's launchers and by one
/// `qsub` per task, on one queue.
pub fn launchers_vs_direct(exe: &Path, tasks: u32, slots: u32, seconds: u32) -> anyhow::Result<()> {
    let queues = SgeQueues::new(1, slots);
    let queue = &queues.names[0];
    let ideal = f64::from(tasks * seconds) / f64::from(slots);

    let started = Instant::now();
    let sleep = seconds.to_string();
    for _ in 0..tasks {
        qsub(&["-N", "direct", "-q", queue, "-b", "y", "/bin/sleep", &sleep])?;
    }
    while !queues.jobs(queue).is_empty() {
        std::thread::sleep(POLL);
    }
    let direct = started.elapsed().as_secs_f64();

    let mut g = Gleaner::new("bench-sge-launchers", exe);
    g.write("gleaner.toml", &config(queue));
    g.start("up", &["up"]);
    wait_until_serving(&g);
    let (gleaner, _) = run_job(&g, &sweep("launchers", tasks, &format!("sleep {seconds}")))?;

    let row = |how: &str, makespan: f64| {
        println!(
            "| {how} | {tasks} × `sleep {seconds}` | {slots} | {ideal:.1} | {makespan:.2} | {:.3} |",
            makespan / ideal
        );
    };
    row("one `qsub` per task", direct);
    row("gleaner launchers", gleaner);
    Ok(())
}

/// Seed 000, Table 4.2: how long local jobs of each shape wait for an 8-slot
/// queue, empty and full of gleaner launchers.
pub fn local_delay(exe: &Path, slots: u32) -> anyhow::Result<()> {
    let queues = SgeQueues::new(1, slots);
    let queue = queues.names[0].clone();
    let shapes: Vec<(u32, u32)> = [1, 2, 4, 8]
        .into_iter()
        .filter(|jobs| slots.is_multiple_of(*jobs))
        .map(|jobs| (jobs, slots / jobs))
        .collect();

    let mut alone = Vec::new();
    for &(jobs, width) in &shapes {
        alone.push(local_waits(&queues, &queue, jobs, width)?);
    }

    let mut g = Gleaner::new("bench-sge-delay", exe);
    g.write("gleaner.toml", &config(&queue));
    g.start("up", &["up"]);
    wait_until_serving(&g);
    let job = g.submit(&sweep("load", 100_000, "sleep 60"));
    let full = || {
        queues
            .jobs(&queue)
            .iter()
            .filter(|j| j.name == placeholder_name(&job) && j.state.contains('r'))
            .count() as u32
            == slots
    };
    for (&(jobs, width), alone) in shapes.iter().zip(&alone) {
        wait_for("gleaner to fill the queue", Duration::from_secs(120), full);
        std::thread::sleep(Duration::from_secs(3));
        let loaded = local_waits(&queues, &queue, jobs, width)?;
        let max = |w: &[f64]| w.iter().cloned().fold(0.0, f64::max);
        let mean = |w: &[f64]| w.iter().sum::<f64>() / w.len() as f64;
        println!(
            "| {jobs} × {width} | {:.2} | {:.2} | {:.2} | {:.2} |",
            max(alone),
            max(&loaded),
            mean(&loaded) - mean(alone),
            max(&loaded) - max(alone),
        );
    }
    g.run(&["cancel", &job]);
    Ok(())
}

/// Submits `jobs` local jobs of `width` slots running `sleep 10`; returns how
/// long each waited to start (seconds). The jobs are removed once started.
fn local_waits(queues: &SgeQueues, queue: &str, jobs: u32, width: u32) -> anyhow::Result<Vec<f64>> {
    let mut submitted = Vec::new();
    for _ in 0..jobs {
        let mut args = vec!["-N", "local", "-q", queue];
        let width_arg = width.to_string();
        if width > 1 {
            args.extend(["-pe", "make", &width_arg]);
        }
        args.extend(["-b", "y", "/bin/sleep", "10"]);
        submitted.push((qsub(&args)?, Instant::now()));
    }
    let mut waits = vec![None; submitted.len()];
    let deadline = Instant::now() + Duration::from_secs(120);
    while waits.iter().any(Option::is_none) {
        ensure!(Instant::now() < deadline, "local jobs did not start");
        let running: Vec<String> = queues
            .jobs(queue)
            .into_iter()
            .filter(|j| j.state.contains('r'))
            .map(|j| j.number)
            .collect();
        for ((number, at), wait) in submitted.iter().zip(waits.iter_mut()) {
            if wait.is_none() && running.contains(number) {
                *wait = Some(at.elapsed().as_secs_f64());
            }
        }
        std::thread::sleep(POLL);
    }
    let numbers: Vec<&str> = submitted.iter().map(|(n, _)| n.as_str()).collect();
    sge("qdel", &numbers);
    wait_for("the local jobs to go", Duration::from_secs(60), || {
        queues
            .jobs(queue)
            .iter()
            .all(|j| !numbers.contains(&j.number.as_str()))
    });
    waits.into_iter().map(|w| w.context("wait")).collect()
}

/// How long a grid job needing a whole queue waits to start, on an empty
/// queue and on one full of gleaner launchers that must shrink for it.
pub fn grid_delay(exe: &Path, slots: u32, runs: u32) -> anyhow::Result<()> {
    let queues = SgeQueues::new(1, slots);
    let queue = queues.names[0].clone();
    let mut g = Gleaner::new("bench-sge-grid", exe);
    g.write("gleaner.toml", &config(&queue));
    g.start("up", &["up"]);
    wait_until_serving(&g);
    // The component prints when it started (ms since the epoch).
    let grid = format!(
        "name = \"rigid\"\nkind = \"grid\"\npriority = \"high\"\n[[component]]\nslots = {slots}\ncommand = \"date +%s%3N; sleep 2\"\n"
    );
    let wait = |g: &Gleaner| -> anyhow::Result<f64> {
        let job = g.submit(&grid);
        let state = g.wait_for_end(&job, Duration::from_secs(120));
        ensure!(state == "done", "grid job {job} ended {state}");
        let file = g.job_file(&job).context("job.json")?;
        let submitted = file["submitted_at"].as_f64().context("submitted_at")?;
        let started: f64 = std::fs::read_to_string(g.results_dir(&job).join("tasks/0/stdout"))?
            .trim()
            .parse()
            .context("component start time")?;
        Ok((started - submitted) / 1000.0)
    };
    let mut alone = Vec::new();
    for _ in 0..runs {
        alone.push(wait(&g)?);
    }
    let load = g.submit(&sweep("load", 100_000, "sleep 60"));
    let mut loaded = Vec::new();
    for _ in 0..runs {
        wait_for(
            "gleaner to fill the queue",
            Duration::from_secs(120),
            || {
                queues
                    .jobs(&queue)
                    .iter()
                    .filter(|j| j.name == placeholder_name(&load) && j.state.contains('r'))
                    .count() as u32
                    == slots
            },
        );
        std::thread::sleep(Duration::from_secs(3));
        loaded.push(wait(&g)?);
    }
    g.run(&["cancel", &load]);
    let mean = |w: &[f64]| w.iter().sum::<f64>() / w.len() as f64;
    let max = |w: &[f64]| w.iter().cloned().fold(0.0, f64::max);
    println!(
        "| {slots} slots of {slots} | {runs} | {:.2} ({:.2}) | {:.2} ({:.2}) | {:.2} |",
        mean(&alone),
        max(&alone),
        mean(&loaded),
        max(&loaded),
        mean(&loaded) - mean(&alone),
    );
    Ok(())
}
