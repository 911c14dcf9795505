//! The launcher: one per placeholder slot, pulling its job's tasks.
//!
//! It consumes the job's task queue with prefetch equal to the tasks it runs
//! at once (more while tasks are short, see [`LauncherCore::prefetch`]), and acks a
//! message (one task, or a bundle of them) only once each of its tasks has
//! its result safely with the broker or is back in the queue alone, so a
//! launcher that dies loses nothing but partial runs: the broker redelivers
//! the message, and the runner keeps the first result of each task. It
//! leaves when its job's queue is deleted, when it has been idle for
//! `idle_timeout`, or when told to (preempt, drain, SIGTERM, its
//! placeholder's walltime).
//!
//! What to do and when is decided in [`core`], without I/O; this file is the
//! shell that connects, turns what happens into events for it, and carries
//! out its effects.

mod dirs;
mod exec;
mod gpus;
mod orphans;
mod shell;
mod task;

use gleaner_launcher_core::consumers::{Consumers, Swap};
use gleaner_launcher_core::io::{Io, turn};
use gleaner_launcher_core::packing::Packer;
use shell::Shell;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use gleaner_broker::{
    Broker, BrokerError, Connection, ConsumeOptions, Inbox, Incoming, Publisher, sleep_until,
    topology::{JobQueues, declare_launcher},
};
use gleaner_protocol::{
    Captured, ControlMsg, Core, GpusHeld, LauncherInfo, LauncherMsg, Now, OutputPiece, ResultBatch,
    ResultMsg, RunStatus, TaskBundle, TaskMsg, now_ms,
};
use tokio::{sync::watch, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error_span, info, warn};

use dirs::{Checkpoints, Sandboxes};
use gleaner_launcher_core::core::{Effect, Event, LauncherCore, Status, TaskEnd};
pub use gleaner_launcher_core::{Exit, GpuSource, LauncherConfig, LauncherSettings, Limits};

#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("scratch directory {path}: {reason}")]
    Scratch { path: String, reason: String },
    #[error("GPUs: {0}")]
    Gpus(String),
}

/// Makes the scratch directory (`<base>/<uid>`) private to this account
/// (mode 0700), or, if it is there, checks that it is a real directory of
/// this account's that nobody else may write to, on a way only root and
/// this account can change ([`gleaner_contain::shared`]): on a shared
/// `/tmp`, another user could have put a link or a directory of theirs in
/// its place, or, owning the base, swap it for one later.
fn private_scratch(dir: &std::path::Path) -> Result<(), LauncherError> {
    let failed = |reason: String| LauncherError::Scratch {
        path: dir.display().to_string(),
        reason,
    };
    let (Some(base), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str())) else {
        return Err(failed("not a directory in a base directory".to_owned()));
    };
    let me = nix::unistd::geteuid();
    gleaner_contain::shared::shared_base(base, me).map_err(|e| failed(e.to_string()))?;
    gleaner_contain::shared::private_dir(base, name, (me, nix::unistd::getegid()), me, 0o700)
        .map(|_| ())
        .map_err(|e| failed(e.to_string()))
}

/// Shared between the shell's loop and the futures it spawns.
struct Shared {
    config: LauncherConfig,
    queues: JobQueues,
    publisher: Publisher,
    sandboxes: Sandboxes,
    checkpoints: Checkpoints,
    /// To [`publish_results`].
    results: tokio::sync::mpsc::UnboundedSender<Outgoing>,
    /// The GPUs held for the launcher's tasks (its core hands them out).
    gpus: Vec<String>,
}

/// A run's result on its way out, and who waits for the broker to have it.
struct Outgoing {
    result: ResultMsg,
    settled: tokio::sync::oneshot::Sender<Result<(), BrokerError>>,
}

/// How long a message of results waits for more while they come fast.
const RESULTS_LINGER: Duration = Duration::from_millis(5);

/// Publishes results as they come, those that queued while the last
/// message was being confirmed together in the next, as the [`Packer`]
/// packs them (waiting up to [`RESULTS_LINGER`] for more while they come
/// fast). Each waiter hears once its result is with the broker.
async fn publish_results(
    publisher: Publisher,
    route: (String, String),
    mut outgoing: tokio::sync::mpsc::UnboundedReceiver<Outgoing>,
) {
    let size = |o: &Outgoing| o.result.weight();
    let route = (route.0.as_str(), route.1.as_str());
    // A result that would have made the last message too big starts the next.
    let mut carried: Option<Outgoing> = None;
    let mut packer = Packer::default();
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match outgoing.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let Some(first) = send_parts(&publisher, route, first).await else {
            continue;
        };
        packer.start(size(&first));
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + RESULTS_LINGER;
        while packer.has_room() {
            let next = match outgoing.try_recv() {
                Ok(next) => next,
                Err(_) if !packer.lingers() => break,
                Err(_) => match tokio::time::timeout_at(until, outgoing.recv()).await {
                    Ok(Some(next)) => next,
                    Ok(None) | Err(_) => break,
                },
            };
            let Some(next) = send_parts(&publisher, route, next).await else {
                continue;
            };
            if !packer.take(size(&next)) {
                carried = Some(next);
                break;
            }
            batch.push(next);
        }
        packer.sent();
        let (results, waiting): (Vec<ResultMsg>, Vec<_>) =
            batch.into_iter().map(|o| (o.result, o.settled)).unzip();
        let batch = ResultBatch {
            results,
            part: None,
        };
        let sent = publisher.send_via(route, &batch).await;
        for settled in waiting {
            let _ = settled.send(sent.clone());
        }
    }
}

/// Sends a run's output ahead of it in parts if it is too much for one
/// message, and gives back the result to send (without that data). A part
/// the broker would not take settles the result with the error.
async fn send_parts(publisher: &Publisher, route: (&str, &str), o: Outgoing) -> Option<Outgoing> {
    let Outgoing { result, settled } = o;
    let (parts, result) = result.into_parts(rand::random());
    for part in parts {
        let part = ResultBatch {
            results: Vec::new(),
            part: Some(part),
        };
        if let Err(e) = publisher.send_via(route, &part).await {
            let _ = settled.send(Err(e));
            return None;
        }
    }
    Some(Outgoing { result, settled })
}

/// A run that failed of a SIGTERM or SIGINT: the launcher kills its own
/// tasks otherwise (and then has no outcome), so someone else sent it.
fn signalled_from_outside(outcome: &exec::Outcome) -> bool {
    use nix::sys::signal::Signal::{SIGINT, SIGTERM};
    outcome.status == RunStatus::Failed
        && outcome
            .signal
            .is_some_and(|signal| signal == SIGTERM as i32 || signal == SIGINT as i32)
}

/// What the batch system's signals ask of a launcher.
#[derive(Debug, Clone, Default)]
pub struct Signals {
    /// Give the running tasks back and leave (SIGTERM, SIGINT, and Grid
    /// Engine's kill warning SIGUSR2): a preemption.
    pub stop: CancellationToken,
    /// Take no more tasks and leave once the running ones are done
    /// (SIGUSR1: Slurm's warning before the time limit or at preemption,
    /// Grid Engine's before a suspension).
    pub drain: CancellationToken,
}

/// Runs a launcher until it has a reason to leave, or a signal gives it one.
pub async fn run(
    broker: &Broker,
    config: LauncherConfig,
    signals: Signals,
) -> Result<Exit, LauncherError> {
    let span = error_span!("launcher", job = %config.job, launcher = %config.id, cluster = %config.cluster, host = %config.host);
    launch(broker, config, signals).instrument(span).await
}

/// [`run`], in the launcher's span.
async fn launch(
    broker: &Broker,
    config: LauncherConfig,
    signals: Signals,
) -> Result<Exit, LauncherError> {
    private_scratch(&config.scratch)?;
    private_scratch(&config.checkpoints)?;
    if let Err(e) = gleaner_contain::prompt_wakeups() {
        debug!(error = %e, "the kernel keeps its default slice for the launcher");
    }
    if !orphans::adopt() {
        warn!(
            "cannot be the subreaper of its tasks: processes they move out of their group may outlive them"
        );
    }
    if let Err(why) = orphans::contain() {
        debug!(
            why,
            "tasks contained by process group and subreaper, without cgroups"
        );
    }
    let gpus = config
        .task_needs
        .gpus
        .saturating_mul(config.tasks_at_once());
    let held = match gpus::acquire(&config.gpu_source, gpus) {
        Ok(held) => held,
        Err(short) => {
            if !short.claimed.is_empty() {
                tell_gpus_held(broker, &config, short.claimed).await;
            }
            return Err(LauncherError::Gpus(short.reason));
        }
    };
    if !held.devices.is_empty() {
        info!(gpus = held.devices.join(","), "GPUs held");
    }
    let checkpoints = config.checkpoints.join(config.job.as_str());
    let served = serve(broker, config, signals, &held.devices).await;
    orphans::release();
    if served.as_ref().is_ok_and(|exit| !exit.keeps_checkpoints()) {
        let _ = std::fs::remove_dir_all(checkpoints);
    }
    served
}

/// How long a launcher that cannot claim its GPUs tries to say so.
const TELL_TIMEOUT: Duration = Duration::from_secs(20);

/// Tells the job's runner, for its kcm, which of the host's GPUs were
/// claimed when this launcher looked: where more are than gleaner's
/// launchers there hold, someone outside gleaner holds them, and this
/// placeholder's end is counted against no one. Said in place of
/// `LauncherUp`: a launcher that cannot run its tasks is not up.
async fn tell_gpus_held(broker: &Broker, config: &LauncherConfig, mut devices: Vec<String>) {
    devices.retain(|d| gleaner_protocol::is_device_name(d));
    devices.truncate(gleaner_protocol::MAX_HELD_GPUS);
    warn!(
        gpus = devices.join(","),
        "GPUs the batch system counted free are claimed by another process"
    );
    let held = ControlMsg::GpusHeld(GpusHeld {
        launcher: config.id.clone(),
        cluster: config.cluster.clone(),
        host: config.host.clone(),
        devices,
    });
    let told = async {
        let connection = broker.connect().await?;
        let sent = match connection.publisher().await {
            Ok(publisher) => {
                publisher
                    .send_via(JobQueues::new(&config.job).to_control(), &held)
                    .await
            }
            Err(e) => Err(e),
        };
        connection.close().await;
        sent
    };
    match tokio::time::timeout(TELL_TIMEOUT, told).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "cannot tell the job which GPUs are claimed"),
        Err(_) => warn!("cannot tell the job which GPUs are claimed: the broker did not answer"),
    }
}

/// What a launcher holds once it is up.
struct Up {
    connection: Connection,
    publisher: Publisher,
    queues: JobQueues,
    own: Inbox<LauncherMsg>,
    tasks: Inbox<TaskBundle>,
}

/// How long getting up may take: a broker that stops answering midway (a
/// vhost deleted as the job ends, say) must not keep a placeholder.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Connects, says it is up, and opens its consumers; `Err` with how the
/// launcher ends if it cannot.
async fn start(
    broker: &Broker,
    config: &LauncherConfig,
) -> Result<Up, Result<Exit, LauncherError>> {
    let up = async {
        let connection = broker.connect().await.map_err(|e| Err(e.into()))?;
        let publisher = connection.publisher().await.map_err(|e| Err(e.into()))?;
        let queues = JobQueues::new(&config.job);
        let tag = config.consumer_tag();
        let own_channel = connection.channel().await.map_err(|e| Err(e.into()))?;
        let own_queue = declare_launcher(&own_channel, &config.job, &config.id)
            .await
            .map_err(|e| Err(e.into()))?;
        let own: Inbox<LauncherMsg> = Inbox::open(
            &own_channel,
            publisher.clone(),
            &own_queue,
            ConsumeOptions {
                tag: &tag,
                prefetch: 16,
                exclusive: false,
            },
        )
        .await
        .map_err(|e| Err(e.into()))?;

        let info = ControlMsg::LauncherUp(LauncherInfo {
            launcher: config.id.clone(),
            cluster: config.cluster.clone(),
            host: config.host.clone(),
            slots: config.slots,
            started_at: now_ms(),
            deadline: config.deadline.map(|deadline| {
                now_ms()
                    + deadline
                        .saturating_duration_since(Instant::now())
                        .as_millis() as u64
            }),
            heartbeat_ms: Some(config.heartbeat.as_millis() as u64),
        });
        // Its runner hears it, and tells its kcm that this start went well.
        if let Err(e) = publisher.send_via(queues.to_control(), &info).await {
            return Err(job_over_or(e));
        }
        let task_channel = connection.channel().await.map_err(|e| Err(e.into()))?;
        let prefetch = initial_prefetch(config);
        let tasks: Inbox<TaskBundle> = match Inbox::open(
            &task_channel,
            publisher.clone(),
            &queues.tasks,
            ConsumeOptions {
                tag: &tag,
                prefetch,
                exclusive: false,
            },
        )
        .await
        {
            Ok(inbox) => inbox,
            Err(e) => return Err(job_over_or(e)),
        };
        Ok(Up {
            connection,
            publisher,
            queues,
            own,
            tasks,
        })
    };
    match tokio::time::timeout(STARTUP_TIMEOUT, up).await {
        Ok(up) => up,
        Err(_) => Err(Err(LauncherError::Broker(BrokerError::Connect(format!(
            "the broker did not answer within {STARTUP_TIMEOUT:?} while the launcher was starting"
        ))))),
    }
}

async fn serve(
    broker: &Broker,
    config: LauncherConfig,
    signals: Signals,
    gpus: &[String],
) -> Result<Exit, LauncherError> {
    let Up {
        connection,
        publisher,
        queues,
        own,
        tasks,
    } = match start(broker, &config).await {
        Ok(up) => up,
        Err(ending) => return ending,
    };
    info!(slots = config.slots, "launcher up");

    let (results, outgoing) = tokio::sync::mpsc::unbounded_channel();
    let (exchange, key) = queues.to_results();
    // It ends once the last sender (in `shared`) is gone.
    tokio::spawn(
        publish_results(
            publisher.clone(),
            (exchange.to_owned(), key.to_owned()),
            outgoing,
        )
        .in_current_span(),
    );
    let shared = Arc::new(Shared {
        sandboxes: Sandboxes::new(config.scratch.join(config.id.as_str())),
        checkpoints: Checkpoints::new(
            config.checkpoints.join(config.job.as_str()),
            config.id.as_str(),
        ),
        config,
        queues,
        publisher,
        results,
        gpus: gpus.to_vec(),
    });
    let result = Shell::new(shared.clone(), tasks, own, signals)
        .serve()
        .await;
    shared.sandboxes.remove_all();
    shared.checkpoints.remove_spares();
    let config = &shared.config;
    match &result {
        Ok(exit) => {
            let gone = ControlMsg::LauncherGone {
                launcher: config.id.clone(),
                cluster: config.cluster.clone(),
                reason: exit.describe().to_owned(),
            };
            if let Err(e) = shared
                .publisher
                .send_via(shared.queues.to_control(), &gone)
                .await
            {
                debug!(error = %e, "cannot say goodbye");
            }
            info!(exit = exit.describe(), "launcher leaves");
        }
        Err(e) => {
            warn!(error = %e, "launcher failed")
        }
    }
    connection.close().await;
    result
}

/// One message per task it runs at once, to begin with (see
/// [`LauncherCore::prefetch`]).
fn initial_prefetch(config: &LauncherConfig) -> u16 {
    u16::try_from(config.tasks_at_once()).unwrap_or(u16::MAX)
}

fn job_over_or(e: BrokerError) -> Result<Exit, LauncherError> {
    if e.is_not_found() {
        Ok(Exit::JobOver)
    } else {
        Err(e.into())
    }
}
