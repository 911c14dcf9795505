//! A runner's core: what it decides for each job (tasks to publish,
//! results to judge, retries, preemptions, a grid job's gathering and
//! restarts, when the job ends) and which submissions it takes, as state
//! machines of events and time ([`JobMachine`] around a [`Job`]: a
//! [`Sweep`] or a [`Grid`]). Nothing here does I/O: the shell
//! (`gleaner-runner`) talks to the broker, writes the results directory
//! and carries out the effects.

pub mod admission;
mod book;
mod core;
mod effect;
mod follow;
mod grid_job;
pub mod io;
mod job;
mod launchers;
mod publication;
pub mod records;
mod returns;
pub mod supervision;
mod sweep;

pub use book::{FinalStatus, TaskBook, Verdict};
pub use core::{JobEvent, JobMachine};
/// Public, with what it takes to drive it, so that the simulator's
/// scavenging jobs are run by the runner's own core.
pub use effect::{Effect, Followup, Now};
pub use grid_job::Grid;
pub use job::{Job, JobSettings, Kind, Ledger, Opening, Refusal};
pub use publication::{FirstAttempts, Publication};
pub use records::{IndexEntry, JobFile};
pub use returns::DeadLetter;
pub use sweep::Sweep;
