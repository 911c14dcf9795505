//! Sweeps end to end on a real RabbitMQ with the local backend: every
//! task once, retries, reruns, open jobs, final steps, data files, shares.

use std::time::Duration;

use gleaner_testkit::{by_task, entries_under, finish, finish_all_succeeded, sweep, wait_for};

use crate::{MINUTE, gleaner, services_apart};

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
        let stdout = g.stdout(&job, *task).expect("stdout file");
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
    let stdout = g.stdout(&job, 0).unwrap();
    assert_eq!(stdout, "always failing\n");
    // The summary says which tasks did not succeed, and where to look.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("1 of 3 tasks succeeded (2 did not: 1 failed, 1 timed out)"),
        "{stderr}"
    );
    assert!(stderr.contains("  failed: task 0\n"), "{stderr}");
    assert!(stderr.contains("  timed out: task 1\n"), "{stderr}");
    assert!(
        stderr.contains(&format!("gleaner logs {job} 0 --stderr")),
        "{stderr}"
    );

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
    let stderr = g.stderr(&job, 0).unwrap();
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
        let stdout = g.stdout(&again, *task).unwrap();
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
        let stdout = g.stdout(&job, task).unwrap();
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
        let stdout = g.stdout(&job, task as u64).unwrap();
        assert_eq!(stdout.trim(), *expected);
    }
    let late = g.run(&["submit", "--job", &job, more.to_str().unwrap()]);
    assert_eq!(late.status.code(), Some(1), "the job has ended: {late:?}");

    // A job that is not open takes no tasks.
    let shut = g.submit("name = \"shut\"\n[[task]]\ncommand = \"sleep 20\"\n");
    wait_for("the job to run", MINUTE, || {
        g.job_state(&shut).as_deref() == Some("running")
    });
    // Its job.json may say running before its control queue takes
    // messages; the CLI then says to try again, and the test does.
    let mut refused = g.run(&["submit", "--job", &shut, more.to_str().unwrap()]);
    wait_for("the job's runner to take messages", MINUTE, || {
        let again = refused.status.code() == Some(1)
            && String::from_utf8_lossy(&refused.stderr).contains("try again");
        if again {
            refused = g.run(&["submit", "--job", &shut, more.to_str().unwrap()]);
        }
        !again
    });
    assert_eq!(refused.status.code(), Some(4), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("the job is not open"),
        "{refused:?}"
    );
    assert!(g.run(&["cancel", &shut]).status.success());
}

/// A big sweep's tasks are published as its launchers take them: grants
/// are taken, launchers start and their results are recorded long before
/// the last task is published.
#[test]
fn launchers_start_while_a_big_sweep_is_still_being_published() {
    let mut g = gleaner("publishing");
    g.up(2);
    let job = g.submit(&sweep("big", 100_000, "true"));
    wait_for("the results to be taken", 2 * MINUTE, || {
        !g.index(&job).is_empty()
    });
    let file = g.job_file(&job).expect("job.json");
    assert_eq!(
        file["tasks_published"], false,
        "results do not wait for the publication: {file}"
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
        // Words keep their quoting: "a  b" stays one argument.
        assert_eq!(
            g.stdout(&job, task).unwrap_or_default(),
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
command = "\"$GLEANER_BIN\" logs \"$GLEANER_JOB\" --dir \"$GLEANER_RESULTS\" | tr '\\n' ' '; wc -l < \"$GLEANER_RESULTS/index.jsonl\""
"#;
    let output = finish_all_succeeded(g.submit_waiting(manifest), 6, 2 * MINUTE);
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let merged =
        std::fs::read_to_string(g.results_dir(&job).join("final/stdout")).unwrap_or_default();
    assert_eq!(
        merged,
        "1 2 3 4 5 6 6\n",
        "every task's output, and all 6 indexed; its stderr: {}",
        std::fs::read_to_string(g.results_dir(&job).join("final/stderr")).unwrap_or_default()
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
        let stdout = g.stdout(&job, *task).expect("stdout file");
        assert_eq!(stdout, format!("{}\n", line["params"]["n"]), "task {task}");
    }
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
                let split = line.split_whitespace().collect::<Vec<_>>().join(" ");
                assert_eq!(
                    g.stdout(&job, task).unwrap_or_default(),
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

/// A sweep far bigger than its launchers can take at once waits in the
/// broker a window at a time: with no slot anywhere and no run time
/// measured, the task queue holds the first 100 of 50,000 tasks while the
/// job counts all of them
/// pending; a runner that takes the job over publishes its window in place
/// of, not beside, what the queue held.
#[test]
fn a_big_sweep_waits_in_the_broker_a_window_at_a_time() {
    let mut g = gleaner("window");
    g.start("scheduler", &["scheduler"]);
    let runner = g.start("runner", &["runner"]);
    let job = g.submit(&sweep("window", 50_000, "true"));
    let queue = format!("gleaner.job.{job}.tasks");
    let ready = |g: &gleaner_testkit::Gleaner| {
        g.vhost
            .queue(&queue)
            .and_then(|q| q["messages_ready"].as_u64())
    };
    wait_for("the first window", MINUTE, || ready(&g) == Some(100));
    let file = g.job_file(&job).expect("job.json");
    assert_eq!(file["tasks"]["pending"], 50_000, "{file}");
    assert_eq!(file["tasks_published"], false, "{file}");

    g.signal(runner, nix::sys::signal::Signal::SIGKILL);
    g.start("runner2", &["runner"]);
    wait_for("the job taken over", MINUTE, || {
        g.log("runner2").contains("job accepted")
    });
    // The broker's figures are refreshed every 5 s: two refreshes on.
    std::thread::sleep(Duration::from_secs(11));
    assert_eq!(ready(&g), Some(100), "purged, then one window again");
    assert!(g.run(&["cancel", &job]).status.success());
}

/// Without a `bundle` key, short tasks travel in bundles the runner sizes
/// from their measured run times; a runner killed while most of the sweep
/// is still unpublished is replaced, and every task ends exactly once.
#[test]
fn short_tasks_are_bundled_and_a_takeover_mid_publication_loses_nothing() {
    let (mut g, runner) = services_apart("autobundle");
    let job = g.submit(&sweep("short", 12_000, "true"));
    wait_for("some results", 2 * MINUTE, || g.index(&job).len() >= 1000);
    let file = g.job_file(&job).expect("job.json");
    assert_eq!(file["tasks_published"], false, "mid-publication: {file}");
    g.signal(runner, nix::sys::signal::Signal::SIGKILL);
    g.start("runner2", &["runner"]);
    assert_eq!(g.wait_for_end(&job, 5 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks.len(), 12_000);
    assert!(tasks.values().all(|t| t["status"] == "succeeded"));
    let file = g.job_file(&job).expect("job.json");
    assert!(
        file["largest_bundle"].as_u64().unwrap_or(0) > 1,
        "bundled: {file}"
    );
    assert_eq!(file["tasks_published"], true, "{file}");
}

/// Tasks that print make no file of their own: their streams go to one
/// `output.log`; `gleaner logs` reads one task's or every task's in task
/// order, and `gleaner export` writes a directory per task on demand.
#[test]
fn printing_tasks_make_a_handful_of_files_and_export_makes_the_rest() {
    let mut g = gleaner("fewfiles");
    g.up(2);
    let manifest = sweep("printing", 300, "echo out {n}; echo err {n} >&2");
    let output = finish_all_succeeded(g.submit_waiting(&manifest), 300, 3 * MINUTE);
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let results = g.results_dir(&job);
    let made = entries_under(&results);
    assert!(made <= 8, "{made} files for 300 tasks that print");

    let all = g.run(&["logs", &job]);
    assert!(all.status.success(), "{all:?}");
    let expected: String = (1..=300).map(|n| format!("out {n}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&all.stdout), expected);
    let one = g.run(&["logs", &job, "41", "--stderr"]);
    assert_eq!(String::from_utf8_lossy(&one.stdout), "err 42\n");

    let into = g.path().join("by-task");
    let exported = g.run(&["export", &job, into.to_str().unwrap()]);
    assert!(exported.status.success(), "{exported:?}");
    for (name, text) in [("stdout", "out 42\n"), ("stderr", "err 42\n")] {
        let file = into.join("tasks/41").join(name);
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            text,
            "{}",
            file.display()
        );
    }
    assert_eq!(entries_under(&into.join("tasks")), 300 * 3);
}

/// While a failed task runs again, `gleaner logs` shows the attempt that
/// failed, saying so.
#[test]
fn a_retried_tasks_failed_attempt_can_be_read_while_it_runs_again() {
    let mut g = gleaner("retriedlogs");
    g.up(1);
    let mark = g.path().join("tried");
    let manifest = format!(
        "name = \"again\"\nmax_attempts = 2\n[[task]]\ncommand = \"if [ -e {m} ]; then sleep 120; else touch {m}; echo first try >&2; exit 3; fi\"\n",
        m = mark.display()
    );
    let job = g.submit(&manifest);
    wait_for("the second attempt", MINUTE, || {
        std::fs::read_to_string(g.results_dir(&job).join("attempts.jsonl"))
            .is_ok_and(|t| t.contains("\"attempt\":1"))
    });
    let logs = g.run(&["logs", &job, "0", "--stderr"]);
    assert!(logs.status.success(), "{logs:?}");
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "first try\n");
    let said = String::from_utf8_lossy(&logs.stderr);
    assert!(said.contains("attempt 1 failed (exit code 3)"), "{said}");
    assert!(g.run(&["cancel", &job]).status.success());
}

/// A child's stdout as it comes, gathered by a thread of its own.
fn gathering(child: &mut std::process::Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::Read;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut out = child.stdout.take().expect("piped stdout");
    let sink = seen.clone();
    std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        while let Ok(n) = out.read(&mut buffer) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
    });
    seen
}

/// `gleaner logs --follow` shows a running task's output as it is printed
/// (each task below cannot end before the test has seen its first line),
/// every byte once, until the task ends; a task followed before it starts
/// shows once it does; a follower that goes away costs the job nothing.
#[test]
fn a_running_tasks_output_is_followed_as_it_is_printed() {
    let mut g = gleaner("follow");
    g.up(1);
    let gate = g.path().join("release");
    let manifest = sweep(
        "followed",
        2,
        &format!(
            "echo before {{n}}; while [ ! -e {gate}{{n}} ]; do sleep 0.1; done; echo after {{n}}",
            gate = gate.display()
        ),
    );
    let job = g.submit(&manifest);
    let mut first = g.client(&["logs", &job, "0", "--follow"]);
    let mut second = g.client(&["logs", &job, "1", "--follow"]);
    let mut quitter = g.client(&["logs", &job, "0", "-f"]);
    let (seen_first, seen_second, seen_quitter) = (
        gathering(&mut first),
        gathering(&mut second),
        gathering(&mut quitter),
    );
    wait_for("task 0's first line, while it runs", MINUTE, || {
        seen_first.lock().unwrap().contains("before 1\n")
            && seen_quitter.lock().unwrap().contains("before 1\n")
    });
    assert!(g.index(&job).is_empty(), "no task could have ended");
    quitter.kill().unwrap();
    quitter.wait().unwrap();
    std::fs::write(format!("{}1", gate.display()), "").unwrap();
    let output = finish(first, MINUTE);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(*seen_first.lock().unwrap(), "before 1\nafter 1\n");

    // Task 1 was followed from before it started (one slot: after task 0).
    wait_for("task 1's first line, while it runs", MINUTE, || {
        seen_second.lock().unwrap().contains("before 2\n")
    });
    assert_eq!(g.index(&job).len(), 1, "task 1 runs on");
    std::fs::write(format!("{}2", gate.display()), "").unwrap();
    let output = finish(second, MINUTE);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(*seen_second.lock().unwrap(), "before 2\nafter 2\n");
    assert_eq!(g.wait_for_end(&job, MINUTE), "done");
    g.assert_all_done_once(&job, 2);

    // An ended task's output, followed: printed from the results at once.
    let ended = g.run(&["logs", &job, "1", "--follow"]);
    assert_eq!(
        String::from_utf8_lossy(&ended.stdout),
        "before 2\nafter 2\n"
    );
}
