use std::path::PathBuf;

use gleaner_protocol::{assert_settled, drain as effects_of, wake_up};

use super::*;
use crate::Limits;

type Effects = Vec<Effect<&'static str>>;

/// A launcher started at `t0`; events are given at whole seconds after it.
struct Launcher {
    state: LauncherCore<&'static str>,
    t0: Instant,
}

/// Idle after 60 s, a heartbeat every 1000 s (out of the way), no deadline.
fn launcher(configure: impl FnOnce(&mut LauncherConfig, Instant)) -> Launcher {
    launcher_holding(&[], configure)
}

/// A launcher holding the GPUs `gpus` for its tasks.
fn launcher_holding(
    gpus: &[&str],
    configure: impl FnOnce(&mut LauncherConfig, Instant),
) -> Launcher {
    let t0 = Instant::now();
    let mut config = LauncherConfig {
        job: gleaner_manifest::JobId::new("sweep", 1),
        cluster: "c1".into(),
        id: "l1".into(),
        host: "h1".to_owned(),
        slot: "1".to_owned(),
        slots: 2,
        task_slots: 1,
        task_needs: Default::default(),
        gpu_source: crate::GpuSource::BatchSystem,
        idle_timeout: Duration::from_secs(60),
        heartbeat: Duration::from_secs(1000),
        deadline: None,
        walltime: None,
        deadline_margin: Duration::from_secs(10),
        scratch: PathBuf::from("/nonexistent"),
        checkpoints: PathBuf::from("/nonexistent"),
        limits: Limits::default(),
    };
    configure(&mut config, t0);
    Launcher {
        state: LauncherCore::new(
            &config,
            &gpus.iter().map(|d| (*d).to_owned()).collect::<Vec<_>>(),
            Now {
                instant: t0,
                wall_ms: 0,
            },
        ),
        t0,
    }
}

/// A placeholder whose walltime ends 200 s after start: tasks stop at 190 s.
fn placeholder() -> Launcher {
    launcher(|config, t0| config.deadline = Some(t0 + Duration::from_secs(200)))
}

impl Launcher {
    fn at(&mut self, secs: u64, event: Event<&'static str>) -> Effects {
        self.at_ms(secs * 1000, event)
    }

    fn at_ms(&mut self, ms: u64, event: Event<&'static str>) -> Effects {
        let now = self.now(ms);
        self.state.handle(event, now);
        effects_of(&mut self.state, now)
    }

    /// The time event at `secs`, as the shell sends it once
    /// [`Core::poll_timeout`] has passed (or earlier: it must be
    /// harmless).
    fn timeout(&mut self, secs: u64) -> Effects {
        self.timeout_ms(secs * 1000)
    }

    fn timeout_ms(&mut self, ms: u64) -> Effects {
        let now = self.now(ms);
        self.state.handle_timeout(now);
        effects_of(&mut self.state, now)
    }

    fn now(&self, ms: u64) -> Now {
        Now {
            instant: self.t0 + Duration::from_millis(ms),
            wall_ms: ms,
        }
    }

    fn wakeup(&self) -> Option<Duration> {
        self.state
            .poll_timeout()
            .map(|at| at.duration_since(self.t0))
    }
}

/// Delivery `tag` runs, without GPUs.
fn run(tag: u64) -> Effect<&'static str> {
    Effect::Run { tag, gpus: vec![] }
}

/// Delivery `tag` carries task `100 + tag`.
fn deliver(tag: u64, walltime_secs: Option<u64>) -> Event<&'static str> {
    Event::Delivered {
        tag,
        task: 100 + tag,
        preemptions: 0,
        walltime: walltime_secs.map(Duration::from_secs),
        message_tasks: 1,
        shape: None,
    }
}

#[test]
fn a_task_of_another_shape_goes_back_and_the_launcher_leaves() {
    let shaped = |tag, slots| Event::Delivered {
        tag,
        task: 100 + tag,
        preemptions: 0,
        walltime: None,
        message_tasks: 1,
        shape: Some(TaskShape::slots(slots)),
    };
    let mut l = launcher(|_, _| {});
    let effects = l.at(1, shaped(1, 4));
    assert!(
        effects.contains(&Effect::GiveBack { tag: 1 }),
        "{effects:?}"
    );
    assert!(effects.contains(&Effect::StopConsuming), "{effects:?}");
    assert_eq!(l.at(2, Event::TasksEnded), []);
    assert_eq!(l.at(3, settled(1)), [Effect::Leave(Ok(Exit::Reshaped))]);
    // One of its own shape runs.
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, shaped(1, 1)), [run(1)]);
}

fn drain() -> Event<&'static str> {
    Event::Message(LauncherMsg::Drain {
        reason: "fair share".to_owned(),
    })
}

fn preempt() -> Event<&'static str> {
    Event::Message(LauncherMsg::Preempt {
        reason: "local job waiting".to_owned(),
    })
}

fn ended(tag: u64) -> Event<&'static str> {
    Event::Ended {
        tag,
        end: TaskEnd::Itself,
    }
}

fn killed(tag: u64) -> Event<&'static str> {
    Event::Ended {
        tag,
        end: TaskEnd::Killed,
    }
}

fn signalled(tag: u64) -> Event<&'static str> {
    Event::Ended {
        tag,
        end: TaskEnd::Signalled,
    }
}

fn settled(tag: u64) -> Event<&'static str> {
    Event::Settled { tag }
}

/// A batch system's preemption signals the task and the launcher at
/// once: a task that ended of it just before the launcher heard its own
/// goes back with one more preemption; one that ended of a signal the
/// launcher never got is its own failure, reported once the grace is
/// over.
#[test]
fn a_task_ended_of_the_signal_that_preempts_its_launcher_is_preempted() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(l.at(2, signalled(1)), []);
    let effects = l.at(2, Event::Signal);
    assert!(
        effects.contains(&Effect::Republish { tag: 1 }),
        "{effects:?}"
    );
    assert!(!effects.contains(&Effect::Report { tag: 1 }), "{effects:?}");

    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(l.at(2, signalled(1)), []);
    let judged = l.state.poll_timeout().expect("a judgement due");
    assert!(judged <= l.t0 + Duration::from_secs(2) + SIGNALLED_GRACE);
    let effects = l.timeout(2 + SIGNALLED_GRACE.as_secs());
    assert!(effects.contains(&Effect::Report { tag: 1 }), "{effects:?}");
}

#[test]
fn drain_lets_running_tasks_finish_and_takes_no_new_ones() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(l.at(2, drain()), [Effect::StopConsuming]);
    // Sent before the broker saw the cancel: back for another launcher.
    assert_eq!(l.at(2, deliver(2, None)), [Effect::GiveBack { tag: 2 }]);
    assert_eq!(l.at(3, Event::TasksEnded), []);
    assert_eq!(l.at(3, settled(2)), []);
    assert_eq!(l.at(4, ended(1)), [Effect::Report { tag: 1 }]);
    assert_eq!(l.at(5, settled(1)), [Effect::Leave(Ok(Exit::Drained))]);
}

#[test]
fn preempt_message_kills_and_republishes_running_tasks() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(
        l.at(2, preempt()),
        [Effect::StopTasks, Effect::StopConsuming]
    );
    assert_eq!(l.at(2, killed(1)), [Effect::Republish { tag: 1 }]);
    assert_eq!(l.at(3, Event::TasksEnded), []);
    assert_eq!(l.at(3, settled(1)), [Effect::Leave(Ok(Exit::Preempted))]);
}

#[test]
fn signal_preempts_like_a_message_and_only_once() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(
        l.at(2, Event::Signal),
        [Effect::StopTasks, Effect::StopConsuming]
    );
    assert_eq!(l.at(2, Event::Signal), []);
    assert_eq!(l.at(2, preempt()), []);
    assert_eq!(l.at(2, killed(1)), [Effect::Republish { tag: 1 }]);
    assert_eq!(l.at(3, Event::TasksEnded), []);
    assert_eq!(l.at(3, settled(1)), [Effect::Leave(Ok(Exit::Preempted))]);
}

#[test]
fn preemption_overrides_a_drain_under_way() {
    for preemption in [preempt(), Event::Signal] {
        let mut l = launcher(|_, _| {});
        assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
        assert_eq!(l.at(2, drain()), [Effect::StopConsuming]);
        assert_eq!(l.at(3, preemption), [Effect::StopTasks]);
        assert_eq!(l.at(3, killed(1)), [Effect::Republish { tag: 1 }]);
        // A later drain does not turn the preemption back into one.
        assert_eq!(l.at(4, drain()), []);
        assert_eq!(l.at(4, Event::TasksEnded), []);
        assert_eq!(l.at(4, settled(1)), [Effect::Leave(Ok(Exit::Preempted))]);
    }
}

#[test]
fn walltime_preempts_tasks_deadline_margin_before_the_deadline() {
    let mut l = placeholder();
    assert_eq!(l.at(0, deliver(1, None)), [run(1)]);
    assert!(matches!(l.timeout(0)[..], [Effect::SendStatus(_)]));
    assert_eq!(l.wakeup(), Some(Duration::from_secs(190)));
    assert_eq!(l.timeout(189), []);
    assert_eq!(l.timeout(190), [Effect::StopTasks, Effect::StopConsuming]);
    assert_eq!(l.at(190, killed(1)), [Effect::Republish { tag: 1 }]);
    assert_eq!(l.at(191, Event::TasksEnded), []);
    assert_eq!(l.at(191, settled(1)), [Effect::Leave(Ok(Exit::Walltime))]);
}

#[test]
fn a_task_that_would_outlast_the_placeholder_is_given_back_and_the_launcher_drains() {
    let mut l = placeholder();
    // Ends exactly when tasks must stop: fits.
    assert_eq!(l.at(100, deliver(1, Some(90))), [run(1)]);
    assert_eq!(
        l.at(101, deliver(2, Some(90))),
        [Effect::GiveBack { tag: 2 }, Effect::StopConsuming]
    );
    assert_eq!(l.at(102, settled(2)), []);
    assert_eq!(l.at(102, Event::TasksEnded), []);
    // The running task is left to finish (and told of: the first since idle).
    assert!(matches!(l.timeout(150)[..], [Effect::SendStatus(_)]));
    assert_eq!(l.at(160, ended(1)), [Effect::Report { tag: 1 }]);
    assert_eq!(l.at(161, settled(1)), [Effect::Leave(Ok(Exit::Walltime))]);
}

#[test]
fn a_task_longer_than_any_fresh_placeholder_offers_is_refused() {
    let mut l = placeholder();
    assert_eq!(
        l.at(0, deliver(1, Some(191))),
        [Effect::Refuse {
            tag: 1,
            reason: "the task's walltime (191 s) exceeds what a placeholder of cluster c1 \
                         offers (190 s)"
                .to_owned(),
        }]
    );
    assert_eq!(l.at(1, settled(1)), []);
    // The launcher goes on taking tasks.
    assert_eq!(l.at(2, deliver(2, Some(10))), [run(2)]);
}

#[test]
fn a_task_longer_than_what_its_placeholder_was_given_is_passed_on_not_refused() {
    // Placeholders ask for an hour; the batch system gave this one 200 s.
    let mut l = launcher(|config, t0| {
        config.deadline = Some(t0 + Duration::from_secs(200));
        config.walltime = Some(Duration::from_secs(3600));
    });
    assert_eq!(
        l.at(0, deliver(1, Some(600))),
        [Effect::GiveBack { tag: 1 }, Effect::StopConsuming]
    );
    let mut l = launcher(|config, t0| {
        config.deadline = Some(t0 + Duration::from_secs(200));
        config.walltime = Some(Duration::from_secs(3600));
    });
    assert!(matches!(
        l.at(0, deliver(1, Some(3591)))[..],
        [Effect::Refuse { tag: 1, .. }]
    ));
    assert_eq!(l.at(1, deliver(2, Some(60))), [run(2)]);
}

#[test]
fn an_idle_launcher_leaves_after_idle_timeout() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.wakeup(), Some(Duration::from_secs(60)));
    assert_eq!(l.timeout(59), []);
    let at_59 = l.now(59_000);
    let (then, effects) = wake_up(&mut l.state, at_59).expect("idle timeout");
    assert_eq!(then, l.now(60_000));
    assert_eq!(effects, [Effect::StopConsuming]);
    assert_eq!(l.at(60, Event::TasksEnded), [Effect::Leave(Ok(Exit::Idle))]);
    assert_eq!(l.state.poll_timeout(), None, "gone");
    let at_61 = l.now(61_000);
    assert_settled(&mut l.state, at_61);
}

#[test]
fn no_idle_exit_while_a_task_runs_and_idle_counts_from_its_end() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(10, deliver(1, None)), [run(1)]);
    assert_eq!(l.wakeup(), Some(Duration::from_secs(10)), "told at once");
    assert!(matches!(l.timeout(10)[..], [Effect::SendStatus(_)]));
    assert_eq!(l.wakeup(), Some(Duration::from_secs(1010)));
    assert_eq!(l.timeout(500), []);
    assert_eq!(l.at(600, ended(1)), [Effect::Report { tag: 1 }]);
    assert_eq!(l.at(600, settled(1)), []);
    assert_eq!(l.wakeup(), Some(Duration::from_secs(660)));
    assert_eq!(l.timeout(659), []);
    assert_eq!(l.timeout(660), [Effect::StopConsuming]);
}

#[test]
fn job_over_abandons_running_tasks_and_leaves_once_none_is_held() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(l.at(1, deliver(2, None)), [run(2)]);
    assert_eq!(
        l.at(2, ended(1)),
        [Effect::Report { tag: 1 }, Effect::Prefetch(4)]
    );
    // The consumer ended without our asking: the queue is gone.
    assert_eq!(l.at(3, Event::TasksEnded), [Effect::StopTasks]);
    assert_eq!(l.state.poll_timeout(), None);
    assert_eq!(l.at(3, preempt()), []);
    assert_eq!(l.at(3, killed(2)), [Effect::Abandon { tag: 2 }]);
    assert_eq!(l.at(4, settled(1)), [Effect::Leave(Ok(Exit::JobOver))]);
}

#[test]
fn a_queue_gone_while_draining_ends_the_job() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(l.at(2, drain()), [Effect::StopConsuming]);
    assert_eq!(l.at(2, Event::TasksEnded), []);
    assert_eq!(l.at(3, ended(1)), [Effect::Report { tag: 1 }]);
    assert_eq!(l.at(4, Event::QueueGone), [Effect::StopTasks]);
    assert_eq!(l.at(4, settled(1)), [Effect::Leave(Ok(Exit::JobOver))]);
}

#[test]
fn leaves_only_after_the_last_task_and_the_end_of_consuming() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(l.at(1, deliver(2, None)), [run(2)]);
    assert_eq!(
        l.at(2, preempt()),
        [Effect::StopTasks, Effect::StopConsuming]
    );
    assert_eq!(l.at(2, killed(1)), [Effect::Republish { tag: 1 }]);
    assert_eq!(l.at(3, settled(1)), []);
    assert_eq!(l.at(3, Event::TasksEnded), []);
    assert_eq!(l.at(3, killed(2)), [Effect::Republish { tag: 2 }]);
    assert_eq!(l.at(4, settled(2)), [Effect::Leave(Ok(Exit::Preempted))]);
    // Nothing more once gone.
    assert_eq!(l.at(5, Event::Signal), []);

    // The other order: all tasks settled while deliveries may still come.
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(
        l.at(2, preempt()),
        [Effect::StopTasks, Effect::StopConsuming]
    );
    assert_eq!(l.at(2, killed(1)), [Effect::Republish { tag: 1 }]);
    assert_eq!(l.at(3, settled(1)), []);
    // Delivered after the stop: back to the queue untouched.
    assert_eq!(l.at(3, deliver(2, None)), [Effect::GiveBack { tag: 2 }]);
    assert_eq!(l.at(4, settled(2)), []);
    assert_eq!(
        l.at(4, Event::TasksEnded),
        [Effect::Leave(Ok(Exit::Preempted))]
    );
}

#[test]
fn a_followed_tasks_output_goes_while_it_runs_and_is_followed() {
    let follow = |task, for_ms| Event::Message(LauncherMsg::Follow { task, for_ms });
    let tee = |tag| Effect::Tee { tag };
    let mut l = launcher(|config, _| config.heartbeat = Duration::from_secs(1000));
    // Followed before it starts here: looked at a moment later.
    assert_eq!(l.at(1, follow(101, 10_000)), []);
    assert_eq!(l.wakeup(), Some(Duration::from_millis(1250)));
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(l.at(1, deliver(2, None)), [run(2)]);
    let effects = l.timeout_ms(1250);
    assert!(effects.contains(&tee(1)), "{effects:?}");
    assert!(
        !effects.contains(&tee(2)),
        "task 102 is not followed: {effects:?}"
    );
    assert_eq!(l.wakeup(), Some(Duration::from_millis(1500)));
    assert_eq!(l.timeout_ms(1500), [tee(1)]);
    // Not renewed: it lapses, and nothing wakes the launcher for it.
    assert_eq!(l.timeout(11), []);
    assert_eq!(
        l.wakeup(),
        Some(Duration::from_millis(1_001_250)),
        "the heartbeat only"
    );
    // Followed again while it runs: at once, for 30 s at most.
    assert_eq!(l.at(12, follow(101, u64::MAX)), []);
    assert_eq!(l.wakeup(), Some(Duration::from_secs(12)));
    assert_eq!(l.timeout(12), [tee(1)]);
    assert_eq!(l.timeout(41), [tee(1)]);
    // The rest goes with the result.
    assert_eq!(l.at(41, ended(1)), [Effect::Report { tag: 1 }]);
    assert_eq!(l.at(41, ended(2)), [Effect::Report { tag: 2 }]);
    assert_eq!(l.timeout(43), []);
}

#[test]
fn follows_are_bounded_in_number() {
    let mut l = launcher(|_, _| {});
    for task in 0..300 {
        l.at(
            1,
            Event::Message(LauncherMsg::Follow { task, for_ms: 5000 }),
        );
    }
    assert_eq!(l.state.followed.len(), MOST_FOLLOWED);
    l.at(
        1,
        Event::Message(LauncherMsg::Follow {
            task: 0,
            for_ms: 9000,
        }),
    );
    assert_eq!(
        l.state.followed.len(),
        MOST_FOLLOWED,
        "a renewal still counts"
    );
}

#[test]
fn status_on_poll_and_on_heartbeat() {
    let mut l = launcher(|config, _| config.heartbeat = Duration::from_secs(30));
    assert_eq!(l.at(5, deliver(1, None)), [run(1)]);
    assert!(matches!(l.timeout(5)[..], [Effect::SendStatus(_)]));
    assert_eq!(l.at(6, deliver(2, None)), [run(2)]);
    assert_eq!(l.at(10, ended(1)), [Effect::Report { tag: 1 }]);
    assert_eq!(l.at(11, settled(1)), []);
    let status = Status {
        running: vec![Running {
            task: 102,
            preemptions: 0,
            started: l.t0 + Duration::from_secs(6),
        }],
        completed: 1,
    };
    assert_eq!(
        l.at(12, Event::Message(LauncherMsg::Poll {})),
        [Effect::SendStatus(status.clone())]
    );
    assert_eq!(l.wakeup(), Some(Duration::from_secs(35)));
    assert_eq!(l.timeout(34), []);
    assert_eq!(l.timeout(35), [Effect::SendStatus(status)]);
    assert_eq!(l.wakeup(), Some(Duration::from_secs(65)));
}

#[test]
fn a_broker_failure_abandons_tasks_and_leaves_with_the_error() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(
        l.at(2, Event::Failed("channel closed")),
        [Effect::StopTasks]
    );
    assert!(!l.state.consuming() && !l.state.listening());
    // The first reason stands.
    assert_eq!(l.at(2, Event::QueueGone), []);
    assert_eq!(
        l.at(3, killed(1)),
        [
            Effect::Abandon { tag: 1 },
            Effect::Leave(Err("channel closed"))
        ]
    );
}

#[test]
fn the_first_task_after_idleness_is_told_at_once_then_by_heartbeat() {
    let mut l = launcher(|_, _| {});
    assert!(l.at(1, deliver(1, None)).contains(&run(1)));
    assert_eq!(l.wakeup(), Some(Duration::from_secs(1)), "a status now");
    let sent = l.timeout(1);
    assert!(
        matches!(&sent[..], [Effect::SendStatus(s)] if s.running.len() == 1),
        "{sent:?}"
    );
    // Busy, and said so: the next task waits for the heartbeat.
    l.at(2, deliver(2, None));
    assert_eq!(l.wakeup(), Some(Duration::from_secs(1001)), "the heartbeat");
}

#[test]
fn a_bundle_runs_as_slots_free_and_its_unstarted_tasks_go_back_untouched() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(1, deliver(1, None)), [run(1)]);
    assert_eq!(l.at(1, deliver(2, None)), [run(2)]);
    // Two slots busy: the rest of the bundle waits.
    assert_eq!(l.at(1, deliver(3, None)), []);
    assert_eq!(l.at(1, deliver(4, None)), []);
    assert_eq!(l.at(1, deliver(5, None)), []);
    // A task of 1 s: the next ones are read ahead.
    assert_eq!(
        l.at(2, ended(1)),
        [Effect::Report { tag: 1 }, run(3), Effect::Prefetch(4)]
    );
    let running = |l: &mut Launcher| -> Vec<u64> {
        match &l.at(2, Event::Message(LauncherMsg::Poll {}))[..] {
            [Effect::SendStatus(status)] => status.running.iter().map(|r| r.task).collect(),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(running(&mut l), vec![102, 103]);
    // Its result took 1 s to be confirmed: two more messages are held.
    assert_eq!(l.at(3, settled(1)), [Effect::Prefetch(6)]);
    assert_eq!(
        l.at(4, preempt()),
        [
            Effect::StopTasks,
            Effect::StopConsuming,
            Effect::GiveBack { tag: 4 },
            Effect::GiveBack { tag: 5 }
        ]
    );
    assert_eq!(l.at(4, killed(2)), [Effect::Republish { tag: 2 }]);
    assert_eq!(l.at(4, killed(3)), [Effect::Republish { tag: 3 }]);
    assert_eq!(l.at(5, Event::TasksEnded), []);
    for tag in [2, 3, 4] {
        assert_eq!(l.at(5, settled(tag)), []);
    }
    assert_eq!(l.at(5, settled(5)), [Effect::Leave(Ok(Exit::Preempted))]);
}

#[test]
fn short_tasks_are_read_ahead_and_long_ones_are_not() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.state.prefetch(), 2, "one per slot to begin with");
    let mut at = 0;
    // Runs `tag` for `secs` and returns the effects of its end but the
    // report and the next start.
    let mut run_for = |l: &mut Launcher, tag: u64, secs: u64| -> Effects {
        assert_eq!(l.at(at, deliver(tag, None)), [run(tag)]);
        at += secs;
        let effects = l.at(at, ended(tag));
        assert_eq!(l.at(at, settled(tag)), []);
        effects
            .into_iter()
            .filter(|e| *e != Effect::Report { tag })
            .collect()
    };
    assert_eq!(run_for(&mut l, 1, 2), [Effect::Prefetch(4)]);
    assert_eq!(l.state.prefetch(), 4);
    // Longer tasks move the average, which must pass 20 s to stop it.
    assert_eq!(run_for(&mut l, 2, 60), []);
    assert_eq!(run_for(&mut l, 3, 60), [Effect::Prefetch(2)]);
    assert_eq!(run_for(&mut l, 4, 1), []);
    // A task killed mid-run says nothing of its run time.
    assert_eq!(l.at(at, deliver(5, None)), [run(5)]);
    l.at(at, preempt());
    assert_eq!(l.at(at, killed(5)), [Effect::Republish { tag: 5 }]);
}

#[test]
fn read_ahead_covers_the_messages_that_wait_for_their_confirms() {
    // Two slots, 1 s tasks whose results take 4 s to be confirmed: two
    // messages end a second, so eight wait for confirms at any time.
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(0, deliver(1, None)), [run(1)]);
    assert!(l.at(1, ended(1)).contains(&Effect::Prefetch(4)));
    assert_eq!(l.at(5, settled(1)), [Effect::Prefetch(12)]);
    // A small drift keeps the consumer it has.
    assert_eq!(l.at(5, deliver(2, None)), [run(2)]);
    l.at(6, ended(2));
    assert_eq!(l.at(11, settled(2)), []);
    assert_eq!(l.state.prefetch(), 12);
    // Confirms that take forever hold eight messages a slot at most.
    assert_eq!(l.at(11, deliver(3, None)), [run(3)]);
    l.at(12, ended(3));
    assert_eq!(l.at(500, settled(3)), [Effect::Prefetch(16)]);

    // Bundles of 32 end a message every 16 s: none waits.
    let mut l = launcher(|_, _| {});
    for tag in 1..=10 {
        let bundled = Event::Delivered {
            tag,
            task: 100 + tag,
            preemptions: 0,
            walltime: None,
            message_tasks: 32,
            shape: None,
        };
        let t = tag * 6;
        assert_eq!(l.at(t, bundled), [run(tag)]);
        l.at(t + 1, ended(tag));
        l.at(t + 5, settled(tag));
    }
    assert_eq!(l.state.prefetch(), 4);
}

#[test]
fn no_read_ahead_once_leaving() {
    let mut l = launcher(|_, _| {});
    assert_eq!(l.at(0, deliver(1, None)), [run(1)]);
    assert_eq!(l.at(1, drain()), [Effect::StopConsuming]);
    assert_eq!(l.at(2, ended(1)), [Effect::Report { tag: 1 }]);
    assert_eq!(l.state.prefetch(), 2);
}

#[test]
fn a_waiting_task_is_abandoned_with_the_job_and_given_back_when_it_no_longer_fits() {
    let mut l = launcher(|_, _| {});
    for tag in 1..=3 {
        l.at(1, deliver(tag, None));
    }
    assert_eq!(
        l.at(2, Event::QueueGone),
        [Effect::StopTasks, Effect::Abandon { tag: 3 }]
    );
    assert_eq!(l.at(3, killed(1)), [Effect::Abandon { tag: 1 }]);
    assert_eq!(
        l.at(3, killed(2)),
        [Effect::Abandon { tag: 2 }, Effect::Leave(Ok(Exit::JobOver))]
    );

    // Tasks stop at 190 s: the waiting 60 s task fits at 100 s, not at 140 s.
    let mut l = placeholder();
    assert_eq!(l.at(100, deliver(1, Some(60))), [run(1)]);
    assert_eq!(l.at(100, deliver(2, Some(60))), [run(2)]);
    assert_eq!(l.at(100, deliver(3, Some(60))), []);
    assert_eq!(l.at(100, deliver(4, Some(60))), []);
    assert_eq!(
        l.at(140, ended(1)),
        [
            Effect::Report { tag: 1 },
            Effect::GiveBack { tag: 3 },
            Effect::StopConsuming,
            Effect::GiveBack { tag: 4 }
        ]
    );
}

#[test]
fn each_running_task_has_gpus_of_its_own_and_one_without_free_ones_waits() {
    let gpu_each = |config: &mut LauncherConfig, _| {
        config.task_needs.gpus = 1;
    };
    let run_on = |tag, gpu: &str| Effect::Run {
        tag,
        gpus: vec![gpu.to_owned()],
    };
    let mut l = launcher_holding(&["1", "0"], gpu_each);
    assert_eq!(l.at(1, deliver(1, None)), [run_on(1, "0")]);
    assert_eq!(l.at(1, deliver(2, None)), [run_on(2, "1")]);
    l.at(2, ended(1));
    assert_eq!(
        l.at(3, deliver(3, None)),
        [run_on(3, "0")],
        "its devices free again"
    );
    // Two slots and one device: the second task waits for the first's.
    let mut l = launcher_holding(&["0"], gpu_each);
    assert_eq!(l.at(1, deliver(1, None)), [run_on(1, "0")]);
    assert_eq!(l.at(1, deliver(2, None)), []);
    assert!(l.at(2, ended(1)).contains(&run_on(2, "0")));
}
