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
    collections::BTreeMap,
    time::{Duration, Instant},
};

use gleaner_broker::{
    Broker, BrokerError, Connection, ConsumeOptions, Inbox, Publisher,
    protocol::{
        ClusterReport, ControlMsg, Event, Holding, KcmMsg, SchedulerMsg, ShrinkMode, now_ms,
    },
    topology::{self, JobQueues, SCHEDULER_QUEUE, kcm_queue},
};
use gleaner_manifest::JobId;
use gleaner_policy::local::{Answered, LocalState, on_local_wait};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use backend::{Backend, BackendError, LauncherCommand, Placeholder, Snapshot};
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
}

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
                        let report_now = self.handle(incoming.msg.clone()).await;
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
    async fn handle(&mut self, message: KcmMsg) -> bool {
        let cluster = self.config.cluster.clone();
        match message {
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
        let pending: Vec<String> = pending.iter().map(|p| p.id.clone()).collect();
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
            match publisher.send(&JobQueues::new(&job).control, &order).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
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
        ClusterReport {
            cluster: self.config.cluster.clone(),
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
