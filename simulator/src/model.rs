//! The simulated grid, stepped by a simulated clock. The scheduler is the
//! scheduler's own [`SchedulerCore`], each cluster's manager the kcm's own
//! [`KcmCore`] and each scavenging job's runner the runner's own machine;
//! they exchange the protocol's messages, and simulated batch systems run
//! the jobs.

use std::{
    collections::{BTreeMap, VecDeque},
    time::Duration,
};

use futures_util::FutureExt;
use gleaner_kcm_core::{
    core::{Core, CoreConfig, Event, KcmCore},
    io::carry_out,
};
use gleaner_manifest::{Component, JobId, JobKind, Manifest, Priority};
use gleaner_policy::{access::Users, share::CsPolicy};
use gleaner_protocol::{
    ClusterName, ControlMsg, GrantId, KcmMsg, LauncherId, LauncherMsg, ResultMsg, SchedulerMsg,
};
use gleaner_runner_core::{JobEvent, JobFile};
use gleaner_scheduler_core::{
    core::{Event as SchedulerEvent, Rounds, SchedulerCore},
    io as scheduler_io,
    state::State,
};
use rand::{RngExt, SeedableRng, rngs::StdRng};

mod arrivals;
mod shells;

use crate::{
    batch::{Batch, Clock, Happenings, LocalJob, Tasks},
    runner::{GridRunner, Reach, SweepRunner},
    scenario::{GridWorkload, Scenario, TaskChoice, draw, mix},
};
use arrivals::{grid_arrivals, grid_manifest, trace_arrivals};
use shells::{SimulatedKcm, SimulatedScheduler, launcher_mail};

/// A message on its way, by destination.
pub enum Mail {
    Scheduler(Box<SchedulerMsg>),
    Runner(JobId, ControlMsg),
    Kcm(ClusterName, KcmMsg),
    Launcher(LauncherId, LauncherMsg),
    /// On its job's results queue.
    Result(ResultMsg),
}

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
    /// How each grid job of KOALA's experiment was placed and started.
    pub grid_jobs: Vec<GridOutcome>,
    pub samples: Vec<Sample>,
    pub total_nodes: u32,
}

#[derive(Debug, Clone)]
pub struct JobResult {
    pub name: String,
    pub done: u64,
    /// Tasks per second over its own time in the system: from its
    /// submission ([`Self::started`]) to its end, or the run's.
    pub throughput: f64,
    /// When it was submitted (s into the run): its `start_after`; `None`
    /// if the run ended first.
    pub started: Option<f64>,
    /// When its runner was done with it (s into the run), if it was.
    pub ended: Option<f64>,
    /// When a kcm first queued a launcher for it (s into the run): it
    /// held no node before.
    pub first_launcher: Option<f64>,
    pub preemptions: u64,
    /// Launchers its runner gave up because their heartbeats stopped
    /// (KOALA-CS's launcher time-outs).
    pub timeouts: u64,
    /// Launchers told to drain for fair share.
    pub drains: u64,
    /// Node hours of runs thrown away by preemption (on nodes of speed 1).
    pub lost_hours: f64,
}

/// A grid job of KOALA's experiment (seed 001), as its `job.json` has it
/// at its end (or at the end of the run).
#[derive(Debug, Clone)]
pub struct GridOutcome {
    pub size: u32,
    pub components: usize,
    pub priority: Priority,
    /// Seconds from its submission (or its last run given up) to its
    /// last placement, and from that to its start (the barrier passed).
    pub placement_s: Option<f64>,
    pub start_delay_s: Option<f64>,
    /// Its components went to more than one cluster.
    pub coallocated: bool,
    pub claiming_tries: u32,
    /// Runs given up: lost, or not gathered in time.
    pub restarts: u32,
    /// Runs stopped for jobs of higher priority.
    pub preemptions: u32,
    /// It ran to its end.
    pub done: bool,
    /// Seconds from its submission to its end.
    pub makespan_s: Option<f64>,
    /// Times it moved to a cluster where it would complete earlier.
    pub moves: u32,
    /// When it was submitted (s into the run).
    pub arrival: f64,
}

/// Nodes in use at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at: f64,
    pub local: u32,
    pub grid: u32,
    pub scavenged: u32,
}

struct Cluster {
    batch: Batch,
    kcm: KcmCore,
}

struct GridSim {
    id: JobId,
    arrival: f64,
    components: Vec<u32>,
    length: f64,
    priority: Priority,
    registered: bool,
    started: Vec<f64>,
    /// Its `job.json` once its runner is done (or at the run's end).
    file: Option<JobFile>,
    /// Seconds of it done in runs stopped for jobs of higher priority.
    done: f64,
    /// Its requested walltime (a trace's), else its length and a margin.
    walltime: Option<f64>,
}

/// When a scavenging job came, went and first had a launcher queued.
#[derive(Debug, Clone, Copy, Default)]
struct JobTimes {
    started: Option<f64>,
    ended: Option<f64>,
    first_launcher: Option<f64>,
}

struct Sim<'a> {
    scenario: &'a Scenario,
    policy: Option<CsPolicy>,
    clock: Clock,
    scheduler: SchedulerCore,
    clusters: Vec<Cluster>,
    cluster_index: BTreeMap<ClusterName, usize>,
    ids: Vec<JobId>,
    tasks: Vec<Tasks>,
    /// The runners of the scavenging jobs, by job index, once submitted.
    sweeps: Vec<Option<SweepRunner>>,
    /// When each scavenging job was submitted, was done, and first had a
    /// launcher queued (s into the run).
    times: Vec<JobTimes>,
    grid: Vec<GridSim>,
    grid_index: BTreeMap<JobId, usize>,
    grid_runners: BTreeMap<JobId, GridRunner>,
    runner_settings: gleaner_runner_core::JobSettings,
    local_waits: BTreeMap<String, f64>,
    samples: Vec<Sample>,
    /// A trace's jobs for the clusters' own queues: when, which cluster.
    trace_locals: std::collections::VecDeque<(usize, LocalJob)>,
}

/// Runs a scenario under `policy`, or without scavenging jobs (`None`).
/// The cores log each decision as their services would (at `info`, which
/// `gleaner simulate` shows only when `RUST_LOG` asks for it).
pub fn simulate(scenario: &Scenario, policy: Option<CsPolicy>) -> Run {
    let mut sim = Sim::new(scenario, policy);
    let end = scenario.duration.as_secs_f64();
    let every = scenario.timing.sample.as_secs_f64();
    // Those submitted at once start before anything else, and register
    // before any cluster reports: no round gives the first of them every
    // idle slot before the others are known.
    sim.submit_sweeps();
    // Each kcm connects, and reads its batch system before any order.
    for c in 0..sim.clusters.len() {
        let mail = sim.at_kcm(c, Event::Connected);
        sim.deliver(mail);
    }
    // From one wake-up to the next, whoever's it is: nothing changes between.
    let mut next_sample = every;
    loop {
        let next = sim.next_wake_up().min(next_sample);
        if next > end {
            break;
        }
        sim.clock.advance_to(next);
        sim.progress();
        sim.arrivals();
        sim.dispatch();
        // Every core whose time has come: each kcm's reading, each
        // runner's report, the scheduler's round.
        sim.timeouts();
        // What the cores published is delivered at once, as the broker
        // does to launchers with room for it.
        sim.progress();
        if sim.clock.t >= next_sample {
            sim.sample();
            next_sample += every;
        }
    }
    sim.into_run(end)
}

impl<'a> Sim<'a> {
    fn new(scenario: &'a Scenario, policy: Option<CsPolicy>) -> Self {
        let local = &scenario.local_jobs;
        let clusters: Vec<Cluster> = scenario
            .clusters
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let rng = StdRng::seed_from_u64(
                    scenario.seed.wrapping_mul(1_000_003).wrapping_add(i as u64),
                );
                let failures = StdRng::seed_from_u64(mix(scenario.seed, draw::FAILURES, i as u64));
                Cluster {
                    batch: Batch::new(
                        spec,
                        local,
                        (
                            scenario.timing.launcher(),
                            scenario.timing.preempt_delay.as_secs_f64(),
                        ),
                        rng,
                        (scenario.choices.launcher_failures_per_hour, failures),
                    ),
                    kcm: KcmCore::new(CoreConfig {
                        backend: "simulated".to_owned(),
                        ..scenario.timing.kcm(spec)
                    }),
                }
            })
            .collect();
        let cluster_index = scenario
            .clusters
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        let jobs = if policy.is_some() {
            &scenario.jobs[..]
        } else {
            &[]
        };
        let ids: Vec<JobId> = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| JobId::new(&j.name, i as u64))
            .collect();
        let tasks = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| Tasks {
                queue: VecDeque::new(),
                preemptions: 0,
                drains: 0,
                work: j.task_duration.as_secs_f64(),
                checkpoints: j.checkpoints,
                saved: Default::default(),
                lost_work: 0.0,
                gone: false,
                pick: (scenario.choices.task == TaskChoice::Random)
                    .then(|| StdRng::seed_from_u64(mix(scenario.seed, draw::TASKS, i as u64))),
            })
            .collect();
        let clock = Clock::start();
        let runner_settings = scenario.timing.runner();
        // Each is opened when it is submitted (`start_after`).
        let sweeps = jobs.iter().map(|_| None).collect();
        let times = vec![JobTimes::default(); jobs.len()];
        let (grid, trace_locals) = match scenario.grid_jobs.workload {
            GridWorkload::Trace => trace_arrivals(scenario),
            _ => (grid_arrivals(scenario), Default::default()),
        };
        let grid_index = grid
            .iter()
            .enumerate()
            .map(|(i, g)| (g.id.clone(), i))
            .collect();
        let start = clock.now().instant;
        Self {
            scenario,
            policy,
            clock,
            scheduler: SchedulerCore::new(
                State::new(GrantId::new(1)),
                scenario.state_config(policy.unwrap_or_default()),
                Users::default(),
                "simulated".to_owned(),
                // Rounds when the core's clock says, as in the service:
                // every interval, and when a message hurries one, no
                // sooner than the service's least gap after the last.
                Rounds {
                    interval: scenario.timing.scheduler_round,
                    min_gap: gleaner_scheduler_core::SchedulerConfig::default().round_min_gap,
                },
                false,
                start,
            ),
            clusters,
            cluster_index,
            ids,
            tasks,
            sweeps,
            times,
            grid,
            grid_index,
            grid_runners: BTreeMap::new(),
            runner_settings,
            local_waits: BTreeMap::new(),
            samples: Vec::new(),
            trace_locals,
        }
    }

    /// When anything next happens: a core's wake-up, a batch system's
    /// event, a job's arrival.
    fn next_wake_up(&self) -> f64 {
        let clock = &self.clock;
        let at = |instant: Option<std::time::Instant>| {
            instant.map_or(f64::INFINITY, |i| clock.seconds(i))
        };
        let kcms = self.clusters.iter().map(|c| at(c.kcm.poll_timeout()));
        let batches = self.clusters.iter().map(|c| c.batch.next_event(clock));
        let sweeps = self.sweeps.iter().flatten().map(|r| at(r.poll_timeout()));
        let grids = self.grid_runners.values().map(|r| at(r.poll_timeout()));
        let submitted = self
            .scenario
            .jobs
            .iter()
            .zip(&self.times)
            .take(self.sweeps.len())
            .filter(|(_, times)| times.started.is_none())
            .map(|(spec, _)| spec.start_after.as_secs_f64());
        let arriving = self
            .grid
            .iter()
            .filter(|g| !g.registered)
            .map(|g| g.arrival);
        let trace = self.trace_locals.front().map(|(_, j)| j.arrived);
        kcms.chain(batches)
            .chain(sweeps)
            .chain(grids)
            .chain(submitted)
            .chain(arriving)
            .chain(trace)
            .fold(at(self.scheduler.poll_timeout()), f64::min)
    }

    /// Delivers mail, and the mail it causes, until there is none.
    fn deliver(&mut self, mail: Vec<Mail>) {
        let mut queue = VecDeque::from(mail);
        while let Some(next) = queue.pop_front() {
            let more = match next {
                Mail::Scheduler(message) => self.at_scheduler(*message),
                Mail::Runner(job, message) => self.at_runner(&job, message),
                Mail::Kcm(cluster, message) => match self.cluster_index.get(&cluster) {
                    Some(&c) => self.at_kcm(c, Event::Message(message)),
                    None => Vec::new(),
                },
                Mail::Launcher(launcher, message) => self.at_launcher(&launcher, message),
                Mail::Result(result) => match self.live_sweep(&result.job) {
                    Some(j) => self.at_sweep(j, |runner, now, reach| {
                        runner.handle(JobEvent::Results(vec![result]), now, reach)
                    }),
                    // Its results queue is gone.
                    None => Vec::new(),
                },
            };
            queue.extend(more);
        }
    }

    /// The scheduler's core takes a message as its service does; a round
    /// runs when the core says one is due.
    fn at_scheduler(&mut self, message: SchedulerMsg) -> Vec<Mail> {
        let now = self.clock.now();
        self.scheduler.handle(SchedulerEvent::Message(message), now);
        let mut mail = self.at_core(now);
        mail.extend(self.scheduler_timeout());
        mail
    }

    /// The scheduler's round, if its core says one is due.
    fn scheduler_timeout(&mut self) -> Vec<Mail> {
        let now = self.clock.now();
        if !gleaner_protocol::is_due(&self.scheduler, now) {
            return Vec::new();
        }
        self.scheduler.handle_timeout(now);
        self.at_core(now)
    }

    /// Carries out the scheduler core's effects with its service's loop:
    /// what it sends goes to the jobs' runners, a job whose control queue
    /// is gone is forgotten, and nothing was handed over before it became
    /// active.
    fn at_core(&mut self, now: gleaner_protocol::Now) -> Vec<Mail> {
        let mut io = SimulatedScheduler {
            now,
            live: |job: &JobId| {
                self.ids
                    .iter()
                    .position(|id| id == job)
                    .is_some_and(|j| self.sweeps[j].as_ref().is_some_and(SweepRunner::is_live))
                    || self.grid_runners.contains_key(job)
            },
            mail: Vec::new(),
        };
        match scheduler_io::carry_out(&mut self.scheduler, &mut io).now_or_never() {
            Some(Ok(_)) => {}
            Some(Err(never)) => match never {},
            None => tracing::error!("a simulated scheduler's effect did not end at once"),
        }
        io.mail
    }

    /// The index of a scavenging job whose queues exist.
    fn live_sweep(&self, job: &JobId) -> Option<usize> {
        self.ids
            .iter()
            .position(|id| id == job)
            .filter(|&j| self.sweeps[j].as_ref().is_some_and(SweepRunner::is_live))
    }

    /// The scavenging jobs whose `start_after` has come are submitted:
    /// each one's runner opens and starts, as `gleaner submit` has it.
    fn submit_sweeps(&mut self) {
        let (t, scenario) = (self.clock.t, self.scenario);
        for j in 0..self.sweeps.len() {
            let spec = &scenario.jobs[j];
            if self.times[j].started.is_some() || spec.start_after.as_secs_f64() > t {
                continue;
            }
            let settings = gleaner_runner_core::JobSettings {
                victims: scenario.choices.victims(scenario.seed, j),
                ..self.runner_settings.clone()
            };
            let runner = SweepRunner::open(self.ids[j].clone(), spec, settings, self.clock.now());
            self.sweeps[j] = Some(runner);
            self.times[j].started = Some(t);
            let mail = self.at_sweep(j, |runner, now, reach| {
                runner.handle(JobEvent::Start, now, reach)
            });
            self.deliver(mail);
        }
    }

    /// Hands the runner of scavenging job `j` an event, with what its
    /// effects reach: the job's task queue, and which queues exist.
    fn at_sweep(
        &mut self,
        j: usize,
        event: impl FnOnce(&mut SweepRunner, gleaner_runner_core::Now, &mut Reach<'_>) -> Vec<Mail>,
    ) -> Vec<Mail> {
        let now = self.clock.now();
        let Some(runner) = self.sweeps[j].as_mut() else {
            // Not submitted yet: nobody knows of it.
            return Vec::new();
        };
        let (clusters, index) = (&self.clusters, &self.cluster_index);
        let kcm = |cluster: &ClusterName| index.contains_key(cluster);
        let launcher = |id: &LauncherId| clusters.iter().any(|c| c.batch.has_launcher(id));
        let mut reach = Reach {
            queue: &mut self.tasks[j].queue,
            kcm: &kcm,
            launcher: &launcher,
        };
        let mail = event(runner, now, &mut reach);
        if !runner.is_live() {
            self.tasks[j].gone = true;
            if self.times[j].ended.is_none() {
                self.times[j].ended = Some(self.clock.t);
            }
        }
        mail
    }

    fn at_runner(&mut self, job: &JobId, message: ControlMsg) -> Vec<Mail> {
        if let Some(j) = self.live_sweep(job) {
            return self.at_sweep(j, |runner, now, reach| {
                runner.handle(
                    JobEvent::Control {
                        msg: message,
                        sender: Some(crate::runner::SENDER.to_owned()),
                    },
                    now,
                    reach,
                )
            });
        }
        self.at_grid(job, |runner, now, reach| {
            runner.handle(
                JobEvent::Control {
                    msg: message,
                    sender: Some(crate::runner::SENDER.to_owned()),
                },
                now,
                reach,
            )
        })
    }

    /// Hands a grid job's runner an event; a runner done is forgotten, its
    /// `job.json` kept for the figures.
    fn at_grid(
        &mut self,
        job: &JobId,
        event: impl FnOnce(&mut GridRunner, gleaner_runner_core::Now, &mut Reach<'_>) -> Vec<Mail>,
    ) -> Vec<Mail> {
        let now = self.clock.now();
        let Some(runner) = self.grid_runners.get_mut(job) else {
            return Vec::new();
        };
        let index = &self.cluster_index;
        let kcm = |cluster: &ClusterName| index.contains_key(cluster);
        let mut none = VecDeque::new();
        let mut reach = Reach {
            queue: &mut none,
            kcm: &kcm,
            launcher: &|_| false,
        };
        let mail = event(runner, now, &mut reach);
        if !runner.is_live() {
            if let Some(&g) = self.grid_index.get(job) {
                self.grid[g].file = Some(runner.job_file());
            }
            self.grid_runners.remove(job);
        }
        mail
    }

    /// A launcher's queue gets a message (if the launcher runs).
    fn at_launcher(&mut self, launcher: &LauncherId, message: LauncherMsg) -> Vec<Mail> {
        let Some(c) = self
            .clusters
            .iter()
            .position(|c| c.batch.has_launcher(launcher))
        else {
            return Vec::new();
        };
        let mut out = Happenings::default();
        let at = (self.clock.t, self.clock.now());
        self.clusters[c]
            .batch
            .tell(launcher, message, at, &mut self.tasks, &mut out);
        self.launcher_mail(out)
    }

    /// Hands the kcm of cluster `c` a message, as the kcm's shell does:
    /// its effects, then a poll if it asked for one.
    fn at_kcm(&mut self, c: usize, event: Event) -> Vec<Mail> {
        let span = self.kcm_span(c);
        let _in_kcm = span.enter();
        self.clusters[c].kcm.handle(event, self.clock.now());
        self.kcm_effects(c)
    }

    /// The kcm's effects, and the reading they ask for.
    fn kcm_effects(&mut self, c: usize) -> Vec<Mail> {
        let (mut mail, poll_now) = self.apply(c);
        if poll_now {
            mail.extend(self.poll(c));
        }
        mail
    }

    /// The kcm of cluster `c` reads its batch system and the spool, then
    /// reports (in its caller's kcm span).
    fn poll(&mut self, c: usize) -> Vec<Mail> {
        let (snapshot, spooled, started) = self.clusters[c].batch.read(&self.ids);
        let event = Event::Polled {
            snapshot: Ok(snapshot),
            spooled,
            started,
        };
        self.clusters[c].kcm.handle(event, self.clock.now());
        self.apply(c).0
    }

    /// The span a kcm logs in, as its service's.
    fn kcm_span(&self, c: usize) -> tracing::Span {
        tracing::error_span!("kcm", cluster = %self.scenario.clusters[c].name)
    }

    /// Carries out the kcm's effects on the simulated batch system with
    /// the kcm's own loop, each command's outcome handed back at once;
    /// `true` when the kcm asked for a poll.
    fn apply(&mut self, c: usize) -> (Vec<Mail>, bool) {
        let mut mail = Vec::new();
        let Cluster { batch, kcm } = &mut self.clusters[c];
        let mut io = SimulatedKcm {
            clock: &self.clock,
            batch,
            tasks: &mut self.tasks,
            ids: &self.ids,
            times: &mut self.times,
            grid: &mut self.grid,
            grid_index: &self.grid_index,
            launcher_start: self.scenario.timing.launcher_start.as_secs_f64(),
            mail: &mut mail,
        };
        let poll_now = match carry_out(kcm, &mut io).now_or_never() {
            Some(Ok(poll_now)) => poll_now,
            Some(Err(never)) => match never {},
            None => {
                tracing::error!("a simulated command did not end at once; its effects are lost");
                false
            }
        };
        (mail, poll_now)
    }

    fn launcher_mail(&self, out: Happenings) -> Vec<Mail> {
        launcher_mail(&self.ids, out)
    }

    /// Jobs end and launchers work up to now.
    fn progress(&mut self) {
        let (t, now) = (self.clock.t, self.clock.now());
        let mut out = Happenings::default();
        for cluster in &mut self.clusters {
            cluster.batch.progress(t, now, &mut self.tasks, &mut out);
        }
        let mail = self.launcher_mail(out);
        self.deliver(mail);
    }

    /// Local jobs join their cluster's queue; grid jobs register with the
    /// scheduler; scavenging jobs whose time has come are submitted.
    fn arrivals(&mut self) {
        let t = self.clock.t;
        while self
            .trace_locals
            .front()
            .is_some_and(|(_, j)| j.arrived <= t)
        {
            if let Some((c, job)) = self.trace_locals.pop_front() {
                self.clusters[c].batch.submit_local(job);
            }
        }
        let local = &self.scenario.local_jobs;
        for cluster in &mut self.clusters {
            cluster
                .batch
                .arrivals(t, local.nodes, local.duration.as_secs_f64());
        }
        let arrived: Vec<JobId> = self
            .grid
            .iter_mut()
            .filter(|g| g.arrival <= t && !g.registered)
            .map(|g| {
                g.registered = true;
                g.id.clone()
            })
            .collect();
        for job in arrived {
            let Some(&g) = self.grid_index.get(&job) else {
                continue;
            };
            let manifest = grid_manifest(&self.grid[g], &self.scenario.grid_jobs);
            let runner = GridRunner::open(
                job.clone(),
                manifest,
                self.runner_settings.clone(),
                self.clock.now(),
            );
            self.grid_runners.insert(job.clone(), runner);
            let mail = self.at_grid(&job, |runner, now, reach| {
                runner.handle(JobEvent::Start, now, reach)
            });
            self.deliver(mail);
        }
        self.submit_sweeps();
    }

    fn dispatch(&mut self) {
        let (t, now) = (self.clock.t, self.clock.now());
        let mut out = Happenings::default();
        for cluster in &mut self.clusters {
            cluster.batch.dispatch((t, now), &mut out);
        }
        self.local_waits
            .extend(std::mem::take(&mut out.local_started));
        for (job, _) in std::mem::take(&mut out.components_started) {
            if let Some(&g) = self.grid_index.get(&job) {
                self.grid[g].started.push(t);
            }
        }
        let mail = self.launcher_mail(out);
        self.deliver(mail);
    }

    /// The time event of every core whose wake-up has come: each kcm's
    /// reading, each runner's report, then the scheduler's round.
    fn timeouts(&mut self) {
        let now = self.clock.now();
        for c in 0..self.clusters.len() {
            if gleaner_protocol::is_due(&self.clusters[c].kcm, now) {
                let span = self.kcm_span(c);
                let _in_kcm = span.enter();
                self.clusters[c].kcm.handle_timeout(now);
                let mail = self.kcm_effects(c);
                self.deliver(mail);
            }
        }
        let mut mail = Vec::new();
        for j in 0..self.sweeps.len() {
            if self.sweeps[j].as_ref().is_some_and(SweepRunner::is_live) {
                mail.extend(self.at_sweep(j, SweepRunner::handle_timeout));
            }
        }
        let grid: Vec<JobId> = self.grid_runners.keys().cloned().collect();
        for job in grid {
            mail.extend(self.at_grid(&job, GridRunner::handle_timeout));
        }
        self.deliver(mail);
        let mail = self.scheduler_timeout();
        self.deliver(mail);
    }

    fn sample(&mut self) {
        let t = self.clock.t;
        let mut sample = Sample {
            at: t,
            local: 0,
            grid: 0,
            scavenged: 0,
        };
        for c in &self.clusters {
            let (local, grid, scavenged) = c.batch.load(t);
            sample.local += local;
            sample.grid += grid;
            sample.scavenged += scavenged;
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
        let grid_jobs = self
            .grid
            .iter()
            .filter(|_| {
                matches!(
                    self.scenario.grid_jobs.workload,
                    GridWorkload::Poisson | GridWorkload::Trace
                )
            })
            .map(|g| {
                let file = g
                    .file
                    .clone()
                    .or_else(|| self.grid_runners.get(&g.id).map(GridRunner::job_file));
                let gathering = file
                    .as_ref()
                    .and_then(|f| f.gathering.as_ref())
                    .map(|g| g.figures.clone())
                    .unwrap_or_default();
                let clusters: std::collections::BTreeSet<&ClusterName> = file
                    .iter()
                    .flat_map(|f| f.components.iter().flatten())
                    .collect();
                GridOutcome {
                    size: g.components.iter().sum(),
                    components: g.components.len(),
                    priority: g.priority,
                    placement_s: gathering.placement_s,
                    start_delay_s: gathering.start_delay_s,
                    coallocated: clusters.len() > 1,
                    claiming_tries: gathering.claiming_tries,
                    restarts: file.as_ref().map_or(0, |f| f.restarts),
                    preemptions: gathering.preemptions,
                    done: file
                        .as_ref()
                        .is_some_and(|f| f.tasks.succeeded == g.components.len() as u64),
                    makespan_s: file.as_ref().and_then(|f| f.makespan_s),
                    moves: gathering.moves,
                    arrival: g.arrival,
                }
            })
            .collect();
        Run {
            grid_jobs,
            policy: self.policy,
            jobs: self
                .scenario
                .jobs
                .iter()
                .zip(self.tasks.iter().zip(&self.sweeps).zip(&self.times))
                .map(|(spec, ((tasks, runner), times))| {
                    let done = runner.as_ref().map_or(0, SweepRunner::done);
                    // Its own time in the system: none if never submitted.
                    let span = times
                        .started
                        .map_or(0.0, |from| times.ended.unwrap_or(end) - from);
                    JobResult {
                        name: spec.name.clone(),
                        done,
                        throughput: match span > 0.0 {
                            true => done as f64 / span,
                            false => 0.0,
                        },
                        started: times.started,
                        ended: times.ended,
                        first_launcher: times.first_launcher,
                        preemptions: tasks.preemptions,
                        timeouts: runner.as_ref().map_or(0, SweepRunner::timeouts),
                        drains: tasks.drains,
                        lost_hours: tasks.lost_work / 3600.0,
                    }
                })
                .collect(),
            local_waits: self.local_waits,
            grid_waits,
            samples: self.samples,
            total_nodes: self.clusters.iter().map(|c| c.batch.nodes).sum(),
        }
    }
}
