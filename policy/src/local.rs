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
mod tests {
    use super::*;

    fn job(name: &str) -> JobId {
        format!("{name}-0000000000000000").parse().unwrap()
    }

    fn host(name: &str, slots: u32, free: u32, held: &[(&str, u32)]) -> HostLoad {
        HostLoad {
            name: name.into(),
            slots,
            free,
            held: held.iter().map(|(j, n)| (job(j), *n)).collect(),
            ..HostLoad::default()
        }
    }

    fn order(name: &str, slots: u32, hosts: &[&str]) -> ShrinkOrder {
        ShrinkOrder {
            job: job(name),
            slots,
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        }
    }

    fn plan(
        waiting: &[WaitingJob],
        hosts: &[HostLoad],
        answered: &mut Answered,
        now: u64,
    ) -> LocalPlan {
        let state = LocalState {
            waiting,
            hosts,
            pending_placeholders: &[],
            planned: &BTreeSet::new(),
        };
        on_local_wait(state, answered, now, 5000)
    }

    #[test]
    fn nothing_waits_nothing_happens() {
        let hosts = [host("n1", 8, 0, &[("a", 8)])];
        let state = LocalState {
            waiting: &[],
            hosts: &hosts,
            pending_placeholders: &["1.2".into()],
            planned: &BTreeSet::new(),
        };
        assert_eq!(
            on_local_wait(state, &mut Answered::default(), 0, 5000),
            LocalPlan::default()
        );
    }

    #[test]
    fn pending_placeholders_go_first_and_the_need_is_split_once() {
        let hosts = [host("n1", 8, 0, &[("a", 4), ("b", 4)])];
        let waiting = [WaitingJob::anywhere("7", 4)];
        let pending = ["9.1".to_owned(), "9.2".to_owned()];
        let state = LocalState {
            waiting: &waiting,
            hosts: &hosts,
            pending_placeholders: &pending,
            planned: &BTreeSet::new(),
        };
        let plan = on_local_wait(state, &mut Answered::default(), 0, 5000);
        assert_eq!(plan.withdraw, pending);
        assert_eq!(
            plan.shrink,
            [order("a", 2, &[]), order("b", 2, &[])],
            "4 slots in all, not 4 each"
        );
    }

    #[test]
    fn idle_slots_count_and_a_wait_is_answered_once() {
        let mut answered = Answered::default();
        let hosts = [host("n1", 8, 2, &[("a", 6)])];
        let w = [WaitingJob::anywhere("7", 4)];
        assert_eq!(
            plan(&w, &hosts, &mut answered, 0).shrink,
            [order("a", 2, &[])]
        );
        // Still waiting a second later: the order is under way.
        let hosts = [host("n1", 8, 4, &[("a", 4)])];
        assert!(plan(&w, &hosts, &mut answered, 1000).shrink.is_empty());
        // A new local job arrives; the 4 idle slots are meant for the first one.
        let w2 = [WaitingJob::anywhere("7", 4), WaitingJob::anywhere("8", 2)];
        assert_eq!(
            plan(&w2, &hosts, &mut answered, 1500).shrink,
            [order("a", 2, &[])]
        );
        // Still waiting after the settle time: answered again.
        let hosts = [host("n1", 8, 0, &[("a", 8)])];
        assert_eq!(
            plan(&w, &hosts, &mut answered, 7000).shrink,
            [order("a", 4, &[])]
        );
    }

    #[test]
    fn slots_taken_by_another_job_are_asked_for_again_once_the_launchers_left() {
        let mut answered = Answered::default();
        let w = [WaitingJob::anywhere("7", 4)];
        let hosts = [host("n1", 8, 2, &[("a", 6)])];
        assert_eq!(
            plan(&w, &hosts, &mut answered, 0).shrink,
            [order("a", 2, &[])]
        );
        // The launchers left, but a grid component the batch system
        // started first took their slots: the job is answered again at
        // once, not after the settle time.
        let hosts = [host("n1", 8, 0, &[("a", 4)])];
        assert_eq!(
            plan(&w, &hosts, &mut answered, 1000).shrink,
            [order("a", 4, &[])]
        );
        // Those launchers have not left yet: nothing more.
        assert!(plan(&w, &hosts, &mut answered, 2000).shrink.is_empty());
    }

    #[test]
    fn a_planned_job_that_waits_for_the_clusters_own_jobs_too_costs_nothing_until_they_leave() {
        let w = [WaitingJob::anywhere("7", 8)];
        let planned = BTreeSet::from(["7"]);
        let plan_for =
            |hosts: &[HostLoad], planned: &BTreeSet<&str>, answered: &mut Answered, now| {
                let state = LocalState {
                    waiting: &w,
                    hosts,
                    pending_placeholders: &[],
                    planned,
                };
                on_local_wait(state, answered, now, 5000)
            };
        // 7 slots held by the cluster's own jobs, 1 by gleaner: gleaner
        // leaving would only leave a hole in the batch system's plan…
        let busy = [host("n1", 8, 0, &[("a", 1)])];
        let mut answered = Answered::default();
        let early = plan_for(&busy, &planned, &mut answered, 0);
        assert!(
            early.shrink.is_empty() && early.unplaceable.is_empty(),
            "{early:?}"
        );
        // …until they left 4 free: gleaner's 4 are what is missing, at once.
        let left = [host("n1", 8, 4, &[("a", 4)])];
        assert_eq!(
            plan_for(&left, &planned, &mut answered, 100).shrink,
            [order("a", 4, &[])]
        );
        // A job whose start nothing plans gets room at once, never more
        // than gleaner holds.
        let unplanned = plan_for(&busy, &BTreeSet::new(), &mut Answered::default(), 0);
        assert_eq!(unplanned.shrink, [order("a", 1, &[])]);
    }

    #[test]
    fn a_one_host_job_empties_the_cheapest_host_only() {
        // n2 has 1 slot idle: it costs 3 preempted slots, the others 4.
        let hosts = [
            host("n1", 4, 0, &[("a", 4)]),
            host("n2", 4, 1, &[("a", 2), ("b", 1)]),
            host("n3", 4, 0, &[("b", 4)]),
        ];
        let w = [WaitingJob::one_host("7", 4)];
        let plan = plan(&w, &hosts, &mut Answered::default(), 0);
        assert_eq!(
            plan.shrink,
            [order("a", 2, &["n2"]), order("b", 1, &["n2"])]
        );
        assert!(plan.unplaceable.is_empty());
    }

    #[test]
    fn local_work_on_a_host_rules_it_out() {
        // n1 runs a 2-slot local job: 4 slots can never be had there.
        let hosts = [host("n1", 4, 0, &[("a", 2)]), host("n2", 4, 0, &[("a", 4)])];
        let w = [WaitingJob::one_host("7", 4)];
        assert_eq!(
            plan(&w, &hosts, &mut Answered::default(), 0).shrink,
            [order("a", 4, &["n2"])]
        );
    }

    #[test]
    fn two_one_host_jobs_empty_two_hosts_and_no_more() {
        let hosts = [
            host("n1", 4, 0, &[("a", 4)]),
            host("n2", 4, 0, &[("a", 4)]),
            host("n3", 4, 0, &[("a", 4)]),
        ];
        let w = [WaitingJob::one_host("7", 4), WaitingJob::one_host("8", 4)];
        let mut answered = Answered::default();
        assert_eq!(
            plan(&w, &hosts, &mut answered, 0).shrink,
            [order("a", 4, &["n1"]), order("a", 4, &["n2"])]
        );
        // A poll later n1 is free and its job started; n2 is being emptied.
        let hosts = [
            host("n1", 4, 0, &[]),
            host("n2", 4, 2, &[("a", 2)]),
            host("n3", 4, 0, &[("a", 4)]),
        ];
        let w = [WaitingJob::one_host("8", 4)];
        assert!(plan(&w, &hosts, &mut answered, 1000).shrink.is_empty());
    }

    /// A host whose launchers hold memory and GPUs beside their slots.
    fn rich_host(
        name: &str,
        free_memory_mb: u64,
        free_gpus: u32,
        held: &[(&str, u32, u64, u32)],
    ) -> HostLoad {
        HostLoad {
            free_memory_mb: Some(free_memory_mb),
            free_gpus: Some(free_gpus),
            held_needs: held
                .iter()
                .map(|(j, _, memory_mb, gpus)| {
                    let needs = Needs {
                        memory_mb: *memory_mb,
                        gpus: *gpus,
                    };
                    (job(j), needs)
                })
                .collect(),
            ..host(
                name,
                4,
                0,
                &held.iter().map(|(j, n, _, _)| (*j, *n)).collect::<Vec<_>>(),
            )
        }
    }

    fn needing(id: &str, slots: u32, memory_mb: u64, gpus: u32) -> WaitingJob {
        WaitingJob {
            needs: Needs { memory_mb, gpus },
            ..WaitingJob::anywhere(id, slots)
        }
    }

    #[test]
    fn a_memory_bound_job_frees_memory_where_it_costs_least() {
        // n1's launchers hold all its memory; n2's hold none of theirs.
        let hosts = [
            rich_host("n1", 0, 0, &[("mem", 4, 4000, 0)]),
            rich_host("n2", 4000, 0, &[("cpu", 4, 0, 0)]),
        ];
        let big = needing("7", 1, 3000, 0);
        let p = plan(
            std::slice::from_ref(&big),
            &hosts,
            &mut Answered::default(),
            0,
        );
        assert_eq!(p.shrink, vec![order("cpu", 1, &["n2"])]);
        // Where the others' memory is taken by someone else, only n1 can.
        let hosts = [
            hosts[0].clone(),
            rich_host("n2", 1000, 0, &[("cpu", 4, 0, 0)]),
        ];
        let p = plan(&[big], &hosts, &mut Answered::default(), 0);
        assert_eq!(p.shrink, vec![order("mem", 3, &["n1"])], "3 × 1000M");
        assert!(p.unplaceable.is_empty());
    }

    #[test]
    fn a_wide_launchers_gpu_is_freed_though_each_slot_holds_a_fraction() {
        // Launchers of 4 slots and 1 GPU: a quarter GPU per slot.
        let hosts = [rich_host("n1", 4000, 0, &[("wide", 8, 0, 2)])];
        let p = plan(
            &[needing("12", 1, 0, 1)],
            &hosts,
            &mut Answered::default(),
            0,
        );
        assert_eq!(
            p.shrink,
            vec![order("wide", 4, &["n1"])],
            "one whole launcher"
        );
        assert!(p.unplaceable.is_empty());
    }

    #[test]
    fn slots_anywhere_come_from_launchers_without_gpus_first() {
        let hosts = [rich_host(
            "n1",
            4000,
            0,
            &[("cpu", 2, 0, 0), ("gpu", 2, 0, 2)],
        )];
        let p = plan(
            &[WaitingJob::anywhere("14", 2)],
            &hosts,
            &mut Answered::default(),
            0,
        );
        assert_eq!(p.shrink, vec![order("cpu", 2, &[])]);
        let p = plan(
            &[WaitingJob::anywhere("15", 3)],
            &hosts,
            &mut Answered::default(),
            0,
        );
        assert_eq!(p.shrink, vec![order("cpu", 2, &[]), order("gpu", 1, &[])]);
    }

    #[test]
    fn single_slots_with_memory_may_share_a_host() {
        // Four slots anywhere, 500M each: n1 has room for all of them.
        let hosts = [
            rich_host("n1", 4000, 0, &[("cpu", 4, 0, 0)]),
            rich_host("n2", 0, 0, &[("mem", 4, 4000, 0)]),
        ];
        let p = plan(
            &[needing("11", 4, 2000, 0)],
            &hosts,
            &mut Answered::default(),
            0,
        );
        assert_eq!(p.shrink, vec![order("cpu", 4, &["n1"])]);
        assert!(p.unplaceable.is_empty());
    }

    #[test]
    fn a_gpu_job_preempts_a_gpu_launcher_not_a_cpu_one() {
        let hosts = [rich_host(
            "n1",
            4000,
            0,
            &[("cpu", 2, 0, 0), ("gpu", 2, 0, 2)],
        )];
        let p = plan(
            &[needing("8", 1, 0, 1)],
            &hosts,
            &mut Answered::default(),
            0,
        );
        assert_eq!(p.shrink, vec![order("gpu", 1, &["n1"])]);
    }

    #[test]
    fn a_gpu_job_goes_where_the_gpus_are_not_to_a_host_without() {
        // `cpu-only` has free slots but no GPUs; `gpus` is full.
        let cpu_only = HostLoad {
            free_gpus: None,
            ..host("cpu-only", 4, 4, &[])
        };
        let hosts = [cpu_only, rich_host("gpus", 0, 0, &[("gpu", 4, 0, 4)])];
        let p = plan(
            &[needing("13", 1, 0, 1)],
            &hosts,
            &mut Answered::default(),
            0,
        );
        assert_eq!(p.shrink, vec![order("gpu", 1, &["gpus"])]);
    }

    #[test]
    fn more_memory_or_gpus_than_any_host_has_preempts_nothing() {
        let hosts = [
            rich_host("n1", 0, 0, &[("mem", 4, 4000, 0)]),
            rich_host("n2", 0, 2, &[("gpu", 4, 4000, 0)]),
        ];
        for job in [needing("9", 1, 5000, 0), needing("10", 1, 0, 3)] {
            let p = plan(
                std::slice::from_ref(&job),
                &hosts,
                &mut Answered::default(),
                0,
            );
            assert!(p.shrink.is_empty(), "{p:?}");
            assert_eq!(p.unplaceable, vec![job.id]);
        }
    }

    #[test]
    fn a_job_no_host_can_take_preempts_nothing_however_often_it_is_seen() {
        let hosts = [host("n1", 4, 0, &[("a", 4)]), host("n2", 4, 0, &[("a", 4)])];
        let w = [WaitingJob::one_host("7", 5)];
        let mut answered = Answered::default();
        for (now, told) in [(0, true), (1000, false), (6000, true), (7000, false)] {
            let plan = plan(&w, &hosts, &mut answered, now);
            assert!(plan.shrink.is_empty());
            assert_eq!(plan.unplaceable.len(), usize::from(told), "once a settle");
        }
    }

    #[test]
    fn fixed_allocations_take_a_chunk_per_host() {
        // 4 slots, 2 per host (Grid Engine allocation_rule 2).
        let hosts = [
            host("n1", 4, 2, &[("a", 2)]),
            host("n2", 4, 1, &[("a", 3)]),
            host("n3", 4, 0, &[("a", 4)]),
        ];
        let w = [WaitingJob {
            together: 2,
            ..WaitingJob::anywhere("7", 4)
        }];
        assert_eq!(
            plan(&w, &hosts, &mut Answered::default(), 0).shrink,
            [order("a", 1, &["n2"])],
            "n1's 2 idle slots, then n2 at the cost of 1"
        );
    }

    #[test]
    fn an_exclusive_job_wants_a_host_with_nothing_else_on_it() {
        let hosts = [
            host("n1", 4, 3, &[]),
            host("n2", 4, 0, &[("a", 4)]),
            host("n3", 4, 2, &[("a", 2)]),
        ];
        // n1 has a 1-slot local job: not exclusive however free.
        let w = [WaitingJob {
            exclusive: true,
            ..WaitingJob::anywhere("7", 1)
        }];
        assert_eq!(
            plan(&w, &hosts, &mut Answered::default(), 0).shrink,
            [order("a", 2, &["n3"])]
        );
    }

    #[test]
    fn a_one_slot_job_asks_for_one_slot_anywhere() {
        // One 4-slot launcher per host: the runner preempts one whole.
        let hosts = [host("n1", 4, 0, &[("a", 4)]), host("n2", 4, 0, &[("a", 4)])];
        let w = [WaitingJob::one_host("7", 1)];
        assert_eq!(
            plan(&w, &hosts, &mut Answered::default(), 0).shrink,
            [order("a", 1, &[])]
        );
    }

    #[test]
    fn chunks_cover_the_slots() {
        let chunks = |slots, together| {
            WaitingJob {
                together,
                ..WaitingJob::anywhere("x", slots)
            }
            .chunks()
        };
        assert_eq!(chunks(4, 4), [4]);
        assert_eq!(chunks(4, 2), [2, 2]);
        assert_eq!(chunks(5, 2), [2, 2, 1]);
        assert_eq!(chunks(3, 8), [3]);
        assert_eq!(chunks(0, 1), [1], "a job asks for a slot at least");
    }
}
