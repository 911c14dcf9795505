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
mod package;
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

/// A test's gleaner with its services apart, on a local cluster of 4
/// slots, so that its runner can be killed alone; and the runner's pid.
fn services_apart(test: &str) -> (Gleaner, u32) {
    let mut g = gleaner(test);
    g.write(
        "gleaner.toml",
        "[[cluster]]\nname = \"local\"\nbackend = \"local\"\nslots = 4\n",
    );
    g.start("scheduler", &["scheduler"]);
    g.start("kcm", &["kcm", "--cluster", "local"]);
    let runner = g.start("runner", &["runner"]);
    (g, runner)
}
