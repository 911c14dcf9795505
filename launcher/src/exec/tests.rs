#[test]
fn plain_commands_skip_the_shell_and_the_rest_keep_it() {
    assert_eq!(super::plain_words("true"), Some(vec!["true"]));
    assert_eq!(
        super::plain_words("./solve  --seed 3\t--alpha=0.5 out/x,y"),
        Some(vec!["./solve", "--seed", "3", "--alpha=0.5", "out/x,y"])
    );
    for shell in [
        "echo -e 'a\\tb'",
        "a=1 ./solve",
        "./solve > out",
        "./solve $HOME",
        "cd x",
        "./solve *.dat",
        "./a && ./b",
        "./solve 'two words'",
        "exit 3",
        "./solve # comment",
        "./solve ~/x",
        "",
        "   ",
    ] {
        assert_eq!(super::plain_words(shell), None, "{shell:?}");
    }
}

#[test]
fn programs_are_found_as_the_shell_finds_them() {
    let cwd = std::path::Path::new("/");
    assert_eq!(
        super::find_program("sh", cwd, Some("/nonexistent::/bin")),
        Some(std::path::PathBuf::from("/bin/sh"))
    );
    assert_eq!(
        super::find_program("no-such-program", cwd, Some("/bin:/usr/bin")),
        None
    );
    assert_eq!(
        super::find_program("sh", cwd, None),
        None,
        "no PATH, no search"
    );
    assert!(
        super::find_program("bin/sh", cwd, None).is_some(),
        "relative to the task's directory"
    );
    assert_eq!(
        super::find_program("sh", cwd, Some("bin")),
        None,
        "relative PATH entries are the shell's"
    );
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("no-hashbang");
    std::fs::write(&script, "echo hi\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    assert_eq!(
        super::find_program("./no-hashbang", dir.path(), None),
        None,
        "a script for the shell"
    );
    assert_eq!(
        super::find_program("etc/passwd", cwd, None),
        None,
        "not executable"
    );
}

#[test]
fn a_directory_tree_is_measured_up_to_the_limit() {
    let dir = std::env::temp_dir().join(format!("gleaner-size-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a/b")).unwrap();
    std::fs::write(dir.join("one"), [0u8; 100]).unwrap();
    std::fs::write(dir.join("a/b/two"), [0u8; 200]).unwrap();
    std::os::unix::fs::symlink("/usr", dir.join("link")).unwrap();
    assert!(!super::size_over(&dir, 300), "links are not followed");
    assert!(super::size_over(&dir, 299));
    assert!(!super::size_over(&dir.join("missing"), 0));
    std::fs::remove_dir_all(&dir).unwrap();
}

use super::*;

fn task<'a>(command: &'a str, dir: &Path) -> TaskRun<'a> {
    TaskRun {
        command,
        env: &[],
        walltime: None,
        outputs: &[],
        workdir: None,
        sandbox: dir.join("sandbox"),
        preempt: None,
        memory_mb: None,
        streams: Streams::default(),
    }
}

#[test]
fn a_tasks_variables_replace_the_launchers_and_each_other() {
    let own = task_vars([
        (OsStr::new("HOME"), OsStr::new("/root")),
        (OsStr::new("PATH"), OsStr::new("/bin")),
    ])
    .unwrap();
    let set = task_vars([
        (OsStr::new("PATH"), OsStr::new("/opt/bin")),
        (OsStr::new("X"), OsStr::new("1")),
        (OsStr::new("X"), OsStr::new("2")),
    ])
    .unwrap();
    let env: Vec<&str> = task_env(&own, &set)
        .into_iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(env, ["HOME=/root", "PATH=/opt/bin", "X=2"]);
    let nul = task_vars([(OsStr::new("Y"), OsStr::new("a\0b"))]).err();
    assert!(nul.is_some_and(|e| e.to_string().contains("$Y")));
}

fn never() -> watch::Receiver<bool> {
    watch::channel(false).1
}

#[tokio::test]
async fn a_running_tasks_output_is_seen_before_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let streams = Streams::default();
    let run = TaskRun {
        streams: streams.clone(),
        ..task("echo early; echo warn >&2; sleep 30", dir.path())
    };
    let (stop, stopped) = watch::channel(false);
    let running = tokio::spawn(async move { super::run(run, Limits::default(), stopped).await });
    let deadline = Instant::now() + Duration::from_secs(20);
    let [out, err] = loop {
        let [out, err] = streams.since([0, 0]);
        if out.data == b"early\n" && err.data == b"warn\n" || Instant::now() > deadline {
            break [out, err];
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(out.data, b"early\n");
    assert_eq!(err.data, b"warn\n");
    assert_eq!(streams.since([6, 5])[0].data, b"");
    stop.send_replace(true);
    assert!(running.await.unwrap().is_none());
}

#[tokio::test]
async fn success_captures_output_and_removes_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("GREETING".to_owned(), "hello".to_owned())];
    let run = TaskRun {
        env: &env,
        ..task("echo $GREETING; echo oops >&2; pwd", dir.path())
    };
    let run = TaskRun {
        command: "echo $GREETING; echo oops >&2; pwd; mkdir -p junk/deep; touch junk/deep/f left",
        ..run
    };
    let outcome = super::run(run, Limits::default(), never()).await.unwrap();
    assert_eq!(outcome.status, RunStatus::Succeeded);
    assert_eq!(outcome.exit_code, Some(0));
    let stdout = String::from_utf8(outcome.stdout.data).unwrap();
    assert!(stdout.starts_with("hello\n"), "{stdout}");
    assert!(stdout.contains("sandbox"), "ran in the sandbox: {stdout}");
    assert_eq!(outcome.stderr.data, b"oops\n");
    let sandbox = dir.path().join("sandbox");
    assert!(reset_sandbox(&sandbox));
    assert_eq!(
        std::fs::read_dir(&sandbox).unwrap().count(),
        0,
        "emptied for the next task"
    );
}

/// Tasks yield to their launcher, and to whatever else runs on the node.
#[tokio::test]
async fn a_task_runs_nicer_than_its_launcher() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        nice: 3,
        ..Limits::default()
    };
    let outcome = super::run(
        task("cut -d' ' -f19 /proc/self/stat", dir.path()),
        limits,
        never(),
    )
    .await
    .unwrap();
    // SAFETY: reads this thread's niceness.
    let own = unsafe { nix::libc::getpriority(nix::libc::PRIO_PROCESS, 0) };
    assert_eq!(
        String::from_utf8(outcome.stdout.data).unwrap().trim(),
        (own + 3).min(19).to_string()
    );
}

/// A command without shell syntax runs as its program, as `sh -c`
/// would have run it: in the sandbox, with `PWD` saying so.
#[tokio::test]
async fn a_plain_command_runs_directly_with_the_shells_result() {
    let dir = tempfile::tempdir().unwrap();
    let run = task("printenv PWD GLEANER_SANDBOX", dir.path());
    let sandbox = run.sandbox.display().to_string();
    let outcome = super::run(run, Limits::default(), never()).await.unwrap();
    assert_eq!(outcome.status, RunStatus::Succeeded);
    assert_eq!(
        String::from_utf8(outcome.stdout.data).unwrap(),
        format!("{sandbox}\n{sandbox}\n")
    );
    let outcome = super::run(task("false", dir.path()), Limits::default(), never())
        .await
        .unwrap();
    assert_eq!(
        (outcome.status, outcome.exit_code),
        (RunStatus::Failed, Some(1))
    );
    let outcome = super::run(
        task("no-such-program x", dir.path()),
        Limits::default(),
        never(),
    )
    .await
    .unwrap();
    assert_eq!(outcome.exit_code, Some(127), "the shell's answer");
    assert!(String::from_utf8_lossy(&outcome.stderr.data).contains("not found"));
}

#[tokio::test]
async fn failure_missing_executable_and_signals() {
    let dir = tempfile::tempdir().unwrap();
    let outcome = super::run(task("exit 3", dir.path()), Limits::default(), never())
        .await
        .unwrap();
    assert_eq!(
        (outcome.status, outcome.exit_code),
        (RunStatus::Failed, Some(3))
    );
    let outcome = super::run(
        task("./no-such-program", dir.path()),
        Limits::default(),
        never(),
    )
    .await
    .unwrap();
    assert_eq!(
        (outcome.status, outcome.exit_code),
        (RunStatus::Failed, Some(127))
    );
    assert!(String::from_utf8_lossy(&outcome.stderr.data).contains("not found"));
    let outcome = super::run(task("kill -9 $$", dir.path()), Limits::default(), never())
        .await
        .unwrap();
    assert_eq!(
        (outcome.status, outcome.signal),
        (RunStatus::Failed, Some(9))
    );
}

#[tokio::test]
async fn a_task_over_its_memory_is_killed_as_out_of_memory_with_its_peak() {
    assert!(orphans::contain().is_ok(), "task cgroups are allowed here");
    let dir = tempfile::tempdir().unwrap();
    // 200 MiB held in a child of the shell, escaped from its group:
    // its cgroup still counts it.
    let hog = "setsid python3 -c 'b = bytearray(200 << 20); import time; time.sleep(30)' & wait";
    let run = TaskRun {
        memory_mb: Some(64),
        ..task(hog, dir.path())
    };
    let started = Instant::now();
    let outcome = super::run(run, Limits::default(), never()).await.unwrap();
    assert_eq!(outcome.status, RunStatus::Oom, "{outcome:?}");
    assert!(outcome.peak_memory_mb.unwrap() > 64, "{outcome:?}");
    assert!(outcome.error.unwrap().contains("64 MiB"));
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "killed, not waited for"
    );

    orphans::release();
}

#[tokio::test]
async fn memory_forked_workers_share_is_counted_once() {
    assert!(orphans::contain().is_ok(), "task cgroups are allowed here");
    let dir = tempfile::tempdir().unwrap();
    // 80 MiB, then three forked workers sharing it: 320 MiB resident
    // all told, 80 MiB in fact.
    let workers = "python3 -c 'import os, time
b = bytearray(80 << 20)
for _ in range(3):
    if os.fork() == 0:
        time.sleep(2)
        os._exit(0)
time.sleep(2)
os.wait()'";
    let run = TaskRun {
        memory_mb: Some(200),
        ..task(workers, dir.path())
    };
    let outcome = super::run(run, Limits::default(), never()).await.unwrap();
    assert_eq!(outcome.status, RunStatus::Succeeded, "{outcome:?}");
    let peak = outcome.peak_memory_mb.unwrap_or(0);
    assert!((60..200).contains(&peak), "counted once: {peak} MiB");
    orphans::release();
}

#[tokio::test]
async fn without_task_cgroups_memory_is_counted_over_the_tasks_descendants() {
    let dir = tempfile::tempdir().unwrap();
    let hog = "sh -c \"python3 -c 'b = bytearray(200 << 20); import time; time.sleep(30)'\"";
    let run = TaskRun {
        memory_mb: Some(64),
        ..task(hog, dir.path())
    };
    let outcome = super::run(run, Limits::default(), never()).await.unwrap();
    assert_eq!(outcome.status, RunStatus::Oom, "{outcome:?}");

    let small = TaskRun {
        memory_mb: Some(64),
        ..task("python3 -c 'b = bytearray(8 << 20)'", dir.path())
    };
    let outcome = super::run(small, Limits::default(), never()).await.unwrap();
    assert_eq!(outcome.status, RunStatus::Succeeded, "{outcome:?}");
    assert!(outcome.peak_memory_mb.is_some());
}

#[tokio::test]
async fn walltime_kills_the_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("survivor");
    let command = format!("(sleep 3; touch {}) & sleep 30", marker.display());
    let run = TaskRun {
        walltime: Some(Duration::from_millis(300)),
        ..task(&command, dir.path())
    };
    let started = Instant::now();
    let outcome = super::run(run, Limits::default(), never()).await.unwrap();
    assert_eq!(outcome.status, RunStatus::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(5));
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !marker.exists(),
        "the background child was killed with its group"
    );
}

#[tokio::test]
async fn output_is_kept_when_an_escaped_daemon_holds_the_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let run = task("echo before; setsid sleep 5 & echo after", dir.path());
    let outcome = super::run(run, Limits::default(), never()).await.unwrap();
    assert_eq!(outcome.status, RunStatus::Succeeded);
    assert_eq!(outcome.stdout.data, b"before\nafter\n");
}

#[tokio::test]
async fn processes_that_leave_the_group_end_with_the_task() {
    assert!(orphans::adopt(), "the subreaper is allowed here");
    let dir = tempfile::tempdir().unwrap();
    // Unique among the tests running at once.
    let daemon = format!("sleep 41.{}", std::process::id());
    // Out of the group before the task ends, which the group kill misses.
    let command =
        format!("setsid {daemon} & setsid sh -c '{daemon} & wait' & sleep 0.3; echo started");
    let outcome = super::run(task(&command, dir.path()), Limits::default(), never())
        .await
        .unwrap();
    assert_eq!(outcome.stdout.data, b"started\n");
    let left = std::process::Command::new("pgrep")
        .args(["-f", &daemon])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "escaped processes outlived their task: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

#[tokio::test]
async fn a_running_tasks_orphan_lives_until_that_task_ends() {
    assert!(orphans::adopt(), "the subreaper is allowed here");
    assert!(orphans::contain().is_ok(), "cgroup v2 is writable here");
    let dir = tempfile::tempdir().unwrap();
    let daemon = format!("sleep 43.{}", std::process::id());
    // The daemon's own command line, not the task's shell's.
    let running = |daemon: &str| {
        let found = std::process::Command::new("pgrep")
            .args(["-f", &format!("^{daemon}$")])
            .output()
            .unwrap();
        !found.stdout.is_empty()
    };
    // Orphaned at once (its parent subshell ends), out of the group,
    // while its task still runs.
    let long = tokio::spawn({
        let (command, sandbox) = (
            format!("(setsid {daemon} &); sleep 2"),
            dir.path().join("a"),
        );
        async move { super::run(task(&command, &sandbox), Limits::default(), never()).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(running(&daemon), "the orphan started");
    // Another task ending sweeps the strays; the orphan is not one.
    let short = super::run(
        task("true", &dir.path().join("b")),
        Limits::default(),
        never(),
    )
    .await
    .unwrap();
    assert_eq!(short.status, RunStatus::Succeeded);
    assert!(
        running(&daemon),
        "another task's end spared a running task's orphan"
    );
    let outcome = long.await.unwrap().unwrap();
    assert_eq!(outcome.status, RunStatus::Succeeded);
    assert!(!running(&daemon), "the orphan ended with its task");
    orphans::release();
}

#[tokio::test]
async fn stop_kills_and_returns_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = watch::channel(false);
    let handle = tokio::spawn({
        let sandbox = dir.path().to_path_buf();
        async move { super::run(task("sleep 30", &sandbox), Limits::default(), rx).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx.send(true).unwrap();
    assert_eq!(handle.await.unwrap(), None);
}

#[tokio::test]
async fn a_preempted_task_gets_its_signal_and_grace_before_the_kill() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("saved");
    let command = format!(
        "trap 'sleep 0.3; echo state > {}; exit 0' USR1; sleep 30 & wait",
        saved.display()
    );
    let (tx, rx) = watch::channel(false);
    let handle = tokio::spawn({
        let sandbox = dir.path().to_path_buf();
        async move {
            let run = TaskRun {
                preempt: Some((Signal::SIGUSR1, Duration::from_secs(5))),
                ..task(&command, &sandbox)
            };
            super::run(run, Limits::default(), rx).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    tx.send(true).unwrap();
    assert_eq!(handle.await.unwrap(), None, "preempted: no outcome");
    assert_eq!(
        std::fs::read_to_string(&saved).unwrap_or_default(),
        "state\n"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "no longer than it took"
    );
}

#[tokio::test]
async fn output_is_bounded_and_outputs_collected() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        stream_bytes: 10,
        file_bytes: 4,
        ..Limits::default()
    };
    let outputs = ["*.txt".to_owned(), "sub/*".to_owned()];
    let run = TaskRun {
        outputs: &outputs,
        ..task(
            "seq 1 100000; echo 123456 > a.txt; mkdir sub; echo hi > sub/b; ln -s /etc/passwd c.txt",
            dir.path(),
        )
    };
    let outcome = super::run(run, limits, never()).await.unwrap();
    assert_eq!(outcome.stdout.data.len(), 10);
    assert!(outcome.stdout.data.ends_with(b"100000\n"));
    assert!(outcome.stdout.dropped > 0);
    let names: Vec<&str> = outcome.outputs.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(names, ["a.txt", "sub/b"]);
    assert_eq!(outcome.outputs[0].data, b"1234");
    assert_eq!(outcome.outputs[0].dropped, 3);
}
