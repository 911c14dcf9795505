//! gleaner on a replicated broker: the 3-node RabbitMQ cluster of
//! `deploy/rabbitmq/cluster.sh` on the dev grid's test hosts.

use std::time::Duration;

use gleaner_testkit::{BrokerCluster, Gleaner, by_task, finish_all_succeeded, sweep, wait_for};

use crate::MINUTE;

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

    finish_all_succeeded(waiting, tasks, 4 * MINUTE);
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

/// RabbitMQ's memory alarm blocks every connection that publishes, the
/// services' and the launchers' alike, for as long as it lasts: a sweep
/// stops where it is and, once the alarm clears, ends with every task
/// succeeded, without anyone restarting a service.
#[test]
fn a_sweep_paused_by_the_brokers_memory_alarm_ends_once_it_clears() {
    let cluster = BrokerCluster::lock();
    let mut g = Gleaner::on(
        cluster.access.clone(),
        "alarm",
        env!("CARGO_BIN_EXE_gleaner"),
    );
    g.up(2);
    let tasks = 60;
    let waiting = g.submit_waiting(&sweep("alarm", tasks, "sleep 0.2; echo {n}"));
    let job = wait_for_job(&g);
    wait_for("10 results", MINUTE, || g.index(&job).len() >= 10);
    let alarm = cluster.memory_alarm();
    let during = g.index(&job).len();
    std::thread::sleep(Duration::from_secs(20));
    drop(alarm);
    finish_all_succeeded(waiting, tasks, 4 * MINUTE);
    let index = by_task(&g.index(&job));
    assert_eq!(index.len(), tasks as usize);
    assert!(
        index.values().all(|t| t["status"] == "succeeded"),
        "{index:?}"
    );
    assert!(
        during < tasks as usize,
        "the alarm came in the middle of the sweep"
    );
}

/// The replicated broker is reached from the network: no `guest` there,
/// neither over AMQP nor through the management API, on any node.
#[test]
fn guest_is_refused_on_every_node() {
    let cluster = BrokerCluster::lock();
    let guest = cluster.access.as_user("guest", "guest");
    for answer in guest.whoami_each() {
        let refused = answer.expect_err("guest logged in to the management API");
        assert!(refused.contains("401"), "{refused}");
    }
    for url in guest.amqp_urls() {
        let outcome = gleaner_testkit::users::Amqp(url.clone()).consume("gleaner.submit");
        let refused = outcome.expect_err("guest connected over AMQP");
        assert!(refused.contains("ACCESS_REFUSED"), "{url}: {refused}");
    }
    // The services' account is not refused: what is refused is guest.
    assert!(cluster.access.whoami_each().iter().all(Result::is_ok));
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

/// Everything over TLS, the way a cluster's admins would deploy it: the
/// services, the kcm and the launchers on `amqps`, and the runner making
/// the job's launcher account through the management API over HTTPS. The
/// nodes offer neither plain AMQP nor plain HTTP on their addresses, and a
/// client that does not trust the broker's certificate authority gets no
/// connection.
#[test]
fn the_replicated_broker_is_reached_over_tls_only() {
    let cluster = BrokerCluster::lock();
    let mut g = Gleaner::on(cluster.access.clone(), "tls", env!("CARGO_BIN_EXE_gleaner"));
    assert!(
        g.vhost.urls().iter().all(|u| u.starts_with("amqps://")),
        "{:?}",
        cluster.access
    );
    // Many users, so that each job's launchers get an account of their own;
    // the services' account owns the job, as the Unix account alice.
    g.open_to_every_account();
    let config = g.write(
        "gleaner.toml",
        "[users]\nsingle = false\naccounts = { gleaner = \"alice\" }\n",
    );
    let config = config.to_str().expect("path").to_owned();
    g.start_with(
        "up",
        &["up", "--slots", "2"],
        &[
            ("GLEANER_CONFIG", &config),
            ("GLEANER_USERS__SINGLE", "false"),
        ],
    );
    let tasks = 12;
    let waiting = g.submit_waiting(&sweep("tls", tasks, "id -un"));
    let output = finish_all_succeeded(waiting, tasks, 4 * MINUTE);
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let results = g.path().join("alice").join("results").join(&job);
    for task in 0..tasks {
        assert_eq!(
            gleaner_testkit::task_stream(&results, u64::from(task), false).unwrap_or_default(),
            "alice\n",
            "task {task}"
        );
    }
    assert!(
        g.log("up").contains("launcher account is ready"),
        "the runner made the job's launcher account: {}",
        g.log("up")
    );

    // Plain AMQP is not offered: not on its own port, and not spoken to the
    // TLS listener.
    let url = g.vhost.url();
    let plain = url.replacen("amqps://", "amqp://", 1);
    let plain_port = plain.replacen(":5671/", ":5672/", 1);
    let status_with = |env: &[(&str, &str)]| {
        let output = g
            .command(&["status"])
            .envs(env.iter().copied())
            .env_remove("SSL_CERT_DIR")
            .output()
            .expect("gleaner status");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, said) = status_with(&[
        ("GLEANER_BROKER_URL", &plain),
        ("GLEANER_BROKER_URLS", &plain),
    ]);
    assert_eq!(code, Some(3), "{said}");
    assert!(said.contains("needs an amqps:// URL"), "{said}");
    let (code, said) = status_with(&[
        ("GLEANER_BROKER_URL", &plain_port),
        ("GLEANER_BROKER_URLS", &plain_port),
    ]);
    assert_eq!(code, Some(3), "{said}");
    assert!(said.contains("refused"), "{said}");
    // Nor plain HTTP for the management API (which answered over HTTPS).
    assert!(
        std::net::TcpStream::connect_timeout(
            &"10.77.0.11:15672".parse().expect("address"),
            Duration::from_secs(3)
        )
        .is_err(),
        "plain HTTP answers on 10.77.0.11:15672"
    );

    // The certificate is checked: trusting another authority only, the
    // client refuses it.
    let made = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=another authority", "-keyout"])
        .arg(g.path().join("other-ca.key"))
        .arg("-out")
        .arg(g.path().join("other-ca.pem"))
        .output()
        .expect("openssl");
    assert!(made.status.success(), "{made:?}");
    let other = g.path().join("other-ca.pem");
    let (code, said) = status_with(&[("SSL_CERT_FILE", other.to_str().expect("path"))]);
    assert_eq!(code, Some(3), "{said}");
    assert!(said.contains("UnknownIssuer"), "{said}");
    assert!(said.contains("not trusted here"), "{said}");
    // While the system's store, which has the deployment's CA, is trusted.
    let (code, said) = status_with(&[]);
    assert_eq!(code, Some(0), "{said}");
}
