//! Users' requests on `gleaner.requests`, and their replies.

use super::*;

/// What a user asks of gleaner, through the `gleaner.user` exchange to the
/// active scheduler, which answers to the AMQP `reply_to`. Who asks is the
/// message's `user_id`, which the broker checks against the connection's
/// user; a user sees and cancels their own jobs only (admins: all).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RequestMsg {
    /// `gleaner status`: answered with a [`StatusReply`]; with `job`, of
    /// that job alone, running or ended.
    Status {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job: Option<JobId>,
    },
    /// `gleaner cancel`: answered with an [`ActionReply`].
    Cancel { job: JobId },
    /// `gleaner submit --job JOB`: tasks for an open job, answered with an
    /// [`ActionReply`].
    AddTasks { job: JobId, addition: Addition },
    /// `gleaner close`: an open job takes no more tasks, and ends once
    /// they have; answered with an [`ActionReply`].
    Close { job: JobId },
    /// `gleaner logs JOB TASK --follow`: the task's output as it is
    /// printed, for [`FOLLOW_LEASE_MS`] (the asker renews it sooner).
    /// Answered with an [`ActionReply`] as for a cancel, then with
    /// [`Followed::Output`] pieces from the job's runner.
    Follow { job: JobId, task: u64 },
}

impl Message for RequestMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Status { .. } => "status",
            Self::Cancel { .. } => "cancel",
            Self::AddTasks { .. } => "add_tasks",
            Self::Close { .. } => "close",
            Self::Follow { .. } => "follow",
        }
    }
}

/// How long a follow lasts unless renewed: a follower that went away
/// costs the runner and the launcher this long at most.
pub const FOLLOW_LEASE_MS: u64 = 10_000;

/// The most bytes of one stream in one [`OutputPiece`]: a task printing
/// faster than a follower is sent skips ahead.
pub const MAX_PIECE_BYTES: usize = 64 * 1024;

/// What a follower hears on its direct reply-to: the scheduler's answer
/// (an [`ActionReply`], whose variants these first three are), then the
/// task's output as its runner relays it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Followed {
    Accepted {},
    NotRunning {},
    Refused { reason: String },
    Output(OutputPiece),
}

impl Message for Followed {
    fn kind(&self) -> &'static str {
        match self {
            Self::Output(_) => "output",
            _ => "action_reply",
        }
    }
}

/// Output a followed task printed since the last piece, from the launcher
/// running it, through its runner to the followers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputPiece {
    pub task: u64,
    /// The run it is from, with `preemptions` and `launcher`: a task run
    /// again (retried, preempted, or redelivered elsewhere) prints from
    /// the start.
    pub attempt: u32,
    #[serde(default)]
    pub preemptions: u32,
    #[serde(default)]
    pub launcher: String,
    pub stdout: StreamPiece,
    pub stderr: StreamPiece,
    /// The run ended: nothing more comes of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended: bool,
}

impl OutputPiece {
    /// Within [`MAX_PIECE_BYTES`] a stream: a larger one is forged.
    pub fn is_bounded(&self) -> bool {
        self.stdout.data.len() <= MAX_PIECE_BYTES && self.stderr.data.len() <= MAX_PIECE_BYTES
    }
}

/// Bytes of a stream, from `offset` (bytes the run printed before them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPiece {
    pub offset: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

impl StreamPiece {
    /// The bytes of a stream from offset `from` on, given the last bytes
    /// kept (`data`) and how many came before them: at most
    /// [`MAX_PIECE_BYTES`], the last ones (a follower far behind skips
    /// ahead).
    pub fn since(data: &[u8], dropped: u64, from: u64) -> Self {
        let end = dropped.saturating_add(data.len() as u64);
        let start = from
            .max(dropped)
            .max(end.saturating_sub(MAX_PIECE_BYTES as u64))
            .min(end);
        let skip = usize::try_from(start - dropped).unwrap_or(data.len());
        Self {
            offset: start,
            data: data.get(skip..).unwrap_or_default().to_vec(),
        }
    }

    /// The end of what a run kept of a stream, as a piece.
    pub fn rest_of(captured: &Captured) -> Self {
        Self::since(&captured.data, captured.dropped, 0)
    }
}

/// The scheduler's answer to [`RequestMsg::Cancel`], `AddTasks` and `Close`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ActionReply {
    /// The job's runner has been told.
    Accepted {},
    /// No such job is running (it ended, or no runner has it yet).
    NotRunning {},
    /// The job is someone else's.
    Refused { reason: String },
}

impl Message for ActionReply {
    fn kind(&self) -> &'static str {
        "action_reply"
    }
}
