use super::*;
use gleaner_manifest::Priority;
use gleaner_protocol::{Holding, JobState, TaskCounts};

use crate::grid_book::GridConfig;

fn job(name: &str) -> JobId {
    format!("{name}-0000000000000000").parse().unwrap()
}

pub(crate) fn job_report(name: &str, unfinished: u64) -> JobReport {
    JobReport {
        task_needs: Default::default(),
        job: job(name),
        owner: "alice".into(),
        kind: JobKind::Scavenge,
        priority: Priority::SuperLow,
        state: JobState::Running,
        runner: "r".into(),
        tasks: TaskCounts {
            total: unfinished,
            pending: unfinished,
            ..TaskCounts::default()
        },
        launchers: BTreeMap::new(),
        throughput: 0.0,
        preemptions: 0,
        started_at: 0,
        results: String::new(),
        components: Vec::new(),
        max_slots: None,
        problem: None,
        gathering: None,
        avoid: Vec::new(),
        moldable: Vec::new(),
        inputs: Vec::new(),
        component_inputs: Vec::new(),
        weight: 1,
        task_slots: 1,
        open: false,
    }
}

fn cluster_report(idle: u32, jobs: &[(&str, u32)], applied: Vec<u64>) -> ClusterReport {
    ClusterReport {
        cluster: "c1".into(),
        backend: "local".into(),
        total_slots: 8,
        idle_slots: idle,
        jobs: jobs
            .iter()
            .map(|(j, n)| {
                (
                    job(j),
                    Holding {
                        running: *n,
                        pending: 0,
                    },
                )
            })
            .collect(),
        applied_grants: applied.into_iter().map(GrantId::new).collect(),
        ..ClusterReport::default()
    }
}

fn offers(actions: &[Action]) -> Vec<(String, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Offer { job, slots, .. } => Some((job.name().to_owned(), *slots)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_slot_is_never_offered_twice() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(job_report("a", 100), now);
    state.on_cluster(cluster_report(8, &[], vec![]), now, &config);
    assert_eq!(offers(&state.round(now, &config)), [("a".into(), 8)]);
    assert!(state.round(now, &config).is_empty(), "grant in flight");
    // The runner took 5; 3 come free again for the next round.
    state.on_grow_ack(GrantId::new(1), 5);
    assert_eq!(offers(&state.round(now, &config)), [("a".into(), 3)]);
    // The kcm applied grant 1: its placeholders now hold the slots.
    state.on_grow_ack(GrantId::new(2), 0);
    state.on_cluster(cluster_report(3, &[("a", 5)], vec![1]), now, &config);
    assert_eq!(offers(&state.round(now, &config)), [("a".into(), 3)]);
}

#[test]
fn a_round_follows_each_new_job_but_not_cluster_reports() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    let update = || SchedulerMsg::JobUpdate(job_report("a", 100));
    assert_eq!(state.on_message(update(), now, &config), Reaction::Round);
    assert_eq!(state.on_message(update(), now, &config), Reaction::Nothing);
    let report = SchedulerMsg::ClusterStatus(cluster_report(8, &[], vec![]));
    assert_eq!(state.on_message(report, now, &config), Reaction::Nothing);
    let done = SchedulerMsg::JobDone { job: job("a") };
    assert_eq!(state.on_message(done, now, &config), Reaction::Nothing);
    assert!(state.round(now, &config).is_empty(), "a is forgotten");
}

#[test]
fn users_find_their_own_ended_jobs_only() {
    let config = StateConfig::default();
    let now = Now::read();
    let mut state = State::new(GrantId::new(1));
    let users = Users {
        single: Some(false),
        ..Users::default()
    };
    let mut hers = job_report("a", 0);
    hers.state = JobState::Done;
    let mut his = job_report("b", 0);
    his.owner = "bob".into();
    for report in [hers, his] {
        let event = gleaner_protocol::Event::Done(report);
        let ended = EndedJob::of(&event, now.wall_ms).expect("an end");
        state.on_ended(ended, now, &config);
    }
    let ask = |user, job: Option<JobId>| match state.on_request(
        Some(user),
        RequestMsg::Status { job },
        now.instant,
        &config,
        &users,
    ) {
        Answer::Status(reply) => reply,
        other => panic!("{other:?}"),
    };
    let all = ask("alice", None);
    assert_eq!(all.ended.len(), 1);
    assert_eq!(all.ended[0].job, job("a"));
    let hers = ask("alice", Some(job("a")));
    assert_eq!((hers.ended.len(), hers.hidden), (1, 0));
    let his = ask("alice", Some(job("b")));
    assert_eq!(
        (his.ended.len(), his.hidden),
        (0, 1),
        "not hers: left out, and counted"
    );
    assert_eq!(ask("bob", Some(job("b"))).ended.len(), 1);
}

#[test]
fn users_see_and_cancel_their_own_jobs_only() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(job_report("a", 3), now);
    let mut bobs = job_report("b", 3);
    bobs.owner = "bob".into();
    state.on_job_update(bobs, now);
    let users = Users {
        single: Some(false),
        admins: vec!["ops".into()],
        ..Users::default()
    };
    let seen =
        |user| match state.on_request(user, RequestMsg::Status { job: None }, now, &config, &users)
        {
            Answer::Status(reply) => (
                reply
                    .jobs
                    .iter()
                    .map(|j| j.job.name().to_owned())
                    .collect::<Vec<_>>(),
                reply.hidden,
            ),
            other => panic!("{other:?}"),
        };
    assert_eq!(seen(Some("alice")), (vec!["a".to_owned()], 1));
    assert_eq!(seen(Some("ops")).0.len(), 2);
    assert_eq!(seen(None), (vec![], 2));
    let cancel = |user, name| {
        let request = RequestMsg::Cancel { job: job(name) };
        match state.on_request(user, request, now, &config, &users) {
            Answer::Action(reply, sent) => (reply, sent.map(|(job, _)| job)),
            other => panic!("{other:?}"),
        }
    };
    assert!(matches!(
        cancel(Some("bob"), "a"),
        (ActionReply::Refused { .. }, None)
    ));
    assert_eq!(
        cancel(Some("alice"), "a"),
        (ActionReply::Accepted {}, Some(job("a")))
    );
    assert_eq!(
        cancel(Some("ops"), "b"),
        (ActionReply::Accepted {}, Some(job("b")))
    );
    assert_eq!(
        cancel(Some("alice"), "zz"),
        (ActionReply::NotRunning {}, None)
    );
}

#[test]
fn news_brings_a_round_forward_but_bursts_share_one() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut clock = RoundClock::new(ms(1000), ms(200), t0);
    assert_eq!(clock.next(), t0 + ms(1000));
    clock.hurry(t0 + ms(500));
    assert_eq!(clock.next(), t0 + ms(500), "due at once");
    clock.ran(t0 + ms(500));
    clock.hurry(t0 + ms(510));
    clock.hurry(t0 + ms(520));
    assert_eq!(
        clock.next(),
        t0 + ms(700),
        "not sooner than min_gap after the last"
    );
    clock.ran(t0 + ms(700));
    assert_eq!(clock.next(), t0 + ms(1700), "then on the timer again");
}

#[test]
fn demand_counts_what_a_job_holds() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(job_report("a", 6), now);
    state.on_cluster(cluster_report(4, &[("a", 4)], vec![]), now, &config);
    assert_eq!(offers(&state.round(now, &config)), [("a".into(), 2)]);
}

#[test]
fn a_job_never_grows_past_its_max_launchers() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(
        JobReport {
            task_needs: Default::default(),
            max_slots: Some(5),
            problem: None,
            weight: 1,
            ..job_report("a", 100)
        },
        now,
    );
    state.on_cluster(cluster_report(6, &[("a", 2)], vec![]), now, &config);
    assert_eq!(offers(&state.round(now, &config)), [("a".into(), 3)]);
    state.on_grow_ack(GrantId::new(1), 3);
    state.on_cluster(cluster_report(3, &[("a", 5)], vec![1]), now, &config);
    assert!(
        offers(&state.round(now, &config)).is_empty(),
        "5 held: no more"
    );
}

#[test]
fn only_slots_idle_for_the_settle_time_are_offered() {
    let config = StateConfig {
        idle_settle: Duration::from_secs(5),
        ..StateConfig::default()
    };
    let start = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(job_report("a", 100), start);
    state.on_cluster(cluster_report(8, &[], vec![]), start, &config);
    assert!(
        state.round(start, &config).is_empty(),
        "not watched long enough"
    );
    let t = |s| start + Duration::from_secs(s);
    state.on_cluster(cluster_report(2, &[], vec![]), t(3), &config);
    state.on_cluster(cluster_report(8, &[], vec![]), t(6), &config);
    state.on_job_update(job_report("a", 100), t(6));
    assert_eq!(
        offers(&state.round(t(6), &config)),
        [("a".into(), 2)],
        "6 freed just now"
    );
}

#[test]
fn slots_freed_while_local_jobs_arrive_settle_before_they_are_offered() {
    let config = StateConfig::default();
    let start = Instant::now();
    let t = |ms| start + Duration::from_millis(ms);
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(job_report("a", 100), start);
    state.on_cluster(cluster_report(0, &[("a", 8)], vec![]), start, &config);
    // A local job waits; the kcm takes four launchers back for it.
    let mut waiting = cluster_report(0, &[("a", 8)], vec![]);
    waiting.local_waiting = 4;
    state.on_cluster(waiting, t(500), &config);
    // It started; the next local job is still being submitted, and the
    // slots just freed must not go straight back to the sweep.
    state.on_cluster(cluster_report(2, &[("a", 4)], vec![]), t(1000), &config);
    state.on_job_update(job_report("a", 100), t(1000));
    assert!(offers(&state.round(t(1000), &config)).is_empty());
    state.on_cluster(cluster_report(2, &[("a", 4)], vec![]), t(3000), &config);
    assert!(
        offers(&state.round(t(3000), &config)).is_empty(),
        "idle for 2 s only"
    );
    state.on_cluster(cluster_report(2, &[("a", 4)], vec![]), t(3600), &config);
    state.on_job_update(job_report("a", 100), t(3600));
    assert_eq!(
        offers(&state.round(t(3600), &config)),
        [("a".into(), 2)],
        "no local job waited for 3 s"
    );

    // Where no local job waited, idle slots are offered at once.
    let mut calm = State::new(GrantId::new(1));
    calm.on_job_update(job_report("a", 100), start);
    calm.on_cluster(cluster_report(0, &[("a", 8)], vec![]), start, &config);
    calm.on_cluster(cluster_report(2, &[("a", 6)], vec![]), t(1000), &config);
    calm.on_job_update(job_report("a", 100), t(1000));
    assert_eq!(offers(&calm.round(t(1000), &config)), [("a".into(), 2)]);
}

#[test]
fn slots_local_jobs_wait_for_are_not_offered() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(job_report("a", 100), now);
    let mut report = cluster_report(4, &[("a", 4)], vec![]);
    report.local_waiting = 3;
    state.on_cluster(report.clone(), now, &config);
    assert!(
        offers(&state.round(now, &config)).is_empty(),
        "local jobs wait: the idle slots settle first"
    );
    let later = now + config.local_wait_settle;
    state.on_cluster(report, later, &config);
    state.on_job_update(job_report("a", 100), later);
    assert_eq!(offers(&state.round(later, &config)), [("a".into(), 1)]);
}

#[test]
fn slots_of_local_jobs_the_batch_system_starts_first_are_offered_at_once() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(job_report("a", 100), now);
    let mut report = cluster_report(4, &[("a", 4)], vec![]);
    report.local_waiting = 12;
    report.local_waiting_first = 12;
    state.on_cluster(report.clone(), now, &config);
    assert_eq!(
        offers(&state.round(now, &config)),
        [("a".into(), 4)],
        "placeholders wait behind those jobs, in the holes backfill finds"
    );
    // One more waits that a placeholder could hold up.
    let mut also = report;
    also.local_waiting = 13;
    let later = now + Duration::from_millis(100);
    state.on_cluster(also, later, &config);
    state.on_job_update(job_report("a", 100), later);
    assert!(offers(&state.round(later, &config)).is_empty());
}

#[test]
fn failing_and_silent_clusters_get_nothing() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(job_report("a", 100), now);
    let mut failing = cluster_report(8, &[], vec![]);
    failing.failed_starts = 3;
    state.on_cluster(failing.clone(), now, &config);
    assert_eq!(
        offers(&state.round(now, &config)),
        [("a".into(), 1)],
        "a trial slot"
    );
    state.on_grow_ack(GrantId::new(1), 0);
    assert!(
        state.round(now, &config).is_empty(),
        "no second trial so soon"
    );
    let minute = now + config.probe_interval;
    state.on_job_update(job_report("a", 100), minute);
    state.on_cluster(failing, minute, &config);
    assert_eq!(
        offers(&state.round(minute, &config)).len(),
        1,
        "another trial later"
    );
    state.on_cluster(cluster_report(8, &[], vec![]), now, &config);
    let later = now + config.probe_interval + Duration::from_secs(31);
    state.on_job_update(job_report("a", 100), later);
    assert!(state.round(later, &config).is_empty(), "report too old");
}

#[test]
fn a_job_whose_launchers_fail_here_leaves_the_slots_to_others() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(job_report("a", 100), now);
    state.on_job_update(job_report("b", 100), now);
    let mut report = cluster_report(8, &[], vec![]);
    report.job_failures = [(job("a"), config.max_consecutive_failures)].into();
    state.on_cluster(report, now, &config);
    assert_eq!(
        offers(&state.round(now, &config)),
        [("b".into(), 8)],
        "b gets what a cannot use; the cluster is not excluded"
    );
}

fn grid_report(name: &str, priority: Priority, components: &[u32]) -> JobReport {
    JobReport {
        task_needs: Default::default(),
        kind: JobKind::Grid,
        priority,
        state: JobState::Waiting,
        components: components.to_vec(),
        ..job_report(name, components.len() as u64)
    }
}

/// A cluster of 8 slots, all free but for `busy` held by local jobs
/// for `busy_s`, with gleaner's component `waiting` (job, slots,
/// start in s, walltime in s) in its queue.
fn foreseeing(
    name: &str,
    busy: u32,
    busy_s: u64,
    waiting: Option<(&str, u32, u64, u64)>,
) -> ClusterReport {
    let free = match busy {
        0 => vec![(0, 8)],
        _ => vec![(0, 8 - busy), (busy_s * 1000, 8)],
    };
    ClusterReport {
        cluster: name.into(),
        free_slots: Some(8 - busy),
        foresight: Some(gleaner_protocol::Foresight {
            speed: 1.0,
            free,
            waiting: waiting
                .into_iter()
                .map(
                    |(j, slots, start_s, walltime_s)| gleaner_protocol::WaitingComponent {
                        job: job(j),
                        component: 0,
                        slots,
                        start_ms: start_s * 1000,
                        walltime_ms: Some(walltime_s * 1000),
                        source: gleaner_protocol::EctSource::Model,
                    },
                )
                .collect(),
        }),
        ..cluster_report(8 - busy, &[], vec![])
    }
}

#[test]
fn mct_queues_a_grid_job_where_it_completes_first_and_reallocation_moves_it() {
    let config = StateConfig {
        grid: GridConfig {
            reallocate_every: Duration::from_secs(60),
            ..GridConfig::default()
        },
        ..StateConfig::default()
    };
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    let mut report = grid_report("g", Priority::High, &[8]);
    report.gathering = Some(gleaner_protocol::Gathering {
        walltime_s: Some(600.0),
        ..Default::default()
    });
    state.on_job_update(report.clone(), now);
    // c1 is full for 20 min, c2 for an hour.
    state.on_cluster(foreseeing("c1", 8, 1200, None), now, &config);
    state.on_cluster(foreseeing("c2", 8, 3600, None), now, &config);
    assert!(
        !state
            .round(now, &config)
            .iter()
            .any(|a| matches!(a, Action::Place { .. })),
        "no job queues before every cluster had time to report"
    );
    let now = now + config.stale_after;
    state.on_job_update(report.clone(), now);
    state.on_cluster(foreseeing("c1", 8, 1200, None), now, &config);
    state.on_cluster(foreseeing("c2", 8, 3600, None), now, &config);
    let actions = state.round(now, &config);
    assert!(
        actions.contains(&Action::Place {
            job: job("g"),
            clusters: vec!["c1".into()],
            stage_ms: 0,
            start_ms: 1_200_000,
            slots: Vec::new(),
        }),
        "{actions:?}"
    );
    // Queued on c1; then c2 frees up.
    report.state = JobState::Running;
    report.components = Vec::new();
    let t = |s| now + Duration::from_secs(s);
    state.on_job_update(report.clone(), t(5));
    state.on_cluster(
        foreseeing("c1", 8, 1170, Some(("g", 8, 1170, 600))),
        t(5),
        &config,
    );
    state.on_cluster(foreseeing("c2", 0, 0, None), t(5), &config);
    assert!(
        !state
            .round(t(5), &config)
            .iter()
            .any(|a| matches!(a, Action::Move { .. })),
        "not due"
    );
    state.on_job_update(report, t(61));
    state.on_cluster(
        foreseeing("c1", 8, 1139, Some(("g", 8, 1139, 600))),
        t(61),
        &config,
    );
    state.on_cluster(foreseeing("c2", 0, 0, None), t(61), &config);
    let actions = state.round(t(61), &config);
    let moves: Vec<&Action> = actions
        .iter()
        .filter(|a| matches!(a, Action::Move { .. }))
        .collect();
    assert_eq!(
        moves,
        [&Action::Move {
            job: job("g"),
            component: 0,
            from: "c1".into(),
            to: "c2".into(),
            start_ms: 0,
            before_ms: 1_739_000,
            // 1139 s to wait, then 600 s.
            after_ms: 600_000,
        }]
    );
    let mut off = config.clone();
    off.grid.reallocate_every = Duration::ZERO;
    assert!(
        !state
            .round(t(200), &off)
            .iter()
            .any(|a| matches!(a, Action::Move { .. })),
        "reallocation off"
    );
}

/// Tasks sent as bare arrays (`["x"]`) fit a user's message; the
/// runner's would name each field (`{"command":"x"}`): 700,000 short
/// commands make 15 MiB, and 20 MiB once named.
#[test]
fn tasks_to_add_that_would_not_fit_the_runners_message_are_refused_with_the_reason() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Compact {
        r#type: String,
        job: JobId,
        addition: (u64, Vec<(String,)>, Option<u8>),
    }
    impl gleaner_protocol::Message for Compact {
        fn kind(&self) -> &'static str {
            "add_tasks"
        }
    }
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    let mut open = job_report("a", 10);
    open.open = true;
    state.on_job_update(open, now);
    let sent = Compact {
        r#type: "add_tasks".into(),
        job: job("a"),
        addition: (1, vec![("x".repeat(20),); 700_000], None),
    };
    let body = codec::encode("cli", &sent).unwrap();
    assert!(body.len() < MAX_MESSAGE_BYTES, "{} bytes", body.len());
    let request = codec::decode::<RequestMsg>(&body).unwrap().msg;
    let users = Users::default();
    match state.on_request(Some("alice"), request, now, &config, &users) {
        Answer::Action(ActionReply::Refused { reason }, None) => {
            assert!(reason.contains("a message of 20.0 MiB"), "{reason}");
        }
        other => panic!("refused, with the reason: {other:?}"),
    }
    let few = RequestMsg::AddTasks {
        job: job("a"),
        addition: gleaner_manifest::Addition {
            id: 2,
            tasks: vec![
                gleaner_manifest::TaskDef {
                    command: "x".into()
                };
                1000
            ],
            sweep: None,
        },
    };
    assert!(matches!(
        state.on_request(Some("alice"), few, now, &config, &users),
        Answer::Action(ActionReply::Accepted {}, Some(_))
    ));
}

#[test]
fn a_grid_jobs_inputs_reported_once_are_read_by_every_component_and_shown_to_nobody() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    let mut report = grid_report("g", Priority::High, &[4, 4]);
    report.inputs = vec!["/data/x".into()];
    state.on_job_update(report, now);
    let sees = |name: &str, shared: &[&str]| ClusterReport {
        cluster: name.into(),
        inputs: gleaner_protocol::InputAccess {
            shared: shared.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        },
        ..cluster_report(8, &[], vec![])
    };
    state.on_cluster(sees("c1", &["/data"]), now, &config);
    state.on_cluster(sees("c2", &[]), now, &config);
    let actions = state.round(now, &config);
    assert!(
        actions.contains(&Action::Place {
            job: job("g"),
            clusters: vec!["c1".into(), "c1".into()],
            stage_ms: 0,
            start_ms: 0,
            slots: Vec::new(),
        }),
        "both where the inputs are: {actions:?}"
    );
    let users = Users::default();
    let Answer::Status(reply) = state.on_request(
        Some("alice"),
        RequestMsg::Status { job: None },
        now,
        &config,
        &users,
    ) else {
        panic!("a status");
    };
    assert_eq!(reply.jobs.len(), 1);
    assert!(reply.jobs[0].inputs.is_empty(), "placement's, not hers");
}

#[test]
fn a_grid_job_takes_free_slots_and_blocks_grows_on_them() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(grid_report("g", Priority::High, &[6]), now);
    state.on_job_update(job_report("a", 100), now);
    state.on_cluster(cluster_report(8, &[], vec![]), now, &config);
    let actions = state.round(now, &config);
    assert!(actions.contains(&Action::Place {
        job: job("g"),
        clusters: vec!["c1".into()],
        stage_ms: 0,
        start_ms: 0,
        slots: Vec::new(),
    }));
    assert_eq!(
        offers(&actions),
        [("a".into(), 2)],
        "6 of 8 slots are promised"
    );
    // The component runs: the promise is kept, the slots are the grid's.
    let mut running = cluster_report(0, &[("a", 2)], vec![1]);
    running.grid.insert(
        job("g"),
        Holding {
            running: 6,
            pending: 0,
        },
    );
    running.grid_slots = 6;
    state.on_cluster(running, now, &config);
    assert!(state.round(now, &config).is_empty());
}

#[test]
fn a_high_priority_grid_job_stops_a_running_low_one_once_and_is_placed_on_its_slots() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    let low = JobReport {
        state: JobState::Running,
        gathering: Some(gleaner_protocol::Gathering {
            running_s: Some(60.0),
            ..Default::default()
        }),
        ..grid_report("low", Priority::Low, &[])
    };
    state.on_job_update(low.clone(), now);
    let mut full = cluster_report(0, &[], vec![]);
    full.grid.insert(
        job("low"),
        Holding {
            running: 8,
            pending: 0,
        },
    );
    full.grid_slots = 8;
    state.on_cluster(full.clone(), now, &config);
    state.on_job_update(grid_report("high", Priority::High, &[6]), now);
    let actions = state.round(now, &config);
    let stepped: Vec<&JobId> = actions
        .iter()
        .filter_map(|a| match a {
            Action::StepAside { job, .. } => Some(job),
            _ => None,
        })
        .collect();
    assert_eq!(stepped, [&job("low")], "{actions:?}");
    let later = now + Duration::from_secs(5);
    assert!(
        !state
            .round(later, &config)
            .iter()
            .any(|a| matches!(a, Action::StepAside { .. })),
        "asked once"
    );
    // Its components stopped: it waits again, and the high job goes first.
    state.on_job_update(
        JobReport {
            state: JobState::Waiting,
            components: vec![8],
            ..low
        },
        later,
    );
    state.on_cluster(cluster_report(8, &[], vec![]), later, &config);
    let actions = state.round(later, &config);
    assert!(
        actions.contains(&Action::Place {
            job: job("high"),
            clusters: vec!["c1".into()],
            stage_ms: 0,
            start_ms: 0,
            slots: Vec::new(),
        }),
        "{actions:?}"
    );
}

#[test]
fn a_cap_on_scavenging_leaves_a_grid_job_its_room_and_a_job_that_cannot_fit_says_why() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(grid_report("g", Priority::High, &[6]), now);
    state.on_job_update(job_report("a", 100), now);
    // `max_scavenged = 0`: nothing for sweeps, 8 free slots all the same.
    let capped = ClusterReport {
        free_slots: Some(8),
        ..cluster_report(0, &[], vec![])
    };
    state.on_cluster(capped, now, &config);
    let actions = state.round(now, &config);
    assert!(actions.contains(&Action::Place {
        job: job("g"),
        clusters: vec!["c1".into()],
        stage_ms: 0,
        start_ms: 0,
        slots: Vec::new(),
    }));
    assert!(
        offers(&actions).is_empty(),
        "sweeps get nothing: {actions:?}"
    );

    let mut state = State::new(GrantId::new(1));
    state.on_job_update(grid_report("big", Priority::High, &[6, 6]), now);
    state.on_cluster(cluster_report(8, &[], vec![]), now, &config);
    state.round(now, &config);
    let status = state.status("s", now, &config);
    let because = status.placements[0]
        .unplaced_because
        .clone()
        .unwrap_or_default();
    assert!(
        because.contains("[6, 6]") && because.contains("c1 has 8 free"),
        "{because}"
    );
}

#[test]
fn a_grid_job_whose_run_was_lost_is_placed_again_on_the_slots_it_had() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(grid_report("g", Priority::High, &[6]), now);
    state.on_cluster(cluster_report(8, &[], vec![]), now, &config);
    let place = Action::Place {
        job: job("g"),
        clusters: vec!["c1".into()],
        stage_ms: 0,
        start_ms: 0,
        slots: Vec::new(),
    };
    assert!(state.round(now, &config).contains(&place));
    let running = JobReport {
        task_needs: Default::default(),
        state: JobState::Running,
        ..grid_report("g", Priority::High, &[6])
    };
    state.on_job_update(running, now);
    // The run is lost before the cluster ever showed its component.
    state.on_job_update(grid_report("g", Priority::High, &[6]), now);
    assert!(
        state.round(now, &config).contains(&place),
        "its promise is void: the same slots take it again"
    );
}

#[test]
fn scavengers_are_preempted_for_a_grid_job() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(job_report("a", 100), now);
    state.on_job_update(job_report("b", 100), now);
    state.on_job_update(grid_report("g", Priority::High, &[8]), now);
    state.on_cluster(
        cluster_report(0, &[("a", 4), ("b", 4)], vec![]),
        now,
        &config,
    );
    let actions = state.round(now, &config);
    let preempted: Vec<(String, u32)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Preempt { job, slots, .. } => Some((job.name().to_owned(), *slots)),
            _ => None,
        })
        .collect();
    assert_eq!(preempted, [("a".into(), 4), ("b".into(), 4)]);
    assert!(actions.iter().any(|a| matches!(a, Action::Place { .. })));
    assert!(offers(&actions).is_empty());
}

/// Grid jobs move up a queue every 2 tries and give up after `max_tries`.
fn upgrading_after_two(max_tries: u32) -> StateConfig {
    StateConfig {
        grid: GridConfig {
            upgrade_after: 2,
            max_tries,
            ..GridConfig::default()
        },
        ..StateConfig::default()
    }
}

#[test]
fn unplaceable_grid_jobs_move_up_and_are_aborted() {
    let config = upgrading_after_two(3);
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(grid_report("g", Priority::Low, &[16]), now);
    state.on_cluster(cluster_report(8, &[], vec![]), now, &config);
    assert!(state.round(now, &config).is_empty());
    assert!(state.round(now, &config).is_empty());
    let actions = state.round(now, &config);
    assert!(matches!(&actions[..], [Action::Abort { job: aborted, .. }] if *aborted == job("g")));
    assert!(state.status("s", now, &config).jobs.is_empty());
}

fn wall(instant: Instant, ms: u64) -> Now {
    Now {
        instant,
        wall_ms: ms,
    }
}

#[test]
fn a_scheduler_taking_over_goes_on_counting_tries() {
    let config = upgrading_after_two(4);
    let now = Instant::now();
    let mut active = State::new(GrantId::new(1));
    active.on_job_update(grid_report("g", Priority::Low, &[16]), now);
    active.on_cluster(cluster_report(8, &[], vec![]), now, &config);
    for _ in 0..3 {
        assert!(active.round(now, &config).is_empty());
    }
    let snapshot = active.grid_snapshot(wall(now, 1_000));
    assert_eq!(
        active.status("s", now, &config).placements,
        snapshot.placements
    );
    assert_eq!(snapshot.placements[0].tries, 3);
    assert_eq!(snapshot.placements[0].queue, Priority::High);

    // The job's report reaches the new scheduler before it takes over,
    // and after.
    for report_first in [true, false] {
        let later = now + Duration::from_secs(2);
        let mut standby = State::new(GrantId::new(2));
        standby.on_cluster(cluster_report(8, &[], vec![]), later, &config);
        if report_first {
            standby.on_job_update(grid_report("g", Priority::Low, &[16]), later);
        }
        standby.restore_grid(snapshot.clone(), wall(later, 3_000));
        if !report_first {
            standby.on_job_update(grid_report("g", Priority::Low, &[16]), later);
        }
        let placements = standby.status("s", later, &config).placements;
        assert_eq!(placements[0].tries, 3, "report first: {report_first}");
        assert_eq!(placements[0].queue, Priority::High);
        let actions = standby.round(later, &config);
        assert!(
            matches!(&actions[..], [Action::Abort { job: aborted, .. }] if *aborted == job("g")),
            "the fourth try, the first after the takeover, is the last: {actions:?}"
        );
    }
}

#[test]
fn slots_promised_before_a_takeover_stay_promised() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut active = State::new(GrantId::new(1));
    active.on_job_update(grid_report("g", Priority::High, &[6]), now);
    active.on_cluster(cluster_report(8, &[], vec![]), now, &config);
    let actions = active.round(now, &config);
    assert!(actions.iter().any(|a| matches!(a, Action::Place { .. })));
    let snapshot = active.grid_snapshot(wall(now, 10_000));
    assert_eq!(snapshot.reservations.len(), 1);
    assert!(snapshot.placements[0].placed_ms_ago.is_some());

    let later = now + Duration::from_secs(5);
    let mut standby = State::new(GrantId::new(2));
    standby.restore_grid(snapshot.clone(), wall(later, 15_000));
    standby.on_job_update(grid_report("g", Priority::High, &[6]), later);
    standby.on_job_update(job_report("a", 100), later);
    standby.on_cluster(cluster_report(8, &[], vec![]), later, &config);
    let actions = standby.round(later, &config);
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Place { .. })),
        "placed once, not again: {actions:?}"
    );
    assert_eq!(offers(&actions), [("a".into(), 2)], "6 of 8 slots promised");

    // Ages count on: past the reservation timeout, the promise lapses.
    let much_later = later + config.grid.reservation_timeout;
    let mut late = State::new(GrantId::new(3));
    late.restore_grid(snapshot, wall(much_later, 15_000 + 120_000));
    late.on_job_update(job_report("a", 100), much_later);
    late.on_cluster(cluster_report(8, &[], vec![]), much_later, &config);
    assert_eq!(offers(&late.round(much_later, &config)), [("a".into(), 8)]);
}

#[test]
fn drains_are_not_repeated_while_in_flight() {
    let config = StateConfig::default();
    let now = Instant::now();
    let mut state = State::new(GrantId::new(1));
    state.on_job_update(job_report("a", 100), now);
    state.on_job_update(job_report("b", 100), now);
    state.on_cluster(cluster_report(0, &[("a", 8)], vec![]), now, &config);
    let actions = state.round(now, &config);
    assert_eq!(
        actions,
        [Action::Drain {
            job: job("a"),
            cluster: "c1".into(),
            slots: 4,
            hosts: Vec::new(),
        }]
    );
    assert!(state.round(now, &config).is_empty());
    // Two launchers left so far; the order stands for the other two.
    state.on_cluster(cluster_report(2, &[("a", 6)], vec![]), now, &config);
    assert_eq!(offers(&state.round(now, &config)), [("b".into(), 2)]);
}
