//! The controller of one job, from its manifest to its last result: the
//! shell around the job's core (`sweep.rs` or `grid_job.rs`).
//!
//! The shell does the I/O: it takes the job's lock, reads the results
//! directory, consumes the job's queues, hands what arrives to the core with
//! the time, and applies the effects the core returns (messages, tasks,
//! results files). It always starts the same way, whether the job is new or
//! resumed after a crash, and consumes until the core says the job is over.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::Duration,
};

use futures_util::FutureExt;
use gleaner_broker::{
    BrokerError, Connection, ConsumeOptions, Inbox, Incoming, Publisher, Receipt, Reply,
    admin::Admin,
    peek, sleep_until, take_all,
    topology::{self, JobQueues, SCHEDULER_QUEUE, kcm_queue, launcher_queue},
};
use gleaner_manifest::{JobKind, TaskList};
use gleaner_protocol::{
    ClusterName, ControlMsg, Core, Followed, JobClaim, JobReport, KcmMsg, LauncherId, LauncherMsg,
    MAX_RESULTS_MESSAGE_BYTES, ResultBatch, ResultMsg, ResultPart, Submission, TaskBundle,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use gleaner_runner_core::{
    DeadLetter, Effect, FirstAttempts, Grid, Job, JobEvent, JobFile, JobMachine, JobSettings, Kind,
    Now, Opening, Publication, Refusal, Sweep,
    io::{Io, carry_out},
};

use crate::{
    owner::{Owner, as_account, prepare_area, symlink_on_the_way},
    results::{ResultsDir, StagedFiles, is_disk_failure},
};

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("results directory {path}: {error}")]
    Results {
        path: String,
        error: std::io::Error,
        /// Where the job stood when it could not go on, for the scheduler
        /// (and `gleaner status`) while the runner waits to retry.
        standing: Option<Box<JobReport>>,
    },
    #[error("the runner is shutting down")]
    Shutdown,
    /// The job cannot run as submitted (its results directory belongs to
    /// another job); retrying would not help.
    #[error("{0}")]
    Refused(String),
}

impl JobError {
    /// Why a message of the job's could not be sent for what it holds (over
    /// the broker's bound), if that is the error: the job is stopped with
    /// this reason, and the runner's session goes on.
    pub fn unsendable(&self) -> Option<String> {
        match self {
            Self::Broker(e) if e.is_too_big() => Some(e.to_string()),
            _ => None,
        }
    }
}

/// A submission's claim on its job's id, and what to do once the job's
/// claim in the broker is found to be it (the runner's session hears so).
pub struct Claim<F> {
    pub claim: JobClaim,
    pub on_claimed: F,
}

/// Messages of results a job's consumer holds unacked: each has at most
/// a MiB of output (more goes in parts), so a job's results take 32 MiB of
/// the runner's memory at most, and forged ones
/// ([`MAX_RESULTS_MESSAGE_BYTES`] at most on the wire, larger are
/// dead-lettered) 256 MiB of messages. Launchers pack up to 64 results a
/// message, so this many keep the runner busy.
const RESULTS_PREFETCH: u16 = 32;
/// Control messages held unacked (heartbeats, additions): at most
/// [`gleaner_protocol::MAX_MESSAGE_BYTES`] each.
const CONTROL_PREFETCH: u16 = 32;
/// Dead letters held unacked: a launcher that died gives back a few
/// bundles, and a task returned with no launcher leaving waits to be judged.
const DEAD_PREFETCH: u16 = 8;
/// Results processed per write-and-sync round.
const RESULT_BATCH: usize = 512;
/// Tasks published per confirm round.
const PUBLISH_BATCH: usize = 1000;
/// Control messages (mostly launchers' heartbeats) handled per ack.
const CONTROL_BATCH: usize = 256;
/// How long the control messages that follow a first one gather before
/// they are handled: with a thousand launchers beating, one wake-up and
/// one ack for several instead of each. None of them is that urgent.
const CONTROL_GATHER: Duration = Duration::from_millis(50);

/// Runs a job to its end. Returns `Ok` once the manifest may be acked.
pub async fn run(
    connection: Arc<Connection>,
    settings: JobSettings,
    submission: &Submission,
    owner: &Owner,
    claim: &Claim<impl Fn()>,
    admin: Option<&Admin>,
    shutdown: CancellationToken,
) -> Result<(), JobError> {
    let id = submission.job.clone();
    let queues = JobQueues::new(&id);
    let relative = submission.manifest.results_dir(id.as_str());
    let root = owner.results_dir(&settings.results_root, &relative);
    let io_error = |error| JobError::Results {
        path: root.display().to_string(),
        error,
        standing: None,
    };
    if let Some(account) = &owner.account {
        prepare_area(&settings.results_root.join(&account.name), account).map_err(io_error)?;
    }
    let account = owner.account.as_ref();
    let area = owner.results_dir(&settings.results_root, std::path::Path::new(""));
    if let Some(link) = as_account(account, || symlink_on_the_way(&area, &relative)) {
        return Err(JobError::Refused(format!(
            "results directory {} passes through the symbolic link {}; choose another `results`",
            root.display(),
            link.display()
        )));
    }
    let publisher = connection.publisher().await?;
    if !wait_for_lock(
        &connection,
        &publisher,
        &queues,
        &claim.claim,
        &root,
        account,
        &shutdown,
    )
    .await?
    {
        info!("another runner finished the job meanwhile");
        return Ok(());
    }
    (claim.on_claimed)();
    // Only the lock holder reads (and repairs) the index: another runner
    // may still have been appending to it until now.
    let (results, finished) = ResultsDir::open(&root, account).map_err(io_error)?;
    results
        .keep_manifest(&submission.manifest)
        .map_err(io_error)?;

    // Renewed at every start: a runner taking the job over does not know
    // the last password, and launchers already connected keep theirs.
    let launcher_credentials = match admin {
        Some(admin) => {
            let credentials = admin.launcher_account(&id).await?;
            info!(user = %credentials.user, "the job's launcher account is ready");
            Some(credentials)
        }
        None => None,
    };
    let opening = Opening {
        submission,
        owner: owner.name.clone(),
        launcher_credentials,
        settings,
        runner: connection.identity().to_owned(),
        results: std::path::absolute(&root)
            .unwrap_or_else(|_| root.clone())
            .display()
            .to_string(),
        finished,
        job_file: results.read_job_file(),
        additions: results.read_additions().map_err(io_error)?,
    };
    let refused = |refusal: Refusal| {
        JobError::Refused(format!(
            "results directory {} belongs to job {}; choose another `results`",
            root.display(),
            refusal.owner
        ))
    };
    match submission.manifest.kind {
        JobKind::Scavenge => {
            let tasks = TaskList::new(&submission.manifest).map_err(|e| {
                // Validated on arrival; a failure here means the manifest changed under us.
                JobError::Results {
                    path: root.display().to_string(),
                    error: std::io::Error::other(e.to_string()),
                    standing: None,
                }
            })?;
            let core = match Sweep::open(opening, tasks, Now::read()) {
                Ok(core) => core,
                Err(refusal) => {
                    return Err(give_up(&connection, &queues, admin, refused(refusal)).await);
                }
            };
            Shell::new(core, queues, results, publisher, admin.cloned())
                .run(&connection, &shutdown)
                .await
        }
        JobKind::Grid => {
            let core = match Grid::open(opening, Now::read()) {
                Ok(core) => core,
                Err(refusal) => {
                    return Err(give_up(&connection, &queues, admin, refused(refusal)).await);
                }
            };
            Shell::new(core, queues, results, publisher, admin.cloned())
                .run(&connection, &shutdown)
                .await
        }
    }
}

/// A job refused after its claim was staked: its claim, lock and launcher
/// account go, so that a refused submission leaves nothing behind.
async fn give_up(
    connection: &Connection,
    queues: &JobQueues,
    admin: Option<&Admin>,
    refusal: JobError,
) -> JobError {
    let forgotten = async {
        let channel = connection.channel().await?;
        topology::forget_claim(&channel, queues).await?;
        if let Some(admin) = admin {
            admin.forget_launcher_account(&queues.job).await?;
        }
        Ok::<_, BrokerError>(())
    };
    if let Err(e) = forgotten.await {
        warn!(error = %e, "a refused job's claim or launcher account is left behind");
    }
    refusal
}

/// Takes the job's lock, waiting while another runner holds it, and then
/// its claim: `claim` is staked if the job has none, and must match the
/// one it has (a refusal otherwise, the lock given back). `false` if the
/// runner that held the lock finished the job meanwhile.
///
/// Only the lock holder reads the claim: a reader takes the message out of
/// the queue until it puts it back, so a second reader could find it empty.
async fn wait_for_lock(
    connection: &Connection,
    publisher: &Publisher,
    queues: &JobQueues,
    claim: &JobClaim,
    root: &std::path::Path,
    account: Option<&crate::owner::Account>,
    shutdown: &CancellationToken,
) -> Result<bool, JobError> {
    let job = &queues.job;
    let mut said = false;
    loop {
        if topology::lock_job(connection.lapin(), queues).await? {
            let channel = connection.channel().await?;
            topology::declare_claim(&channel, queues).await?;
            let refusal = match peek::<JobClaim>(&channel, &queues.claim).await? {
                Some(held) => claim.refusal(job.as_str(), &held),
                None => {
                    publisher.send(&queues.claim, claim).await?;
                    None
                }
            };
            if let Some(reason) = refusal {
                topology::unlock_job(&channel, queues).await?;
                return Err(JobError::Refused(reason));
            }
            return Ok(true);
        }
        if ResultsDir::job_file_at(root, account).is_some_and(|f| f.has_ended()) {
            return Ok(false);
        }
        if !said {
            info!("another runner owns this job; waiting for it to end or die");
            said = true;
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
            () = shutdown.cancelled() => return Err(JobError::Shutdown),
        }
    }
}

/// The shell of one job: the machine that decides, and its hands.
struct Shell<K> {
    machine: JobMachine<K>,
    hands: Hands,
}

/// What a job's effects act on: its queues, its results directory, and
/// what it holds of the broker's deliveries.
struct Hands {
    queues: JobQueues,
    results: ResultsDir,
    publisher: Publisher,
    /// Deletes the job's launcher account when it ends.
    admin: Option<Admin>,
    /// First attempts being published, a chunk at a time between events
    /// (so that grants are taken, and launchers start, meanwhile), with the
    /// next chunk's index.
    publishing: VecDeque<(FirstAttempts, usize)>,
    /// Where an [`Effect::Answer`] goes: the sender of the control message
    /// being handled, if it asked for an answer.
    answering: Option<Reply>,
    /// Acks the deliveries being handled once their effects are carried
    /// out, or before their queue is deleted.
    unacked: Option<Receipt>,
    /// Dead letters held unacked until the machine has judged their
    /// tasks ([`Effect::SettleLost`]), by the receipt number it was given.
    lost: HashMap<u64, Receipt>,
    /// The receipt number the next dead letter gets.
    next_lost: u64,
    /// Parts of runs whose results are written, removed once those are
    /// acked: a result delivered again finds them still.
    written_parts: Vec<StagedFiles>,
    /// Control messages taken from the queue as it was deleted, for the
    /// machine to answer.
    late: Vec<(ControlMsg, Reply)>,
}

impl<K: Kind> Shell<K> {
    fn new(
        core: Job<K>,
        queues: JobQueues,
        results: ResultsDir,
        publisher: Publisher,
        admin: Option<Admin>,
    ) -> Self {
        Self {
            machine: JobMachine::new(core),
            hands: Hands {
                queues,
                results,
                publisher,
                admin,
                answering: None,
                publishing: VecDeque::new(),
                unacked: None,
                lost: HashMap::new(),
                next_lost: 0,
                written_parts: Vec::new(),
                late: Vec::new(),
            },
        }
    }

    async fn run(
        mut self,
        connection: &Connection,
        shutdown: &CancellationToken,
    ) -> Result<(), JobError> {
        let outcome = async {
            self.handle(JobEvent::Start, Now::read()).await?;
            if self.machine.is_over() {
                return Ok(());
            }
            self.serve(connection, shutdown).await?;
            if let Err(e) = self.hands.results.clear_parts() {
                warn!(error = %e, "parts of runs whose results never came are left in .parts");
            }
            Ok(())
        }
        .await;
        match outcome {
            Err(JobError::Results { path, error, .. }) => Err(JobError::Results {
                path,
                error,
                standing: Some(Box::new(self.machine.standing(Now::read()))),
            }),
            outcome => outcome,
        }
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
        let publisher = &self.hands.publisher;
        let mut results: Inbox<ResultBatch> = connection
            .inbox(
                publisher,
                &self.hands.queues.results,
                options(RESULTS_PREFETCH),
            )
            .await?
            .limited(MAX_RESULTS_MESSAGE_BYTES);
        let mut dead: Inbox<TaskBundle> = connection
            .inbox(publisher, &self.hands.queues.dead, options(DEAD_PREFETCH))
            .await?;
        let mut control: Inbox<ControlMsg> = connection
            .inbox(
                publisher,
                &self.hands.queues.control,
                options(CONTROL_PREFETCH),
            )
            .await?;
        // The first control message of a batch, held while the rest gather.
        let mut first_control = None;
        let gathered = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(gathered);
        loop {
            if self.machine.is_over() {
                // Tasks on their way to a job that ended go back to their
                // senders with the machine's answer, not deleted unread.
                let taken = std::mem::take(&mut self.hands.late)
                    .into_iter()
                    .map(|(msg, reply)| (msg, reply, None));
                let prefetched = std::iter::from_fn(|| control.next().now_or_never().flatten());
                let held = first_control
                    .take()
                    .into_iter()
                    .chain(prefetched.flatten())
                    .map(|i| (i.msg, i.reply, i.user));
                for (msg, reply, sender) in taken.chain(held) {
                    let msg = addressed(msg, &reply);
                    self.hands.answering = Some(reply);
                    self.handle(JobEvent::Control { msg, sender }, Now::read())
                        .await?;
                }
                self.hands.answering = None;
                return Ok(());
            }
            tokio::select! {
                first = results.next() => {
                    let first = delivered(first)?;
                    let mut count = first.msg.results.len();
                    let mut batch = vec![first];
                    while count < RESULT_BATCH {
                        match results.next().now_or_never() {
                            Some(next) => {
                                let next = delivered(next)?;
                                count += next.msg.results.len();
                                batch.push(next);
                            }
                            None => break,
                        }
                    }
                    self.hands.unacked = batch.last().map(Incoming::receipt);
                    let mut results = Vec::with_capacity(count);
                    let mut staged = false;
                    for incoming in batch {
                        results.extend(incoming.msg.results);
                        if let Some(part) = incoming.msg.part {
                            self.stage(&part)?;
                            staged = true;
                        }
                    }
                    if staged {
                        self.hands.results.sync().map_err(|e| self.hands.io_error(e))?;
                    }
                    if results.is_empty() {
                        self.hands.settle().await?;
                    } else {
                        self.handle(JobEvent::Results(results), Now::read()).await?;
                    }
                }
                lost = dead.next() => {
                    let incoming = delivered(lost)?;
                    let receipt = self.hands.next_lost;
                    self.hands.next_lost += 1;
                    self.hands.lost.insert(receipt, incoming.receipt());
                    let event = JobEvent::Lost(DeadLetter {
                        bundle: incoming.msg,
                        receipt,
                        redelivered: incoming.redelivered,
                    });
                    self.handle(event, Now::read()).await?;
                }
                message = control.next(), if first_control.is_none() => {
                    first_control = Some(delivered(message)?);
                    gathered.as_mut().reset(tokio::time::Instant::now() + CONTROL_GATHER);
                }
                () = &mut gathered, if first_control.is_some() => {
                    // What came meanwhile goes with it, acked at once after:
                    // many launchers' heartbeats, one ack.
                    let mut batch: Vec<_> = first_control.take().into_iter().collect();
                    while batch.len() < CONTROL_BATCH {
                        match control.next().now_or_never() {
                            Some(next) => batch.push(delivered(next)?),
                            None => break,
                        }
                    }
                    self.hands.unacked = batch.last().map(Incoming::receipt);
                    for incoming in batch {
                        let msg = addressed(incoming.msg, &incoming.reply);
                        self.hands.answering = Some(incoming.reply);
                        let event = JobEvent::Control { msg, sender: incoming.user };
                        let handled = self.handle(event, Now::read()).await;
                        self.hands.answering = None;
                        handled?;
                    }
                    self.hands.settle().await?;
                }
                () = sleep_until(self.machine.poll_timeout()) => {
                    let now = Now::read();
                    self.machine.handle_timeout(now);
                    self.apply(now, true).await?;
                }
                () = shutdown.cancelled() => return Err(JobError::Shutdown),
                () = std::future::ready(()), if !self.hands.publishing.is_empty() => self.publish_chunk().await?,
            }
        }
    }

    /// Writes a part of a run's output for its result to find, if the
    /// machine stages it; one that cannot be a launcher's is dropped.
    /// Only a disk that fails is the job's error.
    fn stage(&self, part: &ResultPart) -> Result<(), JobError> {
        if !self.machine.stages(part) {
            warn!(part_of = %part.job, task = part.task, "a part of another job's output, or after the job's end, dropped");
            return Ok(());
        }
        match self.hands.results.stage_part(part) {
            Err(e) if is_disk_failure(&e) => Err(self.hands.io_error(e)),
            Err(e) => {
                warn!(task = part.task, error = %e, "a part of a run's output dropped");
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    /// Publishes the next chunk of first attempts; once a publication is
    /// all with the broker, the machine hears it.
    async fn publish_chunk(&mut self) -> Result<(), JobError> {
        let Some((first, next)) = self.hands.publishing.front_mut() else {
            return Ok(());
        };
        if *next < first.chunk_count(PUBLISH_BATCH) {
            let chunk = first.chunk(*next, PUBLISH_BATCH);
            let sent = self
                .hands
                .publisher
                .send_all(&self.hands.queues.tasks, &chunk)
                .await;
            if let Err(e) = sent.map_err(JobError::from) {
                let problem = e.unsendable().ok_or(e)?;
                self.hands.publishing.clear();
                return self
                    .handle(JobEvent::Unsendable { problem }, Now::read())
                    .await;
            }
            *next += 1;
        }
        if *next < first.chunk_count(PUBLISH_BATCH) {
            return Ok(());
        }
        if let Some((first, _)) = self.hands.publishing.pop_front() {
            debug!(
                tasks = first.tasks().len(),
                bundle = first.bundle(),
                "tasks published"
            );
            self.handle(JobEvent::Published(first.completes()), Now::read())
                .await?;
        }
        Ok(())
    }

    /// Hands `event` to the machine and carries out its effects in order;
    /// what was delivered is acked once they are (results are on disk, and
    /// their retries published, before they are acked), unless a control
    /// batch is still being handled.
    async fn handle(&mut self, event: JobEvent, now: Now) -> Result<(), JobError> {
        let control = matches!(event, JobEvent::Control { .. });
        self.machine.handle(event, now);
        self.apply(now, !control).await
    }

    /// Carries out the machine's effects, then (`settle`) acknowledges
    /// what the last event came with; a control batch settles on its own.
    /// Too big is what the job holds: the job stops with the reason; the
    /// runner's session, and its other jobs, go on.
    async fn apply(&mut self, now: Now, settle: bool) -> Result<(), JobError> {
        carry_out(&mut self.machine, &mut self.hands, now).await?;
        if settle {
            self.hands.settle().await?;
        }
        Ok(())
    }
}

impl Hands {
    fn io_error(&self, error: std::io::Error) -> JobError {
        JobError::Results {
            path: self.results.root().display().to_string(),
            error,
            standing: None,
        }
    }

    /// Writes a run's output as `how` says, from its message and, for a
    /// parted run, its parts, which stay until the result is acked.
    fn write_run(&mut self, mut result: ResultMsg, how: Written) -> Result<(), JobError> {
        let staged = self.results.unpart(&mut result);
        let written = match how {
            Written::Run => self.results.write_outputs(&result, false, staged.as_ref()),
            Written::FinalStep => self.results.write_outputs(&result, true, staged.as_ref()),
            Written::Retried => self.results.write_retried(&result),
        };
        written.map_err(|e| self.io_error(e))?;
        self.written_parts.extend(staged);
        Ok(())
    }

    /// Acks the deliveries handled so far.
    async fn settle(&mut self) -> Result<(), JobError> {
        if let Some(receipt) = self.unacked.take() {
            receipt.ack_up_to_here().await?;
        }
        for staged in self.written_parts.drain(..) {
            self.results.remove_parts(staged);
        }
        Ok(())
    }
}

impl Io for Hands {
    type Error = JobError;

    async fn to_kcm(&mut self, cluster: &ClusterName, msg: KcmMsg) -> Result<bool, JobError> {
        Ok(self.publisher.deliver(&kcm_queue(cluster), &msg).await?)
    }

    async fn to_launcher(
        &mut self,
        launcher: &LauncherId,
        msg: LauncherMsg,
    ) -> Result<bool, JobError> {
        let queue = launcher_queue(&self.queues.job, launcher);
        Ok(self.publisher.deliver(&queue, &msg).await?)
    }

    /// A chunk at a time between events ([`Shell::publish_chunk`]).
    async fn publish_first(
        &mut self,
        first: FirstAttempts,
    ) -> Result<Option<Publication>, JobError> {
        self.publishing.push_back((first, 0));
        Ok(None)
    }

    fn save_job_file(&mut self, file: JobFile) -> Result<(), JobError> {
        self.results
            .write_job_file(&file)
            .map_err(|e| self.io_error(e))
    }

    async fn apply(&mut self, effect: Effect) -> Result<(), JobError> {
        match effect {
            Effect::ToScheduler(msg) => self.publisher.send(SCHEDULER_QUEUE, &msg).await?,
            Effect::Event(event) => self.publisher.event(&event).await?,
            Effect::Answer(answer) => {
                if let Some(to) = self.answering.as_ref().filter(|r| r.is_direct())
                    && let Err(e) = self.publisher.reply(to, &answer).await
                {
                    warn!(error = %e, "cannot answer the sender of tasks to add");
                }
            }
            Effect::Relay { to, piece } => {
                let piece = Followed::Output(*piece);
                for to in to {
                    let follower = Reply {
                        correlation_id: None,
                        reply_to: Some(to),
                    };
                    if let Err(e) = self.publisher.reply(&follower, &piece).await {
                        debug!(error = %e, "a follower missed a piece of output");
                    }
                }
            }
            Effect::DeclareQueues => {
                topology::declare_job(self.publisher.channel(), &self.queues).await?;
            }
            Effect::PurgeTasks => {
                topology::purge(self.publisher.channel(), &self.queues.tasks).await?;
            }
            Effect::Publish(tasks) => {
                self.publisher.send_all(&self.queues.tasks, &tasks).await?;
            }
            Effect::SettleLost(receipt) => {
                if let Some(receipt) = self.lost.remove(&receipt) {
                    receipt.ack().await?;
                }
            }
            Effect::WriteOutputs(result) => self.write_run(*result, Written::Run)?,
            Effect::WriteRetried(result) => self.write_run(*result, Written::Retried)?,
            Effect::WriteFinalOutputs(result) => self.write_run(*result, Written::FinalStep)?,
            Effect::Record(entries) => {
                if !entries.is_empty() {
                    self.results.append(entries).map_err(|e| self.io_error(e))?;
                }
                self.results.sync().map_err(|e| self.io_error(e))?;
            }
            Effect::RecordAddition(added) => self
                .results
                .append_addition(&added)
                .map_err(|e| self.io_error(e))?,
            // Carried out by the machine itself, or answered in `carry_out`.
            Effect::Report
            | Effect::ToKcm { .. }
            | Effect::ToLauncher { .. }
            | Effect::PublishFirst(_)
            | Effect::SaveJobFile => {}
            Effect::DeleteQueues => {
                // What is being handled goes before its queue.
                self.settle().await?;
                let late = take_all(self.publisher.channel(), &self.queues.control, 10_000).await?;
                self.late.extend(late);
                topology::delete_job(self.publisher.channel(), &self.queues).await?;
            }
            Effect::ForgetLauncherAccount => {
                if let Some(admin) = &self.admin {
                    admin.forget_launcher_account(&self.queues.job).await?;
                }
            }
        }
        Ok(())
    }

    fn unsendable(&mut self, error: JobError) -> Result<String, JobError> {
        let problem = error.unsendable().ok_or(error)?;
        self.publishing.clear();
        Ok(problem)
    }
}

/// Which of a run's writes an effect asks for.
#[derive(Debug, Clone, Copy)]
enum Written {
    /// A task's last run: streams to the log, files under `tasks/`.
    Run,
    /// A failed run that is retried: its streams only.
    Retried,
    /// The final step's run, under `final/`.
    FinalStep,
}

/// A follow with its asker's address: the message's direct reply-to, and
/// nothing else (the services then post only where the broker routes
/// replies to a channel waiting for them).
fn addressed(msg: ControlMsg, reply: &Reply) -> ControlMsg {
    match msg {
        ControlMsg::Follow { task, .. } => ControlMsg::Follow {
            task,
            reply_to: reply.reply_to.clone().filter(|_| reply.is_direct()),
        },
        msg => msg,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_message_too_big_stops_the_job_rather_than_the_session() {
        let too_big = JobError::Broker(BrokerError::TooBig {
            kind: "job_update",
            bytes: 20 << 20,
        });
        assert_eq!(
            too_big.unsendable().as_deref(),
            Some("a job_update message of 20.0 MiB is more than the 16 MiB a message may hold")
        );
        for other in [
            JobError::Broker(BrokerError::NoQueue("q".into())),
            JobError::Broker(BrokerError::Nacked("q".into())),
            JobError::Shutdown,
        ] {
            assert!(other.unsendable().is_none(), "{other}");
        }
    }
}
