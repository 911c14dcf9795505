//! What a cluster manager does when the cluster's own jobs wait.
//!
//! gleaner must never make a local job wait. When one does: withdraw
//! gleaner's pending placeholders (they would compete with it), then free
//! the slots still missing — where the job can use them. A job whose slots
//! must share a host (an SMP code, a whole-node request) is not helped by
//! slots scattered over many hosts: the host that can give them at the
//! least cost in scavenged slots is chosen, and only launchers there are
//! preempted; a job that could not start on any host even then costs
//! nothing. Where the batch system plans a waiting job's start and fits
//! placeholders around it by their time limits (Slurm's backfill), one
//! that could start anywhere costs nothing until the cluster's own jobs
//! have left it enough room that gleaner's would do; elsewhere room is
//! made at once, ready for when they leave. A job that asks for memory or GPUs gets them where its slots
//! are: the host chosen is the one that frees every resource it waits for
//! with the fewest launcher slots preempted, GPU launchers for GPUs and
//! memory-heavy ones for memory. Slots any host can give are split between the scavenging jobs
//! once (together covering the need, not each job the full amount). Each
//! waiting job is answered once, until the answer has had time to work.

use std::collections::{BTreeMap, BTreeSet};

use gleaner_manifest::{JobId, Needs};

use crate::share::split_shrink;

/// A job of the cluster's own users, waiting for slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingJob {
    pub id: String,
    pub slots: u32,
    /// How many of its slots must be on one host: 1 when any slot anywhere
    /// will do, `slots` for an SMP job (Grid Engine's `$pe_slots`).
    pub together: u32,
    /// It wants hosts to itself (`-l exclusive`).
    pub exclusive: bool,
    /// Memory and GPUs it asks for in all, beside its slots.
    pub needs: Needs,
}

impl WaitingJob {
    /// A job of `slots` slots that may be spread over any hosts.
    pub fn anywhere(id: impl Into<String>, slots: u32) -> Self {
        Self {
            id: id.into(),
            slots,
            together: 1,
            exclusive: false,
            needs: Needs::default(),
        }
    }

    /// A job whose `slots` slots must all be on one host.
    pub fn one_host(id: impl Into<String>, slots: u32) -> Self {
        Self {
            together: slots.max(1),
            ..Self::anywhere(id, slots)
        }
    }

    /// Whether any free slot helps it (else it needs particular hosts:
    /// its memory and GPUs are wanted where its slots are).
    fn spreads(&self) -> bool {
        self.together <= 1 && !self.exclusive && self.needs.is_none()
    }

    /// The memory and GPUs that go with `chunk` of its slots.
    fn chunk_needs(&self, chunk: u32) -> Needs {
        let slots = u64::from(self.slots.max(1));
        let chunk = u64::from(chunk);
        Needs {
            memory_mb: self.needs.memory_mb.saturating_mul(chunk).div_ceil(slots),
            gpus: (u64::from(self.needs.gpus) * chunk).div_ceil(slots) as u32,
        }
    }

    /// The groups of slots that must each be on one host.
    fn chunks(&self) -> Vec<u32> {
        let together = self.together.clamp(1, self.slots.max(1));
        let mut chunks = vec![together; (self.slots / together).max(1) as usize];
        if self.slots > together && !self.slots.is_multiple_of(together) {
            chunks.push(self.slots % together);
        }
        chunks
    }
}

/// One execution host as the local policy sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostLoad {
    pub name: String,
    /// Slots of the host gleaner may use.
    pub slots: u32,
    /// Slots free right now.
    pub free: u32,
    /// Slots each scavenging job's running launchers hold here.
    pub held: BTreeMap<JobId, u32>,
    /// Memory free right now; `None` where the batch system does not
    /// count it (then it never keeps a job waiting).
    pub free_memory_mb: Option<u64>,
    /// GPUs free right now; `None` where they are not counted.
    pub free_gpus: Option<u32>,
    /// Memory and GPUs each scavenging job's running launchers hold here.
    pub held_needs: BTreeMap<JobId, Needs>,
}

impl HostLoad {
    fn scavenged(&self) -> u32 {
        self.held.values().fold(0, |a, b| a.saturating_add(*b))
    }

    /// Slots a waiting job could have here once gleaner left.
    fn reachable(&self) -> u32 {
        self.free.saturating_add(self.scavenged()).min(self.slots)
    }

    /// Nothing but gleaner runs here: an exclusive job can have it.
    fn only_gleaner(&self) -> bool {
        self.reachable() == self.slots
    }

    /// What launchers of `job` free here, giving back `slots` of theirs.
    fn freed_by(&self, job: &JobId, slots: u32) -> Needs {
        let held = u64::from(self.held.get(job).copied().unwrap_or(0).max(1));
        let needs = self.held_needs.get(job).copied().unwrap_or_default();
        let slots = u64::from(slots);
        Needs {
            memory_mb: needs.memory_mb.saturating_mul(slots) / held,
            gpus: (u64::from(needs.gpus) * slots / held) as u32,
        }
    }

    /// The launcher slots of each job to preempt here so that `slots` slots
    /// and `needs` are free, fewest in all: GPUs from the launchers holding
    /// most GPUs per slot, memory likewise, then slots from whoever holds
    /// most. `None` if not even every launcher leaving would do.
    fn give_back(&self, slots: u32, needs: Needs) -> Option<BTreeMap<JobId, u32>> {
        let mut taking = Taking {
            left: self
                .held
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(j, n)| (j.clone(), *n))
                .collect(),
            ..Taking::default()
        };
        type Amount = fn(&Needs) -> u64;
        let resources: [(Option<u64>, u64, Amount); 2] = [
            (self.free_gpus.map(u64::from), u64::from(needs.gpus), |n| {
                u64::from(n.gpus)
            }),
            (self.free_memory_mb, needs.memory_mb, |n| n.memory_mb),
        ];
        for (free, wanted, amount) in resources {
            let deficit = free.map_or(0, |free| wanted.saturating_sub(free));
            while amount(&taking.freed) < deficit {
                // The launchers giving most of it per slot (`held` of
                // `slots`, compared without rounding: a launcher of 4
                // slots and 1 GPU gives a quarter GPU per slot).
                let (job, held, slots) = taking
                    .left
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(j, n)| (j.clone(), amount(&self.freed_by(j, *n)), u64::from(*n)))
                    .filter(|(_, held, _)| *held > 0)
                    .max_by(|(a, held_a, slots_a), (b, held_b, slots_b)| {
                        (u128::from(*held_a) * u128::from(*slots_b))
                            .cmp(&(u128::from(*held_b) * u128::from(*slots_a)))
                            .then_with(|| b.cmp(a))
                    })?;
                let missing = deficit - amount(&taking.freed);
                let wanted_slots = u128::from(missing) * u128::from(slots);
                let n = wanted_slots
                    .div_ceil(u128::from(held))
                    .min(u128::from(slots)) as u32;
                taking.take(self, &job, n);
            }
        }
        let still = slots.saturating_sub(self.free).saturating_sub(taking.slots);
        let split = split_shrink(still, &taking.left);
        if split.iter().map(|(_, n)| n).sum::<u32>() < still {
            return None;
        }
        for (job, n) in split {
            taking.take(self, &job, n);
        }
        Some(taking.plan)
    }

    /// Takes `slots` and `needs` here for a local job, the launchers of
    /// `plan` gone.
    fn occupy(&mut self, slots: u32, needs: Needs, plan: &BTreeMap<JobId, u32>) {
        for (job, n) in plan {
            let freed = self.freed_by(job, *n);
            self.free = self.free.saturating_add(*n);
            self.free_memory_mb = self
                .free_memory_mb
                .map(|m| m.saturating_add(freed.memory_mb));
            self.free_gpus = self.free_gpus.map(|g| g.saturating_add(freed.gpus));
            if let Some(held) = self.held.get_mut(job) {
                *held -= (*n).min(*held);
            }
            if let Some(held) = self.held_needs.get_mut(job) {
                held.memory_mb -= freed.memory_mb.min(held.memory_mb);
                held.gpus -= freed.gpus.min(held.gpus);
            }
        }
        self.free = self.free.saturating_sub(slots);
        self.slots = self.slots.saturating_sub(slots);
        self.free_memory_mb = self
            .free_memory_mb
            .map(|m| m.saturating_sub(needs.memory_mb));
        self.free_gpus = self.free_gpus.map(|g| g.saturating_sub(needs.gpus));
    }
}

/// Launchers chosen to leave one host, and what they free.
#[derive(Debug, Default)]
struct Taking {
    /// Slots of each job still there.
    left: BTreeMap<JobId, u32>,
    plan: BTreeMap<JobId, u32>,
    freed: Needs,
    slots: u32,
}

impl Taking {
    fn take(&mut self, host: &HostLoad, job: &JobId, slots: u32) {
        self.freed = self.freed + host.freed_by(job, slots);
        self.slots += slots;
        *self.plan.entry(job.clone()).or_default() += slots;
        if let Some(left) = self.left.get_mut(job) {
            *left -= slots.min(*left);
        }
    }
}

/// The cluster as the local policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct LocalState<'a> {
    pub waiting: &'a [WaitingJob],
    pub hosts: &'a [HostLoad],
    /// gleaner's placeholders that wait in the batch system.
    pub pending_placeholders: &'a [String],
    /// Waiting jobs whose starts the batch system plans, fitting
    /// placeholders only around them by their time limits: room is made
    /// for one when it could start, not before (that would only leave
    /// the hole backfill gave gleaner).
    pub planned: &'a BTreeSet<&'a str>,
}

/// An order to one scavenging job: give back `slots`, from launchers on
/// `hosts` (anywhere when empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShrinkOrder {
    pub job: JobId,
    pub slots: u32,
    pub hosts: Vec<String>,
}

/// What to do about the waiting jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalPlan {
    /// Pending placeholders to remove.
    pub withdraw: Vec<String>,
    pub shrink: Vec<ShrinkOrder>,
    /// Waiting jobs no host could take even without gleaner: nothing is
    /// preempted for them.
    pub unplaceable: Vec<String>,
}

/// Slots promised to a waiting job already answered: on a host, or anywhere.
#[derive(Debug, Clone)]
struct Promise {
    at: u64,
    slots: Vec<(Option<String>, u32)>,
    /// The slots gleaner's launchers hold once those told to go with this
    /// answer left; `None` when the answer told none to go.
    held_after: Option<u32>,
}

/// Waiting jobs already answered, and when; kept between polls.
#[derive(Debug, Clone, Default)]
pub struct Answered {
    jobs: BTreeMap<String, Promise>,
}

impl Answered {
    fn promised(&self, host: Option<&str>) -> u32 {
        self.jobs
            .values()
            .flat_map(|p| &p.slots)
            .filter(|(h, _)| h.as_deref() == host)
            .fold(0, |a, (_, n)| a.saturating_add(*n))
    }
}

/// The hosts as the answers so far leave them.
struct Room {
    hosts: Vec<HostLoad>,
    /// Free slots anywhere not promised yet.
    free_anywhere: u32,
    /// Slots of each job to preempt per host (index into `hosts`).
    needed: BTreeMap<usize, BTreeMap<JobId, u32>>,
    needed_anywhere: u32,
    /// Slots gleaner's launchers hold on all hosts.
    scavenged: u32,
}

impl Room {
    fn new(hosts: &[HostLoad], answered: &Answered) -> Self {
        // Where some hosts count a resource, a host that does not has none
        // of it (a host without GPUs among hosts with some); where none
        // does, the batch system does not count it, and it keeps nobody
        // waiting.
        let memory_counted = hosts.iter().any(|h| h.free_memory_mb.is_some());
        let gpus_counted = hosts.iter().any(|h| h.free_gpus.is_some());
        let hosts: Vec<HostLoad> = hosts
            .iter()
            .map(|h| {
                let promised = answered.promised(Some(&h.name));
                let mut host = h.clone();
                host.slots = host.slots.saturating_sub(promised);
                host.free = host.free.saturating_sub(promised);
                if memory_counted {
                    host.free_memory_mb.get_or_insert(0);
                }
                if gpus_counted {
                    host.free_gpus.get_or_insert(0);
                }
                host
            })
            .collect();
        let free = hosts.iter().fold(0, |a: u32, h| a.saturating_add(h.free));
        Self {
            free_anywhere: free.saturating_sub(answered.promised(None)),
            scavenged: hosts
                .iter()
                .fold(0, |a: u32, h| a.saturating_add(h.scavenged())),
            hosts,
            needed: BTreeMap::new(),
            needed_anywhere: 0,
        }
    }

    /// Promises the slots of a job that may spread anywhere; if `planned`,
    /// only once the free slots and gleaner's together let it start, `None`
    /// while it waits for the cluster's own jobs too.
    fn spread(&mut self, job: &WaitingJob, planned: bool) -> Option<Vec<(Option<String>, u32)>> {
        let from_free = job.slots.min(self.free_anywhere);
        let missing = job.slots - from_free;
        let needed = self
            .needed
            .values()
            .flat_map(BTreeMap::values)
            .fold(self.needed_anywhere, |a, n| a.saturating_add(*n));
        if planned && missing > self.scavenged.saturating_sub(needed) {
            return None;
        }
        self.free_anywhere -= from_free;
        self.needed_anywhere = self.needed_anywhere.saturating_add(missing);
        Some(vec![(None, job.slots)])
    }

    /// Picks a host for each of the job's chunks (each a different host):
    /// the one that can give it, memory and GPUs included, with the fewest
    /// scavenged slots preempted. `None` (and nothing promised) when some
    /// chunk fits no host.
    fn place(&mut self, job: &WaitingJob) -> Option<Vec<(Option<String>, u32)>> {
        let mut hosts = self.hosts.clone();
        let mut taken: Vec<usize> = Vec::new();
        let mut picks = Vec::new();
        // Each chunk on a host of its own, as a fixed allocation rule (and
        // an exclusive job) places them; single slots may share one.
        let distinct = job.together > 1 || job.exclusive;
        for chunk in job.chunks() {
            let needs = job.chunk_needs(chunk);
            let (best, plan) = hosts
                .iter()
                .enumerate()
                .filter(|(i, _)| !distinct || !taken.contains(i))
                .filter_map(|(i, h)| {
                    let plan = match job.exclusive {
                        true if h.only_gleaner() && h.slots >= chunk => {
                            h.give_back(h.slots, needs)?
                        }
                        true => return None,
                        false => h.give_back(chunk, needs)?,
                    };
                    Some((i, plan))
                })
                .min_by(|(a, pa), (b, pb)| {
                    let cost = |plan: &BTreeMap<JobId, u32>| plan.values().sum::<u32>();
                    cost(pa)
                        .cmp(&cost(pb))
                        .then_with(|| hosts[*a].name.cmp(&hosts[*b].name))
                })?;
            let used = if job.exclusive {
                hosts[best].slots
            } else {
                chunk
            };
            taken.push(best);
            hosts[best].occupy(used, needs, &plan);
            picks.push((best, used, plan));
        }
        for (i, used, plan) in &picks {
            let preempt: u32 = plan.values().sum();
            self.free_anywhere = self
                .free_anywhere
                .saturating_sub(used.saturating_sub(preempt));
            let needed = self.needed.entry(*i).or_default();
            for (job, slots) in plan {
                *needed.entry(job.clone()).or_default() += slots;
            }
        }
        self.hosts = hosts;
        Some(
            picks
                .into_iter()
                .map(|(i, used, _)| (Some(self.hosts[i].name.clone()), used))
                .collect(),
        )
    }

    /// The orders: per host from the launchers there, then what any host
    /// may give, split over what the jobs hold and are not already giving.
    fn orders(self, original: &[HostLoad]) -> Vec<ShrinkOrder> {
        let mut orders = Vec::new();
        let mut remaining: BTreeMap<JobId, u32> = BTreeMap::new();
        for host in original {
            for (job, held) in &host.held {
                let total = remaining.entry(job.clone()).or_default();
                *total = total.saturating_add(*held);
            }
        }
        for (&i, needed) in &self.needed {
            let host = &original[i];
            for (job, slots) in needed.clone() {
                if let Some(left) = remaining.get_mut(&job) {
                    *left = left.saturating_sub(slots);
                }
                orders.push(ShrinkOrder {
                    job,
                    slots,
                    hosts: vec![host.name.clone()],
                });
            }
        }
        // Slots anywhere come from launchers that hold no GPU first: a job
        // that wants none started on a GPU's slot would keep the GPU from
        // the jobs that do.
        let holds_gpus = |job: &JobId| {
            original
                .iter()
                .any(|h| h.held_needs.get(job).is_some_and(|n| n.gpus > 0))
        };
        let (gpu_holders, others): (BTreeMap<JobId, u32>, BTreeMap<JobId, u32>) =
            remaining.into_iter().partition(|(job, _)| holds_gpus(job));
        let mut anywhere = self.needed_anywhere;
        for holders in [others, gpu_holders] {
            for (job, slots) in split_shrink(anywhere, &holders) {
                anywhere -= slots;
                orders.push(ShrinkOrder {
                    job,
                    slots,
                    hosts: Vec::new(),
                });
            }
        }
        orders
    }
}

/// Decides, at `now` (ms), what to do for the waiting local jobs. A job
/// answered less than `settle` ms ago is not answered again while the
/// launchers told to go for it have not all left. Once they have, and it
/// still waits, it is answered again at once: another job (a grid
/// component the batch system starts first) may have taken the slots they
/// freed, and an answer counts free slots before it preempts more.
pub fn on_local_wait(
    state: LocalState<'_>,
    answered: &mut Answered,
    now: u64,
    settle: u64,
) -> LocalPlan {
    let held: u32 = state
        .hosts
        .iter()
        .fold(0, |a, h| a.saturating_add(h.scavenged()));
    answered.jobs.retain(|id, promise| {
        let launchers_left = promise.held_after.is_some_and(|after| held <= after);
        now.saturating_sub(promise.at) < settle
            && !launchers_left
            && state.waiting.iter().any(|w| &w.id == id)
    });
    if state.waiting.is_empty() {
        return LocalPlan::default();
    }
    let mut room = Room::new(state.hosts, answered);
    let mut unplaceable = Vec::new();
    let fresh: Vec<&WaitingJob> = state
        .waiting
        .iter()
        .filter(|w| !answered.jobs.contains_key(&w.id))
        .collect();
    let mut promised = Vec::new();
    for job in fresh {
        let slots = if job.spreads() {
            // One that cannot start yet is answered when it can.
            let Some(slots) = room.spread(job, state.planned.contains(job.id.as_str())) else {
                continue;
            };
            slots
        } else {
            room.place(job).unwrap_or_else(|| {
                unplaceable.push(job.id.clone());
                Vec::new()
            })
        };
        promised.push((job.id.clone(), slots));
    }
    let shrink = room.orders(state.hosts);
    let ordered: u32 = shrink.iter().fold(0, |a, o| a.saturating_add(o.slots));
    let held_after = (ordered > 0).then(|| held.saturating_sub(ordered));
    for (job, slots) in promised {
        answered.jobs.insert(
            job,
            Promise {
                at: now,
                slots,
                held_after,
            },
        );
    }
    LocalPlan {
        withdraw: state.pending_placeholders.to_vec(),
        shrink,
        unplaceable,
    }
}

#[cfg(test)]
mod tests;
