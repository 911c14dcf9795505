//! The scheduler: one active instance (others wait as hot standbys on the
//! single-active-consumer inbox), holding the picture of clusters and jobs
//! and deciding who gets idle slots.
//!
//! The policies (crate `gleaner-policy`) are pure and decide; [`state`]
//! keeps the picture and the promises in flight; this module only moves
//! messages.

mod grid;
mod history;
pub mod metrics;
pub mod outbox;
pub mod state;

pub use grid::GridConfig;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use gleaner_broker::{
    Broker, BrokerError, Connection, ConsumeOptions, Inbox, Incoming, Publisher, peek,
    topology::{
        self, HISTORY_QUEUE, JobQueues, REQUESTS_QUEUE, SCHEDULER_GRID_QUEUE, SCHEDULER_QUEUE,
    },
};
use gleaner_manifest::JobId;
use gleaner_policy::access::Users;
use gleaner_protocol::{
    ActionReply, ControlMsg, EndedJob, Event, GrantId, GridSnapshot, Now, RequestMsg, SchedulerMsg,
    now_ms,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::state::{Answer, Reaction, RoundClock, State, StateConfig};

/// Inbox messages acknowledged at once under load.
const ACK_EVERY: u16 = 64;
/// How long a quiet inbox keeps its last messages unacknowledged.
const ACK_IDLE: Duration = Duration::from_millis(5);

/// A large round goes out in chunks this big, `POST_PAUSE` apart: at most
/// 10,000 messages a second, so that the broker has room for the inbox.
const POST_CHUNK: usize = 500;
const POST_PAUSE: Duration = Duration::from_millis(50);
/// How often the metrics page is made again: a scrape interval is seconds.
const METRICS_EVERY: Duration = Duration::from_secs(2);

/// `[scheduler]` of the configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedulerConfig {
    #[serde(flatten)]
    pub state: StateConfig,
    /// How often a round runs even without news.
    #[serde(with = "humantime_serde")]
    pub round_interval: Duration,
    /// The least time between two rounds when news (a new job) calls for
    /// one before the timer.
    #[serde(with = "humantime_serde")]
    pub round_min_gap: Duration,
    /// Where Prometheus metrics are served (`/metrics`), if anywhere.
    pub metrics: Option<std::net::SocketAddr>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            state: StateConfig::default(),
            round_interval: Duration::from_secs(1),
            round_min_gap: Duration::from_millis(200),
            metrics: None,
        }
    }
}

/// Serves `gleaner.scheduler`, and users' requests on `gleaner.requests`,
/// until `shutdown`, reconnecting after outages.
pub async fn run(
    broker: Broker,
    config: SchedulerConfig,
    users: Users,
    shutdown: CancellationToken,
) {
    let mut state = State::new(GrantId::new(now_ms()));
    let page = Page::default();
    let server = config
        .metrics
        .and_then(|address| serve_metrics(address, &page));
    broker
        .supervise(&shutdown, async |connection| {
            session(&connection, &config, &users, &mut state, &page, &shutdown).await
        })
        .await;
    if let Some(server) = server {
        server.unblock();
    }
}

/// The last metrics page, as the server hands it out.
#[derive(Clone)]
struct Page(Arc<Mutex<String>>);

impl Default for Page {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(metrics::STANDBY.to_owned())))
    }
}

impl Page {
    fn set(&self, text: String) {
        if let Ok(mut page) = self.0.lock() {
            *page = text;
        }
    }

    fn get(&self) -> String {
        self.0.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

/// Serves `page` on `address` from a thread of its own; a scrape never
/// waits for the scheduler.
fn serve_metrics(address: std::net::SocketAddr, page: &Page) -> Option<Arc<tiny_http::Server>> {
    let server = match tiny_http::Server::http(address) {
        Ok(server) => Arc::new(server),
        Err(e) => {
            warn!(%address, error = %e, "cannot serve metrics");
            return None;
        }
    };
    info!(%address, "metrics served at /metrics");
    let (serving, page) = (server.clone(), page.clone());
    std::thread::spawn(move || {
        let content_type = tiny_http::Header::from_bytes(
            "Content-Type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
        .ok();
        for request in serving.incoming_requests() {
            let response = if request.url() == "/metrics" {
                let mut response = tiny_http::Response::from_string(page.get());
                if let Some(header) = content_type.clone() {
                    response.add_header(header);
                }
                response
            } else {
                tiny_http::Response::from_string("see /metrics\n").with_status_code(404)
            };
            let _ = request.respond(response);
        }
    });
    Some(server)
}

async fn session(
    connection: &Connection,
    config: &SchedulerConfig,
    users: &Users,
    state: &mut State,
    page: &Page,
    shutdown: &CancellationToken,
) -> Result<(), BrokerError> {
    let mut rendered: Option<Instant> = None;
    let channel = connection.channel().await?;
    topology::declare_core(connection.lapin()).await?;
    topology::declare_scheduler_grid(&channel).await?;
    let publisher = connection.publisher().await?;
    let mut inbox: Inbox<SchedulerMsg> = connection
        .inbox(
            &publisher,
            SCHEDULER_QUEUE,
            ConsumeOptions {
                tag: connection.identity(),
                prefetch: 256,
                exclusive: false,
            },
        )
        .await?;
    // Ended jobs, from the history's start: a standby reads it too, so
    // that it can answer for them the moment it is active.
    let history_channel = connection.channel().await?;
    let mut history: Inbox<Event> = Inbox::read_stream(
        &history_channel,
        publisher.clone(),
        HISTORY_QUEUE,
        ConsumeOptions {
            tag: connection.identity(),
            prefetch: 512,
            exclusive: false,
        },
    )
    .await?;
    info!(scheduler = %connection.identity(), policy = config.state.policy.policy.name(), "scheduler consuming (active once the broker hands it the inbox)");
    let mut clock = RoundClock::new(config.round_interval, config.round_min_gap, Instant::now());
    // Rounds are posted by a task of their own, so that a round of
    // thousands of offers does not keep the inbox waiting.
    let (mail, outbox) = mpsc::channel(4);
    let (gone, mut forgotten) = mpsc::unbounded_channel();
    let mut postman = tokio::spawn(post(publisher.clone(), outbox, gone));
    // Acknowledged together, every `ACK_EVERY` messages or once the inbox is
    // quiet: one ack each costs more than reading the message at grid scale,
    // and an unacked report read again after a crash only repeats news.
    let (mut unacked, mut last) = (0u16, None);
    // The broker hands the inbox to one scheduler at a time: the first
    // message says this one is active. Until then it decides nothing (what
    // it kept from an earlier turn is stale), and when it becomes active it
    // takes over the grid bookkeeping the last active one left.
    let mut active = false;
    let mut handed_over_nothing = false;
    // Users' requests are answered by the active scheduler only: a standby
    // consumes them once it has the inbox.
    let mut requests: Option<Inbox<RequestMsg>> = None;
    loop {
        tokio::select! {
            request = async {
                match requests.as_mut() {
                    Some(inbox) => inbox.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let incoming = match request {
                    Some(Ok(incoming)) => incoming,
                    Some(Err(e)) => return Err(e),
                    None => return Err(BrokerError::NoQueue(REQUESTS_QUEUE.to_owned())),
                };
                answer(&publisher, state, incoming, config, users).await?;
            }
            ended = history.next() => {
                let incoming = match ended {
                    Some(Ok(incoming)) => incoming,
                    Some(Err(e)) => return Err(e),
                    None => return Err(BrokerError::NoQueue(HISTORY_QUEUE.to_owned())),
                };
                let now = Now::read();
                let ended_at = incoming.sent_at.map_or(now.wall_ms, |s| s.saturating_mul(1000));
                if let Some(ended) = EndedJob::of(&incoming.msg, ended_at) {
                    state.on_ended(ended, now, &config.state);
                }
                incoming.ack().await?;
            }
            message = inbox.next() => {
                let incoming = match message {
                    Some(Ok(incoming)) => incoming,
                    Some(Err(e)) => return Err(e),
                    None => return Err(BrokerError::NoQueue(SCHEDULER_QUEUE.to_owned())),
                };
                if !active {
                    active = true;
                    info!(scheduler = %connection.identity(), "scheduler active");
                    if let Some(snapshot) = peek::<GridSnapshot>(&channel, SCHEDULER_GRID_QUEUE).await? {
                        state.restore_grid(snapshot, Now::read());
                    }
                    requests = Some(connection.inbox(&publisher, REQUESTS_QUEUE, ConsumeOptions {
                        tag: connection.identity(),
                        prefetch: 16,
                        exclusive: false,
                    }).await?);
                }
                let now = Instant::now();
                let reaction = state.on_message(incoming.msg.clone(), now, &config.state);
                if reaction == Reaction::Round {
                    clock.hurry(now);
                }
                unacked += 1;
                if unacked >= ACK_EVERY {
                    incoming.ack_up_to_here().await?;
                    (unacked, last) = (0, None);
                } else {
                    last = Some(incoming);
                }
            }
            () = tokio::time::sleep(ACK_IDLE), if last.is_some() => {
                if let Some(incoming) = last.take() {
                    incoming.ack_up_to_here().await?;
                }
                unacked = 0;
            }
            () = tokio::time::sleep_until(clock.next().into()) => {
                let now = Now::read();
                clock.ran(now.instant);
                if !active {
                    continue;
                }
                let actions: Vec<_> = state.round(now.instant, &config.state).into_iter().map(outbox::message).collect();
                if config.metrics.is_some() && rendered.is_none_or(|at| now.instant.duration_since(at) >= METRICS_EVERY) {
                    page.set(metrics::render(&state.status(connection.identity(), now.instant, &config.state)));
                    rendered = Some(now.instant);
                }
                // Handed over after every round that has grid jobs, and
                // once more when the last is gone.
                let grid = state.grid_snapshot(now);
                let empty = grid.placements.is_empty() && grid.reservations.is_empty();
                let grid = (!(empty && handed_over_nothing)).then_some(grid);
                handed_over_nothing = empty;
                if (!actions.is_empty() || grid.is_some()) && mail.send(Post { actions, grid }).await.is_err() {
                    return postman.await.unwrap_or_else(|e| Err(BrokerError::Connect(e.to_string())));
                }
            }
            Some(job) = forgotten.recv() => {
                debug!(job = %job, "job has no control queue any more; forgotten");
                state.on_job_done(&job);
            }
            posted = &mut postman => {
                return posted.unwrap_or_else(|e| Err(BrokerError::Connect(e.to_string())));
            }
            () = shutdown.cancelled() => {
                drop(mail);
                return postman.await.unwrap_or_else(|e| Err(BrokerError::Connect(e.to_string())));
            }
        }
    }
}

/// Answers one user's request and acks it; a cancel goes on to the job's
/// runner first, so that "accepted" means the runner has it.
async fn answer(
    publisher: &Publisher,
    state: &State,
    incoming: Incoming<RequestMsg>,
    config: &SchedulerConfig,
    users: &Users,
) -> Result<(), BrokerError> {
    let user = incoming.user.as_deref();
    // Answers go to the asker's direct reply-to and nowhere else: a user
    // naming any queue as `reply_to` must not have the services post there.
    if !incoming.reply.is_direct() {
        warn!(user, "request without a direct reply-to address; ignored");
        return incoming.ack().await;
    }
    let answered = match state.on_request(
        user,
        incoming.msg.clone(),
        Instant::now(),
        &config.state,
        users,
    ) {
        Answer::Status(mut reply) => {
            reply.scheduler = publisher.identity().to_owned();
            publisher.reply(&incoming.reply, &reply).await
        }
        // Tasks to add are answered by the job's runner, once it has
        // recorded them or refused them: the asker's address goes along.
        Answer::Action(_, Some((job, action @ ControlMsg::AddTasks(_)))) => {
            let control = JobQueues::new(&job).control;
            match publisher
                .deliver_answerable(&control, &action, &incoming.reply)
                .await?
            {
                true => Ok(()),
                false => {
                    publisher
                        .reply(&incoming.reply, &ActionReply::NotRunning {})
                        .await
                }
            }
        }
        Answer::Action(mut reply, action) => {
            if let Some((job, action)) = action
                && !publisher
                    .deliver(&JobQueues::new(&job).control, &action)
                    .await?
            {
                reply = ActionReply::NotRunning {};
            }
            publisher.reply(&incoming.reply, &reply).await
        }
    };
    if let Err(e) = answered {
        warn!(user, error = %e, "cannot answer a request");
    }
    incoming.ack().await
}

/// What a round sends: its decisions, and the grid bookkeeping to hand over.
struct Post {
    actions: Vec<(JobId, ControlMsg)>,
    grid: Option<GridSnapshot>,
}

/// Sends each round's decisions to the jobs' runners, pipelined (a round at
/// grid scale makes thousands of offers), and names the jobs whose control
/// queue is gone. Ends when the session drops `mail`, or at the first
/// broker error.
async fn post(
    publisher: Publisher,
    mut mail: mpsc::Receiver<Post>,
    gone: mpsc::UnboundedSender<JobId>,
) -> Result<(), BrokerError> {
    while let Some(Post {
        actions: round,
        grid,
    }) = mail.recv().await
    {
        for chunk in round.chunks(POST_CHUNK) {
            let letters: Vec<_> = chunk
                .iter()
                .map(|(job, message)| (JobQueues::new(job).control, message.clone()))
                .collect();
            let delivered = publisher.deliver_all(&letters).await?;
            for ((job, _), delivered) in chunk.iter().zip(delivered) {
                if !delivered && gone.send(job.clone()).is_err() {
                    return Ok(());
                }
            }
            if round.len() > POST_CHUNK {
                tokio::time::sleep(POST_PAUSE).await;
            }
        }
        if let Some(grid) = grid {
            publisher.send(SCHEDULER_GRID_QUEUE, &grid).await?;
        }
    }
    Ok(())
}
