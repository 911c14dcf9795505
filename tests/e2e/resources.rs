//! Memory and GPUs on the local backend: a task over its memory is killed
//! and reported `oom`, the cluster's memory bounds how many tasks run at
//! once, and each task gets GPUs of its own.

use gleaner_testkit::{assert_one_task_per_gpu, by_task, gpu_sweep, sweep};

use crate::{MINUTE, gleaner};

#[test]
fn a_task_over_its_memory_is_reported_oom_with_its_peak_and_not_retried() {
    let mut g = gleaner("oom");
    g.up(2);
    let hog = "if [ {n} = 2 ]; then python3 -c 'b = bytearray(300 << 20); import time; time.sleep(60)'; else echo {n}; fi";
    let job = g.submit(&format!(
        "memory = \"100M\"\nmax_attempts = 3\n{}",
        sweep("hog", 4, hog)
    ));
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let tasks = by_task(&g.index(&job));
    let hog = &tasks[&1];
    assert_eq!(hog["status"], "oom", "{hog}");
    assert_eq!(hog["attempts"], 1, "not run again: {hog}");
    assert!(hog["peak_memory_mb"].as_u64().unwrap_or(0) > 100, "{hog}");
    for task in [0, 2, 3] {
        assert_eq!(tasks[&task]["status"], "succeeded", "{}", tasks[&task]);
    }
}

#[test]
fn a_clusters_memory_bounds_the_tasks_running_at_once() {
    let mut g = gleaner("memory-bound");
    let dir = g.path().join("running");
    std::fs::create_dir_all(&dir).unwrap();
    g.write(
        "gleaner.toml",
        "[[cluster]]\nname = \"local\"\nbackend = \"local\"\nslots = 4\nmemory = \"1000M\"\n",
    );
    g.start("up", &["up"]);
    // Each task counts the tasks running beside it.
    let command = format!(
        "touch {dir}/{{n}}; sleep 1; ls {dir} | wc -l; rm {dir}/{{n}}",
        dir = dir.display()
    );
    let manifest = format!("memory = \"400M\"\n{}", sweep("bound", 8, &command));
    let job = g.submit(&manifest);
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    for task in 0..8 {
        let stdout = g.stdout(&job, task).unwrap_or_default();
        let beside: u32 = stdout.trim().parse().unwrap_or(u32::MAX);
        assert!(beside <= 2, "1000M hold two tasks of 400M, not {beside}");
    }
}

#[test]
fn local_gpus_go_one_per_task() {
    let mut g = gleaner("local-gpus");
    // Names of this test's own: launchers claim devices host-wide.
    let tag = std::process::id();
    g.write(
        "gleaner.toml",
        &format!(
            "[[cluster]]\nname = \"local\"\nbackend = \"local\"\nslots = 4\ngpus = [\"g{tag}a\", \"g{tag}b\"]\n"
        ),
    );
    g.start("up", &["up"]);
    let manifest = gpu_sweep(&g, "gpus", 8, 1, "");
    let job = g.submit(&manifest);
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let used = assert_one_task_per_gpu(&g, &job, 8);
    let devices: Vec<&String> = used.values().flatten().collect();
    assert!(
        devices.iter().all(|d| d.starts_with(&format!("g{tag}"))),
        "{used:?}"
    );
}

/// Someone outside gleaner holds the names a launcher on another backend
/// would claim its GPUs by (the abstract sockets `gleaner-gpu/<device>`):
/// on the local backend the kcm claims devices where no other account
/// reaches and hands them to its launchers, so the sweep runs on both
/// devices all the same.
#[test]
fn gpus_squatted_by_name_do_not_stop_a_local_sweep() {
    use std::os::linux::net::SocketAddrExt;

    let mut g = gleaner("local-gpus-squatted");
    let tag = std::process::id();
    let squatted: Vec<std::os::unix::net::UnixListener> = ["a", "b"]
        .iter()
        .map(|d| {
            let name = format!("gleaner-gpu/g{tag}{d}");
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .expect("an abstract name");
            std::os::unix::net::UnixListener::bind_addr(&address).expect("the name is free")
        })
        .collect();
    g.write(
        "gleaner.toml",
        &format!(
            "[[cluster]]\nname = \"local\"\nbackend = \"local\"\nslots = 4\ngpus = [\"g{tag}a\", \"g{tag}b\"]\n"
        ),
    );
    g.start("up", &["up"]);
    let job = g.submit(&gpu_sweep(&g, "squatted", 4, 1, ""));
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let used = assert_one_task_per_gpu(&g, &job, 4);
    assert!(
        used.values()
            .flatten()
            .all(|d| d.starts_with(&format!("g{tag}"))),
        "{used:?}"
    );
    drop(squatted);
}

#[test]
fn a_final_step_of_its_own_shape_runs_on_launchers_of_that_shape() {
    let mut g = gleaner("final-shape");
    g.up(4);
    let manifest = format!(
        "{}[final]\ncommand = \"echo $GLEANER_SLOTS\"\nslots = 3\n",
        sweep("merge-wide", 6, "echo {n}")
    );
    let job = g.submit(&manifest);
    assert_eq!(g.wait_for_end(&job, 2 * MINUTE), "done");
    let stdout =
        std::fs::read_to_string(g.results_dir(&job).join("final/stdout")).unwrap_or_default();
    assert_eq!(stdout, "3\n", "run by a launcher of 3 slots");
    let file = g.job_file(&job).unwrap_or_default();
    assert_eq!(file["final"]["status"], "succeeded", "{file}");
}
