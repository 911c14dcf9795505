//! A gleaner of many users on a real RabbitMQ, with broker accounts made by
//! `deploy/rabbitmq/user.sh` and the Unix accounts alice and bob
//! (`deploy/accounts.sh`): who may do what is the broker's to enforce.

use std::{os::unix::fs::MetadataExt, time::Duration};

use gleaner_protocol::naming::placeholder_name;
use gleaner_testkit::{
    Gleaner, SgeQueues, SlurmCluster, task_stream,
    users::{BasicProperties, BrokerUser},
    wait_for,
};
use nix::sys::signal::Signal;

use crate::MINUTE;

/// A gleaner of many users, `alice-<pid>` and `bob-<pid>` their broker
/// names, mapped to the Unix accounts alice and bob; results under the
/// test's directory, which every account may pass through.
fn many_users(test: &str) -> (Gleaner, BrokerUser, BrokerUser) {
    many_users_on(test, "", &["up", "--slots", "2"])
}

/// [`many_users`] with `clusters` (configuration) and `up` (its command).
fn many_users_on(test: &str, clusters: &str, up: &[&str]) -> (Gleaner, BrokerUser, BrokerUser) {
    many_users_up(test, clusters, up, |_| {})
}

/// [`many_users_on`] with `prepare` run on the test's directory before
/// the services start.
fn many_users_up(
    test: &str,
    clusters: &str,
    up: &[&str],
    prepare: impl FnOnce(&Gleaner),
) -> (Gleaner, BrokerUser, BrokerUser) {
    let (mut g, alice, bob, env) = many_users_configured(test, clusters);
    prepare(&g);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    g.start_with("up", up, &env);
    // Users cannot declare gleaner's queues: the services do.
    wait_for("the runner to serve", MINUTE, || {
        g.log("up").contains("runner serving")
    });
    (g, alice, bob)
}

/// A gleaner of many users with its configuration written and no service
/// started yet: the environment its services need.
fn many_users_configured(
    test: &str,
    clusters: &str,
) -> (Gleaner, BrokerUser, BrokerUser, [(&'static str, String); 2]) {
    gleaner_testkit::users::many_users(test, env!("CARGO_BIN_EXE_gleaner"), clusters)
}

fn text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn users_reach_their_own_jobs_only() {
    let (g, alice, bob) = many_users("users");
    let manifest = g.write(
        "alice.toml",
        "name = \"mine\"\n[[task]]\ncommand = \"id -un\"\n[[task]]\ncommand = \"sleep 120\"\n",
    );
    let submitted = g.run_as(&alice, &["submit", manifest.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", text(&submitted));
    let job = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    wait_for("alice to see her job", MINUTE, || {
        g.run_as(&alice, &["status", &job]).status.success()
    });

    // Bob sees nothing of it, and cannot cancel it: gleaner refuses.
    let status = g.run_as(&bob, &["status", &job]);
    assert_eq!(status.status.code(), Some(1), "{}", text(&status));
    assert!(text(&status).contains("not yours"), "{}", text(&status));
    let listed = g.run_as(&bob, &["status", "--json"]);
    assert!(!text(&listed).contains(&job), "{}", text(&listed));
    let cancel = g.run_as(&bob, &["cancel", &job]);
    assert_eq!(cancel.status.code(), Some(4), "{}", text(&cancel));
    assert!(text(&cancel).contains(&alice.name), "{}", text(&cancel));

    // And the broker refuses him her queues, her events and her name.
    let refused = |what: &str, outcome: Result<(), String>, code: &str| match outcome {
        Err(e) => assert!(e.contains(code), "{what}: {e}"),
        Ok(()) => panic!("{what}: the broker let bob do it"),
    };
    let tasks = format!("gleaner.job.{job}.tasks");
    refused(
        "consume her tasks",
        bob.amqp().consume(&tasks),
        "ACCESS_REFUSED",
    );
    let results = format!("gleaner.job.{job}.results");
    refused(
        "publish into her results",
        bob.amqp().publish(("", &results), b"x", None),
        "ACCESS_REFUSED",
    );
    refused(
        "follow her events",
        bob.amqp().watch(&format!("job.{}.#", alice.name)),
        "ACCESS_REFUSED",
    );
    refused(
        "submit in her name",
        bob.amqp()
            .publish(("gleaner.user", "submit"), b"{}", Some(&alice.name)),
        "PRECONDITION_FAILED",
    );
    assert!(
        bob.amqp().watch(&format!("job.{}.#", bob.name)).is_ok(),
        "his own events"
    );
    // Nor can he take the broker's connections and channels for himself.
    let limits = g.vhost.user_limits(&bob.name).to_string();
    assert!(
        limits.contains("\"max-connections\":64") && limits.contains("\"max-channels\":256"),
        "{limits}"
    );

    // Her task ran as her.
    let area = g.path().join("alice");
    let results = area.join("results").join(&job);
    wait_for("her first task's output", MINUTE, || {
        task_stream(&results, 0, false).is_some()
    });
    assert_eq!(task_stream(&results, 0, false).unwrap(), "alice\n");

    // Alice may cancel her own job.
    let cancel = g.run_as(&alice, &["cancel", &job]);
    assert!(cancel.status.success(), "{}", text(&cancel));
    wait_for("the job to end", MINUTE, || {
        std::fs::read_to_string(results.join("job.json")).is_ok_and(|t| t.contains("\"cancelled\""))
    });
    let alice_uid = nix::unistd::User::from_name("alice")
        .unwrap()
        .unwrap()
        .uid
        .as_raw();
    for dir in [&area, &results] {
        let meta = std::fs::metadata(dir).expect("results directory");
        assert_eq!(meta.uid(), alice_uid, "{} is alice's", dir.display());
        assert_eq!(meta.mode() & 0o777, 0o700, "{} is private", dir.display());
    }
    for file in ["index.jsonl", "job.json", "output.log", "attempts.jsonl"] {
        let meta = std::fs::metadata(results.join(file)).expect(file);
        assert_eq!(meta.uid(), alice_uid, "{file} is alice's");
    }
    let job_file = std::fs::read_to_string(results.join("job.json")).unwrap();
    assert!(
        job_file.contains(&format!("\"owner\": \"{}\"", alice.name)),
        "{job_file}"
    );
}

/// Job ids are public (`qstat` shows them). Bob hand-publishes a manifest
/// under the id of Alice's running job, to a second runner that waits for
/// the job's lock; Alice's runner is then killed. Bob's copy is refused
/// (it never takes the job over, purges her tasks or publishes his), and
/// Alice's job completes, resumed, with her tasks only; a copy sent to the
/// runner that then holds her job is refused at once.
#[test]
fn another_users_submission_of_a_live_job_id_is_refused() {
    let (mut g, alice, bob, env) = many_users_configured(
        "claim",
        "[[cluster]]\nname = \"local\"\nbackend = \"local\"\nslots = 2\n",
    );
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    g.start_with("scheduler", &["scheduler"], &env);
    g.start_with("kcm", &["kcm", "--cluster", "local"], &env);
    // One job at a time, so that Bob's copy must go to the second runner.
    let one_job: Vec<(&str, &str)> = env
        .iter()
        .copied()
        .chain([("GLEANER_RUNNER__MAX_JOBS", "1")])
        .collect();
    let first = g.start_with("runner", &["runner"], &one_job);
    wait_for("the first runner to serve", MINUTE, || {
        g.log("runner").contains("runner serving")
    });
    let manifest = g.write(
        "victim.toml",
        "name = \"victim\"\n[sweep]\ncommand = \"sleep 2; echo alice {n}\"\nparams = { n = { from = 1, to = 16 } }\n",
    );
    let submitted = g.run_as(&alice, &["submit", manifest.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", text(&submitted));
    let job = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    let results = g.path().join("alice/results").join(&job);
    let index = || {
        std::fs::read_to_string(results.join("index.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("index line"))
            .collect::<Vec<_>>()
    };
    wait_for("alice's first results", MINUTE, || !index().is_empty());

    g.start_with("runner2", &["runner"], &env);
    let intruder = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_user_id(bob.name.as_str().into())
        .with_message_id(job.as_str().into());
    let intrude = |command: &str| {
        let body = format!(r#"{{"name":"victim","task":[{{"command":"{command}"}}]}}"#);
        bob.amqp()
            .publish_with(
                ("gleaner.user", "submit"),
                body.as_bytes(),
                intruder.clone(),
            )
            .expect("bob may submit");
    };
    intrude("echo bob");
    wait_for("bob's copy to wait for the job's lock", MINUTE, || {
        g.log("runner2").contains("another runner owns this job")
    });
    g.signal(first, Signal::SIGKILL);
    wait_for("alice's job to be resumed", 2 * MINUTE, || {
        g.log("runner2").contains("job resumed")
    });
    let log = g.log("runner2");
    assert!(log.contains("belongs to another user"), "{log}");
    intrude("echo bob again");
    let mut dead = Vec::new();
    wait_for("bob's copies in gleaner.dead", MINUTE, || {
        dead.extend(g.vhost.get("gleaner.dead", 10));
        dead.len() >= 2
    });
    assert!(
        dead.iter()
            .all(|d| d["properties"]["headers"]["x-gleaner-reason"]
                .as_str()
                .is_some_and(|r| r.contains("belongs to another user"))),
        "{dead:?}"
    );

    wait_for("alice's job to end", 3 * MINUTE, || {
        std::fs::read_to_string(results.join("job.json")).is_ok_and(|t| t.contains("\"done\""))
    });
    let outputs: std::collections::BTreeSet<String> = (0..16)
        .map(|task| task_stream(&results, task, false).unwrap_or_default())
        .collect();
    let expected: std::collections::BTreeSet<String> =
        (1..=16).map(|n| format!("alice {n}\n")).collect();
    assert_eq!(outputs, expected, "alice's tasks, and only hers, ran");
    let tasks = gleaner_testkit::by_task(&index());
    assert_eq!(tasks.len(), 16);
    assert!(
        tasks.values().all(|t| t["status"] == "succeeded"),
        "{tasks:?}"
    );
    assert!(
        !g.path().join("bob/results").join(&job).exists(),
        "bob's copies ran nothing"
    );
}

/// A task holds its launcher's broker account, and with it its job's
/// control and results queues: what it sends there may be refused, but
/// costs its runner nothing. A launcher announcing itself with a 300-byte
/// cluster name (which no queue name can hold) and a body that is not a
/// message go to `gleaner.dead` with their reasons, as does a message of
/// results too big for any launcher to send (without its body: the runner
/// holds a job's results in bounded memory); a part of output no launcher
/// would send is dropped. The runner keeps serving and the job completes,
/// and a run's output bigger than a message came in parts and is whole.
#[test]
fn a_tasks_hostile_messages_leave_its_runner_serving() {
    let (g, alice, _bob) = many_users("users-hostile");
    let hers = g.write(
        "alice.toml",
        "name = \"hostile\"\noutputs = [\"big.txt\"]\n[[task]]\ncommand = \"cat \\\"$GLEANER_CONFIG\\\"\"\n\
         [[task]]\ncommand = \"seq 1 800000 > big.txt; head -c 3000000 /dev/zero | tr '\\\\0' y\"\n\
         [sweep]\ncommand = \"sleep 1\"\nparams = { n = { from = 1, to = 12 } }\n",
    );
    let submitted = g.run_as(&alice, &["submit", hers.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", text(&submitted));
    let job = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    let results = g.path().join("alice/results").join(&job);
    wait_for("her task's output", MINUTE, || {
        task_stream(&results, 0, false).is_some_and(|t| t.contains("amqp://"))
    });
    let seen = task_stream(&results, 0, false).unwrap();
    let url = seen
        .split('"')
        .find(|s| s.starts_with("amqp://"))
        .unwrap_or_else(|| panic!("no broker URL in the launcher's settings:\n{seen}"));
    let stolen = gleaner_testkit::users::Amqp(url.to_owned());
    let up = gleaner_protocol::ControlMsg::LauncherUp(gleaner_protocol::LauncherInfo {
        launcher: "local-1".into(),
        cluster: "c".repeat(300).as_str().into(),
        host: "node1".into(),
        slots: 1,
        started_at: 0,
        deadline: None,
        heartbeat_ms: None,
    });
    let exchange = format!("gleaner.job.{job}");
    for body in [
        gleaner_protocol::codec::encode("launcher@forged", &up).unwrap(),
        b"\xc1 not a message".to_vec(),
    ] {
        stolen
            .publish((&exchange, "control"), &body, None)
            .expect("her own job's exchange takes it");
    }
    let stray = gleaner_protocol::ResultBatch {
        results: Vec::new(),
        part: Some(gleaner_protocol::ResultPart {
            job: job.parse().unwrap(),
            task: 1,
            run: 7,
            target: 5000,
            offset: 0,
            data: b"nowhere".to_vec(),
        }),
    };
    for body in [
        vec![0; gleaner_protocol::MAX_RESULTS_MESSAGE_BYTES + 1],
        gleaner_protocol::codec::encode("launcher@forged", &stray).unwrap(),
    ] {
        stolen
            .publish((&exchange, "results"), &body, None)
            .expect("her own job's exchange takes it");
    }
    let mut dead = Vec::new();
    wait_for("three in gleaner.dead", MINUTE, || {
        dead.extend(g.vhost.get("gleaner.dead", 10));
        dead.len() >= 3
    });
    let reasons: Vec<&str> = dead
        .iter()
        .filter_map(|d| d["properties"]["headers"]["x-gleaner-reason"].as_str())
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("not a cluster name")),
        "{reasons:?}"
    );
    let too_big = dead
        .iter()
        .find(|d| {
            d["properties"]["headers"]["x-gleaner-reason"]
                .as_str()
                .is_some_and(|r| r.contains("more than the"))
        })
        .unwrap_or_else(|| panic!("the big message is not dead-lettered: {reasons:?}"));
    assert_eq!(too_big["payload_bytes"], 0, "its body is not copied");
    wait_for("her job to end", 3 * MINUTE, || {
        std::fs::read_to_string(results.join("job.json")).is_ok_and(|t| t.contains("\"done\""))
    });
    let index = std::fs::read_to_string(results.join("index.jsonl")).unwrap();
    let tasks: Vec<serde_json::Value> = index
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let tasks = gleaner_testkit::by_task(&tasks);
    assert_eq!(tasks.len(), 14);
    assert!(
        tasks.values().all(|t| t["status"] == "succeeded"),
        "{tasks:?}"
    );
    let expected: String = (1..=800_000).map(|i| format!("{i}\n")).collect();
    let big = std::fs::read_to_string(results.join("tasks/1/big.txt")).unwrap();
    assert!(big == expected, "big.txt: {} bytes, not seq's", big.len());
    let printed = task_stream(&results, 1, false).unwrap();
    assert!(
        printed.ends_with(&"y".repeat(1 << 20))
            && printed.starts_with("[gleaner: the first 1951424 bytes"),
        "{}",
        &printed[..200]
    );
    // The runner clears what is left of parts once the job's queues are
    // gone, just after `job.json` says it is done.
    wait_for("the parts to be cleared", MINUTE, || {
        !results.join(".parts").exists()
    });
    let log = g.log("up");
    assert!(log.contains("a part of a run's output dropped"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(!log.contains("restarting the session"), "{log}");
}

/// A MessagePack envelope whose message is a map with one field, `type`,
/// of `kind` (written by hand: no gleaner would send it).
fn envelope_of_type(kind: &str) -> Vec<u8> {
    let mut body = vec![0x83, 0xa1, b'v', 0x01, 0xa4];
    body.extend_from_slice(b"from");
    body.extend_from_slice(&[0xa1, b'x', 0xa3]);
    body.extend_from_slice(b"msg");
    body.extend_from_slice(&[0x81, 0xa4]);
    body.extend_from_slice(b"type");
    body.push(0xdb);
    body.extend_from_slice(&u32::try_from(kind.len()).unwrap().to_be_bytes());
    body.extend_from_slice(kind.as_bytes());
    body
}

/// Messages that cannot be read, made so that what a service says about
/// them is big: a submission whose unknown field name is 200,000
/// characters, one with sender headers of 100 kB, a request whose `type` is
/// as long, and a 100 kB manifest whose one task would be a 19 MiB message
/// (refused on receipt for that, not failing the runner's publish). Each is dead-lettered with its reason cut short and acked;
/// Bob's job runs to its end meanwhile, his `status` is answered, and no
/// service restarts its session (a dead letter over the broker's frame
/// size closed the service's connection, and the message came back).
#[test]
fn a_users_messages_with_huge_names_leave_every_service_serving() {
    use gleaner_testkit::users::{AMQPValue, FieldTable};

    let (g, alice, bob) = many_users("users-huge-names");
    let his = g.write(
        "bob.toml",
        &gleaner_testkit::sweep("his", 8, "sleep 1; echo {n}"),
    );
    let submitted = g.run_as(&bob, &["submit", his.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", text(&submitted));
    let job = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();

    let long = "f".repeat(200_000);
    let json = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_user_id(alice.name.as_str().into());
    let unknown_field = format!(r#"{{"name":"long","{long}":1,"task":[{{"command":"true"}}]}}"#);
    let mut headers = FieldTable::default();
    headers.insert(
        "note".into(),
        AMQPValue::LongString("n".repeat(100_000).as_str().into()),
    );
    let heavy = json.clone().with_headers(headers);
    // A small manifest whose one task would be a 19 MiB message.
    let expanding = format!(
        r#"{{"name":"expands","sweep":{{"command":"{}","params":{{"x":["{}"]}}}}}}"#,
        "{x}".repeat(200),
        "v".repeat(100_000)
    );
    let mine = alice.amqp();
    mine.publish_with(
        ("gleaner.user", "submit"),
        expanding.as_bytes(),
        json.clone(),
    )
    .expect("alice may submit");
    for _ in 0..3 {
        mine.publish_with(
            ("gleaner.user", "submit"),
            unknown_field.as_bytes(),
            json.clone(),
        )
        .expect("alice may submit");
        mine.publish_with(("gleaner.user", "submit"), b"{\"name\": 7}", heavy.clone())
            .expect("alice may submit");
        mine.publish_with(
            ("gleaner.user", "request"),
            &envelope_of_type(&long),
            BasicProperties::default().with_user_id(alice.name.as_str().into()),
        )
        .expect("alice may ask");
    }
    let mut dead = Vec::new();
    wait_for("her ten messages in gleaner.dead", 2 * MINUTE, || {
        dead.extend(g.vhost.get("gleaner.dead", 20));
        dead.len() >= 10
    });
    assert!(
        dead.iter()
            .any(|d| d["properties"]["headers"]["x-gleaner-reason"]
                .as_str()
                .is_some_and(|r| r.contains("task 0 would take"))),
        "the expanding manifest is refused for its task's size"
    );
    for letter in &dead {
        let reason = letter["properties"]["headers"]["x-gleaner-reason"]
            .as_str()
            .unwrap_or_else(|| panic!("no reason: {letter}"));
        assert!(
            reason.len() <= gleaner_protocol::REASON_BYTES,
            "{} bytes",
            reason.len()
        );
        assert!(
            letter["properties"]["headers"]["note"].is_null(),
            "the 100 kB header is not copied"
        );
    }
    let status = g.run_as(&bob, &["status", &job]);
    assert!(status.status.success(), "{}", text(&status));
    wait_for("his job to end", 3 * MINUTE, || {
        std::fs::read_to_string(g.path().join("bob/results").join(&job).join("job.json"))
            .is_ok_and(|t| t.contains("\"done\""))
    });
    let index: Vec<serde_json::Value> =
        std::fs::read_to_string(g.path().join("bob/results").join(&job).join("index.jsonl"))
            .expect("his index")
            .lines()
            .map(|l| serde_json::from_str(l).expect("an index line"))
            .collect();
    assert_eq!(index.len(), 8);
    assert!(
        index.iter().all(|t| t["status"] == "succeeded"),
        "{index:?}"
    );
    let log = g.log("up");
    assert!(!log.contains("restarting the session"), "{log}");
    assert!(!log.contains("lost the broker; reconnecting"), "{log}");
}

/// A user may make queues and exchanges under their own prefix (their
/// `--wait` clients' watch queues): one filled with 20 MiB through an
/// exchange of theirs, declared asking to hold a terabyte, holds what the
/// services' policy allows (`broker::admin::USER_QUEUE_BYTES`), the oldest
/// messages pushed out.
#[test]
fn a_users_own_queues_hold_what_the_services_allow() {
    let (g, alice, _bob) = many_users("users-own-queues");
    let body = vec![b'q'; 100 << 10];
    let queue = alice
        .amqp()
        .flood_own_queue(&body, 200)
        .expect("alice may fill her own queue");
    let mut held = serde_json::Value::Null;
    // The management API may answer with counts before the rest of a
    // queue's statistics (its bytes, its policy): wait for them all.
    wait_for("the queue's statistics", MINUTE, || {
        held = g.vhost.queue(&queue).unwrap_or_default();
        held["messages"].as_u64().is_some_and(|n| n > 0) && held["message_bytes"].is_u64()
    });
    let bytes = held["message_bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(
        bytes <= gleaner_broker::admin::USER_QUEUE_BYTES,
        "{bytes} bytes held: {held}"
    );
    assert_eq!(
        held["effective_policy_definition"]["max-length-bytes"],
        gleaner_broker::admin::USER_QUEUE_BYTES
    );
}

/// Everything in a user's results directory is theirs to make anything:
/// Bob's job resumes from an index that is a sparse file of 2 GB with no
/// newline (no disk used). The runner reads it in bounded memory and runs
/// the job.
#[test]
fn a_huge_sparse_index_leaves_the_runners_memory_flat() {
    let (mut g, _alice, bob, env) = many_users_configured("users-sparse", "");
    let bob_account = nix::unistd::User::from_name("bob").unwrap().unwrap();
    let results = g.path().join("bob/results/sparse");
    std::fs::create_dir_all(&results).unwrap();
    for dir in [
        g.path().join("bob"),
        g.path().join("bob/results"),
        results.clone(),
    ] {
        std::os::unix::fs::chown(
            &dir,
            Some(bob_account.uid.as_raw()),
            Some(bob_account.gid.as_raw()),
        )
        .unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
    }
    let index = std::fs::File::create(results.join("index.jsonl")).unwrap();
    index.set_len(2 << 30).unwrap();
    std::os::unix::fs::fchown(
        &index,
        Some(bob_account.uid.as_raw()),
        Some(bob_account.gid.as_raw()),
    )
    .unwrap();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let up = g.start_with("up", &["up", "--slots", "2"], &env);
    wait_for("the runner to serve", MINUTE, || {
        g.log("up").contains("runner serving")
    });
    let manifest = g.write(
        "bob.toml",
        "name = \"sparse\"\nresults = \"results/sparse\"\n[[task]]\ncommand = \"echo ran\"\n",
    );
    let submitted = g.run_as(&bob, &["submit", manifest.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", text(&submitted));
    wait_for("bob's job to end", 3 * MINUTE, || {
        std::fs::read_to_string(results.join("job.json")).is_ok_and(|t| t.contains("\"done\""))
    });
    let status = std::fs::read_to_string(format!("/proc/{up}/status")).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    assert!(peak_kib < 512 * 1024, "the runner peaked at {peak_kib} KiB");
    assert_eq!(task_stream(&results, 0, false).unwrap(), "ran\n");
}

/// Bob owns the launchers' scratch base (he made it first, mode 1777).
/// Once Alice's launcher made her directory in it, he would swap that
/// for a link to a tree of his whose sandbox links to a directory of
/// hers, and her launcher would empty it when her task ends. The kcm makes
/// such a base root's, so the swap is refused and nothing of hers is lost.
#[test]
fn a_swap_in_a_shared_scratch_base_harms_no_file() {
    let bob_account = nix::unistd::User::from_name("bob").unwrap().unwrap();
    let alice_account = nix::unistd::User::from_name("alice").unwrap().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        scratch.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let base = scratch.path().join("scratch");
    std::fs::create_dir(&base).unwrap();
    std::os::unix::fs::chown(&base, Some(bob_account.uid.as_raw()), None).unwrap();
    std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let victim = scratch.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("thesis.tex"), "years of work").unwrap();
    std::os::unix::fs::chown(&victim, Some(alice_account.uid.as_raw()), None).unwrap();
    std::os::unix::fs::chown(
        victim.join("thesis.tex"),
        Some(alice_account.uid.as_raw()),
        None,
    )
    .unwrap();

    let config = format!("[launcher]\nscratch = \"{}\"\n", base.display());
    let (g, alice, _bob) = many_users_up("users-swap", &config, &["up", "--slots", "1"], |_| {});
    let manifest = g.write(
        "alice.toml",
        "name = \"long\"\n[[task]]\ncommand = \"sleep 10\"\n",
    );
    let submitted = g.run_as(&alice, &["submit", manifest.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", text(&submitted));
    let job = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    let hers = base.join(alice_account.uid.to_string());
    let mut launcher = None;
    wait_for("her task's sandbox", MINUTE, || {
        launcher = std::fs::read_dir(&hers)
            .ok()
            .and_then(|mut entries| entries.next())
            .and_then(|entry| entry.ok())
            .map(|entry| entry.file_name());
        launcher.is_some()
    });
    let launcher = launcher.unwrap();
    // Bob's tree: the sandbox the launcher will empty, a link to hers.
    let tree = scratch.path().join("bobtree");
    std::fs::create_dir_all(tree.join(&launcher)).unwrap();
    std::os::unix::fs::symlink(&victim, tree.join(&launcher).join("s0")).unwrap();
    std::os::unix::fs::chown(&tree, Some(bob_account.uid.as_raw()), None).unwrap();
    let as_bob = |args: &[&std::ffi::OsStr]| {
        std::process::Command::new("runuser")
            .args(["-u", "bob", "--"])
            .args(args)
            .output()
            .expect("runuser")
    };
    let moved = as_bob(&[
        "mv".as_ref(),
        hers.as_os_str(),
        base.join("old").as_os_str(),
    ]);
    if moved.status.success() {
        as_bob(&[
            "ln".as_ref(),
            "-s".as_ref(),
            tree.as_os_str(),
            hers.as_os_str(),
        ]);
    }
    let results = g.path().join("alice/results").join(&job);
    wait_for("her job to end", 2 * MINUTE, || {
        std::fs::read_to_string(results.join("job.json")).is_ok_and(|t| t.contains("\"done\""))
    });
    assert!(!moved.status.success(), "bob could move her directory");
    assert_eq!(
        std::fs::read_to_string(victim.join("thesis.tex"))
            .ok()
            .as_deref(),
        Some("years of work")
    );
    assert!(g.log("up").contains("it is root's now"), "{}", g.log("up"));
}

#[test]
fn submissions_without_a_sender_or_leaving_the_users_area_are_refused() {
    let (g, alice, _bob) = many_users("anonymous");
    // Published by hand with no user_id: refused, with the reason.
    g.vhost.publish_raw(
        "gleaner.submit",
        r#"{"name":"nobody","task":[{"command":"true"}]}"#,
        Some("application/json"),
    );
    let mut dead = Vec::new();
    wait_for("the anonymous manifest in gleaner.dead", MINUTE, || {
        dead.extend(g.vhost.get("gleaner.dead", 10));
        !dead.is_empty()
    });
    let reason = dead[0]["properties"]["headers"]["x-gleaner-reason"]
        .as_str()
        .unwrap_or_default();
    assert!(reason.contains("user_id"), "{reason}");

    for results in ["../bob/stolen", "/tmp/elsewhere"] {
        let manifest = g.write(
            "escape.toml",
            &format!("name = \"escape\"\nresults = \"{results}\"\n[[task]]\ncommand = \"true\"\n"),
        );
        let submitted = g.run_as(&alice, &["submit", manifest.to_str().unwrap()]);
        assert_eq!(submitted.status.code(), Some(2), "{}", text(&submitted));
        assert!(text(&submitted).contains("results"), "{}", text(&submitted));
    }
}

/// One user's flood of jobs holds no more than `max_jobs_per_user` of a
/// runner's places: Bob's third open job is refused with the reason while
/// Alice's job runs, and once one of his ends he may submit again.
#[test]
fn one_user_holds_at_most_his_share_of_a_runners_jobs() {
    let (mut g, alice, bob, env) = many_users_configured("perusers", "");
    let env: Vec<(&str, &str)> = env
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        // Three places: without the limit, Bob's third job would take
        // the last one and Alice's would wait behind it.
        .chain([
            ("GLEANER_RUNNER__MAX_JOBS_PER_USER", "2"),
            ("GLEANER_RUNNER__MAX_JOBS", "3"),
        ])
        .collect();
    g.start_with("up", &["up", "--slots", "2"], &env);
    wait_for("the runner to serve", MINUTE, || {
        g.log("up").contains("runner serving")
    });
    let open = g.write("open.toml", "name = \"held\"\nopen = true\n");
    let mut held = Vec::new();
    for _ in 0..2 {
        let submitted = g.run_as(&bob, &["submit", open.to_str().unwrap()]);
        assert!(submitted.status.success(), "{}", text(&submitted));
        held.push(String::from_utf8_lossy(&submitted.stdout).trim().to_owned());
    }
    for job in &held {
        wait_for("bob's open job to run", MINUTE, || {
            g.run_as(&bob, &["status", job]).status.success()
        });
    }
    let third = g.run_as(&bob, &["submit", open.to_str().unwrap()]);
    assert!(third.status.success(), "{}", text(&third));
    let third = String::from_utf8_lossy(&third.stdout).trim().to_owned();
    let refused = format!("{} already has 2 jobs on this runner", bob.name);
    wait_for("bob's third job to be refused or run", MINUTE, || {
        g.log("up").contains(&refused) || g.run_as(&bob, &["status", &third]).status.success()
    });
    assert!(g.log("up").contains(&refused), "{}", g.log("up"));

    // Alice is not held back by Bob's jobs.
    let hers = g.write(
        "hers.toml",
        "name = \"hers\"\n[[task]]\ncommand = \"echo hi\"\n",
    );
    let done = g.run_as(&alice, &["submit", "--wait", hers.to_str().unwrap()]);
    assert!(done.status.success(), "{}", text(&done));

    // Refused, it is not forgotten: `status` and `wait` tell him why.
    let told = g.run_as(&bob, &["status", &third]);
    assert!(!told.status.success(), "{}", text(&told));
    assert!(text(&told).contains(&refused), "{}", text(&told));

    let closed = g.run_as(&bob, &["close", &held[0]]);
    assert!(closed.status.success(), "{}", text(&closed));
    let ended = g.run_as(&bob, &["wait", &held[0]]);
    assert!(ended.status.success(), "{}", text(&ended));
    // His place is free once the runner is done with the job, a moment
    // after its end is told: until then he is refused again.
    let mut job = String::new();
    wait_for("bob's new job to run", MINUTE, || {
        let again = g.run_as(&bob, &["submit", open.to_str().unwrap()]);
        job = String::from_utf8_lossy(&again.stdout).trim().to_owned();
        let started = std::time::Instant::now();
        loop {
            let status = g.run_as(&bob, &["status", &job]);
            if status.status.success() {
                return true;
            }
            if text(&status).contains("was refused") || started.elapsed() > Duration::from_secs(20)
            {
                return false;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
}

/// A sweep of alice's on a batch cluster (`clusters`): her placeholders are
/// hers in the batch system (`listed_as_hers`, given the job's placeholder
/// name) and her tasks run as her.
fn a_batch_cluster_runs_alices_tasks_as_hers(
    test: &str,
    clusters: &str,
    listed_as_hers: impl Fn(&str) -> bool,
) {
    let (g, alice, _bob) = many_users_on(test, clusters, &["up"]);
    let manifest = g.write(
        "alice.toml",
        "name = \"on-batch\"\n[sweep]\ncommand = \"sleep 2; id -un\"\nparams = { i = { from = 1, to = 3 } }\n",
    );
    let submitted = g.run_as(&alice, &["submit", manifest.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", text(&submitted));
    let job = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    wait_for(
        "a placeholder of alice's in the batch system",
        MINUTE,
        || listed_as_hers(&placeholder_name(&job)),
    );
    let results = g.path().join("alice/results").join(&job);
    wait_for("the job to end", 3 * MINUTE, || {
        std::fs::read_to_string(results.join("job.json")).is_ok_and(|t| t.contains("\"done\""))
    });
    for task in 0..3 {
        let stdout = task_stream(&results, task, false).expect("task output");
        assert_eq!(stdout, "alice\n", "task {task}");
    }
}

/// What a batch-system command prints.
fn listing(program: &str, args: &[&str]) -> String {
    let output = std::process::Command::new(program)
        .args(args)
        .env("SGE_ROOT", "/var/lib/gridengine")
        .env("SGE_CELL", "default")
        .output()
        .expect(program);
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn slurm_runs_a_users_placeholders_as_hers() {
    let _slurm = SlurmCluster::lock();
    let clusters = format!(
        "[[cluster]]\nname = \"s1\"\nbackend = \"slurm\"\npartition = \"{}\"\n",
        SlurmCluster::PARTITION
    );
    a_batch_cluster_runs_alices_tasks_as_hers("users-slurm", &clusters, |name| {
        listing("squeue", &["-h", "-u", "alice", "-o", "%j"]).contains(name)
    });
}

#[test]
fn grid_engine_runs_a_users_placeholders_as_hers() {
    let queues = SgeQueues::new(1, 2);
    let clusters = format!(
        "[[cluster]]\nname = \"g1\"\nbackend = \"sge\"\nqueue = \"{}\"\n",
        queues.names[0]
    );
    a_batch_cluster_runs_alices_tasks_as_hers("users-sge", &clusters, |name| {
        listing("qstat", &["-u", "alice", "-xml"]).contains(name)
    });
}

/// A grid component's command with lines a batch system reads as
/// options (`#$ -p 1000`, `#SBATCH --nice=-1000`), and a default request
/// file in the kcm's directory asking the same: the component is
/// submitted as Alice and runs as her, as submitted, with none of them.
fn a_components_option_lines_change_nothing(
    test: &str,
    clusters: &str,
    asked: impl Fn(&str) -> Option<String>,
) {
    let (g, alice, _bob) = many_users_up(test, clusters, &["up"], |g| {
        g.write(".sge_request", "-p 1000\n");
    });
    let manifest = g.write(
        "grid.toml",
        "name = \"rigid\"\nkind = \"grid\"\npriority = \"high\"\n[[component]]\nslots = 1\ncommand = \"\"\"\nsleep 8\n#$ -p 1000\n#SBATCH --nice=-1000\nid -un\n\"\"\"\n",
    );
    let submitted = g.run_as(&alice, &["submit", manifest.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", text(&submitted));
    let job = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    let name = gleaner_protocol::naming::component_name(&job.parse().unwrap(), 0);
    let mut seen = None;
    wait_for("the component in the batch system", MINUTE, || {
        seen = asked(&name);
        seen.is_some()
    });
    let seen = seen.unwrap_or_default();
    assert!(
        !seen.contains("1000"),
        "the script's lines were read as options: {seen}"
    );
    assert!(seen.contains("alice"), "submitted as its owner: {seen}");
    let results = g.path().join("alice/results").join(&job);
    wait_for("the grid job to end", MINUTE, || {
        std::fs::read_to_string(results.join("job.json")).is_ok_and(|t| t.contains("\"done\""))
    });
    let stdout = task_stream(&results, 0, false).expect("output");
    assert_eq!(stdout, "alice\n");
}

#[test]
fn grid_engine_reads_no_option_of_a_users_component() {
    let queues = SgeQueues::new(1, 2);
    let clusters = format!(
        "[[cluster]]\nname = \"g1\"\nbackend = \"sge\"\nqueue = \"{}\"\n",
        queues.names[0]
    );
    a_components_option_lines_change_nothing("users-sge-lines", &clusters, |name| {
        let job = listing("qstat", &["-j", name]);
        // `priority:` is shown only when it is not 0.
        job.contains("job_number").then(|| {
            job.lines()
                .filter(|l| {
                    ["priority", "job_name", "owner"]
                        .iter()
                        .any(|k| l.starts_with(k))
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
    });
}

#[test]
fn slurm_reads_no_option_of_a_users_component() {
    let _slurm = SlurmCluster::lock();
    let clusters = format!(
        "[[cluster]]\nname = \"s1\"\nbackend = \"slurm\"\npartition = \"{}\"\n",
        SlurmCluster::PARTITION
    );
    a_components_option_lines_change_nothing("users-slurm-lines", &clusters, |name| {
        let job = listing("squeue", &["-h", "-n", name, "-o", "nice %y, user %u"]);
        (!job.trim().is_empty()).then(|| job.trim().to_owned())
    });
}

#[test]
fn a_users_grid_component_runs_as_her() {
    let (g, alice, _bob) = many_users("users-grid");
    let manifest = g.write(
        "grid.toml",
        "name = \"rigid\"\nkind = \"grid\"\npriority = \"high\"\n[[component]]\nslots = 1\ncommand = \"id -un; id -Gn\"\n",
    );
    let submitted = g.run_as(&alice, &["submit", manifest.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", text(&submitted));
    let job = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    let results = g.path().join("alice/results").join(&job);
    wait_for("the grid job to end", MINUTE, || {
        std::fs::read_to_string(results.join("job.json")).is_ok_and(|t| t.contains("\"done\""))
    });
    let stdout = task_stream(&results, 0, false).expect("output");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("alice"), "{stdout}");
    assert!(
        !lines.next().unwrap_or_default().contains("root"),
        "none of root's groups: {stdout}"
    );
}

#[test]
fn a_task_with_its_launchers_credentials_reaches_its_own_job_only() {
    let (g, alice, bob) = many_users("users-launcher");
    let bobs = g.write(
        "bob.toml",
        "name = \"his\"\n[[task]]\ncommand = \"sleep 120\"\n",
    );
    let submitted = g.run_as(&bob, &["submit", bobs.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", text(&submitted));
    let his = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    wait_for("bob's task to run", MINUTE, || {
        g.vhost
            .queue(&format!("gleaner.job.{his}.tasks"))
            .is_some_and(|q| q["messages_unacknowledged"] == 1)
    });
    // Her task reads what its launcher connects with, and its environment.
    let hers = g.write(
        "alice.toml",
        "name = \"nosy\"\n[[task]]\ncommand = \"cat \\\"$GLEANER_CONFIG\\\"; env\"\n[[task]]\ncommand = \"sleep 120\"\n",
    );
    let submitted = g.run_as(&alice, &["submit", hers.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", text(&submitted));
    let job = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    let results = g.path().join("alice/results").join(&job);
    wait_for("her task's output", MINUTE, || {
        task_stream(&results, 0, false).is_some()
    });
    let seen = task_stream(&results, 0, false).unwrap();
    assert!(
        !seen.contains("guest:guest"),
        "the services' account leaked to a task:\n{seen}"
    );
    let url = seen
        .split('"')
        .find(|s| s.starts_with("amqp://"))
        .unwrap_or_else(|| panic!("no broker URL in the launcher's settings:\n{seen}"));
    assert!(url.contains(&format!("gleaner-launcher-{job}:")), "{url}");
    let stolen = gleaner_testkit::users::Amqp(url.to_owned());
    let refused = |what: &str, outcome: Result<(), String>| match outcome {
        Err(e) => assert!(e.contains("ACCESS_REFUSED"), "{what}: {e}"),
        Ok(()) => panic!("{what}: the broker let her task do it"),
    };
    refused(
        "consume his tasks",
        stolen.consume(&format!("gleaner.job.{his}.tasks")),
    );
    refused(
        "publish into his results",
        stolen.publish((&format!("gleaner.job.{his}"), "results"), b"x", None),
    );
    refused(
        "publish through the default exchange",
        stolen.publish(("", &format!("gleaner.job.{his}.results")), b"x", None),
    );
    refused(
        "submit a job",
        stolen.publish(("gleaner.user", "submit"), b"{}", None),
    );
    // Her own job's queues it reaches, but it cannot play the services
    // there: a cancel from the launcher's account is dropped.
    let forged = gleaner_protocol::codec::encode(
        "scheduler@forged",
        &gleaner_protocol::ControlMsg::Cancel {
            reason: "forged".into(),
        },
    )
    .unwrap();
    stolen
        .publish((&format!("gleaner.job.{job}"), "control"), &forged, None)
        .expect("her own job's exchange takes it");
    wait_for("the runner to drop the forged cancel", MINUTE, || {
        g.log("up")
            .contains("control message from a sender who may not send it")
    });
    let results = g.path().join("alice/results").join(&job);
    let file = std::fs::read_to_string(results.join("job.json")).unwrap_or_default();
    let file: serde_json::Value = serde_json::from_str(&file).unwrap_or_default();
    assert_eq!(file["state"], "running", "{file}");
    // The account goes with the job.
    for (user, job) in [(&bob, &his), (&alice, &job)] {
        let cancel = g.run_as(user, &["cancel", job]);
        assert!(cancel.status.success(), "{}", text(&cancel));
    }
    wait_for("her job to end", MINUTE, || {
        std::fs::read_to_string(results.join("job.json")).is_ok_and(|t| t.contains("\"cancelled\""))
    });
    wait_for("her launcher account to be deleted", MINUTE, || {
        !g.vhost.has_user(&format!("gleaner-launcher-{job}"))
    });
}
