//! How long one scheduling round takes at grid scale: the scheduler's own
//! state and policies, fed with reports, no broker.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use gleaner_manifest::{JobId, JobKind, Priority};
use gleaner_policy::share::{CsPolicy, PolicyConfig};
use gleaner_protocol::{ClusterReport, GrantId, Holding, JobReport, JobState, TaskCounts};
use gleaner_scheduler_core::state::{Action, State, StateConfig};

/// A grid of `clusters` clusters of 100 slots (20 used by local jobs, 60 by
/// scavenging jobs, 20 idle), `jobs` hungry scavenging jobs and `grid` grid
/// jobs of 70 slots that must shrink scavengers to fit.
fn state(clusters: usize, jobs: usize, grid: usize, config: &StateConfig, now: Instant) -> State {
    let mut state = State::new(GrantId::new(1));
    let ids: Vec<JobId> = (0..jobs).map(|i| JobId::new("sweep", i as u64)).collect();
    for id in &ids {
        state.on_job_update(report(id.clone(), JobKind::Scavenge, vec![]), now);
    }
    for g in 0..grid {
        let id = JobId::new("grid", g as u64);
        state.on_job_update(report(id, JobKind::Grid, vec![70]), now);
    }
    for c in 0..clusters {
        state.on_cluster(cluster_report(c, &ids), now, config);
    }
    state
}

/// Cluster `c` of the grid: 100 slots, 20 used by local jobs, 60 by six of
/// `ids`, 20 idle.
pub fn cluster_report(c: usize, ids: &[JobId]) -> ClusterReport {
    let jobs = (0..6)
        .map(|k| {
            (
                ids[(c * 7 + k * 131) % ids.len()].clone(),
                Holding {
                    running: 10,
                    pending: 0,
                },
            )
        })
        .collect();
    ClusterReport {
        cluster: format!("c{c}").into(),
        backend: "sge".into(),
        total_slots: 100,
        idle_slots: 20,
        local_slots: 20,
        jobs,
        ..ClusterReport::default()
    }
}

/// A hungry scavenging job, or a waiting grid job of `components`.
pub fn report(job: JobId, kind: JobKind, components: Vec<u32>) -> JobReport {
    JobReport {
        job,
        owner: "bench".to_owned(),
        kind,
        priority: if kind == JobKind::Grid {
            Priority::High
        } else {
            Priority::SuperLow
        },
        state: if kind == JobKind::Grid {
            JobState::Waiting
        } else {
            JobState::Running
        },
        runner: "runner@bench".into(),
        tasks: TaskCounts {
            total: 1000,
            pending: 1000,
            ..TaskCounts::default()
        },
        launchers: BTreeMap::new(),
        throughput: 0.0,
        preemptions: 0,
        started_at: 0,
        results: String::new(),
        components,
        max_slots: None,
        problem: None,
        gathering: None,
        avoid: Vec::new(),
        moldable: Vec::new(),
        inputs: Vec::new(),
        component_inputs: Vec::new(),
        weight: 1,
        task_slots: 1,
        task_needs: Default::default(),
        open: false,
    }
}

pub fn round(clusters: usize, jobs: usize, grid: usize, policies: &[CsPolicy]) {
    let policies = match policies {
        [] => &[CsPolicy::SiteEquipartition, CsPolicy::GridEquipartition][..],
        chosen => chosen,
    };
    for &policy in policies {
        let config = StateConfig {
            policy: PolicyConfig {
                policy,
                ..PolicyConfig::default()
            },
            ..StateConfig::default()
        };
        let mut times = Vec::new();
        let mut counts = (0, 0, 0);
        for _ in 0..5 {
            let now = Instant::now();
            let mut state = state(clusters, jobs, grid, &config, now);
            let started = Instant::now();
            let actions = state.round(now, &config);
            times.push(started.elapsed());
            counts = actions.iter().fold((0, 0, 0), |(o, s, p), a| match a {
                Action::Offer { .. } => (o + 1, s, p),
                Action::Preempt { .. } | Action::Drain { .. } | Action::StepAside { .. } => {
                    (o, s + 1, p)
                }
                Action::Place { .. } => (o, s, p + 1),
                Action::Abort { .. } | Action::Move { .. } => (o, s, p),
            });
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "| {} | {clusters} | {jobs} | {grid} | {} / {} / {} | {:.1} | {:.1} |",
            policy.name(),
            counts.0,
            counts.1,
            counts.2,
            ms(times[0]),
            ms(times[times.len() / 2]),
        );
    }
}
