//! Seed 002 on real batch systems: a grid component goes where it would
//! complete first, by the kcms' estimates, and moves, at a reallocation,
//! to a cluster where it would now complete earlier — submitted there
//! before it is withdrawn where it waited, with the scheduler and the
//! kcm it moves to killed in the middle.

use gleaner_protocol::naming::COMPONENT_PREFIX;
use gleaner_testkit::{SgeQueues, SlurmCluster, by_task, qsub, sbatch, sge, wait_for};
use nix::sys::signal::Signal;

use crate::{MINUTE, gleaner};

/// `count` local jobs of one slot on the first of `queues`, each asking
/// and taking half an hour, once they run; their numbers.
fn half_hour_jobs(queues: &SgeQueues, count: usize) -> Vec<String> {
    let queue = queues.names[0].as_str();
    let job = [
        "-N",
        "local",
        "-q",
        queue,
        "-l",
        "h_rt=1800",
        "-b",
        "y",
        "/bin/sleep",
        "1800",
    ];
    let numbers = (0..count).map(|_| qsub(&job)).collect();
    wait_for("the local jobs to run", MINUTE, || {
        queues
            .jobs(queue)
            .iter()
            .filter(|j| !j.host.is_empty())
            .count()
            == count
    });
    numbers
}

#[test]
fn a_waiting_component_moves_where_it_starts_at_once_and_runs_once() {
    let slurm = SlurmCluster::lock();
    // c1: 4 slots, each held by a local job for half an hour; s1: Slurm's
    // 12 CPUs held by a local job of ten minutes. A component of 4 slots
    // and 2 minutes completes first on s1, where it waits.
    let queues = SgeQueues::new(1, 4);
    let queue = &queues.names[0];
    let local = half_hour_jobs(&queues, 4);
    sbatch(&[
        "-p",
        SlurmCluster::LOCAL,
        "-N3",
        "-n12",
        "--time=10",
        "--wrap",
        "sleep 600",
    ]);
    wait_for("the local job to run on s1", MINUTE, || {
        slurm.jobs().iter().any(|j| j.state == "RUNNING")
    });
    let mut g = gleaner("realloc");
    g.write(
        "gleaner.toml",
        &format!(
            "[scheduler]\nreallocate_every = \"4s\"\nreallocate_gain = \"1m\"\n\
             [[cluster]]\nname = \"c1\"\nbackend = \"sge\"\nqueue = \"{queue}\"\n\
             [[cluster]]\nname = \"s1\"\nbackend = \"slurm\"\npartition = \"{}\"\n",
            SlurmCluster::PARTITION
        ),
    );
    let scheduler = g.start("scheduler", &["scheduler"]);
    g.start("runner", &["runner"]);
    let c1 = g.start("kcm-c1", &["kcm", "--cluster", "c1"]);
    g.start("kcm-s1", &["kcm", "--cluster", "s1"]);
    let ran = g.path().join("ran");
    let job = g.submit(&format!(
        "name = \"moved\"\nkind = \"grid\"\nwalltime = \"2m\"\n\
         [[component]]\nslots = 4\ncommand = \"hostname >> {}; sleep 1\"\n",
        ran.display()
    ));
    wait_for("the component waiting on s1", 2 * MINUTE, || {
        slurm
            .jobs()
            .iter()
            .any(|j| j.name.starts_with(COMPONENT_PREFIX) && j.state == "PENDING")
    });
    // c1's local jobs end: there it would start at once.
    for id in &local {
        sge("qdel", &[id]);
    }
    wait_for("the move", 2 * MINUTE, || {
        g.log("runner").contains("moving a waiting grid component")
    });
    // Mid-move: the scheduler that decided it and the kcm it goes to die.
    g.signal(scheduler, Signal::SIGKILL);
    g.signal(c1, Signal::SIGKILL);
    g.start("scheduler2", &["scheduler"]);
    g.start("kcm-c1-2", &["kcm", "--cluster", "c1"]);
    assert_eq!(g.wait_for_end(&job, 3 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks[&0]["status"], "succeeded", "{tasks:?}");
    assert_eq!(tasks[&0]["cluster"], "c1", "{tasks:?}");
    let runs = std::fs::read_to_string(&ran).unwrap_or_default();
    assert_eq!(runs.lines().count(), 1, "ran once: {runs:?}");
    let file = g.job_file(&job).unwrap_or_default();
    assert_eq!(file["gathering"]["moves"], 1, "{file}");
    let status = String::from_utf8_lossy(&g.run(&["status", &job]).stdout).into_owned();
    assert!(status.contains("moved 1 time"), "{status}");
    // Its submission on s1 is gone, none is left on c1.
    wait_for("no component left", MINUTE, || {
        let on_s1 = slurm.jobs().into_iter().map(|j| j.name);
        let on_c1 = queues.jobs(queue).into_iter().map(|j| j.name);
        on_s1.chain(on_c1).all(|n| !n.starts_with(COMPONENT_PREFIX))
    });
}

/// A moldable component (1 to 8 slots, Amdahl 0.9, 10 minutes on one
/// slot) on a queue of 8 slots: with 6 of them held by local jobs for half
/// an hour it gets the 2 free now (5.5 minutes), on the idle queue all 8
/// (2 minutes 8 s), each with the walltime to match.
#[test]
fn a_moldable_component_gets_fewer_slots_on_a_busy_cluster_and_more_on_an_idle_one() {
    let queues = SgeQueues::new(1, 8);
    let queue = &queues.names[0];
    let local = half_hour_jobs(&queues, 6);
    let mut g = gleaner("moldable");
    g.write(
        "gleaner.toml",
        &format!("[[cluster]]\nname = \"c1\"\nbackend = \"sge\"\nqueue = \"{queue}\"\n"),
    );
    g.start("up", &["up"]);
    let slots = g.path().join("slots");
    let manifest = format!(
        "name = \"molded\"\nkind = \"grid\"\nwalltime = \"10m\"\n\
         [[component]]\nslots = {{ min = 1, max = 8 }}\nspeedup = \"amdahl:0.9\"\n\
         command = \"echo $GLEANER_SLOTS >> {}; sleep 8\"\n",
        slots.display()
    );
    // The component's walltime, as Grid Engine holds it while it runs.
    let walltime_while_it_runs = || {
        let mut h_rt = String::new();
        wait_for("the component to run", MINUTE, || {
            let Some(job) = queues
                .jobs(queue)
                .into_iter()
                .find(|j| j.name.starts_with(COMPONENT_PREFIX) && !j.host.is_empty())
            else {
                return false;
            };
            h_rt = sge("qstat", &["-j", &job.number])
                .lines()
                .find_map(|l| {
                    l.split("h_rt=")
                        .nth(1)
                        .map(|v| v.split([',', ' ']).next().unwrap_or("").to_owned())
                })
                .unwrap_or_default();
            !h_rt.is_empty()
        });
        h_rt
    };
    let busy = g.submit(&manifest);
    assert_eq!(walltime_while_it_runs(), "330");
    assert_eq!(g.wait_for_end(&busy, 2 * MINUTE), "done");
    for id in &local {
        sge("qdel", &[id]);
    }
    wait_for("the scheduler to see the queue idle", MINUTE, || {
        g.status()
            .is_some_and(|s| s["clusters"][0]["report"]["free_slots"] == 8)
    });
    let idle = g.submit(&manifest);
    assert_eq!(walltime_while_it_runs(), "128");
    assert_eq!(g.wait_for_end(&idle, 2 * MINUTE), "done");
    let seen = std::fs::read_to_string(&slots).unwrap_or_default();
    assert_eq!(seen.lines().collect::<Vec<_>>(), ["2", "8"]);
}
