//! Faults of the fleet: a launcher's host cut off from the broker.

use std::{os::unix::fs::PermissionsExt, time::Duration};

use gleaner_testkit::{Gleaner, Island, by_task, sweep, wait_for};

use crate::{MINUTE, gleaner};

/// A sweep on two local clusters: `safe` on this host, `cut` with its
/// launchers on `island`, and its kcm too when `kcm_on_island`. Returns the
/// job once a task has ended on the island and two run there, and the pid
/// of the island's kcm.
fn sweep_across(
    g: &mut Gleaner,
    island: &Island,
    kcm_on_island: bool,
    tasks: u32,
) -> (String, Option<u32>) {
    let wrapper = g.write(
        "on-island.sh",
        &format!(
            "#!/bin/sh\nexec ip netns exec {} {} \"$@\"\n",
            island.namespace(),
            env!("CARGO_BIN_EXE_gleaner")
        ),
    );
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    g.write(
        "gleaner.toml",
        &format!(
            "[[cluster]]\nname = \"cut\"\nbackend = \"local\"\nslots = 2\nlauncher_program = \"{}\"\n\n\
             [[cluster]]\nname = \"safe\"\nbackend = \"local\"\nslots = 2\n",
            wrapper.display()
        ),
    );
    let kcm = if kcm_on_island {
        g.start("scheduler", &["scheduler"]);
        g.start("runner", &["runner"]);
        g.start("kcm-safe", &["kcm", "--cluster", "safe"]);
        Some(g.start_on(island, "kcm-cut", &["kcm", "--cluster", "cut"]))
    } else {
        g.start("up", &["up"]);
        None
    };
    let job = g.submit(&sweep("cut-off", tasks, "sleep 2; echo {n}"));
    wait_for(
        "a task done on the island, two running there",
        MINUTE,
        || {
            g.index(&job).iter().any(|t| t["cluster"] == "cut")
                && island
                    .processes()
                    .iter()
                    .filter(|(_, p)| p == "sleep")
                    .count()
                    == 2
        },
    );
    (job, kcm)
}

/// Cuts the island off; its launchers and their tasks must go, the sweep
/// must end with every task once, and mending the island changes nothing.
fn cut_and_mend(g: &Gleaner, island: &Island, (job, kcm): (String, Option<u32>), tasks: u32) {
    let job = job.as_str();
    island.cut();
    wait_for("no launcher or task left on the island", MINUTE, || {
        island
            .processes()
            .iter()
            .all(|(pid, comm)| comm == "socat" || Some(*pid) == kcm)
    });
    assert_eq!(g.wait_for_end(job, 3 * MINUTE), "done");
    let index = by_task(&g.index(job));
    assert_eq!(index.len(), tasks as usize);
    assert!(index.values().all(|t| t["status"] == "succeeded"));

    // The host comes back: whatever it still had to say changes nothing.
    island.mend();
    std::thread::sleep(Duration::from_secs(5));
    let after = by_task(&g.index(job));
    assert_eq!(after.len(), tasks as usize, "no result counted twice");
    let file = g.job_file(job).expect("job.json");
    assert_eq!(file["tasks"]["succeeded"], tasks);
}

#[test]
fn a_launcher_host_cut_off_has_its_placeholders_removed_and_its_tasks_run_elsewhere() {
    let island = Island::new("cut");
    let mut g = gleaner("cut-off");
    let tasks = 40;
    let started = sweep_across(&mut g, &island, false, tasks);
    cut_and_mend(&g, &island, started, tasks);
}

#[test]
fn launchers_cut_off_with_their_kcm_stop_their_tasks_themselves() {
    let island = Island::new("cutk");
    let mut g = gleaner("cut-off-kcm");
    let tasks = 40;
    let started = sweep_across(&mut g, &island, true, tasks);
    cut_and_mend(&g, &island, started, tasks);
}
