//! The simulated runners: one per job, answering the scheduler and the kcms
//! with the messages the real runner sends. How many offered slots a job
//! takes, and which launchers give up their slots, are the runner's own
//! rules (`gleaner_policy::share::accepted`, `gleaner_policy::preempt`) over
//! the runner's own launcher table.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use gleaner_manifest::{JobId, JobKind, Priority};
use gleaner_policy::{preempt, share};
use gleaner_protocol::{
    ClusterName, ComponentSpec, ControlMsg, JobReport, JobState, KcmMsg, Millis, SchedulerMsg,
    ShrinkMode, TaskCounts,
};
use gleaner_runner::LauncherTable;

use crate::{batch::Tasks, model::Mail};

/// The runner of a scavenging job.
pub struct SweepRunner {
    pub id: JobId,
    /// Its tasks' index in the simulation.
    pub index: usize,
    /// How long preempted launchers get before the kcm removes them.
    preempt_grace: Millis,
    launchers: LauncherTable,
    clusters: BTreeSet<ClusterName>,
}

impl SweepRunner {
    pub fn new(id: JobId, index: usize, preempt_grace: Millis) -> Self {
        Self {
            id,
            index,
            preempt_grace,
            launchers: LauncherTable::default(),
            clusters: BTreeSet::new(),
        }
    }

    pub fn receive(&mut self, message: ControlMsg, tasks: &Tasks, now: Instant) -> Vec<Mail> {
        match message {
            ControlMsg::GrowOffer {
                grant,
                cluster,
                slots,
            } => {
                let accepted = share::accepted(
                    slots,
                    tasks.total - tasks.done,
                    u64::from(self.launchers.total_slots()),
                );
                let mut mail = vec![Mail::Scheduler(SchedulerMsg::GrowAck {
                    grant,
                    job: self.id.clone(),
                    cluster: cluster.clone(),
                    accepted,
                })];
                if accepted > 0 {
                    self.clusters.insert(cluster.clone());
                    mail.push(Mail::Kcm(
                        cluster,
                        KcmMsg::StartLaunchers {
                            job: self.id.clone(),
                            grant,
                            slots: accepted,
                        },
                    ));
                }
                mail
            }
            ControlMsg::Shrink {
                cluster,
                slots,
                mode,
                reason,
            } => self.shrink(cluster, slots, mode, &reason),
            ControlMsg::LauncherUp(info) => {
                self.launchers.up(&info, now);
                Vec::new()
            }
            ControlMsg::LauncherStatus(status) => {
                self.launchers.status(status, now);
                Vec::new()
            }
            ControlMsg::LauncherGone { launcher, .. } => {
                self.launchers.gone(&launcher);
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// Gives back slots on a cluster: the launchers the runner's table
    /// picks are told to go, and the kcm to remove those preempted.
    fn shrink(
        &mut self,
        cluster: ClusterName,
        slots: u32,
        mode: ShrinkMode,
        why: &str,
    ) -> Vec<Mail> {
        let (victims, _) = self.launchers.pick_victims(&cluster, slots);
        let order = preempt::order(mode, why);
        let mut mail: Vec<Mail> = victims
            .iter()
            .map(|id| Mail::Launcher {
                cluster: cluster.clone(),
                launcher: id.clone(),
                message: order.clone(),
            })
            .collect();
        if preempt::releases(mode, &victims) {
            mail.push(Mail::Kcm(
                cluster,
                KcmMsg::Release {
                    job: self.id.clone(),
                    launchers: victims,
                    grace_ms: self.preempt_grace,
                },
            ));
        }
        mail
    }

    pub fn report(&self, tasks: &Tasks) -> Mail {
        Mail::Scheduler(SchedulerMsg::JobUpdate(JobReport {
            launchers: self.launchers.slots_by_cluster(),
            preemptions: tasks.preemptions,
            tasks: TaskCounts {
                total: tasks.total,
                pending: tasks.queued,
                running: tasks.running,
                succeeded: tasks.done,
                ..TaskCounts::default()
            },
            ..report(self.id.clone(), JobKind::Scavenge, JobState::Running)
        }))
    }

    /// Every task is done: the scheduler and the kcms hear of it.
    pub fn finish(&self) -> Vec<Mail> {
        ended(&self.id, &self.clusters)
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
            ..report(self.id.clone(), JobKind::Grid, self.state)
        }))
    }
}

fn report(job: JobId, kind: JobKind, state: JobState) -> JobReport {
    JobReport {
        job,
        kind,
        priority: Priority::SuperLow,
        state,
        runner: "simulated".to_owned(),
        tasks: TaskCounts::default(),
        launchers: BTreeMap::new(),
        throughput: 0.0,
        preemptions: 0,
        started_at: 0,
        results: String::new(),
        components: Vec::new(),
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
