use std::time::Instant;

use gleaner_protocol::{Captured, GrantId};

use super::*;
use crate::job::testing::{at, grow_ack, opening, recorded, submission, told};

const MANIFEST: &str = "name = \"mpi\"\nkind = \"grid\"\npriority = \"high\"\n\
        env = { A = \"1\" }\nwalltime = \"1m\"\n\
        [[component]]\nslots = 4\ncommand = \"mpirun a\"\n\
        [[component]]\nslots = 2\ncommand = \"mpirun b\"\n";

fn started(t0: Instant) -> Job<Grid> {
    let submission = submission(MANIFEST);
    let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
    grid.start();
    grid
}

#[test]
fn a_reports_inputs_are_the_jobs_once_and_watchers_get_none() {
    let t0 = Instant::now();
    let submission = submission(
        "name = \"mpi\"\nkind = \"grid\"\ninputs = [\"/data/a\", \"/data/b\"]\n\
             [[component]]\nslots = 1\ncommand = \"a\"\ninputs = [\"/data/own\"]\n\
             [[component]]\nslots = 1\ncommand = \"b\"\n\
             [[component]]\nslots = 1\ncommand = \"c\"\n",
    );
    let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
    grid.start();
    let effects = grid.report(at(t0, 1));
    let update = effects
        .iter()
        .find_map(|e| match e {
            Effect::ToScheduler(SchedulerMsg::JobUpdate(r)) => Some(r),
            _ => None,
        })
        .expect("a report");
    assert_eq!(update.inputs, ["/data/a", "/data/b"]);
    assert_eq!(
        update.component_inputs,
        [vec!["/data/own".to_owned()], Vec::new(), Vec::new()]
    );
    assert_eq!(update.inputs_by_component()[2], ["/data/a", "/data/b"]);
    let progress = effects
        .iter()
        .find_map(|e| match e {
            Effect::Event(gleaner_protocol::Event::Progress(r)) => Some(r),
            _ => None,
        })
        .expect("progress");
    assert!(progress.inputs.is_empty() && progress.component_inputs.is_empty());
}

fn placed(t0: Instant) -> Job<Grid> {
    let mut grid = started(t0);
    grid.on_control(
        ControlMsg::Place {
            clusters: vec!["c1".into(), "c2".into()],
            slots: Vec::new(),
            start_ms: 0,
            stage_ms: 0,
        },
        at(t0, 1),
    );
    grid
}

/// Component 0 runs on c1, component 1 on c2 ([`placed`]).
fn ended(component: u32, exit_code: Option<i32>) -> ControlMsg {
    ended_after(component, exit_code, 2000)
}

fn ended_after(component: u32, exit_code: Option<i32>, runtime_ms: u64) -> ControlMsg {
    ControlMsg::ComponentEnded(ComponentOutcome {
        component,
        cluster: format!("c{}", component + 1).as_str().into(),
        exit_code,
        runtime_ms,
        stdout: Captured {
            data: b"out\n".to_vec(),
            dropped: 0,
        },
        stderr: Captured::default(),
        preempted: false,
    })
}

fn started_on(component: u32, cluster: &str, host: &str) -> ControlMsg {
    ControlMsg::ComponentStarted {
        component,
        cluster: cluster.into(),
        hosts: vec![HostSlots {
            host: host.into(),
            slots: 4 - 2 * component,
        }],
    }
}

fn gathering(grid: &Job<Grid>) -> gleaner_protocol::Gathering {
    grid.job_file().gathering.unwrap().figures
}

fn grid_with(extra: &str, t0: Instant) -> Job<Grid> {
    let manifest = MANIFEST.replace("walltime", &format!("{extra}\nwalltime"));
    let submission = submission(&manifest);
    let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
    grid.start();
    grid.on_control(
        ControlMsg::Place {
            clusters: vec!["c1".into(), "c2".into()],
            slots: Vec::new(),
            start_ms: 0,
            stage_ms: 0,
        },
        at(t0, 1),
    );
    grid
}

fn move_to(component: u32, from: &str, to: &str) -> ControlMsg {
    ControlMsg::Move {
        component,
        from: from.into(),
        to: to.into(),
        start_ms: 0,
    }
}

fn queued(component: u32, cluster: &str) -> ControlMsg {
    ControlMsg::ComponentQueued {
        component,
        cluster: cluster.into(),
    }
}

fn placed_on(grid: &Job<Grid>) -> Vec<String> {
    let file = grid.job_file();
    file.components
        .iter()
        .map(|c| c.as_ref().map_or("-".to_owned(), |c| c.to_string()))
        .collect()
}

#[test]
fn a_moldable_component_is_submitted_with_the_slots_chosen_and_their_walltime() {
    let t0 = Instant::now();
    let manifest = "name = \"m\"\nkind = \"grid\"\nwalltime = \"1h\"\n\
            [[component]]\nslots = { min = 4, max = 64 }\nspeedup = \"amdahl:0.9\"\ncommand = \"solve\"\n";
    let submission = submission(manifest);
    let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
    grid.start();
    let report = grid.standing(at(t0, 0));
    assert_eq!(report.components, [4], "its fewest slots");
    assert!(report.moldable[0].is_some());
    let effects = grid.on_control(
        ControlMsg::Place {
            clusters: vec!["c1".into()],
            slots: vec![16],
            start_ms: 0,
            stage_ms: 0,
        },
        at(t0, 1),
    );
    let spec = effects
        .iter()
        .find_map(|e| match e {
            Effect::ToKcm {
                msg: KcmMsg::SubmitComponent(spec),
                ..
            } => Some(spec.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(spec.slots, 16);
    assert_eq!(spec.walltime_ms, Some(1_730_770));
    assert!(
        spec.env
            .contains(&("GLEANER_SLOTS".to_owned(), "16".to_owned()))
    );
    // Moved, it keeps them.
    let effects = grid.on_control(move_to(0, "c1", "c2"), at(t0, 2));
    assert!(effects.iter().any(|e| matches!(
        e,
        Effect::ToKcm { msg: KcmMsg::SubmitComponent(spec), .. } if spec.slots == 16
    )));
}

#[test]
fn a_moved_component_is_withdrawn_where_it_waited_only_once_its_new_cluster_has_it() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    let effects = grid.on_control(move_to(1, "c2", "c3"), at(t0, 2));
    assert_eq!(told(&effects), [("c3".to_owned(), "submit_component")]);
    assert_eq!(placed_on(&grid), ["c1", "c2"], "still where it waits");
    assert!(
        told(&grid.on_control(move_to(1, "c2", "c3"), at(t0, 3))).is_empty(),
        "one move at a time"
    );
    assert!(
        told(&grid.on_control(queued(1, "c2"), at(t0, 3))).is_empty(),
        "queued where it was: nothing new"
    );
    let effects = grid.on_control(queued(1, "c3"), at(t0, 4));
    assert_eq!(told(&effects), [("c2".to_owned(), "withdraw_component")]);
    assert_eq!(placed_on(&grid), ["c1", "c3"]);
    assert_eq!(gathering(&grid).moves, 1);
    // It starts where it went, and the job gathers there.
    grid.on_control(started_on(0, "c1", "a1"), at(t0, 5));
    let effects = grid.on_control(started_on(1, "c3", "d1"), at(t0, 6));
    let go: Vec<(String, &str)> = told(&effects);
    assert_eq!(
        go,
        [("c1".to_owned(), "go"), ("c3".to_owned(), "go")],
        "{effects:?}"
    );
}

#[test]
fn a_claiming_try_that_withdraws_a_moving_component_withdraws_its_copy_too() {
    let t0 = Instant::now();
    let mut grid = grid_with("claim_threshold = 0.5", t0);
    grid.on_control(started_on(0, "c1", "a1"), at(t0, 2));
    grid.on_control(move_to(1, "c2", "c3"), at(t0, 3));
    // The first try is due at once: half started, the other withdrawn.
    let effects = grid.poll(at(t0, 4));
    let mut withdrawn = told(&effects);
    withdrawn.sort();
    assert_eq!(
        withdrawn,
        [
            ("c2".to_owned(), "withdraw_component"),
            ("c3".to_owned(), "withdraw_component")
        ]
    );
    let effects = grid.on_control(queued(1, "c3"), at(t0, 5));
    assert!(told(&effects).is_empty(), "the move is over");
    assert_eq!(placed_on(&grid), ["c1", "-"]);
}

#[test]
fn a_component_that_starts_where_it_waits_stays_and_its_copy_is_withdrawn() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    grid.on_control(move_to(1, "c2", "c3"), at(t0, 2));
    let effects = grid.on_control(started_on(1, "c2", "b1"), at(t0, 3));
    assert_eq!(told(&effects), [("c3".to_owned(), "withdraw_component")]);
    assert!(
        told(&grid.on_control(queued(1, "c3"), at(t0, 4))).is_empty(),
        "the move is over"
    );
    assert_eq!(placed_on(&grid), ["c1", "c2"]);
    assert_eq!(gathering(&grid).moves, 0);
    // Started: it never moves again.
    assert!(told(&grid.on_control(move_to(1, "c2", "c3"), at(t0, 5))).is_empty());
}

#[test]
fn a_component_started_where_it_goes_before_it_is_said_queued_has_moved() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    grid.on_control(move_to(1, "c2", "c3"), at(t0, 2));
    let effects = grid.on_control(started_on(1, "c3", "d1"), at(t0, 3));
    assert_eq!(told(&effects), [("c2".to_owned(), "withdraw_component")]);
    assert_eq!(placed_on(&grid), ["c1", "c3"]);
    assert_eq!(grid.standing(at(t0, 3)).gathering.unwrap().at_barrier, 1);
}

#[test]
fn a_move_its_new_cluster_cannot_take_is_dropped_and_the_job_goes_on() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    grid.on_control(move_to(1, "c2", "c3"), at(t0, 2));
    let refused = ControlMsg::ComponentEnded(ComponentOutcome {
        component: 1,
        cluster: "c3".into(),
        exit_code: None,
        runtime_ms: 0,
        stdout: Captured::default(),
        stderr: Captured::default(),
        preempted: false,
    });
    let effects = grid.on_control(refused, at(t0, 3));
    assert!(recorded(&effects).is_empty(), "{effects:?}");
    assert!(told(&effects).is_empty(), "{effects:?}");
    assert_eq!(placed_on(&grid), ["c1", "c2"]);
    // A kcm that is not there: dropped too, and a next move may go.
    let effects = grid.on_control(move_to(1, "c2", "c4"), at(t0, 4));
    assert_eq!(told(&effects), [("c4".to_owned(), "submit_component")]);
    let missing = Followup::Moved {
        component: 1,
        cluster: "c4".into(),
    };
    grid.on_delivery(missing, false, at(t0, 5));
    let effects = grid.on_control(move_to(1, "c2", "c3"), at(t0, 6));
    assert_eq!(told(&effects), [("c3".to_owned(), "submit_component")]);
}

#[test]
fn components_wait_at_the_barrier_until_all_have_started() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    // Submitted at 1 s after the epoch; placed at 1,001 s.
    assert_eq!(gathering(&grid).placement_s, Some(1000.0));
    let effects = grid.on_control(started_on(1, "c2", "b1"), at(t0, 3));
    assert!(told(&effects).is_empty(), "the other has not started");
    assert_eq!(grid.standing(at(t0, 3)).gathering.unwrap().at_barrier, 1);
    assert!(
        grid.on_control(started_on(0, "c2", "x"), at(t0, 4))
            .is_empty(),
        "not placed there"
    );
    let effects = grid.on_control(started_on(0, "c1", "a1"), at(t0, 6));
    let released: Vec<(String, u32, Vec<Vec<HostSlots>>)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::ToKcm {
                cluster,
                msg: KcmMsg::Go {
                    component, hosts, ..
                },
                ..
            } => Some((cluster.to_string(), *component, hosts.clone())),
            _ => None,
        })
        .collect();
    let hosts = vec![
        vec![HostSlots {
            host: "a1".into(),
            slots: 4,
        }],
        vec![HostSlots {
            host: "b1".into(),
            slots: 2,
        }],
    ];
    assert_eq!(
        released,
        [
            ("c1".to_owned(), 0, hosts.clone()),
            ("c2".to_owned(), 1, hosts)
        ]
    );
    let figures = gathering(&grid);
    assert_eq!(
        (figures.at_barrier, figures.barrier_s, figures.start_delay_s),
        (0, Some(3.0), Some(5.0))
    );
    assert!(
        grid.on_control(started_on(1, "c2", "b1"), at(t0, 7))
            .is_empty(),
        "let go once"
    );
    assert!(
        grid.poll(at(t0, 3_600)).is_empty(),
        "no claiming once gathered"
    );
}

#[test]
fn claiming_tries_follow_koalas_times_and_a_run_not_gathered_by_its_start_time_is_placed_again() {
    let t0 = Instant::now();
    let mut grid = grid_with("barrier_timeout = \"20s\"", t0);
    grid.on_control(started_on(0, "c1", "a1"), at(t0, 2));
    // Tries at placement (1 s), then L = 0.75 of the way to the start
    // time (21 s) each: 16 s, 19.75 s, then the start time itself.
    for (t, tries) in [(1, 1), (15, 1), (16, 2), (19, 2), (20, 3)] {
        assert!(told(&grid.poll(at(t0, t))).is_empty(), "at {t}s");
        assert_eq!(gathering(&grid).claiming_tries, tries, "at {t}s");
    }
    let effects = grid.poll(at(t0, 21));
    assert_eq!(
        told(&effects),
        [
            ("c1".to_owned(), "job_ended"),
            ("c2".to_owned(), "job_ended")
        ]
    );
    let file = grid.job_file();
    assert_eq!((file.state, file.restarts), (JobState::Waiting, 1));
    let gather = file.gathering.unwrap();
    assert_eq!(
        (
            gather.level,
            gather.figures.claiming_tries,
            gather.figures.at_barrier
        ),
        (0.625, 4, 0)
    );
    assert!(gather.run.is_none());
    assert_eq!(
        grid.standing(at(t0, 21)).components,
        [4, 2],
        "placed again whole"
    );
    // The next run's start time counts from its own placement.
    let place = ControlMsg::Place {
        clusters: vec!["c2".into(), "c1".into()],
        slots: Vec::new(),
        start_ms: 0,
        stage_ms: 0,
    };
    grid.on_control(place, at(t0, 30));
    assert_eq!(gathering(&grid).placement_s, Some(9.0));
    assert_eq!(
        grid.job_file().gathering.unwrap().run.unwrap().start_by,
        at(t0, 50).wall_ms
    );
}

#[test]
fn with_a_threshold_a_claiming_try_places_the_components_not_started_again() {
    let t0 = Instant::now();
    let mut grid = grid_with("claim_threshold = 0.5", t0);
    grid.on_control(started_on(0, "c1", "a1"), at(t0, 2));
    let effects = grid.poll(at(t0, 2));
    assert_eq!(told(&effects), [("c2".to_owned(), "withdraw_component")]);
    let report = grid.standing(at(t0, 2));
    assert_eq!(report.state, JobState::Waiting);
    assert_eq!(report.components, [2], "only the one not started");
    assert_eq!(report.avoid, [ClusterName::from("c2")], "placed elsewhere");
    let effects = grid.on_control(
        ControlMsg::Place {
            clusters: vec!["c3".into()],
            slots: Vec::new(),
            start_ms: 0,
            stage_ms: 0,
        },
        at(t0, 4),
    );
    assert_eq!(told(&effects), [("c3".to_owned(), "submit_component")]);
    assert_eq!(gathering(&grid).at_barrier, 1, "component 0 still waits");
    let effects = grid.on_control(started_on(1, "c3", "c31"), at(t0, 5));
    assert_eq!(
        told(&effects),
        [("c1".to_owned(), "go"), ("c3".to_owned(), "go")]
    );
    assert_eq!(
        gathering(&grid).start_delay_s,
        Some(4.0),
        "from the first placement"
    );
}

#[test]
fn a_running_job_steps_aside_once_its_components_stopped_and_is_placed_again() {
    let t0 = Instant::now();
    let mut grid = grid_with("preempt_signal = \"USR1\"\npreempt_grace = \"20s\"", t0);
    let aside = || ControlMsg::StepAside {
        reason: "a job of high priority".into(),
    };
    assert!(
        grid.on_control(aside(), at(t0, 2)).is_empty(),
        "not running yet"
    );
    grid.on_control(started_on(0, "c1", "a1"), at(t0, 2));
    grid.on_control(started_on(1, "c2", "b1"), at(t0, 3));
    assert_eq!(gathering(&grid).running_since, Some(at(t0, 3).wall_ms));
    let effects = grid.on_control(aside(), at(t0, 10));
    let stops: Vec<(String, String, u64)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::ToKcm {
                cluster,
                msg:
                    KcmMsg::PreemptComponents {
                        signal, grace_ms, ..
                    },
                ..
            } => Some((cluster.to_string(), signal.clone(), *grace_ms)),
            _ => None,
        })
        .collect();
    assert_eq!(
        stops,
        [
            ("c1".to_owned(), "USR1".to_owned(), 20_000),
            ("c2".to_owned(), "USR1".to_owned(), 20_000)
        ]
    );
    assert!(grid.on_control(aside(), at(t0, 11)).is_empty(), "once");
    let preempted = |component| match ended(component, None) {
        ControlMsg::ComponentEnded(outcome) => ControlMsg::ComponentEnded(ComponentOutcome {
            preempted: true,
            ..outcome
        }),
        other => other,
    };
    let effects = grid.on_control(preempted(0), at(t0, 12));
    assert!(told(&effects).is_empty() && recorded(&effects).is_empty());
    assert_eq!(grid.job_file().state, JobState::Running, "one still stops");
    let effects = grid.on_control(preempted(1), at(t0, 13));
    assert_eq!(
        told(&effects),
        [
            ("c1".to_owned(), "job_ended"),
            ("c2".to_owned(), "job_ended")
        ]
    );
    assert!(recorded(&effects).is_empty(), "nothing final");
    let file = grid.job_file();
    assert_eq!(
        (file.state, file.restarts),
        (JobState::Waiting, 0),
        "not a try"
    );
    let figures = file.gathering.unwrap().figures;
    assert_eq!((figures.preemptions, figures.running_since), (1, None));
    assert_eq!(grid.standing(at(t0, 13)).components, [4, 2]);
}

#[test]
fn components_that_outlast_their_grace_are_given_up_on() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    grid.on_control(started_on(0, "c1", "a1"), at(t0, 2));
    grid.on_control(started_on(1, "c2", "b1"), at(t0, 3));
    let aside = ControlMsg::StepAside {
        reason: "high".into(),
    };
    grid.on_control(aside, at(t0, 10));
    assert!(told(&grid.poll(at(t0, 60))).is_empty());
    let effects = grid.poll(at(t0, 71));
    assert_eq!(told(&effects).len(), 2, "stopped for good: {effects:?}");
    assert_eq!(grid.job_file().state, JobState::Waiting);
}

#[test]
fn a_new_grid_job_waits_to_be_placed() {
    let t0 = Instant::now();
    let submission = submission(MANIFEST);
    let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
    let effects = grid.start();
    assert!(matches!(effects[..], [Effect::SaveJobFile, Effect::Report]));
    let report = grid.standing(at(t0, 0));
    assert_eq!(report.state, JobState::Waiting);
    assert_eq!(report.components, [4, 2]);
    assert_eq!(report.tasks.running, 0);
}

#[test]
fn placement_sends_each_component_to_its_clusters_kcm() {
    let t0 = Instant::now();
    let mut grid = started(t0);
    let place = ControlMsg::Place {
        clusters: vec!["c1".into(), "c2".into()],
        slots: Vec::new(),
        start_ms: 0,
        stage_ms: 0,
    };
    let effects = grid.on_control(place.clone(), at(t0, 1));
    let submitted: Vec<(String, u32, u32, String)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::ToKcm {
                cluster,
                msg: KcmMsg::SubmitComponent(spec),
                followup: Followup::Component { component, .. },
            } => {
                assert_eq!(spec.component, *component);
                assert_eq!(spec.env, [("A".to_owned(), "1".to_owned())]);
                assert_eq!(spec.walltime_ms, Some(60_000));
                Some((
                    cluster.to_string(),
                    spec.component,
                    spec.slots,
                    spec.command.clone(),
                ))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        submitted,
        [
            ("c1".to_owned(), 0, 4, "mpirun a".to_owned()),
            ("c2".to_owned(), 1, 2, "mpirun b".to_owned())
        ]
    );
    assert!(matches!(
        effects[2..],
        [Effect::SaveJobFile, Effect::Report]
    ));
    let file = grid.job_file();
    assert_eq!(file.state, JobState::Running);
    assert_eq!(
        file.components,
        [Some(ClusterName::from("c1")), Some(ClusterName::from("c2"))]
    );
    assert_eq!(grid.standing(at(t0, 2)).tasks.running, 2);
    assert!(grid.on_control(place, at(t0, 3)).is_empty(), "placed once");
    let effects = grid.wind_up(at(t0, 4));
    assert_eq!(
        told(&effects),
        [
            ("c1".to_owned(), "job_ended"),
            ("c2".to_owned(), "job_ended")
        ]
    );
}

#[test]
fn a_withdrawn_component_is_placed_again_and_the_others_keep_running() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    let withdrawn = |cluster: &str| ControlMsg::ComponentWithdrawn {
        component: 1,
        cluster: cluster.into(),
        reason: "waited too long".into(),
    };
    assert!(
        grid.on_control(withdrawn("c1"), at(t0, 2)).is_empty(),
        "not where it was placed"
    );
    let effects = grid.on_control(withdrawn("c2"), at(t0, 3));
    assert!(matches!(effects[..], [Effect::SaveJobFile, Effect::Report]));
    let report = grid.standing(at(t0, 3));
    assert_eq!(report.state, JobState::Waiting);
    assert_eq!(report.components, [2], "only the withdrawn one to place");
    assert_eq!(report.tasks.running, 1, "component 0 still runs");
    assert!(grid.on_control(withdrawn("c2"), at(t0, 4)).is_empty());

    let effects = grid.on_control(
        ControlMsg::Place {
            clusters: vec!["c3".into()],
            slots: Vec::new(),
            start_ms: 0,
            stage_ms: 0,
        },
        at(t0, 5),
    );
    let submitted: Vec<(String, u32)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::ToKcm {
                cluster,
                msg: KcmMsg::SubmitComponent(spec),
                ..
            } => Some((cluster.to_string(), spec.component)),
            _ => None,
        })
        .collect();
    assert_eq!(submitted, [("c3".to_owned(), 1)]);
    let file = grid.job_file();
    assert_eq!(file.state, JobState::Running);
    assert_eq!(
        file.components,
        [Some(ClusterName::from("c1")), Some(ClusterName::from("c3"))]
    );
    assert!(grid.standing(at(t0, 6)).components.is_empty());
}

#[test]
fn a_placement_that_does_not_fit_the_job_is_ignored() {
    let t0 = Instant::now();
    let mut grid = started(t0);
    let place = ControlMsg::Place {
        clusters: vec!["c1".into()],
        slots: Vec::new(),
        start_ms: 0,
        stage_ms: 0,
    };
    assert!(grid.on_control(place, at(t0, 1)).is_empty());
    assert_eq!(grid.job_file().state, JobState::Waiting);
}

#[test]
fn a_lost_component_stops_the_others_and_the_job_is_placed_again() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    let effects = grid.on_control(ended(1, None), at(t0, 2));
    assert_eq!(
        told(&effects),
        [
            ("c1".to_owned(), "job_ended"),
            ("c2".to_owned(), "job_ended")
        ]
    );
    assert!(recorded(&effects).is_empty(), "nothing final");
    let file = grid.job_file();
    assert_eq!((file.state, file.restarts), (JobState::Waiting, 1));
    assert_eq!(file.components, [None, None]);
    let report = grid.standing(at(t0, 2));
    assert_eq!(report.components, [4, 2], "the whole job to place");
    assert_eq!(report.tasks.running, 0);
    // The stopped component's end, reported late, is not this run's.
    assert!(grid.on_control(ended(0, None), at(t0, 3)).is_empty());

    // Placed again; lost again: the third and last run, as
    // max_attempts (3) allows; then a loss is final.
    for (run, t) in [(2u32, 4u64), (3, 6)] {
        let place = ControlMsg::Place {
            clusters: vec!["c1".into(), "c2".into()],
            slots: Vec::new(),
            start_ms: 0,
            stage_ms: 0,
        };
        assert_eq!(told(&grid.on_control(place, at(t0, t))).len(), 2);
        let effects = grid.on_control(ended(0, None), at(t0, t + 1));
        if run < 3 {
            assert_eq!(grid.job_file().restarts, run);
            assert!(recorded(&effects).is_empty());
        } else {
            assert_eq!(recorded(&effects)[0].status, FinalStatus::Failed);
            assert_eq!(grid.job_file().restarts, 2);
        }
    }
}

#[test]
fn host_lists_too_big_for_a_go_fail_the_component_that_brings_them() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    let many = |n: usize| {
        let host = HostSlots {
            host: "n".repeat(253),
            slots: 1,
        };
        vec![host; n]
    };
    // Each within the bound, both beyond it.
    let half = MAX_GO_HOSTS_BYTES / 2 / 273;
    let effects = grid.on_control(
        ControlMsg::ComponentStarted {
            component: 1,
            cluster: "c2".into(),
            hosts: many(half),
        },
        at(t0, 2),
    );
    assert!(recorded(&effects).is_empty(), "waits for the other");
    let effects = grid.on_control(
        ControlMsg::ComponentStarted {
            component: 0,
            cluster: "c1".into(),
            hosts: many(half + 10),
        },
        at(t0, 3),
    );
    assert!(
        !effects.iter().any(|e| matches!(
            e,
            Effect::ToKcm {
                msg: KcmMsg::Go { .. },
                ..
            }
        )),
        "no go that could not be sent"
    );
    let entries = recorded(&effects);
    let statuses: Vec<(u64, FinalStatus)> = entries.iter().map(|e| (e.task, e.status)).collect();
    assert_eq!(
        statuses,
        [(0, FinalStatus::Failed), (1, FinalStatus::Cancelled)]
    );
    let error = entries[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("more than the 8192 KiB"), "{error}");
    assert_eq!(grid.ending(), Some(JobState::Done));
}

#[test]
fn host_lists_within_a_go_are_read_back_from_job_json() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    // The shortest names: the most JSON for their bytes in a message.
    let each = MAX_GO_HOSTS_BYTES / 2 / 21 - 10;
    let hosts = vec![
        HostSlots {
            host: "n".into(),
            slots: u32::MAX,
        };
        each
    ];
    for (component, cluster) in [(0, "c1"), (1, "c2")] {
        let started = ControlMsg::ComponentStarted {
            component,
            cluster: cluster.into(),
            hosts: hosts.clone(),
        };
        assert!(recorded(&grid.on_control(started, at(t0, 2))).is_empty());
    }
    let file = serde_json::to_vec_pretty(&grid.job_file()).unwrap();
    assert!(
        file.len() as u64 <= crate::records::MAX_JOB_FILE,
        "{} bytes",
        file.len()
    );
}

#[test]
fn a_failed_component_stops_the_others_and_the_job_fails_with_it() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    let effects = grid.on_control(ended(0, Some(3)), at(t0, 2));
    let statuses: Vec<(u64, FinalStatus)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Record(entries) => Some(entries.iter().map(|e| (e.task, e.status))),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(
        statuses,
        [(0, FinalStatus::Failed), (1, FinalStatus::Cancelled)]
    );
    assert_eq!(grid.ending(), Some(JobState::Done));
}

#[test]
fn with_restart_on_failure_a_failed_component_sends_the_job_back_whole() {
    let t0 = Instant::now();
    let manifest = MANIFEST.replace(
        "walltime",
        "restart_on_failure = true\nmax_attempts = 2\nwalltime",
    );
    let submission = submission(&manifest);
    let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
    grid.start();
    let place = || ControlMsg::Place {
        clusters: vec!["c1".into(), "c2".into()],
        slots: Vec::new(),
        start_ms: 0,
        stage_ms: 0,
    };
    grid.on_control(place(), at(t0, 1));
    let effects = grid.on_control(ended(0, Some(3)), at(t0, 2));
    let stopped: Vec<&ClusterName> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::ToKcm {
                cluster,
                msg: KcmMsg::JobEnded { .. },
                ..
            } => Some(cluster),
            _ => None,
        })
        .collect();
    assert_eq!(
        stopped.len(),
        2,
        "both clusters stop their component: {effects:?}"
    );
    assert!(recorded(&effects).is_empty(), "nothing final yet");
    assert_eq!(grid.ending(), None);
    // The second run is the last: its failure is final.
    grid.on_control(place(), at(t0, 3));
    let effects = grid.on_control(ended(1, Some(1)), at(t0, 4));
    assert_eq!(recorded(&effects)[0].status, FinalStatus::Failed);
    assert_eq!(grid.ending(), Some(JobState::Done));
}

#[test]
fn a_component_killed_at_its_walltime_is_final() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    // The manifest's walltime is one minute.
    let effects = grid.on_control(ended_after(0, None, 59_000), at(t0, 2));
    assert_eq!(recorded(&effects)[0].status, FinalStatus::Failed);
    assert_eq!(grid.job_file().restarts, 0);
}

#[test]
fn a_component_for_a_cluster_without_a_kcm_sends_the_job_back() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    let effects = grid.on_delivery(
        Followup::Component {
            component: 1,
            cluster: "c2".into(),
        },
        false,
        at(t0, 3),
    );
    assert_eq!(told(&effects).len(), 2);
    assert_eq!(grid.job_file().state, JobState::Waiting);
}

#[test]
fn a_component_for_a_cluster_without_a_kcm_fails_once_no_run_is_left() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    grid.ledger_mut().restarted();
    grid.ledger_mut().restarted();
    let effects = grid.on_delivery(
        Followup::Component {
            component: 0,
            cluster: "c1".into(),
        },
        true,
        at(t0, 3),
    );
    assert!(effects.is_empty());
    let effects = grid.on_delivery(
        Followup::Component {
            component: 1,
            cluster: "c2".into(),
        },
        false,
        at(t0, 3),
    );
    let entries = recorded(&effects);
    assert_eq!(
        entries
            .iter()
            .map(|e| (e.task, e.status, e.command.as_str()))
            .collect::<Vec<_>>(),
        [(1, FinalStatus::Failed, "mpirun b")]
    );
    assert_eq!(grid.standing(at(t0, 2)).tasks.running, 1);
}

#[test]
fn component_ends_are_final_and_end_the_job() {
    let t0 = Instant::now();
    let mut grid = placed(t0);
    let effects = grid.on_control(ended(0, Some(0)), at(t0, 2));
    let [Effect::WriteOutputs(result), Effect::Record(entries)] = &effects[..] else {
        panic!("{effects:?}");
    };
    assert_eq!(
        (result.task, result.stdout.data.as_slice()),
        (0, &b"out\n"[..])
    );
    assert_eq!(
        (
            entries[0].task,
            entries[0].status,
            entries[0].runtime_s,
            entries[0].cluster.as_ref().map(ClusterName::as_str)
        ),
        (0, FinalStatus::Succeeded, 2.0, Some("c1"))
    );
    assert!(
        grid.on_control(ended(0, Some(1)), at(t0, 3)).is_empty(),
        "ended once"
    );
    assert_eq!(grid.ending(), None);
    let effects = grid.on_control(ended(1, None), at(t0, 4));
    assert_eq!(
        recorded(&effects)[0].status,
        FinalStatus::Failed,
        "lost after component 0 ended: no run could be whole"
    );
    assert_eq!(grid.ending(), Some(JobState::Done));
    let counts = grid.job_file().tasks;
    assert_eq!((counts.succeeded, counts.failed), (1, 1));
}

#[test]
fn a_job_the_scheduler_cannot_place_fails() {
    let t0 = Instant::now();
    let mut grid = started(t0);
    let effects = grid.on_control(
        ControlMsg::PlacementFailed {
            reason: "too big".into(),
        },
        at(t0, 1),
    );
    assert_eq!(
        recorded(&effects)
            .iter()
            .map(|e| (e.task, e.status))
            .collect::<Vec<_>>(),
        [(0, FinalStatus::Failed), (1, FinalStatus::Failed)]
    );
    assert_eq!(grid.ending(), Some(JobState::Done));
}

#[test]
fn a_resumed_placed_job_runs_where_it_was_placed() {
    let t0 = Instant::now();
    let submission = submission(MANIFEST);
    let file = placed(t0).job_file();
    let mut grid = Grid::open(
        opening(&submission, vec![(0, FinalStatus::Succeeded)], Some(file)),
        at(t0, 5),
    )
    .unwrap();
    grid.start();
    let report = grid.standing(at(t0, 6));
    assert_eq!(report.state, JobState::Running);
    assert_eq!(report.tasks.running, 1, "component 0 had ended");
    assert_eq!(
        grid.clusters()
            .iter()
            .map(ClusterName::as_str)
            .collect::<Vec<_>>(),
        ["c1", "c2"]
    );
}

#[test]
fn grow_offers_are_refused() {
    let t0 = Instant::now();
    let mut grid = started(t0);
    let offer = ControlMsg::GrowOffer {
        grant: GrantId::new(1),
        cluster: "c1".into(),
        slots: 8,
    };
    let effects = grid.on_control(offer, at(t0, 1));
    assert_eq!(grow_ack(&effects), Some(0));
    assert!(told(&effects).is_empty());
}
