//! `gleaner`: bag-of-tasks work on the idle slots of batch clusters.

mod browse;
mod client;
mod doctor;
mod error;
mod output;
mod services;
mod settings;
mod table;
mod top;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::error;
use tracing_subscriber::EnvFilter;

use crate::{
    error::CliError,
    output::{Output, OutputMode},
    services::LauncherArgs,
    settings::Settings,
};

#[derive(Debug, Parser)]
#[command(
    name = "gleaner",
    version,
    about = "Run parameter sweeps on the idle slots of batch clusters"
)]
struct Cli {
    /// Configuration file (default: $GLEANER_CONFIG, ./gleaner.toml, /etc/gleaner/gleaner.toml).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// How `submit`, `status`, `cancel` and `simulate` show what they found.
    #[arg(long, global = true, value_enum, default_value_t)]
    output: OutputMode,
    /// The same as `--output json`.
    #[arg(long, global = true, conflicts_with = "output")]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Scheduler, runner and a local-backend cluster in one process.
    #[command(
        after_help = "Example:\n  gleaner up --slots 8 &\n  gleaner submit sweep.toml --wait"
    )]
    Up {
        /// Launchers that may run at once (default: the number of CPUs).
        #[arg(long)]
        slots: Option<u32>,
    },
    /// Submit a manifest, or a sweep given on the command line; prints the job id.
    #[command(after_help = "Examples:
  gleaner submit sweep.toml --wait
  gleaner submit --array 1-100 -- ./solve --seed {i}
  gleaner submit --array 0-1000:10 --name scan --wait -- 'python3 scan.py {i} > out.txt'
  gleaner submit --open sweep.toml && gleaner submit --job sweep-3fa9c2d41e07b5a8 more.toml")]
    Submit {
        /// The manifest: TOML, or JSON for a `.json` file; with `--job`, the
        /// tasks to add ([[task]] entries and a [sweep]).
        #[arg(required_unless_present = "array", conflicts_with = "array")]
        file: Option<PathBuf>,
        /// An open job: tasks may be added while it runs (`--job`); it ends
        /// once closed (`gleaner close`) and its tasks have.
        #[arg(long, conflicts_with = "job")]
        open: bool,
        /// Add the file's tasks to this open job, numbered after its own.
        #[arg(long, value_name = "JOB", conflicts_with = "array")]
        job: Option<String>,
        /// Show progress until the job ends; exit 0 only if every task succeeded.
        #[arg(long)]
        wait: bool,
        /// A sweep without a manifest: one task per value of the range,
        /// `{i}` in the command standing for it.
        #[arg(long, value_name = "FROM-TO[:STEP]", requires = "command")]
        array: Option<client::ArrayRange>,
        /// The name of an `--array` job (default: the command's program).
        #[arg(long, requires = "array")]
        name: Option<String>,
        /// The command of an `--array` job, after `--`: one argument is a
        /// shell command line, several are words.
        #[arg(last = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Run some of a job's tasks again, as a new job: same parameters, same
    /// task numbers, its results linked to the job's (`rerun-of`).
    #[command(after_help = "Examples:
  gleaner resubmit sweep-3fa9c2d41e07b5a8 --failed --timed-out --wait
  gleaner resubmit sweep-3fa9c2d41e07b5a8 --tasks 3,7-12
  gleaner resubmit sweep-3fa9c2d41e07b5a8 --lost --tasks 0-999")]
    Resubmit {
        job: String,
        /// Tasks that failed.
        #[arg(long)]
        failed: bool,
        /// Tasks that outlived their walltime.
        #[arg(long)]
        timed_out: bool,
        /// Tasks lost with their launchers.
        #[arg(long)]
        lost: bool,
        /// Tasks cancelled before they ended.
        #[arg(long)]
        cancelled: bool,
        /// Only these task numbers (all of the job's when not given).
        #[arg(long, value_name = "3,7-12")]
        tasks: Option<gleaner_manifest::TaskSet>,
        /// Show progress until the job ends; exit 0 only if every task succeeded.
        #[arg(long)]
        wait: bool,
        /// The job's results directory, where it is not found by itself.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Clusters, their hosts and jobs as the scheduler sees them.
    #[command(
        after_help = "Examples:\n  gleaner status\n  gleaner status sweep-3fa9c2d41e07b5a8\n  gleaner status --hosts --output json"
    )]
    Status {
        job: Option<String>,
        /// Every execution host, not only how many are in which state.
        #[arg(long)]
        hosts: bool,
    },
    /// An open job takes no more tasks; it ends once those it has ended.
    #[command(
        after_help = "Example:\n  gleaner close sweep-3fa9c2d41e07b5a8 && gleaner wait sweep-3fa9c2d41e07b5a8"
    )]
    Close { job: String },
    /// Stop a job: running tasks are killed, results so far are kept.
    #[command(after_help = "Example:\n  gleaner cancel sweep-3fa9c2d41e07b5a8")]
    Cancel { job: String },
    /// A live view of clusters, jobs and recent events (q quits).
    #[command(after_help = "Example:\n  gleaner top")]
    Top,
    /// Follow a running job to its end, as `submit --wait` does (same exit code); an ended job answers at once.
    #[command(
        after_help = "Example:\n  gleaner submit sweep.toml\n  gleaner wait sweep-3fa9c2d41e07b5a8 && echo all done"
    )]
    Wait { job: String },
    /// Your jobs, running and lately ended: state, progress, launchers.
    #[command(after_help = "Examples:\n  gleaner jobs\n  gleaner jobs --all --output json")]
    Jobs {
        /// Every job you may see (all of them, for admins), not only yours.
        #[arg(long)]
        all: bool,
        /// Only those running, not those that ended lately.
        #[arg(long)]
        running: bool,
    },
    /// A job's results index, filtered by final state.
    #[command(
        after_help = "Examples:\n  gleaner results sweep-3fa9c2d41e07b5a8\n  gleaner results sweep-3fa9c2d41e07b5a8 --status failed --status timed-out\n  gleaner results sweep-3fa9c2d41e07b5a8 --output json | jq '.[].task'"
    )]
    Results {
        job: String,
        /// Only tasks that ended so (repeatable).
        #[arg(long, value_parser = ["succeeded", "failed", "timed-out", "lost", "cancelled"])]
        status: Vec<String>,
        /// The job's results directory, where it is not found by itself.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// A task's captured output; with --follow, as it is printed; without a
    /// task, every ended task's, in task order.
    #[command(
        after_help = "Examples:\n  gleaner logs sweep-3fa9c2d41e07b5a8 17\n  gleaner logs sweep-3fa9c2d41e07b5a8 17 --stderr --follow\n  gleaner logs sweep-3fa9c2d41e07b5a8 > merged.csv\n  gleaner logs \"$GLEANER_JOB\" --dir \"$GLEANER_RESULTS\"    # in a final step"
    )]
    Logs {
        job: String,
        task: Option<u64>,
        /// Its stderr instead of its stdout.
        #[arg(long)]
        stderr: bool,
        /// Stream the output as the task prints it (within a second), until
        /// the task ends.
        #[arg(long, short = 'f')]
        follow: bool,
        /// The job's results directory, where it is not found by itself.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Writes a job's results in a directory per task: `tasks/<task>/`
    /// with `stdout`, `stderr` and the task's declared outputs.
    #[command(after_help = "Example:\n  gleaner export sweep-3fa9c2d41e07b5a8 ./by-task")]
    Export {
        job: String,
        /// Where to write (made if missing).
        into: PathBuf,
        /// The job's results directory, where it is not found by itself.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Run the scheduler alone.
    #[command(
        after_help = "Example:\n  GLEANER_CONFIG=/etc/gleaner/gleaner.toml gleaner scheduler"
    )]
    Scheduler,
    /// Run a runner alone.
    #[command(after_help = "Example:\n  GLEANER_CONFIG=/etc/gleaner/gleaner.toml gleaner runner")]
    Runner,
    /// Run the cluster manager of one configured cluster.
    #[command(
        after_help = "Example:\n  gleaner kcm --cluster hpc1    # on hpc1's head node; [[cluster]] name = \"hpc1\" in the configuration"
    )]
    Kcm {
        #[arg(long)]
        cluster: gleaner_protocol::ClusterName,
    },
    /// Run one launcher (started by a kcm).
    #[command(
        after_help = "Launchers are started by a kcm, with the arguments it gives them; see `gleaner kcm`."
    )]
    Launcher(LauncherArgs),
    /// Check a deployment from here (broker, scheduler, each cluster's kcm,
    /// batch commands and launcher program, directories) and, with
    /// --nodes, each batch cluster from one of its nodes; exit 1 if a
    /// check failed.
    #[command(after_help = "Examples:
  gleaner doctor
  gleaner doctor --nodes --output json    # also a one-slot probe job on each batch cluster")]
    Doctor {
        /// Also probe each batch cluster from a node, through a one-slot
        /// job run from this directory (which the nodes must share).
        #[arg(long)]
        nodes: bool,
        /// How long a node's probe may wait in the queue and run.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
        node_timeout: std::time::Duration,
        /// Run as a node's probe: write what this node finds to FILE.
        #[arg(long, value_name = "FILE", hide = true)]
        node: Option<PathBuf>,
    },
    /// Print a shell's completion script for gleaner.
    #[command(after_help = "Examples:
  gleaner completions bash > /etc/bash_completion.d/gleaner
  gleaner completions zsh > \"${fpath[1]}/_gleaner\"
  gleaner completions fish > ~/.config/fish/completions/gleaner.fish")]
    Completions { shell: clap_complete::Shell },
    /// Write the man pages (gleaner.1, gleaner-COMMAND.1) into DIR, as the
    /// Debian package installs them.
    #[command(hide = true)]
    Manpages { dir: PathBuf },
    /// Run the scheduling policies on a simulated grid (no broker needed).
    #[command(
        after_help = "Example:\n  gleaner simulate simulator/scenarios/das3-spike.toml --plot plots/"
    )]
    Simulate {
        scenario: PathBuf,
        /// Only this policy (default: the scenario's, or both).
        #[arg(long)]
        policy: Option<gleaner_policy::share::CsPolicy>,
        /// Write a load plot (PNG) per policy into this directory.
        #[arg(long, value_name = "DIR")]
        plot: Option<PathBuf>,
    },
}

impl Command {
    fn is_service(&self) -> bool {
        !matches!(
            self,
            Self::Submit { .. }
                | Self::Resubmit { .. }
                | Self::Status { .. }
                | Self::Cancel { .. }
                | Self::Close { .. }
                | Self::Wait { .. }
                | Self::Jobs { .. }
                | Self::Top
                | Self::Results { .. }
                | Self::Logs { .. }
                | Self::Export { .. }
                | Self::Simulate { .. }
                | Self::Completions { .. }
                | Self::Manpages { .. }
                | Self::Doctor { .. }
        )
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Completions { shell } = cli.command {
        let mut command = <Cli as clap::CommandFactory>::command();
        clap_complete::generate(shell, &mut command, "gleaner", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    if let Command::Manpages { dir } = &cli.command {
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), dir));
        return match written {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!(
                    "error: cannot write the man pages into {}: {e}",
                    dir.display()
                );
                ExitCode::FAILURE
            }
        };
    }
    let service = cli.command.is_service();
    let default_level = if service { "info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(default_level, service))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mode = if cli.json {
        OutputMode::Json
    } else {
        cli.output
    };
    let output = output::for_mode(mode);
    let outcome = Settings::load(cli.config.as_deref())
        .map_err(|e| CliError::BadInput(format!("{e:#}")))
        .and_then(|settings| run(cli.command, settings, output.as_ref()));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(message) = e.message() {
                eprintln!("error: {message}");
            }
            e.exit_code()
        }
    }
}

/// Runs a command on its runtime: a launcher is small, and one thread is
/// plenty and keeps its footprint low.
fn run(command: Command, settings: Settings, output: &dyn Output) -> Result<(), CliError> {
    let runtime = match command {
        Command::Launcher(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    let runtime = runtime
        .map_err(|e| CliError::Service(anyhow::anyhow!("cannot start the async runtime: {e}")))?;
    runtime.block_on(dispatch(command, settings, output))
}

async fn dispatch(
    command: Command,
    settings: Settings,
    output: &dyn Output,
) -> Result<(), CliError> {
    let service = |result: anyhow::Result<()>| {
        result.map_err(|e| {
            error!("{e:#}");
            CliError::Service(e)
        })
    };
    match command {
        Command::Submit {
            file,
            open,
            job,
            wait,
            array,
            name,
            command,
        } => {
            if let (Some(job), Some(file)) = (&job, &file) {
                return client::add_tasks(&settings, job, file, wait, output).await;
            }
            let manifest = match (file, array) {
                (Some(file), _) => client::read_manifest(&file, open),
                (None, Some(range)) => client::array_manifest(range, name.as_deref(), &command)
                    .map(|manifest| gleaner_manifest::Manifest { open, ..manifest }),
                (None, None) => Err("give a manifest, or --array with a command".to_owned()),
            }
            .map_err(CliError::BadInput)?;
            client::submit(&settings, manifest, wait, output).await
        }
        Command::Resubmit {
            job,
            failed,
            timed_out,
            lost,
            cancelled,
            tasks,
            wait,
            dir,
        } => {
            let statuses = [
                (failed, "failed"),
                (timed_out, "timed_out"),
                (lost, "lost"),
                (cancelled, "cancelled"),
            ];
            let choice = browse::RerunChoice {
                statuses: statuses
                    .into_iter()
                    .filter_map(|(asked, status)| asked.then_some(status))
                    .collect(),
                tasks,
            };
            let manifest = browse::rerun_manifest(&settings, &job, &choice, dir.as_deref()).await?;
            client::submit(&settings, manifest, wait, output).await
        }
        Command::Completions { .. } | Command::Manpages { .. } => Ok(()),
        Command::Status { job, hosts } => {
            client::status(&settings, job.as_deref(), hosts, output).await
        }
        Command::Cancel { job } => client::cancel(&settings, &job, output).await,
        Command::Close { job } => client::close(&settings, &job, output).await,
        Command::Wait { job } => client::wait(&settings, &job, output).await,
        Command::Jobs { all, running } => client::jobs(&settings, all, running, output).await,
        Command::Top => top::top(&settings).await,
        Command::Results { job, status, dir } => {
            browse::results(&settings, &job, &status, dir.as_deref(), output).await
        }
        Command::Logs {
            job,
            task,
            stderr,
            follow,
            dir,
        } => browse::logs(&settings, &job, task, stderr, follow, dir.as_deref()).await,
        Command::Doctor {
            nodes,
            node_timeout,
            node,
        } => match node {
            Some(file) => doctor::node(&settings, &file).await,
            None => {
                let options = doctor::Options {
                    nodes,
                    node_timeout,
                };
                doctor::doctor(&settings, &options, output).await
            }
        },
        Command::Export { job, into, dir } => {
            let written = browse::export(&settings, &job, &into, dir.as_deref()).await?;
            output.file_written(&format!("{written} tasks' results"), &into);
            Ok(())
        }
        Command::Simulate {
            scenario,
            policy,
            plot,
        } => simulate(&scenario, policy, plot.as_deref(), output),
        Command::Up { slots } => service(services::up(settings, slots, on_signals()).await),
        Command::Scheduler => service(services::scheduler(&settings, on_signals()).await),
        Command::Runner => service(services::runner(&settings, on_signals()).await),
        Command::Kcm { cluster } => {
            let cluster = settings
                .cluster(&cluster)
                .map_err(|e| CliError::BadInput(format!("{e:#}")))?
                .clone();
            service(services::kcm(&settings, &cluster, on_signals()).await)
        }
        Command::Launcher(args) => service(
            services::launcher(&settings, args, launcher_signals())
                .await
                .map(|_exit| ()),
        ),
    }
}

/// `gleaner simulate`: the policies on a simulated grid; no broker.
fn simulate(
    path: &std::path::Path,
    policy: Option<gleaner_policy::share::CsPolicy>,
    plot: Option<&std::path::Path>,
    output: &dyn Output,
) -> Result<(), CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::BadInput(format!("cannot read {}: {e}", path.display())))?;
    let scenario = gleaner_simulator::Scenario::from_toml(&text)
        .map_err(|e| CliError::BadInput(format!("{}: invalid scenario\n{e}", path.display())))?;
    let comparison = gleaner_simulator::Comparison::run(&scenario, policy);
    output.simulation(&comparison);
    if let Some(dir) = plot {
        let stem = path
            .file_stem()
            .map_or("scenario".into(), |s| s.to_string_lossy().into_owned());
        let files = comparison
            .plot(dir, &stem)
            .map_err(|e| CliError::Unsuccessful(Some(format!("cannot write the plot: {e}"))))?;
        for file in files {
            output.file_written("plot", &file);
        }
    }
    Ok(())
}

/// `RUST_LOG` if set, else `default`. lapin's own lines are muted: gleaner
/// publishes with `mandatory` on purpose and handles returns itself, and it
/// reports a closed channel or a lost connection itself, with context. The
/// user's commands hear nothing from lapin at all.
fn log_filter(default: &str, service: bool) -> EnvFilter {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let muted: &[&str] = if service {
        &[
            "lapin::returned_messages=error",
            "lapin::channels=off",
            "lapin::channel=off",
            "lapin::io_loop=off",
            "lapin::heartbeat=off",
        ]
    } else {
        &["lapin=off"]
    };
    for muted in muted {
        if let Ok(directive) = muted.parse() {
            filter = filter.add_directive(directive);
        }
    }
    filter
}

/// A token cancelled by SIGTERM or SIGINT. A second SIGINT exits at once.
fn on_signals() -> CancellationToken {
    cancelled_by(&[SignalKind::terminate(), SignalKind::interrupt()])
}

/// A launcher's signals: SIGTERM, SIGINT and Grid Engine's kill warning
/// (SIGUSR2 with `qsub -notify`) stop it; SIGUSR1 (Slurm's `--signal`
/// before the time limit or at preemption) drains it.
fn launcher_signals() -> gleaner_launcher::Signals {
    gleaner_launcher::Signals {
        stop: cancelled_by(&[
            SignalKind::terminate(),
            SignalKind::interrupt(),
            SignalKind::user_defined2(),
        ]),
        drain: cancelled_by(&[SignalKind::user_defined1()]),
    }
}

fn cancelled_by(kinds: &[SignalKind]) -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    for &kind in kinds {
        let Ok(mut stream) = signal(kind) else {
            continue;
        };
        let cancel = cancel.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if cancel.is_cancelled() && kind == SignalKind::interrupt() {
                    std::process::exit(130);
                }
                cancel.cancel();
            }
        });
    }
    token
}
