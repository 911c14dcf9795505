//! The one error type of the user's commands, and the exit codes it maps to.
//!
//! Exit codes (the contract scripts rely on): 0 all went well, 1 the job did
//! not fully succeed or the named job is unknown, 2 bad input, 3 the broker
//! or a service is unreachable, 4 the user may not do it.

use std::process::ExitCode;

use gleaner_broker::BrokerError;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A manifest, a scenario, a job id or the configuration is wrong.
    #[error("{0}")]
    BadInput(String),
    /// The broker, or the service that should answer, is not there.
    #[error("{0}")]
    Unreachable(String),
    /// The job is unknown, or ended without every task succeeding; the
    /// output has already said how, so there may be nothing to add.
    #[error("{}", .0.as_deref().unwrap_or_default())]
    Unsuccessful(Option<String>),
    /// The broker or the scheduler refused: the job is someone else's, or
    /// the user's broker permissions do not reach that far.
    #[error("{0}")]
    Denied(String),
    /// A service stopped on an error.
    #[error("{0:#}")]
    Service(anyhow::Error),
}

impl CliError {
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Self::Unsuccessful(_) | Self::Service(_) => 1,
            Self::BadInput(_) => 2,
            Self::Unreachable(_) => 3,
            Self::Denied(_) => 4,
        })
    }

    /// What to tell the user on stderr, if anything is left to tell (a
    /// service's error is already in its log).
    pub fn message(&self) -> Option<String> {
        match self {
            Self::Unsuccessful(None) | Self::Service(_) => None,
            other => Some(other.to_string()),
        }
    }
}

impl From<BrokerError> for CliError {
    fn from(e: BrokerError) -> Self {
        // What the user gave is too big: theirs to change, not the broker's.
        if e.is_too_big() {
            return Self::BadInput(e.to_string());
        }
        if e.is_access_refused() {
            return Self::Denied(format!("the broker refused: {e}"));
        }
        Self::Unreachable(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_too_big_is_bad_input_not_an_unreachable_broker() {
        let e = CliError::from(BrokerError::TooBig {
            kind: "submit",
            bytes: 17 << 20,
        });
        assert!(matches!(e, CliError::BadInput(_)), "{e:?}");
        assert_eq!(e.exit_code(), ExitCode::from(2));
        assert!(
            e.to_string()
                .contains("more than the 16 MiB a message may hold"),
            "{e}"
        );
    }
}
