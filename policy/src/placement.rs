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
mod tests {
    use super::*;

    fn id(name: &str) -> JobId {
        format!("{name}-0000000000000000").parse().unwrap()
    }

    fn job(name: &str, queue: Priority, components: &[u32]) -> GridJob {
        GridJob {
            id: id(name),
            queue,
            components: components.to_vec(),
            avoid: Vec::new(),
            inputs: Vec::new(),
            walltime_ms: None,
            moldable: Vec::new(),
        }
    }

    /// A site of `total` slots, `free` of them free now, whose kcm
    /// foresees `running` (slots, ms left) at `speed`.
    fn foreseeing(name: &str, speed: f64, total: u32, running: &[(u32, u64)]) -> Site {
        let profile = Profile::new(total, running.iter().copied());
        Site {
            ect: Some(SiteEct {
                speed,
                profile: profile.clone(),
            }),
            ..site(name, profile.free_at(0), &[])
        }
    }

    #[test]
    fn a_moldable_component_gets_fewer_slots_on_a_busy_cluster_and_more_on_an_idle_one() {
        let moldable = Moldable::read(
            gleaner_manifest::Slots::Range { min: 4, max: 64 },
            &gleaner_manifest::Speedup::Law("amdahl:0.9".into()),
            Some(std::time::Duration::from_secs(3600)),
        )
        .unwrap();
        let job = GridJob {
            walltime_ms: Some(3_600_000),
            moldable: vec![Some(moldable.clone())],
            ..job("g", Priority::High, &[4])
        };
        // 56 of 64 slots held for 2 h: 8 slots now (39 min) beat 64 later.
        let busy = foreseeing("busy", 1.0, 64, &[(56, 7_200_000)]);
        let idle = foreseeing("idle", 1.0, 64, &[]);
        let on = |site: &Site| {
            let placed = place(
                std::slice::from_ref(&job),
                std::slice::from_ref(site),
                Weights::default(),
                Rule::Mct,
            );
            (placed[0].slots.clone(), placed[0].start_ms)
        };
        assert_eq!(on(&busy), (vec![8], 0));
        assert_eq!(on(&idle), (vec![64], 0));
        assert_eq!(moldable.walltime_ms(8), 2_353_847, "the walltime to match");
        let both = place(&[job], &[busy, idle], Weights::default(), Rule::Mct);
        assert_eq!(both[0].clusters, [ClusterName::from("idle")]);
    }

    #[test]
    fn mct_places_where_a_component_completes_first_even_if_it_must_wait() {
        // "fast" (speed 4) is full for 10 min; "slow" is idle. An hour's
        // job completes on "fast" after 10 + 15 min, on "slow" after 60.
        let sites = [
            foreseeing("slow", 1.0, 8, &[]),
            foreseeing("fast", 4.0, 8, &[(8, 600_000)]),
        ];
        let hour = GridJob {
            walltime_ms: Some(3_600_000),
            ..job("g", Priority::High, &[8])
        };
        let placed = place(
            std::slice::from_ref(&hour),
            &sites,
            Weights::default(),
            Rule::Mct,
        );
        assert_eq!(placed[0].clusters, [ClusterName::from("fast")]);
        assert_eq!(placed[0].start_ms, 600_000);
        // Worst fit only takes free slots now.
        let placed = place(&[hour], &sites, Weights::default(), Rule::WorstFit);
        assert_eq!(placed[0].clusters, [ClusterName::from("slow")]);
        // A minute's job starts now on "slow": done before "fast" is free.
        let minute = GridJob {
            walltime_ms: Some(60_000),
            ..job("m", Priority::High, &[8])
        };
        let placed = place(&[minute], &sites, Weights::default(), Rule::Mct);
        assert_eq!(
            (placed[0].clusters[0].as_str(), placed[0].start_ms),
            ("slow", 0)
        );
    }

    #[test]
    fn mct_queues_the_next_job_behind_the_one_it_placed_and_reclaims_scavenged_slots() {
        let mut busy = foreseeing("a", 1.0, 8, &[]);
        busy.free = 2;
        busy.scavenged = [(id("sweep"), 6)].into();
        let jobs = [
            GridJob {
                walltime_ms: Some(1000),
                ..job("g", Priority::High, &[8])
            },
            GridJob {
                walltime_ms: Some(1000),
                ..job("h", Priority::High, &[8])
            },
        ];
        let placed = place(&jobs, &[busy], Weights::default(), Rule::Mct);
        assert_eq!(placed.len(), 2);
        assert_eq!((placed[0].start_ms, placed[1].start_ms), (0, 1000));
        assert_eq!(placed[0].reclaim.len(), 1);
        assert_eq!(placed[0].reclaim[0].slots, 6);
        assert!(placed[1].reclaim.is_empty(), "it waits its turn");
    }

    #[test]
    fn mct_without_foresight_takes_a_site_only_if_the_component_fits_now() {
        let sites = [
            site("blind", 2, &[]),
            foreseeing("seen", 1.0, 4, &[(4, 5000)]),
        ];
        let placed = place(
            &[job("g", Priority::High, &[4])],
            &sites,
            Weights::default(),
            Rule::Mct,
        );
        assert_eq!(
            (placed[0].clusters[0].as_str(), placed[0].start_ms),
            ("seen", 5000)
        );
        let too_big = job("h", Priority::High, &[5]);
        assert!(place(&[too_big], &sites, Weights::default(), Rule::Mct).is_empty());
    }

    fn site(name: &str, free: u32, scavenged: &[(&str, u32)]) -> Site {
        Site {
            name: name.into(),
            free,
            scavenged: scavenged.iter().map(|(j, n)| (id(j), *n)).collect(),
            hosts: Vec::new(),
            inputs: Default::default(),
            ect: None,
        }
    }

    /// A site of hosts given as (free, scavenged by job); `slots` each.
    fn hosts(name: &str, slots: u32, hosts: &[(u32, &[(&str, u32)])]) -> Site {
        let hosts: Vec<HostRoom> = hosts
            .iter()
            .enumerate()
            .map(|(i, (free, scavenged))| HostRoom {
                name: format!("n{}", i + 1),
                slots,
                free: *free,
                scavenged: scavenged.iter().map(|(j, n)| (id(j), *n)).collect(),
            })
            .collect();
        let mut scavenged: BTreeMap<JobId, u32> = BTreeMap::new();
        for host in &hosts {
            for (job, n) in &host.scavenged {
                *scavenged.entry(job.clone()).or_default() += n;
            }
        }
        Site {
            name: name.into(),
            free: hosts.iter().map(|h| h.free).sum(),
            scavenged,
            hosts,
            inputs: Default::default(),
            ect: None,
        }
    }

    fn reclaim(cluster: &str, job: &str, slots: u32, hosts: &[&str]) -> Reclaim {
        Reclaim {
            cluster: cluster.into(),
            job: id(job),
            slots,
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        }
    }

    #[test]
    fn weighted_round_robin_prefers_but_does_not_starve() {
        use Priority::*;
        let jobs = [
            job("l1", Low, &[1]),
            job("h1", High, &[1]),
            job("s1", SuperHigh, &[1]),
            job("s2", SuperHigh, &[1]),
            job("s3", SuperHigh, &[1]),
            job("h2", High, &[1]),
            job("h3", High, &[1]),
        ];
        let weights = Weights {
            super_high: 2,
            high: 1,
            low: 1,
        };
        let names: Vec<String> = scan_order(&jobs, weights)
            .into_iter()
            .map(|i| jobs[i].id.name().to_owned())
            .collect();
        assert_eq!(names, ["s1", "s2", "h1", "l1", "s3", "h2", "h3"]);
    }

    #[test]
    fn worst_fit_spreads_components_over_the_emptiest_sites() {
        let sites = [site("a", 10, &[]), site("b", 6, &[]), site("c", 8, &[])];
        let placed = place(
            &[job("g", Priority::High, &[4, 5, 4])],
            &sites,
            Weights::default(),
            Rule::WorstFit,
        );
        assert_eq!(placed[0].clusters, ["c", "a", "b"].map(ClusterName::from));
        assert!(placed[0].reclaim.is_empty());
    }

    fn running(name: &str, priority: Priority, ran_s: u64, walltime_s: Option<u64>) -> Running {
        Running {
            id: id(name),
            priority,
            elapsed_ms: ran_s * 1000,
            walltime_ms: walltime_s.map(|s| s * 1000),
            holds: [(ClusterName::from("a"), 4)].into(),
        }
    }

    #[test]
    fn components_go_close_to_their_files_or_where_they_can_be_staged() {
        let shared = |name: &str, free: u32, paths: &[&str], stages: bool| Site {
            inputs: InputAccess {
                shared: paths.iter().map(|p| p.to_string()).collect(),
                stages,
                stage_s: None,
            },
            ..site(name, free, &[])
        };
        let sites = [
            shared("big", 16, &[], true),
            shared("near", 4, &["/data"], false),
            shared("none", 32, &[], false),
        ];
        let reading = |input: &str| GridJob {
            inputs: vec![vec![input.to_owned()], Vec::new()],
            ..job("g", Priority::High, &[4, 4])
        };
        let placed = place(
            &[reading("/data/x")],
            &sites,
            Weights::default(),
            Rule::WorstFit,
        );
        let clusters: Vec<&str> = placed[0].clusters.iter().map(ClusterName::as_str).collect();
        assert_eq!(clusters, ["near", "none"], "files first, then room");
        let placed = place(
            &[reading("/elsewhere/x")],
            &sites,
            Weights::default(),
            Rule::WorstFit,
        );
        assert_eq!(
            placed[0].clusters[0].as_str(),
            "big",
            "staged where it can be"
        );
        let nowhere = [shared("near", 4, &["/data"], false)];
        assert!(
            place(
                &[reading("/elsewhere/x")],
                &nowhere,
                Weights::default(),
                Rule::WorstFit
            )
            .is_empty()
        );
    }

    #[test]
    fn lower_priority_jobs_are_stopped_latest_started_first_as_many_as_it_takes() {
        let full = [site("a", 0, &[])];
        let jobs = [
            // y started after x, z after y.
            running("x", Priority::Low, 300, None),
            running("y", Priority::Low, 200, None),
            running("z", Priority::High, 100, None),
        ];
        let names = |victims: Vec<JobId>| -> Vec<String> {
            victims.iter().map(|j| j.name().to_owned()).collect()
        };
        let stop = |slots: &[u32], priority| {
            let job = job("g", priority, slots);
            let rules = StopRules::default();
            names(to_stop(&job, priority, None, &full, &jobs, rules))
        };
        assert_eq!(stop(&[4], Priority::High), ["y"]);
        assert_eq!(stop(&[8], Priority::High), ["y", "x"]);
        assert!(stop(&[12], Priority::High).is_empty(), "z is not lower");
        assert_eq!(stop(&[12], Priority::SuperHigh), ["z", "y", "x"]);
        assert!(stop(&[4], Priority::Low).is_empty());
    }

    #[test]
    fn a_job_is_stopped_only_after_progress_and_when_the_utility_is_worth_it() {
        let full = [site("a", 0, &[])];
        let g = job("g", Priority::High, &[4]);
        let rules = StopRules::default();
        // y ran 100 s of its 1000 s walltime since it last started: spared.
        let jobs = [
            running("x", Priority::Low, 400, None),
            running("y", Priority::Low, 100, Some(1000)),
        ];
        let stopped = to_stop(&g, Priority::High, None, &full, &jobs, rules);
        assert_eq!(stopped, [id("x")]);
        // x has 100 s of 1000 s left; g runs 1000 s: util 0.09, not worth it.
        let jobs = [running("x", Priority::Low, 900, Some(1000))];
        assert!(to_stop(&g, Priority::High, Some(1_000_000), &full, &jobs, rules).is_empty());
        // With 700 s left and g of 100 s, it is (util 8.75).
        let jobs = [running("x", Priority::Low, 300, Some(1000))];
        let stopped = to_stop(&g, Priority::High, Some(100_000), &full, &jobs, rules);
        assert_eq!(stopped, [id("x")]);
        assert!((stop_utility(3_600_000, 600_000, 600_000) - 5.0).abs() < 1e-9);
        assert!((stop_utility(1_000_000, 100_000, 100_000) - 9.0).abs() < 1e-9);
    }

    #[test]
    fn scavenged_slots_count_but_must_be_reclaimed() {
        let sites = [site("a", 2, &[("s", 6)]), site("b", 3, &[])];
        let placed = place(
            &[job("g", Priority::High, &[8])],
            &sites,
            Weights::default(),
            Rule::WorstFit,
        );
        assert_eq!(placed[0].clusters, [ClusterName::from("a")]);
        assert_eq!(placed[0].reclaim, [reclaim("a", "s", 6, &[])]);
        let placed = place(
            &[job("g", Priority::High, &[3])],
            &sites,
            Weights::default(),
            Rule::WorstFit,
        );
        assert!(
            placed[0].reclaim.is_empty(),
            "free slots come before scavenged ones"
        );
    }

    #[test]
    fn components_that_did_not_start_on_a_cluster_go_elsewhere_and_others_still_may() {
        let sites = [site("a", 8, &[]), site("b", 4, &[])];
        let avoiding = GridJob {
            avoid: vec!["a".into()],
            ..job("g", Priority::High, &[4])
        };
        let other = job("h", Priority::High, &[4]);
        let placed = place(
            &[avoiding, other],
            &sites,
            Weights::default(),
            Rule::WorstFit,
        );
        let clusters: Vec<(&str, &str)> = placed
            .iter()
            .map(|p| (p.job.as_str(), p.clusters[0].as_str()))
            .collect();
        assert_eq!(
            clusters,
            [("g-0000000000000000", "b"), ("h-0000000000000000", "a")]
        );
        let too_big = GridJob {
            avoid: vec!["a".into()],
            ..job("g", Priority::High, &[6])
        };
        assert!(
            place(&[too_big], &sites, Weights::default(), Rule::WorstFit).is_empty(),
            "waits"
        );
    }

    #[test]
    fn a_component_that_fits_on_one_host_takes_back_slots_on_one_host_only() {
        // Three 4-slot hosts full of two sweeps' launchers, one slot free on n2.
        let site = hosts(
            "a",
            4,
            &[
                (0, &[("s", 2), ("t", 2)]),
                (1, &[("s", 3)]),
                (0, &[("t", 4)]),
            ],
        );
        let placed = place(
            &[job("g", Priority::High, &[4])],
            std::slice::from_ref(&site),
            Weights::default(),
            Rule::WorstFit,
        );
        assert_eq!(
            placed[0].reclaim,
            [reclaim("a", "s", 3, &["n2"])],
            "the host with a free slot: three taken back there, from its only holder"
        );
        let placed = place(
            &[job("g", Priority::High, &[4, 4])],
            std::slice::from_ref(&site),
            Weights::default(),
            Rule::WorstFit,
        );
        assert_eq!(
            placed[0].reclaim,
            [
                reclaim("a", "s", 2, &["n1"]),
                reclaim("a", "s", 3, &["n2"]),
                reclaim("a", "t", 2, &["n1"])
            ],
            "two components, two hosts"
        );
        let placed = place(
            &[job("g", Priority::High, &[6])],
            std::slice::from_ref(&site),
            Weights::default(),
            Rule::WorstFit,
        );
        assert_eq!(
            placed[0].reclaim,
            [reclaim("a", "s", 2, &[]), reclaim("a", "t", 3, &[])],
            "larger than a host: spread, from whoever holds most"
        );
    }

    #[test]
    fn a_one_host_component_waits_when_no_host_has_room() {
        let site = hosts("a", 4, &[(2, &[]), (2, &[])]);
        let placed = place(
            &[job("g", Priority::High, &[3])],
            std::slice::from_ref(&site),
            Weights::default(),
            Rule::WorstFit,
        );
        assert!(placed.is_empty(), "4 free slots, but 2 on each host");
        let two = place(
            &[job("g", Priority::High, &[2, 2])],
            &[site],
            Weights::default(),
            Rule::WorstFit,
        );
        assert_eq!(two.len(), 1);
        assert!(two[0].reclaim.is_empty());
    }

    #[test]
    fn jobs_that_do_not_fit_wait_and_others_go_by() {
        let sites = [site("a", 4, &[])];
        let jobs = [
            job("big", Priority::SuperHigh, &[8]),
            job("small", Priority::Low, &[2]),
            job("two", Priority::Low, &[3]),
        ];
        let placed = place(&jobs, &sites, Weights::default(), Rule::WorstFit);
        let names: Vec<&str> = placed.iter().map(|p| p.job.name()).collect();
        assert_eq!(names, ["small"], "the second small job no longer fits");
    }

    #[test]
    fn failed_tries_move_a_job_up() {
        assert_eq!(upgraded(Priority::Low, 3, 3), Priority::High);
        assert_eq!(upgraded(Priority::Low, 2, 3), Priority::Low);
        assert_eq!(upgraded(Priority::High, 6, 3), Priority::SuperHigh);
        assert_eq!(upgraded(Priority::SuperHigh, 3, 3), Priority::SuperHigh);
        assert_eq!(upgraded(Priority::Low, 3, 0), Priority::Low);
    }
}
