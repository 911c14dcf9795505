//! The simulated clusters' managers, behind one seam.
//!
//! [`ClusterManager`] is how the simulation talks to a kcm: a message on
//! its queue or a reading of the batch system in, with the time, and what to
//! do out. It is shaped after the kcm's pure core so that the core can take
//! its place (it reads the same [`Snapshot`]); until it does,
//! [`PolicyKcm`] stands in and answers waiting local jobs with the kcm's own
//! policy function, [`gleaner_policy::local::on_local_wait`].

use std::{collections::BTreeMap, time::Duration};

use gleaner_kcm::{
    KcmConfig, Snapshot,
    core::{Now, SpooledExit},
};
use gleaner_manifest::JobId;
use gleaner_policy::local::{Answered, LocalState, on_local_wait};
use gleaner_protocol::{
    ClusterName, ClusterReport, ComponentOutcome, ComponentSpec, ControlMsg, GrantId, Holding,
    KcmMsg, SchedulerMsg, ShrinkMode,
};

#[derive(Debug, Clone)]
pub enum Event {
    Message(KcmMsg),
    /// The batch system was read, with the exit statuses of the grid
    /// components that ended since.
    Polled {
        snapshot: Snapshot,
        spooled: Vec<SpooledExit>,
    },
}

#[derive(Debug, Clone)]
pub enum Effect {
    SubmitLaunchers {
        job: JobId,
        slots: u32,
    },
    /// Remove placeholders by batch id.
    Remove {
        ids: Vec<String>,
    },
    SubmitComponent(ComponentSpec),
    Tell {
        job: JobId,
        message: ControlMsg,
    },
    ToScheduler(SchedulerMsg),
    /// Read the batch system (and report) at once.
    PollNow,
}

/// The seam: whatever manages a simulated cluster. The kcm's pure core
/// (`gleaner_kcm::core::KcmCore`) goes here in place of [`PolicyKcm`]: its
/// events and effects cover these, and it also wants each launcher
/// submission answered and each reading followed by the moment to report.
pub trait ClusterManager {
    fn handle(&mut self, event: Event, now: Now) -> Vec<Effect>;
}

/// The manager of a simulated cluster, with the kcm's settings.
pub fn cluster_manager(config: &KcmConfig) -> Box<dyn ClusterManager> {
    Box::new(PolicyKcm {
        cluster: config.cluster.clone(),
        local_settle: config.local_settle,
        last: Snapshot::default(),
        applied_grants: Vec::new(),
        answered: Answered::default(),
    })
}

/// Stands in for the kcm's core: grows become placeholders, grid components
/// batch jobs, and waiting local jobs are answered by the local policy.
struct PolicyKcm {
    cluster: ClusterName,
    local_settle: Duration,
    last: Snapshot,
    /// Grants acted on since the previous report.
    applied_grants: Vec<GrantId>,
    answered: Answered,
}

impl ClusterManager for PolicyKcm {
    fn handle(&mut self, event: Event, now: Now) -> Vec<Effect> {
        match event {
            Event::Message(KcmMsg::StartLaunchers { job, grant, slots }) => {
                self.applied_grants.push(grant);
                vec![Effect::SubmitLaunchers { job, slots }, Effect::PollNow]
            }
            Event::Message(KcmMsg::SubmitComponent(spec)) => {
                vec![Effect::SubmitComponent(spec), Effect::PollNow]
            }
            // Its waiting placeholders go; its launchers, out of tasks,
            // leave by themselves.
            Event::Message(KcmMsg::JobEnded { job }) => {
                let ids: Vec<String> = self
                    .last
                    .placeholders
                    .iter()
                    .filter(|p| p.job == job && !p.running)
                    .map(|p| p.id.clone())
                    .collect();
                let mut effects = vec![Effect::PollNow];
                if !ids.is_empty() {
                    effects.insert(0, Effect::Remove { ids });
                }
                effects
            }
            // Simulated launchers always leave within their preemption delay:
            // there is nothing left to remove when the grace period ends.
            Event::Message(KcmMsg::Release { .. }) => Vec::new(),
            Event::Polled { snapshot, spooled } => {
                self.last = snapshot;
                let mut effects: Vec<Effect> = spooled
                    .into_iter()
                    .map(|exit| Effect::Tell {
                        job: exit.job,
                        message: ControlMsg::ComponentEnded(ComponentOutcome {
                            component: exit.component,
                            cluster: self.cluster.clone(),
                            exit_code: exit.exit_code,
                            runtime_ms: 0,
                            stdout: Default::default(),
                            stderr: Default::default(),
                        }),
                    })
                    .collect();
                effects.extend(self.make_room(now));
                effects.push(Effect::ToScheduler(SchedulerMsg::ClusterStatus(
                    self.report(now),
                )));
                effects
            }
        }
    }
}

impl PolicyKcm {
    /// Local jobs wait: withdraw pending placeholders, then order the
    /// scavenging jobs here to give back what is still missing.
    fn make_room(&mut self, now: Now) -> Vec<Effect> {
        let snapshot = &self.last;
        let pending: Vec<String> = snapshot
            .placeholders
            .iter()
            .filter(|p| !p.running)
            .map(|p| p.id.clone())
            .collect();
        let mut held: BTreeMap<JobId, u32> = BTreeMap::new();
        for p in snapshot.placeholders.iter().filter(|p| p.running) {
            *held.entry(p.job.clone()).or_default() += p.slots;
        }
        let state = LocalState {
            waiting: &snapshot.waiting,
            idle: snapshot.free_slots(),
            pending_placeholders: &pending,
            held: &held,
        };
        let settle = u64::try_from(self.local_settle.as_millis()).unwrap_or(u64::MAX);
        let plan = on_local_wait(state, &mut self.answered, now.wall_ms, settle);
        let mut effects = Vec::new();
        if !plan.withdraw.is_empty() {
            self.last
                .placeholders
                .retain(|p| !plan.withdraw.contains(&p.id));
            effects.push(Effect::Remove { ids: plan.withdraw });
        }
        for (job, slots) in plan.shrink {
            effects.push(Effect::Tell {
                job,
                message: ControlMsg::Shrink {
                    cluster: self.cluster.clone(),
                    slots,
                    mode: ShrinkMode::Preempt,
                    reason: "local jobs wait".to_owned(),
                },
            });
        }
        effects
    }

    fn report(&mut self, now: Now) -> ClusterReport {
        let snapshot = &self.last;
        let mut jobs: BTreeMap<JobId, Holding> = BTreeMap::new();
        for p in &snapshot.placeholders {
            let holding = jobs.entry(p.job.clone()).or_default();
            if p.running {
                holding.running += p.slots;
            } else {
                holding.pending += p.slots;
            }
        }
        let mut grid: BTreeMap<JobId, Holding> = BTreeMap::new();
        for c in &snapshot.components {
            let holding = grid.entry(c.job.clone()).or_default();
            if c.running {
                holding.running += c.slots;
            } else {
                holding.pending += c.slots;
            }
        }
        ClusterReport {
            cluster: self.cluster.clone(),
            backend: "simulated".to_owned(),
            total_slots: snapshot.total_slots,
            idle_slots: snapshot.idle_slots(),
            local_slots: snapshot.local_running,
            local_waiting: snapshot.local_waiting(),
            grid_slots: snapshot.grid_running,
            jobs,
            grid,
            applied_grants: std::mem::take(&mut self.applied_grants),
            error: None,
            failed_starts: 0,
            at: now.wall_ms,
        }
    }
}
