//! The user's side: `submit`, `status`, `cancel`. What they show goes
//! through [`Output`]; what goes wrong is a [`CliError`].

use std::{
    path::Path,
    time::{Duration, Instant},
};

use gleaner_broker::{
    Broker, BrokerError, Connection, Inbox,
    topology::{self, REQUEST, SUBMIT},
};
use gleaner_manifest::{JobId, JobIdError, Manifest};
use gleaner_protocol::{
    CancelReply, Event, RequestMsg, StatusReply, Submission, job_events, now_ms,
};

use crate::{error::CliError, output::Output, services::hostname, settings::Settings};

async fn connect(settings: &Settings) -> Result<Connection, CliError> {
    let broker = Broker::new(&settings.broker_urls(), format!("cli@{}", hostname()))
        .map_err(|e| CliError::BadInput(e.to_string()))?;
    broker.connect().await.map_err(|e| {
        let e = e.to_string();
        CliError::Unreachable(format!("{e}\n({})", connect_hint(&e)))
    })
}

/// What to try, from how connecting failed.
fn connect_hint(error: &str) -> &'static str {
    if error.contains("certificate") {
        "the broker's certificate is not trusted here: add its CA to the system's trust store, or point SSL_CERT_FILE at it"
    } else if error.contains("Parsing Error") {
        "the broker did not answer in AMQP: a TLS port (5671) needs an amqps:// URL"
    } else {
        "is RabbitMQ running? `deploy/rabbitmq/setup.sh` installs and starts one"
    }
}

/// Reads and validates a manifest: TOML, or JSON for a `.json` file.
pub fn read_manifest(path: &Path) -> Result<Manifest, String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let parsed = if path.extension().is_some_and(|e| e == "json") {
        Manifest::from_json(&text)
    } else {
        let text =
            String::from_utf8(text).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
        Manifest::from_toml(&text)
    };
    parsed.map_err(|e| format!("{}: invalid manifest\n{e}", path.display()))
}

/// How long the broker keeps a `--wait` client's queue of events once
/// nobody consumes it (the client died, or the broker was away).
const WATCH_EXPIRY: Duration = Duration::from_secs(600);

pub async fn submit(
    settings: &Settings,
    path: &Path,
    wait: bool,
    output: &dyn Output,
) -> Result<(), CliError> {
    let manifest = read_manifest(path).map_err(CliError::BadInput)?;
    let job = JobId::new(&manifest.name, rand::random::<u32>());
    let connection = connect(settings).await?;
    let watch = Watch::new(&job, connection.user());
    let events = async {
        topology::declare_core_if_allowed(connection.lapin()).await?;
        let publisher = connection.publisher().await?;
        // Follow before submitting, so that no event can be missed.
        let events = match wait {
            true => Some(watch.follow(&connection).await?),
            false => None,
        };
        let submission = Submission {
            job: job.clone(),
            manifest,
            submitted_at: now_ms(),
        };
        publisher.send_via(SUBMIT, &submission).await?;
        Ok::<_, BrokerError>(events)
    }
    .await
    .map_err(|e| unless_missing(e, "a runner"))?;
    output.job_submitted(&job, wait);
    let Some(events) = events else {
        return Ok(());
    };
    watch.until_done(settings, connection, events, output).await
}

/// A `--wait` client's own queue of the job's events.
struct Watch {
    job: JobId,
    /// The job's owner: the user submitting it.
    owner: String,
    queue: String,
}

impl Watch {
    fn new(job: &JobId, owner: &str) -> Self {
        Self {
            job: job.clone(),
            owner: owner.to_owned(),
            queue: topology::watch_queue(owner, job),
        }
    }

    async fn follow(&self, connection: &Connection) -> Result<Inbox<Event>, BrokerError> {
        let publisher = connection.publisher().await?;
        connection
            .follow(
                &publisher,
                &self.queue,
                &job_events(&self.owner, self.job.as_str(), "#"),
                WATCH_EXPIRY,
            )
            .await
    }

    /// Shows the job's progress until it ends. A broker that goes away is
    /// waited for (one line says so): the job goes on without the client,
    /// and the queue keeps what happens meanwhile.
    async fn until_done(
        &self,
        settings: &Settings,
        mut connection: Connection,
        mut events: Inbox<Event>,
        output: &dyn Output,
    ) -> Result<(), CliError> {
        let job = &self.job;
        let mut progress = output.progress(job);
        let mut last_news = Instant::now();
        let mut nudged = false;
        let ended = loop {
            let next = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
            let incoming = match next {
                Err(_) => {
                    if !nudged && last_news.elapsed() > Duration::from_secs(10) {
                        progress.note("no runner has picked the job up yet (is `gleaner up` or `gleaner runner` running?)");
                        nudged = true;
                    }
                    continue;
                }
                Ok(Some(Ok(incoming))) => incoming,
                Ok(Some(Err(_)) | None) => {
                    progress.note(&format!(
                        "lost the broker; waiting for it to come back (the job goes on; Ctrl-C leaves, `gleaner status {job}` looks later)"
                    ));
                    (connection, events) = self.reconnect(settings).await;
                    progress.note("the broker is back");
                    continue;
                }
            };
            let _ = incoming.ack().await;
            last_news = Instant::now();
            match incoming.msg {
                Event::Progress(report) => progress.update(&report),
                Event::Done(report) => {
                    progress.finish(&report);
                    output.job_ended(&report);
                    let t = report.tasks;
                    break if t.succeeded == t.total {
                        Ok(())
                    } else {
                        Err(CliError::Unsuccessful(None))
                    };
                }
                Event::Rejected { reason, .. } => {
                    progress.abandon();
                    break Err(CliError::BadInput(format!(
                        "the runner refused the job: {reason}"
                    )));
                }
                Event::Cluster(_) => {}
            }
        };
        connection.forget(&self.queue).await;
        ended
    }

    /// Connects and follows again, backing off until the broker answers.
    async fn reconnect(&self, settings: &Settings) -> (Connection, Inbox<Event>) {
        let mut delay = Duration::from_millis(500);
        loop {
            tokio::time::sleep(delay).await;
            if let Ok(connection) = connect(settings).await
                && let Ok(events) = self.follow(&connection).await
            {
                return (connection, events);
            }
            delay = delay.saturating_mul(2).min(Duration::from_secs(10));
        }
    }
}

pub async fn status(
    settings: &Settings,
    job: Option<&str>,
    hosts: bool,
    output: &dyn Output,
) -> Result<(), CliError> {
    let connection = connect(settings).await?;
    let mut reply: StatusReply = ask(&connection, &RequestMsg::Status {}).await?;
    if let Some(job) = job {
        reply.jobs.retain(|j| j.job.as_str() == job);
        reply.placements.retain(|p| p.job.as_str() == job);
        if reply.jobs.is_empty() {
            return Err(not_running(job, reply.hidden > 0));
        }
    }
    output.status(&reply, job, hosts);
    Ok(())
}

/// Asks the active scheduler; it answers within 5 s or is not there.
async fn ask<A: gleaner_protocol::Message>(
    connection: &Connection,
    request: &RequestMsg,
) -> Result<A, CliError> {
    let answer = connection
        .ask::<RequestMsg, A>(REQUEST, request, Duration::from_secs(5))
        .await
        .map_err(|e| unless_missing(e, "a scheduler"))?;
    answer.ok_or_else(|| {
        CliError::Unreachable(
            "no scheduler answered within 5 s (is `gleaner up` or `gleaner scheduler` running?)"
                .to_owned(),
        )
    })
}

/// A broker error, or, if gleaner's queues are not there (a user may not
/// declare them: the services do), which service to start.
fn unless_missing(e: BrokerError, service: &str) -> CliError {
    if e.is_not_found() {
        return CliError::Unreachable(format!(
            "gleaner's queues are not there yet (is {service} running? `gleaner up` starts every service)"
        ));
    }
    CliError::from(e)
}

/// A job the user cannot find: ended, not started, or (`others`: the
/// scheduler left some jobs out) someone else's.
fn not_running(job: &str, others: bool) -> CliError {
    let why = if others {
        "it ended, no runner has it yet, or it is not yours"
    } else {
        "it ended, or no runner has it yet"
    };
    CliError::Unsuccessful(Some(format!("job {job} is not running ({why})")))
}

pub async fn cancel(settings: &Settings, job: &str, output: &dyn Output) -> Result<(), CliError> {
    let job: JobId = job
        .parse()
        .map_err(|e: JobIdError| CliError::BadInput(e.to_string()))?;
    let connection = connect(settings).await?;
    match ask(&connection, &RequestMsg::Cancel { job: job.clone() }).await? {
        CancelReply::Accepted {} => {
            output.cancel_requested(&job);
            Ok(())
        }
        CancelReply::NotRunning {} => Err(not_running(job.as_str(), false)),
        CancelReply::Refused { reason } => {
            Err(CliError::Denied(format!("cannot cancel {job}: {reason}")))
        }
    }
}
