//! Placing rigid grid jobs (KOALA): placement queues per priority, scanned
//! by weighted round robin; worst-fit placement of each component; slots
//! held by scavenging jobs count as free, at the price of shrinking them.

use std::collections::BTreeMap;

use gleaner_manifest::{JobId, Moldable, Priority};
use gleaner_protocol::{ClusterName, InputAccess};
use serde::{Deserialize, Serialize};

/// Whether a grid component of `slots` slots runs on one host (a one-host
/// parallel environment) on a cluster whose largest host has
/// `largest_host` slots; the kcm submits it so and the scheduler places
/// it so. Larger components spread over hosts.
pub fn component_on_one_host(slots: u32, largest_host: u32) -> bool {
    slots <= largest_host
}

use crate::{
    ect::{Estimate, Profile, estimate, scaled},
    share::split_shrink,
};

/// How often each placement queue is scanned relative to the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Weights {
    pub super_high: u32,
    pub high: u32,
    pub low: u32,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            super_high: 4,
            high: 2,
            low: 1,
        }
    }
}

/// A grid job waiting to be placed.
#[derive(Debug, Clone, PartialEq)]
pub struct GridJob {
    pub id: JobId,
    /// The placement queue it is in now (it moves up after failed tries).
    pub queue: Priority,
    /// Slots of each component.
    pub components: Vec<u32>,
    /// Clusters its components are not placed on: they did not start
    /// there when claimed, in this run.
    pub avoid: Vec<ClusterName>,
    /// The input files of each component (none when empty).
    pub inputs: Vec<Vec<String>>,
    /// Its walltime on a cluster of speed 1, if it has one.
    pub walltime_ms: Option<u64>,
    /// Moldable components' ranges and walltimes, in component order
    /// (empty: none is; `components` holds their fewest slots).
    pub moldable: Vec<Option<Moldable>>,
}

impl GridJob {
    fn inputs_of(&self, component: usize) -> &[String] {
        self.inputs.get(component).map_or(&[], Vec::as_slice)
    }
}

/// A cluster as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    pub name: ClusterName,
    /// Slots nobody uses or has been promised.
    pub free: u32,
    /// Slots scavenging jobs hold here, which they would give back.
    pub scavenged: BTreeMap<JobId, u32>,
    /// Its execution hosts; a component that fits on one host must find
    /// its slots on one. Empty: the cluster is one pool of slots.
    pub hosts: Vec<HostRoom>,
    /// Which input files its nodes see, and whether it stages others.
    pub inputs: InputAccess,
    /// When components would complete here, where its kcm says.
    pub ect: Option<SiteEct>,
}

/// What a site foresees: its speed, and its free slots over time with the
/// grid components waiting there in it (so that the next one queues
/// behind them).
#[derive(Debug, Clone, PartialEq)]
pub struct SiteEct {
    pub speed: f64,
    pub profile: Profile,
}

/// How grid jobs' components are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// Seed 002's MCT: each component, largest first, goes to the cluster
    /// where it would complete first, to wait in its batch queue if need
    /// be; a cluster whose kcm foresees nothing takes it only if it fits
    /// now.
    #[default]
    Mct,
    /// KOALA's worst fit: only on free slots now, each component where the
    /// most are left; a job that does not fit waits in its placement queue.
    WorstFit,
}

/// The walltime estimates assume for a job that has none.
pub const ASSUMED_WALLTIME_MS: u64 = 3600 * 1000;

/// One execution host as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoom {
    pub name: String,
    pub slots: u32,
    /// Slots nobody uses.
    pub free: u32,
    /// Slots scavenging jobs hold on this host.
    pub scavenged: BTreeMap<JobId, u32>,
}

/// Where a job goes, and what scavenging must give back for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub job: JobId,
    /// The cluster of each component, in component order.
    pub clusters: Vec<ClusterName>,
    /// Slots scavenging jobs must give back.
    pub reclaim: Vec<Reclaim>,
    /// When its last component is expected to start, ms from now (0: all
    /// start now).
    pub start_ms: u64,
    /// The slots chosen for each moldable component (0: not moldable);
    /// empty when none is.
    pub slots: Vec<u32>,
}

/// Slots one scavenging job gives back on one cluster for a placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaim {
    pub cluster: ClusterName,
    pub job: JobId,
    pub slots: u32,
    /// From launchers on these hosts only (a component kept on one host);
    /// anywhere on the cluster when empty.
    pub hosts: Vec<String>,
}

/// The order in which waiting jobs are tried: super-high, high and low in
/// turn, `weights` jobs of each queue per turn, first come first served
/// within a queue.
pub fn scan_order(jobs: &[GridJob], weights: Weights) -> Vec<usize> {
    let queues = [
        (Priority::SuperHigh, weights.super_high.max(1)),
        (Priority::High, weights.high.max(1)),
        (Priority::Low, weights.low.max(1)),
    ];
    let mut heads: Vec<std::collections::VecDeque<usize>> = queues
        .iter()
        .map(|(priority, _)| {
            (0..jobs.len())
                .filter(|&i| normalized(jobs[i].queue) == *priority)
                .collect()
        })
        .collect();
    let mut order = Vec::with_capacity(jobs.len());
    while heads.iter().any(|h| !h.is_empty()) {
        for ((_, weight), head) in queues.iter().zip(heads.iter_mut()) {
            for _ in 0..*weight {
                if let Some(i) = head.pop_front() {
                    order.push(i);
                }
            }
        }
    }
    order
}

/// Scavenging's own queue never holds grid jobs; treat it as low.
fn normalized(priority: Priority) -> Priority {
    match priority {
        Priority::SuperLow => Priority::Low,
        other => other,
    }
}

/// Places what can be placed, in scan order. Jobs missing from the result
/// could not be placed this time (a failed try).
pub fn place(jobs: &[GridJob], sites: &[Site], weights: Weights, rule: Rule) -> Vec<Placement> {
    place_leaving(jobs, sites, weights, rule).0
}

/// [`place`], and the room it leaves on each site.
pub fn place_leaving(
    jobs: &[GridJob],
    sites: &[Site],
    weights: Weights,
    rule: Rule,
) -> (Vec<Placement>, Vec<Site>) {
    let mut rooms: Vec<Site> = sites.to_vec();
    let mut placed = Vec::new();
    for i in scan_order(jobs, weights) {
        let job = &jobs[i];
        let plan = match rule {
            Rule::WorstFit => worst_fit(job, &rooms, false)
                .or_else(|| worst_fit(job, &rooms, true))
                .map(|plan| (plan, 0, Vec::new())),
            Rule::Mct => mct(job, &rooms),
        };
        let Some(((chosen, after, reclaim), start_ms, slots)) = plan else {
            continue;
        };
        rooms = after;
        placed.push(Placement {
            job: job.id.clone(),
            clusters: chosen.iter().map(|&s| sites[s].name.clone()).collect(),
            reclaim,
            start_ms,
            slots,
        });
    }
    (placed, rooms)
}

/// Each component's site, the rooms left, and what scavenging gives back.
type Plan = (Vec<usize>, Vec<Site>, Vec<Reclaim>);

/// Slots scavenging gives back, by cluster, job and hosts (none: any).
type Taken = BTreeMap<(ClusterName, JobId, Vec<String>), u32>;

/// MCT: each component, largest first, where it would complete first
/// (ties: close to its files, then the most room now); one that starts
/// now takes its slots as worst fit would, scavenged ones given back.
/// Returns the plan and the latest expected start.
fn mct(job: &GridJob, rooms: &[Site]) -> Option<(Plan, u64, Vec<u32>)> {
    let components = &job.components;
    let walltime = job.walltime_ms.unwrap_or(ASSUMED_WALLTIME_MS);
    let mut rooms = rooms.to_vec();
    let mut order: Vec<usize> = (0..components.len()).collect();
    order.sort_by(|a, b| components[*b].cmp(&components[*a]).then(a.cmp(b)));
    let mut chosen = vec![0; components.len()];
    let mut slots = vec![0; components.len()];
    let mut taken = Taken::new();
    let mut latest = 0;
    for component in order {
        let moldable = job.moldable.get(component).and_then(Option::as_ref);
        let inputs = job.inputs_of(component);
        let (site, need, length, when) = (0..rooms.len())
            .filter(|s| !job.avoid.contains(&rooms[*s].name))
            .filter(|s| rooms[*s].inputs.can_read(inputs))
            .filter_map(|s| {
                let room = &rooms[s];
                let now = room_of(room.free, &room.scavenged, true);
                let (need, length, when) = match (moldable, &room.ect) {
                    (Some(m), Some(ect)) => {
                        let (n, when) = moldable_choice(m, ect)?;
                        (n, m.walltime_ms(n), when)
                    }
                    (Some(m), None) => {
                        let n = m.at_most(now)?;
                        let length = m.walltime_ms(n);
                        (
                            n,
                            length,
                            Estimate {
                                start: 0,
                                completion: length,
                            },
                        )
                    }
                    (None, Some(ect)) => {
                        let need = components[component];
                        (
                            need,
                            walltime,
                            estimate(&ect.profile, ect.speed, need, walltime)?,
                        )
                    }
                    (None, None) if now >= components[component] => (
                        components[component],
                        walltime,
                        Estimate {
                            start: 0,
                            completion: walltime,
                        },
                    ),
                    (None, None) => return None,
                };
                let close = inputs.iter().all(|i| room.inputs.sees(i));
                Some((s, need, length, when, close, now))
            })
            .min_by(|a, b| {
                (a.3.completion, !a.4, std::cmp::Reverse(a.5), a.0).cmp(&(
                    b.3.completion,
                    !b.4,
                    std::cmp::Reverse(b.5),
                    b.0,
                ))
            })
            .map(|(s, need, length, when, _, _)| (s, need, length, when))?;
        chosen[component] = site;
        if moldable.is_some() {
            slots[component] = need;
        }
        latest = latest.max(when.start);
        let room = &mut rooms[site];
        if let Some(ect) = room.ect.as_mut() {
            ect.profile
                .reserve(when.start, need, scaled(length, ect.speed));
        }
        if when.start == 0 {
            let reclaim = room.free < need;
            take_room(room, need, reclaim, &mut taken);
        }
    }
    if job.moldable.iter().all(Option::is_none) {
        slots.clear();
    }
    Some(((chosen, rooms, reclaims(taken)), latest, slots))
}

/// The slot count of a moldable component that completes first on a site.
/// Seed 002 binary-searches the completion time over the slot counts, as
/// if it had one minimum; over a profile of free slots in steps it has one
/// per step (fewer slots start sooner, more run shorter), so each step's
/// best is tried: for a start at a step, the most slots that fit its free
/// level, and the fewest and the most slots besides.
fn moldable_choice(m: &Moldable, ect: &SiteEct) -> Option<(u32, Estimate)> {
    let mut tried: Vec<u32> = ect
        .profile
        .steps()
        .iter()
        .filter_map(|(_, free)| m.at_most(*free))
        .chain([m.min, m.max].into_iter().filter_map(|n| m.at_most(n)))
        .collect();
    tried.sort_unstable();
    tried.dedup();
    tried
        .into_iter()
        .filter_map(|n| Some((n, estimate(&ect.profile, ect.speed, n, m.walltime_ms(n))?)))
        .min_by_key(|(n, e)| (e.completion, std::cmp::Reverse(*n)))
}

/// A running grid job that a job of higher priority might stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub id: JobId,
    pub priority: Priority,
    /// How long its run has gone on (ms): its progress since it was last
    /// stopped.
    pub elapsed_ms: u64,
    pub walltime_ms: Option<u64>,
    /// Slots its components hold, by cluster.
    pub holds: BTreeMap<ClusterName, u32>,
}

/// When a running grid job may be stopped for another (seed 003).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StopRules {
    /// The fraction of its walltime a job must have run since it was last
    /// stopped: no job is stopped over and over by small ones.
    #[serde(rename = "stop_min_progress")]
    pub min_progress: f64,
    /// GrADS's utility, the waiting job's gain over the running job's
    /// loss, that stopping must reach (where both have walltimes).
    #[serde(rename = "stop_min_utility")]
    pub min_utility: f64,
}

impl Default for StopRules {
    fn default() -> Self {
        Self {
            min_progress: 0.2,
            min_utility: 1.0,
        }
    }
}

/// GrADS's `util_val` of stopping `running` (walltime `w1`, run
/// `elapsed` so far) for a job of walltime `w2`: the waiting job's gain,
/// `perf_gain = R1 / (R1 + W2)` with R1 the time `running` has left (the
/// waiting job would otherwise wait that long), over the running job's
/// loss, `perf_loss = W2 / W1` (it waits while the other runs).
pub fn stop_utility(w1: u64, elapsed: u64, w2: u64) -> f64 {
    let left = w1.saturating_sub(elapsed) as f64;
    let gain = left / (left + w2 as f64).max(1.0);
    let loss = w2 as f64 / (w1 as f64).max(1.0);
    match loss > 0.0 {
        true => gain / loss,
        false => f64::INFINITY,
    }
}

/// The running jobs to stop so that `job` fits (KOALA): those of lower
/// priority, latest started first, as many as it takes; none that has not
/// run `min_progress` of its walltime since it last started, nor any
/// whose stopping is worth less than `min_utility` (where walltimes are
/// known). Empty when stopping all that may be stopped would not do.
pub fn to_stop(
    job: &GridJob,
    priority: Priority,
    walltime_ms: Option<u64>,
    rooms: &[Site],
    running: &[Running],
    rules: StopRules,
) -> Vec<JobId> {
    let mut candidates: Vec<&Running> = running
        .iter()
        .filter(|r| r.priority < priority)
        .filter(|r| {
            let elapsed = r.elapsed_ms;
            r.walltime_ms.is_none_or(|w1| {
                elapsed as f64 >= rules.min_progress * w1 as f64
                    && walltime_ms
                        .is_none_or(|w2| stop_utility(w1, elapsed, w2) >= rules.min_utility)
            })
        })
        .collect();
    candidates.sort_by(|a, b| a.elapsed_ms.cmp(&b.elapsed_ms).then(a.id.cmp(&b.id)));
    let mut rooms = rooms.to_vec();
    let mut chosen = Vec::new();
    for victim in candidates {
        for (cluster, slots) in &victim.holds {
            if let Some(site) = rooms.iter_mut().find(|s| &s.name == cluster) {
                site.free = site.free.saturating_add(*slots);
                // Its slots may be on any of the site's hosts.
                site.hosts.clear();
            }
        }
        chosen.push(victim.id.clone());
        if worst_fit(job, &rooms, false).is_some() {
            return chosen;
        }
    }
    Vec::new()
}

/// Worst fit: each component, largest first, on the site with the most room
/// left — among those that see its input files, if any does (KOALA's
/// Close-to-Files), else among those that can stage them; one that fits on
/// one host of the site on the host needing least taken back. With `reclaim`, scavenged slots count as room. Returns each
/// component's site, the rooms left, and what scavenging gives back. The
/// sites the job avoids are not considered.
fn worst_fit(job: &GridJob, rooms: &[Site], reclaim: bool) -> Option<Plan> {
    let components = &job.components;
    let mut rooms = rooms.to_vec();
    let mut order: Vec<usize> = (0..components.len()).collect();
    order.sort_by(|a, b| components[*b].cmp(&components[*a]).then(a.cmp(b)));
    let mut chosen = vec![0; components.len()];
    let mut taken = Taken::new();
    for component in order {
        let need = components[component];
        let inputs = job.inputs_of(component);
        let site = (0..rooms.len())
            .filter(|s| !job.avoid.contains(&rooms[*s].name))
            .filter(|s| rooms[*s].inputs.can_read(inputs))
            .filter_map(|s| {
                let room = room_of(rooms[s].free, &rooms[s].scavenged, reclaim);
                let fits = room >= need
                    && (!on_one_host(&rooms[s], need)
                        || best_host(&rooms[s], need, reclaim).is_some());
                let close = inputs.iter().all(|i| rooms[s].inputs.sees(i));
                fits.then_some((s, (close, room)))
            })
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))?
            .0;
        chosen[component] = site;
        take_room(&mut rooms[site], need, reclaim, &mut taken);
    }
    Some((chosen, rooms, reclaims(taken)))
}

/// Takes `need` slots of `room` for a component: free ones first (on the
/// best host, for one kept on one host), then, with `reclaim`, scavenged
/// ones, which `taken` records.
fn take_room(room: &mut Site, need: u32, reclaim: bool, taken: &mut Taken) {
    let cluster = room.name.clone();
    let host = match on_one_host(room, need) {
        true => best_host(room, need, reclaim),
        false => None,
    };
    let from_free = match host {
        Some(h) => need.min(room.free).min(room.hosts[h].free),
        None => need.min(room.free),
    };
    room.free -= from_free;
    let rest = match reclaim {
        true => need - from_free,
        false => 0,
    };
    let (holders, hosts) = match host {
        Some(h) => {
            room.hosts[h].free -= from_free;
            (&room.hosts[h].scavenged, vec![room.hosts[h].name.clone()])
        }
        None => (&room.scavenged, Vec::new()),
    };
    for (job, slots) in split_shrink(rest, holders) {
        take(&mut room.scavenged, &job, slots);
        if let Some(h) = host {
            take(&mut room.hosts[h].scavenged, &job, slots);
        }
        *taken
            .entry((cluster.clone(), job, hosts.clone()))
            .or_default() += slots;
    }
}

fn reclaims(taken: Taken) -> Vec<Reclaim> {
    taken
        .into_iter()
        .map(|((cluster, job, hosts), slots)| Reclaim {
            cluster,
            job,
            slots,
            hosts,
        })
        .collect()
}

/// Free slots, and with `reclaim` the scavenged ones too.
fn room_of(free: u32, scavenged: &BTreeMap<JobId, u32>, reclaim: bool) -> u32 {
    let scavenged: u32 = match reclaim {
        true => scavenged.values().fold(0, |a, b| a.saturating_add(*b)),
        false => 0,
    };
    free.saturating_add(scavenged)
}

/// Whether a component of `need` slots is kept on one host of `site`.
fn on_one_host(site: &Site, need: u32) -> bool {
    let largest = site.hosts.iter().map(|h| h.slots).max();
    largest.is_some_and(|largest| component_on_one_host(need, largest))
}

/// The host that can give `need` slots taking back the fewest, the
/// emptiest among equals.
fn best_host(site: &Site, need: u32, reclaim: bool) -> Option<usize> {
    site.hosts
        .iter()
        .enumerate()
        .filter_map(|(i, h)| {
            let free = h.free.min(site.free);
            let room = room_of(free, &h.scavenged, reclaim);
            (room >= need).then_some((i, need.saturating_sub(free), room))
        })
        .min_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)).then(a.0.cmp(&b.0)))
        .map(|(i, _, _)| i)
}

fn take(held: &mut BTreeMap<JobId, u32>, job: &JobId, slots: u32) {
    if let Some(n) = held.get_mut(job) {
        *n = n.saturating_sub(slots);
    }
}

/// The queue a job is in after `tries` failed tries: one up every
/// `upgrade_after` tries (0: never).
pub fn upgraded(queue: Priority, tries: u32, upgrade_after: u32) -> Priority {
    if upgrade_after == 0 || tries == 0 || !tries.is_multiple_of(upgrade_after) {
        return queue;
    }
    match normalized(queue) {
        Priority::Low => Priority::High,
        Priority::High | Priority::SuperHigh | Priority::SuperLow => Priority::SuperHigh,
    }
}

#[cfg(test)]
mod tests;
