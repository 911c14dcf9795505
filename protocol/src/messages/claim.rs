//! Which runner holds a job: its claim on `gleaner.job.<job>.owner`.

use super::*;

/// Whose a job id is. Ids are public (`qstat` shows them), so the first
/// runner to hold a job's lock keeps this in the job's `owner` queue, and
/// every runner compares it before it takes the job over, purges its
/// queues or publishes into them: a redelivery of the same submission
/// matches; another user's submission of the id, or a second submission of
/// it, does not, and is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobClaim {
    /// The broker user who submitted the job.
    pub owner: String,
    /// A fingerprint of the submission's body as it came.
    pub submission: u64,
}

impl JobClaim {
    /// Why a submission claiming `self` may not run a job claimed by
    /// `held`, if it may not.
    pub fn refusal(&self, job: &str, held: &Self) -> Option<String> {
        if held.owner != self.owner {
            Some(format!(
                "job id {job} belongs to another user; a job id is never taken over"
            ))
        } else if held.submission != self.submission {
            Some(format!(
                "job {job} was already submitted; each submission gets a job id of its own"
            ))
        } else {
            None
        }
    }
}

impl Message for JobClaim {
    fn kind(&self) -> &'static str {
        "job_claim"
    }
}
