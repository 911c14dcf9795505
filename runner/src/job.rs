//! The controller of one job, from its manifest to its last result.
//!
//! It always starts the same way, whether the job is new or resumed after a
//! crash: take the job's lock, read what the results directory already has,
//! publish what was never published, then consume results until every task
//! has a final state.

use std::{
    collections::{BTreeSet, VecDeque},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use futures_util::FutureExt;
use gleaner_broker::{
    BrokerError, Connection, ConsumeOptions, Inbox, Incoming, Publisher,
    topology::{self, JobQueues, SCHEDULER_QUEUE, kcm_queue, launcher_queue},
};
use gleaner_protocol::{
        ComponentOutcome, ComponentSpec, ControlMsg, Event, JobReport, JobState, KcmMsg,
        LauncherMsg, ResultMsg, RunStatus, SchedulerMsg, ShrinkMode, Submission, TaskMsg, now_ms,
    };
use gleaner_manifest::{JobId, JobKind, Manifest, TaskList};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    book::{FinalStatus, TaskBook, Verdict},
    launchers::LauncherTable,
    results::{IndexEntry, JobFile, ResultsDir},
};

/// Settings every job controller of a runner shares.
#[derive(Debug, Clone)]
pub struct JobSettings {
    /// Relative `results` paths are resolved against this.
    pub results_root: PathBuf,
    /// How often the job reports to the scheduler and checks its launchers.
    pub heartbeat: Duration,
    /// A launcher silent this long is considered dead.
    pub launcher_silence: Duration,
    /// How long a preempted launcher has before the kcm removes it.
    pub preempt_grace: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("results directory {path}: {error}")]
    Results { path: String, error: std::io::Error },
    #[error("the runner is shutting down")]
    Shutdown,
    /// The job cannot run as submitted (its results directory belongs to
    /// another job); retrying would not help.
    #[error("{0}")]
    Refused(String),
}

/// Results processed per write-and-sync round.
const RESULT_BATCH: usize = 512;
/// Tasks published per confirm round.
const PUBLISH_BATCH: usize = 1000;

struct Job {
    id: JobId,
    manifest: Manifest,
    tasks: TaskList,
    queues: JobQueues,
    book: TaskBook,
    launchers: LauncherTable,
    results: ResultsDir,
    file: JobFile,
    publisher: Publisher,
    settings: JobSettings,
    preemptions: u64,
    /// When recent tasks finished, for the throughput figure.
    recent: VecDeque<Instant>,
    /// Clusters asked for launchers, told when the job ends.
    clusters: BTreeSet<String>,
    /// Shrinks that found too few launchers to stop: the launchers still on
    /// their way (placeholders starting) are stopped as they announce themselves.
    owed: Vec<OwedShrink>,
    reported: Option<(u64, u64)>,
}

#[derive(Debug, Clone)]
struct OwedShrink {
    cluster: String,
    slots: u32,
    mode: ShrinkMode,
    reason: String,
    since: Instant,
}

/// How long an unfulfilled shrink waits for launchers to stop; the
/// scheduler decides afresh after that.
const OWED_SHRINK_LIFETIME: Duration = Duration::from_secs(30);

/// Runs a job to its end. Returns `Ok` once the manifest may be acked.
pub async fn run(
    connection: Arc<Connection>,
    settings: JobSettings,
    submission: &Submission,
    shutdown: CancellationToken,
) -> Result<(), JobError> {
    let id = submission.job.clone();
    let queues = JobQueues::new(&id);
    let root = settings
        .results_root
        .join(submission.manifest.results_dir(id.as_str()));
    let io_error = |error| JobError::Results {
        path: root.display().to_string(),
        error,
    };
    let (results, finished) = ResultsDir::open(&root).map_err(io_error)?;
    let publisher = connection.publisher().await?;

    if !wait_for_lock(&connection, &queues, &results, &id, &shutdown).await? {
        info!(job = %id, "another runner finished the job meanwhile");
        return Ok(());
    }

    let tasks = TaskList::new(&submission.manifest).map_err(|e| {
        // Validated on arrival; a failure here means the manifest changed under us.
        JobError::Results {
            path: root.display().to_string(),
            error: std::io::Error::other(e.to_string()),
        }
    })?;
    let manifest = &submission.manifest;
    let total = match manifest.kind {
        JobKind::Scavenge => tasks.len(),
        JobKind::Grid => manifest.components.len() as u64,
    };
    let mut book = TaskBook::new(total, manifest.max_attempts);
    for (task, status) in finished {
        book.finish(task, status);
    }
    let existing = results.read_job_file();
    if let Some(other) = existing.as_ref().filter(|f| f.job != id.as_str()) {
        return Err(JobError::Refused(format!(
            "results directory {} belongs to job {}; choose another `results`",
            root.display(),
            other.job
        )));
    }
    let file = existing.unwrap_or_else(|| JobFile {
        job: id.to_string(),
        name: submission.manifest.name.clone(),
        state: JobState::Starting,
        runner: connection.identity().to_owned(),
        results: std::path::absolute(&root)
            .unwrap_or_else(|_| root.clone())
            .display()
            .to_string(),
        submitted_at: submission.submitted_at,
        started_at: now_ms(),
        finished_at: None,
        makespan_s: None,
        tasks: book.counts(),
        duplicates: 0,
        preemptions: 0,
        tasks_published: false,
        components: Vec::new(),
    });
    let mut job = Job {
        id,
        manifest: submission.manifest.clone(),
        tasks,
        queues,
        book,
        launchers: LauncherTable::default(),
        results,
        preemptions: file.preemptions,
        file,
        publisher,
        settings,
        recent: VecDeque::new(),
        clusters: BTreeSet::new(),
        owed: Vec::new(),
        reported: None,
    };
    if matches!(job.file.state, JobState::Done | JobState::Cancelled) {
        info!(job = %job.id, "job had already ended; cleaning up");
        return job.wind_up().await;
    }
    job.file.runner = connection.identity().to_owned();
    job.start(&connection).await?;
    job.serve(&connection, &shutdown).await
}

/// Takes the job's lock, waiting while another runner holds it. `false` if
/// that runner finished the job meanwhile.
async fn wait_for_lock(
    connection: &Connection,
    queues: &JobQueues,
    results: &ResultsDir,
    job: &JobId,
    shutdown: &CancellationToken,
) -> Result<bool, JobError> {
    let mut said = false;
    loop {
        if topology::lock_job(connection.lapin(), queues).await? {
            return Ok(true);
        }
        if results
            .read_job_file()
            .is_some_and(|f| matches!(f.state, JobState::Done | JobState::Cancelled))
        {
            return Ok(false);
        }
        if !said {
            info!(job = %job, "another runner owns this job; waiting for it to end or die");
            said = true;
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
            () = shutdown.cancelled() => return Err(JobError::Shutdown),
        }
    }
}

impl Job {
    fn io_error(&self, error: std::io::Error) -> JobError {
        JobError::Results {
            path: self.results.root().display().to_string(),
            error,
        }
    }

    /// Declares the job's queues and publishes every task not yet published
    /// (or, for a grid job, waits to be placed).
    async fn start(&mut self, connection: &Connection) -> Result<(), JobError> {
        let channel = connection.channel().await?;
        topology::declare_job(&channel, &self.queues).await?;
        if self.manifest.kind == JobKind::Grid {
            self.file
                .components
                .resize(self.manifest.components.len(), None);
            self.clusters
                .extend(self.file.components.iter().flatten().cloned());
            let placed = self.file.components.iter().all(Option::is_some);
            self.file.state = if placed {
                JobState::Running
            } else {
                JobState::Waiting
            };
            info!(job = %self.id, components = self.manifest.components.len(), placed, "grid job registered");
            self.save()?;
            return self.report().await;
        }
        if !self.file.tasks_published {
            // A crash mid-publication leaves an unknown prefix published:
            // start the publication over (duplicates are harmless).
            topology::purge(&channel, &self.queues.tasks).await?;
            let unfinished: Vec<u64> = self.book.unfinished().collect();
            for chunk in unfinished.chunks(PUBLISH_BATCH) {
                let msgs: Vec<TaskMsg> = chunk
                    .iter()
                    .filter_map(|&task| self.task_msg(task, 1, 0))
                    .collect();
                self.publisher.send_all(&self.queues.tasks, &msgs).await?;
            }
            self.file.tasks_published = true;
            info!(job = %self.id, tasks = unfinished.len(), "tasks published");
        } else {
            info!(job = %self.id, finished = self.book.counts().finished(), total = self.book.counts().total, "job resumed");
        }
        self.file.state = JobState::Running;
        self.save()?;
        self.report().await
    }

    fn task_msg(&self, task: u64, attempt: u32, preemptions: u32) -> Option<TaskMsg> {
        let spec = self.tasks.get(task)?;
        let m = &self.manifest;
        Some(TaskMsg {
            job: self.id.clone(),
            task,
            attempt,
            preemptions,
            command: spec.command,
            env: m.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            walltime_ms: m.walltime.map(|w| w.as_millis() as u64),
            outputs: m.outputs.clone(),
            workdir: m.workdir.as_ref().map(|w| w.display().to_string()),
        })
    }

    fn save(&mut self) -> Result<(), JobError> {
        self.file.tasks = self.book.counts();
        self.file.duplicates = self.book.duplicates();
        self.file.preemptions = self.preemptions;
        self.results
            .write_job_file(&self.file)
            .map_err(|e| self.io_error(e))
    }

    async fn serve(
        &mut self,
        connection: &Connection,
        shutdown: &CancellationToken,
    ) -> Result<(), JobError> {
        let options = |prefetch| ConsumeOptions {
            tag: connection.identity(),
            prefetch,
            exclusive: false,
        };
        let publisher = &self.publisher;
        let mut results: Inbox<ResultMsg> = connection
            .inbox(publisher, &self.queues.results, options(1024))
            .await?;
        let mut dead: Inbox<TaskMsg> = connection
            .inbox(publisher, &self.queues.dead, options(64))
            .await?;
        let mut control: Inbox<ControlMsg> = connection
            .inbox(publisher, &self.queues.control, options(256))
            .await?;
        let mut heartbeat = tokio::time::interval(self.settings.heartbeat);
        loop {
            if self.book.is_complete() {
                return self.finish(JobState::Done).await;
            }
            tokio::select! {
                first = results.next() => {
                    let mut batch = vec![delivered(first)?];
                    while batch.len() < RESULT_BATCH {
                        match results.next().now_or_never() {
                            Some(next) => batch.push(delivered(next)?),
                            None => break,
                        }
                    }
                    self.on_results(batch).await?;
                }
                lost = dead.next() => self.on_lost(delivered(lost)?).await?,
                message = control.next() => {
                    let incoming = delivered(message)?;
                    if let ControlMsg::Cancel { reason } = &incoming.msg {
                        return self.cancel(reason, &incoming).await;
                    }
                    self.on_control(incoming).await?;
                }
                _ = heartbeat.tick() => self.report().await?,
                () = shutdown.cancelled() => return Err(JobError::Shutdown),
            }
        }
    }

    async fn on_results(&mut self, batch: Vec<Incoming<ResultMsg>>) -> Result<(), JobError> {
        let mut retries = Vec::new();
        let mut entries = Vec::new();
        for incoming in &batch {
            let result = &incoming.msg;
            if result.job != self.id {
                warn!(job = %self.id, other = %result.job, "result of another job ignored");
                continue;
            }
            match self.book.judge(result) {
                Verdict::Final(status) => {
                    self.results
                        .write_outputs(result)
                        .map_err(|e| self.io_error(e))?;
                    entries.push(self.entry(result.task, status, Some(result)));
                    self.book.finish(result.task, status);
                    self.preemptions += u64::from(result.preemptions);
                    self.recent.push_back(Instant::now());
                    debug!(job = %self.id, task = result.task, ?status, "task finished");
                }
                Verdict::Retry { attempt } => {
                    self.results
                        .write_outputs(result)
                        .map_err(|e| self.io_error(e))?;
                    info!(job = %self.id, task = result.task, attempt, status = ?result.status, exit_code = ?result.exit_code, "task failed; retrying");
                    retries.extend(self.task_msg(result.task, attempt, result.preemptions));
                }
                Verdict::Duplicate => {
                    debug!(job = %self.id, task = result.task, attempt = result.attempt, "duplicate result");
                }
            }
        }
        // Retries go out before the results that caused them are acked.
        self.publisher
            .send_all(&self.queues.tasks, &retries)
            .await?;
        self.record(&entries)?;
        if let Some(last) = batch.last() {
            last.ack_up_to_here().await?;
        }
        Ok(())
    }

    /// Appends final states to the index and makes them durable.
    fn record(&mut self, entries: &[IndexEntry]) -> Result<(), JobError> {
        if !entries.is_empty() {
            self.results.append(entries).map_err(|e| self.io_error(e))?;
        }
        self.results.sync().map_err(|e| self.io_error(e))
    }

    fn entry(&self, task: u64, status: FinalStatus, result: Option<&ResultMsg>) -> IndexEntry {
        let spec = self.tasks.get(task);
        let component = self.manifest.components.get(task as usize);
        IndexEntry {
            task,
            command: spec
                .as_ref()
                .map(|s| s.command.clone())
                .or_else(|| component.map(|c| c.command.clone()))
                .unwrap_or_default(),
            params: spec.map(|s| s.params).unwrap_or_default(),
            status,
            exit_code: result.and_then(|r| r.exit_code),
            attempts: result.map_or(0, |r| r.attempt),
            preemptions: result.map_or(0, |r| r.preemptions),
            runtime_s: result.map_or(0.0, |r| r.runtime_ms as f64 / 1000.0),
            cluster: result.map(|r| r.cluster.clone()),
            host: result.map(|r| r.host.clone()).filter(|h| !h.is_empty()),
        }
    }

    /// A task dead-lettered after crashing its launchers too often.
    async fn on_lost(&mut self, incoming: Incoming<TaskMsg>) -> Result<(), JobError> {
        let task = &incoming.msg;
        if task.job == self.id && !self.book.is_finished(task.task) {
            warn!(job = %self.id, task = task.task, attempt = task.attempt, "task lost: its launchers died every time it ran");
            let mut entry = self.entry(task.task, FinalStatus::Lost, None);
            entry.attempts = task.attempt;
            entry.preemptions = task.preemptions;
            self.record(&[entry])?;
            self.book.finish(task.task, FinalStatus::Lost);
        }
        incoming.ack().await?;
        Ok(())
    }

    async fn on_control(&mut self, incoming: Incoming<ControlMsg>) -> Result<(), JobError> {
        let now = Instant::now();
        match incoming.msg.clone() {
            ControlMsg::LauncherUp(info) => {
                debug!(job = %self.id, launcher = %info.launcher, cluster = %info.cluster, host = %info.host, "launcher up");
                self.clusters.insert(info.cluster.clone());
                self.launchers.up(&info, now);
                if let Some(i) = self.owed.iter().position(|o| o.cluster == info.cluster) {
                    let owed = self.owed.remove(i);
                    self.on_shrink(&owed.cluster, owed.slots, owed.mode, &owed.reason)
                        .await?;
                }
            }
            ControlMsg::LauncherStatus(status) => {
                self.launchers.status(status, now);
            }
            ControlMsg::LauncherGone {
                launcher, reason, ..
            } => {
                debug!(job = %self.id, launcher = %launcher, reason, "launcher gone");
                self.launchers.gone(&launcher);
            }
            ControlMsg::GrowOffer {
                grant,
                cluster,
                slots,
            } => {
                self.on_grow(grant, cluster, slots).await?;
            }
            ControlMsg::Shrink {
                cluster,
                slots,
                mode,
                reason,
            } => {
                self.on_shrink(&cluster, slots, mode, &reason).await?;
            }
            // Handled by the serving loop, which acks it once recorded.
            ControlMsg::Cancel { .. } => {}
            ControlMsg::Place { clusters } => {
                self.on_place(&clusters).await?;
            }
            ControlMsg::PlacementFailed { reason } => {
                warn!(job = %self.id, reason, "the scheduler gave up placing the job");
                self.finish_unfinished(FinalStatus::Failed)?;
            }
            ControlMsg::ComponentEnded(outcome) => {
                self.on_component_ended(outcome)?;
            }
        }
        incoming.ack().await?;
        Ok(())
    }

    /// The scheduler placed the grid job: each component goes to its cluster's
    /// kcm, which submits it to the batch system.
    async fn on_place(&mut self, clusters: &[String]) -> Result<(), JobError> {
        if self.file.state != JobState::Waiting || clusters.len() != self.manifest.components.len()
        {
            debug!(job = %self.id, "placement ignored: already placed, or not for this job");
            return Ok(());
        }
        info!(job = %self.id, clusters = ?clusters, "grid job placed");
        let components = self.manifest.components.clone();
        for (i, (component, cluster)) in components.iter().zip(clusters).enumerate() {
            let spec = ComponentSpec {
                job: self.id.clone(),
                component: i as u32,
                slots: component.slots,
                command: component.command.clone(),
                env: self
                    .manifest
                    .env
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                walltime_ms: self.manifest.walltime.map(|w| w.as_millis() as u64),
                workdir: self
                    .manifest
                    .workdir
                    .as_ref()
                    .map(|w| w.display().to_string()),
            };
            match self
                .publisher
                .send(&kcm_queue(cluster), &KcmMsg::SubmitComponent(spec))
                .await
            {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {
                    warn!(job = %self.id, component = i, cluster = %cluster, "no kcm for the cluster; component failed");
                    let entry = self.entry(i as u64, FinalStatus::Failed, None);
                    self.record(&[entry])?;
                    self.book.finish(i as u64, FinalStatus::Failed);
                }
                Err(e) => return Err(e.into()),
            }
            self.file.components[i] = Some(cluster.clone());
            self.clusters.insert(cluster.clone());
        }
        self.file.state = JobState::Running;
        self.save()?;
        self.report().await
    }

    /// A component ended: its result is final (a rigid job is not retried).
    fn on_component_ended(&mut self, outcome: ComponentOutcome) -> Result<(), JobError> {
        let task = u64::from(outcome.component);
        if self.book.is_finished(task) {
            return Ok(());
        }
        let status = match outcome.exit_code {
            Some(0) => RunStatus::Succeeded,
            _ => RunStatus::Failed,
        };
        let result = ResultMsg {
            job: self.id.clone(),
            task,
            attempt: 1,
            preemptions: 0,
            status,
            exit_code: outcome.exit_code,
            signal: None,
            runtime_ms: outcome.runtime_ms,
            launcher: String::new(),
            cluster: outcome.cluster,
            host: String::new(),
            stdout: outcome.stdout,
            stderr: outcome.stderr,
            outputs: Vec::new(),
            error: None,
        };
        info!(job = %self.id, component = task, cluster = %result.cluster, exit_code = ?result.exit_code, "grid component ended");
        self.results
            .write_outputs(&result)
            .map_err(|e| self.io_error(e))?;
        let entry = self.entry(task, status.into(), Some(&result));
        self.record(&[entry])?;
        self.book.finish(task, status.into());
        Ok(())
    }

    /// Accepts as many offered slots as there are tasks to keep them busy.
    async fn on_grow(&mut self, grant: u64, cluster: String, slots: u32) -> Result<(), JobError> {
        let wanted = self
            .book
            .counts()
            .unfinished()
            .saturating_sub(u64::from(self.launchers.total_slots()));
        let accepted = slots.min(u32::try_from(wanted).unwrap_or(u32::MAX));
        let ack = SchedulerMsg::GrowAck {
            grant,
            job: self.id.clone(),
            cluster: cluster.clone(),
            accepted,
        };
        self.publisher.send(SCHEDULER_QUEUE, &ack).await?;
        if accepted == 0 {
            return Ok(());
        }
        let start = KcmMsg::StartLaunchers {
            job: self.id.clone(),
            grant,
            slots: accepted,
        };
        match self.publisher.send(&kcm_queue(&cluster), &start).await {
            Ok(()) => {
                info!(job = %self.id, cluster = %cluster, grant, slots = accepted, offered = slots, "grow accepted");
                self.clusters.insert(cluster);
            }
            Err(e) if e.is_not_found() => {
                warn!(job = %self.id, cluster = %cluster, "no kcm queue for the cluster; grow dropped");
            }
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Gives back slots on a cluster: idle launchers first, then those whose
    /// task started most recently.
    async fn on_shrink(
        &mut self,
        cluster: &str,
        slots: u32,
        mode: ShrinkMode,
        reason: &str,
    ) -> Result<(), JobError> {
        let (victims, freed) = self.launchers.pick_victims(cluster, slots);
        info!(job = %self.id, cluster, slots, ?mode, reason, launchers = ?victims, "shrinking");
        if freed < slots {
            self.owed.push(OwedShrink {
                cluster: cluster.to_owned(),
                slots: slots - freed,
                mode,
                reason: reason.to_owned(),
                since: Instant::now(),
            });
        }
        let order = match mode {
            ShrinkMode::Preempt => LauncherMsg::Preempt {
                reason: reason.to_owned(),
            },
            ShrinkMode::Drain => LauncherMsg::Drain {
                reason: reason.to_owned(),
            },
        };
        for launcher in &victims {
            match self.publisher.send(&launcher_queue(launcher), &order).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => self.launchers.gone(launcher),
                Err(e) => return Err(e.into()),
            }
        }
        if mode == ShrinkMode::Preempt && !victims.is_empty() {
            let release = KcmMsg::Release {
                job: self.id.clone(),
                launchers: victims,
                grace_ms: self.settings.preempt_grace.as_millis() as u64,
            };
            match self.publisher.send(&kcm_queue(cluster), &release).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn report_now(&mut self) -> JobReport {
        self.launchers
            .expire(Instant::now(), self.settings.launcher_silence);
        self.owed
            .retain(|o| o.since.elapsed() < OWED_SHRINK_LIFETIME);
        let running = match self.manifest.kind {
            JobKind::Scavenge => self.launchers.running_tasks(),
            JobKind::Grid => self
                .file
                .components
                .iter()
                .enumerate()
                .filter(|(i, placed)| placed.is_some() && !self.book.is_finished(*i as u64))
                .count() as u64,
        };
        self.book.set_running(running);
        let window = Duration::from_secs(60);
        let now = Instant::now();
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > window)
        {
            self.recent.pop_front();
        }
        let age = Duration::from_millis(now_ms().saturating_sub(self.file.started_at));
        let span = age.min(window).as_secs_f64().max(1.0);
        JobReport {
            job: self.id.clone(),
            kind: self.manifest.kind,
            priority: self.manifest.effective_priority(),
            state: self.file.state,
            runner: self.file.runner.clone(),
            tasks: self.book.counts(),
            launchers: self.launchers.slots_by_cluster(),
            throughput: self.recent.len() as f64 / span,
            preemptions: self.preemptions,
            started_at: self.file.started_at,
            results: self.file.results.clone(),
            components: self.manifest.components.iter().map(|c| c.slots).collect(),
        }
    }

    /// Tells the scheduler where the job stands, and watchers if anything
    /// changed; asks launchers that went quiet whether they are still there
    /// (one that died has lost its queue, which answers at once).
    async fn report(&mut self) -> Result<(), JobError> {
        for launcher in self
            .launchers
            .poll_silent(Instant::now(), self.settings.heartbeat * 2)
        {
            match self
                .publisher
                .send(&launcher_queue(&launcher), &LauncherMsg::Poll {})
                .await
            {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {
                    debug!(job = %self.id, launcher = %launcher, "silent launcher is gone");
                    self.launchers.gone(&launcher);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let report = self.report_now();
        self.publisher
            .send(SCHEDULER_QUEUE, &SchedulerMsg::JobUpdate(report.clone()))
            .await?;
        let progress = (report.tasks.finished(), report.tasks.running);
        if self.reported != Some(progress) {
            self.reported = Some(progress);
            self.publisher.event(&Event::Progress(report)).await?;
            self.save()?;
        }
        Ok(())
    }

    /// Gives every task without a final state this one, durably.
    fn finish_unfinished(&mut self, status: FinalStatus) -> Result<(), JobError> {
        let entries: Vec<IndexEntry> = self
            .book
            .unfinished()
            .map(|task| self.entry(task, status, None))
            .collect();
        self.record(&entries)?;
        for entry in &entries {
            self.book.finish(entry.task, status);
        }
        Ok(())
    }

    /// Cancels the job; the order is acked once the cancellation is on disk.
    async fn cancel(&mut self, reason: &str, order: &Incoming<ControlMsg>) -> Result<(), JobError> {
        info!(job = %self.id, reason, "cancelling");
        self.finish_unfinished(FinalStatus::Cancelled)?;
        self.file.state = JobState::Cancelled;
        self.save()?;
        order.ack().await?;
        self.finish(JobState::Cancelled).await
    }

    async fn finish(&mut self, state: JobState) -> Result<(), JobError> {
        let now = now_ms();
        self.file.state = state;
        self.file.finished_at = Some(now);
        self.file.makespan_s = Some(now.saturating_sub(self.file.submitted_at) as f64 / 1000.0);
        self.save()?;
        let counts = self.book.counts();
        info!(
            job = %self.id,
            ?state,
            succeeded = counts.succeeded,
            failed = counts.failed,
            timed_out = counts.timed_out,
            lost = counts.lost,
            cancelled = counts.cancelled,
            duplicates = self.book.duplicates(),
            makespan_s = self.file.makespan_s,
            "job ended"
        );
        self.wind_up().await
    }

    /// The end of a job, repeatable after a crash: queues deleted (launchers
    /// leave), scheduler and kcms told, watchers notified.
    async fn wind_up(&mut self) -> Result<(), JobError> {
        topology::delete_job(self.publisher.channel(), &self.queues).await?;
        self.publisher
            .send(
                SCHEDULER_QUEUE,
                &SchedulerMsg::JobDone {
                    job: self.id.clone(),
                },
            )
            .await?;
        let clusters: Vec<String> = self
            .clusters
            .iter()
            .cloned()
            .chain(self.launchers.clusters().map(str::to_owned))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        for cluster in clusters {
            let ended = KcmMsg::JobEnded {
                job: self.id.clone(),
            };
            match self.publisher.send(&kcm_queue(&cluster), &ended).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        let report = self.report_now();
        self.publisher.event(&Event::Done(report)).await?;
        Ok(())
    }
}

/// Unwraps a delivery; a consumer cancelled by the broker means the job's
/// queues were deleted under us.
fn delivered<M>(
    delivery: Option<Result<Incoming<M>, BrokerError>>,
) -> Result<Incoming<M>, BrokerError> {
    match delivery {
        Some(result) => result,
        None => Err(BrokerError::NoQueue("job queue deleted".to_owned())),
    }
}
