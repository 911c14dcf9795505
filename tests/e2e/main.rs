//! gleaner end to end, against the real components: RabbitMQ (one vhost
//! per test), Grid Engine and Slurm from `deploy/`, the Unix accounts
//! alice and bob, and test hosts in network namespaces. One binary, a
//! module per topic, so the suite links once.

mod batch_names;
mod chaos;
mod cli;
mod coallocation;
mod faults;
mod grid_engine;
mod launchers;
mod multi_host;
mod reallocation;
mod recovery;
mod replicated_broker;
mod resources;
mod rigid;
mod scheduling;
mod slurm;
mod sweeps;
mod users;

use std::time::Duration;

use gleaner_testkit::Gleaner;

const MINUTE: Duration = Duration::from_secs(60);

/// A test's gleaner, running this build's binary.
fn gleaner(test: &str) -> Gleaner {
    Gleaner::new(test, env!("CARGO_BIN_EXE_gleaner"))
}
