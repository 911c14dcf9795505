//! The Grid Engine cell of `deploy/sge/setup.sh`: queues of a test's own,
//! and the cell's commands.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use crate::*;

/// Cluster queues of a test's own on this host's Grid Engine cell, removed
/// (with their jobs) when the test ends. Needs `deploy/sge/setup.sh`.
pub struct SgeQueues {
    pub names: Vec<String>,
}

impl SgeQueues {
    pub fn new(count: usize, slots: u32) -> Self {
        Self::make(count, slots, None)
    }

    /// Queues spanning the multi-host grid's nodes (`deploy/sge/hosts.sh`),
    /// `slots` on each host.
    pub fn on_nodes(count: usize, slots: u32) -> Self {
        Self::make(count, slots, Some("@nodes"))
    }

    fn make(count: usize, slots: u32, hosts: Option<&str>) -> Self {
        let tag = rand_suffix();
        let names: Vec<String> = (1..=count).map(|i| format!("t{tag}c{i}.q")).collect();
        let mut args = vec!["add".to_owned()];
        if let Some(hosts) = hosts {
            args.extend(["--hosts".to_owned(), hosts.to_owned()]);
        }
        args.extend(names.iter().cloned());
        args.push(slots.to_string());
        let status = Command::new(queue_script())
            .args(&args)
            .stdout(Stdio::null())
            .status()
            .expect("deploy/sge/queue.sh (is Grid Engine set up? deploy/sge/setup.sh)");
        assert!(
            status.success(),
            "cannot create test queues (run deploy/sge/setup.sh, and deploy/sge/hosts.sh for the nodes)"
        );
        let queues = Self { names };
        wait_for(
            "the test queues to take jobs",
            Duration::from_secs(60),
            || {
                queues.names.iter().all(|q| {
                    let out = sge("qstat", &["-f", "-q", q]);
                    out.contains(&format!("{q}@")) && !queue_unusable(&out, q)
                })
            },
        );
        queues
    }

    /// Every job in a queue, as (number, name, state, task) from `qstat -xml`.
    pub fn jobs(&self, queue: &str) -> Vec<SgeJob> {
        let xml = sge("qstat", &["-xml", "-u", "*", "-q", queue]);
        xml.split("<job_list")
            .skip(1)
            .map(|entry| {
                let field = |name: &str| {
                    entry
                        .split_once(&format!("<{name}>"))
                        .and_then(|(_, rest)| rest.split_once(&format!("</{name}>")))
                        .map(|(value, _)| value.to_owned())
                        .unwrap_or_default()
                };
                SgeJob {
                    number: field("JB_job_number"),
                    name: field("JB_name"),
                    state: field("state"),
                    tasks: field("tasks"),
                    host: field("queue_name")
                        .split_once('@')
                        .map(|(_, host)| host.to_owned())
                        .unwrap_or_default(),
                    slots: field("slots").parse().unwrap_or(0),
                }
            })
            .collect()
    }
}

impl Drop for SgeQueues {
    fn drop(&mut self) {
        let mut args = vec!["delete".to_owned()];
        args.extend(self.names.iter().cloned());
        let _ = Command::new(queue_script()).args(&args).output();
    }
}

/// One line of `qstat` for a test.
#[derive(Debug, Clone)]
pub struct SgeJob {
    pub number: String,
    pub name: String,
    pub state: String,
    pub tasks: String,
    /// Where it runs (empty while it waits).
    pub host: String,
    pub slots: u32,
}

fn queue_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/sge/queue.sh")
}

fn queue_unusable(qstat: &str, queue: &str) -> bool {
    qstat
        .lines()
        .filter(|l| l.starts_with(&format!("{queue}@")))
        .any(|l| {
            l.split_whitespace()
                .nth(5)
                .is_some_and(|states| states.contains(['a', 'u', 'E', 'd']))
        })
}

/// Submits a job (output discarded); returns its number.
pub fn qsub(args: &[&str]) -> String {
    let answer = sge(
        "qsub",
        &[&["-terse", "-o", "/dev/null", "-e", "/dev/null"], args].concat(),
    );
    let number = answer.trim().split('.').next().unwrap_or("").to_owned();
    assert!(number.parse::<u64>().is_ok(), "qsub answered {answer:?}");
    number
}

/// Runs a Grid Engine command; returns its stdout (and panics if it cannot run).
pub fn sge(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .env(
            "SGE_ROOT",
            std::env::var("SGE_ROOT").unwrap_or_else(|_| "/var/lib/gridengine".into()),
        )
        .env(
            "SGE_CELL",
            std::env::var("SGE_CELL").unwrap_or_else(|_| "default".into()),
        )
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (is Grid Engine set up? deploy/sge/setup.sh)"));
    String::from_utf8_lossy(&output.stdout).into_owned()
}
