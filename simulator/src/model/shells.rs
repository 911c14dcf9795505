//! The services' shells in the simulated world: what a kcm's commands and
//! the scheduler's effects do there, for the services' own loops
//! (`kcm-core::io`, `scheduler-core::io`) to carry out.

use std::{collections::BTreeMap, convert::Infallible};

use gleaner_kcm_core::{
    BackendError,
    core::Now,
    io::{Io, LauncherOrder},
};
use gleaner_manifest::JobId;
use gleaner_protocol::{ComponentOutcome, ComponentSpec, ControlMsg, SchedulerMsg};
use gleaner_scheduler_core::io as scheduler_io;

use super::{GridSim, JobTimes, Mail};
use crate::batch::{Batch, Clock, Happenings, Tasks};

/// What launchers and the batch system said, as mail for the jobs' runners.
pub(super) fn launcher_mail(ids: &[JobId], out: Happenings) -> Vec<Mail> {
    out.to_runners
        .into_iter()
        .map(|(j, message)| Mail::Runner(ids[j].clone(), message))
        .chain(out.results.into_iter().map(Mail::Result))
        .collect()
}

/// The simulated world as one cluster's kcm's commands reach it.
pub(super) struct SimulatedKcm<'s> {
    pub(super) clock: &'s Clock,
    pub(super) batch: &'s mut Batch,
    pub(super) tasks: &'s mut [Tasks],
    pub(super) ids: &'s [JobId],
    pub(super) times: &'s mut [JobTimes],
    pub(super) grid: &'s mut [GridSim],
    pub(super) grid_index: &'s BTreeMap<JobId, usize>,
    /// From a placeholder's submission to its launcher's first task (s).
    pub(super) launcher_start: f64,
    pub(super) mail: &'s mut Vec<Mail>,
}

impl Io for SimulatedKcm<'_> {
    type Error = Infallible;

    fn now(&self) -> Now {
        self.clock.now()
    }

    async fn submit_launchers(&mut self, order: LauncherOrder<'_>) -> Result<u32, BackendError> {
        if let Some(j) = self.ids.iter().position(|id| id == order.job) {
            let t = self.clock.t;
            self.times[j].first_launcher.get_or_insert(t);
            let gpu = order.task.needs.gpus > 0;
            let job = (j, &self.ids[j]);
            self.batch
                .submit_launchers(job, order.slots, gpu, t, self.launcher_start);
        }
        Ok(order.slots)
    }

    async fn remove(&mut self, ids: &[String]) -> Result<(), BackendError> {
        let mut out = Happenings::default();
        let at = (self.clock.t, self.clock.now());
        self.batch.remove(ids, at, self.tasks, &mut out);
        self.mail.extend(launcher_mail(self.ids, out));
        Ok(())
    }

    fn delete_spool_entry(&mut self, job: &JobId, component: u32) {
        self.batch.delete_spool_entry(job, component);
    }

    fn stop_component(&mut self, job: &JobId, component: u32, _stop: &str) {
        let ran = self.batch.stop_component(job, component, self.clock.t);
        // Its components resume from their checkpoints: the next run has
        // what is left.
        if let (Some(ran), Some(&g), 0) = (ran, self.grid_index.get(job), component) {
            self.grid[g].done += ran;
        }
    }

    fn release_component(&mut self, job: &JobId, component: u32, _go: &str, _hosts: &str) {
        self.batch.release_component(job, component, self.clock.t);
    }

    // Simulated jobs read no files.
    fn stage_inputs(&mut self, _: ComponentSpec, _: Vec<String>, _: Option<String>) {}

    async fn submit_component(
        &mut self,
        spec: &ComponentSpec,
        _one_host: bool,
        _account: Option<&str>,
    ) -> Result<(), BackendError> {
        if let Some(&g) = self.grid_index.get(&spec.job) {
            let left = self.grid[g].length - self.grid[g].done;
            let walltime = spec.walltime_ms.map(|ms| ms as f64 / 1000.0);
            self.batch.submit_component(
                spec.job.clone(),
                spec.component,
                spec.slots,
                (left.max(1.0), walltime),
                self.clock.t,
            );
        }
        Ok(())
    }

    async fn tell(&mut self, job: &JobId, message: ControlMsg) -> Result<(), Infallible> {
        self.mail.push(Mail::Runner(job.clone(), message));
        Ok(())
    }

    async fn report_component_end(
        &mut self,
        job: &JobId,
        outcome: ComponentOutcome,
    ) -> Result<(), Infallible> {
        let message = ControlMsg::ComponentEnded(outcome);
        self.mail.push(Mail::Runner(job.clone(), message));
        Ok(())
    }

    async fn to_scheduler(&mut self, message: SchedulerMsg) -> Result<(), Infallible> {
        self.mail.push(Mail::Scheduler(Box::new(message)));
        Ok(())
    }

    async fn announce(&mut self, _: gleaner_protocol::Event) -> Result<(), Infallible> {
        Ok(())
    }

    fn forget_launcher_settings(&mut self, _: &JobId) {}
}

/// The simulated world as the scheduler's effects reach it: decisions go
/// to the runners of jobs still there, and nobody else hears anything.
pub(super) struct SimulatedScheduler<F> {
    pub(super) now: Now,
    /// Whether a job's control queue exists.
    pub(super) live: F,
    pub(super) mail: Vec<Mail>,
}

impl<F: Fn(&JobId) -> bool + Send> scheduler_io::Io for SimulatedScheduler<F> {
    type Error = Infallible;

    fn now(&self) -> Now {
        self.now
    }

    async fn take_over(&mut self) -> Result<Option<gleaner_protocol::GridSnapshot>, Infallible> {
        Ok(None)
    }

    async fn reply(&mut self, _: gleaner_scheduler_core::core::Reply) {}

    async fn forward(
        &mut self,
        _: &JobId,
        _: ControlMsg,
        _: bool,
    ) -> Result<Result<bool, String>, Infallible> {
        Ok(Ok(false))
    }

    async fn post(&mut self, post: gleaner_scheduler_core::core::Post) -> Option<Vec<JobId>> {
        let mut gone = Vec::new();
        for (job, message) in post.actions {
            match (self.live)(&job) {
                true => self.mail.push(Mail::Runner(job, message)),
                false => gone.push(job),
            }
        }
        Some(gone)
    }

    fn metrics(&mut self, _: String) {}
}
