//! A job as its shell (`job.rs`) and the simulator both drive it: the
//! job ([`Job`]: its ledger and its kind) with the effects it has yet to have carried
//! out. What follows what is decided here, once: a report polls silent
//! launchers first and is written once their answers are in, an answer to
//! a message or a publication comes before the effects queued after it,
//! and a job whose tasks are all over is finished and wound up, after which
//! tasks sent to it are refused.

use std::time::Instant;

use gleaner_protocol::{ActionReply, ControlMsg, Core, Message, Outbox, ResultMsg, ResultPart};
use tracing::{debug, info, warn};

use crate::{
    effect::{Effect, Followup, Now},
    job::{Job, Kind},
    publication::Publication,
    returns::DeadLetter,
};

/// What happens to a job, and the answers to its effects.
#[derive(Debug)]
pub enum JobEvent {
    /// Its runner holds it: it starts, resumes, or (ended before a crash)
    /// is only wound up.
    Start,
    /// Results, in delivery order.
    Results(Vec<ResultMsg>),
    /// Tasks dead-lettered after being returned to their queue too often,
    /// held unacked until an [`Effect::SettleLost`] names their receipt.
    Lost(DeadLetter),
    /// A message on the job's control queue, and who sent it (its
    /// broker-checked `user_id`, if it named one).
    Control {
        msg: ControlMsg,
        sender: Option<String>,
    },
    /// Answers [`Effect::ToKcm`] and [`Effect::ToLauncher`]: whether the
    /// message arrived (its queue may be gone).
    Delivered { followup: Followup, arrived: bool },
    /// Answers [`Effect::PublishFirst`]: all of it is with the broker.
    Published(Publication),
    /// Answers an effect whose message could not be sent for what it
    /// holds (over the broker's bound): the job is stopped with this
    /// `problem`, and the effect is not carried out.
    Unsendable { problem: String },
}

/// A queued effect, or the second half of a report.
#[derive(Debug)]
enum Step {
    Do(Box<Effect>),
    /// The report an [`Effect::Report`] asked for, once the polls before
    /// it are answered.
    ReportNow,
}

impl Step {
    fn boxed(effect: Effect) -> Self {
        Self::Do(Box::new(effect))
    }
}

/// A job and its pending effects.
#[derive(Debug)]
pub struct JobMachine<K> {
    job: Job<K>,
    outbox: Outbox<Step>,
    /// The end is decided (finished and wound up, or only wound up).
    ended: bool,
    /// When the job next reports where it stands (polling silent
    /// launchers first): at once when it starts, then every heartbeat.
    next_report: Option<Instant>,
}

impl<K: Kind> JobMachine<K> {
    pub fn new(job: Job<K>) -> Self {
        Self {
            job,
            outbox: Outbox::default(),
            ended: false,
            next_report: None,
        }
    }

    /// Whether `sender` may send `msg`: where the job's launchers have an
    /// account of their own, it speaks of launchers only.
    fn may_send(&self, msg: &ControlMsg, sender: Option<&str>) -> bool {
        match self.job.ledger().launcher_credentials() {
            Some(launchers) => may_send_control(msg, sender, &launchers.user),
            None => true,
        }
    }

    /// Whether a part of a run's output is staged for its result: one of
    /// this job's while it runs. A part naming another job is a
    /// launcher's mistake or a sender's mischief, and one that comes after
    /// the end has no result left to join.
    pub fn stages(&self, part: &ResultPart) -> bool {
        part.job == *self.job.ledger().id() && !self.ended
    }

    pub fn job(&self) -> &Job<K> {
        &self.job
    }

    /// Where the job stands, for a shell that cannot go on.
    pub fn standing(&mut self, now: Now) -> gleaner_protocol::JobReport {
        self.job.standing(now)
    }

    /// The job has ended and every effect of its end is carried out.
    pub fn is_over(&self) -> bool {
        self.ended && self.outbox.is_empty()
    }

    fn push(&mut self, effects: Vec<Effect>) {
        self.outbox.push(effects.into_iter().map(Step::boxed));
    }

    fn push_front(&mut self, effects: Vec<Effect>) {
        self.outbox.push_front(effects.into_iter().map(Step::boxed));
    }

    /// A control message for a job that has ended: tasks sent to it were
    /// not added, and their sender hears so.
    fn after_the_end(msg: &ControlMsg) -> Vec<Effect> {
        match msg {
            ControlMsg::AddTasks(_) => vec![Effect::Answer(ActionReply::Refused {
                reason: "the job ended before its runner took the tasks".to_owned(),
            })],
            _ => Vec::new(),
        }
    }
}

impl<K: Kind> Core for JobMachine<K> {
    type Event = JobEvent;
    type Effect = Effect;

    fn handle(&mut self, event: JobEvent, now: Now) {
        match event {
            JobEvent::Start if self.job.ledger().has_ended() => {
                info!("job had already ended; cleaning up");
                self.ended = true;
                let wind_up = self.job.wind_up(now);
                self.push(wind_up);
            }
            JobEvent::Start => {
                self.next_report = Some(now.instant);
                let start = self.job.start();
                self.push(vec![Effect::DeclareQueues]);
                self.push(start);
            }
            // After the end nothing a message asks is done: whoever sent
            // tasks hears that they were not added.
            JobEvent::Control { msg, .. } if self.ended => self.push(Self::after_the_end(&msg)),
            JobEvent::Control { msg, sender } if !self.may_send(&msg, sender.as_deref()) => {
                warn!(
                    sender = sender.as_deref().unwrap_or("-"),
                    kind = msg.kind(),
                    "control message from a sender who may not send it; dropped"
                );
            }
            JobEvent::Lost(letter) if self.ended => {
                self.push(vec![Effect::SettleLost(letter.receipt)]);
            }
            JobEvent::Results(_) if self.ended => {
                debug!("the job has ended; ignored");
            }
            JobEvent::Results(batch) => {
                let effects = self.job.on_results(batch, now);
                self.push(effects);
            }
            JobEvent::Lost(letter) => {
                let effects = self.job.on_lost(letter, now);
                self.push(effects);
            }
            JobEvent::Control { msg, .. } => {
                let effects = self.job.on_control(msg, now);
                self.push(effects);
            }
            JobEvent::Delivered { followup, arrived } => {
                let effects = self.job.on_delivery(followup, arrived, now);
                self.push_front(effects);
            }
            JobEvent::Published(publication) => {
                let effects = self.job.on_published(publication);
                self.push_front(effects);
            }
            JobEvent::Unsendable { problem } if self.ended => {
                warn!(problem, "a message of the job's end could not be sent");
            }
            JobEvent::Unsendable { problem } => {
                let effects = self.job.fail(problem, now);
                self.push(effects);
            }
        }
    }

    fn poll_effect(&mut self, now: Now) -> Option<Effect> {
        loop {
            match self.outbox.pop() {
                Some(Step::Do(effect)) if matches!(*effect, Effect::Report) => {
                    let polls = self.job.poll(now);
                    let then = std::iter::once(Step::ReportNow);
                    self.outbox
                        .push_front(polls.into_iter().map(Step::boxed).chain(then));
                }
                Some(Step::ReportNow) => {
                    let report = self.job.report(now);
                    self.push_front(report);
                }
                Some(Step::Do(effect)) => return Some(*effect),
                None => {
                    let state = self.job.ending().filter(|_| !self.ended)?;
                    self.ended = true;
                    let mut end = self.job.finish(state, now);
                    end.extend(self.job.wind_up(now));
                    self.push(end);
                }
            }
        }
    }

    /// The next report; none once the job has ended.
    fn poll_timeout(&self) -> Option<Instant> {
        self.next_report.filter(|_| !self.ended)
    }

    fn handle_timeout(&mut self, now: Now) {
        if gleaner_protocol::is_due(self, now) {
            let heartbeat = self.job.ledger().settings().heartbeat;
            self.next_report = Some(now.instant + heartbeat);
            self.push(vec![Effect::Report]);
        }
    }
}

/// Whether a control message may come from `sender` (its broker-checked
/// `user_id`) when the job's launchers have an account of their own
/// (`launchers`). Only the services and that account may write to the
/// job's control queue at all; launchers speak of themselves only, and
/// offers, shrinks, cancels and placements come from the services, whom a
/// task holding its launcher's account must not be able to play. The
/// services always name themselves; the launcher account could leave
/// `user_id` out.
pub fn may_send_control(
    msg: &gleaner_protocol::ControlMsg,
    sender: Option<&str>,
    launchers: &str,
) -> bool {
    use gleaner_protocol::ControlMsg;
    let from_launcher = matches!(
        msg,
        ControlMsg::LauncherUp(_)
            | ControlMsg::LauncherStatus(_)
            | ControlMsg::GpusHeld(_)
            | ControlMsg::LauncherGone { .. }
            | ControlMsg::Output(_)
    );
    from_launcher || sender.is_some_and(|sender| sender != launchers)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    #[test]
    fn a_launchers_account_cannot_play_the_services() {
        use gleaner_protocol::ControlMsg;
        let gone = ControlMsg::LauncherGone {
            launcher: "l1".into(),
            cluster: "c1".into(),
            reason: "idle".into(),
        };
        let cancel = ControlMsg::Cancel { reason: "x".into() };
        let ok = |msg, sender| may_send_control(msg, sender, "gleaner-launcher-j");
        assert!(ok(&gone, Some("gleaner-launcher-j")));
        assert!(ok(&gone, Some("svc")));
        let held = ControlMsg::GpusHeld(gleaner_protocol::GpusHeld {
            launcher: "c1-7.1".into(),
            cluster: "c1".into(),
            host: "n1".into(),
            devices: vec!["0".into()],
        });
        assert!(
            ok(&held, Some("gleaner-launcher-j")),
            "a launcher's own word"
        );
        assert!(!ok(&cancel, Some("gleaner-launcher-j")));
        assert!(!ok(&cancel, None), "the launcher account, nameless");
        assert!(ok(&cancel, Some("svc")));
    }

    use gleaner_manifest::{Addition, JobId};
    use gleaner_protocol::{JobState, RunStatus};

    use super::*;
    use crate::{
        job::{
            Opening,
            testing::{at, opening, result, submission},
        },
        records::JobFile,
        sweep::Sweep,
    };

    /// Carries out what the machine asks, as a shell would: every launcher
    /// but `gone` has a queue, and publications are with the broker at once.
    fn drain_without(machine: &mut JobMachine<Sweep>, gone: &str, now: Now) -> Vec<Effect> {
        let mut effects = Vec::new();
        while let Some(effect) = machine.poll_effect(now) {
            match &effect {
                Effect::PublishFirst(first) => {
                    machine.handle(JobEvent::Published(first.completes()), now);
                }
                Effect::ToLauncher {
                    launcher, followup, ..
                } => {
                    let arrived = launcher.as_str() != gone;
                    let followup = followup.clone();
                    machine.handle(JobEvent::Delivered { followup, arrived }, now);
                }
                _ => {}
            }
            effects.push(effect);
        }
        effects
    }

    fn drain(machine: &mut JobMachine<Sweep>, now: Now) -> Vec<Effect> {
        drain_without(machine, "", now)
    }

    fn up(launcher: &str) -> JobEvent {
        JobEvent::Control {
            msg: ControlMsg::LauncherUp(gleaner_protocol::LauncherInfo {
                launcher: launcher.into(),
                cluster: "c1".into(),
                host: "node1".into(),
                slots: 1,
                started_at: 0,
                deadline: None,
                heartbeat_ms: None,
            }),
            sender: None,
        }
    }

    const ONE: &str = "name = \"m\"\n[sweep]\ncommand = \"true {x}\"\nparams.x = [1]\n";
    const TWO: &str = "name = \"m\"\n[sweep]\ncommand = \"true {x}\"\nparams.x = [1, 2]\n";

    /// A machine of a sweep opened at `t0` (from `job.json`, if given),
    /// told to start; `change` adjusts what the runner found first.
    fn machine(
        manifest: &str,
        job_file: Option<JobFile>,
        change: impl FnOnce(&mut Opening<'_>),
        t0: Instant,
    ) -> JobMachine<Sweep> {
        let submission = submission(manifest);
        let tasks = gleaner_manifest::TaskList::new(&submission.manifest).unwrap();
        let mut found = opening(&submission, vec![], job_file);
        change(&mut found);
        let job = Sweep::open(found, tasks, at(t0, 0)).unwrap();
        let mut machine = JobMachine::new(job);
        machine.handle(JobEvent::Start, at(t0, 0));
        machine
    }

    #[test]
    fn a_message_too_big_to_send_stops_its_job_with_the_reason_and_nothing_else() {
        let t0 = Instant::now();
        let mut machine = machine(TWO, None, |_| {}, t0);
        drain(&mut machine, at(t0, 0));
        let problem = "a job_update message of 19.1 MiB is more than the 16 MiB a message may hold";
        machine.handle(
            JobEvent::Unsendable {
                problem: problem.into(),
            },
            at(t0, 1),
        );
        let effects = drain(&mut machine, at(t0, 1));
        assert!(machine.is_over(), "{effects:?}");
        let file = machine.job().job_file();
        assert_eq!(file.state, JobState::Cancelled);
        assert_eq!(file.problem.as_deref(), Some(problem));
        assert_eq!(file.tasks.cancelled, 2);
        let done = effects.iter().find_map(|e| match e {
            Effect::Event(gleaner_protocol::Event::Done(report)) => Some(report),
            _ => None,
        });
        assert_eq!(
            done.and_then(|r| r.problem.as_deref()),
            Some(problem),
            "the owner's wait hears why: {effects:?}"
        );
        // One of the end's own messages too big changes nothing more.
        machine.handle(
            JobEvent::Unsendable {
                problem: "again".into(),
            },
            at(t0, 2),
        );
        assert!(drain(&mut machine, at(t0, 2)).is_empty());
        assert_eq!(machine.job().job_file().problem.as_deref(), Some(problem));
    }

    /// Users kept apart: the job's launchers have an account of their own.
    fn apart(found: &mut Opening<'_>) {
        found.launcher_credentials = Some(gleaner_protocol::Credentials {
            user: "gleaner-launcher-j".into(),
            password: "p".into(),
        });
    }

    fn started(manifest: &str, t0: Instant) -> JobMachine<Sweep> {
        let mut machine = machine(manifest, None, |_| {}, t0);
        drain(&mut machine, at(t0, 0));
        machine
    }

    #[test]
    fn a_report_counts_what_its_polls_found() {
        let t0 = Instant::now();
        let mut machine = started(TWO, t0);
        for launcher in ["a", "b"] {
            machine.handle(up(launcher), at(t0, 0));
            drain(&mut machine, at(t0, 0));
        }
        // Both are silent by now: each is polled, and `a` is found gone.
        machine.handle_timeout(at(t0, 11));
        let effects = drain_without(&mut machine, "a", at(t0, 11));
        let polls = effects
            .iter()
            .filter(|e| matches!(e, Effect::ToLauncher { .. }))
            .count();
        assert_eq!(polls, 2, "{effects:?}");
        let reported = effects.iter().find_map(|e| match e {
            Effect::ToScheduler(gleaner_protocol::SchedulerMsg::JobUpdate(report)) => {
                Some(report.launchers.clone())
            }
            _ => None,
        });
        assert_eq!(
            reported.and_then(|l| l.get("c1").copied()),
            Some(1),
            "the report comes after the polls' answers: {effects:?}"
        );
        let heartbeat = machine.job().ledger().settings().heartbeat;
        assert_eq!(
            machine.poll_timeout(),
            Some(at(t0, 11).instant + heartbeat),
            "the next report a heartbeat later"
        );
    }

    #[test]
    fn only_this_jobs_parts_are_staged_and_only_while_it_runs() {
        let t0 = Instant::now();
        let mut machine = started(ONE, t0);
        let part = |job: &JobId| ResultPart {
            job: job.clone(),
            task: 0,
            run: 1,
            target: 0,
            offset: 0,
            data: b"out".to_vec(),
        };
        let own = machine.job().ledger().id().clone();
        assert!(machine.stages(&part(&own)));
        assert!(!machine.stages(&part(&JobId::new("other", 1))));
        machine.handle(
            JobEvent::Results(vec![result(0, 1, RunStatus::Succeeded)]),
            at(t0, 2),
        );
        drain(&mut machine, at(t0, 2));
        assert!(!machine.stages(&part(&own)), "the job is over");
    }

    #[test]
    fn a_job_whose_tasks_are_over_ends_once_and_then_refuses_tasks() {
        let t0 = Instant::now();
        let mut machine = started(ONE, t0);
        machine.handle(
            JobEvent::Results(vec![result(0, 1, RunStatus::Succeeded)]),
            at(t0, 2),
        );
        let effects = drain(&mut machine, at(t0, 2));
        let done = effects
            .iter()
            .filter(|e| matches!(e, Effect::Event(gleaner_protocol::Event::Done(_))))
            .count();
        assert_eq!(done, 1, "{effects:?}");
        assert!(matches!(effects.last(), Some(Effect::DeleteQueues)));
        assert!(machine.is_over());
        assert_eq!(machine.job().ledger().file().state, JobState::Done);

        machine.handle(
            JobEvent::Control {
                msg: ControlMsg::AddTasks(Addition {
                    id: 1,
                    tasks: Vec::new(),
                    sweep: None,
                }),
                sender: None,
            },
            at(t0, 3),
        );
        let effects = drain(&mut machine, at(t0, 3));
        assert!(
            matches!(&effects[..], [Effect::Answer(ActionReply::Refused { .. })]),
            "{effects:?}"
        );
        // Nothing after the end, not even a spurious time event.
        machine.handle_timeout(at(t0, 4));
        gleaner_protocol::assert_settled(&mut machine, at(t0, 4));
    }

    #[test]
    fn an_ended_job_is_only_wound_up() {
        let t0 = Instant::now();
        let mut file = started(ONE, t0).job().job_file();
        file.state = JobState::Done;
        let mut machine = machine(ONE, Some(file), |_| {}, t0);
        let effects = drain(&mut machine, at(t0, 5));
        assert!(
            !effects
                .iter()
                .any(|e| matches!(e, Effect::DeclareQueues | Effect::PublishFirst(_))),
            "{effects:?}"
        );
        assert!(matches!(effects.last(), Some(Effect::DeleteQueues)));
        assert!(machine.is_over());
    }

    #[test]
    fn tasks_sent_after_the_end_are_refused_to_any_sender() {
        let t0 = Instant::now();
        let mut machine = machine(ONE, None, apart, t0);
        drain(&mut machine, at(t0, 0));
        machine.handle(
            JobEvent::Results(vec![result(0, 1, RunStatus::Succeeded)]),
            at(t0, 1),
        );
        let end = drain(&mut machine, at(t0, 1));
        assert!(
            matches!(
                &end[end.len().saturating_sub(2)..],
                [Effect::DeleteQueues, Effect::ForgetLauncherAccount]
            ),
            "the launchers' account goes with the queues: {end:?}"
        );
        assert!(machine.is_over());
        // Taken from the queue as it was deleted: nobody is named.
        let late = JobEvent::Control {
            msg: ControlMsg::AddTasks(Addition {
                id: 1,
                tasks: Vec::new(),
                sweep: None,
            }),
            sender: None,
        };
        machine.handle(late, at(t0, 2));
        let effects = drain(&mut machine, at(t0, 2));
        assert!(
            matches!(&effects[..], [Effect::Answer(ActionReply::Refused { .. })]),
            "{effects:?}"
        );
    }

    #[test]
    fn a_launchers_account_cannot_cancel_its_job() {
        let t0 = Instant::now();
        let mut machine = machine(ONE, None, apart, t0);
        drain(&mut machine, at(t0, 0));
        let cancel = |sender: Option<&str>| JobEvent::Control {
            msg: ControlMsg::Cancel { reason: "x".into() },
            sender: sender.map(str::to_owned),
        };
        for sender in [Some("gleaner-launcher-j"), None] {
            machine.handle(cancel(sender), at(t0, 1));
            drain(&mut machine, at(t0, 1));
            assert!(!machine.is_over(), "{sender:?} may not cancel");
        }
        machine.handle(cancel(Some("gleaner-services")), at(t0, 2));
        drain(&mut machine, at(t0, 2));
        assert!(machine.is_over());
        assert_eq!(machine.job().ledger().file().state, JobState::Cancelled);
    }
}
