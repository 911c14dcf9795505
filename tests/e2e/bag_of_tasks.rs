//! Bag-of-tasks end to end on a real RabbitMQ with the local backend.

use std::time::Duration;

use gleaner_testkit::{
    Gleaner, by_task, finish, finish_all_succeeded, runs, sweep, terminal::Terminal, wait_for,
};
use nix::sys::signal::Signal;

const MINUTE: Duration = Duration::from_secs(60);

fn gleaner(test: &str) -> Gleaner {
    Gleaner::new(test, env!("CARGO_BIN_EXE_gleaner"))
}

#[test]
fn a_500_task_sweep_completes_with_every_result_exactly_once() {
    let mut g = gleaner("sweep500");
    g.up(4);
    let waiting = g.submit_waiting(
        r#"
name = "five-hundred"
[sweep]
command = "echo task-{i}-{colour}"
params = { i = { from = 1, to = 250 }, colour = ["red", "blue"] }
"#,
    );
    let output = finish_all_succeeded(waiting, 500, 3 * MINUTE);
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();

    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 500);
    for (task, line) in &tasks {
        assert_eq!(line["status"], "succeeded");
        let expected = format!(
            "task-{}-{}\n",
            line["params"]["i"],
            line["params"]["colour"].as_str().unwrap()
        );
        let stdout =
            std::fs::read_to_string(g.results_dir(&job).join(format!("tasks/{task}/stdout")))
                .expect("stdout file");
        assert_eq!(stdout, expected, "task {task}");
    }
    assert_eq!(tasks[&0]["command"], "echo task-1-red");
    assert_eq!(tasks[&499]["command"], "echo task-250-blue");
    let job_file = g.job_file(&job).unwrap();
    assert_eq!(job_file["state"], "done");
    assert_eq!(job_file["tasks"]["succeeded"], 500);
    // The job's queues are gone with it.
    wait_for("job queues to be deleted", Duration::from_secs(10), || {
        !g.vhost.queue_names().iter().any(|q| q.contains(&job))
    });
}

#[test]
fn failures_are_retried_then_failed_and_walltime_times_out() {
    let mut g = gleaner("retries");
    g.up(3);
    let marker = g.path().join("marker");
    let manifest = format!(
        r#"
name = "flaky"
max_attempts = 3
walltime = "2s"
[[task]]
command = "echo always failing; exit 3"
[[task]]
command = "sleep 30"
[[task]]
command = "if [ -e {m} ]; then echo second time lucky; else touch {m}; exit 1; fi"
"#,
        m = marker.display()
    );
    let output = finish(g.submit_waiting(&manifest), 2 * MINUTE);
    assert_eq!(output.status.code(), Some(1), "not every task succeeded");
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks[&0]["status"], "failed");
    assert_eq!(tasks[&0]["exit_code"], 3);
    assert_eq!(tasks[&0]["attempts"], 3);
    assert_eq!(tasks[&1]["status"], "timed_out");
    assert_eq!(tasks[&1]["attempts"], 3);
    assert!(tasks[&1]["runtime_s"].as_f64().unwrap() < 10.0);
    assert_eq!(tasks[&2]["status"], "succeeded");
    assert_eq!(tasks[&2]["attempts"], 2);
    let stdout = std::fs::read_to_string(g.results_dir(&job).join("tasks/0/stdout")).unwrap();
    assert_eq!(stdout, "always failing\n");
    // The summary says which tasks did not succeed, and where to look.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("1 of 3 tasks succeeded (2 did not: 1 failed, 1 timed out)"),
        "{stderr}"
    );
    assert!(stderr.contains("  failed: task 0\n"), "{stderr}");
    assert!(stderr.contains("  timed out: task 1\n"), "{stderr}");
    let where_ = g.results_dir(&job).join("tasks/0/stderr");
    assert!(stderr.contains(&where_.display().to_string()), "{stderr}");

    // The index, filtered, and a task's output, from the CLI.
    let listed = g.run(&[
        "results",
        &job,
        "--status",
        "failed",
        "--status",
        "timed-out",
        "--json",
    ]);
    assert!(listed.status.success(), "{listed:?}");
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    let tasks: Vec<u64> = listed
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|e| e["task"].as_u64())
        .collect();
    assert_eq!(tasks, [0, 1]);
    let table = g.run(&["results", &job]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("timed out"), "{table}");
    let logs = g.run(&["logs", &job, "0"]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "always failing\n");
    let none = g.run(&["logs", &job, "7"]);
    assert_eq!(none.status.code(), Some(1), "task 7 never ends: {none:?}");

    // A task that cannot even start says why, in the index, in its stderr
    // and in the summary.
    let nowhere =
        "name = \"nowhere\"\nworkdir = \"/nonexistent/dir\"\n[[task]]\ncommand = \"true\"\n";
    let output = finish(g.submit_waiting(nowhere), 2 * MINUTE);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let index = g.index(&job);
    let error = index[0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("cannot enter its directory"), "{index:?}");
    let stderr = std::fs::read_to_string(g.results_dir(&job).join("tasks/0/stderr")).unwrap();
    assert!(stderr.contains(error), "{stderr}");
    let summary = String::from_utf8_lossy(&output.stderr);
    assert!(
        summary.contains(&format!("  task 0 could not start: {error}")),
        "{summary}"
    );
}

/// `gleaner resubmit --failed` runs exactly the failed tasks again, with
/// their numbers and parameters, as a job of its own linked to the first.
#[test]
fn resubmit_failed_reruns_exactly_the_failed_tasks() {
    let mut g = gleaner("resubmit");
    g.up(3);
    let fixed = g.path().join("fixed");
    let manifest = format!(
        r#"
name = "flaky-sweep"
max_attempts = 1
[sweep]
command = "if [ -e {f} ] || [ {{i}} != 2 -a {{i}} != 5 ]; then echo ok $GLEANER_PARAM_i; else exit 4; fi"
params.i = {{ from = 0, to = 7 }}
"#,
        f = fixed.display()
    );
    let first = finish(g.submit_waiting(&manifest), 2 * MINUTE);
    assert_eq!(first.status.code(), Some(1), "two tasks failed");
    let job = String::from_utf8_lossy(&first.stdout).trim().to_owned();

    let nothing = g.run(&["resubmit", &job, "--lost"]);
    assert_eq!(nothing.status.code(), Some(1), "{nothing:?}");
    let said = String::from_utf8_lossy(&nothing.stderr);
    assert!(
        said.contains(&format!("no task of {job} ended lost")),
        "{said}"
    );
    let stranger = g.run(&["resubmit", &job, "--tasks", "3,8"]);
    assert_eq!(stranger.status.code(), Some(2), "{stranger:?}");
    let said = String::from_utf8_lossy(&stranger.stderr);
    assert!(said.contains("task 8 is not one of"), "{said}");

    std::fs::write(&fixed, "").unwrap();
    let rerun = finish_all_succeeded(
        g.client(&["resubmit", &job, "--failed", "--wait"]),
        2,
        2 * MINUTE,
    );
    let again = String::from_utf8_lossy(&rerun.stdout).trim().to_owned();
    assert_ne!(again, job);
    let tasks = by_task(&g.index(&again));
    assert_eq!(
        tasks.keys().copied().collect::<Vec<_>>(),
        [2, 5],
        "exactly the failed tasks, by their numbers"
    );
    for (task, entry) in &tasks {
        assert_eq!(entry["status"], "succeeded");
        assert_eq!(entry["params"]["i"], *task);
        let stdout =
            std::fs::read_to_string(g.results_dir(&again).join(format!("tasks/{task}/stdout")))
                .unwrap();
        assert_eq!(stdout, format!("ok {task}\n"));
    }
    let job_file = g.job_file(&again).expect("job.json");
    assert_eq!(job_file["tasks"]["total"], 2);
    let link = std::fs::read_link(g.results_dir(&again).join("rerun-of"))
        .expect("a link to the first job's results");
    assert_eq!(
        link.canonicalize().unwrap(),
        g.results_dir(&job).canonicalize().unwrap()
    );
    let kept: serde_json::Value = serde_json::from_slice(
        &std::fs::read(g.results_dir(&again).join("manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(kept["rerun"]["of"], job.as_str());
    assert_eq!(kept["rerun"]["tasks"], "2,5");

    // A rerun of the rerun chooses among its own tasks.
    let one = finish_all_succeeded(
        g.client(&["resubmit", &again, "--tasks", "5", "--wait"]),
        1,
        2 * MINUTE,
    );
    let third = String::from_utf8_lossy(&one.stdout).trim().to_owned();
    assert_eq!(
        by_task(&g.index(&third))
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        [5]
    );
}

/// `slots = 2`: each task takes two slots of a launcher, so four slots run
/// two tasks at once, and each task hears how many it has.
#[test]
fn a_task_of_two_slots_takes_two_slots() {
    let mut g = gleaner("task-slots");
    g.up(4);
    let running = g.path().join("running");
    std::fs::create_dir(&running).unwrap();
    let manifest = format!(
        r#"
name = "threaded"
slots = 2
[sweep]
command = "touch {r}/{{i}}; ls {r} | wc -l > {r}.{{i}}; sleep 1; rm {r}/{{i}}; echo $GLEANER_SLOTS $OMP_NUM_THREADS"
params.i = {{ from = 0, to = 7 }}
"#,
        r = running.display()
    );
    let job = String::from_utf8_lossy(
        &finish_all_succeeded(g.submit_waiting(&manifest), 8, 2 * MINUTE).stdout,
    )
    .trim()
    .to_owned();
    let mut together = Vec::new();
    for task in 0..8 {
        let stdout =
            std::fs::read_to_string(g.results_dir(&job).join(format!("tasks/{task}/stdout")))
                .unwrap();
        assert_eq!(stdout, "2 2\n", "task {task}");
        let seen = std::fs::read_to_string(format!("{}.{task}", running.display())).unwrap();
        together.push(seen.trim().parse::<u32>().unwrap());
    }
    assert!(
        together.iter().all(|&n| n <= 2),
        "never more than 4 slots' worth: {together:?}"
    );
    assert!(together.contains(&2), "two at once: {together:?}");

    let too_big = g.write(
        "big.toml",
        "name = \"big\"\nslots = 2000\n[[task]]\ncommand = \"true\"\n",
    );
    let refused = g.run(&["submit", too_big.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("slots: must be from 1 to 1024"));
}

/// An open job takes more tasks while it runs and ends once closed.
#[test]
fn tasks_added_to_an_open_job_run_and_it_ends_when_closed() {
    let mut g = gleaner("open-job");
    g.up(2);
    let job = {
        let path = g.write(
            "base.toml",
            "name = \"growing\"\n[sweep]\ncommand = \"echo base {i}\"\nparams.i = [0, 1]\n",
        );
        let output = g.run(&["submit", "--open", path.to_str().unwrap()]);
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    wait_for("the first tasks", MINUTE, || g.index(&job).len() == 2);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        g.job_state(&job).as_deref(),
        Some("running"),
        "open: it waits for more"
    );

    g.write("more.txt", "a\nb\nc\n");
    let more = g.write(
        "more.toml",
        "[sweep]\ncommand = \"echo more {line}\"\nlines = \"more.txt\"\n",
    );
    let added = g.run(&["submit", "--job", &job, more.to_str().unwrap()]);
    assert!(added.status.success(), "{added:?}");
    assert_eq!(
        String::from_utf8_lossy(&added.stdout).trim(),
        format!("3 tasks added to {job}")
    );
    wait_for("the added tasks", MINUTE, || g.index(&job).len() == 5);

    // Tasks its runner cannot take (the job would pass the task limit) are
    // refused to their sender, with the reason, not dropped in silence.
    let huge = g.write(
        "huge.toml",
        "[sweep]\ncommand = \"echo {i}\"\nparams.i = { from = 1, to = 10000000 }\n",
    );
    let too_many = g.run(&["submit", "--job", &job, huge.to_str().unwrap()]);
    assert_eq!(too_many.status.code(), Some(4), "{too_many:?}");
    assert!(
        String::from_utf8_lossy(&too_many.stderr).contains("more than 10000000 tasks"),
        "{too_many:?}"
    );

    let bad = g.write("bad.toml", "name = \"x\"\n[[task]]\ncommand = \"true\"\n");
    let refused = g.run(&["submit", "--job", &job, bad.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");

    let closed = g.run(&["close", &job]);
    assert!(closed.status.success(), "{closed:?}");
    assert_eq!(g.wait_for_end(&job, MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 5);
    for (task, expected) in ["base 0", "base 1", "more a", "more b", "more c"]
        .iter()
        .enumerate()
    {
        let entry = &tasks[&(task as u64)];
        assert_eq!(entry["status"], "succeeded", "{entry}");
        let stdout =
            std::fs::read_to_string(g.results_dir(&job).join(format!("tasks/{task}/stdout")))
                .unwrap();
        assert_eq!(stdout.trim(), *expected);
    }
    let late = g.run(&["submit", "--job", &job, more.to_str().unwrap()]);
    assert_eq!(late.status.code(), Some(1), "the job has ended: {late:?}");

    // A job that is not open takes no tasks.
    let shut = g.submit("name = \"shut\"\n[[task]]\ncommand = \"sleep 20\"\n");
    wait_for("the job to run", MINUTE, || {
        g.job_state(&shut).as_deref() == Some("running")
    });
    let refused = g.run(&["submit", "--job", &shut, more.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(4), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("the job is not open"),
        "{refused:?}"
    );
    assert!(g.run(&["cancel", &shut]).status.success());
}

/// A big sweep's tasks are published a chunk at a time between the job's
/// events: grants are taken and launchers start before the last is
/// published (their results wait until it is).
#[test]
fn launchers_start_while_a_big_sweep_is_still_being_published() {
    let mut g = gleaner("publishing");
    g.up(2);
    let job = g.submit(&sweep("big", 100_000, "true"));
    wait_for("launchers", MINUTE, || !g.launchers(&job).is_empty());
    let file = g.job_file(&job).expect("job.json");
    assert_eq!(file["tasks_published"], false, "still publishing: {file}");
    wait_for("the results to be taken", 2 * MINUTE, || {
        !g.index(&job).is_empty()
    });
    let file = g.job_file(&job).expect("job.json");
    assert_eq!(
        file["tasks_published"], true,
        "results wait for the publication: {file}"
    );
    assert!(g.run(&["cancel", &job]).status.success());
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "cancelled");
}

/// `submit --array` runs a sweep without a manifest file.
#[test]
fn an_array_sweep_needs_no_manifest() {
    let mut g = gleaner("array");
    g.up(2);
    let waiting = g.client(&[
        "submit", "--array", "3-9:3", "--wait", "--", "echo", "seed={i}", "a  b",
    ]);
    let output = finish_all_succeeded(waiting, 3, 2 * MINUTE);
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(job.starts_with("echo-"), "named after its program: {job}");
    let tasks = by_task(&g.index(&job));
    for (task, seed) in [(0u64, 3), (1, 6), (2, 9)] {
        assert_eq!(tasks[&task]["params"]["i"], seed);
        let stdout = g.results_dir(&job).join(format!("tasks/{task}/stdout"));
        // Words keep their quoting: "a  b" stays one argument.
        assert_eq!(
            std::fs::read_to_string(stdout).unwrap_or_default(),
            format!("seed={seed} a  b\n")
        );
    }
    for bad in [&["--array", "9-3", "--", "true"][..], &["--array", "1-3"]] {
        let mut args = vec!["submit"];
        args.extend_from_slice(bad);
        let output = g.run(&args);
        assert_eq!(output.status.code(), Some(2), "{bad:?}");
    }
}

/// A final step runs once, after the last task, and sees every task's
/// output; its outcome is in `job.json` and decides the exit code.
#[test]
fn the_final_step_runs_after_every_task_and_sees_their_output() {
    let mut g = gleaner("final");
    g.up(3);
    let manifest = r#"name = "merge"
[sweep]
command = "sleep 0.{n}; echo {n}"
params = { n = { from = 1, to = 6 } }
[final]
command = "cat \"$GLEANER_RESULTS\"/tasks/*/stdout | sort -n | tr '\\n' ' '; wc -l < \"$GLEANER_RESULTS/index.jsonl\""
"#;
    let output = finish_all_succeeded(g.submit_waiting(manifest), 6, 2 * MINUTE);
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let merged =
        std::fs::read_to_string(g.results_dir(&job).join("final/stdout")).unwrap_or_default();
    assert_eq!(
        merged, "1 2 3 4 5 6 6\n",
        "every task's output, and all 6 indexed"
    );
    assert_eq!(
        g.index(&job).len(),
        6,
        "the final step is no task of the index"
    );
    let file = g.job_file(&job).expect("job.json");
    assert_eq!(file["final"]["status"], "succeeded", "{file}");
    assert_eq!(file["tasks"]["total"], 6, "{file}");

    // A final step that keeps failing fails the job, after its retries.
    let failing = "name = \"broken\"\nmax_attempts = 2\n[[task]]\ncommand = \"true\"\n[final]\ncommand = \"echo merging; exit 3\"\n";
    let output = finish(g.submit_waiting(failing), 2 * MINUTE);
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("1 of 1 tasks succeeded"), "{said}");
    assert!(
        said.contains("the final step failed (exit code 3) after 2 attempts"),
        "{said}"
    );
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert_eq!(
        std::fs::read_to_string(g.results_dir(&job).join("final/stdout")).unwrap_or_default(),
        "merging\n"
    );
}

/// `gleaner wait` attaches to a job submitted without `--wait`, as
/// `submit --wait` would have followed it, exit code included.
#[test]
fn wait_follows_a_running_job_to_its_end() {
    let mut g = gleaner("wait");
    g.up(2);
    let job = g.submit(&sweep("attached", 4, "sleep 1; exit $(( {n} == 3 ))"));
    let listed = g.run(&["jobs", "--json"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains(&job) || {
            // Not anyone's yet: a moment later it is.
            std::thread::sleep(Duration::from_secs(2));
            String::from_utf8_lossy(&g.run(&["jobs", "--json"]).stdout).contains(&job)
        },
        "gleaner jobs lists it"
    );
    let waited = finish(g.client(&["wait", &job]), 2 * MINUTE);
    let said = String::from_utf8_lossy(&waited.stderr);
    assert_eq!(
        waited.status.code(),
        Some(1),
        "task 2 (n = 3) failed: {said}"
    );
    assert!(said.contains("3 of 4 tasks succeeded"), "{said}");
    assert!(said.contains("  failed: task 2\n"), "{said}");
    // Waiting on a job that has ended answers at once, the same way.
    let again = g.run(&["wait", &job]);
    let said = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{said}");
    assert!(said.contains("3 of 4 tasks succeeded"), "{said}");
}

/// README's path, in order, as a new user takes it: `gleaner up` in a
/// directory, then each command with no extra flag and no setting of the
/// services' (the CLI is not told that `up` keeps one user), answering
/// about a job that has ended as about one that runs.
#[test]
fn readmes_commands_work_as_written_after_gleaner_up() {
    let mut g = gleaner("readme");
    g.up(2);
    let newcomer = |args: &[&str]| {
        let mut command = g.command(args);
        command
            .env_remove("GLEANER_USERS__SINGLE")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        finish(command.spawn().expect("start gleaner"), 3 * MINUTE)
    };
    let said = |output: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    };
    let swept = newcomer(&[
        "submit",
        "--array",
        "1-20",
        "--wait",
        "--",
        "sh",
        "-c",
        "echo hello {i}; test {i} -ne 7",
    ]);
    assert_eq!(swept.status.code(), Some(1), "{}", said(&swept));
    assert!(said(&swept).contains("failed: task 6"), "{}", said(&swept));
    let job = String::from_utf8_lossy(&swept.stdout).trim().to_owned();

    // The job has ended; every command still finds it and its results.
    wait_for(
        "the ended job in `gleaner jobs`, and not among those running",
        MINUTE,
        || {
            let listed = said(&newcomer(&["jobs"]));
            let running = said(&newcomer(&["jobs", "--running"]));
            listed
                .lines()
                .any(|l| l.contains(&job) && l.contains("done"))
                && !running.contains(&job)
        },
    );
    let status = newcomer(&["status", &job]);
    assert!(status.status.success(), "{}", said(&status));
    assert!(
        said(&status).contains("done") && said(&status).contains("20/20"),
        "{}",
        said(&status)
    );
    let logs = newcomer(&["logs", &job, "3"]);
    assert!(logs.status.success(), "{}", said(&logs));
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "hello 4\n");
    let failed = newcomer(&["results", &job, "--status", "failed", "--output", "json"]);
    assert!(failed.status.success(), "{}", said(&failed));
    let entries: Vec<serde_json::Value> =
        serde_json::from_slice(&failed.stdout).expect("results as JSON");
    let tasks: Vec<_> = entries.iter().map(|e| e["task"].as_u64()).collect();
    assert_eq!(tasks, [Some(6)], "{entries:?}");

    // Task 6 again, as a new job: it fails again, alone.
    let again = newcomer(&["resubmit", &job, "--failed", "--wait"]);
    assert_eq!(again.status.code(), Some(1), "{}", said(&again));
    assert!(
        said(&again).contains("0 of 1 tasks succeeded"),
        "{}",
        said(&again)
    );

    // A running job: in `top`, then cancelled.
    let long = newcomer(&["submit", "--array", "1-4", "--", "sleep", "600"]);
    assert!(long.status.success(), "{}", said(&long));
    let long = String::from_utf8_lossy(&long.stdout).trim().to_owned();
    let mut top_command = g.command(&["top"]);
    top_command.env_remove("GLEANER_USERS__SINGLE");
    let top = Terminal::start(&top_command, 150, 40);
    wait_for("top to show the job running", MINUTE, || {
        let screen = top.screen();
        screen.contains(&long) && screen.contains("running")
    });
    top.keys("q");
    wait_for("top to quit on q", MINUTE, || !top.running());
    let cancelled = newcomer(&["cancel", &long]);
    assert!(cancelled.status.success(), "{}", said(&cancelled));
    let waited = newcomer(&["wait", &long]);
    assert_eq!(waited.status.code(), Some(1), "{}", said(&waited));
    wait_for("the cancelled job to be told as such", MINUTE, || {
        said(&newcomer(&["status", &long])).contains("cancelled")
    });
}

/// Every command's help ends with an example.
#[test]
fn every_command_has_an_example() {
    let g = gleaner("help");
    for command in [
        "up",
        "submit",
        "status",
        "cancel",
        "wait",
        "scheduler",
        "runner",
        "kcm",
        "launcher",
        "completions",
        "simulate",
    ] {
        let output = g.run(&[command, "--help"]);
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{command}: {help}");
        assert!(
            help.contains("Example") || help.contains("gleaner kcm"),
            "{command}: {help}"
        );
    }
}

/// Shell completions come from the CLI's own definition.
#[test]
fn completions_cover_every_command() {
    let g = gleaner("completions");
    for shell in ["bash", "zsh", "fish"] {
        let output = g.run(&["completions", shell]);
        assert!(output.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&output.stdout);
        for command in ["submit", "status", "cancel", "--array"] {
            assert!(script.contains(command), "{shell} lacks {command}");
        }
    }
}

/// Launchers whose tasks are short hold a second task per slot (by a new
/// consumer: RabbitMQ cannot change a consumer's prefetch), and every task
/// still ends once.
#[test]
fn short_tasks_are_read_ahead_and_each_ends_once() {
    let mut g = gleaner("readahead");
    g.up(2);
    let waiting = g.submit_waiting(&sweep("short", 120, "sleep 0.1; echo {n}"));
    let mut read_ahead = None;
    // A one-slot launcher's first consumer (`launcher@HOST/SLOT`) has
    // prefetch 1; each new prefetch takes a new consumer (`…#2`, `#3`, …),
    // and those read ahead. (Under load the first may still be listed.)
    wait_for("a launcher to read ahead", Duration::from_secs(60), || {
        read_ahead = g.vhost.consumers().into_iter().find(|c| {
            c["queue"]["name"]
                .as_str()
                .is_some_and(|q| q.ends_with(".tasks"))
                && c["consumer_tag"].as_str().is_some_and(|t| t.contains('#'))
        });
        read_ahead.is_some()
    });
    let consumer = read_ahead.unwrap_or_default();
    let prefetch = consumer["prefetch_count"].as_u64().unwrap_or(0);
    assert!((2..=8).contains(&prefetch), "{consumer}");
    let output = finish_all_succeeded(waiting, 120, 3 * MINUTE);
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 120);
    for (task, line) in &tasks {
        assert_eq!(line["attempts"], 1, "task {task}");
        let stdout =
            std::fs::read_to_string(g.results_dir(&job).join(format!("tasks/{task}/stdout")))
                .expect("stdout file");
        assert_eq!(stdout, format!("{}\n", line["params"]["n"]), "task {task}");
    }
}

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
        let stdout =
            std::fs::read_to_string(g.results_dir(&job).join(format!("tasks/{task}/stdout")))
                .unwrap_or_default();
        assert_eq!(stdout, format!("{}\n", task + 1));
    }
    let preemptions: u64 = tasks
        .values()
        .map(|t| t["preemptions"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(preemptions, 1, "only the running task counts a preemption");
    assert!(g.log("up").contains("task preempted and republished"));
}

#[test]
fn a_runner_killed_mid_job_is_replaced_and_the_job_completes() {
    let mut g = gleaner("runnerkill");
    g.write(
        "gleaner.toml",
        "[[cluster]]\nname = \"local\"\nbackend = \"local\"\nslots = 4\n",
    );
    g.start("scheduler", &["scheduler"]);
    g.start("kcm", &["kcm", "--cluster", "local"]);
    let runner = g.start("runner", &["runner"]);
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

#[test]
fn invalid_manifests_are_refused_with_the_field_named() {
    let g = gleaner("invalid");
    g.write("short-row.csv", "a,b\n1,2\n3\n");
    g.write("points.csv", "a,b\n1,2\n");
    let cases = [
        ("name = \"broken\nno", "line"),
        (
            "name = \"x\"\nwalltim = \"1m\"\n[[task]]\ncommand = \"true\"\n",
            "walltim",
        ),
        (
            "name = \"x\"\n[sweep]\ncommand = \"echo\"\nparams = {}\n",
            "sweep.params",
        ),
        (
            "name = \"x\"\nwalltime = \"soon\"\n[[task]]\ncommand = \"true\"\n",
            "walltime",
        ),
        (
            "name = \"x\"\n[sweep]\ncommand = \"echo {a}\"\ncsv = \"short-row.csv\"\n",
            "sweep.csv: short-row.csv line 3: 1 fields where the header has 2",
        ),
        (
            "name = \"x\"\n[sweep]\ncommand = \"echo {line}\"\nlines = \"missing.txt\"\n",
            "sweep.lines: missing.txt: cannot read",
        ),
        (
            "name = \"x\"\n[sweep]\ncommand = \"echo {b}\"\ncsv = \"points.csv\"\nparams = { b = [1] }\n",
            "sweep.params.b: is also a column",
        ),
    ];
    for (i, (manifest, field)) in cases.iter().enumerate() {
        let path = g.write(&format!("bad{i}.toml"), manifest);
        let output = g.run(&["submit", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "case {i}: {stderr}");
        assert!(
            stderr.contains(field),
            "case {i} should name {field}: {stderr}"
        );
    }
    let output = g.run(&["submit", "/nonexistent/job.toml"]);
    assert_eq!(output.status.code(), Some(2));
}

/// A sweep over a CSV file's rows, a file's lines and a list: every
/// combination runs once, with its values in the command and in the
/// environment.
#[test]
fn csv_and_lines_sweeps_run_every_row_once() {
    let mut g = gleaner("data-sweep");
    std::fs::create_dir(g.path().join("data")).expect("mkdir");
    g.write(
        "data/points.csv",
        "alpha,label\n0.1,\"first, 'one'\"\n0.2,second\n0.3,third\n",
    );
    g.write("data/inputs.txt", "a  b\r\n\nc\n");
    let manifest = g.write(
        "data/sweep.toml",
        r#"name = "data"
[sweep]
command = "echo {alpha} {line} {n} \"$GLEANER_PARAM_label\" \"$GLEANER_PARAM_line\""
csv = "points.csv"
lines = "inputs.txt"
params = { n = [1, 2] }
"#,
    );
    g.up(2);
    let waiting = g.client(&["submit", manifest.to_str().expect("path"), "--wait"]);
    let output = finish_all_succeeded(waiting, 12, 3 * MINUTE);
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 12);
    // Rows first, then lines, then the list, the last varying fastest. The
    // shell splits `{line}`'s "a  b" in the command; "$GLEANER_PARAM_line"
    // keeps it whole.
    let mut task = 0;
    for (alpha, label) in [("0.1", "first, 'one'"), ("0.2", "second"), ("0.3", "third")] {
        for line in ["a  b", "c"] {
            for n in [1, 2] {
                let stdout = g.results_dir(&job).join(format!("tasks/{task}/stdout"));
                let split = line.split_whitespace().collect::<Vec<_>>().join(" ");
                assert_eq!(
                    std::fs::read_to_string(&stdout).unwrap_or_default(),
                    format!("{alpha} {split} {n} {label} {line}\n"),
                    "task {task}"
                );
                let params = &tasks[&task]["params"];
                assert_eq!(params["alpha"], alpha, "task {task}: {params}");
                assert_eq!(params["label"], label, "task {task}: {params}");
                assert_eq!(params["line"], line, "task {task}: {params}");
                assert_eq!(params["n"], n, "task {task}: {params}");
                task += 1;
            }
        }
    }
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
fn two_jobs_submitted_together_share_the_slots_evenly() {
    let mut g = gleaner("fair");
    g.up(4);
    let manifest = |name: &str| {
        format!(
            "name = \"{name}\"\n[sweep]\ncommand = \"sleep 1\"\nparams = {{ n = {{ from = 1, to = 40 }} }}\n"
        )
    };
    let a = g.submit(&manifest("left"));
    let b = g.submit(&manifest("right"));
    let mut seen = String::new();
    wait_for("two launchers for each job", MINUTE, || {
        let Some(status) = g.status() else {
            return false;
        };
        let holding = |job: &str| {
            status["clusters"][0]["report"]["jobs"][job]["running"]
                .as_u64()
                .unwrap_or(0)
        };
        seen = format!("{}/{}", holding(&a), holding(&b));
        holding(&a) == 2 && holding(&b) == 2
    });
    assert_eq!(seen, "2/2");
    g.run(&["cancel", &a]);
    g.run(&["cancel", &b]);
}

/// A sweep of weight 2 holds twice the slots of one of weight 1, the
/// lighter one submitted first (and holding everything) included.
#[test]
fn a_sweep_of_weight_2_holds_twice_the_slots() {
    let mut g = gleaner("weights");
    g.up(6);
    let manifest = |name: &str, weight: u32| {
        format!(
            "name = \"{name}\"\nweight = {weight}\n[sweep]\ncommand = \"sleep 1\"\nparams = {{ n = {{ from = 1, to = 200 }} }}\n"
        )
    };
    let light = g.submit(&manifest("light", 1));
    let holding = |status: &serde_json::Value, job: &str| {
        status["clusters"][0]["report"]["jobs"][job]["running"]
            .as_u64()
            .unwrap_or(0)
    };
    wait_for("the light sweep to hold every slot", MINUTE, || {
        g.status().is_some_and(|s| holding(&s, &light) == 6)
    });
    let heavy = g.submit(&manifest("heavy", 2));
    let mut seen = String::new();
    wait_for(
        "4 slots for the heavy sweep, 2 for the light",
        MINUTE,
        || {
            let Some(status) = g.status() else {
                return false;
            };
            seen = format!("{}/{}", holding(&status, &heavy), holding(&status, &light));
            seen == "4/2"
        },
    );
    assert_eq!(seen, "4/2");
    g.run(&["cancel", &light]);
    g.run(&["cancel", &heavy]);
}

/// `gleaner top`, driven in a real terminal (tmux), shows the running job
/// and its cluster, and quits on `q`.
#[test]
fn top_shows_a_running_job_live() {
    let mut g = gleaner("top");
    g.up(2);
    let job = g.submit(&sweep("watched", 20, "sleep 2"));
    let top = Terminal::start(&g.command(&["top"]), 150, 40);
    let mut screen = String::new();
    wait_for("top to show the job running", MINUTE, || {
        screen = top.screen();
        screen.contains(&job) && screen.contains("local") && screen.contains("running")
    });
    assert!(screen.contains("recent events"), "{screen}");
    top.keys("q");
    wait_for("top to quit on q", Duration::from_secs(10), || {
        !top.running()
    });
    g.run(&["cancel", &job]);
}

/// The scheduler serves the figures of `gleaner status` to Prometheus.
#[test]
fn the_scheduler_serves_metrics_for_prometheus() {
    let mut g = gleaner("metrics");
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string();
    g.start_with(
        "up",
        &["up", "--slots", "2"],
        &[("GLEANER_SCHEDULER__METRICS", &address)],
    );
    let job = g.submit(&sweep("scraped", 40, "sleep 0.5"));
    let scrape = || -> Option<std::collections::BTreeMap<String, f64>> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&address).ok()?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
        let mut page = String::new();
        stream.read_to_string(&mut page).ok()?;
        let (head, body) = page.split_once("\r\n\r\n")?;
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return None;
        }
        // `name{labels} value`, comments aside.
        Some(
            body.lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .filter_map(|l| {
                    let (series, value) = l.rsplit_once(' ')?;
                    Some((series.to_owned(), value.parse().ok()?))
                })
                .collect(),
        )
    };
    let running = format!("gleaner_job_tasks{{job=\"{job}\",owner=\"guest\",state=\"running\"}}");
    let mut seen = Default::default();
    wait_for("the job running in the metrics", MINUTE, || {
        seen = scrape().unwrap_or_default();
        seen.get(&running).is_some_and(|n| *n > 0.0)
    });
    assert_eq!(
        seen.get("gleaner_cluster_slots{cluster=\"local\",kind=\"total\"}"),
        Some(&2.0),
        "{seen:?}"
    );
    assert_eq!(
        seen.get(&format!(
            "gleaner_job_launcher_slots{{job=\"{job}\",owner=\"guest\"}}"
        )),
        Some(&2.0),
        "{seen:?}"
    );
    assert!(
        seen.keys()
            .any(|k| k.starts_with("gleaner_job_tasks_per_second{")),
        "{seen:?}"
    );
    g.run(&["cancel", &job]);
}

#[test]
fn cancel_stops_a_running_job_and_keeps_its_results() {
    let mut g = gleaner("cancel");
    g.up(2);
    let waiting = g.submit_waiting(
        r#"
name = "doomed"
[[task]]
command = "echo quick"
[[task]]
command = "echo quick"
[sweep]
command = "sleep 60"
params = { n = { from = 1, to = 10 } }
"#,
    );
    let mut job = String::new();
    wait_for("the quick tasks and two sleepers", MINUTE, || {
        let Ok(entries) = std::fs::read_dir(g.path().join("results")) else {
            return false;
        };
        let Some(dir) = entries.flatten().next() else {
            return false;
        };
        job = dir.file_name().to_string_lossy().into_owned();
        g.index(&job).len() == 2
            && g.launchers(&job).len() == 2
            && g.job_file(&job).is_some_and(|f| f["tasks"]["running"] == 2)
    });
    let output = g.run(&["cancel", &job]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = finish(waiting, MINUTE);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(g.wait_for_end(&job, MINUTE), "cancelled");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 12);
    assert_eq!(
        tasks
            .values()
            .filter(|t| t["status"] == "succeeded")
            .count(),
        2
    );
    assert_eq!(
        tasks
            .values()
            .filter(|t| t["status"] == "cancelled")
            .count(),
        10
    );
    wait_for("the launchers to leave", Duration::from_secs(20), || {
        g.launchers(&job).is_empty()
    });
    let output = g.run(&["cancel", &job]);
    assert_eq!(output.status.code(), Some(1), "the job is over");
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
    let stdout = std::fs::read_to_string(g.results_dir(&job).join("tasks/0/stdout")).unwrap();
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
    let stdout = std::fs::read_to_string(g.results_dir(&job).join("tasks/1/stdout")).unwrap();
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

#[test]
fn a_job_holds_no_more_launchers_than_its_max() {
    let mut g = gleaner("max-launchers");
    g.up(8);
    let job = g.submit(
        "name = \"capped\"\nmax_launchers = 3\n[sweep]\ncommand = \"sleep 0.3\"\nparams = { i = { from = 1, to = 40 } }\n",
    );
    let mut most = 0;
    wait_for("the job to end", 2 * MINUTE, || {
        most = most.max(g.launchers(&job).len());
        g.job_state(&job).as_deref() == Some("done")
    });
    assert_eq!(most, 3, "three launchers at most, and three used");
    assert_eq!(by_task(&g.index(&job)).len(), 40);
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
