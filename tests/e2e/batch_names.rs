//! Batch jobs named like gleaner's that are not: job ids are public, so Bob
//! can name his own jobs after Alice's — a held `gl-<her sweep>` (her
//! placeholders' name) and a held `gg-<her grid job>.0` (her component's).
//! The kcm goes by owner as well as by name: her jobs complete, none of
//! Bob's jobs is removed, and the cluster counts no failed start. On the
//! real Grid Engine (`deploy/sge/setup.sh`) and Slurm
//! (`deploy/slurm/setup.sh`), with the Unix accounts alice and bob
//! (`deploy/accounts.sh`).

use std::{
    process::{Command, Output},
    time::{SystemTime, UNIX_EPOCH},
};

use gleaner_protocol::naming::{component_name, placeholder_name};
use gleaner_testkit::{Gleaner, SgeQueues, SlurmCluster, wait_for};

use crate::MINUTE;

/// The batch system under test, as Bob uses it.
#[derive(Debug, Clone, Copy)]
enum Batch {
    /// Grid Engine, a queue of the test's own.
    Sge,
    /// Slurm, gleaner's partition.
    Slurm,
}

impl Batch {
    /// Runs a batch-system command as `account` (root: `None`).
    fn command(self, account: Option<&str>, program: &str, args: &[&str]) -> Output {
        let mut command = match account {
            Some(account) => {
                let mut command = Command::new("runuser");
                command.args(["-u", account, "--", program]);
                command
            }
            None => Command::new(program),
        };
        command
            .args(args)
            .current_dir("/tmp")
            .env("SGE_ROOT", "/var/lib/gridengine")
            .env("SGE_CELL", "default")
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    }

    /// Submits a job named `name` on hold as bob, to `queue` (Grid Engine)
    /// or gleaner's partition (Slurm); its batch id.
    fn submit_held_as_bob(self, name: &str, queue: &str) -> String {
        let output = match self {
            Batch::Sge => self.command(
                Some("bob"),
                "qsub",
                &[
                    "-terse",
                    "-h",
                    "-N",
                    name,
                    "-q",
                    queue,
                    "-o",
                    "/dev/null",
                    "-e",
                    "/dev/null",
                    "-b",
                    "y",
                    "/bin/sleep",
                    "600",
                ],
            ),
            Batch::Slurm => self.command(
                Some("bob"),
                "sbatch",
                &[
                    "--parsable",
                    "--hold",
                    &format!("--job-name={name}"),
                    &format!("--partition={}", SlurmCluster::PARTITION),
                    "--output=/dev/null",
                    "--error=/dev/null",
                    "--wrap",
                    "sleep 600",
                ],
            ),
        };
        let answer = String::from_utf8_lossy(&output.stdout);
        let id = answer
            .trim()
            .split([';', '.'])
            .next()
            .unwrap_or("")
            .to_owned();
        assert!(
            id.parse::<u64>().is_ok(),
            "bob could not submit {name}: {answer}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        id
    }

    /// Whether the job `id`, named `name`, is still in the batch system,
    /// bob's.
    fn has_bobs(self, id: &str, name: &str) -> bool {
        let listing = match self {
            Batch::Sge => self.command(None, "qstat", &["-u", "bob", "-xml"]),
            Batch::Slurm => self.command(None, "squeue", &["-h", "-u", "bob", "-o", "%i|%j"]),
        };
        let listing = String::from_utf8_lossy(&listing.stdout);
        match self {
            Batch::Sge => listing
                .split("<job_list")
                .any(|j| j.contains(&format!("<JB_job_number>{id}<")) && j.contains(name)),
            Batch::Slurm => listing.lines().any(|l| l == format!("{id}|{name}")),
        }
    }

    fn remove(self, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let program = match self {
            Batch::Sge => "qdel",
            Batch::Slurm => "scancel",
        };
        self.command(None, program, &ids);
    }
}

/// Bob's jobs, removed at the end of the test however it ends.
struct BobsJobs {
    batch: Batch,
    ids: Vec<String>,
}

impl Drop for BobsJobs {
    fn drop(&mut self) {
        self.batch.remove(&self.ids);
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A job's `job.json` state, in alice's results area.
fn state(g: &Gleaner, job: &str) -> Option<String> {
    let path = g.path().join("alice/results").join(job).join("job.json");
    let text = std::fs::read_to_string(path).ok()?;
    let file: serde_json::Value = serde_json::from_str(&text).ok()?;
    file["state"].as_str().map(str::to_owned)
}

/// Waits for a job of alice's to end; its state.
fn wait_for_end(g: &Gleaner, job: &str) -> String {
    let mut ended = None;
    wait_for(&format!("alice's job {job} to end"), 4 * MINUTE, || {
        ended = state(g, job).filter(|s| s == "done" || s == "cancelled");
        ended.is_some()
    });
    ended.unwrap_or_default()
}

/// The cluster's report in `gleaner status --json` (null when absent).
fn report(g: &Gleaner, cluster: &str) -> serde_json::Value {
    let status = g.status().unwrap_or_default();
    status["clusters"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["report"]["cluster"] == cluster))
        .cloned()
        .unwrap_or_default()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Alice's sweep and grid job on `clusters`, with Bob's held jobs named
/// after them submitted as soon as their ids are known (to `queue` on
/// Grid Engine).
fn bobs_names_take_nothing_of_alices(test: &str, batch: Batch, clusters: &str, queue: &str) {
    let (mut g, alice, _bob, env) =
        gleaner_testkit::users::many_users(test, env!("CARGO_BIN_EXE_gleaner"), clusters);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    g.start_with("up", &["up"], &env);
    wait_for("the runner to serve", MINUTE, || {
        g.log("up").contains("runner serving")
    });
    let mut bobs = BobsJobs {
        batch,
        ids: Vec::new(),
    };
    let submit = |manifest: &str, text_of: &str| {
        let path = g.write(manifest, text_of);
        let submitted = g.run_as(&alice, &["submit", path.to_str().expect("path")]);
        assert!(submitted.status.success(), "{}", text(&submitted));
        String::from_utf8_lossy(&submitted.stdout).trim().to_owned()
    };

    // The grid job's component runs for a while: Bob's name for it is in
    // the batch system before it ends.
    let grid = submit(
        "grid.toml",
        "name = \"rigid\"\nkind = \"grid\"\npriority = \"high\"\n[[component]]\nslots = 1\ncommand = \"sleep 10; echo ran\"\n",
    );
    let fake_component = component_name(&grid.parse().expect("job id"), 0);
    bobs.ids
        .push(batch.submit_held_as_bob(&fake_component, queue));
    let sweep = submit(
        "sweep.toml",
        "name = \"spread\"\n[sweep]\ncommand = \"sleep 4; echo {i}\"\nparams = { i = { from = 1, to = 6 } }\n",
    );
    let fake_placeholder = placeholder_name(&sweep);
    bobs.ids
        .push(batch.submit_held_as_bob(&fake_placeholder, queue));

    assert_eq!(wait_for_end(&g, &sweep), "done", "{}", g.log("up"));
    assert_eq!(wait_for_end(&g, &grid), "done", "{}", g.log("up"));
    let index = std::fs::read_to_string(
        g.path()
            .join("alice/results")
            .join(&sweep)
            .join("index.jsonl"),
    )
    .expect("the sweep's index");
    assert_eq!(
        index
            .lines()
            .filter(|l| l.contains("\"succeeded\""))
            .count(),
        6,
        "{index}"
    );
    let output =
        gleaner_testkit::task_stream(&g.path().join("alice/results").join(&grid), 0, false)
            .expect("the component's output");
    assert_eq!(output, "ran\n");

    // Both jobs ended: whatever the kcm does to an ended job's placeholders
    // and components (its running ones go after a 10 s grace), it has had
    // the time to do, polling every second.
    let ended = now_ms();
    wait_for(
        "the kcm to report 20 s after the jobs ended",
        2 * MINUTE,
        || {
            report(&g, "c1")["report"]["at"]
                .as_u64()
                .is_some_and(|at| at > ended + 20_000)
        },
    );
    let [component_id, placeholder_id] = [&bobs.ids[0], &bobs.ids[1]];
    assert!(
        batch.has_bobs(component_id, &fake_component),
        "bob's {fake_component} was removed"
    );
    assert!(
        batch.has_bobs(placeholder_id, &fake_placeholder),
        "bob's {fake_placeholder} was removed"
    );
    let cluster = report(&g, "c1");
    assert_eq!(cluster["report"]["failed_starts"], 0, "{cluster}");
    assert_ne!(cluster["excluded"], true, "{cluster}");
    let log = g.log("up");
    for name in [&fake_component, &fake_placeholder] {
        let job = name
            .trim_start_matches("gl-")
            .trim_start_matches("gg-")
            .trim_end_matches(".0");
        assert!(
            log.lines()
                .any(|l| l.contains("is not gleaner's") && l.contains(job)),
            "the kcm did not tell of bob's {name}"
        );
    }
}

#[test]
fn grid_engine_leaves_another_users_jobs_named_like_gleaners_alone() {
    let queues = SgeQueues::new(1, 4);
    let queue = &queues.names[0];
    let clusters = format!("[[cluster]]\nname = \"c1\"\nbackend = \"sge\"\nqueue = \"{queue}\"\n");
    bobs_names_take_nothing_of_alices("names-sge", Batch::Sge, &clusters, queue);
}

#[test]
fn slurm_leaves_another_users_jobs_named_like_gleaners_alone() {
    let _slurm = SlurmCluster::lock();
    let clusters = format!(
        "[[cluster]]\nname = \"c1\"\nbackend = \"slurm\"\npartition = \"{}\"\n",
        SlurmCluster::PARTITION
    );
    bobs_names_take_nothing_of_alices("names-slurm", Batch::Slurm, &clusters, "");
}
