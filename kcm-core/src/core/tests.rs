use gleaner_protocol::{Event as Published, advance, drain, wake_up};

use super::*;
use crate::snapshot::Standing;

fn job(name: &str) -> JobId {
    format!("{name}-0000000000000000").parse().unwrap()
}

/// `preempt_grace` 3 s + 2 × a 1 s poll.
const SETTLE: Duration = Duration::from_secs(5);
const MAX_PENDING: Duration = Duration::from_secs(60);
const BUSY_POLL: Duration = Duration::from_secs(2);
const IDLE_POLL: Duration = Duration::from_secs(15);

/// The account a job's launchers connect as, where users are kept apart.
fn launcher_account() -> Credentials {
    Credentials {
        user: "gleaner-launcher-a".into(),
        password: "p".into(),
    }
}

fn core() -> KcmCore {
    KcmCore::new(CoreConfig {
        speed: 1.0,
        cluster: "c1".into(),
        backend: "sge".into(),
        job_end_grace: Duration::from_secs(10),
        local_settle: SETTLE,
        poll_interval: BUSY_POLL,
        idle_poll_interval: IDLE_POLL,
        max_pending: MAX_PENDING,
        max_scavenged: None,
        reserve_hosts: Vec::new(),
        account: "root".into(),
        users: Users::default(),
        inputs: InputAccess {
            shared: vec!["/shared".into()],
            stages: false,
            stage_s: None,
        },
    })
}

/// A simulated clock: `at(ms)` is `ms` milliseconds after its start.
struct Clock(Instant);

impl Clock {
    fn new() -> Self {
        Self(Instant::now())
    }

    fn at(&self, ms: u64) -> Now {
        Now {
            instant: self.0 + Duration::from_millis(ms),
            wall_ms: 1_700_000_000_000 + ms,
        }
    }
}

fn placeholder(id: &str, job: &JobId, running: bool) -> Placeholder {
    Placeholder {
        id: id.into(),
        job: job.clone(),
        slots: 1,
        host: running.then(|| "n1".to_owned()),
        owner: "alice".into(),
        needs: Default::default(),
    }
}

fn component(id: &str, job: &JobId, component: u32, slots: u32) -> ComponentRun {
    ComponentRun {
        id: id.into(),
        job: job.clone(),
        component,
        slots,
        running: true,
        owner: "root".into(),
        timing: Default::default(),
    }
}

fn spec(job: &JobId, component: u32, slots: u32) -> ComponentSpec {
    ComponentSpec {
        needs: Default::default(),
        job: job.clone(),
        component,
        slots,
        command: "mpirun ./solver".into(),
        env: Vec::new(),
        walltime_ms: None,
        workdir: None,
        owner: "alice".into(),
        checkpoint: None,
        inputs: Vec::new(),
    }
}

/// One host, `n1`, of `total_slots` slots.
fn cluster(total_slots: u32, placeholders: Vec<Placeholder>) -> Snapshot {
    busy(total_slots, 0, 0, placeholders)
}

/// One host, `n1`, with local jobs and grid components on it.
fn busy(slots: u32, local: u32, grid: u32, placeholders: Vec<Placeholder>) -> Snapshot {
    Snapshot {
        hosts: vec![Host {
            local,
            grid,
            ..Host::new("n1", slots)
        }],
        placeholders,
        ..Snapshot::default()
    }
}

#[test]
fn the_batch_system_is_read_often_only_while_gleaner_holds_or_waits_for_slots() {
    let clock = Clock::new();
    let mut kcm = core();
    assert_eq!(
        kcm.poll_timeout(),
        None,
        "no timer before the first reading"
    );
    kcm.handle(Event::Connected, clock.at(0));
    assert!(matches!(
        drain(&mut kcm, clock.at(0))[..],
        [Effect::PollNow]
    ));
    poll(&mut kcm, cluster(4, Vec::new()), clock.at(0));
    assert_eq!(kcm.poll_timeout(), Some(clock.at(15_000).instant));
    assert!(
        advance(&mut kcm, clock.at(14_999)).is_empty(),
        "not yet due"
    );
    assert!(matches!(
        advance(&mut kcm, clock.at(15_000))[..],
        [Effect::PollNow]
    ));
    let job: JobId = "sweep-0000000000000001".parse().unwrap();
    let waiting = vec![placeholder("7.1", &job, false)];
    poll(&mut kcm, cluster(4, waiting), clock.at(1_000));
    let (then, effects) = wake_up(&mut kcm, clock.at(1_000)).expect("a reading due");
    assert_eq!(then, clock.at(3_000), "read again 2 s on");
    assert!(matches!(effects[..], [Effect::PollNow]), "{effects:?}");
    let running = vec![placeholder("7.1", &job, true)];
    poll(&mut kcm, cluster(4, running), clock.at(3_000));
    assert_eq!(kcm.poll_timeout(), Some(clock.at(5_000).instant));
    poll(&mut kcm, cluster(4, Vec::new()), clock.at(5_000));
    assert_eq!(kcm.poll_timeout(), Some(clock.at(20_000).instant));
}

#[test]
fn a_grant_for_tasks_bigger_than_any_host_is_not_carried_out() {
    let clock = Clock::new();
    let mut kcm = core();
    poll(&mut kcm, cluster(4, Vec::new()), clock.at(0));
    let grant = |grant, task_slots| KcmMsg::StartLaunchers {
        job: "sweep-0000000000000001".parse().unwrap(),
        grant: GrantId::new(grant),
        slots: 8,
        task_slots,
        task_needs: Default::default(),
        owner: "alice".into(),
        credentials: Some(launcher_account()),
    };
    let submits = |effects: Vec<Effect>| {
        effects
            .iter()
            .filter(|e| matches!(e, Effect::SubmitLaunchers { .. }))
            .count()
    };
    assert_eq!(submits(message(&mut kcm, grant(1, 8), clock.at(1))), 0);
    assert_eq!(submits(message(&mut kcm, grant(2, 4), clock.at(2))), 1);
}

fn waiting(jobs: &[(&str, u32)]) -> Vec<WaitingJob> {
    jobs.iter()
        .map(|(id, slots)| WaitingJob::anywhere(*id, *slots))
        .collect()
}

fn poll(core: &mut KcmCore, snapshot: Snapshot, now: Now) -> Vec<Effect> {
    poll_spool(core, snapshot, Vec::new(), now)
}

/// Hands the core `event` and takes every effect it then has, as a
/// shell would with no answer to give.
fn step(core: &mut KcmCore, event: Event, now: Now) -> Vec<Effect> {
    core.handle(event, now);
    std::iter::from_fn(|| core.poll_effect(now)).collect()
}

/// A kcm whose every failure is the cluster's: one user.
fn single_user_core() -> KcmCore {
    KcmCore::new(CoreConfig {
        speed: 1.0,
        users: Users {
            single: Some(true),
            ..Users::default()
        },
        ..core().config
    })
}

/// A poll's effects before its report, which goes last, both to the
/// scheduler and to the events exchange.
fn poll_spool(
    core: &mut KcmCore,
    snapshot: Snapshot,
    spooled: Vec<SpooledExit>,
    now: Now,
) -> Vec<Effect> {
    poll_started(core, snapshot, spooled, Vec::new(), now)
}

/// [`poll_spool`], with started files in the spool too.
fn poll_started(
    core: &mut KcmCore,
    snapshot: Snapshot,
    spooled: Vec<SpooledExit>,
    started: Vec<SpooledStart>,
    now: Now,
) -> Vec<Effect> {
    let snapshot = Ok(snapshot);
    let event = Event::Polled {
        snapshot,
        spooled,
        started,
    };
    let mut effects = step(core, event, now);
    let report = effects.split_off(effects.len().saturating_sub(2));
    let [
        Effect::ToScheduler(SchedulerMsg::ClusterStatus(report)),
        Effect::Announce(Published::Cluster(announced)),
    ] = report.as_slice()
    else {
        panic!("a poll ends with its report, sent and announced: {report:?}");
    };
    assert_eq!(format!("{report:?}"), format!("{announced:?}"));
    effects
}

fn message(core: &mut KcmCore, message: KcmMsg, now: Now) -> Vec<Effect> {
    step(core, Event::Message(message), now)
}

/// The report the next poll ends with.
fn report(core: &mut KcmCore, now: Now) -> ClusterReport {
    core.report(now)
}

fn removed(effects: &[Effect]) -> Vec<Vec<String>> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Remove { ids } => Some(ids.clone()),
            _ => None,
        })
        .collect()
}

fn shrinks(effects: &[Effect]) -> Vec<(JobId, u32)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Tell {
                job,
                message:
                    ControlMsg::Shrink {
                        cluster,
                        slots,
                        mode: ShrinkMode::Preempt,
                        ..
                    },
            } if cluster.as_str() == "c1" => Some((job.clone(), *slots)),
            _ => None,
        })
        .collect()
}

fn ended(effects: &[Effect]) -> Vec<(JobId, ComponentOutcome)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::ReportComponentEnd { job, outcome } => Some((job.clone(), outcome.clone())),
            _ => None,
        })
        .collect()
}

fn failure(what: &str) -> BackendError {
    BackendError {
        command: what.into(),
        message: "exit status: 1: denied".into(),
    }
}

#[test]
fn a_restarted_kcm_adopts_what_its_predecessor_left() {
    let clock = Clock::new();
    let mut kcm = core();
    let (a, g) = (job("a"), job("g"));
    let found = Snapshot {
        components: vec![component("9", &g, 0, 2)],
        ..busy(
            6,
            0,
            2,
            (1..=4)
                .map(|t| placeholder(&format!("3.{t}"), &a, true))
                .collect(),
        )
    };
    let effects = poll(&mut kcm, found.clone(), clock.at(0));
    assert!(
        effects.is_empty(),
        "nothing submitted or removed: {effects:?}"
    );
    let r = report(&mut kcm, clock.at(0));
    assert_eq!(
        r.jobs[&a],
        Holding {
            running: 4,
            pending: 0
        }
    );
    assert_eq!(
        r.grid[&g],
        Holding {
            running: 2,
            pending: 0
        }
    );
    assert_eq!(
        r.idle_slots, 0,
        "the scheduler sees no room for a second array"
    );
    assert!(r.applied_grants.is_empty());

    // A grant after the restart is one array, acknowledged once.
    let effects = message(
        &mut kcm,
        KcmMsg::StartLaunchers {
            job: a.clone(),
            grant: GrantId::new(7),
            slots: 2,
            task_slots: 1,
            task_needs: Default::default(),
            owner: "alice".into(),
            credentials: Some(launcher_account()),
        },
        clock.at(100),
    );
    let submits: Vec<_> = effects
        .iter()
        .filter(|e| matches!(e, Effect::SubmitLaunchers { .. }))
        .collect();
    assert!(matches!(
        submits.as_slice(),
        [Effect::SubmitLaunchers { job, grant, slots: 2, .. }] if *job == a && *grant == GrantId::new(7)
    ));
    assert_eq!(
        report(&mut kcm, clock.at(200)).applied_grants,
        [GrantId::new(7)]
    );
    assert!(report(&mut kcm, clock.at(300)).applied_grants.is_empty());

    // The adopted component is the kcm's to report when it ends.
    let gone = Snapshot {
        components: Vec::new(),
        ..cluster(6, found.placeholders.clone())
    };
    let ends = ended(&poll(&mut kcm, gone, clock.at(1_000)));
    assert_eq!(ends.len(), 1);
    assert_eq!(
        (&ends[0].0, ends[0].1.component, ends[0].1.exit_code),
        (&g, 0, None)
    );
    assert_eq!(
        ends[0].1.runtime_ms, 1_000,
        "counted from when it was found"
    );
}

#[test]
fn waiting_local_jobs_withdraw_pending_placeholders_and_split_one_shrink() {
    let clock = Clock::new();
    let mut kcm = core();
    let (a, b) = (job("a"), job("b"));
    let mut placeholders: Vec<Placeholder> = (1..=4)
        .map(|t| placeholder(&format!("1.{t}"), &a, true))
        .chain((1..=4).map(|t| placeholder(&format!("2.{t}"), &b, true)))
        .collect();
    let running = placeholders.clone();
    placeholders.extend([placeholder("2.5", &b, false), placeholder("2.6", &b, false)]);
    let busy = |waits: &[(&str, u32)], placeholders: &[Placeholder]| Snapshot {
        waiting: waiting(waits),
        ..cluster(8, placeholders.to_vec())
    };

    let effects = poll(&mut kcm, busy(&[("9", 4)], &placeholders), clock.at(0));
    assert_eq!(removed(&effects), [["2.5", "2.6"]]);
    assert_eq!(
        shrinks(&effects),
        [(a.clone(), 2), (b.clone(), 2)],
        "4 in all, not 4 each"
    );
    let Some(Effect::Tell {
        message: ControlMsg::Shrink { reason, .. },
        ..
    }) = effects.last()
    else {
        panic!("{effects:?}");
    };
    assert_eq!(reason, "1 local job(s) wait for 4 slot(s) on c1");
    let r = report(&mut kcm, clock.at(0));
    assert_eq!(
        r.jobs[&b],
        Holding {
            running: 4,
            pending: 0
        },
        "withdrawn ones are gone"
    );
    assert_eq!(r.local_waiting, 4);

    // The launchers need time to leave: the same job is not answered again…
    let effects = poll(&mut kcm, busy(&[("9", 4)], &running), clock.at(1_000));
    assert!(effects.is_empty(), "{effects:?}");
    // …a new one is, for its own slots only…
    let effects = poll(
        &mut kcm,
        busy(&[("9", 4), ("10", 2)], &running),
        clock.at(2_000),
    );
    assert_eq!(shrinks(&effects), [(a.clone(), 1), (b.clone(), 1)]);
    let effects = poll(
        &mut kcm,
        busy(&[("9", 4), ("10", 2)], &running),
        clock.at(4_999),
    );
    assert!(shrinks(&effects).is_empty(), "{effects:?}");
    // …and once the settle time passed, a job still waiting is answered again.
    let effects = poll(
        &mut kcm,
        busy(&[("9", 4), ("10", 2)], &running),
        clock.at(5_000),
    );
    assert_eq!(shrinks(&effects), [(a, 2), (b, 2)]);
}

#[test]
fn placeholders_the_queue_keeps_behind_waiting_local_jobs_wait_there() {
    let clock = Clock::new();
    let mut kcm = core();
    let a = job("a");
    let standing = |tier, priority| Standing { tier, priority };
    let queue = |waits: &[(&str, u32)], local_standing: Standing| Snapshot {
        waiting: waiting(waits),
        standings: BTreeMap::from([
            ("1.1".to_owned(), standing(1, 500)),
            ("9".to_owned(), local_standing),
        ]),
        ..busy(4, 4, 0, vec![placeholder("1.1", &a, false)])
    };
    let behind = || queue(&[("9", 4)], standing(10, 100));
    // Behind the waiting job in the queue: left to the batch system's
    // backfill, however long it waits.
    for at in [0, 1_000, MAX_PENDING.as_millis() as u64 * 3] {
        let effects = poll(&mut kcm, behind(), clock.at(at));
        assert!(removed(&effects).is_empty(), "{effects:?}");
    }
    // Ahead of it: withdrawn at once.
    let effects = poll(
        &mut kcm,
        queue(&[("9", 4)], standing(1, 400)),
        clock.at(200_000),
    );
    assert_eq!(removed(&effects), [["1.1"]]);
    // Once nothing waits, a placeholder still waiting is stuck after
    // `max_pending` counted from then.
    let mut kcm = core();
    poll(&mut kcm, behind(), clock.at(0));
    let alone = || queue(&[], standing(10, 100));
    let effects = poll(&mut kcm, alone(), clock.at(100_000));
    assert!(removed(&effects).is_empty(), "{effects:?}");
    let effects = poll(
        &mut kcm,
        alone(),
        clock.at(100_000 + MAX_PENDING.as_millis() as u64 + 1),
    );
    assert_eq!(removed(&effects), [["1.1"]]);
}

#[test]
fn released_launchers_are_removed_after_their_grace_if_still_there() {
    let clock = Clock::new();
    let mut kcm = core();
    let a = job("a");
    let both = cluster(
        4,
        vec![placeholder("5.1", &a, true), placeholder("5.2", &a, true)],
    );
    poll(&mut kcm, both.clone(), clock.at(0));
    let effects = message(
        &mut kcm,
        KcmMsg::Release {
            job: a.clone(),
            launchers: vec!["c1-5.1".into(), "c1-5.2".into(), "c2-5.3".into()],
            grace_ms: 3_000,
        },
        clock.at(0),
    );
    assert!(effects.is_empty(), "no poll needed: {effects:?}");
    // Another job's runner cannot have a's launchers removed.
    let b = job("b");
    message(
        &mut kcm,
        KcmMsg::Release {
            job: b,
            launchers: vec!["c1-5.1".into(), "c1-5.2".into()],
            grace_ms: 0,
        },
        clock.at(0),
    );
    assert!(removed(&poll(&mut kcm, both.clone(), clock.at(1))).is_empty());
    assert!(removed(&poll(&mut kcm, both, clock.at(2_999))).is_empty());
    // 5.1 left by itself; 5.3 is another cluster's.
    let one = cluster(4, vec![placeholder("5.2", &a, true)]);
    assert_eq!(
        removed(&poll(&mut kcm, one.clone(), clock.at(3_000))),
        [["5.2"]]
    );
    assert!(
        removed(&poll(&mut kcm, one, clock.at(4_000))).is_empty(),
        "once"
    );
}

#[test]
fn an_ended_job_goes_pending_and_components_now_running_after_grace() {
    let clock = Clock::new();
    let mut kcm = core();
    let (a, b, g) = (job("a"), job("b"), job("g"));
    let snapshot = Snapshot {
        components: vec![component("8", &g, 0, 2)],
        ..cluster(
            8,
            vec![
                placeholder("1.1", &a, true),
                placeholder("1.2", &a, false),
                placeholder("2.1", &b, true),
                placeholder("2.2", &b, false),
            ],
        )
    };
    poll(&mut kcm, snapshot.clone(), clock.at(0));
    let effects = message(&mut kcm, KcmMsg::JobEnded { job: a.clone() }, clock.at(0));
    assert_eq!(removed(&effects), [["1.2"]], "b's are not touched");
    assert!(matches!(effects.last(), Some(Effect::PollNow)));
    let effects = message(&mut kcm, KcmMsg::JobEnded { job: g }, clock.at(0));
    assert_eq!(
        removed(&effects),
        [["8"]],
        "a cancelled grid job's components go"
    );
    let running = Snapshot {
        components: Vec::new(),
        ..cluster(
            8,
            vec![placeholder("1.1", &a, true), placeholder("2.1", &b, true)],
        )
    };
    assert!(removed(&poll(&mut kcm, running.clone(), clock.at(9_999))).is_empty());
    assert_eq!(
        removed(&poll(&mut kcm, running, clock.at(10_000))),
        [["1.1"]]
    );
    let left = cluster(8, vec![placeholder("2.1", &b, true)]);
    let message_for_gone = message(&mut kcm, KcmMsg::JobEnded { job: a }, clock.at(11_000));
    assert!(removed(&message_for_gone).is_empty());
    assert!(removed(&poll(&mut kcm, left, clock.at(30_000))).is_empty());
}

#[test]
fn a_grant_ordered_twice_is_carried_out_once() {
    let clock = Clock::new();
    let mut kcm = core();
    poll(&mut kcm, cluster(4, Vec::new()), clock.at(0));
    let order = || KcmMsg::StartLaunchers {
        job: job("a"),
        grant: GrantId::new(7),
        slots: 2,
        task_slots: 1,
        task_needs: Default::default(),
        owner: "alice".into(),
        credentials: Some(launcher_account()),
    };
    let first = message(&mut kcm, order(), clock.at(0));
    assert!(matches!(first[0], Effect::SubmitLaunchers { slots: 2, .. }));
    assert!(message(&mut kcm, order(), clock.at(1_000)).is_empty());
    assert_eq!(
        report(&mut kcm, clock.at(1_000)).applied_grants,
        [GrantId::new(7)]
    );
}

#[test]
fn a_kcm_and_a_runner_that_disagree_on_users_start_no_launchers() {
    let clock = Clock::new();
    let single = Users {
        single: Some(true),
        ..Users::default()
    };
    let cases = [
        (single, Some(launcher_account()), "keeps users apart"),
        (Users::default(), None, "no launcher account"),
    ];
    for (users, credentials, why) in cases {
        let mut kcm = KcmCore::new(CoreConfig {
            speed: 1.0,
            users,
            ..core().config
        });
        poll(&mut kcm, cluster(4, Vec::new()), clock.at(0));
        let order = KcmMsg::StartLaunchers {
            job: job("a"),
            grant: GrantId::new(1),
            slots: 2,
            task_slots: 1,
            task_needs: Default::default(),
            owner: "alice".into(),
            credentials,
        };
        let effects = message(&mut kcm, order, clock.at(0));
        assert!(
            !effects
                .iter()
                .any(|e| matches!(e, Effect::SubmitLaunchers { .. })),
            "{why}: {effects:?}"
        );
        let error = report(&mut kcm, clock.at(0)).error.unwrap_or_default();
        assert!(error.contains(why), "{error}");
    }
}

#[test]
fn failed_starts_are_counted_and_reported_until_one_succeeds() {
    let clock = Clock::new();
    let mut kcm = core();
    let a = job("a");
    poll(&mut kcm, cluster(4, Vec::new()), clock.at(0));
    for (grant, failures) in [(GrantId::new(1), 1), (GrantId::new(2), 2)] {
        let effects = message(
            &mut kcm,
            KcmMsg::StartLaunchers {
                job: a.clone(),
                grant,
                slots: 4,
                task_slots: 1,
                task_needs: Default::default(),
                owner: "alice".into(),
                credentials: Some(launcher_account()),
            },
            clock.at(0),
        );
        assert!(matches!(
            effects.as_slice(),
            [Effect::SubmitLaunchers { .. }, Effect::PollNow]
        ));
        let result = Err(failure("qsub -t 1-4"));
        let event = Event::LaunchersSubmitted {
            job: a.clone(),
            grant,
            requested: 4,
            result,
        };
        assert!(step(&mut kcm, event, clock.at(0)).is_empty());
        let r = report(&mut kcm, clock.at(0));
        assert_eq!(r.failed_starts, 0, "alice's alone are not the cluster's");
        assert_eq!(r.job_failures.get(&a), Some(&failures));
        assert_eq!(
            r.error.as_deref(),
            Some("qsub -t 1-4: exit status: 1: denied")
        );
        assert_eq!(
            r.applied_grants,
            [grant],
            "a refused grant was still acted on"
        );
    }
    message(
        &mut kcm,
        KcmMsg::StartLaunchers {
            job: a.clone(),
            grant: GrantId::new(3),
            slots: 4,
            task_slots: 1,
            task_needs: Default::default(),
            owner: "alice".into(),
            credentials: Some(launcher_account()),
        },
        clock.at(0),
    );
    let event = Event::LaunchersSubmitted {
        job: a,
        grant: GrantId::new(3),
        requested: 4,
        result: Ok(4),
    };
    step(&mut kcm, event, clock.at(0));
    let r = report(&mut kcm, clock.at(0));
    assert_eq!(
        (r.job_failures.get(&job("a")), r.error),
        (Some(&2), None),
        "submitted is not started yet"
    );
    // Bob's start fails too: two accounts' failures are the cluster's.
    let b = job("b");
    message(
        &mut kcm,
        KcmMsg::StartLaunchers {
            job: b.clone(),
            grant: GrantId::new(4),
            slots: 1,
            task_slots: 1,
            task_needs: Default::default(),
            owner: "bob".into(),
            credentials: Some(launcher_account()),
        },
        clock.at(0),
    );
    let event = Event::LaunchersSubmitted {
        job: b.clone(),
        grant: GrantId::new(4),
        requested: 1,
        result: Err(failure("qsub")),
    };
    step(&mut kcm, event, clock.at(0));
    assert_eq!(report(&mut kcm, clock.at(0)).failed_starts, 3);
    let up = KcmMsg::LauncherUp {
        job: job("a"),
        launcher: naming::launcher_id(&"c1".into(), "7.1"),
    };
    message(&mut kcm, up, clock.at(1_000));
    assert_eq!(
        report(&mut kcm, clock.at(1_000)).failed_starts,
        3,
        "a placeholder not seen yet: its word clears nothing (it could be forged)"
    );
    poll(
        &mut kcm,
        cluster(4, vec![placeholder("7.1", &job("a"), true)]),
        clock.at(2_000),
    );
    let r = report(&mut kcm, clock.at(2_000));
    assert_eq!(r.failed_starts, 0, "seen: its start worked");
    assert_eq!(r.job_failures, [(b, 1)].into(), "bob's are still his");
}

/// Host `n1` with two GPUs the batch system counts free, and these
/// placeholders.
fn gpu_cluster(placeholders: Vec<Placeholder>) -> Snapshot {
    Snapshot {
        hosts: vec![Host {
            free_gpus: Some(2),
            ..Host::new("n1", 4)
        }],
        placeholders,
        ..Snapshot::default()
    }
}

/// A placeholder of `owner`'s for `job` needing `gpus`, running on `n1`
/// or waiting.
fn gpu_placeholder(id: &str, job: &JobId, owner: &str, gpus: u32, running: bool) -> Placeholder {
    Placeholder {
        owner: owner.into(),
        needs: gleaner_manifest::Needs { memory_mb: 0, gpus },
        ..placeholder(id, job, running)
    }
}

/// What alice's launcher in placeholder `id` says: `devices` of `n1`
/// were claimed.
fn gpus_held(job: &JobId, id: &str, devices: &[&str]) -> KcmMsg {
    KcmMsg::GpusHeld {
        job: job.clone(),
        held: GpusHeld {
            launcher: naming::launcher_id(&"c1".into(), id),
            cluster: "c1".into(),
            host: "n1".into(),
            devices: devices.iter().map(|d| d.to_string()).collect(),
        },
    }
}

#[test]
fn gpus_held_outside_gleaner_are_a_failure_of_no_ones() {
    let clock = Clock::new();
    let mut kcm = core();
    let (a, b) = (job("a"), job("b"));
    poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(0));
    // Bob squats both GPUs of n1; alice's placeholder runs there, and
    // bob's own job's launchers are broken.
    let alices = gpu_placeholder("5.1", &a, "alice", 2, true);
    let bobs = gpu_placeholder("6.1", &b, "bob", 0, false);
    poll(&mut kcm, gpu_cluster(vec![alices, bobs]), clock.at(1_000));
    // Job b cannot speak for alice's placeholder.
    message(&mut kcm, gpus_held(&b, "5.1", &["0", "1"]), clock.at(1_100));
    assert!(
        report(&mut kcm, clock.at(1_100)).hosts[0]
            .squatted_gpus
            .is_empty()
    );
    message(&mut kcm, gpus_held(&a, "5.1", &["1", "0"]), clock.at(1_200));
    let r = report(&mut kcm, clock.at(1_200));
    assert_eq!(r.hosts[0].squatted_gpus, ["0", "1"], "shown to the admin");
    assert_eq!(r.hosts[0].free_gpus, Some(0), "free to no one");
    assert_eq!(r.free_gpus, Some(0));
    poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(2_000));
    let r = report(&mut kcm, clock.at(2_000));
    assert_eq!(
        kcm.starts.failures.of("alice", clock.at(2_000).instant),
        0,
        "not alice's"
    );
    assert_eq!(
        kcm.starts.failures.of("bob", clock.at(2_000).instant),
        1,
        "bob's own"
    );
    assert_eq!(
        r.failed_starts, 0,
        "bob's squat and his own failures do not exclude the cluster"
    );
    assert_eq!(r.error, Some("placeholder 6.1 (before it ran) ended before its launcher reached the broker; its output (log_dir) says why".into()));
    let later = clock.at(2_000 + SQUAT_SHOWN.as_millis() as u64);
    poll(&mut kcm, gpu_cluster(Vec::new()), later);
    let r = report(&mut kcm, later);
    assert!(r.hosts[0].squatted_gpus.is_empty(), "then tried again");
    assert_eq!(r.free_gpus, Some(2));
}

#[test]
fn a_word_of_gpus_held_outside_gleaner_after_the_end_takes_the_failure_back() {
    let clock = Clock::new();
    let mut kcm = core();
    let a = job("a");
    poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(0));
    let alices = gpu_placeholder("5.1", &a, "alice", 1, true);
    poll(&mut kcm, gpu_cluster(vec![alices]), clock.at(1_000));
    // Gone before its launcher's word, relayed by its runner, came.
    poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(2_000));
    assert_eq!(kcm.starts.failures.of("alice", clock.at(2_000).instant), 1);
    message(&mut kcm, gpus_held(&a, "5.1", &["0"]), clock.at(2_100));
    assert_eq!(kcm.starts.failures.of("alice", clock.at(2_100).instant), 0);
    let r = report(&mut kcm, clock.at(2_100));
    assert_eq!(
        (r.error, r.hosts[0].squatted_gpus.clone()),
        (None, vec!["0".to_owned()])
    );
    // Said again, it takes nothing more back.
    message(&mut kcm, gpus_held(&a, "5.1", &["0"]), clock.at(2_200));
    assert_eq!(kcm.starts.failures.of("alice", clock.at(2_200).instant), 0);
}

#[test]
fn a_word_for_a_placeholder_not_seen_running_excuses_it_and_names_no_host() {
    let clock = Clock::new();
    let mut kcm = core();
    let a = job("a");
    poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(0));
    let waiting = gpu_placeholder("7.1", &a, "alice", 2, false);
    poll(&mut kcm, gpu_cluster(vec![waiting]), clock.at(1_000));
    // It ran, and its launcher spoke, between two readings; the host
    // is its word only (a task could have sent it).
    message(&mut kcm, gpus_held(&a, "7.1", &["0", "1"]), clock.at(1_500));
    let r = report(&mut kcm, clock.at(1_500));
    assert!(r.hosts[0].squatted_gpus.is_empty());
    assert_eq!(r.free_gpus, Some(2));
    poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(2_000));
    assert_eq!(kcm.starts.failures.of("alice", clock.at(2_000).instant), 0);
}

#[test]
fn gpus_claimed_within_gleaners_count_are_the_clusters_miscount() {
    let clock = Clock::new();
    let mut kcm = core();
    let (a, c) = (job("a"), job("c"));
    poll(&mut kcm, gpu_cluster(Vec::new()), clock.at(0));
    // Carol's launcher holds both GPUs by right; alice's finds them
    // claimed (the batch system counted more than the cluster lists).
    let carols = gpu_placeholder("4.1", &c, "carol", 2, true);
    let alices = gpu_placeholder("5.1", &a, "alice", 2, true);
    poll(
        &mut kcm,
        gpu_cluster(vec![carols.clone(), alices]),
        clock.at(1_000),
    );
    message(&mut kcm, gpus_held(&a, "5.1", &["0", "1"]), clock.at(1_100));
    assert!(
        report(&mut kcm, clock.at(1_100)).hosts[0]
            .squatted_gpus
            .is_empty()
    );
    poll(&mut kcm, gpu_cluster(vec![carols]), clock.at(2_000));
    assert_eq!(kcm.starts.failures.of("alice", clock.at(2_000).instant), 1);
}

#[test]
fn placeholders_that_end_before_their_launcher_speaks_are_failed_starts() {
    let clock = Clock::new();
    let mut kcm = core();
    let a = job("a");
    let at = |id: &str, host: Option<&str>| Placeholder {
        id: id.into(),
        job: a.clone(),
        slots: 1,
        host: host.map(str::to_owned),
        owner: "alice".into(),
        needs: Default::default(),
    };
    let b = job("b");
    let of_b = Placeholder {
        job: b.clone(),
        ..at("4.1", None)
    };
    // Adopted from an earlier kcm: ending is not news.
    poll(
        &mut kcm,
        cluster(4, vec![at("1.1", Some("n1"))]),
        clock.at(0),
    );
    let two = vec![at("2.1", None), at("2.2", None)];
    poll(&mut kcm, cluster(4, two), clock.at(1_000));
    assert_eq!(report(&mut kcm, clock.at(1_000)).failed_starts, 0);
    // 2.1 ran and ended unheard; 2.2 ended before it even ran.
    let next = vec![
        at("2.1", Some("n1")),
        at("2.2", None),
        at("3.1", None),
        of_b.clone(),
    ];
    poll(&mut kcm, cluster(4, next), clock.at(2_000));
    poll(
        &mut kcm,
        cluster(4, vec![at("3.1", None), of_b]),
        clock.at(3_000),
    );
    let r = report(&mut kcm, clock.at(3_000));
    assert_eq!(r.job_failures.get(&a), Some(&2), "alice's");
    assert_eq!(r.failed_starts, 0, "hers alone are not the cluster's");
    let error = r.error.unwrap_or_default();
    assert!(
        error.contains("before its launcher reached the broker"),
        "{error}"
    );
    // Job b's launchers cannot speak for a's placeholder 3.1.
    let forged = KcmMsg::LauncherUp {
        job: b.clone(),
        launcher: naming::launcher_id(&"c1".into(), "3.1"),
    };
    message(&mut kcm, forged, clock.at(3_200));
    assert_eq!(
        report(&mut kcm, clock.at(3_200)).job_failures.get(&a),
        Some(&2)
    );
    // 3.1's launcher speaks before the kcm sees it run, and clears the
    // count; 4.1 is removed by the kcm. Neither ending is a failure.
    let up = KcmMsg::LauncherUp {
        job: a.clone(),
        launcher: naming::launcher_id(&"c1".into(), "3.1"),
    };
    message(&mut kcm, up, clock.at(3_500));
    let effects = message(&mut kcm, KcmMsg::JobEnded { job: b }, clock.at(3_500));
    assert_eq!(removed(&effects), [["4.1"]]);
    poll(&mut kcm, cluster(4, Vec::new()), clock.at(4_000));
    let r = report(&mut kcm, clock.at(4_000));
    assert_eq!((r.failed_starts, r.error), (0, None));
}

#[test]
fn errors_reported_commands_first_then_reads_then_the_batch_system() {
    let clock = Clock::new();
    let mut kcm = core();
    let troubled = Snapshot {
        problem: Some("c1.q@a is in state E".into()),
        ..cluster(4, Vec::new())
    };
    poll(&mut kcm, troubled.clone(), clock.at(0));
    let error = |kcm: &mut KcmCore| report(kcm, clock.at(0)).error;
    assert_eq!(error(&mut kcm).as_deref(), Some("c1.q@a is in state E"));
    let snapshot = Err(failure("qstat -xml"));
    step(
        &mut kcm,
        Event::Polled {
            snapshot,
            spooled: Vec::new(),
            started: Vec::new(),
        },
        clock.at(0),
    );
    assert_eq!(
        error(&mut kcm).as_deref(),
        Some("qstat -xml: exit status: 1: denied")
    );
    step(
        &mut kcm,
        Event::Removed(Err(failure("qdel 1.1"))),
        clock.at(0),
    );
    assert_eq!(
        error(&mut kcm).as_deref(),
        Some("qdel 1.1: exit status: 1: denied")
    );
    step(&mut kcm, Event::Removed(Ok(())), clock.at(0));
    assert!(
        error(&mut kcm).is_some(),
        "only a good submission clears a command error"
    );
    let fine = cluster(4, Vec::new());
    poll(&mut kcm, fine, clock.at(0));
    assert_eq!(
        error(&mut kcm).as_deref(),
        Some("qdel 1.1: exit status: 1: denied")
    );
}

#[test]
fn component_ends_in_the_spool_are_reported_until_heard_then_deleted() {
    let clock = Clock::new();
    let mut kcm = core();
    let g = job("g");
    let spec = spec(&g, 1, 2);
    let effects = message(&mut kcm, KcmMsg::SubmitComponent(spec.clone()), clock.at(0));
    assert!(
        matches!(
            effects.as_slice(),
            [
                Effect::DeleteSpoolEntry { component: 1, .. },
                Effect::SubmitComponent { spec: submitted, one_host: false, .. },
                Effect::PollNow,
            ] if *submitted == spec
        ),
        "no host seen yet: spread"
    );
    let answer = Event::ComponentSubmitted {
        spec,
        result: Ok(()),
    };
    assert!(
        matches!(
            &step(&mut kcm, answer, clock.at(0))[..],
            [Effect::Tell {
                message: ControlMsg::ComponentQueued { component: 1, .. },
                ..
            }]
        ),
        "its job hears it is queued"
    );
    let exit = SpooledExit {
        job: g.clone(),
        component: 1,
        exit_code: Some(3),
        preempted: false,
    };
    let running = Snapshot {
        components: vec![component("8", &g, 1, 2)],
        ..cluster(4, Vec::new())
    };
    // The wrapper wrote its exit status; the batch system still lists it.
    let effects = poll_spool(&mut kcm, running, vec![exit.clone()], clock.at(1_000));
    assert!(ended(&effects).is_empty(), "{effects:?}");

    let ends = ended(&poll_spool(
        &mut kcm,
        cluster(4, Vec::new()),
        vec![exit.clone()],
        clock.at(31_000),
    ));
    let outcome = ComponentOutcome {
        component: 1,
        cluster: "c1".into(),
        exit_code: Some(3),
        runtime_ms: 31_000,
        stdout: Captured::default(),
        stderr: Captured::default(),
        preempted: false,
    };
    assert_eq!(ends, [(g.clone(), outcome.clone())]);
    // Not heard yet (the send failed): still reported, spool entry kept.
    let effects = poll_spool(
        &mut kcm,
        cluster(4, Vec::new()),
        vec![exit],
        clock.at(32_000),
    );
    let again = ComponentOutcome {
        runtime_ms: 32_000,
        ..outcome
    };
    assert_eq!(ended(&effects), [(g.clone(), again)], "still tracked");
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::DeleteSpoolEntry { .. }))
    );
    // Heard: forgotten, and only now its spool entry goes.
    let effects = step(
        &mut kcm,
        Event::ComponentReported {
            job: g.clone(),
            component: 1,
        },
        clock.at(32_000),
    );
    assert!(matches!(
        effects.as_slice(),
        [Effect::DeleteSpoolEntry { job, component: 1 }] if *job == g
    ));
    assert!(ended(&poll(&mut kcm, cluster(4, Vec::new()), clock.at(33_000))).is_empty());
}

#[test]
fn a_started_component_is_told_once_and_let_go_or_withdrawn_when_its_job_says() {
    let clock = Clock::new();
    let mut kcm = core();
    let g = job("g");
    let spec = spec(&g, 1, 2);
    message(&mut kcm, KcmMsg::SubmitComponent(spec.clone()), clock.at(0));
    let answer = Event::ComponentSubmitted {
        spec,
        result: Ok(()),
    };
    step(&mut kcm, answer, clock.at(0));
    let n1 = vec![HostSlots {
        host: "n1".into(),
        slots: 2,
    }];
    let started = |job: &JobId, hosts: Result<Vec<HostSlots>, String>| SpooledStart {
        job: job.clone(),
        component: 1,
        hosts,
    };
    let running = || Snapshot {
        components: vec![component("8", &g, 1, 2)],
        ..cluster(4, Vec::new())
    };
    let told = |effects: &[Effect]| -> Vec<(JobId, ControlMsg)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Tell { job, message } => Some((job.clone(), message.clone())),
                _ => None,
            })
            .collect()
    };
    let stranger = job("h");
    let effects = poll_started(
        &mut kcm,
        running(),
        Vec::new(),
        vec![
            started(&g, Ok(n1.clone())),
            started(&stranger, Ok(n1.clone())),
        ],
        clock.at(1_000),
    );
    let [
        (
            job,
            ControlMsg::ComponentStarted {
                component,
                cluster: at,
                hosts,
            },
        ),
    ] = &told(&effects)[..]
    else {
        panic!("{effects:?}");
    };
    assert_eq!((job, *component, at.as_str(), hosts), (&g, 1, "c1", &n1));
    let again = poll_started(
        &mut kcm,
        running(),
        Vec::new(),
        vec![started(&g, Err("garbage".into()))],
        clock.at(2_000),
    );
    assert!(told(&again).is_empty(), "told once");

    let a = vec![HostSlots {
        host: "a".into(),
        slots: 4,
    }];
    let go = |component| KcmMsg::Go {
        job: g.clone(),
        component,
        hosts: vec![a.clone(), n1.clone()],
    };
    let effects = message(&mut kcm, go(1), clock.at(3_000));
    let [
        Effect::ReleaseComponent {
            go: text, hosts, ..
        },
    ] = &effects[..]
    else {
        panic!("{effects:?}");
    };
    assert_eq!(text, "4 6 2\n", "ranks 4 and 5 of 6");
    assert_eq!(hosts, "a slots=4 # component 0\nn1 slots=2 # component 1\n");
    assert!(
        message(&mut kcm, go(3), clock.at(3_000)).is_empty(),
        "no such component"
    );

    let effects = message(
        &mut kcm,
        KcmMsg::WithdrawComponent {
            job: g.clone(),
            component: 1,
        },
        clock.at(4_000),
    );
    assert!(
        matches!(
            &effects[..],
            [Effect::DeleteSpoolEntry { component: 1, .. }, Effect::Remove { ids }] if *ids == ["8"]
        ),
        "{effects:?}"
    );
    let effects = poll_spool(
        &mut kcm,
        cluster(4, Vec::new()),
        Vec::new(),
        clock.at(5_000),
    );
    assert!(
        ended(&effects).is_empty(),
        "withdrawn, not ended: {effects:?}"
    );
}

#[test]
fn inputs_the_nodes_do_not_see_are_staged_first_or_the_component_cannot_run() {
    let clock = Clock::new();
    let g = job("g");
    let mut reading = spec(&g, 0, 1);
    reading.inputs = vec!["/shared/a".into(), "/home/alice/b".into()];
    // No staging command: the component ends at once, unstarted.
    let mut kcm = core();
    let effects = message(
        &mut kcm,
        KcmMsg::SubmitComponent(reading.clone()),
        clock.at(0),
    );
    let [
        Effect::Tell {
            message: ControlMsg::ComponentEnded(outcome),
            ..
        },
    ] = &effects[..]
    else {
        panic!("{effects:?}");
    };
    assert_eq!((outcome.exit_code, outcome.runtime_ms), (None, 0));
    let error = String::from_utf8_lossy(&outcome.stderr.data).into_owned();
    assert!(
        error.contains("/home/alice/b") && !error.contains("/shared/a"),
        "{error}"
    );
    // With one: staged, then submitted; the time it took is reported.
    let mut kcm = KcmCore::new(CoreConfig {
        speed: 1.0,
        inputs: InputAccess {
            stages: true,
            ..core().config.inputs
        },
        ..core().config
    });
    let effects = message(
        &mut kcm,
        KcmMsg::SubmitComponent(reading.clone()),
        clock.at(0),
    );
    let [Effect::StageInputs { inputs, .. }] = &effects[..] else {
        panic!("{effects:?}");
    };
    assert_eq!(inputs, &["/home/alice/b".to_owned()]);
    let staged = Event::InputsStaged {
        spec: reading,
        account: None,
        result: Ok(Duration::from_secs(3)),
    };
    let effects = step(&mut kcm, staged, clock.at(3_000));
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::SubmitComponent { .. })),
        "{effects:?}"
    );
    let r = report(&mut kcm, clock.at(3_000));
    assert_eq!((r.inputs.stages, r.inputs.stage_s), (true, Some(3.0)));
}

#[test]
fn components_that_fit_on_one_host_are_kept_on_one() {
    let clock = Clock::new();
    let mut kcm = core();
    let g = job("g");
    let hosts = Snapshot {
        hosts: vec![Host::new("n1", 4), Host::new("n2", 8)],
        ..Snapshot::default()
    };
    poll(&mut kcm, hosts, clock.at(0));
    let layouts: Vec<(u32, bool)> = [1, 8, 9]
        .into_iter()
        .map(|slots| {
            let effects = message(
                &mut kcm,
                KcmMsg::SubmitComponent(spec(&g, 0, slots)),
                clock.at(0),
            );
            let one_host = effects.iter().find_map(|e| match e {
                Effect::SubmitComponent { one_host, .. } => Some(*one_host),
                _ => None,
            });
            (slots, one_host.unwrap())
        })
        .collect();
    assert_eq!(layouts, [(1, true), (8, true), (9, false)]);
}

#[test]
fn components_without_an_exit_status_end_once_gone_or_a_minute_unseen() {
    let clock = Clock::new();
    let mut kcm = single_user_core();
    let g = job("g");
    for component in [0, 1] {
        let submitted = Event::ComponentSubmitted {
            spec: spec(&g, component, 1),
            result: Ok(()),
        };
        step(&mut kcm, submitted, clock.at(0));
    }
    // Component 1 shows up, then leaves without an exit status (qdel).
    let seen = Snapshot {
        components: vec![component("8", &g, 1, 1)],
        ..cluster(4, Vec::new())
    };
    assert!(ended(&poll(&mut kcm, seen, clock.at(1_000))).is_empty());
    let ends = ended(&poll(&mut kcm, cluster(4, Vec::new()), clock.at(2_000)));
    let summary: Vec<_> = ends
        .iter()
        .map(|(_, o)| (o.component, o.exit_code, o.runtime_ms))
        .collect();
    assert_eq!(summary, [(1, None, 2_000)]);
    let r = report(&mut kcm, clock.at(2_000));
    assert_eq!(
        r.failed_starts, 1,
        "killed under it: the cluster's failure, counted once"
    );
    step(
        &mut kcm,
        Event::ComponentReported {
            job: g.clone(),
            component: 1,
        },
        clock.at(2_000),
    );
    // Component 0 never showed up: given up on after a minute.
    assert!(ended(&poll(&mut kcm, cluster(4, Vec::new()), clock.at(60_000))).is_empty());
    let ends = ended(&poll(&mut kcm, cluster(4, Vec::new()), clock.at(60_001)));
    let summary: Vec<_> = ends
        .iter()
        .map(|(_, o)| (o.component, o.exit_code, o.runtime_ms))
        .collect();
    assert_eq!(summary, [(0, None, 60_001)]);
    assert_eq!(
        report(&mut kcm, clock.at(60_001)).failed_starts,
        1,
        "never seen: the batch system lost it, or never had it"
    );
}

#[test]
fn a_component_that_exits_or_meets_its_walltime_is_no_failure_of_the_clusters() {
    let clock = Clock::new();
    let mut kcm = single_user_core();
    let g = job("g");
    let mut timed = spec(&g, 0, 1);
    timed.walltime_ms = Some(10_000);
    for spec in [timed, spec(&g, 1, 1)] {
        let submitted = Event::ComponentSubmitted {
            spec,
            result: Ok(()),
        };
        step(&mut kcm, submitted, clock.at(0));
    }
    let seen = Snapshot {
        components: vec![component("8", &g, 0, 1), component("9", &g, 1, 1)],
        ..cluster(4, Vec::new())
    };
    poll(&mut kcm, seen, clock.at(1_000));
    let exit = SpooledExit {
        job: g.clone(),
        component: 1,
        exit_code: Some(7),
        preempted: false,
    };
    let ends = ended(&poll_spool(
        &mut kcm,
        cluster(4, Vec::new()),
        vec![exit],
        clock.at(9_000),
    ));
    assert_eq!(ends.len(), 2);
    assert_eq!(report(&mut kcm, clock.at(9_000)).failed_starts, 0);
}

#[test]
fn a_component_that_cannot_be_submitted_ends_at_once_with_the_error() {
    let clock = Clock::new();
    let mut kcm = core();
    let g = job("g");
    let spec = spec(&g, 2, 64);
    let result = Err(failure("qsub -pe make 64"));
    let effects = step(
        &mut kcm,
        Event::ComponentSubmitted { spec, result },
        clock.at(0),
    );
    let [
        Effect::Tell {
            job,
            message: ControlMsg::ComponentEnded(outcome),
        },
    ] = effects.as_slice()
    else {
        panic!("{effects:?}");
    };
    assert_eq!((job, outcome.component, outcome.exit_code), (&g, 2, None));
    assert_eq!(
        outcome.stderr.data,
        b"qsub -pe make 64: exit status: 1: denied"
    );
    assert!(report(&mut kcm, clock.at(0)).error.is_some());
    assert!(
        ended(&poll(&mut kcm, cluster(4, Vec::new()), clock.at(120_000))).is_empty(),
        "not tracked"
    );
}

#[test]
fn a_polls_report_carries_the_answers_to_its_own_commands() {
    let clock = Clock::new();
    let mut kcm = core();
    let a = job("a");
    let waiting = cluster(4, vec![placeholder("3.1", &a, false)]);
    poll(&mut kcm, waiting.clone(), clock.at(0));
    let now = clock.at(61_000);
    kcm.handle(
        Event::Polled {
            snapshot: Ok(waiting),
            spooled: Vec::new(),
            started: Vec::new(),
        },
        now,
    );
    let mut sent = Vec::new();
    while let Some(effect) = kcm.poll_effect(now) {
        if let Effect::Remove { .. } = effect {
            kcm.handle(Event::Removed(Err(failure("qdel 3.1"))), now);
        }
        sent.push(effect);
    }
    let reported = sent.iter().find_map(|e| match e {
        Effect::ToScheduler(SchedulerMsg::ClusterStatus(report)) => Some(report.clone()),
        _ => None,
    });
    assert_eq!(
        reported.and_then(|r| r.error).as_deref(),
        Some("qdel 3.1: exit status: 1: denied"),
        "{sent:?}"
    );
}

#[test]
fn a_jobs_end_forgets_its_launchers_settings() {
    let clock = Clock::new();
    let mut kcm = core();
    let a = job("a");
    let effects = message(&mut kcm, KcmMsg::JobEnded { job: a.clone() }, clock.at(0));
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::ForgetLauncherSettings { job } if *job == a)),
        "{effects:?}"
    );
}

#[test]
fn placeholders_and_components_waiting_too_long_are_withdrawn() {
    let clock = Clock::new();
    let mut kcm = core();
    let (a, g) = (job("a"), job("g"));
    let waiting = Snapshot {
        components: vec![ComponentRun {
            running: false,
            ..component("9", &g, 1, 2)
        }],
        ..cluster(
            4,
            vec![placeholder("3.1", &a, true), placeholder("3.2", &a, false)],
        )
    };
    assert!(removed(&poll(&mut kcm, waiting.clone(), clock.at(0))).is_empty());
    assert!(removed(&poll(&mut kcm, waiting.clone(), clock.at(60_000))).is_empty());
    let effects = poll(&mut kcm, waiting.clone(), clock.at(61_000));
    assert_eq!(removed(&effects), [vec!["3.2".to_owned(), "9".to_owned()]]);
    let ends = ended(&effects);
    assert!(
        ends.is_empty(),
        "a withdrawn component is told, not reported from the spool"
    );
    assert!(effects.iter().any(|e| matches!(
        e,
        Effect::Tell { job, message: ControlMsg::ComponentWithdrawn { component: 1, reason, .. } }
            if job == &g && reason.contains("longer than")
    )));
    let r = report(&mut kcm, clock.at(61_000));
    assert_eq!(r.failed_starts, 1, "counted as a failed start");
    assert_eq!(
        r.idle_slots, 0,
        "one slot runs a launcher; the withdrawn three are not offered again"
    );
    assert!(r.error.unwrap().contains("longer than"));
    // A successful submit does not clear it; a placeholder that runs does.
    step(
        &mut kcm,
        Event::LaunchersSubmitted {
            job: a.clone(),
            grant: GrantId::new(8),
            requested: 1,
            result: Ok(1),
        },
        clock.at(62_000),
    );
    assert_eq!(report(&mut kcm, clock.at(62_000)).failed_starts, 1);
    let started = cluster(
        4,
        vec![placeholder("3.1", &a, true), placeholder("4.1", &a, true)],
    );
    poll(&mut kcm, started, clock.at(63_000));
    assert_eq!(report(&mut kcm, clock.at(63_000)).failed_starts, 0);
}

#[test]
fn caps_limit_the_slots_offered() {
    let clock = Clock::new();
    let capped = |max_scavenged, reserve_hosts: &[&str]| {
        KcmCore::new(CoreConfig {
            speed: 1.0,
            max_scavenged,
            reserve_hosts: reserve_hosts.iter().map(|h| (*h).to_owned()).collect(),
            ..core().config
        })
    };
    let a = job("a");
    let grid = |placeholders: Vec<Placeholder>| Snapshot {
        hosts: vec![Host::new("n1", 4), Host::new("n2", 4), Host::new("n3", 4)],
        placeholders,
        ..Snapshot::default()
    };
    let idle = |kcm: &mut KcmCore, snapshot| {
        poll(kcm, snapshot, clock.at(0));
        report(kcm, clock.at(0)).idle_slots
    };
    let two = vec![placeholder("1.1", &a, true), placeholder("1.2", &a, false)];
    assert_eq!(idle(&mut capped(None, &[]), grid(two.clone())), 10);
    assert_eq!(
        idle(
            &mut capped(Some(crate::Cap::Slots(5)), &[]),
            grid(two.clone())
        ),
        3
    );
    assert_eq!(
        idle(
            &mut capped(Some(crate::Cap::Fraction(0.5)), &[]),
            grid(two.clone())
        ),
        4
    );
    assert_eq!(
        idle(&mut capped(None, &["n3.grid.example"]), grid(two.clone())),
        6,
        "n3's slots are not offered"
    );
    assert_eq!(
        idle(&mut capped(Some(crate::Cap::Slots(1)), &[]), grid(two)),
        0,
        "never below what is held"
    );
}

#[test]
fn the_report_counts_slots_per_job_and_for_the_cluster() {
    let clock = Clock::new();
    let mut kcm = core();
    let (a, b, g) = (job("a"), job("b"), job("g"));
    let node = Placeholder {
        slots: 4,
        ..placeholder("2.1", &b, true)
    };
    let snapshot = Snapshot {
        components: vec![
            component("8", &g, 0, 4),
            ComponentRun {
                running: false,
                ..component("9", &g, 1, 2)
            },
        ],
        ..busy(
            16,
            3,
            4,
            vec![
                placeholder("1.1", &a, true),
                placeholder("1.2", &a, true),
                placeholder("1.3", &a, false),
                node,
            ],
        )
    };
    poll(&mut kcm, snapshot, clock.at(0));
    let r = report(&mut kcm, clock.at(1_234));
    assert_eq!((r.cluster.as_str(), r.backend.as_str()), ("c1", "sge"));
    assert_eq!((r.total_slots, r.local_slots, r.grid_slots), (16, 3, 4));
    assert_eq!(
        r.idle_slots, 0,
        "16 - 3 local - 4 grid - 7 claimed by placeholders - 2 by the waiting component"
    );
    assert_eq!(r.local_waiting, 0);
    assert_eq!(
        r.jobs,
        [
            (
                a,
                Holding {
                    running: 2,
                    pending: 1
                }
            ),
            (
                b,
                Holding {
                    running: 4,
                    pending: 0
                }
            ),
        ]
        .into()
    );
    assert_eq!(
        r.grid,
        [(
            g,
            Holding {
                running: 4,
                pending: 2
            }
        )]
        .into()
    );
    assert_eq!((r.error, r.failed_starts), (None, 0));
    assert_eq!(r.at, 1_700_000_001_234);
}

/// A job named like gleaner's, as a reading leaves it: one batch id
/// of one slot, running on `n1` or waiting (on hold: no local job).
fn named(id: &str, job: &JobId, component: Option<u32>, owner: &str, runs: bool) -> NamedJob {
    NamedJob {
        job: job.clone(),
        component,
        owner: owner.into(),
        ids: vec![id.into()],
        slots: 1,
        hosts: if runs {
            vec![("n1".into(), 1)]
        } else {
            Vec::new()
        },
        waiting: None,
        problem: None,
        needs: Default::default(),
        timing: Default::default(),
    }
}

/// One host, `n1`, of 4 slots, and jobs named like gleaner's.
fn reading(named: Vec<NamedJob>) -> Snapshot {
    Snapshot {
        named,
        ..cluster(4, Vec::new())
    }
}

fn grant(job: &JobId, grant: u64, owner: &str) -> KcmMsg {
    KcmMsg::StartLaunchers {
        job: job.clone(),
        grant: GrantId::new(grant),
        slots: 1,
        task_slots: 1,
        task_needs: Default::default(),
        owner: owner.into(),
        credentials: Some(launcher_account()),
    }
}

/// Many users; the broker user `alice@lab` is the Unix account alice.
fn many_users() -> KcmCore {
    let mut users = Users::default();
    users.accounts.insert("alice@lab".into(), "alice".into());
    KcmCore::new(CoreConfig {
        speed: 1.0,
        users,
        ..core().config
    })
}

#[test]
fn launchers_and_components_run_as_their_owners_account_where_users_are_kept_apart() {
    let clock = Clock::new();
    let mut kcm = many_users();
    let h = job("h");
    poll(&mut kcm, reading(Vec::new()), clock.at(0));
    let accounts = |effects: &[Effect]| -> Vec<Option<String>> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::SubmitLaunchers { account, .. }
                | Effect::SubmitComponent { account, .. } => Some(account.clone()),
                _ => None,
            })
            .collect()
    };
    let effects = message(&mut kcm, grant(&h, 1, "alice@lab"), clock.at(0));
    assert_eq!(accounts(&effects), [Some("alice".to_owned())]);
    let submit = KcmMsg::SubmitComponent(ComponentSpec {
        needs: Default::default(),
        owner: "bob".into(),
        ..spec(&job("g"), 0, 1)
    });
    let effects = message(&mut kcm, submit, clock.at(0));
    assert_eq!(
        accounts(&effects),
        [Some("bob".to_owned())],
        "unmapped: the same name"
    );
    let mut single = single_user_core();
    poll(&mut single, reading(Vec::new()), clock.at(0));
    let mut order = grant(&h, 2, "alice@lab");
    if let KcmMsg::StartLaunchers { credentials, .. } = &mut order {
        *credentials = None;
    }
    let effects = message(&mut single, order, clock.at(0));
    assert_eq!(accounts(&effects), [None], "one user: the kcm's own");
}

#[test]
fn a_component_submitted_as_its_owner_is_gleaners_and_no_one_elses_is() {
    let clock = Clock::new();
    let mut kcm = many_users();
    let h = job("h");
    poll(&mut kcm, reading(Vec::new()), clock.at(0));
    let submit = KcmMsg::SubmitComponent(ComponentSpec {
        needs: Default::default(),
        owner: "alice@lab".into(),
        ..spec(&h, 0, 1)
    });
    message(&mut kcm, submit, clock.at(0));
    let hers = named("9", &h, Some(0), "alice", true);
    let bobs = named("10", &h, Some(1), "bob", true);
    poll(&mut kcm, reading(vec![hers, bobs]), clock.at(1_000));
    let r = report(&mut kcm, clock.at(1_000));
    assert_eq!(
        r.grid[&h],
        Holding {
            running: 1,
            pending: 0
        },
        "alice's is the job's; bob's is his own local job"
    );
    assert_eq!(r.local_slots, 1);
}

/// Bob names a job of his like a component of Alice's grid job before
/// the kcm's first reading, which adopts it for want of an order: her
/// order still has her component submitted, and his is never taken
/// for it (nor withdrawn as hers waiting too long).
#[test]
fn a_component_named_by_another_before_the_first_reading_is_not_the_jobs() {
    let clock = Clock::new();
    let mut kcm = many_users();
    let h = job("h");
    let bobs = named("10", &h, Some(0), "bob", false);
    poll(&mut kcm, reading(vec![bobs.clone()]), clock.at(0));
    let submit = KcmMsg::SubmitComponent(ComponentSpec {
        needs: Default::default(),
        owner: "alice@lab".into(),
        ..spec(&h, 0, 1)
    });
    let effects = message(&mut kcm, submit, clock.at(0));
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::SubmitComponent { .. })),
        "{effects:?}"
    );
    let effects = poll(&mut kcm, reading(vec![bobs]), clock.at(120_000));
    assert!(removed(&effects).is_empty(), "{effects:?}");
    assert!(
        !effects.iter().any(|e| matches!(
            e,
            Effect::Tell {
                message: ControlMsg::ComponentWithdrawn { .. },
                ..
            }
        )),
        "{effects:?}"
    );
}

#[test]
fn another_owners_jobs_named_like_gleaners_are_his_local_jobs() {
    let clock = Clock::new();
    let mut kcm = many_users();
    let (a, g) = (job("a"), job("g"));
    poll(&mut kcm, reading(Vec::new()), clock.at(0));
    message(&mut kcm, grant(&a, 1, "alice@lab"), clock.at(0));
    let submitted = Event::ComponentSubmitted {
        spec: spec(&g, 0, 1),
        result: Ok(()),
    };
    step(&mut kcm, submitted, clock.at(0));
    let hers = named("5.1", &a, None, "alice", true);
    let gleaners = named("8", &g, Some(0), "root", true);
    // Bob's: a held `gl-<a>`, a running `gg-<g>.0`.
    let held = named("6", &a, None, "bob", false);
    let fake = named("7", &g, Some(0), "bob", true);
    let all = vec![hers.clone(), held.clone(), fake, gleaners.clone()];
    assert!(removed(&poll(&mut kcm, reading(all), clock.at(1_000))).is_empty());
    let r = report(&mut kcm, clock.at(1_000));
    let one = Holding {
        running: 1,
        pending: 0,
    };
    assert_eq!((r.jobs[&a], r.grid[&g]), (one, one));
    assert_eq!(
        (r.local_slots, r.grid_slots, r.idle_slots),
        (1, 1, 1),
        "bob's component is a local job; his held one takes nothing"
    );

    // Bob's component ends; g's does not, nor is anything reported.
    let without = vec![hers.clone(), held.clone(), gleaners.clone()];
    assert!(ended(&poll(&mut kcm, reading(without.clone()), clock.at(2_000))).is_empty());
    // His placeholder waits far longer than max_pending, then runs
    // and ends without a launcher: never withdrawn, no failed start.
    let effects = poll(&mut kcm, reading(without), clock.at(120_000));
    assert!(removed(&effects).is_empty(), "{effects:?}");
    let ran = vec![
        hers.clone(),
        named("6", &a, None, "bob", true),
        gleaners.clone(),
    ];
    poll(&mut kcm, reading(ran), clock.at(121_000));
    let left = vec![hers.clone(), held.clone(), gleaners.clone()];
    poll(&mut kcm, reading(left.clone()), clock.at(122_000));
    let r = report(&mut kcm, clock.at(122_000));
    assert_eq!((r.failed_starts, r.error), (0, None));

    // Alice's job ends: hers go (after the grace), his never.
    let effects = message(
        &mut kcm,
        KcmMsg::JobEnded { job: a.clone() },
        clock.at(123_000),
    );
    assert!(removed(&effects).is_empty(), "{effects:?}");
    let effects = poll(&mut kcm, reading(left.clone()), clock.at(133_000));
    assert_eq!(removed(&effects), [["5.1"]]);
    // Her last placeholder gone, her job's account is forgotten: a
    // `gl-<a>` of hers now is one of her local jobs.
    poll(
        &mut kcm,
        reading(vec![held.clone(), gleaners.clone()]),
        clock.at(134_000),
    );
    let late = vec![named("9.1", &a, None, "alice", true), held, gleaners];
    assert!(removed(&poll(&mut kcm, reading(late), clock.at(135_000))).is_empty());
    let r = report(&mut kcm, clock.at(135_000));
    assert!(r.jobs.is_empty(), "{:?}", r.jobs);
    assert_eq!(r.local_slots, 1);
}

#[test]
fn a_restarted_kcm_adopts_placeholders_of_one_owner_per_job() {
    let clock = Clock::new();
    let mut kcm = many_users();
    let (b, c, d) = (job("b"), job("c"), job("d"));
    let found = vec![
        named("1.1", &b, None, "carol", true),
        named("1.2", &b, None, "carol", false),
        named("2.1", &c, None, "alice", true),
        named("3", &c, None, "bob", false),
    ];
    poll(&mut kcm, reading(found.clone()), clock.at(0));
    let r = report(&mut kcm, clock.at(0));
    let jobs: Vec<&JobId> = r.jobs.keys().collect();
    assert_eq!(jobs, [&b], "two owners claim c: neither is adopted");
    assert_eq!(r.local_slots, 1, "c's running one counts as a local job");

    // c's grant says whose it is; d's placeholder comes after the
    // first reading, without a grant: not gleaner's.
    message(&mut kcm, grant(&c, 1, "alice@lab"), clock.at(100));
    let mut later = found;
    later.push(named("4.1", &d, None, "dave", true));
    poll(&mut kcm, reading(later), clock.at(1_000));
    let r = report(&mut kcm, clock.at(1_000));
    let held: Vec<(&JobId, u32, u32)> = r
        .jobs
        .iter()
        .map(|(job, h)| (job, h.running, h.pending))
        .collect();
    assert_eq!(held, [(&b, 1, 1), (&c, 1, 0)]);
    assert_eq!(r.local_slots, 1, "d's");
}

#[test]
fn with_one_user_every_placeholder_is_the_kcms_own_accounts() {
    let clock = Clock::new();
    let mut kcm = KcmCore::new(CoreConfig {
        speed: 1.0,
        account: "gleaner".into(),
        users: Users {
            single: Some(true),
            ..Users::default()
        },
        ..core().config
    });
    let a = job("a");
    message(&mut kcm, grant(&a, 1, "alice"), clock.at(0));
    let found = vec![
        named("1.1", &a, None, "gleaner", true),
        named("2.1", &a, None, "alice", true),
        named("3", &a, Some(0), "alice", true),
    ];
    poll(&mut kcm, reading(found), clock.at(0));
    let r = report(&mut kcm, clock.at(0));
    assert_eq!(
        r.jobs[&a],
        Holding {
            running: 1,
            pending: 0
        }
    );
    assert!(r.grid.is_empty());
    assert_eq!(r.local_slots, 2);
}
