//! gleaner on a real Grid Engine cell (`deploy/sge/setup.sh`, and the
//! multi-host grid of `deploy/sge/hosts.sh`):
//! placeholders, local jobs first, kcm restarts, failing clusters. Every test
//! makes its own cluster queues and its own RabbitMQ vhost.

use std::{collections::BTreeSet, time::Duration};

use gleaner_protocol::naming::{COMPONENT_PREFIX, placeholder_name};
use gleaner_testkit::{Gleaner, SgeQueues, by_task, finish, qsub, sge, sweep, wait_for};
use nix::sys::signal::Signal;

use crate::{MINUTE, gleaner};

/// A configuration with one SGE cluster per (name, queue).
fn config(clusters: &[(&str, &str)]) -> String {
    clusters
        .iter()
        .map(|(name, queue)| {
            format!("[[cluster]]\nname = \"{name}\"\nbackend = \"sge\"\nqueue = \"{queue}\"\nh_rt = \"10m\"\n\n")
        })
        .collect()
}

/// Entries of a job's placeholders in `qstat` whose state contains `state`
/// (a running task each; pending tasks may share an entry).
fn placeholders(queues: &SgeQueues, queue: &str, job: &str, state: char) -> usize {
    let name = placeholder_name(job);
    queues
        .jobs(queue)
        .iter()
        .filter(|j| j.name == name && j.state.contains(state))
        .count()
}

/// `gleaner up` on one SGE cluster of `slots` slots, and a sweep of `tasks`
/// two-second tasks filling it.
fn busy_cluster(test: &str, slots: u32, tasks: u32) -> (SgeQueues, Gleaner, String) {
    let queues = SgeQueues::new(1, slots);
    let mut g = gleaner(test);
    g.write("gleaner.toml", &config(&[("c1", &queues.names[0])]));
    g.start("up", &["up"]);
    let job = g.submit(&sweep("busy", tasks, "sleep 2; echo {n}"));
    wait_for("the sweep to fill the queue", MINUTE, || {
        placeholders(&queues, &queues.names[0], &job, 'r') == slots as usize
    });
    (queues, g, job)
}

/// A cluster as `gleaner status --json` shows it (null when absent).
fn cluster_view(status: &serde_json::Value, name: &str) -> serde_json::Value {
    status["clusters"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["report"]["cluster"] == name))
        .cloned()
        .unwrap_or_default()
}

/// `gleaner up` on two SGE clusters of 4 slots, c1 and c2; `extra` goes
/// into c1's table.
fn two_clusters_up(test: &str, extra: &str) -> (SgeQueues, Gleaner) {
    let queues = SgeQueues::new(2, 4);
    let mut g = gleaner(test);
    let clusters = config(&[("c1", &queues.names[0]), ("c2", &queues.names[1])]);
    g.write(
        "gleaner.toml",
        &clusters.replacen("h_rt", &format!("{extra}h_rt"), 1),
    );
    g.start("up", &["up"]);
    (queues, g)
}

/// The batch job numbers of the jobs named `name` in a queue.
fn arrays_named(queues: &SgeQueues, queue: &str, name: &str) -> Vec<String> {
    queues
        .jobs(queue)
        .into_iter()
        .filter(|j| j.name == name)
        .map(|j| j.number)
        .collect()
}

#[test]
fn a_sweep_runs_on_two_sge_clusters_and_leaves_no_placeholder() {
    let (queues, g) = two_clusters_up("sge-two", "");
    let job = g.submit(&sweep("spread", 40, "sleep 1; echo {n}"));
    wait_for("running placeholders on both clusters", MINUTE, || {
        queues
            .names
            .iter()
            .all(|q| placeholders(&queues, q, &job, 'r') > 0)
    });
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 40);
    assert!(tasks.values().all(|t| t["status"] == "succeeded"));
    let clusters: BTreeSet<&str> = tasks
        .values()
        .filter_map(|t| t["cluster"].as_str())
        .collect();
    assert_eq!(clusters, BTreeSet::from(["c1", "c2"]));
    wait_for("the placeholders to end", MINUTE, || {
        queues.names.iter().all(|q| {
            queues
                .jobs(q)
                .iter()
                .all(|j| j.name != placeholder_name(&job))
        })
    });
}

#[test]
fn a_local_job_starts_while_the_sweep_still_has_pending_tasks() {
    let (queues, g, job) = busy_cluster("sge-local", 4, 40);
    let queue = &queues.names[0];

    let local = qsub(&["-N", "local", "-q", queue, "-b", "y", "/bin/sleep", "3"]);
    let mut pending_then = 0;
    wait_for("the local job to start", MINUTE, || {
        let started = queues
            .jobs(queue)
            .iter()
            .any(|j| j.number == local && j.state.contains('r'));
        if started {
            pending_then = g
                .job_file(&job)
                .map_or(0, |f| f["tasks"]["pending"].as_u64().unwrap_or(0));
        }
        started
    });
    assert!(
        pending_then > 0,
        "the sweep still had pending tasks when the local job started"
    );

    assert_eq!(g.wait_for_end(&job, 3 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 40);
    assert!(
        tasks
            .values()
            .all(|t| t["status"] == "succeeded" && t["attempts"] == 1)
    );
    assert!(
        g.job_file(&job).unwrap()["preemptions"].as_u64() > Some(0),
        "the local job took a launcher's slot"
    );
}

#[test]
fn pending_placeholders_are_withdrawn_when_a_local_job_waits() {
    let (queues, g, job) = busy_cluster("sge-withdraw", 2, 20);
    let queue = &queues.names[0];
    // Placeholders that lost the race for slots wait in the queue.
    let name = placeholder_name(&job);
    qsub(&[
        "-N",
        &name,
        "-q",
        queue,
        "-t",
        "1-3",
        "-b",
        "y",
        "/bin/sleep",
        "60",
    ]);
    wait_for("placeholders pending", MINUTE, || {
        placeholders(&queues, queue, &job, 'q') > 0
    });

    let local = qsub(&["-N", "local", "-q", queue, "-b", "y", "/bin/sleep", "2"]);
    wait_for("the pending placeholders to be withdrawn", MINUTE, || {
        placeholders(&queues, queue, &job, 'q') == 0
    });
    wait_for("the local job to start", MINUTE, || {
        queues
            .jobs(queue)
            .iter()
            .any(|j| j.number == local && j.state.contains('r'))
    });
    assert!(g.log("up").contains("withdrawing pending placeholders"));
    assert_eq!(g.wait_for_end(&job, 3 * MINUTE), "done");
    assert_eq!(by_task(&g.index(&job)).len(), 20);
}

#[test]
fn a_restarted_kcm_adopts_the_running_placeholders_on_every_host() {
    // Two slots on each host of the multi-host grid.
    let queues = SgeQueues::on_nodes(1, 2);
    let queue = &queues.names[0];
    let mut g = gleaner("sge-adopt");
    g.write("gleaner.toml", &config(&[("c1", queue)]));
    g.start("scheduler", &["scheduler"]);
    g.start("runner", &["runner"]);
    let kcm = g.start("kcm", &["kcm", "--cluster", "c1"]);
    // Tasks wait for `go`: all six placeholders run until the test has
    // seen the new kcm adopt them, however slowly a busy machine goes.
    let go = g.path().join("go");
    let job = g.submit(&sweep(
        "adopted",
        24,
        &format!(
            "while [ ! -e {} ]; do sleep 0.2; done; echo {{n}}",
            go.display()
        ),
    ));
    wait_for("six launchers", MINUTE, || {
        placeholders(&queues, queue, &job, 'r') == 6
    });
    let name = placeholder_name(&job);
    let hosts: BTreeSet<String> = queues
        .jobs(queue)
        .into_iter()
        .filter(|j| j.name == name)
        .map(|j| j.host)
        .collect();
    assert_eq!(hosts.len(), 3, "launchers on every host: {hosts:?}");
    g.signal(kcm, Signal::SIGKILL);
    std::thread::sleep(Duration::from_secs(2));
    g.start("kcm2", &["kcm", "--cluster", "c1"]);

    let mut arrays = BTreeSet::new();
    let adopted = || {
        g.status().is_some_and(|s| {
            s["clusters"].as_array().into_iter().flatten().any(|c| {
                c["report"]["cluster"] == "c1"
                    && c["report"]["jobs"][&job]["running"].as_u64() > Some(0)
                    && c["report"]["hosts"].as_array().is_some_and(|h| {
                        h.iter()
                            .filter(|h| h["scavenged"].as_u64() > Some(0))
                            .count()
                            == 3
                    })
            })
        })
    };
    wait_for(
        "the new kcm to report the job's placeholders on every host",
        2 * MINUTE,
        || {
            arrays.extend(arrays_named(&queues, queue, &name));
            adopted()
        },
    );
    std::fs::write(&go, "").expect("go");
    wait_for("the job to end", 3 * MINUTE, || {
        arrays.extend(arrays_named(&queues, queue, &name));
        g.job_state(&job).as_deref() == Some("done")
    });
    assert_eq!(
        arrays.len(),
        1,
        "no placeholders submitted twice: {arrays:?}"
    );
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 24);
    assert!(tasks.values().all(|t| t["status"] == "succeeded"));
}

#[test]
fn failing_clusters_are_reported_and_the_others_keep_working() {
    let queues = SgeQueues::new(2, 4);
    let (refusing, good) = (&queues.names[0], &queues.names[1]);
    // Placeholders ask for 10 minutes; this queue allows one.
    sge("qconf", &["-mattr", "queue", "h_rt", "60", refusing]);
    let missing = format!("missing{}.q", gleaner_testkit::rand_suffix());
    let mut g = gleaner("sge-broken");
    g.write(
        "gleaner.toml",
        &config(&[("c1", &missing), ("c2", refusing), ("c3", good)]),
    );
    g.start("up", &["up"]);
    let job = g.submit(&sweep("survivor", 48, "sleep 0.5; echo {n}"));
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 48);
    assert!(tasks.values().all(|t| t["cluster"] == "c3"));

    let status = g.status().expect("status");
    let cluster = |name: &str| cluster_view(&status, name);
    let error = |name: &str| {
        cluster(name)["report"]["error"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    assert!(error("c1").contains(&missing), "c1: {}", error("c1"));
    assert!(error("c2").contains("qsub"), "c2: {}", error("c2"));
    assert_eq!(
        cluster("c2")["excluded"],
        true,
        "three failed starts exclude a cluster"
    );
    assert_eq!(error("c3"), "");
    let text = String::from_utf8_lossy(&g.run(&["status"]).stdout).into_owned();
    assert!(text.contains("excluded"), "{text}");
    let log = g.log("up");
    assert!(
        log.contains("cannot read the batch system") && log.contains("cannot submit launchers")
    );
}

#[test]
fn placeholders_whose_launcher_cannot_start_exclude_their_cluster() {
    // c1's nodes have no gleaner where the kcm says: every placeholder
    // starts and ends at once, without its launcher reaching the broker.
    let (_queues, g) = two_clusters_up(
        "sge-dead-on-arrival",
        "launcher_program = \"/nonexistent/gleaner\"\n",
    );
    // Tasks wait for `go`: the job cannot end (which withdraws c1's pending
    // placeholders, and a withdrawn one is no failed start) before c1 is
    // seen excluded, however slowly a loaded machine starts them.
    let go = g.path().join("go");
    let started = std::time::Instant::now();
    let job = g.submit(&sweep(
        "elsewhere",
        60,
        &format!(
            "until test -e {}; do sleep 0.2; done; echo {{n}}",
            go.display()
        ),
    ));
    let c1_view = || {
        g.status()
            .map(|s| cluster_view(&s, "c1"))
            .unwrap_or_default()
    };
    let mut c1 = serde_json::Value::Null;
    wait_for("c1 to be excluded", 2 * MINUTE, || {
        c1 = c1_view();
        c1["excluded"] == true
    });
    std::fs::write(&go, "").expect("release the tasks");
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 60);
    assert!(tasks.values().all(|t| t["cluster"] == "c2"));

    // Failed starts are not forgotten: still excluded.
    wait_for("c1's status", MINUTE, || {
        c1 = c1_view();
        !c1.is_null()
    });
    assert_eq!(c1["excluded"], true, "{c1}");
    let error = c1["report"]["error"].as_str().unwrap_or("");
    assert!(
        error.contains("ended before its launcher reached the broker"),
        "{error}"
    );
    let log = g.log("up");
    let submitted = log
        .lines()
        .filter(|l| l.contains("launchers submitted") && l.contains("cluster=c1"))
        .count();
    // Before the exclusion, one grow at most per count of failed starts
    // below 3 (a slow cluster reports them over several polls); then a
    // one-slot trial at once and one per `probe_interval` (60 s).
    let trials = 1 + started.elapsed().as_secs() as usize / 60;
    assert!(
        (1..=3 + trials).contains(&submitted),
        "c1 got {submitted} grows after its launchers failed"
    );
}

#[test]
fn a_grid_job_that_loses_a_component_runs_again_whole() {
    let (queues, g) = two_clusters_up("sge-lost-component", "");
    // The first run's components wait until stopped; the second's end at
    // once. Each run of a component leaves a file when its command starts.
    let again = g.path().join("again");
    let started = g.path().join("started");
    std::fs::create_dir(&started).expect("started dir");
    let command = format!(
        "mktemp {}/XXXXXX >/dev/null; test -e {} || sleep 300; echo ran",
        started.display(),
        again.display()
    );
    let job = g.submit(&format!(
        "name = \"rigid\"\nkind = \"grid\"\n\
         [[component]]\nslots = 3\ncommand = \"{command}\"\n\
         [[component]]\nslots = 3\ncommand = \"{command}\"\n"
    ));
    let components = || -> Vec<(String, gleaner_testkit::SgeJob)> {
        queues
            .names
            .iter()
            .flat_map(|q| queues.jobs(q).into_iter().map(move |j| (q.clone(), j)))
            .filter(|(_, j)| j.name.starts_with(COMPONENT_PREFIX))
            .collect()
    };
    wait_for("both components to run", MINUTE, || {
        let running = components();
        running.len() == 2 && running.iter().all(|(_, j)| j.state.contains('r'))
    });
    // Past the barrier: both commands run, and wait for the marker.
    wait_for("both components' commands to start", MINUTE, || {
        std::fs::read_dir(&started).map_or(0, |d| d.count()) == 2
    });
    // One component vanishes without an exit status, as with its host.
    std::fs::write(&again, "").expect("marker");
    let (_, lost) = components().remove(0);
    sge("qdel", &[&lost.number]);
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 2, "one index line per component");
    assert!(
        tasks.values().all(|t| t["status"] == "succeeded"),
        "{tasks:?}"
    );
    let file = g.job_file(&job).expect("job file");
    assert_eq!(file["restarts"], 1);
    let log = g.log("up");
    assert!(log.contains("vanished without an exit status"), "{log}");
    assert!(
        log.contains("its host was lost, or the batch system killed it"),
        "counted as the cluster's failure: {log}"
    );
    assert!(components().is_empty(), "nothing left in the queues");
}

#[test]
fn launchers_leave_before_their_placeholder_walltime_without_losing_a_task() {
    let queues = SgeQueues::new(1, 2);
    let queue = &queues.names[0];
    let mut g = gleaner("sge-walltime");
    // Placeholders live 14 s; launchers stop 3 s before. A task may take 5 s.
    let logs = g.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let cluster = config(&[("c1", queue)]).replace("\"10m\"", "\"14s\"");
    g.write(
        "gleaner.toml",
        &format!(
            "[launcher]\ndeadline_margin = \"3s\"\n\n{cluster}log_dir = {:?}\n",
            logs.display().to_string()
        ),
    );
    g.start("up", &["up"]);
    let job = g.submit(
        "name = \"rotating\"\nwalltime = \"5s\"\n[sweep]\ncommand = \"sleep 2; echo {n}\"\nparams = { n = { from = 1, to = 16 } }\n",
    );
    let name = placeholder_name(&job);
    let mut arrays = BTreeSet::new();
    wait_for("the job to end", 3 * MINUTE, || {
        arrays.extend(arrays_named(&queues, queue, &name));
        g.job_state(&job).as_deref() == Some("done")
    });
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 16);
    assert!(
        tasks
            .values()
            .all(|t| t["status"] == "succeeded" && t["attempts"] == 1),
        "no task was killed by the batch system: {tasks:?}"
    );
    assert!(
        arrays.len() >= 2,
        "placeholders were replaced as they ran out of time: {arrays:?}"
    );
    let launcher_logs: String = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    assert!(
        launcher_logs.contains("would outlast the placeholder")
            || launcher_logs.contains("walltime ending"),
        "launchers stopped for their walltime:\n{launcher_logs}"
    );
    assert!(
        sge("qacct", &["-j", &name])
            .lines()
            .filter(|l| l.starts_with("exit_status"))
            .all(|l| l.split_whitespace().nth(1) == Some("0")),
        "every placeholder ended by itself"
    );
}

/// A resource quota that lets one slot of a queue run at a time, removed
/// on drop: more jobs wait there for a reason gleaner cannot see (and one
/// runs, so that Grid Engine accepts them: `qsub -w e`).
struct OneSlotRuns {
    name: String,
}

impl OneSlotRuns {
    fn new(queue: &str) -> Self {
        let name = format!("gl{}", gleaner_testkit::rand_suffix());
        let file = std::env::temp_dir().join(format!("{name}.rqs"));
        std::fs::write(
            &file,
            format!("{{\n name {name}\n description NONE\n enabled TRUE\n limit queues {queue} to slots=1\n}}\n"),
        )
        .unwrap();
        sge("qconf", &["-Arqs", &file.display().to_string()]);
        let _ = std::fs::remove_file(file);
        assert!(
            sge("qconf", &["-srqsl"]).lines().any(|l| l == name),
            "quota added"
        );
        Self { name }
    }
}

impl Drop for OneSlotRuns {
    fn drop(&mut self) {
        sge("qconf", &["-drqs", &self.name]);
    }
}

/// Clusters c1, where one slot at most runs, and c2, with `max_pending`
/// 5 s; the scheduler and a runner, no kcm yet.
fn stuck_and_good(test: &str) -> (SgeQueues, OneSlotRuns, Gleaner) {
    let queues = SgeQueues::new(2, 4);
    let quota = OneSlotRuns::new(&queues.names[0]);
    let mut g = gleaner(test);
    let clusters = config(&[("c1", &queues.names[0]), ("c2", &queues.names[1])]).replacen(
        "h_rt = \"10m\"\n",
        "h_rt = \"10m\"\nmax_pending = \"5s\"\n",
        1,
    );
    g.write("gleaner.toml", &clusters);
    g.start("scheduler", &["scheduler"]);
    g.start("runner", &["runner"]);
    (queues, quota, g)
}

#[test]
fn a_grid_component_stuck_in_the_queue_is_placed_again_elsewhere() {
    let (queues, _quota, mut g) = stuck_and_good("sge-stuck-grid");
    let stuck = &queues.names[0];
    // A local job takes the one slot c1's quota lets run.
    let local = qsub(&["-N", "local", "-q", stuck, "-b", "y", "/bin/sleep", "300"]);
    wait_for("the local job to run", MINUTE, || {
        queues
            .jobs(stuck)
            .iter()
            .any(|j| j.number == local && j.state.contains('r'))
    });
    g.start("kcm1", &["kcm", "--cluster", "c1"]);
    let grid = g.submit_waiting(
        "name = \"rigid\"\nkind = \"grid\"\n[[component]]\nslots = 1\ncommand = \"echo ran\"\n",
    );
    wait_for("the component waiting on c1", MINUTE, || {
        queues
            .jobs(stuck)
            .iter()
            .any(|j| j.name.starts_with(COMPONENT_PREFIX) && j.state.contains("qw"))
    });
    g.start("kcm2", &["kcm", "--cluster", "c2"]);
    let output = finish(grid, 2 * MINUTE);
    assert!(
        output.status.success(),
        "grid job failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        g.log("runner")
    );
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks[&0]["status"], "succeeded");
    assert_eq!(
        tasks[&0]["cluster"], "c2",
        "placed again where it could run"
    );
    assert!(g.log("kcm1").contains("to be placed again"));
    assert!(g.log("runner").contains("waiting to be placed again"));
    assert!(
        !queues
            .jobs(stuck)
            .iter()
            .any(|j| j.name.starts_with(COMPONENT_PREFIX)),
        "nothing left in c1's queue"
    );
}

#[test]
fn placeholders_stuck_in_the_queue_are_withdrawn_and_the_job_runs_elsewhere() {
    let (queues, _quota, mut g) = stuck_and_good("sge-stuck");
    let stuck = &queues.names[0];
    g.start("kcm1", &["kcm", "--cluster", "c1"]);
    // Four tasks: c1's four placeholders cover the job, one runs.
    let job = g.submit(&sweep("moved", 4, "sleep 6; echo {n}"));
    wait_for("placeholders waiting on c1", MINUTE, || {
        placeholders(&queues, stuck, &job, 'q') > 0
    });
    // c2 comes up while c1 holds the job's demand in waiting placeholders.
    g.start("kcm2", &["kcm", "--cluster", "c2"]);
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 4);
    assert!(
        tasks.values().any(|t| t["cluster"] == "c2"),
        "the withdrawn slots were offered on c2: {tasks:?}\n{}\n{}",
        g.log("scheduler"),
        g.log("runner")
    );
    assert!(g.log("kcm1").contains("longer than 5s: withdrawn"));
    wait_for("no placeholder left waiting on c1", MINUTE, || {
        placeholders(&queues, stuck, &job, 'q') == 0
    });
}

#[test]
fn a_cap_on_scavenging_does_not_keep_a_grid_job_off_a_cluster() {
    let queues = SgeQueues::new(2, 8);
    let mut g = gleaner("sge-capped-grid");
    let capped = config(&[("c1", &queues.names[0]), ("c2", &queues.names[1])]).replacen(
        "h_rt = \"10m\"\n",
        "h_rt = \"10m\"\nmax_scavenged = 0\n",
        1,
    );
    g.write("gleaner.toml", &capped);
    g.start("up", &["up"]);
    // Two components of 6 slots need both 8-slot clusters, c1 capped to
    // no scavenging at all.
    let grid = g.submit_waiting(
        "name = \"rigid\"\nkind = \"grid\"\npriority = \"high\"\n[[component]]\nslots = 6\ncommand = \"echo a\"\n[[component]]\nslots = 6\ncommand = \"echo b\"\n",
    );
    let output = finish(grid, 2 * MINUTE);
    assert!(
        output.status.success(),
        "grid job failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        g.log("up")
    );
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let clusters: BTreeSet<String> = by_task(&g.index(&job))
        .values()
        .filter_map(|t| t["cluster"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(clusters, BTreeSet::from(["c1".to_owned(), "c2".to_owned()]));
}

/// `gleaner doctor --nodes` checks a Grid Engine cluster from one of its
/// nodes through a one-slot probe (its gleaner, its clock, the broker
/// from there), and says what to do about a queue Grid Engine does not
/// know.
#[test]
fn doctor_probes_a_grid_engine_cluster_from_a_node_and_names_the_fix_for_a_missing_queue() {
    let queues = SgeQueues::new(1, 1);
    let mut g = gleaner("doctor-sge");
    let good = &queues.names[0];
    g.write(
        "gleaner.toml",
        &format!(
            "{}[[cluster]]\nname = \"gone\"\nbackend = \"sge\"\nqueue = \"no-such.q\"\n",
            config(&[("c1", good)])
        ),
    );
    g.start("up", &["up"]);
    wait_for("c1's kcm to report", MINUTE, || {
        g.status()
            .is_some_and(|s| cluster_view(&s, "c1")["report"]["total_slots"] == 1)
    });
    let output = finish(
        g.client(&[
            "doctor",
            "--nodes",
            "--node-timeout",
            "90s",
            "--output",
            "json",
        ]),
        3 * MINUTE,
    );
    let findings: Vec<serde_json::Value> =
        serde_json::from_slice(&output.stdout).expect("doctor's JSON");
    let said = |check: &str| {
        findings
            .iter()
            .find(|f| f["check"].as_str().is_some_and(|c| c.starts_with(check)))
            .unwrap_or_else(|| panic!("no {check}: {findings:#?}"))
    };
    assert_eq!(output.status.code(), Some(1), "{findings:#?}");
    for check in [
        "scheduler",
        "cluster c1: kcm",
        "cluster c1: qstat",
        &format!("cluster c1: queue {good}"),
        "cluster c1: launcher program",
    ] {
        assert_eq!(said(check)["verdict"], "ok", "{check}: {findings:#?}");
    }
    let node: Vec<_> = findings
        .iter()
        .filter(|f| {
            f["check"]
                .as_str()
                .is_some_and(|c| c.starts_with("cluster c1: node "))
        })
        .collect();
    assert_eq!(
        node.len(),
        3,
        "gleaner, clock and broker from the node: {findings:#?}"
    );
    assert!(node.iter().all(|f| f["verdict"] == "ok"), "{node:#?}");
    let missing = said("cluster gone: queue no-such.q");
    assert_eq!(missing["verdict"], "fail");
    assert!(
        missing["fix"]
            .as_str()
            .is_some_and(|f| f.contains("qconf -sql")),
        "{missing}"
    );
    // Not sent to a cluster that already failed a check.
    assert_eq!(said("cluster gone: probe from a node")["verdict"], "warn");
    assert!(
        !g.path().read_dir().expect("dir").flatten().any(|e| e
            .file_name()
            .to_string_lossy()
            .starts_with(".gleaner-doctor-")),
        "the probe's directory is removed"
    );
}
