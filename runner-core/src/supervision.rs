//! What the runner does with a job's manifest once a run of the job has
//! ended, however it ended: its supervisor's decisions, apart from the I/O.
//! A job is given up only when running it again cannot help; a job whose
//! results cannot be written (a full disk) waits and runs again, its
//! results held in the broker meanwhile, so nothing is lost.

use std::{fmt::Display, time::Duration};

use tracing::error;

/// How long a job whose results directory cannot be written waits before
/// it runs again.
pub const RESULTS_RETRY: Duration = Duration::from_secs(10);

/// How a run of a job ended.
#[derive(Debug)]
pub enum RunEnd<E> {
    /// The job is over and wound up.
    Over,
    /// The runner is shutting down.
    Shutdown,
    /// The job cannot run as submitted (its results directory belongs to
    /// another job), for this reason.
    Refused(String),
    /// Its queues were deleted under it.
    QueuesGone(E),
    /// A message of its was too big to send, and it did not stop itself.
    TooBig(E),
    /// The broker session failed.
    BrokerLost(E),
    /// Its results directory could not be written.
    ResultsUnwritable { error: String },
}

/// What becomes of the job's manifest.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<E> {
    /// Acknowledged: nobody runs the job again.
    Ack,
    /// Left unacknowledged: the broker hands it to the runner that resumes
    /// the job.
    Leave,
    /// Refused to its submitter with this reason, then acknowledged.
    Refuse(String),
    /// The session ends with this error; its manifests come back.
    EndSession(E),
    /// The job runs again after `wait`; meanwhile the scheduler (and
    /// `gleaner status`) shows `problem` as why it stalls.
    RetryAfter { wait: Duration, problem: String },
}

/// The manifest's fate after a run that ended as `end`.
pub fn after<E: Display>(end: RunEnd<E>) -> Next<E> {
    match end {
        RunEnd::Over => Next::Ack,
        RunEnd::Shutdown => Next::Leave,
        RunEnd::Refused(reason) => Next::Refuse(reason),
        RunEnd::QueuesGone(e) => {
            error!(error = %e, "the job's queues were deleted under it; giving the job up");
            Next::Ack
        }
        RunEnd::TooBig(e) => {
            error!(error = %e, "a message of the job's is too big to send; giving the job up");
            Next::Ack
        }
        RunEnd::BrokerLost(e) => Next::EndSession(e),
        RunEnd::ResultsUnwritable { error } => {
            let wait = RESULTS_RETRY.as_secs();
            error!(
                error,
                "cannot write results; they wait in the broker, retrying in {wait} s"
            );
            Next::RetryAfter {
                wait: RESULTS_RETRY,
                problem: format!(
                    "cannot write results ({error}); they wait in the broker, retrying every {wait} s"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_given_up_only_when_running_it_again_cannot_help() {
        assert_eq!(after::<&str>(RunEnd::Over), Next::Ack);
        assert_eq!(after(RunEnd::QueuesGone("NOT_FOUND")), Next::Ack);
        assert_eq!(after(RunEnd::TooBig("too big")), Next::Ack);
        assert_eq!(
            after::<&str>(RunEnd::Refused("another job's".into())),
            Next::Refuse("another job's".into())
        );
        assert_eq!(
            after::<&str>(RunEnd::Shutdown),
            Next::Leave,
            "another runner resumes it"
        );
        assert_eq!(
            after(RunEnd::BrokerLost("connection reset")),
            Next::EndSession("connection reset")
        );
    }

    #[test]
    fn a_job_whose_results_cannot_be_written_waits_and_runs_again() {
        let next = after::<&str>(RunEnd::ResultsUnwritable {
            error: "No space left on device".into(),
        });
        let Next::RetryAfter { wait, problem } = next else {
            panic!("not retried: {next:?}");
        };
        assert_eq!(wait, Duration::from_secs(10));
        assert!(problem.contains("No space left on device"), "{problem}");
        assert!(problem.contains("every 10 s"), "{problem}");
    }
}
