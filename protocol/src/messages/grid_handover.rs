//! The grid bookkeeping one scheduler hands the next on `gleaner.scheduler.grid`.

use super::*;

/// The active scheduler's grid bookkeeping (the latest only is kept): what
/// no report carries, so that a scheduler taking over goes on counting tries
/// and keeps promised slots promised instead of starting again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GridSnapshot {
    /// When it was taken; its ages count from here.
    pub taken_ms: Millis,
    pub placements: Vec<GridPlacement>,
    pub reservations: Vec<GridReservation>,
}

impl Message for GridSnapshot {
    fn kind(&self) -> &'static str {
        "grid_snapshot"
    }
}

/// A cluster as the scheduler sees it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterView {
    pub report: ClusterReport,
    pub excluded: bool,
    /// No report for longer than the staleness limit.
    pub stale: bool,
}
