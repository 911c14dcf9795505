//! What a job survives on the local backend: killed launchers, runners
//! and kcms, a lost broker, garbage and dead letters, a full disk.

use std::time::Duration;

use gleaner_testkit::{by_task, finish, runs, sweep, wait_for};
use nix::sys::signal::Signal;

use crate::{MINUTE, gleaner, services_apart};

#[test]
fn a_killed_launcher_loses_only_its_partial_run() {
    let mut g = gleaner("kill9");
    g.up(2);
    let job = g.submit(&sweep("victim", 12, "sleep 1.5; echo {n}"));
    // Kill a launcher while it runs a task.
    g.signal_busy_launcher(&job, 2, Signal::SIGKILL);

    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 12);
    assert!(tasks.values().all(|t| t["status"] == "succeeded"));
    assert!(
        tasks.values().all(|t| t["attempts"] == 1),
        "a crash is not a failed attempt"
    );
}

/// Tasks in bundles (`bundle = 6`, one launcher slot each: one runs, five
/// wait): a launcher killed outright has its bundle run again whole and the
/// index still holds each task once; a preempted one republishes its
/// running task and gives the waiting ones back untouched.
#[test]
fn bundled_tasks_end_once_through_a_killed_and_a_preempted_launcher() {
    let mut g = gleaner("bundle");
    g.up(4);
    let manifest = format!(
        "bundle = 6\n{}",
        sweep("bundled", 60, "sleep 0.4; echo {n}")
    );
    let job = g.submit(&manifest);
    let killed = g.signal_busy_launcher(&job, 4, Signal::SIGKILL);
    wait_for("the killed launcher gone", Duration::from_secs(10), || {
        !g.launchers(&job).contains(&killed)
    });
    let preempted = g.signal_busy_launcher(&job, 3, Signal::SIGTERM);
    wait_for(
        "the preempted launcher to leave",
        Duration::from_secs(10),
        || !g.launchers(&job).contains(&preempted),
    );
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let index = g.index(&job);
    assert_eq!(index.len(), 60, "one line per task");
    let tasks = by_task(&index);
    assert_eq!(tasks.len(), 60);
    for (task, line) in &tasks {
        assert!(
            line["status"] == "succeeded" && line["attempts"] == 1,
            "{line}"
        );
        let stdout = g.stdout(&job, *task).unwrap_or_default();
        assert_eq!(stdout, format!("{}\n", task + 1));
    }
    let preemptions: u64 = tasks
        .values()
        .map(|t| t["preemptions"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(preemptions, 1, "only the running task counts a preemption");
    assert!(g.log("up").contains("task preempted and republished"));
}

/// A quorum queue counts every return of a message against its delivery
/// limit, its own too (a delivery that reaches a consumer just cancelled
/// goes back): a task returned past the limit while no launcher died is
/// run again, not called lost.
#[test]
fn a_task_returned_too_often_with_no_launcher_dying_runs_again() {
    let mut g = gleaner("returned");
    g.up(1);
    // The first holds the one slot long enough for the second, waiting in
    // the queue, to be returned five times.
    let job = g.submit(&sweep("returned", 2, "sleep $((40 / {n})); echo {n}"));
    let queue = format!("gleaner.job.{job}.tasks");
    wait_for("one task running, one waiting", MINUTE, || {
        g.vhost.queue(&queue).is_some_and(|q| {
            q["messages_ready"].as_u64() == Some(1)
                && q["messages_unacknowledged"].as_u64() == Some(1)
        })
    });
    let mut returned = 0;
    while returned < 10 && !g.vhost.get_and_return(&queue, 1).is_empty() {
        returned += 1;
    }
    assert_eq!(returned, 5, "dead-lettered on its fifth return");
    g.assert_all_done_once(&job, 2);
    assert_eq!(g.stdout(&job, 1).as_deref(), Some("2\n"));
    assert!(g.log("up").contains("published again"), "{}", g.log("up"));
}

#[test]
fn a_runner_killed_mid_job_is_replaced_and_the_job_completes() {
    let (mut g, runner) = services_apart("runnerkill");
    let job = g.submit(&sweep("resume", 200, "sleep 0.1; echo {n}"));
    wait_for("some results", MINUTE, || g.index(&job).len() >= 20);
    g.signal(runner, Signal::SIGKILL);
    let before = g.index(&job).len();
    assert!(before < 200, "the runner died mid-job");
    g.start("runner2", &["runner"]);
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 200);
    assert!(tasks.values().all(|t| t["status"] == "succeeded"));
    assert!(
        g.log("runner2").contains("job resumed"),
        "{}",
        g.log("runner2")
    );
}

/// Anybody may send what cannot be read: `gleaner.dead` keeps the newest
/// `DEAD_LIMIT` of it and drops the oldest, so it cannot fill the broker.
#[test]
fn the_dead_letter_queue_stays_bounded() {
    let mut g = gleaner("dead-bound");
    g.up(1);
    wait_for("the submit queue", MINUTE, || {
        g.vhost.queue("gleaner.submit").is_some()
    });
    let limit = gleaner_broker::topology::DEAD_LIMIT as u64;
    gleaner_testkit::users::Amqp(g.vhost.url())
        .publish_many(
            ("", "gleaner.submit"),
            b"\x01 not a manifest",
            limit as usize + 500,
        )
        .expect("publish");
    wait_for("every copy dead-lettered", 3 * MINUTE, || {
        g.vhost
            .queue("gleaner.submit")
            .is_some_and(|q| q["messages"].as_u64() == Some(0))
    });
    // The management API's figures lag the queue by a few seconds.
    wait_for("the dead-letter queue at its bound", MINUTE, || {
        g.vhost
            .queue("gleaner.dead")
            .is_some_and(|q| q["messages"].as_u64() == Some(limit))
    });
}

/// A `gleaner.dead` an older gleaner declared without its bound does not
/// stop the services: it is kept as it is, with a warning.
#[test]
fn an_unbounded_dead_letter_queue_of_before_is_kept() {
    let mut g = gleaner("dead-before");
    g.vhost
        .declare_queue("gleaner.dead", r#"{"x-queue-type": "quorum"}"#);
    g.up(1);
    let output = finish(
        g.submit_waiting("name = \"after\"\n[[task]]\ncommand = \"echo fine\"\n"),
        MINUTE,
    );
    assert!(output.status.success(), "{output:?}");
    assert!(g.log("up").contains("stays unbounded"), "{}", g.log("up"));
}

#[test]
fn garbage_on_the_submit_queue_is_dead_lettered_and_the_next_job_runs() {
    let mut g = gleaner("garbage");
    g.up(2);
    wait_for("the submit queue", MINUTE, || {
        g.vhost.queue("gleaner.submit").is_some()
    });
    g.vhost
        .publish_raw("gleaner.submit", "\u{1}\u{2} not a manifest", None);
    g.vhost.publish_raw(
        "gleaner.submit",
        r#"{"name": "bad json", "task": []}"#,
        Some("application/json"),
    );
    wait_for("two dead letters", MINUTE, || {
        g.vhost
            .queue("gleaner.dead")
            .is_some_and(|q| q["messages"].as_u64() == Some(2))
    });
    let dead = g.vhost.get("gleaner.dead", 2);
    let reasons: Vec<String> = dead
        .iter()
        .map(|m| {
            m["properties"]["headers"]["x-gleaner-reason"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert!(reasons[0].contains("MessagePack"), "{reasons:?}");
    assert!(reasons[1].contains("name"), "{reasons:?}");

    // A hand-published JSON manifest works, and so does the CLI afterwards.
    g.vhost.publish_raw(
        "gleaner.submit",
        r#"{"name": "by-hand", "task": [{"command": "echo from json"}]}"#,
        Some("application/json"),
    );
    let output = finish(
        g.submit_waiting("name = \"after\"\n[[task]]\ncommand = \"echo fine\"\n"),
        MINUTE,
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    wait_for("the JSON job to finish", MINUTE, || {
        std::fs::read_dir(g.path().join("results")).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("by-hand-") && g.job_state(&name).as_deref() == Some("done")
            })
        })
    });
}

#[test]
fn services_reconnect_after_losing_the_broker_and_lose_nothing() {
    let mut g = gleaner("reconnect");
    g.up(3);
    let job = g.submit(&sweep("outage", 150, "sleep 0.2; echo {n}"));
    wait_for("some results", MINUTE, || g.index(&job).len() >= 15);
    // The management API lists connections a few seconds late.
    let mut closed = 0;
    wait_for("the services' connections to be closed", MINUTE, || {
        closed += g.vhost.close_connections();
        closed >= 4
    });
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 150);
    assert!(tasks.values().all(|t| t["status"] == "succeeded"));
    let log = g.log("up");
    assert!(
        log.contains("reconnecting"),
        "the services noticed the outage"
    );
    assert!(
        !log.contains("lapin::"),
        "the services said it themselves, without the library's noise"
    );
}

#[test]
fn submit_wait_rides_out_a_lost_broker_connection() {
    let mut g = gleaner("waitout");
    g.up(3);
    let waiting = g.submit_waiting(&sweep("waited", 150, "sleep 0.2; echo {n}"));
    let results = g.path().join("results");
    wait_for("some results", MINUTE, || {
        std::fs::read_dir(&results).is_ok_and(|dirs| {
            dirs.flatten().any(|d| {
                std::fs::read_to_string(d.path().join("index.jsonl"))
                    .is_ok_and(|index| index.lines().count() >= 15)
            })
        })
    });
    // The management API lists connections a few seconds late.
    let mut closed = 0;
    wait_for(
        "every connection, the client's too, to be closed",
        MINUTE,
        || {
            closed += g.vhost.close_connections();
            closed >= 5
        },
    );
    let output = finish(waiting, 2 * MINUTE);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the client gave up: {stderr}");
    assert!(stderr.contains("lost the broker"), "{stderr}");
    assert!(stderr.contains("the broker is back"), "{stderr}");
    assert!(!stderr.contains("ERROR"), "no library noise: {stderr}");
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    g.assert_all_done_once(&job, 150);
    assert!(
        !g.vhost
            .queue_names()
            .iter()
            .any(|q| q.starts_with("gleaner.watch.")),
        "the client's queue is gone with it"
    );
}

#[test]
fn a_launcher_that_stops_answering_is_removed_and_its_task_runs_elsewhere() {
    let mut g = gleaner("silent");
    g.up(2);
    let job = g.submit(&sweep("silent", 8, "sleep 2; echo done-{n}"));
    // Stopped, it neither beats nor answers polls: only its kcm can remove it.
    let victim = g.signal_busy_launcher(&job, 2, Signal::SIGSTOP);
    wait_for("the silent launcher to be removed", MINUTE, || {
        !g.launchers(&job).contains(&victim)
    });
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 8);
    assert!(tasks.values().all(|t| t["status"] == "succeeded"));
    assert!(g.log("up").contains("launchers silent too long"));
}

#[test]
fn a_killed_local_kcm_takes_its_launchers_along_and_slots_stay_slots() {
    let mut g = gleaner("kcmkill");
    g.write(
        "gleaner.toml",
        "[[cluster]]\nname = \"local\"\nbackend = \"local\"\nslots = 3\n",
    );
    g.start("scheduler", &["scheduler"]);
    g.start("runner", &["runner"]);
    let kcm = g.start("kcm", &["kcm", "--cluster", "local"]);
    let job = g.submit(&sweep("orphans", 30, "sleep 1; echo {n}"));
    wait_for("three launchers", MINUTE, || g.launchers(&job).len() == 3);
    g.signal(kcm, Signal::SIGKILL);
    wait_for(
        "its launchers to go with it",
        Duration::from_secs(15),
        || g.launchers(&job).is_empty(),
    );
    g.start("kcm2", &["kcm", "--cluster", "local"]);
    let mut most = 0;
    wait_for("the job to end", 2 * MINUTE, || {
        most = most.max(g.launchers(&job).len());
        g.job_state(&job).as_deref() == Some("done")
    });
    assert!(most <= 3, "never more launchers than slots: {most}");
    g.assert_all_done_once(&job, 30);
}

/// A small filesystem of its own, unmounted when dropped.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(at: std::path::PathBuf, size: &str) -> Self {
        std::fs::create_dir_all(&at).expect("mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .expect("mount");
        assert!(status.success(), "mount a tmpfs (needs root)");
        Self(at)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_full_results_disk_holds_results_until_space_returns() {
    let mut g = gleaner("diskfull");
    let disk = SmallDisk::mount(g.path().join("results"), "2m");
    // Nearly full before the job starts.
    let filler = disk.0.join("filler");
    let blocks = vec![b'x'; 1900 * 1024];
    std::fs::write(&filler, &blocks).expect("filler");
    g.up(2);
    let job = g.submit(&sweep("bulky", 60, "yes | head -c 20000; echo {n}"));
    wait_for("the runner to notice the full disk", MINUTE, || {
        g.log("up").contains("No space left on device")
    });
    wait_for("gleaner status to say why the job stalls", MINUTE, || {
        String::from_utf8_lossy(&g.run(&["status", &job]).stdout).contains("No space left")
    });
    std::fs::remove_file(&filler).expect("free the disk");
    g.assert_all_done_once(&job, 60);
}

#[test]
fn launchers_killed_outright_take_what_their_tasks_started_with_them() {
    let mut g = gleaner("sigkill");
    g.up(2);
    let pids = g.path().join("pids");
    let job = g.submit(&sweep(
        "sigkill",
        2,
        &format!(
            "sleep 300 & echo $! >> {p}; setsid sleep 301 & echo $! >> {p}; wait",
            p = pids.display()
        ),
    ));
    let read = || -> Vec<i32> {
        std::fs::read_to_string(&pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    wait_for("both tasks' processes", MINUTE, || read().len() == 4);
    let started = read();
    for launcher in g.launchers(&job) {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(launcher as i32), Signal::SIGKILL);
    }
    // Gone, or dead and waiting for init to reap them.
    let alive = |pid: &i32| runs(*pid);
    wait_for(
        "the killed launchers' task processes to die",
        MINUTE,
        || !started.iter().any(alive),
    );
    let output = g.run(&["cancel", &job]);
    assert!(output.status.success());
}
