//! The simulated grid: clusters with their own jobs, grid jobs, and the
//! scavenging jobs' launchers, stepped by a simulated clock. Every decision
//! is taken by the policy functions the real services use.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gleaner_manifest::{JobId, Priority};
use gleaner_policy::{
    local::{Answered, LocalState, WaitingJob, on_local_wait},
    placement::{self, GridJob, Site, Weights, upgraded},
    preempt::{Candidate, choose_victims},
    share::{self, ClusterInput, CsPolicy, JobInput, PolicyConfig, split_shrink},
};
use rand::{RngExt, SeedableRng, rngs::StdRng};

use crate::scenario::{GridWorkload, Scenario};

/// Grid jobs moving up a placement queue after this many failed rounds.
const UPGRADE_AFTER: u32 = 30;

/// What one run produced.
#[derive(Debug, Clone)]
pub struct Run {
    /// `None`: the baseline without scavenging jobs.
    pub policy: Option<CsPolicy>,
    pub jobs: Vec<JobResult>,
    /// Wait of each local job that started, by its id.
    pub local_waits: BTreeMap<String, f64>,
    /// Wait of each grid job that started, by its index.
    pub grid_waits: BTreeMap<usize, f64>,
    pub samples: Vec<Sample>,
    pub total_nodes: u32,
}

#[derive(Debug, Clone)]
pub struct JobResult {
    pub name: String,
    pub done: u64,
    /// Tasks per second over the run.
    pub throughput: f64,
    pub preemptions: u64,
}

/// Nodes in use at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at: f64,
    pub local: u32,
    pub grid: u32,
    pub scavenged: u32,
}

struct LocalJob {
    id: String,
    nodes: u32,
    duration: f64,
    arrived: f64,
}

struct Launcher {
    id: u64,
    job: usize,
    /// When it takes its first task; before, it is a pending placeholder.
    active_at: f64,
    /// Remaining work and start time of its task.
    task: Option<(f64, f64)>,
    draining: bool,
    /// Preempted: its node is free from then on.
    leaving_at: Option<f64>,
}

struct ClusterSim {
    name: String,
    nodes: u32,
    speed: f64,
    rng: StdRng,
    arrival_rate: f64,
    next_arrival: f64,
    next_local: u64,
    queue: VecDeque<LocalJob>,
    local: Vec<(u32, f64)>,
    grid: Vec<(u32, f64)>,
    /// Placed grid components waiting for their nodes: (grid job, nodes).
    grid_pending: Vec<(usize, u32)>,
    launchers: Vec<Launcher>,
    answered: Answered,
}

impl ClusterSim {
    fn occupied(&self) -> u32 {
        self.local.iter().map(|(n, _)| n).sum::<u32>()
            + self.grid.iter().map(|(n, _)| n).sum::<u32>()
            + self.launchers.len() as u32
    }

    fn free(&self) -> u32 {
        self.nodes.saturating_sub(self.occupied())
    }

    fn local_waiting(&self) -> u32 {
        self.queue.iter().map(|j| j.nodes).sum()
    }

    fn grid_reserved(&self) -> u32 {
        self.grid_pending.iter().map(|(_, n)| n).sum()
    }

    /// Launchers of each job that are staying (starting or working).
    fn held(&self, ids: &[JobId]) -> BTreeMap<JobId, u32> {
        let mut held = BTreeMap::new();
        for l in self
            .launchers
            .iter()
            .filter(|l| l.leaving_at.is_none() && !l.draining)
        {
            *held.entry(ids[l.job].clone()).or_default() += 1;
        }
        held
    }
}

struct JobSim {
    name: String,
    unstarted: u64,
    running: u64,
    done: u64,
    preemptions: u64,
    task_work: f64,
}

struct GridSim {
    arrival: f64,
    components: Vec<u32>,
    length: f64,
    queue: Priority,
    tries: u32,
    placed: bool,
    started: Vec<f64>,
}

struct Sim<'a> {
    scenario: &'a Scenario,
    policy: Option<PolicyConfig>,
    t: f64,
    clusters: Vec<ClusterSim>,
    jobs: Vec<JobSim>,
    ids: Vec<JobId>,
    grid: Vec<GridSim>,
    next_launcher: u64,
    local_waits: BTreeMap<String, f64>,
    samples: Vec<Sample>,
}

/// Runs a scenario under `policy`, or without scavenging jobs (`None`).
pub fn simulate(scenario: &Scenario, policy: Option<CsPolicy>) -> Run {
    let mut sim = Sim::new(scenario, policy);
    let timing = &scenario.timing;
    let dt = timing.step.as_secs_f64();
    let end = scenario.duration.as_secs_f64();
    let every =
        |interval: std::time::Duration| (interval.as_secs_f64() / dt).round().max(1.0) as u64;
    let (poll, round, sample) = (
        every(timing.kcm_poll),
        every(timing.scheduler_round),
        every(timing.sample),
    );
    let mut step = 0u64;
    while sim.t < end {
        step += 1;
        sim.t = step as f64 * dt;
        sim.finish_and_work(dt);
        sim.arrivals();
        sim.start_waiting();
        if step.is_multiple_of(poll) {
            sim.kcm_polls();
        }
        if step.is_multiple_of(round) {
            sim.scheduler_round();
        }
        sim.start_waiting();
        if step.is_multiple_of(sample) {
            sim.sample();
        }
    }
    sim.into_run(end)
}

impl<'a> Sim<'a> {
    fn new(scenario: &'a Scenario, policy: Option<CsPolicy>) -> Self {
        let mean_nodes =
            f64::from(scenario.local_jobs.nodes[0] + scenario.local_jobs.nodes[1]) / 2.0;
        let mean_duration = scenario.local_jobs.duration.as_secs_f64().max(1.0);
        let [low, high] = scenario.local_jobs.nodes;
        let clusters = scenario
            .clusters
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let arrival_rate =
                    spec.local_load * f64::from(spec.nodes) / (mean_nodes * mean_duration);
                let mut rng = StdRng::seed_from_u64(
                    scenario.seed.wrapping_mul(1_000_003).wrapping_add(i as u64),
                );
                // A warm start: the cluster's own jobs already use their
                // share, each with an exponential (memoryless) time left.
                let target = (spec.local_load * f64::from(spec.nodes)).round() as u32;
                let mut local = Vec::new();
                let mut used = 0;
                while used < target {
                    let nodes = rng.random_range(low..=high).min(target - used).max(1);
                    local.push((nodes, exponential(&mut rng, 1.0 / mean_duration)));
                    used += nodes;
                }
                let next_arrival = exponential(&mut rng, arrival_rate);
                ClusterSim {
                    name: spec.name.clone(),
                    nodes: spec.nodes,
                    speed: spec.speed,
                    rng,
                    arrival_rate,
                    next_arrival,
                    next_local: 0,
                    queue: VecDeque::new(),
                    local,
                    grid: Vec::new(),
                    grid_pending: Vec::new(),
                    launchers: Vec::new(),
                    answered: Answered::default(),
                }
            })
            .collect();
        let jobs = match policy {
            Some(_) => scenario
                .jobs
                .iter()
                .map(|j| JobSim {
                    name: j.name.clone(),
                    unstarted: j.tasks,
                    running: 0,
                    done: 0,
                    preemptions: 0,
                    task_work: j.task_duration.as_secs_f64(),
                })
                .collect(),
            None => Vec::new(),
        };
        let ids = scenario
            .jobs
            .iter()
            .enumerate()
            .map(|(i, j)| JobId::new(&j.name, i as u32))
            .collect();
        Self {
            scenario,
            policy: policy.map(|policy| PolicyConfig {
                policy,
                ..PolicyConfig::default()
            }),
            t: 0.0,
            clusters,
            jobs,
            ids,
            grid: grid_arrivals(scenario),
            next_launcher: 0,
            local_waits: BTreeMap::new(),
            samples: Vec::new(),
        }
    }

    /// Ends what ended, and lets launchers work one step.
    fn finish_and_work(&mut self, dt: f64) {
        let t = self.t;
        for cluster in &mut self.clusters {
            cluster.local.retain(|(_, end)| *end > t);
            cluster.grid.retain(|(_, end)| *end > t);
            cluster
                .launchers
                .retain(|l| l.leaving_at.is_none_or(|at| at > t));
            let speed = cluster.speed;
            for launcher in &mut cluster.launchers {
                if launcher.active_at > t || launcher.leaving_at.is_some() {
                    continue;
                }
                let job = &mut self.jobs[launcher.job];
                if let Some((work, started)) = launcher.task {
                    let left = work - speed * dt;
                    if left > 0.0 {
                        launcher.task = Some((left, started));
                        continue;
                    }
                    launcher.task = None;
                    job.running -= 1;
                    job.done += 1;
                }
                if !launcher.draining && job.unstarted > 0 {
                    job.unstarted -= 1;
                    job.running += 1;
                    launcher.task = Some((job.task_work, t));
                } else {
                    // No work, or told to drain: the launcher leaves.
                    launcher.leaving_at = Some(t);
                }
            }
            cluster
                .launchers
                .retain(|l| l.leaving_at.is_none_or(|at| at > t));
        }
    }

    fn arrivals(&mut self) {
        let t = self.t;
        let [low, high] = self.scenario.local_jobs.nodes;
        let mean = self.scenario.local_jobs.duration.as_secs_f64();
        for cluster in &mut self.clusters {
            while cluster.arrival_rate > 0.0 && cluster.next_arrival <= t {
                let nodes = cluster.rng.random_range(low..=high).min(cluster.nodes);
                let duration = exponential(&mut cluster.rng, 1.0 / mean);
                cluster.queue.push_back(LocalJob {
                    id: format!("{}-{}", cluster.name, cluster.next_local),
                    nodes,
                    duration,
                    arrived: cluster.next_arrival,
                });
                cluster.next_local += 1;
                let gap = exponential(&mut cluster.rng, cluster.arrival_rate);
                cluster.next_arrival += gap;
            }
        }
    }

    /// Placed grid components, then local jobs in order, start where the
    /// nodes are free.
    fn start_waiting(&mut self) {
        let t = self.t;
        for cluster in &mut self.clusters {
            let mut i = 0;
            while i < cluster.grid_pending.len() {
                let (job, nodes) = cluster.grid_pending[i];
                if cluster.free() >= nodes {
                    cluster.grid_pending.remove(i);
                    let grid = &mut self.grid[job];
                    cluster.grid.push((nodes, t + grid.length));
                    grid.started.push(t);
                } else {
                    i += 1;
                }
            }
            while let Some(head) = cluster.queue.front() {
                if cluster.free() < head.nodes {
                    break;
                }
                let Some(job) = cluster.queue.pop_front() else {
                    break;
                };
                self.local_waits.insert(job.id, t - job.arrived);
                cluster.local.push((job.nodes, t + job.duration));
            }
        }
    }

    /// Each kcm answers its waiting local jobs with the local policy.
    fn kcm_polls(&mut self) {
        let t = self.t;
        let timing = &self.scenario.timing;
        let settle = (timing.preempt_delay + timing.kcm_poll * 2).as_millis() as u64;
        for c in 0..self.clusters.len() {
            let cluster = &mut self.clusters[c];
            if cluster.queue.is_empty() {
                continue;
            }
            let waiting: Vec<WaitingJob> = cluster
                .queue
                .iter()
                .map(|j| WaitingJob {
                    id: j.id.clone(),
                    slots: j.nodes,
                })
                .collect();
            let pending: Vec<String> = cluster
                .launchers
                .iter()
                .filter(|l| l.active_at > t && l.leaving_at.is_none())
                .map(|l| l.id.to_string())
                .collect();
            let mut held = BTreeMap::new();
            for l in cluster
                .launchers
                .iter()
                .filter(|l| l.active_at <= t && l.leaving_at.is_none())
            {
                *held.entry(self.ids[l.job].clone()).or_default() += 1;
            }
            let state = LocalState {
                waiting: &waiting,
                idle: cluster.free(),
                pending_placeholders: &pending,
                held: &held,
            };
            let plan = on_local_wait(state, &mut cluster.answered, (t * 1000.0) as u64, settle);
            cluster
                .launchers
                .retain(|l| !plan.withdraw.contains(&l.id.to_string()));
            for (job, slots) in plan.shrink {
                self.preempt(c, &job, slots);
            }
        }
    }

    /// A runner's shrink: its launchers on the cluster chosen by the
    /// preemption policy lose their task (it runs again later).
    fn preempt(&mut self, cluster: usize, job: &JobId, slots: u32) {
        let Some(j) = self.ids.iter().position(|id| id == job) else {
            return;
        };
        let t = self.t;
        let leave = t + self.scenario.timing.preempt_delay.as_secs_f64();
        let launchers = &mut self.clusters[cluster].launchers;
        let victims = victims(launchers, j, slots);
        for launcher in launchers
            .iter_mut()
            .filter(|l| victims.contains(&l.id.to_string()))
        {
            launcher.leaving_at = Some(leave);
            if launcher.task.take().is_some() {
                let sim = &mut self.jobs[j];
                sim.running -= 1;
                sim.unstarted += 1;
                sim.preemptions += 1;
            }
        }
    }

    fn scheduler_round(&mut self) {
        self.place_grid_jobs();
        if let Some(config) = self.policy {
            self.share(config);
        }
    }

    fn place_grid_jobs(&mut self) {
        let t = self.t;
        let waiting: Vec<usize> = (0..self.grid.len())
            .filter(|&i| self.grid[i].arrival <= t && !self.grid[i].placed)
            .collect();
        if waiting.is_empty() {
            return;
        }
        let jobs: Vec<GridJob> = waiting
            .iter()
            .map(|&i| GridJob {
                id: JobId::new("grid", i as u32),
                queue: self.grid[i].queue,
                components: self.grid[i].components.clone(),
            })
            .collect();
        let sites: Vec<Site> = self
            .clusters
            .iter()
            .map(|c| Site {
                name: c.name.clone(),
                free: c
                    .free()
                    .saturating_sub(c.grid_reserved())
                    .saturating_sub(c.local_waiting()),
                scavenged: c.held(&self.ids),
            })
            .collect();
        let placements = placement::place(&jobs, &sites, Weights::default());
        for (&g, job) in waiting.iter().zip(&jobs) {
            let Some(placed) = placements.iter().find(|p| p.job == job.id) else {
                let grid = &mut self.grid[g];
                grid.tries += 1;
                grid.queue = upgraded(grid.queue, grid.tries, UPGRADE_AFTER);
                continue;
            };
            for (cluster, slots) in &placed.reclaim {
                let c = self.cluster_index(cluster);
                let held = self.clusters[c].held(&self.ids);
                for (job, give) in split_shrink(*slots, &held) {
                    self.preempt(c, &job, give);
                }
            }
            for (component, cluster) in placed.clusters.iter().enumerate() {
                let c = self.cluster_index(cluster);
                self.clusters[c]
                    .grid_pending
                    .push((g, self.grid[g].components[component]));
            }
            self.grid[g].placed = true;
        }
    }

    fn cluster_index(&self, name: &str) -> usize {
        self.clusters
            .iter()
            .position(|c| c.name == name)
            .unwrap_or(0)
    }

    /// The CS policy's round: grows become launchers, drains drain.
    fn share(&mut self, config: PolicyConfig) {
        let t = self.t;
        let inputs: Vec<ClusterInput> = self
            .clusters
            .iter()
            .map(|c| ClusterInput {
                name: c.name.clone(),
                total: c.nodes,
                idle: c
                    .free()
                    .saturating_sub(c.grid_reserved())
                    .saturating_sub(c.local_waiting()),
                others: c.occupied() - c.launchers.len() as u32,
                held: c.held(&self.ids),
                excluded: false,
                draining: c
                    .launchers
                    .iter()
                    .filter(|l| l.draining)
                    .map(|l| self.ids[l.job].clone())
                    .collect(),
            })
            .collect();
        let jobs: Vec<JobInput> = self
            .jobs
            .iter()
            .enumerate()
            .map(|(j, job)| {
                let launchers: u64 = self
                    .clusters
                    .iter()
                    .map(|c| {
                        c.launchers
                            .iter()
                            .filter(|l| l.job == j && l.leaving_at.is_none() && !l.draining)
                            .count() as u64
                    })
                    .sum();
                let demand = (job.unstarted + job.running).saturating_sub(launchers);
                JobInput {
                    id: self.ids[j].clone(),
                    demand: u32::try_from(demand).unwrap_or(u32::MAX),
                }
            })
            .collect();
        let plan = share::plan(&inputs, &jobs, &config);
        let start = t + self.scenario.timing.launcher_start.as_secs_f64();
        for offer in plan.offers {
            let c = self.cluster_index(&offer.cluster);
            let Some(j) = self.ids.iter().position(|id| *id == offer.job) else {
                continue;
            };
            for _ in 0..offer.slots.min(self.clusters[c].free()) {
                self.next_launcher += 1;
                self.clusters[c].launchers.push(Launcher {
                    id: self.next_launcher,
                    job: j,
                    active_at: start,
                    task: None,
                    draining: false,
                    leaving_at: None,
                });
            }
        }
        for drain in plan.drains {
            let c = self.cluster_index(&drain.cluster);
            let Some(j) = self.ids.iter().position(|id| *id == drain.job) else {
                continue;
            };
            let launchers = &mut self.clusters[c].launchers;
            let victims = victims(launchers, j, drain.slots);
            for launcher in launchers
                .iter_mut()
                .filter(|l| victims.contains(&l.id.to_string()))
            {
                launcher.draining = true;
            }
        }
    }

    fn sample(&mut self) {
        let t = self.t;
        let mut sample = Sample {
            at: t,
            local: 0,
            grid: 0,
            scavenged: 0,
        };
        for c in &self.clusters {
            sample.local += c.local.iter().map(|(n, _)| n).sum::<u32>();
            sample.grid += c.grid.iter().map(|(n, _)| n).sum::<u32>();
            sample.scavenged += c
                .launchers
                .iter()
                .filter(|l| l.active_at <= t && l.leaving_at.is_none())
                .count() as u32;
        }
        self.samples.push(sample);
    }

    fn into_run(self, end: f64) -> Run {
        let grid_waits = self
            .grid
            .iter()
            .enumerate()
            .filter(|(_, g)| g.started.len() == g.components.len())
            .map(|(i, g)| (i, g.started.iter().cloned().fold(0.0, f64::max) - g.arrival))
            .collect();
        Run {
            policy: self.policy.map(|p| p.policy),
            jobs: self
                .jobs
                .iter()
                .map(|j| JobResult {
                    name: j.name.clone(),
                    done: j.done,
                    throughput: j.done as f64 / end,
                    preemptions: j.preemptions,
                })
                .collect(),
            local_waits: self.local_waits,
            grid_waits,
            samples: self.samples,
            total_nodes: self.clusters.iter().map(|c| c.nodes).sum(),
        }
    }
}

/// The launchers of job `j` the runner's policy gives up to free `slots`
/// (among those still staying).
fn victims(launchers: &[Launcher], j: usize, slots: u32) -> BTreeSet<String> {
    let candidates = launchers
        .iter()
        .filter(|l| l.job == j && l.leaving_at.is_none() && !l.draining)
        .map(|l| Candidate {
            launcher: l.id.to_string(),
            slots: 1,
            newest_start: l.task.map(|(_, started)| (started * 1000.0) as u64),
        })
        .collect();
    choose_victims(candidates, slots).into_iter().collect()
}

/// The background grid jobs of the workload, at fixed moments per seed.
fn grid_arrivals(scenario: &Scenario) -> Vec<GridSim> {
    let g = &scenario.grid_jobs;
    if g.workload == GridWorkload::Free {
        return Vec::new();
    }
    let mut rng = StdRng::seed_from_u64(scenario.seed ^ 0x9e37_79b9_7f4a_7c15);
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
                arrival: p as f64 * period + offset,
                components: components.clone(),
                length: g.length.as_secs_f64(),
                queue: Priority::Low,
                tries: 0,
                placed: false,
                started: Vec::new(),
            }
        })
        .collect()
}

/// An exponentially distributed interval with the given rate (per second).
fn exponential(rng: &mut StdRng, rate: f64) -> f64 {
    if rate <= 0.0 {
        return f64::INFINITY;
    }
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    -u.ln() / rate
}
