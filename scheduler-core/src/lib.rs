//! The scheduler's core: the picture of clusters and jobs, the promises in
//! flight, and who gets idle slots, as a state machine of events and time
//! ([`core::SchedulerCore`]), with its settings. Nothing here does I/O: the
//! shell (`gleaner-scheduler`) moves the messages and serves the metrics
//! page it renders.

pub mod core;
mod grid_book;
mod history;
pub mod io;
pub mod metrics;
pub mod outbox;
pub mod state;

pub use grid_book::GridConfig;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{core::Rounds, state::StateConfig};

/// `[scheduler]` of the configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedulerConfig {
    #[serde(flatten)]
    pub state: StateConfig,
    /// How often a round runs even without news.
    #[serde(with = "humantime_serde")]
    pub round_interval: Duration,
    /// The least time between two rounds when news (a new job) calls for
    /// one before the timer.
    #[serde(with = "humantime_serde")]
    pub round_min_gap: Duration,
    /// Where Prometheus metrics are served (`/metrics`), if anywhere.
    pub metrics: Option<std::net::SocketAddr>,
}

impl SchedulerConfig {
    pub fn rounds(&self) -> Rounds {
        Rounds {
            interval: self.round_interval,
            min_gap: self.round_min_gap,
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            state: StateConfig::default(),
            round_interval: Duration::from_secs(1),
            round_min_gap: Duration::from_millis(200),
            metrics: None,
        }
    }
}
