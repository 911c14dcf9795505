//! gleaner's benchmarks. Each one starts real gleaner processes (the release
//! build next to this binary) on a vhost of its own and prints Markdown for
//! BENCHMARKS.md. Run them with `bench/run.sh` on an otherwise idle machine.

mod chaos;
mod decide;
mod fairness;
mod figures;
mod follow;
mod hq;
mod inbox;
mod measure;
mod rounds;
mod scale;
mod seed000;
mod seed004;
mod sge;
mod slurm;
mod trace;

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Fixed-length tasks on a local cluster: makespan against the ideal.
    Makespan {
        #[arg(long, default_value_t = 400)]
        tasks: u32,
        #[arg(long, default_value_t = 8)]
        slots: u32,
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// Tasks per message (unset: the runner's own bundles).
        #[arg(long)]
        bundle: Option<u32>,
    },
    /// No-op tasks end to end through 1, 2 and 4 launchers.
    Throughput {
        #[arg(long, default_value_t = 20_000)]
        tasks: u32,
        /// Slots of each launcher.
        #[arg(long, default_value_t = 1)]
        launcher_slots: u32,
        /// Launchers of each run.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        launchers: Vec<u32>,
        /// Tasks per message of the bundled runs.
        #[arg(long, default_value_t = 32)]
        bundle: u32,
        /// Only the runs with the runner's own bundles and with `bundle`.
        #[arg(long)]
        bundled_only: bool,
        /// Rounds, each in a rotated order; more than one prints medians.
        #[arg(long, default_value_t = 1)]
        rounds: u32,
    },
    /// No-op sweeps of each size through `gleaner up`: broker memory,
    /// queue and disk, the services' memory and the files made, at their
    /// peaks.
    Scale {
        #[arg(long, value_delimiter = ',', default_value = "20000,1000000")]
        tasks: Vec<u32>,
        #[arg(long, default_value_t = 8)]
        slots: u32,
        /// Slots a launcher holds (`launcher_slots` of the local cluster).
        #[arg(long, default_value_t = 1)]
        launcher_slots: u32,
    },
    /// `gleaner logs --follow` of a running task: how long its lines take
    /// to arrive.
    Follow {
        #[arg(long, default_value_t = 2)]
        slots: u32,
    },
    /// Launchers of one job at scale: the services' and the broker's CPU
    /// and memory per launcher while each runs a task that sleeps.
    LauncherScale {
        #[arg(long, value_delimiter = ',', default_value = "100,500,1000")]
        launchers: Vec<u32>,
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        window: Duration,
        /// The launchers' heartbeat (the deployed default unless given).
        #[arg(long, value_parser = humantime::parse_duration)]
        heartbeat: Option<Duration>,
    },
    /// Resident memory of an idle launcher and of `gleaner up` with 10,000 pending tasks.
    Memory {
        #[arg(long, default_value_t = 10_000)]
        tasks: u32,
    },
    /// The simulator on the DAS-3 scenarios of seed 000, both policies.
    Fairness {
        #[arg(long, default_value = "simulator/scenarios")]
        scenarios: std::path::PathBuf,
    },
    /// One scheduling round (grows, shrinks, placements) at grid scale.
    Decide {
        #[arg(long, default_value_t = 1000)]
        clusters: usize,
        #[arg(long, default_value_t = 10_000)]
        jobs: usize,
        #[arg(long, default_value_t = 10)]
        grid: usize,
        /// The policies to time (both unless given).
        #[arg(long, value_delimiter = ',')]
        policy: Vec<gleaner_policy::share::CsPolicy>,
    },
    /// The scheduler service over the broker: every cluster reporting each
    /// second, every job at the runners' heartbeat; inbox lag and CPU.
    Inbox {
        #[arg(long, default_value_t = 1000)]
        clusters: usize,
        #[arg(long, default_value_t = 10_000)]
        jobs: usize,
        /// How often each job reports (the runners' heartbeat).
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        job_report: Duration,
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Another build's `gleaner` to run the same load against, first.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// Seed 000, Table 4.1: tasks through gleaner, one batch job per task
    /// and one array job, on the whole deployed grid.
    #[command(name = "table-4-1")]
    Table41 {
        #[arg(long, value_enum)]
        batch: seed000::Batch,
        /// Slots of the grid as deployed (checked).
        #[arg(long, default_value_t = 68)]
        slots: u32,
        #[arg(long, default_value_t = 1000)]
        tasks: u32,
        #[arg(long, default_value_t = 30)]
        seconds: u32,
    },
    /// Seed 000, Table 4.2: local jobs in six chunkings, on the grid empty
    /// and full of launchers.
    #[command(name = "table-4-2")]
    Table42 {
        #[arg(long, value_enum)]
        batch: seed000::Batch,
        #[arg(long, default_value_t = 68)]
        slots: u32,
        #[arg(long, default_value_t = 5)]
        runs: u32,
        /// Run time of each chunk.
        #[arg(long, default_value_t = 60)]
        seconds: u32,
        /// Only this job (`CHUNKSxWIDTH`, as `1x40`); repeatable. None:
        /// all six.
        #[arg(long = "shape", value_parser = parse_shape)]
        shapes: Vec<(u32, u32)>,
    },
    /// Seed 000, Table 4.3: chunked grid jobs over three Grid Engine
    /// clusters, empty and full of launchers.
    #[command(name = "table-4-3")]
    Table43 {
        #[arg(long, default_value_t = 5)]
        runs: u32,
        /// Run time of each component.
        #[arg(long, default_value_t = 60)]
        seconds: u32,
        /// Only this job (`COMPONENTSxWIDTH`, as `4x20`); repeatable.
        /// None: all three.
        #[arg(long = "shape", value_parser = parse_shape)]
        shapes: Vec<(u32, u32)>,
    },
    /// The batch system alone: how long after every slot frees at once a
    /// waiting job of each width starts.
    Handover {
        #[arg(long, value_enum)]
        batch: seed000::Batch,
        #[arg(long, default_value_t = 68)]
        slots: u32,
        #[arg(long, value_delimiter = ',', default_value = "1,2,10,40")]
        widths: Vec<u32>,
        #[arg(long, default_value_t = 5)]
        runs: u32,
    },
    /// Seed 004, Figure 4.4: from a grant to every launcher connected.
    #[command(name = "figure-4-4")]
    Figure44 {
        #[arg(long, value_enum)]
        batch: seed000::Batch,
        #[arg(long, value_delimiter = ',', default_value = "4,8,16,32,48,100,500")]
        launchers: Vec<u32>,
        #[arg(long, default_value_t = 3)]
        runs: u32,
    },
    /// A picture of a table that `bench/run.sh` printed: `figure-4-4` or
    /// `table-4-2`.
    Plot {
        #[arg(value_parser = ["figure-4-4", "table-4-2"])]
        figure: String,
        /// The Markdown `bench/run.sh` printed.
        table: PathBuf,
        /// The PNG to write.
        out: PathBuf,
    },
    /// Grid Engine: the same tasks by launchers and by one qsub per task.
    SgeLaunchers {
        #[arg(long, default_value_t = 80)]
        tasks: u32,
        #[arg(long, default_value_t = 8)]
        slots: u32,
        #[arg(long, default_value_t = 2)]
        seconds: u32,
    },
    /// Grid Engine: how long a grid job waits with and without sweeps to shrink.
    SgeGridDelay {
        #[arg(long, default_value_t = 8)]
        slots: u32,
        #[arg(long, default_value_t = 3)]
        runs: u32,
    },
    /// Grid Engine: how long local jobs wait with and without gleaner's load.
    SgeLocalDelay {
        #[arg(long, default_value_t = 8)]
        slots: u32,
    },
    /// Slurm: the same tasks by launchers, by one sbatch per task and as
    /// one array job.
    SlurmLaunchers {
        #[arg(long, default_value_t = 80)]
        tasks: u32,
        #[arg(long, default_value_t = 2)]
        seconds: u32,
    },
    /// Slurm: how long local jobs wait with and without gleaner's load.
    SlurmLocalDelay,
    /// What gleaner costs `slurmctld` with the queue full of the
    /// cluster's own jobs: RPCs a minute and CPU, without gleaner, idle
    /// and busy.
    SlurmMasterLoad {
        /// Held jobs in the queue.
        #[arg(long, default_value_t = 10_000)]
        queued: u32,
        /// How long each is measured.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        span: Duration,
    },
    /// A production trace's window on the dev grid's Slurm or Grid
    /// Engine, three times side by side: alone, with a sweep through
    /// gleaner, and with the same sweep as the batch system's own
    /// scavenging (an array job in its scavenger partition or queue).
    Trace {
        #[arg(long, value_enum, default_value = "slurm")]
        batch: trace::Batch,
        /// A Standard Workload Format trace, gzipped or not.
        #[arg(long, default_value = "bench/traces/NASA-iPSC-1993-3.1-cln.swf.gz")]
        trace: PathBuf,
        /// Where the window starts in the trace, hours.
        #[arg(long, default_value_t = 537.0)]
        from_hours: f64,
        /// The window's length in the trace, hours.
        #[arg(long, default_value_t = 2.0)]
        hours: f64,
        /// Trace seconds per second of the run.
        #[arg(long, default_value_t = 20.0)]
        compress: f64,
        /// Tasks of the sweep.
        #[arg(long, default_value_t = 2000)]
        tasks: u32,
        /// The shortest and longest task, seconds.
        #[arg(long, default_value_t = 5)]
        task_min: u32,
        #[arg(long, default_value_t = 60)]
        task_max: u32,
        /// Walltime of gleaner's placeholders, and the least they may be
        /// started with (`--time-min`).
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        walltime: Duration,
        #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
        min_walltime: Duration,
        /// The arms run beside the trace alone.
        #[arg(long, value_delimiter = ',', default_values = ["gleaner", "scavenger"])]
        arms: Vec<trace::Arm>,
        /// Where the plots go.
        #[arg(long, default_value = "target/bench")]
        out: PathBuf,
    },
    /// The simulator alone on a production trace at its own size: the
    /// whole traced machine, the trace's own time, a sweep beside it.
    TraceSimulated {
        /// A Standard Workload Format trace, gzipped or not.
        #[arg(long, default_value = "bench/traces/NASA-iPSC-1993-3.1-cln.swf.gz")]
        trace: PathBuf,
        /// Where the window starts in the trace, hours.
        #[arg(long, default_value_t = 504.0)]
        from_hours: f64,
        /// The window's length, days.
        #[arg(long, default_value_t = 7.0)]
        days: f64,
        /// Tasks of the sweep, and the shortest and longest, seconds.
        #[arg(long, default_value_t = 2_000_000)]
        tasks: u32,
        #[arg(long, default_value_t = 5)]
        task_min: u32,
        #[arg(long, default_value_t = 60)]
        task_max: u32,
    },
    /// Multi-host Grid Engine: how long one-host local jobs wait with and
    /// without gleaner's load.
    SgeHostsLocalDelay {
        /// Slots of each of the grid's hosts.
        #[arg(long, default_value_t = 4)]
        host_slots: u32,
    },
    /// Multi-host Grid Engine: how long local jobs wanting most of a host's
    /// memory, or a GPU, wait with and without gleaner's load.
    SgeResourceDelay,
    /// Multi-host Grid Engine: how busy a GPU sweep keeps the idle GPUs.
    SgeGpuUtilisation {
        #[arg(long, default_value_t = 60)]
        tasks: u32,
        #[arg(long, default_value_t = 10)]
        seconds: u32,
    },
    /// Multi-host Grid Engine: no-op tasks through single-slot placeholders
    /// and through one placeholder per host.
    SgeThroughput {
        #[arg(long, default_value_t = 50_000)]
        tasks: u32,
        /// Slots of each of the grid's hosts.
        #[arg(long, default_value_t = 4)]
        host_slots: u32,
    },
    /// The chaos suite, long: scheduler, runner, kcm, launcher, broker node,
    /// whole broker and launcher host faults at random over one sweep over
    /// the replicated broker (deploy/rabbitmq/cluster.sh up).
    Chaos {
        #[arg(long, default_value_t = 1500)]
        tasks: u32,
        #[arg(long, default_value_t = 2.0)]
        task_seconds: f64,
        /// Quiet seconds between faults, at least.
        #[arg(long, default_value_t = 5)]
        pause_min: u64,
        /// Quiet seconds between faults, at most.
        #[arg(long, default_value_t = 10)]
        pause_max: u64,
    },
}

fn gleaner_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name("gleaner");
    anyhow::ensure!(
        path.is_file(),
        "{} not found: build it with `cargo build --release -p gleaner`",
        path.display()
    );
    Ok(path)
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().bench {
        Bench::Makespan {
            tasks,
            slots,
            seconds,
            bundle,
        } => measure::makespan(&gleaner_binary()?, tasks, slots, seconds, bundle),
        Bench::Throughput {
            tasks,
            launcher_slots,
            launchers,
            bundle,
            bundled_only,
            rounds,
        } => {
            let runs = [
                ("/usr/bin/true", Some(1)),
                ("/usr/bin/true;", Some(1)),
                ("/usr/bin/true", None),
                ("/usr/bin/true", Some(bundle)),
            ];
            // HyperQueue on the same slots, when given (`HQ=/path/to/hq`).
            let hq = std::env::var_os("HQ").map(PathBuf::from);
            if let Some(hq) = &hq {
                println!("beside {}", hq::version(hq));
            }
            let plan = rounds::Plan {
                tasks,
                launcher_slots,
                launchers: &launchers,
                runs: &runs[if bundled_only { 2 } else { 0 }..],
                hq: hq.as_deref(),
                rounds,
            };
            rounds::throughput(&gleaner_binary()?, &plan)
        }
        Bench::Scale {
            tasks,
            slots,
            launcher_slots,
        } => scale::scale(&gleaner_binary()?, &tasks, slots, launcher_slots),
        Bench::Follow { slots } => follow::follow(&gleaner_binary()?, slots),
        Bench::LauncherScale {
            launchers,
            window,
            heartbeat,
        } => measure::launcher_scale(
            &gleaner_binary()?,
            &launchers,
            window,
            heartbeat.unwrap_or(gleaner_protocol::LAUNCHER_HEARTBEAT),
        ),
        Bench::Memory { tasks } => measure::memory(&gleaner_binary()?, tasks),
        Bench::Fairness { scenarios } => fairness::scenarios(&scenarios),
        Bench::Decide {
            clusters,
            jobs,
            grid,
            policy,
        } => {
            decide::round(clusters, jobs, grid, &policy);
            Ok(())
        }
        Bench::Inbox {
            clusters,
            jobs,
            job_report,
            seconds,
            baseline,
        } => {
            let exe = gleaner_binary()?;
            let baseline = baseline.map(std::fs::canonicalize).transpose()?;
            let mut builds = Vec::new();
            if let Some(baseline) = &baseline {
                builds.push(("baseline", baseline.as_path()));
            }
            builds.push(("this build", exe.as_path()));
            inbox::lag(&builds, clusters, jobs, job_report, seconds)
        }
        Bench::SgeLaunchers {
            tasks,
            slots,
            seconds,
        } => sge::launchers_vs_direct(&gleaner_binary()?, tasks, slots, seconds),
        Bench::Table41 {
            batch,
            slots,
            tasks,
            seconds,
        } => seed000::table_4_1(&gleaner_binary()?, batch, slots, tasks, seconds),
        Bench::Table42 {
            batch,
            slots,
            runs,
            seconds,
            shapes,
        } => seed000::table_4_2(&gleaner_binary()?, batch, slots, runs, seconds, &shapes),
        Bench::Table43 {
            runs,
            seconds,
            shapes,
        } => seed000::table_4_3(&gleaner_binary()?, runs, seconds, &shapes),
        Bench::Handover {
            batch,
            slots,
            widths,
            runs,
        } => seed000::handover(batch, slots, &widths, runs),
        Bench::Figure44 {
            batch,
            launchers,
            runs,
        } => seed004::figure_4_4(&gleaner_binary()?, batch, &launchers, runs),
        Bench::Plot { figure, table, out } => match figure.as_str() {
            "figure-4-4" => figures::figure_4_4(&table, &out),
            _ => figures::table_4_2(&table, &out),
        },
        Bench::SgeLocalDelay { slots } => sge::local_delay(&gleaner_binary()?, slots),
        Bench::SgeGridDelay { slots, runs } => sge::grid_delay(&gleaner_binary()?, slots, runs),
        Bench::SlurmLaunchers { tasks, seconds } => {
            slurm::launchers_vs_direct(&gleaner_binary()?, tasks, seconds)
        }
        Bench::SlurmLocalDelay => slurm::local_delay(&gleaner_binary()?),
        Bench::SlurmMasterLoad { queued, span } => {
            slurm::master_load(&gleaner_binary()?, queued, span)
        }
        Bench::Trace {
            batch,
            trace,
            from_hours,
            hours,
            compress,
            tasks,
            task_min,
            task_max,
            walltime,
            min_walltime,
            arms,
            out,
        } => trace::replay(
            &gleaner_binary()?,
            batch,
            &trace::Window {
                trace,
                from_s: from_hours * 3600.0,
                length_s: hours * 3600.0,
                compress,
            },
            trace::SweepShape {
                tasks,
                min_s: task_min,
                max_s: task_max.max(task_min),
            },
            &trace::Placeholders {
                walltime,
                min_walltime,
            },
            &arms,
            &out,
        ),
        Bench::TraceSimulated {
            trace,
            from_hours,
            days,
            tasks,
            task_min,
            task_max,
        } => trace::simulate_full(
            &trace::Window {
                trace,
                from_s: from_hours * 3600.0,
                length_s: days * 86_400.0,
                compress: 1.0,
            },
            trace::SweepShape {
                tasks,
                min_s: task_min,
                max_s: task_max.max(task_min),
            },
        ),
        Bench::SgeResourceDelay => sge::resource_delay(&gleaner_binary()?),
        Bench::SgeGpuUtilisation { tasks, seconds } => {
            sge::gpu_utilisation(&gleaner_binary()?, tasks, seconds)
        }
        Bench::SgeHostsLocalDelay { host_slots } => {
            sge::hosts_local_delay(&gleaner_binary()?, host_slots)
        }
        Bench::SgeThroughput { tasks, host_slots } => {
            sge::throughput(&gleaner_binary()?, tasks, host_slots)
        }
        Bench::Chaos {
            tasks,
            task_seconds,
            pause_min,
            pause_max,
        } => chaos::run(
            &gleaner_binary()?,
            tasks,
            task_seconds,
            (pause_min, pause_max),
        ),
    }
}

/// `CHUNKSxWIDTH`, as `4x10`.
fn parse_shape(text: &str) -> Result<(u32, u32), String> {
    let (chunks, width) = text
        .split_once('x')
        .ok_or_else(|| format!("{text:?} is not CHUNKSxWIDTH (as 4x10)"))?;
    let number = |part: &str| {
        part.parse::<u32>()
            .map_err(|e| format!("{part:?} in {text:?}: {e}"))
    };
    Ok((number(chunks)?, number(width)?))
}
