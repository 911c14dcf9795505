//! The Slurm cluster of `deploy/slurm/setup.sh`, one test at a time, and
//! its commands.

use std::{process::Command, time::Duration};

use crate::*;

/// The dev grid's Slurm (`deploy/slurm/setup.sh`), one test at a time:
/// every test shares its nodes, so each holds a lock on them for as long
/// as it runs, and starts and ends with no job in the queue.
pub struct SlurmCluster {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// One line of `squeue` for a test.
#[derive(Debug, Clone)]
pub struct SlurmJob {
    /// `123`, or `123_4` for an array task.
    pub id: String,
    pub name: String,
    pub state: String,
    /// Where it runs (empty while it waits).
    pub node: String,
}

impl SlurmCluster {
    /// Partition of gleaner's placeholders.
    pub const PARTITION: &str = "gleaner";
    /// Partition of the cluster's own jobs, on the same nodes.
    pub const LOCAL: &str = "local";
    /// Partition of placeholders that the site's jobs preempt …
    pub const SCAVENGER: &str = "scavenger";
    /// … the site's jobs, in a higher PriorityTier, on the same nodes.
    pub const SITE: &str = "batch";

    pub fn lock() -> Self {
        let cluster = Self {
            _lock: exclusive("gleaner-slurm-tests.lock"),
        };
        cluster.clear();
        cluster
    }

    /// Every job in the queue.
    pub fn jobs(&self) -> Vec<SlurmJob> {
        slurm("squeue", &["-h", "-r", "-o", "%i|%j|%T|%N"])
            .lines()
            .filter_map(|line| {
                let mut f = line.split('|');
                Some(SlurmJob {
                    id: f.next()?.to_owned(),
                    name: f.next()?.to_owned(),
                    state: f.next()?.to_owned(),
                    node: f.next()?.to_owned(),
                })
            })
            .collect()
    }

    /// `scontrol show job ID`: how a job stands, or ended (for `MinJobAge`).
    pub fn state(&self, id: &str) -> String {
        slurm("scontrol", &["show", "job", id])
    }

    /// Jobs submitted to gleaner's partition wait there, none starts,
    /// until the returned guard is dropped: Slurm says the partition is
    /// down, while its nodes, which is what a kcm reads, stay idle.
    pub fn hold_partition(&self) -> PartitionHeld<'_> {
        set_partition(Self::PARTITION, "DOWN");
        PartitionHeld { _cluster: self }
    }

    /// Every node reserved from `from_now` on for half an hour, as a site
    /// reserves them for maintenance, until the returned guard is dropped:
    /// before it, jobs start only if their time limit ends in time.
    pub fn reserve_nodes_in(&self, from_now: Duration) -> Reserved<'_> {
        slurm(
            "scontrol",
            &[
                "create",
                "reservation",
                &format!("reservationname={RESERVATION}"),
                &format!("starttime=now+{}minutes", from_now.as_secs().div_ceil(60)),
                "duration=30",
                "nodes=ALL",
                // Nobody's: a reservation of the jobs' own account lets
                // them in whatever their limit.
                "users=nobody",
                "flags=ignore_jobs",
            ],
        );
        Reserved { _cluster: self }
    }

    /// CPUs of the nodes of `partition`.
    pub fn cores(&self, partition: &str) -> u32 {
        slurm("sinfo", &["-h", "-p", partition, "-o", "%C"])
            .trim()
            .rsplit('/')
            .next()
            .and_then(|total| total.parse().ok())
            .unwrap_or(0)
    }

    /// Cancels every job the tests submit, and waits until the queue is
    /// empty.
    pub fn clear(&self) {
        // A test killed while it held the partition left it down, or
        // the nodes reserved.
        set_partition(Self::PARTITION, "UP");
        delete_reservation();
        cancel_tests_jobs();
        wait_for("the Slurm queue to empty", Duration::from_secs(60), || {
            self.jobs().is_empty()
        });
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        cancel_tests_jobs();
    }
}

/// gleaner's partition held by [`SlurmCluster::hold_partition`]; let go
/// when dropped.
pub struct PartitionHeld<'a> {
    _cluster: &'a SlurmCluster,
}

impl Drop for PartitionHeld<'_> {
    fn drop(&mut self) {
        set_partition(SlurmCluster::PARTITION, "UP");
    }
}

/// The nodes reserved by [`SlurmCluster::reserve_nodes_in`]; free again
/// when dropped.
pub struct Reserved<'a> {
    _cluster: &'a SlurmCluster,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        delete_reservation();
    }
}

const RESERVATION: &str = "gleaner-tests-maintenance";

fn delete_reservation() {
    let _ = Command::new("scontrol")
        .args(["delete", &format!("reservation={RESERVATION}")])
        .output();
}

fn set_partition(partition: &str, state: &str) {
    slurm(
        "scontrol",
        &[
            "update",
            &format!("PartitionName={partition}"),
            &format!("State={state}"),
        ],
    );
}

/// Cancels the jobs of every account the tests submit as: root's, and
/// alice's and bob's (placeholders of many users' tests whose kcm ended
/// with the test, before it could remove them).
fn cancel_tests_jobs() {
    for account in ["root", "alice", "bob"] {
        slurm("scancel", &["--full", "-u", account]);
    }
}

/// `sbatch --parsable ARGS`; returns the job id.
pub fn sbatch(args: &[&str]) -> String {
    let answer = slurm(
        "sbatch",
        &[
            &["--parsable", "--output=/dev/null", "--error=/dev/null"],
            args,
        ]
        .concat(),
    );
    let id = answer.trim().split(';').next().unwrap_or("").to_owned();
    assert!(
        id.parse::<u64>().is_ok(),
        "sbatch {args:?} answered {answer:?}"
    );
    id
}

/// Runs a Slurm command; returns its stdout (and panics if it cannot run).
pub fn slurm(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (is Slurm set up? deploy/slurm/setup.sh)"));
    String::from_utf8_lossy(&output.stdout).into_owned()
}
