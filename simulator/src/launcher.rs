//! A placeholder of the simulated batch system and the launcher in it: the
//! launcher's own core ([`LauncherCore`]) decides what the real one does
//! (which task to take and when, read-ahead and prefetch, drains,
//! preemption, heartbeats, idle and job-over departures), and this shell
//! carries its effects out on the simulated task queue and clock, handing
//! each answer back at once as the launcher's shell does.

use std::{collections::BTreeMap, convert::Infallible, path::PathBuf};

use futures_util::FutureExt;
use gleaner_launcher_core::{
    GpuSource, LauncherConfig, LauncherSettings, Limits,
    core::{Effect, Event, LauncherCore, TaskEnd},
    io::{Io, turn},
};
use gleaner_manifest::{JobId, Needs};
use gleaner_protocol::{
    Captured, ClusterName, ControlMsg, Core, LauncherId, LauncherMsg, Now, ResultMsg, RunStatus,
    TaskMsg, is_due,
};

use crate::batch::{Clock, Happenings, Tasks, millis};

/// What a launcher's effects act on at one moment.
pub struct World<'a> {
    /// Simulated seconds since the start.
    pub t: f64,
    pub now: Now,
    /// The cluster's speed: work done per second.
    pub speed: f64,
    /// Every job's task queue, by job index.
    pub tasks: &'a mut [Tasks],
    pub out: &'a mut Happenings,
}

/// How the cluster's launchers are set up.
#[derive(Debug, Clone)]
pub struct Setup {
    pub cluster: ClusterName,
    /// `[launcher]` of the simulated deployment.
    pub settings: LauncherSettings,
    /// From a launcher's leaving to its slot being free (s).
    pub exit_delay: f64,
}

/// A placeholder and the launcher it runs once the batch system starts it.
pub struct Launcher {
    /// The placeholder's id in the batch system.
    pub batch_id: String,
    /// The launcher's own id.
    pub id: LauncherId,
    /// Its job's index.
    pub job: usize,
    job_id: JobId,
    /// When the batch system started the placeholder (it holds a node).
    pub dispatched: Option<f64>,
    /// When its task consumer opens: the batch system's dispatch and the
    /// launcher's start.
    pub first_task: f64,
    /// When it dies without a word (never, unless the scenario's
    /// launchers fail).
    pub dies_at: f64,
    /// Its tasks use a GPU.
    pub gpu: bool,
    /// It holds a node with a GPU.
    pub on_gpu_node: bool,
    /// Its core, from its placeholder's start.
    core: Option<(LauncherConfig, LauncherCore<Infallible>)>,
    /// What its effects act on.
    hands: Hands,
    next_tag: u64,
    /// It was told its job's queues are gone.
    told_gone: bool,
    /// It was told to drain (counted once).
    drained: bool,
    /// Once it left: when its placeholder ends and its slot is free, and
    /// why it left.
    pub leaving: Option<(f64, &'static str)>,
}

/// What a launcher's shell holds: its deliveries and their runs, and its
/// task consumer.
struct Hands {
    /// Its job's index.
    job: usize,
    /// Deliveries it holds unacked, by tag.
    deliveries: BTreeMap<u64, TaskMsg>,
    /// Runs of its tasks, by delivery tag, until they are settled.
    runs: BTreeMap<u64, Run>,
    /// Messages its consumer may hold unacked.
    prefetch: u32,
    /// Its task consumer is open.
    consuming: bool,
    /// Its running tasks were stopped, and any started from now on is.
    stopped: bool,
}

/// A launcher's hands in the simulated world at one moment, as its core's
/// effects reach them.
struct Carrier<'a, 'w> {
    hands: &'a mut Hands,
    config: &'a LauncherConfig,
    world: &'a mut World<'w>,
}

impl Io<Infallible> for Carrier<'_, '_> {
    fn now(&self) -> Now {
        self.world.now
    }

    async fn apply(&mut self, effect: Effect<Infallible>) -> Vec<Event<Infallible>> {
        self.hands.apply(effect, self.config, self.world)
    }
}

/// A task a launcher runs.
struct Run {
    /// Work left when it started, and when it last stopped.
    from: f64,
    left: f64,
    started: f64,
    /// Its process is over.
    ended: bool,
}

impl Run {
    /// Work left at `t`, at `speed`.
    fn left_at(&self, t: f64, speed: f64) -> f64 {
        match self.ended {
            true => self.left,
            false => (self.left - (t - self.started) * speed).max(0.0),
        }
    }
}

impl Launcher {
    /// A queued placeholder of job `job` (index `index`) whose launcher
    /// may take its first task at `first_task`.
    pub fn queued(
        batch_id: String,
        id: LauncherId,
        (index, job): (usize, JobId),
        first_task: f64,
        gpu: bool,
    ) -> Self {
        Self {
            batch_id,
            id,
            job: index,
            job_id: job,
            dispatched: None,
            first_task,
            dies_at: f64::INFINITY,
            gpu,
            on_gpu_node: false,
            core: None,
            hands: Hands {
                job: index,
                deliveries: BTreeMap::new(),
                runs: BTreeMap::new(),
                prefetch: 1,
                consuming: true,
                stopped: false,
            },
            next_tag: 0,
            told_gone: false,
            drained: false,
            leaving: None,
        }
    }

    /// The batch system starts its placeholder on `host` at `t`: the
    /// launcher's core starts.
    pub fn start(&mut self, setup: &Setup, host: String, t: f64, now: Now) {
        self.dispatched = Some(t);
        self.first_task = self.first_task.max(t);
        let settings = &setup.settings;
        let config = LauncherConfig {
            job: self.job_id.clone(),
            cluster: setup.cluster.clone(),
            id: self.id.clone(),
            host,
            slot: self.batch_id.clone(),
            slots: 1,
            task_slots: 1,
            task_needs: Needs {
                memory_mb: 0,
                gpus: u32::from(self.gpu),
            },
            gpu_source: GpuSource::BatchSystem,
            idle_timeout: settings.idle_timeout,
            heartbeat: settings.heartbeat,
            deadline: None,
            walltime: None,
            deadline_margin: settings.deadline_margin,
            scratch: PathBuf::new(),
            checkpoints: PathBuf::new(),
            limits: Limits::default(),
        };
        let gpus: Vec<String> = match self.gpu {
            true => vec!["0".to_owned()],
            false => Vec::new(),
        };
        let core = LauncherCore::new(&config, &gpus, now);
        self.hands.prefetch = core.prefetch();
        self.core = Some((config, core));
    }

    /// Whether its launcher runs, and so has a queue.
    pub fn runs(&self) -> bool {
        self.dispatched.is_some()
    }

    /// Its launcher works: started, taking tasks, not leaving.
    pub fn at_work(&self, t: f64) -> bool {
        self.dispatched.is_some() && self.first_task <= t && self.leaving.is_none()
    }

    /// When something next happens to it by itself, after `clock`'s time
    /// (at `speed`): its placeholder ends, it dies, it starts taking
    /// tasks, a task's work is done or its core wakes up. Never while
    /// its placeholder waits: the batch system's cycle starts it.
    pub fn next_event(&self, speed: f64, clock: &Clock) -> f64 {
        let ends = self.leaving.map_or(f64::INFINITY, |(at, _)| at);
        let Some((_, core)) = self.core.as_ref().filter(|_| self.leaving.is_none()) else {
            return ends;
        };
        let starts = match self.first_task > clock.t {
            true => self.first_task,
            false => f64::INFINITY,
        };
        let wakes = core
            .poll_timeout()
            .map_or(f64::INFINITY, |at| clock.seconds(at));
        self.hands
            .runs
            .values()
            .filter(|run| !run.ended)
            .map(|run| run.started + run.left / speed)
            .fold(ends.min(self.dies_at).min(starts).min(wakes), f64::min)
    }

    /// A message on its own queue, which its core reads.
    pub fn message(&mut self, message: LauncherMsg, setup: &Setup, w: &mut World<'_>) {
        if matches!(message, LauncherMsg::Drain { .. }) && !self.drained && self.leaving.is_none() {
            self.drained = true;
            w.tasks[self.job].drains += 1;
        }
        self.drive(vec![Some(Event::Message(message))], setup, w);
    }

    /// Time passes to `w.t`: tasks whose work is done end, its core's time
    /// event comes if due, its job's queue going away is heard, and the
    /// broker delivers what its prefetch allows.
    pub fn progress(&mut self, setup: &Setup, w: &mut World<'_>) {
        let Some((_, core)) = &self.core else {
            return;
        };
        let mut events = Vec::new();
        if is_due(core, w.now) {
            events.push(None);
        }
        for (tag, run) in &mut self.hands.runs {
            if !run.ended && run.started + run.left / w.speed <= w.t + 1e-9 {
                run.ended = true;
                run.left = 0.0;
                events.push(Some(Event::Ended {
                    tag: *tag,
                    end: TaskEnd::Itself,
                }));
            }
        }
        if w.tasks[self.job].gone && !self.told_gone {
            self.told_gone = true;
            events.push(Some(Event::QueueGone));
        }
        self.drive(events, setup, w);
    }

    /// Hands its core `events` (`None`: its time event) with the
    /// launcher's own loop, then the broker's deliveries while there are
    /// any; once it leaves, its placeholder ends `exit_delay` later.
    fn drive(&mut self, events: Vec<Option<Event<Infallible>>>, setup: &Setup, w: &mut World<'_>) {
        let Some((config, mut core)) = self.core.take() else {
            return;
        };
        let mut events = events;
        loop {
            let mut carrier = Carrier {
                hands: &mut self.hands,
                config: &config,
                world: w,
            };
            let left = match turn(&mut core, &mut carrier, events).now_or_never() {
                Some(left) => left,
                None => {
                    tracing::error!("a simulated launcher's effect did not end at once");
                    None
                }
            };
            if let Some(exit) = left {
                let why = match exit {
                    Ok(exit) => exit.describe(),
                    Err(never) => match never {},
                };
                self.leaving = Some((w.t + setup.exit_delay, why));
                break;
            }
            match self.deliver(&core, w) {
                Some(delivered) => events = vec![Some(delivered)],
                None => break,
            }
        }
        self.core = Some((config, core));
    }

    /// The next task the broker delivers to it, if its consumer is open,
    /// its prefetch allows one more and its job's queue has one.
    fn deliver(
        &mut self,
        core: &LauncherCore<Infallible>,
        w: &mut World<'_>,
    ) -> Option<Event<Infallible>> {
        let open = self.hands.consuming && core.consuming() && self.leaving.is_none();
        let room = self.hands.deliveries.len() < self.hands.prefetch as usize;
        if !open || !room || w.t < self.first_task || w.tasks[self.job].gone {
            return None;
        }
        let msg = w.tasks[self.job].take()?;
        let tag = self.next_tag;
        self.next_tag += 1;
        let event = Event::delivered(tag, &msg, 1);
        self.hands.deliveries.insert(tag, msg);
        Some(event)
    }

    /// Its launcher dies with everything it holds, which the broker
    /// redelivers; how many of its tasks were running.
    pub fn die(&mut self, w: &mut World<'_>) -> u64 {
        let tags: Vec<u64> = self.hands.deliveries.keys().copied().collect();
        tags.into_iter()
            .filter(|tag| self.hands.lose(*tag, w))
            .count() as u64
    }

    /// The message its runner hears when its placeholder goes.
    pub fn gone(&self, cluster: &ClusterName, reason: &str) -> (usize, ControlMsg) {
        (
            self.job,
            ControlMsg::LauncherGone {
                launcher: self.id.clone(),
                cluster: cluster.clone(),
                reason: reason.to_owned(),
            },
        )
    }
}

impl Hands {
    /// Carries out one effect, as the launcher's shell does; the events
    /// it leads to.
    fn apply(
        &mut self,
        effect: Effect<Infallible>,
        config: &LauncherConfig,
        w: &mut World<'_>,
    ) -> Vec<Event<Infallible>> {
        let settled = |tag| vec![Event::Settled { tag }];
        match effect {
            Effect::Run { tag, .. } => {
                let Some(msg) = self.deliveries.get(&tag) else {
                    return Vec::new();
                };
                let job = &mut w.tasks[self.job];
                let left = job.saved.remove(&msg.task).unwrap_or(job.work);
                self.runs.insert(
                    tag,
                    Run {
                        from: left,
                        left,
                        started: w.t,
                        ended: false,
                    },
                );
                if self.stopped {
                    return self.kill(tag, w);
                }
                Vec::new()
            }
            Effect::Report { tag } => {
                if let (Some(msg), Some(run)) =
                    (self.deliveries.remove(&tag), self.runs.remove(&tag))
                {
                    let runtime = w.t - run.started;
                    w.out.results.push(result(config, msg, runtime, None));
                }
                settled(tag)
            }
            Effect::Refuse { tag, reason } => {
                if let Some(msg) = self.deliveries.remove(&tag) {
                    w.out.results.push(result(config, msg, 0.0, Some(reason)));
                }
                settled(tag)
            }
            Effect::GiveBack { tag } => {
                if let Some(msg) = self.deliveries.remove(&tag) {
                    w.tasks[self.job].queue.push_back(msg);
                }
                settled(tag)
            }
            Effect::Republish { tag } => {
                if let Some(mut msg) = self.deliveries.remove(&tag) {
                    let job = &mut w.tasks[self.job];
                    if let Some(run) = self.runs.remove(&tag) {
                        job.preemptions += 1;
                        // A task that checkpoints saved its state.
                        match job.checkpoints {
                            true => {
                                job.saved.insert(msg.task, run.left);
                            }
                            false => job.lost_work += run.from - run.left,
                        }
                    }
                    msg.preemptions += 1;
                    job.queue.push_back(msg);
                }
                settled(tag)
            }
            Effect::Abandon { tag } => {
                // Unacked: the broker redelivers it once the launcher is gone.
                self.lose(tag, w);
                Vec::new()
            }
            Effect::StopConsuming => {
                self.consuming = false;
                vec![Event::TasksEnded]
            }
            Effect::Prefetch(prefetch) => {
                self.prefetch = prefetch;
                Vec::new()
            }
            Effect::StopTasks => {
                self.stopped = true;
                let running: Vec<u64> = self
                    .runs
                    .iter()
                    .filter(|(_, run)| !run.ended)
                    .map(|(tag, _)| *tag)
                    .collect();
                running
                    .into_iter()
                    .flat_map(|tag| self.kill(tag, w))
                    .collect()
            }
            Effect::SendStatus(status) => {
                let message = status.into_message(config, w.now);
                w.out.to_runners.push((self.job, message));
                Vec::new()
            }
            // Nobody follows a simulated task's output.
            Effect::Tee { .. } => Vec::new(),
            // Ends the turn before it is carried out.
            Effect::Leave(_) => Vec::new(),
        }
    }

    /// Its task's process is killed: the work it did stays in the run.
    fn kill(&mut self, tag: u64, w: &World<'_>) -> Vec<Event<Infallible>> {
        let Some(run) = self.runs.get_mut(&tag) else {
            return Vec::new();
        };
        run.left = run.left_at(w.t, w.speed);
        run.ended = true;
        vec![Event::Ended {
            tag,
            end: TaskEnd::Killed,
        }]
    }

    /// A delivery the broker takes back unacked: its run's work is lost.
    /// Whether it was running.
    fn lose(&mut self, tag: u64, w: &mut World<'_>) -> bool {
        let job = &mut w.tasks[self.job];
        let ran = match self.runs.remove(&tag) {
            Some(run) => {
                job.lost_work += run.from - run.left_at(w.t, w.speed);
                !run.ended
            }
            None => false,
        };
        if let Some(msg) = self.deliveries.remove(&tag) {
            job.queue.push_back(msg);
        }
        ran
    }
}

/// The result a launcher reports for a task that ran `runtime` s to its
/// end, or that it refused for `refused`.
fn result(
    config: &LauncherConfig,
    msg: TaskMsg,
    runtime: f64,
    refused: Option<String>,
) -> ResultMsg {
    let (status, exit_code, stderr) = match refused {
        None => (RunStatus::Succeeded, Some(0), Captured::default()),
        Some(reason) => (
            RunStatus::Failed,
            None,
            Captured {
                data: reason.into_bytes(),
                dropped: 0,
            },
        ),
    };
    ResultMsg {
        job: msg.job,
        task: msg.task,
        attempt: msg.attempt,
        preemptions: msg.preemptions,
        status,
        exit_code,
        signal: None,
        runtime_ms: millis(runtime),
        launcher: config.id.clone(),
        cluster: config.cluster.clone(),
        host: config.host.clone(),
        stdout: Captured::default(),
        stderr,
        outputs: Vec::new(),
        error: None,
        peak_memory_mb: None,
        parted: None,
    }
}
