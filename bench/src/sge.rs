//! Benchmarks on the single-host Grid Engine cell (`deploy/sge/setup.sh`)
//! and on the multi-host grid (`deploy/sge/hosts.sh`).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};
use gleaner_protocol::naming::placeholder_name;
use gleaner_testkit::{Gleaner, SgeQueues, sge, sweep, wait_for};

use crate::measure::{run_job, wait_until_serving, waits_to_start};

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

/// Hosts of the multi-host grid the benchmarks use.
const GRID_HOSTS: u32 = 3;

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
    let shapes: Vec<Shape> = [1, 2, 4, 8]
        .into_iter()
        .filter(|jobs| slots.is_multiple_of(*jobs))
        .map(|jobs| Shape {
            jobs,
            width: slots / jobs,
            pe: "make",
            request: None,
            label: String::new(),
        })
        .collect();
    let load = Load {
        config: String::new(),
        sweeps: vec![sweep("load", 100_000, "sleep 60")],
        launchers: slots,
    };
    local_delays(exe, "bench-sge-delay", &queues, &load, &shapes)
}

/// Seed 000, Table 4.2 on the multi-host grid: local jobs that need their
/// slots on one host (`-pe smp`): a whole host, two half hosts, and one-slot
/// jobs, on the grid empty and full of launchers.
pub fn hosts_local_delay(exe: &Path, host_slots: u32) -> anyhow::Result<()> {
    let queues = SgeQueues::on_nodes(1, host_slots);
    let shape = |jobs: u32, width: u32, label: &str| Shape {
        jobs,
        width,
        pe: "smp",
        request: None,
        label: label.to_owned(),
    };
    let shapes = [
        shape(1, host_slots, "a whole host"),
        shape(2, host_slots / 2, "half a host"),
        shape(host_slots, 1, "one slot"),
    ];
    let load = Load {
        config: String::new(),
        sweeps: vec![sweep("load", 100_000, "sleep 60")],
        launchers: GRID_HOSTS * host_slots,
    };
    local_delays(exe, "bench-sge-hosts-delay", &queues, &load, &shapes)
}

/// Seed 000, Table 4.2 for local jobs that wait for memory or a GPU on
/// the multi-host grid: a grid full of launchers holding every host's
/// memory, then one of GPU launchers on every GPU beside CPU launchers on
/// every other slot.
pub fn resource_delay(exe: &Path) -> anyhow::Result<()> {
    let queues = SgeQueues::on_nodes(1, 4);
    let memory = Load {
        config: String::new(),
        sweeps: vec![format!(
            "memory = \"900M\"\n{}",
            sweep("load", 100_000, "sleep 60")
        )],
        launchers: GRID_HOSTS * 4,
    };
    let wants = |request: &'static str, label: &str| Shape {
        jobs: 1,
        width: 1,
        pe: "smp",
        request: Some(request),
        label: label.to_owned(),
    };
    local_delays(
        exe,
        "bench-sge-memory-delay",
        &queues,
        &memory,
        &[wants("mem_free=3000M", "3000M of a host's 4000M")],
    )?;
    let gpus = Load {
        config: "gpus = [\"0\", \"1\"]\n".to_owned(),
        sweeps: vec![
            format!("gpus = 1\n{}", sweep("gpus", 100_000, "sleep 60")),
            sweep("cpus", 100_000, "sleep 60"),
        ],
        launchers: GRID_HOSTS * 4,
    };
    local_delays(
        exe,
        "bench-sge-gpu-delay",
        &queues,
        &gpus,
        &[wants("gpu=1", "a GPU")],
    )
}

/// How busy a GPU sweep keeps the grid's idle GPUs: its tasks' GPU-seconds
/// over the GPUs' seconds from its submission to its end.
pub fn gpu_utilisation(exe: &Path, tasks: u32, seconds: u32) -> anyhow::Result<()> {
    let queues = SgeQueues::on_nodes(1, 4);
    let queue = queues.names[0].clone();
    let mut g = Gleaner::new("bench-sge-gpu-use", exe);
    g.write(
        "gleaner.toml",
        &format!("{}gpus = [\"0\", \"1\"]\n", config(&queue)),
    );
    g.start("up", &["up"]);
    wait_until_serving(&g);
    let gpus = GRID_HOSTS * 2;
    let job = g.submit(&format!(
        "gpus = 1\n{}",
        sweep("gpus", tasks, &format!("sleep {seconds}"))
    ));
    let timeout = Duration::from_secs(u64::from(tasks * seconds / gpus + 120));
    let state = g.wait_for_end(&job, timeout);
    ensure!(state == "done", "GPU sweep {job} ended {state}");
    let file = g.job_file(&job).context("job.json")?;
    let span = (file["finished_at"].as_f64().context("finished_at")?
        - file["submitted_at"].as_f64().context("submitted_at")?)
        / 1000.0;
    let busy: f64 = g
        .index(&job)
        .iter()
        .filter_map(|t| t["runtime_s"].as_f64())
        .sum();
    println!(
        "| {tasks} × {seconds} s on {gpus} GPUs | {span:.1} | {:.1} % |",
        100.0 * busy / (f64::from(gpus) * span)
    );
    Ok(())
}

/// What fills the queue before local jobs come: sweeps, with extra keys
/// for the cluster, until `launchers` placeholders run.
struct Load {
    config: String,
    sweeps: Vec<String>,
    launchers: u32,
}

/// Local jobs of one shape: `jobs` jobs of `width` slots through `pe`,
/// asking `-l request` if given.
struct Shape {
    jobs: u32,
    width: u32,
    pe: &'static str,
    request: Option<&'static str>,
    label: String,
}

/// Each shape's waits on the empty queue, then on the queue full of a
/// sweep's launchers (all `slots` of it); one Markdown row per shape.
fn local_delays(
    exe: &Path,
    name: &str,
    queues: &SgeQueues,
    load: &Load,
    shapes: &[Shape],
) -> anyhow::Result<()> {
    let queue = queues.names[0].clone();
    let mut alone = Vec::new();
    for shape in shapes {
        alone.push(local_waits(queues, &queue, shape)?);
    }

    let mut g = Gleaner::new(name, exe);
    g.write(
        "gleaner.toml",
        &format!("{}{}", config(&queue), load.config),
    );
    g.start("up", &["up"]);
    wait_until_serving(&g);
    let jobs: Vec<String> = load.sweeps.iter().map(|s| g.submit(s)).collect();
    let names: Vec<String> = jobs.iter().map(|job| placeholder_name(job)).collect();
    let full = || {
        queues
            .jobs(&queue)
            .iter()
            .filter(|j| names.contains(&j.name) && j.state.contains('r'))
            .count() as u32
            == load.launchers
    };
    for (shape, alone) in shapes.iter().zip(&alone) {
        wait_for("gleaner to fill the queue", Duration::from_secs(120), full);
        std::thread::sleep(Duration::from_secs(3));
        let loaded = local_waits(queues, &queue, shape)?;
        let max = |w: &[f64]| w.iter().cloned().fold(0.0, f64::max);
        let mean = |w: &[f64]| w.iter().sum::<f64>() / w.len() as f64;
        let label = match shape.label.as_str() {
            "" => String::new(),
            label => format!(" ({label})"),
        };
        println!(
            "| {} × {}{label} | {:.2} | {:.2} | {:.2} | {:.2} |",
            shape.jobs,
            shape.width,
            max(alone),
            max(&loaded),
            mean(&loaded) - mean(alone),
            max(&loaded) - max(alone),
        );
    }
    for job in &jobs {
        g.run(&["cancel", job]);
    }
    Ok(())
}

/// Submits a shape's local jobs running `sleep 10`; returns how long each
/// waited to start (seconds). The jobs are removed once started.
fn local_waits(queues: &SgeQueues, queue: &str, shape: &Shape) -> anyhow::Result<Vec<f64>> {
    let mut submitted = Vec::new();
    let width = shape.width.to_string();
    for _ in 0..shape.jobs {
        let mut args = vec!["-N", "local", "-q", queue];
        if shape.width > 1 {
            args.extend(["-pe", shape.pe, &width]);
        }
        if let Some(request) = shape.request {
            args.extend(["-l", request]);
        }
        args.extend(["-b", "y", "/bin/sleep", "10"]);
        submitted.push((qsub(&args)?, Instant::now()));
    }
    let waits = waits_to_start(&submitted, || {
        queues
            .jobs(queue)
            .into_iter()
            .filter(|j| j.state.contains('r'))
            .map(|j| j.number)
            .collect()
    })?;
    let numbers: Vec<&str> = submitted.iter().map(|(n, _)| n.as_str()).collect();
    sge("qdel", &numbers);
    wait_for("the local jobs to go", Duration::from_secs(60), || {
        queues
            .jobs(queue)
            .iter()
            .all(|j| !numbers.contains(&j.number.as_str()))
    });
    Ok(waits)
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
        let started: f64 = g
            .stdout(&job, 0)
            .context("the component's output")?
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

/// No-op tasks through Grid Engine placeholders on the multi-host grid,
/// with single-slot launchers and with one launcher per host.
pub fn throughput(exe: &Path, tasks: u32, host_slots: u32) -> anyhow::Result<()> {
    for launcher_slots in [1, host_slots] {
        let queues = SgeQueues::on_nodes(1, host_slots);
        let mut g = Gleaner::new(&format!("bench-sge-throughput-{launcher_slots}"), exe);
        g.write(
            "gleaner.toml",
            &format!(
                "{}launcher_slots = {launcher_slots}\n",
                config(&queues.names[0])
            ),
        );
        g.start("up", &["up"]);
        wait_until_serving(&g);
        let (makespan, _) = run_job(&g, &sweep("noop", tasks, "true"))?;
        let slots = GRID_HOSTS * host_slots;
        println!(
            "| {} × {launcher_slots} | {GRID_HOSTS} × {host_slots} | {tasks} | {makespan:.2} | {:.0} |",
            slots / launcher_slots,
            f64::from(tasks) / makespan,
        );
    }
    Ok(())
}
