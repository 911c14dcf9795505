//! The launcher's shell proper: the loop that turns deliveries, messages,
//! signals, the state's wake-ups and the ends of spawned work into events
//! for [`LauncherCore`], and carries out its effects (running, reporting,
//! refusing, giving back and republishing tasks).

use super::*;

/// The launcher's I/O: turns deliveries, messages, signals, timers and the
/// ends of spawned work into [`Event`]s for [`LauncherCore`], and applies the
/// [`Effect`]s it answers.
pub(crate) struct Shell {
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
    pub(crate) fn new(
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
    pub(crate) async fn serve(mut self) -> Result<Exit, LauncherError> {
        let mut state = LauncherCore::new(&self.shared.config, &self.shared.gpus, Now::read());
        loop {
            let events = self.next_events(&state).await;
            if let Some(exit) = turn(&mut state, &mut self, events).await {
                return exit;
            }
        }
    }

    /// Waits for what happens next, looking in order: a replaced
    /// consumer's last deliveries come before the new one's, which the
    /// broker sent after them, so that tasks start in the order they were
    /// queued. `None` is the state's time event.
    async fn next_events(
        &mut self,
        state: &LauncherCore<LauncherError>,
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
                let event = Event::delivered(tag, &task, message_tasks);
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

impl Io<LauncherError> for Shell {
    fn now(&self) -> Now {
        Now::read()
    }

    /// Applies one effect; a broker failure doing it comes back as an
    /// event, as does the task consumer's end once it is cancelled.
    async fn apply(&mut self, effect: Effect<LauncherError>) -> Vec<Event<LauncherError>> {
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
            Effect::Run { tag, gpus } => {
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
                    let run = run_task(shared, held, gpus, streams, self.stop.subscribe());
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
                return failed
                    .or_else(|| self.tasks_ended().pop())
                    .into_iter()
                    .collect();
            }
            Effect::Prefetch(messages) => {
                let swap = self.swaps.prefetch(messages, self.deliveries.len());
                return self.swap(swap).await.pop().into_iter().collect();
            }
            Effect::StopTasks => {
                self.stop.send_replace(true);
            }
            Effect::SendStatus(status) => {
                if let Err(e) = send_status(&shared, status).await {
                    return vec![Event::Failed(e.into())];
                }
            }
            // Ends the turn before it is carried out.
            Effect::Leave(_) => {}
        }
        Vec::new()
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
    devices: Vec<String>,
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
    let status = status.into_message(&shared.config, Now::read());
    // The job's queues may be going away; the task consumer will tell.
    shared
        .publisher
        .deliver_via(shared.queues.to_control(), &status)
        .await
        .map(|_| ())
}
