//! Connections, and getting them back after the broker went away.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use deadpool_lapin::{Config, Pool, PoolConfig, Runtime, Timeouts};
use lapin::{Channel, ConnectionProperties, options::ConfirmSelectOptions};
use rand::RngExt;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{BrokerError, ConsumeOptions, Inbox, codec::Decode, publish::Publisher};

/// The default broker: a local RabbitMQ with a 10 s heartbeat, so that a dead
/// peer is noticed (and its unacked tasks redelivered) within about 20 s.
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10";

/// How long one broker node may take to accept a connection before the next
/// is tried: a node whose host dropped off the network never answers at all.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A handle on the broker for one component: one or several addresses of
/// the same broker (the nodes of a RabbitMQ cluster), tried in turn. Cheap
/// to clone.
#[derive(Clone)]
pub struct Broker {
    nodes: Arc<[Node]>,
    /// The node that answered last: tried first next time.
    current: Arc<AtomicUsize>,
    identity: Arc<str>,
    /// The broker user of the URLs: stamped as `user_id` on every message,
    /// which the broker checks, so receivers know who sent it.
    user: Arc<str>,
}

/// One address of the broker, with its own connection pool.
struct Node {
    pool: Pool,
    /// The URL without its password.
    url: String,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("identity", &self.identity)
            .field("url", &self.url())
            .finish()
    }
}

impl Broker {
    /// `urls` are addresses of one broker (several for a cluster; at least
    /// one). Each component starts at a random one, so that a cluster's
    /// nodes share the connections, and moves to the next when it fails.
    /// `identity` names the component (`runner@host`); it becomes the
    /// connection name in the management UI and the sender of its messages.
    pub fn new(urls: &[impl AsRef<str>], identity: impl Into<String>) -> Result<Self, BrokerError> {
        let identity: Arc<str> = identity.into().into();
        if urls.is_empty() {
            return Err(BrokerError::Url("no broker URL given".into()));
        }
        let nodes = urls
            .iter()
            .map(|url| Node::new(url.as_ref(), &identity))
            .collect::<Result<Vec<_>, _>>()?;
        let user = nodes[0].1.clone();
        if let Some((_, other)) = nodes.iter().find(|(_, u)| *u != user) {
            return Err(BrokerError::Url(format!(
                "the broker URLs name two users ({user} and {other}); they must be the addresses of one broker for one user"
            )));
        }
        let nodes: Arc<[Node]> = nodes.into_iter().map(|(node, _)| node).collect();
        let first = rand::rng().random_range(0..nodes.len());
        Ok(Self {
            nodes,
            current: Arc::new(AtomicUsize::new(first)),
            identity,
            user,
        })
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The broker user this component connects as.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The URL of the node in use, without its password, for logs and
    /// messages.
    pub fn url(&self) -> &str {
        &self.nodes[self.current.load(Ordering::Relaxed)].url
    }

    /// One connection, to the node that answered last or else to the next
    /// that does; the reason from each node when none does.
    pub async fn connect(&self) -> Result<Connection, BrokerError> {
        let count = self.nodes.len();
        let first = self.current.load(Ordering::Relaxed);
        let mut reasons = Vec::new();
        for k in (0..count).map(|i| (first + i) % count) {
            let node = &self.nodes[k];
            match node.pool.get().await {
                Ok(object) => {
                    if k != first {
                        self.current.store(k, Ordering::Relaxed);
                        info!(component = %self.identity, broker = %node.url, "moved to another broker node");
                    }
                    return Ok(Connection {
                        object,
                        identity: self.identity.clone(),
                        user: self.user.clone(),
                    });
                }
                Err(e) => reasons.push(format!("{}: {e}", node.url)),
            }
        }
        Err(BrokerError::Connect(reasons.join("; ")))
    }

    /// Keeps trying to connect, with backoff, until it works or `shutdown`
    /// fires (then `None`).
    pub async fn connect_until(&self, shutdown: &CancellationToken) -> Option<Connection> {
        let mut backoff = Backoff::default();
        loop {
            match self.connect().await {
                Ok(connection) => {
                    if backoff.failures > 0 {
                        info!(broker = %self.url(), "connected to the broker again");
                    }
                    return Some(connection);
                }
                Err(e) => {
                    warn!(error = %e, retry_in = ?backoff.current, "broker unreachable");
                    if !backoff.wait(shutdown).await {
                        return None;
                    }
                }
            }
        }
    }
}

impl Node {
    /// The node, and the user its URL names.
    fn new(url: &str, identity: &Arc<str>) -> Result<(Self, Arc<str>), BrokerError> {
        let uri = url
            .parse::<lapin::uri::AMQPUri>()
            .map_err(|e| BrokerError::Url(format!("{}: {e}", redact(url))))?;
        let user: Arc<str> = uri.authority.userinfo.username.into();
        let mut pool = PoolConfig::new(64);
        pool.timeouts = Timeouts {
            create: Some(CONNECT_TIMEOUT),
            recycle: Some(CONNECT_TIMEOUT),
            wait: None,
        };
        let config = Config {
            url: Some(url.to_owned()),
            pool: Some(pool),
        };
        let name = identity.clone();
        let pool = config
            .create_pool(
                move || {
                    ConnectionProperties::default().with_connection_name(name.to_string().into())
                },
                Runtime::Tokio1,
            )
            .map_err(|e| BrokerError::Url(e.to_string()))?;
        Ok((
            Self {
                pool,
                url: redact(url),
            },
            user,
        ))
    }
}

impl Broker {
    /// Runs `session` on a live connection, and again on a fresh one (after
    /// a backoff) each time it fails: how every service survives the broker
    /// going away. Returns once a session ends well or `shutdown` fires.
    pub async fn supervise(
        &self,
        shutdown: &CancellationToken,
        mut session: impl AsyncFnMut(Arc<Connection>) -> Result<(), BrokerError>,
    ) {
        let mut backoff = Backoff::default();
        while let Some(connection) = self.connect_until(shutdown).await {
            let connection = Arc::new(connection);
            let started = std::time::Instant::now();
            match session(connection.clone()).await {
                Ok(()) => {
                    connection.close().await;
                    return;
                }
                Err(e) => {
                    warn!(component = %self.identity, error = %e, "lost the broker; reconnecting");
                    // A failed session may have left the connection up:
                    // close it, so that what it held (exclusive queues, job
                    // locks, unacked deliveries) is released, not reused.
                    connection.close().await;
                }
            }
            backoff.after_session(started.elapsed());
            if !backoff.wait(shutdown).await {
                return;
            }
        }
    }
}

/// A live connection.
pub struct Connection {
    object: deadpool_lapin::Object,
    pub(crate) identity: Arc<str>,
    pub(crate) user: Arc<str>,
}

impl Connection {
    /// A new channel; a broker that does not open it in time (a node busy
    /// electing leaders after losing another) counts as lost, so that the
    /// caller reconnects rather than waits for ever.
    pub async fn channel(&self) -> Result<Channel, BrokerError> {
        match tokio::time::timeout(CONNECT_TIMEOUT, self.object.create_channel()).await {
            Ok(channel) => Ok(channel?),
            Err(_) => Err(BrokerError::Connect(format!(
                "no channel opened within {}s",
                CONNECT_TIMEOUT.as_secs()
            ))),
        }
    }

    /// A channel in publisher-confirm mode.
    pub async fn publisher(&self) -> Result<Publisher, BrokerError> {
        let channel = self.channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Publisher::new(
            channel,
            self.identity.clone(),
            self.user.clone(),
        ))
    }

    /// Consumes `queue` on a channel of its own.
    pub async fn inbox<M: Decode>(
        &self,
        publisher: &Publisher,
        queue: &str,
        options: ConsumeOptions<'_>,
    ) -> Result<Inbox<M>, BrokerError> {
        let channel = self.channel().await?;
        Inbox::open(&channel, publisher.clone(), queue, options).await
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The broker user of this connection.
    pub fn user(&self) -> &str {
        &self.user
    }

    pub fn lapin(&self) -> &lapin::Connection {
        &self.object
    }

    /// Whether the connection is still up.
    pub fn is_connected(&self) -> bool {
        self.object.status().connected()
    }

    /// Closes the connection politely (consumers are cancelled, unacked
    /// deliveries return to their queues); a broker that does not answer in
    /// time has the connection dropped instead.
    pub async fn close(&self) {
        let _ = tokio::time::timeout(CONNECT_TIMEOUT, self.object.close(200, "bye".into())).await;
    }
}

/// Exponential backoff with jitter, from 100 ms to 10 s.
#[derive(Debug)]
pub(crate) struct Backoff {
    current: Duration,
    failures: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            current: Self::MIN,
            failures: 0,
        }
    }
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(10);

    /// Sleeps for the current delay (±25 %) and doubles it; `false` if
    /// `shutdown` fired meanwhile.
    pub(crate) async fn wait(&mut self, shutdown: &CancellationToken) -> bool {
        let jitter = rand::rng().random_range(0.75..1.25);
        let delay = self.current.mul_f64(jitter);
        self.current = (self.current * 2).min(Self::MAX);
        self.failures += 1;
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            () = shutdown.cancelled() => false,
        }
    }

    /// A session that lasted a while resets the delay: the next failure is
    /// a new outage, not the same one.
    pub(crate) fn after_session(&mut self, lasted: Duration) {
        if lasted > Duration::from_secs(30) {
            *self = Self::default();
        }
    }
}

/// Whether `url` asks for plain AMQP on 5671, the port of AMQP over TLS:
/// a listener there answers with a TLS alert, or resets the connection.
pub fn plain_to_tls_port(url: &str) -> bool {
    url.parse::<lapin::uri::AMQPUri>()
        .is_ok_and(|uri| uri.scheme == lapin::uri::AMQPScheme::AMQP && uri.authority.port == 5671)
}

/// `amqp://user:secret@host` → `amqp://user:***@host`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact("amqp://host/%2f"), "amqp://host/%2f");
    }

    #[tokio::test]
    async fn bad_urls_are_refused() {
        assert!(matches!(
            Broker::new(&["http://nope"], "t"),
            Err(BrokerError::Url(_))
        ));
        assert!(matches!(
            Broker::new(&["amqp://h/v", "http://nope"], "t"),
            Err(BrokerError::Url(_))
        ));
        assert!(matches!(
            Broker::new(&[] as &[&str], "t"),
            Err(BrokerError::Url(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_grows_and_stops_at_shutdown() {
        let shutdown = CancellationToken::new();
        let mut backoff = Backoff::default();
        for _ in 0..10 {
            assert!(backoff.wait(&shutdown).await);
        }
        assert_eq!(backoff.current, Backoff::MAX);
        backoff.after_session(Duration::from_secs(60));
        assert_eq!(backoff.current, Backoff::MIN);
        shutdown.cancel();
        assert!(!backoff.wait(&shutdown).await);
    }
}
