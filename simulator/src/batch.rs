//! One cluster's batch system: its nodes, its own users' jobs, grid job
//! components, and gleaner's placeholders with the launchers in them. It
//! runs what it is given and decides nothing for gleaner.

use std::collections::VecDeque;

use gleaner_kcm::{ComponentRun, Placeholder, Snapshot, core::SpooledExit};
use gleaner_manifest::JobId;
use gleaner_policy::local::WaitingJob;
use gleaner_protocol::{
    ClusterName, ControlMsg, LauncherId, LauncherInfo, LauncherStatus, RunningTask, naming,
};
use rand::{RngExt, rngs::StdRng};

/// A job's tasks as the broker and its runner see them.
#[derive(Debug, Clone)]
pub struct Tasks {
    pub total: u64,
    /// In the task queue (never started, or republished after a preemption).
    pub queued: u64,
    pub running: u64,
    pub done: u64,
    /// Runs lost to preemption (the task went back to the queue).
    pub preemptions: u64,
    /// Launchers told to drain.
    pub drains: u64,
    /// Work of one task on a node of speed 1 (s).
    pub work: f64,
}

struct LocalJob {
    id: String,
    nodes: u32,
    duration: f64,
    arrived: f64,
}

struct Component {
    batch_id: String,
    job: JobId,
    index: u32,
    nodes: u32,
    length: f64,
    started: Option<f64>,
}

/// A placeholder and the launcher it runs once the batch system starts it.
struct Launcher {
    /// The placeholder's id in the batch system.
    batch_id: String,
    /// The launcher's own id.
    id: LauncherId,
    job: usize,
    /// When the batch system started the placeholder (it holds a node).
    dispatched: Option<f64>,
    /// When it takes its first task.
    first_task: f64,
    /// Work left and start of its task.
    task: Option<(f64, f64)>,
    draining: bool,
    /// Preempted or drained while idle: its node is free from then on.
    leaving_at: Option<f64>,
    completed: u64,
}

/// What happened in the batch system that others hear of.
#[derive(Debug, Default)]
pub struct Happenings {
    /// Messages launchers send their jobs' runners (by job index).
    pub to_runners: Vec<(usize, ControlMsg)>,
    /// Local jobs started, with their waits.
    pub local_started: Vec<(String, f64)>,
    /// Grid components started: (job, component).
    pub components_started: Vec<(JobId, u32)>,
}

pub struct Batch {
    pub name: ClusterName,
    pub nodes: u32,
    speed: f64,
    rng: StdRng,
    arrival_rate: f64,
    next_arrival: f64,
    next_local: u64,
    queue: VecDeque<LocalJob>,
    /// Running local jobs: (nodes, end).
    local: Vec<(u32, f64)>,
    components: Vec<Component>,
    /// Exit statuses of the components that ended, until the kcm deletes
    /// them (the spool directory).
    spool: Vec<SpooledExit>,
    launchers: Vec<Launcher>,
    next_id: u64,
}

impl Batch {
    /// A cluster whose own jobs already use their share (a warm start).
    pub fn new(
        name: &ClusterName,
        nodes: u32,
        speed: f64,
        local_load: f64,
        local_nodes: [u32; 2],
        mean_duration: f64,
        mut rng: StdRng,
    ) -> Self {
        let [low, high] = local_nodes;
        let mean_nodes = f64::from(low + high) / 2.0;
        let arrival_rate = local_load * f64::from(nodes) / (mean_nodes * mean_duration.max(1.0));
        // Each job already running has an exponential (memoryless) time left.
        let target = (local_load * f64::from(nodes)).round() as u32;
        let mut local = Vec::new();
        let mut used = 0;
        while used < target {
            let n = rng.random_range(low..=high).min(target - used).max(1);
            local.push((n, exponential(&mut rng, 1.0 / mean_duration.max(1.0))));
            used += n;
        }
        let next_arrival = exponential(&mut rng, arrival_rate);
        Self {
            name: name.clone(),
            nodes,
            speed,
            rng,
            arrival_rate,
            next_arrival,
            next_local: 0,
            queue: VecDeque::new(),
            local,
            components: Vec::new(),
            spool: Vec::new(),
            launchers: Vec::new(),
            next_id: 0,
        }
    }

    fn local_nodes(&self) -> u32 {
        self.local.iter().map(|(n, _)| n).sum()
    }

    fn grid_nodes(&self) -> u32 {
        self.components
            .iter()
            .filter(|c| c.started.is_some())
            .map(|c| c.nodes)
            .sum()
    }

    fn free(&self) -> u32 {
        let launchers = self
            .launchers
            .iter()
            .filter(|l| l.dispatched.is_some())
            .count() as u32;
        self.nodes
            .saturating_sub(self.local_nodes() + self.grid_nodes() + launchers)
    }

    /// Jobs end and launchers work for `dt` up to `t`; launchers that are
    /// done leave.
    pub fn progress(&mut self, t: f64, dt: f64, tasks: &mut [Tasks], out: &mut Happenings) {
        self.local.retain(|(_, end)| *end > t);
        let spool = &mut self.spool;
        self.components.retain(|c| match c.started {
            Some(start) if start + c.length <= t => {
                spool.push(SpooledExit {
                    job: c.job.clone(),
                    component: c.index,
                    exit_code: Some(0),
                });
                false
            }
            _ => true,
        });
        let name = &self.name;
        let speed = self.speed;
        self.launchers.retain_mut(|l| {
            let gone = |l: &Launcher, out: &mut Happenings, reason: &str| {
                out.to_runners.push((
                    l.job,
                    ControlMsg::LauncherGone {
                        launcher: l.id.clone(),
                        cluster: name.clone(),
                        reason: reason.to_owned(),
                    },
                ));
            };
            if l.leaving_at.is_some_and(|at| at <= t) {
                gone(l, out, "told to leave");
                return false;
            }
            if l.dispatched.is_none() || l.leaving_at.is_some() || l.first_task > t {
                return true;
            }
            let job = &mut tasks[l.job];
            if let Some((work, started)) = l.task {
                let left = work - speed * dt;
                if left > 0.0 {
                    l.task = Some((left, started));
                    return true;
                }
                l.task = None;
                l.completed += 1;
                job.running -= 1;
                job.done += 1;
            }
            if l.draining {
                gone(l, out, "drained");
                return false;
            }
            if job.queued == 0 {
                gone(l, out, "no tasks left");
                return false;
            }
            job.queued -= 1;
            job.running += 1;
            l.task = Some((job.work, t));
            out.to_runners.push((
                l.job,
                ControlMsg::LauncherStatus(LauncherStatus {
                    launcher: l.id.clone(),
                    cluster: name.clone(),
                    running: vec![RunningTask {
                        task: 0,
                        started_at: millis(t),
                    }],
                    completed: l.completed,
                }),
            ));
            true
        });
    }

    /// The cluster's own jobs that arrived by `t` join its queue.
    pub fn arrivals(&mut self, t: f64, local_nodes: [u32; 2], mean_duration: f64) {
        let [low, high] = local_nodes;
        while self.arrival_rate > 0.0 && self.next_arrival <= t {
            let nodes = self.rng.random_range(low..=high).min(self.nodes);
            let duration = exponential(&mut self.rng, 1.0 / mean_duration);
            self.queue.push_back(LocalJob {
                id: format!("{}-{}", self.name, self.next_local),
                nodes,
                duration,
                arrived: self.next_arrival,
            });
            self.next_local += 1;
            let gap = exponential(&mut self.rng, self.arrival_rate);
            self.next_arrival += gap;
        }
    }

    /// The batch system's scheduling cycle: grid components where they fit,
    /// then local jobs in order; gleaner's placeholders, submitted at the
    /// lowest priority, only when no other job waits.
    pub fn dispatch(&mut self, t: f64, out: &mut Happenings) {
        for i in 0..self.components.len() {
            let c = &self.components[i];
            if c.started.is_none() && self.free() >= c.nodes {
                out.components_started.push((c.job.clone(), c.index));
                self.components[i].started = Some(t);
            }
        }
        while let Some(head) = self.queue.front() {
            if self.free() < head.nodes {
                break;
            }
            let Some(job) = self.queue.pop_front() else {
                break;
            };
            out.local_started.push((job.id, t - job.arrived));
            self.local.push((job.nodes, t + job.duration));
        }
        if !self.queue.is_empty() || self.components.iter().any(|c| c.started.is_none()) {
            return;
        }
        let mut free = self.free();
        for l in self.launchers.iter_mut().filter(|l| l.dispatched.is_none()) {
            if free == 0 {
                break;
            }
            free -= 1;
            // The launcher announces itself as its placeholder starts, so
            // its runner knows every launcher that holds a node.
            l.dispatched = Some(t);
            l.first_task = l.first_task.max(t);
            out.to_runners.push((
                l.job,
                ControlMsg::LauncherUp(LauncherInfo {
                    launcher: l.id.clone(),
                    cluster: self.name.clone(),
                    host: String::new(),
                    slots: 1,
                    started_at: millis(t),
                    deadline: None,
                }),
            ));
        }
    }

    /// Queues one single-slot placeholder per slot; each takes its first
    /// task `start` after submission at the earliest.
    pub fn submit_launchers(&mut self, job: usize, slots: u32, t: f64, start: f64) {
        for _ in 0..slots {
            let batch_id = self.batch_id();
            self.launchers.push(Launcher {
                id: naming::launcher_id(&self.name, &batch_id),
                batch_id,
                job,
                dispatched: None,
                first_task: t + start,
                task: None,
                draining: false,
                leaving_at: None,
                completed: 0,
            });
        }
    }

    pub fn submit_component(&mut self, job: JobId, index: u32, nodes: u32, length: f64) {
        let batch_id = self.batch_id();
        self.components.push(Component {
            batch_id,
            job,
            index,
            nodes,
            length,
            started: None,
        });
    }

    fn batch_id(&mut self) -> String {
        self.next_id += 1;
        self.next_id.to_string()
    }

    /// Removes placeholders and components by batch id (a running
    /// placeholder's launcher dies with its task, which goes back to the
    /// queue; a removed component leaves no exit status).
    pub fn remove(&mut self, ids: &[String], tasks: &mut [Tasks], out: &mut Happenings) {
        self.components.retain(|c| !ids.contains(&c.batch_id));
        let name = &self.name;
        self.launchers.retain(|l| {
            if !ids.contains(&l.batch_id) {
                return true;
            }
            if l.task.is_some() {
                let job = &mut tasks[l.job];
                job.running -= 1;
                job.queued += 1;
                job.preemptions += 1;
            }
            if l.dispatched.is_some() {
                out.to_runners.push((
                    l.job,
                    ControlMsg::LauncherGone {
                        launcher: l.id.clone(),
                        cluster: name.clone(),
                        reason: "removed".to_owned(),
                    },
                ));
            }
            false
        });
    }

    /// A launcher told to preempt kills its task (which goes back to the
    /// queue) and is gone `delay` later.
    pub fn preempt(&mut self, id: &LauncherId, t: f64, delay: f64, tasks: &mut [Tasks]) {
        let Some(l) = self.launchers.iter_mut().find(|l| &l.id == id) else {
            return;
        };
        if l.leaving_at.is_some() {
            return;
        }
        if l.task.take().is_some() {
            let job = &mut tasks[l.job];
            job.running -= 1;
            job.queued += 1;
            job.preemptions += 1;
        }
        l.leaving_at = Some(t + delay);
    }

    /// A launcher told to drain finishes its task and leaves; an idle one
    /// is gone `delay` later.
    pub fn drain(&mut self, id: &LauncherId, t: f64, delay: f64, tasks: &mut [Tasks]) {
        let Some(l) = self.launchers.iter_mut().find(|l| &l.id == id) else {
            return;
        };
        if l.leaving_at.is_some() || l.draining {
            return;
        }
        tasks[l.job].drains += 1;
        l.draining = true;
        if l.task.is_none() {
            l.leaving_at = Some(t + delay);
        }
    }

    /// A component's exit status, once its job has heard of it.
    pub fn delete_spool_entry(&mut self, job: &JobId, component: u32) {
        self.spool
            .retain(|exit| !(&exit.job == job && exit.component == component));
    }

    /// What the kcm reads: the batch system, and the exit statuses in the
    /// spool.
    pub fn read(&self, jobs: &[JobId]) -> (Snapshot, Vec<SpooledExit>) {
        let snapshot = Snapshot {
            total_slots: self.nodes,
            local_running: self.local_nodes(),
            waiting: self
                .queue
                .iter()
                .map(|j| WaitingJob {
                    id: j.id.clone(),
                    slots: j.nodes,
                })
                .collect(),
            grid_running: self.grid_nodes(),
            placeholders: self
                .launchers
                .iter()
                .map(|l| Placeholder {
                    id: l.batch_id.clone(),
                    job: jobs[l.job].clone(),
                    slots: 1,
                    running: l.dispatched.is_some(),
                })
                .collect(),
            components: self
                .components
                .iter()
                .map(|c| ComponentRun {
                    id: c.batch_id.clone(),
                    job: c.job.clone(),
                    component: c.index,
                    slots: c.nodes,
                    running: c.started.is_some(),
                })
                .collect(),
            problem: None,
        };
        (snapshot, self.spool.clone())
    }

    /// Nodes in use: (local, grid, launchers at work).
    pub fn load(&self, t: f64) -> (u32, u32, u32) {
        let scavenged = self
            .launchers
            .iter()
            .filter(|l| l.dispatched.is_some() && l.first_task <= t && l.leaving_at.is_none())
            .count() as u32;
        (self.local_nodes(), self.grid_nodes(), scavenged)
    }
}

/// Simulated seconds as wire milliseconds.
pub fn millis(t: f64) -> u64 {
    (t * 1000.0).round() as u64
}

/// An exponentially distributed interval with the given rate (per second).
pub fn exponential(rng: &mut StdRng, rate: f64) -> f64 {
    if rate <= 0.0 {
        return f64::INFINITY;
    }
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    -u.ln() / rate
}
