//! The simulated runners: one per job, answering the scheduler and the kcms
//! with the messages the real runner sends. Which launchers give up their
//! slots is the preemption policy's choice, as in the runner.

use std::collections::{BTreeMap, BTreeSet};

use gleaner_manifest::{JobId, JobKind, Priority};
use gleaner_policy::preempt::{Candidate, choose_victims};
use gleaner_protocol::{
    ClusterName, ComponentSpec, ControlMsg, JobReport, JobState, KcmMsg, LauncherId, LauncherMsg,
    Millis, SchedulerMsg, ShrinkMode, TaskCounts,
};

use crate::{batch::Tasks, model::Mail};

/// A launcher that announced itself.
struct Known {
    cluster: ClusterName,
    /// Start of its task; `None` when idle.
    newest_start: Option<Millis>,
    /// Told to preempt or drain: no longer capacity.
    leaving: bool,
}

/// The runner of a scavenging job.
pub struct SweepRunner {
    pub id: JobId,
    /// Its tasks' index in the simulation.
    pub index: usize,
    /// How long preempted launchers get before the kcm removes them.
    preempt_grace: Millis,
    launchers: BTreeMap<LauncherId, Known>,
    clusters: BTreeSet<ClusterName>,
}

impl SweepRunner {
    pub fn new(id: JobId, index: usize, preempt_grace: Millis) -> Self {
        Self {
            id,
            index,
            preempt_grace,
            launchers: BTreeMap::new(),
            clusters: BTreeSet::new(),
        }
    }

    fn capacity(&self) -> u64 {
        self.launchers.values().filter(|l| !l.leaving).count() as u64
    }

    pub fn receive(&mut self, message: ControlMsg, tasks: &Tasks) -> Vec<Mail> {
        match message {
            ControlMsg::GrowOffer {
                grant,
                cluster,
                slots,
            } => {
                // As many slots as there are tasks to keep busy.
                let unfinished = tasks.total - tasks.done;
                let wanted = unfinished.saturating_sub(self.capacity());
                let accepted = slots.min(u32::try_from(wanted).unwrap_or(u32::MAX));
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
            } => self.shrink(&cluster, slots, mode, &reason),
            ControlMsg::LauncherUp(info) => {
                self.launchers.insert(
                    info.launcher,
                    Known {
                        cluster: info.cluster,
                        newest_start: None,
                        leaving: false,
                    },
                );
                Vec::new()
            }
            ControlMsg::LauncherStatus(status) => {
                if let Some(known) = self.launchers.get_mut(&status.launcher) {
                    known.newest_start = status.running.iter().map(|t| t.started_at).max();
                }
                Vec::new()
            }
            ControlMsg::LauncherGone { launcher, .. } => {
                self.launchers.remove(&launcher);
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// Gives back slots on a cluster: the launchers the preemption policy
    /// picks are told to go, and the kcm to remove those preempted.
    fn shrink(
        &mut self,
        cluster: &ClusterName,
        slots: u32,
        mode: ShrinkMode,
        reason: &str,
    ) -> Vec<Mail> {
        let candidates = self
            .launchers
            .iter()
            .filter(|(_, l)| &l.cluster == cluster && !l.leaving)
            .map(|(id, l)| Candidate {
                launcher: id.clone(),
                slots: 1,
                newest_start: l.newest_start,
            })
            .collect();
        let victims = choose_victims(candidates, slots);
        let order = match mode {
            ShrinkMode::Preempt => LauncherMsg::Preempt {
                reason: reason.to_owned(),
            },
            ShrinkMode::Drain => LauncherMsg::Drain {
                reason: reason.to_owned(),
            },
        };
        let mut mail = Vec::new();
        for id in &victims {
            if let Some(known) = self.launchers.get_mut(id) {
                known.leaving = true;
            }
            mail.push(Mail::Launcher {
                cluster: cluster.clone(),
                launcher: id.clone(),
                message: order.clone(),
            });
        }
        if mode == ShrinkMode::Preempt && !victims.is_empty() {
            mail.push(Mail::Kcm(
                cluster.clone(),
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
        let mut launchers: BTreeMap<ClusterName, u32> = BTreeMap::new();
        for known in self.launchers.values().filter(|l| !l.leaving) {
            *launchers.entry(known.cluster.clone()).or_default() += 1;
        }
        Mail::Scheduler(SchedulerMsg::JobUpdate(JobReport {
            launchers,
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
