//! gleaner on a replicated broker: the 3-node RabbitMQ cluster of
//! `deploy/rabbitmq/cluster.sh` on the dev grid's test hosts.

use std::time::Duration;

use gleaner_testkit::{BrokerCluster, Gleaner, by_task, finish, sweep, wait_for};

const MINUTE: Duration = Duration::from_secs(60);

#[test]
fn losing_a_broker_node_mid_sweep_loses_and_duplicates_nothing() {
    let cluster = BrokerCluster::lock();
    let mut g = Gleaner::on(
        cluster.access.clone(),
        "node-loss",
        env!("CARGO_BIN_EXE_gleaner"),
    );
    g.up(4);
    let tasks = 400;
    let waiting = g.submit_waiting(&sweep("node-loss", tasks, "sleep 0.1; echo {n}"));
    let job = wait_for_job(&g);
    wait_for("40 results", MINUTE, || g.index(&job).len() >= 40);

    // Every queue of the job has a replica on each node.
    let queue = format!("gleaner.job.{job}.tasks");
    let members = g.vhost.queue(&queue).expect("task queue")["members"].clone();
    assert_eq!(members.as_array().map(Vec::len), Some(3), "{members}");

    // The runner's node holds the leaders of the job's queues (it declared
    // them): lose it, with every connection on it.
    let host = gleaner_kcm::hostname();
    let mut node = None;
    wait_for("the runner's connection", MINUTE, || {
        node = cluster.node_of(&g.vhost, &format!("runner@{host}"));
        node.is_some()
    });
    let node = node.unwrap_or_default();
    let before = g.index(&job).len();
    cluster.stop(&node);
    eprintln!("stopped {node} after {before} results");

    let output = finish(waiting, 4 * MINUTE);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "submit --wait failed: {stderr}");
    assert!(
        stderr.contains(&format!("{tasks} of {tasks} tasks succeeded")),
        "{stderr}"
    );
    let index = by_task(&g.index(&job));
    assert_eq!(index.len(), tasks as usize);
    assert!(index.values().all(|t| t["status"] == "succeeded"));
    assert!(
        before < tasks as usize,
        "the node was lost in the middle of the sweep"
    );
    let mut moved = None;
    wait_for("the runner on another node", MINUTE, || {
        moved = cluster.node_of(&g.vhost, &format!("runner@{host}"));
        moved.as_deref().is_some_and(|n| n != node)
    });
}

/// The job's id, once the runner has made its results directory.
fn wait_for_job(g: &Gleaner) -> String {
    let root = g.path().join("results");
    let mut job = None;
    wait_for("the job to start", MINUTE, || {
        job = std::fs::read_dir(&root)
            .ok()
            .and_then(|mut entries| entries.next())
            .and_then(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned());
        job.is_some()
    });
    job.unwrap_or_default()
}

#[test]
fn a_dead_broker_address_is_skipped_for_the_next() {
    let mut g = Gleaner::new("dead-address", env!("CARGO_BIN_EXE_gleaner"));
    // Refused at once, and an address of the test network where no host
    // answers; whichever the client starts at, it ends on the live one.
    let urls = format!(
        "amqp://guest:guest@127.0.0.1:1/x,amqp://guest:guest@10.77.0.250:5672/x,{}",
        g.vhost.url()
    );
    g.up(1);
    wait_for("the scheduler", MINUTE, || g.status().is_some());
    for _ in 0..4 {
        let output = g
            .command(&["status", "--json"])
            .env("GLEANER_BROKER_URLS", &urls)
            .output()
            .expect("gleaner status");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
