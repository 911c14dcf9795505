//! The user's side: `submit`, `status`, `cancel`.

use std::{
    io::IsTerminal,
    path::Path,
    process::ExitCode,
    time::{Duration, Instant},
};

use gleaner_broker::{
    Broker, BrokerError, Connection,
    topology::{self, JobQueues, SCHEDULER_QUEUE, SUBMIT_QUEUE},
};
use gleaner_protocol::{Event, JobReport, SchedulerMsg, StatusReply, Submission, now_ms};
use gleaner_manifest::{JobId, Manifest};
use indicatif::{ProgressBar, ProgressStyle};

use crate::{services::hostname, settings::Settings};

/// Exit codes: 0 all went well, 1 the job did not fully succeed (or the
/// named job is unknown), 2 bad input, 3 the broker or a service is unreachable.
pub const FAILED: u8 = 1;
pub const BAD_INPUT: u8 = 2;
pub const UNREACHABLE: u8 = 3;

async fn connect(settings: &Settings) -> Result<Connection, ExitCode> {
    let broker = Broker::new(&settings.broker_url, format!("cli@{}", hostname())).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(BAD_INPUT)
    })?;
    broker.connect().await.map_err(|e| {
        eprintln!(
            "error: {e}\n(is RabbitMQ running? `deploy/rabbitmq/setup.sh` installs and starts one)"
        );
        ExitCode::from(UNREACHABLE)
    })
}

fn broker_failure(e: &BrokerError) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(UNREACHABLE)
}

/// Reads and validates a manifest: TOML, or JSON for a `.json` file.
pub fn read_manifest(path: &Path) -> Result<Manifest, String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let parsed = if path.extension().is_some_and(|e| e == "json") {
        Manifest::from_json(&text)
    } else {
        let text =
            String::from_utf8(text).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
        Manifest::from_toml(&text)
    };
    parsed.map_err(|e| format!("{}: invalid manifest\n{e}", path.display()))
}

pub async fn submit(settings: &Settings, path: &Path, wait: bool, json: bool) -> ExitCode {
    let manifest = match read_manifest(path) {
        Ok(m) => m,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(BAD_INPUT);
        }
    };
    let job = JobId::new(&manifest.name, rand::random::<u32>());
    let connection = match connect(settings).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let outcome = async {
        let channel = connection.channel().await?;
        topology::declare_core(&channel).await?;
        let publisher = connection.publisher().await?;
        // Subscribe before submitting, so that no event can be missed.
        let events = match wait {
            true => Some(
                connection
                    .subscribe(&publisher, &format!("job.{job}.#"))
                    .await?,
            ),
            false => None,
        };
        let submission = Submission {
            job: job.clone(),
            manifest,
            submitted_at: now_ms(),
        };
        publisher.send(SUBMIT_QUEUE, &submission).await?;
        Ok::<_, BrokerError>(events)
    }
    .await;
    let events = match outcome {
        Ok(events) => events,
        Err(e) => return broker_failure(&e),
    };
    if json && !wait {
        println!("{}", serde_json::json!({ "job": job.as_str() }));
    } else if !json {
        println!("{job}");
    }
    let Some(mut events) = events else {
        return ExitCode::SUCCESS;
    };
    let mut progress = Progress::new(&job, json);
    let mut last_news = Instant::now();
    let mut nudged = false;
    loop {
        let next = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
        let incoming = match next {
            Err(_) => {
                if !nudged && last_news.elapsed() > Duration::from_secs(10) {
                    progress.note("no runner has picked the job up yet (is `gleaner up` or `gleaner runner` running?)");
                    nudged = true;
                }
                continue;
            }
            Ok(Some(Ok(incoming))) => incoming,
            Ok(Some(Err(e))) => {
                eprintln!(
                    "error: lost the broker while waiting ({e}); the job goes on: `gleaner status {job}`"
                );
                return ExitCode::from(UNREACHABLE);
            }
            Ok(None) => {
                eprintln!(
                    "error: the event subscription was cancelled; the job goes on: `gleaner status {job}`"
                );
                return ExitCode::from(UNREACHABLE);
            }
        };
        let _ = incoming.ack().await;
        last_news = Instant::now();
        match incoming.msg {
            Event::Progress(report) => progress.update(&report),
            Event::Done(report) => {
                progress.finish(&report);
                if json {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                }
                let t = report.tasks;
                return if t.succeeded == t.total {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(FAILED)
                };
            }
            Event::Rejected { reason, .. } => {
                progress.abandon();
                eprintln!("error: the runner refused the job: {reason}");
                return ExitCode::from(BAD_INPUT);
            }
            Event::Cluster(_) => {}
        }
    }
}

/// Progress of a job: a bar on a terminal, plain lines otherwise.
struct Progress {
    job: String,
    bar: Option<ProgressBar>,
    quiet: bool,
    last_line: Option<Instant>,
}

impl Progress {
    fn new(job: &JobId, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
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
            quiet,
            last_line: None,
        }
    }

    fn describe(report: &JobReport) -> String {
        let t = &report.tasks;
        let mut parts = vec![format!("{} running", t.running)];
        for (n, what) in [
            (t.failed, "failed"),
            (t.timed_out, "timed out"),
            (t.lost, "lost"),
            (t.cancelled, "cancelled"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        let launchers: u32 = report.launchers.values().sum();
        parts.push(format!("{launchers} launchers"));
        if report.throughput > 0.0 {
            parts.push(format!("{:.1} tasks/s", report.throughput));
        }
        parts.join(", ")
    }

    fn update(&mut self, report: &JobReport) {
        let t = &report.tasks;
        if let Some(bar) = &self.bar {
            bar.set_length(t.total);
            bar.set_position(t.finished());
            bar.set_message(Self::describe(report));
        } else if !self.quiet
            && self
                .last_line
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(2))
        {
            eprintln!(
                "{}: {}/{} done, {}",
                self.job,
                t.finished(),
                t.total,
                Self::describe(report)
            );
            self.last_line = Some(Instant::now());
        }
    }

    fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{}: {text}", self.job),
        }
    }

    fn abandon(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }

    fn finish(&mut self, report: &JobReport) {
        self.update(report);
        if let Some(bar) = &self.bar {
            bar.finish();
        }
        if self.quiet {
            return;
        }
        let t = &report.tasks;
        eprintln!(
            "{}: {:?}: {} of {} tasks succeeded{}; results in {}",
            self.job,
            report.state,
            t.succeeded,
            t.total,
            match t.total.saturating_sub(t.succeeded) {
                0 => String::new(),
                n => format!(" ({n} did not: {})", Self::describe(report)),
            },
            report.results
        );
    }
}

pub async fn status(settings: &Settings, job: Option<&str>, json: bool) -> ExitCode {
    let connection = match connect(settings).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let answer = connection
        .ask::<SchedulerMsg, StatusReply>(
            SCHEDULER_QUEUE,
            &SchedulerMsg::StatusRequest {},
            Duration::from_secs(5),
        )
        .await;
    let mut reply = match answer {
        Ok(Some(reply)) => reply,
        Ok(None) => {
            eprintln!(
                "error: no scheduler answered within 5 s (is `gleaner up` or `gleaner scheduler` running?)"
            );
            return ExitCode::from(UNREACHABLE);
        }
        Err(e) => return broker_failure(&e),
    };
    if let Some(job) = job {
        reply.jobs.retain(|j| j.job.as_str() == job);
        if reply.jobs.is_empty() {
            eprintln!("job {job} is not running (it ended, or no runner has it yet)");
            return ExitCode::from(FAILED);
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reply).unwrap_or_default()
        );
    } else {
        print!("{}", crate::table::status(&reply, job.is_none()));
    }
    ExitCode::SUCCESS
}

pub async fn cancel(settings: &Settings, job: &str) -> ExitCode {
    let job: JobId = match job.parse() {
        Ok(job) => job,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(BAD_INPUT);
        }
    };
    let connection = match connect(settings).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let queues = JobQueues::new(&job);
    let outcome = async {
        if !topology::queue_exists(connection.lapin(), &queues.control).await? {
            return Ok(false);
        }
        let publisher = connection.publisher().await?;
        let cancel = gleaner_protocol::ControlMsg::Cancel {
            reason: format!("cancelled by {}", connection.identity()),
        };
        publisher.send(&queues.control, &cancel).await?;
        Ok::<_, BrokerError>(true)
    }
    .await;
    match outcome {
        Ok(true) => {
            println!("cancel requested for {job}");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!("job {job} is not running (it ended, or no runner has it yet)");
            ExitCode::from(FAILED)
        }
        Err(e) => broker_failure(&e),
    }
}
