use super::*;

fn scenario(name: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(name);
    Scenario::from_toml(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn site_equipartition_is_fair_on_every_das3_workload() {
    for name in ["das3-free.toml", "das3-block.toml", "das3-spike.toml"] {
        let comparison = Comparison::run(&scenario(name), Some(CsPolicy::SiteEquipartition));
        let run = &comparison.runs[0];
        assert_eq!(run.jobs.len(), 3);
        assert!(
            run.jobs.iter().all(|j| j.done > 1000),
            "{name}: the jobs made progress"
        );
        assert!(spread(run) <= 0.05, "{name}: spread {:.3}", spread(run));
        let local = comparison.local_delay(run);
        assert!(
            local.jobs > 10 && local.max <= 5.0,
            "{name}: local jobs {local:?}"
        );
    }
}

/// The fixture's five jobs on 8 nodes, by hand (start, as waited):
/// 1 (4 nodes, 100 s) at once; 2 (6 nodes, asks 200 s, runs 50)
/// reserved when 1 ends, at 101; 3 (2 nodes) backfills at 11, ending
/// before 2's reservation; 4 (4 nodes, 80 s) fits nowhere before 2 is
/// done: reserved at 301 by the walltimes, it starts at 151, when 2
/// ends early; 5 (2 nodes, 20 s) backfills at 31.
#[test]
fn conservative_backfilling_replays_a_small_log_as_computed_by_hand() {
    let text = format!(
        "name = \"cbf\"\nduration = \"10m\"\njob = []\n\
             [[cluster]]\nname = \"c\"\nnodes = 8\nbatch_scheduler = \"conservative\"\n\
             [grid_jobs]\nworkload = \"trace\"\n\
             [grid_jobs.trace]\nthrough_gleaner = 0.0\nswf = \"{}\"\n",
        concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/cbf-hand.swf")
    );
    let scenario = Scenario::from_toml(&text).unwrap();
    let run = simulate(&scenario, None);
    let waits: Vec<(String, f64)> = run.local_waits.into_iter().collect();
    assert_eq!(
        waits,
        [
            ("c-trace-0".to_owned(), 0.0),
            ("c-trace-1".to_owned(), 100.0),
            ("c-trace-2".to_owned(), 0.0),
            ("c-trace-3".to_owned(), 130.0),
            ("c-trace-4".to_owned(), 0.0),
        ]
    );
    // First come first served holds 3 and 5 behind 2.
    let fcfs = Scenario::from_toml(&text.replace("conservative", "fcfs")).unwrap();
    let waits = simulate(&fcfs, None).local_waits;
    assert_eq!(waits["c-trace-2"], 90.0);
    assert_eq!(waits["c-trace-4"], 120.0);
}

#[test]
fn koalas_workload_runs_and_its_large_jobs_are_co_allocated() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/koala-high-load.toml"),
    )
    .unwrap()
    .replace("jobs = 500", "jobs = 60")
    .replace("duration = \"6h\"", "duration = \"1h\"");
    let scenario = Scenario::from_toml(&text).unwrap();
    let run = simulate(&scenario, None);
    assert_eq!(run.grid_jobs.len(), 60);
    let koala = Koala::of(&run).unwrap();
    let done: usize = koala.rows.iter().map(|r| r.done).sum();
    assert!(done >= 50, "{}", koala.text());
    assert!(
        run.grid_jobs.iter().all(|j| j.size == 36 || j.size == 72),
        "KOALA's sizes"
    );
    assert!(
        koala
            .rows
            .iter()
            .any(|r| r.size == 72 && r.coallocated > 0.9),
        "72 processors fit on no 64-processor cluster's free part: {}",
        koala.text()
    );
    assert!(
        koala.utilisation > koala.grid_share && koala.grid_share > 0.1,
        "{}",
        koala.text()
    );
}

#[test]
fn stopping_long_low_jobs_for_short_high_ones_shortens_theirs() {
    let koala = |name: &str| {
        let run = simulate(&scenario(name), None);
        Koala::of(&run).unwrap()
    };
    let (with, without) = (
        koala("grads-stop-restart.toml"),
        koala("grads-no-stopping.toml"),
    );
    let row = |k: &Koala, p| {
        k.rows
            .iter()
            .find(|r| r.priority == p)
            .map(|r| (r.jobs, r.done, r.makespan_s, r.preemptions))
            .unwrap()
    };
    let (jobs, done, high_with, _) = row(&with, gleaner_manifest::Priority::High);
    assert_eq!(jobs, done, "{}", with.text());
    let (jobs, done, _, stops) = row(&with, gleaner_manifest::Priority::Low);
    assert_eq!(jobs, done, "stopped jobs resume and end: {}", with.text());
    assert!(stops > 0.0, "{}", with.text());
    let (_, _, high_without, stops) = row(&without, gleaner_manifest::Priority::High);
    assert!(
        high_with < high_without,
        "{}{}",
        with.text(),
        without.text()
    );
    assert_eq!(stops, 0.0);
}

#[test]
fn a_sweep_of_weight_2_gets_twice_the_share_under_both_policies() {
    let scenario = scenario("weights.toml");
    for policy in [CsPolicy::SiteEquipartition, CsPolicy::GridEquipartition] {
        let comparison = Comparison::run(&scenario, Some(policy));
        let run = &comparison.runs[0];
        let done = |name: &str| {
            run.jobs
                .iter()
                .find(|j| j.name == name)
                .map_or(0, |j| j.done) as f64
        };
        let ratio = done("heavy") / done("light");
        assert!((1.8..=2.2).contains(&ratio), "{policy:?}: {ratio:.2}");
    }
}

#[test]
fn a_gpu_sweep_has_the_gpu_nodes_and_local_jobs_wait_no_longer() {
    let comparison = Comparison::run(&scenario("gpus.toml"), Some(CsPolicy::SiteEquipartition));
    let run = &comparison.runs[0];
    let done = |name: &str| {
        run.jobs
            .iter()
            .find(|j| j.name == name)
            .map_or(0, |j| j.done)
    };
    // 16 GPU nodes less what local jobs take, for 6 h of 5-minute
    // tasks: about 850 tasks; the CPU sweep has the other nodes.
    assert!(done("gpu") > 750, "GPU sweep: {}", done("gpu"));
    assert!(done("cpu") > 2000, "CPU sweep: {}", done("cpu"));
    let local = comparison.local_delay(run);
    assert!(local.jobs > 100 && local.max <= 5.0, "{local:?}");
}

#[test]
fn tasks_that_checkpoint_lose_no_work_to_a_churning_local_load() {
    let scenario = scenario("checkpoints.toml");
    let comparison = Comparison::run(&scenario, Some(CsPolicy::SiteEquipartition));
    let run = &comparison.runs[0];
    let job = |name: &str| run.jobs.iter().find(|j| j.name == name).expect(name);
    let (restart, resume) = (job("restart"), job("resume"));
    assert!(restart.preemptions > 100, "the load churns: {restart:?}");
    assert!(resume.preemptions > 100, "the load churns: {resume:?}");
    assert!(restart.lost_hours > 10.0, "{restart:?}");
    assert_eq!(resume.lost_hours, 0.0, "{resume:?}");
    assert!(resume.done > restart.done, "{resume:?} {restart:?}");
}

#[test]
fn grid_jobs_run_and_scavenging_fills_the_rest() {
    let comparison = Comparison::run(
        &scenario("das3-block.toml"),
        Some(CsPolicy::SiteEquipartition),
    );
    let run = &comparison.runs[0];
    assert_eq!(
        comparison.grid_delay(run).jobs,
        3,
        "every block job started"
    );
    let busy = run
        .samples
        .iter()
        .filter(|s| s.at > 600.0)
        .map(|s| f64::from(s.local + s.grid + s.scavenged) / f64::from(run.total_nodes))
        .fold(f64::INFINITY, f64::min);
    assert!(
        busy > 0.85,
        "idle nodes are scavenged: lowest load {busy:.2}"
    );
    assert!(
        comparison.baseline.jobs.is_empty(),
        "the baseline runs no scavenging jobs"
    );
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let s = scenario("das3-spike.toml");
    let (a, b) = (
        simulate(&s, Some(CsPolicy::GridEquipartition)),
        simulate(&s, Some(CsPolicy::GridEquipartition)),
    );
    let done = |r: &Run| {
        r.jobs
            .iter()
            .map(|j| (j.done, j.preemptions))
            .collect::<Vec<_>>()
    };
    assert_eq!(done(&a), done(&b));
    assert_eq!(a.local_waits, b.local_waits);
}

#[test]
fn bad_scenarios_are_refused() {
    assert!(matches!(
        Scenario::from_toml("name = 1"),
        Err(ScenarioError::Parse(_))
    ));
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/das3-free.toml"),
    )
    .unwrap();
    let broken = text.replace("local_load = 0.30", "local_load = 1.5");
    assert!(
        matches!(Scenario::from_toml(&broken), Err(ScenarioError::Invalid(m)) if m.contains("VU"))
    );
    let renamed = text.replace("name = \"runner-1\"", "name = \"runner 1\"");
    assert!(Scenario::from_toml(&renamed).is_err());
    // A period of nothing would hold the simulated clock still.
    for (key, from) in [
        ("kcm_poll", "kcm_poll = \"1s\""),
        ("scheduler_round", "scheduler_round = \"1s\""),
    ] {
        let still = text.replace(from, &format!("{key} = \"0s\""));
        assert_ne!(still, text, "{key} is in the scenario");
        assert!(
            matches!(Scenario::from_toml(&still), Err(ScenarioError::Invalid(m)) if m.contains(key)),
            "{key}"
        );
    }
    let no_samples = format!("{text}\n").replace("[timing]\n", "[timing]\nsample = \"0s\"\n");
    assert!(
        matches!(Scenario::from_toml(&no_samples), Err(ScenarioError::Invalid(m)) if m.contains("sample"))
    );
}

#[test]
fn every_scenario_file_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".toml"))
        .collect();
    names.sort();
    assert!(names.len() >= 18, "{names:?}");
    for name in names {
        let s = scenario(&name);
        assert!(!s.policies().is_empty(), "{name}");
    }
    let koala = scenario("koala-free.toml");
    assert_eq!(
        koala.policies(),
        [
            CsPolicy::SiteEquipartition,
            CsPolicy::KoalaGridEquipartition
        ]
    );
    assert_eq!(koala.choices.task, scenario::TaskChoice::Random);
    assert_eq!(koala.choices.preemption, scenario::PreemptionChoice::Random);
}

#[test]
fn koalas_choices_are_refused_unless_known() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/das3-free.toml"),
    )
    .unwrap();
    let with = |choices: &str| Scenario::from_toml(&format!("{text}\n[choices]\n{choices}\n"));
    let s = with("task = \"random\"\npreemption = \"random\"").unwrap();
    use gleaner_policy::preempt::VictimChoice;
    let (first, second) = (s.choices.victims(s.seed, 0), s.choices.victims(s.seed, 1));
    assert!(matches!(first, VictimChoice::Random { .. }), "{first:?}");
    assert_ne!(first, second, "each job draws its own");
    let gleaners = scenario("das3-free.toml").choices;
    assert_eq!(gleaners.victims(2008, 0), VictimChoice::LeastLoss);
    assert_eq!(gleaners.launcher_failures_per_hour, 0.0);
    for refused in [
        "task = \"lifo\"",
        "preemption = \"oldest\"",
        "tasks = \"random\"",
    ] {
        assert!(
            matches!(with(refused), Err(ScenarioError::Parse(_))),
            "{refused}"
        );
    }
    assert!(matches!(
        with("launcher_failures_per_hour = -1.0"),
        Err(ScenarioError::Invalid(_))
    ));
}

/// koala-free.toml for 15 minutes, its launchers failing at `rate`.
fn koala_short(rate: &str) -> Scenario {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/koala-free.toml"),
    )
    .unwrap()
    .replace("duration = \"1h\"", "duration = \"15m\"")
    .replace(
        "launcher_failures_per_hour = 0.6",
        &format!("launcher_failures_per_hour = {rate}"),
    );
    Scenario::from_toml(&text).unwrap()
}

#[test]
fn koalas_random_choices_repeat_and_failing_launchers_time_out() {
    let failing = koala_short("2.0");
    let once = Comparison::run(&failing, Some(CsPolicy::KoalaGridEquipartition));
    let again = Comparison::run(&failing, Some(CsPolicy::KoalaGridEquipartition));
    assert_eq!(once.text(), again.text(), "the same scenario, the same run");
    assert_eq!(once.json(), again.json());
    let run = &once.runs[0];
    assert!(run.jobs.iter().all(|j| j.done > 100), "{}", once.text());
    assert!(
        run.jobs.iter().all(|j| j.timeouts > 0),
        "dead launchers are found by their silence: {}",
        once.text()
    );
    assert!(once.text().contains("time-outs"));
    assert!(once.json()["runs"][0]["jobs"][0]["timeouts"].as_u64() > Some(0));
    let sound = Comparison::run(&koala_short("0.0"), Some(CsPolicy::KoalaGridEquipartition));
    assert!(
        sound.runs[0].jobs.iter().all(|j| j.timeouts == 0),
        "{}",
        sound.text()
    );
    // Redone: more work lost with failures, as their tasks run again.
    let lost = |c: &Comparison| c.runs[0].jobs.iter().map(|j| j.lost_hours).sum::<f64>();
    assert!(
        lost(&once) > lost(&sound),
        "{}{}",
        once.text(),
        sound.text()
    );
}

#[test]
fn without_rebalance_nobody_is_drained() {
    let no_drain = scenario("das3-spike-no-drain.toml");
    let config = no_drain.state_config(CsPolicy::GridEquipartition);
    assert!(!config.policy.rebalance);
    let drains = |s: &Scenario| {
        simulate(s, Some(CsPolicy::GridEquipartition))
            .jobs
            .iter()
            .map(|j| j.drains)
            .sum::<u64>()
    };
    assert_eq!(drains(&no_drain), 0);
    assert!(
        drains(&scenario("das3-spike.toml")) > 0,
        "GEP drains for fair share unless told not to"
    );
}

#[test]
fn scheduler_settings_are_the_schedulers_own() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/das3-free.toml"),
    )
    .unwrap();
    let with = |settings: &str| Scenario::from_toml(&format!("{text}\n[scheduler]\n{settings}\n"));
    let s = with("idle_settle = \"5s\"\nupgrade_after = 3").unwrap();
    let config = s.state_config(CsPolicy::SiteEquipartition);
    assert_eq!(config.idle_settle, std::time::Duration::from_secs(5));
    assert_eq!(config.grid.upgrade_after, 3);
    assert_eq!(
        config.grant_timeout,
        gleaner_scheduler_core::state::StateConfig::default().grant_timeout
    );
    for refused in [
        "idle_setle = \"5s\"",
        "policy = \"grid-equipartition\"",
        "load_cap = 2.0",
    ] {
        assert!(
            matches!(with(refused), Err(ScenarioError::Invalid(_))),
            "{refused}"
        );
    }
}

/// Two clusters of 10 idle nodes for 5 minutes, and two sweeps: `a`
/// of 2000 tasks of 30 s, `b` of `b_tasks` tasks of 10 s, submitted
/// as `b_start` says (the line left out if empty).
fn two_sweeps(b_start: &str, b_tasks: u32) -> String {
    format!(
        "name = \"late\"\nduration = \"5m\"\n\
             [timing]\nsample = \"5s\"\n\
             [[cluster]]\nname = \"c1\"\nnodes = 10\n\
             [[cluster]]\nname = \"c2\"\nnodes = 10\n\
             [[job]]\nname = \"a\"\ntasks = 2000\ntask_duration = \"30s\"\n\
             [[job]]\nname = \"b\"\ntasks = {b_tasks}\ntask_duration = \"10s\"\n{b_start}\n"
    )
}

#[test]
fn a_job_submitted_later_holds_nothing_before_and_is_timed_from_then() {
    let late = Scenario::from_toml(&two_sweeps("start_after = \"2m\"", 2000)).unwrap();
    assert_eq!(
        late.jobs[1].start_after,
        std::time::Duration::from_secs(120)
    );
    let run = simulate(&late, Some(CsPolicy::SiteEquipartition));
    let (a, b) = (&run.jobs[0], &run.jobs[1]);
    assert_eq!((a.started, b.started), (Some(0.0), Some(120.0)), "{run:?}");
    assert!(
        b.first_launcher.is_some_and(|t| t >= 120.0),
        "no launcher of b before its submission: {b:?}"
    );
    // Before b comes, every scavenged node is a's: all 20 of them.
    let before: Vec<u32> = run
        .samples
        .iter()
        .filter(|s| (30.0..120.0).contains(&s.at))
        .map(|s| s.scavenged)
        .collect();
    assert!(before.iter().all(|&n| n == 20), "{before:?}");
    // Drained for b, a gives it its share.
    assert!(a.done > 0 && b.done > 0, "{run:?}");
    // Each over its own time: a for the 300 s, b for the last 180 s.
    assert_eq!((a.ended, b.ended), (None, None));
    assert_eq!(a.throughput, a.done as f64 / 300.0);
    assert_eq!(b.throughput, b.done as f64 / 180.0);
    // KOALA-CS's GEP splits only idle nodes, and drains nobody: the
    // first comer keeps all 20, the one that came later gets none.
    let run = simulate(&late, Some(CsPolicy::KoalaGridEquipartition));
    let b = &run.jobs[1];
    assert_eq!((b.done, b.first_launcher), (0, None), "{b:?}");
    let refused = two_sweeps("start_after = \"5m\"", 2000);
    assert!(matches!(
        Scenario::from_toml(&refused),
        Err(ScenarioError::Invalid(m)) if m.contains("start_after")
    ));
}

#[test]
fn a_job_done_early_is_timed_to_its_end() {
    let small = Scenario::from_toml(&two_sweeps("start_after = \"1m\"", 20)).unwrap();
    let run = simulate(&small, Some(CsPolicy::SiteEquipartition));
    let b = &run.jobs[1];
    assert_eq!(b.done, 20, "{b:?}");
    let ended = b.ended.expect("b ran all its tasks");
    assert!(ended > 60.0 && ended < 300.0, "{b:?}");
    assert_eq!(b.throughput, 20.0 / (ended - 60.0));
}

#[test]
fn jobs_submitted_at_once_run_as_before() {
    // Said or not, a start at 0 is the same run, timed over the whole
    // of it.
    let (unsaid, said) = (
        Scenario::from_toml(&two_sweeps("", 2000)).unwrap(),
        Scenario::from_toml(&two_sweeps("start_after = \"0s\"", 2000)).unwrap(),
    );
    let (a, b) = (Comparison::run(&unsaid, None), Comparison::run(&said, None));
    assert_eq!(a.text(), b.text());
    assert_eq!(a.json(), b.json());
    for job in a.runs.iter().flat_map(|run| &run.jobs) {
        assert_eq!(job.started, Some(0.0), "{job:?}");
        assert_eq!(job.throughput, job.done as f64 / 300.0, "{job:?}");
    }
    // And the thesis's own scenarios, shortened, likewise.
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/koala-spike.toml"),
    )
    .unwrap()
    .replace("duration = \"1h\"", "duration = \"10m\"");
    let zero = text.replace(
        "task_duration = \"2m\"\n",
        "task_duration = \"2m\"\nstart_after = \"0s\"\n",
    );
    assert_ne!(text, zero);
    let policy = Some(CsPolicy::KoalaGridEquipartition);
    let run = |t: &str| Comparison::run(&Scenario::from_toml(t).unwrap(), policy).text();
    assert_eq!(run(&text), run(&zero));
}

#[test]
fn the_plot_is_written() {
    let dir = std::env::temp_dir().join(format!("gleaner-plot-{}", std::process::id()));
    let comparison = Comparison::run(
        &scenario("das3-spike.toml"),
        Some(CsPolicy::SiteEquipartition),
    );
    let files = comparison.plot(&dir, "spike").unwrap();
    let png = std::fs::read(&files[0]).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a picture"
    );
    let _ = std::fs::remove_dir_all(dir);
}
