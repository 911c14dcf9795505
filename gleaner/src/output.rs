//! What the user's commands print, in one place: `--output cli` for people
//! (tables, a progress bar, sentences), `json` for scripts (JSON on stdout,
//! nothing else there), `quiet` for exit codes alone (and the id of a job
//! submitted without waiting). Errors are not output: `main` prints them,
//! whatever the mode.

use std::{
    collections::BTreeMap,
    io::{IsTerminal, Write},
    path::Path,
    time::{Duration, Instant},
};

use gleaner_manifest::JobId;
use gleaner_protocol::{JobReport, StatusReply, TaskCounts};
use gleaner_simulator::Comparison;

use crate::doctor::{Finding, Verdict};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputMode {
    #[default]
    Cli,
    Json,
    Quiet,
}

/// Everything a command shows besides errors.
pub trait Output {
    /// The job is on the submission queue; `waiting` when progress follows.
    fn job_submitted(&self, job: &JobId, waiting: bool);
    /// A display of the job's progress until it ends.
    fn progress(&self, job: &JobId) -> Progress;
    /// The job ended as `report` says.
    fn job_ended(&self, report: &JobReport);
    /// The scheduler's picture; `job` when only one job was asked for.
    /// `hosts`: every execution host, not only a count per state.
    fn status(&self, reply: &StatusReply, job: Option<&str>, hosts: bool);
    /// `gleaner jobs`: these jobs, one line each.
    fn jobs(&self, jobs: &[JobReport]);
    /// `gleaner results`: index lines of the job whose results are in `dir`.
    fn results(&self, dir: &Path, entries: &[serde_json::Value]);
    /// The scheduler passed a request on to the job's runner.
    fn passed_on(&self, job: &JobId, request: Passed);
    fn simulation(&self, comparison: &Comparison);
    fn file_written(&self, what: &str, path: &Path);
    /// `gleaner doctor`: every check's outcome, and what to do about it.
    fn doctor(&self, findings: &[Finding]);
}

/// A request the scheduler passed on to a job's runner.
#[derive(Debug, Clone, Copy)]
pub enum Passed {
    Cancel,
    Close,
    /// This many tasks added.
    Tasks(u64),
}

/// One line on stdout. A reader that went away (`| head`) has what it
/// wanted: a closed pipe ends nothing and is no error.
fn out(text: impl std::fmt::Display) {
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

pub fn for_mode(mode: OutputMode) -> Box<dyn Output> {
    match mode {
        OutputMode::Cli => Box::new(Cli),
        OutputMode::Json => Box::new(Json),
        OutputMode::Quiet => Box::new(Quiet),
    }
}

struct Cli;

impl Output for Cli {
    fn job_submitted(&self, job: &JobId, _waiting: bool) {
        out(job);
    }

    fn progress(&self, job: &JobId) -> Progress {
        Progress::new(job, true)
    }

    fn job_ended(&self, report: &JobReport) {
        let t = &report.tasks;
        let unsuccessful = t.total.saturating_sub(t.succeeded);
        eprintln!(
            "{}: {:?}: {} of {} tasks succeeded{}; results in {}",
            report.job,
            report.state,
            t.succeeded,
            t.total,
            match unsuccessful {
                0 => String::new(),
                n => format!(" ({n} did not: {})", outcomes(t).join(", ")),
            },
            report.results
        );
        if unsuccessful > 0
            && let Some(which) = unsuccessful_tasks(&report.job, Path::new(&report.results))
        {
            eprintln!("{which}");
        }
        if let Some(problem) = &report.problem {
            eprintln!("{}: {problem}", report.job);
        }
    }

    fn jobs(&self, jobs: &[JobReport]) {
        if jobs.is_empty() {
            eprintln!("no jobs");
        } else {
            out(crate::table::jobs(jobs).trim_end());
        }
    }

    fn results(&self, dir: &Path, entries: &[serde_json::Value]) {
        if !entries.is_empty() {
            out(crate::table::results(entries).trim_end());
        }
        eprintln!(
            "{} tasks; from {}",
            entries.len(),
            dir.join("index.jsonl").display()
        );
    }

    fn status(&self, reply: &StatusReply, job: Option<&str>, hosts: bool) {
        if job.is_none() {
            out(format_args!(
                "scheduler {} ({})\n\n{}",
                reply.scheduler,
                reply.policy,
                crate::table::clusters(&reply.clusters)
            ));
            if reply.clusters.iter().any(|c| !c.report.hosts.is_empty()) {
                out(if hosts {
                    crate::table::each_host(&reply.clusters)
                } else {
                    crate::table::hosts(&reply.clusters)
                });
            }
        }
        out(crate::table::jobs(&reply.jobs).trim_end());
        for report in &reply.jobs {
            if let Some(problem) = &report.problem {
                out(format_args!("{}: {problem}", report.job));
            }
            if let Some(gathering) = crate::table::gathering(report) {
                out(gathering);
            }
        }
        for placement in &reply.placements {
            out(crate::table::placement(placement));
        }
    }

    fn passed_on(&self, job: &JobId, request: Passed) {
        match request {
            Passed::Cancel => out(format_args!("cancel requested for {job}")),
            Passed::Close => out(format_args!("{job} closed: it ends once its tasks have")),
            Passed::Tasks(count) => out(format_args!("{count} tasks added to {job}")),
        }
    }

    fn simulation(&self, comparison: &Comparison) {
        out(comparison.text().trim_end());
    }

    fn file_written(&self, what: &str, path: &Path) {
        eprintln!("{what}: {}", path.display());
    }

    fn doctor(&self, findings: &[Finding]) {
        for finding in findings {
            let mark = match finding.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            out(format_args!(
                "{mark}  {}: {}",
                finding.check, finding.detail
            ));
            if let Some(fix) = &finding.fix {
                out(format_args!("      fix: {fix}"));
            }
        }
    }
}

struct Json;

impl Json {
    fn print(value: &impl serde::Serialize) {
        match serde_json::to_string_pretty(value) {
            Ok(text) => out(text),
            Err(e) => eprintln!("error: cannot write JSON: {e}"),
        }
    }
}

impl Output for Json {
    fn job_submitted(&self, job: &JobId, waiting: bool) {
        // With --wait, the final report is the one document on stdout.
        if !waiting {
            out(serde_json::json!({ "job": job.as_str() }));
        }
    }

    fn progress(&self, job: &JobId) -> Progress {
        Progress::new(job, false)
    }

    /// One line, as `submit --wait --json` always printed it.
    fn job_ended(&self, report: &JobReport) {
        match serde_json::to_string(report) {
            Ok(text) => out(text),
            Err(e) => eprintln!("error: cannot write JSON: {e}"),
        }
    }

    fn status(&self, reply: &StatusReply, _job: Option<&str>, _hosts: bool) {
        Self::print(reply);
    }

    fn jobs(&self, jobs: &[JobReport]) {
        Self::print(&jobs);
    }

    fn results(&self, _dir: &Path, entries: &[serde_json::Value]) {
        Self::print(&entries);
    }

    fn passed_on(&self, job: &JobId, request: Passed) {
        out(match request {
            Passed::Cancel => serde_json::json!({ "job": job.as_str(), "cancel": "requested" }),
            Passed::Close => serde_json::json!({ "job": job.as_str(), "close": "requested" }),
            Passed::Tasks(count) => serde_json::json!({ "job": job.as_str(), "added": count }),
        });
    }

    fn simulation(&self, comparison: &Comparison) {
        out(comparison.json());
    }

    fn file_written(&self, what: &str, path: &Path) {
        eprintln!("{what}: {}", path.display());
    }

    fn doctor(&self, findings: &[Finding]) {
        Self::print(&findings);
    }
}

struct Quiet;

/// Nothing but what a script cannot do without: the id of a job submitted
/// without waiting for it.
impl Output for Quiet {
    fn job_submitted(&self, job: &JobId, waiting: bool) {
        if !waiting {
            out(job);
        }
    }

    fn progress(&self, job: &JobId) -> Progress {
        Progress::new(job, false)
    }

    fn job_ended(&self, _report: &JobReport) {}

    fn status(&self, _reply: &StatusReply, _job: Option<&str>, _hosts: bool) {}

    fn jobs(&self, _jobs: &[JobReport]) {}

    fn results(&self, _dir: &Path, _entries: &[serde_json::Value]) {}

    fn passed_on(&self, _job: &JobId, _request: Passed) {}

    fn simulation(&self, _comparison: &Comparison) {}

    fn file_written(&self, _what: &str, _path: &Path) {}

    fn doctor(&self, _findings: &[Finding]) {}
}

/// How many tasks ended other than by succeeding, in words.
fn outcomes(t: &TaskCounts) -> Vec<String> {
    [
        (t.failed, "failed"),
        (t.timed_out, "timed out"),
        (t.lost, "lost"),
        (t.cancelled, "cancelled"),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect()
}

/// Which tasks did not succeed, and how to read their output, from the
/// results index (when this host sees the results directory).
fn unsuccessful_tasks(job: &JobId, results: &Path) -> Option<String> {
    const SHOWN: usize = 10;
    let index = std::fs::read_to_string(results.join("index.jsonl")).ok()?;
    let mut by_status: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    // The first task that could not even start, and why.
    let mut not_started: Option<(u64, String)> = None;
    for line in index.lines() {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(task), Some(status)) = (entry["task"].as_u64(), entry["status"].as_str()) else {
            continue;
        };
        if let Some(error) = entry["error"].as_str()
            && not_started.as_ref().is_none_or(|(first, _)| task < *first)
        {
            not_started = Some((task, error.to_owned()));
        }
        if status != "succeeded" {
            by_status
                .entry(status.replace('_', " "))
                .or_default()
                .push(task);
        }
    }
    let mut lines = Vec::new();
    let mut example = None;
    for (status, mut tasks) in by_status {
        tasks.sort_unstable();
        example = example.or(tasks.first().copied());
        let shown: Vec<String> = tasks.iter().take(SHOWN).map(u64::to_string).collect();
        let more = match tasks.len().saturating_sub(SHOWN) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        lines.push(format!("  {status}: task {}{more}", shown.join(", ")));
    }
    let example = example?;
    if let Some((task, error)) = not_started {
        lines.push(format!("  task {task} could not start: {error}"));
    }
    lines.push(format!(
        "  each task's output: gleaner logs {job} {example} --stderr"
    ));
    Some(lines.join("\n"))
}

/// A job's task counts in a few words.
fn describe(report: &JobReport) -> String {
    let t = &report.tasks;
    let mut parts = vec![format!("{} running", t.running)];
    parts.extend(outcomes(t));
    let launchers = report
        .launchers
        .values()
        .fold(0u32, |sum, n| sum.saturating_add(*n));
    parts.push(format!("{launchers} launchers"));
    if report.throughput > 0.0 {
        parts.push(format!("{:.1} tasks/s", report.throughput));
    }
    parts.join(", ")
}

/// Progress of a job on stderr: a bar on a terminal, a plain line every few
/// seconds otherwise, nothing when not `shown`.
pub struct Progress {
    job: String,
    bar: Option<ProgressBar>,
    shown: bool,
    last_line: Option<Instant>,
}

impl Progress {
    fn new(job: &JobId, shown: bool) -> Self {
        let bar = (shown && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_prefix(job.to_string());
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Self {
            job: job.to_string(),
            bar,
            shown,
            last_line: None,
        }
    }

    pub fn update(&mut self, report: &JobReport) {
        let t = &report.tasks;
        if let Some(bar) = &self.bar {
            bar.set_length(t.total);
            bar.set_position(t.finished());
            bar.set_message(describe(report));
        } else if self.shown
            && self
                .last_line
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(2))
        {
            eprintln!(
                "{}: {}/{} done, {}",
                self.job,
                t.finished(),
                t.total,
                describe(report)
            );
            self.last_line = Some(Instant::now());
        }
    }

    /// A line about the wait itself (no runner yet, the broker away).
    pub fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None if self.shown => eprintln!("{}: {text}", self.job),
            None => {}
        }
    }

    pub fn abandon(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }

    pub fn finish(&mut self, report: &JobReport) {
        self.update(report);
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}
