//! Starting the services, alone or all in one (`gleaner up`).

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use gleaner_broker::Broker;
use gleaner_kcm::{KcmConfig, LauncherCommand, LocalBackend, SgeBackend, SgeConfig};
use gleaner_launcher::{Exit, LauncherConfig, Limits};
use gleaner_manifest::JobId;
use gleaner_protocol::now_ms;
use gleaner_runner::{JobSettings, RunnerConfig};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::settings::{BackendKind, ClusterSettings, Settings};

pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

fn broker(settings: &Settings, role: &str) -> anyhow::Result<Broker> {
    Ok(Broker::new(
        &settings.broker_url,
        format!("{role}@{}", hostname()),
    )?)
}

pub async fn scheduler(settings: &Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    gleaner_scheduler::run(
        broker(settings, "scheduler")?,
        settings.scheduler.clone(),
        shutdown,
    )
    .await;
    Ok(())
}

pub async fn runner(settings: &Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let r = &settings.runner;
    let config = RunnerConfig {
        job: JobSettings {
            results_root: r.results_root.clone(),
            heartbeat: r.heartbeat,
            launcher_silence: settings.launcher.heartbeat * 3 + Duration::from_secs(5),
            preempt_grace: r.preempt_grace,
        },
        max_jobs: r.max_jobs,
    };
    gleaner_runner::run(broker(settings, "runner")?, config, shutdown).await;
    Ok(())
}

/// A name for the gleaner a broker URL serves (its host and vhost), so that
/// two deployments on one host never share a kcm's spool directory.
fn deployment(broker_url: &str) -> String {
    let rest = broker_url
        .split_once("://")
        .map_or(broker_url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let rest = rest.split('?').next().unwrap_or(rest);
    let (host, vhost) = rest.split_once('/').unwrap_or((rest, ""));
    let vhost = match vhost {
        "" | "%2f" | "%2F" => "default",
        other => other,
    };
    format!("{host}-{vhost}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// How this very binary starts a launcher, with the settings it runs under:
/// the same configuration file and `GLEANER_*` overrides, wherever it runs.
fn launcher_command(settings: &Settings) -> anyhow::Result<LauncherCommand> {
    let program = std::env::current_exe().context("cannot find the gleaner executable")?;
    let mut env = crate::settings::environment_overrides();
    env.retain(|(key, _)| key != "GLEANER_BROKER_URL");
    env.push(("GLEANER_BROKER_URL".to_owned(), settings.broker_url.clone()));
    if let Some(source) = &settings.source {
        env.push(("GLEANER_CONFIG".to_owned(), source.display().to_string()));
    }
    Ok(LauncherCommand {
        program,
        args: vec!["launcher".to_owned()],
        env,
    })
}

pub async fn kcm(
    settings: &Settings,
    cluster: &ClusterSettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let config = KcmConfig {
        cluster: cluster.name.clone(),
        poll_interval: cluster.poll_interval,
        job_end_grace: Duration::from_secs(10),
        local_settle: settings.runner.preempt_grace + cluster.poll_interval * 2,
        spool_dir: cluster.spool_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir()
                .join("gleaner-kcm")
                .join(deployment(&settings.broker_url))
                .join(&cluster.name)
        }),
    };
    let broker = broker(settings, &format!("kcm.{}", cluster.name))?;
    match cluster.backend {
        BackendKind::Local => {
            let slots = cluster.slots.unwrap_or(1);
            let backend = LocalBackend::new(
                &cluster.name,
                slots,
                cluster.launcher_slots,
                launcher_command(settings)?,
            );
            gleaner_kcm::run(broker, config, backend, shutdown).await;
        }
        BackendKind::Sge => {
            let backend = SgeBackend::new(SgeConfig {
                cluster: cluster.name.clone(),
                queue: cluster.queue.clone().unwrap_or_default(),
                h_rt: cluster.h_rt,
                log_dir: cluster.log_dir.clone(),
                command_timeout: cluster.command_timeout,
                launcher: launcher_command(settings)?,
            });
            gleaner_kcm::run(broker, config, backend, shutdown).await;
        }
    }
    Ok(())
}

/// What the kcm tells a launcher on its command line.
#[derive(Debug, clap::Args)]
pub struct LauncherArgs {
    #[arg(long)]
    pub job: JobId,
    #[arg(long)]
    pub cluster: String,
    /// Unique launcher id (names its queue).
    #[arg(long)]
    pub id: String,
    /// The batch system's name for the slot, for the consumer tag.
    #[arg(long, default_value = "0")]
    pub slot: String,
    /// Tasks run at once.
    #[arg(long, default_value_t = 1)]
    pub slots: u32,
    /// The placeholder's walltime, from the launcher's start (`3600s`, `1h`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub walltime: Option<Duration>,
}

pub async fn launcher(
    settings: &Settings,
    args: LauncherArgs,
    signals: CancellationToken,
) -> anyhow::Result<Exit> {
    let host = hostname();
    let l = &settings.launcher;
    let config = LauncherConfig {
        job: args.job,
        cluster: args.cluster,
        id: args.id,
        host: host.clone(),
        slot: args.slot.clone(),
        slots: args.slots,
        idle_timeout: l.idle_timeout,
        heartbeat: l.heartbeat,
        deadline: args.walltime.map(|w| std::time::Instant::now() + w),
        deadline_margin: l.deadline_margin,
        scratch: scratch_dir(&l.scratch),
        limits: Limits {
            stream_bytes: l.max_stream_bytes,
            file_bytes: l.max_file_bytes,
            outputs_bytes: l.max_outputs_bytes,
            kill_grace: l.kill_grace,
        },
    };
    let broker = Broker::new(
        &settings.broker_url,
        format!("launcher@{host}/{}", args.slot),
    )?;
    Ok(gleaner_launcher::run(&broker, config, signals).await?)
}

fn scratch_dir(base: &std::path::Path) -> PathBuf {
    base.join(format!("{}", nix::unistd::getuid()))
}

/// `gleaner up`: scheduler, runner and cluster managers in one process. With
/// `--slots`, or when no cluster is configured, one local cluster; otherwise
/// every configured cluster.
pub async fn up(
    settings: Settings,
    slots: Option<u32>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let clusters = match (slots, settings.clusters.is_empty()) {
        (None, false) => settings.clusters.clone(),
        _ => vec![ClusterSettings {
            name: "local".to_owned(),
            backend: BackendKind::Local,
            slots: Some(slots.unwrap_or_else(default_slots)),
            launcher_slots: 1,
            poll_interval: Duration::from_secs(1),
            queue: None,
            h_rt: None,
            log_dir: None,
            command_timeout: Duration::from_secs(30),
            spool_dir: None,
        }],
    };
    let results = std::path::absolute(&settings.runner.results_root)
        .unwrap_or_else(|_| settings.runner.results_root.clone());
    let described: Vec<String> = clusters
        .iter()
        .map(|c| match c.backend {
            BackendKind::Local => format!("{} (local, {} slots)", c.name, c.slots.unwrap_or(0)),
            BackendKind::Sge => format!(
                "{} (sge queue {})",
                c.name,
                c.queue.as_deref().unwrap_or("?")
            ),
        })
        .collect();
    eprintln!(
        "gleaner up: broker {}, clusters {}, results under {}",
        gleaner_broker::redact(&settings.broker_url),
        described.join(", "),
        results.display()
    );
    if let Some(ui) = management_ui(&settings.broker_url).await {
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

/// The management UI's address, if the plugin answers on the broker's host.
async fn management_ui(broker_url: &str) -> Option<String> {
    let host = broker_url
        .split_once("://")
        .map(|(_, rest)| rest)
        .map(|rest| rest.rsplit_once('@').map_or(rest, |(_, h)| h))
        .and_then(|rest| rest.split(['/', '?']).next())
        .map(|hostport| hostport.rsplit_once(':').map_or(hostport, |(h, _)| h))
        .filter(|h| !h.is_empty())
        .unwrap_or("127.0.0.1")
        .to_owned();
    let url = format!("http://{host}:15672/");
    let probe = url.clone();
    let answered = tokio::task::spawn_blocking(move || {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(700)))
            .build()
            .new_agent();
        agent.get(&probe).call().is_ok()
    })
    .await
    .unwrap_or(false);
    answered.then_some(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployments_are_told_apart_by_host_and_vhost() {
        assert_eq!(
            deployment(gleaner_broker::DEFAULT_URL),
            "127.0.0.1_5672-default"
        );
        assert_eq!(
            deployment("amqp://u:p@broker:5672/science?heartbeat=10"),
            "broker_5672-science"
        );
        assert_ne!(deployment("amqp://h/a"), deployment("amqp://h/b"));
    }
}
