use super::*;

fn id(name: &str) -> JobId {
    format!("{name}-0000000000000000").parse().unwrap()
}

fn job(name: &str, queue: Priority, components: &[u32]) -> GridJob {
    GridJob {
        id: id(name),
        queue,
        components: components.to_vec(),
        avoid: Vec::new(),
        inputs: Vec::new(),
        walltime_ms: None,
        moldable: Vec::new(),
    }
}

/// A site of `total` slots, `free` of them free now, whose kcm
/// foresees `running` (slots, ms left) at `speed`.
fn foreseeing(name: &str, speed: f64, total: u32, running: &[(u32, u64)]) -> Site {
    let profile = Profile::new(total, running.iter().copied());
    Site {
        ect: Some(SiteEct {
            speed,
            profile: profile.clone(),
        }),
        ..site(name, profile.free_at(0), &[])
    }
}

#[test]
fn a_moldable_component_gets_fewer_slots_on_a_busy_cluster_and_more_on_an_idle_one() {
    let moldable = Moldable::read(
        gleaner_manifest::Slots::Range { min: 4, max: 64 },
        &gleaner_manifest::Speedup::Law("amdahl:0.9".into()),
        Some(std::time::Duration::from_secs(3600)),
    )
    .unwrap();
    let job = GridJob {
        walltime_ms: Some(3_600_000),
        moldable: vec![Some(moldable.clone())],
        ..job("g", Priority::High, &[4])
    };
    // 56 of 64 slots held for 2 h: 8 slots now (39 min) beat 64 later.
    let busy = foreseeing("busy", 1.0, 64, &[(56, 7_200_000)]);
    let idle = foreseeing("idle", 1.0, 64, &[]);
    let on = |site: &Site| {
        let placed = place(
            std::slice::from_ref(&job),
            std::slice::from_ref(site),
            Weights::default(),
            Rule::Mct,
        );
        (placed[0].slots.clone(), placed[0].start_ms)
    };
    assert_eq!(on(&busy), (vec![8], 0));
    assert_eq!(on(&idle), (vec![64], 0));
    assert_eq!(moldable.walltime_ms(8), 2_353_847, "the walltime to match");
    let both = place(&[job], &[busy, idle], Weights::default(), Rule::Mct);
    assert_eq!(both[0].clusters, [ClusterName::from("idle")]);
}

#[test]
fn mct_places_where_a_component_completes_first_even_if_it_must_wait() {
    // "fast" (speed 4) is full for 10 min; "slow" is idle. An hour's
    // job completes on "fast" after 10 + 15 min, on "slow" after 60.
    let sites = [
        foreseeing("slow", 1.0, 8, &[]),
        foreseeing("fast", 4.0, 8, &[(8, 600_000)]),
    ];
    let hour = GridJob {
        walltime_ms: Some(3_600_000),
        ..job("g", Priority::High, &[8])
    };
    let placed = place(
        std::slice::from_ref(&hour),
        &sites,
        Weights::default(),
        Rule::Mct,
    );
    assert_eq!(placed[0].clusters, [ClusterName::from("fast")]);
    assert_eq!(placed[0].start_ms, 600_000);
    // Worst fit only takes free slots now.
    let placed = place(&[hour], &sites, Weights::default(), Rule::WorstFit);
    assert_eq!(placed[0].clusters, [ClusterName::from("slow")]);
    // A minute's job starts now on "slow": done before "fast" is free.
    let minute = GridJob {
        walltime_ms: Some(60_000),
        ..job("m", Priority::High, &[8])
    };
    let placed = place(&[minute], &sites, Weights::default(), Rule::Mct);
    assert_eq!(
        (placed[0].clusters[0].as_str(), placed[0].start_ms),
        ("slow", 0)
    );
}

#[test]
fn mct_queues_the_next_job_behind_the_one_it_placed_and_reclaims_scavenged_slots() {
    let mut busy = foreseeing("a", 1.0, 8, &[]);
    busy.free = 2;
    busy.scavenged = [(id("sweep"), 6)].into();
    let jobs = [
        GridJob {
            walltime_ms: Some(1000),
            ..job("g", Priority::High, &[8])
        },
        GridJob {
            walltime_ms: Some(1000),
            ..job("h", Priority::High, &[8])
        },
    ];
    let placed = place(&jobs, &[busy], Weights::default(), Rule::Mct);
    assert_eq!(placed.len(), 2);
    assert_eq!((placed[0].start_ms, placed[1].start_ms), (0, 1000));
    assert_eq!(placed[0].reclaim.len(), 1);
    assert_eq!(placed[0].reclaim[0].slots, 6);
    assert!(placed[1].reclaim.is_empty(), "it waits its turn");
}

#[test]
fn mct_without_foresight_takes_a_site_only_if_the_component_fits_now() {
    let sites = [
        site("blind", 2, &[]),
        foreseeing("seen", 1.0, 4, &[(4, 5000)]),
    ];
    let placed = place(
        &[job("g", Priority::High, &[4])],
        &sites,
        Weights::default(),
        Rule::Mct,
    );
    assert_eq!(
        (placed[0].clusters[0].as_str(), placed[0].start_ms),
        ("seen", 5000)
    );
    let too_big = job("h", Priority::High, &[5]);
    assert!(place(&[too_big], &sites, Weights::default(), Rule::Mct).is_empty());
}

fn site(name: &str, free: u32, scavenged: &[(&str, u32)]) -> Site {
    Site {
        name: name.into(),
        free,
        scavenged: scavenged.iter().map(|(j, n)| (id(j), *n)).collect(),
        hosts: Vec::new(),
        inputs: Default::default(),
        ect: None,
    }
}

/// A site of hosts given as (free, scavenged by job); `slots` each.
fn hosts(name: &str, slots: u32, hosts: &[(u32, &[(&str, u32)])]) -> Site {
    let hosts: Vec<HostRoom> = hosts
        .iter()
        .enumerate()
        .map(|(i, (free, scavenged))| HostRoom {
            name: format!("n{}", i + 1),
            slots,
            free: *free,
            scavenged: scavenged.iter().map(|(j, n)| (id(j), *n)).collect(),
        })
        .collect();
    let mut scavenged: BTreeMap<JobId, u32> = BTreeMap::new();
    for host in &hosts {
        for (job, n) in &host.scavenged {
            *scavenged.entry(job.clone()).or_default() += n;
        }
    }
    Site {
        name: name.into(),
        free: hosts.iter().map(|h| h.free).sum(),
        scavenged,
        hosts,
        inputs: Default::default(),
        ect: None,
    }
}

fn reclaim(cluster: &str, job: &str, slots: u32, hosts: &[&str]) -> Reclaim {
    Reclaim {
        cluster: cluster.into(),
        job: id(job),
        slots,
        hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
    }
}

#[test]
fn weighted_round_robin_prefers_but_does_not_starve() {
    use Priority::*;
    let jobs = [
        job("l1", Low, &[1]),
        job("h1", High, &[1]),
        job("s1", SuperHigh, &[1]),
        job("s2", SuperHigh, &[1]),
        job("s3", SuperHigh, &[1]),
        job("h2", High, &[1]),
        job("h3", High, &[1]),
    ];
    let weights = Weights {
        super_high: 2,
        high: 1,
        low: 1,
    };
    let names: Vec<String> = scan_order(&jobs, weights)
        .into_iter()
        .map(|i| jobs[i].id.name().to_owned())
        .collect();
    assert_eq!(names, ["s1", "s2", "h1", "l1", "s3", "h2", "h3"]);
}

#[test]
fn worst_fit_spreads_components_over_the_emptiest_sites() {
    let sites = [site("a", 10, &[]), site("b", 6, &[]), site("c", 8, &[])];
    let placed = place(
        &[job("g", Priority::High, &[4, 5, 4])],
        &sites,
        Weights::default(),
        Rule::WorstFit,
    );
    assert_eq!(placed[0].clusters, ["c", "a", "b"].map(ClusterName::from));
    assert!(placed[0].reclaim.is_empty());
}

fn running(name: &str, priority: Priority, ran_s: u64, walltime_s: Option<u64>) -> Running {
    Running {
        id: id(name),
        priority,
        elapsed_ms: ran_s * 1000,
        walltime_ms: walltime_s.map(|s| s * 1000),
        holds: [(ClusterName::from("a"), 4)].into(),
    }
}

#[test]
fn components_go_close_to_their_files_or_where_they_can_be_staged() {
    let shared = |name: &str, free: u32, paths: &[&str], stages: bool| Site {
        inputs: InputAccess {
            shared: paths.iter().map(|p| p.to_string()).collect(),
            stages,
            stage_s: None,
        },
        ..site(name, free, &[])
    };
    let sites = [
        shared("big", 16, &[], true),
        shared("near", 4, &["/data"], false),
        shared("none", 32, &[], false),
    ];
    let reading = |input: &str| GridJob {
        inputs: vec![vec![input.to_owned()], Vec::new()],
        ..job("g", Priority::High, &[4, 4])
    };
    let placed = place(
        &[reading("/data/x")],
        &sites,
        Weights::default(),
        Rule::WorstFit,
    );
    let clusters: Vec<&str> = placed[0].clusters.iter().map(ClusterName::as_str).collect();
    assert_eq!(clusters, ["near", "none"], "files first, then room");
    let placed = place(
        &[reading("/elsewhere/x")],
        &sites,
        Weights::default(),
        Rule::WorstFit,
    );
    assert_eq!(
        placed[0].clusters[0].as_str(),
        "big",
        "staged where it can be"
    );
    let nowhere = [shared("near", 4, &["/data"], false)];
    assert!(
        place(
            &[reading("/elsewhere/x")],
            &nowhere,
            Weights::default(),
            Rule::WorstFit
        )
        .is_empty()
    );
}

#[test]
fn lower_priority_jobs_are_stopped_latest_started_first_as_many_as_it_takes() {
    let full = [site("a", 0, &[])];
    let jobs = [
        // y started after x, z after y.
        running("x", Priority::Low, 300, None),
        running("y", Priority::Low, 200, None),
        running("z", Priority::High, 100, None),
    ];
    let names = |victims: Vec<JobId>| -> Vec<String> {
        victims.iter().map(|j| j.name().to_owned()).collect()
    };
    let stop = |slots: &[u32], priority| {
        let job = job("g", priority, slots);
        let rules = StopRules::default();
        names(to_stop(&job, priority, None, &full, &jobs, rules))
    };
    assert_eq!(stop(&[4], Priority::High), ["y"]);
    assert_eq!(stop(&[8], Priority::High), ["y", "x"]);
    assert!(stop(&[12], Priority::High).is_empty(), "z is not lower");
    assert_eq!(stop(&[12], Priority::SuperHigh), ["z", "y", "x"]);
    assert!(stop(&[4], Priority::Low).is_empty());
}

#[test]
fn a_job_is_stopped_only_after_progress_and_when_the_utility_is_worth_it() {
    let full = [site("a", 0, &[])];
    let g = job("g", Priority::High, &[4]);
    let rules = StopRules::default();
    // y ran 100 s of its 1000 s walltime since it last started: spared.
    let jobs = [
        running("x", Priority::Low, 400, None),
        running("y", Priority::Low, 100, Some(1000)),
    ];
    let stopped = to_stop(&g, Priority::High, None, &full, &jobs, rules);
    assert_eq!(stopped, [id("x")]);
    // x has 100 s of 1000 s left; g runs 1000 s: util 0.09, not worth it.
    let jobs = [running("x", Priority::Low, 900, Some(1000))];
    assert!(to_stop(&g, Priority::High, Some(1_000_000), &full, &jobs, rules).is_empty());
    // With 700 s left and g of 100 s, it is (util 8.75).
    let jobs = [running("x", Priority::Low, 300, Some(1000))];
    let stopped = to_stop(&g, Priority::High, Some(100_000), &full, &jobs, rules);
    assert_eq!(stopped, [id("x")]);
    assert!((stop_utility(3_600_000, 600_000, 600_000) - 5.0).abs() < 1e-9);
    assert!((stop_utility(1_000_000, 100_000, 100_000) - 9.0).abs() < 1e-9);
}

#[test]
fn scavenged_slots_count_but_must_be_reclaimed() {
    let sites = [site("a", 2, &[("s", 6)]), site("b", 3, &[])];
    let placed = place(
        &[job("g", Priority::High, &[8])],
        &sites,
        Weights::default(),
        Rule::WorstFit,
    );
    assert_eq!(placed[0].clusters, [ClusterName::from("a")]);
    assert_eq!(placed[0].reclaim, [reclaim("a", "s", 6, &[])]);
    let placed = place(
        &[job("g", Priority::High, &[3])],
        &sites,
        Weights::default(),
        Rule::WorstFit,
    );
    assert!(
        placed[0].reclaim.is_empty(),
        "free slots come before scavenged ones"
    );
}

#[test]
fn components_that_did_not_start_on_a_cluster_go_elsewhere_and_others_still_may() {
    let sites = [site("a", 8, &[]), site("b", 4, &[])];
    let avoiding = GridJob {
        avoid: vec!["a".into()],
        ..job("g", Priority::High, &[4])
    };
    let other = job("h", Priority::High, &[4]);
    let placed = place(
        &[avoiding, other],
        &sites,
        Weights::default(),
        Rule::WorstFit,
    );
    let clusters: Vec<(&str, &str)> = placed
        .iter()
        .map(|p| (p.job.as_str(), p.clusters[0].as_str()))
        .collect();
    assert_eq!(
        clusters,
        [("g-0000000000000000", "b"), ("h-0000000000000000", "a")]
    );
    let too_big = GridJob {
        avoid: vec!["a".into()],
        ..job("g", Priority::High, &[6])
    };
    assert!(
        place(&[too_big], &sites, Weights::default(), Rule::WorstFit).is_empty(),
        "waits"
    );
}

#[test]
fn a_component_that_fits_on_one_host_takes_back_slots_on_one_host_only() {
    // Three 4-slot hosts full of two sweeps' launchers, one slot free on n2.
    let site = hosts(
        "a",
        4,
        &[
            (0, &[("s", 2), ("t", 2)]),
            (1, &[("s", 3)]),
            (0, &[("t", 4)]),
        ],
    );
    let placed = place(
        &[job("g", Priority::High, &[4])],
        std::slice::from_ref(&site),
        Weights::default(),
        Rule::WorstFit,
    );
    assert_eq!(
        placed[0].reclaim,
        [reclaim("a", "s", 3, &["n2"])],
        "the host with a free slot: three taken back there, from its only holder"
    );
    let placed = place(
        &[job("g", Priority::High, &[4, 4])],
        std::slice::from_ref(&site),
        Weights::default(),
        Rule::WorstFit,
    );
    assert_eq!(
        placed[0].reclaim,
        [
            reclaim("a", "s", 2, &["n1"]),
            reclaim("a", "s", 3, &["n2"]),
            reclaim("a", "t", 2, &["n1"])
        ],
        "two components, two hosts"
    );
    let placed = place(
        &[job("g", Priority::High, &[6])],
        std::slice::from_ref(&site),
        Weights::default(),
        Rule::WorstFit,
    );
    assert_eq!(
        placed[0].reclaim,
        [reclaim("a", "s", 2, &[]), reclaim("a", "t", 3, &[])],
        "larger than a host: spread, from whoever holds most"
    );
}

#[test]
fn a_one_host_component_waits_when_no_host_has_room() {
    let site = hosts("a", 4, &[(2, &[]), (2, &[])]);
    let placed = place(
        &[job("g", Priority::High, &[3])],
        std::slice::from_ref(&site),
        Weights::default(),
        Rule::WorstFit,
    );
    assert!(placed.is_empty(), "4 free slots, but 2 on each host");
    let two = place(
        &[job("g", Priority::High, &[2, 2])],
        &[site],
        Weights::default(),
        Rule::WorstFit,
    );
    assert_eq!(two.len(), 1);
    assert!(two[0].reclaim.is_empty());
}

#[test]
fn jobs_that_do_not_fit_wait_and_others_go_by() {
    let sites = [site("a", 4, &[])];
    let jobs = [
        job("big", Priority::SuperHigh, &[8]),
        job("small", Priority::Low, &[2]),
        job("two", Priority::Low, &[3]),
    ];
    let placed = place(&jobs, &sites, Weights::default(), Rule::WorstFit);
    let names: Vec<&str> = placed.iter().map(|p| p.job.name()).collect();
    assert_eq!(names, ["small"], "the second small job no longer fits");
}

#[test]
fn failed_tries_move_a_job_up() {
    assert_eq!(upgraded(Priority::Low, 3, 3), Priority::High);
    assert_eq!(upgraded(Priority::Low, 2, 3), Priority::Low);
    assert_eq!(upgraded(Priority::High, 6, 3), Priority::SuperHigh);
    assert_eq!(upgraded(Priority::SuperHigh, 3, 3), Priority::SuperHigh);
    assert_eq!(upgraded(Priority::Low, 3, 0), Priority::Low);
}
