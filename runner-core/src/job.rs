//! A job by composition: the [`Ledger`] every job keeps and its [`Kind`]
//! (`sweep.rs`, `grid_job.rs`), together a [`Job`], which the machine
//! (`core.rs`) drives.
//!
//! The ledger decides what is the same for every job: how a job opens from
//! what its results directory holds, what it reports, how it is cancelled,
//! when it is over and how it ends. No I/O here; the time comes in as
//! [`Now`].

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::Duration,
};

use gleaner_manifest::{Component, JobId, Manifest, ParamValue, TaskShape};
use gleaner_protocol::{
    ClusterName, ControlMsg, Credentials, Event, Gathering, JobReport, JobState, KcmMsg, ResultMsg,
    SchedulerMsg, Submission, TaskCounts,
};
use indexmap::IndexMap;
use tracing::{info, warn};

use crate::{
    book::{FinalStatus, TaskBook},
    effect::{Effect, Followup, Now},
    publication::Publication,
    records::{AddedTasks, FinalOutcome, IndexEntry, JobFile},
    returns::DeadLetter,
};

/// Settings every job controller of a runner shares: keys of `[runner]`,
/// with their defaults here and nowhere else.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct JobSettings {
    /// Relative `results` paths are resolved against this.
    pub results_root: PathBuf,
    /// How often the job reports to the scheduler and checks its launchers.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// How often launchers that do not say otherwise report (`[launcher]
    /// heartbeat`, copied when the settings are resolved, never set):
    /// each launcher's silence is judged by its own heartbeat.
    #[serde(skip)]
    pub launcher_heartbeat: Duration,
    /// How long a preempted launcher has before the kcm removes it.
    #[serde(with = "humantime_serde")]
    pub preempt_grace: Duration,
    /// An open job with no task to run and no addition for this long is
    /// closed (and so ends).
    #[serde(with = "humantime_serde")]
    pub open_idle: Duration,
    /// Which launchers a shrink takes back: gleaner's choice, always, in
    /// the services (not a setting); the simulator sets KOALA-CS's random
    /// one to rerun its thesis's experiments.
    #[serde(skip)]
    pub victims: gleaner_policy::preempt::VictimChoice,
}

impl JobSettings {
    /// How long a launcher that beats every `heartbeat` may stay silent:
    /// three missed beats and a margin for a busy broker.
    pub fn silence_after(heartbeat: Duration) -> Duration {
        heartbeat
            .saturating_mul(3)
            .saturating_add(Duration::from_secs(5))
    }

    /// How long after a launcher's death (it beat every `heartbeat`) the
    /// runner may notice it: a poll its queue no longer answers comes after
    /// two missed beats, its silence is given up after
    /// [`JobSettings::silence_after`]; a beat more for the report that
    /// looks.
    pub fn death_noticed_within(heartbeat: Duration) -> Duration {
        Self::silence_after(heartbeat).saturating_add(heartbeat)
    }
}

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            results_root: PathBuf::from("."),
            heartbeat: Duration::from_secs(2),
            launcher_heartbeat: gleaner_protocol::LAUNCHER_HEARTBEAT,
            preempt_grace: Duration::from_secs(10),
            open_idle: Duration::from_secs(3600),
            victims: gleaner_policy::preempt::VictimChoice::LeastLoss,
        }
    }
}

/// Throughput is finished tasks per second over this window.
pub const THROUGHPUT_WINDOW: Duration = Duration::from_secs(60);

/// What the shell found before the job could start.
#[derive(Debug)]
pub struct Opening<'a> {
    pub submission: &'a Submission,
    /// Who submitted it (see [`JobFile::owner`]).
    pub owner: String,
    /// The job's launcher account, where users are kept apart.
    pub launcher_credentials: Option<Credentials>,
    pub settings: JobSettings,
    /// This runner, named in `job.json` and the reports once the job starts.
    pub runner: String,
    /// The results directory, as reported (absolute).
    pub results: String,
    /// Final states the index already holds.
    pub finished: Vec<(u64, FinalStatus)>,
    /// `job.json`, if there is one.
    pub job_file: Option<JobFile>,
    /// Tasks added to an open job so far, in order.
    pub additions: Vec<AddedTasks>,
}

/// The results directory belongs to another job: running this one there
/// would mix two jobs' results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub owner: String,
}

/// What every job keeps, whatever its kind.
#[derive(Debug)]
pub struct Ledger {
    id: JobId,
    manifest: Manifest,
    settings: JobSettings,
    book: TaskBook,
    /// `job.json` as last decided; counts are filled in when it is written.
    file: JobFile,
    runner: String,
    preemptions: u64,
    /// Clusters involved in the job, whose kcms are told when it ends.
    clusters: BTreeSet<ClusterName>,
    /// Progress (finished, running) last told to watchers.
    reported: Option<(u64, u64)>,
    /// Given to kcms with each grow, for the launchers to connect as.
    launcher_credentials: Option<Credentials>,
    /// The manifest's final step, kept in the book as one entry beyond the
    /// tasks (so that it is retried and counted like one), but recorded in
    /// `job.json`, not the index.
    final_task: Option<u64>,
}

/// What a kind reads of the ledger, and the rules by which it changes.
impl Ledger {
    pub fn id(&self) -> &JobId {
        &self.id
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn settings(&self) -> &JobSettings {
        &self.settings
    }

    /// Where each task stands.
    pub fn book(&self) -> &TaskBook {
        &self.book
    }

    /// `job.json` as last decided (its counts are filled in when written).
    pub fn file(&self) -> &JobFile {
        &self.file
    }

    /// The final step's number in the book, if the job has one.
    pub fn final_task(&self) -> Option<u64> {
        self.final_task
    }

    pub fn launcher_credentials(&self) -> Option<&Credentials> {
        self.launcher_credentials.as_ref()
    }

    /// Clusters involved in the job, whose kcms are told when it ends.
    pub fn clusters(&self) -> &BTreeSet<ClusterName> {
        &self.clusters
    }

    /// What a run's result means for its task (see [`TaskBook::judge`]).
    pub fn judge(&mut self, result: &ResultMsg) -> crate::book::Verdict {
        self.book.judge(result)
    }

    /// A task's final state; `false` if it had one.
    pub fn finish(&mut self, task: u64, status: FinalStatus) -> bool {
        self.book.finish(task, status)
    }

    /// The final step's end, in the book and in `job.json`.
    pub fn finish_final(&mut self, outcome: FinalOutcome) {
        if let Some(task) = self.final_task {
            self.book.finish(task, outcome.book_status());
        }
        self.file.final_step = Some(outcome);
    }

    /// Preemptions a finished task went through.
    pub fn count_preemptions(&mut self, preemptions: u32) {
        self.preemptions += u64::from(preemptions);
    }

    /// A cluster the job has launchers or components on.
    pub fn involve(&mut self, cluster: ClusterName) {
        self.clusters.insert(cluster);
    }

    /// The clusters involved so far, forgotten (a grid job placed anew).
    pub fn forget_clusters(&mut self) -> BTreeSet<ClusterName> {
        std::mem::take(&mut self.clusters)
    }

    pub fn set_state(&mut self, state: JobState) {
        self.file.state = state;
    }

    /// An open job takes no more tasks.
    pub fn close(&mut self) {
        self.file.closed = true;
    }

    /// The final step is on its way to the task queue.
    pub fn final_published(&mut self) {
        self.file.final_published = true;
    }

    /// An open job's additions so far are all with the broker.
    pub fn additions_published(&mut self, additions: u32) {
        self.file.additions_published = additions;
    }

    /// Where a grid job's components are placed (`None`: not yet), as
    /// `job.json` records it.
    pub fn placements_mut(&mut self) -> &mut Vec<Option<ClusterName>> {
        &mut self.file.components
    }

    /// A grid job's gathering, begun (waiting since its submission, its
    /// claiming at `level`) if it had none.
    pub fn gather_mut(&mut self, level: f64) -> &mut crate::records::Gather {
        let waiting_since = self.file.submitted_at;
        self.file
            .gathering
            .get_or_insert_with(|| crate::records::Gather {
                figures: Default::default(),
                level,
                waiting_since,
                run: None,
            })
    }

    /// A grid job goes back to be placed again.
    pub fn restarted(&mut self) -> u32 {
        self.file.restarts += 1;
        self.file.restarts
    }

    /// Opens a job of `total` tasks (and its final step, if it has one)
    /// from what its results directory holds.
    pub fn open(opening: Opening<'_>, total: u64, now: Now) -> Result<Self, Refusal> {
        let submission = opening.submission;
        let final_task = submission.manifest.final_step.as_ref().map(|_| total);
        let entries = total + u64::from(final_task.is_some());
        let mut book = TaskBook::new(entries, submission.manifest.max_attempts);
        if let Some(rerun) = &submission.manifest.rerun {
            book.keep_only(&rerun.tasks, total);
        }
        for (task, status) in opening.finished {
            book.finish(task, status);
        }
        if let Some(other) = opening.job_file.as_ref().filter(|f| {
            f.job != submission.job.as_str() || (!f.owner.is_empty() && f.owner != opening.owner)
        }) {
            return Err(Refusal {
                owner: other.job.clone(),
            });
        }
        let mut file = opening.job_file.unwrap_or_else(|| JobFile {
            job: submission.job.to_string(),
            owner: opening.owner.clone(),
            name: submission.manifest.name.clone(),
            state: JobState::Starting,
            runner: opening.runner.clone(),
            results: opening.results,
            submitted_at: submission.submitted_at,
            started_at: now.wall_ms,
            finished_at: None,
            makespan_s: None,
            tasks: book.counts(),
            duplicates: 0,
            preemptions: 0,
            tasks_published: false,
            largest_bundle: 0,
            components: Vec::new(),
            restarts: 0,
            final_published: false,
            final_step: None,
            closed: false,
            additions_published: 0,
            gathering: None,
            problem: None,
        });
        // A job.json from before owners were recorded names none.
        file.owner.clone_from(&opening.owner);
        if let (Some(task), Some(outcome)) = (final_task, &file.final_step) {
            book.finish(task, outcome.book_status());
        }
        Ok(Self {
            id: submission.job.clone(),
            manifest: submission.manifest.clone(),
            settings: opening.settings,
            book,
            preemptions: file.preemptions,
            file,
            runner: opening.runner,
            clusters: BTreeSet::new(),
            reported: None,
            launcher_credentials: opening.launcher_credentials,
            final_task,
        })
    }

    /// The tasks' counts. A final step is left out of them once it ended;
    /// until then it counts as pending or running work, which the scheduler
    /// must find a slot for, but not in `total`.
    pub fn counts(&self) -> TaskCounts {
        let mut counts = self.book.counts();
        if self.final_task.is_some() {
            counts.total = counts.total.saturating_sub(1);
            if let Some(outcome) = &self.file.final_step {
                let counter = outcome.book_status().counter(&mut counts);
                *counter = counter.saturating_sub(1);
            }
        }
        counts
    }

    /// An open job not closed yet: more tasks may come, so it does not end
    /// when its tasks so far have.
    pub fn takes_tasks(&self) -> bool {
        self.manifest.open && !self.file.closed
    }

    /// `count` more tasks, numbered after the last; the final step, not
    /// published while tasks may come, moves behind them.
    pub fn add_tasks(&mut self, count: u64) {
        self.book.extend(count);
        if let Some(task) = self.final_task.as_mut() {
            *task += count;
        }
    }

    /// The job ended before (a runner died while winding it up): only the
    /// wind-up is left to do.
    pub fn has_ended(&self) -> bool {
        self.file.has_ended()
    }

    /// This runner takes the job over.
    pub fn take_over(&mut self) {
        self.file.runner = self.runner.clone();
    }

    /// The report to the scheduler, with what only the job's kind knows.
    pub fn report(
        &mut self,
        running: u64,
        launchers: BTreeMap<ClusterName, u32>,
        finished_recently: usize,
        now: Now,
    ) -> JobReport {
        self.book.set_running(running);
        let tasks = self.counts();
        let age = Duration::from_millis(now.wall_ms.saturating_sub(self.file.started_at));
        let span = age.min(THROUGHPUT_WINDOW).as_secs_f64().max(1.0);
        JobReport {
            job: self.id.clone(),
            owner: self.file.owner.clone(),
            kind: self.manifest.kind,
            priority: self.manifest.effective_priority(),
            state: self.file.state,
            runner: self.file.runner.clone(),
            tasks,
            launchers,
            throughput: finished_recently as f64 / span,
            preemptions: self.preemptions,
            started_at: self.file.started_at,
            results: self.file.results.clone(),
            components: self.unplaced().map(|(_, c)| c.slots.min()).collect(),
            moldable: match self.manifest.components.iter().any(|c| c.speedup.is_some()) {
                true => self
                    .unplaced()
                    .map(|(_, c)| c.moldable(self.manifest.walltime))
                    .collect(),
                false => Vec::new(),
            },
            max_slots: self.manifest.max_launchers,
            problem: self.file.problem.clone(),
            weight: self.manifest.weight,
            task_slots: self.current_shape().slots,
            task_needs: self.current_shape().needs,
            open: self.manifest.open && !self.file.closed,
            gathering: self.file.gathering.as_ref().map(|g| Gathering {
                walltime_s: self.manifest.walltime.map(|w| w.as_secs_f64()),
                running_s: g
                    .figures
                    .running_since
                    .map(|since| now.wall_ms.saturating_sub(since) as f64 / 1000.0),
                ..g.figures.clone()
            }),
            // The job's inputs once, however many components read them.
            inputs: match self.unplaced().next() {
                Some(_) => self.manifest.inputs.clone(),
                None => Vec::new(),
            },
            component_inputs: match self.manifest.components.iter().all(|c| c.inputs.is_empty()) {
                true => Vec::new(),
                false => self.unplaced().map(|(_, c)| c.inputs.clone()).collect(),
            },
            avoid: self
                .file
                .gathering
                .iter()
                .flat_map(|g| g.run.iter().flat_map(|run| run.avoid.iter().cloned()))
                .collect(),
        }
    }

    /// The shape launchers need now: the final step's own once it is all
    /// that is left to run.
    pub fn current_shape(&self) -> TaskShape {
        match (self.manifest.final_shape(), self.final_task) {
            (Some(shape), Some(task))
                if self.file.final_published && !self.book.is_finished(task) =>
            {
                shape
            }
            _ => self.manifest.task_shape(),
        }
    }

    /// A grid job's components no cluster has (yet), with their indices.
    pub fn unplaced(&self) -> impl Iterator<Item = (usize, &Component)> {
        self.manifest
            .components
            .iter()
            .enumerate()
            .filter(|(i, _)| self.file.components.get(*i).is_none_or(Option::is_none))
    }

    /// The scheduler hears every report; watchers, and `job.json`, only
    /// those where the progress changed.
    pub fn publish(&mut self, report: JobReport) -> Vec<Effect> {
        let mut effects = vec![Effect::ToScheduler(SchedulerMsg::JobUpdate(report.clone()))];
        let progress = (report.tasks.finished(), report.tasks.running);
        if self.reported != Some(progress) {
            self.reported = Some(progress);
            // Inputs are for placement: watchers need none.
            effects.push(Effect::Event(Event::Progress(report.without_inputs())));
            effects.push(Effect::SaveJobFile);
        }
        effects
    }
}

/// An index line: what the task ran, and how its final run went, if any.
pub fn index_entry(
    task: u64,
    command: String,
    params: IndexMap<String, ParamValue>,
    status: FinalStatus,
    result: Option<&ResultMsg>,
) -> IndexEntry {
    IndexEntry {
        task,
        command,
        params,
        status,
        exit_code: result.and_then(|r| r.exit_code),
        attempts: result.map_or(0, |r| r.attempt),
        preemptions: result.map_or(0, |r| r.preemptions),
        runtime_s: result.map_or(0.0, |r| r.runtime_ms as f64 / 1000.0),
        cluster: result.map(|r| r.cluster.clone()),
        host: result.map(|r| r.host.clone()).filter(|h| !h.is_empty()),
        error: result.and_then(|r| r.error.clone()),
        peak_memory_mb: result.and_then(|r| r.peak_memory_mb),
        stdout: None,
        stderr: None,
    }
}

/// What a job decides by its kind (a sweep, a grid job), given the
/// ledger every job keeps. [`Job`] composes the two and decides the rest.
pub trait Kind {
    /// Starts (or resumes) the job, once its queues exist.
    fn start(&mut self, ledger: &mut Ledger) -> Vec<Effect>;
    /// Results in delivery order; the shell acks them once the effects are applied.
    fn on_results(
        &mut self,
        ledger: &mut Ledger,
        batch: impl IntoIterator<Item = ResultMsg>,
        now: Now,
    ) -> Vec<Effect>;
    /// Tasks dead-lettered after being returned to their queue too often,
    /// held unacked until an [`Effect::SettleLost`] names their receipt.
    fn on_lost(&mut self, ledger: &mut Ledger, letter: DeadLetter, now: Now) -> Vec<Effect>;
    /// A message on the job's control queue.
    fn on_control(&mut self, ledger: &mut Ledger, msg: ControlMsg, now: Now) -> Vec<Effect>;
    /// Whether a message to a kcm or launcher arrived (its queue may be gone).
    fn on_delivery(
        &mut self,
        ledger: &mut Ledger,
        followup: Followup,
        arrived: bool,
        now: Now,
    ) -> Vec<Effect>;
    /// Asks launchers that went quiet whether they are still there: the
    /// first half of a report, whose answers (a queue gone) the report reflects.
    fn poll(&mut self, ledger: &mut Ledger, now: Now) -> Vec<Effect>;
    /// Where the job stands.
    fn standing(&mut self, ledger: &mut Ledger, now: Now) -> JobReport;
    /// The index line of a task's final state.
    fn entry(
        &self,
        ledger: &Ledger,
        task: u64,
        status: FinalStatus,
        result: Option<&ResultMsg>,
    ) -> IndexEntry;
    /// Clusters whose kcm is told when the job ends.
    fn clusters(&self, ledger: &Ledger) -> BTreeSet<ClusterName>;
}

/// Gives every task without a final state this one, durably.
pub fn finish_unfinished(kind: &impl Kind, ledger: &mut Ledger, status: FinalStatus) -> Effect {
    let final_task = ledger.final_task;
    let entries: Vec<IndexEntry> = ledger
        .book
        .unfinished()
        .filter(|task| Some(*task) != final_task)
        .map(|task| kind.entry(ledger, task, status, None))
        .collect();
    for entry in &entries {
        ledger.book.finish(entry.task, status);
    }
    if let Some(task) = final_task
        && ledger.book.finish(task, status)
    {
        ledger.file.final_step = Some(FinalOutcome::of(status, None));
    }
    Effect::Record(entries)
}

/// `gleaner cancel`: what has not finished is cancelled, on disk before
/// the order is acked. The job then ends.
pub fn cancel(kind: &impl Kind, ledger: &mut Ledger, reason: &str) -> Vec<Effect> {
    info!(reason, "cancelling");
    let record = finish_unfinished(kind, ledger, FinalStatus::Cancelled);
    ledger.file.state = JobState::Cancelled;
    vec![record, Effect::SaveJobFile]
}

/// A job: the ledger every job keeps, and what its kind keeps. The shell
/// (through [`crate::JobMachine`]) feeds it what happens, with the time,
/// and applies the effects it returns, in order.
#[derive(Debug)]
pub struct Job<K> {
    ledger: Ledger,
    kind: K,
}

impl<K: Kind> Job<K> {
    pub fn new(ledger: Ledger, kind: K) -> Self {
        Self { ledger, kind }
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// What its kind keeps, to read (the simulator's figures, tests).
    pub fn kind(&self) -> &K {
        &self.kind
    }

    /// For tests that set up a state no event leads to quickly.
    #[cfg(test)]
    pub(crate) fn ledger_mut(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    /// Clusters whose kcm is told when the job ends.
    pub fn clusters(&self) -> BTreeSet<ClusterName> {
        self.kind.clusters(&self.ledger)
    }

    pub fn start(&mut self) -> Vec<Effect> {
        self.kind.start(&mut self.ledger)
    }

    /// A publication of first attempts is all with the broker.
    pub fn on_published(&mut self, publication: Publication) -> Vec<Effect> {
        let file = &mut self.ledger.file;
        file.tasks_published |= publication.all_tasks;
        file.additions_published = file.additions_published.max(publication.additions);
        file.largest_bundle = file.largest_bundle.max(publication.bundle);
        vec![Effect::SaveJobFile]
    }

    pub fn on_results(
        &mut self,
        batch: impl IntoIterator<Item = ResultMsg>,
        now: Now,
    ) -> Vec<Effect> {
        self.kind.on_results(&mut self.ledger, batch, now)
    }

    pub fn on_lost(&mut self, letter: DeadLetter, now: Now) -> Vec<Effect> {
        self.kind.on_lost(&mut self.ledger, letter, now)
    }

    pub fn on_control(&mut self, msg: ControlMsg, now: Now) -> Vec<Effect> {
        self.kind.on_control(&mut self.ledger, msg, now)
    }

    pub fn on_delivery(&mut self, followup: Followup, arrived: bool, now: Now) -> Vec<Effect> {
        self.kind
            .on_delivery(&mut self.ledger, followup, arrived, now)
    }

    pub fn poll(&mut self, now: Now) -> Vec<Effect> {
        self.kind.poll(&mut self.ledger, now)
    }

    pub fn standing(&mut self, now: Now) -> JobReport {
        self.kind.standing(&mut self.ledger, now)
    }

    pub fn entry(&self, task: u64, status: FinalStatus, result: Option<&ResultMsg>) -> IndexEntry {
        self.kind.entry(&self.ledger, task, status, result)
    }

    /// The second half of a report: the scheduler, watchers, `job.json`.
    pub fn report(&mut self, now: Now) -> Vec<Effect> {
        let report = self.standing(now);
        self.ledger.publish(report)
    }

    /// `job.json` with the current counts.
    pub fn job_file(&self) -> JobFile {
        let ledger = &self.ledger;
        JobFile {
            tasks: ledger.counts(),
            duplicates: ledger.book.duplicates(),
            preemptions: ledger.preemptions,
            ..ledger.file.clone()
        }
    }

    pub fn cancel(&mut self, reason: &str) -> Vec<Effect> {
        cancel(&self.kind, &mut self.ledger, reason)
    }

    /// Something of the job's could not be sent (`problem`: a message
    /// over the broker's bound, made of what its owner gave): the job is
    /// stopped as a cancel stops it, its kind's own way, with the reason
    /// in `job.json` and its reports; its runner's other jobs go on. Once.
    pub fn fail(&mut self, problem: String, now: Now) -> Vec<Effect> {
        if self.ledger.file.problem.is_some() || self.ledger.has_ended() {
            return Vec::new();
        }
        warn!(problem, "the job is stopped");
        let reason = format!("stopped: {problem}");
        self.ledger.file.problem = Some(problem);
        let mut effects =
            self.kind
                .on_control(&mut self.ledger, ControlMsg::Cancel { reason }, now);
        effects.push(Effect::SaveJobFile);
        effects
    }

    /// The job is over, and how: cancelled, or done once every task has a
    /// final state.
    pub fn ending(&self) -> Option<JobState> {
        let ledger = &self.ledger;
        if ledger.file.state == JobState::Cancelled {
            Some(JobState::Cancelled)
        } else if ledger.book.is_complete() && !ledger.takes_tasks() {
            Some(JobState::Done)
        } else {
            None
        }
    }

    /// Records the end in `job.json`; [`Job::wind_up`] follows.
    pub fn finish(&mut self, state: JobState, now: Now) -> Vec<Effect> {
        let ledger = &mut self.ledger;
        let file = &mut ledger.file;
        file.state = state;
        file.finished_at = Some(now.wall_ms);
        file.makespan_s = Some(now.wall_ms.saturating_sub(file.submitted_at) as f64 / 1000.0);
        let counts = ledger.counts();
        info!(
            ?state,
            succeeded = counts.succeeded,
            failed = counts.failed,
            timed_out = counts.timed_out,
            lost = counts.lost,
            cancelled = counts.cancelled,
            duplicates = ledger.book.duplicates(),
            makespan_s = ledger.file.makespan_s,
            final_step = ledger.file.final_step.as_ref().map(|f| f.status.as_str()),
            "job ended"
        );
        vec![Effect::SaveJobFile]
    }

    /// The end of a job, repeatable after a crash: watchers, scheduler and
    /// kcms told, then the queues deleted (launchers leave). The
    /// news goes first: with a broker node down, deleting a replicated
    /// queue can take seconds, and nobody should wait for that.
    pub fn wind_up(&mut self, now: Now) -> Vec<Effect> {
        let clusters = self.clusters();
        // Watchers and the history keep no inputs: nothing is placed now.
        let mut report = self.standing(now).without_inputs();
        // A final step that failed fails the job, tasks' success or not.
        if let Some(outcome) = &self.ledger.file.final_step
            && matches!(outcome.status.as_str(), "failed" | "timed_out" | "lost")
            && report.problem.is_none()
        {
            report.problem = Some(format!(
                "the final step {} (exit code {}) after {} attempts; its output is in {}/final",
                outcome.status.replace('_', " "),
                outcome
                    .exit_code
                    .map_or_else(|| "none".to_owned(), |c| c.to_string()),
                outcome.attempts,
                report.results
            ));
        }
        let job = self.ledger.id.clone();
        // The end goes to watchers (and the history) first, the scheduler
        // next: a job is never gone from both its running list and the
        // history at once.
        let mut effects = vec![
            Effect::Event(Event::Done(report)),
            Effect::ToScheduler(SchedulerMsg::JobDone { job: job.clone() }),
        ];
        effects.extend(clusters.into_iter().map(|cluster| Effect::ToKcm {
            cluster,
            msg: KcmMsg::JobEnded { job: job.clone() },
            followup: Followup::Nothing,
        }));
        effects.push(Effect::DeleteQueues);
        if self.ledger.launcher_credentials.is_some() {
            effects.push(Effect::ForgetLauncherAccount);
        }
        effects
    }
}

/// What the cores' tests share: a job opened on a manifest, at a known time.
#[cfg(test)]
pub mod testing {
    use std::time::Instant;

    use super::*;
    use gleaner_protocol::{Captured, Message, Millis, RunStatus};

    pub const HEARTBEAT: Duration = Duration::from_secs(5);
    /// How long launchers beating every [`HEARTBEAT`] may stay silent.
    pub const SILENCE: Duration = Duration::from_secs(20);
    pub const GRACE: Duration = Duration::from_secs(10);
    /// The wall clock at the first instant of a test, in ms.
    const EPOCH_MS: Millis = 1_000_000;

    /// A submission of this manifest (TOML), submitted at 1 s.
    pub fn submission(manifest: &str) -> Submission {
        Submission {
            job: "sweep-3fa9c2d41e07b5a8".parse().unwrap(),
            manifest: Manifest::from_toml(manifest).unwrap(),
            submitted_at: 1_000,
        }
    }

    pub fn opening(
        submission: &Submission,
        finished: Vec<(u64, FinalStatus)>,
        job_file: Option<JobFile>,
    ) -> Opening<'_> {
        Opening {
            submission,
            owner: "alice".into(),
            launcher_credentials: None,
            settings: JobSettings {
                results_root: PathBuf::from("/results"),
                heartbeat: HEARTBEAT,
                launcher_heartbeat: HEARTBEAT,
                preempt_grace: GRACE,
                ..JobSettings::default()
            },
            runner: "runner@here".into(),
            results: "/results/sweep".into(),
            finished,
            job_file,
            additions: Vec::new(),
        }
    }

    /// `secs` seconds after `start`, on both clocks.
    pub fn at(start: Instant, secs: u64) -> Now {
        Now {
            instant: start + Duration::from_secs(secs),
            wall_ms: EPOCH_MS + secs * 1000,
        }
    }

    pub fn result(task: u64, attempt: u32, status: RunStatus) -> ResultMsg {
        ResultMsg {
            peak_memory_mb: None,
            job: "sweep-3fa9c2d41e07b5a8".parse().unwrap(),
            task,
            attempt,
            preemptions: 0,
            status,
            exit_code: Some(if status == RunStatus::Succeeded { 0 } else { 1 }),
            signal: None,
            runtime_ms: 1500,
            launcher: "l".into(),
            cluster: "c1".into(),
            host: "node1".into(),
            stdout: Captured::default(),
            stderr: Captured::default(),
            outputs: vec![],
            error: None,
            parted: None,
        }
    }

    /// The messages to kcms and launchers among `effects`, as
    /// (queue owner, message kind).
    pub fn told(effects: &[Effect]) -> Vec<(String, &'static str)> {
        effects
            .iter()
            .filter_map(|effect| match effect {
                // A relay, not a decision: see `a_launcher_up_is_relayed_to_its_kcm`.
                Effect::ToKcm {
                    msg: KcmMsg::LauncherUp { .. },
                    ..
                } => None,
                Effect::ToKcm { cluster, msg, .. } => Some((cluster.to_string(), msg.kind())),
                Effect::ToLauncher { launcher, msg, .. } => {
                    Some((launcher.to_string(), msg.kind()))
                }
                _ => None,
            })
            .collect()
    }

    /// The index lines recorded among `effects`.
    pub fn recorded(effects: &[Effect]) -> Vec<IndexEntry> {
        effects
            .iter()
            .flat_map(|effect| match effect {
                Effect::Record(entries) => entries.clone(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// The grow acceptance among `effects`.
    pub fn grow_ack(effects: &[Effect]) -> Option<u32> {
        effects.iter().find_map(|effect| match effect {
            Effect::ToScheduler(SchedulerMsg::GrowAck { accepted, .. }) => Some(*accepted),
            _ => None,
        })
    }
}
