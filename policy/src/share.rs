//! CS policies: how idle slots are split between scavenging jobs.
//!
//! Pure functions from a snapshot of the grid to a plan: grow offers, and
//! drains that move slots from jobs above their fair share to jobs below it
//! (gleaner's SEP and GEP); KOALA-CS's own GEP, kept to rerun its thesis's
//! experiments, shares idle slots only and drains nobody. The scheduler
//! applies the plan; a simulator can drive the same functions with a
//! simulated clock.

use std::collections::{BTreeMap, BTreeSet};

use gleaner_manifest::JobId;
use gleaner_protocol::ClusterName;
use serde::{Deserialize, Serialize};

/// Which CS policy splits the idle slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CsPolicy {
    /// Each cluster's idle slots are split evenly between the jobs (SEP).
    #[default]
    SiteEquipartition,
    /// The grid's idle slots are split evenly, wherever they are (GEP).
    GridEquipartition,
    /// KOALA-CS's GEP as its thesis ran it (seed 000, section 3.7.1): each
    /// round the grid's idle slots are split evenly between the jobs that
    /// want more, whatever they hold already, and nobody is drained. Kept
    /// to rerun the thesis's fairness experiments beside gleaner's GEP.
    KoalaGridEquipartition,
}

impl std::str::FromStr for CsPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "site-equipartition" | "sep" => Ok(Self::SiteEquipartition),
            "grid-equipartition" | "gep" => Ok(Self::GridEquipartition),
            "koala-grid-equipartition" | "koala-gep" => Ok(Self::KoalaGridEquipartition),
            other => Err(format!(
                "{other:?} is not a policy (site-equipartition, grid-equipartition or koala-grid-equipartition)"
            )),
        }
    }
}

impl CsPolicy {
    pub fn name(self) -> &'static str {
        match self {
            Self::SiteEquipartition => "site-equipartition",
            Self::GridEquipartition => "grid-equipartition",
            Self::KoalaGridEquipartition => "koala-grid-equipartition",
        }
    }

    /// Whether it may drain jobs above their share (with `rebalance`):
    /// KOALA-CS's GEP never did.
    fn drains(self) -> bool {
        match self {
            Self::SiteEquipartition | Self::GridEquipartition => true,
            Self::KoalaGridEquipartition => false,
        }
    }
}

/// The CS policy's settings (keys of `[scheduler]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicyConfig {
    pub policy: CsPolicy,
    /// No grow where the load of others (local and grid jobs) is at least this.
    pub load_cap: f64,
    /// Move slots between jobs when one is below its fair share and another
    /// above (never under `koala-grid-equipartition`).
    pub rebalance: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            policy: CsPolicy::SiteEquipartition,
            load_cap: 0.8,
            rebalance: true,
        }
    }
}

/// A cluster as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInput {
    pub name: ClusterName,
    pub total: u32,
    /// Free slots not yet promised to anyone.
    pub idle: u32,
    /// Slots used by local and grid jobs.
    pub others: u32,
    /// Slots each scavenging job holds (placeholders, and grants in flight).
    pub held: BTreeMap<JobId, u32>,
    /// Excluded from grows (failing launcher starts, no recent report).
    pub excluded: bool,
    /// Jobs giving slots back here right now; they get none meanwhile.
    pub draining: std::collections::BTreeSet<JobId>,
    /// Jobs whose launchers fail to start here (their account's, not the
    /// cluster's failures): they get none here for a while.
    pub barred: std::collections::BTreeSet<JobId>,
    /// The hosts whose GPUs the batch system counts; `None` where it counts
    /// none (GPU jobs get nothing there).
    pub gpu_hosts: Option<Vec<GpuHost>>,
}

/// A host with GPUs, as the GPU share sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHost {
    pub name: String,
    /// Slots nobody holds.
    pub free_slots: u32,
    /// GPUs nobody holds.
    pub free_gpus: u32,
    /// Slots each scavenging job's launchers hold here.
    pub held: BTreeMap<JobId, u32>,
}

impl ClusterInput {
    fn load(&self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            f64::from(self.others) / f64::from(self.total)
        }
    }
}

/// A scavenging job as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInput {
    pub id: JobId,
    /// More slots it could use right now.
    pub demand: u32,
    /// Its weight in the share (at least 1): a job of weight 2 is given
    /// twice the slots of a job of weight 1 where both could use more.
    pub weight: u32,
    /// Slots each of its tasks takes: its share is in whole tasks.
    pub task_slots: u32,
    /// GPUs each of its tasks takes: a GPU job shares the GPUs with the
    /// other GPU jobs, apart from the slots CPU jobs share.
    pub gpus: u32,
}

/// A scavenging job's need, as the scheduler and its runner see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// Tasks not finished (pending or running).
    pub unfinished: u64,
    /// Slots each task takes.
    pub task_slots: u32,
    /// The most slots its launchers may hold (`max_launchers`).
    pub max_slots: Option<u32>,
}

/// More slots a scavenging job could use: `task_slots` per unfinished task
/// that the slots it holds or was promised (`covered`) do not already
/// serve, within its own limit. The scheduler offers no more than this,
/// and a runner takes no more.
pub fn demand(need: Need, covered: u64) -> u32 {
    let all = need
        .unfinished
        .saturating_mul(u64::from(need.task_slots.max(1)));
    let wanted = need.max_slots.map_or(all, |max| all.min(u64::from(max)));
    u32::try_from(wanted.saturating_sub(covered)).unwrap_or(u32::MAX)
}

/// How many of `offered` slots a job accepts while its launchers hold
/// `capacity`: as many as its tasks can keep busy, within its limit, in
/// whole tasks' worth.
pub fn accepted(offered: u32, need: Need, capacity: u64) -> u32 {
    let slots = offered.min(demand(need, capacity));
    slots - slots % need.task_slots.max(1)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub job: JobId,
    pub cluster: ClusterName,
    pub slots: u32,
}

/// Slots a job should give back on a cluster, without losing work (from
/// launchers on `hosts`, anywhere when empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    pub job: JobId,
    pub cluster: ClusterName,
    pub slots: u32,
    pub hosts: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub offers: Vec<Offer>,
    pub drains: Vec<Drain>,
}

/// Splits `amount` between claimants capped by `caps`, as evenly as the caps
/// allow (water-filling). Remainders go to the earliest claimants, so callers
/// order them by who should get the odd slot.
pub fn equipartition(amount: u32, caps: &[u32]) -> Vec<u32> {
    weighted_equipartition(amount, caps, &vec![1; caps.len()])
}

/// [`equipartition`] in proportion to `weights` (each at least 1): what a
/// claimant cannot use goes to the others, in proportion again, and odd
/// slots to the largest remainders (the earliest claimant among equals).
pub fn weighted_equipartition(amount: u32, caps: &[u32], weights: &[u32]) -> Vec<u32> {
    let mut shares = vec![0u32; caps.len()];
    let mut left = amount;
    loop {
        let open: Vec<usize> = (0..caps.len()).filter(|&i| shares[i] < caps[i]).collect();
        if left == 0 || open.is_empty() {
            return shares;
        }
        let total: u64 = open.iter().map(|&i| u64::from(weights[i].max(1))).sum();
        let mut capped = false;
        let mut remainders = Vec::with_capacity(open.len());
        let mut given = 0;
        for &i in &open {
            let exact = u64::from(left) * u64::from(weights[i].max(1));
            let part = u32::try_from(exact / total).unwrap_or(u32::MAX);
            let add = part.min(caps[i] - shares[i]);
            capped |= add < part;
            shares[i] += add;
            given += add;
            remainders.push((exact % total, i));
        }
        left -= given;
        if capped {
            continue;
        }
        // Stable: among equal remainders the earliest claimant goes first.
        remainders.sort_by_key(|r| std::cmp::Reverse(r.0));
        for (_, i) in remainders {
            if left > 0 && shares[i] < caps[i] {
                shares[i] += 1;
                left -= 1;
            }
        }
    }
}

/// [`weighted_equipartition`] in whole tasks: a job whose tasks take
/// several slots is given its share rounded to the nearest whole number of
/// tasks (a half rounds up), within what is left, and the others share
/// the rest again. Without, a 4-slot job's share of 3 slots is no task.
pub fn whole_task_targets(
    capacity: u32,
    wants: &[u32],
    weights: &[u32],
    task_slots: &[u32],
) -> Vec<u32> {
    let mut fixed: Vec<Option<u32>> = vec![None; wants.len()];
    loop {
        let open: Vec<usize> = (0..wants.len()).filter(|&i| fixed[i].is_none()).collect();
        let left = capacity.saturating_sub(fixed.iter().flatten().sum());
        let caps: Vec<u32> = open.iter().map(|&i| wants[i]).collect();
        let open_weights: Vec<u32> = open.iter().map(|&i| weights[i]).collect();
        let shares = weighted_equipartition(left, &caps, &open_weights);
        let uneven = open
            .iter()
            .zip(&shares)
            .find(|(i, share)| **share % task_slots[**i].max(1) != 0);
        let Some((&i, &share)) = uneven else {
            let mut targets: Vec<u32> = fixed.iter().map(|t| t.unwrap_or(0)).collect();
            for (i, share) in open.into_iter().zip(shares) {
                targets[i] = share;
            }
            return targets;
        };
        let task = task_slots[i].max(1);
        let nearest = share.saturating_add(task / 2) / task * task;
        let room = left.min(wants[i]) / task * task;
        fixed[i] = Some(nearest.min(room));
    }
}

/// The GPU jobs' side of a cluster, and the CPU jobs' side once they have
/// theirs.
mod gpu_pool {
    use std::collections::BTreeMap;

    use super::{ClusterInput, Drain, GpuHost, JobInput, split_shrink};

    /// Slots of `job`'s tasks that a host's free slots and GPUs hold.
    fn room(host: &GpuHost, job: &JobInput) -> u32 {
        let task = job.task_slots.max(1);
        let tasks = (host.free_slots / task).min(host.free_gpus / job.gpus.max(1));
        tasks * task
    }

    /// What the host's GPUs could run of the GPU job that uses most slots
    /// per GPU, were its slots free.
    fn gpu_slots(host: &GpuHost, jobs: &[JobInput]) -> u32 {
        jobs.iter()
            .map(|j| host.free_gpus / j.gpus.max(1) * j.task_slots.max(1))
            .max()
            .unwrap_or(0)
    }

    /// Each GPU job's demand within the slots free GPUs could run (some
    /// perhaps held by CPU jobs now): more would wait in a batch queue for
    /// GPUs.
    pub fn capped(clusters: &[ClusterInput], mut jobs: Vec<JobInput>) -> Vec<JobInput> {
        for job in &mut jobs {
            let room: u32 = clusters
                .iter()
                .flat_map(|c| c.gpu_hosts.iter().flatten())
                .map(|h| gpu_slots(h, std::slice::from_ref(job)))
                .sum();
            job.demand = job.demand.min(room);
        }
        jobs
    }

    /// The cluster as GPU jobs share it: the slots that go with its free
    /// GPUs, and what GPU jobs hold.
    pub fn gpu_side(cluster: &ClusterInput, jobs: &[JobInput]) -> ClusterInput {
        let hosts = cluster.gpu_hosts.iter().flatten();
        let room: u32 = hosts
            .map(|h| jobs.iter().map(|j| room(h, j)).max().unwrap_or(0))
            .sum();
        ClusterInput {
            idle: cluster.idle.min(room),
            held: only(&cluster.held, jobs, true),
            excluded: cluster.excluded,
            ..cluster.clone()
        }
    }

    /// What the GPU jobs that may have more here want.
    fn hungry_here(cluster: &ClusterInput, jobs: &[JobInput]) -> u32 {
        jobs.iter()
            .filter(|j| !cluster.barred.contains(&j.id) && !cluster.draining.contains(&j.id))
            .map(|j| j.demand)
            .sum()
    }

    /// The cluster as CPU jobs share it: the idle slots GPU jobs neither
    /// take nor could take while they want more, and what CPU jobs hold.
    pub fn cpu_side(cluster: &ClusterInput, gpu: &ClusterInput, jobs: &[JobInput]) -> ClusterInput {
        let kept = match gpu.excluded {
            true => 0,
            false => gpu.idle.min(hungry_here(cluster, jobs)),
        };
        ClusterInput {
            idle: cluster.idle.saturating_sub(kept),
            held: only(&cluster.held, jobs, false),
            ..cluster.clone()
        }
    }

    /// The holdings of the GPU jobs (`gpu`), or of every other job.
    fn only(
        held: &BTreeMap<gleaner_manifest::JobId, u32>,
        gpu_jobs: &[JobInput],
        gpu: bool,
    ) -> BTreeMap<gleaner_manifest::JobId, u32> {
        held.iter()
            .filter(|(job, _)| gpu_jobs.iter().any(|j| &j.id == *job) == gpu)
            .map(|(job, n)| (job.clone(), *n))
            .collect()
    }

    /// Drains of CPU jobs' launchers on hosts whose free GPUs lack the
    /// slots to run GPU tasks, up to `unmet` slots GPU jobs still want.
    pub fn make_room(clusters: &[ClusterInput], jobs: &[JobInput], mut unmet: u32) -> Vec<Drain> {
        let mut drains = Vec::new();
        for cluster in clusters
            .iter()
            .filter(|c| c.draining.is_empty() && !c.excluded)
        {
            let mut unmet_here = unmet.min(hungry_here(cluster, jobs));
            for host in cluster.gpu_hosts.iter().flatten() {
                let missing = gpu_slots(host, jobs)
                    .saturating_sub(host.free_slots)
                    .min(unmet_here);
                if missing == 0 {
                    continue;
                }
                let cpu = only(&host.held, jobs, false);
                for (job, slots) in split_shrink(missing, &cpu) {
                    unmet -= slots;
                    unmet_here -= slots;
                    drains.push(Drain {
                        job,
                        cluster: cluster.name.clone(),
                        slots,
                        hosts: vec![host.name.clone()],
                    });
                }
            }
        }
        drains
    }
}

/// Splits a shrink of `slots` on one cluster between the jobs holding slots
/// there, evenly and never more than a job holds (each job once, together
/// covering the amount). Returns `(job, slots)` for every job that gives some.
pub fn split_shrink(slots: u32, held: &BTreeMap<JobId, u32>) -> Vec<(JobId, u32)> {
    let mut holders: Vec<(&JobId, u32)> = held
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(j, n)| (j, *n))
        .collect();
    // The odd slot comes from whoever holds most.
    holders.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let caps: Vec<u32> = holders.iter().map(|(_, n)| *n).collect();
    equipartition(slots, &caps)
        .into_iter()
        .zip(holders)
        .filter(|(n, _)| *n > 0)
        .map(|(n, (job, _))| (job.clone(), n))
        .collect()
}

/// What the round has given so far: each job's remaining demand and its
/// slots grid-wide, and the hungry jobs ordered by those slots, so that odd
/// slots go to whoever has least anywhere (not to the same job everywhere).
struct Book<'a> {
    demand: BTreeMap<&'a JobId, u32>,
    weight: BTreeMap<&'a JobId, u32>,
    task_slots: BTreeMap<&'a JobId, u32>,
    global: BTreeMap<&'a JobId, u32>,
    hungry: BTreeSet<(u32, &'a JobId)>,
}

impl<'a> Book<'a> {
    fn new(clusters: &'a [ClusterInput], jobs: &'a [JobInput]) -> Self {
        let mut global: BTreeMap<&JobId, u32> = jobs.iter().map(|j| (&j.id, 0)).collect();
        for cluster in clusters {
            for (job, held) in &cluster.held {
                if let Some(total) = global.get_mut(job) {
                    *total += held;
                }
            }
        }
        let demand: BTreeMap<&JobId, u32> = jobs.iter().map(|j| (&j.id, j.demand)).collect();
        let weight = jobs.iter().map(|j| (&j.id, j.weight.max(1))).collect();
        let task_slots = jobs.iter().map(|j| (&j.id, j.task_slots.max(1))).collect();
        let hungry = demand
            .iter()
            .filter(|(_, d)| **d > 0)
            .map(|(job, _)| (global[job], *job))
            .collect();
        Self {
            demand,
            weight,
            task_slots,
            global,
            hungry,
        }
    }

    fn global(&self, job: &JobId) -> u32 {
        self.global.get(job).copied().unwrap_or(0)
    }

    fn demand(&self, job: &JobId) -> u32 {
        self.demand.get(job).copied().unwrap_or(0)
    }

    fn weight(&self, job: &JobId) -> u32 {
        self.weight.get(job).copied().unwrap_or(1)
    }

    fn task_slots(&self, job: &JobId) -> u32 {
        self.task_slots.get(job).copied().unwrap_or(1)
    }

    /// Records an offer of `slots` to `job`.
    fn give(&mut self, job: &JobId, slots: u32) {
        let (Some((&key, demand)), Some(global)) =
            (self.demand.get_key_value(job), self.global.get(job))
        else {
            return;
        };
        let (demand, global) = (*demand, *global);
        self.hungry.remove(&(global, key));
        let left = demand.saturating_sub(slots);
        self.demand.insert(key, left);
        self.global.insert(key, global + slots);
        if left > 0 {
            self.hungry.insert((global + slots, key));
        }
    }
}

/// The plan for one scheduling round. SEP shares each cluster on its own;
/// GEP shares the whole grid as one pool. Where the batch system counts
/// GPUs, GPU jobs share the slots that go with free GPUs first, among
/// themselves; CPU jobs share the rest, and give back slots on hosts whose
/// GPUs they would keep idle while a GPU job waits. Elsewhere every job
/// shares the slots, and the batch system holds GPU placeholders until
/// GPUs are free.
pub fn plan(clusters: &[ClusterInput], jobs: &[JobInput], config: &PolicyConfig) -> Plan {
    let (counted, uncounted): (Vec<ClusterInput>, Vec<ClusterInput>) = clusters
        .iter()
        .cloned()
        .partition(|c| c.gpu_hosts.is_some());
    let (gpu_jobs, cpu_jobs): (Vec<JobInput>, Vec<JobInput>) =
        jobs.iter().cloned().partition(|j| j.gpus > 0);
    if gpu_jobs.is_empty() || counted.is_empty() {
        return plan_pool(clusters, jobs, config);
    }
    let mut plan = plan_pool(&uncounted, jobs, config);
    let counted_plan = plan_with_gpus(&counted, gpu_jobs, &cpu_jobs, config);
    plan.offers.extend(counted_plan.offers);
    plan.drains.extend(counted_plan.drains);
    plan
}

/// [`plan`] on clusters that count GPUs.
fn plan_with_gpus(
    clusters: &[ClusterInput],
    gpu_jobs: Vec<JobInput>,
    cpu_jobs: &[JobInput],
    config: &PolicyConfig,
) -> Plan {
    let gpu_jobs = gpu_pool::capped(clusters, gpu_jobs);
    let gpu_clusters: Vec<ClusterInput> = clusters
        .iter()
        .map(|c| gpu_pool::gpu_side(c, &gpu_jobs))
        .collect();
    let mut plan = plan_pool(&gpu_clusters, &gpu_jobs, config);
    let hungry: u32 = gpu_jobs.iter().map(|j| j.demand).sum();
    let cpu_clusters: Vec<ClusterInput> = clusters
        .iter()
        .zip(&gpu_clusters)
        .map(|(c, gpu)| gpu_pool::cpu_side(c, gpu, &gpu_jobs))
        .collect();
    let cpu_plan = plan_pool(&cpu_clusters, cpu_jobs, config);
    let offered: u32 = plan.offers.iter().map(|o| o.slots).sum();
    if config.rebalance && config.policy.drains() {
        plan.drains.extend(gpu_pool::make_room(
            clusters,
            &gpu_jobs,
            hungry.saturating_sub(offered),
        ));
    }
    plan.offers.extend(cpu_plan.offers);
    plan.drains.extend(cpu_plan.drains);
    plan
}

/// [`plan`] for one pool of jobs.
fn plan_pool(clusters: &[ClusterInput], jobs: &[JobInput], config: &PolicyConfig) -> Plan {
    let mut book = Book::new(clusters, jobs);
    let mut plan = Plan::default();
    match config.policy {
        CsPolicy::SiteEquipartition => {
            for cluster in clusters.iter().filter(|c| can_grow(c, config.load_cap)) {
                share(&[cluster], &mut book, config.rebalance, &mut plan);
            }
        }
        CsPolicy::GridEquipartition => {
            if let Some(pool) = grid_pool(clusters, config.load_cap) {
                share(&pool, &mut book, config.rebalance, &mut plan);
            }
        }
        CsPolicy::KoalaGridEquipartition => {
            if let Some(pool) = grid_pool(clusters, config.load_cap) {
                share_idle(&pool, &mut book, &mut plan);
            }
        }
    }
    plan
}

/// The clusters a grid-wide policy shares as one pool; `None` when the
/// grid's load of others reaches `load_cap`: then nobody grows anywhere.
fn grid_pool(clusters: &[ClusterInput], load_cap: f64) -> Option<Vec<&ClusterInput>> {
    let pool: Vec<&ClusterInput> = clusters
        .iter()
        .filter(|c| !c.excluded && c.total > 0)
        .collect();
    let total: u32 = pool.iter().map(|c| c.total).sum();
    let others: u32 = pool.iter().map(|c| c.others).sum();
    (total > 0 && f64::from(others) / f64::from(total) < load_cap).then_some(pool)
}

/// KOALA-CS's GEP: the pool's idle slots split evenly between the jobs
/// that want more (in whole tasks, by weight, within their demands),
/// whatever they hold already, each share taken from the clusters with
/// most idle slots wherever the job's other slots are. Nobody is drained:
/// a job that came late catches up only as slots free up, which is what
/// the thesis measured.
fn share_idle<'a>(pool: &[&'a ClusterInput], book: &mut Book<'a>, plan: &mut Plan) {
    let gets_none = stopped_in(pool);
    let idle: u32 = pool.iter().map(|c| c.idle).sum();
    // Holding least first: odd slots go to them.
    let hungry: Vec<&'a JobId> = book
        .hungry
        .iter()
        .map(|(_, job)| *job)
        .filter(|job| !gets_none(job))
        .collect();
    let wants: Vec<u32> = hungry.iter().map(|job| book.demand(job)).collect();
    let weights: Vec<u32> = hungry.iter().map(|job| book.weight(job)).collect();
    let task_slots: Vec<u32> = hungry.iter().map(|job| book.task_slots(job)).collect();
    let shares = whole_task_targets(idle, &wants, &weights, &task_slots);
    let mut free = FreeSlots::new(pool);
    for (job, slots) in hungry.into_iter().zip(shares) {
        free.offer(job, slots, book, plan);
    }
}

fn can_grow(cluster: &ClusterInput, load_cap: f64) -> bool {
    !cluster.excluded && cluster.total > 0 && cluster.load() < load_cap
}

/// Whether a job is draining or barred somewhere in the pool: no slot more
/// for it. The set is gathered once, so that a grid-wide pool is not
/// scanned cluster by cluster for each of thousands of jobs.
fn stopped_in<'a>(pool: &[&'a ClusterInput]) -> impl Fn(&JobId) -> bool + 'a {
    let stopped: BTreeSet<&'a JobId> = pool
        .iter()
        .flat_map(|c| c.draining.iter().chain(&c.barred))
        .collect();
    move |job| stopped.contains(job)
}

/// A job taking part in the share of a pool.
struct Member<'a> {
    job: &'a JobId,
    held: u32,
    /// More it could use.
    more: u32,
}

/// Shares a pool of clusters between the jobs: every job's fair target is an
/// equal part of the slots scavenging can use there (idle plus held), capped
/// by what it can use. Jobs below target get idle slots; when there are none
/// left, jobs above target are drained.
fn share<'a>(pool: &[&'a ClusterInput], book: &mut Book<'a>, rebalance: bool, plan: &mut Plan) {
    let gets_none = stopped_in(pool);
    let mut holders: BTreeMap<&'a JobId, u32> = BTreeMap::new();
    // Where each job holds most: where a drain takes its slots.
    let mut most_held: BTreeMap<&'a JobId, (&'a ClusterName, u32)> = BTreeMap::new();
    for cluster in pool {
        for (job, held) in &cluster.held {
            *holders.entry(job).or_default() += held;
            let most = most_held.entry(job).or_insert((&cluster.name, *held));
            if *held > most.1 {
                *most = (&cluster.name, *held);
            }
        }
    }
    let idle: u32 = pool.iter().map(|c| c.idle).sum();
    let capacity = idle + holders.values().sum::<u32>();
    let hungry_elsewhere = book
        .hungry
        .iter()
        .filter(|(_, job)| !holders.contains_key(job) && !gets_none(job))
        .take(capacity as usize + 1)
        .count();
    if holders.len() + hungry_elsewhere > capacity as usize {
        return share_thinly(pool, &holders, idle, capacity, book, plan);
    }
    let mut members: Vec<Member<'a>> = holders
        .iter()
        .map(|(job, held)| (*job, *held))
        .chain(
            book.hungry
                .iter()
                .filter(|(_, job)| !holders.contains_key(job))
                .map(|(_, job)| (*job, 0)),
        )
        .map(|(job, held)| Member {
            job,
            held,
            more: if gets_none(job) { 0 } else { book.demand(job) },
        })
        .filter(|m| m.held + m.more > 0)
        .collect();
    if members.is_empty() {
        return;
    }
    // Odd slots of the targets go to those holding most here (near-even
    // holdings are left alone rather than shuffled), then to those holding
    // least anywhere.
    members.sort_by(|a, b| {
        b.held
            .cmp(&a.held)
            .then_with(|| book.global(a.job).cmp(&book.global(b.job)))
            .then_with(|| a.job.cmp(b.job))
    });
    let wants: Vec<u32> = members.iter().map(|m| m.held + m.more).collect();
    let weights: Vec<u32> = members.iter().map(|m| book.weight(m.job)).collect();
    let task_slots: Vec<u32> = members.iter().map(|m| book.task_slots(m.job)).collect();
    let targets = whole_task_targets(capacity, &wants, &weights, &task_slots);

    // Idle slots fill the gaps below target, those holding least first.
    let mut below: Vec<(usize, u32)> = members
        .iter()
        .zip(&targets)
        .enumerate()
        .filter(|(_, (m, target))| **target > m.held)
        .map(|(i, (m, target))| (i, target - m.held))
        .collect();
    below.sort_by_key(|(i, _)| {
        let m = &members[*i];
        (m.held, book.global(m.job), m.job)
    });
    let gaps: Vec<u32> = below.iter().map(|(_, gap)| *gap).collect();
    let fills = equipartition(idle, &gaps);
    let mut free = FreeSlots::new(pool);
    let mut unmet = 0;
    for ((i, gap), fill) in below.iter().zip(&fills) {
        unmet += gap - fill;
        free.offer(members[*i].job, *fill, book, plan);
    }

    let drains_in_flight = pool.iter().any(|c| !c.draining.is_empty());
    if !rebalance || unmet == 0 || drains_in_flight {
        return;
    }
    for (member, target) in members.iter().zip(&targets) {
        if unmet == 0 {
            break;
        }
        if member.held > *target {
            let slots = (member.held - target).min(unmet);
            unmet -= slots;
            // Drained where the job holds most.
            if let Some((cluster, held)) = most_held.get(member.job) {
                plan.drains.push(Drain {
                    job: member.job.clone(),
                    cluster: (*cluster).clone(),
                    slots: slots.min(*held),
                    hosts: Vec::new(),
                });
            }
        }
    }
}

/// More jobs than slots: each fair share is 0 or 1 slot. Holders keep what
/// they have; the idle slots go one each to the hungry jobs that hold least
/// anywhere. Nobody is drained: below one slot, there is nothing fairer.
fn share_thinly<'a>(
    pool: &[&'a ClusterInput],
    holders: &BTreeMap<&'a JobId, u32>,
    idle: u32,
    capacity: u32,
    book: &mut Book<'a>,
    plan: &mut Plan,
) {
    let room = (capacity as usize)
        .saturating_sub(holders.len())
        .min(idle as usize);
    let gets_none = stopped_in(pool);
    let chosen: Vec<&'a JobId> = book
        .hungry
        .iter()
        .map(|(_, job)| *job)
        .filter(|job| !holders.contains_key(job) && !gets_none(job))
        .take(room)
        .collect();
    let mut free = FreeSlots::new(pool);
    for job in chosen {
        free.offer(job, 1, book, plan);
    }
}

/// The idle slots of a pool, handed out from the cluster with most first.
struct FreeSlots<'a> {
    clusters: Vec<(&'a ClusterInput, u32)>,
    /// Clusters before this one have nothing left.
    next: usize,
}

impl<'a> FreeSlots<'a> {
    fn new(pool: &[&'a ClusterInput]) -> Self {
        let mut clusters: Vec<(&ClusterInput, u32)> = pool.iter().map(|c| (*c, c.idle)).collect();
        clusters.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.name.cmp(&b.0.name)));
        Self { clusters, next: 0 }
    }

    /// Offers `slots` to `job`, as far as slots are left.
    fn offer(&mut self, job: &JobId, slots: u32, book: &mut Book<'_>, plan: &mut Plan) {
        let mut want = slots;
        while want > 0 && self.next < self.clusters.len() {
            let (cluster, left) = &mut self.clusters[self.next];
            let take = want.min(*left);
            if take > 0 {
                *left -= take;
                want -= take;
                plan.offers.push(Offer {
                    job: job.clone(),
                    cluster: cluster.name.clone(),
                    slots: take,
                });
            }
            if *left == 0 {
                self.next += 1;
            }
        }
        book.give(job, slots - want);
    }
}

#[cfg(test)]
mod tests;
