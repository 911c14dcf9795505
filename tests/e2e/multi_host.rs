//! gleaner on the multi-host Grid Engine grid (`deploy/sge/hosts.sh`: three
//! hosts in network namespaces, queues spanning all of them): local jobs
//! that need one host are given one host, and only that host's launchers
//! are preempted. Every test makes its own queue and RabbitMQ vhost.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use gleaner_protocol::naming::placeholder_name;
use gleaner_testkit::{
    Gleaner, SgeQueues, assert_one_task_per_gpu, finish, gpu_sweep, most_on_one_host, qsub, sge,
    sge_gpus_lock, sweep, wait_for,
};

use crate::{MINUTE, gleaner};

/// Slots of each host in the tests' queues.
const HOST_SLOTS: u32 = 4;

/// One SGE cluster on `queue`, with extra keys for its `[[cluster]]`.
fn config(queue: &str, extra: &str) -> String {
    format!(
        "[[cluster]]\nname = \"c1\"\nbackend = \"sge\"\nqueue = \"{queue}\"\nh_rt = \"10m\"\n{extra}\n"
    )
}

/// The job's running placeholders: batch id → host.
fn running(queues: &SgeQueues, job: &str) -> BTreeMap<String, String> {
    let name = placeholder_name(job);
    queues
        .jobs(&queues.names[0])
        .into_iter()
        .filter(|j| j.name == name && j.state.contains('r'))
        .map(|j| (format!("{}.{}", j.number, j.tasks), j.host))
        .collect()
}

/// A local job `-pe smp SLOTS` in the queue.
fn smp_job(queue: &str, slots: u32, seconds: u32) -> String {
    qsub(&[
        "-N",
        "local",
        "-q",
        queue,
        "-pe",
        "smp",
        &slots.to_string(),
        "-b",
        "y",
        "/bin/sleep",
        &seconds.to_string(),
    ])
}

/// Where a local job runs, once it does.
fn host_of(queues: &SgeQueues, number: &str) -> Option<String> {
    queues
        .jobs(&queues.names[0])
        .into_iter()
        .find(|j| j.number == number && j.state.contains('r'))
        .map(|j| j.host)
}

/// `gleaner up` on one cluster spanning the grid's hosts, and a sweep of
/// two-second tasks filling every host; returns the placeholders running then.
fn full_grid(
    test: &str,
    extra: &str,
    launchers: usize,
) -> (SgeQueues, Gleaner, String, BTreeMap<String, String>) {
    full_grid_of(
        test,
        extra,
        |g| slow_sweep_until_go(g, LONG_SWEEP),
        launchers,
    )
}

/// Tasks of [`full_grid`]'s sweep: more than its launchers run in any
/// test's watch, on the busiest machine.
const LONG_SWEEP: u32 = 1000;

/// Lets [`full_grid`]'s sweep end, and checks that every task of it ran
/// once.
fn finish_long_sweep(g: &Gleaner, job: &str) {
    go(g);
    g.assert_all_done_once(job, LONG_SWEEP as usize);
}

/// A sweep of `tasks` whose tasks wait for the test's word (`go` in the
/// test's directory): a busy machine acting slowly must not see the sweep
/// end and its launchers leave of themselves while the test watches them.
fn held_sweep(g: &Gleaner, tasks: u32) -> String {
    let go = g.path().join("go");
    sweep(
        "fill",
        tasks,
        &format!(
            "while [ ! -e {} ]; do sleep 0.2; done; echo {{n}}",
            go.display()
        ),
    )
}

/// A sweep of `tasks` of two seconds each until the test's word, then of
/// no time: long enough to outlast any wait, yet each task ends, so its
/// launchers can be drained.
fn slow_sweep_until_go(g: &Gleaner, tasks: u32) -> String {
    let go = g.path().join("go");
    sweep(
        "fill",
        tasks,
        &format!("[ -e {} ] || sleep 2; echo {{n}}", go.display()),
    )
}

/// Gives the word to the sweeps above.
fn go(g: &Gleaner) {
    std::fs::write(g.path().join("go"), "").unwrap();
}

/// [`full_grid`] of the sweep `manifest` writes.
fn full_grid_of(
    test: &str,
    extra: &str,
    manifest: impl FnOnce(&Gleaner) -> String,
    launchers: usize,
) -> (SgeQueues, Gleaner, String, BTreeMap<String, String>) {
    let queues = SgeQueues::on_nodes(1, HOST_SLOTS);
    let mut g = gleaner(test);
    g.write("gleaner.toml", &config(&queues.names[0], extra));
    g.start("up", &["up"]);
    let job = g.submit(&manifest(&g));
    let mut before = BTreeMap::new();
    wait_for("the sweep to fill every host", 2 * MINUTE, || {
        before = running(&queues, &job);
        before.len() == launchers
    });
    let hosts: BTreeSet<&String> = before.values().collect();
    assert_eq!(hosts.len(), 3, "launchers on every host: {before:?}");
    (queues, g, job, before)
}

/// Watches the placeholders running at first until `done`; returns those
/// that went away. `done` is asked before the placeholders are listed, so
/// the last list is taken after whatever `done` saw: a local job seen
/// started has its freed slots' placeholders already gone from it.
fn watch_until(
    queues: &SgeQueues,
    job: &str,
    before: &BTreeMap<String, String>,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> BTreeSet<String> {
    let mut gone = BTreeSet::new();
    wait_for(what, timeout, || {
        let finished = done();
        let now = running(queues, job);
        gone.extend(before.keys().filter(|id| !now.contains_key(*id)).cloned());
        finished
    });
    gone
}

#[test]
fn a_one_host_local_job_empties_one_host_and_no_other() {
    let (queues, g, job, before) = full_grid("mh-one", "", 12);
    let local = smp_job(&queues.names[0], HOST_SLOTS, 3);
    only_its_host_gives_way(&queues, &job, &before, &local);
    assert!(g.log("up").contains("local jobs wait: shrinking"));
    finish_long_sweep(&g, &job);
}

#[test]
fn two_one_host_local_jobs_empty_two_hosts() {
    let (queues, g, job, before) = full_grid("mh-two", "", 12);
    let locals = [
        smp_job(&queues.names[0], HOST_SLOTS, 3),
        smp_job(&queues.names[0], HOST_SLOTS, 3),
    ];
    let mut hosts = BTreeSet::new();
    let gone = watch_until(
        &queues,
        &job,
        &before,
        "both local jobs to start",
        MINUTE,
        || {
            hosts.extend(locals.iter().filter_map(|l| host_of(&queues, l)));
            hosts.len() == 2
        },
    );
    let hosts_hit: BTreeSet<String> = gone.iter().map(|id| before[id].clone()).collect();
    assert_eq!(hosts_hit, hosts, "two hosts emptied, no more: {gone:?}");
    finish_long_sweep(&g, &job);
}

#[test]
fn a_grid_component_of_one_host_takes_back_one_host() {
    // The sweep's tasks wait for the test's word: a busy machine placing
    // the grid job slowly must not see the sweep end and every launcher
    // leave of itself.
    let (queues, g, job, before) = full_grid_of("mh-grid", "", |g| held_sweep(g, 150), 12);
    let mut grid = g.submit_waiting(&format!(
        "name = \"rigid\"\nkind = \"grid\"\npriority = \"high\"\n[[component]]\nslots = {HOST_SLOTS}\ncommand = \"echo $NSLOTS $(hostname); sleep 3\"\n"
    ));
    let gone = watch_until(
        &queues,
        &job,
        &before,
        "the grid job to end",
        2 * MINUTE,
        || matches!(grid.try_wait(), Ok(Some(_))),
    );
    let output = finish(grid, MINUTE);
    assert!(
        output.status.success(),
        "grid job failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rigid = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let stdout = g.stdout(&rigid, 0).unwrap_or_default();
    let (slots, host) = stdout.trim().split_once(' ').unwrap_or_default();
    assert_eq!(slots, HOST_SLOTS.to_string(), "all its slots: {stdout}");
    let hosts_hit: BTreeSet<&str> = gone.iter().map(|id| before[id].as_str()).collect();
    assert_eq!(
        hosts_hit,
        BTreeSet::from([host]),
        "only launchers of the host it ran on were stopped; gone: {gone:?} of {before:?}"
    );
    go(&g);
    g.assert_all_done_once(&job, 150);
}

#[test]
fn a_local_job_larger_than_any_host_preempts_nothing() {
    let (queues, g, job, before) = full_grid_of("mh-too-big", "", |g| held_sweep(g, 150), 12);
    let local = smp_job(&queues.names[0], HOST_SLOTS + 1, 1);
    // Longer than the kcm's settle time: it would have answered twice.
    let start = Instant::now();
    let gone = watch_until(&queues, &job, &before, "a while", MINUTE, || {
        start.elapsed() > Duration::from_secs(15)
    });
    assert!(gone.is_empty(), "launchers stopped for nothing: {gone:?}");
    assert!(
        g.log("up").contains("no host could take"),
        "the kcm said why it did nothing"
    );
    assert!(host_of(&queues, &local).is_none());
    sge("qdel", &[&local]);
    go(&g);
    g.assert_all_done_once(&job, 150);
}

#[test]
fn multi_slot_launchers_take_a_host_each_and_one_goes_for_a_small_local_job() {
    let extra = format!("launcher_slots = {HOST_SLOTS}\n");
    let (queues, g, job, before) = full_grid("mh-wide", &extra, 3);
    let placeholders = queues.jobs(&queues.names[0]);
    assert!(
        placeholders
            .iter()
            .filter(|j| j.name == placeholder_name(&job))
            .all(|j| j.slots == HOST_SLOTS),
        "each placeholder holds a host: {placeholders:?}"
    );
    wait_for("every slot busy", MINUTE, || {
        g.status().is_some_and(|s| {
            s["jobs"].as_array().into_iter().flatten().any(|j| {
                j["job"] == job.as_str() && j["tasks"]["running"] == u64::from(3 * HOST_SLOTS)
            })
        })
    });
    let each = String::from_utf8_lossy(&g.run(&["status", "--hosts"]).stdout).into_owned();
    for host in ["node1", "node2", "node3"] {
        assert!(
            each.lines()
                .any(|l| l.contains(host) && l.contains("scavenged")),
            "{host} scavenged in:\n{each}"
        );
    }
    let local = qsub(&[
        "-N",
        "local",
        "-q",
        &queues.names[0],
        "-b",
        "y",
        "/bin/sleep",
        "3",
    ]);
    let gone = watch_until(
        &queues,
        &job,
        &before,
        "the local job to start",
        MINUTE,
        || host_of(&queues, &local).is_some(),
    );
    assert_eq!(gone.len(), 1, "one whole launcher went: {gone:?}");
    assert!(g.log("up").contains("preempted whole"));
    finish_long_sweep(&g, &job);
}

#[test]
fn admin_caps_keep_placeholders_off_reserved_hosts_and_below_the_limit() {
    let queues = SgeQueues::on_nodes(1, HOST_SLOTS);
    let mut g = gleaner("mh-caps");
    // 12 slots; node3 reserved (8 left), at most half of all scavenged (6).
    g.write(
        "gleaner.toml",
        &config(
            &queues.names[0],
            "max_scavenged = \"50%\"\nreserve_hosts = [\"node3\"]\n",
        ),
    );
    g.start("up", &["up"]);
    let job = g.submit(&sweep("capped", 60, "sleep 1; echo {n}"));
    wait_for("six launchers", MINUTE, || {
        running(&queues, &job).len() == 6
    });
    let start = Instant::now();
    let mut most = 0;
    let mut hosts = BTreeSet::new();
    wait_for("a while", MINUTE, || {
        let now = running(&queues, &job);
        most = most.max(now.len());
        hosts.extend(now.into_values());
        start.elapsed() > Duration::from_secs(8)
    });
    assert_eq!(most, 6, "never more than max_scavenged");
    assert!(
        !hosts.contains("node3"),
        "nothing on the reserved host: {hosts:?}"
    );
    g.assert_all_done_once(&job, 60);
}

#[test]
fn a_gpu_sweep_on_grid_engine_runs_one_task_per_gpu_each_claimed_by_its_launcher() {
    let _gpus = sge_gpus_lock();
    let queues = SgeQueues::on_nodes(1, HOST_SLOTS);
    let mut g = gleaner("mh-gpus");
    // Grid Engine counts each host's two GPUs (`gpu`); launchers claim theirs.
    g.write(
        "gleaner.toml",
        &config(&queues.names[0], "gpus = [\"0\", \"1\"]"),
    );
    g.start("up", &["up"]);
    let manifest = gpu_sweep(&g, "gpus", 18, 1, "memory = \"1500M\"");
    let job = g.submit(&manifest);
    let mut most = 0;
    wait_for("the GPU sweep to end", 3 * MINUTE, || {
        most = most.max(most_on_one_host(running(&queues, &job).into_values()));
        g.job_state(&job).is_some_and(|s| s == "done")
    });
    assert!(
        (1..=2).contains(&most),
        "{most} one-GPU placeholders on a two-GPU host at most"
    );
    let used = assert_one_task_per_gpu(&g, &job, 18);
    assert!(
        used.values().any(|devices| devices.len() == 2),
        "both GPUs of a host in use: {used:?}"
    );
}

/// Waits for the local job `local` to start; of the launchers of `job`
/// running `before`, only those of its host went. Returns them.
fn only_its_host_gives_way(
    queues: &SgeQueues,
    job: &str,
    before: &BTreeMap<String, String>,
    local: &str,
) -> BTreeSet<String> {
    let mut host = None;
    let gone = watch_until(
        queues,
        job,
        before,
        "the local job to start",
        MINUTE,
        || {
            host = host_of(queues, local);
            host.is_some()
        },
    );
    let host = host.unwrap_or_default();
    let hosts_hit: BTreeSet<&String> = gone.iter().map(|id| &before[id]).collect();
    assert_eq!(
        hosts_hit,
        BTreeSet::from([&host]),
        "only launchers on {host} were stopped; gone: {gone:?} of {before:?}"
    );
    gone
}

/// A local job of one slot in the queue, asking for `request` (`-l`).
fn requesting_job(queue: &str, request: &str, seconds: u32) -> String {
    qsub(&[
        "-N",
        "local",
        "-q",
        queue,
        "-l",
        request,
        "-b",
        "y",
        "/bin/sleep",
        &seconds.to_string(),
    ])
}

#[test]
fn a_local_job_wanting_most_of_a_hosts_memory_empties_that_host_only() {
    // Launchers of 900M tasks (964M with their own) hold nearly all of every host's 4000M.
    let (queues, g, job, before) = full_grid_of(
        "mh-memory",
        "",
        |g| format!("memory = \"900M\"\n{}", slow_sweep_until_go(g, LONG_SWEEP)),
        12,
    );
    let queue = &queues.names[0];
    // More than any host has: Grid Engine does not count it as waiting for
    // this queue, and nothing is preempted for it.
    let too_big = requesting_job(queue, "mem_free=5000M", 1);
    let start = Instant::now();
    let gone = watch_until(&queues, &job, &before, "a while", MINUTE, || {
        start.elapsed() > Duration::from_secs(15)
    });
    assert!(gone.is_empty(), "launchers stopped for nothing: {gone:?}");
    sge("qdel", &[&too_big]);
    // One slot and 3000M: three launchers of one host go, and no other.
    let local = requesting_job(queue, "mem_free=3000M", 3);
    let before = running(&queues, &job);
    let gone = only_its_host_gives_way(&queues, &job, &before, &local);
    assert!(gone.len() >= 3, "3000M of 964M launchers: {gone:?}");
    finish_long_sweep(&g, &job);
}

#[test]
fn a_local_job_wanting_a_gpu_preempts_one_gpu_launcher_of_one_host() {
    let _gpus = sge_gpus_lock();
    // Two one-GPU launchers on each host hold its GPUs, and half its slots.
    let (queues, g, job, before) = full_grid_of(
        "mh-gpu-wait",
        "gpus = [\"0\", \"1\"]",
        |g| gpu_sweep(g, "gpus", 150, 2, ""),
        6,
    );
    let local = requesting_job(&queues.names[0], "gpu=1", 3);
    only_its_host_gives_way(&queues, &job, &before, &local);
    assert_eq!(g.wait_for_end(&job, 3 * MINUTE), "done");
    assert_one_task_per_gpu(&g, &job, 150);
}

#[test]
fn a_gpu_sweep_beside_a_cpu_sweep_gets_every_gpu_and_the_cpu_sweep_every_other_slot() {
    let _gpus = sge_gpus_lock();
    let (queues, g, cpu, _) = full_grid_of(
        "mh-gpu-beside",
        "gpus = [\"0\", \"1\"]",
        |g| slow_sweep_until_go(g, LONG_SWEEP),
        12,
    );
    // The CPU sweep holds every slot; its launchers on the GPUs' slots
    // give them back once their task is done.
    let gpus = g.submit(&gpu_sweep(&g, "gpus", 60, 3, ""));
    wait_for(
        "a launcher on every GPU, and CPU launchers on every other slot",
        2 * MINUTE,
        || running(&queues, &gpus).len() == 6 && running(&queues, &cpu).len() == 6,
    );
    assert!(g.log("up").contains("drain for fair share"));
    assert_eq!(g.wait_for_end(&gpus, 3 * MINUTE), "done");
    assert_one_task_per_gpu(&g, &gpus, 60);
    finish_long_sweep(&g, &cpu);
}
