//! The chaos suite: one long sweep over the replicated broker, on two local
//! clusters (`near` on this host, `far` with its launchers on a test host of
//! its own), while every kind of component is killed with SIGKILL at random,
//! again and again. The short run is a test, the long one a benchmark; both
//! check the same promises: every task ends exactly once and succeeds, no
//! cluster ever runs more tasks at once than its slots, and nothing of
//! gleaner or of a task is left running afterwards.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::fs::PermissionsExt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use rand::seq::{IndexedRandom, SliceRandom};

use crate::{BrokerCluster, Gleaner, Island, by_task, sweep};

/// A kind of fault the suite injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// The active scheduler, killed; it comes back as the standby.
    Scheduler,
    /// The runner that holds the job, killed; restarted.
    Runner,
    /// A cluster's kcm, killed; restarted.
    Kcm,
    /// A launcher that runs tasks, killed.
    Launcher,
    /// One node of the replicated broker, killed; started again 5 s later.
    BrokerNode,
    /// Every node of the broker stopped, then the cluster started again.
    BrokerRestart,
    /// The `far` cluster's host cut off from the broker (its traffic
    /// dropped) for 20 s.
    HostCut,
}

impl Fault {
    /// The faults the short run injects: each component's kind.
    pub const COMPONENTS: [Fault; 5] = [
        Fault::Scheduler,
        Fault::Runner,
        Fault::Kcm,
        Fault::Launcher,
        Fault::BrokerNode,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Scheduler => "scheduler killed",
            Fault::Runner => "runner killed",
            Fault::Kcm => "kcm killed",
            Fault::Launcher => "launcher killed",
            Fault::BrokerNode => "broker node lost",
            Fault::BrokerRestart => "whole broker restarted",
            Fault::HostCut => "launcher host cut off",
        }
    }
}

/// What a chaos run does.
#[derive(Debug, Clone)]
pub struct Plan {
    pub tasks: u32,
    /// How long each task runs.
    pub task_seconds: f64,
    /// The kinds of fault to inject: each once first, in random order, then
    /// at random until the sweep nears its end.
    pub faults: Vec<Fault>,
    /// The quiet time between the end of one fault and the next.
    pub pause: (Duration, Duration),
    /// Longest the sweep may take.
    pub timeout: Duration,
}

/// One fault injected.
#[derive(Debug, Clone)]
pub struct Injected {
    pub fault: Fault,
    /// Since the sweep started.
    pub at: Duration,
    /// From the fault until the job ran at full width again (for a cut host:
    /// until every task stranded there ran again); `None` when the sweep
    /// ran out of tasks first.
    pub recovery: Option<Duration>,
}

/// What a chaos run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub tasks: u32,
    pub state: String,
    pub makespan: Duration,
    pub faults: Vec<Injected>,
    /// Tasks without an index line.
    pub lost: Vec<u64>,
    /// Index lines beyond one per task.
    pub duplicated: usize,
    /// Tasks whose line is not `succeeded`.
    pub failed: usize,
    /// Per cluster: most tasks seen running at once, and its slots.
    pub peak: BTreeMap<String, (usize, u32)>,
    /// Processes of gleaner or of a task still running after every service
    /// was stopped: `pid comm args`.
    pub leftovers: Vec<String>,
}

impl Outcome {
    /// Every promise held.
    pub fn kept(&self) -> bool {
        self.state == "done"
            && self.lost.is_empty()
            && self.duplicated == 0
            && self.failed == 0
            && self
                .peak
                .values()
                .all(|(peak, slots)| *peak <= *slots as usize)
            && self.leftovers.is_empty()
    }
}

const CLUSTERS: [(&str, u32); 2] = [("near", 3), ("far", 2)];
/// How often the tasks running are counted.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// Samples in a row below full width that make a loss of width (fewer are
/// the gap between one task and the next).
const DIP_SAMPLES: usize = 4;

/// Runs the plan with `exe` (the `gleaner` binary under test).
pub fn run(exe: &str, plan: &Plan) -> Outcome {
    let broker = BrokerCluster::lock();
    let island = Island::new("chaos");
    let mut g = Gleaner::on(broker.access.clone(), "chaos", exe);
    let tag = crate::rand_suffix();
    g.write("gleaner.toml", &config(&g, &island, &tag, exe));
    let mut fleet = Fleet::start(&mut g, &tag);
    let job = g.submit(&format!(
        "max_attempts = 50\n{}",
        sweep(
            "chaos",
            plan.tasks,
            &format!("sleep {}; echo {{n}}", plan.task_seconds)
        )
    ));
    let started = Instant::now();
    let sampler = Sampler::start(&tag);
    let mut faults = Vec::new();
    let mut kinds = plan.faults.clone();
    kinds.shuffle(&mut rand::rng());
    let near_end = (plan.tasks as usize).saturating_sub(plan.tasks as usize / 10);
    while started.elapsed() < plan.timeout && g.index(&job).len() < near_end {
        std::thread::sleep(Duration::from_secs_f64(rand::random_range(
            plan.pause.0.as_secs_f64()..=plan.pause.1.as_secs_f64(),
        )));
        let fault = match kinds.pop() {
            Some(fault) => fault,
            None => match plan.faults.choose(&mut rand::rng()) {
                Some(fault) => *fault,
                None => break,
            },
        };
        let at = started.elapsed();
        let stranded = sampler.running("far");
        let restored = inject(fault, &mut g, &mut fleet, &job, &broker, &island);
        eprintln!("chaos: {} at {:.1}s", fault.name(), at.as_secs_f64());
        faults.push((fault, at, restored - started, stranded));
    }
    let state = wait_for_end(&g, &job, plan.timeout.saturating_sub(started.elapsed()));
    let makespan = started.elapsed();
    let samples = sampler.stop();
    let faults = faults
        .into_iter()
        .map(|(fault, at, restored, stranded)| Injected {
            fault,
            at,
            recovery: recovery(&samples, started, fault, at, restored, &stranded),
        })
        .collect();
    g.stop_services(Duration::from_secs(30));
    let leftovers = leftovers(&tag, Duration::from_secs(15));
    let index = g.index(&job);
    let lines = by_task(&index);
    let outcome = Outcome {
        tasks: plan.tasks,
        state,
        makespan,
        faults,
        lost: (0..plan.tasks as u64)
            .filter(|t| !lines.contains_key(t))
            .collect(),
        duplicated: index.len() - lines.len(),
        failed: lines
            .values()
            .filter(|t| t["status"] != "succeeded")
            .count(),
        peak: CLUSTERS
            .iter()
            .map(|(name, slots)| {
                let peak = samples
                    .iter()
                    .map(|s| s.running.get(*name).map_or(0, BTreeSet::len))
                    .max()
                    .unwrap_or(0);
                ((*name).to_owned(), (peak, *slots))
            })
            .collect(),
        leftovers,
    };
    if !outcome.kept() {
        g.print_logs();
        eprintln!("job.json: {}", g.job_file(&job).unwrap_or_default());
        for line in index.iter().rev().take(20) {
            eprintln!("index: {line}");
        }
    }
    outcome
}

/// The two clusters; their launchers carry the run's tag and their
/// cluster's name in their environment (tasks inherit it), `far`'s run on
/// the island.
fn config(g: &Gleaner, island: &Island, tag: &str, exe: &str) -> String {
    let mut config = String::new();
    for (name, slots) in CLUSTERS {
        let netns = if name == "far" {
            format!("ip netns exec {} ", island.namespace())
        } else {
            String::new()
        };
        let wrapper = g.write(
            &format!("launch-{name}.sh"),
            &format!(
                "#!/bin/sh\nexport CHAOS_RUN={tag} CHAOS_CLUSTER={name}\nexec {netns}{exe} \"$@\"\n"
            ),
        );
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
            .expect("make the launcher wrapper executable");
        config += &format!(
            "[[cluster]]\nname = \"{name}\"\nbackend = \"local\"\nslots = {slots}\nlauncher_program = \"{}\"\n\n",
            wrapper.display()
        );
    }
    config
}

/// The services of the run, each restarted under a new log name
/// (`runner-1.2`) after it is killed.
struct Fleet {
    tag: String,
    services: BTreeMap<&'static str, Service>,
}

struct Service {
    args: &'static [&'static str],
    pid: u32,
    generation: u32,
}

impl Fleet {
    fn start(g: &mut Gleaner, tag: &str) -> Self {
        const SERVICES: [(&str, &[&str]); 6] = [
            ("scheduler-1", &["scheduler"]),
            ("scheduler-2", &["scheduler"]),
            ("runner-1", &["runner"]),
            ("runner-2", &["runner"]),
            ("kcm-near", &["kcm", "--cluster", "near"]),
            ("kcm-far", &["kcm", "--cluster", "far"]),
        ];
        let mut fleet = Self {
            tag: tag.to_owned(),
            services: BTreeMap::new(),
        };
        for (name, args) in SERVICES {
            let pid = g.start_with(&format!("{name}.1"), args, &[("CHAOS_RUN", tag)]);
            fleet.services.insert(
                name,
                Service {
                    args,
                    pid,
                    generation: 1,
                },
            );
        }
        fleet
    }

    /// The current log of a service.
    fn log(&self, g: &Gleaner, name: &str) -> String {
        self.services
            .get(name)
            .map(|s| g.log(&format!("{name}.{}", s.generation)))
            .unwrap_or_default()
    }

    /// Kills a service with SIGKILL and starts it again a second later, as
    /// a service manager would.
    fn crash(&mut self, g: &mut Gleaner, name: &str) {
        let Some(service) = self.services.get_mut(name) else {
            return;
        };
        g.signal(service.pid, Signal::SIGKILL);
        std::thread::sleep(Duration::from_secs(1));
        service.generation += 1;
        service.pid = g.start_with(
            &format!("{name}.{}", service.generation),
            service.args,
            &[("CHAOS_RUN", &self.tag)],
        );
    }
}

/// Injects a fault and undoes what a service manager or an admin would;
/// returns when that is done.
fn inject(
    fault: Fault,
    g: &mut Gleaner,
    fleet: &mut Fleet,
    job: &str,
    broker: &BrokerCluster,
    island: &Island,
) -> Instant {
    let mut rng = rand::rng();
    match fault {
        Fault::Scheduler => {
            let active = ["scheduler-1", "scheduler-2"]
                .into_iter()
                .find(|s| fleet.log(g, s).contains("scheduler active"))
                .unwrap_or("scheduler-1");
            fleet.crash(g, active);
        }
        Fault::Runner => {
            let holder = ["runner-1", "runner-2"]
                .into_iter()
                .find(|r| fleet.log(g, r).contains(&format!("job accepted job={job}")))
                .unwrap_or("runner-1");
            fleet.crash(g, holder);
        }
        Fault::Kcm => {
            let kcm = *["kcm-near", "kcm-far"]
                .choose(&mut rng)
                .unwrap_or(&"kcm-near");
            fleet.crash(g, kcm);
        }
        Fault::Launcher => {
            if let Some(pid) = g.launchers(job).choose(&mut rng) {
                let _ = nix::sys::signal::kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
            }
        }
        Fault::BrokerNode => {
            let node = *BrokerCluster::NODES.choose(&mut rng).unwrap_or(&"node1");
            broker.stop(node);
            std::thread::sleep(Duration::from_secs(5));
            broker.start(node);
        }
        Fault::BrokerRestart => broker.restart(),
        Fault::HostCut => {
            island.cut();
            std::thread::sleep(Duration::from_secs(20));
            island.mend();
        }
    }
    Instant::now()
}

fn wait_for_end(g: &Gleaner, job: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(state) = g.job_state(job).filter(|s| s == "done" || s == "cancelled") {
            return state;
        }
        if Instant::now() > deadline {
            return g.job_state(job).unwrap_or_else(|| "unknown".to_owned());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The tasks running on each cluster at one moment.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    running: BTreeMap<String, BTreeSet<u64>>,
}

impl Sample {
    fn width(&self) -> usize {
        self.running.values().map(BTreeSet::len).sum()
    }
}

/// Counts the tasks running on each cluster, every [`SAMPLE_EVERY`], from
/// the environment of every process (a task's processes inherit its
/// launcher's, which names the cluster).
struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Sampler {
    fn start(tag: &str) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let (samples, stop, tag) = (samples.clone(), stop.clone(), tag.to_owned());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    let sample = Sample {
                        at: Instant::now(),
                        running: running_tasks(&tag),
                    };
                    if let Ok(mut samples) = samples.lock() {
                        samples.push(sample);
                    }
                    std::thread::sleep(SAMPLE_EVERY);
                }
            }
        });
        Self {
            samples,
            stop,
            thread,
        }
    }

    /// The tasks running on a cluster at the last sample.
    fn running(&self, cluster: &str) -> BTreeSet<u64> {
        self.samples
            .lock()
            .ok()
            .and_then(|s| s.last().and_then(|s| s.running.get(cluster).cloned()))
            .unwrap_or_default()
    }

    fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let samples = self.samples.lock().map(|s| s.clone());
        samples.unwrap_or_default()
    }
}

/// The run's processes: pid and environment, for those tagged `tag`.
fn tagged(tag: &str) -> Vec<(u32, BTreeMap<String, String>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let marker = format!("CHAOS_RUN={tag}");
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
            if !vars.contains(&marker.as_bytes()) {
                return None;
            }
            let vars = vars
                .iter()
                .filter_map(|v| {
                    let (key, value) = std::str::from_utf8(v).ok()?.split_once('=')?;
                    Some((key.to_owned(), value.to_owned()))
                })
                .collect();
            Some((pid, vars))
        })
        .collect()
}

fn running_tasks(tag: &str) -> BTreeMap<String, BTreeSet<u64>> {
    let mut running: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for (_, env) in tagged(tag) {
        if let (Some(cluster), Some(task)) = (
            env.get("CHAOS_CLUSTER"),
            env.get("GLEANER_TASK").and_then(|t| t.parse().ok()),
        ) {
            running.entry(cluster.clone()).or_default().insert(task);
        }
    }
    running
}

/// The run's processes still there after `grace`: `pid comm args`.
fn leftovers(tag: &str, grace: Duration) -> Vec<String> {
    let deadline = Instant::now() + grace;
    loop {
        let left = tagged(tag);
        if left.is_empty() || Instant::now() > deadline {
            return left
                .into_iter()
                .map(|(pid, _)| {
                    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    let args = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                    format!("{pid} {}", args.trim())
                })
                .collect();
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// How long the job took to get over a fault: for a cut host, until every
/// task stranded there ran again; otherwise, if the job lost width
/// (for [`DIP_SAMPLES`] samples) before the fault was undone or in the 3 s
/// after, until it ran at full width again. `None` when it never did before the sweep ran short of
/// tasks.
fn recovery(
    samples: &[Sample],
    start: Instant,
    fault: Fault,
    at: Duration,
    restored: Duration,
    stranded: &BTreeSet<u64>,
) -> Option<Duration> {
    let since = |s: &Sample| s.at.saturating_duration_since(start);
    let after: Vec<&Sample> = samples.iter().filter(|s| since(s) >= at).collect();
    if fault == Fault::HostCut {
        // A stranded task runs again once it is seen on `near`, or on
        // `far` after it was gone from there.
        let mut left = stranded.clone();
        let mut gone = BTreeSet::new();
        for sample in &after {
            let empty = BTreeSet::new();
            let far = sample.running.get("far").unwrap_or(&empty);
            let near = sample.running.get("near").unwrap_or(&empty);
            gone.extend(left.iter().filter(|t| !far.contains(t)).copied());
            left.retain(|t| !(near.contains(t) || (gone.contains(t) && far.contains(t))));
            if left.is_empty() {
                return Some(since(sample) - at);
            }
        }
        return None;
    }
    let full: usize = CLUSTERS.iter().map(|(_, slots)| *slots as usize).sum();
    let window = after
        .iter()
        .take_while(|s| since(s) <= restored + Duration::from_secs(3))
        .count();
    let dip = (0..window).find(|&i| {
        after[i..]
            .iter()
            .take(DIP_SAMPLES)
            .all(|s| s.width() < full)
    });
    let Some(dip) = dip else {
        return Some(Duration::ZERO);
    };
    after[dip..]
        .iter()
        .find(|s| s.width() == full)
        .map(|s| since(s) - at)
}
