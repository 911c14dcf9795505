//! gleaner's AMQP plumbing.
//!
//! This is the only crate that speaks AMQP. The rest of gleaner sees typed
//! messages (`gleaner-protocol`), named queues ([`topology`]), a [`Publisher`] that
//! returns once the broker has a message, and an [`Inbox`] that hands out
//! decoded deliveries and dead-letters the ones that do not decode.

pub mod admin;
pub mod codec;
mod connection;
mod consume;
mod error;
mod publish;
mod submission;
pub mod topology;
mod watch;

pub use connection::{Broker, Connection, DEFAULT_URL, plain_to_tls_port, redact};
pub use consume::{ConsumeOptions, Inbox, Incoming, Receipt, peek, take_all};
pub use error::BrokerError;
/// Channels are handed between the broker crate's functions; callers only
/// hold them.
pub use lapin::Channel;
pub use publish::{Publisher, Reply};
pub use submission::{IncomingSubmission, Raw};
pub use watch::Conversation;

/// Sleeps until a core's next wake-up ([`gleaner_protocol::Core::poll_timeout`]),
/// or for ever when it has none: the only clock a service's shell keeps.
pub async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}
