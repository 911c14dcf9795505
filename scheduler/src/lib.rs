//! The scheduler: one active instance (others wait as hot standbys on the
//! single-active-consumer inbox), holding the picture of clusters and jobs
//! and deciding who gets idle slots.
//!
//! The policies (crate `gleaner-policy`) are pure and decide; the core
//! (crate `gleaner-scheduler-core`) keeps the picture and the promises in
//! flight; this crate only moves messages and serves the metrics page.

pub use gleaner_scheduler_core::{GridConfig, SchedulerConfig, core, io, metrics, outbox, state};

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use gleaner_broker::{
    Broker, BrokerError, Channel, Connection, ConsumeOptions, Inbox, Incoming, Publisher, peek,
    sleep_until,
    topology::{
        self, HISTORY_QUEUE, JobQueues, REQUESTS_QUEUE, SCHEDULER_GRID_QUEUE, SCHEDULER_QUEUE,
    },
};
use gleaner_manifest::JobId;
use gleaner_policy::access::Users;
use gleaner_protocol::{
    ControlMsg, Core, Event, GrantId, GridSnapshot, Message, Now, RequestMsg, SchedulerMsg, codec,
    now_ms,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    core::{Event as CoreEvent, Post, Reply, SchedulerCore},
    io::Io,
    state::State,
};

/// Inbox messages acknowledged at once under load.
const ACK_EVERY: u16 = 64;
/// How long a quiet inbox keeps its last messages unacknowledged.
const ACK_IDLE: Duration = Duration::from_millis(5);

/// Serves `gleaner.scheduler`, and users' requests on `gleaner.requests`,
/// until `shutdown`, reconnecting after outages.
pub async fn run(
    broker: Broker,
    config: SchedulerConfig,
    users: Users,
    shutdown: CancellationToken,
) {
    let page = Page::default();
    let server = config
        .metrics
        .and_then(|address| serve_metrics(address, &page));
    let mut core = SchedulerCore::new(
        State::new(GrantId::new(now_ms())),
        config.state.clone(),
        users,
        String::new(),
        config.rounds(),
        server.is_some(),
        Instant::now(),
    );
    broker
        .supervise(&shutdown, async |connection| {
            session(&connection, &config, &mut core, &page, &shutdown).await
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
    core: &mut SchedulerCore,
    page: &Page,
    shutdown: &CancellationToken,
) -> Result<(), BrokerError> {
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
    core.reconnected(connection.identity(), Instant::now());
    // Rounds are posted by a task of their own, so that a round of
    // thousands of offers does not keep the inbox waiting.
    let (mail, outbox) = mpsc::channel(4);
    let (gone, mut forgotten) = mpsc::unbounded_channel();
    let mut postman = tokio::spawn(post(publisher.clone(), outbox, gone));
    let mut shell = Shell {
        connection,
        channel: &channel,
        publisher: &publisher,
        page,
        mail,
        requests: None,
    };
    // Acknowledged together, every `ACK_EVERY` messages or once the inbox is
    // quiet: one ack each costs more than reading the message at grid scale,
    // and an unacked report read again after a crash only repeats news.
    let (mut unacked, mut last) = (0u16, None);
    loop {
        tokio::select! {
            request = async {
                match shell.requests.as_mut() {
                    Some(inbox) => inbox.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let incoming = match request {
                    Some(Ok(incoming)) => incoming,
                    Some(Err(e)) => return Err(e),
                    None => return Err(BrokerError::NoQueue(REQUESTS_QUEUE.to_owned())),
                };
                let event = CoreEvent::Request {
                    user: incoming.user.clone(),
                    request: incoming.msg.clone(),
                    direct: incoming.reply.is_direct(),
                };
                if !shell.handle(core, event, Some(&incoming)).await? {
                    return postman.await.unwrap_or_else(|e| Err(BrokerError::Connect(e.to_string())));
                }
                incoming.ack().await?;
            }
            ended = history.next() => {
                let incoming = match ended {
                    Some(Ok(incoming)) => incoming,
                    Some(Err(e)) => return Err(e),
                    None => return Err(BrokerError::NoQueue(HISTORY_QUEUE.to_owned())),
                };
                let event = CoreEvent::History { event: incoming.msg.clone(), sent_at: incoming.sent_at };
                shell.handle(core, event, None).await?;
                incoming.ack().await?;
            }
            message = inbox.next() => {
                let incoming = match message {
                    Some(Ok(incoming)) => incoming,
                    Some(Err(e)) => return Err(e),
                    None => return Err(BrokerError::NoQueue(SCHEDULER_QUEUE.to_owned())),
                };
                shell.handle(core, CoreEvent::Message(incoming.msg.clone()), None).await?;
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
            () = sleep_until(core.poll_timeout()) => {
                core.handle_timeout(Now::read());
                if !shell.carry_out(core, None).await? {
                    return postman.await.unwrap_or_else(|e| Err(BrokerError::Connect(e.to_string())));
                }
            }
            Some(job) = forgotten.recv() => {
                debug!(job = %job, "job has no control queue any more; forgotten");
                shell.handle(core, CoreEvent::Gone(job), None).await?;
            }
            posted = &mut postman => {
                return posted.unwrap_or_else(|e| Err(BrokerError::Connect(e.to_string())));
            }
            () = shutdown.cancelled() => {
                drop(shell);
                return postman.await.unwrap_or_else(|e| Err(BrokerError::Connect(e.to_string())));
            }
        }
    }
}

/// What the scheduler's effects reach: the broker, the metrics page, and
/// the postman that sends rounds.
struct Shell<'a> {
    connection: &'a Connection,
    channel: &'a Channel,
    publisher: &'a Publisher,
    page: &'a Page,
    mail: mpsc::Sender<Post>,
    /// Users' requests, taken by the active scheduler only.
    requests: Option<Inbox<RequestMsg>>,
}

impl Shell<'_> {
    /// Hands `event` to the core and carries out its effects; `false` when
    /// the postman has stopped (its error ends the session).
    async fn handle(
        &mut self,
        core: &mut SchedulerCore,
        event: CoreEvent,
        request: Option<&Incoming<RequestMsg>>,
    ) -> Result<bool, BrokerError> {
        core.handle(event, Now::read());
        self.carry_out(core, request).await
    }

    /// Carries out the core's effects, handing it their answers; `false`
    /// once the postman is gone (the session is over).
    async fn carry_out(
        &mut self,
        core: &mut SchedulerCore,
        request: Option<&Incoming<RequestMsg>>,
    ) -> Result<bool, BrokerError> {
        let mut io = ShellIo {
            shell: self,
            request,
        };
        io::carry_out(core, &mut io).await
    }
}

/// The shell as the core's effects reach it, with the request being
/// handled (if any), which replies and answerable orders go back to.
struct ShellIo<'s, 'a, 'r> {
    shell: &'s mut Shell<'a>,
    request: Option<&'r Incoming<RequestMsg>>,
}

impl Io for ShellIo<'_, '_, '_> {
    type Error = BrokerError;

    fn now(&self) -> Now {
        Now::read()
    }

    async fn take_over(&mut self) -> Result<Option<GridSnapshot>, BrokerError> {
        let shell = &mut *self.shell;
        let snapshot = peek::<GridSnapshot>(shell.channel, SCHEDULER_GRID_QUEUE).await?;
        shell.requests = Some(
            shell
                .connection
                .inbox(
                    shell.publisher,
                    REQUESTS_QUEUE,
                    ConsumeOptions {
                        tag: shell.connection.identity(),
                        prefetch: 16,
                        exclusive: false,
                    },
                )
                .await?,
        );
        Ok(snapshot)
    }

    async fn reply(&mut self, reply: Reply) {
        if let Some(incoming) = self.request {
            let to = &incoming.reply;
            let replied = match reply {
                Reply::Status(reply) => self.shell.publisher.reply(to, &*reply).await,
                Reply::Action(reply) => self.shell.publisher.reply(to, &reply).await,
            };
            if let Err(e) = replied {
                warn!(user = incoming.user.as_deref(), error = %e, "cannot answer a request");
            }
        }
    }

    async fn forward(
        &mut self,
        job: &JobId,
        msg: ControlMsg,
        answerable: bool,
    ) -> Result<Result<bool, String>, BrokerError> {
        let control = JobQueues::new(job).control;
        let publisher = self.shell.publisher;
        let arrived = match (answerable, self.request) {
            (true, Some(incoming)) => {
                publisher
                    .deliver_answerable(&control, &msg, &incoming.reply)
                    .await
            }
            _ => publisher.deliver(&control, &msg).await,
        };
        // Too big is the asker's to hear, not the session's end.
        match arrived {
            Ok(arrived) => Ok(Ok(arrived)),
            Err(e) if e.is_too_big() => {
                warn!(job = %job, error = %e, "an order too big to pass on");
                Ok(Err(e.to_string()))
            }
            Err(e) => Err(e),
        }
    }

    /// To the postman, who names gone jobs as it finds them.
    async fn post(&mut self, post: Post) -> Option<Vec<JobId>> {
        self.shell.mail.send(post).await.ok().map(|()| Vec::new())
    }

    fn metrics(&mut self, text: String) {
        self.shell.page.set(text);
    }
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
        for (chunk, pause) in outbox::paced(&round) {
            // One decision too big to send (a placement of a job of very
            // many components) is left out, not the end of the session.
            let chunk: Vec<&(JobId, _)> = chunk
                .iter()
                .filter(|(job, message)| match codec::fits(message) {
                    Ok(()) => true,
                    Err(bytes) => {
                        warn!(job = %job, kind = message.kind(), bytes, "a decision too big to send; left out");
                        false
                    }
                })
                .collect();
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
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
        }
        if let Some(grid) = grid {
            match publisher.send(SCHEDULER_GRID_QUEUE, &grid).await {
                Err(e) if e.is_too_big() => {
                    warn!(error = %e, "the grid bookkeeping is too big to hand over");
                }
                sent => sent?,
            }
        }
    }
    Ok(())
}
