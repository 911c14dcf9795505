//! The scheduler: one active instance (others wait as hot standbys on the
//! single-active-consumer inbox), holding the picture of clusters and jobs
//! and deciding who gets idle slots.
//!
//! The policies (crate `gleaner-policy`) are pure and decide; [`state`]
//! keeps the picture and the promises in flight; this module only moves
//! messages.

mod grid;
pub mod outbox;
pub mod state;

pub use grid::GridConfig;

use std::time::{Duration, Instant};

use gleaner_broker::{
    Broker, BrokerError, Connection, ConsumeOptions, Inbox, Publisher,
    topology::{self, JobQueues, SCHEDULER_QUEUE},
};
use gleaner_protocol::{GrantId, SchedulerMsg, now_ms};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::state::{Reaction, State, StateConfig};

/// `[scheduler]` of the configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedulerConfig {
    #[serde(flatten)]
    pub state: StateConfig,
    /// How often a round runs even without news.
    #[serde(with = "humantime_serde")]
    pub round_interval: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            state: StateConfig::default(),
            round_interval: Duration::from_secs(1),
        }
    }
}

/// Serves `gleaner.scheduler` until `shutdown`, reconnecting after outages.
pub async fn run(broker: Broker, config: SchedulerConfig, shutdown: CancellationToken) {
    let mut state = State::new(GrantId::new(now_ms()));
    broker
        .supervise(&shutdown, async |connection| {
            session(&connection, &config, &mut state, &shutdown).await
        })
        .await;
}

async fn session(
    connection: &Connection,
    config: &SchedulerConfig,
    state: &mut State,
    shutdown: &CancellationToken,
) -> Result<(), BrokerError> {
    let channel = connection.channel().await?;
    topology::declare_core(&channel).await?;
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
    info!(scheduler = %connection.identity(), policy = config.state.policy.policy.name(), "scheduler consuming (active once the broker hands it the inbox)");
    let mut rounds = tokio::time::interval(config.round_interval);
    rounds.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = inbox.next() => {
                let incoming = match message {
                    Some(Ok(incoming)) => incoming,
                    Some(Err(e)) => return Err(e),
                    None => return Err(BrokerError::NoQueue(SCHEDULER_QUEUE.to_owned())),
                };
                let now = Instant::now();
                let reaction = state.on_message(incoming.msg.clone(), now, &config.state);
                if reaction == Reaction::Status {
                    let reply = state.status(connection.identity(), now, &config.state);
                    if let Err(e) = publisher.reply(&incoming.reply, &reply).await {
                        warn!(error = %e, "cannot answer a status request");
                    }
                }
                incoming.ack().await?;
                if reaction == Reaction::Round {
                    round(state, config, &publisher).await?;
                }
            }
            _ = rounds.tick() => round(state, config, &publisher).await?,
            () = shutdown.cancelled() => return Ok(()),
        }
    }
}

/// Runs the policy and sends its decisions to the jobs' runners.
async fn round(
    state: &mut State,
    config: &SchedulerConfig,
    publisher: &Publisher,
) -> Result<(), BrokerError> {
    for action in state.round(Instant::now(), &config.state) {
        let (job, message) = outbox::message(action);
        if !publisher
            .deliver(&JobQueues::new(&job).control, &message)
            .await?
        {
            debug!(job = %job, "job has no control queue any more; forgotten");
            state.on_job_done(&job);
        }
    }
    Ok(())
}
