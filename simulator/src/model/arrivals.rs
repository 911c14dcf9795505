//! Where the simulated grid's work comes from: a trace's jobs, split
//! between gleaner and the clusters' own queues, and the grid jobs of the
//! workload (at fixed moments, or KOALA's Poisson arrivals).

use super::*;

/// Seed 002's workload: each job of the trace (read, or drawn from the
/// Lublin-Feitelson model with the scenario's seed) through gleaner as a
/// one-component grid job with `through_gleaner`'s odds, else to the own
/// queue of a cluster it fits on, picked at random; jobs larger than the
/// largest cluster are cut to it.
pub(super) fn trace_arrivals(
    scenario: &Scenario,
) -> (Vec<GridSim>, std::collections::VecDeque<(usize, LocalJob)>) {
    let Some(trace) = &scenario.grid_jobs.trace else {
        return Default::default();
    };
    let mut rng = StdRng::seed_from_u64(scenario.seed ^ 0x2545_f491_4f6c_dd1d);
    let jobs = match &trace.lublin {
        Some(params) => crate::workload::lublin(params, &mut rng),
        None => trace.loaded.clone(),
    };
    let largest = scenario.clusters.iter().map(|c| c.nodes).max().unwrap_or(1);
    let mut grid = Vec::new();
    let mut local = std::collections::VecDeque::new();
    for (i, job) in jobs.iter().enumerate() {
        let nodes = job.procs.clamp(1, largest);
        if rng.random_range(0.0..1.0) < trace.through_gleaner {
            grid.push(GridSim {
                id: JobId::new("trace", i as u64),
                arrival: job.submit_s,
                components: vec![nodes],
                length: job.run_s.min(job.requested_s).max(1.0),
                priority: Priority::Low,
                registered: false,
                started: Vec::new(),
                file: None,
                done: 0.0,
                walltime: Some(job.requested_s.max(1.0)),
            });
            continue;
        }
        let fits: Vec<usize> = (0..scenario.clusters.len())
            .filter(|&c| scenario.clusters[c].nodes >= nodes)
            .collect();
        let c = fits[rng.random_range(0..fits.len())];
        let speed = scenario.clusters[c].speed;
        local.push_back((
            c,
            LocalJob {
                id: format!("{}-trace-{i}", scenario.clusters[c].name),
                nodes,
                duration: job.run_s.max(1.0) / speed,
                walltime: job.requested_s.max(1.0) / speed,
                arrived: job.submit_s,
                gpu: false,
            },
        ));
    }
    (grid, local)
}

/// The background grid jobs of the workload, at fixed moments per seed.
pub(super) fn grid_arrivals(scenario: &Scenario) -> Vec<GridSim> {
    let g = &scenario.grid_jobs;
    if g.workload == GridWorkload::Free {
        return Vec::new();
    }
    let mut rng = StdRng::seed_from_u64(scenario.seed ^ 0x9e37_79b9_7f4a_7c15);
    if g.workload == GridWorkload::Poisson {
        return poisson_arrivals(g, &mut rng);
    }
    let period = g.period.as_secs_f64();
    let periods = (scenario.duration.as_secs_f64() / period).floor() as u64;
    let each = g.nodes / g.components;
    let mut components = vec![each; g.components as usize];
    components[0] += g.nodes - each * g.components;
    (0..periods)
        .map(|p| {
            let offset = match g.workload {
                GridWorkload::Block => {
                    rng.random_range(0.0..(period - g.length.as_secs_f64()).max(1.0))
                }
                _ => 0.0,
            };
            GridSim {
                id: JobId::new("grid", p),
                arrival: p as f64 * period + offset,
                components: components.clone(),
                length: g.length.as_secs_f64(),
                priority: Priority::Low,
                registered: false,
                started: Vec::new(),
                file: None,
                done: 0.0,
                walltime: None,
            }
        })
        .collect()
}

/// A simulated grid job as its manifest: its components, priority and
/// length (its walltime, for the scheduler's choice of jobs to stop), and
/// the workload's claiming settings.
pub(super) fn grid_manifest(g: &GridSim, jobs: &crate::scenario::GridJobs) -> Manifest {
    let mut manifest = Manifest::named(g.id.name());
    manifest.kind = JobKind::Grid;
    manifest.priority = Some(g.priority);
    manifest.walltime = Some(Duration::from_secs_f64(
        g.walltime.unwrap_or(g.length.ceil() + 30.0).max(1.0),
    ));
    manifest.claim_threshold = Some(jobs.claim_threshold);
    manifest.barrier_timeout = Some(jobs.barrier_timeout);
    manifest.components = g
        .components
        .iter()
        .map(|slots| Component {
            slots: (*slots).into(),
            speedup: None,
            command: "simulated".to_owned(),
            memory: None,
            gpus: 0,
            inputs: Vec::new(),
        })
        .collect();
    manifest
}

/// KOALA's workload (seed 001, section 5): Poisson arrivals of jobs of
/// the given sizes in equal components, their count, length and priority
/// picked uniformly at random.
fn poisson_arrivals(g: &crate::scenario::GridJobs, rng: &mut StdRng) -> Vec<GridSim> {
    let mean = g.interarrival.as_secs_f64();
    let mut t = 0.0;
    (0..g.jobs)
        .map(|i| {
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            t += -u.ln() * mean;
            let size = g.sizes[rng.random_range(0..g.sizes.len())];
            let counts: Vec<u32> = g
                .component_counts
                .iter()
                .copied()
                .filter(|n| *n > 0 && size / n >= g.min_component.max(1))
                .collect();
            let count = counts[rng.random_range(0..counts.len())];
            let each = size / count;
            let mut components = vec![each; count as usize];
            components[0] += size - each * count;
            let high = rng.random_range(0.0..1.0) < g.high_share;
            let [shortest, longest] = match high {
                true => g.high_lengths_s.unwrap_or(g.lengths_s),
                false => g.lengths_s,
            };
            GridSim {
                id: JobId::new("koala", u64::from(i)),
                arrival: t,
                components,
                length: rng.random_range(shortest..=longest),
                priority: if high { Priority::High } else { Priority::Low },
                registered: false,
                started: Vec::new(),
                file: None,
                done: 0.0,
                walltime: None,
            }
        })
        .collect()
}
