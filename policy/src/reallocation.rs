//! Reallocation of waiting jobs (seed 002, Caniou, Charrier & Desprez):
//! now and then, grid components still waiting in a batch queue move to a
//! cluster where they would now complete earlier. `regular` keeps every
//! waiting component where it is unless another cluster beats its
//! current estimate; `all-cancellation` takes them all out (in thought:
//! nothing is withdrawn before its replacement is accepted) and places
//! them again on the clusters as they would be without them. The order
//! in which components are considered is the heuristic's: `mct` oldest
//! first, each to its cluster of minimum completion time; `minmin`, of the
//! oldest few, the component that would complete first, first.

use gleaner_manifest::JobId;
use gleaner_protocol::ClusterName;
use serde::{Deserialize, Serialize};

use crate::ect::{Profile, estimate, scaled};

/// How many of the oldest waiting components `minmin` compares at each
/// step (the seed's choice, which keeps a round cheap); later ones follow
/// in order, as with `mct`.
pub const MINMIN_WINDOW: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    #[default]
    Regular,
    AllCancellation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Heuristic {
    #[default]
    Mct,
    Minmin,
}

/// A grid component waiting in a cluster's batch queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    pub job: JobId,
    pub component: u32,
    pub slots: u32,
    /// Its walltime on a cluster of speed 1 (ms).
    pub walltime: u64,
    pub cluster: ClusterName,
    /// Its predicted start and completion there, ms from now.
    pub start: u64,
    pub completion: u64,
    /// Clusters it may not go to (it cannot read its inputs there, or it
    /// did not start there in this run).
    pub barred: Vec<ClusterName>,
}

/// A cluster as reallocation sees it: its free slots over time with none
/// of the waiting components in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    pub name: ClusterName,
    pub speed: f64,
    pub profile: Profile,
}

/// A component to submit on `to`, and withdraw from `from` once `to` has
/// accepted it.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub job: JobId,
    pub component: u32,
    pub from: ClusterName,
    pub to: ClusterName,
    /// Its predicted completion where it is and where it goes (ms from now).
    pub before: u64,
    pub after: u64,
    /// Its predicted start where it goes (ms from now).
    pub start: u64,
}

/// The moves of one reallocation: `waiting` oldest first; a move must
/// gain at least `gain` ms.
pub fn reallocate(
    waiting: &[Waiting],
    sites: &[Site],
    algorithm: Algorithm,
    heuristic: Heuristic,
    gain: u64,
) -> Vec<Move> {
    let mut profiles: Vec<Profile> = sites.iter().map(|s| s.profile.clone()).collect();
    let site_of = |name: &ClusterName| sites.iter().position(|s| &s.name == name);
    if algorithm == Algorithm::Regular {
        // Everyone keeps their place but for those that move.
        for w in waiting {
            if let Some(s) = site_of(&w.cluster) {
                profiles[s].reserve(w.start, w.slots, scaled(w.walltime, sites[s].speed));
            }
        }
    }
    let mut left: Vec<usize> = (0..waiting.len()).collect();
    let mut moves = Vec::new();
    while !left.is_empty() {
        let pick = match heuristic {
            Heuristic::Mct => 0,
            Heuristic::Minmin => {
                let window = left.len().min(MINMIN_WINDOW);
                (0..window)
                    .min_by_key(|&k| {
                        best(&waiting[left[k]], sites, &profiles, algorithm)
                            .map_or(u64::MAX, |(_, e)| e.completion)
                    })
                    .unwrap_or(0)
            }
        };
        let w = &waiting[left.remove(pick)];
        let own = site_of(&w.cluster);
        let Some((to, there)) = best(w, sites, &profiles, algorithm) else {
            continue;
        };
        let moved = Some(to) != own && there.completion.saturating_add(gain) <= w.completion;
        let (site, start) = match (moved, own) {
            (true, _) => (to, there.start),
            (false, Some(own)) if algorithm == Algorithm::AllCancellation => (own, w.start),
            (false, _) => continue,
        };
        let length = scaled(w.walltime, sites[site].speed);
        profiles[site].reserve(start, w.slots, length);
        if moved {
            if let (Algorithm::Regular, Some(own)) = (algorithm, own) {
                profiles[own].release(w.start, w.slots, scaled(w.walltime, sites[own].speed));
            }
            moves.push(Move {
                job: w.job.clone(),
                component: w.component,
                from: w.cluster.clone(),
                to: sites[to].name.clone(),
                before: w.completion,
                after: there.completion,
                start: there.start,
            });
        }
    }
    moves
}

/// The cluster where `w` would complete first, other than where it waits
/// (for `regular`, which keeps it there unless another wins) or any.
fn best(
    w: &Waiting,
    sites: &[Site],
    profiles: &[Profile],
    algorithm: Algorithm,
) -> Option<(usize, crate::ect::Estimate)> {
    sites
        .iter()
        .enumerate()
        .filter(|(_, s)| !w.barred.contains(&s.name))
        .filter(|(_, s)| algorithm == Algorithm::AllCancellation || s.name != w.cluster)
        .filter_map(|(i, s)| Some((i, estimate(&profiles[i], s.speed, w.slots, w.walltime)?)))
        .min_by_key(|(i, e)| (e.completion, sites[*i].name != w.cluster, *i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(name: &str, speed: f64, total: u32, running: &[(u32, u64)]) -> Site {
        Site {
            name: name.into(),
            speed,
            profile: Profile::new(total, running.iter().copied()),
        }
    }

    fn waiting(job: &str, cluster: &str, slots: u32, walltime: u64, start: u64) -> Waiting {
        Waiting {
            job: job.parse().unwrap(),
            component: 0,
            slots,
            walltime,
            cluster: cluster.into(),
            start,
            completion: start + walltime,
            barred: Vec::new(),
        }
    }

    #[test]
    fn a_component_stuck_behind_a_long_job_moves_where_it_starts_at_once() {
        let sites = [
            site("busy", 1.0, 8, &[(8, 10_000)]),
            site("idle", 1.0, 8, &[]),
        ];
        let w = [waiting("g-0000000000000001", "busy", 4, 100, 10_000)];
        let moves = reallocate(&w, &sites, Algorithm::Regular, Heuristic::Mct, 60);
        assert_eq!(moves.len(), 1);
        assert_eq!(
            (moves[0].to.as_str(), moves[0].after, moves[0].start),
            ("idle", 100, 0)
        );
        // A gain under the threshold moves nothing.
        assert!(reallocate(&w, &sites, Algorithm::Regular, Heuristic::Mct, 10_001).is_empty());
    }

    #[test]
    fn regular_moves_the_oldest_first_and_the_next_sees_the_room_it_took() {
        // 4 free slots on "idle"; two 4-slot components wait on "busy".
        let sites = [
            site("busy", 1.0, 8, &[(8, 1000)]),
            site("idle", 1.0, 8, &[(4, 5000)]),
        ];
        let w = [
            waiting("a-0000000000000001", "busy", 4, 100, 1000),
            waiting("b-0000000000000002", "busy", 4, 100, 1000),
        ];
        let moves = reallocate(&w, &sites, Algorithm::Regular, Heuristic::Mct, 0);
        assert_eq!(moves.len(), 2, "{moves:?}");
        assert_eq!(moves[0].after, 100);
        // The second finds idle's 4 free slots taken until 100.
        assert_eq!((moves[1].start, moves[1].after), (100, 200));
    }

    #[test]
    fn minmin_moves_the_component_that_completes_first_first() {
        // One free 4-slot hole on "idle" until 5000; the older component
        // is long (its run there would end at 3000), the younger short.
        let sites = [
            site("busy", 1.0, 8, &[(8, 20_000)]),
            site("idle", 1.0, 8, &[(4, 5000)]),
        ];
        let w = [
            waiting("a-0000000000000001", "busy", 4, 3000, 20_000),
            waiting("b-0000000000000002", "busy", 4, 100, 20_000),
        ];
        let mct = reallocate(&w, &sites, Algorithm::Regular, Heuristic::Mct, 0);
        let minmin = reallocate(&w, &sites, Algorithm::Regular, Heuristic::Minmin, 0);
        assert_eq!(mct[0].job.as_str(), "a-0000000000000001");
        assert_eq!(minmin[0].job.as_str(), "b-0000000000000002");
        assert_eq!(minmin[1].start, 100);
    }

    #[test]
    fn all_cancellation_places_everyone_again_and_a_faster_cluster_wins() {
        // Both wait on "slow"; "fast" (speed 2) is busy until 1500. Without
        // them "slow" is idle: the first stays (2000 there, 2500 on
        // "fast"), the second goes where it completes first.
        let sites = [
            site("slow", 1.0, 4, &[]),
            site("fast", 2.0, 4, &[(4, 1500)]),
        ];
        let w = [
            waiting("a-0000000000000001", "slow", 4, 2000, 0),
            waiting("b-0000000000000002", "slow", 4, 2000, 2000),
        ];
        let moves = reallocate(&w, &sites, Algorithm::AllCancellation, Heuristic::Mct, 0);
        assert_eq!(moves.len(), 1, "{moves:?}");
        assert_eq!(moves[0].job.as_str(), "b-0000000000000002");
        assert_eq!((moves[0].start, moves[0].after), (1500, 2500));
        let regular = reallocate(&w, &sites, Algorithm::Regular, Heuristic::Mct, 0);
        assert_eq!(regular, moves);
    }

    #[test]
    fn a_component_never_goes_where_it_is_barred_or_does_not_fit() {
        let sites = [
            site("busy", 1.0, 8, &[(8, 10_000)]),
            site("idle", 1.0, 8, &[]),
            site("small", 1.0, 2, &[]),
        ];
        let mut w = waiting("g-0000000000000001", "busy", 4, 100, 10_000);
        w.barred = vec!["idle".into()];
        assert!(reallocate(&[w], &sites, Algorithm::Regular, Heuristic::Mct, 0).is_empty());
    }
}
