//! The simulated runners. A scavenging job's runner is the runner's own
//! machine ([`JobMachine`] around [`Sweep`]), driven by the loop the
//! runner's shell (`runner/src/job.rs`) drives it with, its effects
//! carried out in the simulated world. Its task queue is the simulated
//! broker's. A grid job's runner
//! is simulated here: it places its components and reports their ends.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gleaner_manifest::{JobId, JobKind, Priority};
use gleaner_protocol::Core;
use gleaner_protocol::{
    ClusterName, ComponentSpec, ControlMsg, JobReport, JobState, KcmMsg, LauncherId, Millis,
    SchedulerMsg, Submission, TaskCounts, TaskMsg,
};
use gleaner_runner::{Effect, JobEvent, JobMachine, JobSettings, Now, Opening, Sweep};

use crate::{model::Mail, scenario::JobSpec};

/// The simulated jobs' launcher account.
const LAUNCHERS: &str = "simulated-launchers";

/// Who sends a simulated job its control messages: the services, and its
/// launchers, which speak of themselves only.
pub const SENDER: &str = "simulated";

/// The runner of a scavenging job: the runner's own machine.
pub struct SweepRunner {
    machine: JobMachine<Sweep>,
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
            // Users kept apart, as the simulated kcms have them: the job's
            // launchers have an account of their own.
            launcher_credentials: Some(gleaner_protocol::Credentials {
                user: LAUNCHERS.to_owned(),
                password: String::new(),
            }),
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
        Self {
            machine: JobMachine::new(core),
        }
    }

    pub fn is_live(&self) -> bool {
        !self.machine.is_over()
    }

    /// Tasks that succeeded, as the job's index has them.
    pub fn done(&self) -> u64 {
        self.machine.job().ledger().book().counts().succeeded
    }

    /// Hands `event` to the machine and carries out its effects in the
    /// simulated world, as the runner's shell does in the real one: a
    /// message to a queue that may be gone is answered at once with
    /// whether it exists, a publication is with the broker at once.
    /// Writing outputs, index lines and `job.json` changes nothing here.
    pub fn handle(&mut self, event: JobEvent, now: Now, reach: &mut Reach<'_>) -> Vec<Mail> {
        let span = tracing::error_span!("job", job = %self.machine.job().ledger().id());
        let _in_job = span.enter();
        let mut mail = Vec::new();
        self.machine.handle(event, now);
        while let Some(effect) = self.machine.poll_effect(now) {
            match effect {
                Effect::ToScheduler(msg) => mail.push(Mail::Scheduler(msg)),
                Effect::ToKcm {
                    cluster,
                    msg,
                    followup,
                } => {
                    let arrived = (reach.kcm)(&cluster);
                    mail.push(Mail::Kcm(cluster, msg));
                    self.machine
                        .handle(JobEvent::Delivered { followup, arrived }, now);
                }
                Effect::ToLauncher {
                    launcher,
                    msg,
                    followup,
                } => {
                    let arrived = (reach.launcher)(&launcher);
                    mail.push(Mail::Launcher(launcher, msg));
                    self.machine
                        .handle(JobEvent::Delivered { followup, arrived }, now);
                }
                Effect::PurgeTasks | Effect::DeleteQueues => reach.queue.clear(),
                Effect::PublishFirst(first) => {
                    reach.queue.extend(first.each());
                    self.machine
                        .handle(JobEvent::Published(first.completes()), now);
                }
                Effect::Publish(tasks) => reach.queue.extend(tasks),
                Effect::DeclareQueues
                | Effect::ForgetLauncherAccount
                | Effect::Report
                | Effect::Event(_)
                | Effect::Answer(_)
                | Effect::WriteOutputs(_)
                | Effect::WriteFinalOutputs(_)
                | Effect::Record(_)
                | Effect::RecordAddition(_)
                | Effect::SaveJobFile => {}
            }
        }
        mail
    }
}

/// The runner of a grid job.
pub struct GridRunner {
    pub id: JobId,
    components: Vec<u32>,
    priority: Priority,
    registered: Millis,
    state: JobState,
    clusters: BTreeSet<ClusterName>,
    ended: BTreeSet<u32>,
}

impl GridRunner {
    pub fn new(id: JobId, components: Vec<u32>, priority: Priority, registered: Millis) -> Self {
        Self {
            id,
            components,
            priority,
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
            ControlMsg::Place { clusters, .. }
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
                                needs: Default::default(),
                                command: String::new(),
                                env: Vec::new(),
                                walltime_ms: None,
                                workdir: None,
                                owner: "simulated".to_owned(),
                                checkpoint: None,
                                inputs: Vec::new(),
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
            priority: self.priority,
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
            gathering: None,
            avoid: Vec::new(),
            component_inputs: Vec::new(),
            weight: 1,
            task_slots: 1,
            task_needs: Default::default(),
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
