//! Placing rigid grid jobs (KOALA): placement queues per priority, scanned
//! by weighted round robin; worst-fit placement of each component; slots
//! held by scavenging jobs count as free, at the price of shrinking them.

use std::collections::BTreeMap;

use gleaner_manifest::{JobId, Priority};
use gleaner_protocol::ClusterName;
use serde::{Deserialize, Serialize};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GridJob {
    pub id: JobId,
    /// The placement queue it is in now (it moves up after failed tries).
    pub queue: Priority,
    /// Slots of each component.
    pub components: Vec<u32>,
}

/// A cluster as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub name: ClusterName,
    /// Slots nobody uses or has been promised.
    pub free: u32,
    /// Slots scavenging jobs hold here, which they would give back.
    pub scavenged: BTreeMap<JobId, u32>,
}

/// Where a job goes, and what scavenging must give back for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub job: JobId,
    /// The cluster of each component, in component order.
    pub clusters: Vec<ClusterName>,
    /// Slots to reclaim from scavenging jobs, per cluster.
    pub reclaim: Vec<(ClusterName, u32)>,
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
pub fn place(jobs: &[GridJob], sites: &[Site], weights: Weights) -> Vec<Placement> {
    let mut free: Vec<u32> = sites.iter().map(|s| s.free).collect();
    let mut reclaimable: Vec<u32> = sites.iter().map(|s| s.scavenged.values().sum()).collect();
    let mut placed = Vec::new();
    for i in scan_order(jobs, weights) {
        let job = &jobs[i];
        let plan = worst_fit(&job.components, &free, None)
            .or_else(|| worst_fit(&job.components, &free, Some(&reclaimable)));
        let Some(chosen) = plan else { continue };
        let mut reclaim: BTreeMap<usize, u32> = BTreeMap::new();
        for (component, &site) in chosen.iter().enumerate() {
            let need = job.components[component];
            let from_free = need.min(free[site]);
            free[site] -= from_free;
            let from_scavengers = need - from_free;
            if from_scavengers > 0 {
                reclaimable[site] -= from_scavengers;
                *reclaim.entry(site).or_default() += from_scavengers;
            }
        }
        placed.push(Placement {
            job: job.id.clone(),
            clusters: chosen.iter().map(|&s| sites[s].name.clone()).collect(),
            reclaim: reclaim
                .into_iter()
                .map(|(site, slots)| (sites[site].name.clone(), slots))
                .collect(),
        });
    }
    placed
}

/// Worst fit: each component, largest first, on the site with the most room
/// left. With `reclaimable`, scavenged slots count as room.
fn worst_fit(components: &[u32], free: &[u32], reclaimable: Option<&[u32]>) -> Option<Vec<usize>> {
    let mut room: Vec<u32> = free
        .iter()
        .enumerate()
        .map(|(i, f)| f + reclaimable.map_or(0, |r| r[i]))
        .collect();
    let mut order: Vec<usize> = (0..components.len()).collect();
    order.sort_by(|a, b| components[*b].cmp(&components[*a]).then(a.cmp(b)));
    let mut chosen = vec![0; components.len()];
    for component in order {
        let need = components[component];
        let site = (0..room.len())
            .filter(|&s| room[s] >= need)
            .max_by(|&a, &b| room[a].cmp(&room[b]).then(b.cmp(&a)))?;
        room[site] -= need;
        chosen[component] = site;
    }
    Some(chosen)
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
        format!("{name}-000000").parse().unwrap()
    }

    fn job(name: &str, queue: Priority, components: &[u32]) -> GridJob {
        GridJob {
            id: id(name),
            queue,
            components: components.to_vec(),
        }
    }

    fn site(name: &str, free: u32, scavenged: &[(&str, u32)]) -> Site {
        Site {
            name: name.into(),
            free,
            scavenged: scavenged.iter().map(|(j, n)| (id(j), *n)).collect(),
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
        );
        assert_eq!(placed[0].clusters, ["c", "a", "b"].map(ClusterName::from));
        assert!(placed[0].reclaim.is_empty());
    }

    #[test]
    fn scavenged_slots_count_but_must_be_reclaimed() {
        let sites = [site("a", 2, &[("s", 6)]), site("b", 3, &[])];
        let placed = place(
            &[job("g", Priority::High, &[8])],
            &sites,
            Weights::default(),
        );
        assert_eq!(placed[0].clusters, [ClusterName::from("a")]);
        assert_eq!(placed[0].reclaim, [(ClusterName::from("a"), 6)]);
        let placed = place(
            &[job("g", Priority::High, &[3])],
            &sites,
            Weights::default(),
        );
        assert!(
            placed[0].reclaim.is_empty(),
            "free slots come before scavenged ones"
        );
    }

    #[test]
    fn jobs_that_do_not_fit_wait_and_others_go_by() {
        let sites = [site("a", 4, &[])];
        let jobs = [
            job("big", Priority::SuperHigh, &[8]),
            job("small", Priority::Low, &[2]),
            job("two", Priority::Low, &[3]),
        ];
        let placed = place(&jobs, &sites, Weights::default());
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
