//! `gleaner results`, `gleaner logs` and `gleaner export`: a job's results
//! directory, read where this host sees it (the runner's results root is
//! usually shared).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use gleaner_manifest::{JobId, JobIdError, Manifest, Rerun, TaskList, TaskSet};
use serde_json::Value;

use gleaner_broker::{Conversation, topology::REQUEST};
use gleaner_protocol::{Followed, OutputPiece, RequestMsg, StreamPiece};

use crate::{client, error::CliError, output::Output, settings::Settings};

/// Where job `job`'s results are: `dir` if given; the job's own directory,
/// as the scheduler knows it (running or ended); or where the runner puts a
/// job by default (`results_root[/<account>]/results/<job>`).
pub async fn locate(
    settings: &Settings,
    job: &str,
    dir: Option<&Path>,
) -> Result<PathBuf, CliError> {
    let id: JobId = job
        .parse()
        .map_err(|e: JobIdError| CliError::BadInput(e.to_string()))?;
    if let Some(dir) = dir {
        return Ok(dir.to_owned());
    }
    if let Ok(Some(known)) = client::results_of(settings, &id).await {
        return Ok(PathBuf::from(known));
    }
    // No scheduler knows it (none runs, or the job ended long ago): where
    // the runner puts a job by default, in the layout this configuration
    // says, else in the other (a CLI is not told that `gleaner up` keeps
    // one user, say).
    let root = &settings.runner.job.results_root;
    let user = settings.broker_user();
    let relative = Manifest::default_results_dir(job);
    let configured = settings.users.results_area(root, &user).join(&relative);
    let other = gleaner_policy::access::results_area(
        root,
        settings
            .users
            .is_single()
            .then(|| settings.users.account(&user)),
    )
    .join(&relative);
    Ok(match configured.exists() || !other.exists() {
        true => configured,
        false => other,
    })
}

/// A file of a job's results directory; `what` it is, for the error.
fn read_results_file(dir: &Path, name: &str, what: &str) -> Result<Vec<u8>, CliError> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|e| {
        CliError::Unsuccessful(Some(format!(
            "cannot read {what}, {} ({e}); `--dir` says where the job's results are",
            path.display()
        )))
    })
}

/// The index's lines, in the order recorded.
fn index(dir: &Path) -> Result<Vec<Value>, CliError> {
    let text = read_results_file(dir, "index.jsonl", "the results index")?;
    Ok(String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

/// `gleaner results JOB [--status S]…`: the index, filtered.
pub async fn results(
    settings: &Settings,
    job: &str,
    statuses: &[String],
    dir: Option<&Path>,
    output: &dyn Output,
) -> Result<(), CliError> {
    let dir = locate(settings, job, dir).await?;
    let mut entries = index(&dir)?;
    let wanted: Vec<String> = statuses.iter().map(|s| s.replace('-', "_")).collect();
    entries.retain(|e| {
        wanted.is_empty()
            || wanted
                .iter()
                .any(|w| e["status"].as_str() == Some(w.as_str()))
    });
    entries.sort_by_key(|e| e["task"].as_u64());
    output.results(&dir, &entries);
    Ok(())
}

/// Which of a job's tasks `gleaner resubmit` runs again: those that ended
/// in one of `statuses` (any, when none is given), among `tasks` (all of
/// the job's, when not given).
#[derive(Debug, Default)]
pub struct RerunChoice {
    pub statuses: Vec<&'static str>,
    pub tasks: Option<TaskSet>,
}

/// The manifest of a rerun of `job`: its own manifest, as it ran, with
/// only the chosen tasks, and its results linked to the job's.
pub async fn rerun_manifest(
    settings: &Settings,
    job: &str,
    choice: &RerunChoice,
    dir: Option<&Path>,
) -> Result<Manifest, CliError> {
    let dir = locate(settings, job, dir).await?;
    let text = read_results_file(&dir, "manifest.json", &format!("the manifest {job} ran"))?;
    let mut manifest = Manifest::from_json(&text)
        .map_err(|e| CliError::BadInput(format!("{}: {e}", dir.join("manifest.json").display())))?;
    let ended: Vec<(u64, String)> = index(&dir)?
        .iter()
        .filter_map(|e| Some((e["task"].as_u64()?, e["status"].as_str()?.to_owned())))
        .collect();
    let chosen = choose(&manifest, job, &ended, choice)?;
    if manifest.open && !choice.statuses.is_empty() {
        let own = TaskList::new(&manifest).map_or(0, |tasks| tasks.len());
        if ended
            .iter()
            .any(|&(task, ref status)| task >= own && choice.statuses.contains(&status.as_str()))
        {
            eprintln!(
                "note: tasks added to {job} while it was open are not run again; only its manifest's are"
            );
        }
    }
    let results = std::path::absolute(&dir).unwrap_or(dir);
    manifest.rerun = Some(Rerun {
        of: job.to_owned(),
        tasks: chosen,
        results: Some(results.display().to_string()),
    });
    manifest.results = None;
    manifest.open = false;
    manifest
        .validate()
        .map_err(|e| CliError::BadInput(format!("the rerun of {job} is not a valid job: {e}")))?;
    Ok(manifest)
}

/// The tasks a rerun runs: `choice` applied to the job's tasks and how
/// those that ended (`ended`: number, status) ended.
fn choose(
    manifest: &Manifest,
    job: &str,
    ended: &[(u64, String)],
    choice: &RerunChoice,
) -> Result<TaskSet, CliError> {
    let all: TaskSet = match &manifest.rerun {
        Some(rerun) => rerun.tasks.clone(),
        None => {
            let count = TaskList::new(manifest)
                .map_err(|e| CliError::BadInput(e.to_string()))?
                .len();
            (0..count).collect()
        }
    };
    let mut candidates = all.clone();
    if let Some(asked) = &choice.tasks {
        if let Some(stranger) = asked.iter().find(|&t| !all.contains(t)) {
            return Err(CliError::BadInput(format!(
                "task {stranger} is not one of {job}'s tasks ({all})"
            )));
        }
        candidates = asked.clone();
    }
    if !choice.statuses.is_empty() {
        let matching: TaskSet = ended
            .iter()
            .filter(|(_, status)| choice.statuses.contains(&status.as_str()))
            .map(|&(task, _)| task)
            .collect();
        candidates = candidates.intersection(&matching);
    }
    if candidates.is_empty() {
        let which = choice.statuses.join(" or ").replace('_', "-");
        return Err(CliError::Unsuccessful(Some(format!(
            "no task of {job} ended {which}: nothing to run again"
        ))));
    }
    Ok(candidates)
}

/// Where a run's stream is in the job's `output.log`.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
struct Span {
    offset: u64,
    bytes: u64,
}

/// What `gleaner logs` and `export` read of a line of `index.jsonl` or
/// `attempts.jsonl`.
#[derive(Debug, serde::Deserialize)]
struct RunLine {
    task: u64,
    #[serde(default)]
    attempt: Option<u32>,
    /// In the index: the runs made, the last one's number.
    #[serde(default)]
    attempts: u32,
    /// In the index: the preemptions before the last run.
    #[serde(default)]
    preemptions: u32,
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(default)]
    stdout: Option<Span>,
    #[serde(default)]
    stderr: Option<Span>,
}

impl RunLine {
    fn stream(&self, stderr: bool) -> Option<Span> {
        if stderr { self.stderr } else { self.stdout }
    }
}

/// Each readable line of a file of the results directory, in order; a
/// missing file has none.
fn each_run(dir: &Path, name: &str, mut each: impl FnMut(RunLine)) -> Result<(), CliError> {
    use std::io::BufRead;
    let path = dir.join(name);
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(CliError::Unsuccessful(Some(format!(
                "cannot read {} ({e}); `--dir` says where the job's results are",
                path.display()
            ))));
        }
    };
    for line in std::io::BufReader::new(file).split(b'\n') {
        let line = line.map_err(|e| {
            CliError::Unsuccessful(Some(format!("cannot read {}: {e}", path.display())))
        })?;
        if let Ok(run) = serde_json::from_slice::<RunLine>(&line) {
            each(run);
        }
    }
    Ok(())
}

/// A job's `output.log`, read a span at a time.
struct OutputLog {
    file: Option<std::fs::File>,
    len: u64,
    path: PathBuf,
}

impl OutputLog {
    fn open(dir: &Path) -> Result<Self, CliError> {
        let path = dir.join("output.log");
        let file = match std::fs::File::open(&path) {
            Ok(file) => Some(file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(CliError::Unsuccessful(Some(format!(
                    "cannot read {}: {e}",
                    path.display()
                ))));
            }
        };
        let len = file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.len());
        Ok(Self { file, len, path })
    }

    /// The bytes of `span`, which must lie within the log (the index is in
    /// the owner's hands, and may say anything).
    fn read(&self, span: Span) -> Result<Vec<u8>, CliError> {
        use std::os::unix::fs::FileExt;
        let outside = || {
            CliError::Unsuccessful(Some(format!(
                "the index points past the end of {} ({} bytes at {})",
                self.path.display(),
                span.bytes,
                span.offset
            )))
        };
        let file = self.file.as_ref().ok_or_else(outside)?;
        if span
            .offset
            .checked_add(span.bytes)
            .is_none_or(|end| end > self.len)
        {
            return Err(outside());
        }
        let mut data = vec![0; usize::try_from(span.bytes).map_err(|_| outside())?];
        file.read_exact_at(&mut data, span.offset).map_err(|e| {
            CliError::Unsuccessful(Some(format!("cannot read {}: {e}", self.path.display())))
        })?;
        Ok(data)
    }
}

/// Writes to stdout; a reader that went away (`| head`) ends it quietly.
fn emit(data: &[u8]) -> bool {
    use std::io::Write;
    std::io::stdout().write_all(data).is_ok()
}

/// `gleaner logs JOB [TASK]`: a task's captured stdout (or stderr), read
/// from `output.log` where the index says; while it has not ended, its last
/// failed attempt's, if it was retried. `follow` streams it as it is
/// printed ([`follow_task`]) until the task ends. Without a task, every
/// ended task's, in task order.
pub async fn logs(
    settings: &Settings,
    job: &str,
    task: Option<u64>,
    stderr: bool,
    follow: bool,
    dir: Option<&Path>,
) -> Result<(), CliError> {
    let dir = locate(settings, job, dir).await?;
    let Some(task) = task else {
        return all_logs(&dir, stderr);
    };
    if let Some(run) = ended_run(&dir, task)? {
        if let Some(span) = run.stream(stderr) {
            emit(&OutputLog::open(&dir)?.read(span)?);
        }
        return Ok(());
    }
    if follow {
        return follow_task(settings, job, &dir, task, stderr).await;
    }
    let mut retried = None;
    each_run(&dir, "attempts.jsonl", |run| {
        if run.task == task {
            retried = Some(run);
        }
    })?;
    let Some(run) = retried else {
        return Err(CliError::Unsuccessful(Some(format!(
            "task {task} of {job} has not ended, or is not one of its tasks (--follow shows its output as it is printed)"
        ))));
    };
    eprintln!(
        "task {task} has not ended: its attempt {} failed (exit code {}) and runs again; that attempt's output:",
        run.attempt.unwrap_or(0),
        run.exit_code
            .map_or_else(|| "none".to_owned(), |c| c.to_string())
    );
    if let Some(span) = run.stream(stderr) {
        emit(&OutputLog::open(&dir)?.read(span)?);
    }
    Ok(())
}

/// The index line of `task`, once it has ended.
fn ended_run(dir: &Path, task: u64) -> Result<Option<RunLine>, CliError> {
    let mut ended = None;
    each_run(dir, "index.jsonl", |run| {
        if run.task == task {
            ended = Some(run);
        }
    })?;
    Ok(ended)
}

/// How often a follow is renewed: well within its lease.
const RENEW_FOLLOW: Duration = Duration::from_secs(3);

/// How long the last piece of a run is waited for once the index says the
/// task ended (it is sent before the result, on another queue).
const LAST_PIECE_PATIENCE: Duration = Duration::from_secs(2);

/// `gleaner logs JOB TASK --follow`: the task's output as its launcher
/// reads it, through the job's runner (asked again every
/// [`RENEW_FOLLOW`]), until the index says it ended; then the rest of it
/// from the results (on a host that does not see them, until a run's end).
/// Without a broker, the output shows when it ends.
async fn follow_task(
    settings: &Settings,
    job: &str,
    dir: &Path,
    task: u64,
    stderr: bool,
) -> Result<(), CliError> {
    let id: JobId = job
        .parse()
        .map_err(|e: JobIdError| CliError::BadInput(e.to_string()))?;
    let request = RequestMsg::Follow { job: id, task };
    let connection = client::connect(settings).await;
    let mut answers = match &connection {
        Ok(connection) => Some(connection.converse::<Followed>().await?),
        Err(e) if !dir.exists() => {
            return Err(CliError::Unreachable(format!(
                "{e}, and {}",
                not_here_text(dir)
            )));
        }
        Err(e) => {
            eprintln!("[gleaner: {e}; the output shows once the task ends]");
            None
        }
    };
    let mut tee = Tee::default();
    let mut renew = tokio::time::interval(RENEW_FOLLOW);
    let mut look = tokio::time::interval(Duration::from_millis(500));
    let mut said_waiting = false;
    let mut ended_at = None;
    loop {
        tokio::select! {
            _ = renew.tick(), if answers.is_some() => {
                if let Some(conversation) = &answers
                    && let Err(e) = conversation.send(REQUEST, &request, None).await
                {
                    eprintln!("[gleaner: {e}; the output shows once the task ends]");
                    answers = None;
                }
            }
            answer = next_answer(&mut answers) => match answer {
                // The task had ended when the runner was asked: its output
                // is in the results, where this host may not see them.
                Ok(Followed::Output(piece)) if piece.task == task && piece.attempt == 0 => {
                    if !dir.exists() {
                        return Err(not_here(dir));
                    }
                }
                Ok(Followed::Output(piece)) if piece.task == task => {
                    let run = Run::of(&piece);
                    let stream = if stderr { &piece.stderr } else { &piece.stdout };
                    let (note, data) = tee.take(&run, stream);
                    if let Some(note) = note {
                        eprintln!("[gleaner: {note}]");
                    }
                    if !emit(data) {
                        return Ok(());
                    }
                    tee.ended |= piece.ended && tee.run.as_ref() == Some(&run);
                    // Where this host does not see the job's results, a
                    // run's end is the end of what can be shown.
                    if piece.ended && !dir.exists() {
                        return Ok(());
                    }
                }
                Ok(Followed::Refused { reason }) => {
                    return Err(CliError::Unsuccessful(Some(format!("cannot follow task {task} of {job}: {reason}"))));
                }
                Ok(Followed::NotRunning {}) if !said_waiting => {
                    said_waiting = true;
                    eprintln!("[gleaner: no runner has job {job} now; waiting for it]");
                }
                Ok(_) => {}
                Err(e) => {
                    if !dir.exists() {
                        return Err(CliError::Unreachable(format!("{e}, and {}", not_here_text(dir))));
                    }
                    eprintln!("[gleaner: {e}; the output shows once the task ends]");
                    answers = None;
                }
            },
            _ = look.tick() => {
                let Some(line) = ended_run(dir, task)? else { continue };
                let last = (line.attempts, line.preemptions);
                if tee.done_with(last) {
                    return Ok(());
                }
                let waited = ended_at.get_or_insert_with(std::time::Instant::now).elapsed();
                if waited >= LAST_PIECE_PATIENCE || answers.is_none() {
                    if let Some(span) = line.stream(stderr) {
                        let data = OutputLog::open(dir)?.read(span)?;
                        let (note, rest) = tee.rest(last, &data);
                        if let Some(note) = note {
                            eprintln!("[gleaner: {note}]");
                        }
                        emit(rest);
                    }
                    return Ok(());
                }
            }
        }
    }
}

/// A follower on a host that does not see the job's results.
fn not_here(dir: &Path) -> CliError {
    CliError::Unsuccessful(Some(not_here_text(dir)))
}

fn not_here_text(dir: &Path) -> String {
    format!(
        "the task has ended and its output is in {}, which this host does not see (`--dir` says where it is)",
        dir.display()
    )
}

/// The next answer of a follow, while there is a broker to hear it from.
async fn next_answer(
    answers: &mut Option<Conversation<Followed>>,
) -> Result<Followed, gleaner_broker::BrokerError> {
    match answers {
        Some(conversation) => conversation.next().await.unwrap_or_else(|| {
            Err(gleaner_broker::BrokerError::Connect(
                "the broker closed the follow".to_owned(),
            ))
        }),
        None => std::future::pending().await,
    }
}

/// One run of a task: its attempt and the preemptions before it, and the
/// launcher running it (a task redelivered elsewhere runs again with the
/// same attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    attempt: u32,
    preemptions: u32,
    launcher: String,
}

impl Run {
    fn of(piece: &OutputPiece) -> Self {
        Self {
            attempt: piece.attempt,
            preemptions: piece.preemptions,
            launcher: piece.launcher.clone(),
        }
    }

    fn order(&self) -> (u32, u32) {
        (self.attempt, self.preemptions)
    }
}

/// What of a followed task's stream has been printed: of which run, how
/// far, and whether that run's last piece came.
#[derive(Debug, Default)]
struct Tee {
    run: Option<Run>,
    printed: u64,
    ended: bool,
}

impl Tee {
    /// What to print of a piece of `run`: its new bytes, after a note when
    /// it starts another run or skips some; nothing of an earlier run.
    fn take<'a>(&mut self, run: &Run, piece: &'a StreamPiece) -> (Option<String>, &'a [u8]) {
        let mut note = None;
        match &self.run {
            Some(current) if run.order() < current.order() => return (None, &[]),
            Some(current) if run != current => {
                note = Some(format!(
                    "the task runs again (attempt {}); its output from the start",
                    run.attempt
                ));
                (self.printed, self.ended) = (0, false);
            }
            _ => {}
        }
        self.run = Some(run.clone());
        let end = piece.offset.saturating_add(piece.data.len() as u64);
        if end <= self.printed {
            return (note, &[]);
        }
        if piece.offset > self.printed {
            let skipped = piece.offset - self.printed;
            note = Some(match note {
                Some(note) => format!("{note}; {skipped} bytes before this not shown"),
                None => format!(
                    "{skipped} bytes not shown (`gleaner logs` prints all it kept once the task ends)"
                ),
            });
            self.printed = piece.offset;
        }
        let skip = usize::try_from(self.printed - piece.offset).unwrap_or(piece.data.len());
        self.printed = end;
        (note, piece.data.get(skip..).unwrap_or_default())
    }

    /// Whether the run the index names last (`(attempt, preemptions)`) was
    /// printed to its end: its last piece came.
    fn done_with(&self, last: (u32, u32)) -> bool {
        self.ended && self.run.as_ref().is_some_and(|run| run.order() == last)
    }

    /// What to print, once the task ended without its last piece here,
    /// of what the results kept of its last run: what was not printed of
    /// it (the kept part of a long stream starts with a line saying how
    /// many bytes came before it).
    fn rest<'a>(&self, last: (u32, u32), kept: &'a [u8]) -> (Option<String>, &'a [u8]) {
        match &self.run {
            None => (None, kept),
            Some(run) if run.order() != last => (
                Some(format!(
                    "its last run (attempt {}), as the results kept it",
                    last.0
                )),
                kept,
            ),
            Some(_) => {
                let (dropped, data) = without_dropped_note(kept);
                match self.printed.checked_sub(dropped) {
                    Some(printed) => {
                        let printed = usize::try_from(printed).unwrap_or(usize::MAX);
                        (None, data.get(printed..).unwrap_or_default())
                    }
                    None => (
                        Some(format!("{} bytes not shown", dropped - self.printed)),
                        data,
                    ),
                }
            }
        }
    }
}

/// A kept stream's bytes dropped before it, from the line that starts it
/// (`runner::results`), and the stream after that line.
fn without_dropped_note(kept: &[u8]) -> (u64, &[u8]) {
    const NOTE: &[u8] = b"[gleaner: the first ";
    let Some(after) = kept.strip_prefix(NOTE) else {
        return (0, kept);
    };
    let digits = after.iter().take_while(|b| b.is_ascii_digit()).count();
    let dropped = std::str::from_utf8(&after[..digits])
        .ok()
        .and_then(|n| n.parse().ok());
    let line_end = kept.iter().position(|&b| b == b'\n');
    match (dropped, line_end) {
        (Some(dropped), Some(end)) => (dropped, &kept[end + 1..]),
        _ => (0, kept),
    }
}

/// Every ended task's stream, in task order (a task recorded twice, by a
/// runner that took the job over, counts once).
fn all_logs(dir: &Path, stderr: bool) -> Result<(), CliError> {
    let mut spans = Vec::new();
    each_run(dir, "index.jsonl", |run| {
        if let Some(span) = run.stream(stderr) {
            spans.push((run.task, span));
        }
    })?;
    spans.sort_by_key(|(task, _)| *task);
    spans.dedup_by_key(|(task, _)| *task);
    let log = OutputLog::open(dir)?;
    for (_, span) in spans {
        if !emit(&log.read(span)?) {
            break;
        }
    }
    Ok(())
}

/// `gleaner export JOB INTO`: `INTO/tasks/<task>/` for every ended task,
/// with its `stdout` and `stderr` and a copy of its declared outputs.
/// Returns how many tasks it wrote.
pub async fn export(
    settings: &Settings,
    job: &str,
    into: &Path,
    dir: Option<&Path>,
) -> Result<u64, CliError> {
    let dir = locate(settings, job, dir).await?;
    let log = OutputLog::open(&dir)?;
    let mut runs = Vec::new();
    each_run(&dir, "index.jsonl", |run| runs.push(run))?;
    let failed = |what: &Path, e: std::io::Error| {
        CliError::Unsuccessful(Some(format!("cannot write {}: {e}", what.display())))
    };
    let mut written = 0;
    for run in runs {
        let task = into.join("tasks").join(run.task.to_string());
        std::fs::create_dir_all(&task).map_err(|e| failed(&task, e))?;
        for (name, span) in [("stdout", run.stdout), ("stderr", run.stderr)] {
            let path = task.join(name);
            let data = span.map(|s| log.read(s)).transpose()?.unwrap_or_default();
            std::fs::write(&path, data).map_err(|e| failed(&path, e))?;
        }
        let declared = dir.join("tasks").join(run.task.to_string());
        copy_files(&declared, &task).map_err(|e| failed(&task, e))?;
        written += 1;
    }
    Ok(written)
}

/// The regular files and directories under `from`, copied under `to`;
/// anything else (a link the owner made) is left out.
fn copy_files(from: &Path, to: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(from) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_files(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
