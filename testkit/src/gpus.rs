//! GPU sweeps on the dev grid's stand-in GPUs: each task checks that it
//! sees exactly one device and that no other task holds it meanwhile.

use std::collections::{BTreeMap, BTreeSet};

use crate::{Gleaner, by_task, harness::exclusive};

/// The Grid Engine test hosts' GPUs, for one test at a time: they are the
/// hosts' (every queue's), so a test's GPU launchers would wait for
/// another's, or take what another test means to free.
pub fn sge_gpus_lock() -> nix::fcntl::Flock<std::fs::File> {
    exclusive("gleaner-test-sge-gpus.lock")
}

/// A task that fails unless it has exactly one device of its own: it holds
/// a lock on `<locks>/<host>-gpu<device>` while it runs (its second
/// argument's seconds; the lock goes with it however it ends), and prints
/// its host and device.
const GPU_TASK: &str = r#"d="$CUDA_VISIBLE_DEVICES"
case "$d" in ""|*,*) echo "devices: '$d'"; exit 3;; esac
[ "$GLEANER_GPUS" = "$d" ] || { echo "GLEANER_GPUS: $GLEANER_GPUS"; exit 4; }
exec 9>>"$1/$(hostname)-gpu$d"
flock -n 9 || { echo "gpu $d of $(hostname) held by another task"; exit 5; }
sleep "$2"
echo "$(hostname) $d"
"#;

/// A sweep of `tasks` one-GPU tasks of `seconds` each (and `extra`
/// manifest keys), no retry: a task that shared its device fails for good.
pub fn gpu_sweep(g: &Gleaner, name: &str, tasks: u32, seconds: u32, extra: &str) -> String {
    let script = g.write("gpu-task.sh", GPU_TASK);
    let locks = g.path().join("gpu-locks");
    std::fs::create_dir_all(&locks).expect("lock directory");
    format!(
        "name = \"{name}\"\ngpus = 1\nmax_attempts = 1\n{extra}\n[sweep]\ncommand = \"sh {} {} {seconds} #{{n}}\"\nparams = {{ n = {{ from = 1, to = {tasks} }} }}\n",
        script.display(),
        locks.display()
    )
}

/// Every task of a GPU sweep succeeded on a device of its own; returns the
/// devices used on each host.
pub fn assert_one_task_per_gpu(
    g: &Gleaner,
    job: &str,
    tasks: usize,
) -> BTreeMap<String, BTreeSet<String>> {
    let index = by_task(&g.index(job));
    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (task, entry) in &index {
        let stdout = g.stdout(job, *task).unwrap_or_default();
        assert_eq!(
            entry["status"], "succeeded",
            "task {task}: {stdout} {entry}"
        );
        let (host, device) = stdout.trim().split_once(' ').expect("host and device");
        used.entry(host.to_owned())
            .or_default()
            .insert(device.to_owned());
    }
    assert_eq!(index.len(), tasks, "every task has a result");
    used
}

/// The most placeholders on one host, of those running where `hosts` says.
pub fn most_on_one_host(hosts: impl IntoIterator<Item = String>) -> usize {
    let mut per_host: BTreeMap<String, usize> = BTreeMap::new();
    for host in hosts {
        *per_host.entry(host).or_default() += 1;
    }
    per_host.into_values().max().unwrap_or(0)
}
