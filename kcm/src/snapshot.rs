//! The batch system at one moment, as plain data: what a backend reads and
//! the kcm's core decides on (a simulator builds it by hand).

use gleaner_manifest::JobId;
use gleaner_policy::local::WaitingJob;

/// Slot counts come from the batch system: added without overflowing.
fn saturating_sum(slots: impl IntoIterator<Item = u32>) -> u32 {
    slots.into_iter().fold(0, u32::saturating_add)
}

/// A gleaner placeholder in the batch system: one launcher, running or waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    /// The batch system's id (`4711.3`); the launcher's id is
    /// [`launcher_id`](gleaner_protocol::naming::launcher_id) of it.
    pub id: String,
    pub job: JobId,
    pub slots: u32,
    pub running: bool,
}

/// A grid job's component in the batch system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentRun {
    /// The batch system's id.
    pub id: String,
    pub job: JobId,
    pub component: u32,
    pub slots: u32,
    pub running: bool,
}

/// The cluster's state at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub total_slots: u32,
    /// Slots running jobs that are not gleaner's.
    pub local_running: u32,
    /// Jobs that are not gleaner's, waiting for slots of this cluster.
    pub waiting: Vec<WaitingJob>,
    /// Slots running grid job components.
    pub grid_running: u32,
    pub placeholders: Vec<Placeholder>,
    /// Grid job components, running or waiting.
    pub components: Vec<ComponentRun>,
    /// Something wrong in the batch system worth reporting (a queue in error).
    pub problem: Option<String>,
}

impl Snapshot {
    /// Slots nobody uses or has claimed (pending placeholders claim theirs).
    pub fn idle_slots(&self) -> u32 {
        let claimed = saturating_sum(self.placeholders.iter().map(|p| p.slots));
        self.total_slots.saturating_sub(saturating_sum([
            self.local_running,
            self.grid_running,
            claimed,
        ]))
    }

    /// Slots free right now: what a waiting job could start on.
    pub fn free_slots(&self) -> u32 {
        let running = saturating_sum(
            self.placeholders
                .iter()
                .filter(|p| p.running)
                .map(|p| p.slots),
        );
        self.total_slots.saturating_sub(saturating_sum([
            self.local_running,
            self.grid_running,
            running,
        ]))
    }

    /// Slots asked for by the waiting local jobs.
    pub fn local_waiting(&self) -> u32 {
        saturating_sum(self.waiting.iter().map(|w| w.slots))
    }
}
