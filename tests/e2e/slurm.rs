//! gleaner on the real Slurm of the dev grid (`deploy/slurm/setup.sh`: three
//! 4-CPU test hosts in network namespaces, partitions `gleaner` for the
//! placeholders and `local` for the cluster's own jobs on the same nodes).
//! The tests share those nodes, so they run one at a time
//! ([`SlurmCluster::lock`]); each has its own RabbitMQ vhost.

use std::collections::{BTreeMap, BTreeSet};

use gleaner_protocol::naming::placeholder_name;
use gleaner_testkit::{
    Gleaner, SgeQueues, SlurmCluster, assert_one_task_per_gpu, by_task, finish, gpu_sweep,
    most_on_one_host, sbatch, sweep, wait_for,
};
use nix::sys::signal::Signal;

use crate::{MINUTE, gleaner};

/// CPUs of each test host.
const NODE_CPUS: usize = 4;
const NODES: usize = 3;

/// One Slurm cluster: only the partition is required.
fn config() -> String {
    format!(
        "[[cluster]]\nname = \"s1\"\nbackend = \"slurm\"\npartition = \"{}\"\n",
        SlurmCluster::PARTITION
    )
}

/// The job's running placeholders: array task id → node.
fn running(slurm: &SlurmCluster, job: &str) -> BTreeMap<String, String> {
    let name = placeholder_name(job);
    slurm
        .jobs()
        .into_iter()
        .filter(|j| j.name == name && j.state == "RUNNING")
        .map(|j| (j.id, j.node))
        .collect()
}

/// Where a local job runs, once it does.
fn node_of(slurm: &SlurmCluster, id: &str) -> Option<String> {
    slurm
        .jobs()
        .into_iter()
        .find(|j| j.id == id && j.state == "RUNNING")
        .map(|j| j.node)
}

/// A task command that waits for the file `go` in `g`'s directory, so that
/// a sweep cannot end before the test has seen what it waits for, however
/// slowly a busy machine goes; the file's path and the command.
fn gated(g: &Gleaner) -> (std::path::PathBuf, String) {
    let go = g.path().join("go");
    let command = format!(
        "while [ ! -e {} ]; do sleep 0.2; done; echo {{n}}",
        go.display()
    );
    (go, command)
}

/// The job's placeholders once they run on every CPU of the partition.
fn filled(slurm: &SlurmCluster, job: &str) -> BTreeMap<String, String> {
    let mut before = BTreeMap::new();
    wait_for("the sweep to fill the partition", 2 * MINUTE, || {
        before = running(slurm, job);
        before.len() == NODES * NODE_CPUS
    });
    before
}

/// Waits until the local job `local` runs, adding the placeholders running
/// `before` that went to `gone`; its node.
fn started(
    slurm: &SlurmCluster,
    job: &str,
    before: &BTreeMap<String, String>,
    gone: &mut BTreeSet<String>,
    local: &str,
) -> String {
    let mut node = None;
    watch(slurm, job, before, gone, "the local job to start", || {
        node = node_of(slurm, local);
        node.is_some()
    });
    node.unwrap_or_default()
}

/// Waits until `done`, adding the placeholders running `before` that went
/// away to `gone`.
fn watch(
    slurm: &SlurmCluster,
    job: &str,
    before: &BTreeMap<String, String>,
    gone: &mut BTreeSet<String>,
    what: &str,
    mut done: impl FnMut() -> bool,
) {
    wait_for(what, MINUTE, || {
        let now = running(slurm, job);
        gone.extend(before.keys().filter(|id| !now.contains_key(*id)).cloned());
        done()
    });
}

#[test]
fn a_sweep_on_slurm_completes_and_leaves_no_placeholder() {
    let slurm = SlurmCluster::lock();
    let mut g = gleaner("slurm-sweep");
    g.write("gleaner.toml", &config());
    g.start("up", &["up"]);
    let job = g.submit(&sweep("on-slurm", 60, "sleep 1; echo {n} $(hostname)"));
    let mut nodes = BTreeSet::new();
    wait_for("placeholders running on every node", 2 * MINUTE, || {
        nodes.extend(running(&slurm, &job).into_values());
        nodes.len() == NODES
    });
    g.assert_all_done_once(&job, 60);
    let ran_on: BTreeSet<String> = by_task(&g.index(&job))
        .values()
        .filter_map(|t| t["host"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ran_on, nodes, "tasks ran on the nodes of the placeholders");
    wait_for("no placeholder left", MINUTE, || {
        !slurm
            .jobs()
            .iter()
            .any(|j| j.name == placeholder_name(&job))
    });
}

#[test]
fn local_jobs_start_while_the_sweep_runs_and_only_the_launchers_needed_go() {
    let slurm = SlurmCluster::lock();
    let mut g = gleaner("slurm-local");
    g.write("gleaner.toml", &config());
    g.start("up", &["up"]);
    let (go, command) = gated(&g);
    let job = g.submit(&sweep("fill", 240, &command));
    let before = filled(&slurm, &job);
    let mut gone = BTreeSet::new();
    let one = sbatch(&["-p", SlurmCluster::LOCAL, "-n1", "--wrap", "sleep 120"]);
    watch(
        &slurm,
        &job,
        &before,
        &mut gone,
        "the one-CPU local job to start",
        || node_of(&slurm, &one).is_some(),
    );
    assert_eq!(gone.len(), 1, "one launcher for one CPU: {gone:?}");
    let whole = sbatch(&[
        "-p",
        SlurmCluster::LOCAL,
        "-N1",
        "-n4",
        "--wrap",
        "sleep 120",
    ]);
    let node = started(&slurm, &job, &before, &mut gone, &whole);
    let hit: Vec<&String> = gone.iter().map(|id| &before[id]).collect();
    assert_eq!(
        hit.iter().filter(|n| ***n == node).count(),
        NODE_CPUS,
        "the whole node's launchers went: {gone:?} of {before:?}"
    );
    assert_eq!(gone.len(), NODE_CPUS + 1, "and no others: {gone:?}");
    std::fs::write(&go, "").unwrap();
    g.assert_all_done_once(&job, 240);
}

#[test]
fn a_restarted_kcm_adopts_the_placeholders_and_submits_no_second_array() {
    let slurm = SlurmCluster::lock();
    let mut g = gleaner("slurm-kcm");
    g.write("gleaner.toml", &config());
    g.start("scheduler", &["scheduler"]);
    g.start("runner", &["runner"]);
    let kcm = g.start("kcm", &["kcm", "--cluster", "s1"]);
    let job = g.submit(&sweep("adopted", 120, "sleep 2; echo {n}"));
    let before = filled(&slurm, &job);
    g.signal(kcm, Signal::SIGKILL);
    g.start("kcm2", &["kcm", "--cluster", "s1"]);
    g.assert_all_done_once(&job, 120);
    let arrays: BTreeSet<String> = before
        .keys()
        .map(|id| id.split('_').next().unwrap_or(id).to_owned())
        .collect();
    assert_eq!(arrays.len(), 1, "one array: {before:?}");
    assert!(
        !g.log("kcm2").contains("launchers submitted"),
        "the new kcm adopted the placeholders rather than submitting more"
    );
}

#[test]
fn slurm_preempting_a_placeholder_itself_loses_nothing_and_requeues_nothing() {
    let slurm = SlurmCluster::lock();
    let mut g = gleaner("slurm-preempted");
    g.write(
        "gleaner.toml",
        &config().replace(SlurmCluster::PARTITION, SlurmCluster::SCAVENGER),
    );
    g.start("scheduler", &["scheduler"]);
    g.start("runner", &["runner"]);
    let kcm = g.start("kcm", &["kcm", "--cluster", "s1"]);
    let (go, command) = gated(&g);
    let job = g.submit(&sweep("scavenging", 120, &command));
    let before = filled(&slurm, &job);
    // Without its kcm gleaner does not see the site's job: Slurm alone
    // makes room for it, by preempting placeholders.
    g.signal(kcm, Signal::SIGTERM);
    let site = sbatch(&["-p", SlurmCluster::SITE, "-N1", "-n4", "--wrap", "sleep 60"]);
    let mut node = None;
    wait_for("the site's job to preempt its way in", MINUTE, || {
        node = node_of(&slurm, &site);
        node.is_some()
    });
    let node = node.unwrap_or_default();
    let preempted: Vec<&String> = before
        .iter()
        .filter(|(_, n)| **n == node)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(preempted.len(), NODE_CPUS);
    for id in &preempted {
        // Signalled at preemption, the launcher gave its tasks back and left.
        let state = slurm.state(id);
        assert!(
            !state.contains("PreemptTime=None") && state.contains("PreemptTime="),
            "{id} was preempted by Slurm: {state}"
        );
        assert!(state.contains("Restarts=0"), "{id} not requeued: {state}");
    }
    assert!(
        !slurm
            .jobs()
            .iter()
            .any(|j| j.name == placeholder_name(&job) && j.state != "RUNNING"),
        "no placeholder requeued"
    );
    std::fs::write(&go, "").unwrap();
    g.start("kcm2", &["kcm", "--cluster", "s1"]);
    g.assert_all_done_once(&job, 120);
}

#[test]
fn a_placeholder_started_before_a_reservation_takes_only_tasks_that_end_before_it() {
    let slurm = SlurmCluster::lock();
    // An hour's placeholders fit before the reservation only with less
    // time: Slurm's main scheduler gives them their least, 5 minutes, its
    // backfill as much as fits before the reservation; never the hour.
    let reservation_in = std::time::Duration::from_secs(12 * 60);
    let _maintenance = slurm.reserve_nodes_in(reservation_in);
    let mut g = gleaner("slurm-hole");
    let logs = g.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    g.write(
        "gleaner.toml",
        &format!(
            "{}h_rt = \"1h\"\nmin_walltime = \"5m\"\nlog_dir = {:?}\n",
            config(),
            logs.display().to_string()
        ),
    );
    g.start("up", &["up"]);
    let job = |name: &str, walltime: &str| {
        format!(
            "name = \"{name}\"\nwalltime = \"{walltime}\"\n[sweep]\ncommand = \"echo {{n}}\"\nparams = {{ n = {{ from = 1, to = 4 }} }}\n"
        )
    };
    let short = g.submit(&job("short", "1m"));
    // Longer than any time Slurm may give before the reservation.
    let long = g.submit(&job("long", "15m"));
    let names = [placeholder_name(&short), placeholder_name(&long)];
    let mut limits = BTreeSet::new();
    // Each launcher of the long job's first array gets one of its four
    // tasks: all four give theirs back, the array's last (whose id is the
    // array's) included, or one runs.
    let first_array_gave_back = || {
        let prefix = format!("{}.", names[1]);
        let mut arrays: BTreeMap<u64, Vec<bool>> = BTreeMap::new();
        for entry in std::fs::read_dir(&logs).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let array = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.split('_').next())
                .and_then(|id| id.parse().ok());
            if let Some(array) = array {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let gave_back = text.contains("would outlast the placeholder");
                arrays.entry(array).or_default().push(gave_back);
            }
        }
        arrays
            .into_values()
            .next()
            .is_some_and(|first| first.len() == 4 && first.iter().all(|&gave_back| gave_back))
    };
    wait_for(
        "the short job to end, and the long job's first launchers to give their 15-minute tasks back or one to run it",
        2 * MINUTE,
        || {
            for placeholder in slurm.jobs() {
                if names.contains(&placeholder.name) && placeholder.state == "RUNNING" {
                    let state = slurm.state(&placeholder.id);
                    let limit = state
                        .split_whitespace()
                        .find_map(|f| f.strip_prefix("TimeLimit="))
                        .and_then(minutes_of);
                    limits.extend(limit);
                }
            }
            (first_array_gave_back() || !g.index(&long).is_empty())
                && g.job_state(&short).as_deref() == Some("done")
        },
    );
    let reservation_in = reservation_in.as_secs() / 60;
    assert!(
        !limits.is_empty() && limits.iter().all(|m| (5..=reservation_in).contains(m)),
        "placeholders got between their least time and the reservation: {limits:?} minutes"
    );
    assert_eq!(
        g.index(&long),
        Vec::<serde_json::Value>::new(),
        "no 15-minute task ran"
    );
    g.assert_all_done_once(&short, 4);
}

/// Whole minutes of a Slurm time limit (`[D-]HH:MM:SS` or `MM:SS`).
fn minutes_of(limit: &str) -> Option<u64> {
    let (days, clock) = match limit.split_once('-') {
        Some((days, clock)) => (days.parse::<u64>().ok()?, clock),
        None => (0, limit),
    };
    let parts: Vec<u64> = clock
        .split(':')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let seconds = match parts[..] {
        [h, m, s] => h * 3600 + m * 60 + s,
        [m, s] => m * 60 + s,
        _ => return None,
    };
    Some(days * 1440 + seconds / 60)
}

/// A site's job waits for the whole partition, Slurm reserving its start
/// for when the job holding two thirds of it ends; the third left idle
/// until then is a hole Slurm's backfill fills with the placeholders of a
/// sweep with a time range, while the waiting job keeps its start.
#[test]
fn a_sweep_fills_the_hole_slurm_keeps_before_a_wide_jobs_reserved_start() {
    let slurm = SlurmCluster::lock();
    let cores = slurm.cores(SlurmCluster::SITE);
    let site = |cpus: u32, minutes: u32, command: &str| {
        sbatch(&[
            "-p",
            SlurmCluster::SITE,
            &format!("-n{cpus}"),
            &format!("--time={minutes}"),
            "--wrap",
            command,
        ])
    };
    let holder = site(cores * 2 / 3, 10, "sleep 600");
    wait_for("the site's first job to run", MINUTE, || {
        slurm.state(&holder).contains("JobState=RUNNING")
    });
    let wide = site(cores, 5, "sleep 1");
    wait_for("the wide job's start to be reserved", MINUTE, || {
        let state = slurm.state(&wide);
        state.contains("JobState=PENDING") && state.contains("Reason=Resources")
    });
    let mut g = gleaner("slurm-backfill");
    g.write(
        "gleaner.toml",
        &format!("{}walltime = \"5m\"\nmin_walltime = \"1m\"\n", config()),
    );
    g.start("up", &["up"]);
    let job = g.submit(
        "name = \"holes\"\nwalltime = \"30s\"\n[sweep]\ncommand = \"sleep 1\"\nparams = { n = { from = 1, to = 8 } }\n",
    );
    wait_for("the sweep to run in the hole", 3 * MINUTE, || {
        g.job_state(&job).as_deref() == Some("done")
    });
    g.assert_all_done_once(&job, 8);
    assert!(
        slurm.state(&wide).contains("JobState=PENDING"),
        "the wide job waits for the site's first job, not for gleaner"
    );
    // Its holder ends: it starts, nothing of gleaner's in its way.
    gleaner_testkit::slurm("scancel", &[&holder]);
    wait_for("the wide job to start", MINUTE, || {
        !slurm.state(&wide).contains("JobState=PENDING")
    });
}

#[test]
fn a_grid_component_runs_as_an_ordinary_slurm_job_on_one_node() {
    let _slurm = SlurmCluster::lock();
    let mut g = gleaner("slurm-grid");
    g.write("gleaner.toml", &config());
    g.start("up", &["up"]);
    let grid = g.submit_waiting(
        "name = \"rigid\"\nkind = \"grid\"\n[[component]]\nslots = 4\ncommand = \"echo $SLURM_NTASKS $SLURM_JOB_NUM_NODES\"\n",
    );
    let output = finish(grid, 2 * MINUTE);
    assert!(
        output.status.success(),
        "grid job failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let stdout = g.stdout(&job, 0).unwrap_or_default();
    assert_eq!(stdout, "4 1\n", "four tasks on one node");
}

#[test]
fn one_sweep_runs_across_a_grid_engine_and_a_slurm_cluster() {
    let _slurm = SlurmCluster::lock();
    let queues = SgeQueues::new(1, 4);
    let mut g = gleaner("slurm-mixed");
    g.write(
        "gleaner.toml",
        &format!(
            "{}[[cluster]]\nname = \"c1\"\nbackend = \"sge\"\nqueue = \"{}\"\nh_rt = \"10m\"\n",
            config(),
            queues.names[0]
        ),
    );
    g.start("up", &["up"]);
    let job = g.submit(&sweep("both", 160, "sleep 1; echo {n}"));
    g.assert_all_done_once(&job, 160);
    let clusters: BTreeSet<String> = by_task(&g.index(&job))
        .values()
        .filter_map(|t| t["cluster"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(clusters, BTreeSet::from(["c1".to_owned(), "s1".to_owned()]));
}

#[test]
fn a_gpu_sweep_on_slurm_runs_one_task_per_gpu_and_tasks_by_memory() {
    let slurm = SlurmCluster::lock();
    let mut g = gleaner("slurm-gpus");
    g.write("gleaner.toml", &config());
    g.start("up", &["up"]);
    // Two GPUs per host: six tasks at once at most, one per device.
    let manifest = gpu_sweep(&g, "gpus", 18, 1, "memory = \"1500M\"");
    let job = g.submit(&manifest);
    let mut most = 0;
    wait_for("the GPU sweep to end", 3 * MINUTE, || {
        most = most.max(most_on_one_host(running(&slurm, &job).into_values()));
        g.job_state(&job).is_some_and(|s| s == "done")
    });
    assert!(
        (1..=2).contains(&most),
        "{most} one-GPU placeholders on a two-GPU node at most"
    );
    let used = assert_one_task_per_gpu(&g, &job, 18);
    for (host, devices) in &used {
        assert!(
            devices.iter().all(|d| d == "0" || d == "1"),
            "{host}: the devices Slurm assigned: {devices:?}"
        );
    }
    assert!(
        used.values().any(|devices| devices.len() == 2),
        "both GPUs of a host in use: {used:?}"
    );
}

#[test]
fn a_local_job_wanting_most_of_a_nodes_memory_empties_that_node_only() {
    let slurm = SlurmCluster::lock();
    let mut g = gleaner("slurm-memory");
    g.write("gleaner.toml", &config());
    g.start("up", &["up"]);
    let (go, command) = gated(&g);
    // Launchers of 900M tasks (964M with their own) hold nearly all of every node's 4000M.
    let manifest = format!("memory = \"900M\"\n{}", sweep("fill", 240, &command));
    let job = g.submit(&manifest);
    let before = filled(&slurm, &job);
    let mut gone = BTreeSet::new();
    let local = sbatch(&[
        "-p",
        SlurmCluster::LOCAL,
        "-n1",
        "--mem=3000M",
        "--wrap",
        "sleep 120",
    ]);
    let node = started(&slurm, &job, &before, &mut gone, &local);
    let hit: BTreeSet<&String> = gone.iter().map(|id| &before[id]).collect();
    assert_eq!(hit, BTreeSet::from([&node]), "{gone:?} of {before:?}");
    assert!(gone.len() >= 3, "3000M of 964M launchers: {gone:?}");
    std::fs::write(&go, "").unwrap();
    g.assert_all_done_once(&job, 240);
}
