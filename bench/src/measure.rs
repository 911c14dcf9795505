//! The measurements. Every figure comes from real processes: the makespan
//! from the job's own `job.json`, CPU and memory from `/proc`.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};
use gleaner_protocol::{
    ClusterName,
    naming::{LAUNCHER_SUBCOMMAND, LauncherArgs, launcher_id},
};
use gleaner_testkit::{Gleaner, sweep, wait_for};

const TIMEOUT: Duration = Duration::from_secs(900);

/// CPU seconds of a process: its own, and that of its reaped children.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    pub own: f64,
    pub children: f64,
}

pub fn cpu(pid: u32) -> Cpu {
    let stat = i32::try_from(pid)
        .ok()
        .and_then(|pid| procfs::process::Process::new(pid).ok())
        .and_then(|process| process.stat().ok());
    let Some(stat) = stat else {
        return Cpu::default();
    };
    let tick = procfs::ticks_per_second() as f64;
    Cpu {
        own: (stat.utime + stat.stime) as f64 / tick,
        children: (stat.cutime + stat.cstime) as f64 / tick,
    }
}

/// Resident memory in KiB: all of it, and the private (anonymous) part that
/// is not shared with other processes running the same binary.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("Rss:"), field("Anonymous:"))
}

/// The local broker: a `beam.smp` in this network namespace (the test
/// hosts' nodes run in their own).
pub fn broker_pid() -> Option<u32> {
    let output = Command::new("pgrep").arg("beam.smp").output().ok()?;
    let here = std::fs::read_link("/proc/self/ns/net").ok()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .find(|pid: &u32| {
            std::fs::read_link(format!("/proc/{pid}/ns/net")).ok() == Some(here.clone())
        })
}

/// Waits until the services serve: the scheduler answers and knows a cluster.
pub fn wait_until_serving(g: &Gleaner) {
    wait_for("gleaner up to serve", Duration::from_secs(60), || {
        g.status()
            .is_some_and(|s| s["clusters"].as_array().is_some_and(|c| !c.is_empty()))
    });
}

/// Runs a job to its end; returns (makespan in seconds, job.json).
pub fn run_job(g: &Gleaner, manifest: &str) -> anyhow::Result<(f64, serde_json::Value)> {
    run_job_within(g, manifest, TIMEOUT)
}

/// As [`run_job`], for a job that may take longer than the usual timeout.
fn run_job_within(
    g: &Gleaner,
    manifest: &str,
    timeout: Duration,
) -> anyhow::Result<(f64, serde_json::Value)> {
    let job = g.submit(manifest);
    let state = g.wait_for_end(&job, timeout);
    ensure!(state == "done", "job {job} ended {state}");
    let file = g.job_file(&job).context("job.json")?;
    Ok((makespan_of_success(&file)?, file))
}

/// The makespan in a `job.json` whose every task succeeded.
pub fn makespan_of_success(file: &serde_json::Value) -> anyhow::Result<f64> {
    let t = &file["tasks"];
    ensure!(
        t["succeeded"] == t["total"],
        "not every task succeeded: {t}"
    );
    file["makespan_s"].as_f64().context("makespan")
}

pub fn makespan(
    exe: &Path,
    tasks: u32,
    slots: u32,
    seconds: f64,
    bundle: Option<u32>,
) -> anyhow::Result<()> {
    let mut g = Gleaner::new("bench-makespan", exe);
    g.up(slots);
    wait_until_serving(&g);
    let manifest = format!(
        "{}{}",
        bundle_key(bundle),
        sweep("makespan", tasks, &format!("sleep {seconds}"))
    );
    let ideal = f64::from(tasks) * seconds / f64::from(slots);
    // A million short tasks take hours: the usual timeout plus twice the ideal.
    let timeout = TIMEOUT + Duration::from_secs_f64(2.0 * ideal);
    let (makespan, _) = run_job_within(&g, &manifest, timeout)?;
    println!(
        "| {tasks} × `sleep {seconds}` | {slots} | {} | {ideal:.1} | {makespan:.2} | {:.3} |",
        bundle_label(bundle),
        makespan / ideal
    );
    Ok(())
}

/// A manifest's `bundle` line: none for the runner's own bundles.
fn bundle_key(bundle: Option<u32>) -> String {
    bundle.map_or_else(String::new, |n| format!("bundle = {n}\n"))
}

/// How a table names a bundle setting.
pub fn bundle_label(bundle: Option<u32>) -> String {
    bundle.map_or_else(|| "auto".to_owned(), |n| n.to_string())
}

/// One throughput run: `command` runs each task (`/usr/bin/true` directly,
/// `/usr/bin/true;` through the shell, as a command with shell syntax
/// does), `bundle` tasks to a message (unset: the runner's own bundles).
pub struct Throughput<'a> {
    pub tasks: u32,
    pub launchers: u32,
    pub launcher_slots: u32,
    pub command: &'a str,
    pub bundle: Option<u32>,
}

/// Runs one row; returns its tasks per second.
pub fn throughput(exe: &Path, run: &Throughput<'_>) -> anyhow::Result<f64> {
    let Throughput {
        tasks,
        launchers,
        launcher_slots,
        command,
        bundle,
    } = *run;
    let mut g = Gleaner::new(&format!("bench-throughput-{launchers}"), exe);
    let slots = launchers * launcher_slots;
    g.write(
        "gleaner.toml",
        &format!(
            "[[cluster]]\nname = \"bench\"\nbackend = \"local\"\nslots = {slots}\nlauncher_slots = {launcher_slots}\n"
        ),
    );
    let up = g.start("up", &["up"]);
    wait_until_serving(&g);
    let broker = broker_pid().context("no beam.smp process: is RabbitMQ local?")?;
    let (broker_before, up_before) = (cpu(broker), cpu(up));
    let manifest = format!("{}{}", bundle_key(bundle), sweep("noop", tasks, command));
    let (makespan, file) = run_job(&g, &manifest)?;
    let job = file["job"].as_str().unwrap_or_default().to_owned();
    // Launchers leave once the job is over; then their CPU counts as up's children.
    wait_for("the launchers to leave", Duration::from_secs(30), || {
        g.launchers(&job).is_empty()
    });
    std::thread::sleep(Duration::from_millis(1500));
    let (broker_after, up_after) = (cpu(broker), cpu(up));
    let per_k = 1000.0 / f64::from(tasks);
    let rate = f64::from(tasks) / makespan;
    println!(
        "| {launchers} × {launcher_slots} | `{command}` | {} | {tasks} | {makespan:.2} | {rate:.0} | {:.2} | {:.2} | {:.2} |",
        bundle_label(bundle),
        (broker_after.own - broker_before.own) * per_k,
        (up_after.own - up_before.own) * per_k,
        (up_after.children - up_before.children) * per_k,
    );
    Ok(rate)
}

/// The floor: how fast this machine can start and reap `/usr/bin/true`
/// (what the direct and bundled rows run) and `sh -c true` (the rows
/// through a shell), one and two at a time. Returns the `/usr/bin/true`
/// rate two at a time: the ceiling of a 2-core machine.
pub fn spawn_rate(duration: Duration) -> anyhow::Result<f64> {
    let mut ceiling = 0.0;
    let programs: [(&str, &[&str]); 2] = [("/usr/bin/true", &[]), ("/bin/sh", &["-c", "true"])];
    for (program, args) in programs {
        for parallel in [1, 2] {
            let started = Instant::now();
            let before = cpu(std::process::id());
            let counts: Vec<u64> = std::thread::scope(|scope| {
                let workers: Vec<_> = (0..parallel)
                    .map(|_| {
                        scope.spawn(|| {
                            let mut n = 0u64;
                            while started.elapsed() < duration {
                                let ok = Command::new(program)
                                    .args(args)
                                    .status()
                                    .is_ok_and(|s| s.success());
                                n += u64::from(ok);
                            }
                            n
                        })
                    })
                    .collect();
                workers.into_iter().map(|w| w.join().unwrap_or(0)).collect()
            });
            let spawned: u64 = counts.iter().sum();
            let after = cpu(std::process::id());
            let cpu_ms = (after.own + after.children - before.own - before.children) * 1000.0;
            let what = [program]
                .into_iter()
                .chain(args.iter().copied())
                .collect::<Vec<_>>()
                .join(" ");
            let rate = spawned as f64 / started.elapsed().as_secs_f64();
            if program == "/usr/bin/true" {
                ceiling = f64::max(ceiling, rate);
            }
            println!(
                "spawn floor: {parallel} at a time: {rate:.0} `{what}`/s, {:.2} ms CPU each",
                cpu_ms / spawned as f64,
            );
        }
    }
    Ok(ceiling)
}

pub fn memory(exe: &Path, tasks: u32) -> anyhow::Result<()> {
    let mut g = Gleaner::new("bench-memory", exe);
    let up = g.up(0);
    wait_until_serving(&g);
    let empty = memory_kib(up);
    let big = g.submit(&sweep("pending", tasks, "true"));
    wait_for(
        "the tasks to be published",
        Duration::from_secs(120),
        || g.job_state(&big).as_deref() == Some("running"),
    );
    std::thread::sleep(Duration::from_secs(3));
    let pending = memory_kib(up);

    // An idle launcher: connected and consuming, with nothing to run.
    let small = g.submit(&sweep("one", 1, "sleep 60"));
    wait_for("the small job's queues", Duration::from_secs(60), || {
        g.job_state(&small).as_deref() == Some("running")
    });
    let cluster = ClusterName::from("bench");
    let launcher = |name: &str| -> Vec<String> {
        let id = launcher_id(&cluster, name);
        let args = LauncherArgs {
            job: &small,
            cluster: cluster.as_str(),
            id: id.as_str(),
            slot: "0",
            slots: 1,
            task_slots: 1,
            task_needs: Default::default(),
            gpu_devices: &[],
            gpu_claims: &[],
            walltime: None,
            ends_at: None,
        };
        [vec![LAUNCHER_SUBCOMMAND.to_owned()], args.to_vec()].concat()
    };
    let (busy, idle) = (launcher("busy"), launcher("idle"));
    let busy = g.start("busy", &busy.iter().map(String::as_str).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_secs(2));
    let idle = g.start_with(
        "idle",
        &idle.iter().map(String::as_str).collect::<Vec<_>>(),
        &[("GLEANER_LAUNCHER__IDLE_TIMEOUT", "10m")],
    );
    std::thread::sleep(Duration::from_secs(3));
    let row = |what: &str, (rss, private): (u64, u64)| println!("| {what} | {rss} | {private} |");
    row("`gleaner up`, no job", empty);
    row(&format!("`gleaner up`, {tasks} pending tasks"), pending);
    row("launcher, idle", memory_kib(idle));
    row("launcher, running `sleep 60`", memory_kib(busy));

    // A hostile user's submissions: each a list of 9.9 million one-byte
    // items (9.9 MB as sent), held by the runner while they wait for slots.
    let items = 9_900_000;
    let hostile = format!(
        "name = \"items\"\n[sweep]\ncommand = \"true {{x}}\"\nparams = {{ x = [{}] }}\n",
        "1,".repeat(items)
    );
    let before = memory_kib(up);
    let jobs: Vec<String> = (0..2).map(|_| g.submit(&hostile)).collect();
    wait_for(
        "the hostile submissions to run",
        Duration::from_secs(300),
        || {
            jobs.iter()
                .all(|job| g.job_state(job).as_deref() == Some("running"))
        },
    );
    std::thread::sleep(Duration::from_secs(3));
    let after = memory_kib(up);
    row(
        "`gleaner up`, two submissions of 9.9 M one-byte list items",
        after,
    );
    let sent = 2.0 * items as f64 / 1024.0;
    println!(
        "| added, per byte sent | {:.2} | {:.2} |",
        after.0.saturating_sub(before.0) as f64 / sent,
        after.1.saturating_sub(before.1) as f64 / sent
    );
    Ok(())
}

/// How long each of the `submitted` batch jobs (id, submitted at) waited
/// until `running` (the ids running now, read every 100 ms) showed it, in
/// seconds; two minutes at most.
pub fn waits_to_start(
    submitted: &[(String, Instant)],
    mut running: impl FnMut() -> Vec<String>,
) -> anyhow::Result<Vec<f64>> {
    let mut waits = vec![None; submitted.len()];
    let deadline = Instant::now() + Duration::from_secs(120);
    while waits.iter().any(Option::is_none) {
        ensure!(Instant::now() < deadline, "local jobs did not start");
        let running = running();
        for ((id, at), wait) in submitted.iter().zip(waits.iter_mut()) {
            if wait.is_none() && running.contains(id) {
                *wait = Some(at.elapsed().as_secs_f64());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    waits.into_iter().map(|w| w.context("wait")).collect()
}

/// The broker's socket limit (`rabbitmqctl status`): each launcher holds a
/// connection, so the largest runs need a broker started with more.
fn broker_socket_limit() -> Option<u32> {
    let output = Command::new("rabbitmqctl").arg("status").output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("Sockets:"))?;
    line.rsplit("limit:").next()?.trim().parse().ok()
}

/// `n` single-slot launchers of one job, each running a task that sleeps:
/// the CPU and memory of the runner, of the scheduler and kcm, and of the
/// broker over `window`, per launcher. The services run as separate
/// processes, as deployed, so the runner's share is its own.
pub fn launcher_scale(
    exe: &Path,
    counts: &[u32],
    window: Duration,
    heartbeat: Duration,
) -> anyhow::Result<()> {
    let limit = broker_socket_limit();
    for &n in counts {
        if limit.is_some_and(|limit| n + 20 > limit) {
            println!(
                "| {n} | skipped: the broker allows {} sockets ||||||||",
                limit.unwrap_or(0)
            );
            continue;
        }
        let mut g = Gleaner::new(&format!("bench-scale-{n}"), exe);
        g.write(
            "gleaner.toml",
            &format!(
                "[[cluster]]\nname = \"bench\"\nbackend = \"local\"\nslots = {n}\nlauncher_slots = 1\n"
            ),
        );
        // The deployed heartbeats, not the tests' quick ones.
        let beat = humantime::format_duration(heartbeat).to_string();
        let env = [
            ("GLEANER_LAUNCHER__HEARTBEAT", beat.as_str()),
            ("GLEANER_RUNNER__HEARTBEAT", "2s"),
        ];
        let scheduler = g.start_with("scheduler", &["scheduler"], &env);
        let runner = g.start_with("runner", &["runner"], &env);
        let kcm = g.start_with("kcm", &["kcm", "--cluster", "bench"], &env);
        wait_until_serving(&g);
        let broker = broker_pid().context("no beam.smp process: is RabbitMQ local?")?;
        let broker_idle = memory_kib(broker).0;
        let job = g.submit(&sweep("asleep", n, "sleep 3600"));
        wait_for("every launcher running its task", TIMEOUT, || {
            g.job_file(&job)
                .is_some_and(|f| f["tasks"]["running"].as_u64() == Some(u64::from(n)))
        });
        // Start-up is over: what follows is the steady cost.
        std::thread::sleep(Duration::from_secs(5));
        let own = |pids: &[u32]| pids.iter().map(|&p| cpu(p).own).sum::<f64>();
        let before = (own(&[runner]), own(&[scheduler, kcm]), own(&[broker]));
        std::thread::sleep(window);
        let after = (own(&[runner]), own(&[scheduler, kcm]), own(&[broker]));
        let seconds = window.as_secs_f64();
        let per_k = 1000.0 / f64::from(n);
        let runner_core = 100.0 * (after.0 - before.0) / seconds;
        let services_core = 100.0 * (after.1 - before.1) / seconds;
        let broker_core = 100.0 * (after.2 - before.2) / seconds;
        let runner_mib = memory_kib(runner).0 / 1024;
        let broker_kib = memory_kib(broker).0.saturating_sub(broker_idle);
        println!(
            "| {n} | {runner_core:.1} % | {:.2} % | {services_core:.1} % | {:.2} % | {broker_core:.1} % | {:.1} % | {runner_mib} | {} | {:.0} |",
            runner_core * per_k,
            services_core * per_k,
            broker_core * per_k,
            broker_kib / 1024,
            broker_kib as f64 / f64::from(n),
        );
        g.run(&["cancel", &job]);
        g.wait_for_end(&job, TIMEOUT);
        wait_for("the launchers to leave", TIMEOUT, || {
            g.launchers(&job).is_empty()
        });
    }
    Ok(())
}
