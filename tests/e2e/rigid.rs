//! Rigid (grid) jobs on the local backend: a job runs whole or not at all.

use gleaner_testkit::{by_task, wait_for};

use crate::{MINUTE, gleaner};

#[test]
fn a_failing_component_stops_its_job_or_sends_it_back_whole() {
    let mut g = gleaner("grid-failure");
    g.up(4);
    // Without restart_on_failure: component 0 fails, component 1 is stopped.
    let job = g.submit(
        "name = \"rigid\"\nkind = \"grid\"\n[[component]]\nslots = 1\ncommand = \"exit 3\"\n[[component]]\nslots = 1\ncommand = \"sleep 120\"\n",
    );
    assert_eq!(g.wait_for_end(&job, MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert_eq!(tasks[&0]["status"], "failed", "{tasks:?}");
    assert_eq!(tasks[&1]["status"], "cancelled", "stopped, not waited for");
    // With it: the first run's failure sends the job back; the second runs whole.
    let marker = g.path().join("failed-once");
    let job = g.submit(&format!(
        "name = \"again\"\nkind = \"grid\"\nrestart_on_failure = true\nmax_attempts = 2\n[[component]]\nslots = 1\ncommand = \"test -e {m} || {{ touch {m}; exit 3; }}\"\n[[component]]\nslots = 1\ncommand = \"sleep 2\"\n",
        m = marker.display()
    ));
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    assert!(
        tasks.values().all(|t| t["status"] == "succeeded"),
        "{tasks:?}"
    );
    assert_eq!(g.job_file(&job).unwrap_or_default()["restarts"], 1);
}

#[test]
fn components_go_where_their_inputs_are_or_where_they_are_staged() {
    let mut g = gleaner("grid-inputs");
    let data = g.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    std::fs::write(data.join("in.txt"), "input\n").expect("input");
    let log = g.path().join("staged.log");
    let stage = g.write(
        "stage.sh",
        &format!(
            "#!/bin/sh\njob=$1; component=$2; shift 2\nfor f; do echo \"$job $component $f\" >> {}; done\n",
            log.display()
        ),
    );
    std::fs::set_permissions(&stage, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    // "near" sees the data but is small; "far" is big and stages.
    g.write(
        "gleaner.toml",
        &format!(
            "[[cluster]]\nname = \"near\"\nbackend = \"local\"\nslots = 2\nshared_paths = [\"{}\"]\n\
             [[cluster]]\nname = \"far\"\nbackend = \"local\"\nslots = 8\nstage_command = [\"{}\"]\n",
            data.display(),
            stage.display()
        ),
    );
    g.start("up", &["up"]);
    let input = data.join("in.txt");
    let close = g.submit(&format!(
        "name = \"close\"\nkind = \"grid\"\ninputs = [\"{}\"]\n[[component]]\nslots = 1\ncommand = \"cat {}\"\n",
        input.display(),
        input.display()
    ));
    assert_eq!(g.wait_for_end(&close, MINUTE), "done");
    let tasks = by_task(&g.index(&close));
    assert_eq!(
        (&tasks[&0]["status"], &tasks[&0]["cluster"]),
        (&"succeeded".into(), &"near".into()),
        "close to its files, though far has more room"
    );
    let elsewhere = g.path().join("elsewhere.txt");
    std::fs::write(&elsewhere, "x\n").expect("input");
    let staged = g.submit(&format!(
        "name = \"staged\"\nkind = \"grid\"\n[[component]]\nslots = 1\ncommand = \"true\"\ninputs = [\"{}\"]\n",
        elsewhere.display()
    ));
    assert_eq!(g.wait_for_end(&staged, MINUTE), "done");
    let tasks = by_task(&g.index(&staged));
    assert_eq!(tasks[&0]["cluster"], "far", "{tasks:?}");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap_or_default(),
        format!("{staged} 0 {}\n", elsewhere.display()),
        "staged before it ran, by the cluster's command"
    );
}

/// Whether a process runs whose command line is exactly `command`.
fn runs(command: &str) -> bool {
    std::process::Command::new("pgrep")
        .args(["-f", &format!("^{command}$")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn nothing_a_component_starts_outlives_it_or_its_cancelled_job() {
    let mut g = gleaner("grid-strays");
    g.up(4);
    let seconds = 4000 + std::process::id() % 1000;
    // A component that leaves a process behind when it ends.
    let stray = format!("sleep {seconds}");
    let job = g.submit(&format!(
        "name = \"strays\"\nkind = \"grid\"\n[[component]]\nslots = 1\ncommand = \"setsid {stray} > /dev/null 2>&1 & true\"\n"
    ));
    assert_eq!(g.wait_for_end(&job, MINUTE), "done");
    wait_for("the stray to be gone", MINUTE, || !runs(&stray));
    // A component of a job cancelled while it runs.
    let running = format!("sleep {}", seconds + 1);
    let job = g.submit(&format!(
        "name = \"cancelled\"\nkind = \"grid\"\n[[component]]\nslots = 1\ncommand = \"{running}\"\n"
    ));
    wait_for("the component's command to run", MINUTE, || runs(&running));
    assert!(g.run(&["cancel", &job]).status.success());
    wait_for("the cancelled command to be gone", MINUTE, || {
        !runs(&running)
    });
}
