//! Everything a launcher decides, apart from the I/O that carries it out.
//!
//! [`LauncherCore`] is told what happened — a task delivered, a task's process
//! over, a delivery settled with the broker, a message on the launcher's own
//! queue, a signal, the clock reaching [`Core::poll_timeout`] — together
//! with the time, and keeps the [`Effect`]s the shell (`lib.rs`) must apply
//! until it polls them ([`Core`]).
//! It decides which tasks to run, refuse or give back, how many to hold
//! ahead of its slots, when to stop taking tasks, when to stop running ones and whether they are then republished or
//! abandoned, when to report status, and when and why to leave.
//!
//! It touches no broker, process, file or clock: the time is an argument, so
//! every decision, the timed ones included, is tested here without RabbitMQ
//! and without waiting.

use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, Instant},
};

use gleaner_manifest::TaskShape;
use gleaner_protocol::{
    ClusterName, ControlMsg, Core, LauncherMsg, LauncherStatus, Now, Outbox, RunningTask, TaskMsg,
};
use tracing::{info, warn};

use crate::{Exit, LauncherConfig, gpus::Pool};

/// Tasks that run shorter than this on average are read ahead: a round trip
/// to the broker (some milliseconds, more through a replicated broker) is
/// then a share of their run worth saving. The cost is imbalance: a task
/// held waits up to a task's run time while another launcher may idle.
const READ_AHEAD_BELOW: Duration = Duration::from_secs(5);

/// Tasks that run longer than this on average are not read ahead any more.
const NO_READ_AHEAD_ABOVE: Duration = Duration::from_secs(20);

/// Messages held per slot at most while reading ahead.
const MOST_PER_SLOT: u32 = 8;

/// How often a followed task's new output is sent: a follower sees it
/// within this and the broker's round trips.
const TEE_EVERY: Duration = Duration::from_millis(250);

/// The longest a follow lasts without being renewed.
const LONGEST_FOLLOW: Duration = Duration::from_secs(30);

/// Tasks followed at once at most (a follow is for a task that runs here
/// or may start here: a job's runner asks every launcher when it does not
/// know which runs it).
const MOST_FOLLOWED: usize = 256;

/// Something that happened, as the shell saw it. Delivered tasks are named
/// by a tag the shell gives each, unique in the launcher (a message may
/// carry a bundle of tasks). `E` is the shell's error,
/// handed back when the launcher leaves because of it.
#[derive(Debug)]
pub enum Event<E> {
    /// A task arrived from the job's task queue.
    Delivered {
        tag: u64,
        task: u64,
        /// Times the task was preempted before: the runner hears it, to
        /// spare a task preempted often.
        preemptions: u32,
        walltime: Option<Duration>,
        /// Tasks in the message it came in (a bundle's, or 1).
        message_tasks: u32,
        /// A shape of its own, unlike the job's tasks' (a final step's).
        shape: Option<TaskShape>,
    },
    /// The task consumer ended: cancelled by us, or by the broker because the
    /// job's task queue was deleted.
    TasksEnded,
    /// A task's process is over, as `end` says.
    Ended { tag: u64, end: TaskEnd },
    /// The shell is done with a delivery: acked once its result, republish,
    /// give-back or refusal was confirmed by the broker (or lost with a failed
    /// supervisor, for the broker to redeliver).
    Settled { tag: u64 },
    /// The broker says the job's queues are gone.
    QueueGone,
    /// The broker connection or a channel failed.
    Failed(E),
    /// A message on the launcher's own queue.
    Message(LauncherMsg),
    /// SIGTERM, SIGINT or the batch system's kill warning.
    Signal,
}

impl<E> Event<E> {
    /// `task` delivered under `tag`, in a message of `message_tasks` tasks.
    pub fn delivered(tag: u64, task: &TaskMsg, message_tasks: u32) -> Self {
        Self::Delivered {
            tag,
            task: task.task,
            preemptions: task.preemptions,
            walltime: task.walltime_ms.map(Duration::from_millis),
            message_tasks,
            shape: task.shape,
        }
    }
}

/// How a task's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEnd {
    /// By itself: an exit, or a failure of its own.
    Itself,
    /// Killed by the launcher after [`Effect::StopTasks`].
    Killed,
    /// Failed of a SIGTERM or SIGINT the launcher did not send. A batch
    /// system that preempts a placeholder signals every process of it at
    /// once (Slurm's preemption with a grace time): the launcher's own
    /// signal may come a moment later, and the task was preempted, not
    /// failed. Judged after [`SIGNALLED_GRACE`].
    Signalled,
}

/// How long a task ended by an outside signal waits for the launcher's own
/// before its failure is reported.
pub const SIGNALLED_GRACE: Duration = Duration::from_secs(2);

/// What the shell must do. Every effect naming a delivery but
/// [`Effect::Run`] and [`Effect::Abandon`] ends with an [`Event::Settled`].
#[derive(Debug, PartialEq, Eq)]
pub enum Effect<E> {
    /// Run the task in a sandbox with these GPUs, its own until its end
    /// comes back as [`Event::Ended`].
    Run { tag: u64, gpus: Vec<String> },
    /// Publish the result of a task that ended by itself, then ack it.
    Report { tag: u64 },
    /// Publish a failed result with `reason` as its stderr, then ack the task.
    Refuse { tag: u64, reason: String },
    /// Publish the task unchanged to its queue, then ack the original.
    GiveBack { tag: u64 },
    /// Publish the task with one more preemption, then ack the original.
    Republish { tag: u64 },
    /// Drop the delivery unacked: the broker redelivers it if anyone still wants it.
    Abandon { tag: u64 },
    /// Ask the broker for no more deliveries.
    StopConsuming,
    /// From now on, hold up to this many messages unacked (running,
    /// waiting or settling).
    Prefetch(u32),
    /// Kill every running task, and any started from now on.
    StopTasks,
    /// Tell the job's runner what runs here.
    SendStatus(Status),
    /// Send the output the running task printed since the last time to
    /// its followers (the rest goes with its result).
    Tee { tag: u64 },
    /// Leave: no task is left and no delivery can arrive any more.
    Leave(Result<Exit, E>),
}

/// A launcher's status, for the runner's heartbeat bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub running: Vec<Running>,
    /// Deliveries settled so far.
    pub completed: u64,
}

impl Status {
    /// The heartbeat `config`'s launcher sends its runner at `now`: each
    /// running task's start on the wall clock.
    pub fn into_message(self, config: &LauncherConfig, now: Now) -> ControlMsg {
        let running = self
            .running
            .into_iter()
            .map(|running| RunningTask {
                task: running.task,
                preemptions: running.preemptions,
                started_at: now.wall_ms.saturating_sub(
                    now.instant
                        .saturating_duration_since(running.started)
                        .as_millis() as u64,
                ),
            })
            .collect();
        ControlMsg::LauncherStatus(LauncherStatus {
            launcher: config.id.clone(),
            cluster: config.cluster.clone(),
            host: config.host.clone(),
            running,
            completed: self.completed,
            heartbeat_ms: Some(config.heartbeat.as_millis() as u64),
        })
    }
}

/// A task whose process runs, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub task: u64,
    pub started: Instant,
    pub preemptions: u32,
}

/// A delivered task, as far as the launcher's decisions go.
#[derive(Debug, Clone, Copy)]
struct Task {
    task: u64,
    preemptions: u32,
}

/// Where a held task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Delivered while every slot was busy (a bundle's or read-ahead's):
    /// it starts when one is free.
    Waiting,
    /// Its process runs.
    Running,
    /// Its process ended of an outside signal: a failure unless the
    /// launcher is signalled too by then (`TaskEnd::Signalled`).
    Signalled { until: Instant },
    /// Its result, republish, give-back or refusal is being sent.
    Settling,
}

/// A task the shell holds, until it is settled or abandoned.
#[derive(Debug)]
struct Held {
    task: u64,
    preemptions: u32,
    walltime: Option<Duration>,
    started: Instant,
    /// When its run ended and its settlement began.
    ended: Option<Instant>,
    phase: Phase,
    /// The GPUs its process has while it runs.
    gpus: Vec<String>,
}

/// The launcher's state between events.
#[derive(Debug)]
pub struct LauncherCore<E> {
    cluster: ClusterName,
    idle_timeout: Duration,
    heartbeat: Duration,
    /// When running tasks are preempted: `deadline_margin` before the
    /// placeholder's deadline, so the batch system's kill never costs a task
    /// its retry budget.
    stop_at: Option<Instant>,
    /// What a fresh placeholder like this one offers a task, start to stop,
    /// at most: a task that needs more is refused, one that only needs
    /// more than this one has left is passed on.
    window: Option<Duration>,
    /// Tasks run at once.
    capacity: usize,
    /// The slots and needs of the tasks it runs.
    shape: TaskShape,
    /// The launcher's GPUs no running task has: a task starts only with
    /// its own.
    gpus: Pool,
    held: BTreeMap<u64, Held>,
    /// Held tasks waiting for a slot, first delivered first.
    waiting: VecDeque<u64>,
    /// Held tasks whose process runs.
    running: usize,
    /// Recent tasks' run time (a moving average), for [`LauncherCore::prefetch`].
    runtime: Option<Duration>,
    /// Recent tasks' settlement time, their end to their result's confirm
    /// (a moving average), for [`LauncherCore::prefetch`].
    settle: Option<Duration>,
    /// Tasks per message lately (a moving average), for [`LauncherCore::prefetch`].
    message_tasks: f64,
    /// The prefetch last asked of the shell.
    asked: u32,
    /// A slot's next task is held while its task runs: for short tasks,
    /// whose slots would otherwise sit idle for the round trip to the
    /// broker (result, ack, next delivery) between one task and the next.
    read_ahead: bool,
    completed: u64,
    /// Since when nothing was held; `None` while anything is.
    idle_since: Option<Instant>,
    next_heartbeat: Option<Instant>,
    /// The last status sent (if any) said no task ran: the first task run
    /// since is told at once, not a heartbeat later, so that a job's
    /// progress does not say "0 running" while every slot is busy.
    told_idle: bool,
    /// Tasks whose output is followed, until when.
    followed: BTreeMap<u64, Instant>,
    /// When followed tasks' output is sent next, while any is followed.
    next_tee: Option<Instant>,
    /// The task consumer may still deliver.
    consuming: bool,
    /// Why we leave, once we stopped taking tasks.
    leaving: Option<Exit>,
    /// Running tasks were told to stop (they are republished unless abandoned).
    tasks_stopped: bool,
    walltime_reached: bool,
    /// The job is over or the broker failed: tasks are killed and left to the
    /// broker, and we leave with this once none is held.
    abandoned: Option<Result<Exit, E>>,
    left: bool,
    /// Effects decided and not yet carried out.
    outbox: Outbox<Effect<E>>,
}

impl<E> Core for LauncherCore<E> {
    type Event = Event<E>;
    type Effect = Effect<E>;

    fn handle(&mut self, event: Event<E>, now: Now) {
        let effects = self.decide(event, now.instant);
        self.outbox.push(effects);
    }

    fn poll_effect(&mut self, _now: Now) -> Option<Effect<E>> {
        self.outbox.pop()
    }

    /// The next of the idle timeout, the walltime stop, the heartbeat, a
    /// followed task's output and a signalled task's grace.
    fn poll_timeout(&self) -> Option<Instant> {
        self.next_wake_up()
    }

    fn handle_timeout(&mut self, now: Now) {
        if self.left {
            return;
        }
        let mut effects = Vec::new();
        if self.listening() {
            self.tick(now.instant, &mut effects);
        }
        self.leave_if_done(&mut effects);
        self.outbox.push(effects);
    }
}

impl<E> LauncherCore<E> {
    /// A launcher of `config` that holds the GPUs `gpus` for its tasks.
    pub fn new(config: &LauncherConfig, gpus: &[String], now: Now) -> Self {
        let now = now.instant;
        let stop_at = config.deadline.map(|deadline| {
            deadline
                .checked_sub(config.deadline_margin)
                .unwrap_or(deadline)
        });
        Self {
            cluster: config.cluster.clone(),
            idle_timeout: config.idle_timeout,
            heartbeat: config.heartbeat,
            stop_at,
            window: match config.walltime {
                Some(walltime) => Some(walltime.saturating_sub(config.deadline_margin)),
                None => stop_at.map(|stop| stop.saturating_duration_since(now)),
            },
            capacity: config.tasks_at_once() as usize,
            shape: TaskShape {
                slots: config.task_slots,
                needs: config.task_needs,
            },
            gpus: Pool::new(gpus),
            held: BTreeMap::new(),
            waiting: VecDeque::new(),
            running: 0,
            runtime: None,
            settle: None,
            message_tasks: 1.0,
            asked: config.tasks_at_once(),
            read_ahead: false,
            completed: 0,
            idle_since: Some(now),
            next_heartbeat: now.checked_add(config.heartbeat),
            told_idle: true,
            followed: BTreeMap::new(),
            next_tee: None,
            consuming: true,
            leaving: None,
            tasks_stopped: false,
            walltime_reached: false,
            abandoned: None,
            left: false,
            outbox: Outbox::default(),
        }
    }

    /// Messages the task consumer may hold unacked: one per slot, and
    /// while tasks are short two, plus those that wait for their results'
    /// confirms (a message is acked only then). By Little's law these are
    /// the messages ending per second times the settlement time:
    /// `slots × settle / (runtime × tasks per message)`, rounded: many for
    /// millisecond tasks, none for bundles or tasks of seconds. At most
    /// [`MOST_PER_SLOT`] per slot. It starts at one: a launcher that takes
    /// two long tasks keeps one waiting that another launcher could be
    /// running.
    pub fn prefetch(&self) -> u32 {
        let capacity = u32::try_from(self.capacity).unwrap_or(u32::MAX);
        if !self.read_ahead {
            return capacity;
        }
        let settling = match (self.settle, self.runtime) {
            (Some(settle), Some(runtime)) => {
                let ending = f64::from(capacity)
                    / runtime.as_secs_f64().max(1e-4)
                    / self.message_tasks.max(1.0);
                // A part of a message is not worth holding: tasks of some
                // seconds keep two per slot, and no more would wait idle.
                (ending * settle.as_secs_f64()).round()
            }
            _ => 0.0,
        };
        let most = capacity.saturating_mul(MOST_PER_SLOT);
        // The cast saturates: confirms that take for ever give `most`.
        let settling = settling as u32;
        capacity
            .saturating_mul(2)
            .saturating_add(settling)
            .min(most)
    }

    /// Whether the shell should read the task consumer.
    pub fn consuming(&self) -> bool {
        self.consuming && self.abandoned.is_none()
    }

    /// Whether the shell should read the launcher's own queue and signals:
    /// not once tasks are being abandoned, when only their ends matter.
    pub fn listening(&self) -> bool {
        self.abandoned.is_none()
    }

    fn next_wake_up(&self) -> Option<Instant> {
        if self.left || self.abandoned.is_some() {
            return None;
        }
        let idle = self
            .idle_since
            .filter(|_| self.leaving.is_none())
            .and_then(|since| since.checked_add(self.idle_timeout));
        let walltime = self
            .stop_at
            .filter(|_| !self.walltime_reached && self.leaving != Some(Exit::Preempted));
        let judged = self.held.values().filter_map(|held| match held.phase {
            Phase::Signalled { until } => Some(until),
            _ => None,
        });
        [idle, walltime, self.next_heartbeat, self.next_tee]
            .into_iter()
            .flatten()
            .chain(judged)
            .min()
    }

    /// Takes one event at `now`; after [`Effect::Leave`] nothing more happens.
    fn decide(&mut self, event: Event<E>, now: Instant) -> Vec<Effect<E>> {
        let mut effects = Vec::new();
        if self.left {
            return effects;
        }
        match event {
            Event::Delivered {
                tag,
                task,
                preemptions,
                walltime,
                message_tasks,
                shape,
            } => {
                self.message_tasks = (self.message_tasks * 4.0 + f64::from(message_tasks)) / 5.0;
                let task = Task { task, preemptions };
                if shape.is_some_and(|shape| shape != self.shape) {
                    // Launchers of its own shape run it; this one has
                    // nothing left to do for its job.
                    info!(
                        task = task.task,
                        "task needs launchers of another shape; giving it back and leaving"
                    );
                    self.idle_since = None;
                    self.hold(tag, task, walltime, now, Phase::Settling);
                    effects.push(Effect::GiveBack { tag });
                    self.leave(Exit::Reshaped, &mut effects);
                } else {
                    self.delivered(tag, task, walltime, now, &mut effects);
                }
            }
            Event::TasksEnded => {
                self.consuming = false;
                if self.leaving.is_none() {
                    // Cancelled by the broker: the queue was deleted.
                    self.abandon(Ok(Exit::JobOver), now, &mut effects);
                }
            }
            Event::Ended { tag, end } => self.ended(tag, end, now, &mut effects),
            Event::Settled { tag } => {
                if let Some(ended) = self.held.get(&tag).and_then(|held| held.ended) {
                    let settle = now.saturating_duration_since(ended);
                    self.settle = Some(moving_average(self.settle, settle));
                }
                self.forget(tag, now);
                self.ask_prefetch(&mut effects);
            }
            Event::QueueGone => self.abandon(Ok(Exit::JobOver), now, &mut effects),
            Event::Failed(error) => self.abandon(Err(error), now, &mut effects),
            Event::Message(msg) if self.listening() => self.message(msg, now, &mut effects),
            Event::Signal if self.listening() && self.leaving != Some(Exit::Preempted) => {
                info!("signalled: preempting own tasks");
                self.stop_tasks(&mut effects);
                self.leave(Exit::Preempted, &mut effects);
                // Those the same signal ended a moment before were preempted.
                for (tag, held) in &mut self.held {
                    if let Phase::Signalled { .. } = held.phase {
                        held.phase = Phase::Settling;
                        effects.push(Effect::Republish { tag: *tag });
                    }
                }
            }
            Event::Message(_) | Event::Signal => {}
        }
        self.leave_if_done(&mut effects);
        effects
    }

    fn delivered(
        &mut self,
        tag: u64,
        task: Task,
        walltime: Option<Duration>,
        now: Instant,
        effects: &mut Vec<Effect<E>>,
    ) {
        if self.abandoned.is_some() {
            effects.push(Effect::Abandon { tag });
            return;
        }
        self.idle_since = None;
        if self.leaving.is_some() {
            // Sent before the broker saw the cancel (or the rest of a
            // bundle): back to the queue untouched, for another launcher.
            self.hold(tag, task, walltime, now, Phase::Settling);
            effects.push(Effect::GiveBack { tag });
        } else if let (Some(window), Some(walltime)) = (self.window, walltime)
            && walltime > window
        {
            // No placeholder like this one could ever run it: a failed
            // attempt, not a task passed on forever.
            let reason = format!(
                "the task's walltime ({} s) exceeds what a placeholder of cluster {} offers ({} s)",
                walltime.as_secs(),
                self.cluster,
                window.as_secs()
            );
            warn!(task = task.task, reason, "task refused");
            self.hold(tag, task, Some(walltime), now, Phase::Settling);
            effects.push(Effect::Refuse { tag, reason });
        } else {
            self.hold(tag, task, walltime, now, Phase::Waiting);
            self.waiting.push_back(tag);
            self.start_waiting(now, effects);
        }
    }

    /// Starts waiting tasks while slots are free. One that would no longer
    /// end before the launcher must stop is given back, and the launcher
    /// drains (giving back the rest).
    fn start_waiting(&mut self, now: Instant, effects: &mut Vec<Effect<E>>) {
        while self.running < self.capacity && self.leaving.is_none() {
            let Some(tag) = self.waiting.pop_front() else {
                return;
            };
            let Some(walltime) = self.held.get(&tag).map(|held| held.walltime) else {
                continue;
            };
            let fits = self.fits(walltime, now);
            let Some(held) = self.held.get_mut(&tag) else {
                continue;
            };
            if !fits {
                info!(
                    task = held.task,
                    "task would outlast the placeholder; giving it back and draining"
                );
                held.phase = Phase::Settling;
                effects.push(Effect::GiveBack { tag });
                self.leave(Exit::Walltime, effects);
                return;
            }
            let Some(gpus) = self.gpus.take(self.shape.needs.gpus) else {
                // It starts when a running task gives its devices back.
                self.waiting.push_front(tag);
                return;
            };
            held.phase = Phase::Running;
            held.started = now;
            held.gpus.clone_from(&gpus);
            self.running += 1;
            effects.push(Effect::Run { tag, gpus });
            if self.told_idle {
                self.next_heartbeat = Some(now);
            }
        }
    }

    /// Whether a task's walltime fits before the launcher must stop. A task
    /// without a walltime might take any time: it is taken while time remains.
    fn fits(&self, walltime: Option<Duration>, now: Instant) -> bool {
        match (self.stop_at, walltime) {
            (Some(stop_at), Some(walltime)) => {
                now.checked_add(walltime).is_some_and(|end| end <= stop_at)
            }
            _ => true,
        }
    }

    fn ended(&mut self, tag: u64, end: TaskEnd, now: Instant, effects: &mut Vec<Effect<E>>) {
        let Some(held) = self.held.get_mut(&tag) else {
            return;
        };
        let ran = held.phase == Phase::Running;
        if ran {
            self.running -= 1;
            self.gpus.give_back(std::mem::take(&mut held.gpus));
        }
        // Signalled after the launcher was, or while it is abandoning:
        // as if it had killed the task itself.
        let end = match end {
            TaskEnd::Signalled
                if self.leaving == Some(Exit::Preempted) || self.abandoned.is_some() =>
            {
                TaskEnd::Killed
            }
            end => end,
        };
        if end == TaskEnd::Signalled {
            held.ended = Some(now);
            held.phase = Phase::Signalled {
                until: now + SIGNALLED_GRACE,
            };
            return;
        }
        let killed = end == TaskEnd::Killed;
        held.phase = Phase::Settling;
        let runtime = now.saturating_duration_since(held.started);
        if ran && !killed {
            held.ended = Some(now);
        }
        if !killed {
            effects.push(Effect::Report { tag });
        } else if self.abandoned.is_some() {
            self.forget(tag, now);
            effects.push(Effect::Abandon { tag });
        } else {
            effects.push(Effect::Republish { tag });
        }
        self.start_waiting(now, effects);
        // After the next start: a new prefetch takes the broker round trips.
        if ran && !killed {
            self.ran_for(runtime, effects);
        }
    }

    /// A task ran this long: reads ahead once recent tasks are short, and
    /// stops once they are long (apart enough that run times around either
    /// bound do not switch it at every task).
    fn ran_for(&mut self, runtime: Duration, effects: &mut Vec<Effect<E>>) {
        let average = moving_average(self.runtime, runtime);
        self.runtime = Some(average);
        let read_ahead = match self.read_ahead {
            false => average < READ_AHEAD_BELOW,
            true => average <= NO_READ_AHEAD_ABOVE,
        };
        if read_ahead != self.read_ahead && self.consuming() && self.leaving.is_none() {
            self.read_ahead = read_ahead;
            info!(
                read_ahead,
                average_ms = average.as_millis() as u64,
                "task run times changed the prefetch"
            );
        }
        self.ask_prefetch(effects);
    }

    /// Asks the shell for the prefetch [`LauncherCore::prefetch`] says, when it
    /// differs from the one asked last by a quarter or more: each change
    /// costs the shell a new consumer, so small drifts are let be.
    fn ask_prefetch(&mut self, effects: &mut Vec<Effect<E>>) {
        if !self.consuming() || self.leaving.is_some() {
            return;
        }
        let prefetch = self.prefetch();
        let (low, high) = (prefetch.min(self.asked), prefetch.max(self.asked));
        if u64::from(high - low) * 4 >= u64::from(high) && high > low {
            self.asked = prefetch;
            effects.push(Effect::Prefetch(prefetch));
        }
    }

    fn message(&mut self, msg: LauncherMsg, now: Instant, effects: &mut Vec<Effect<E>>) {
        match msg {
            LauncherMsg::Preempt { reason } => {
                info!(reason, "preempted");
                self.stop_tasks(effects);
                self.leave(Exit::Preempted, effects);
            }
            LauncherMsg::Drain { reason } => {
                info!(reason, "draining");
                self.leave(Exit::Drained, effects);
            }
            LauncherMsg::Poll {} => effects.push(self.tell()),
            LauncherMsg::Follow { task, for_ms } => self.follow(task, for_ms, now),
        }
    }

    /// Follows `task` for `for_ms` (at most [`LONGEST_FOLLOW`]), whether it
    /// runs here now or starts here meanwhile; its output goes at once.
    fn follow(&mut self, task: u64, for_ms: u64, now: Instant) {
        let lasting = Duration::from_millis(for_ms).min(LONGEST_FOLLOW);
        let Some(until) = now.checked_add(lasting) else {
            return;
        };
        if self.followed.len() >= MOST_FOLLOWED && !self.followed.contains_key(&task) {
            warn!(task, "too many tasks followed at once; follow ignored");
            return;
        }
        self.followed.insert(task, until);
        let runs_here = self
            .held
            .values()
            .any(|held| held.task == task && held.phase == Phase::Running);
        self.next_tee = match (runs_here, self.next_tee) {
            (true, _) => Some(now),
            (false, Some(at)) => Some(at),
            (false, None) => now.checked_add(TEE_EVERY),
        };
    }

    /// Sends the followed running tasks' new output, forgets follows that
    /// lapsed, and says when to look again.
    fn tee(&mut self, now: Instant, effects: &mut Vec<Effect<E>>) {
        if self.next_tee.is_none_or(|at| at > now) {
            return;
        }
        self.followed.retain(|_, until| *until > now);
        for (&tag, held) in &self.held {
            if held.phase == Phase::Running && self.followed.contains_key(&held.task) {
                effects.push(Effect::Tee { tag });
            }
        }
        self.next_tee = match self.followed.is_empty() {
            true => None,
            false => now.checked_add(TEE_EVERY),
        };
    }

    fn tick(&mut self, now: Instant, effects: &mut Vec<Effect<E>>) {
        if self.leaving.is_none()
            && let Some(since) = self.idle_since
            && since
                .checked_add(self.idle_timeout)
                .is_some_and(|at| at <= now)
        {
            self.leave(Exit::Idle, effects);
        }
        if let Some(stop_at) = self.stop_at
            && stop_at <= now
            && !self.walltime_reached
            && self.leaving != Some(Exit::Preempted)
        {
            info!("placeholder walltime ending: preempting own tasks");
            self.walltime_reached = true;
            self.stop_tasks(effects);
            self.leave(Exit::Walltime, effects);
        }
        if self.next_heartbeat.is_some_and(|at| at <= now) {
            effects.push(self.tell());
            self.next_heartbeat = now.checked_add(self.heartbeat);
        }
        self.tee(now, effects);
        // Ended of an outside signal, and the launcher was not signalled:
        // the task's own failure.
        let mut judged = false;
        for (tag, held) in &mut self.held {
            if let Phase::Signalled { until } = held.phase
                && until <= now
            {
                held.phase = Phase::Settling;
                effects.push(Effect::Report { tag: *tag });
                judged = true;
            }
        }
        if judged {
            self.start_waiting(now, effects);
        }
    }

    fn hold(
        &mut self,
        tag: u64,
        task: Task,
        walltime: Option<Duration>,
        now: Instant,
        phase: Phase,
    ) {
        self.held.insert(
            tag,
            Held {
                task: task.task,
                preemptions: task.preemptions,
                walltime,
                started: now,
                ended: None,
                phase,
                gpus: Vec::new(),
            },
        );
    }

    fn forget(&mut self, tag: u64, now: Instant) {
        if let Some(held) = self.held.remove(&tag) {
            // Settled while running: its supervisor failed.
            if held.phase == Phase::Running {
                self.running -= 1;
            }
            self.completed += 1;
            if self.held.is_empty() {
                self.idle_since = Some(now);
            }
        }
    }

    fn stop_tasks(&mut self, effects: &mut Vec<Effect<E>>) {
        if !self.tasks_stopped {
            self.tasks_stopped = true;
            effects.push(Effect::StopTasks);
        }
    }

    /// Stops taking tasks for `exit`; a preemption overrides a drain (or any
    /// other reason) already under way.
    fn leave(&mut self, exit: Exit, effects: &mut Vec<Effect<E>>) {
        let first = self.leaving.is_none();
        if first || exit == Exit::Preempted {
            self.leaving = Some(exit);
        }
        if first && self.consuming {
            effects.push(Effect::StopConsuming);
        }
        // Tasks not started go back untouched: they were not preempted.
        for tag in std::mem::take(&mut self.waiting) {
            if let Some(held) = self.held.get_mut(&tag) {
                held.phase = Phase::Settling;
                effects.push(Effect::GiveBack { tag });
            }
        }
    }

    /// The job is over or the launcher is failing: kill everything, report
    /// nothing. The first reason stands.
    fn abandon(&mut self, ending: Result<Exit, E>, now: Instant, effects: &mut Vec<Effect<E>>) {
        if self.abandoned.is_none() {
            self.abandoned = Some(ending);
            self.stop_tasks(effects);
            let signalled = self
                .held
                .iter()
                .filter(|(_, held)| matches!(held.phase, Phase::Signalled { .. }))
                .map(|(tag, _)| *tag)
                .collect::<Vec<_>>();
            for tag in std::mem::take(&mut self.waiting)
                .into_iter()
                .chain(signalled)
            {
                self.forget(tag, now);
                effects.push(Effect::Abandon { tag });
            }
        }
    }

    fn leave_if_done(&mut self, effects: &mut Vec<Effect<E>>) {
        if !self.held.is_empty() {
            return;
        }
        let ending = match self.abandoned.take() {
            Some(ending) => ending,
            None => match self.leaving {
                Some(exit) if !self.consuming => Ok(exit),
                _ => return,
            },
        };
        self.left = true;
        effects.push(Effect::Leave(ending));
    }

    /// A status for the runner, remembered as told.
    fn tell(&mut self) -> Effect<E> {
        let status = self.status();
        self.told_idle = status.running.is_empty();
        Effect::SendStatus(status)
    }

    fn status(&self) -> Status {
        Status {
            running: self
                .held
                .values()
                .filter(|held| held.phase == Phase::Running)
                .map(|held| Running {
                    task: held.task,
                    started: held.started,
                    preemptions: held.preemptions,
                })
                .collect(),
            completed: self.completed,
        }
    }
}

/// A moving average that follows the last fifth of a sample, so that one
/// odd task moves it little.
fn moving_average(average: Option<Duration>, sample: Duration) -> Duration {
    match average {
        Some(average) => (average * 4 + sample) / 5,
        None => sample,
    }
}

#[cfg(test)]
mod tests;
