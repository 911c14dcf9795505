//! The history a job leaves on `gleaner.events`.

use super::*;

/// Published on the `gleaner.events` topic exchange for `--wait` and dashboards.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// `job.<owner>.<job>.progress`
    Progress(JobReport),
    /// `job.<owner>.<job>.done`: every task has a final state (or the job was cancelled).
    Done(JobReport),
    /// `job.<owner>.<job>.rejected`: the manifest was invalid, or its
    /// sender may not run it.
    Rejected {
        job: String,
        #[serde(default)]
        owner: String,
        reason: String,
        /// The refused submission's fingerprint (of its body, as its
        /// sender can work out): one id may be submitted more than once,
        /// and a refusal is news to the sender of that submission only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        submission: Option<u64>,
        /// The refused submission reused the id of a job that runs: news
        /// to its sender only, and no end of that job's (the history keeps
        /// none, so nobody's `wait` or `status` takes it for one).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        live_job: bool,
    },
    /// `cluster.<name>.status`
    Cluster(ClusterReport),
}

impl Message for Event {
    fn kind(&self) -> &'static str {
        match self {
            Self::Progress(_) => "progress",
            Self::Done(_) => "done",
            Self::Rejected { .. } => "rejected",
            Self::Cluster(_) => "cluster",
        }
    }
}

impl Event {
    /// The routing key on `gleaner.events`. A job's events carry its
    /// owner, so that a topic permission (`^job\.{username}\.`) lets each
    /// user follow their own jobs only.
    pub fn routing_key(&self) -> String {
        match self {
            Self::Progress(r) => job_events(&r.owner, r.job.as_str(), "progress"),
            Self::Done(r) => job_events(&r.owner, r.job.as_str(), "done"),
            Self::Rejected { job, owner, .. } => job_events(owner, job, "rejected"),
            Self::Cluster(c) => format!("cluster.{}.status", c.cluster),
        }
    }
}

/// The owner word of a job whose sender is unknown (a manifest published
/// by hand without `user_id`).
pub const UNKNOWN_OWNER: &str = "_";

/// `job.<owner>.<job>.<event>`; `event` may be a pattern (`#`).
pub fn job_events(owner: &str, job: &str, event: &str) -> String {
    let owner = if owner.is_empty() {
        UNKNOWN_OWNER
    } else {
        owner
    };
    format!("job.{owner}.{job}.{event}")
}
