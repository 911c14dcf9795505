//! Results on `gleaner.job.<job>.results`, and the parts of big outputs.

use super::*;

/// How one run of a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Succeeded,
    Failed,
    TimedOut,
    /// Killed for using more memory than the task asked for: running it
    /// again would end the same way.
    Oom,
}

/// The outcome of one run of a task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResultMsg {
    pub job: JobId,
    pub task: u64,
    pub attempt: u32,
    pub preemptions: u32,
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    /// The signal that ended the command, if one did.
    #[serde(default)]
    pub signal: Option<i32>,
    pub runtime_ms: u64,
    pub launcher: LauncherId,
    pub cluster: ClusterName,
    #[serde(deserialize_with = "crate::ids::host_name")]
    pub host: String,
    pub stdout: Captured,
    pub stderr: Captured,
    #[serde(default)]
    pub outputs: Vec<OutputFile>,
    /// Why the task could not even start (sandbox, spawn), if so.
    #[serde(default)]
    pub error: Option<String>,
    /// The most memory its processes held together, where the task asked
    /// for memory (the launcher watches only then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_mb: Option<u64>,
    /// Set when the run's output went ahead of it in [`ResultPart`]s: the
    /// data of its streams and files is then empty here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parted: Option<Parted>,
}

impl ResultMsg {
    /// Bytes of captured output it carries.
    pub fn output_bytes(&self) -> usize {
        self.stdout.data.len()
            + self.stderr.data.len()
            + self.outputs.iter().map(|f| f.data.len()).sum::<usize>()
    }

    /// What it weighs in a message: its output, and its other variable
    /// parts (paths, error) with room for the fixed ones.
    pub fn weight(&self) -> usize {
        self.output_bytes()
            + self
                .outputs
                .iter()
                .map(|f| f.path.len() + 32)
                .sum::<usize>()
            + self.error.as_ref().map_or(0, String::len)
            + 256
    }

    /// Splits a run whose output is over [`RESULT_MESSAGE_BYTES`] into
    /// parts of at most [`RESULT_PART_BYTES`] and the result without the
    /// data, which says how much each part's target holds. `run` tells
    /// this run's parts from another run's of the same task.
    pub fn into_parts(mut self, run: u64) -> (Vec<ResultPart>, ResultMsg) {
        if self.output_bytes() <= RESULT_MESSAGE_BYTES {
            return (Vec::new(), self);
        }
        let datas = [&mut self.stdout.data, &mut self.stderr.data]
            .into_iter()
            .chain(self.outputs.iter_mut().map(|f| &mut f.data));
        let mut parts = Vec::new();
        let mut sizes = Vec::new();
        for (target, data) in datas.enumerate() {
            let data = std::mem::take(data);
            sizes.push(data.len() as u64);
            for (index, chunk) in data.chunks(RESULT_PART_BYTES).enumerate() {
                parts.push(ResultPart {
                    job: self.job.clone(),
                    task: self.task,
                    run,
                    target: target as u32,
                    offset: (index * RESULT_PART_BYTES) as u64,
                    data: chunk.to_vec(),
                });
            }
        }
        self.parted = Some(Parted { run, sizes });
        (parts, self)
    }
}

/// Bytes of captured output a message of results holds at most (a run
/// with more goes in parts): with the runner's prefetch, what a job's
/// results can make it hold at once.
pub const RESULT_MESSAGE_BYTES: usize = 1 << 20;
/// Bytes of one [`ResultPart`].
pub const RESULT_PART_BYTES: usize = 1 << 20;
/// The most output one parted run may declare: what the launcher's
/// largest limits allow, with room.
pub const MAX_PARTED_BYTES: u64 = 1 << 30;
/// Output files one run sends back at most.
pub const MAX_OUTPUT_FILES: usize = 1000;
/// Targets of a parted run at most: the two streams and the output files.
pub const MAX_PARTED_TARGETS: usize = 2 + MAX_OUTPUT_FILES;
/// The largest message of results a launcher sends: its output is at most
/// [`RESULT_MESSAGE_BYTES`], and the rest (paths of up to
/// [`MAX_OUTPUT_FILES`] files, errors) well within the remainder.
pub const MAX_RESULTS_MESSAGE_BYTES: usize = 8 << 20;

/// The largest message a gleaner component sends, and the broker's own
/// `max_message_size` (`deploy/rabbitmq/50-gleaner.conf`): a consumer
/// holds at most its prefetch times this.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Where a parted run's data went: a run id, and the bytes of each
/// target (stdout, stderr, then the output files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parted {
    pub run: u64,
    pub sizes: Vec<u64>,
}

/// A piece of a parted run's output, sent ahead of its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultPart {
    pub job: JobId,
    pub task: u64,
    pub run: u64,
    /// 0 stdout, 1 stderr, then the output files in order.
    pub target: u32,
    pub offset: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

impl Message for ResultMsg {
    fn kind(&self) -> &'static str {
        "result"
    }
}

/// Results of a launcher's runs that ended about together, as one message:
/// one publish, one confirm, one delivery and one ack for all of them.
/// Or a part of a run's output, which comes alone.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ResultBatch {
    pub results: Vec<ResultMsg>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part: Option<ResultPart>,
}

impl<'de> Deserialize<'de> for ResultBatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Many {
                results: Vec<ResultMsg>,
                #[serde(default)]
                part: Option<ResultPart>,
            },
            One(Box<ResultMsg>),
        }
        Ok(match Either::deserialize(d)? {
            Either::Many { results, part } => Self { results, part },
            Either::One(one) => Self {
                results: vec![*one],
                part: None,
            },
        })
    }
}

impl Message for ResultBatch {
    fn kind(&self) -> &'static str {
        "results"
    }
}

/// A captured stream: its last bytes, and how many earlier ones were dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Captured {
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    pub dropped: u64,
}

/// A declared output file collected from the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    /// Relative to the sandbox.
    pub path: String,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Bytes beyond the size limit that were not kept.
    pub dropped: u64,
}
