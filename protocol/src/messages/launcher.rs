//! Orders to one launcher on `gleaner.launcher.<id>`.

use super::*;

/// A launcher's own inbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LauncherMsg {
    /// Kill the running tasks, republish them, exit.
    Preempt { reason: String },
    /// Finish the running tasks, take no more, exit.
    Drain { reason: String },
    /// Report your status now (you have been silent for a while).
    Poll {},
    /// Send `task`'s output as it is printed, for `for_ms`, if it runs
    /// here or starts here meanwhile.
    Follow { task: u64, for_ms: u64 },
}

impl Message for LauncherMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Preempt { .. } => "preempt",
            Self::Drain { .. } => "drain",
            Self::Poll {} => "poll",
            Self::Follow { .. } => "follow",
        }
    }
}
