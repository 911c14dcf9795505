//! Errors of the AMQP plumbing, classified by what a caller should do next.

use lapin::{ErrorKind, protocol::AMQPSoftError};

#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    #[error("invalid broker URL: {0}")]
    Url(String),
    #[error("cannot reach the broker: {0}")]
    Connect(String),
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("the broker refused the message for {0} (nack)")]
    Nacked(String),
    #[error("no queue {0}")]
    NoQueue(String),
    #[error("cannot encode message: {0}")]
    Encode(String),
    /// A queue, exchange or routing key longer than AMQP's 255 bytes:
    /// refused here, where the client library would panic.
    #[error("name too long for AMQP ({} bytes): {}…", .0.len(), .0.chars().take(60).collect::<String>())]
    NameTooLong(String),
}

/// `name` as AMQP's short string, or the error that it is too long.
pub(crate) fn short(name: &str) -> Result<lapin::types::ShortString, BrokerError> {
    lapin::types::ShortString::try_new(name).map_err(|_| BrokerError::NameTooLong(name.to_owned()))
}

impl BrokerError {
    /// The queue or exchange named in the operation does not exist (any more).
    pub fn is_not_found(&self) -> bool {
        match self {
            Self::NoQueue(_) => true,
            Self::Amqp(e) => is_not_found(e),
            _ => false,
        }
    }

    /// A declaration differs from what the broker has (a queue declared
    /// with other arguments by an older gleaner).
    pub fn is_precondition_failed(&self) -> bool {
        matches!(self, Self::Amqp(e) if soft_error(e).is_some_and(|s| matches!(s, AMQPSoftError::PRECONDITIONFAILED)))
    }

    /// The broker's permissions do not let this user do it.
    pub fn is_access_refused(&self) -> bool {
        matches!(self, Self::Amqp(e) if soft_error(e).is_some_and(|s| matches!(s, AMQPSoftError::ACCESSREFUSED)))
    }
}

fn soft_error(e: &lapin::Error) -> Option<AMQPSoftError> {
    match e.kind() {
        ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            lapin::protocol::AMQPErrorKind::Soft(soft) => Some(soft.clone()),
            lapin::protocol::AMQPErrorKind::Hard(_) => None,
        },
        _ => None,
    }
}

pub(crate) fn is_not_found(e: &lapin::Error) -> bool {
    soft_error(e).is_some_and(|s| matches!(s, AMQPSoftError::NOTFOUND))
}

pub(crate) fn is_locked(e: &lapin::Error) -> bool {
    soft_error(e).is_some_and(|s| matches!(s, AMQPSoftError::RESOURCELOCKED))
}
