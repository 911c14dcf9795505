//! The batch system at one moment, as plain data: what a backend reads and
//! the kcm's core decides on (a simulator builds it by hand).

use std::collections::{BTreeMap, BTreeSet};

use gleaner_manifest::{JobId, Needs};
use gleaner_policy::{
    ect::{NEVER_MS, Profile},
    local::{HostLoad, WaitingJob},
};
use gleaner_protocol::{
    EctSource, Foresight, HostReport, WaitingComponent,
    naming::{host_key, parse_component_name, parse_placeholder_name},
};

/// Of the jobs waiting in a batch queue, those an estimate places one by
/// one: past them, a queue of any length costs a report nothing more.
const MAX_ESTIMATED_JOBS: usize = 500;

/// Steps of the free-slot profile a report carries, at most.
const MAX_PROFILE_STEPS: usize = 256;

/// Slot counts come from the batch system: added without overflowing.
fn saturating_sum(slots: impl IntoIterator<Item = u32>) -> u32 {
    slots.into_iter().fold(0, u32::saturating_add)
}

/// A gleaner placeholder in the batch system: one launcher, running or waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    /// The batch system's id (`4711.3`); the launcher's id is
    /// [`launcher_id`](gleaner_protocol::naming::launcher_id) of it.
    pub id: String,
    pub job: JobId,
    pub slots: u32,
    /// Where it runs; `None` while it waits.
    pub host: Option<String>,
    /// The batch system's name of the account that submitted it.
    pub owner: String,
    /// Memory and GPUs it holds beside its slots.
    pub needs: Needs,
}

impl Placeholder {
    pub fn running(&self) -> bool {
        self.host.is_some()
    }
}

/// A batch job as estimates see it: its slots and when they free up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    pub slots: u32,
    pub running: bool,
    /// Its time limit; `None` without one (it may hold its slots for ever).
    pub limit_ms: Option<u64>,
    /// When it started or, waiting, when the batch system expects to start
    /// it (wall clock, ms), where it says.
    pub start: Option<u64>,
}

impl Timing {
    /// How long its slots stay taken from `now`: running, until its start
    /// plus its limit (its whole limit if its start is not known);
    /// waiting, its limit.
    fn holds_for(&self, now: u64) -> u64 {
        let limit = self.limit_ms.unwrap_or(NEVER_MS);
        match (self.running, self.start) {
            (true, Some(start)) => start.saturating_add(limit).saturating_sub(now),
            _ => limit,
        }
    }

    /// When it is expected to start, ms from `now`, if it waits and the
    /// batch system says.
    fn expected_in(&self, now: u64) -> Option<u64> {
        self.start
            .filter(|_| !self.running)
            .map(|at| at.saturating_sub(now))
    }
}

/// A grid job's component in the batch system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentRun {
    /// The batch system's id.
    pub id: String,
    pub job: JobId,
    pub component: u32,
    pub slots: u32,
    pub running: bool,
    /// The batch system's name of the account that submitted it.
    pub owner: String,
    pub timing: Timing,
}

/// A batch job named like one of gleaner's — `gl-<job>` (placeholders) or
/// `gg-<job>.<n>` (a grid component) — as read, with its owner. Anyone may
/// give a job any name, and job ids are public: the name alone makes
/// nothing gleaner's. Whose it is depends on which accounts submit
/// gleaner's jobs, which the kcm's core knows and a reading of the batch
/// system does not, so a reading leaves it unjudged and counted nowhere
/// until [`Snapshot::judge`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedJob {
    /// The gleaner job its name names.
    pub job: JobId,
    /// `Some(n)` for the component `gg-<job>.<n>`, `None` for `gl-<job>`.
    pub component: Option<u32>,
    /// The batch system's name of the account that submitted it.
    pub owner: String,
    /// Batch ids: of a running placeholder (`4711.3`) or of the component;
    /// of a waiting array, one per task, each a placeholder of its own.
    pub ids: Vec<String>,
    /// Slots of each placeholder, or of the component.
    pub slots: u32,
    /// Where it runs, and its slots there (a component may span hosts);
    /// empty while it waits.
    pub hosts: Vec<(String, u32)>,
    /// As someone else's job that waits for slots, the local job it is;
    /// `None` when it runs, is on hold or in error.
    pub waiting: Option<WaitingJob>,
    /// As gleaner's, what is wrong with it (a placeholder in error).
    pub problem: Option<String>,
    /// Memory and GPUs of each placeholder, or of the component.
    pub needs: Needs,
    /// Its slots and times, for estimates: a component's, or another's.
    pub timing: Timing,
}

/// The gleaner job a batch job's name names, and the component when it is
/// one; `None` for a name of no gleaner job.
pub fn named_after(name: &str) -> Option<(JobId, Option<u32>)> {
    match parse_placeholder_name(name) {
        Some(job) => Some((job, None)),
        None => parse_component_name(name).map(|(job, component)| (job, Some(component))),
    }
}

/// One execution host of the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    /// Slots gleaner's queue has here (0 when the host takes no jobs).
    pub slots: u32,
    /// Slots running jobs that are not gleaner's.
    pub local: u32,
    /// Slots running grid job components.
    pub grid: u32,
    /// Memory nobody holds, where the batch system counts it.
    pub free_memory_mb: Option<u64>,
    /// GPUs nobody holds, where the batch system counts them.
    pub free_gpus: Option<u32>,
}

impl Host {
    pub fn new(name: impl Into<String>, slots: u32) -> Self {
        Self {
            name: name.into(),
            slots,
            ..Self::default()
        }
    }
}

/// Where a waiting job stands in the batch system's queue: its
/// partition's priority tier, then its priority. The batch system starts a
/// job only after every waiting job of a higher standing that wants the
/// same slots, its backfill included: that starts a job early only where
/// it delays none of them by their time limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Standing {
    pub tier: u32,
    pub priority: u64,
}

/// The cluster's state at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub hosts: Vec<Host>,
    /// Jobs that are not gleaner's, waiting for slots of this cluster.
    pub waiting: Vec<WaitingJob>,
    pub placeholders: Vec<Placeholder>,
    /// Grid job components, running or waiting.
    pub components: Vec<ComponentRun>,
    /// Jobs named like gleaner's, not judged yet: a batch system's reading
    /// has them, and [`Snapshot::judge`] makes them placeholders,
    /// components or others' jobs. A backend that knows its launchers
    /// without their names (the local one) has none.
    pub named: Vec<NamedJob>,
    /// Something wrong in the batch system worth reporting (a queue in error).
    pub problem: Option<String>,
    /// Jobs that are not gleaner's, running on the cluster's hosts or
    /// waiting for them, with their time limits: what the kcm's estimates
    /// of completion times start from. Empty from a backend that does not
    /// read them.
    pub timing: Vec<Timing>,
    /// Standings of the jobs waiting for this cluster's slots, gleaner's
    /// and others', by batch id; empty from a backend that does not read
    /// them.
    pub standings: BTreeMap<String, Standing>,
    /// The priority tier of the partition placeholders go to, where the
    /// batch system tells it.
    pub placeholder_tier: Option<u32>,
}

impl Snapshot {
    /// The snapshot with its named jobs judged by `gleaners`. Gleaner's
    /// become placeholders and components (a running component's slots its
    /// hosts' grid slots). Anybody else's are what any job of theirs is:
    /// local slots where it runs, a local job if it waits for slots.
    pub fn judge(mut self, gleaners: impl Fn(&NamedJob) -> bool) -> Self {
        let mut problems: Vec<String> = self.problem.take().into_iter().collect();
        let index = self.host_index();
        for named in std::mem::take(&mut self.named) {
            let ours = gleaners(&named);
            // A placeholder of gleaner's is held by its job: counted from
            // the placeholders, not here.
            let counted = match (ours, named.component) {
                (true, None) => &[][..],
                _ => named.hosts.as_slice(),
            };
            for (name, slots) in counted {
                let Some(host) = index
                    .get(&host_key(name))
                    .and_then(|&i| self.hosts.get_mut(i))
                else {
                    continue;
                };
                let count = if ours {
                    &mut host.grid
                } else {
                    &mut host.local
                };
                *count = count.saturating_add(*slots);
            }
            if !ours {
                self.waiting.extend(named.waiting);
                self.timing.push(named.timing);
                continue;
            }
            problems.extend(named.problem);
            let host = named.hosts.first().map(|(host, _)| host.clone());
            match named.component {
                Some(component) => {
                    self.components
                        .extend(named.ids.into_iter().map(|id| ComponentRun {
                            id,
                            job: named.job.clone(),
                            component,
                            slots: named.slots,
                            running: host.is_some(),
                            owner: named.owner.clone(),
                            timing: named.timing,
                        }))
                }
                None => self
                    .placeholders
                    .extend(named.ids.into_iter().map(|id| Placeholder {
                        id,
                        job: named.job.clone(),
                        slots: named.slots,
                        host: host.clone(),
                        owner: named.owner.clone(),
                        needs: named.needs,
                    })),
            }
        }
        self.problem = (!problems.is_empty()).then(|| problems.join("; "));
        self
    }

    /// Waiting placeholders the batch system itself keeps behind every
    /// local job that waits here: they need not be withdrawn to let those
    /// start, and they wait their turn, not for something unseen. None
    /// while no local job waits, nor when a standing is unknown.
    pub fn yielding(&self) -> BTreeSet<&str> {
        let mut lowest_local = None::<Standing>;
        for job in &self.waiting {
            let Some(standing) = self.standings.get(&job.id) else {
                return BTreeSet::new();
            };
            lowest_local = Some(lowest_local.map_or(*standing, |s| s.min(*standing)));
        }
        let Some(lowest_local) = lowest_local else {
            return BTreeSet::new();
        };
        self.placeholders
            .iter()
            .filter(|p| !p.running())
            .filter(|p| self.standings.get(&p.id).is_some_and(|s| *s < lowest_local))
            .map(|p| p.id.as_str())
            .collect()
    }

    /// What the cluster foresees at `now` (wall clock, ms) for a cluster
    /// of `speed`: running jobs (grid components too) end at their time
    /// limits; waiting ones start where the batch system expects them to,
    /// else in queue order by conservative backfilling. Placeholders count
    /// as free: they give way to whatever waits. The free slots leave
    /// gleaner's waiting components out, so that the scheduler can weigh
    /// moving them; each one's own predicted start goes beside them.
    pub fn foresight(&self, now: u64, speed: f64) -> Foresight {
        let running = self
            .timing
            .iter()
            .filter(|t| t.running)
            .copied()
            .chain(
                self.components
                    .iter()
                    .filter(|c| c.running)
                    .map(|c| c.timing),
            )
            .map(|t| (t.slots, t.holds_for(now)));
        let mut free = Profile::new(self.total_slots(), running);
        let mut local: Vec<&Timing> = self.timing.iter().filter(|t| !t.running).collect();
        // Those the batch system has a start for first, in that order.
        local.sort_by_key(|t| t.expected_in(now).unwrap_or(u64::MAX));
        for t in local.into_iter().take(MAX_ESTIMATED_JOBS) {
            let length = t.holds_for(now);
            let start = t
                .expected_in(now)
                .or_else(|| free.earliest(t.slots, length, 0));
            if let Some(start) = start {
                free.reserve(start, t.slots, length);
            }
        }
        let mut with_ours = free.clone();
        let waiting = self
            .components
            .iter()
            .filter(|c| !c.running)
            .take(MAX_ESTIMATED_JOBS)
            .filter_map(|c| {
                let t = &c.timing;
                let length = t.holds_for(now);
                let (start, source) = match t.expected_in(now) {
                    Some(start) => (start, EctSource::BatchSystem),
                    None => (with_ours.earliest(c.slots, length, 0)?, EctSource::Model),
                };
                with_ours.reserve(start, c.slots, length);
                Some(WaitingComponent {
                    job: c.job.clone(),
                    component: c.component,
                    slots: c.slots,
                    start_ms: start,
                    walltime_ms: t.limit_ms,
                    source,
                })
            })
            .collect();
        Foresight {
            speed,
            free: free.bounded(MAX_PROFILE_STEPS).steps().to_vec(),
            waiting,
        }
    }

    pub fn total_slots(&self) -> u32 {
        saturating_sum(self.hosts.iter().map(|h| h.slots))
    }

    /// Slots of the largest host: what a job kept on one host can have.
    pub fn largest_host(&self) -> u32 {
        self.hosts.iter().map(|h| h.slots).max().unwrap_or(0)
    }

    /// Slots running jobs that are not gleaner's.
    pub fn local_running(&self) -> u32 {
        saturating_sum(self.hosts.iter().map(|h| h.local))
    }

    /// Slots running grid job components.
    pub fn grid_running(&self) -> u32 {
        saturating_sum(self.hosts.iter().map(|h| h.grid))
    }

    /// Slots nobody uses or has claimed: pending placeholders and pending
    /// grid components claim theirs (else the slots a component waits for
    /// would be offered to sweeps again).
    pub fn idle_slots(&self) -> u32 {
        let claimed = saturating_sum(
            self.placeholders.iter().map(|p| p.slots).chain(
                self.components
                    .iter()
                    .filter(|c| !c.running)
                    .map(|c| c.slots),
            ),
        );
        self.total_slots().saturating_sub(saturating_sum([
            self.local_running(),
            self.grid_running(),
            claimed,
        ]))
    }

    /// Slots asked for by the waiting local jobs.
    pub fn local_waiting(&self) -> u32 {
        saturating_sum(self.waiting.iter().map(|w| w.slots))
    }

    /// The waiting local jobs that stand in a higher tier than
    /// placeholders: the batch system starts them before any placeholder,
    /// whenever it was submitted, and backfills placeholders around their
    /// planned starts.
    pub fn starting_first(&self) -> BTreeSet<&str> {
        let Some(ours) = self.placeholder_tier else {
            return BTreeSet::new();
        };
        self.waiting
            .iter()
            .filter(|w| self.standings.get(&w.id).is_some_and(|s| s.tier > ours))
            .map(|w| w.id.as_str())
            .collect()
    }

    /// Slots asked for by the jobs [`Snapshot::starting_first`].
    pub fn local_waiting_first(&self) -> u32 {
        let first = self.starting_first();
        saturating_sum(
            self.waiting
                .iter()
                .filter(|w| first.contains(w.id.as_str()))
                .map(|w| w.slots),
        )
    }

    /// Each host's place in `hosts`, by its name without a domain.
    fn host_index(&self) -> BTreeMap<String, usize> {
        self.hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (host_key(&h.name), i))
            .collect()
    }

    /// What each job's running placeholders hold per host (in the
    /// snapshot's host order), added up by `add`, in one pass over the
    /// placeholders.
    fn per_host<T: Default>(&self, add: impl Fn(&mut T, &Placeholder)) -> Vec<BTreeMap<JobId, T>> {
        let index = self.host_index();
        let mut held: Vec<BTreeMap<JobId, T>> =
            (0..self.hosts.len()).map(|_| BTreeMap::new()).collect();
        for placeholder in &self.placeholders {
            let Some(&i) = placeholder
                .host
                .as_deref()
                .and_then(|h| index.get(&host_key(h)))
            else {
                continue;
            };
            add(
                held[i].entry(placeholder.job.clone()).or_default(),
                placeholder,
            );
        }
        held
    }

    /// Slots each job's running placeholders hold, per host.
    fn held_per_host(&self) -> Vec<BTreeMap<JobId, u32>> {
        self.per_host(|slots: &mut u32, p| *slots = slots.saturating_add(p.slots))
    }

    /// Memory and GPUs each job's running placeholders hold, per host.
    fn needs_per_host(&self) -> Vec<BTreeMap<JobId, Needs>> {
        self.per_host(|needs: &mut Needs, p| *needs = *needs + p.needs)
    }

    /// Each host as the local policy sees it.
    pub fn host_loads(&self) -> Vec<HostLoad> {
        self.hosts
            .iter()
            .zip(self.held_per_host())
            .zip(self.needs_per_host())
            .map(|((host, held), held_needs)| {
                let busy = saturating_sum(
                    [host.local, host.grid]
                        .into_iter()
                        .chain(held.values().copied()),
                );
                HostLoad {
                    name: host.name.clone(),
                    slots: host.slots,
                    free: host.slots.saturating_sub(busy),
                    held,
                    free_memory_mb: host.free_memory_mb,
                    free_gpus: host.free_gpus,
                    held_needs,
                }
            })
            .collect()
    }

    /// What the scheduler and `gleaner status` hear of each host.
    pub fn host_reports(&self) -> Vec<HostReport> {
        self.hosts
            .iter()
            .zip(self.held_per_host())
            .zip(self.needs_per_host())
            .map(|((host, held), needs)| HostReport {
                name: host.name.clone(),
                slots: host.slots,
                local: host.local,
                grid: host.grid,
                scavenged: saturating_sum(held.values().copied()),
                jobs: held,
                free_memory_mb: host.free_memory_mb,
                free_gpus: host.free_gpus,
                scavenged_needs: needs.into_values().sum(),
                squatted_gpus: Vec::new(),
            })
            .collect()
    }

    /// Memory nobody holds on the hosts that count it.
    pub fn free_memory_mb(&self) -> Option<u64> {
        self.hosts
            .iter()
            .filter_map(|h| h.free_memory_mb)
            .reduce(u64::saturating_add)
    }

    /// GPUs nobody holds on the hosts that count them.
    pub fn free_gpus(&self) -> Option<u32> {
        self.hosts
            .iter()
            .filter_map(|h| h.free_gpus)
            .reduce(u32::saturating_add)
    }
}

#[cfg(test)]
mod tests;
