use std::time::Instant;

use gleaner_protocol::{
    LauncherId, LauncherInfo, LauncherStatus, RunStatus, RunningTask, TaskBundle,
};

use super::*;
use crate::{
    job::testing::{GRACE, SILENCE, at, grow_ack, opening, recorded, result, submission, told},
    records::read_index,
};
use gleaner_manifest::MAX_TASK_BYTES;

/// A sweep of `tasks` tasks (`echo 0` … ), retried up to `max_attempts`.
fn manifest(tasks: u64, max_attempts: u32) -> String {
    format!(
        "name = \"sweep\"\nmax_attempts = {max_attempts}\n\
             [sweep]\ncommand = \"echo {{i}}\"\nparams = {{ i = {{ from = 0, to = {} }} }}\n",
        tasks - 1
    )
}

/// A new sweep, started at `start`.
fn started(tasks: u64, max_attempts: u32, start: Instant) -> Job<Sweep> {
    started_as(&submission(&manifest(tasks, max_attempts)), start)
}

/// The job of `submission`, new, started at `start`, its tasks with the
/// broker.
fn started_as(submission: &gleaner_protocol::Submission, start: Instant) -> Job<Sweep> {
    let mut sweep = Sweep::open(
        opening(submission, vec![], None),
        tasks_of(submission),
        at(start, 0),
    )
    .unwrap();
    let effects = sweep.start();
    with_broker(&mut sweep, &effects);
    sweep
}

/// What the shell does once each publication in `effects` is with the
/// broker.
fn with_broker(sweep: &mut Job<Sweep>, effects: &[Effect]) {
    for effect in effects {
        if let Effect::PublishFirst(first) = effect {
            sweep.on_published(first.completes());
        }
    }
}

fn tasks_of(submission: &gleaner_protocol::Submission) -> TaskList {
    TaskList::new(&submission.manifest).unwrap()
}

fn up(launcher: &str, cluster: &str, slots: u32) -> ControlMsg {
    ControlMsg::LauncherUp(LauncherInfo {
        launcher: launcher.into(),
        cluster: cluster.into(),
        host: "node1".into(),
        slots,
        started_at: 0,
        deadline: None,
        heartbeat_ms: None,
    })
}

/// A heartbeat of a launcher running tasks started at these times.
fn status(launcher: &str, cluster: &str, started: &[u64]) -> ControlMsg {
    ControlMsg::LauncherStatus(LauncherStatus {
        launcher: launcher.into(),
        cluster: cluster.into(),
        host: "node1".into(),
        running: started
            .iter()
            .enumerate()
            .map(|(task, &started_at)| RunningTask {
                task: task as u64,
                started_at,
                preemptions: 0,
            })
            .collect(),
        completed: 0,
        heartbeat_ms: None,
    })
}

fn offer(cluster: &str, slots: u32) -> ControlMsg {
    ControlMsg::GrowOffer {
        grant: GrantId::new(7),
        cluster: cluster.into(),
        slots,
    }
}

fn shrink(cluster: &str, slots: u32, mode: ShrinkMode) -> ControlMsg {
    ControlMsg::Shrink {
        cluster: cluster.into(),
        slots,
        mode,
        reason: "a grid job".into(),
        hosts: Vec::new(),
    }
}

fn owned(pairs: &[(&str, &'static str)]) -> Vec<(String, &'static str)> {
    pairs
        .iter()
        .map(|&(to, kind)| (to.to_owned(), kind))
        .collect()
}

#[test]
fn grow_accepts_what_unfinished_tasks_can_keep_busy() {
    let t0 = Instant::now();
    let mut sweep = started(5, 1, t0);
    let effects = sweep.on_control(offer("c1", 3), at(t0, 1));
    assert_eq!(grow_ack(&effects), Some(3));
    assert!(matches!(
        &effects[1],
        Effect::ToKcm { cluster, msg: KcmMsg::StartLaunchers { grant, slots: 3, .. }, followup: Followup::Grow { offered: 3, .. } }
            if cluster.as_str() == "c1" && *grant == GrantId::new(7)
    ));
    for launcher in ["a", "b", "c"] {
        sweep.on_control(up(launcher, "c1", 1), at(t0, 2));
    }
    let effects = sweep.on_control(offer("c2", 4), at(t0, 3));
    assert_eq!(grow_ack(&effects), Some(2), "5 tasks, 3 slots already");
    assert_eq!(told(&effects), owned(&[("c2", "start_launchers")]));
    sweep.on_control(up("d", "c2", 2), at(t0, 4));
    let effects = sweep.on_control(offer("c2", 4), at(t0, 5));
    assert_eq!(grow_ack(&effects), Some(0));
    assert!(told(&effects).is_empty(), "no launchers asked for");
}

#[test]
fn launchers_silent_too_long_are_forgotten_and_their_placeholders_removed() {
    let t0 = Instant::now();
    let mut sweep = started(10, 3, t0);
    sweep.on_control(up("a", "c1", 1), at(t0, 1));
    sweep.on_control(up("b", "c2", 1), at(t0, 20));
    let effects = sweep.poll(at(t0, 1 + SILENCE.as_secs() + 1));
    let released: Vec<(String, Vec<LauncherId>, u64)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::ToKcm {
                cluster,
                msg:
                    KcmMsg::Release {
                        launchers,
                        grace_ms,
                        ..
                    },
                ..
            } => Some((cluster.to_string(), launchers.clone(), *grace_ms)),
            _ => None,
        })
        .collect();
    assert_eq!(
        released,
        [("c1".to_owned(), vec![LauncherId::from("a")], 0)],
        "only the silent one, removed at once"
    );
    let report = sweep.standing(at(t0, 33));
    assert_eq!(report.launchers.get("c1"), None);
    assert_eq!(report.launchers.get("c2"), Some(&1));
}

#[test]
fn grow_is_refused_once_every_task_is_final() {
    let t0 = Instant::now();
    let mut sweep = started(2, 1, t0);
    let results = [
        result(0, 1, RunStatus::Succeeded),
        result(1, 1, RunStatus::Failed),
    ];
    sweep.on_results(results.clone(), at(t0, 1));
    assert_eq!(sweep.ending(), Some(JobState::Done));
    let effects = sweep.on_control(offer("c1", 4), at(t0, 2));
    assert_eq!(grow_ack(&effects), Some(0));
    assert!(told(&effects).is_empty());
}

#[test]
fn a_cluster_counts_as_the_jobs_once_its_kcm_has_the_grow() {
    let t0 = Instant::now();
    let mut sweep = started(4, 1, t0);
    let grow = |cluster: &str| Followup::Grow {
        cluster: cluster.into(),
        grant: GrantId::new(7),
        slots: 1,
        offered: 1,
    };
    assert!(
        sweep
            .on_delivery(grow("nokcm"), false, at(t0, 1))
            .is_empty()
    );
    assert!(sweep.on_delivery(grow("c1"), true, at(t0, 1)).is_empty());
    let effects = sweep.wind_up(at(t0, 1));
    assert_eq!(
        told(&effects),
        owned(&[("c1", "job_ended")]),
        "only c1 is told of the end"
    );
}

#[test]
fn shrink_stops_idle_launchers_first_then_those_losing_least_work() {
    let t0 = Instant::now();
    let mut sweep = started(10, 1, t0);
    for launcher in ["a", "b", "c"] {
        sweep.on_control(up(launcher, "c1", 1), at(t0, 1));
    }
    sweep.on_control(up("d", "c2", 1), at(t0, 1));
    sweep.on_control(status("a", "c1", &[100]), at(t0, 2));
    sweep.on_control(status("b", "c1", &[200]), at(t0, 2));
    let effects = sweep.on_control(shrink("c1", 2, ShrinkMode::Preempt), at(t0, 3));
    assert_eq!(
        told(&effects),
        owned(&[("c", "preempt"), ("b", "preempt"), ("c1", "release")]),
        "idle c, then b whose task started last"
    );
    assert!(matches!(
        effects.last(),
        Some(Effect::ToKcm { msg: KcmMsg::Release { launchers, grace_ms, .. }, .. })
            if *launchers == ["c", "b"].map(LauncherId::from) && *grace_ms == GRACE.as_millis() as u64
    ));
    let effects = sweep.on_control(shrink("c1", 1, ShrinkMode::Drain), at(t0, 4));
    assert_eq!(
        told(&effects),
        owned(&[("a", "drain")]),
        "a drain releases nothing"
    );
    let report = sweep.standing(at(t0, 5));
    assert_eq!(
        report.launchers.get("c1"),
        None,
        "leaving launchers are not capacity"
    );
    assert_eq!(report.launchers["c2"], 1);
}

/// A new sweep of 10 tasks whose shrinks choose launchers by `victims`.
fn choosing(victims: preempt::VictimChoice, start: Instant) -> Job<Sweep> {
    let submission = submission(&manifest(10, 1));
    let mut opening = opening(&submission, vec![], None);
    opening.settings.victims = victims;
    let mut sweep = Sweep::open(opening, tasks_of(&submission), at(start, 0)).unwrap();
    let effects = sweep.start();
    with_broker(&mut sweep, &effects);
    sweep
}

/// The launchers the first shrink of one slot on c1 takes back, of
/// busy a and b and idle c.
fn first_taken(victims: preempt::VictimChoice) -> Vec<(String, &'static str)> {
    let t0 = Instant::now();
    let mut sweep = choosing(victims, t0);
    for launcher in ["a", "b", "c"] {
        sweep.on_control(up(launcher, "c1", 1), at(t0, 1));
    }
    sweep.on_control(status("a", "c1", &[100]), at(t0, 2));
    sweep.on_control(status("b", "c1", &[200]), at(t0, 2));
    told(&sweep.on_control(shrink("c1", 1, ShrinkMode::Preempt), at(t0, 3)))
}

#[test]
fn a_random_choice_of_launchers_takes_busy_ones_too_and_repeats_by_seed() {
    use preempt::VictimChoice::{LeastLoss, Random};
    assert_eq!(
        first_taken(LeastLoss),
        owned(&[("c", "preempt"), ("c1", "release")])
    );
    let mut taken = BTreeSet::new();
    for seed in 0..30 {
        let first = first_taken(Random { seed });
        assert_eq!(
            first,
            first_taken(Random { seed }),
            "the same seed, the same"
        );
        assert_eq!(first.len(), 2, "one launcher and the release: {first:?}");
        taken.insert(first[0].0.clone());
    }
    assert_eq!(taken.len(), 3, "any of the three: {taken:?}");
    // Each shrink draws anew: the job's launchers do not all go in
    // the same order as the first shrink's.
    let t0 = Instant::now();
    let mut sweep = choosing(Random { seed: 1 }, t0);
    let mut orders = BTreeSet::new();
    for round in 0..10 {
        for launcher in ["a", "b", "c", "d"] {
            sweep.on_control(up(&format!("{launcher}{round}"), "c1", 1), at(t0, 1));
        }
        let effects = sweep.on_control(shrink("c1", 4, ShrinkMode::Preempt), at(t0, 2));
        let order: Vec<String> = told(&effects)
            .into_iter()
            .filter(|(_, kind)| *kind == "preempt")
            .map(|(to, _)| to[..1].to_owned())
            .collect();
        orders.insert(order);
    }
    assert!(orders.len() > 1, "{orders:?}");
}

#[test]
fn launchers_given_up_for_their_silence_are_counted() {
    let t0 = Instant::now();
    let mut sweep = started(10, 1, t0);
    for launcher in ["a", "b", "c"] {
        sweep.on_control(up(launcher, "c1", 1), at(t0, 0));
    }
    sweep.on_control(status("c", "c1", &[]), at(t0, 8));
    // a and b are polled; a's queue is gone, b's is there.
    assert_eq!(
        told(&sweep.poll(at(t0, 11))),
        owned(&[("a", "poll"), ("b", "poll")])
    );
    for (launcher, arrived) in [("a", false), ("b", true)] {
        let poll = Followup::Poll {
            launcher: launcher.into(),
        };
        sweep.on_delivery(poll, arrived, at(t0, 11));
    }
    assert_eq!(sweep.kind().launcher_timeouts(), 1, "a");
    // b stays silent: forgotten for it.
    sweep.on_control(status("c", "c1", &[]), at(t0, SILENCE.as_secs()));
    sweep.poll(at(t0, SILENCE.as_secs() + 1));
    assert_eq!(sweep.kind().launcher_timeouts(), 2, "a and b");
    // A launcher that left, or was told to, is no time-out.
    sweep.on_control(
        ControlMsg::LauncherGone {
            launcher: "c".into(),
            cluster: "c1".into(),
            reason: "drained".into(),
        },
        at(t0, SILENCE.as_secs() + 1),
    );
    let poll = Followup::Poll {
        launcher: "c".into(),
    };
    sweep.on_delivery(poll, false, at(t0, SILENCE.as_secs() + 2));
    assert_eq!(sweep.kind().launcher_timeouts(), 2);
}

#[test]
fn a_launcher_whose_queue_is_gone_is_forgotten_when_told_to_leave() {
    let t0 = Instant::now();
    let mut sweep = started(10, 1, t0);
    sweep.on_control(up("a", "c1", 1), at(t0, 1));
    sweep.on_control(status("a", "c1", &[100]), at(t0, 1));
    sweep.on_control(shrink("c1", 1, ShrinkMode::Drain), at(t0, 2));
    assert_eq!(
        sweep.standing(at(t0, 3)).tasks.running,
        1,
        "draining, still running"
    );
    sweep.on_delivery(
        Followup::Leave {
            launcher: "a".into(),
        },
        false,
        at(t0, 3),
    );
    assert_eq!(sweep.standing(at(t0, 3)).tasks.running, 0);
}

#[test]
fn a_shrink_beyond_the_clusters_launchers_is_owed_to_the_next_ones_up() {
    let t0 = Instant::now();
    let mut sweep = started(10, 1, t0);
    sweep.on_control(up("a", "c1", 1), at(t0, 1));
    let effects = sweep.on_control(shrink("c1", 3, ShrinkMode::Preempt), at(t0, 2));
    assert_eq!(
        told(&effects),
        owned(&[("a", "preempt"), ("c1", "release")])
    );
    assert!(
        told(&sweep.on_control(up("x", "c2", 1), at(t0, 3))).is_empty(),
        "owed on c1 only"
    );
    let effects = sweep.on_control(up("b", "c1", 1), at(t0, 4));
    assert_eq!(
        told(&effects),
        owned(&[("b", "preempt"), ("c1", "release")])
    );
    let effects = sweep.on_control(up("c", "c1", 1), at(t0, 5));
    assert_eq!(
        told(&effects),
        owned(&[("c", "preempt"), ("c1", "release")])
    );
    assert!(
        told(&sweep.on_control(up("d", "c1", 1), at(t0, 6))).is_empty(),
        "the 3 slots are given back"
    );
}

#[test]
fn a_launcher_up_is_relayed_to_its_kcm() {
    let t0 = Instant::now();
    let mut sweep = started(10, 1, t0);
    let effects = sweep.on_control(up("a", "c1", 1), at(t0, 1));
    assert!(
        matches!(
            effects.as_slice(),
            [Effect::ToKcm { cluster, msg: KcmMsg::LauncherUp { job, launcher }, followup: Followup::Nothing }]
                if cluster.as_str() == "c1" && launcher.as_str() == "a" && job == sweep.ledger().id()
        ),
        "{effects:?}"
    );
}

#[test]
fn gpus_a_launcher_found_claimed_are_relayed_to_its_kcm() {
    let t0 = Instant::now();
    let mut sweep = started(10, 1, t0);
    let held = gleaner_protocol::GpusHeld {
        launcher: "c1-7.1".into(),
        cluster: "c1".into(),
        host: "n1".into(),
        devices: vec!["0".into()],
    };
    let effects = sweep.on_control(ControlMsg::GpusHeld(held.clone()), at(t0, 1));
    assert!(
        matches!(
            effects.as_slice(),
            [Effect::ToKcm { cluster, msg: KcmMsg::GpusHeld { job, held: relayed }, followup: Followup::Nothing }]
                if cluster.as_str() == "c1" && *relayed == held && job == sweep.ledger().id()
        ),
        "{effects:?}"
    );
}

#[test]
fn an_owed_shrink_lapses() {
    let t0 = Instant::now();
    let mut sweep = started(10, 1, t0);
    sweep.on_control(shrink("c1", 2, ShrinkMode::Preempt), at(t0, 1));
    sweep.standing(at(t0, 1 + OWED_SHRINK_LIFETIME.as_secs()));
    assert!(told(&sweep.on_control(up("a", "c1", 1), at(t0, 40))).is_empty());
}

#[test]
fn silent_launchers_are_polled_once_and_forgotten_if_gone() {
    let t0 = Instant::now();
    let mut sweep = started(10, 1, t0);
    sweep.on_control(up("a", "c1", 1), at(t0, 0));
    sweep.on_control(up("b", "c1", 1), at(t0, 0));
    sweep.on_control(status("b", "c1", &[]), at(t0, 8));
    let effects = sweep.poll(at(t0, 11));
    assert_eq!(
        told(&effects),
        owned(&[("a", "poll")]),
        "silent for two heartbeats"
    );
    assert!(sweep.poll(at(t0, 12)).is_empty(), "asked once");
    sweep.on_delivery(
        Followup::Poll {
            launcher: "b".into(),
        },
        true,
        at(t0, 3),
    );
    sweep.on_delivery(
        Followup::Poll {
            launcher: "a".into(),
        },
        false,
        at(t0, 3),
    );
    assert_eq!(sweep.standing(at(t0, 12)).launchers["c1"], 1, "a is gone");
}

/// Today an expiry only forgets: nothing is sent about the launcher,
/// and its slot is offered to grows again.
#[test]
fn launchers_silent_too_long_are_forgotten_and_nothing_is_sent() {
    let t0 = Instant::now();
    let mut sweep = started(5, 1, t0);
    sweep.on_control(up("a", "c1", 1), at(t0, 0));
    sweep.on_control(up("b", "c1", 1), at(t0, 0));
    sweep.on_control(status("b", "c1", &[]), at(t0, 20));
    sweep.poll(at(t0, 31));
    let effects = sweep.report(at(t0, 31));
    assert!(told(&effects).is_empty(), "nobody told of the expiry");
    assert!(matches!(
        &effects[0],
        Effect::ToScheduler(SchedulerMsg::JobUpdate(report)) if report.launchers["c1"] == 1
    ));
    assert_eq!(
        grow_ack(&sweep.on_control(offer("c1", 5), at(t0, 32))),
        Some(4)
    );
    sweep.on_control(status("a", "c1", &[]), at(t0, 33));
    assert_eq!(
        sweep.standing(at(t0, 33)).launchers["c1"],
        2,
        "a launcher heard from again is adopted"
    );
}

#[test]
fn a_resumed_job_publishes_only_what_its_index_lacks() {
    let t0 = Instant::now();
    let submission = submission(&manifest(5, 1));
    let mut index =
        b"{\"task\":0,\"status\":\"succeeded\"}\n{\"task\":2,\"status\":\"failed\"}\n".to_vec();
    index.extend_from_slice(b"{\"task\":3,\"sta");
    let finished = read_index(&index[..]).unwrap().finished;
    let mut sweep = Sweep::open(
        opening(&submission, finished, None),
        tasks_of(&submission),
        at(t0, 0),
    )
    .unwrap();
    let effects = sweep.start();
    assert!(matches!(effects[0], Effect::PurgeTasks));
    let Effect::PublishFirst(first) = &effects[1] else {
        panic!("no publication: {effects:?}");
    };
    assert_eq!(first.tasks(), [1, 3, 4], "the torn line's task runs again");
    let msgs: Vec<TaskMsg> = first.each().collect();
    assert_eq!(msgs.len(), 3);
    assert_eq!(
        (msgs[1].task, msgs[1].attempt, msgs[1].command.as_str()),
        (3, 1, "echo 3")
    );
    assert!(matches!(
        effects[2..],
        [Effect::SaveJobFile, Effect::Report]
    ));
    assert!(
        !sweep.job_file().tasks_published,
        "not before the broker has every task"
    );
    let completes = first.completes();
    assert!(matches!(
        sweep.on_published(completes)[..],
        [Effect::SaveJobFile]
    ));
    let file = sweep.job_file();
    assert!(file.tasks_published);
    assert_eq!(
        (file.tasks.succeeded, file.tasks.failed, file.tasks.pending),
        (1, 1, 3)
    );

    let mut again = Sweep::open(
        opening(&submission, vec![], Some(file)),
        tasks_of(&submission),
        at(t0, 9),
    )
    .unwrap();
    let effects = again.start();
    assert!(
        matches!(effects[..], [Effect::SaveJobFile, Effect::Report]),
        "published before"
    );
}

#[test]
fn a_results_directory_of_another_job_is_refused() {
    let t0 = Instant::now();
    let submission = submission(&manifest(2, 1));
    let mut file = started(2, 1, t0).job_file();
    file.job = "other-0000000000000000".into();
    let refusal = Sweep::open(
        opening(&submission, vec![], Some(file)),
        tasks_of(&submission),
        at(t0, 0),
    )
    .unwrap_err();
    assert_eq!(refusal.owner, "other-0000000000000000");
}

#[test]
fn results_are_recorded_once_and_failures_retried_up_to_max_attempts() {
    let t0 = Instant::now();
    let mut sweep = started(3, 2, t0);
    let mut preempted = result(1, 1, RunStatus::Failed);
    preempted.preemptions = 2;
    let mut stranger = result(2, 1, RunStatus::Succeeded);
    stranger.job = "other-0000000000000000".parse().unwrap();
    let batch = [
        result(0, 1, RunStatus::Succeeded),
        result(0, 1, RunStatus::Succeeded),
        preempted,
        stranger,
    ];
    let effects = sweep.on_results(batch.clone(), at(t0, 1));
    let written: Vec<(u64, &str)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::WriteOutputs(r) => Some((r.task, "final")),
            Effect::WriteRetried(r) => Some((r.task, "retried")),
            _ => None,
        })
        .collect();
    assert_eq!(
        written,
        [(0, "final"), (1, "retried")],
        "outputs of the first result and of the failed run"
    );
    let Some(Effect::Publish(retries)) = effects.iter().find(|e| matches!(e, Effect::Publish(_)))
    else {
        panic!("no retry: {effects:?}");
    };
    assert_eq!(
        retries
            .iter()
            .map(|t| (t.task, t.attempt, t.preemptions))
            .collect::<Vec<_>>(),
        [(1, 2, 2)],
        "preemptions are carried, not counted as attempts"
    );
    assert!(
        matches!(effects.last(), Some(Effect::Record(_))),
        "recorded after the retry is out"
    );
    let entries = recorded(&effects);
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (
            entries[0].task,
            entries[0].status,
            entries[0].command.as_str()
        ),
        (0, FinalStatus::Succeeded, "echo 0")
    );

    let batch = [
        result(1, 1, RunStatus::Failed),
        result(1, 2, RunStatus::TimedOut),
    ];
    let effects = sweep.on_results(batch.clone(), at(t0, 2));
    let entries = recorded(&effects);
    assert_eq!(entries.len(), 1, "the stale first attempt is a duplicate");
    assert_eq!(
        (entries[0].task, entries[0].status, entries[0].attempts),
        (1, FinalStatus::TimedOut, 2)
    );
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::Publish(_))),
        "no third attempt"
    );
    let file = sweep.job_file();
    assert_eq!(file.duplicates, 2);
    assert_eq!(
        (
            file.tasks.succeeded,
            file.tasks.timed_out,
            file.tasks.pending
        ),
        (1, 1, 1)
    );
}

#[test]
fn final_results_count_their_preemptions_and_throughput() {
    let t0 = Instant::now();
    let mut sweep = started(3, 1, t0);
    let mut r = result(2, 1, RunStatus::Succeeded);
    r.preemptions = 3;
    let effects = sweep.on_results([r.clone()], at(t0, 10));
    assert_eq!(recorded(&effects)[0].preemptions, 3);
    let report = sweep.standing(at(t0, 20));
    assert_eq!(report.preemptions, 3);
    assert_eq!(report.throughput, 1.0 / 20.0);
    assert_eq!(
        sweep.standing(at(t0, 71)).throughput,
        0.0,
        "outside the window"
    );
}

fn alone(task: TaskMsg) -> TaskBundle {
    TaskBundle { tasks: vec![task] }
}

fn gone(launcher: &str) -> ControlMsg {
    ControlMsg::LauncherGone {
        launcher: launcher.into(),
        cluster: "c1".into(),
        reason: "exited".to_owned(),
    }
}

/// A launcher found dead: polled, its queue gone.
fn found_dead(sweep: &mut Job<Sweep>, launcher: &str, now: Now) {
    let poll = Followup::Poll {
        launcher: launcher.into(),
    };
    assert!(sweep.on_delivery(poll, false, now).is_empty());
}

fn letter(bundle: TaskBundle, receipt: u64) -> DeadLetter {
    DeadLetter {
        bundle,
        receipt,
        redelivered: false,
    }
}

fn settled(effects: &[Effect]) -> Vec<u64> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SettleLost(receipt) => Some(*receipt),
            _ => None,
        })
        .collect()
}

#[test]
fn a_lost_task_is_recorded_once() {
    let t0 = Instant::now();
    let mut sweep = started(2, 1, t0);
    sweep.on_control(up("a", "c1", 1), at(t0, 1));
    found_dead(&mut sweep, "a", at(t0, 2));
    let mut lost = sweep.kind().tasks.msg(1, 3, 1).unwrap();
    let effects = sweep.on_lost(letter(alone(lost.clone()), 7), at(t0, 3));
    assert!(
        matches!(effects.last(), Some(Effect::SettleLost(7))),
        "acked after the record: {effects:?}"
    );
    let entries = recorded(&effects);
    assert_eq!(
        (
            entries[0].task,
            entries[0].status,
            entries[0].attempts,
            entries[0].preemptions
        ),
        (1, FinalStatus::Lost, 3, 1)
    );
    let again = sweep.on_lost(letter(alone(lost.clone()), 8), at(t0, 4));
    assert!(matches!(again[..], [Effect::SettleLost(8)]), "{again:?}");
    lost.task = 0;
    lost.job = "other-0000000000000000".parse().unwrap();
    let other = sweep.on_lost(letter(alone(lost), 9), at(t0, 5));
    assert!(
        matches!(other[..], [Effect::SettleLost(9)]),
        "another job's task"
    );
}

/// The broker returns a delivery that reaches a consumer just
/// cancelled, and counts it: a task bounced so through a few launchers
/// is dead-lettered though none died.
#[test]
fn a_task_returned_with_no_launcher_dying_runs_again() {
    let t0 = Instant::now();
    let mut sweep = started(3, 1, t0);
    sweep.on_control(up("a", "c1", 1), at(t0, 1));
    sweep.on_control(up("b", "c1", 1), at(t0, 1));
    let task = sweep.kind().tasks.msg(1, 1, 0).unwrap();
    let heartbeat = sweep.ledger().settings().launcher_heartbeat;
    let window = JobSettings::death_noticed_within(heartbeat).as_secs();
    assert!(
        sweep
            .on_lost(letter(alone(task.clone()), 3), at(t0, 2))
            .is_empty(),
        "judged once a death would have been noticed"
    );
    // A goodbye is no death.
    sweep.on_control(gone("b"), at(t0, 3));
    sweep.on_control(status("a", "c1", &[]), at(t0, 2 + window / 2));
    let effects = sweep.poll(at(t0, 2 + window / 2));
    assert!(settled(&effects).is_empty(), "not yet");
    sweep.on_control(status("a", "c1", &[]), at(t0, 2 + window));
    let effects = sweep.poll(at(t0, 2 + window));
    assert_eq!(published(&effects), std::slice::from_ref(&task));
    assert!(recorded(&effects).is_empty());
    assert!(
        matches!(effects.last(), Some(Effect::SettleLost(3))),
        "acked after it is published: {effects:?}"
    );
    assert_eq!(sweep.ending(), None, "the task is still to run");

    // A launcher found dead soon after the next dead letter: lost.
    sweep.on_control(status("a", "c1", &[]), at(t0, 99));
    assert!(
        sweep
            .on_lost(letter(alone(task.clone()), 4), at(t0, 100))
            .is_empty()
    );
    found_dead(&mut sweep, "a", at(t0, 101));
    let effects = sweep.poll(at(t0, 100 + window));
    assert!(published(&effects).is_empty());
    assert_eq!(recorded(&effects)[0].status, FinalStatus::Lost);
    assert_eq!(settled(&effects), [4]);

    // One that ends while its dead letter waits is only acked.
    let other = sweep.kind().tasks.msg(2, 1, 0).unwrap();
    sweep.on_lost(letter(alone(other), 5), at(t0, 200));
    sweep.on_results([result(2, 1, RunStatus::Succeeded)], at(t0, 201));
    let effects = sweep.poll(at(t0, 200 + window));
    assert_eq!(settled(&effects), [5]);
    assert!(published(&effects).is_empty() && recorded(&effects).is_empty());
}

#[test]
fn bundles_of_long_commands_stop_at_their_bytes() {
    let t0 = Instant::now();
    let long = "x".repeat(100_000);
    let text = format!(
        "name = \"sweep\"\nbundle = 1000\n\
             [sweep]\ncommand = \"echo {long} {{i}}\"\nparams = {{ i = {{ from = 0, to = 99 }} }}\n"
    );
    let (_, effects) = new_sweep(&text, t0);
    let Some(Effect::PublishFirst(first)) = effects
        .iter()
        .find(|e| matches!(e, Effect::PublishFirst(_)))
    else {
        panic!("no publication: {effects:?}");
    };
    let bundles: Vec<TaskBundle> = (0..first.chunk_count(1000))
        .flat_map(|i| first.chunk(i, 1000))
        .collect();
    assert_eq!(bundles.iter().map(|b| b.tasks.len()).sum::<usize>(), 100);
    assert!(bundles.len() >= 3, "{} bundles", bundles.len());
    for bundle in &bundles {
        let encoded = gleaner_protocol::codec::encode("runner", bundle).unwrap();
        assert!(
            encoded.len() <= gleaner_protocol::BUNDLE_BYTES,
            "{}",
            encoded.len()
        );
    }
}

#[test]
fn first_attempts_go_in_bundles_and_a_lost_bundle_comes_back_alone() {
    let t0 = Instant::now();
    let (mut sweep, effects) = new_sweep(&format!("bundle = 4\n{}", manifest(10, 1)), t0);
    let Some(Effect::PublishFirst(first)) = effects
        .iter()
        .find(|e| matches!(e, Effect::PublishFirst(_)))
    else {
        panic!("no publication: {effects:?}");
    };
    // Chunks of about 3 tasks are whole bundles of 4.
    assert_eq!(first.chunk_count(3), 3);
    let bundles: Vec<Vec<u64>> = (0..first.chunk_count(3))
        .flat_map(|i| first.chunk(i, 3))
        .map(|b| b.tasks.iter().map(|t| t.task).collect())
        .collect();
    assert_eq!(bundles, [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    sweep.on_results([result(5, 1, RunStatus::Succeeded)], at(t0, 1));
    let lost = first.chunk(1, 3).remove(0);
    let effects = sweep.on_lost(letter(lost, 1), at(t0, 2));
    assert_eq!(
        published(&effects)
            .iter()
            .map(|t| (t.task, t.attempt))
            .collect::<Vec<_>>(),
        [(4, 1), (6, 1), (7, 1)],
        "the unfinished ones, alone, nothing recorded lost"
    );
    assert!(recorded(&effects).is_empty());
    assert_eq!(settled(&effects), [1]);
    let mut task = letter(alone(sweep.kind().tasks.msg(6, 1, 0).unwrap()), 2);
    task.redelivered = true;
    let effects = sweep.on_lost(task, at(t0, 3));
    assert_eq!(recorded(&effects)[0].status, FinalStatus::Lost);
}

#[test]
fn the_job_ends_when_every_task_is_final() {
    let t0 = Instant::now();
    let mut sweep = started(2, 1, t0);
    sweep.on_control(up("a", "c1", 1), at(t0, 1));
    sweep.on_control(status("b", "c2", &[]), at(t0, 1));
    sweep.on_results([result(0, 1, RunStatus::Succeeded)], at(t0, 2));
    assert_eq!(sweep.ending(), None);
    sweep.on_results([result(1, 1, RunStatus::Succeeded)], at(t0, 3));
    assert_eq!(sweep.ending(), Some(JobState::Done));
    assert!(matches!(
        sweep.finish(JobState::Done, at(t0, 4))[..],
        [Effect::SaveJobFile]
    ));
    let file = sweep.job_file();
    assert_eq!(file.state, JobState::Done);
    assert_eq!(file.finished_at, Some(at(t0, 4).wall_ms));
    assert_eq!(
        file.makespan_s,
        Some((at(t0, 4).wall_ms - 1_000) as f64 / 1000.0)
    );
    let effects = sweep.wind_up(at(t0, 4));
    let [done, to_scheduler, .., delete] = effects.as_slice() else {
        panic!("{effects:?}")
    };
    assert!(
        matches!(done, Effect::Event(gleaner_protocol::Event::Done(report)) if report.state == JobState::Done),
        "watchers and the history first"
    );
    assert!(matches!(
        to_scheduler,
        Effect::ToScheduler(SchedulerMsg::JobDone { .. })
    ));
    assert_eq!(
        told(&effects),
        owned(&[("c1", "job_ended"), ("c2", "job_ended")])
    );
    assert!(matches!(delete, Effect::DeleteQueues), "news first");
}

#[test]
fn cancel_gives_what_is_unfinished_a_final_state_and_ends_the_job() {
    let t0 = Instant::now();
    let mut sweep = started(3, 1, t0);
    sweep.on_results([result(1, 1, RunStatus::Succeeded)], at(t0, 1));
    let effects = sweep.on_control(
        ControlMsg::Cancel {
            reason: "user".into(),
        },
        at(t0, 2),
    );
    let entries = recorded(&effects);
    assert_eq!(
        entries
            .iter()
            .map(|e| (e.task, e.status))
            .collect::<Vec<_>>(),
        [(0, FinalStatus::Cancelled), (2, FinalStatus::Cancelled)]
    );
    assert!(
        matches!(effects.last(), Some(Effect::SaveJobFile)),
        "on disk before the ack"
    );
    assert_eq!(sweep.job_file().state, JobState::Cancelled);
    assert_eq!(sweep.ending(), Some(JobState::Cancelled));
    assert_eq!(
        grow_ack(&sweep.on_control(offer("c1", 2), at(t0, 3))),
        Some(0)
    );
}

#[test]
fn watchers_hear_of_progress_only() {
    let t0 = Instant::now();
    let mut sweep = started(3, 1, t0);
    assert_eq!(
        sweep.report(at(t0, 1)).len(),
        3,
        "update, progress event, job.json"
    );
    let effects = sweep.report(at(t0, 2));
    assert!(matches!(
        effects[..],
        [Effect::ToScheduler(SchedulerMsg::JobUpdate(_))]
    ));
    sweep.on_results([result(1, 1, RunStatus::Succeeded)], at(t0, 3));
    assert!(matches!(
        sweep.report(at(t0, 4))[1],
        Effect::Event(gleaner_protocol::Event::Progress(ref report)) if report.tasks.succeeded == 1
    ));
}

/// A sweep of two tasks with a final step, `when` it runs.
/// Tasks first published in these effects, by number.
/// The first publication among `effects`, as (tasks, bundle, completes).
fn first_publication(effects: &[Effect]) -> Option<(Vec<u64>, usize, Publication)> {
    effects.iter().find_map(|e| match e {
        Effect::PublishFirst(first) => {
            Some((first.tasks().to_vec(), first.bundle(), first.completes()))
        }
        _ => None,
    })
}

#[test]
fn a_followed_tasks_launcher_is_asked_for_its_output_which_goes_to_its_followers() {
    use gleaner_protocol::{MAX_PIECE_BYTES, OutputPiece, StreamPiece};
    let t0 = Instant::now();
    let (mut sweep, effects) = new_sweep(&manifest(10, 1), t0);
    let (_, _, completes) = first_publication(&effects).unwrap();
    sweep.on_published(completes);
    sweep.on_control(up("l1", "c1", 1), at(t0, 1));
    sweep.on_control(up("l2", "c1", 2), at(t0, 1));
    // l2 runs tasks 0 and 1.
    sweep.on_control(status("l2", "c1", &[0, 0]), at(t0, 1));
    let to = "amq.rabbitmq.reply-to.abc";
    let follow = |task| ControlMsg::Follow {
        task,
        reply_to: Some(to.into()),
    };
    let asked = |effects: Vec<Effect>| -> Vec<(String, u64)> {
        effects
            .into_iter()
            .filter_map(|e| match e {
                Effect::ToLauncher {
                    launcher,
                    msg: LauncherMsg::Follow { task, .. },
                    ..
                } => Some((launcher.to_string(), task)),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        asked(sweep.on_control(follow(1), at(t0, 2))),
        [("l2".to_owned(), 1)]
    );
    // Task 5 runs nowhere a launcher said: every one is asked.
    assert_eq!(asked(sweep.on_control(follow(5), at(t0, 2))).len(), 2);
    let piece = |task| OutputPiece {
        task,
        attempt: 1,
        preemptions: 0,
        launcher: "l2".into(),
        stdout: StreamPiece {
            offset: 0,
            data: b"x".to_vec(),
        },
        stderr: StreamPiece::default(),
        ended: false,
    };
    let relayed = sweep.on_control(ControlMsg::Output(piece(1)), at(t0, 3));
    assert!(
        matches!(&relayed[..], [Effect::Relay { to: followers, .. }] if followers == &[to]),
        "{relayed:?}"
    );
    assert!(
        sweep
            .on_control(ControlMsg::Output(piece(2)), at(t0, 3))
            .is_empty(),
        "nobody follows task 2"
    );
    let mut forged = piece(1);
    forged.stdout.data = vec![b'x'; MAX_PIECE_BYTES + 1];
    assert!(
        sweep
            .on_control(ControlMsg::Output(forged), at(t0, 3))
            .is_empty(),
        "a piece over the bound goes nowhere"
    );
    let mut forged_end = piece(1);
    forged_end.ended = true;
    assert!(
        sweep
            .on_control(ControlMsg::Output(forged_end), at(t0, 3))
            .is_empty(),
        "a run's end comes from its result"
    );
    assert_eq!(
        sweep
            .on_control(ControlMsg::Output(piece(1)), at(t0, 3))
            .len(),
        1,
        "the follow goes on"
    );
    let unaddressed = ControlMsg::Follow {
        task: 1,
        reply_to: None,
    };
    assert!(sweep.on_control(unaddressed, at(t0, 3)).is_empty());
    assert!(matches!(
        &sweep.on_control(follow(10), at(t0, 3))[..],
        [Effect::Answer(ActionReply::Refused { .. })]
    ));
    // An ended task's output is in the results: no launcher is asked,
    // and its follower hears it ended.
    sweep.on_results([result(3, 1, RunStatus::Succeeded)], at(t0, 4));
    let effects = sweep.on_control(follow(3), at(t0, 4));
    assert!(
        matches!(&effects[..], [Effect::Relay { piece, .. }] if piece.ended),
        "{effects:?}"
    );
    // Renewals within half a lease ask no launcher again.
    assert!(asked(sweep.on_control(follow(1), at(t0, 4))).is_empty());
    // A followed task's end: the end of its output goes to its
    // followers from its result, before its index line.
    let mut printed = result(1, 1, RunStatus::Succeeded);
    printed.stdout.data = b"the end\n".to_vec();
    printed.stdout.dropped = 9;
    let effects = sweep.on_results([printed], at(t0, 5));
    let Some(Effect::Relay {
        to: followers,
        piece: last,
    }) = effects.first()
    else {
        panic!("{effects:?}");
    };
    assert_eq!(followers, &[to]);
    assert!(last.ended);
    assert_eq!(
        (last.stdout.offset, &last.stdout.data[..]),
        (9, &b"the end\n"[..])
    );
    assert!(matches!(effects[1], Effect::WriteOutputs(_)), "{effects:?}");
    assert!(
        sweep
            .on_control(ControlMsg::Output(piece(1)), at(t0, 5))
            .is_empty(),
        "the follow ended with the run"
    );
}

#[test]
fn a_big_sweep_is_published_as_its_launchers_take_it() {
    let t0 = Instant::now();
    let (mut sweep, effects) = new_sweep(&manifest(100_000, 1), t0);
    let (first, bundle, completes) = first_publication(&effects).unwrap();
    assert_eq!(
        (first.len(), bundle),
        (100, 1),
        "a few single tasks until run times are measured"
    );
    assert!(!completes.all_tasks);
    sweep.on_published(completes);
    assert!(
        !sweep.job_file().tasks_published,
        "the rest is not with the broker"
    );
    let done = |tasks: std::ops::Range<u64>| tasks.map(|t| result(t, 1, RunStatus::Succeeded));
    // Runs of 1.5 s: one a message, a window of 1,000.
    let effects = sweep.on_results(done(0..100), at(t0, 2));
    let (more, bundle, _) = first_publication(&effects).unwrap();
    assert_eq!((more[0], more.len(), bundle), (100, 1000, 1));
    let effects = sweep.on_results(done(100..200), at(t0, 2));
    assert!(
        first_publication(&effects).is_none(),
        "900 of 1000 still ahead"
    );
    let effects = sweep.on_results(done(200..300), at(t0, 3));
    let (more, bundle, _) = first_publication(&effects).unwrap();
    assert_eq!(
        (more[0], bundle),
        (1100, 1),
        "on from where the last one stopped"
    );
    // 300 tasks in a second: five seconds of them ahead.
    assert_eq!(more.len(), 1500 - 800);
    // Runs of 2 ms: a tenth of a second of work is 50 of them, and
    // eight slots prefetch up to ten such bundles each.
    sweep.on_control(up("l1", "c1", 8), at(t0, 4));
    let fast = (300..400).map(|task| {
        let mut r = result(task, 1, RunStatus::Succeeded);
        r.runtime_ms = 2;
        r
    });
    let effects = sweep.on_results(fast.collect::<Vec<_>>(), at(t0, 5));
    let (more, bundle, _) = first_publication(&effects).unwrap();
    assert_eq!(more[0], 1800);
    assert!(bundle > 40, "bundled from the run times measured: {bundle}");
    assert_eq!(more.len() as u64 + 1400, 8 * 10 * bundle as u64);

    // A runner that takes over before the end starts over from the
    // first unfinished task, on a purged queue.
    let file = sweep.job_file();
    let submission = submission(&manifest(100_000, 1));
    let done = (0..300).map(|t| (t, FinalStatus::Succeeded)).collect();
    let mut again = Sweep::open(
        opening(&submission, done, Some(file)),
        tasks_of(&submission),
        at(t0, 9),
    )
    .unwrap();
    let effects = again.start();
    assert!(matches!(effects[0], Effect::PurgeTasks));
    let (tasks, bundle, _) = first_publication(&effects).unwrap();
    assert_eq!((tasks[0], tasks.len(), bundle), (300, 100, 1));
}

#[test]
fn the_last_publication_says_every_task_is_with_the_broker() {
    let t0 = Instant::now();
    let (mut sweep, effects) = new_sweep(&manifest(1500, 1), t0);
    let (_, _, completes) = first_publication(&effects).unwrap();
    sweep.on_published(completes);
    let effects = sweep.on_results(
        (0..1000).map(|t| result(t, 1, RunStatus::Succeeded)),
        at(t0, 5),
    );
    let (rest, _, completes) = first_publication(&effects).unwrap();
    assert_eq!(rest, (1000..1500).collect::<Vec<_>>());
    assert!(completes.all_tasks);
    sweep.on_published(completes);
    assert!(sweep.job_file().tasks_published);
    let effects = sweep.on_results([result(1000, 1, RunStatus::Succeeded)], at(t0, 6));
    assert!(
        first_publication(&effects).is_none(),
        "nothing left to publish"
    );
}

fn published_first(effects: &[Effect]) -> Vec<u64> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::PublishFirst(first) => Some(first.tasks().to_vec()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn addition(id: u64, lines: &[&str]) -> Addition {
    let text = format!(
        "[sweep]\ncommand = \"more {{x}}\"\nparams.x = [{}]\n",
        lines
            .iter()
            .map(|l| format!("{l:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Addition {
        id,
        ..Addition::from_toml_reading(&text, |_| Err(String::new())).unwrap()
    }
}

#[test]
fn an_open_job_takes_tasks_until_closed_and_runs_its_final_step_after_them() {
    let t0 = Instant::now();
    let submission = submission(
        "name = \"open\"\nopen = true\nmax_attempts = 1\n[[task]]\ncommand = \"echo 0\"\n[final]\ncommand = \"merge\"\n",
    );
    let mut sweep = Sweep::open(
        opening(&submission, vec![], None),
        tasks_of(&submission),
        at(t0, 0),
    )
    .unwrap();
    assert_eq!(published_first(&sweep.start()), [0]);
    assert!(
        sweep
            .on_results([result(0, 1, RunStatus::Succeeded)], at(t0, 1))
            .iter()
            .all(|e| !matches!(e, Effect::Publish(_))),
        "no final step while open"
    );
    assert_eq!(sweep.ending(), None, "open: more may come");
    assert!(sweep.standing(at(t0, 1)).open);

    let effects = sweep.on_control(ControlMsg::AddTasks(addition(7, &["a", "b"])), at(t0, 2));
    assert!(
        matches!(
            effects.first(),
            Some(Effect::RecordAddition(added)) if added.first == 1
        ),
        "recorded before published"
    );
    assert!(
        matches!(
            effects.get(1),
            Some(Effect::Answer(ActionReply::Accepted {}))
        ),
        "its sender told once it is recorded: {effects:?}"
    );
    assert_eq!(published_first(&effects), [1, 2]);
    assert_eq!(
        sweep.job_file().additions_published,
        0,
        "not yet with the broker"
    );
    with_broker(&mut sweep, &effects);
    assert_eq!(sweep.job_file().additions_published, 1);
    assert_eq!(sweep.ledger().counts().total, 3);
    assert!(
        matches!(
            sweep
                .on_control(ControlMsg::AddTasks(addition(7, &["a", "b"])), at(t0, 3))
                .as_slice(),
            [Effect::Answer(ActionReply::Accepted {})]
        ),
        "the same addition again is added once"
    );
    assert_eq!(sweep.kind().tasks.msg(2, 1, 0).unwrap().command, "more b");
    assert_eq!(
        sweep.kind().tasks.msg(3, 1, 0).unwrap().command,
        "merge",
        "the final step moved behind them"
    );

    sweep.on_results(
        [
            result(1, 1, RunStatus::Succeeded),
            result(2, 1, RunStatus::Succeeded),
        ],
        at(t0, 4),
    );
    assert_eq!(sweep.ending(), None);
    let effects = sweep.on_control(ControlMsg::Close {}, at(t0, 5));
    let final_step: Vec<u64> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Publish(tasks) => Some(tasks.iter().map(|t| t.task).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(final_step, [3], "closed, every task ended: the final step");
    assert!(sweep.job_file().closed);
    match sweep
        .on_control(ControlMsg::AddTasks(addition(8, &["c"])), at(t0, 6))
        .as_slice()
    {
        [Effect::Answer(ActionReply::Refused { reason })] => {
            assert!(reason.contains("closed"), "{reason}");
        }
        other => panic!("closed: no more, and its sender told why: {other:?}"),
    }
    sweep.on_results([result(3, 1, RunStatus::Succeeded)], at(t0, 7));
    assert_eq!(sweep.ending(), Some(JobState::Done));
}

#[test]
fn an_addition_too_heavy_with_its_jobs_environment_is_refused_with_its_number() {
    let t0 = Instant::now();
    let text = format!(
        "name = \"open\"\nopen = true\nenv = {{ BIG = \"{}\" }}\n[[task]]\ncommand = \"echo 0\"\n",
        "e".repeat(MAX_TASK_BYTES - 1000)
    );
    let (mut sweep, _) = new_sweep(&text, t0);
    let heavy = addition(3, &["a", &"x".repeat(2000), "b"]);
    heavy.task_list().expect("light enough alone");
    match sweep
        .on_control(ControlMsg::AddTasks(heavy), at(t0, 1))
        .as_slice()
    {
        [Effect::Answer(ActionReply::Refused { reason }), ..] => {
            assert!(reason.contains("task 2 would take"), "{reason}");
        }
        other => panic!("refused, and its sender told why: {other:?}"),
    }
    assert_eq!(sweep.ledger().counts().total, 1, "nothing added");
}

/// The manifest's measure of a task is what its message weighs, so
/// the bound checked at submit is the one publication meets.
#[test]
fn a_tasks_measure_at_submit_is_its_messages_weight() {
    let text = "name = \"w\"\nenv = { A = \"1\", LONGER = \"two words\" }\n\
            outputs = [\"*.png\"]\nworkdir = \"/scratch/w\"\n\
            [[task]]\ncommand = \"echo fixed\"\n\
            [sweep]\ncommand = \"run {n} {s} {n}\"\n\
            params = { n = { from = -50, to = 100000, step = 3 }, s = [\"a\", \"long value\", 1.5] }\n";
    let submission = submission(text);
    let manifest = &submission.manifest;
    let tasks = tasks_of(&submission);
    let (index, bytes) = tasks.largest().unwrap();
    let maker = TaskMaker::new(submission.job.clone(), manifest, tasks, "/r".into());
    let heaviest = (0..maker.len())
        .map(|t| maker.msg(t, 1, 0).unwrap().weight())
        .max()
        .unwrap();
    let msg = maker.msg(index, 1, 0).unwrap();
    assert_eq!(msg.weight(), heaviest);
    assert_eq!(msg.weight(), manifest.task_base_bytes() + bytes);
}

#[test]
fn recorded_additions_are_checked_not_trusted() {
    let record = |first, id| AddedTasks {
        first,
        addition: addition(id, &["a", "b"]),
    };
    let good = [record(3, 1), record(5, 2)];
    assert_eq!(recorded_additions(true, &good, 3).len(), 2);
    assert!(
        recorded_additions(false, &good, 3).is_empty(),
        "a job that is not open has none"
    );
    let gap = [record(3, 1), record(1 << 40, 2)];
    assert_eq!(
        recorded_additions(true, &gap, 3).len(),
        1,
        "numbers must follow on"
    );
    let beyond = [record(MAX_TASKS - 1, 1)];
    assert!(recorded_additions(true, &beyond, MAX_TASKS - 1).is_empty());
}

#[test]
fn a_resumed_open_job_publishes_again_what_an_addition_may_not_have() {
    let t0 = Instant::now();
    let submission = submission("name = \"open\"\nopen = true\n");
    let recorded = vec![
        AddedTasks {
            first: 0,
            addition: addition(1, &["a", "b"]),
        },
        AddedTasks {
            first: 2,
            addition: addition(2, &["c"]),
        },
    ];
    let mut file = started_as(&submission, t0).job_file();
    file.additions_published = 1;
    let mut opening = opening(&submission, vec![(1, FinalStatus::Succeeded)], Some(file));
    opening.additions = recorded;
    let mut sweep = Sweep::open(opening, tasks_of(&submission), at(t0, 10)).unwrap();
    assert_eq!(
        published_first(&sweep.start()),
        [2],
        "only the second addition's, again"
    );
    assert_eq!(sweep.ledger().counts().total, 3);
    assert_eq!(sweep.ledger().counts().succeeded, 1);
    assert!(
        matches!(
            sweep
                .on_control(ControlMsg::AddTasks(addition(2, &["c"])), at(t0, 11))
                .as_slice(),
            [Effect::Answer(ActionReply::Accepted {})]
        ),
        "recorded before the crash: not added twice, and its sender told it is"
    );
}

#[test]
fn an_open_job_with_nothing_to_do_is_closed_after_open_idle() {
    let t0 = Instant::now();
    let (mut sweep, _) = new_sweep("name = \"open\"\nopen = true\n", t0);
    let idle = sweep.ledger().settings().open_idle.as_secs();
    sweep.poll(at(t0, idle - 1));
    assert_eq!(sweep.ending(), None, "not idle long enough");
    let effects = sweep.on_control(ControlMsg::AddTasks(addition(1, &["a"])), at(t0, idle - 1));
    assert_eq!(published_first(&effects), [0]);
    sweep.poll(at(t0, 3 * idle));
    assert_eq!(sweep.ending(), None, "a task still to run");
    let (mut sweep, _) = new_sweep("name = \"open\"\nopen = true\n", t0);
    sweep.poll(at(t0, idle));
    assert!(sweep.ledger().file().closed);
    assert_eq!(sweep.ending(), Some(JobState::Done));
}

fn with_final(when: &str, t0: Instant) -> (Job<Sweep>, Vec<Effect>) {
    let text = format!(
        "{}[final]\ncommand = \"merge\"\nwhen = \"{when}\"\n",
        manifest(2, 2)
    );
    new_sweep(&text, t0)
}

/// A new job of manifest `text`, opened and started at `t0`.
fn new_sweep(text: &str, t0: Instant) -> (Job<Sweep>, Vec<Effect>) {
    let submission = submission(text);
    let mut sweep = Sweep::open(
        opening(&submission, vec![], None),
        tasks_of(&submission),
        at(t0, 0),
    )
    .unwrap();
    let effects = sweep.start();
    (sweep, effects)
}

fn published(effects: &[Effect]) -> Vec<TaskMsg> {
    effects
        .iter()
        .flat_map(|e| match e {
            Effect::Publish(tasks) => tasks.clone(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn the_final_step_runs_after_the_last_task_and_is_retried_like_one() {
    let t0 = Instant::now();
    let (mut sweep, effects) = with_final("all-succeeded", t0);
    let first = effects.iter().find_map(|e| match e {
        Effect::PublishFirst(first) => Some(first.tasks().to_vec()),
        _ => None,
    });
    assert_eq!(first, Some(vec![0, 1]), "the final step waits");
    assert_eq!(sweep.standing(at(t0, 1)).tasks.to_run(), 3);
    assert!(
        published(&sweep.on_results([result(0, 1, RunStatus::Succeeded)], at(t0, 1))).is_empty()
    );
    let run = result(1, 1, RunStatus::Succeeded);
    let effects = sweep.on_results([run.clone()], at(t0, 2));
    let [step] = &published(&effects)[..] else {
        panic!("{effects:?}")
    };
    assert_eq!(
        (step.task, step.attempt, step.command.as_str()),
        (2, 1, "merge")
    );
    assert!(
        step.env
            .iter()
            .any(|(k, v)| k == "GLEANER_RESULTS" && v.starts_with('/'))
    );
    let record = effects.iter().position(|e| matches!(e, Effect::Record(_)));
    let publish = effects.iter().position(|e| matches!(e, Effect::Publish(_)));
    assert!(record < publish, "every task's output is recorded first");
    assert_eq!(sweep.ending(), None, "not before the final step ends");
    let report = sweep.standing(at(t0, 2));
    assert_eq!((report.tasks.total, report.tasks.succeeded), (2, 2));
    assert_eq!(report.tasks.to_run(), 1, "the step still wants a slot");

    // It fails once, is retried, then succeeds; it is no task of the index.
    let run = result(2, 1, RunStatus::Failed);
    let effects = sweep.on_results([run.clone()], at(t0, 3));
    assert!(matches!(
        published(&effects)[..],
        [TaskMsg {
            task: 2,
            attempt: 2,
            ..
        }]
    ));
    let run = result(2, 2, RunStatus::Succeeded);
    let effects = sweep.on_results([run.clone()], at(t0, 4));
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::WriteFinalOutputs(_)))
    );
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::Record(entries) if !entries.is_empty()))
    );
    assert_eq!(sweep.ending(), Some(JobState::Done));
    let file = sweep.job_file();
    let outcome = file.final_step.expect("recorded");
    assert_eq!(
        (outcome.status.as_str(), outcome.attempts),
        ("succeeded", 2)
    );
    assert_eq!((file.tasks.total, file.tasks.succeeded), (2, 2));
    assert_eq!(file.tasks.to_run(), 0);
    let done = sweep.wind_up(at(t0, 5));
    assert!(done.iter().any(
        |e| matches!(e, Effect::Event(gleaner_protocol::Event::Done(r)) if r.problem.is_none())
    ));
}

#[test]
fn a_final_step_for_success_only_is_skipped_after_a_failure_and_a_failed_one_fails_the_job() {
    let t0 = Instant::now();
    let (mut sweep, _) = with_final("all-succeeded", t0);
    sweep.on_results([result(0, 1, RunStatus::Succeeded)], at(t0, 1));
    sweep.on_results([result(1, 1, RunStatus::Failed)], at(t0, 1));
    let run = result(1, 2, RunStatus::Failed);
    let effects = sweep.on_results([run.clone()], at(t0, 2));
    assert!(published(&effects).is_empty(), "{effects:?}");
    assert_eq!(sweep.ending(), Some(JobState::Done));
    assert_eq!(
        sweep.job_file().final_step.map(|f| f.status),
        Some("skipped".to_owned())
    );

    let (mut sweep, _) = with_final("always", t0);
    sweep.on_results([result(0, 1, RunStatus::Succeeded)], at(t0, 1));
    sweep.on_results([result(1, 1, RunStatus::Failed)], at(t0, 1));
    let run = result(1, 2, RunStatus::Failed);
    let effects = sweep.on_results([run.clone()], at(t0, 2));
    assert_eq!(published(&effects).len(), 1, "runs anyway");
    sweep.on_results([result(2, 1, RunStatus::Failed)], at(t0, 3));
    sweep.on_results([result(2, 2, RunStatus::Failed)], at(t0, 4));
    assert_eq!(sweep.ending(), Some(JobState::Done));
    let done = sweep.wind_up(at(t0, 5));
    assert!(done.iter().any(|e| matches!(e, Effect::Event(gleaner_protocol::Event::Done(r)) if r.problem.as_deref().is_some_and(|p| p.contains("final step failed")))));
}

#[test]
fn a_cancelled_job_does_not_run_its_final_step_nor_index_it() {
    let t0 = Instant::now();
    let (mut sweep, _) = with_final("always", t0);
    let effects = sweep.on_control(
        ControlMsg::Cancel {
            reason: "user".into(),
        },
        at(t0, 1),
    );
    let indexed: Vec<u64> = recorded(&effects).iter().map(|e| e.task).collect();
    assert_eq!(indexed, [0, 1]);
    assert_eq!(sweep.ending(), Some(JobState::Cancelled));
    assert_eq!(
        sweep.job_file().final_step.map(|f| f.status),
        Some("cancelled".to_owned())
    );
}
