//! Co-allocation of a grid job across a Grid Engine and a Slurm cluster,
//! as KOALA does it: components wait at a start barrier and run together,
//! a claiming try places a component that does not start elsewhere, and a
//! run that cannot gather by its `barrier_timeout` goes back to placement.

use std::{path::Path, time::Duration};

use gleaner_protocol::naming::COMPONENT_PREFIX;
use gleaner_testkit::{Gleaner, SgeQueues, SlurmCluster, by_task, wait_for};

use crate::{MINUTE, gleaner};

/// c1: a Grid Engine queue of 15 slots on this host; s1: Slurm's three
/// 4-CPU nodes. Worst fit puts components of 6, 4 and 4 slots on c1, s1
/// and c1, in that order.
fn two_batch_systems(test: &str) -> (SgeQueues, Gleaner) {
    let queues = SgeQueues::new(1, 15);
    let mut g = gleaner(test);
    g.write(
        "gleaner.toml",
        &format!(
            "[[cluster]]\nname = \"c1\"\nbackend = \"sge\"\nqueue = \"{}\"\nh_rt = \"10m\"\n\
             [[cluster]]\nname = \"s1\"\nbackend = \"slurm\"\npartition = \"{}\"\n",
            queues.names[0],
            SlurmCluster::PARTITION
        ),
    );
    g.start("up", &["up"]);
    (queues, g)
}

/// A job of three components that each note, in `dir`, when their
/// command started, their ranks and the host file they were given.
fn manifest(dir: &Path, extra: &str) -> String {
    let command = format!(
        "date +%s.%N > {d}/start.$GLEANER_COMPONENT; \
         echo $GLEANER_RANK $GLEANER_RANKS $GLEANER_COMPONENTS > {d}/rank.$GLEANER_COMPONENT; \
         cp \\\"$GLEANER_HOSTFILE\\\" {d}/hosts.$GLEANER_COMPONENT; sleep 1",
        d = dir.display()
    );
    let mut text = format!("name = \"mpi\"\nkind = \"grid\"\npriority = \"high\"\n{extra}\n");
    for slots in [6, 4, 4] {
        text.push_str(&format!(
            "[[component]]\nslots = {slots}\ncommand = \"{command}\"\n"
        ));
    }
    text
}

fn gathering(g: &Gleaner, job: &str) -> serde_json::Value {
    g.job_file(job).unwrap_or_default()["gathering"].clone()
}

fn seconds_since_epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// gleaner's components still in either batch system.
fn components_left(queues: &SgeQueues, slurm: &SlurmCluster) -> Vec<String> {
    let sge = queues.jobs(&queues.names[0]).into_iter().map(|j| j.name);
    let slurm = slurm.jobs().into_iter().map(|j| j.name);
    sge.chain(slurm)
        .filter(|name| name.starts_with(COMPONENT_PREFIX))
        .collect()
}

#[test]
fn components_wait_at_the_barrier_and_start_together_once_the_last_one_starts() {
    let slurm = SlurmCluster::lock();
    let (queues, g) = two_batch_systems("coalloc-barrier");
    let held = slurm.hold_partition();
    let submitted = std::time::Instant::now();
    let job = g.submit(&manifest(g.path(), ""));
    wait_for("c1's two components at the barrier", MINUTE, || {
        gathering(&g, &job)["at_barrier"] == 2
    });
    let status = String::from_utf8_lossy(&g.run(&["status", &job]).stdout).into_owned();
    assert!(status.contains("barrier 2/3"), "{status}");
    assert!(
        status.contains("2 of 3 components waiting at the barrier"),
        "{status}"
    );
    // s1's queue is held for 10 s.
    std::thread::sleep(Duration::from_secs(10).saturating_sub(submitted.elapsed()));
    for component in 0..3 {
        assert!(
            !g.path().join(format!("start.{component}")).exists(),
            "component {component} ran before the last one started"
        );
    }
    let released = seconds_since_epoch();
    drop(held);
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");

    let tasks = by_task(&g.index(&job));
    let placed: Vec<(&str, &str)> = tasks
        .values()
        .map(|t| {
            (
                t["status"].as_str().unwrap_or_default(),
                t["cluster"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        placed,
        [
            ("succeeded", "c1"),
            ("succeeded", "s1"),
            ("succeeded", "c1")
        ]
    );
    let read = |name: &str| std::fs::read_to_string(g.path().join(name)).unwrap_or_default();
    let starts: Vec<f64> = (0..3)
        .map(|c| read(&format!("start.{c}")).trim().parse().unwrap_or(0.0))
        .collect();
    let first = starts.iter().copied().fold(f64::MAX, f64::min);
    let last = starts.iter().copied().fold(0.0, f64::max);
    assert!(first >= released, "started before s1 did: {starts:?}");
    assert!(last - first < 1.0, "not together: {starts:?}");
    let ranks: Vec<String> = (0..3).map(|c| read(&format!("rank.{c}"))).collect();
    assert_eq!(ranks, ["0 14 3\n", "6 14 3\n", "10 14 3\n"]);
    let hosts = read("hosts.1");
    assert_eq!(
        hosts,
        read("hosts.0"),
        "every component gets the same host file"
    );
    let s1_host = hosts
        .lines()
        .find(|l| l.ends_with("# component 1"))
        .unwrap_or_default();
    assert!(
        s1_host.starts_with("node") && s1_host.contains(" slots=4 "),
        "{hosts}"
    );
    let figures = gathering(&g, &job);
    let barrier = figures["barrier_s"].as_f64().unwrap_or_default();
    assert!(barrier >= 5.0, "waited at the barrier: {figures}");
    assert!(
        figures["start_delay_s"].as_f64().unwrap_or_default() >= barrier,
        "{figures}"
    );
    assert_eq!(figures["at_barrier"], 0);
    assert!(components_left(&queues, &slurm).is_empty());
}

#[test]
fn a_held_component_is_placed_elsewhere_and_a_run_that_cannot_gather_goes_back() {
    let slurm = SlurmCluster::lock();
    let (queues, g) = two_batch_systems("coalloc-claim");
    let _held = slurm.hold_partition();
    // T = 0.5: two of three started on c1 is enough at the claiming try
    // (15 s after placement): the component held on s1 goes to c1.
    let job = g.submit(&manifest(
        g.path(),
        "claim_threshold = 0.5\nbarrier_timeout = \"20s\"",
    ));
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert!(
        tasks
            .values()
            .all(|t| t["status"] == "succeeded" && t["cluster"] == "c1"),
        "{tasks:?}"
    );
    assert!(
        g.log("up").contains("withdrawn to be placed elsewhere"),
        "{}",
        g.log("up")
    );
    let restarts = &g.job_file(&job).unwrap_or_default()["restarts"];
    assert_eq!(restarts.as_u64().unwrap_or(0), 0, "the run kept");
    assert!(components_left(&queues, &slurm).is_empty());

    // T = 1: the run cannot gather; at its start time its components are
    // stopped and it is placed again, a try; the last try fails the job.
    let job = g.submit(&manifest(
        g.path(),
        "barrier_timeout = \"6s\"\nmax_attempts = 2",
    ));
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert!(
        tasks.values().all(|t| t["status"] == "failed"),
        "{tasks:?}\n{}",
        g.log("up")
    );
    let file = g.job_file(&job).unwrap_or_default();
    assert_eq!(file["restarts"], 1, "{file}");
    assert!(
        file["gathering"]["claiming_tries"].as_u64().unwrap_or(0) >= 4,
        "{file}"
    );
    assert!(
        g.log("up")
            .contains("did not gather within its barrier_timeout (6s)")
    );
    wait_for("the stopped components to leave", MINUTE, || {
        components_left(&queues, &slurm).is_empty()
    });
}

#[test]
fn a_high_priority_job_stops_a_low_one_which_resumes_from_its_checkpoint() {
    let queues = SgeQueues::new(1, 4);
    let mut g = gleaner("coalloc-preempt");
    g.write(
        "gleaner.toml",
        &format!(
            "[[cluster]]\nname = \"c1\"\nbackend = \"sge\"\nqueue = \"{}\"\nh_rt = \"10m\"\n",
            queues.names[0]
        ),
    );
    g.start("up", &["up"]);
    // Counts to 20, half a second a step; on TERM it saves where it is.
    let counter = "n=$(cat $GLEANER_CHECKPOINT/n 2>/dev/null || echo 0); first=$n; \
         trap 'echo $n > $GLEANER_CHECKPOINT/n; exit 0' TERM; \
         while [ $n -lt 20 ]; do n=$((n + 1)); sleep 0.5; done; echo from $first to $n";
    let low = g.submit(&format!(
        "name = \"low\"\nkind = \"grid\"\npriority = \"low\"\npreempt_grace = \"10s\"\n\
         [[component]]\nslots = 4\ncommand = \"{counter}\"\n"
    ));
    wait_for("the low job to run", MINUTE, || {
        gathering(&g, &low)["running_since"].is_u64()
    });
    std::thread::sleep(Duration::from_secs(3));
    let high = g.submit(
        "name = \"high\"\nkind = \"grid\"\npriority = \"high\"\n\
         [[component]]\nslots = 4\ncommand = \"echo high\"\n",
    );
    assert_eq!(g.wait_for_end(&high, 2 * MINUTE), "done");
    assert_eq!(g.wait_for_end(&low, 2 * MINUTE), "done");
    let ended = |job: &str| g.job_file(job).unwrap_or_default()["finished_at"].as_u64();
    assert!(ended(&high) < ended(&low), "the high job went first");
    let tasks = by_task(&g.index(&low));
    assert_eq!(tasks[&0]["status"], "succeeded", "{tasks:?}");
    let stdout = g.stdout(&low, 0).unwrap_or_default();
    let first: u32 = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        first > 0 && stdout.ends_with("to 20\n"),
        "resumed from its checkpoint: {stdout:?}"
    );
    assert_eq!(gathering(&g, &low)["preemptions"], 1);
    assert!(
        g.log("up")
            .contains("stopping the grid job for one of higher priority")
    );
}
