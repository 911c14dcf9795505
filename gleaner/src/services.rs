//! Starting the services, alone or all in one (`gleaner up`).

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use gleaner_broker::Broker;
use gleaner_kcm::{
    BackendKind, ClusterConfig, ClusterSettings, LauncherCommand, LocalBackend, SgeBackend,
    SlurmBackend,
};
use gleaner_launcher::{Exit, GpuSource, LauncherConfig};
use gleaner_manifest::JobId;
use gleaner_protocol::{ClusterName, LauncherId, naming, now_ms};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::settings::Settings;

pub use gleaner_kcm::hostname;

fn broker(settings: &Settings, role: &str) -> anyhow::Result<Broker> {
    Ok(Broker::new(
        &settings.broker_urls(),
        format!("{role}@{}", hostname()),
    )?)
}

pub async fn scheduler(settings: &Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    gleaner_scheduler::run(
        broker(settings, "scheduler")?,
        settings.scheduler.clone(),
        settings.users.clone(),
        shutdown,
    )
    .await;
    Ok(())
}

pub async fn runner(settings: &Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    // Where users are kept apart, each job's launchers get an account of
    // their own, made through the management API.
    let admin = match settings.users.is_single() {
        true => None,
        false => Some(gleaner_broker::admin::Admin::new(
            &settings.broker_urls()[0],
            settings.runner.management_url.as_deref(),
        )?),
    };
    gleaner_runner::run(
        broker(settings, "runner")?,
        settings.runner.clone(),
        settings.users.clone(),
        admin,
        shutdown,
    )
    .await;
    Ok(())
}

/// How this very binary starts a launcher, with the settings it runs under:
/// the same configuration file and `GLEANER_*` overrides, wherever it runs.
fn launcher_command(
    settings: &Settings,
    cluster: &ClusterConfig,
) -> anyhow::Result<LauncherCommand> {
    let program = match &cluster.launcher_program {
        Some(program) => program.clone(),
        None => std::env::current_exe().context("cannot find the gleaner executable")?,
    };
    let mut env = crate::settings::environment_overrides();
    env.retain(|(key, _)| !matches!(key.as_str(), "GLEANER_BROKER_URL" | "GLEANER_BROKER_URLS"));
    // Both, agreeing, whatever the launcher inherits from its environment.
    let urls = settings.broker_urls();
    env.push(("GLEANER_BROKER_URL".to_owned(), urls[0].clone()));
    env.push(("GLEANER_BROKER_URLS".to_owned(), urls.join(",")));
    if let Some(source) = &settings.source {
        env.push(("GLEANER_CONFIG".to_owned(), source.display().to_string()));
    }
    #[derive(serde::Serialize)]
    struct LauncherSection<'a> {
        launcher: &'a gleaner_launcher::LauncherSettings,
    }
    let launcher_settings = toml::to_string(&LauncherSection {
        launcher: &settings.launcher,
    })
    .context("cannot write the launcher's settings")?;
    Ok(LauncherCommand {
        program,
        args: vec![naming::LAUNCHER_SUBCOMMAND.to_owned()],
        env,
        broker_urls: urls,
        launcher_settings,
        // Slurm assigns each placeholder its devices.
        gpu_devices: match cluster.backend {
            BackendKind::Slurm => Vec::new(),
            BackendKind::Local | BackendKind::Sge => cluster.gpus.clone(),
        },
    })
}

pub async fn kcm(
    settings: &Settings,
    cluster: &ClusterConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let config = settings.kcm(cluster);
    if nix::unistd::geteuid().is_root() {
        launcher_bases(settings);
    }
    let broker = broker(settings, &format!("kcm.{}", cluster.name))?;
    match cluster.backend {
        BackendKind::Local => {
            let slots = cluster.slots.unwrap_or(1);
            let backend = LocalBackend::new(
                &cluster.name,
                slots,
                cluster.memory.map(|m| m.0),
                cluster.launcher_slots,
                launcher_command(settings, cluster)?,
            );
            gleaner_kcm::run(broker, config, backend, shutdown).await;
        }
        BackendKind::Sge => {
            let backend = SgeBackend::new(cluster.sge(launcher_command(settings, cluster)?));
            gleaner_kcm::run(broker, config, backend, shutdown).await;
        }
        BackendKind::Slurm => {
            let backend = SlurmBackend::new(cluster.slurm(launcher_command(settings, cluster)?));
            gleaner_kcm::run(broker, config, backend, shutdown).await;
        }
    }
    Ok(())
}

/// Makes the launchers' scratch and checkpoint bases on this host root's,
/// shared like `/tmp`: one that a user's launcher made first would be that
/// user's to swap other users' directories in. Other hosts' are their
/// admins' to make so (a launcher refuses a base of someone else's).
fn launcher_bases(settings: &Settings) {
    use gleaner_contain::shared::{Base, root_base};
    for base in [&settings.launcher.scratch, &settings.launcher.checkpoints] {
        match root_base(base) {
            Ok(Base::Kept | Base::Made) => {}
            Ok(Base::Repaired) => {
                warn!(base = %base.display(), "a launcher base was someone else's; it is root's now (mode 1777)");
            }
            Err(e) => {
                warn!(error = %e, "cannot make a launcher base root's; launchers of other users may refuse it")
            }
        }
    }
}

/// What the kcm tells a launcher on its command line.
#[derive(Debug, clap::Args)]
pub struct LauncherArgs {
    #[arg(long)]
    pub job: JobId,
    #[arg(long)]
    pub cluster: ClusterName,
    /// Unique launcher id (names its queue).
    #[arg(long)]
    pub id: LauncherId,
    /// The batch system's name for the slot, for the consumer tag.
    #[arg(long, default_value = "0")]
    pub slot: String,
    /// Slots it holds.
    #[arg(long, default_value_t = 1)]
    pub slots: u32,
    /// Slots each task takes: `slots / task_slots` tasks run at once.
    #[arg(long, default_value_t = 1)]
    pub task_slots: u32,
    /// Memory each task may hold (`8192M`): over it, it is killed as `oom`.
    #[arg(long, value_parser = parse_memory)]
    pub task_memory: Option<u64>,
    /// GPUs each task gets, its own.
    #[arg(long, default_value_t = 0)]
    pub task_gpus: u32,
    /// The host's GPUs, to claim this launcher's from (unset: those the
    /// batch system gave it in `$CUDA_VISIBLE_DEVICES`).
    #[arg(long, value_delimiter = ',')]
    pub gpu_devices: Vec<String>,
    /// Open descriptors, each the kcm's claim on the device of
    /// `--gpu-devices` in its place: then those are this launcher's.
    #[arg(long, value_delimiter = ',')]
    pub gpu_claims: Vec<i32>,
    /// The placeholder's walltime, from the launcher's start (`3600s`, `1h`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub walltime: Option<Duration>,
    /// The end the batch system gave the placeholder, in seconds since the
    /// epoch, where it may be sooner than the walltime asked; anything
    /// else (the batch system could not be read) leaves the walltime.
    #[arg(long)]
    pub ends_at: Option<String>,
}

/// When the placeholder ends, as far as the launcher can tell: at the end
/// the batch system gave it, or its walltime from now, whichever is
/// sooner.
fn deadline(walltime: Option<Duration>, ends_at: Option<&str>, now_ms: u64) -> Option<Duration> {
    let given = ends_at
        .and_then(|text| text.trim().parse::<u64>().ok())
        .filter(|&seconds| seconds > 0)
        .map(|seconds| Duration::from_millis(seconds.saturating_mul(1000).saturating_sub(now_ms)));
    match (walltime, given) {
        (Some(walltime), Some(given)) => Some(walltime.min(given)),
        (walltime, given) => walltime.or(given),
    }
}

fn parse_memory(text: &str) -> Result<u64, String> {
    gleaner_manifest::Memory::parse(text).map(|m| m.0)
}

pub async fn launcher(
    settings: &Settings,
    args: LauncherArgs,
    signals: gleaner_launcher::Signals,
) -> anyhow::Result<Exit> {
    die_with_parent();
    let host = hostname();
    let l = &settings.launcher;
    let config = LauncherConfig {
        job: args.job,
        cluster: args.cluster,
        id: args.id,
        host: host.clone(),
        slot: args.slot.clone(),
        slots: args.slots,
        task_slots: args.task_slots.max(1),
        task_needs: gleaner_manifest::Needs {
            memory_mb: args.task_memory.unwrap_or(0),
            gpus: args.task_gpus,
        },
        gpu_source: match (args.gpu_devices.is_empty(), args.gpu_claims.is_empty()) {
            (true, _) => GpuSource::BatchSystem,
            (false, true) => GpuSource::Claim(args.gpu_devices),
            (false, false) => GpuSource::Given {
                devices: args.gpu_devices,
                claims: args.gpu_claims,
            },
        },
        idle_timeout: l.idle_timeout,
        heartbeat: l.heartbeat,
        deadline: deadline(args.walltime, args.ends_at.as_deref(), now_ms())
            .and_then(|left| std::time::Instant::now().checked_add(left)),
        walltime: args.walltime,
        deadline_margin: l.deadline_margin,
        scratch: scratch_dir(&l.scratch),
        checkpoints: scratch_dir(&l.checkpoints),
        limits: l.limits,
    };
    let broker = Broker::new(
        &settings.broker_urls(),
        format!("launcher@{host}/{}", args.slot),
    )?;
    Ok(gleaner_launcher::run(&broker, config, signals).await?)
}

/// A launcher lives no longer than what started it (the local backend's
/// kcm, the batch system's shepherd): when that dies, the launcher gets
/// SIGTERM and gives its tasks back, so a restarted kcm's launchers are
/// not added to orphans still holding the slots.
fn die_with_parent() {
    let parent = nix::unistd::getppid();
    if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM).is_ok()
        && nix::unistd::getppid() != parent
    {
        // It died before the request took hold.
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM);
    }
}

fn scratch_dir(base: &std::path::Path) -> PathBuf {
    base.join(format!("{}", nix::unistd::getuid()))
}

/// `gleaner up`: scheduler, runner and cluster managers in one process. With
/// `--slots`, or when no cluster is configured, one local cluster; otherwise
/// every configured cluster.
pub async fn up(
    mut settings: Settings,
    slots: Option<u32>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // All in one process is one user's gleaner, unless configured otherwise.
    settings.users.single.get_or_insert(true);
    let clusters = match (slots, settings.clusters.is_empty()) {
        (None, false) => settings.clusters.clone(),
        _ => vec![ClusterConfig::local(
            "local",
            slots.unwrap_or_else(default_slots),
        )],
    };
    let results_root = &settings.runner.job.results_root;
    let results = std::path::absolute(results_root).unwrap_or_else(|_| results_root.clone());
    let described: Vec<String> = clusters.iter().map(ClusterConfig::describe).collect();
    let urls = settings.broker_urls();
    let brokers: Vec<String> = urls.iter().map(|url| gleaner_broker::redact(url)).collect();
    eprintln!(
        "gleaner up: broker {}, clusters {}, results under {}",
        brokers.join(" | "),
        described.join(", "),
        results.display()
    );
    if let Some(url) = urls.first()
        && let Some(ui) = management_ui(url).await
    {
        eprintln!("gleaner up: watch the queues in the RabbitMQ management UI at {ui}");
    }
    eprintln!("gleaner up: submit with `gleaner submit FILE --wait`; Ctrl-C stops");
    info!(started_at = now_ms(), "gleaner up");
    let kcms = futures_util::future::join_all(
        clusters
            .iter()
            .map(|cluster| kcm(&settings, cluster, shutdown.clone())),
    );
    let (scheduler, runner, kcms) = tokio::join!(
        scheduler(&settings, shutdown.clone()),
        runner(&settings, shutdown.clone()),
        kcms,
    );
    kcms.into_iter()
        .fold(scheduler.and(runner), |all, kcm| all.and(kcm))
}

fn default_slots() -> u32 {
    std::thread::available_parallelism().map_or(2, |n| n.get() as u32)
}

/// The management UI's address, if the plugin answers beside the broker.
async fn management_ui(broker_url: &str) -> Option<String> {
    let url = format!(
        "{}/",
        gleaner_broker::admin::management_base(broker_url).ok()?
    );
    let probe = url.clone();
    let answered = tokio::task::spawn_blocking(move || {
        let agent = gleaner_broker::admin::http_agent(Duration::from_millis(700));
        agent
            .get(&probe)
            .call()
            .is_ok_and(|r| r.status().is_success())
    })
    .await
    .unwrap_or(false);
    answered.then_some(url)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        args: LauncherArgs,
    }

    #[test]
    fn a_launcher_ends_at_the_end_its_batch_system_gave_or_its_walltime() {
        let now_ms = 1_800_000_000_000;
        let hour = Some(Duration::from_secs(3600));
        let in_ten_minutes = "1800000600";
        assert_eq!(
            deadline(hour, Some(in_ten_minutes), now_ms),
            Some(Duration::from_secs(600))
        );
        assert_eq!(
            deadline(hour, Some("1800007200"), now_ms),
            hour,
            "never past the walltime"
        );
        for unread in ["", "N/A", "-5", "0"] {
            assert_eq!(deadline(hour, Some(unread), now_ms), hour, "{unread:?}");
        }
        assert_eq!(
            deadline(None, Some(in_ten_minutes), now_ms),
            Some(Duration::from_secs(600))
        );
        assert_eq!(deadline(None, None, now_ms), None);
        assert_eq!(
            deadline(hour, Some("1799999000"), now_ms),
            Some(Duration::ZERO),
            "an end passed leaves no time"
        );
    }

    /// What a kcm writes on a launcher's command line is what the launcher reads.
    #[test]
    fn launchers_read_the_arguments_kcms_write() {
        let written = naming::LauncherArgs {
            job: "sweep-3fa9c2d41e07b5a8",
            cluster: "c1",
            id: "c1-4711.3",
            slot: "4711.3",
            slots: 4,
            task_slots: 2,
            task_needs: gleaner_manifest::Needs {
                memory_mb: 3072,
                gpus: 1,
            },
            gpu_devices: &["0".to_owned(), "1".to_owned()],
            gpu_claims: &[7, 9],
            walltime: Some(Duration::from_secs(3600)),
            ends_at: Some("1800000000"),
        };
        let argv = std::iter::once(naming::LAUNCHER_SUBCOMMAND.to_owned()).chain(written.to_vec());
        let read = Command::try_parse_from(argv).unwrap().args;
        assert_eq!(read.job.as_str(), written.job);
        assert_eq!(read.cluster.as_str(), written.cluster);
        assert_eq!(read.id.as_str(), written.id);
        assert_eq!(read.slot, written.slot);
        assert_eq!(read.slots, written.slots);
        assert_eq!(read.task_slots, written.task_slots);
        assert_eq!(read.task_memory, Some(3072));
        assert_eq!(read.task_gpus, 1);
        assert_eq!(read.gpu_devices, written.gpu_devices);
        assert_eq!(read.gpu_claims, written.gpu_claims);
        assert_eq!(read.walltime, written.walltime);
        assert_eq!(read.ends_at.as_deref(), written.ends_at);
    }
}
