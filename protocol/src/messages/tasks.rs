//! Tasks on `gleaner.job.<job>.tasks`, one bundle per message.

use super::*;

/// One run of one task. Self-contained, so a launcher needs nothing else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskMsg {
    pub job: JobId,
    pub task: u64,
    /// 1 for the first run; retries after a failure count up to `max_attempts`.
    pub attempt: u32,
    /// Times this task was preempted and republished; not failures.
    #[serde(default)]
    pub preemptions: u32,
    pub command: String,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    #[serde(default)]
    pub walltime_ms: Option<u64>,
    #[serde(default)]
    pub outputs: Vec<String>,
    #[serde(default)]
    pub workdir: Option<String>,
    /// When preempted, the task gets this signal (a name: `TERM`, `USR1`…)
    /// and `preempt_grace_ms` to save its state before it is killed;
    /// without them it is killed at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_grace_ms: Option<u64>,
    /// The job's `max_attempts` (0: not said): after a failed last attempt
    /// nothing runs the task again, and its checkpoint can go.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_attempts: u32,
    /// A shape unlike its job's tasks' (a final step's own): only a
    /// launcher of this shape runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<TaskShape>,
}

impl Message for TaskMsg {
    fn kind(&self) -> &'static str {
        "task"
    }
}

impl TaskMsg {
    /// About what it weighs in a message: its variable parts, with room
    /// for the fixed ones.
    pub fn weight(&self) -> usize {
        self.command.len()
            + self
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>()
            + self.outputs.iter().map(|o| o.len() + 8).sum::<usize>()
            + self.workdir.as_ref().map_or(0, String::len)
            + 256
    }
}

/// What one bundle of tasks weighs at most ([`TaskMsg::weight`]), unless
/// its one task alone weighs more: well within [`MAX_MESSAGE_BYTES`], and
/// what a launcher's prefetch holds stays small.
pub const BUNDLE_BYTES: usize = 4 << 20;

/// A message of many `$item`s in `$field` that also reads a lone `$item`
/// as a list of one: single messages still queued across an upgrade, and
/// retries, which travel alone, decode as the same type.
macro_rules! many_or_one {
    ($many:ident, $field:ident, $item:ident) => {
        impl<'de> Deserialize<'de> for $many {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                #[serde(untagged)]
                enum Either {
                    Many { $field: Vec<$item> },
                    One(Box<$item>),
                }
                Ok(match Either::deserialize(d)? {
                    Either::Many { $field } => Self { $field },
                    Either::One(one) => Self { $field: vec![*one] },
                })
            }
        }
    };
}

/// Tasks published as one message (a manifest's `bundle`): one publish,
/// delivery and ack for all of them. A launcher acks it once every task in
/// it has its result with the broker or is back in the queue alone.
#[derive(Debug, Clone, Serialize)]
pub struct TaskBundle {
    pub tasks: Vec<TaskMsg>,
}

many_or_one!(TaskBundle, tasks, TaskMsg);

impl Message for TaskBundle {
    fn kind(&self) -> &'static str {
        "tasks"
    }
}
