//! The launcher: one per placeholder slot, pulling its job's tasks.
//!
//! It consumes the job's task queue with prefetch equal to the tasks it runs
//! at once (more while tasks are short, see [`State::prefetch`]), and acks a
//! message (one task, or a bundle of them) only once each of its tasks has
//! its result safely with the broker or is back in the queue alone, so a
//! launcher that dies loses nothing but partial runs: the broker redelivers
//! the message, and the runner keeps the first result of each task. It
//! leaves when its job's queue is deleted, when it has been idle for
//! `idle_timeout`, or when told to (preempt, drain, SIGTERM, its
//! placeholder's walltime).
//!
//! What to do and when is decided in [`state`], without I/O; this file is the
//! shell that connects, turns what happens into events for it, and carries
//! out its effects.

mod consumers;
mod dirs;
mod exec;
mod gpus;
mod orphans;
mod task;

use consumers::{Consumers, Swap};
use gleaner_launcher_core::packing::Packer;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    ops::ControlFlow,
    sync::Arc,
    time::{Duration, Instant},
};

use gleaner_broker::{
    Broker, BrokerError, Connection, ConsumeOptions, Inbox, Incoming, Publisher, sleep_until,
    topology::{JobQueues, declare_launcher},
};
use gleaner_protocol::{
    Captured, ControlMsg, Core, GpusHeld, LauncherInfo, LauncherMsg, LauncherStatus, Now,
    OutputPiece, ResultBatch, ResultMsg, RunStatus, RunningTask, TaskBundle, TaskMsg, now_ms,
};
use tokio::{sync::watch, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, error_span, info, warn};

use dirs::{Checkpoints, Sandboxes};
use gleaner_launcher_core::state::{Effect, Event, State, Status, TaskEnd};
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
    /// The held GPUs no running task has.
    gpus: std::sync::Mutex<gpus::Pool>,
}

impl Shared {
    /// Devices for a task about to run; `None` if fewer are free.
    fn take_gpus(&self, count: u32) -> Option<Vec<String>> {
        let mut pool = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        pool.take(count)
    }

    fn give_back_gpus(&self, devices: Vec<String>) {
        if !devices.is_empty() {
            let mut pool = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
            pool.give_back(devices);
        }
    }
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
        gpus: std::sync::Mutex::new(gpus::Pool::new(gpus)),
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
/// [`State::prefetch`]).
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

/// The launcher's I/O: turns deliveries, messages, signals, timers and the
/// ends of spawned work into [`Event`]s for [`State`], and applies the
/// [`Effect`]s it answers.
struct Shell {
    shared: Arc<Shared>,
    /// The task consumer.
    tasks: Inbox<TaskBundle>,
    /// Which task consumer to hold ([`Consumers`]).
    swaps: Consumers,
    /// Task consumers replaced by one of a higher prefetch and cancelled,
    /// oldest first: what they still deliver is taken like any delivery.
    retiring: Vec<Inbox<TaskBundle>>,
    /// Task consumers opened so far, to tag each apart.
    consumers: u32,
    own: Inbox<LauncherMsg>,
    /// The own queue's consumer may still deliver.
    own_open: bool,
    signals: Signals,
    signalled: bool,
    drain_signalled: bool,
    /// Task runs and settlements, each for one delivery (its tag).
    work: JoinSet<(u64, Done)>,
    /// The delivery each spawned future is for, to settle it if it panics.
    work_tags: HashMap<tokio::task::Id, u64>,
    /// Tasks waiting for the effect that names them, by the tag given each.
    held: BTreeMap<u64, Held>,
    /// Messages not acked yet, by delivery tag: acked once each of their
    /// tasks is settled.
    deliveries: HashMap<u64, Delivery>,
    /// The tag the next delivered task gets.
    next_tag: u64,
    /// Turned true by [`Effect::StopTasks`]; every run watches it.
    stop: watch::Sender<bool>,
    /// The output of each running task (by tag), and how much of it went
    /// to followers.
    teed: HashMap<u64, Teed>,
}

/// A running task's output as far as its followers are concerned.
struct Teed {
    task: u64,
    attempt: u32,
    preemptions: u32,
    streams: exec::Streams,
    /// Offsets of stdout and stderr sent so far.
    sent: [u64; 2],
}

/// A delivered task in the shell's hands.
struct Held {
    task: TaskMsg,
    /// The message it came in (its delivery tag).
    delivery: u64,
    /// The run's outcome, once it ended by itself.
    outcome: Option<exec::Outcome>,
}

/// A message whose tasks are not all settled yet.
struct Delivery {
    incoming: Incoming<TaskBundle>,
    unsettled: usize,
}

/// What a spawned future hands back.
enum Done {
    /// The task's process is over (boxed: an outcome is large).
    Ran(Box<Held>),
    /// The result, republish, give-back or refusal of a task of this
    /// delivery is with the broker, or not.
    Settled {
        delivery: u64,
        sent: Result<(), BrokerError>,
    },
}

impl Shell {
    fn new(
        shared: Arc<Shared>,
        tasks: Inbox<TaskBundle>,
        own: Inbox<LauncherMsg>,
        signals: Signals,
    ) -> Self {
        Self {
            swaps: Consumers::new(initial_prefetch(&shared.config)),
            shared,
            tasks,
            retiring: Vec::new(),
            consumers: 1,
            own,
            own_open: true,
            signals,
            signalled: false,
            drain_signalled: false,
            work: JoinSet::new(),
            work_tags: HashMap::new(),
            held: BTreeMap::new(),
            deliveries: HashMap::new(),
            next_tag: 0,
            stop: watch::Sender::new(false),
            teed: HashMap::new(),
        }
    }

    /// Runs until the state says to leave.
    async fn serve(mut self) -> Result<Exit, LauncherError> {
        let mut state = State::new(&self.shared.config, Now::read());
        loop {
            let mut events = VecDeque::from(self.next_events(&state).await);
            while let Some(event) = events.pop_front() {
                let now = Now::read();
                match event {
                    Some(event) => state.handle(event, now),
                    None => state.handle_timeout(now),
                }
                while let Some(effect) = state.poll_effect(now) {
                    match self.apply(effect).await {
                        ControlFlow::Break(exit) => return exit,
                        ControlFlow::Continue(failure) => events.extend(failure.map(Some)),
                    }
                }
            }
        }
    }

    /// Waits for what happens next, looking in order: a replaced
    /// consumer's last deliveries come before the new one's, which the
    /// broker sent after them, so that tasks start in the order they were
    /// queued. `None` is the state's time event.
    async fn next_events(
        &mut self,
        state: &State<LauncherError>,
    ) -> Vec<Option<Event<LauncherError>>> {
        let events = tokio::select! {
            biased;
            delivery = next_retiring(&mut self.retiring), if !self.retiring.is_empty() && state.listening() => match delivery {
                Some(Ok(incoming)) => self.delivered(incoming).await,
                Some(Err(e)) => vec![Event::Failed(e.into())],
                None => {
                    self.retiring.remove(0);
                    self.swaps.retired_ended();
                    self.tasks_ended()
                }
            },
            delivery = self.tasks.next(), if self.swaps.may_deliver() && state.consuming() => match delivery {
                Some(Ok(incoming)) => self.delivered(incoming).await,
                Some(Err(e)) => vec![Event::Failed(e.into())],
                None => {
                    let swap = self.swaps.current_ended(self.deliveries.len());
                    let mut events = self.swap(swap).await;
                    events.extend(self.tasks_ended());
                    events
                }
            },
            () = self.signals.stop.cancelled(), if !self.signalled && state.listening() => {
                self.signalled = true;
                vec![Event::Signal]
            }
            () = self.signals.drain.cancelled(), if !self.drain_signalled && state.listening() => {
                self.drain_signalled = true;
                vec![Event::Message(LauncherMsg::Drain {
                    reason: "the batch system's warning (SIGUSR1)".to_owned(),
                })]
            }
            message = self.own.next(), if self.own_open && state.listening() => match message {
                Some(Ok(incoming)) => {
                    let _ = incoming.ack().await;
                    vec![Event::Message(incoming.msg)]
                }
                Some(Err(e)) => vec![Event::Failed(e.into())],
                None => {
                    self.own_open = false;
                    Vec::new()
                }
            },
            Some(joined) = self.work.join_next_with_id() => self.joined(joined).await,
            () = sleep_until(state.poll_timeout()) => return vec![None],
        };
        events.into_iter().map(Some).collect()
    }

    /// Each task of a message becomes a delivery of its own for the state.
    async fn delivered(&mut self, mut incoming: Incoming<TaskBundle>) -> Vec<Event<LauncherError>> {
        let delivery = incoming.delivery_tag();
        let tasks = std::mem::take(&mut incoming.msg.tasks);
        if tasks.is_empty() {
            return match incoming.ack().await {
                Ok(()) => Vec::new(),
                Err(e) => vec![Event::Failed(e.into())],
            };
        }
        let message_tasks = u32::try_from(tasks.len()).unwrap_or(u32::MAX);
        self.deliveries.insert(
            delivery,
            Delivery {
                incoming,
                unsettled: tasks.len(),
            },
        );
        tasks
            .into_iter()
            .map(|task| {
                let tag = self.next_tag;
                self.next_tag += 1;
                let event = Event::Delivered {
                    tag,
                    task: task.task,
                    preemptions: task.preemptions,
                    walltime: task.walltime_ms.map(Duration::from_millis),
                    message_tasks,
                    shape: task.shape,
                };
                self.held.insert(
                    tag,
                    Held {
                        task,
                        delivery,
                        outcome: None,
                    },
                );
                event
            })
            .collect()
    }

    /// One of a message's tasks is settled: the message is acked with its last.
    async fn settled(&mut self, delivery: u64) -> Result<(), BrokerError> {
        let Some(waiting) = self.deliveries.get_mut(&delivery) else {
            return Ok(());
        };
        waiting.unsettled = waiting.unsettled.saturating_sub(1);
        if waiting.unsettled > 0 {
            return Ok(());
        }
        match self.deliveries.remove(&delivery) {
            Some(done) => done.incoming.ack().await,
            None => Ok(()),
        }
    }

    async fn joined(
        &mut self,
        joined: Result<(tokio::task::Id, (u64, Done)), tokio::task::JoinError>,
    ) -> Vec<Event<LauncherError>> {
        let (tag, done) = match joined {
            Ok((id, done)) => {
                self.work_tags.remove(&id);
                done
            }
            Err(e) => {
                warn!(error = %e, "task supervisor failed");
                // Its delivery went with it, unacked: the broker redelivers it.
                return self
                    .work_tags
                    .remove(&e.id())
                    .map(|tag| Event::Settled { tag })
                    .into_iter()
                    .collect();
            }
        };
        match done {
            Done::Ran(held) => {
                let end = match &held.outcome {
                    None => TaskEnd::Killed,
                    Some(outcome) if signalled_from_outside(outcome) => TaskEnd::Signalled,
                    Some(_) => TaskEnd::Itself,
                };
                self.held.insert(tag, *held);
                vec![Event::Ended { tag, end }]
            }
            Done::Settled {
                delivery,
                sent: Ok(()),
            } => match self.settled(delivery).await {
                Ok(()) => {
                    let mut events = vec![Event::Settled { tag }];
                    let swap = self.swaps.settled(self.deliveries.len());
                    events.extend(self.swap(swap).await);
                    events
                }
                Err(e) => settle_failed(e, tag),
            },
            Done::Settled { sent: Err(e), .. } => settle_failed(e, tag),
        }
    }

    /// Applies one effect: leaving breaks, and a broker failure doing
    /// anything else comes back as an event.
    async fn apply(
        &mut self,
        effect: Effect<LauncherError>,
    ) -> ControlFlow<Result<Exit, LauncherError>, Option<Event<LauncherError>>> {
        let shared = self.shared.clone();
        match &effect {
            Effect::Report { tag }
            | Effect::Refuse { tag, .. }
            | Effect::GiveBack { tag }
            | Effect::Republish { tag }
            | Effect::Abandon { tag } => {
                self.teed.remove(tag);
            }
            _ => {}
        }
        match effect {
            Effect::Run { tag } => {
                if let Some(held) = self.held.remove(&tag) {
                    let streams = exec::Streams::default();
                    let teed = Teed {
                        task: held.task.task,
                        attempt: held.task.attempt,
                        preemptions: held.task.preemptions,
                        streams: streams.clone(),
                        sent: [0, 0],
                    };
                    self.teed.insert(tag, teed);
                    let run = run_task(shared, held, streams, self.stop.subscribe());
                    self.spawn(tag, run);
                }
            }
            Effect::Tee { tag } => self.tee(tag).await,
            Effect::Report { tag } => {
                if let Some(Held {
                    task,
                    delivery,
                    outcome: Some(outcome),
                }) = self.held.remove(&tag)
                {
                    self.settle(tag, delivery, report(shared, task, outcome));
                }
            }
            Effect::Refuse { tag, reason } => {
                if let Some(held) = self.held.remove(&tag) {
                    self.settle(tag, held.delivery, refuse(shared, held.task, reason));
                }
            }
            Effect::GiveBack { tag } => {
                if let Some(held) = self.held.remove(&tag) {
                    self.settle(tag, held.delivery, give_back(shared, held.task));
                }
            }
            Effect::Republish { tag } => {
                if let Some(held) = self.held.remove(&tag) {
                    self.settle(tag, held.delivery, republish(shared, held.task));
                }
            }
            Effect::Abandon { tag } => {
                // Its message stays unacked: the broker redelivers it whole
                // once this launcher is gone.
                self.held.remove(&tag);
            }
            Effect::StopConsuming => {
                let swap = self.swaps.stop();
                let failed = self.swap(swap).await.pop();
                return ControlFlow::Continue(failed.or_else(|| self.tasks_ended().pop()));
            }
            Effect::Prefetch(messages) => {
                let swap = self.swaps.prefetch(messages, self.deliveries.len());
                return ControlFlow::Continue(self.swap(swap).await.pop());
            }
            Effect::StopTasks => {
                self.stop.send_replace(true);
            }
            Effect::SendStatus(status) => {
                if let Err(e) = send_status(&shared, status).await {
                    return ControlFlow::Continue(Some(Event::Failed(e.into())));
                }
            }
            Effect::Leave(exit) => return ControlFlow::Break(exit),
        }
        ControlFlow::Continue(None)
    }

    /// The consumers have all ended (and no new one is due): the state
    /// hears it once nothing more can be delivered.
    fn tasks_ended(&self) -> Vec<Event<LauncherError>> {
        match self.swaps.all_ended() {
            true => vec![Event::TasksEnded],
            false => Vec::new(),
        }
    }

    /// Opens, replaces or cancels the task consumer, as [`Consumers`] says.
    async fn swap(&mut self, swap: Swap) -> Vec<Event<LauncherError>> {
        let done = match swap {
            Swap::Keep => Ok(()),
            Swap::Cancel => self.tasks.stop().await,
            Swap::Open { prefetch } => {
                let tag = self.next_consumer_tag();
                self.tasks.reopen(&tag, prefetch).await.map(|fresh| {
                    self.tasks = fresh;
                    self.swaps.opened();
                })
            }
            Swap::Replace { prefetch, retire } => {
                let tag = self.next_consumer_tag();
                match self.tasks.reopen(&tag, prefetch).await {
                    Ok(fresh) => {
                        self.swaps.opened();
                        let replaced = std::mem::replace(&mut self.tasks, fresh);
                        let stopped = replaced.stop().await;
                        if retire {
                            self.retiring.push(replaced);
                        }
                        stopped
                    }
                    Err(e) => Err(e),
                }
            }
        };
        match done {
            Ok(()) => Vec::new(),
            Err(e) => vec![broker_failure(e)],
        }
    }

    /// Sends a followed running task's output since the last piece to its
    /// job's runner, which relays it to the followers (the end of a run
    /// goes with its result). Followers may miss a piece: a failure costs
    /// nothing else.
    async fn tee(&mut self, tag: u64) {
        let Some(teed) = self.teed.get_mut(&tag) else {
            return;
        };
        let [stdout, stderr] = teed.streams.since(teed.sent);
        if stdout.data.is_empty() && stderr.data.is_empty() {
            return;
        }
        teed.sent = [&stdout, &stderr].map(|p| p.offset + p.data.len() as u64);
        let piece = ControlMsg::Output(OutputPiece {
            task: teed.task,
            attempt: teed.attempt,
            preemptions: teed.preemptions,
            launcher: self.shared.config.id.to_string(),
            stdout,
            stderr,
            ended: false,
        });
        let sent = self
            .shared
            .publisher
            .deliver_via(self.shared.queues.to_control(), &piece)
            .await;
        if let Err(e) = sent {
            debug!(task = teed.task, error = %e, "followed output not sent");
        }
    }

    fn next_consumer_tag(&mut self) -> String {
        self.consumers += 1;
        format!("{}#{}", self.shared.config.consumer_tag(), self.consumers)
    }

    fn spawn(&mut self, tag: u64, work: impl Future<Output = Done> + Send + 'static) {
        let id = self
            .work
            .spawn(async move { (tag, work.await) }.in_current_span())
            .id();
        self.work_tags.insert(id, tag);
    }

    fn settle(
        &mut self,
        tag: u64,
        delivery: u64,
        settlement: impl Future<Output = Result<(), BrokerError>> + Send + 'static,
    ) {
        self.spawn(tag, async move {
            Done::Settled {
                delivery,
                sent: settlement.await,
            }
        });
    }
}

/// A task's settlement failed: the fault first, so that the state ends for
/// it rather than for a drain this settlement completes.
fn settle_failed(e: BrokerError, tag: u64) -> Vec<Event<LauncherError>> {
    vec![broker_failure(e), Event::Settled { tag }]
}

/// The event a broker error is: the job's queues gone, or a failure.
fn broker_failure(e: BrokerError) -> Event<LauncherError> {
    match e.is_not_found() {
        true => Event::QueueGone,
        false => Event::Failed(e.into()),
    }
}

/// The next delivery of the oldest retiring consumer; `None` once it has
/// delivered everything.
async fn next_retiring(
    retiring: &mut [Inbox<TaskBundle>],
) -> Option<Result<Incoming<TaskBundle>, BrokerError>> {
    match retiring.first_mut() {
        Some(inbox) => inbox.next().await,
        None => std::future::pending().await,
    }
}

/// Runs one delivered task in a sandbox, unless the tasks were stopped before
/// it could start.
async fn run_task(
    shared: Arc<Shared>,
    held: Held,
    streams: exec::Streams,
    stop: watch::Receiver<bool>,
) -> Done {
    if *stop.borrow() {
        return Done::Ran(Box::new(held));
    }
    let config = &shared.config;
    let task = &held.task;
    let checkpoint = shared.checkpoints.take(task.task);
    if let Err(e) = &checkpoint {
        warn!(task = task.task, error = %e, "no checkpoint directory for the task");
    }
    let limit = config.limits.checkpoint_bytes;
    let given = checkpoint.as_ref().ok().map(|dir| (dir.as_path(), limit));
    let needs = config.task_needs;
    let Some(devices) = shared.take_gpus(needs.gpus) else {
        // A launcher runs only as many tasks as it holds devices for.
        error!(
            task = task.task,
            gpus = needs.gpus,
            "no free GPU for the task"
        );
        let outcome =
            exec::Outcome::not_started("no free GPU on its launcher".to_owned(), Instant::now());
        return Done::Ran(Box::new(Held {
            outcome: Some(outcome),
            ..held
        }));
    };
    let mut env = task::environment(task, config.task_slots, &devices, given);
    // The gleaner that runs it: a final step reads the job's output with
    // `"$GLEANER_BIN" logs`, wherever gleaner is installed on the node.
    static GLEANER_BIN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let exe = GLEANER_BIN.get_or_init(|| {
        std::env::current_exe()
            .ok()
            .map(|exe| exe.display().to_string())
    });
    if let Some(exe) = exe {
        env.push(("GLEANER_BIN".to_owned(), exe.clone()));
    }
    let sandbox = shared.sandboxes.take();
    let preempt = task
        .preempt_signal
        .as_deref()
        .and_then(gleaner_manifest::preempt_signal_number)
        .and_then(|n| nix::sys::signal::Signal::try_from(n).ok())
        .zip(task.preempt_grace_ms.map(Duration::from_millis));
    let run = exec::TaskRun {
        command: &task.command,
        env: &env,
        walltime: task.walltime_ms.map(Duration::from_millis),
        outputs: &task.outputs,
        workdir: task.workdir.as_deref().map(std::path::Path::new),
        sandbox: sandbox.clone(),
        preempt,
        memory_mb: (needs.memory_mb > 0).then_some(needs.memory_mb),
        streams,
    };
    debug!(task = task.task, attempt = task.attempt, "task started");
    let outcome = exec::run(run, config.limits, stop).await;
    shared.sandboxes.give_back(sandbox);
    shared.give_back_gpus(devices);
    // Kept for the next run unless it is over the limit.
    let ended_for_good = task::ended_for_good(task, outcome.as_ref().map(|o| o.status));
    if let Ok(checkpoint) = checkpoint {
        let oversized = !ended_for_good && exec::size_over(&checkpoint, limit);
        if oversized {
            warn!(task = task.task, path = %checkpoint.display(), limit, "checkpoint over max_checkpoint_bytes removed: the task's next run starts over");
        }
        if ended_for_good || oversized {
            shared.checkpoints.remove(checkpoint);
        }
    }
    if let Some(outcome) = &outcome {
        debug!(task = task.task, attempt = task.attempt, status = ?outcome.status, "task ended");
    }
    Done::Ran(Box::new(Held { outcome, ..held }))
}

/// Publishes the result of a run (or of a refusal).
async fn report(
    shared: Arc<Shared>,
    task: TaskMsg,
    outcome: exec::Outcome,
) -> Result<(), BrokerError> {
    let config = &shared.config;
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
        peak_memory_mb: outcome.peak_memory_mb,
        parted: None,
    };
    let stopped = || BrokerError::Connect("the launcher's result publisher stopped".to_owned());
    let (settled, done) = tokio::sync::oneshot::channel();
    shared
        .results
        .send(Outgoing { result, settled })
        .map_err(|_| stopped())?;
    done.await.unwrap_or_else(|_| Err(stopped()))
}

/// Fails a task no placeholder of this cluster could run, with the reason as
/// its stderr.
async fn refuse(shared: Arc<Shared>, task: TaskMsg, reason: String) -> Result<(), BrokerError> {
    let outcome = exec::Outcome {
        status: RunStatus::Failed,
        exit_code: None,
        signal: None,
        runtime: Duration::ZERO,
        stdout: Captured::default(),
        stderr: Captured {
            data: reason.into_bytes(),
            dropped: 0,
        },
        outputs: Vec::new(),
        error: None,
        peak_memory_mb: None,
    };
    report(shared, task, outcome).await
}

/// Returns a task this launcher will not run to the queue, unchanged and alone.
async fn give_back(shared: Arc<Shared>, task: TaskMsg) -> Result<(), BrokerError> {
    shared
        .publisher
        .send_via(shared.queues.to_tasks(), &task)
        .await
}

/// Returns a stopped task to the queue alone with one more preemption (not
/// a failure: its attempts are untouched).
async fn republish(shared: Arc<Shared>, task: TaskMsg) -> Result<(), BrokerError> {
    let again = TaskMsg {
        preemptions: task.preemptions.saturating_add(1),
        ..task.clone()
    };
    shared
        .publisher
        .send_via(shared.queues.to_tasks(), &again)
        .await?;
    info!(task = task.task, "task preempted and republished");
    Ok(())
}

/// Sends a status to the runner, start instants turned into wall-clock times.
async fn send_status(shared: &Shared, status: Status) -> Result<(), BrokerError> {
    let now = Instant::now();
    let wall = now_ms();
    let running = status
        .running
        .into_iter()
        .map(|running| RunningTask {
            task: running.task,
            preemptions: running.preemptions,
            started_at: wall
                .saturating_sub(now.saturating_duration_since(running.started).as_millis() as u64),
        })
        .collect();
    let status = ControlMsg::LauncherStatus(LauncherStatus {
        launcher: shared.config.id.clone(),
        cluster: shared.config.cluster.clone(),
        host: shared.config.host.clone(),
        running,
        completed: status.completed,
        heartbeat_ms: Some(shared.config.heartbeat.as_millis() as u64),
    });
    // The job's queues may be going away; the task consumer will tell.
    shared
        .publisher
        .deliver_via(shared.queues.to_control(), &status)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_outlive_a_launcher_unless_its_job_is_over() {
        for exit in [Exit::Idle, Exit::Preempted, Exit::Drained, Exit::Walltime] {
            assert!(exit.keeps_checkpoints(), "{exit:?}");
        }
        assert!(!Exit::JobOver.keeps_checkpoints());
    }
}
