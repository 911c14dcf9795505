//! The cluster manager (kcm): one per cluster, on its head node.
//!
//! It turns grow requests into placeholder jobs in the cluster's batch
//! system, watches the batch system every `poll_interval`, reports the
//! cluster's state to the scheduler, and removes placeholders that must go.

mod backend;
mod local;
mod qstat;
mod sge;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use gleaner_broker::{
    Broker, BrokerError, Connection, ConsumeOptions, Inbox, Publisher,
    topology::{self, JobQueues, SCHEDULER_QUEUE, kcm_queue},
};
use gleaner_protocol::{
        Captured, ClusterReport, ComponentOutcome, ComponentSpec, ControlMsg, Event, Holding,
        KcmMsg, SchedulerMsg, ShrinkMode, now_ms,
    };
use gleaner_manifest::JobId;
use gleaner_policy::local::{Answered, LocalState, on_local_wait};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use backend::{
    Backend, BackendError, ComponentFiles, ComponentRun, LauncherCommand, Placeholder, Snapshot,
};
pub use local::LocalBackend;
pub use sge::{SgeBackend, SgeConfig};

#[derive(Debug, Clone)]
pub struct KcmConfig {
    pub cluster: String,
    /// How often the batch system is read and the cluster reported.
    pub poll_interval: Duration,
    /// How long the launchers of an ended job have to leave by themselves.
    pub job_end_grace: Duration,
    /// How long a shrink for waiting local jobs gets to take effect before
    /// the same waiting jobs are answered again.
    pub local_settle: Duration,
    /// Where grid components leave their output and exit status; the
    /// cluster's nodes must see it at the same path.
    pub spool_dir: std::path::PathBuf,
}

/// A grid component this kcm submitted (or found), until its end is reported.
struct TrackedComponent {
    since: Instant,
    /// Seen in the batch system at least once.
    seen: bool,
}

/// A component absent from the batch system this long after its submission,
/// never seen and with no exit status, is reported as ended.
const COMPONENT_VANISHED: Duration = Duration::from_secs(60);
/// Bytes of a component's stdout and stderr sent back (the tail).
const COMPONENT_OUTPUT: u64 = 1 << 20;

/// Removals waiting for their grace period to pass.
struct Removal {
    due: Instant,
    ids: Vec<String>,
}

struct Kcm<B> {
    config: KcmConfig,
    backend: B,
    last: Snapshot,
    applied_grants: Vec<u64>,
    removals: Vec<Removal>,
    /// The last failed qsub/qdel (cleared by the next successful submit).
    command_error: Option<String>,
    /// The last failure to read the batch system (cleared by the next read).
    read_error: Option<String>,
    failed_starts: u32,
    answered: Answered,
    components: BTreeMap<(JobId, u32), TrackedComponent>,
}

/// Serves the cluster until `shutdown`, reconnecting after broker outages.
pub async fn run<B: Backend>(
    broker: Broker,
    config: KcmConfig,
    backend: B,
    shutdown: CancellationToken,
) {
    let mut kcm = Kcm {
        config,
        backend,
        last: Snapshot::default(),
        applied_grants: Vec::new(),
        removals: Vec::new(),
        command_error: None,
        read_error: None,
        failed_starts: 0,
        answered: Answered::default(),
        components: BTreeMap::new(),
    };
    let cluster = kcm.config.cluster.clone();
    broker
        .supervise(&shutdown, async |connection| {
            kcm.session(&connection, &shutdown).await
        })
        .await;
    kcm.backend.shutdown().await;
    info!(cluster = %cluster, "kcm stopped");
}

impl<B: Backend> Kcm<B> {
    async fn session(
        &mut self,
        connection: &Connection,
        shutdown: &CancellationToken,
    ) -> Result<(), BrokerError> {
        let channel = connection.channel().await?;
        topology::declare_core(&channel).await?;
        topology::declare_kcm(&channel, &self.config.cluster).await?;
        let publisher = connection.publisher().await?;
        let mut inbox: Inbox<KcmMsg> = connection
            .inbox(
                &publisher,
                &kcm_queue(&self.config.cluster),
                ConsumeOptions {
                    tag: connection.identity(),
                    prefetch: 16,
                    exclusive: false,
                },
            )
            .await?;
        info!(cluster = %self.config.cluster, backend = self.backend.kind(), "kcm serving");
        let mut poll = tokio::time::interval(self.config.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                message = inbox.next() => match message {
                    Some(Ok(incoming)) => {
                        let report_now = self.handle(incoming.msg.clone(), &publisher).await?;
                        incoming.ack().await?;
                        if report_now {
                            self.poll(&publisher).await?;
                        }
                    }
                    Some(Err(e)) => return Err(e),
                    None => return Err(BrokerError::NoQueue(kcm_queue(&self.config.cluster))),
                },
                _ = poll.tick() => self.poll(&publisher).await?,
                () = shutdown.cancelled() => return Ok(()),
            }
        }
    }

    /// Acts on one message; `true` when the scheduler should hear at once.
    async fn handle(
        &mut self,
        message: KcmMsg,
        publisher: &Publisher,
    ) -> Result<bool, BrokerError> {
        let cluster = self.config.cluster.clone();
        Ok(match message {
            KcmMsg::StartLaunchers { job, grant, slots } => {
                self.applied_grants.push(grant);
                match self.backend.submit(&job, slots).await {
                    Ok(started) => {
                        info!(job = %job, cluster = %cluster, grant, requested = slots, started, "launchers submitted");
                        self.failed_starts = 0;
                        self.command_error = None;
                    }
                    Err(e) => {
                        self.failed_starts += 1;
                        error!(job = %job, cluster = %cluster, grant, error = %e, failures = self.failed_starts, "cannot submit launchers");
                        self.command_error = Some(e.to_string());
                    }
                }
                true
            }
            KcmMsg::Release {
                job,
                launchers,
                grace_ms,
            } => {
                let prefix = format!("{cluster}-");
                let ids: Vec<String> = launchers
                    .iter()
                    .filter_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
                    .collect();
                info!(job = %job, cluster = %cluster, launchers = ?launchers, grace_ms, "will remove preempted launchers that do not leave");
                self.removals.push(Removal {
                    due: Instant::now() + Duration::from_millis(grace_ms),
                    ids,
                });
                false
            }
            KcmMsg::JobEnded { job } => {
                self.end_job(&job).await;
                true
            }
            KcmMsg::SubmitComponent(spec) => {
                self.submit_component(spec, publisher).await?;
                true
            }
        })
    }

    async fn submit_component(
        &mut self,
        spec: ComponentSpec,
        publisher: &Publisher,
    ) -> Result<(), BrokerError> {
        let cluster = self.config.cluster.clone();
        let files = ComponentFiles::new(&self.config.spool_dir, &spec.job, spec.component);
        for stale in [&files.stdout, &files.stderr, &files.exit] {
            let _ = std::fs::remove_file(stale);
        }
        let submitted = match std::fs::create_dir_all(&self.config.spool_dir) {
            Ok(()) => self.backend.submit_component(&spec, &files).await,
            Err(e) => Err(BackendError {
                command: format!("mkdir {}", self.config.spool_dir.display()),
                message: e.to_string(),
            }),
        };
        match submitted {
            Ok(()) => {
                info!(job = %spec.job, component = spec.component, cluster = %cluster, slots = spec.slots, "grid component submitted");
                self.components.insert(
                    (spec.job.clone(), spec.component),
                    TrackedComponent {
                        since: Instant::now(),
                        seen: false,
                    },
                );
            }
            Err(e) => {
                error!(job = %spec.job, component = spec.component, cluster = %cluster, error = %e, "cannot submit a grid component");
                self.command_error = Some(e.to_string());
                let outcome = ComponentOutcome {
                    component: spec.component,
                    cluster,
                    exit_code: None,
                    runtime_ms: 0,
                    stdout: Captured::default(),
                    stderr: Captured {
                        data: e.to_string().into_bytes(),
                        dropped: 0,
                    },
                };
                self.tell_job(publisher, &spec.job, ControlMsg::ComponentEnded(outcome))
                    .await?;
            }
        }
        Ok(())
    }

    /// Reports the components that left the batch system to their jobs: those
    /// with an exit status in the spool directory (which outlives a kcm
    /// restart), and those that vanished without one.
    async fn settle_components(&mut self, publisher: &Publisher) -> Result<(), BrokerError> {
        for run in &self.last.components {
            self.components
                .entry((run.job.clone(), run.component))
                .or_insert(TrackedComponent {
                    since: Instant::now(),
                    seen: true,
                })
                .seen = true;
        }
        let in_batch = |job: &JobId, component: u32| {
            self.last
                .components
                .iter()
                .any(|r| &r.job == job && r.component == component)
        };
        let mut ended: BTreeSet<(JobId, u32)> = spooled_exits(&self.config.spool_dir)
            .into_iter()
            .filter(|(job, component)| !in_batch(job, *component))
            .collect();
        ended.extend(
            self.components
                .iter()
                .filter(|((job, component), tracked)| {
                    !in_batch(job, *component)
                        && (tracked.seen || tracked.since.elapsed() > COMPONENT_VANISHED)
                })
                .map(|(key, _)| key.clone()),
        );
        for (job, component) in ended {
            let files = ComponentFiles::new(&self.config.spool_dir, &job, component);
            let exit_code = std::fs::read_to_string(&files.exit)
                .ok()
                .and_then(|text| text.trim().parse().ok());
            let runtime = self
                .components
                .get(&(job.clone(), component))
                .map_or(Duration::ZERO, |t| t.since.elapsed());
            let outcome = ComponentOutcome {
                component,
                cluster: self.config.cluster.clone(),
                exit_code,
                runtime_ms: runtime.as_millis() as u64,
                stdout: read_tail(&files.stdout),
                stderr: read_tail(&files.stderr),
            };
            info!(job = %job, component, cluster = %self.config.cluster, exit_code = ?exit_code, "grid component ended");
            self.tell_job(publisher, &job, ControlMsg::ComponentEnded(outcome))
                .await?;
            // Forgotten only once its job has heard.
            self.components.remove(&(job, component));
            for file in [&files.stdout, &files.stderr, &files.exit] {
                let _ = std::fs::remove_file(file);
            }
        }
        Ok(())
    }

    /// Sends to a job's runner; a job that is gone no longer needs to hear.
    async fn tell_job(
        &self,
        publisher: &Publisher,
        job: &JobId,
        message: ControlMsg,
    ) -> Result<(), BrokerError> {
        match publisher.send(&JobQueues::new(job).control, &message).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waiting placeholders of an ended job go now; running ones get a grace
    /// period to notice the end themselves.
    async fn end_job(&mut self, job: &JobId) {
        let (pending, running): (Vec<&Placeholder>, Vec<&Placeholder>) = self
            .last
            .placeholders
            .iter()
            .filter(|p| &p.job == job)
            .partition(|p| !p.running);
        let pending: Vec<String> = pending
            .iter()
            .map(|p| p.id.clone())
            .chain(
                // Components of a job that ended early (cancelled) go too.
                self.last
                    .components
                    .iter()
                    .filter(|c| &c.job == job)
                    .map(|c| c.id.clone()),
            )
            .collect();
        let running: Vec<String> = running.iter().map(|p| p.id.clone()).collect();
        if !pending.is_empty() {
            info!(job = %job, cluster = %self.config.cluster, placeholders = pending.len(), "withdrawing waiting placeholders of an ended job");
            self.remove(&pending).await;
        }
        if !running.is_empty() {
            self.removals.push(Removal {
                due: Instant::now() + self.config.job_end_grace,
                ids: running,
            });
        }
    }

    async fn remove(&mut self, ids: &[String]) {
        if let Err(e) = self.backend.remove(ids).await {
            error!(cluster = %self.config.cluster, error = %e, "cannot remove placeholders");
            self.command_error = Some(e.to_string());
        }
    }

    /// Reads the batch system, makes room for waiting local jobs, carries
    /// out removals that are due, and reports.
    async fn poll(&mut self, publisher: &Publisher) -> Result<(), BrokerError> {
        match self.backend.snapshot().await {
            Ok(snapshot) => {
                if let Some(problem) = snapshot
                    .problem
                    .as_ref()
                    .filter(|p| Some(*p) != self.last.problem.as_ref())
                {
                    warn!(cluster = %self.config.cluster, problem, "batch system problem");
                }
                self.read_error = None;
                self.last = snapshot;
                self.settle_components(publisher).await?;
                self.make_room(publisher).await?;
            }
            Err(e) => {
                error!(cluster = %self.config.cluster, error = %e, "cannot read the batch system");
                self.read_error = Some(e.to_string());
            }
        }
        let now = Instant::now();
        let (due, later): (Vec<Removal>, Vec<Removal>) = std::mem::take(&mut self.removals)
            .into_iter()
            .partition(|r| r.due <= now);
        self.removals = later;
        let still_there: Vec<String> = due
            .into_iter()
            .flat_map(|r| r.ids)
            .filter(|id| self.last.placeholders.iter().any(|p| &p.id == id))
            .collect();
        if !still_there.is_empty() {
            warn!(cluster = %self.config.cluster, placeholders = ?still_there, "removing launchers that outstayed their grace period");
            self.remove(&still_there).await;
        }
        let report = self.report();
        publisher
            .send(
                SCHEDULER_QUEUE,
                &SchedulerMsg::ClusterStatus(report.clone()),
            )
            .await?;
        publisher.event(&Event::Cluster(report)).await
    }

    /// Local jobs wait: withdraw pending placeholders, then order the
    /// scavenging jobs here to give back what is still missing.
    async fn make_room(&mut self, publisher: &Publisher) -> Result<(), BrokerError> {
        let snapshot = &self.last;
        let pending: Vec<String> = snapshot
            .placeholders
            .iter()
            .filter(|p| !p.running)
            .map(|p| p.id.clone())
            .collect();
        let mut held: BTreeMap<JobId, u32> = BTreeMap::new();
        for placeholder in snapshot.placeholders.iter().filter(|p| p.running) {
            *held.entry(placeholder.job.clone()).or_default() += placeholder.slots;
        }
        let state = LocalState {
            waiting: &snapshot.waiting,
            idle: snapshot.free_slots(),
            pending_placeholders: &pending,
            held: &held,
        };
        let plan = on_local_wait(
            state,
            &mut self.answered,
            now_ms(),
            self.config.local_settle.as_millis() as u64,
        );
        let cluster = self.config.cluster.clone();
        let waiting = snapshot.waiting.len();
        let wanted = snapshot.local_waiting();
        if !plan.withdraw.is_empty() {
            info!(cluster = %cluster, placeholders = plan.withdraw.len(), waiting, "local jobs wait: withdrawing pending placeholders");
            self.remove(&plan.withdraw).await;
            self.last
                .placeholders
                .retain(|p| !plan.withdraw.contains(&p.id));
        }
        for (job, slots) in plan.shrink {
            info!(job = %job, cluster = %cluster, slots, waiting, wanted, "local jobs wait: shrinking");
            let order = ControlMsg::Shrink {
                cluster: cluster.clone(),
                slots,
                mode: ShrinkMode::Preempt,
                reason: format!("{waiting} local job(s) wait for {wanted} slot(s) on {cluster}"),
            };
            self.tell_job(publisher, &job, order).await?;
        }
        Ok(())
    }

    fn report(&mut self) -> ClusterReport {
        let snapshot = &self.last;
        let mut jobs: BTreeMap<JobId, Holding> = BTreeMap::new();
        for placeholder in &snapshot.placeholders {
            let holding = jobs.entry(placeholder.job.clone()).or_default();
            if placeholder.running {
                holding.running += placeholder.slots;
            } else {
                holding.pending += placeholder.slots;
            }
        }
        let mut grid: BTreeMap<JobId, Holding> = BTreeMap::new();
        for component in &snapshot.components {
            let holding = grid.entry(component.job.clone()).or_default();
            if component.running {
                holding.running += component.slots;
            } else {
                holding.pending += component.slots;
            }
        }
        ClusterReport {
            cluster: self.config.cluster.clone(),
            grid,
            backend: self.backend.kind().to_owned(),
            total_slots: snapshot.total_slots,
            idle_slots: snapshot.idle_slots(),
            local_slots: snapshot.local_running,
            local_waiting: snapshot.local_waiting(),
            grid_slots: snapshot.grid_running,
            jobs,
            applied_grants: std::mem::take(&mut self.applied_grants),
            error: self
                .command_error
                .clone()
                .or_else(|| self.read_error.clone())
                .or_else(|| snapshot.problem.clone()),
            failed_starts: self.failed_starts,
            at: now_ms(),
        }
    }
}

/// The components whose exit status waits in the spool directory.
fn spooled_exits(spool: &std::path::Path) -> Vec<(JobId, u32)> {
    let Ok(entries) = std::fs::read_dir(spool) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let (job, component) = name.strip_suffix(".exit")?.rsplit_once('.')?;
            Some((job.parse().ok()?, component.parse().ok()?))
        })
        .collect()
}

/// The last bytes of a file, and how many came before them.
fn read_tail(path: &std::path::Path) -> Captured {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return Captured::default();
    };
    let length = file.metadata().map_or(0, |m| m.len());
    let dropped = length.saturating_sub(COMPONENT_OUTPUT);
    let mut data = Vec::new();
    if file.seek(SeekFrom::Start(dropped)).is_ok() {
        let _ = file.take(COMPONENT_OUTPUT).read_to_end(&mut data);
    }
    Captured { data, dropped }
}
