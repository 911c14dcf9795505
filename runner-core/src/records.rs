//! What a job keeps in its results directory, as plain data: the lines of
//! `index.jsonl`, `job.json`, and how a resumed job reads the index back.
//!
//! No filesystem here (`results.rs` writes and reads the files), so that
//! resuming from an index can be tested on bytes.

use std::io::{self, BufRead};

use gleaner_manifest::{Addition, ParamValue};
use std::collections::BTreeMap;

use gleaner_protocol::{ClusterName, Gathering, HostSlots, JobState, Millis, TaskCounts};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::book::FinalStatus;

/// One line of `index.jsonl`: the final state of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexEntry {
    pub task: u64,
    pub command: String,
    pub params: IndexMap<String, ParamValue>,
    pub status: FinalStatus,
    pub exit_code: Option<i32>,
    pub attempts: u32,
    pub preemptions: u32,
    pub runtime_s: f64,
    pub cluster: Option<ClusterName>,
    pub host: Option<String>,
    /// Why its last run could not even start (its directory, its program),
    /// or why it was killed (its memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The most memory its last run held, where the task asked for memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_mb: Option<u64>,
    /// Its last run's stdout in `output.log`, where it printed any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<Span>,
    /// Its last run's stderr in `output.log`, where it printed any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<Span>,
}

/// Where a run's stream is in the job's `output.log`: a million tasks'
/// output is one file, not a million.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub offset: u64,
    pub bytes: u64,
}

/// A run's streams, where they were written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streams {
    pub stdout: Option<Span>,
    pub stderr: Option<Span>,
}

/// One line of `attempts.jsonl`: a run that failed and is retried, so that
/// its output can be read while the task runs again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptEntry {
    pub task: u64,
    pub attempt: u32,
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<Span>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<Span>,
}

/// `job.json`: the job's summary, rewritten as it progresses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobFile {
    pub job: String,
    /// The broker user who submitted the job.
    #[serde(default)]
    pub owner: String,
    pub name: String,
    pub state: JobState,
    pub runner: String,
    pub results: String,
    pub submitted_at: Millis,
    pub started_at: Millis,
    pub finished_at: Option<Millis>,
    pub makespan_s: Option<f64>,
    pub tasks: TaskCounts,
    pub duplicates: u64,
    pub preemptions: u64,
    /// The publication of first attempts reached the manifest's last task;
    /// a runner that takes over trusts the task queue to hold the rest.
    pub tasks_published: bool,
    /// The most tasks one message of first attempts carried so far: the
    /// manifest's `bundle`, or the runner's own from measured run times.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub largest_bundle: u32,
    /// Grid jobs: the cluster each component was placed on, once placed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<Option<ClusterName>>,
    /// Grid jobs: runs given up because a component was lost (it could
    /// not start, or died with its host), each followed by a new placement.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// The final step was published (after every task ended); a resumed
    /// job need not publish it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub final_published: bool,
    /// How the manifest's final step ended, once it has.
    #[serde(default, rename = "final", skip_serializing_if = "Option::is_none")]
    pub final_step: Option<FinalOutcome>,
    /// An open job was closed: no more tasks are added.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closed: bool,
    /// Additions (`additions.jsonl`) whose tasks were all published; a
    /// resumed job publishes those of the others again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub additions_published: u32,
    /// Grid jobs: how the components gather at their start barrier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gathering: Option<Gather>,
    /// Why the job was stopped, if something it holds could not be sent
    /// (a message over the broker's bound): its owner's to change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// A grid job's gathering (KOALA's claiming), in `job.json` so that a
/// runner taking the job over goes on where the last one was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gather {
    /// The figures so far (`at_barrier` as of the last save).
    #[serde(flatten)]
    pub figures: Gathering,
    /// KOALA's L: how far towards the start time each claiming try moves
    /// the next one; lowered by each run that did not gather.
    pub level: f64,
    /// Since when the job waits to be placed (submission, or its last
    /// run given up).
    pub waiting_since: Millis,
    /// The run placed now, until it is given up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<Claim>,
}

/// One placed run of a grid job, gathering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    /// KOALA's Job Placement Time.
    pub placed_at: Millis,
    /// KOALA's Job Start Time: the run must have gathered by then.
    pub start_by: Millis,
    /// The next claiming try (KOALA's JCT), until the run is let go.
    pub next_try: Millis,
    /// The components that started, waiting at the barrier.
    #[serde(default)]
    pub started: BTreeMap<u32, StartedComponent>,
    /// When every component started and was let go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Millis>,
    /// Since when the run is being stopped for a job of higher priority,
    /// and which of its components have stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<Millis>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub stopped: std::collections::BTreeSet<u32>,
    /// Clusters whose components did not start when claimed: this run's
    /// components are placed elsewhere.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub avoid: std::collections::BTreeSet<ClusterName>,
    /// Components being moved (reallocation), to the cluster each is
    /// submitted to: they stay placed where they were until it has them
    /// queued.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub moving: BTreeMap<u32, ClusterName>,
    /// The slots the scheduler chose for moldable components.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub slots: BTreeMap<u32, u32>,
}

impl Claim {
    /// A run placed at `placed_at`, to gather within `barrier_timeout_ms`;
    /// its first claiming try `first_try_ms` later (KOALA: JCT₀ = JPT +
    /// L·FTT).
    pub fn new(placed_at: Millis, barrier_timeout_ms: u64, first_try_ms: u64) -> Self {
        Self {
            placed_at,
            start_by: placed_at.saturating_add(barrier_timeout_ms),
            next_try: placed_at.saturating_add(first_try_ms),
            started: BTreeMap::new(),
            released_at: None,
            stopping: None,
            stopped: Default::default(),
            avoid: Default::default(),
            moving: BTreeMap::new(),
            slots: BTreeMap::new(),
        }
    }
}

/// A component that started: where, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartedComponent {
    pub cluster: ClusterName,
    pub hosts: Vec<HostSlots>,
    pub at: Millis,
}

impl JobFile {
    /// The job ended (done or cancelled): only its wind-up may be left.
    pub fn has_ended(&self) -> bool {
        matches!(self.state, JobState::Done | JobState::Cancelled)
    }
}

/// A line of `additions.jsonl`: tasks added to an open job, numbered from
/// `first`, recorded before they are published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AddedTasks {
    pub first: u64,
    pub addition: Addition,
}

/// The additions a results directory records. A line cut short by a crash
/// was never acked: its addition comes again.
pub fn read_additions(text: &str) -> Vec<AddedTasks> {
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// The final step's end: like a task's index line, or `skipped` (when it
/// runs only if every task succeeded, and one did not).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinalOutcome {
    /// `succeeded`, `failed`, `timed_out`, `lost`, `cancelled` or `skipped`.
    pub status: String,
    pub exit_code: Option<i32>,
    pub attempts: u32,
    pub runtime_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

impl FinalOutcome {
    /// Its end, with its last run if it had one.
    pub fn of(status: FinalStatus, run: Option<&gleaner_protocol::ResultMsg>) -> Self {
        Self {
            status: status.name().to_owned(),
            exit_code: run.and_then(|r| r.exit_code),
            attempts: run.map_or(0, |r| r.attempt),
            runtime_s: run.map_or(0.0, |r| r.runtime_ms as f64 / 1000.0),
            host: run.map(|r| r.host.clone()).filter(|h| !h.is_empty()),
        }
    }

    /// Not run: not every task succeeded.
    pub fn skipped() -> Self {
        Self {
            status: "skipped".to_owned(),
            exit_code: None,
            attempts: 0,
            runtime_s: 0.0,
            host: None,
        }
    }

    pub fn succeeded(&self) -> bool {
        self.status == "succeeded"
    }

    /// The book's final state for the step.
    pub fn book_status(&self) -> FinalStatus {
        match self.status.as_str() {
            "succeeded" => FinalStatus::Succeeded,
            "timed_out" => FinalStatus::TimedOut,
            "lost" => FinalStatus::Lost,
            "failed" => FinalStatus::Failed,
            _ => FinalStatus::Cancelled,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What an index holds, read back.
#[derive(Debug, Default)]
pub struct IndexContents {
    /// Tasks with a final state, in the order they were recorded.
    pub finished: Vec<(u64, FinalStatus)>,
    /// Bytes in whole lines: anything after them is a line cut short by a
    /// crash, which the caller cuts off before appending.
    pub whole_bytes: u64,
    /// Whole lines that do not parse (or are longer than
    /// [`MAX_INDEX_LINE`]); skipped, for the caller to report.
    pub unreadable: u64,
    /// Why the first of them could not be read.
    pub first_error: Option<String>,
}

/// The longest index line read: an index sits in its owner's directory, so
/// it is read as if hostile (a sparse file of 60 GB without a newline
/// costs the runner this much memory, not 60 GB).
pub const MAX_INDEX_LINE: usize = 1 << 20;

#[derive(Deserialize)]
struct IndexLine {
    task: u64,
    status: FinalStatus,
}

/// Reads an index. Only a reader's own errors fail it: unreadable lines are
/// skipped, and a torn last line is left out. Memory is bounded by
/// [`MAX_INDEX_LINE`] and the lines that name a task within `MAX_TASKS`.
pub fn read_index(mut index: impl BufRead) -> io::Result<IndexContents> {
    let mut contents = IndexContents::default();
    // Bytes, not text: a line cut in the middle of a UTF-8 character must
    // not make the whole index unreadable.
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = io::Read::take(&mut index, MAX_INDEX_LINE as u64).read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(contents);
        }
        if line.last() != Some(&b'\n') {
            if n < MAX_INDEX_LINE {
                // The end of the file, in a line cut short.
                return Ok(contents);
            }
            let Some(rest) = skip_line(&mut index)? else {
                return Ok(contents);
            };
            contents.whole_bytes += (n + rest) as u64;
            contents.skip(format!("a line longer than {MAX_INDEX_LINE} bytes"));
            continue;
        }
        contents.whole_bytes += n as u64;
        match serde_json::from_slice::<IndexLine>(&line) {
            Ok(entry) if entry.task < gleaner_manifest::MAX_TASKS => {
                contents.finished.push((entry.task, entry.status));
            }
            Ok(entry) => contents.skip(format!("task {} is beyond any job", entry.task)),
            Err(e) => contents.skip(e.to_string()),
        }
    }
}

impl IndexContents {
    fn skip(&mut self, why: String) {
        self.unreadable += 1;
        self.first_error.get_or_insert(why);
    }
}

/// Reads past the rest of a line without keeping it: its length with the
/// newline, or `None` if the file ends first.
fn skip_line(index: &mut impl BufRead) -> io::Result<Option<usize>> {
    let mut skipped = 0;
    loop {
        let buffer = index.fill_buf()?;
        if buffer.is_empty() {
            return Ok(None);
        }
        match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => {
                index.consume(at + 1);
                return Ok(Some(skipped + at + 1));
            }
            None => {
                let length = buffer.len();
                index.consume(length);
                skipped += length;
            }
        }
    }
}

/// The largest `job.json` read: the runner writes a few kilobytes, but
/// for a grid job's started components' hosts, which may take up to
/// [`gleaner_protocol::MAX_GO_HOSTS_BYTES`] in a message and four times
/// that as indented JSON.
pub const MAX_JOB_FILE: u64 = 64 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_and_unreadable_lines_are_left_out() {
        let mut index = b"{\"task\":3,\"status\":\"succeeded\",\"command\":\"x\"}\n\
                          not json\n\
                          {\"task\":0,\"status\":\"lost\"}\n"
            .to_vec();
        let whole = index.len() as u64;
        index.extend_from_slice(
            "{\"task\":1,\"command\":\"é"
                .as_bytes()
                .split_last()
                .unwrap()
                .1,
        );
        let contents = read_index(&index[..]).unwrap();
        assert_eq!(
            contents.finished,
            [(3, FinalStatus::Succeeded), (0, FinalStatus::Lost)]
        );
        assert_eq!(contents.whole_bytes, whole);
        assert_eq!(contents.unreadable, 1);
    }

    #[test]
    fn long_lines_are_skipped_in_bounded_memory() {
        let mut index = vec![b'x'; MAX_INDEX_LINE * 3];
        index.push(b'\n');
        let long = index.len() as u64;
        index.extend_from_slice(b"{\"task\":2,\"status\":\"failed\"}\n");
        index.extend_from_slice(b"{\"task\":99999999999,\"status\":\"failed\"}\n");
        let whole = index.len() as u64;
        index.extend(std::iter::repeat_n(0, MAX_INDEX_LINE * 2));
        let contents = read_index(std::io::BufReader::new(&index[..])).unwrap();
        assert_eq!(contents.finished, [(2, FinalStatus::Failed)]);
        assert_eq!(contents.whole_bytes, whole, "the zeros are a torn line");
        assert_eq!(contents.unreadable, 2);
        assert!(contents.first_error.unwrap().contains("longer than"));
        assert!(long < whole);
    }
}
