use rand::{SeedableRng, rngs::StdRng};

use super::*;

const SAMPLE: &str = "\
; Version: 2.2
; Computer: a test machine
; MaxProcs: 128
; MaxNodes: 64
;
; job 2 was cancelled before it started
1 0 5 100 4 -1 -1 4 300 -1 1 7 1 -1 1 -1 -1 -1
2 10 -1 -1 -1 -1 -1 8 600 -1 5 3 1 -1 1 -1 -1 -1
4 7 0 2000 2 -1 -1 2 1800 -1 0 2 1 -1 1 -1 -1 -1
3 5 0 50 -1 12.5 -1 16 -1 -1 1 -1 -1 -1 1 -1 -1 -1
";

fn job(id: u64, submit_s: f64, run_s: f64, procs: u32, requested_s: f64) -> WorkloadJob {
    WorkloadJob {
        id,
        submit_s,
        run_s,
        procs,
        requested_s,
        user: None,
    }
}

/// The share of `jobs` that `pick` picks.
fn share(jobs: &[WorkloadJob], pick: impl Fn(&WorkloadJob) -> bool) -> f64 {
    jobs.iter().filter(|&j| pick(j)).count() as f64 / jobs.len() as f64
}

fn params(jobs: usize, max_nodes: u32) -> Lublin {
    Lublin {
        jobs,
        max_nodes,
        load_scale: 1.0,
        underestimated: 0.1,
    }
}

#[test]
fn parses_a_log_skipping_unusable_jobs() {
    let swf = parse_swf(SAMPLE).unwrap();
    assert_eq!(swf.max_procs, Some(128), "MaxProcs before MaxNodes");
    assert_eq!(
        swf.jobs,
        [
            WorkloadJob {
                user: Some(7),
                ..job(1, 0.0, 100.0, 4, 300.0)
            },
            job(3, 5.0, 50.0, 16, 50.0),
            WorkloadJob {
                user: Some(2),
                ..job(4, 7.0, 2000.0, 2, 1800.0)
            },
        ]
    );
    let nodes_only = parse_swf("; MaxNodes: 64\n").unwrap();
    assert_eq!(nodes_only.max_procs, Some(64));
    assert!(nodes_only.jobs.is_empty());
}

#[test]
fn malformed_lines_are_errors_that_name_them() {
    let good = "1 0 5 100 4 -1 -1 4 300 -1 1 7 1 -1 1 -1 -1 -1";
    let short = format!("; MaxProcs: 8\n{good}\n1 0 5 100 4\n");
    let err = parse_swf(&short).unwrap_err();
    assert!(
        matches!(err, WorkloadError::Malformed { line: 3, .. }),
        "{err}"
    );
    for bad in ["nan", "inf", "ten"] {
        let text = format!("{good}\n\n1 0 5 {bad} 4 -1 -1 4 300 -1 1 7 1 -1 1 -1 -1 -1\n");
        let err = parse_swf(&text).unwrap_err();
        assert!(err.to_string().starts_with("line 3: field 4"), "{err}");
    }
    let early = "1 -5 5 100 4 -1 -1 4 300 -1 1 7 1 -1 1 -1 -1 -1\n";
    assert!(matches!(
        parse_swf(early),
        Err(WorkloadError::Malformed { line: 1, .. })
    ));
    let half = "1 0 5 100 2.5 -1 -1 4 300 -1 1 7 1 -1 1 -1 -1 -1\n";
    assert!(parse_swf(half).is_err(), "half a processor");
    assert!(parse_swf("; MaxProcs: many\n").is_err());
}

#[test]
fn parses_the_sample_log() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/parallel-sample.swf");
    let swf = parse_swf(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(swf.max_procs, Some(64));
    assert_eq!(swf.jobs.len(), 38, "jobs 9 and 27 were cancelled");
    assert!(swf.jobs.iter().all(|j| (1..=64).contains(&j.procs)));
    let killed: Vec<u64> = swf
        .jobs
        .iter()
        .filter(|j| j.requested_s < j.run_s)
        .map(|j| j.id)
        .collect();
    assert_eq!(killed, [14, 31, 38]);
    let find = |id| swf.jobs.iter().find(|j| j.id == id).unwrap();
    assert_eq!(
        find(21).procs,
        16,
        "requested processors when none allocated"
    );
    assert_eq!(find(33).requested_s, 306.0, "the runtime when no request");
    assert_eq!(find(17).user, None);
    assert_eq!(find(1).user, Some(5));
}

#[test]
fn generated_workloads_read_back_as_written() {
    let jobs = lublin(&params(500, 128), &mut StdRng::seed_from_u64(7));
    let swf = parse_swf(&to_swf(&jobs, 128)).unwrap();
    assert_eq!(swf.max_procs, Some(128));
    assert_eq!(swf.jobs, jobs);
}

#[test]
fn generated_workloads_look_like_the_model() {
    let jobs = lublin(&params(20_000, 128), &mut StdRng::seed_from_u64(2003));
    assert_eq!(jobs.len(), 20_000);
    assert!(jobs.iter().zip(1..).all(|(j, id)| j.id == id));
    assert!(jobs.windows(2).all(|w| w[0].submit_s <= w[1].submit_s));
    assert!(
        jobs.iter()
            .all(|j| (1..=128).contains(&j.procs) && j.run_s >= 1.0)
    );
    let serial = share(&jobs, |j| j.procs == 1);
    assert!((0.22..=0.27).contains(&serial), "serial share {serial}");
    let parallel = 1.0 - serial;
    let pow2 = share(&jobs, |j| j.procs > 1 && j.procs.is_power_of_two()) / parallel;
    assert!(pow2 >= 0.75, "powers of two among parallel jobs {pow2}");
    // Three jobs in four take the short gamma, of mean log-runtime 3.9.
    let mut runs: Vec<f64> = jobs.iter().map(|j| j.run_s).collect();
    runs.sort_by(f64::total_cmp);
    let median = runs[runs.len() / 2];
    assert!((50.0..=300.0).contains(&median), "median runtime {median}");
    // About 940 s: the mean of e^gamma(AARR * ARAR, BARR), e^7 s, less the
    // tail the model cuts.
    let gap = (jobs[jobs.len() - 1].submit_s - jobs[0].submit_s) / (jobs.len() - 1) as f64;
    assert!((600.0..=1500.0).contains(&gap), "mean inter-arrival {gap}");
    let day = share(&jobs, |j| {
        (8.0 * HOUR..18.0 * HOUR).contains(&(j.submit_s % (24.0 * HOUR)))
    });
    assert!(day > 0.55, "arrivals in working hours {day}");
    let under = share(&jobs, |j| j.requested_s < j.run_s);
    assert!((under - 0.1).abs() < 0.001, "underestimated share {under}");
    assert!(jobs.iter().all(|j| POPULAR_S.contains(&j.requested_s)));
}

#[test]
fn load_scale_divides_inter_arrival_times() {
    let span = |load_scale| {
        let jobs = lublin(
            &Lublin {
                load_scale,
                ..params(5_000, 64)
            },
            &mut StdRng::seed_from_u64(11),
        );
        jobs[jobs.len() - 1].submit_s
    };
    let ratio = span(2.0) / span(1.0);
    assert!((0.45..=0.55).contains(&ratio), "ratio {ratio}");
}

#[test]
fn sizes_fit_any_machine() {
    for max_nodes in [1, 3, 100, 1000] {
        let jobs = lublin(&params(2_000, max_nodes), &mut StdRng::seed_from_u64(3));
        assert!(
            jobs.iter().all(|j| (1..=max_nodes).contains(&j.procs)),
            "{max_nodes} nodes"
        );
    }
}

#[test]
fn parameters_are_checked_and_defaulted() {
    let parsed: Lublin = toml::from_str("jobs = 10\nmax_nodes = 64").unwrap();
    assert_eq!((parsed.load_scale, parsed.underestimated), (1.0, 0.1));
    assert!(parsed.check().is_ok());
    assert!(toml::from_str::<Lublin>("jobs = 10\nmax_nodes = 64\nnodes = 3").is_err());
    for bad in [
        Lublin {
            load_scale: 0.0,
            ..params(10, 64)
        },
        Lublin {
            underestimated: f64::NAN,
            ..params(10, 64)
        },
        params(10, 0),
        params(0, 64),
    ] {
        assert!(bad.check().is_err(), "{bad:?}");
    }
}

#[test]
fn gamma_draws_have_the_right_mean_and_variance() {
    let mut rng = StdRng::seed_from_u64(5);
    for (shape, scale) in [(0.5, 2.0), (4.2, 0.94), (312.0, 0.03)] {
        let draws: Vec<f64> = (0..100_000)
            .map(|_| gamma(&mut rng, shape, scale))
            .collect();
        let n = draws.len() as f64;
        let mean = draws.iter().sum::<f64>() / n;
        let variance = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        let (expected_mean, expected_variance) = (shape * scale, shape * scale * scale);
        assert!(
            (mean - expected_mean).abs() < 0.02 * expected_mean,
            "gamma({shape}, {scale}): mean {mean}"
        );
        assert!(
            (variance - expected_variance).abs() < 0.1 * expected_variance,
            "gamma({shape}, {scale}): variance {variance}"
        );
    }
}
