//! The CLI as a user meets it: README's path, examples and completions,
//! `wait`, `top`, `cancel`, and the scheduler's metrics.

use std::time::Duration;

use gleaner_testkit::{by_task, finish, sweep, terminal::Terminal, wait_for};

use crate::{MINUTE, gleaner};

/// A message holds 16 MiB at most, and a consumer its prefetch of them:
/// a manifest too big for one, or whose tasks would each be too big, is
/// refused by `gleaner submit` before it is sent, saying how big it is and
/// (for a table, a task) what to do instead.
#[test]
fn a_manifest_too_big_for_a_message_is_refused_before_it_is_sent() {
    let g = gleaner("too-big");
    let rows: String = (0..1_400_000).map(|i| format!("row{i:06}\n")).collect();
    g.write("rows.txt", &rows);
    let table = g.write(
        "table.toml",
        "name = \"table\"\n[sweep]\ncommand = \"echo {line}\"\nlines = \"rows.txt\"\n",
    );
    let env = g.write(
        "env.toml",
        &format!(
            "name = \"env\"\nenv = {{ BIG = \"{}\" }}\n[[task]]\ncommand = \"true\"\n",
            "x".repeat(17 << 20)
        ),
    );
    let tasks: String = (0..200_000)
        .map(|i| format!("[[task]]\ncommand = \"echo {i:0>80}\"\n"))
        .collect();
    let many = g.write("many.toml", &format!("name = \"many\"\n{tasks}"));
    for (manifest, says) in [
        (&table, "at most 12 MiB of rows travel with a manifest"),
        (&env, "a task may take at most 1 MiB"),
        (&many, "more than the 16 MiB a message may hold"),
    ] {
        let output = g.run(&["submit", manifest.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(says),
            "{stderr}"
        );
    }
    assert!(
        g.vhost.get("gleaner.submit", 10).is_empty(),
        "nothing was sent"
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

/// README's first command, `deploy/demo.sh`, as a fresh clone has it
/// (the script, its broker setup and the example, copied to a directory of
/// their own), run with this build's binary: it exits 0 and shows task 5's
/// stdout and declared output.
#[test]
fn readmes_first_command_runs_the_example_sweep_and_shows_its_results() {
    let g = gleaner("demo");
    let checkout = crate::package::repository();
    let clone = g.path().join("clone");
    for part in ["deploy/demo.sh", "deploy/rabbitmq", "examples/sweep.toml"] {
        let to = clone.join(part);
        std::fs::create_dir_all(to.parent().expect("a parent")).expect("mkdir");
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(checkout.join(part))
            .arg(&to)
            .status()
            .expect("cp");
        assert!(copied.success(), "copying {part}");
    }
    let mut demo = g.script(&clone.join("deploy/demo.sh"), &[]);
    demo.env("SLOTS", "2")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let ran = finish(demo.spawn().expect("bash"), 5 * MINUTE);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    assert_eq!(ran.status.code(), Some(0), "{said}");
    assert!(said.contains("13 of 13 tasks succeeded"), "{said}");
    // Task 5 is seed 2, size 10: it printed that, and 2 × 55 in sum.csv.
    assert!(said.contains("\nseed=2 size=10\n"), "{said}");
    assert!(said.contains("\n110\n"), "{said}");
    assert!(clone.join("results").is_dir(), "{said}");
}

/// With one user, a second submission of a running job's id is refused
/// (to `gleaner.dead`, with its reason), and that refusal is not the
/// running job's: its `wait` follows it to its end and exits 0.
#[test]
fn a_second_submission_of_a_running_jobs_id_leaves_its_wait_alone() {
    let mut g = gleaner("second-id");
    g.up(2);
    let job = g.submit(&sweep("twice", 4, "sleep 2; echo {n}"));
    let waiting = g.client(&["wait", &job]);
    let mut properties = serde_json::Map::new();
    properties.insert("content_type".into(), "application/json".into());
    properties.insert("message_id".into(), job.as_str().into());
    g.vhost.publish_raw_with(
        "gleaner.submit",
        r#"{"name":"twice","task":[{"command":"echo again"}]}"#,
        properties,
    );
    let mut dead = Vec::new();
    wait_for("the second submission in gleaner.dead", MINUTE, || {
        dead.extend(g.vhost.get("gleaner.dead", 10));
        !dead.is_empty()
    });
    let reason = dead[0]["properties"]["headers"]["x-gleaner-reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("already submitted"), "{reason}");
    let waited = finish(waiting, 3 * MINUTE);
    let said = String::from_utf8_lossy(&waited.stderr);
    assert_eq!(waited.status.code(), Some(0), "{said}");
    assert!(said.contains("4 of 4 tasks succeeded"), "{said}");
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
        "doctor",
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

/// The checks of `gleaner doctor --output json`, as (check, verdict, fix).
fn doctor_findings(output: &std::process::Output) -> Vec<(String, String, String)> {
    let findings: Vec<serde_json::Value> =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "doctor's JSON: {e}: {}",
                String::from_utf8_lossy(&output.stdout)
            )
        });
    findings
        .iter()
        .map(|f| {
            let text = |key: &str| f[key].as_str().unwrap_or_default().to_owned();
            (text("check"), text("verdict"), text("fix"))
        })
        .collect()
}

/// `gleaner doctor` finds a running deployment healthy (exit 0), and a
/// broker it cannot reach a failure (exit 1) with the fix in one line.
#[test]
fn doctor_finds_a_running_deployment_healthy_and_says_how_to_fix_an_unreachable_broker() {
    let mut g = gleaner("doctor");
    g.up(1);
    wait_for("gleaner up to serve", MINUTE, || {
        g.status()
            .is_some_and(|s| s["clusters"].as_array().is_some_and(|c| !c.is_empty()))
    });
    let healthy = g.run(&["doctor", "--output", "json"]);
    let findings = doctor_findings(&healthy);
    assert!(healthy.status.success(), "{findings:?}");
    let verdict = |findings: &[(String, String, String)], prefix: &str| {
        findings
            .iter()
            .find(|(check, ..)| check.starts_with(prefix))
            .map(|(_, verdict, fix)| (verdict.clone(), fix.clone()))
    };
    assert_eq!(
        verdict(&findings, "broker amqp://guest:***@").map(|v| v.0),
        Some("ok".into()),
        "{findings:?}"
    );
    assert_eq!(
        verdict(&findings, "scheduler").map(|v| v.0),
        Some("ok".into()),
        "{findings:?}"
    );

    let nowhere = g.vhost.url().replace("127.0.0.1:5672", "127.0.0.1:1");
    let broken = g
        .command(&["doctor", "--output", "json"])
        .env("GLEANER_BROKER_URL", &nowhere)
        .env("GLEANER_BROKER_URLS", &nowhere)
        .env("RUST_LOG", "warn")
        .output()
        .expect("doctor");
    let findings = doctor_findings(&broken);
    assert_eq!(broken.status.code(), Some(1), "{findings:?}");
    let (verdict, fix) = verdict(&findings, "broker amqp://").expect("a broker finding");
    assert_eq!(verdict, "fail");
    assert!(fix.contains("RabbitMQ"), "{fix}");
    assert!(
        !findings.iter().any(|(check, ..)| check == "scheduler"),
        "nothing to ask the scheduler through: {findings:?}"
    );
}

/// A user without root, as the book's "Without root" has it: a broker
/// account of their own (every permission on a vhost an admin gave them,
/// no tag) and a Slurm cluster in their configuration. `gleaner up` run
/// as them scavenges for them: their sweep completes on the cluster's
/// nodes, its tasks run as them, its results are theirs.
#[test]
fn a_user_without_root_runs_gleaner_up_with_a_slurm_cluster_and_their_sweep_completes_there() {
    use std::os::unix::fs::MetadataExt;

    let alice = nix::unistd::User::from_name("alice")
        .ok()
        .flatten()
        .expect("no Unix account alice: run deploy/accounts.sh alice bob");
    let mut g = gleaner("without-root");
    g.open_to_every_account();
    let account = gleaner_testkit::users::BrokerUser::owner_of(&g.vhost, "alice");
    let home = g.path().join("alice");
    std::fs::create_dir(&home).expect("alice's directory");
    let config = home.join("gleaner.toml");
    std::fs::write(
        &config,
        format!(
            "broker_url = \"{}\"\n\n[[cluster]]\nname = \"hpc\"\nbackend = \"slurm\"\npartition = \"gleaner\"\n",
            account.url()
        ),
    )
    .expect("alice's configuration");
    std::fs::write(
        home.join("sweep.toml"),
        sweep("mine", 6, "echo {n} $(id -un)"),
    )
    .expect("alice's sweep");
    for path in [&home, &config, &home.join("sweep.toml")] {
        nix::unistd::chown(path.as_path(), Some(alice.uid), Some(alice.gid)).expect("chown");
    }
    let up = g.command_as("alice", &home, &["up"], &[]);
    g.start_command("up-alice", up);
    let submit = g
        .command_as("alice", &home, &["submit", "sweep.toml", "--wait"], &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("submit as alice");
    let output = gleaner_testkit::finish_all_succeeded(submit, 6, 3 * MINUTE);
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let results = home.join("results").join(&job);
    assert_eq!(
        std::fs::metadata(&results)
            .expect("results under alice's directory")
            .uid(),
        alice.uid.as_raw(),
        "the results are alice's"
    );
    let index = std::fs::read_to_string(results.join("index.jsonl")).expect("index");
    for line in index.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).expect("index line");
        assert_eq!(entry["cluster"], "hpc", "{line}");
        assert!(
            entry["host"]
                .as_str()
                .is_some_and(|h| h.starts_with("node")),
            "on a Slurm node: {line}"
        );
    }
    let logs = g
        .command_as("alice", &home, &["logs", &job], &[])
        .output()
        .expect("logs as alice");
    let mut lines: Vec<String> = String::from_utf8_lossy(&logs.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        (1..=6).map(|n| format!("{n} alice")).collect::<Vec<_>>()
    );
}
