//! The scheduler on a real Grid Engine cell: fair shares between sweeps,
//! grid jobs placed by priority, a standby taking over.

use std::{collections::BTreeMap, time::Duration};

use gleaner_testkit::{SgeQueues, by_task, finish, sweep, wait_for};
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::{MINUTE, gleaner};

fn config(queues: &SgeQueues) -> String {
    queues
        .names
        .iter()
        .enumerate()
        .map(|(i, queue)| {
            format!("[[cluster]]\nname = \"c{}\"\nbackend = \"sge\"\nqueue = \"{queue}\"\nh_rt = \"10m\"\n\n", i + 1)
        })
        .collect()
}

/// Slots each job's placeholders hold, per cluster, as the scheduler sees them.
fn holdings(status: &Value) -> BTreeMap<String, BTreeMap<String, u64>> {
    status["clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let jobs = c["report"]["jobs"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(job, h)| {
                    let slots =
                        h["running"].as_u64().unwrap_or(0) + h["pending"].as_u64().unwrap_or(0);
                    (job.clone(), slots)
                })
                .collect();
            (
                c["report"]["cluster"].as_str().unwrap_or("").to_owned(),
                jobs,
            )
        })
        .collect()
}

#[test]
fn three_sweeps_share_two_clusters_within_one_launcher() {
    let queues = SgeQueues::new(2, 6);
    let mut g = gleaner("fair-sep");
    g.write("gleaner.toml", &config(&queues));
    g.start("up", &["up"]);
    let jobs: Vec<String> = ["red", "green", "blue"]
        .iter()
        .map(|name| g.submit(&sweep(name, 300, "sleep 2")))
        .collect();
    let mut seen = String::new();
    let mut even_rounds = 0;
    wait_for(
        "an even share on both clusters, twice in a row",
        2 * MINUTE,
        || {
            let Some(status) = g.status() else {
                return false;
            };
            let shares = holdings(&status);
            seen = format!("{shares:?}");
            let even = shares.len() == 2
                && shares.values().all(|held| {
                    let slots: Vec<u64> = jobs
                        .iter()
                        .map(|j| held.get(j).copied().unwrap_or(0))
                        .collect();
                    let (min, max) = (slots.iter().min(), slots.iter().max());
                    slots.iter().sum::<u64>() == 6 && max.zip(min).is_some_and(|(a, b)| a - b <= 1)
                });
            even_rounds = if even { even_rounds + 1 } else { 0 };
            if !even {
                std::thread::sleep(Duration::from_millis(400));
            }
            even_rounds >= 2
        },
    );
    eprintln!("shares: {seen}");
    for job in &jobs {
        g.run(&["cancel", job]);
    }
}

#[test]
fn a_high_priority_grid_job_takes_a_whole_cluster_and_the_sweeps_grow_back() {
    let queues = SgeQueues::new(2, 4);
    let mut g = gleaner("grid-place");
    g.write("gleaner.toml", &config(&queues));
    g.start("up", &["up"]);
    let a = g.submit(&sweep("left", 80, "sleep 2"));
    let b = g.submit(&sweep("right", 80, "sleep 2"));
    // Settled: each sweep holds 2 slots of each cluster, on two polls running.
    let mut settled = 0;
    wait_for("the sweeps to share both clusters", 2 * MINUTE, || {
        let even = g.status().is_some_and(|s| {
            let shares = holdings(&s);
            shares.len() == 2
                && shares
                    .values()
                    .all(|held| held.get(&a) == Some(&2) && held.get(&b) == Some(&2))
        });
        settled = if even { settled + 1 } else { 0 };
        std::thread::sleep(Duration::from_millis(500));
        settled >= 2
    });

    let grid = g.submit_waiting(
        "name = \"rigid\"\nkind = \"grid\"\npriority = \"high\"\n[[component]]\nslots = 4\ncommand = \"echo slots=$NSLOTS; sleep 3\"\n",
    );
    let output = finish(grid, 2 * MINUTE);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "grid job failed: {stderr}");
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks[&0]["status"], "succeeded");
    let cluster = tasks[&0]["cluster"].as_str().unwrap().to_owned();
    let stdout = g.stdout(&job, 0).unwrap();
    // NSLOTS is set by Grid Engine: the component ran as a 4-slot batch job.
    assert_eq!(stdout, "slots=4\n");

    wait_for(
        "the sweeps to grow back on the grid job's cluster",
        MINUTE,
        || {
            g.status().is_some_and(|s| {
                holdings(&s)
                    .get(&cluster)
                    .is_some_and(|held| held.values().sum::<u64>() == 4)
            })
        },
    );
    let mut preemptions = 0;
    for sweep in [&a, &b] {
        assert_eq!(g.wait_for_end(sweep, 3 * MINUTE), "done");
        let tasks = by_task(&g.index(sweep));
        assert_eq!(tasks.len(), 80);
        assert!(
            tasks
                .values()
                .all(|t| t["status"] == "succeeded" && t["attempts"] == 1)
        );
        preemptions += g.job_file(sweep).unwrap()["preemptions"]
            .as_u64()
            .unwrap_or(0);
    }
    assert!(
        preemptions > 0,
        "the sweeps gave the cluster up for the grid job"
    );
}

#[test]
fn a_standby_scheduler_takes_over_and_the_sweeps_complete() {
    let queues = SgeQueues::new(1, 4);
    let mut g = gleaner("standby");
    g.write("gleaner.toml", &config(&queues));
    let active = g.start("scheduler", &["scheduler"]);
    g.start("standby", &["scheduler"]);
    g.start("runner", &["runner"]);
    g.start("kcm", &["kcm", "--cluster", "c1"]);
    let first = g.submit(&sweep("before", 30, "sleep 1; echo {n}"));
    wait_for("launchers for the first sweep", MINUTE, || {
        g.launchers(&first).len() == 4
    });
    g.signal(active, Signal::SIGKILL);

    // Only a scheduler can give the second sweep slots: the standby must.
    let second = g.submit(&sweep("after", 30, "sleep 1; echo {n}"));
    for job in [&first, &second] {
        assert_eq!(g.wait_for_end(job, 2 * MINUTE), "done");
        let tasks = by_task(&g.index(job));
        assert_eq!(tasks.len(), 30);
        assert!(tasks.values().all(|t| t["status"] == "succeeded"));
    }
    assert!(
        g.log("standby").contains("grow offer"),
        "the standby scheduled"
    );
    assert!(g.status().is_some(), "the standby answers status requests");
}

/// Tries of the one grid job waiting for placement, and its queue.
fn placement(status: &Value) -> Option<(u64, String)> {
    let placement = status["placements"].get(0)?;
    Some((
        placement["tries"].as_u64()?,
        placement["queue"].as_str()?.to_owned(),
    ))
}

#[test]
fn a_standby_scheduler_goes_on_counting_a_grid_jobs_placement_tries() {
    let mut g = gleaner("standby-grid");
    g.write(
        "gleaner.toml",
        "[scheduler]\nupgrade_after = 4\n\n\
         [[cluster]]\nname = \"small\"\nbackend = \"local\"\nslots = 2\n",
    );
    let active = g.start("scheduler", &["scheduler"]);
    g.start("runner", &["runner"]);
    g.start("kcm", &["kcm", "--cluster", "small"]);
    // The kcm's first report makes the first scheduler the active one.
    wait_for("the first scheduler to be active", MINUTE, || {
        g.log("scheduler").contains("scheduler active")
    });
    g.start("standby", &["scheduler"]);
    // Wider than any cluster: never placed, one try a round.
    let job = g
        .submit("name = \"wide\"\nkind = \"grid\"\n[[component]]\nslots = 4\ncommand = \"true\"\n");
    let mut before = (0, String::new());
    wait_for("six placement tries", MINUTE, || {
        let Some(status) = g.status() else {
            return false;
        };
        before = placement(&status).unwrap_or_default();
        before.0 >= 6
    });
    assert_eq!(before.1, "high", "upgraded after 4 tries");
    let text = String::from_utf8_lossy(&g.run(&["status", &job]).stdout).into_owned();
    assert!(
        text.contains(&format!("{job}: not placed after")) && text.contains("in the high queue"),
        "status says why the job waits: {text}"
    );

    g.signal(active, Signal::SIGKILL);
    // Only the standby is left to answer.
    let mut after = None;
    wait_for("the standby to answer", MINUTE, || {
        after = g.status().and_then(|s| placement(&s));
        after.is_some()
    });
    let (tries, queue) = after.unwrap_or_default();
    assert!(
        tries >= before.0,
        "the standby went on from {} tries, not from none: {tries}",
        before.0
    );
    assert_eq!(queue, "high");
    assert!(g.log("standby").contains("grid bookkeeping taken over"));
    assert!(g.run(&["cancel", &job]).status.success());
    assert_eq!(g.wait_for_end(&job, MINUTE), "cancelled");
}
