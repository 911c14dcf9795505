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
use gleaner_manifest::{Addition, JobId, JobIdError, Manifest};
use gleaner_protocol::{
    ActionReply, EndedJob, Ending, Event, JobReport, MAX_MESSAGE_BYTES, RequestMsg, StatusReply,
    Submission, codec, job_events, now_ms,
};

use crate::{
    error::CliError,
    output::{Output, Passed},
    services::hostname,
    settings::Settings,
};

pub(crate) async fn connect(settings: &Settings) -> Result<Connection, CliError> {
    let urls = settings.broker_urls();
    let broker = Broker::new(&urls, format!("cli@{}", hostname()))
        .map_err(|e| CliError::BadInput(e.to_string()))?;
    broker.connect().await.map_err(|e| {
        let e = e.to_string();
        CliError::Unreachable(format!("{e}\n({})", connect_hint(&e, &urls)))
    })
}

/// What to try, from how connecting failed and where to.
pub(crate) fn connect_hint(error: &str, urls: &[String]) -> &'static str {
    let plain_to_tls = urls
        .iter()
        .any(|url| gleaner_broker::plain_to_tls_port(url));
    if [
        "ACCESS_REFUSED",
        "ACCESS-REFUSED",
        "ACCESSREFUSED",
        "Login was refused",
    ]
    .iter()
    .any(|refused| error.contains(refused))
    {
        "the broker refused the account in broker_url: set its user and password (`deploy/rabbitmq/user.sh` makes accounts and prints their URLs)"
    } else if error.contains("certificate") {
        "the broker's certificate is not trusted here: add its CA to the system's trust store, or point SSL_CERT_FILE at it"
    } else if plain_to_tls || error.contains("Parsing Error") {
        "the broker did not answer in AMQP: a TLS port (5671) needs an amqps:// URL"
    } else {
        "is RabbitMQ running? `deploy/rabbitmq/setup.sh` installs and starts one"
    }
}

/// Reads and validates a manifest: TOML, or JSON for a `.json` file; its
/// sweep's data files are read relative to it. `open` makes it an open job.
pub fn read_manifest(path: &Path, open: bool) -> Result<Manifest, String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let parsed = if path.extension().is_some_and(|e| e == "json") {
        Manifest::parse_json(&text)
    } else {
        let text =
            String::from_utf8(text).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
        Manifest::parse_toml(&text)
    };
    parsed
        .and_then(|manifest| {
            let open = manifest.open || open;
            Manifest { open, ..manifest }.complete(files_beside(path))
        })
        .map_err(|e| format!("{}: invalid manifest\n{e}", path.display()))
}

/// Reads the data files a manifest (or an addition) at `path` names,
/// relative to it.
fn files_beside(path: &Path) -> impl FnMut(&str) -> Result<Vec<u8>, String> + '_ {
    let beside = path.parent().unwrap_or(Path::new("."));
    move |name| {
        let file = beside.join(name);
        std::fs::read(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))
    }
}

/// Reads and checks tasks to add to an open job, its sweep's data files
/// relative to it.
pub fn read_addition(path: &Path) -> Result<Addition, String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let parsed = if path.extension().is_some_and(|e| e == "json") {
        Addition::parse_json(&text)
    } else {
        let text =
            String::from_utf8(text).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
        Addition::parse_toml(&text)
    };
    parsed
        .and_then(|addition| addition.complete(files_beside(path)))
        .map_err(|e| format!("{}: invalid tasks to add\n{e}", path.display()))
}

/// How long the broker keeps a `--wait` client's queue of events once
/// nobody consumes it (the client died, or the broker was away).
pub(crate) const WATCH_EXPIRY: Duration = Duration::from_secs(600);

/// `FROM-TO[:STEP]` of `submit --array`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayRange {
    from: i64,
    to: i64,
    step: i64,
}

impl std::str::FromStr for ArrayRange {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let span: gleaner_manifest::Span = text.parse()?;
        let number = |n: u64| i64::try_from(n).map_err(|_| format!("{text:?}: {n} is too large"));
        Ok(Self {
            from: number(span.first)?,
            to: number(span.last)?,
            step: number(span.step)?,
        })
    }
}

/// The manifest of `submit --array RANGE -- COMMAND…`: a sweep of `{i}`.
pub fn array_manifest(
    range: ArrayRange,
    name: Option<&str>,
    command: &[String],
) -> Result<Manifest, String> {
    let line = match command {
        [] => return Err("--array needs a command after `--`".to_owned()),
        [line] => line.clone(),
        words => shell_words::join(words),
    };
    let name = match name {
        Some(name) => name.to_owned(),
        None => {
            let program = shell_words::split(&line)
                .ok()
                .and_then(|words| words.into_iter().next())
                .unwrap_or_default();
            let program = Path::new(&program)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let name: String = program
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                .take(64)
                .collect();
            if name.is_empty() {
                "array".to_owned()
            } else {
                name
            }
        }
    };
    let manifest = Manifest {
        sweep: Some(gleaner_manifest::Sweep {
            command: line,
            params: [(
                "i".to_owned(),
                gleaner_manifest::ParamSpec::Range {
                    from: range.from,
                    to: range.to,
                    step: range.step,
                },
            )]
            .into_iter()
            .collect(),
            csv: None,
            lines: None,
            tables: Vec::new(),
        }),
        ..Manifest::named(&name)
    };
    manifest
        .validate()
        .map_err(|e| format!("invalid --array job\n{e}"))?;
    Ok(manifest)
}

pub async fn submit(
    settings: &Settings,
    manifest: Manifest,
    wait: bool,
    output: &dyn Output,
) -> Result<(), CliError> {
    let job = JobId::new(&manifest.name, rand::random::<u64>());
    let connection = connect(settings).await?;
    let submission = Submission {
        job: job.clone(),
        manifest,
        submitted_at: now_ms(),
    };
    let followed = async {
        topology::declare_core_if_allowed(connection.lapin()).await?;
        let publisher = connection.publisher().await?;
        // Follow before submitting, so that no event can be missed.
        let followed = match wait {
            true => {
                let watch =
                    Watch::new(&job, connection.user(), publisher.fingerprint(&submission)?);
                let events = watch.follow(&connection).await?;
                Some((watch, events))
            }
            false => None,
        };
        publisher.send_via(SUBMIT, &submission).await?;
        Ok::<_, BrokerError>(followed)
    }
    .await
    .map_err(|e| unless_missing(e, "a runner"))?;
    output.job_submitted(&job, wait);
    let Some((watch, events)) = followed else {
        return Ok(());
    };
    watch
        .until_done(settings, connection, events, output, None)
        .await
}

/// `gleaner wait JOB`: follows a running job to its end, as `submit --wait`
/// does, with the same exit code; a job that has ended already answers at
/// once.
pub async fn wait(settings: &Settings, job: &str, output: &dyn Output) -> Result<(), CliError> {
    let id = job_id(job)?;
    let connection = connect(settings).await?;
    let standing = async |connection: &Connection| match find(connection, &id, PATIENCE).await? {
        (_, Some(known)) => Ok(known),
        (reply, None) => Err(not_found(&id, reply.hidden > 0)),
    };
    // Its owner names its events; following them before asking again
    // leaves no moment in which its end could be missed.
    let report = match standing(&connection).await? {
        Known::Running(report) => report,
        settled => return settled.settle(output, None).unwrap_or(Ok(())),
    };
    let watch = Watch::another(&report.job, &report.owner, connection.user());
    let events = watch
        .follow(&connection)
        .await
        .map_err(|e| unless_missing(e, "a runner"))?;
    match standing(&connection).await {
        Ok(Known::Running(report)) => {
            watch
                .until_done(settings, connection, events, output, Some(&report))
                .await
        }
        Ok(settled) => {
            connection.forget(&watch.queue).await;
            settled.settle(output, None).unwrap_or(Ok(()))
        }
        Err(e) => {
            connection.forget(&watch.queue).await;
            Err(e)
        }
    }
}

/// How long a job the scheduler knows nothing of is asked about again: it
/// may have been submitted a moment ago, or be between its runner and
/// the history.
const PATIENCE: Duration = Duration::from_secs(10);

/// The exit of a job that ended: success only if every task succeeded
/// and nothing else went wrong.
fn outcome(report: &JobReport) -> Result<(), CliError> {
    let t = &report.tasks;
    if t.succeeded == t.total && report.problem.is_none() {
        Ok(())
    } else {
        Err(CliError::Unsuccessful(None))
    }
}

/// A job as the scheduler knows it.
enum Known {
    Running(JobReport),
    /// From the history: it ran and ended.
    Ended(JobReport),
    /// From the history: a runner refused it, for this reason.
    Refused(String),
}

impl Known {
    /// What the scheduler's answer about `job` says of it. An end is
    /// final: a running report beside it is stale.
    fn of(reply: &StatusReply, job: &JobId) -> Option<Self> {
        if let Some(report) = reply.ended.iter().find_map(EndedJob::report) {
            return Some(Self::Ended(report.clone()));
        }
        if let Some(report) = reply.jobs.iter().find(|j| &j.job == job) {
            return Some(Self::Running(report.clone()));
        }
        reply.ended.iter().find_map(|e| match &e.ending {
            Ending::Refused { reason } => Some(Self::Refused(reason.clone())),
            Ending::Done(_) => None,
        })
    }

    /// Where its results are, if it ran.
    fn results(&self) -> Option<&str> {
        match self {
            Self::Running(report) | Self::Ended(report) => Some(&report.results),
            Self::Refused(_) => None,
        }
    }

    /// The end of waiting for a job that is over, as `submit --wait` ends:
    /// `None` while it runs.
    fn settle(
        self,
        output: &dyn Output,
        progress: Option<&mut crate::output::Progress>,
    ) -> Option<Result<(), CliError>> {
        match self {
            Self::Running(_) => None,
            Self::Ended(report) => {
                if let Some(progress) = progress {
                    progress.finish(&report);
                }
                output.job_ended(&report);
                Some(outcome(&report))
            }
            Self::Refused(reason) => {
                if let Some(progress) = progress {
                    progress.abandon();
                }
                Some(Err(CliError::BadInput(format!(
                    "the runner refused the job: {reason}"
                ))))
            }
        }
    }
}

/// What the scheduler knows of `job` (as the asking user may see it),
/// asked again for up to `patience` while it knows nothing: its last
/// answer, and what that says.
async fn find(
    connection: &Connection,
    job: &JobId,
    patience: Duration,
) -> Result<(StatusReply, Option<Known>), CliError> {
    let started = Instant::now();
    loop {
        let request = RequestMsg::Status {
            job: Some(job.clone()),
        };
        let reply: StatusReply = ask(connection, &request).await?;
        let known = Known::of(&reply, job);
        if known.is_some() || started.elapsed() >= patience {
            return Ok((reply, known));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// How long a `--wait` client hears nothing before it asks whether the
/// job has ended.
const SILENCE: Duration = Duration::from_secs(10);

/// How long `submit --job` waits for the job's runner to take the tasks.
const ADDITION_PATIENCE: Duration = Duration::from_secs(30);

/// A `--wait` client's own queue of the job's events.
struct Watch {
    job: JobId,
    /// The job's owner: the user submitting it.
    owner: String,
    queue: String,
    /// The fingerprint of the submission waited for, if this client sent
    /// it (`submit --wait`); `wait` of a running job knows none.
    submission: Option<u64>,
}

/// Whether a `rejected` event naming `refused` (a submission's
/// fingerprint) ends a wait for the submission `ours`: only its own
/// refusal does. The same id may be submitted again while the job runs,
/// and that refusal says nothing of the job; `wait` of a running job
/// waits for it to end (a refusal of the running submission itself is
/// found in the history after a silence). A refusal naming no
/// submission (from a runner before they did) ends only a wait for a
/// submission just sent.
fn refusal_ends_wait(ours: Option<u64>, refused: Option<u64>) -> bool {
    ours.is_some_and(|ours| refused.is_none_or(|refused| refused == ours))
}

impl Watch {
    /// The watch of `submit --wait`, of the submission whose fingerprint
    /// is `submission`.
    fn new(job: &JobId, owner: &str, submission: u64) -> Self {
        Self {
            job: job.clone(),
            owner: owner.to_owned(),
            queue: topology::watch_queue(owner, job),
            submission: Some(submission),
        }
    }

    /// A watch of `user`'s own beside any other (`submit --wait`'s, another
    /// `wait`'s) of `owner`'s job.
    fn another(job: &JobId, owner: &str, user: &str) -> Self {
        Self {
            job: job.clone(),
            owner: owner.to_owned(),
            queue: format!(
                "{}.{:08x}",
                topology::watch_queue(user, job),
                rand::random::<u32>()
            ),
            submission: None,
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
        standing: Option<&JobReport>,
    ) -> Result<(), CliError> {
        let job = &self.job;
        let mut progress = output.progress(job);
        if let Some(report) = standing {
            progress.update(report);
        }
        let mut last_news = Instant::now();
        let mut last_look = Instant::now();
        let mut nudged = false;
        let ended = loop {
            let next = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
            let incoming = match next {
                Err(_) => {
                    if !nudged && last_news.elapsed() > Duration::from_secs(10) {
                        progress.note("no runner has picked the job up yet (is `gleaner up` or `gleaner runner` running?)");
                        nudged = true;
                    }
                    // An end told before this client listened is in the
                    // history: looked for after a silence.
                    if last_news.elapsed() > SILENCE && last_look.elapsed() > SILENCE {
                        last_look = Instant::now();
                        if let Ok((_, Some(known))) = find(&connection, job, Duration::ZERO).await
                            && let Some(ended) = known.settle(output, Some(&mut progress))
                        {
                            break ended;
                        }
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
                    if let Some(ended) = Known::Ended(report).settle(output, Some(&mut progress)) {
                        break ended;
                    }
                }
                Event::Rejected {
                    reason, submission, ..
                } => {
                    if !refusal_ends_wait(self.submission, submission) {
                        continue;
                    }
                    if let Some(ended) = Known::Refused(reason).settle(output, Some(&mut progress))
                    {
                        break ended;
                    }
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

/// Where a job's results are, as the scheduler knows it (running, or
/// ended within the history's retention).
pub async fn results_of(settings: &Settings, job: &JobId) -> Result<Option<String>, CliError> {
    let connection = connect(settings).await?;
    let (_, known) = find(&connection, job, Duration::from_secs(3)).await?;
    Ok(known.as_ref().and_then(Known::results).map(str::to_owned))
}

/// `gleaner jobs`: the user's jobs, running and recently ended (`all`:
/// every job the user may see; `running`: those running only).
pub async fn jobs(
    settings: &Settings,
    all: bool,
    running: bool,
    output: &dyn Output,
) -> Result<(), CliError> {
    let connection = connect(settings).await?;
    let reply: StatusReply = ask(&connection, &RequestMsg::Status { job: None }).await?;
    let mut jobs = reply.jobs;
    if !running {
        jobs.extend(reply.ended.iter().filter_map(EndedJob::report).cloned());
    }
    if !all {
        let user = connection.user().to_owned();
        jobs.retain(|j| j.owner == user);
    }
    output.jobs(&jobs);
    Ok(())
}

/// `gleaner status [JOB]`: the clusters and jobs; of one job, running or
/// ended.
pub async fn status(
    settings: &Settings,
    job: Option<&str>,
    hosts: bool,
    output: &dyn Output,
) -> Result<(), CliError> {
    let connection = connect(settings).await?;
    let mut reply = match job.map(job_id).transpose()? {
        None => ask(&connection, &RequestMsg::Status { job: None }).await?,
        Some(id) => {
            let (mut reply, known) = find(&connection, &id, Duration::from_secs(3)).await?;
            match known {
                Some(Known::Running(_)) => {}
                Some(Known::Ended(report)) => reply.jobs = vec![report],
                Some(Known::Refused(reason)) => {
                    return Err(CliError::Unsuccessful(Some(format!(
                        "job {id} was refused: {reason}"
                    ))));
                }
                None => return Err(not_found(&id, reply.hidden > 0)),
            }
            reply.ended.clear();
            reply
        }
    };
    if job.is_none() {
        reply.ended.clear();
    }
    output.status(&reply, job, hosts);
    Ok(())
}

/// Asks the active scheduler; it answers within 5 s or is not there.
pub(crate) async fn ask<A: gleaner_protocol::Message>(
    connection: &Connection,
    request: &RequestMsg,
) -> Result<A, CliError> {
    ask_within(connection, request, Duration::from_secs(5))
        .await?
        .ok_or_else(|| {
            CliError::Unreachable(
                "no scheduler answered within 5 s (is `gleaner up` or `gleaner scheduler` running?)"
                    .to_owned(),
            )
        })
}

/// [`ask`], waiting `timeout` for the answer.
pub(crate) async fn ask_within<A: gleaner_protocol::Message>(
    connection: &Connection,
    request: &RequestMsg,
    timeout: Duration,
) -> Result<Option<A>, CliError> {
    connection
        .ask::<RequestMsg, A>(REQUEST, request, timeout)
        .await
        .map_err(|e| unless_missing(e, "a scheduler"))
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

/// A job the user cannot find, running or ended: `others`, the scheduler
/// left one of that id out (someone else's).
fn not_found(job: &JobId, others: bool) -> CliError {
    CliError::Unsuccessful(Some(match others {
        true => format!("job {job} is not yours"),
        false => format!(
            "job {job} is not known here: no runner has it yet, or it ended longer ago than the history keeps"
        ),
    }))
}

pub async fn cancel(settings: &Settings, job: &str, output: &dyn Output) -> Result<(), CliError> {
    let job = job_id(job)?;
    let request = RequestMsg::Cancel { job: job.clone() };
    act(settings, &job, &request, "cancel").await?;
    output.passed_on(&job, Passed::Cancel);
    Ok(())
}

/// `gleaner close JOB`: an open job takes no more tasks.
pub async fn close(settings: &Settings, job: &str, output: &dyn Output) -> Result<(), CliError> {
    let job = job_id(job)?;
    let request = RequestMsg::Close { job: job.clone() };
    act(settings, &job, &request, "close").await?;
    output.passed_on(&job, Passed::Close);
    Ok(())
}

/// `gleaner submit --job JOB FILE`: more tasks for an open job.
pub async fn add_tasks(
    settings: &Settings,
    job: &str,
    path: &Path,
    wait: bool,
    output: &dyn Output,
) -> Result<(), CliError> {
    let job = job_id(job)?;
    let mut addition = read_addition(path).map_err(CliError::BadInput)?;
    addition.id = rand::random();
    let count = addition
        .task_list()
        .map_err(|e| CliError::BadInput(format!("{}: {e}", path.display())))?
        .len();
    let request = addition_request(&job, addition)
        .map_err(|e| CliError::BadInput(format!("{}: {e}", path.display())))?;
    // The job's runner answers, once it has recorded the tasks or
    // refused them (the job was closed meanwhile, or would be too big).
    let connection = connect(settings).await?;
    match ask_within(&connection, &request, ADDITION_PATIENCE).await? {
        Some(ActionReply::Accepted {}) => {}
        Some(refused) => return Err(action_error(&connection, &job, refused, "add tasks to").await),
        None => {
            if let Ok((_, Some(Known::Ended(_)))) = find(&connection, &job, Duration::ZERO).await {
                return Err(CliError::Unsuccessful(Some(format!(
                    "cannot add tasks to {job}: it ended before its runner took them; none was added"
                ))));
            }
            return Err(CliError::Unreachable(format!(
                "no answer from the scheduler or {job}'s runner within {} s: the tasks may yet be added (`gleaner status {job}` counts them)",
                ADDITION_PATIENCE.as_secs()
            )));
        }
    }
    output.passed_on(&job, Passed::Tasks(count));
    match wait {
        true => self::wait(settings, job.as_str(), output).await,
        false => Ok(()),
    }
}

/// The request to add `addition` to `job`, if one message holds it (and
/// so the one its runner gets): otherwise why not, before it is sent.
fn addition_request(job: &JobId, addition: Addition) -> Result<RequestMsg, String> {
    let request = RequestMsg::AddTasks {
        job: job.clone(),
        addition,
    };
    match codec::fits(&request) {
        Ok(()) => Ok(request),
        Err(bytes) => Err(format!(
            "the tasks to add make a message of {:.1} MiB, more than the {} MiB one may hold: add them in parts",
            bytes as f64 / f64::from(1 << 20),
            MAX_MESSAGE_BYTES >> 20
        )),
    }
}

fn job_id(job: &str) -> Result<JobId, CliError> {
    job.parse()
        .map_err(|e: JobIdError| CliError::BadInput(e.to_string()))
}

/// Asks the scheduler to pass `request` on to `job`'s runner.
async fn act(
    settings: &Settings,
    job: &JobId,
    request: &RequestMsg,
    what: &str,
) -> Result<(), CliError> {
    let connection = connect(settings).await?;
    match ask(&connection, request).await? {
        ActionReply::Accepted {} => Ok(()),
        refused => Err(action_error(&connection, job, refused, what).await),
    }
}

/// Why `what` (to) `job` did not happen: it is not running, or was refused.
async fn action_error(
    connection: &Connection,
    job: &JobId,
    reply: ActionReply,
    what: &str,
) -> CliError {
    if let ActionReply::Refused { reason } = reply {
        return CliError::Denied(format!("cannot {what} {job}: {reason}"));
    }
    match find(connection, job, Duration::from_secs(3)).await {
        Ok((_, Some(Known::Ended(report)))) => CliError::Unsuccessful(Some(format!(
            "cannot {what} {job}: it has ended ({})",
            format!("{:?}", report.state).to_lowercase()
        ))),
        Ok((_, Some(Known::Refused(reason)))) => CliError::Unsuccessful(Some(format!(
            "cannot {what} {job}: it was refused ({reason})"
        ))),
        Ok((_, Some(Known::Running(_)))) => CliError::Unsuccessful(Some(format!(
            "cannot {what} {job}: its runner is not taking messages now; try again"
        ))),
        Ok((reply, None)) => not_found(job, reply.hidden > 0),
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_to_add_too_big_for_a_message_are_refused_before_they_are_sent() {
        let job: JobId = "open-0000000000000001".parse().unwrap();
        let task = |command: String| gleaner_manifest::TaskDef { command };
        let addition = |tasks| Addition {
            id: 1,
            tasks,
            sweep: None,
        };
        let few = addition(vec![task("echo".into()); 10]);
        assert!(addition_request(&job, few).is_ok());
        let many = addition(vec![task("x".repeat(20)); 700_000]);
        let err = addition_request(&job, many).unwrap_err();
        assert!(
            err.contains("more than the 16 MiB one may hold: add them in parts"),
            "{err}"
        );
    }

    #[test]
    fn only_its_own_submissions_refusal_ends_a_wait() {
        // `submit --wait`: its own refusal ends it, another of its id's not.
        assert!(refusal_ends_wait(Some(7), Some(7)));
        assert!(
            !refusal_ends_wait(Some(7), Some(8)),
            "a second submission of the running job's id"
        );
        assert!(refusal_ends_wait(Some(7), None), "a runner that names none");
        // `wait` of a running job: no refusal is its end.
        assert!(!refusal_ends_wait(None, Some(8)));
        assert!(!refusal_ends_wait(None, None));
    }
}
