//! One cluster's batch system: its nodes, its own users' jobs, grid job
//! components, and gleaner's placeholders with the launchers in them. It
//! runs what it is given and decides nothing for gleaner.

use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, Instant},
};

use gleaner_kcm_core::{
    core::{SpooledExit, SpooledStart},
    snapshot::{ComponentRun, Host, Placeholder, Snapshot, Timing},
};
use gleaner_launcher_core::LauncherSettings;
use gleaner_manifest::{JobId, Needs};
use gleaner_policy::{
    ect::{Discipline, NEVER_MS, Profile, Queued, schedule},
    local::WaitingJob,
};
use gleaner_protocol::{
    ClusterName, ControlMsg, HostSlots, LauncherId, LauncherInfo, LauncherMsg, Now, ResultMsg,
    TaskMsg, naming,
};
use rand::{RngExt, rngs::StdRng};

use crate::{
    launcher::{Launcher, Setup, World},
    scenario::{ClusterSpec, LocalJobs},
};

/// Whom the simulated batch system shows as the owner of gleaner's jobs:
/// it hands them over as gleaner's, with nothing for the kcm to judge.
pub const SIMULATED_ACCOUNT: &str = "simulated";

/// A job's tasks as the broker holds them, and what became of their runs.
#[derive(Debug)]
pub struct Tasks {
    /// The job's task queue: what its runner published, and what launchers
    /// gave back.
    pub queue: VecDeque<TaskMsg>,
    /// Runs lost to preemption (the task went back to the queue).
    pub preemptions: u64,
    /// Launchers told to drain.
    pub drains: u64,
    /// Work of one task on a node of speed 1 (s).
    pub work: f64,
    /// Its tasks save their state when preempted, and resume from it.
    pub checkpoints: bool,
    /// Work left of tasks that saved their state, by task.
    pub saved: std::collections::HashMap<u64, f64>,
    /// Work done by runs that ended without a result or a saved state (s
    /// on a node of speed 1).
    pub lost_work: f64,
    /// Draws the task a launcher gets, at random (KOALA-CS's Single task
    /// Launcher Pull); the queue's head without.
    pub pick: Option<StdRng>,
    /// The job's queues are gone: its runner is done with it.
    pub gone: bool,
}

impl Tasks {
    /// The task a launcher asking for work gets.
    pub fn take(&mut self) -> Option<TaskMsg> {
        match &mut self.pick {
            None => self.queue.pop_front(),
            Some(rng) if !self.queue.is_empty() => {
                let i = rng.random_range(0..self.queue.len());
                self.queue.swap_remove_back(i)
            }
            Some(_) => None,
        }
    }
}

pub struct LocalJob {
    pub id: String,
    pub nodes: u32,
    /// How long it runs, at most its walltime (on this cluster).
    pub duration: f64,
    /// The walltime it asked for (s): what the batch scheduler plans by.
    pub walltime: f64,
    pub arrived: f64,
    /// It wants GPU nodes only.
    pub gpu: bool,
}

/// A local job that runs.
struct Running {
    nodes: u32,
    end: f64,
    started: f64,
    /// When its walltime is up, as the batch scheduler plans.
    limit: f64,
    /// Of its nodes, those with a GPU.
    gpu_nodes: u32,
    /// It uses their GPUs.
    gpu: bool,
}

struct Component {
    batch_id: String,
    job: JobId,
    index: u32,
    nodes: u32,
    length: f64,
    /// Its walltime here (s; `INFINITY` without one).
    walltime: f64,
    submitted: f64,
    started: Option<f64>,
    /// When its job let it past the barrier: it runs `length` from then.
    released: Option<f64>,
    /// Of its nodes, those with a GPU (it uses no GPU).
    gpu_nodes: u32,
}

/// What happened in the batch system that others hear of.
#[derive(Debug, Default)]
pub struct Happenings {
    /// Messages launchers send their jobs' runners (by job index).
    pub to_runners: Vec<(usize, ControlMsg)>,
    /// Results of finished tasks, for their jobs' results queues.
    pub results: Vec<ResultMsg>,
    /// Local jobs started, with their waits.
    pub local_started: Vec<(String, f64)>,
    /// Grid components started: (job, component).
    pub components_started: Vec<(JobId, u32)>,
}

pub struct Batch {
    pub name: ClusterName,
    pub nodes: u32,
    /// Of the nodes, those with a GPU each.
    gpu_nodes: u32,
    /// The fraction of local jobs that want GPU nodes.
    gpu_share: f64,
    speed: f64,
    rng: StdRng,
    arrival_rate: f64,
    next_arrival: f64,
    next_local: u64,
    queue: VecDeque<LocalJob>,
    local: Vec<Running>,
    components: Vec<Component>,
    /// Exit statuses of the components that ended, until the kcm deletes
    /// them (the spool directory).
    spool: Vec<SpooledExit>,
    launchers: Vec<Launcher>,
    next_id: u64,
    /// How its launchers are set up.
    setup: Setup,
    /// Something changed since its last scheduling cycle (a job came or
    /// went, a node was freed): only then can a cycle start anything.
    changed: bool,
    /// How it orders its queue, by walltimes (seed 002); without one,
    /// grid components first and local jobs in order, as they fit.
    discipline: Option<Discipline>,
    /// Each running launcher dies at this rate (per second), drawn from
    /// `failures` (apart from `rng`: the background load stays the same).
    failure_rate: f64,
    failures: StdRng,
}

impl Batch {
    /// A cluster whose own jobs already use their share (a warm start),
    /// whose launchers are set up by `launchers` and die at `failures`'
    /// rate (per hour) and draws.
    pub fn new(
        spec: &ClusterSpec,
        local_jobs: &LocalJobs,
        launchers: (LauncherSettings, f64),
        mut rng: StdRng,
        failures: (f64, StdRng),
    ) -> Self {
        let (nodes, local_load) = (spec.nodes, spec.local_load);
        let mean_duration = local_jobs.duration.as_secs_f64();
        let [low, high] = local_jobs.nodes;
        let mean_nodes = f64::from(low + high) / 2.0;
        let arrival_rate = local_load * f64::from(nodes) / (mean_nodes * mean_duration.max(1.0));
        // Each job already running has an exponential (memoryless) time left.
        let target = (local_load * f64::from(nodes)).round() as u32;
        let plain = nodes - spec.gpu_nodes.min(nodes);
        let mut local = Vec::new();
        let mut used = 0;
        while used < target {
            let n = rng.random_range(low..=high).min(target - used).max(1);
            let end = exponential(&mut rng, 1.0 / mean_duration.max(1.0));
            local.push(Running {
                nodes: n,
                end,
                started: 0.0,
                limit: end,
                // Plain nodes first, as the batch system places them.
                gpu_nodes: (used + n).saturating_sub(plain).min(n),
                gpu: false,
            });
            used += n;
        }
        let next_arrival = exponential(&mut rng, arrival_rate);
        Self {
            name: spec.name.clone(),
            nodes,
            gpu_nodes: spec.gpu_nodes.min(nodes),
            gpu_share: local_jobs.gpu_share,
            speed: spec.speed,
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
            setup: Setup {
                cluster: spec.name.clone(),
                settings: launchers.0,
                exit_delay: launchers.1,
            },
            changed: true,
            discipline: spec.batch_scheduler,
            failure_rate: failures.0 / 3600.0,
            failures: failures.1,
        }
    }

    fn local_nodes(&self) -> u32 {
        self.local.iter().map(|r| r.nodes).sum()
    }

    fn grid_nodes(&self) -> u32 {
        self.components
            .iter()
            .filter(|c| c.started.is_some())
            .map(|c| c.nodes)
            .sum()
    }

    /// Free nodes: (without a GPU, with one).
    fn free(&self) -> (u32, u32) {
        let mut gpu_used = 0;
        let mut used = 0;
        for r in &self.local {
            used += r.nodes;
            gpu_used += r.gpu_nodes;
        }
        for c in self.components.iter().filter(|c| c.started.is_some()) {
            used += c.nodes;
            gpu_used += c.gpu_nodes;
        }
        for l in self.launchers.iter().filter(|l| l.dispatched.is_some()) {
            used += 1;
            gpu_used += u32::from(l.on_gpu_node);
        }
        let plain = self.nodes - self.gpu_nodes;
        (
            plain.saturating_sub(used - gpu_used),
            self.gpu_nodes.saturating_sub(gpu_used),
        )
    }

    /// GPUs no job or launcher that uses one holds (a node with a GPU may
    /// run a job that uses none).
    fn free_gpus(&self) -> u32 {
        let held = self
            .local
            .iter()
            .filter(|r| r.gpu)
            .map(|r| r.gpu_nodes)
            .sum::<u32>()
            + self
                .launchers
                .iter()
                .filter(|l| l.dispatched.is_some() && l.gpu)
                .count() as u32;
        self.gpu_nodes.saturating_sub(held)
    }

    /// Jobs end and launchers work up to `t` (`now`): their tasks end,
    /// their cores' time comes, they take the next task from their job's
    /// queue; those that left are gone once their placeholder ends, and
    /// those that die lose what they held.
    pub fn progress(&mut self, t: f64, now: Now, tasks: &mut [Tasks], out: &mut Happenings) {
        let before = self.occupants();
        self.local.retain(|r| r.end > t);
        let spool = &mut self.spool;
        self.components.retain(|c| match c.released {
            // Killed at its walltime, if its work is not done by then.
            Some(start) if start + c.length.min(c.walltime) <= t => {
                spool.push(SpooledExit {
                    job: c.job.clone(),
                    component: c.index,
                    exit_code: Some(0),
                    preempted: false,
                });
                false
            }
            _ => true,
        });
        let setup = &self.setup;
        let mut world = World {
            t,
            now,
            speed: self.speed,
            tasks,
            out,
        };
        self.launchers.retain_mut(|l| {
            if let Some((at, why)) = l.leaving
                && at <= t
            {
                world.out.to_runners.push(l.gone(&setup.cluster, why));
                return false;
            }
            if !l.runs() {
                return true;
            }
            // Dead without a word: the broker hands its tasks to other
            // launchers, its runner hears nothing, the batch system shows
            // its placeholder gone.
            if l.dies_at <= t {
                l.die(&mut world);
                return false;
            }
            l.progress(setup, &mut world);
            true
        });
        self.changed |= self.occupants() != before;
    }

    /// How many local jobs, components and placeholders it holds: when
    /// one goes, its nodes are free for the next scheduling cycle.
    fn occupants(&self) -> (usize, usize, usize) {
        (
            self.local.len(),
            self.components.len(),
            self.launchers.len(),
        )
    }

    /// When something next happens here by itself, after `clock`'s time:
    /// a local job ends or arrives, a component's run ends, a launcher's
    /// task ends, its core wakes up, it starts taking tasks, dies or its
    /// placeholder ends.
    pub fn next_event(&self, clock: &Clock) -> f64 {
        let arrival = match self.arrival_rate > 0.0 {
            true => self.next_arrival,
            false => f64::INFINITY,
        };
        let components = self
            .components
            .iter()
            .filter_map(|c| Some(c.released? + c.length.min(c.walltime)));
        let launchers = self
            .launchers
            .iter()
            .map(|l| l.next_event(self.speed, clock));
        self.local
            .iter()
            .map(|r| r.end)
            .chain(components)
            .chain(launchers)
            .fold(arrival, f64::min)
    }

    /// The cluster's own jobs that arrived by `t` join its queue.
    pub fn arrivals(&mut self, t: f64, local_nodes: [u32; 2], mean_duration: f64) {
        let [low, high] = local_nodes;
        while self.arrival_rate > 0.0 && self.next_arrival <= t {
            self.changed = true;
            let nodes = self.rng.random_range(low..=high).min(self.nodes);
            let duration = exponential(&mut self.rng, 1.0 / mean_duration);
            // Drawn only where some want GPUs: the other scenarios' jobs
            // stay as they were.
            let gpu = self.gpu_share > 0.0
                && self.gpu_nodes > 0
                && self.rng.random_range(0.0..1.0) < self.gpu_share;
            self.queue.push_back(LocalJob {
                id: format!("{}-{}", self.name, self.next_local),
                nodes: if gpu {
                    nodes.min(self.gpu_nodes)
                } else {
                    nodes
                },
                duration,
                walltime: duration,
                arrived: self.next_arrival,
                gpu,
            });
            self.next_local += 1;
            let gap = exponential(&mut self.rng, self.arrival_rate);
            self.next_arrival += gap;
        }
    }

    /// The batch system's scheduling cycle: grid components where they fit,
    /// then local jobs in order; gleaner's placeholders, submitted at the
    /// lowest priority, only when no other job waits.
    pub fn dispatch(&mut self, (t, now): (f64, Now), out: &mut Happenings) {
        if !std::mem::take(&mut self.changed) {
            return;
        }
        match self.discipline {
            Some(discipline) => self.dispatch_in_order(t, discipline, out),
            None => self.dispatch_components_first(t, out),
        }
        if !self.queue.is_empty() || self.components.iter().any(|c| c.started.is_none()) {
            return;
        }
        self.dispatch_launchers((t, now), out);
    }

    /// A batch scheduler's cycle over local jobs and grid components
    /// alike, in the order they came, by their walltimes: what starts now
    /// under `discipline` (placeholders are not in the plan: they take
    /// only nodes nothing waits for). GPUs are not told apart.
    fn dispatch_in_order(&mut self, t: f64, discipline: Discipline, out: &mut Happenings) {
        let ms = |s: f64| millis(s.max(0.0));
        let running = self
            .local
            .iter()
            .map(|r| (r.nodes, ms(r.limit - t)))
            .chain(
                self.components
                    .iter()
                    .filter_map(|c| Some((c.nodes, ms(c.started? + c.walltime - t)))),
            )
            .chain(
                self.launchers
                    .iter()
                    .filter(|l| l.dispatched.is_some())
                    .map(|_| (1, NEVER_MS)),
            );
        let profile = Profile::new(self.nodes, running);
        // Waiting: (arrival, local job index or component index).
        let mut waiting: Vec<(f64, Result<usize, usize>)> = self
            .queue
            .iter()
            .enumerate()
            .map(|(i, j)| (j.arrived, Ok(i)))
            .chain(
                self.components
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.started.is_none())
                    .map(|(i, c)| (c.submitted, Err(i))),
            )
            .collect();
        waiting.sort_by(|a, b| a.0.total_cmp(&b.0));
        let queued: Vec<Queued> = waiting
            .iter()
            .map(|(_, w)| match *w {
                Ok(i) => Queued {
                    slots: self.queue[i].nodes,
                    walltime: ms(self.queue[i].walltime),
                },
                Err(i) => Queued {
                    slots: self.components[i].nodes,
                    walltime: ms(self.components[i].walltime.min(1e12)),
                },
            })
            .collect();
        let plan = schedule(&profile, &queued, discipline);
        let mut started_local = Vec::new();
        for k in plan.start_now {
            match waiting[k].1 {
                Ok(i) => started_local.push(i),
                Err(i) => {
                    let c = &mut self.components[i];
                    c.started = Some(t);
                    out.components_started.push((c.job.clone(), c.index));
                }
            }
        }
        started_local.sort_unstable();
        for i in started_local.into_iter().rev() {
            let Some(job) = self.queue.remove(i) else {
                continue;
            };
            out.local_started.push((job.id, t - job.arrived));
            self.local.push(Running {
                nodes: job.nodes,
                // Killed at its walltime.
                end: t + job.duration.min(job.walltime),
                started: t,
                limit: t + job.walltime,
                gpu_nodes: 0,
                gpu: job.gpu,
            });
        }
    }

    /// Grid components where they fit, then local jobs in order.
    fn dispatch_components_first(&mut self, t: f64, out: &mut Happenings) {
        for i in 0..self.components.len() {
            let c = &self.components[i];
            if c.started.is_some() {
                continue;
            }
            if let Some(gpu_nodes) = place(self.free(), c.nodes, false) {
                out.components_started.push((c.job.clone(), c.index));
                self.components[i].started = Some(t);
                self.components[i].gpu_nodes = gpu_nodes;
            }
        }
        while let Some(head) = self.queue.front() {
            let Some(gpu_nodes) = place(self.free(), head.nodes, head.gpu) else {
                break;
            };
            let Some(job) = self.queue.pop_front() else {
                break;
            };
            out.local_started.push((job.id, t - job.arrived));
            self.local.push(Running {
                nodes: job.nodes,
                end: t + job.duration,
                started: t,
                limit: t + job.walltime,
                gpu_nodes,
                gpu: job.gpu,
            });
        }
    }

    /// Gleaner's placeholders, submitted at the lowest priority: on nodes
    /// nothing else waits for.
    fn dispatch_launchers(&mut self, (t, now): (f64, Now), out: &mut Happenings) {
        let mut free = self.free();
        for l in self.launchers.iter_mut().filter(|l| l.dispatched.is_none()) {
            let Some(gpu_nodes) = place(free, 1, l.gpu) else {
                if free == (0, 0) {
                    break;
                }
                continue;
            };
            l.on_gpu_node = gpu_nodes == 1;
            match l.on_gpu_node {
                true => free.1 -= 1,
                false => free.0 -= 1,
            }
            // The launcher announces itself as its placeholder starts, so
            // its runner knows every launcher that holds a node.
            let host = host_name(&self.name, l.on_gpu_node);
            l.start(&self.setup, host.clone(), t, now);
            l.dies_at = t + exponential(&mut self.failures, self.failure_rate);
            out.to_runners.push((
                l.job,
                ControlMsg::LauncherUp(LauncherInfo {
                    launcher: l.id.clone(),
                    cluster: self.name.clone(),
                    host,
                    slots: 1,
                    started_at: millis(t),
                    deadline: None,
                    heartbeat_ms: Some(self.setup.settings.heartbeat.as_millis() as u64),
                }),
            ));
        }
    }

    /// Queues one single-slot placeholder per slot for job `job` (index,
    /// id), on a GPU node if `gpu`; each takes its first task `start`
    /// after submission at the earliest.
    pub fn submit_launchers(
        &mut self,
        job: (usize, &JobId),
        slots: u32,
        gpu: bool,
        t: f64,
        start: f64,
    ) {
        self.changed = true;
        for _ in 0..slots {
            let batch_id = self.batch_id();
            let id = naming::launcher_id(&self.name, &batch_id);
            self.launchers.push(Launcher::queued(
                batch_id,
                id,
                (job.0, job.1.clone()),
                t + start,
                gpu,
            ));
        }
    }

    /// A component of `length` s of work and a walltime of `walltime` s
    /// on a node of speed 1, submitted at `t`.
    pub fn submit_component(
        &mut self,
        job: JobId,
        index: u32,
        nodes: u32,
        (length, walltime): (f64, Option<f64>),
        t: f64,
    ) {
        self.changed = true;
        let batch_id = self.batch_id();
        self.components.push(Component {
            batch_id,
            job,
            index,
            nodes,
            length: length / self.speed,
            walltime: walltime.map_or(f64::INFINITY, |w| w / self.speed),
            submitted: t,
            started: None,
            released: None,
            gpu_nodes: 0,
        });
    }

    /// Every component of the job started: this one runs now.
    pub fn release_component(&mut self, job: &JobId, index: u32, t: f64) {
        for c in &mut self.components {
            if &c.job == job && c.index == index && c.started.is_some() {
                c.released.get_or_insert(t);
            }
        }
    }

    /// A component stopped for a job of higher priority: its wrapper
    /// says so, and its nodes are free. Returns how long it had run past
    /// its barrier: work its checkpoint keeps.
    pub fn stop_component(&mut self, job: &JobId, index: u32, t: f64) -> Option<f64> {
        let at = self
            .components
            .iter()
            .position(|c| &c.job == job && c.index == index && c.started.is_some())?;
        self.changed = true;
        let stopped = self.components.remove(at);
        self.spool.push(SpooledExit {
            job: job.clone(),
            component: index,
            exit_code: None,
            preempted: true,
        });
        Some(stopped.released.map_or(0.0, |r| t - r))
    }

    /// A job of the cluster's own, from a workload.
    pub fn submit_local(&mut self, job: LocalJob) {
        self.changed = true;
        self.queue.push_back(job);
    }

    fn batch_id(&mut self) -> String {
        self.next_id += 1;
        self.next_id.to_string()
    }

    /// Removes placeholders and components by batch id (a running
    /// placeholder's launcher dies with its tasks, which go back to the
    /// queue, each counted as preempted; a removed component leaves no
    /// exit status).
    pub fn remove(
        &mut self,
        ids: &[String],
        (t, now): (f64, Now),
        tasks: &mut [Tasks],
        out: &mut Happenings,
    ) {
        self.changed = true;
        self.components.retain(|c| !ids.contains(&c.batch_id));
        let (speed, name) = (self.speed, &self.name);
        let mut world = World {
            t,
            now,
            speed,
            tasks,
            out,
        };
        self.launchers.retain_mut(|l| {
            if !ids.contains(&l.batch_id) {
                return true;
            }
            let stopped = l.die(&mut world);
            world.tasks[l.job].preemptions += stopped;
            if l.runs() {
                world.out.to_runners.push(l.gone(name, "removed"));
            }
            false
        });
    }

    /// A message on a running launcher's own queue.
    pub fn tell(
        &mut self,
        id: &LauncherId,
        message: LauncherMsg,
        (t, now): (f64, Now),
        tasks: &mut [Tasks],
        out: &mut Happenings,
    ) {
        let Some(l) = self.launchers.iter_mut().find(|l| &l.id == id && l.runs()) else {
            return;
        };
        let mut world = World {
            t,
            now,
            speed: self.speed,
            tasks,
            out,
        };
        l.message(message, &self.setup, &mut world);
    }

    /// Whether a launcher runs here, and so has a queue.
    pub fn has_launcher(&self, id: &LauncherId) -> bool {
        self.launchers.iter().any(|l| &l.id == id && l.runs())
    }

    /// A component's exit status, once its job has heard of it.
    pub fn delete_spool_entry(&mut self, job: &JobId, component: u32) {
        self.spool
            .retain(|exit| !(&exit.job == job && exit.component == component));
    }

    /// What the kcm reads: the batch system, the exit statuses in the
    /// spool, and the started components' hosts.
    pub fn read(&self, jobs: &[JobId]) -> (Snapshot, Vec<SpooledExit>, Vec<SpooledStart>) {
        let limit = |walltime: f64| walltime.is_finite().then(|| millis(walltime));
        // The cluster is one host of its plain nodes, and one of its GPU
        // nodes if it has any: DAS-3's jobs take whole nodes, any of
        // them, so no waiting job needs a particular one.
        let on_gpu = |nodes: u32, gpu_nodes: u32, gpu_host: bool| match gpu_host {
            true => gpu_nodes,
            false => nodes - gpu_nodes,
        };
        let host = |gpu_host: bool, slots: u32| Host {
            local: self
                .local
                .iter()
                .map(|r| on_gpu(r.nodes, r.gpu_nodes, gpu_host))
                .sum(),
            grid: self
                .components
                .iter()
                .filter(|c| c.started.is_some())
                .map(|c| on_gpu(c.nodes, c.gpu_nodes, gpu_host))
                .sum(),
            free_gpus: gpu_host.then(|| self.free_gpus()),
            ..Host::new(host_name(&self.name, gpu_host), slots)
        };
        let mut hosts = vec![host(false, self.nodes - self.gpu_nodes)];
        if self.gpu_nodes > 0 {
            hosts.push(host(true, self.gpu_nodes));
        }
        let snapshot = Snapshot {
            hosts,
            waiting: self
                .queue
                .iter()
                .map(|j| WaitingJob {
                    needs: Needs {
                        memory_mb: 0,
                        gpus: if j.gpu { j.nodes } else { 0 },
                    },
                    ..WaitingJob::anywhere(j.id.clone(), j.nodes)
                })
                .collect(),
            placeholders: self
                .launchers
                .iter()
                .map(|l| Placeholder {
                    id: l.batch_id.clone(),
                    job: jobs[l.job].clone(),
                    slots: 1,
                    host: l.dispatched.map(|_| host_name(&self.name, l.on_gpu_node)),
                    owner: SIMULATED_ACCOUNT.to_owned(),
                    needs: Needs {
                        memory_mb: 0,
                        gpus: u32::from(l.gpu),
                    },
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
                    owner: SIMULATED_ACCOUNT.to_owned(),
                    timing: Timing {
                        slots: c.nodes,
                        running: c.started.is_some(),
                        limit_ms: limit(c.walltime),
                        start: c.started.map(millis),
                    },
                })
                .collect(),
            // The simulated batch system knows gleaner's jobs as its own.
            named: Vec::new(),
            problem: None,
            // Its placeholders start only while nothing else waits, never
            // by backfill: no standings, so the kcm withdraws them for
            // waiting jobs.
            standings: BTreeMap::new(),
            placeholder_tier: None,
            // What the batch scheduler plans by, where it orders its queue.
            timing: match self.discipline {
                Some(_) => self
                    .local
                    .iter()
                    .map(|r| Timing {
                        slots: r.nodes,
                        running: true,
                        limit_ms: limit(r.limit - r.started),
                        start: Some(millis(r.started)),
                    })
                    .chain(self.queue.iter().map(|j| Timing {
                        slots: j.nodes,
                        running: false,
                        limit_ms: limit(j.walltime),
                        start: None,
                    }))
                    .collect(),
                None => Vec::new(),
            },
        };
        let started = self
            .components
            .iter()
            .filter(|c| c.started.is_some())
            .map(|c| SpooledStart {
                job: c.job.clone(),
                component: c.index,
                hosts: Ok(vec![HostSlots {
                    host: host_name(&self.name, false),
                    slots: c.nodes,
                }]),
            })
            .collect();
        (snapshot, self.spool.clone(), started)
    }

    /// Nodes in use: (local, grid, launchers at work).
    pub fn load(&self, t: f64) -> (u32, u32, u32) {
        let scavenged = self.launchers.iter().filter(|l| l.at_work(t)).count() as u32;
        (self.local_nodes(), self.grid_nodes(), scavenged)
    }
}

/// Where `nodes` nodes of a job go among `free` (plain, GPU) nodes: GPU
/// nodes only for a job that uses GPUs, plain nodes first for others. How
/// many of them have a GPU; `None` if they do not fit.
fn place(free: (u32, u32), nodes: u32, gpu: bool) -> Option<u32> {
    let (plain, gpus) = free;
    match gpu {
        true => (gpus >= nodes).then_some(nodes),
        false => (plain + gpus >= nodes).then(|| nodes.saturating_sub(plain)),
    }
}

/// A cluster's host: its plain nodes under its own name, its GPU nodes
/// under `<name>-gpu`.
fn host_name(cluster: &ClusterName, gpu: bool) -> String {
    match gpu {
        true => format!("{cluster}-gpu"),
        false => cluster.to_string(),
    }
}

/// Simulated time: seconds since the start, read as the `Instant` the
/// scheduler and the kcms take (an arbitrary base plus the simulated time;
/// they only ever compare instants) and as wire milliseconds.
pub struct Clock {
    base: Instant,
    pub t: f64,
}

impl Clock {
    /// Time 0.
    pub fn start() -> Self {
        Self {
            base: Instant::now(),
            t: 0.0,
        }
    }

    pub fn now(&self) -> Now {
        Now {
            instant: self.base + Duration::from_secs_f64(self.t),
            wall_ms: millis(self.t),
        }
    }

    /// An instant a core named, in simulated seconds, rounded up to the
    /// microsecond: at that time it is due.
    pub fn seconds(&self, at: Instant) -> f64 {
        let nanos = at.saturating_duration_since(self.base).as_nanos();
        nanos.div_ceil(1000) as f64 / 1e6
    }

    /// Moves on to `t`, or a microsecond on if `t` is not later (what was
    /// due there and did not happen, for a rounding, happens then).
    pub fn advance_to(&mut self, t: f64) {
        self.t = match t > self.t {
            true => t,
            false => self.t + 1e-6,
        };
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

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn tasks(count: u64, pick: Option<StdRng>) -> Tasks {
        let job: JobId = "sweep-0000000000000000".parse().unwrap();
        Tasks {
            queue: (0..count)
                .map(|task| TaskMsg {
                    job: job.clone(),
                    task,
                    attempt: 1,
                    preemptions: 0,
                    command: format!("task {task}"),
                    env: Vec::new(),
                    walltime_ms: None,
                    outputs: Vec::new(),
                    workdir: None,
                    preempt_signal: None,
                    preempt_grace_ms: None,
                    max_attempts: 0,
                    shape: None,
                })
                .collect(),
            preemptions: 0,
            drains: 0,
            work: 60.0,
            checkpoints: false,
            saved: Default::default(),
            lost_work: 0.0,
            pick,
            gone: false,
        }
    }

    fn order(mut tasks: Tasks) -> Vec<u64> {
        std::iter::from_fn(|| tasks.take())
            .map(|t| t.task)
            .collect()
    }

    #[test]
    fn a_launcher_gets_the_queue_head_or_any_waiting_task() {
        assert_eq!(order(tasks(5, None)), [0, 1, 2, 3, 4]);
        let random = |seed| order(tasks(50, Some(StdRng::seed_from_u64(seed))));
        let drawn = random(7);
        assert_eq!(drawn, random(7), "by seed");
        assert_ne!(drawn, (0..50).collect::<Vec<_>>());
        let mut all = drawn.clone();
        all.sort();
        assert_eq!(all, (0..50).collect::<Vec<_>>(), "each once");
    }

    #[test]
    fn a_failing_launcher_dies_without_a_word_and_its_task_waits_again() {
        let spec = ClusterSpec {
            name: "c".into(),
            nodes: 4,
            speed: 1.0,
            local_load: 0.0,
            gpu_nodes: 0,
            batch_scheduler: None,
        };
        // Once in 10 s on average: dead within the minute, mid-task.
        let failing = (360.0, StdRng::seed_from_u64(3));
        let mut batch = Batch::new(
            &spec,
            &LocalJobs::default(),
            (
                LauncherSettings {
                    heartbeat: Duration::from_secs(5),
                    ..LauncherSettings::default()
                },
                1.0,
            ),
            StdRng::seed_from_u64(0),
            failing,
        );
        let mut jobs = [tasks(3, None)];
        let job: JobId = "sweep-0000000000000000".parse().unwrap();
        batch.submit_launchers((0, &job), 1, false, 0.0, 0.0);
        let mut out = Happenings::default();
        let mut clock = Clock::start();
        batch.dispatch((0.0, clock.now()), &mut out);
        assert!(matches!(
            out.to_runners[..],
            [(0, ControlMsg::LauncherUp(_))]
        ));
        let mut said = Vec::new();
        while batch.load(clock.t).2 == 1 && clock.t < 60.0 {
            clock.t += 1.0;
            let mut out = Happenings::default();
            batch.progress(clock.t, clock.now(), &mut jobs, &mut out);
            said.extend(out.to_runners);
        }
        let t = clock.t;
        assert_eq!(batch.load(t).2, 0, "dead by {t} s");
        assert!(t > 2.0, "it ran its task for a while first: {t} s");
        assert!(
            said.iter()
                .all(|(_, m)| matches!(m, ControlMsg::LauncherStatus(_))),
            "no goodbye: {said:?}"
        );
        assert_eq!(jobs[0].queue.len(), 3, "its task waits again");
        assert_eq!(jobs[0].preemptions, 0, "a failure, not a preemption");
        assert!(jobs[0].lost_work > 0.0);
        let (snapshot, ..) = batch.read(&["sweep-0000000000000000".parse().unwrap()]);
        assert!(snapshot.placeholders.is_empty(), "its placeholder is gone");
    }

    /// A cluster of one node of `speed`, nothing of its own, whose one
    /// launcher of the job in `jobs` has started.
    fn one_launcher(speed: f64) -> (Batch, Clock) {
        let spec = ClusterSpec {
            name: "c".into(),
            nodes: 1,
            speed,
            local_load: 0.0,
            gpu_nodes: 0,
            batch_scheduler: None,
        };
        let never = (0.0, StdRng::seed_from_u64(0));
        let setup = (LauncherSettings::default(), 1.0);
        let mut batch = Batch::new(
            &spec,
            &LocalJobs::default(),
            setup,
            StdRng::seed_from_u64(0),
            never,
        );
        let job: JobId = "sweep-0000000000000000".parse().unwrap();
        batch.submit_launchers((0, &job), 1, false, 0.0, 0.0);
        let clock = Clock::start();
        batch.dispatch((0.0, clock.now()), &mut Happenings::default());
        (batch, clock)
    }

    /// Steps of a second until `t`: what the launchers said and reported.
    fn run_until(batch: &mut Batch, clock: &mut Clock, jobs: &mut [Tasks], t: f64) -> Happenings {
        let mut all = Happenings::default();
        while clock.t < t {
            clock.t += 1.0;
            let mut out = Happenings::default();
            batch.progress(clock.t, clock.now(), jobs, &mut out);
            all.to_runners.extend(out.to_runners);
            all.results.extend(out.results);
        }
        all
    }

    fn goodbyes(out: &Happenings) -> Vec<String> {
        out.to_runners
            .iter()
            .filter_map(|(_, m)| match m {
                ControlMsg::LauncherGone { reason, .. } => Some(reason.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_launcher_runs_its_tasks_at_its_clusters_speed_then_leaves_idle() {
        let (mut batch, mut clock) = one_launcher(2.0);
        let mut jobs = [tasks(3, None)];
        let out = run_until(&mut batch, &mut clock, &mut jobs, 95.0);
        let runtimes: Vec<u64> = out.results.iter().map(|r| r.runtime_ms).collect();
        assert_eq!(
            runtimes, [30_000; 3],
            "60 s of work at speed 2, one after another"
        );
        assert!(
            out.to_runners
                .iter()
                .any(|(_, m)| matches!(m, ControlMsg::LauncherStatus(s) if s.running.len() == 1)),
            "it beats while it runs"
        );
        assert!(
            goodbyes(&out).is_empty(),
            "idle for less than its idle timeout"
        );
        let out = run_until(&mut batch, &mut clock, &mut jobs, 110.0);
        assert_eq!(goodbyes(&out), ["idle"]);
        assert_eq!(batch.load(clock.t), (0, 0, 0), "its node is free");
    }

    #[test]
    fn a_preempted_launcher_republishes_its_task_with_the_work_it_saved() {
        let (mut batch, mut clock) = one_launcher(1.0);
        let mut jobs = [tasks(1, None)];
        jobs[0].checkpoints = true;
        run_until(&mut batch, &mut clock, &mut jobs, 20.0);
        let id = batch.launchers[0].id.clone();
        let mut out = Happenings::default();
        let preempt = LauncherMsg::Preempt {
            reason: "test".to_owned(),
        };
        batch.tell(&id, preempt, (clock.t, clock.now()), &mut jobs, &mut out);
        let queued: Vec<(u64, u32)> = jobs[0]
            .queue
            .iter()
            .map(|t| (t.task, t.preemptions))
            .collect();
        assert_eq!(queued, [(0, 1)], "back in the queue, preempted once");
        assert_eq!(jobs[0].preemptions, 1);
        let saved = jobs[0].saved[&0];
        assert!(
            (39.0..=41.0).contains(&saved),
            "about 40 s of its 60 left: {saved}"
        );
        assert_eq!(jobs[0].lost_work, 0.0);
        let out = run_until(&mut batch, &mut clock, &mut jobs, 30.0);
        assert_eq!(goodbyes(&out), ["preempted"]);
        assert!(out.results.is_empty());
    }
}
