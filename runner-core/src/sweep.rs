//! The core of a scavenging job (a sweep): its tasks wait on the job's task
//! queue, and launchers on idle slots of any cluster pull them.
//!
//! It decides how many offered slots to accept (as many as unfinished work
//! can keep busy), which launchers give slots back on a shrink (idle ones
//! first, then those that would lose least work, a task preempted
//! `max_preemptions` times last; a shrink the cluster's
//! launchers cannot cover yet is owed, and applied as the next launcher
//! there comes up), which silent launchers to poll or forget, and what each
//! result means: recorded exactly once, retried up to `max_attempts`.
//! No I/O here: the shell (`job.rs`) applies the effects.

use std::{
    collections::{BTreeSet, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use gleaner_manifest::{Addition, FinalWhen, MAX_TASKS, TaskList};
use gleaner_policy::{preempt, share};
use gleaner_protocol::{
    ActionReply, ClusterName, ControlMsg, FOLLOW_LEASE_MS, GrantId, JobReport, JobState, KcmMsg,
    LauncherInfo, LauncherMsg, OutputPiece, ResultMsg, SchedulerMsg, ShrinkMode, StreamPiece,
    TaskMsg, naming::same_host,
};
use tracing::{debug, info, warn};

use crate::{
    book::{FinalStatus, Verdict},
    effect::{Effect, Followup, Now},
    follow::{Followers, MOST_ASKED, MOST_FOLLOWS},
    job::{
        Job, JobSettings, Kind, Ledger, Opening, Refusal, THROUGHPUT_WINDOW, cancel, index_entry,
    },
    launchers::LauncherTable,
    publication::{Feed, FirstAttempts, Publication, TaskMaker, Uptake},
    records::{AddedTasks, FinalOutcome, IndexEntry},
    returns::{DeadLetter, Judgement, Returns},
};

/// The slowest launcher heartbeat a dead letter waits for.
const SLOWEST_HEARTBEAT: Duration = Duration::from_secs(600);

/// How long an unfulfilled shrink waits for launchers to stop; the
/// scheduler decides afresh after that.
const OWED_SHRINK_LIFETIME: Duration = Duration::from_secs(30);

/// A shrink that found too few launchers to stop: the launchers still on
/// their way (placeholders starting) are stopped as they announce themselves.
#[derive(Debug, Clone)]
struct OwedShrink {
    order: ShrinkOrder,
    since: Instant,
}

/// A shrink as the runner carries it out.
#[derive(Debug, Clone)]
struct ShrinkOrder {
    cluster: ClusterName,
    slots: u32,
    mode: ShrinkMode,
    reason: String,
    /// Launchers on these hosts only; any host when empty.
    hosts: Vec<String>,
}

impl ShrinkOrder {
    /// Whether a launcher that came up could serve this order.
    fn covers(&self, info: &LauncherInfo) -> bool {
        self.cluster == info.cluster
            && (self.hosts.is_empty() || self.hosts.iter().any(|h| same_host(h, &info.host)))
    }
}

/// An open job's additions as recorded, with their tasks: only an open
/// job's, each numbered right after the one before (the file is in the
/// owner's directory, so it is checked, not trusted), within `MAX_TASKS`.
fn recorded_additions(open: bool, recorded: &[AddedTasks], base: u64) -> Vec<(u64, u64, TaskList)> {
    let mut added = Vec::new();
    if !open {
        if !recorded.is_empty() {
            warn!("additions recorded for a job that is not open ignored");
        }
        return added;
    }
    let mut next = base;
    for record in recorded {
        let list = match record.addition.task_list() {
            Ok(list) if record.first == next && next.saturating_add(list.len()) <= MAX_TASKS => {
                list
            }
            _ => {
                warn!(
                    first = record.first,
                    expected = next,
                    "additions.jsonl does not follow from the job's tasks; the rest of it is ignored"
                );
                break;
            }
        };
        next += list.len();
        added.push((record.addition.id, record.first, list));
    }
    added
}

/// The kind of a scavenging job: its tasks as the manifest and additions
/// make them, its launchers, and what it owes a shrink.
#[derive(Debug)]
pub struct Sweep {
    tasks: Arc<TaskMaker>,
    /// First attempts published so far, and how the next are bundled.
    feed: Feed,
    /// An open job's additions so far, in order: their ids (an addition
    /// that arrives twice is added once) and their tasks' numbers.
    additions: Vec<(u64, std::ops::Range<u64>)>,
    launchers: LauncherTable,
    /// Who follows which task's output.
    followers: Followers,
    owed: Vec<OwedShrink>,
    /// When recent tasks finished, for the throughput figure.
    recent: VecDeque<Instant>,
    /// When an open job last had news (its start here, an addition, a
    /// task that ended): one idle for `open_idle` is closed.
    last_news: Instant,
    /// Shrinks carried out so far: each random choice of launchers draws
    /// from a seed of its own.
    shrinks: u64,
    /// Launchers given up for their silence: gone when polled, or silent
    /// too long (KOALA-CS's launcher time-outs).
    timeouts: u64,
    /// Dead-lettered tasks: lost to their launchers' deaths, or only
    /// returned by the broker.
    returns: Returns,
}

impl Sweep {
    pub fn open(opening: Opening<'_>, tasks: TaskList, now: Now) -> Result<Job<Self>, Refusal> {
        let open = opening.submission.manifest.open;
        let added = recorded_additions(open, &opening.additions, tasks.len());
        let total = added
            .last()
            .map_or(tasks.len(), |(_, first, list)| first + list.len());
        let ledger = Ledger::open(opening, total, now)?;
        // The final step runs elsewhere, in a sandbox of its own.
        let results = std::path::absolute(&ledger.file().results)
            .unwrap_or_else(|_| ledger.file().results.clone().into())
            .display()
            .to_string();
        let mut maker = TaskMaker::new(ledger.id().clone(), ledger.manifest(), tasks, results);
        let mut additions = Vec::new();
        for (id, first, list) in added {
            additions.push((id, first..first + list.len()));
            maker = maker.with(first, list);
        }
        let sweep = Self {
            tasks: Arc::new(maker),
            feed: Feed::new(ledger.manifest().bundle),
            additions,
            launchers: LauncherTable::default(),
            followers: Followers::default(),
            owed: Vec::new(),
            recent: VecDeque::new(),
            last_news: now.instant,
            shrinks: 0,
            timeouts: 0,
            returns: Returns::default(),
        };
        Ok(Job::new(ledger, sweep))
    }

    /// Launchers given up so far because their heartbeats stopped.
    pub fn launcher_timeouts(&self) -> u64 {
        self.timeouts
    }

    /// The launchers' slots and the rate they finish tasks at.
    fn uptake(&self, now: Instant) -> Uptake {
        let span = self.recent.front().map_or(Duration::ZERO, |first| {
            now.saturating_duration_since(*first)
        });
        let span = span.clamp(Duration::from_secs(1), THROUGHPUT_WINDOW);
        Uptake {
            slots: self.launchers.total_slots(),
            per_second: self.recent.len() as f64 / span.as_secs_f64(),
        }
    }

    /// Publishes the next first attempts while the job runs and too few are
    /// ahead of the launchers; `job.json` hears how far publication got
    /// once they are with the broker.
    fn top_up(&mut self, ledger: &Ledger, uptake: Uptake) -> Option<Effect> {
        if ledger.file().state != JobState::Running {
            return None;
        }
        let end = self.tasks.len();
        let (tasks, bundle) = self.feed.top_up(ledger.book(), end, uptake)?;
        let next = self.feed.next();
        let base = self.additions.first().map_or(end, |(_, tasks)| tasks.start);
        let completes = Publication {
            all_tasks: next >= base,
            additions: self
                .additions
                .iter()
                .take_while(|(_, tasks)| tasks.end <= next)
                .count() as u32,
            bundle: u32::try_from(bundle).unwrap_or(u32::MAX),
        };
        debug!(
            tasks = tasks.len(),
            bundle,
            ahead = self.feed.ahead(),
            "publishing ahead of the launchers"
        );
        Some(Effect::PublishFirst(FirstAttempts::new(
            self.tasks.clone(),
            tasks,
            bundle,
            completes,
        )))
    }

    /// Closes an open job that has had nothing to do for `open_idle`: it
    /// holds one of its runner's jobs, which an owner could otherwise
    /// keep by the dozen doing nothing.
    fn close_idle(&mut self, ledger: &mut Ledger, now: Now) -> Vec<Effect> {
        let idle = now.instant.saturating_duration_since(self.last_news);
        if !ledger.takes_tasks()
            || ledger.counts().unfinished() > 0
            || idle < ledger.settings().open_idle
        {
            return Vec::new();
        }
        info!(
            idle_s = idle.as_secs(),
            "an open job with nothing to do for open_idle is closed"
        );
        self.close(ledger)
    }

    /// Publishes the final step once every task has a final state (or,
    /// when it runs only after success and a task failed, skips it).
    fn final_step_due(&mut self, ledger: &mut Ledger) -> Vec<Effect> {
        let (Some(task), Some(step)) = (ledger.final_task(), ledger.manifest().final_step.as_ref())
        else {
            return Vec::new();
        };
        // The final step is unfinished here: any other unfinished task
        // makes two.
        if ledger.file().final_published
            || ledger.takes_tasks()
            || ledger.book().is_finished(task)
            || ledger.book().counts().unfinished() > 1
        {
            return Vec::new();
        }
        let counts = ledger.counts();
        if step.when == FinalWhen::AllSucceeded && counts.succeeded < counts.total {
            info!(
                succeeded = counts.succeeded,
                total = counts.total,
                "final step skipped: not every task succeeded"
            );
            ledger.finish_final(FinalOutcome::skipped());
            return vec![Effect::SaveJobFile];
        }
        info!("every task ended: final step published");
        ledger.final_published();
        vec![
            Effect::Publish(self.tasks.msg(task, 1, 0).into_iter().collect()),
            Effect::SaveJobFile,
        ]
    }

    /// Tasks added to an open job: recorded before the message is acked;
    /// the feed publishes them after the rest, and `job.json` counts them
    /// as published once they are.
    fn add_tasks(&mut self, ledger: &mut Ledger, addition: Addition) -> Vec<Effect> {
        let refuse = |reason: String| {
            warn!(addition = addition.id, reason, "tasks not added");
            vec![Effect::Answer(ActionReply::Refused { reason })]
        };
        if self.additions.iter().any(|(id, _)| *id == addition.id) {
            info!(
                addition = addition.id,
                "the same addition came again: added once"
            );
            return vec![Effect::Answer(ActionReply::Accepted {})];
        }
        if ledger.file().state == JobState::Cancelled {
            return refuse("the job was cancelled".to_owned());
        }
        if !ledger.takes_tasks() {
            return refuse("the job was closed, or is not open".to_owned());
        }
        let list = match addition.task_list() {
            Ok(list) => list,
            Err(e) => return refuse(format!("the tasks are not valid: {e}")),
        };
        let (first, count) = (self.tasks.len(), list.len());
        if first + count > MAX_TASKS {
            return refuse(format!(
                "the job would have more than {MAX_TASKS} tasks ({first} and {count} more)"
            ));
        }
        // Checked alone at its sender's; here with what every task of
        // this job carries (its environment, outputs, directory).
        if let Err(e) = ledger.manifest().check_task_bytes(&list, first) {
            return refuse(format!("the tasks are not valid: {e}"));
        }
        info!(first, count, "tasks added");
        self.tasks = Arc::new(self.tasks.with(first, list));
        ledger.add_tasks(count);
        self.additions.push((addition.id, first..first + count));
        vec![
            Effect::RecordAddition(Box::new(AddedTasks { first, addition })),
            Effect::Answer(ActionReply::Accepted {}),
            Effect::Report,
        ]
    }

    /// `gleaner logs --follow`: `reply_to` follows `task`'s output, and
    /// the launchers that may run it are asked to send it (again once
    /// half their follow has passed; at most [`MOST_ASKED`] of them). A
    /// task that ended has its output in the results; one not published
    /// yet runs nowhere (its follower renews until it does).
    fn follow(
        &mut self,
        ledger: &Ledger,
        task: u64,
        reply_to: Option<String>,
        now: Now,
    ) -> Vec<Effect> {
        let Some(to) = reply_to else {
            return Vec::new();
        };
        if ledger.final_task() == Some(task) {
            let reason =
                "the final step's output is in the job's final/ directory once it ends".to_owned();
            return vec![Effect::Answer(ActionReply::Refused { reason })];
        }
        if task >= self.tasks.len() {
            let reason = format!(
                "task {task} is not one of the job's: it has {} tasks, numbered from 0",
                self.tasks.len()
            );
            return vec![Effect::Answer(ActionReply::Refused { reason })];
        }
        if ledger.book().is_finished(task) {
            // Its output is in the results; the follower hears it ended
            // (it may be where the results are not).
            let ended = OutputPiece {
                task,
                attempt: 0,
                preemptions: 0,
                launcher: String::new(),
                stdout: StreamPiece::default(),
                stderr: StreamPiece::default(),
                ended: true,
            };
            return vec![Effect::Relay {
                to: vec![to],
                piece: Box::new(ended),
            }];
        }
        if !self.followers.follow(task, to, now.instant) {
            let reason = format!(
                "the job's tasks are followed {MOST_FOLLOWS} times already; try again later"
            );
            return vec![Effect::Answer(ActionReply::Refused { reason })];
        }
        // Not published yet, it runs nowhere; asked lately, the launchers
        // follow it still.
        if task >= self.feed.next() || !self.followers.ask_due(task, now.instant) {
            return Vec::new();
        }
        self.launchers
            .may_run(task)
            .into_iter()
            .take(MOST_ASKED)
            .map(|launcher| Effect::ToLauncher {
                launcher,
                msg: LauncherMsg::Follow {
                    task,
                    for_ms: FOLLOW_LEASE_MS,
                },
                followup: Followup::Nothing,
            })
            .collect()
    }

    /// A run of a followed task ended: the end of its output, from its
    /// result, goes to the followers before its index line is written.
    fn last_piece(&mut self, result: &ResultMsg, now: Instant) -> Option<Effect> {
        let to = self.followers.relay(result.task, true, now);
        (!to.is_empty()).then(|| Effect::Relay {
            to,
            piece: Box::new(OutputPiece {
                task: result.task,
                attempt: result.attempt,
                preemptions: result.preemptions,
                launcher: result.launcher.to_string(),
                stdout: StreamPiece::rest_of(&result.stdout),
                stderr: StreamPiece::rest_of(&result.stderr),
                ended: true,
            }),
        })
    }

    /// An open job takes no more tasks; it ends once those it has ended.
    fn close(&mut self, ledger: &mut Ledger) -> Vec<Effect> {
        if !ledger.takes_tasks() {
            return Vec::new();
        }
        info!("closed: it ends once its tasks have");
        ledger.close();
        let mut effects = vec![Effect::SaveJobFile];
        effects.extend(self.final_step_due(ledger));
        effects.push(Effect::Report);
        effects
    }

    /// A run of the final step: its outputs under `final/`, its end in
    /// `job.json`, or another attempt.
    fn on_final_result(
        &mut self,
        ledger: &mut Ledger,
        result: ResultMsg,
        retries: &mut Vec<TaskMsg>,
    ) -> Vec<Effect> {
        match ledger.judge(&result) {
            Verdict::Final(status) => {
                info!(status = status.name(), exit_code = ?result.exit_code, attempt = result.attempt, "final step ended");
                ledger.finish_final(FinalOutcome::of(status, Some(&result)));
                vec![
                    Effect::WriteFinalOutputs(Box::new(result)),
                    Effect::SaveJobFile,
                ]
            }
            Verdict::Retry { attempt } => {
                info!(attempt, status = ?result.status, exit_code = ?result.exit_code, "final step failed; retrying");
                retries.extend(self.tasks.msg(result.task, attempt, result.preemptions));
                vec![Effect::WriteFinalOutputs(Box::new(result))]
            }
            Verdict::Duplicate => Vec::new(),
        }
    }

    /// Accepts as many offered slots as there are tasks to keep them busy.
    fn grow(
        &mut self,
        ledger: &mut Ledger,
        grant: GrantId,
        cluster: ClusterName,
        slots: u32,
    ) -> Vec<Effect> {
        let job = ledger.id();
        let manifest = ledger.manifest();
        let shape = ledger.current_shape();
        let need = share::Need {
            unfinished: ledger.book().counts().unfinished(),
            task_slots: shape.slots,
            max_slots: manifest.max_launchers,
        };
        let accepted = share::accepted(slots, need, u64::from(self.launchers.total_slots()));
        let mut effects = vec![Effect::ToScheduler(SchedulerMsg::GrowAck {
            grant,
            job: job.clone(),
            cluster: cluster.clone(),
            accepted,
        })];
        if accepted > 0 {
            effects.push(Effect::ToKcm {
                cluster: cluster.clone(),
                msg: KcmMsg::StartLaunchers {
                    job: job.clone(),
                    grant,
                    slots: accepted,
                    task_slots: shape.slots,
                    task_needs: shape.needs,
                    owner: ledger.file().owner.clone(),
                    credentials: ledger.launcher_credentials().cloned(),
                },
                followup: Followup::Grow {
                    cluster,
                    grant,
                    slots: accepted,
                    offered: slots,
                },
            });
        }
        effects
    }

    /// Gives back slots on a cluster: idle launchers first, then those that
    /// lose least work, sparing tasks preempted often (or, where the
    /// settings say, a random set of them).
    fn shrink(&mut self, ledger: &mut Ledger, order: ShrinkOrder, now: Now) -> Vec<Effect> {
        self.shrinks += 1;
        let (victims, freed) = self.launchers.pick_victims(
            &order.cluster,
            order.slots,
            &order.hosts,
            now.wall_ms,
            ledger.manifest().max_preemptions,
            ledger.settings().victims.nth(self.shrinks),
        );
        info!(cluster = %order.cluster, slots = order.slots, mode = ?order.mode, reason = order.reason, hosts = ?order.hosts, launchers = ?victims, freed, "shrinking");
        if freed > order.slots {
            info!(cluster = %order.cluster, asked = order.slots, freed, "multi-slot launchers preempted whole: more slots freed than asked");
        }
        let (cluster, mode) = (order.cluster.clone(), order.mode);
        let message = preempt::order(mode, &order.reason);
        if freed < order.slots {
            self.owed.push(OwedShrink {
                order: ShrinkOrder {
                    slots: order.slots - freed,
                    ..order
                },
                since: now.instant,
            });
        }
        let mut effects: Vec<Effect> = victims
            .iter()
            .map(|launcher| Effect::ToLauncher {
                launcher: launcher.clone(),
                msg: message.clone(),
                followup: Followup::Leave {
                    launcher: launcher.clone(),
                },
            })
            .collect();
        if preempt::releases(mode, &victims) {
            effects.push(Effect::ToKcm {
                cluster: cluster.clone(),
                msg: KcmMsg::Release {
                    job: ledger.id().clone(),
                    launchers: victims,
                    grace_ms: ledger.settings().preempt_grace.as_millis() as u64,
                },
                followup: Followup::Nothing,
            });
        }
        effects
    }

    /// Forgets launchers silent for too long (three of their heartbeats and
    /// a margin, `JobSettings::silence_after`): they
    /// died or lost the broker, which gave their tasks to others. Their
    /// slots stop counting, so grows can replace them, and their kcms
    /// remove their placeholders at once, so that a launcher cut off does
    /// not hold its slots until the batch system's walltime.
    fn expire_silent(&mut self, ledger: &mut Ledger, now: Now) -> Vec<Effect> {
        let job = ledger.id();
        let expired = self
            .launchers
            .expire(now.instant, ledger.settings().launcher_heartbeat);
        self.timeouts += expired.values().map(|l| l.len() as u64).sum::<u64>();
        if !expired.is_empty() {
            self.returns.found_dead(now.instant);
        }
        expired
            .into_iter()
            .map(|(cluster, launchers)| {
                warn!(cluster = %cluster, launchers = ?launchers, "launchers silent too long: forgotten, their placeholders removed");
                Effect::ToKcm {
                    cluster,
                    msg: KcmMsg::Release {
                        job: job.clone(),
                        launchers,
                        grace_ms: 0,
                    },
                    followup: Followup::Nothing,
                }
            })
            .collect()
    }

    /// How long after a launcher's death the runner may notice it: a
    /// silence and a beat, of the slowest beat a launcher of the job said
    /// (up to [`SLOWEST_HEARTBEAT`]: a beat a task forged cannot hold its
    /// job's dead letters for ever).
    fn death_noticed_within(&self, ledger: &Ledger) -> Duration {
        let heartbeat = ledger.settings().launcher_heartbeat;
        let slowest = self.launchers.longest_heartbeat().unwrap_or(heartbeat);
        JobSettings::death_noticed_within(heartbeat.max(slowest).min(SLOWEST_HEARTBEAT))
    }

    /// What a dead-lettered task's judgement makes of it; its dead letter
    /// is acked after.
    fn judged(
        &mut self,
        ledger: &mut Ledger,
        task: TaskMsg,
        receipt: u64,
        judgement: Judgement,
    ) -> Vec<Effect> {
        let mut effects = match judgement {
            Judgement::Republish => {
                info!(
                    task = task.task,
                    attempt = task.attempt,
                    "task returned to its queue too often with no launcher leaving: published again"
                );
                vec![Effect::Publish(vec![task])]
            }
            Judgement::Lost => self.lost(ledger, &task, "its launchers died every time it ran"),
            Judgement::ReturnedTooOften => self.lost(
                ledger,
                &task,
                "returned to its queue again and again with no launcher leaving",
            ),
        };
        effects.push(Effect::SettleLost(receipt));
        effects
    }

    /// Judgements due: a task dead-lettered a while ago, with no death
    /// noticed around it, is published again.
    fn judge_returns(&mut self, ledger: &mut Ledger, now: Now) -> Vec<Effect> {
        let window = self.death_noticed_within(ledger);
        let judged = self.returns.due(now.instant, window);
        judged
            .into_iter()
            .flat_map(
                |(task, receipt, judgement)| match ledger.book().is_finished(task.task) {
                    true => vec![Effect::SettleLost(receipt)],
                    false => self.judged(ledger, task, receipt, judgement),
                },
            )
            .collect()
    }

    /// A task lost: its final state, recorded.
    fn lost(&mut self, ledger: &mut Ledger, task: &TaskMsg, why: &str) -> Vec<Effect> {
        if Some(task.task) == ledger.final_task() {
            warn!(attempt = task.attempt, "final step lost: {why}");
            let mut outcome = FinalOutcome::of(FinalStatus::Lost, None);
            outcome.attempts = task.attempt;
            ledger.finish_final(outcome);
            return vec![Effect::SaveJobFile];
        }
        warn!(task = task.task, attempt = task.attempt, "task lost: {why}");
        let mut entry = self.entry(ledger, task.task, FinalStatus::Lost, None);
        entry.attempts = task.attempt;
        entry.preemptions = task.preemptions;
        if ledger.finish(task.task, FinalStatus::Lost) {
            self.feed.finished(task.task);
        }
        let mut effects = vec![Effect::Record(vec![entry])];
        effects.extend(self.final_step_due(ledger));
        effects
    }
}

impl Kind for Sweep {
    /// Publishes, a window at a time, every task not yet published. A
    /// runner that took over mid-publication does not know which tasks the
    /// queue holds: it purges it and starts over from the first unfinished
    /// task (tasks in flight may run twice; the book records each once).
    fn start(&mut self, ledger: &mut Ledger) -> Vec<Effect> {
        ledger.take_over();
        let mut effects = Vec::new();
        let recorded = ledger.file().tasks_published;
        let from = if recorded {
            let counts = ledger.book().counts();
            info!(
                finished = counts.finished(),
                total = counts.total,
                "job resumed"
            );
            // Additions recorded but perhaps not all published.
            self.additions
                .get(ledger.file().additions_published as usize)
                .map_or(self.tasks.len(), |(_, tasks)| tasks.start)
        } else {
            effects.push(Effect::PurgeTasks);
            0
        };
        self.feed
            .resume(ledger.book(), from, ledger.final_task(), recorded);
        ledger.set_state(JobState::Running);
        effects.extend(self.top_up(ledger, Uptake::default()));
        effects.extend(self.final_step_due(ledger));
        effects.extend([Effect::SaveJobFile, Effect::Report]);
        effects
    }

    fn on_results(
        &mut self,
        ledger: &mut Ledger,
        batch: impl IntoIterator<Item = ResultMsg>,
        now: Now,
    ) -> Vec<Effect> {
        let job = ledger.id().clone();
        let mut effects = Vec::new();
        let mut retries = Vec::new();
        let mut entries = Vec::new();
        for result in batch {
            if result.job != job {
                warn!(other = %result.job, "result of another job ignored");
                continue;
            }
            if Some(result.task) == ledger.final_task() {
                effects.extend(self.on_final_result(ledger, result, &mut retries));
                continue;
            }
            let verdict = ledger.judge(&result);
            if verdict != Verdict::Duplicate {
                effects.extend(self.last_piece(&result, now.instant));
            }
            match verdict {
                Verdict::Final(status) => {
                    entries.push(self.entry(ledger, result.task, status, Some(&result)));
                    if ledger.finish(result.task, status) {
                        self.feed.finished(result.task);
                    }
                    self.feed.observe(result.runtime_ms);
                    ledger.count_preemptions(result.preemptions);
                    self.recent.push_back(now.instant);
                    self.last_news = now.instant;
                    debug!(task = result.task, ?status, "task finished");
                    effects.push(Effect::WriteOutputs(Box::new(result)));
                }
                Verdict::Retry { attempt } => {
                    info!(task = result.task, attempt, status = ?result.status, exit_code = ?result.exit_code, "task failed; retrying");
                    self.feed.observe(result.runtime_ms);
                    retries.extend(self.tasks.msg(result.task, attempt, result.preemptions));
                    effects.push(Effect::WriteRetried(Box::new(result)));
                }
                Verdict::Duplicate => {
                    debug!(
                        task = result.task,
                        attempt = result.attempt,
                        "duplicate result"
                    );
                }
            }
        }
        if !retries.is_empty() {
            effects.push(Effect::Publish(retries));
        }
        effects.push(Effect::Record(entries));
        let uptake = self.uptake(now.instant);
        effects.extend(self.top_up(ledger, uptake));
        // After the record: the final step sees every task's output.
        effects.extend(self.final_step_due(ledger));
        effects
    }

    fn on_lost(&mut self, ledger: &mut Ledger, letter: DeadLetter, now: Now) -> Vec<Effect> {
        let DeadLetter {
            bundle: lost,
            receipt,
            redelivered,
        } = letter;
        let mut unfinished: Vec<TaskMsg> = lost
            .tasks
            .iter()
            .filter(|task| task.job == *ledger.id() && !ledger.book().is_finished(task.task))
            .cloned()
            .collect();
        let mut effects = Vec::new();
        if lost.tasks.len() > 1 {
            // One of them may be what killed the launchers: alone, each
            // either runs or is lost by itself.
            if !unfinished.is_empty() {
                info!(
                    tasks = unfinished.len(),
                    "a bundle returned too often: its tasks run again alone"
                );
                effects.push(Effect::Publish(unfinished));
            }
        } else if let Some(task) = unfinished.pop() {
            let window = self.death_noticed_within(ledger);
            let letter = (task, receipt);
            if let Some((task, receipt, judgement)) =
                self.returns
                    .dead_lettered(letter, redelivered, now.instant, window)
            {
                return self.judged(ledger, task, receipt, judgement);
            }
            // Judged once a death would have been noticed.
            return Vec::new();
        }
        effects.push(Effect::SettleLost(receipt));
        effects
    }

    fn on_control(&mut self, ledger: &mut Ledger, msg: ControlMsg, now: Now) -> Vec<Effect> {
        let job = ledger.id().clone();
        match msg {
            ControlMsg::LauncherUp(info) => {
                debug!(launcher = %info.launcher, cluster = %info.cluster, host = %info.host, "launcher up");
                ledger.involve(info.cluster.clone());
                self.launchers.up(&info, now.instant);
                // Its kcm counts the start as a good one. Launchers reach
                // their own job's queues only, so the runner tells it.
                let mut effects = vec![Effect::ToKcm {
                    cluster: info.cluster.clone(),
                    msg: KcmMsg::LauncherUp {
                        job: job.clone(),
                        launcher: info.launcher.clone(),
                    },
                    followup: Followup::Nothing,
                }];
                if let Some(i) = self.owed.iter().position(|o| o.order.covers(&info)) {
                    let owed = self.owed.remove(i);
                    effects.extend(self.shrink(ledger, owed.order, now));
                }
                let uptake = self.uptake(now.instant);
                effects.extend(self.top_up(ledger, uptake));
                effects
            }
            ControlMsg::LauncherStatus(status) => {
                self.launchers.status(status, now.instant);
                Vec::new()
            }
            // Its kcm judges whether the GPUs are held outside gleaner.
            ControlMsg::GpusHeld(held) => {
                debug!(launcher = %held.launcher, cluster = %held.cluster, host = %held.host, gpus = ?held.devices, "launcher found its GPUs claimed");
                vec![Effect::ToKcm {
                    cluster: held.cluster.clone(),
                    msg: KcmMsg::GpusHeld { job, held },
                    followup: Followup::Nothing,
                }]
            }
            ControlMsg::LauncherGone {
                launcher, reason, ..
            } => {
                // A goodbye is an orderly end, never a task's doing.
                debug!(launcher = %launcher, reason, "launcher gone");
                self.launchers.gone(&launcher);
                Vec::new()
            }
            ControlMsg::GrowOffer {
                grant,
                cluster,
                slots,
            } => self.grow(ledger, grant, cluster, slots),
            ControlMsg::Shrink {
                cluster,
                slots,
                mode,
                reason,
                hosts,
            } => self.shrink(
                ledger,
                ShrinkOrder {
                    cluster,
                    slots,
                    mode,
                    reason,
                    hosts,
                },
                now,
            ),
            ControlMsg::Cancel { reason } => cancel(self, ledger, &reason),
            ControlMsg::AddTasks(addition) => {
                self.last_news = now.instant;
                let mut effects = self.add_tasks(ledger, addition);
                let uptake = self.uptake(now.instant);
                effects.extend(self.top_up(ledger, uptake));
                effects
            }
            ControlMsg::Close {} => self.close(ledger),
            ControlMsg::Follow { task, reply_to } => self.follow(ledger, task, reply_to, now),
            ControlMsg::Output(piece) if piece.is_bounded() && !piece.ended => {
                let to = self.followers.relay(piece.task, false, now.instant);
                match to.is_empty() {
                    true => Vec::new(),
                    false => vec![Effect::Relay {
                        to,
                        piece: Box::new(piece),
                    }],
                }
            }
            // A run's end comes from its result; a piece that says
            // otherwise, or is over the bound, is forged.
            ControlMsg::Output(_) => Vec::new(),
            ControlMsg::Place { .. } => {
                debug!("placement ignored: already placed, or not for this job");
                Vec::new()
            }
            ControlMsg::PlacementFailed { .. }
            | ControlMsg::ComponentEnded(_)
            | ControlMsg::ComponentWithdrawn { .. }
            | ControlMsg::ComponentStarted { .. }
            | ControlMsg::Move { .. }
            | ControlMsg::ComponentQueued { .. }
            | ControlMsg::StepAside { .. } => {
                debug!("grid job message ignored: this job is a sweep");
                Vec::new()
            }
        }
    }

    fn on_delivery(
        &mut self,
        ledger: &mut Ledger,
        followup: Followup,
        arrived: bool,
        now: Now,
    ) -> Vec<Effect> {
        match followup {
            Followup::Grow {
                cluster,
                grant,
                slots,
                offered,
            } => {
                if arrived {
                    info!(cluster = %cluster, grant = %grant, slots, offered, "grow accepted");
                    ledger.involve(cluster);
                } else {
                    warn!(cluster = %cluster, "no kcm queue for the cluster; grow dropped");
                }
            }
            // Its queue went with its connection: it left without a word.
            Followup::Leave { launcher } if !arrived => {
                if self.launchers.gone(&launcher) {
                    self.returns.found_dead(now.instant);
                }
            }
            Followup::Poll { launcher } if !arrived => {
                debug!(launcher = %launcher, "silent launcher is gone");
                if self.launchers.gone(&launcher) {
                    self.timeouts += 1;
                    self.returns.found_dead(now.instant);
                }
            }
            Followup::Leave { .. }
            | Followup::Poll { .. }
            | Followup::Component { .. }
            | Followup::Moved { .. }
            | Followup::Nothing => {}
        }
        Vec::new()
    }

    /// A launcher that died has lost its queue, which answers the poll at
    /// once; one silent for too long is forgotten and removed.
    fn poll(&mut self, ledger: &mut Ledger, now: Now) -> Vec<Effect> {
        let mut effects = self.close_idle(ledger, now);
        let uptake = self.uptake(now.instant);
        effects.extend(self.top_up(ledger, uptake));
        effects.extend(self.expire_silent(ledger, now));
        effects.extend(self.judge_returns(ledger, now));
        effects.extend(
            self.launchers
                .poll_silent(now.instant, ledger.settings().launcher_heartbeat)
                .into_iter()
                .map(|launcher| Effect::ToLauncher {
                    launcher: launcher.clone(),
                    msg: LauncherMsg::Poll {},
                    followup: Followup::Poll { launcher },
                }),
        );
        effects
    }

    fn standing(&mut self, ledger: &mut Ledger, now: Now) -> JobReport {
        self.owed
            .retain(|o| now.instant.duration_since(o.since) < OWED_SHRINK_LIFETIME);
        while self
            .recent
            .front()
            .is_some_and(|t| now.instant.duration_since(*t) > THROUGHPUT_WINDOW)
        {
            self.recent.pop_front();
        }
        let running = self.launchers.running_tasks();
        let slots = self.launchers.slots_by_cluster();
        ledger.report(running, slots, self.recent.len(), now)
    }

    fn entry(
        &self,
        _ledger: &Ledger,
        task: u64,
        status: FinalStatus,
        result: Option<&ResultMsg>,
    ) -> IndexEntry {
        let (command, params) = self
            .tasks
            .spec(task)
            .map(|spec| (spec.command, spec.params))
            .unwrap_or_default();
        index_entry(task, command, params, status, result)
    }

    fn clusters(&self, ledger: &Ledger) -> BTreeSet<ClusterName> {
        let mut clusters = ledger.clusters().clone();
        clusters.extend(self.launchers.clusters().cloned());
        clusters
    }
}

#[cfg(test)]
mod tests;
