//! `gleaner doctor`: a deployment checked from where it runs, before users
//! arrive — the configuration, each broker address, the scheduler, every
//! configured cluster's kcm, batch commands and launcher program, the
//! launchers' directory bases — and, with `--nodes`, each batch cluster
//! from one of its nodes, through a one-slot probe job that runs the
//! cluster's `launcher_program` as `gleaner doctor --node FILE`: its
//! version, its clock, the broker from there. Every problem comes with its
//! fix in one line; the exit status is 1 when a check failed.
//!
//! The verdicts are pure ([`judge_base`], [`judge_node`]); the rest runs
//! the commands and reads the files they are about.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use gleaner_kcm::{BackendKind, ClusterConfig};
use gleaner_protocol::{RequestMsg, StatusReply};
use serde::{Deserialize, Serialize};

use crate::{client, error::CliError, output::Output, settings::Settings};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// One check's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub check: String,
    pub verdict: Verdict,
    pub detail: String,
    /// What to do about it, in one line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    fn ok(check: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            check: check.into(),
            verdict: Verdict::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn problem(
        verdict: Verdict,
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        // On one line: a batch command's stderr may have several.
        let detail: String = detail.into();
        Self {
            check: check.into(),
            verdict,
            detail: detail.split_whitespace().collect::<Vec<_>>().join(" "),
            fix: Some(fix.into()),
        }
    }
}

/// What `doctor` was asked to do.
pub struct Options {
    /// Probe each batch cluster from a node.
    pub nodes: bool,
    /// How long a probe may wait in the queue and run.
    pub node_timeout: Duration,
}

/// Runs every check, shows the findings, and fails if one failed.
pub async fn doctor(
    settings: &Settings,
    options: &Options,
    output: &dyn Output,
) -> Result<(), CliError> {
    let mut findings = vec![configuration(settings)];
    let reply = broker_and_scheduler(settings, &mut findings).await;
    for base in [&settings.launcher.scratch, &settings.launcher.checkpoints] {
        findings.push(judge_base(
            &format!("launcher base {}", base.display()),
            base,
            std::fs::symlink_metadata(base).ok().as_ref(),
            nix::unistd::geteuid().as_raw(),
        ));
    }
    findings.push(judge_results_root(
        &settings.runner.job.results_root,
        nix::unistd::geteuid(),
    ));
    for cluster in &settings.clusters {
        let checks = cluster_checks(cluster, reply.as_ref());
        let broken = checks.iter().any(|f| f.verdict == Verdict::Fail);
        findings.extend(checks);
        if options.nodes && cluster.backend != BackendKind::Local {
            if broken {
                findings.push(Finding::problem(
                    Verdict::Warn,
                    format!("cluster {}: probe from a node", cluster.name.as_str()),
                    "not sent",
                    "fix the cluster's failures above first",
                ));
            } else {
                findings.extend(
                    probe_node(cluster, options.node_timeout, &settings.broker_urls()).await,
                );
            }
        }
    }
    output.doctor(&findings);
    let failed = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Fail)
        .count();
    match failed {
        0 => Ok(()),
        n => Err(CliError::Unsuccessful(Some(format!(
            "{n} check{} failed",
            if n == 1 { "" } else { "s" }
        )))),
    }
}

fn configuration(settings: &Settings) -> Finding {
    match &settings.source {
        Some(path) => Finding::ok("configuration", format!("read from {}", path.display())),
        None => Finding::ok("configuration", "no file: defaults and GLEANER_* variables"),
    }
}

/// Each broker address, then the scheduler through the first that
/// answered; the scheduler's picture, if it answered.
async fn broker_and_scheduler(
    settings: &Settings,
    findings: &mut Vec<Finding>,
) -> Option<StatusReply> {
    let mut connection = None;
    for url in settings.broker_urls() {
        let shown = gleaner_broker::redact(&url);
        let check = format!("broker {shown}");
        let attempt = match gleaner_broker::Broker::new(&[&url], "doctor") {
            Ok(broker) => tokio::time::timeout(Duration::from_secs(15), broker.connect())
                .await
                .map_err(|_| "no answer within 15 s".to_owned())
                .and_then(|c| c.map_err(|e| e.to_string())),
            Err(e) => Err(e.to_string()),
        };
        match attempt {
            Ok(c) => {
                findings.push(Finding::ok(check, format!("connected as {}", c.user())));
                connection.get_or_insert(c);
            }
            Err(e) => {
                let fix = client::connect_hint(&e, std::slice::from_ref(&url));
                findings.push(Finding::problem(Verdict::Fail, check, e, fix));
            }
        }
    }
    let connection = connection?;
    let asked = client::ask_within::<StatusReply>(
        &connection,
        &RequestMsg::Status { job: None },
        Duration::from_secs(10),
    )
    .await;
    match asked {
        Ok(Some(reply)) => {
            findings.push(Finding::ok(
                "scheduler",
                format!(
                    "{} answers (policy {}): {} clusters, {} jobs",
                    reply.scheduler,
                    reply.policy,
                    reply.clusters.len(),
                    reply.jobs.len()
                ),
            ));
            Some(reply)
        }
        Ok(None) => {
            findings.push(Finding::problem(
                Verdict::Fail,
                "scheduler",
                "no scheduler answered within 10 s",
                "start `gleaner scheduler` (the gleaner-scheduler unit) or `gleaner up` with this configuration",
            ));
            None
        }
        Err(e) => {
            findings.push(Finding::problem(
                Verdict::Fail,
                "scheduler",
                e.to_string(),
                "the broker account needs to publish to gleaner.user (deploy/rabbitmq/user.sh add NAME)",
            ));
            None
        }
    }
}

/// A cluster's kcm (as the scheduler hears it), its batch commands and its
/// launcher program, checked from here.
fn cluster_checks(cluster: &ClusterConfig, reply: Option<&StatusReply>) -> Vec<Finding> {
    let name = cluster.name.as_str();
    let mut findings = Vec::new();
    if let Some(reply) = reply {
        let check = format!("cluster {name}: kcm");
        findings.push(
            match reply.clusters.iter().find(|c| c.report.cluster == cluster.name) {
                Some(view) if view.stale => Finding::problem(
                    Verdict::Warn,
                    check,
                    "its kcm has not reported lately",
                    format!("is `gleaner kcm --cluster {name}` (gleaner-kcm@{name}) still running? see its log"),
                ),
                Some(view) if view.report.total_slots == 0 => Finding::problem(
                    Verdict::Warn,
                    check,
                    "its kcm reports no slots",
                    format!("does the queue or partition of [[cluster]] {name} have hosts?"),
                ),
                Some(view) => Finding::ok(
                    check,
                    format!(
                        "reports {} slots, {} idle{}",
                        view.report.total_slots,
                        view.report.idle_slots,
                        if view.excluded { " (excluded for now: its launchers failed to start)" } else { "" }
                    ),
                ),
                None => Finding::problem(
                    Verdict::Warn,
                    check,
                    "the scheduler hears no kcm for it",
                    format!("start `gleaner kcm --cluster {name}` on its head node (the gleaner-kcm@{name} unit)"),
                ),
            },
        );
    }
    findings.extend(batch_commands(cluster));
    findings.push(launcher_program(cluster));
    findings
}

/// The batch system answers, and the queue or partition exists.
fn batch_commands(cluster: &ClusterConfig) -> Vec<Finding> {
    let name = cluster.name.as_str();
    let (listing, place): (Vec<&str>, Option<(Vec<String>, String)>) = match cluster.backend {
        BackendKind::Local => return Vec::new(),
        BackendKind::Sge => (
            vec!["qstat"],
            cluster.queue.as_ref().map(|q| {
                (
                    vec!["qconf".into(), "-sq".into(), q.clone()],
                    format!("queue {q}"),
                )
            }),
        ),
        BackendKind::Slurm => (
            vec!["squeue", "--noheader", "--me"],
            cluster.partition.as_ref().map(|p| {
                (
                    vec![
                        "sinfo".into(),
                        "--noheader".into(),
                        "--partition".into(),
                        p.clone(),
                    ],
                    format!("partition {p}"),
                )
            }),
        ),
    };
    let system = match cluster.backend {
        BackendKind::Sge => "Grid Engine",
        _ => "Slurm",
    };
    let mut findings = Vec::new();
    let check = format!("cluster {name}: {}", listing[0]);
    findings.push(match run(&listing, cluster.command_timeout) {
        Ok(_) => Finding::ok(check, format!("{system} answers")),
        Err(e) => Finding::problem(
            Verdict::Fail,
            check,
            e,
            format!("is {system}'s client set up here (its PATH and, for Grid Engine, SGE_ROOT and SGE_CELL)?"),
        ),
    });
    if let Some((args, what)) = place {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let check = format!("cluster {name}: {what}");
        findings.push(match run(&args, cluster.command_timeout) {
            Ok(out) if !out.trim().is_empty() => Finding::ok(check, "exists"),
            Ok(_) | Err(_) => Finding::problem(
                Verdict::Fail,
                check,
                format!("{system} does not know it"),
                format!("name an existing one in [[cluster]] {name} (`qconf -sql`, `sinfo -s`)"),
            ),
        });
    }
    findings
}

/// The cluster's launcher program runs here and is this gleaner.
fn launcher_program(cluster: &ClusterConfig) -> Finding {
    let check = format!("cluster {}: launcher program", cluster.name.as_str());
    let program = match &cluster.launcher_program {
        Some(p) => p.clone(),
        None => match std::env::current_exe() {
            Ok(p) => p,
            Err(e) => {
                return Finding::problem(
                    Verdict::Fail,
                    check,
                    e.to_string(),
                    "set launcher_program",
                );
            }
        },
    };
    let shown = program.display().to_string();
    match run(&[shown.as_str(), "--version"], Duration::from_secs(10)) {
        Ok(version) if version.trim() == own_version() => {
            Finding::ok(check, format!("{shown}: {}", version.trim()))
        }
        Ok(version) => Finding::problem(
            Verdict::Warn,
            check,
            format!("{shown} is {}, this is {}", version.trim(), own_version()),
            "install the same gleaner on the nodes as on the services' hosts",
        ),
        Err(e) => Finding::problem(
            Verdict::Fail,
            check,
            format!("{shown}: {e}"),
            "set launcher_program in [[cluster]] to the gleaner binary's path on the nodes",
        ),
    }
}

fn own_version() -> String {
    format!("gleaner {}", env!("CARGO_PKG_VERSION"))
}

/// Runs a command to its end within `timeout`; its stdout, or why not.
fn run(args: &[&str], timeout: Duration) -> Result<String, String> {
    let (program, rest) = args.split_first().ok_or("no command")?;
    let child = Command::new(program)
        .args(rest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    // Its output is read as it comes (a long `qstat` fills a pipe), on a
    // thread of its own, waited for at most `timeout`.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let out = match finished.recv_timeout(timeout) {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("{program}: {e}")),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            return Err(format!("{program} did not answer within {timeout:?}"));
        }
    };
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).trim().to_owned();
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        let said = text(&out.stderr);
        Err(if said.is_empty() {
            format!("{program} exited {}", out.status)
        } else if said.starts_with(&format!("{program}:")) {
            said
        } else {
            format!("{program}: {said}")
        })
    }
}

/// A launcher base (scratch, checkpoints) as it is: missing (made when the
/// first launcher starts), root's and shared like `/tmp`, or this
/// account's own; anything else could be used by its owner against every
/// other account's tasks.
pub fn judge_base(check: &str, path: &Path, meta: Option<&std::fs::Metadata>, me: u32) -> Finding {
    let Some(meta) = meta else {
        return Finding::ok(
            check,
            "not made yet: the kcm makes it root's (mode 1777) as it starts",
        );
    };
    let mode = meta.mode() & 0o7777;
    let shown = path.display();
    if meta.file_type().is_symlink() || !meta.is_dir() {
        return Finding::problem(
            Verdict::Fail,
            check,
            "not a directory (or a symbolic link)",
            format!("remove {shown}; the kcm makes it as it starts"),
        );
    }
    match (meta.uid(), mode) {
        (0, 0o1777) => Finding::ok(check, "root's, mode 1777"),
        (uid, _) if uid == me && me != 0 => Finding::ok(check, "this account's own"),
        (uid, mode) => Finding::problem(
            Verdict::Fail,
            check,
            format!(
                "owned by uid {uid}, mode {mode:o}: its owner could swap other accounts' directories in it"
            ),
            format!("as root: chown root:root {shown} && chmod 1777 {shown}"),
        ),
    }
}

/// The runner's `results_root`, judged as a runner of this account opens
/// it (`gleaner_contain::shared::open_private`): every directory on the way
/// root's or this account's, and none that others may add to.
pub fn judge_results_root(root: &Path, me: nix::unistd::Uid) -> Finding {
    let check = format!("results root {}", root.display());
    if std::fs::symlink_metadata(root).is_err() {
        return Finding::ok(check, "not made yet: the runner makes it");
    }
    match gleaner_contain::shared::open_private(root, me) {
        Ok(_) => Finding::ok(check, "no one else may change it or the way to it"),
        Err(e) => Finding::problem(
            Verdict::Fail,
            check,
            e.to_string(),
            format!(
                "as root: chown root:root {0} && chmod go-w {0} (and the directories above it)",
                root.display()
            ),
        ),
    }
}

/// What a probe job reports from a node (`gleaner doctor --node FILE`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeReport {
    pub host: String,
    pub version: String,
    /// The node's clock when it wrote the report.
    pub time_ms: u64,
    /// The broker from the node: `None` if it connected, else why not.
    pub broker: Option<String>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `gleaner doctor --node FILE`, on a node: writes what it finds to FILE
/// (through a file beside it, renamed, so that FILE is whole when seen).
pub async fn node(settings: &Settings, file: &Path) -> Result<(), CliError> {
    let broker = match client::connect(settings).await {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    };
    let report = NodeReport {
        host: gleaner_kcm::hostname(),
        version: own_version(),
        time_ms: now_ms(),
        broker,
    };
    let text = serde_json::to_vec(&report).map_err(|e| CliError::Service(e.into()))?;
    let partial = file.with_extension("partial");
    std::fs::write(&partial, text)
        .and_then(|()| std::fs::rename(&partial, file))
        .map_err(|e| CliError::BadInput(format!("{}: {e}", file.display())))
}

/// The probe's findings: the node's gleaner, its clock against the window
/// in which it must have written (from submission to being seen, give or
/// take a second), and the broker from there.
pub fn judge_node(
    cluster: &str,
    report: &NodeReport,
    submitted_ms: u64,
    seen_ms: u64,
) -> Vec<Finding> {
    let on = format!("cluster {cluster}: node {}", report.host);
    let mut findings = Vec::new();
    findings.push(if report.version == own_version() {
        Finding::ok(format!("{on}: gleaner"), report.version.clone())
    } else {
        Finding::problem(
            Verdict::Warn,
            format!("{on}: gleaner"),
            format!("{} there, {} here", report.version, own_version()),
            "install the same gleaner on the nodes as on the services' hosts",
        )
    });
    const SLACK_MS: u64 = 1000;
    let early = submitted_ms.saturating_sub(SLACK_MS);
    let late = seen_ms.saturating_add(SLACK_MS);
    findings.push(if (early..=late).contains(&report.time_ms) {
        Finding::ok(
            format!("{on}: clock"),
            format!(
                "in step with this host's, as far as the {:.1} s from submission to its report tell",
                seen_ms.saturating_sub(submitted_ms) as f64 / 1000.0
            ),
        )
    } else {
        let off = if report.time_ms < early {
            early - report.time_ms
        } else {
            report.time_ms - late
        };
        Finding::problem(
            Verdict::Warn,
            format!("{on}: clock"),
            format!("{:.1} s off this host's", off as f64 / 1000.0),
            "run NTP (chrony) on every host: heartbeats and walltimes are judged by the clock",
        )
    });
    findings.push(match &report.broker {
        None => Finding::ok(format!("{on}: broker"), "reached from the node"),
        Some(e) => Finding::problem(
            Verdict::Fail,
            format!("{on}: broker"),
            e.clone(),
            "launchers on the nodes must reach the broker: open its port to them, and give them its CA",
        ),
    });
    findings
}

/// Submits a one-slot probe to the cluster, waits for its report, and
/// withdraws it if it did not come in time.
async fn probe_node(
    cluster: &ClusterConfig,
    timeout: Duration,
    broker_urls: &[String],
) -> Vec<Finding> {
    let name = cluster.name.as_str();
    let check = format!("cluster {name}: probe from a node");
    let dir = match tempfile::Builder::new()
        .prefix(".gleaner-doctor-")
        .tempdir_in(".")
    {
        Ok(dir) => dir,
        Err(e) => {
            return vec![Finding::problem(
                Verdict::Fail,
                check,
                format!("cannot make a directory here for its report: {e}"),
                "run doctor from a directory the nodes share, which this account may write",
            )];
        }
    };
    let Ok(dir_path) = std::fs::canonicalize(dir.path()) else {
        return vec![Finding::problem(
            Verdict::Fail,
            check,
            "its directory vanished",
            "try again",
        )];
    };
    let report_file = dir_path.join("node.json");
    let program = cluster
        .launcher_program
        .clone()
        .or_else(|| std::env::current_exe().ok())
        .unwrap_or_else(|| PathBuf::from("gleaner"));
    if let Err(e) = write_probe_config(&dir_path, broker_urls) {
        return vec![Finding::problem(
            Verdict::Fail,
            check,
            format!("cannot write the probe's configuration: {e}"),
            "run doctor from a directory the nodes share, which this account may write",
        )];
    }
    let submitted_ms = now_ms();
    let job = match submit_probe(cluster, &program, &dir_path) {
        Ok(job) => job,
        Err(e) => {
            return vec![Finding::problem(
                Verdict::Fail,
                check,
                e,
                "the account running gleaner must be able to submit to this queue or partition",
            )];
        }
    };
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(text) = std::fs::read(&report_file) {
            let seen_ms = now_ms();
            return match serde_json::from_slice::<NodeReport>(&text) {
                Ok(report) => judge_node(name, &report, submitted_ms, seen_ms),
                Err(e) => vec![Finding::problem(
                    Verdict::Fail,
                    check,
                    format!("an unreadable report: {e}"),
                    "see the probe job's output",
                )],
            };
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    withdraw_probe(cluster, &job);
    // What the job printed, if it ran and its output reached here.
    let printed = std::fs::read_to_string(dir_path.join(PROBE_OUTPUT))
        .map(|text| {
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        })
        .unwrap_or_default();
    vec![Finding::problem(
        Verdict::Fail,
        check,
        format!(
            "no report from job {job} within {timeout:?}: it is still queued, could not run {}, or its report did not reach {}{}",
            program.display(),
            dir_path.display(),
            if printed.is_empty() {
                String::new()
            } else {
                format!("; it printed: {printed}")
            }
        ),
        format!(
            "see {}; run doctor from a directory the nodes share (--node-timeout for a busy cluster)",
            match cluster.backend {
                BackendKind::Sge => format!("`qstat -j {job}`"),
                _ => format!("`scontrol show job {job}`"),
            }
        ),
    )]
}

/// Where a probe job's own output goes, in its directory.
const PROBE_OUTPUT: &str = "probe.out";
/// The probe's configuration (the broker's addresses), in its directory.
const PROBE_CONFIG: &str = "probe.toml";

/// The broker's addresses for the probe, in a file only this account
/// reads: passed in the job's environment they would show in `qstat -j`
/// and `scontrol show job`, passwords and all.
fn write_probe_config(dir: &Path, broker_urls: &[String]) -> std::io::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let mut table = toml::Table::new();
    table.insert("broker_urls".into(), broker_urls.to_vec().into());
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join(PROBE_CONFIG))?
        .write_all(table.to_string().as_bytes())
}

/// Submits the probe job (five minutes at most, one slot) from this
/// directory, its report and output into `dir`; its environment is its
/// configuration file's name (relative: the job starts here) and the
/// trust store this doctor uses, nothing else of this one's. Its batch id.
fn submit_probe(cluster: &ClusterConfig, program: &Path, dir: &Path) -> Result<String, String> {
    let relative = |path: PathBuf| {
        let here = std::env::current_dir().and_then(std::fs::canonicalize);
        here.ok()
            .and_then(|here| path.strip_prefix(here).ok().map(Path::to_path_buf))
            .unwrap_or(path)
    };
    let mut exported = vec![format!(
        "GLEANER_CONFIG={}",
        relative(dir.join(PROBE_CONFIG)).display()
    )];
    if let Ok(trusted) = std::env::var("SSL_CERT_FILE") {
        exported.push(format!("SSL_CERT_FILE={trusted}"));
    }
    let args = probe_args(cluster, program, dir, &exported.join(","));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&args, cluster.command_timeout)?;
    // `qsub -terse`: `123`; `sbatch --parsable`: `123` or `123;cluster`.
    out.split([';', '.'])
        .next()
        .map(str::trim)
        .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        .map(str::to_owned)
        .ok_or_else(|| format!("the batch system gave no job id: {out:?}"))
}

/// The probe's submission: `exported` is all of its environment that
/// comes from here.
fn probe_args(cluster: &ClusterConfig, program: &Path, dir: &Path, exported: &str) -> Vec<String> {
    let exported = exported.to_owned();
    let program = program.display().to_string();
    let report = dir.join("node.json").display().to_string();
    let printed = dir.join(PROBE_OUTPUT).display().to_string();
    match cluster.backend {
        BackendKind::Sge => {
            let mut a = vec![
                "qsub",
                "-terse",
                "-b",
                "y",
                "-shell",
                "no",
                "-cwd",
                "-N",
                "gleaner-doctor",
                "-l",
                "h_rt=0:05:00",
                "-j",
                "y",
            ]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
            a.extend(["-o".into(), printed, "-v".into(), exported]);
            if let Some(q) = &cluster.queue {
                a.extend(["-q".into(), q.clone()]);
            }
            a.extend([program, "doctor".into(), "--node".into(), report]);
            a
        }
        _ => {
            let mut a = vec![
                "sbatch",
                "--parsable",
                "-J",
                "gleaner-doctor",
                "-n",
                "1",
                "-t",
                "5",
            ]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
            a.extend(["-o".into(), printed, format!("--export={exported}")]);
            for (flag, value) in [
                ("-p", &cluster.partition),
                ("--qos", &cluster.qos),
                ("-A", &cluster.account),
            ] {
                if let Some(v) = value {
                    a.extend([flag.into(), v.clone()]);
                }
            }
            a.push(format!(
                "--wrap={} doctor --node {}",
                shell_quote(&program),
                shell_quote(&report)
            ));
            a
        }
    }
}

fn withdraw_probe(cluster: &ClusterConfig, job: &str) {
    let command = match cluster.backend {
        BackendKind::Sge => "qdel",
        _ => "scancel",
    };
    let _ = run(&[command, job], cluster.command_timeout);
}

/// `text` as one word for `sh`.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(version: String, time_ms: u64, broker: Option<String>) -> NodeReport {
        NodeReport {
            host: "node1".into(),
            version,
            time_ms,
            broker,
        }
    }

    #[test]
    fn a_node_in_step_with_this_gleaner_and_the_broker_is_all_ok() {
        let found = judge_node("hpc", &report(own_version(), 10_500, None), 10_000, 11_000);
        assert!(found.iter().all(|f| f.verdict == Verdict::Ok), "{found:?}");
        assert!(found[0].check.starts_with("cluster hpc: node node1"));
    }

    #[test]
    fn a_clock_off_by_more_than_a_second_is_a_warning_with_how_far() {
        let found = judge_node("hpc", &report(own_version(), 4_000, None), 10_000, 11_000);
        let clock = &found[1];
        assert_eq!(clock.verdict, Verdict::Warn);
        assert!(clock.detail.starts_with("5.0 s off"), "{}", clock.detail);
        let ahead = judge_node("hpc", &report(own_version(), 14_000, None), 10_000, 11_000);
        assert!(
            ahead[1].detail.starts_with("2.0 s off"),
            "{}",
            ahead[1].detail
        );
    }

    #[test]
    fn another_version_warns_and_an_unreachable_broker_fails_with_a_fix() {
        let found = judge_node(
            "hpc",
            &report(
                "gleaner 0.0.1".into(),
                10_500,
                Some("connection refused".into()),
            ),
            10_000,
            11_000,
        );
        assert_eq!(found[0].verdict, Verdict::Warn);
        assert_eq!(found[2].verdict, Verdict::Fail);
        assert!(
            found[2]
                .fix
                .as_deref()
                .is_some_and(|f| f.contains("broker"))
        );
    }

    #[test]
    fn a_probe_takes_no_environment_but_its_configurations_name() {
        for backend in ["sge", "slurm"] {
            let cluster: ClusterConfig = toml::from_str(&format!(
                "name = \"c\"\nbackend = \"{backend}\"\nqueue = \"q\"\npartition = \"p\"\n"
            ))
            .expect("a cluster");
            let exported = "GLEANER_CONFIG=.gleaner-doctor-x/probe.toml";
            let args = probe_args(
                &cluster,
                Path::new("/usr/bin/gleaner"),
                Path::new("/d"),
                exported,
            );
            assert!(
                !args
                    .iter()
                    .any(|a| a == "-V" || a.starts_with("--export=ALL")),
                "{args:?}"
            );
            assert!(args.iter().any(|a| a.ends_with(exported)), "{args:?}");
        }
    }

    #[test]
    fn a_results_root_others_may_write_to_fails_with_its_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let me = nix::unistd::geteuid();
        let root = dir.path().join("results");
        assert_eq!(
            judge_results_root(&root, me).verdict,
            Verdict::Ok,
            "not made yet"
        );
        std::fs::create_dir(&root).expect("mkdir");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(judge_results_root(&root, me).verdict, Verdict::Ok);
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let judged = judge_results_root(&root, me);
        assert_eq!(judged.verdict, Verdict::Fail, "{judged:?}");
        assert!(
            judged
                .fix
                .as_deref()
                .is_some_and(|f| f.contains("chmod go-w"))
        );
    }

    #[test]
    fn a_base_of_another_account_fails_and_roots_shared_one_is_ok() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path();
        let meta = std::fs::symlink_metadata(path).expect("meta");
        let me = nix::unistd::geteuid().as_raw();
        // Seen by someone else: a base they do not own, not root's 1777.
        let other = me.wrapping_add(1);
        let judged = judge_base("base", path, Some(&meta), other);
        if meta.uid() == 0 && meta.mode() & 0o7777 == 0o1777 {
            assert_eq!(judged.verdict, Verdict::Ok);
        } else {
            assert_eq!(judged.verdict, Verdict::Fail, "{judged:?}");
            assert!(
                judged
                    .fix
                    .as_deref()
                    .is_some_and(|f| f.contains("chmod 1777"))
            );
        }
        assert_eq!(judge_base("base", path, None, me).verdict, Verdict::Ok);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/tmp", &link).expect("symlink");
        let meta = std::fs::symlink_metadata(&link).expect("meta");
        assert_eq!(
            judge_base("base", &link, Some(&meta), me).verdict,
            Verdict::Fail
        );
    }
}
