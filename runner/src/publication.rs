//! Publication of a sweep's tasks: messages made from the manifest when
//! they are needed ([`TaskMaker`]), first attempts on their way to the
//! task queue a chunk at a time ([`FirstAttempts`]), and what `job.json`
//! may say once they are all with the broker ([`Publication`]).

use std::sync::Arc;

use gleaner_manifest::{JobId, Manifest, TaskList, TaskShape, TaskSpec, is_param_name};
use gleaner_protocol::{TaskBundle, TaskMsg};

/// Makes task messages when they are needed: a sweep can have millions of
/// tasks, too many to hold as messages at once.
#[derive(Debug, Clone)]
pub(crate) struct TaskMaker {
    job: JobId,
    /// The manifest's tasks, then each addition's, by their first number.
    tasks: Vec<(u64, Arc<TaskList>)>,
    /// The final step's number (one past the tasks) and its command.
    final_step: Option<(u64, String)>,
    /// The final step's shape, where it has one of its own.
    final_shape: Option<TaskShape>,
    /// `GLEANER_RESULTS` of the final step.
    results: String,
    env: Vec<(String, String)>,
    walltime_ms: Option<u64>,
    outputs: Vec<String>,
    workdir: Option<String>,
    preempt_signal: Option<String>,
    preempt_grace_ms: Option<u64>,
    max_attempts: u32,
    /// First attempts per message (the manifest's `bundle`).
    bundle: usize,
}

impl TaskMaker {
    pub(crate) fn new(job: JobId, manifest: &Manifest, tasks: TaskList, results: String) -> Self {
        Self {
            job,
            final_step: manifest
                .final_step
                .as_ref()
                .map(|f| (tasks.len(), f.command.clone())),
            final_shape: manifest.final_shape(),
            tasks: vec![(0, Arc::new(tasks))],
            results,
            env: manifest
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            walltime_ms: manifest.walltime.map(|w| w.as_millis() as u64),
            outputs: manifest.outputs.clone(),
            workdir: manifest.workdir.as_ref().map(|w| w.display().to_string()),
            preempt_grace_ms: manifest.preempt_grace.map(|g| g.as_millis() as u64),
            max_attempts: manifest.max_attempts,
            bundle: manifest.bundle.max(1) as usize,
            preempt_signal: manifest.preempt_grace.map(|_| {
                manifest
                    .preempt_signal
                    .clone()
                    .unwrap_or_else(|| "TERM".to_owned())
            }),
        }
    }

    /// One past the last task's number.
    pub(crate) fn len(&self) -> u64 {
        self.tasks
            .last()
            .map_or(0, |(first, list)| first + list.len())
    }

    /// The same with `added` numbered from `first`, after the last task;
    /// the final step moves behind them.
    pub(crate) fn with(&self, first: u64, added: TaskList) -> Self {
        let mut maker = self.clone();
        maker.tasks.push((first, Arc::new(added)));
        let end = maker.len();
        if let Some((number, _)) = maker.final_step.as_mut() {
            *number = end;
        }
        maker
    }

    pub(crate) fn spec(&self, task: u64) -> Option<TaskSpec> {
        let (first, list) = self.tasks.iter().rev().find(|(first, _)| *first <= task)?;
        list.get(task - first)
    }

    pub(crate) fn msg(&self, task: u64, attempt: u32, preemptions: u32) -> Option<TaskMsg> {
        let mut env = self.env.clone();
        let mut shape = None;
        let command = match &self.final_step {
            Some((number, command)) if *number == task => {
                env.push(("GLEANER_RESULTS".to_owned(), self.results.clone()));
                env.push(("GLEANER_FINAL".to_owned(), "1".to_owned()));
                shape = self.final_shape;
                command.clone()
            }
            _ => {
                let spec = self.spec(task)?;
                // Each parameter as GLEANER_PARAM_<name> too: a value with
                // spaces or quotes reaches the task intact through
                // "$GLEANER_PARAM_x".
                env.extend(
                    spec.params
                        .iter()
                        .filter(|(name, _)| is_param_name(name))
                        .map(|(name, value)| (format!("GLEANER_PARAM_{name}"), value.to_string())),
                );
                spec.command
            }
        };
        Some(TaskMsg {
            job: self.job.clone(),
            task,
            attempt,
            preemptions,
            command,
            env,
            walltime_ms: self.walltime_ms,
            outputs: self.outputs.clone(),
            workdir: self.workdir.clone(),
            preempt_signal: self.preempt_signal.clone(),
            preempt_grace_ms: self.preempt_grace_ms,
            max_attempts: self.max_attempts,
            shape,
        })
    }
}

/// What `job.json` may say once a publication is all with the broker: a
/// runner that takes over publishes again what it may not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Publication {
    /// Every task the job had when it started.
    pub all_tasks: bool,
    /// The additions (of an open job) so far.
    pub additions: u32,
}

/// First attempts of tasks, made as they are published.
#[derive(Debug)]
pub struct FirstAttempts {
    maker: Arc<TaskMaker>,
    tasks: Vec<u64>,
    completes: Publication,
}

impl FirstAttempts {
    pub(crate) fn new(maker: Arc<TaskMaker>, tasks: Vec<u64>, completes: Publication) -> Self {
        Self {
            maker,
            tasks,
            completes,
        }
    }

    pub fn tasks(&self) -> &[u64] {
        &self.tasks
    }

    pub fn completes(&self) -> Publication {
        self.completes
    }

    /// Every message's tasks, one by one (as the simulator's queue holds them).
    pub fn each(&self) -> impl Iterator<Item = TaskMsg> + '_ {
        self.tasks
            .iter()
            .filter_map(|&task| self.maker.msg(task, 1, 0))
    }

    /// Tasks in a chunk of about `size`: whole bundles.
    fn chunk_len(&self, size: usize) -> usize {
        let bundle = self.maker.bundle.max(1);
        size.max(1).div_ceil(bundle) * bundle
    }

    /// How many chunks of about `size` tasks the messages make.
    pub fn chunk_count(&self, size: usize) -> usize {
        self.tasks.len().div_ceil(self.chunk_len(size))
    }

    /// The messages of chunk `index`, about `size` tasks at a time, in
    /// bundles of the manifest's `bundle`.
    pub fn chunk(&self, index: usize, size: usize) -> Vec<TaskBundle> {
        let len = self.chunk_len(size);
        let start = index.saturating_mul(len).min(self.tasks.len());
        let end = start.saturating_add(len).min(self.tasks.len());
        self.tasks[start..end]
            .chunks(self.maker.bundle.max(1))
            .map(|bundle| TaskBundle {
                tasks: bundle
                    .iter()
                    .filter_map(|&task| self.maker.msg(task, 1, 0))
                    .collect(),
            })
            .filter(|bundle| !bundle.tasks.is_empty())
            .collect()
    }
}
