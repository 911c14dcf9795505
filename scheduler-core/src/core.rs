//! The scheduler's core: the picture ([`State`]) with its settings, when
//! rounds run, whether this scheduler is the active one, and what it hands
//! over. Its shell (`lib.rs`) only moves messages: it feeds [`Event`]s with
//! the time, carries out [`Effect`]s, and wakes it at
//! [`SchedulerCore::poll_timeout`]; the simulator drives it the same way.

use std::time::{Duration, Instant};

use gleaner_manifest::JobId;
use gleaner_policy::access::Users;
use gleaner_protocol::{
    ActionReply, ControlMsg, Core, EndedJob, GridSnapshot, Now, Outbox, RequestMsg, SchedulerMsg,
};
use tracing::{info, warn};

use crate::{
    metrics, outbox,
    state::{Answer, Reaction, RoundClock, State, StateConfig},
};

/// How often the metrics page is made again: a scrape interval is seconds.
const METRICS_EVERY: Duration = Duration::from_secs(2);

/// When rounds run: every `interval`, and sooner (not sooner than
/// `min_gap` after the last) when news calls for one.
#[derive(Debug, Clone, Copy)]
pub struct Rounds {
    pub interval: Duration,
    pub min_gap: Duration,
}

#[derive(Debug)]
pub enum Event {
    /// A message on `gleaner.scheduler`. The broker hands that inbox to one
    /// scheduler at a time, so the first one makes this scheduler active.
    Message(SchedulerMsg),
    /// Answers [`Effect::TakeOver`]: the grid bookkeeping the last active
    /// scheduler handed over, if any.
    HandedOver(Option<GridSnapshot>),
    /// An event read from the history stream, and when it was sent (in
    /// seconds), if it says.
    History {
        event: gleaner_protocol::Event,
        sent_at: Option<u64>,
    },
    /// A user's request; `user` is its broker-checked `user_id`, and
    /// `direct` whether it names a direct reply-to address.
    Request {
        user: Option<String>,
        request: RequestMsg,
        direct: bool,
    },
    /// Answers [`Effect::Forward`]: whether the job's control queue took
    /// the message.
    Forwarded { arrived: bool },
    /// Answers [`Effect::Forward`]: the message could not be sent, for
    /// what it holds (`reason`); its asker hears why.
    Unforwardable { reason: String },
    /// A job's control queue is gone: it is over.
    Gone(JobId),
}

/// What a round sends: its decisions, and the grid bookkeeping to hand over.
#[derive(Debug)]
pub struct Post {
    pub actions: Vec<(JobId, ControlMsg)>,
    pub grid: Option<GridSnapshot>,
}

#[derive(Debug)]
pub enum Effect {
    /// This scheduler is now the active one: read what the last one handed
    /// over (answer with [`Event::HandedOver`]) and take users' requests.
    TakeOver,
    /// Answer the request being handled.
    Reply(Reply),
    /// Send a user's order on to the job's runner (answer with
    /// [`Event::Forwarded`]); an `answerable` one carries the asker's
    /// address on: tasks to add are answered by the runner itself, once it
    /// has recorded them, and a follow's output goes there.
    Forward {
        job: JobId,
        msg: ControlMsg,
        answerable: bool,
    },
    /// Send a round's decisions to the jobs' runners, and hand the grid
    /// bookkeeping over.
    Post(Post),
    /// The metrics page, made again.
    Metrics(String),
}

/// An answer to a user.
#[derive(Debug)]
pub enum Reply {
    Status(Box<gleaner_protocol::StatusReply>),
    Action(ActionReply),
}

/// The scheduler's decisions.
#[derive(Debug)]
pub struct SchedulerCore {
    state: State,
    config: StateConfig,
    users: Users,
    /// This scheduler, as status replies and metrics name it.
    identity: String,
    rounds: Rounds,
    clock: RoundClock,
    /// Whether a metrics page is served, and when it was last made.
    metrics: bool,
    rendered: Option<Instant>,
    active: bool,
    /// The first message, held while what was handed over is read.
    held: Option<SchedulerMsg>,
    /// The last round handed over an empty grid: the next empty one is
    /// not handed over again.
    handed_over_nothing: bool,
    /// The reply to the order being forwarded, once its runner has it
    /// (`None`: the runner answers).
    forwarding: Option<ActionReply>,
    outbox: Outbox<Effect>,
}

impl SchedulerCore {
    pub fn new(
        state: State,
        config: StateConfig,
        users: Users,
        identity: String,
        rounds: Rounds,
        metrics: bool,
        now: Instant,
    ) -> Self {
        Self {
            state,
            config,
            users,
            identity,
            rounds,
            clock: RoundClock::new(rounds.interval, rounds.min_gap, now),
            metrics,
            rendered: None,
            active: false,
            held: None,
            handed_over_nothing: false,
            forwarding: None,
            outbox: Outbox::default(),
        }
    }

    /// Whether this scheduler is the active one.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// A new session with the broker: a standby again until the inbox is
    /// handed to it, deciding nothing meanwhile (what it kept from an
    /// earlier turn is stale), with rounds counted afresh.
    pub fn reconnected(&mut self, identity: &str, now: Instant) {
        let rounds = self.rounds;
        identity.clone_into(&mut self.identity);
        self.active = false;
        self.held = None;
        self.handed_over_nothing = false;
        self.rendered = None;
        self.clock = RoundClock::new(rounds.interval, rounds.min_gap, now);
    }

    fn on_message(&mut self, message: SchedulerMsg, now: Instant) {
        if self.state.on_message(message, now, &self.config) == Reaction::Round {
            self.clock.hurry(now);
        }
    }

    fn round(&mut self, now: Now) {
        self.clock.ran(now.instant);
        if !self.active {
            return;
        }
        let actions: Vec<_> = self
            .state
            .round(now.instant, &self.config)
            .into_iter()
            .map(outbox::message)
            .collect();
        if self.metrics
            && self
                .rendered
                .is_none_or(|at| now.instant.duration_since(at) >= METRICS_EVERY)
        {
            let status = self.state.status(&self.identity, now.instant, &self.config);
            self.outbox
                .push([Effect::Metrics(metrics::render(&status))]);
            self.rendered = Some(now.instant);
        }
        // Handed over after every round that has grid jobs, and once more
        // when the last is gone.
        let grid = self.state.grid_snapshot(now);
        let empty = grid.placements.is_empty() && grid.reservations.is_empty();
        let grid = (!(empty && self.handed_over_nothing)).then_some(grid);
        self.handed_over_nothing = empty;
        if !actions.is_empty() || grid.is_some() {
            self.outbox.push([Effect::Post(Post { actions, grid })]);
        }
    }
}

impl Core for SchedulerCore {
    type Event = Event;
    type Effect = Effect;

    fn handle(&mut self, event: Event, now: Now) {
        match event {
            Event::Message(message) if !self.active => {
                self.active = true;
                info!(scheduler = %self.identity, "scheduler active");
                self.held = Some(message);
                self.outbox.push([Effect::TakeOver]);
            }
            Event::Message(message) => self.on_message(message, now.instant),
            Event::HandedOver(snapshot) => {
                if let Some(snapshot) = snapshot {
                    self.state.restore_grid(snapshot, now);
                }
                if let Some(message) = self.held.take() {
                    self.on_message(message, now.instant);
                }
            }
            Event::History { event, sent_at } => {
                let ended_at = sent_at.map_or(now.wall_ms, |s| s.saturating_mul(1000));
                if let Some(ended) = EndedJob::of(&event, ended_at) {
                    self.state.on_ended(ended, now, &self.config);
                }
            }
            // Answers go to the asker's direct reply-to and nowhere else:
            // a user naming any queue as `reply_to` must not have the
            // services post there, nor anything done on their word.
            Event::Request {
                user,
                direct: false,
                ..
            } => {
                warn!(
                    user = user.as_deref(),
                    "request without a direct reply-to address; ignored"
                );
            }
            Event::Request { user, request, .. } => {
                let answer = self.state.on_request(
                    user.as_deref(),
                    request,
                    now.instant,
                    &self.config,
                    &self.users,
                );
                let effect = match answer {
                    Answer::Status(mut reply) => {
                        reply.scheduler.clone_from(&self.identity);
                        Effect::Reply(Reply::Status(Box::new(reply)))
                    }
                    Answer::Action(reply, None) => Effect::Reply(Reply::Action(reply)),
                    // Tasks to add are answered by the job's runner, once
                    // it has recorded them or refused them.
                    Answer::Action(_, Some((job, msg @ ControlMsg::AddTasks(_)))) => {
                        self.forwarding = None;
                        Effect::Forward {
                            job,
                            msg,
                            answerable: true,
                        }
                    }
                    // A follow carries the asker's address on to the
                    // runner, which relays the task's output there; the
                    // asker hears first whether the runner has it.
                    Answer::Action(reply, Some((job, msg @ ControlMsg::Follow { .. }))) => {
                        self.forwarding = Some(reply);
                        Effect::Forward {
                            job,
                            msg,
                            answerable: true,
                        }
                    }
                    // "Accepted" means the runner has it.
                    Answer::Action(reply, Some((job, msg))) => {
                        self.forwarding = Some(reply);
                        Effect::Forward {
                            job,
                            msg,
                            answerable: false,
                        }
                    }
                };
                self.outbox.push([effect]);
            }
            Event::Forwarded { arrived } => {
                let reply = match (arrived, self.forwarding.take()) {
                    (false, _) => Some(ActionReply::NotRunning {}),
                    (true, reply) => reply,
                };
                let reply = reply.map(|reply| Effect::Reply(Reply::Action(reply)));
                self.outbox.push_front(reply);
            }
            Event::Unforwardable { reason } => {
                self.forwarding = None;
                let refused = ActionReply::Refused { reason };
                self.outbox
                    .push_front(Some(Effect::Reply(Reply::Action(refused))));
            }
            Event::Gone(job) => self.state.on_job_done(&job),
        }
    }

    fn poll_effect(&mut self, _now: Now) -> Option<Effect> {
        self.outbox.pop()
    }

    /// The next round: an interval after the last, or sooner (as soon as
    /// `min_gap` allows) once a message calls for one.
    fn poll_timeout(&self) -> Option<Instant> {
        Some(self.clock.next())
    }

    fn handle_timeout(&mut self, now: Now) {
        if now.instant >= self.clock.next() {
            self.round(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use gleaner_protocol::{ClusterReport, GrantId, advance, drain, wake_up};

    use super::*;

    fn at(start: Instant, ms: u64) -> Now {
        Now {
            instant: start + Duration::from_millis(ms),
            wall_ms: 1_000_000 + ms,
        }
    }

    fn core(start: Instant) -> SchedulerCore {
        SchedulerCore::new(
            State::new(GrantId::new(1)),
            StateConfig::default(),
            Users::default(),
            "s1".into(),
            Rounds {
                interval: Duration::from_secs(1),
                min_gap: Duration::from_millis(200),
            },
            false,
            start,
        )
    }

    fn effects(core: &mut SchedulerCore, event: Event, now: Now) -> Vec<Effect> {
        core.handle(event, now);
        drain(core, now)
    }

    fn cluster(name: &str, idle: u32) -> SchedulerMsg {
        SchedulerMsg::ClusterStatus(ClusterReport {
            cluster: name.into(),
            total_slots: idle,
            idle_slots: idle,
            ..ClusterReport::default()
        })
    }

    fn job(name: &str) -> SchedulerMsg {
        SchedulerMsg::JobUpdate(crate::state::tests::job_report(name, 10))
    }

    #[test]
    fn the_first_message_makes_it_active_after_the_handover_is_read() {
        let t0 = Instant::now();
        let mut core = core(t0);
        assert!(
            advance(&mut core, at(t0, 1000)).is_empty(),
            "a standby decides nothing"
        );
        let taken = effects(&mut core, Event::Message(cluster("c1", 4)), at(t0, 1100));
        assert!(matches!(taken[..], [Effect::TakeOver]), "{taken:?}");
        assert!(core.is_active());
        effects(&mut core, Event::HandedOver(None), at(t0, 1100));
        effects(&mut core, Event::Message(job("a")), at(t0, 1150));
        let round = advance(&mut core, at(t0, 1300));
        let offered: Vec<_> = round
            .iter()
            .flat_map(|e| match e {
                Effect::Post(post) => post.actions.clone(),
                _ => Vec::new(),
            })
            .collect();
        assert!(
            matches!(&offered[..], [(_, ControlMsg::GrowOffer { slots: 4, .. })]),
            "the held cluster report counts: {round:?}"
        );
    }

    #[test]
    fn a_new_job_brings_the_round_forward_within_the_least_gap() {
        let t0 = Instant::now();
        let mut core = core(t0);
        effects(&mut core, Event::Message(cluster("c1", 4)), at(t0, 0));
        effects(&mut core, Event::HandedOver(None), at(t0, 0));
        assert_eq!(core.poll_timeout(), Some(at(t0, 1000).instant));
        assert!(advance(&mut core, at(t0, 999)).is_empty(), "not yet due");
        let (then, _) = wake_up(&mut core, at(t0, 999)).expect("a round due");
        assert_eq!(then, at(t0, 1000));
        assert_eq!(core.poll_timeout(), Some(at(t0, 2000).instant));
        effects(&mut core, Event::Message(job("a")), at(t0, 1050));
        assert_eq!(
            core.poll_timeout(),
            Some(at(t0, 1200).instant),
            "hurried, 200 ms after the last"
        );
        effects(&mut core, Event::Message(cluster("c1", 4)), at(t0, 1060));
        assert_eq!(core.poll_timeout(), Some(at(t0, 1200).instant));
    }

    #[test]
    fn an_end_read_from_the_history_is_dated_by_its_sending() {
        let t0 = Instant::now();
        let mut core = core(t0);
        let SchedulerMsg::JobUpdate(report) = job("a") else {
            unreachable!()
        };
        let id = report.job.clone();
        let ended = Event::History {
            event: gleaner_protocol::Event::Done(report),
            sent_at: Some(5),
        };
        effects(&mut core, ended, at(t0, 0));
        let progress = Event::History {
            event: gleaner_protocol::Event::Progress(crate::state::tests::job_report("b", 1)),
            sent_at: None,
        };
        effects(&mut core, progress, at(t0, 0));
        let ask = Event::Request {
            user: Some("alice".into()),
            direct: true,
            request: RequestMsg::Status { job: None },
        };
        let answer = effects(&mut core, ask, at(t0, 10));
        let [Effect::Reply(Reply::Status(reply))] = &answer[..] else {
            panic!("{answer:?}");
        };
        let ended: Vec<_> = reply.ended.iter().map(|e| (&e.job, e.ended_at)).collect();
        assert_eq!(ended, [(&id, 5_000)], "progress is no end");
    }

    #[test]
    fn a_request_without_a_direct_reply_address_is_neither_answered_nor_carried_out() {
        let t0 = Instant::now();
        let mut core = core(t0);
        let report = crate::state::tests::job_report("a", 10);
        let id = report.job.clone();
        effects(
            &mut core,
            Event::Message(SchedulerMsg::JobUpdate(report)),
            at(t0, 0),
        );
        effects(&mut core, Event::HandedOver(None), at(t0, 0));
        let request = |direct| Event::Request {
            user: Some("alice".into()),
            direct,
            request: RequestMsg::Cancel { job: id.clone() },
        };
        assert!(
            effects(&mut core, request(false), at(t0, 1)).is_empty(),
            "a queue named as reply-to gets nothing, and the job is not cancelled"
        );
        assert!(
            matches!(
                &effects(&mut core, request(true), at(t0, 2))[..],
                [Effect::Forward { .. }]
            ),
            "the same cancel with a direct reply-to is passed on"
        );
    }

    #[test]
    fn a_cancel_is_accepted_once_its_runner_has_it_and_tasks_are_answered_by_the_runner() {
        let t0 = Instant::now();
        let mut core = core(t0);
        let mut open = crate::state::tests::job_report("a", 10);
        open.open = true;
        let id = open.job.clone();
        let update = Event::Message(SchedulerMsg::JobUpdate(open));
        effects(&mut core, update, at(t0, 0));
        effects(&mut core, Event::HandedOver(None), at(t0, 0));
        let cancel = || Event::Request {
            user: Some("alice".into()),
            direct: true,
            request: RequestMsg::Cancel { job: id.clone() },
        };
        let forwarded = effects(&mut core, cancel(), at(t0, 1));
        assert!(
            matches!(
                &forwarded[..],
                [Effect::Forward {
                    answerable: false,
                    ..
                }]
            ),
            "{forwarded:?}"
        );
        let replied = effects(&mut core, Event::Forwarded { arrived: true }, at(t0, 1));
        assert!(matches!(
            &replied[..],
            [Effect::Reply(Reply::Action(ActionReply::Accepted {}))]
        ));
        effects(&mut core, cancel(), at(t0, 2));
        let replied = effects(&mut core, Event::Forwarded { arrived: false }, at(t0, 2));
        assert!(matches!(
            &replied[..],
            [Effect::Reply(Reply::Action(ActionReply::NotRunning {}))]
        ));
        let add = Event::Request {
            user: Some("alice".into()),
            direct: true,
            request: RequestMsg::AddTasks {
                job: id.clone(),
                addition: gleaner_manifest::Addition {
                    id: 1,
                    tasks: Vec::new(),
                    sweep: None,
                },
            },
        };
        let forwarded = effects(&mut core, add, at(t0, 3));
        assert!(
            matches!(
                &forwarded[..],
                [Effect::Forward {
                    answerable: true,
                    ..
                }]
            ),
            "{forwarded:?}"
        );
        let replied = effects(&mut core, Event::Forwarded { arrived: true }, at(t0, 3));
        assert!(replied.is_empty(), "the runner answers: {replied:?}");
    }

    #[test]
    fn an_order_too_big_to_pass_on_is_refused_to_its_asker_and_the_scheduler_goes_on() {
        let t0 = Instant::now();
        let mut core = core(t0);
        let mut open = crate::state::tests::job_report("a", 10);
        open.open = true;
        let id = open.job.clone();
        effects(
            &mut core,
            Event::Message(SchedulerMsg::JobUpdate(open)),
            at(t0, 0),
        );
        effects(&mut core, Event::HandedOver(None), at(t0, 0));
        let cancel = Event::Request {
            user: Some("alice".into()),
            direct: true,
            request: RequestMsg::Cancel { job: id },
        };
        effects(&mut core, cancel, at(t0, 1));
        let too_big = Event::Unforwardable {
            reason: "a control message of 21.0 MiB is more than the 16 MiB a message may hold"
                .into(),
        };
        let replied = effects(&mut core, too_big, at(t0, 1));
        assert!(
            matches!(
                &replied[..],
                [Effect::Reply(Reply::Action(ActionReply::Refused { reason }))] if reason.contains("21.0 MiB")
            ),
            "{replied:?}"
        );
        assert!(core.is_active());
    }

    #[test]
    fn a_follow_of_a_closed_job_goes_on_with_its_askers_address_and_is_answered() {
        let t0 = Instant::now();
        let mut core = core(t0);
        let report = crate::state::tests::job_report("a", 10);
        assert!(!report.open);
        let id = report.job.clone();
        effects(
            &mut core,
            Event::Message(SchedulerMsg::JobUpdate(report)),
            at(t0, 0),
        );
        effects(&mut core, Event::HandedOver(None), at(t0, 0));
        let follow = |user: &str| Event::Request {
            user: Some(user.into()),
            direct: true,
            request: RequestMsg::Follow {
                job: id.clone(),
                task: 4,
            },
        };
        let refused = effects(&mut core, follow("bob"), at(t0, 1));
        assert!(
            matches!(
                &refused[..],
                [Effect::Reply(Reply::Action(ActionReply::Refused { .. }))]
            ),
            "{refused:?}"
        );
        let forwarded = effects(&mut core, follow("alice"), at(t0, 2));
        assert!(
            matches!(
                &forwarded[..],
                [Effect::Forward {
                    answerable: true,
                    msg: ControlMsg::Follow { task: 4, .. },
                    ..
                }]
            ),
            "{forwarded:?}"
        );
        let replied = effects(&mut core, Event::Forwarded { arrived: true }, at(t0, 2));
        assert!(matches!(
            &replied[..],
            [Effect::Reply(Reply::Action(ActionReply::Accepted {}))]
        ));
    }
}
