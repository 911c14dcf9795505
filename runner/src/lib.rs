//! The runner: one controller per job.
//!
//! A runner competes with other runners for manifests on `gleaner.submit` and
//! keeps each manifest unacked until its job has ended, so a runner that dies
//! hands its jobs to another runner (or to itself, restarted), which resumes
//! them from their queues and results directories.

mod job;
mod owner;
mod results;

use std::sync::Arc;

use gleaner_runner_core::{
    admission::{Admissions, Arrival, Past},
    supervision::{self, Next, RunEnd},
};

use gleaner_broker::{
    Broker, BrokerError, Connection, ConsumeOptions, Inbox, Incoming, IncomingSubmission,
    admin::Admin,
    topology::{self, SCHEDULER_QUEUE, SUBMIT_QUEUE},
};
use gleaner_manifest::JobId;
use gleaner_policy::access::Users;
use gleaner_protocol::{Event, JobClaim, SchedulerMsg};
use tokio::{sync::mpsc, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, error_span, info, warn};

pub use gleaner_runner_core::{
    Effect, FinalStatus, FirstAttempts, Followup, Grid, IndexEntry, Job, JobEvent, JobFile,
    JobMachine, JobSettings, Kind, Ledger, Now, Opening, Publication, Refusal, Sweep, TaskBook,
    Verdict,
};
use job::Claim;
pub use job::JobError;
pub use owner::{Account, Owner};

/// `[runner]` of the configuration.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RunnerConfig {
    #[serde(flatten)]
    pub job: JobSettings,
    /// Jobs this runner runs at once (its prefetch on `gleaner.submit`).
    pub max_jobs: u16,
    /// Jobs one user may have on this runner at once, where users are
    /// kept apart; a submission beyond it is refused with the reason.
    pub max_jobs_per_user: u16,
    /// RabbitMQ's management API (`http://host:15672`), where the runner
    /// makes each job's launcher account when users are kept apart; by
    /// default on the broker's first address.
    pub management_url: Option<String>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            job: JobSettings::default(),
            max_jobs: 64,
            max_jobs_per_user: 16,
            management_url: None,
        }
    }
}

/// Serves `gleaner.submit` until `shutdown`, reconnecting after broker outages.
///
/// `admin` makes each job's launcher account; without it (one user),
/// launchers connect as their kcm does.
pub async fn run(
    broker: Broker,
    config: RunnerConfig,
    users: Users,
    admin: Option<Admin>,
    shutdown: CancellationToken,
) {
    broker
        .supervise(&shutdown, async |connection| {
            session(connection, &config, &users, admin.as_ref(), &shutdown).await
        })
        .await;
}

/// Who owns a submission sent by `sender` (its broker-checked `user_id`),
/// or why nobody may run it.
fn owner(users: &Users, sender: Option<&str>, runner_user: &str) -> Result<Owner, String> {
    let name = users
        .owner(sender, runner_user)
        .map_err(|e| e.to_string())?;
    let account = users
        .job_account(&name, nix::unistd::geteuid().is_root())
        .map_err(|e| e.to_string())?
        .map(|account| {
            Account::lookup(account).map_err(|e| {
                format!(
                    "{e}: a gleaner of many users runs each job as its owner's Unix account, named as the broker user (or mapped in [users] accounts); a gleaner of one user says [users] single = true"
                )
            })
        })
        .transpose()?;
    Ok(Owner { name, account })
}

/// One connection's worth of work. Job controllers live inside it: when it
/// ends, they stop, and their manifests come back to be resumed.
async fn session(
    connection: Arc<Connection>,
    config: &RunnerConfig,
    users: &Users,
    admin: Option<&Admin>,
    shutdown: &CancellationToken,
) -> Result<(), BrokerError> {
    let channel = connection.channel().await?;
    topology::declare_core(connection.lapin()).await?;
    if let Some(admin) = admin
        && let Err(e) = admin.bound_users_queues().await
    {
        warn!(error = %e, "cannot bound users' own queues; they hold what the broker lets them");
    }
    let publisher = connection.publisher().await?;
    let mut submissions: Inbox<IncomingSubmission> = Inbox::open(
        &channel,
        publisher.clone(),
        SUBMIT_QUEUE,
        ConsumeOptions {
            tag: connection.identity(),
            prefetch: config.max_jobs.max(1),
            exclusive: false,
        },
    )
    .await?;
    info!(runner = %connection.identity(), max_jobs = config.max_jobs, max_jobs_per_user = config.max_jobs_per_user, "runner serving gleaner.submit");
    let stop_jobs = shutdown.child_token();
    let mut jobs: JoinSet<(JobId, Result<(), BrokerError>)> = JoinSet::new();
    let mut admissions = Admissions::new(
        (!users.is_single()).then_some(usize::from(config.max_jobs_per_user.max(1))),
    );
    let (claimed, mut claims) = mpsc::unbounded_channel::<JobId>();
    let start = |jobs: &mut JoinSet<_>,
                 (incoming, owner): (Incoming<IncomingSubmission>, Owner),
                 claim| {
        let admin = owner.account.as_ref().and(admin).cloned();
        let job = incoming.msg.0.job.clone();
        info!(job = %job, owner = %owner.name, from = %incoming.from, redelivered = incoming.redelivered, "job accepted");
        let claimed = claimed.clone();
        let claim = Claim {
            claim,
            // The session outlives its jobs: it hears this.
            on_claimed: move || {
                let _ = claimed.send(job.clone());
            },
        };
        let span = error_span!("job", job = %incoming.msg.0.job);
        let supervised = supervise(
            connection.clone(),
            config.job.clone(),
            incoming,
            owner,
            claim,
            admin,
            stop_jobs.clone(),
        );
        jobs.spawn(supervised.instrument(span));
    };
    let outcome = loop {
        tokio::select! {
            delivery = submissions.next() => match delivery {
                Some(Ok(incoming)) => {
                    let IncomingSubmission(submission, raw) = &incoming.msg;
                    let job = submission.job.clone();
                    let owner = match owner(users, incoming.user.as_deref(), connection.user()) {
                        Ok(owner) => owner,
                        Err(reason) => {
                            let sender = incoming.user.clone().unwrap_or_default();
                            refuse(&publisher, &incoming, &sender, (&reason, false)).await?;
                            continue;
                        }
                    };
                    let claim = JobClaim { owner: owner.name.clone(), submission: raw.fingerprint() };
                    let redelivered = incoming.redelivered;
                    // Asked only where the answer matters: a claim takes a
                    // channel to look for.
                    let claimed = match redelivered && admissions.at_limit(&owner.name) {
                        true => match claim_staked(&connection, &job).await {
                            Ok(claimed) => claimed,
                            Err(e) => break Err(e),
                        },
                        false => false,
                    };
                    let past = Past { redelivered, claimed };
                    let live_job = admissions.is_claimed(&job);
                    match admissions.arrive(&job, claim.clone(), (incoming, owner), past) {
                        Arrival::Run(submission) => start(&mut jobs, submission, claim),
                        Arrival::Wait => info!(job = %job, "another submission of this job id is being checked; this one waits for it"),
                        Arrival::Refuse((incoming, owner), reason) => refuse(&publisher, &incoming, &owner.name, (&reason, live_job)).await?,
                    }
                }
                Some(Err(e)) => break Err(e),
                None => break Err(BrokerError::NoQueue(SUBMIT_QUEUE.to_owned())),
            },
            Some(job) = claims.recv() => {
                for ((incoming, owner), reason) in admissions.claimed(&job) {
                    refuse(&publisher, &incoming, &owner.name, (&reason, true)).await?;
                }
            }
            Some(ended) = jobs.join_next() => match ended {
                Ok((job, Ok(()))) => {
                    if let Some((claim, next)) = admissions.ended(&job) {
                        start(&mut jobs, next, claim);
                    }
                }
                Ok((_, Err(e))) => break Err(e),
                Err(e) => {
                    // Its manifest can only go back to the queue with the channel.
                    error!(error = %e, "job controller failed; restarting the session");
                    break Err(BrokerError::Connect(format!("job controller failed: {e}")));
                }
            },
            () = shutdown.cancelled() => break Ok(()),
        }
    };
    stop_jobs.cancel();
    while jobs.join_next().await.is_some() {}
    outcome
}

/// Whether a runner staked `job`'s claim: the job was accepted and has not
/// ended. Only the services may make a `gleaner.job.*` queue, so this is
/// the deployment's record, which no user can fake.
async fn claim_staked(connection: &Connection, job: &JobId) -> Result<bool, BrokerError> {
    topology::queue_exists(connection.lapin(), &topology::JobQueues::new(job).claim).await
}

/// A submission that may not run: to `gleaner.dead` with the reason, and a
/// `rejected` event for its sender's `--wait` (routed by `owner`, the
/// sender's name, and naming this submission by its fingerprint, as
/// another of the same id may be running), then acked: refused, never
/// dropped in silence.
async fn refuse(
    publisher: &gleaner_broker::Publisher,
    incoming: &Incoming<IncomingSubmission>,
    owner: &str,
    (reason, live_job): (&str, bool),
) -> Result<(), BrokerError> {
    let IncomingSubmission(submission, raw) = &incoming.msg;
    let reason = gleaner_protocol::cut_reason(reason);
    let reason = reason.as_ref();
    warn!(job = %submission.job, user = incoming.user.as_deref().unwrap_or("-"), reason, "submission refused");
    // Refused either way: a copy that cannot be made costs the copy, not
    // the session (the submission would come back and fail it again).
    if let Err(e) = publisher
        .dead_letter(SUBMIT_QUEUE, (&raw.properties, &raw.data), reason)
        .await
    {
        warn!(job = %submission.job, error = %e, "cannot copy the refused submission to gleaner.dead");
    }
    let event = Event::Rejected {
        job: submission.job.to_string(),
        owner: owner.to_owned(),
        reason: reason.to_owned(),
        submission: Some(raw.fingerprint()),
        live_job,
    };
    if let Err(e) = publisher.event(&event).await {
        warn!(job = %submission.job, error = %e, "cannot publish the rejection");
    }
    incoming.ack().await
}

/// Runs one job to its end and acks its manifest; retries after a results
/// directory failure (a full disk, say) instead of losing the job.
async fn supervise(
    connection: Arc<Connection>,
    settings: JobSettings,
    manifest: Incoming<IncomingSubmission>,
    owner: Owner,
    claim: Claim<impl Fn()>,
    admin: Option<Admin>,
    stop: CancellationToken,
) -> (JobId, Result<(), BrokerError>) {
    let submission = &manifest.msg.0;
    let job = submission.job.clone();
    // Where the job stood when its results could not be written.
    let mut stalled = None;
    loop {
        let outcome = job::run(
            connection.clone(),
            settings.clone(),
            submission,
            &owner,
            &claim,
            admin.as_ref(),
            stop.clone(),
        )
        .await;
        let end = match outcome {
            Ok(()) => RunEnd::Over,
            Err(JobError::Shutdown) => RunEnd::Shutdown,
            Err(JobError::Refused(reason)) => RunEnd::Refused(reason),
            Err(JobError::Broker(e)) if e.is_not_found() => RunEnd::QueuesGone(JobError::Broker(e)),
            Err(e) if e.unsendable().is_some() => RunEnd::TooBig(e),
            Err(e @ JobError::Broker(_)) => RunEnd::BrokerLost(e),
            Err(JobError::Results {
                error, standing, ..
            }) => {
                stalled = standing;
                RunEnd::ResultsUnwritable {
                    error: error.to_string(),
                }
            }
        };
        let result = match supervision::after(end) {
            Next::Ack => manifest.ack().await,
            Next::Leave => Ok(()),
            Next::Refuse(reason) => match connection.publisher().await {
                Ok(publisher) => refuse(&publisher, &manifest, &owner.name, (&reason, false)).await,
                Err(e) => Err(e),
            },
            Next::EndSession(JobError::Broker(e)) => Err(e),
            Next::EndSession(e) => Err(BrokerError::Connect(e.to_string())),
            Next::RetryAfter { wait, problem } => {
                if let Some(mut report) = stalled.take() {
                    report.problem = Some(problem);
                    let sent = match connection.publisher().await {
                        Ok(publisher) => {
                            publisher
                                .send(SCHEDULER_QUEUE, &SchedulerMsg::JobUpdate(*report))
                                .await
                        }
                        Err(e) => Err(e),
                    };
                    if let Err(e) = sent {
                        warn!(error = %e, "cannot tell the scheduler why the job stalls");
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(wait) => continue,
                    () = stop.cancelled() => Ok(()),
                }
            }
        };
        return (job, result);
    }
}
