//! Queue and exchange names, and their declarations.
//!
//! Declarations are idempotent but must always carry the same arguments
//! (RabbitMQ refuses a redeclaration that differs), so every queue is declared
//! from exactly one function here.

use gleaner_manifest::JobId;
use gleaner_protocol::{ClusterName, LauncherId};

use crate::BrokerError;

type Result<T> = std::result::Result<T, BrokerError>;
use lapin::{
    Channel, ExchangeKind,
    options::{
        ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
        QueuePurgeOptions,
    },
    types::{AMQPValue, FieldTable},
};

pub const SUBMIT_QUEUE: &str = "gleaner.submit";
pub const SCHEDULER_QUEUE: &str = "gleaner.scheduler";
/// The active scheduler's grid bookkeeping, for the one that takes over.
pub const SCHEDULER_GRID_QUEUE: &str = "gleaner.scheduler.grid";
pub const EVENTS_EXCHANGE: &str = "gleaner.events";
pub const DEAD_QUEUE: &str = "gleaner.dead";
/// Users' requests (status, cancel), for the active scheduler.
pub const REQUESTS_QUEUE: &str = "gleaner.requests";
/// Every ended job's last report and every refused submission (a stream:
/// read from its start by the scheduler, which answers for ended jobs from
/// it; users never reach it).
pub const HISTORY_QUEUE: &str = "gleaner.history";
/// The bytes of reports the history keeps (tens of thousands of jobs);
/// older ones are dropped a segment at a time.
pub const HISTORY_BYTES: i64 = 64 << 20;
/// Where users publish: a direct exchange routing [`SUBMIT_KEY`] to
/// `gleaner.submit` and [`REQUEST_KEY`] to `gleaner.requests`. Users get
/// write permission on it, never on the default exchange (which reaches
/// every queue).
pub const USER_EXCHANGE: &str = "gleaner.user";
pub const SUBMIT_KEY: &str = "submit";
pub const REQUEST_KEY: &str = "request";
/// A submission's route.
pub const SUBMIT: (&str, &str) = (USER_EXCHANGE, SUBMIT_KEY);
/// A request's route.
pub const REQUEST: (&str, &str) = (USER_EXCHANGE, REQUEST_KEY);

/// A `--wait` client's queue of one job's events. It carries the owner, so
/// that a user's permissions can name their own watch queues.
pub fn watch_queue(owner: &str, job: &JobId) -> String {
    watch_queue_for(owner, job.as_str())
}

/// A watch queue of `owner`'s, for `what` (a job, or a view of many).
pub fn watch_queue_for(owner: &str, what: &str) -> String {
    format!("gleaner.watch.{owner}.{what}")
}

/// How many times a task may be handed out without being acked (its
/// launcher died, or the broker took back a delivery to a consumer just
/// cancelled) before it is dead-lettered, for its runner to judge lost or
/// not. Preemption does not count: a preempted launcher republishes the
/// task and acks the original.
pub const TASK_DELIVERY_LIMIT: i64 = 4;

/// How many times a service's message may come back unacked (its
/// consumer's channel or connection died holding it) before the broker
/// dead-letters it to `gleaner.dead`: a message that ends its consumer's
/// session every time it is read stops there instead of taking the service
/// down again and again. A quorum queue counts every return, and a session
/// holds hundreds of messages unacked, so the limit leaves room for the
/// restarts a broker failover causes.
pub const SERVICE_DELIVERY_LIMIT: i64 = 20;
/// The same for `gleaner.submit`, whose messages are held unacked for as
/// long as their job runs (a long job outlives more runner restarts).
pub const SUBMIT_DELIVERY_LIMIT: i64 = 50;

pub fn kcm_queue(cluster: &ClusterName) -> String {
    format!("gleaner.kcm.{cluster}")
}

/// A launcher's own inbox. It carries the job, so that a job's launcher
/// account may be allowed its own launchers' queues and no others; `:`,
/// which no job id has, ends the job's part (`a-0000000000000000` is not a prefix
/// of `a-0000000000000000.b-111111`'s).
pub fn launcher_queue(job: &JobId, launcher: &LauncherId) -> String {
    format!("gleaner.launcher.{job}:{launcher}")
}

/// The queues of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobQueues {
    pub job: JobId,
    pub control: String,
    pub tasks: String,
    pub results: String,
    pub dead: String,
    /// Exclusive to the connection of the runner that runs the job: a
    /// broker-kept lock, released when that runner's connection dies.
    pub lock: String,
    /// Whose the job id is ([`JobClaim`](gleaner_protocol::JobClaim)),
    /// kept as long as the job: what a runner compares before it takes
    /// the job over.
    pub claim: String,
    /// The job's direct exchange, routing [`JobQueues::to_control`],
    /// [`JobQueues::to_tasks`] and [`JobQueues::to_results`] to their
    /// queues: how launchers publish, so that a job's launcher account
    /// needs write permission on this one exchange only.
    pub exchange: String,
}

impl JobQueues {
    pub fn new(job: &JobId) -> Self {
        let base = format!("gleaner.job.{job}");
        Self {
            job: job.clone(),
            control: format!("{base}.control"),
            tasks: format!("{base}.tasks"),
            results: format!("{base}.results"),
            dead: format!("{base}.dead"),
            lock: format!("{base}.runner"),
            claim: format!("{base}.owner"),
            exchange: base,
        }
    }

    pub fn to_control(&self) -> (&str, &str) {
        (&self.exchange, "control")
    }

    pub fn to_tasks(&self) -> (&str, &str) {
        (&self.exchange, "tasks")
    }

    pub fn to_results(&self) -> (&str, &str) {
        (&self.exchange, "results")
    }
}

struct Args(FieldTable);

impl Args {
    fn quorum() -> Self {
        let mut table = FieldTable::default();
        table.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        Self(table)
    }

    /// An append-only log that consumers read from an offset without
    /// taking anything out; bounded by bytes, in segments of `segment`.
    fn stream(bytes: i64, segment: i64) -> Self {
        let mut table = FieldTable::default();
        table.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("stream".into()),
        );
        table.insert("x-max-length-bytes".into(), AMQPValue::LongLongInt(bytes));
        table.insert(
            "x-stream-max-segment-size-bytes".into(),
            AMQPValue::LongLongInt(segment),
        );
        Self(table)
    }

    fn dead_letter_to(mut self, queue: &str) -> Self {
        self.0.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        self.0.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(queue.into()),
        );
        self
    }

    fn single_active_consumer(mut self) -> Self {
        self.0
            .insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        self
    }

    /// Deleted once unused (no consumer, no redeclaration) this long.
    fn expires(mut self, after: std::time::Duration) -> Self {
        let ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX).max(1);
        self.0
            .insert("x-expires".into(), AMQPValue::LongLongInt(ms));
        self
    }

    /// Holds this many messages at most; a new one pushes the oldest out.
    fn max_length(mut self, messages: i64) -> Self {
        self.0
            .insert("x-max-length".into(), AMQPValue::LongLongInt(messages));
        self
    }

    /// Holds this many bytes at most; a new message pushes the oldest out.
    fn max_length_bytes(mut self, bytes: i64) -> Self {
        self.0
            .insert("x-max-length-bytes".into(), AMQPValue::LongLongInt(bytes));
        self
    }

    fn delivery_limit(mut self, limit: i64) -> Self {
        self.0
            .insert("x-delivery-limit".into(), AMQPValue::LongLongInt(limit));
        self
    }
}

async fn durable(channel: &Channel, name: &str, args: Args) -> Result<()> {
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel.queue_declare(name.into(), options, args.0).await?;
    Ok(())
}

/// A client's own queue of events (`gleaner submit --wait`): a quorum
/// queue, so that it outlives a lost connection, a broker restart and the
/// loss of a broker node, and deleted by the broker once nobody has used it
/// for `expires`.
pub async fn declare_watch(
    channel: &Channel,
    name: &str,
    pattern: &str,
    expires: std::time::Duration,
) -> Result<()> {
    durable(channel, name, Args::quorum().expires(expires)).await?;
    channel
        .queue_bind(
            name.into(),
            EVENTS_EXCHANGE.into(),
            pattern.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok(())
}

/// The most messages `gleaner.dead` keeps; a new one pushes the oldest
/// out, so that nobody can fill the broker by sending what cannot be read.
pub const DEAD_LIMIT: i64 = 10_000;
/// The most bytes it keeps, likewise.
pub const DEAD_LIMIT_BYTES: i64 = 256 << 20;

/// A bounded queue (`gleaner.dead`, `gleaner.history`, the services'
/// inboxes with their delivery limits). One declared
/// otherwise, by an older gleaner, is kept as it is, with a warning
/// (`kept`): redeclaring it differently would fail every service's start.
/// Uses a throwaway channel, because a refused declaration closes the
/// channel it was made on.
async fn declare_bounded(
    connection: &lapin::Connection,
    queue: &str,
    args: Args,
    kept: &str,
) -> Result<()> {
    let channel = connection.create_channel().await?;
    match durable(&channel, queue, args).await {
        Err(e) if e.is_precondition_failed() => {
            tracing::warn!(
                queue,
                "declared otherwise by an older gleaner: {kept} until it is deleted (rabbitmqctl delete_queue {queue})"
            );
            Ok(())
        }
        declared => {
            let _ = channel.close(200, "done".into()).await;
            declared
        }
    }
}

/// The queues and exchange every component relies on.
pub async fn declare_core(connection: &lapin::Connection) -> Result<()> {
    let dead = Args::quorum()
        .max_length(DEAD_LIMIT)
        .max_length_bytes(DEAD_LIMIT_BYTES);
    declare_bounded(connection, DEAD_QUEUE, dead, "it stays unbounded").await?;
    let history = Args::stream(HISTORY_BYTES, HISTORY_BYTES / 16);
    declare_bounded(
        connection,
        HISTORY_QUEUE,
        history,
        "it keeps its own bounds",
    )
    .await?;
    let channel = connection.create_channel().await?;
    let declared = declare_routes(connection, &channel).await;
    let _ = channel.close(200, "done".into()).await;
    declared
}

/// What [`declare_core`] declares beside the bounded queues.
async fn declare_routes(connection: &lapin::Connection, channel: &Channel) -> Result<()> {
    let limited = "it keeps no delivery limit";
    declare_bounded(
        connection,
        SUBMIT_QUEUE,
        Args::quorum()
            .delivery_limit(SUBMIT_DELIVERY_LIMIT)
            .dead_letter_to(DEAD_QUEUE),
        limited,
    )
    .await?;
    for queue in [SCHEDULER_QUEUE, REQUESTS_QUEUE] {
        declare_bounded(connection, queue, service_inbox(), limited).await?;
    }
    let exchange = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            EVENTS_EXCHANGE.into(),
            ExchangeKind::Topic,
            exchange,
            FieldTable::default(),
        )
        .await?;
    channel
        .exchange_declare(
            USER_EXCHANGE.into(),
            ExchangeKind::Direct,
            exchange,
            FieldTable::default(),
        )
        .await?;
    // A job's `done` and `rejected` events, whatever its owner and name (a
    // name may hold dots; the event's word is always the last).
    for event in ["job.#.done", "job.#.rejected"] {
        channel
            .queue_bind(
                HISTORY_QUEUE.into(),
                EVENTS_EXCHANGE.into(),
                event.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    for (queue, key) in [(SUBMIT_QUEUE, SUBMIT_KEY), (REQUESTS_QUEUE, REQUEST_KEY)] {
        channel
            .queue_bind(
                queue.into(),
                USER_EXCHANGE.into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    Ok(())
}

/// [`declare_core`] where the user may (the services' account, a single
/// user); a user without configure permission relies on the services
/// having declared it, which is not an error. Uses a throwaway channel,
/// because a refusal closes the channel it was made on.
pub async fn declare_core_if_allowed(connection: &lapin::Connection) -> Result<()> {
    match declare_core(connection).await {
        Err(e) if e.is_access_refused() => Ok(()),
        declared => declared,
    }
}

/// The scheduler's handover queue: only the latest snapshot is worth
/// anything, so it keeps one.
pub async fn declare_scheduler_grid(channel: &Channel) -> Result<()> {
    durable(channel, SCHEDULER_GRID_QUEUE, Args::quorum().max_length(1)).await
}

/// A service's inbox: one consumer at a time (a standby waits), a delivery
/// limit, and what cannot be read to `gleaner.dead`.
fn service_inbox() -> Args {
    Args::quorum()
        .single_active_consumer()
        .delivery_limit(SERVICE_DELIVERY_LIMIT)
        .dead_letter_to(DEAD_QUEUE)
}

/// A cluster manager's inbox ([`service_inbox`]).
pub async fn declare_kcm(connection: &lapin::Connection, cluster: &ClusterName) -> Result<()> {
    declare_bounded(
        connection,
        &kcm_queue(cluster),
        service_inbox(),
        "it keeps no delivery limit",
    )
    .await
}

/// The queues of one job. Only its runner (and `gleaner cancel`, for the
/// control queue) declares them; launchers just consume, so a job that ended
/// cannot be revived by a late launcher.
pub async fn declare_job(channel: &Channel, queues: &JobQueues) -> Result<()> {
    declare_job_control(channel, queues).await?;
    durable(channel, &queues.dead, Args::quorum()).await?;
    durable(
        channel,
        &queues.tasks,
        Args::quorum()
            .delivery_limit(TASK_DELIVERY_LIMIT)
            .dead_letter_to(&queues.dead),
    )
    .await?;
    durable(
        channel,
        &queues.results,
        Args::quorum()
            .delivery_limit(SERVICE_DELIVERY_LIMIT)
            .dead_letter_to(DEAD_QUEUE),
    )
    .await?;
    channel
        .exchange_declare(
            queues.exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    for ((_, key), queue) in [
        (queues.to_control(), &queues.control),
        (queues.to_tasks(), &queues.tasks),
        (queues.to_results(), &queues.results),
    ] {
        channel
            .queue_bind(
                queue.as_str().into(),
                queues.exchange.as_str().into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    Ok(())
}

pub async fn declare_job_control(channel: &Channel, queues: &JobQueues) -> Result<()> {
    durable(
        channel,
        &queues.control,
        Args::quorum()
            .delivery_limit(SERVICE_DELIVERY_LIMIT)
            .dead_letter_to(DEAD_QUEUE),
    )
    .await
}

/// Deletes the task queue first: that cancels every launcher's consumer, which
/// is how launchers learn that their job is over.
pub async fn delete_job(channel: &Channel, queues: &JobQueues) -> Result<()> {
    for queue in [
        &queues.tasks,
        &queues.results,
        &queues.dead,
        &queues.control,
        &queues.claim,
        &queues.lock,
    ] {
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    channel
        .exchange_delete(
            queues.exchange.as_str().into(),
            lapin::options::ExchangeDeleteOptions::default(),
        )
        .await?;
    Ok(())
}

/// Drops every ready message of a queue.
pub async fn purge(channel: &Channel, queue: &str) -> Result<u32> {
    Ok(channel
        .queue_purge(queue.into(), QueuePurgeOptions::default())
        .await?)
}

/// Takes the job's ownership lock for this connection; `false` if another
/// runner holds it. Uses a throwaway channel, because a refused exclusive
/// declaration closes the channel it was made on.
pub async fn lock_job(connection: &lapin::Connection, queues: &JobQueues) -> Result<bool> {
    let channel = connection.create_channel().await?;
    let options = QueueDeclareOptions {
        exclusive: true,
        auto_delete: true,
        ..QueueDeclareOptions::default()
    };
    match channel
        .queue_declare(queues.lock.as_str().into(), options, FieldTable::default())
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if crate::error::is_locked(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Gives the job's lock up (a runner that may not run the job), so that
/// the runner whose job it is can take it at once.
pub async fn unlock_job(channel: &Channel, queues: &JobQueues) -> Result<()> {
    channel
        .queue_delete(queues.lock.as_str().into(), QueueDeleteOptions::default())
        .await?;
    Ok(())
}

/// Deletes the job's claim, then gives its lock up: the job was refused
/// after its claim was staked, and the id names nothing again.
pub async fn forget_claim(channel: &Channel, queues: &JobQueues) -> Result<()> {
    channel
        .queue_delete(queues.claim.as_str().into(), QueueDeleteOptions::default())
        .await?;
    unlock_job(channel, queues).await
}

/// The job's claim: one message, its owner's. Declared by the lock holder
/// only; a runner waiting for the lock just reads it.
pub async fn declare_claim(channel: &Channel, queues: &JobQueues) -> Result<()> {
    durable(channel, &queues.claim, Args::quorum().max_length(1)).await
}

/// A launcher's own inbox: it lives and dies with the launcher's connection.
pub async fn declare_launcher(
    channel: &Channel,
    job: &JobId,
    launcher: &LauncherId,
) -> Result<String> {
    let name = launcher_queue(job, launcher);
    let options = QueueDeclareOptions {
        exclusive: true,
        auto_delete: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(name.as_str().into(), options, FieldTable::default())
        .await?;
    Ok(name)
}

/// Whether a queue exists. Uses a throwaway channel, because a passive
/// declaration of a missing queue closes the channel it was made on.
pub async fn queue_exists(connection: &lapin::Connection, queue: &str) -> Result<bool> {
    let channel = connection.create_channel().await?;
    let options = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    match channel
        .queue_declare(queue.into(), options, FieldTable::default())
        .await
    {
        Ok(_) => {
            channel.close(200, "done".into()).await?;
            Ok(true)
        }
        Err(e) if crate::error::is_not_found(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_contract() {
        let job: JobId = "sweep-3fa9c2d41e07b5a8".parse().unwrap();
        let q = JobQueues::new(&job);
        assert_eq!(q.tasks, "gleaner.job.sweep-3fa9c2d41e07b5a8.tasks");
        assert_eq!(q.control, "gleaner.job.sweep-3fa9c2d41e07b5a8.control");
        assert_eq!(q.results, "gleaner.job.sweep-3fa9c2d41e07b5a8.results");
        assert_eq!(q.dead, "gleaner.job.sweep-3fa9c2d41e07b5a8.dead");
        assert_eq!(kcm_queue(&"c1".into()), "gleaner.kcm.c1");
        assert_eq!(
            launcher_queue(&job, &"c1-h-1".into()),
            "gleaner.launcher.sweep-3fa9c2d41e07b5a8:c1-h-1"
        );
        assert_eq!(
            q.to_results(),
            ("gleaner.job.sweep-3fa9c2d41e07b5a8", "results")
        );
    }
}
