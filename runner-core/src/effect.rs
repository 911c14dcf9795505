//! What the job cores (`sweep.rs`, `grid_job.rs`) and their shell (`job.rs`)
//! say to each other: the time a decision is made at, and the effects the
//! shell applies for it.

use gleaner_protocol::{
    ActionReply, ClusterName, Event, GrantId, KcmMsg, LauncherId, LauncherMsg, OutputPiece,
    ResultMsg, SchedulerMsg, TaskMsg,
};

use crate::{
    publication::FirstAttempts,
    records::{AddedTasks, IndexEntry},
};

pub use gleaner_protocol::Now;

/// Something the shell does for a core, in the order given.
#[derive(Debug)]
pub enum Effect {
    /// To the scheduler, whose queue must exist.
    ToScheduler(SchedulerMsg),
    /// To a cluster's kcm. The queue may be gone (a cluster without a kcm):
    /// whether the message arrived goes back to the core with `followup`.
    ToKcm {
        cluster: ClusterName,
        msg: KcmMsg,
        followup: Followup,
    },
    /// To a launcher, whose queue may be gone (it died), as for a kcm.
    ToLauncher {
        launcher: LauncherId,
        msg: LauncherMsg,
        followup: Followup,
    },
    /// For watchers, on the events exchange.
    Event(Event),
    /// To the user who sent the control message being handled (tasks to
    /// add), if they wait for it: whether the job took it, or why not.
    Answer(ActionReply),
    /// A followed task's output, to its followers' direct reply-to
    /// addresses; one gone misses it.
    Relay {
        to: Vec<String>,
        piece: Box<OutputPiece>,
    },
    /// Declares the job's queues, before anything is sent to them.
    DeclareQueues,
    /// Empties the job's task queue: a publication cut short by a crash left
    /// an unknown part of it there.
    PurgeTasks,
    /// Publishes the first attempt of each of these tasks.
    PublishFirst(FirstAttempts),
    /// Publishes these tasks (retries); before the results that caused them
    /// are acked.
    Publish(Vec<TaskMsg>),
    /// Acks the dead letter the shell handed in with this receipt
    /// ([`crate::returns::DeadLetter`]), once what its tasks became is safe.
    SettleLost(u64),
    /// Writes a task's last run's streams to `output.log` (where the next
    /// `Record` of the task points) and its declared outputs under
    /// `tasks/<task>/`. The result itself, moved from the batch being
    /// handled: outputs can be large.
    WriteOutputs(Box<ResultMsg>),
    /// Writes a failed run that is retried: its streams to `output.log`
    /// and a line to `attempts.jsonl` (durable with the next `Record`).
    WriteRetried(Box<ResultMsg>),
    /// Writes a run of the final step's captured output under `final/`.
    WriteFinalOutputs(Box<ResultMsg>),
    /// Appends these lines to the index, then makes everything written so
    /// far durable (even with no lines: outputs may have been written).
    Record(Vec<IndexEntry>),
    /// Appends tasks added to an open job to `additions.jsonl`, durably,
    /// before they are published.
    RecordAddition(Box<AddedTasks>),
    /// Writes `job.json` as the core has it when this effect is applied, so
    /// that it reflects what came back from the effects before it.
    SaveJobFile,
    /// Reports where the job stands (silent launchers polled first, then the
    /// report), once the effects before it and what came back from them are
    /// applied. A request to [`crate::JobMachine`], which carries it out
    /// itself: a shell never sees it.
    Report,
    /// Deletes the job's queues: its launchers leave.
    DeleteQueues,
    /// Deletes the job's launcher account: its launchers' connections
    /// close with it.
    ForgetLauncherAccount,
}

/// What a core wants to hear back about a message to a queue that may be
/// gone. The shell hands it back with whether the message arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followup {
    /// A missing queue changes nothing.
    Nothing,
    /// Launchers asked of a kcm: the cluster counts as one of the job's once
    /// the kcm has the order.
    Grow {
        cluster: ClusterName,
        grant: GrantId,
        slots: u32,
        offered: u32,
    },
    /// A launcher told to preempt or drain: forgotten if its queue is gone.
    Leave { launcher: LauncherId },
    /// A silent launcher asked to report: forgotten if its queue is gone.
    Poll { launcher: LauncherId },
    /// A grid job's component sent to its cluster's kcm: failed if there is
    /// no kcm.
    Component {
        component: u32,
        cluster: ClusterName,
    },
    /// A component submitted where it is moved to: the move is dropped if
    /// that cluster has no kcm.
    Moved {
        component: u32,
        cluster: ClusterName,
    },
}
