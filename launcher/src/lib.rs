//! The launcher: one per placeholder slot, pulling its job's tasks.
//!
//! It consumes the job's task queue with prefetch equal to its slots and acks
//! a task only once its result is safely with the broker, so a launcher that
//! dies loses nothing but the partial run: the broker redelivers the task. It
//! leaves when its job's queue is deleted, when it has been idle for
//! `idle_timeout`, or when told to (preempt, drain, SIGTERM, its placeholder's
//! walltime).

mod exec;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use gleaner_broker::{
    Broker, BrokerError, ConsumeOptions, Inbox, Incoming, Publisher,
    topology::{JobQueues, declare_launcher},
};
use gleaner_protocol::{
        ControlMsg, LauncherInfo, LauncherMsg, LauncherStatus, ResultMsg, RunningTask, TaskMsg,
        now_ms,
    };
use gleaner_manifest::JobId;
use tokio::{sync::watch, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use exec::Limits;

/// Everything a launcher needs to know; the kcm passes most of it on the
/// command line.
#[derive(Debug, Clone)]
pub struct LauncherConfig {
    pub job: JobId,
    pub cluster: String,
    /// Unique among live launchers; names the launcher's own queue.
    pub id: String,
    pub host: String,
    /// The batch system's name for this slot (`3`, `4711.2`), for the consumer tag.
    pub slot: String,
    /// Tasks run at once.
    pub slots: u32,
    pub idle_timeout: Duration,
    pub heartbeat: Duration,
    /// When the placeholder's walltime ends, if it has one.
    pub deadline: Option<Instant>,
    /// Running tasks are preempted this long before `deadline`, so that the
    /// batch system's kill never costs a task its retry budget.
    pub deadline_margin: Duration,
    /// Where sandboxes are created.
    pub scratch: PathBuf,
    pub limits: Limits,
}

/// Why a launcher left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// No task came within `idle_timeout`.
    Idle,
    /// The job's task queue is gone: the job ended or was cancelled.
    JobOver,
    /// Preempted (message or signal): running tasks were republished.
    Preempted,
    /// Drained: running tasks finished, no new ones taken.
    Drained,
    /// The placeholder's walltime is ending.
    Walltime,
}

impl Exit {
    fn describe(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::JobOver => "job over",
            Self::Preempted => "preempted",
            Self::Drained => "drained",
            Self::Walltime => "walltime",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// What running tasks do when they are stopped before they end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopMode {
    /// Republish the task (preemption count +1) and ack the original.
    Republish,
    /// Nothing: the job is over.
    Abandon,
}

/// Shared between the main loop and the running tasks.
struct Shared {
    config: LauncherConfig,
    queues: JobQueues,
    publisher: Publisher,
    running: Mutex<BTreeMap<u64, RunningTask>>,
    stop_mode: Mutex<StopMode>,
    sandboxes: Sandboxes,
}

/// One sandbox directory per slot, emptied and reused from task to task.
struct Sandboxes {
    root: PathBuf,
    free: Mutex<Vec<PathBuf>>,
    made: std::sync::atomic::AtomicU64,
}

impl Sandboxes {
    fn new(root: PathBuf) -> Self {
        Self {
            root,
            free: Mutex::default(),
            made: Default::default(),
        }
    }

    fn take(&self) -> PathBuf {
        if let Some(dir) = self.free.lock().ok().and_then(|mut free| free.pop()) {
            return dir;
        }
        let n = self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.root.join(format!("s{n}"))
    }

    fn give_back(&self, dir: PathBuf) {
        if exec::reset_sandbox(&dir) {
            if let Ok(mut free) = self.free.lock() {
                free.push(dir);
            }
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// Leaves the node as it was found.
    fn remove_all(&self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Runs a launcher until it has a reason to leave. `signals` fires on
/// SIGTERM/SIGINT (and the batch system's kill warning): that is a preemption.
pub async fn run(
    broker: &Broker,
    config: LauncherConfig,
    signals: CancellationToken,
) -> Result<Exit, LauncherError> {
    let connection = broker.connect().await?;
    let publisher = connection.publisher().await?;
    let queues = JobQueues::new(&config.job);
    let tag = format!("launcher@{}/{}", config.host, config.slot);

    let own_channel = connection.channel().await?;
    let own_queue = declare_launcher(&own_channel, &config.id).await?;
    let mut own: Inbox<LauncherMsg> = Inbox::open(
        &own_channel,
        publisher.clone(),
        &own_queue,
        ConsumeOptions {
            tag: &tag,
            prefetch: 16,
            exclusive: false,
        },
    )
    .await?;

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
    });
    if let Err(e) = publisher.send(&queues.control, &info).await {
        return job_over_or(e);
    }
    let task_channel = connection.channel().await?;
    let prefetch = u16::try_from(config.slots.max(1)).unwrap_or(u16::MAX);
    let mut tasks: Inbox<TaskMsg> = match Inbox::open(
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
        Err(e) => return job_over_or(e),
    };
    info!(job = %config.job, launcher = %config.id, cluster = %config.cluster, slots = config.slots, "launcher up");

    let shared = Arc::new(Shared {
        sandboxes: Sandboxes::new(config.scratch.join(&config.id)),
        config,
        queues,
        publisher,
        running: Mutex::default(),
        stop_mode: Mutex::new(StopMode::Republish),
    });
    let result = serve(&shared, &mut tasks, &mut own, signals).await;
    shared.sandboxes.remove_all();
    let config = &shared.config;
    match &result {
        Ok(exit) => {
            let gone = ControlMsg::LauncherGone {
                launcher: config.id.clone(),
                cluster: config.cluster.clone(),
                reason: exit.describe().to_owned(),
            };
            if let Err(e) = shared.publisher.send(&shared.queues.control, &gone).await {
                debug!(launcher = %config.id, error = %e, "cannot say goodbye");
            }
            info!(job = %config.job, launcher = %config.id, cluster = %config.cluster, exit = exit.describe(), "launcher leaves");
        }
        Err(e) => {
            warn!(job = %config.job, launcher = %config.id, cluster = %config.cluster, error = %e, "launcher failed")
        }
    }
    connection.close().await;
    result
}

fn job_over_or(e: BrokerError) -> Result<Exit, LauncherError> {
    if e.is_not_found() {
        Ok(Exit::JobOver)
    } else {
        Err(e.into())
    }
}

async fn serve(
    shared: &Arc<Shared>,
    tasks: &mut Inbox<TaskMsg>,
    own: &mut Inbox<LauncherMsg>,
    signals: CancellationToken,
) -> Result<Exit, LauncherError> {
    let config = &shared.config;
    let (stop, stop_seen) = watch::channel(false);
    let mut running: JoinSet<Result<(), BrokerError>> = JoinSet::new();
    let mut heartbeat = tokio::time::interval(config.heartbeat);
    heartbeat.tick().await;
    let mut idle_since = Some(Instant::now());
    // `Some(reason)` once we stopped taking tasks; we leave when the last one ends.
    let mut leaving: Option<Exit> = None;
    let mut consuming = true;
    let mut completed = 0u64;
    let stop_at = config.deadline.map(|deadline| {
        deadline
            .checked_sub(config.deadline_margin)
            .unwrap_or(deadline)
    });
    // What a fresh placeholder like this one offers a task, start to stop.
    let window = stop_at.map(|stop| stop.saturating_duration_since(Instant::now()));
    let mut walltime_reached = false;

    loop {
        let idle_deadline = idle_since.map(|since| since + config.idle_timeout);
        let reason = tokio::select! {
            delivery = tasks.next(), if consuming => match delivery {
                Some(Ok(incoming)) => {
                    idle_since = None;
                    if fits(stop_at, &incoming.msg) {
                        running.spawn(run_task(shared.clone(), incoming, stop_seen.clone()));
                        None
                    } else if let Some(window) = window.filter(|w| {
                        incoming.msg.walltime_ms.is_some_and(|ms| Duration::from_millis(ms) > *w)
                    }) {
                        // No placeholder like this one could ever run it:
                        // a failed attempt, not a task passed on forever.
                        running.spawn(refuse(shared.clone(), incoming, window));
                        None
                    } else {
                        info!(job = %config.job, task = incoming.msg.task, launcher = %config.id, "task would outlast the placeholder; giving it back and draining");
                        running.spawn(give_back(shared.clone(), incoming));
                        Some(Exit::Walltime)
                    }
                }
                Some(Err(e)) => {
                    abandon(shared, &stop, &mut running).await;
                    return Err(e.into());
                }
                None => {
                    consuming = false;
                    if leaving.is_none() {
                        // Cancelled by the broker: the queue was deleted.
                        abandon(shared, &stop, &mut running).await;
                        return Ok(Exit::JobOver);
                    }
                    None
                }
            },
            Some(ended) = running.join_next() => {
                completed += 1;
                match ended {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) if e.is_not_found() => {
                        abandon(shared, &stop, &mut running).await;
                        return Ok(Exit::JobOver);
                    }
                    Ok(Err(e)) => {
                        abandon(shared, &stop, &mut running).await;
                        return Err(e.into());
                    }
                    Err(e) => warn!(launcher = %config.id, error = %e, "task supervisor failed"),
                }
                if running.is_empty() {
                    idle_since = Some(Instant::now());
                }
                None
            }
            message = own.next() => match message {
                Some(Ok(incoming)) => {
                    let _ = incoming.ack().await;
                    match incoming.msg {
                        LauncherMsg::Preempt { reason } => {
                            info!(job = %config.job, launcher = %config.id, reason, "preempted");
                            let _ = stop.send(true);
                            Some(Exit::Preempted)
                        }
                        LauncherMsg::Drain { reason } => {
                            info!(job = %config.job, launcher = %config.id, reason, "draining");
                            Some(Exit::Drained)
                        }
                        LauncherMsg::Poll {} => {
                            if let Err(e) = send_status(shared, completed).await {
                                abandon(shared, &stop, &mut running).await;
                                return Err(e);
                            }
                            None
                        }
                    }
                }
                Some(Err(e)) => {
                    abandon(shared, &stop, &mut running).await;
                    return Err(e.into());
                }
                None => None,
            },
            () = signals.cancelled(), if leaving != Some(Exit::Preempted) => {
                info!(job = %config.job, launcher = %config.id, "signalled: preempting own tasks");
                let _ = stop.send(true);
                Some(Exit::Preempted)
            }
            () = sleep_until(idle_deadline), if leaving.is_none() => Some(Exit::Idle),
            () = sleep_until(stop_at), if !walltime_reached && leaving != Some(Exit::Preempted) => {
                info!(job = %config.job, launcher = %config.id, "placeholder walltime ending: preempting own tasks");
                walltime_reached = true;
                let _ = stop.send(true);
                Some(Exit::Walltime)
            }
            _ = heartbeat.tick() => {
                if let Err(e) = send_status(shared, completed).await {
                    abandon(shared, &stop, &mut running).await;
                    return Err(e);
                }
                None
            }
        };
        if let Some(exit) = reason {
            let first = leaving.is_none();
            // A preemption overrides a drain already under way.
            if leaving.is_none() || exit == Exit::Preempted {
                leaving = Some(exit);
            }
            if first
                && consuming
                && let Err(e) = tasks.stop().await
            {
                abandon(shared, &stop, &mut running).await;
                return Err(e.into());
            }
        }
        // Leaving once no task runs and no delivery can arrive any more.
        if let Some(exit) = leaving
            && running.is_empty()
            && !consuming
        {
            return Ok(exit);
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

/// Whether a task's walltime fits before the launcher must stop. A task
/// without a walltime might take any time: it is taken while time remains.
fn fits(stop_at: Option<Instant>, task: &TaskMsg) -> bool {
    match (stop_at, task.walltime_ms) {
        (Some(stop_at), Some(walltime)) => {
            Instant::now() + Duration::from_millis(walltime) <= stop_at
        }
        _ => true,
    }
}

/// Fails a task whose walltime exceeds what any placeholder offers.
async fn refuse(
    shared: Arc<Shared>,
    incoming: Incoming<TaskMsg>,
    window: Duration,
) -> Result<(), BrokerError> {
    let config = &shared.config;
    let task = &incoming.msg;
    let reason = format!(
        "the task's walltime ({} s) exceeds what a placeholder of cluster {} offers ({} s)",
        task.walltime_ms.unwrap_or(0) / 1000,
        config.cluster,
        window.as_secs()
    );
    warn!(job = %task.job, task = task.task, launcher = %config.id, reason, "task refused");
    let result = ResultMsg {
        job: task.job.clone(),
        task: task.task,
        attempt: task.attempt,
        preemptions: task.preemptions,
        status: gleaner_protocol::RunStatus::Failed,
        exit_code: None,
        signal: None,
        runtime_ms: 0,
        launcher: config.id.clone(),
        cluster: config.cluster.clone(),
        host: config.host.clone(),
        stdout: Default::default(),
        stderr: gleaner_protocol::Captured {
            data: reason.into_bytes(),
            dropped: 0,
        },
        outputs: Vec::new(),
        error: None,
    };
    shared
        .publisher
        .send(&shared.queues.results, &result)
        .await?;
    incoming.ack().await
}

/// Returns a task this launcher will not run to the queue, unchanged.
async fn give_back(shared: Arc<Shared>, incoming: Incoming<TaskMsg>) -> Result<(), BrokerError> {
    shared
        .publisher
        .send(&shared.queues.tasks, &incoming.msg)
        .await?;
    incoming.ack().await
}

/// The job is over or the launcher is failing: kill everything, report nothing.
async fn abandon(
    shared: &Shared,
    stop: &watch::Sender<bool>,
    running: &mut JoinSet<Result<(), BrokerError>>,
) {
    if let Ok(mut mode) = shared.stop_mode.lock() {
        *mode = StopMode::Abandon;
    }
    let _ = stop.send(true);
    while running.join_next().await.is_some() {}
}

async fn send_status(shared: &Shared, completed: u64) -> Result<(), LauncherError> {
    let running = shared
        .running
        .lock()
        .map(|r| r.values().cloned().collect())
        .unwrap_or_default();
    let status = ControlMsg::LauncherStatus(LauncherStatus {
        launcher: shared.config.id.clone(),
        cluster: shared.config.cluster.clone(),
        running,
        completed,
    });
    match shared.publisher.send(&shared.queues.control, &status).await {
        Ok(()) => Ok(()),
        // The job's queues are going away; the task consumer will tell.
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Runs one delivered task and settles it: result published then task acked,
/// or (stopped) republished then acked, or (abandoned) left to the broker.
async fn run_task(
    shared: Arc<Shared>,
    incoming: Incoming<TaskMsg>,
    stop: watch::Receiver<bool>,
) -> Result<(), BrokerError> {
    let config = &shared.config;
    let task = &incoming.msg;
    let tag = incoming.delivery_tag();
    let started_at = now_ms();
    if let Ok(mut running) = shared.running.lock() {
        running.insert(
            tag,
            RunningTask {
                task: task.task,
                started_at,
            },
        );
    }
    let sandbox = shared.sandboxes.take();
    let stopped = *stop.borrow();
    let outcome = if stopped {
        None
    } else {
        let mut env = task.env.clone();
        env.extend([
            ("GLEANER_JOB".to_owned(), task.job.to_string()),
            ("GLEANER_TASK".to_owned(), task.task.to_string()),
            ("GLEANER_ATTEMPT".to_owned(), task.attempt.to_string()),
        ]);
        let workdir = task.workdir.as_deref().map(std::path::Path::new);
        let run = exec::TaskRun {
            command: &task.command,
            env: &env,
            walltime: task.walltime_ms.map(Duration::from_millis),
            outputs: &task.outputs,
            workdir,
            sandbox: sandbox.clone(),
        };
        debug!(job = %task.job, task = task.task, attempt = task.attempt, launcher = %config.id, "task started");
        exec::run(run, config.limits, stop).await
    };
    shared.sandboxes.give_back(sandbox);
    if let Ok(mut running) = shared.running.lock() {
        running.remove(&tag);
    }
    match outcome {
        Some(outcome) => {
            debug!(job = %task.job, task = task.task, attempt = task.attempt, launcher = %config.id, status = ?outcome.status, "task ended");
            let result = ResultMsg {
                job: task.job.clone(),
                task: task.task,
                attempt: task.attempt,
                preemptions: task.preemptions,
                status: outcome.status,
                exit_code: outcome.exit_code,
                signal: outcome.signal,
                runtime_ms: outcome.runtime.as_millis() as u64,
                launcher: config.id.clone(),
                cluster: config.cluster.clone(),
                host: config.host.clone(),
                stdout: outcome.stdout,
                stderr: outcome.stderr,
                outputs: outcome.outputs,
                error: outcome.error,
            };
            shared
                .publisher
                .send(&shared.queues.results, &result)
                .await?;
            incoming.ack().await
        }
        None => {
            let mode = shared
                .stop_mode
                .lock()
                .map_or(StopMode::Abandon, |mode| *mode);
            if mode == StopMode::Abandon {
                return Ok(());
            }
            let again = TaskMsg {
                preemptions: task.preemptions + 1,
                ..task.clone()
            };
            shared.publisher.send(&shared.queues.tasks, &again).await?;
            info!(job = %task.job, task = task.task, launcher = %config.id, "task preempted and republished");
            incoming.ack().await
        }
    }
}
