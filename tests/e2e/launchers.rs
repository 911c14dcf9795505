//! Launchers on the local backend: signals, checkpoints, idle give-back,
//! and nothing a task starts outliving it.

use std::time::Duration;

use gleaner_testkit::{by_task, sweep, wait_for};
use nix::sys::signal::Signal;

use crate::{MINUTE, gleaner};

#[test]
fn sigterm_preempts_a_launcher_and_its_task_runs_again_without_a_failure() {
    let mut g = gleaner("sigterm");
    g.up(2);
    let job = g.submit(&sweep("preempted", 4, "sleep 3; echo done-{n}"));
    let victim = g.signal_busy_launcher(&job, 2, Signal::SIGTERM);
    wait_for(
        "the preempted launcher to leave",
        Duration::from_secs(10),
        || !g.launchers(&job).contains(&victim),
    );
    assert_eq!(g.wait_for_end(&job, MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert!(
        tasks
            .values()
            .all(|t| t["status"] == "succeeded" && t["attempts"] == 1)
    );
    let preempted: Vec<_> = tasks.values().filter(|t| t["preemptions"] == 1).collect();
    assert_eq!(
        preempted.len(),
        1,
        "exactly the running task was republished: {tasks:?}"
    );
    assert_eq!(g.job_file(&job).unwrap()["preemptions"], 1);
}

/// A task that saves its state in `$GLEANER_CHECKPOINT` when preempted
/// (`preempt_signal`, `preempt_grace`) resumes from it on its next launcher:
/// preempted three times, its counter goes on instead of starting over.
#[test]
fn a_checkpointing_task_resumes_after_each_preemption() {
    let mut g = gleaner("checkpoint");
    g.up(1);
    let manifest = r#"name = "resumable"
preempt_grace = "3s"
preempt_signal = "USR1"
[[task]]
command = """
c=$(cat "$GLEANER_CHECKPOINT/n" 2>/dev/null || echo 0)
echo "start $c" >> "$GLEANER_CHECKPOINT/log"
trap 'echo $c > "$GLEANER_CHECKPOINT/n"; exit 1' USR1
while [ $c -lt 60 ]; do c=$((c+1)); sleep 0.1; done
cat "$GLEANER_CHECKPOINT/log"; echo "final $c"
"""
"#;
    let job = g.submit(manifest);
    let checkpoint = std::env::temp_dir()
        .join("gleaner-checkpoints")
        .join(nix::unistd::getuid().to_string())
        .join(&job)
        .join("0");
    let runs = || {
        std::fs::read_to_string(checkpoint.join("log"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    for preemption in 1..=3 {
        wait_for("the task to run again", MINUTE, || runs() == preemption);
        std::thread::sleep(Duration::from_millis(700));
        let launchers = g.launchers(&job);
        assert_eq!(launchers.len(), 1, "one slot: {launchers:?}");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(launchers[0] as i32),
            Signal::SIGTERM,
        )
        .expect("preempt the launcher");
        wait_for("the preempted launcher to leave", MINUTE, || {
            !g.launchers(&job).contains(&launchers[0])
        });
    }
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let task = &by_task(&g.index(&job))[&0];
    assert_eq!(task["status"], "succeeded", "{task}");
    assert_eq!(task["attempts"], 1, "preemptions are no failures: {task}");
    assert_eq!(task["preemptions"], 3, "{task}");
    let stdout = g.stdout(&job, 0).unwrap();
    let starts: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("start ")?.parse().ok())
        .collect();
    assert_eq!(starts.len(), 4, "{stdout}");
    assert_eq!(starts[0], 0, "{stdout}");
    assert!(
        starts.windows(2).all(|w| w[1] > w[0]),
        "each run went on from the last: {stdout}"
    );
    assert!(stdout.ends_with("final 60\n"), "{stdout}");
    assert!(
        !checkpoint.exists(),
        "the state of a task that succeeded is removed"
    );
}

/// A checkpoint over `max_checkpoint_bytes` is dropped (the next run
/// starts over), and a job's checkpoints go when the job ends.
#[test]
fn an_oversized_checkpoint_is_dropped_and_checkpoints_end_with_their_job() {
    let mut g = gleaner("checkpoint-bound");
    g.start_with(
        "up",
        &["up", "--slots", "1"],
        &[("GLEANER_LAUNCHER__MAX_CHECKPOINT_BYTES", "1000")],
    );
    let runs = g.path().join("runs");
    let manifest = format!(
        r#"name = "bounded"
max_attempts = 2
[[task]]
command = "echo kept > $GLEANER_CHECKPOINT/state; exit 1"
[[task]]
command = """
n=$(cat {runs} 2>/dev/null || echo 0); echo $((n+1)) > {runs}
if [ $n = 0 ]; then head -c 2000 /dev/zero > $GLEANER_CHECKPOINT/big; sleep 60; fi
echo "limit $GLEANER_CHECKPOINT_MAX_BYTES, files $(ls $GLEANER_CHECKPOINT | wc -l)"
"""
"#,
        runs = runs.display()
    );
    let job = g.submit(&manifest);
    let checkpoints = std::env::temp_dir()
        .join("gleaner-checkpoints")
        .join(nix::unistd::getuid().to_string());
    wait_for("the second task to save its state", MINUTE, || {
        checkpoints.join(&job).join("1/big").exists()
    });
    assert!(
        checkpoints.join(&job).join("0/state").exists(),
        "a task that failed with an attempt left keeps its state"
    );
    let launchers = g.launchers(&job);
    assert_eq!(launchers.len(), 1, "one slot: {launchers:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(launchers[0] as i32),
        Signal::SIGTERM,
    )
    .expect("preempt the launcher");
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(
        (&tasks[&0]["status"], &tasks[&0]["attempts"]),
        (&"failed".into(), &2.into())
    );
    let stdout = g.stdout(&job, 1).unwrap();
    assert_eq!(
        stdout, "limit 1000, files 0\n",
        "the oversized state was dropped"
    );
    wait_for("the job's checkpoints to go", MINUTE, || {
        !checkpoints.join(&job).exists()
    });

    // A task stopped by its job's cancel leaves its state to the job's end.
    let cancelled = g.submit(
        "name = \"stopped\"\n[[task]]\ncommand = \"echo s > $GLEANER_CHECKPOINT/s; sleep 60\"\n",
    );
    wait_for("the state to be saved", MINUTE, || {
        checkpoints.join(&cancelled).join("0/s").exists()
    });
    assert!(g.run(&["cancel", &cancelled]).status.success());
    wait_for("the cancelled job's checkpoints to go", MINUTE, || {
        !checkpoints.join(&cancelled).exists()
    });
}

#[test]
fn sigusr1_drains_a_launcher_its_task_finishes_and_nothing_is_preempted() {
    let mut g = gleaner("sigusr1");
    g.up(2);
    let job = g.submit(&sweep("drained", 4, "sleep 6; echo done-{n}"));
    let victim = g.signal_busy_launcher(&job, 2, Signal::SIGUSR1);
    // A preempted launcher leaves within milliseconds; a drained one once
    // its task is done.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        g.launchers(&job).contains(&victim),
        "still running its task"
    );
    wait_for(
        "the drained launcher to leave",
        Duration::from_secs(20),
        || !g.launchers(&job).contains(&victim),
    );
    assert_eq!(g.wait_for_end(&job, MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert!(
        tasks
            .values()
            .all(|t| t["status"] == "succeeded" && t["attempts"] == 1 && t["preemptions"] == 0),
        "its task finished where it ran: {tasks:?}"
    );
    assert_eq!(g.job_file(&job).unwrap()["preemptions"], 0);
}

#[test]
fn nothing_a_task_starts_outlives_it() {
    let mut g = gleaner("daemons");
    g.up(2);
    // Unique among the tests running at once.
    let daemon = format!("sleep 47.{}", std::process::id());
    let job = g.submit(&sweep(
        "daemons",
        4,
        &format!("setsid {daemon} & sleep 0.3; echo {{n}}"),
    ));
    g.assert_all_done_once(&job, 4);
    let left = std::process::Command::new("pgrep")
        .args(["-f", &daemon])
        .output()
        .expect("pgrep");
    assert!(
        left.stdout.is_empty(),
        "daemons outlived their tasks: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

#[test]
fn an_idle_launcher_gives_its_slot_back() {
    let mut g = gleaner("idle");
    g.up(3);
    let job = g.submit(
        r#"
name = "tail"
[[task]]
command = "true"
[[task]]
command = "true"
[[task]]
command = "sleep 12"
"#,
    );
    wait_for("three launchers", MINUTE, || g.launchers(&job).len() == 3);
    // idle_timeout is 2 s in tests: the two launchers without work leave
    // while the third still runs its task.
    wait_for(
        "the idle launchers to leave",
        Duration::from_secs(8),
        || g.launchers(&job).len() == 1,
    );
    assert_eq!(g.job_state(&job).as_deref(), Some("running"));
    assert_eq!(g.wait_for_end(&job, MINUTE), "done");
}

#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    let mut g = gleaner("closed-pipe");
    g.up(1);
    wait_for("the scheduler to answer", MINUTE, || g.status().is_some());
    // Like `gleaner status | head -0`: the reader is gone before a byte is written.
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    for args in [&["status"][..], &["status", "--output", "json"]] {
        let output = g
            .command(args)
            .stdout(std::process::Stdio::from(write.try_clone().unwrap()))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
