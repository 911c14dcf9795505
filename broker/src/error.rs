//! Errors of the AMQP plumbing, classified by what a caller should do next.

use gleaner_protocol::MAX_MESSAGE_BYTES;
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
    /// A message over [`MAX_MESSAGE_BYTES`], refused before it is sent: its
    /// content is the sender's to bound (a user's job fails with this, the
    /// service goes on).
    #[error("a {kind} message of {:.1} MiB is more than the {} MiB a message may hold", *.bytes as f64 / f64::from(1 << 20), MAX_MESSAGE_BYTES >> 20)]
    TooBig { kind: &'static str, bytes: usize },
}

/// A body of `bytes` for a message of `kind`, or [`BrokerError::TooBig`].
pub(crate) fn fits(kind: &'static str, bytes: usize) -> Result<(), BrokerError> {
    match bytes > MAX_MESSAGE_BYTES {
        true => Err(BrokerError::TooBig { kind, bytes }),
        false => Ok(()),
    }
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

    /// The message was over [`MAX_MESSAGE_BYTES`]: what it carried is to
    /// blame, not the connection.
    pub fn is_too_big(&self) -> bool {
        matches!(self, Self::TooBig { .. })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_over_the_bound_is_an_error_of_its_own() {
        assert!(fits("task", MAX_MESSAGE_BYTES).is_ok());
        let err = fits("job_update", MAX_MESSAGE_BYTES + (3 << 20)).unwrap_err();
        assert!(err.is_too_big());
        assert!(!err.is_not_found());
        assert_eq!(
            err.to_string(),
            "a job_update message of 19.0 MiB is more than the 16 MiB a message may hold"
        );
    }
}
