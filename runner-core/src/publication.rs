//! Publication of a sweep's tasks: messages made from the manifest when
//! they are needed ([`TaskMaker`]), how far ahead of the launchers first
//! attempts are published and in bundles of what size ([`Feed`]), first
//! attempts on their way to the task queue a chunk at a time
//! ([`FirstAttempts`]), and what `job.json` may say once they are with the
//! broker ([`Publication`]).

use std::{sync::Arc, time::Duration};

use gleaner_manifest::{JobId, MAX_BUNDLE, Manifest, TaskList, TaskShape, TaskSpec, is_param_name};
use gleaner_protocol::{BUNDLE_BYTES, TaskBundle, TaskMsg};

use crate::book::TaskBook;

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
    /// Tasks per message.
    pub bundle: u32,
}

/// First attempts of tasks, made as they are published.
#[derive(Debug)]
pub struct FirstAttempts {
    maker: Arc<TaskMaker>,
    tasks: Vec<u64>,
    /// Tasks per message.
    bundle: usize,
    completes: Publication,
}

impl FirstAttempts {
    pub(crate) fn new(
        maker: Arc<TaskMaker>,
        tasks: Vec<u64>,
        bundle: usize,
        completes: Publication,
    ) -> Self {
        Self {
            maker,
            tasks,
            bundle: bundle.max(1),
            completes,
        }
    }

    pub fn tasks(&self) -> &[u64] {
        &self.tasks
    }

    /// Tasks per message.
    pub fn bundle(&self) -> usize {
        self.bundle
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
        size.max(1).div_ceil(self.bundle) * self.bundle
    }

    /// How many chunks of about `size` tasks the messages make.
    pub fn chunk_count(&self, size: usize) -> usize {
        self.tasks.len().div_ceil(self.chunk_len(size))
    }

    /// The messages of chunk `index`, about `size` tasks at a time, in
    /// bundles.
    pub fn chunk(&self, index: usize, size: usize) -> Vec<TaskBundle> {
        let len = self.chunk_len(size);
        let start = index.saturating_mul(len).min(self.tasks.len());
        let end = start.saturating_add(len).min(self.tasks.len());
        let mut bundles = Vec::new();
        let mut bundle = TaskBundle { tasks: Vec::new() };
        let mut weight = 0;
        for msg in self.tasks[start..end]
            .iter()
            .filter_map(|&task| self.maker.msg(task, 1, 0))
        {
            let full = bundle.tasks.len() == self.bundle
                || weight + msg.weight() > BUNDLE_BYTES && !bundle.tasks.is_empty();
            if full {
                bundles.push(std::mem::replace(
                    &mut bundle,
                    TaskBundle { tasks: Vec::new() },
                ));
                weight = 0;
            }
            weight += msg.weight();
            bundle.tasks.push(msg);
        }
        if !bundle.tasks.is_empty() {
            bundles.push(bundle);
        }
        bundles
    }
}

/// Work ahead of the launchers, at the rate they take it: the broker holds
/// what is in flight, not the sweep.
const AHEAD: Duration = Duration::from_secs(5);
/// The fewest tasks ahead: a job's first launchers find work at once.
const MIN_AHEAD: u64 = 1000;
/// The fewest ahead before any run time is measured: these go one to a
/// message, so they are few.
const UNMEASURED_AHEAD: u64 = 100;
/// Messages ahead per slot held: a launcher prefetches up to 8 per slot.
const MESSAGES_PER_SLOT: u64 = 10;
/// What a bundle's tasks should take together: short tasks pay the broker a
/// message per tenth of a second of work, and a launcher killed outright
/// loses no more than that per slot.
const BUNDLE_WORK_MS: f64 = 100.0;
/// Bundles at the end of a sweep: each slot gets at least this many of the
/// messages still to publish, so that the last ones end together.
const TAIL_MESSAGES_PER_SLOT: u64 = 4;

/// What the launchers take, as the runner sees it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Uptake {
    /// Slots held by launchers that are not leaving.
    pub slots: u32,
    /// Tasks finished per second, recently.
    pub per_second: f64,
}

/// The cursor of first attempts: tasks are published in order, a window
/// ahead of the launchers sized by Little's law from the rate they finish
/// (at least enough for every slot's prefetch), in bundles sized from the
/// run times measured so far (unless the manifest pins `bundle`).
///
/// Invariant: `ahead` counts the unfinished tasks below `next`, each with
/// the broker or running (or published by a runner before this one).
#[derive(Debug)]
pub(crate) struct Feed {
    next: u64,
    ahead: u64,
    /// Where the last publication left the cursor: a publication of no
    /// tasks still tells `job.json` how far publication got.
    announced: Option<u64>,
    pinned: Option<usize>,
    /// Smoothed run time of the tasks' runs, in ms.
    runtime_ms: Option<f64>,
}

impl Feed {
    pub(crate) fn new(pinned: Option<u32>) -> Self {
        Self {
            next: 0,
            ahead: 0,
            announced: None,
            pinned: pinned.map(|b| b.max(1) as usize),
            runtime_ms: None,
        }
    }

    /// Goes on from `from`: every unfinished task below it is taken to be
    /// with the broker already, and `job.json` says so if `recorded`.
    pub(crate) fn resume(
        &mut self,
        book: &TaskBook,
        from: u64,
        final_task: Option<u64>,
        recorded: bool,
    ) {
        self.next = from;
        self.announced = recorded.then_some(from);
        let final_below = final_task.is_some_and(|t| t < from && !book.is_finished(t));
        self.ahead = book.unfinished_below(from) - u64::from(final_below);
    }

    /// The next task the cursor looks at.
    pub(crate) fn next(&self) -> u64 {
        self.next
    }

    /// Tasks published and not finished.
    pub(crate) fn ahead(&self) -> u64 {
        self.ahead
    }

    /// `task` has just got its final state.
    pub(crate) fn finished(&mut self, task: u64) {
        if task < self.next {
            self.ahead = self.ahead.saturating_sub(1);
        }
    }

    /// A run that took `runtime_ms`.
    pub(crate) fn observe(&mut self, runtime_ms: u64) {
        let runtime = runtime_ms as f64;
        self.runtime_ms = Some(match self.runtime_ms {
            Some(mean) => 0.9 * mean + 0.1 * runtime,
            None => runtime,
        });
    }

    /// Tasks per message for the next publication, `left` tasks still to
    /// publish.
    pub(crate) fn bundle(&self, left: u64, uptake: Uptake) -> usize {
        if let Some(pinned) = self.pinned {
            return pinned;
        }
        let Some(runtime) = self.runtime_ms else {
            return 1;
        };
        let measured = (BUNDLE_WORK_MS / runtime.max(1.0)).floor() as u64;
        let tail = left / (u64::from(uptake.slots.max(1)) * TAIL_MESSAGES_PER_SLOT);
        measured.min(tail).clamp(1, u64::from(MAX_BUNDLE)) as usize
    }

    /// Tasks to hold ahead of the launchers; until run times are measured
    /// (and bundles can be sized) only what the slots prefetch.
    pub(crate) fn window(&self, bundle: usize, uptake: Uptake) -> u64 {
        let prefetch = u64::from(uptake.slots) * MESSAGES_PER_SLOT * bundle as u64;
        let little = (uptake.per_second * AHEAD.as_secs_f64()).ceil() as u64;
        let least = match self.pinned.is_none() && self.runtime_ms.is_none() {
            true => UNMEASURED_AHEAD,
            false => MIN_AHEAD,
        };
        least.max(prefetch).max(little)
    }

    /// The next tasks to publish, below `end` (the final step's number, or
    /// one past the last task), and their bundle size: none while at least
    /// three quarters of the window is ahead, so that publications are few
    /// and large; no tasks once at the end, announced once.
    pub(crate) fn top_up(
        &mut self,
        book: &TaskBook,
        end: u64,
        uptake: Uptake,
    ) -> Option<(Vec<u64>, usize)> {
        let bundle = self.bundle(end.saturating_sub(self.next), uptake);
        let window = self.window(bundle, uptake);
        if self.next >= end {
            if self.announced == Some(self.next) {
                return None;
            }
            self.announced = Some(self.next);
            return Some((Vec::new(), bundle));
        }
        if self.ahead.saturating_mul(4) >= window.saturating_mul(3) {
            return None;
        }
        let mut tasks = Vec::new();
        let wanted = window - self.ahead;
        while (tasks.len() as u64) < wanted {
            match book.next_unfinished(self.next).filter(|&t| t < end) {
                Some(task) => {
                    tasks.push(task);
                    self.next = task + 1;
                }
                None => {
                    self.next = end;
                    break;
                }
            }
        }
        self.ahead += tasks.len() as u64;
        self.announced = Some(self.next);
        Some((tasks, bundle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::book::FinalStatus;

    const IDLE: Uptake = Uptake {
        slots: 0,
        per_second: 0.0,
    };

    #[test]
    fn a_big_sweep_is_published_a_window_at_a_time() {
        let book = TaskBook::new(1_000_000, 1);
        let mut unmeasured = Feed::new(None);
        let (first, _) = unmeasured.top_up(&book, 1_000_000, IDLE).unwrap();
        assert_eq!(first.len() as u64, UNMEASURED_AHEAD, "before any run time");
        let mut feed = Feed::new(None);
        feed.observe(1500);
        let (first, bundle) = feed.top_up(&book, 1_000_000, IDLE).unwrap();
        assert_eq!((first.len() as u64, bundle), (MIN_AHEAD, 1));
        assert_eq!(first[..3], [0, 1, 2]);
        assert!(
            feed.top_up(&book, 1_000_000, IDLE).is_none(),
            "the window is full"
        );
        for task in 0..100 {
            feed.finished(task);
        }
        assert!(
            feed.top_up(&book, 1_000_000, IDLE).is_none(),
            "a quarter is not yet free"
        );
        for task in 100..300 {
            feed.finished(task);
        }
        let (more, _) = feed.top_up(&book, 1_000_000, IDLE).unwrap();
        assert_eq!(more.len(), 300);
        assert_eq!(more[0], 1000);
        assert_eq!(feed.ahead(), MIN_AHEAD);
    }

    #[test]
    fn the_window_follows_the_rate_and_the_slots() {
        let feed = Feed::new(None);
        let busy = Uptake {
            slots: 8,
            per_second: 5000.0,
        };
        assert_eq!(feed.window(1, busy), 25_000);
        let wide = Uptake {
            slots: 500,
            per_second: 10.0,
        };
        assert_eq!(feed.window(2, wide), 10_000);
    }

    #[test]
    fn bundles_grow_from_measured_run_times_unless_pinned() {
        let uptake = Uptake {
            slots: 8,
            per_second: 0.0,
        };
        let mut feed = Feed::new(None);
        assert_eq!(feed.bundle(1_000_000, uptake), 1, "nothing measured yet");
        feed.observe(2);
        assert_eq!(feed.bundle(1_000_000, uptake), 50);
        feed.observe(2_000);
        assert_eq!(
            feed.bundle(1_000_000, uptake),
            1,
            "one slow run: one task a message"
        );
        let mut fast = Feed::new(None);
        fast.observe(0);
        assert_eq!(fast.bundle(1_000_000, uptake), 100);
        assert_eq!(
            fast.bundle(320, uptake),
            10,
            "the tail is spread over the slots"
        );
        assert_eq!(Feed::new(Some(7)).bundle(10, uptake), 7);
    }

    #[test]
    fn finished_tasks_are_skipped_and_a_resumed_feed_counts_what_is_out() {
        let mut book = TaskBook::new(3000, 1);
        for task in (0..3000).filter(|t| t % 3 != 0) {
            book.finish(task, FinalStatus::Succeeded);
        }
        let mut feed = Feed::new(None);
        feed.observe(1500);
        feed.resume(&book, 1500, None, false);
        assert_eq!(feed.ahead(), 500);
        let (tasks, _) = feed.top_up(&book, 3000, IDLE).unwrap();
        assert_eq!(tasks.len(), 500);
        assert!(tasks.iter().all(|t| t % 3 == 0 && *t >= 1500));
        assert!(
            feed.top_up(&book, 3000, IDLE).is_none(),
            "the window is full"
        );
        feed.finished(3);
        assert_eq!(feed.ahead(), 999);
    }
}
