//! Rigid (grid) jobs on the local backend: a job runs whole or not at all.

use gleaner_testkit::by_task;

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
