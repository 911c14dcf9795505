//! The simulated runners: the runner's own machine ([`JobMachine`] around
//! a [`Sweep`] or a [`Grid`]), driven by the loop the runner's shell
//! (`runner/src/job.rs`) drives it with, its effects carried out in the
//! simulated world. A sweep's task queue is the simulated broker's; a
//! grid job's components are the simulated batch systems' jobs, gathered
//! at the barrier and claimed as the real ones are.

use std::{collections::VecDeque, convert::Infallible};

use futures_util::FutureExt;
use gleaner_manifest::{JobId, Manifest};
use gleaner_protocol::{ClusterName, Core, KcmMsg, LauncherId, LauncherMsg, Submission, TaskMsg};
use gleaner_runner_core::{
    Effect, FirstAttempts, Grid, JobEvent, JobFile, JobMachine, JobSettings, Kind, Now, Opening,
    Publication, Sweep,
    io::{Io, carry_out},
};

use crate::{model::Mail, scenario::JobSpec};

/// The simulated jobs' launcher account.
const LAUNCHERS: &str = "simulated-launchers";

/// Who sends a simulated job its control messages: the services, and its
/// launchers, which speak of themselves only.
pub const SENDER: &str = "simulated";

/// A job's runner: the runner's own machine.
pub struct Runner<K> {
    machine: JobMachine<K>,
}

/// The runner of a scavenging job.
pub type SweepRunner = Runner<Sweep>;

/// The runner of a grid job.
pub type GridRunner = Runner<Grid>;

/// What a sweep's effects reach in the simulated world.
pub struct Reach<'a> {
    /// The job's task queue.
    pub queue: &'a mut VecDeque<TaskMsg>,
    /// Whether a cluster's kcm has a queue.
    pub kcm: &'a (dyn Fn(&ClusterName) -> bool + Sync),
    /// Whether a launcher has a queue (it runs).
    pub launcher: &'a (dyn Fn(&LauncherId) -> bool + Sync),
}

/// The job's opening, as a runner opens a new one: no results yet.
fn opening(submission: &Submission, settings: JobSettings) -> Opening<'_> {
    Opening {
        submission,
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
    }
}

impl SweepRunner {
    pub fn open(job: JobId, spec: &JobSpec, settings: JobSettings, now: Now) -> Self {
        let submission = Submission {
            job,
            manifest: spec.manifest.clone(),
            submitted_at: now.wall_ms,
        };
        let core = match Sweep::open(opening(&submission, settings), spec.task_list.clone(), now) {
            Ok(core) => core,
            Err(refusal) => unreachable!("a job without a job.json is nobody else's: {refusal:?}"),
        };
        Self {
            machine: JobMachine::new(core),
        }
    }

    /// Launchers its core gave up because their heartbeats stopped.
    pub fn timeouts(&self) -> u64 {
        self.machine.job().kind().launcher_timeouts()
    }
}

impl GridRunner {
    /// A grid job of `manifest`, submitted `now`.
    pub fn open(job: JobId, manifest: Manifest, settings: JobSettings, now: Now) -> Self {
        let submission = Submission {
            job,
            manifest,
            submitted_at: now.wall_ms,
        };
        let core = match Grid::open(opening(&submission, settings), now) {
            Ok(core) => core,
            Err(refusal) => unreachable!("a job without a job.json is nobody else's: {refusal:?}"),
        };
        Self {
            machine: JobMachine::new(core),
        }
    }
}

impl<K: Kind> Runner<K> {
    pub fn is_live(&self) -> bool {
        !self.machine.is_over()
    }

    /// Its `job.json`: how a grid job gathered, where it ran.
    pub fn job_file(&self) -> JobFile {
        self.machine.job().job_file()
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
        self.machine.handle(event, now);
        self.carry_out(now, reach)
    }

    /// When the machine wants its time event next.
    pub fn poll_timeout(&self) -> Option<std::time::Instant> {
        self.machine.poll_timeout()
    }

    /// The machine's time event (its report), if due at `now`.
    pub fn handle_timeout(&mut self, now: Now, reach: &mut Reach<'_>) -> Vec<Mail> {
        if !gleaner_protocol::is_due(&self.machine, now) {
            return Vec::new();
        }
        let span = tracing::error_span!("job", job = %self.machine.job().ledger().id());
        let _in_job = span.enter();
        self.machine.handle_timeout(now);
        self.carry_out(now, reach)
    }

    /// Carries out the machine's effects with the runner's own loop.
    fn carry_out(&mut self, now: Now, reach: &mut Reach<'_>) -> Vec<Mail> {
        let mut world = Simulated {
            reach,
            mail: Vec::new(),
        };
        match carry_out(&mut self.machine, &mut world, now).now_or_never() {
            Some(Ok(())) => {}
            Some(Err(never)) => match never {},
            None => tracing::error!("a simulated job's effect did not end at once"),
        }
        world.mail
    }
}

/// A job's effects as they reach the simulated world: a message to a
/// queue that may be gone is answered at once with whether it exists, a
/// publication is with the broker at once; writing outputs, index lines
/// and `job.json` changes nothing here.
struct Simulated<'r, 'q> {
    reach: &'r mut Reach<'q>,
    mail: Vec<Mail>,
}

impl Io for Simulated<'_, '_> {
    type Error = Infallible;

    async fn to_kcm(&mut self, cluster: &ClusterName, msg: KcmMsg) -> Result<bool, Infallible> {
        let arrived = (self.reach.kcm)(cluster);
        self.mail.push(Mail::Kcm(cluster.clone(), msg));
        Ok(arrived)
    }

    async fn to_launcher(
        &mut self,
        launcher: &LauncherId,
        msg: LauncherMsg,
    ) -> Result<bool, Infallible> {
        let arrived = (self.reach.launcher)(launcher);
        self.mail.push(Mail::Launcher(launcher.clone(), msg));
        Ok(arrived)
    }

    async fn publish_first(
        &mut self,
        first: FirstAttempts,
    ) -> Result<Option<Publication>, Infallible> {
        self.reach.queue.extend(first.each());
        Ok(Some(first.completes()))
    }

    fn save_job_file(&mut self, _: JobFile) -> Result<(), Infallible> {
        Ok(())
    }

    async fn apply(&mut self, effect: Effect) -> Result<(), Infallible> {
        match effect {
            Effect::ToScheduler(msg) => self.mail.push(Mail::Scheduler(Box::new(msg))),
            Effect::PurgeTasks | Effect::DeleteQueues => self.reach.queue.clear(),
            Effect::Publish(tasks) => self.reach.queue.extend(tasks),
            Effect::ToKcm { .. }
            | Effect::ToLauncher { .. }
            | Effect::PublishFirst(_)
            | Effect::SaveJobFile
            | Effect::DeclareQueues
            | Effect::ForgetLauncherAccount
            | Effect::Report
            | Effect::Event(_)
            | Effect::Answer(_)
            | Effect::Relay { .. }
            | Effect::SettleLost(_)
            | Effect::WriteOutputs(_)
            | Effect::WriteRetried(_)
            | Effect::WriteFinalOutputs(_)
            | Effect::Record(_)
            | Effect::RecordAddition(_) => {}
        }
        Ok(())
    }

    fn unsendable(&mut self, never: Infallible) -> Result<String, Infallible> {
        match never {}
    }
}
