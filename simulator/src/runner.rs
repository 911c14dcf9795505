//! The simulated runners. A scavenging job's runner is the runner's own
//! core ([`Sweep`]), driven as the runner's shell (`runner/src/job.rs`)
//! drives it: control messages and results in, effects applied in order,
//! a message to a queue that may be gone answered at once with whether it
//! exists. Its task queue is the simulated broker's. A grid job's runner
//! is simulated here: it places its components and reports their ends.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gleaner_manifest::{JobId, JobKind, Priority};
use gleaner_protocol::{
    ClusterName, ComponentSpec, ControlMsg, JobReport, JobState, KcmMsg, LauncherId, Millis,
    ResultMsg, SchedulerMsg, Submission, TaskCounts, TaskMsg,
};
use gleaner_runner::{Effect, JobCore, JobSettings, Now, Opening, Sweep};

use crate::{model::Mail, scenario::JobSpec};

/// The runner of a scavenging job: the runner's core and what its shell
/// keeps.
pub struct SweepRunner {
    core: Sweep,
    /// The job ended and its queues are gone.
    ended: bool,
}

/// What a sweep's effects reach in the simulated world.
pub struct Reach<'a> {
    /// The job's task queue.
    pub queue: &'a mut VecDeque<TaskMsg>,
    /// Whether a cluster's kcm has a queue.
    pub kcm: &'a dyn Fn(&ClusterName) -> bool,
    /// Whether a launcher has a queue (it runs).
    pub launcher: &'a dyn Fn(&LauncherId) -> bool,
}

impl SweepRunner {
    /// Opens the job as a runner opens a new one: no results yet.
    pub fn open(job: JobId, spec: &JobSpec, settings: JobSettings, now: Now) -> Self {
        let submission = Submission {
            job,
            manifest: spec.manifest.clone(),
            submitted_at: now.wall_ms,
        };
        let opening = Opening {
            submission: &submission,
            owner: "simulated".to_owned(),
            launcher_credentials: None,
            settings,
            runner: "simulated".to_owned(),
            results: String::new(),
            finished: Vec::new(),
            job_file: None,
            additions: Vec::new(),
        };
        let core = match Sweep::open(opening, spec.task_list.clone(), now) {
            Ok(core) => core,
            Err(refusal) => unreachable!("a job without a job.json is nobody else's: {refusal:?}"),
        };
        Self { core, ended: false }
    }

    pub fn is_live(&self) -> bool {
        !self.ended
    }

    /// Tasks that succeeded, as the job's index has them.
    pub fn done(&self) -> u64 {
        self.core.ledger().book.counts().succeeded
    }

    /// Publishes the tasks and registers with the scheduler.
    pub fn start(&mut self, now: Now, reach: &mut Reach<'_>) -> Vec<Mail> {
        let effects = self.core.start();
        self.apply(effects, now, reach)
    }

    pub fn receive(&mut self, msg: ControlMsg, now: Now, reach: &mut Reach<'_>) -> Vec<Mail> {
        let effects = self.core.on_control(msg, now);
        self.apply(effects, now, reach)
    }

    pub fn result(&mut self, result: &ResultMsg, now: Now, reach: &mut Reach<'_>) -> Vec<Mail> {
        let effects = self.core.on_results([result], now);
        self.apply(effects, now, reach)
    }

    /// The heartbeat: silent launchers polled, then the report.
    pub fn report(&mut self, now: Now, reach: &mut Reach<'_>) -> Vec<Mail> {
        self.apply(vec![Effect::Report], now, reach)
    }

    /// Applies effects in order, what comes back from a message first;
    /// then, if the job is over, ends it as the shell does. Writing
    /// outputs, index lines and `job.json` changes nothing here.
    fn apply(&mut self, effects: Vec<Effect<'_>>, now: Now, reach: &mut Reach<'_>) -> Vec<Mail> {
        let mut mail = Vec::new();
        // `None`: the report an `Effect::Report` asked for, once its polls
        // are answered.
        let mut work: VecDeque<Option<Effect<'_>>> = effects.into_iter().map(Some).collect();
        while let Some(step) = work.pop_front() {
            let Some(effect) = step else {
                push_front(&mut work, self.core.report(now));
                continue;
            };
            match effect {
                Effect::ToScheduler(msg) => mail.push(Mail::Scheduler(msg)),
                Effect::ToKcm {
                    cluster,
                    msg,
                    followup,
                } => {
                    let arrived = (reach.kcm)(&cluster);
                    mail.push(Mail::Kcm(cluster, msg));
                    push_front(&mut work, self.core.on_delivery(followup, arrived));
                }
                Effect::ToLauncher {
                    launcher,
                    msg,
                    followup,
                } => {
                    let arrived = (reach.launcher)(&launcher);
                    mail.push(Mail::Launcher(launcher, msg));
                    push_front(&mut work, self.core.on_delivery(followup, arrived));
                }
                Effect::PurgeTasks | Effect::DeleteQueues => reach.queue.clear(),
                Effect::PublishFirst(first) => {
                    reach.queue.extend(first.each());
                    push_front(&mut work, self.core.on_published(first.completes()));
                }
                Effect::Publish(tasks) => reach.queue.extend(tasks),
                Effect::Report => {
                    work.push_front(None);
                    push_front(&mut work, self.core.poll(now));
                }
                Effect::Event(_)
                | Effect::Answer(_)
                | Effect::WriteOutputs(_)
                | Effect::WriteFinalOutputs(_)
                | Effect::Record(_)
                | Effect::RecordAddition(_)
                | Effect::SaveJobFile => {}
            }
        }
        if !self.ended
            && let Some(state) = self.core.ending()
        {
            self.ended = true;
            let mut end = self.core.finish(state, now);
            end.extend(self.core.wind_up(now));
            mail.extend(self.apply(end, now, reach));
        }
        mail
    }
}

/// Puts effects at the front of the work, in their order.
fn push_front<'r>(work: &mut VecDeque<Option<Effect<'r>>>, effects: Vec<Effect<'r>>) {
    for effect in effects.into_iter().rev() {
        work.push_front(Some(effect));
    }
}

/// The runner of a grid job.
pub struct GridRunner {
    pub id: JobId,
    components: Vec<u32>,
    registered: Millis,
    state: JobState,
    clusters: BTreeSet<ClusterName>,
    ended: BTreeSet<u32>,
}

impl GridRunner {
    pub fn new(id: JobId, components: Vec<u32>, registered: Millis) -> Self {
        Self {
            id,
            components,
            registered,
            state: JobState::Waiting,
            clusters: BTreeSet::new(),
            ended: BTreeSet::new(),
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == JobState::Done
    }

    pub fn receive(&mut self, message: ControlMsg) -> Vec<Mail> {
        match message {
            ControlMsg::Place { clusters }
                if self.state == JobState::Waiting && clusters.len() == self.components.len() =>
            {
                let mut mail: Vec<Mail> = self
                    .components
                    .iter()
                    .zip(&clusters)
                    .enumerate()
                    .map(|(i, (slots, cluster))| {
                        Mail::Kcm(
                            cluster.clone(),
                            KcmMsg::SubmitComponent(ComponentSpec {
                                job: self.id.clone(),
                                component: i as u32,
                                slots: *slots,
                                command: String::new(),
                                env: Vec::new(),
                                walltime_ms: None,
                                workdir: None,
                                owner: "simulated".to_owned(),
                            }),
                        )
                    })
                    .collect();
                self.clusters.extend(clusters);
                self.state = JobState::Running;
                mail.push(self.report());
                mail
            }
            ControlMsg::PlacementFailed { .. } => {
                self.state = JobState::Done;
                ended(&self.id, &self.clusters)
            }
            ControlMsg::ComponentEnded(outcome) => {
                self.ended.insert(outcome.component);
                if self.ended.len() < self.components.len() {
                    return Vec::new();
                }
                self.state = JobState::Done;
                ended(&self.id, &self.clusters)
            }
            _ => Vec::new(),
        }
    }

    pub fn report(&self) -> Mail {
        let total = self.components.len() as u64;
        let done = self.ended.len() as u64;
        let running = if self.state == JobState::Waiting {
            0
        } else {
            total - done
        };
        Mail::Scheduler(SchedulerMsg::JobUpdate(JobReport {
            priority: Priority::Low,
            tasks: TaskCounts {
                total,
                pending: total - done - running,
                running,
                succeeded: done,
                ..TaskCounts::default()
            },
            started_at: self.registered,
            components: self.components.clone(),
            job: self.id.clone(),
            owner: "simulated".to_owned(),
            kind: JobKind::Grid,
            state: self.state,
            runner: "simulated".to_owned(),
            launchers: BTreeMap::new(),
            throughput: 0.0,
            preemptions: 0,
            results: String::new(),
            max_slots: None,
            problem: None,
            weight: 1,
            task_slots: 1,
            open: false,
        }))
    }
}

/// A job's end, as its runner announces it.
fn ended(job: &JobId, clusters: &BTreeSet<ClusterName>) -> Vec<Mail> {
    std::iter::once(Mail::Scheduler(SchedulerMsg::JobDone { job: job.clone() }))
        .chain(
            clusters
                .iter()
                .map(|c| Mail::Kcm(c.clone(), KcmMsg::JobEnded { job: job.clone() })),
        )
        .collect()
}
