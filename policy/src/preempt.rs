//! Which launchers a job gives up when it must shrink.

use gleaner_protocol::{LauncherId, LauncherMsg, ShrinkMode};

/// A launcher as the preemption policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub launcher: LauncherId,
    pub slots: u32,
    /// How long its running tasks have run so far, together (ms): the work
    /// a preemption throws away; `None` when idle.
    pub work_ms: Option<u64>,
    /// The most times one of its running tasks was preempted already.
    pub preempted: u32,
}

/// Which launchers to give up to free `slots` slots: idle ones first, then
/// those that lose least work. Launchers running a task preempted
/// `max_preemptions` times already go last, so that a long task is not
/// starved by churn, unless nothing else frees the slots.
pub fn choose_victims(
    mut candidates: Vec<Candidate>,
    slots: u32,
    max_preemptions: u32,
) -> Vec<LauncherId> {
    candidates.sort_by(|a, b| {
        let key = |c: &Candidate| {
            (
                c.work_ms.is_some() && c.preempted >= max_preemptions,
                c.work_ms,
            )
        };
        key(a)
            .cmp(&key(b))
            .then_with(|| a.launcher.cmp(&b.launcher))
    });
    first_covering(candidates, slots)
}

/// The first candidates, in order, whose slots cover `slots`.
fn first_covering(candidates: Vec<Candidate>, slots: u32) -> Vec<LauncherId> {
    let mut freed = 0;
    candidates
        .into_iter()
        .take_while(|c| {
            let take = freed < slots;
            freed = c.slots.saturating_add(freed);
            take
        })
        .map(|c| c.launcher)
        .collect()
}

/// How a shrink picks the launchers it takes back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum VictimChoice {
    /// gleaner's: [`choose_victims`].
    #[default]
    LeastLoss,
    /// KOALA-CS's launcher preemption policy (seed 000, section 3.7.2): a
    /// random set of the job's launchers there, each shrink's drawn from
    /// this seed and the shrink's number, so that a run can be repeated.
    Random { seed: u64 },
}

impl VictimChoice {
    /// The choice for a job's `n`th shrink: a random one draws from a seed
    /// of its own, so that shrinks do not all take the same launchers.
    pub fn nth(self, n: u64) -> Self {
        match self {
            Self::LeastLoss => Self::LeastLoss,
            Self::Random { seed } => {
                let mut state = seed ^ n.wrapping_mul(0xd1b5_4a32_d192_ed03);
                Self::Random {
                    seed: splitmix64(&mut state),
                }
            }
        }
    }

    /// The launchers it takes back to free `slots` slots.
    pub fn choose(
        self,
        candidates: Vec<Candidate>,
        slots: u32,
        max_preemptions: u32,
    ) -> Vec<LauncherId> {
        match self {
            Self::LeastLoss => choose_victims(candidates, slots, max_preemptions),
            Self::Random { seed } => random_victims(candidates, slots, seed),
        }
    }
}

/// A random set of `candidates` that frees `slots` slots: a shuffle
/// drawn from `seed` alone (the candidates' order does not matter), then
/// as many as it takes, in that order.
pub fn random_victims(mut candidates: Vec<Candidate>, slots: u32, seed: u64) -> Vec<LauncherId> {
    candidates.sort_by(|a, b| a.launcher.cmp(&b.launcher));
    let mut state = seed;
    // Fisher-Yates, from the back.
    for i in (1..candidates.len()).rev() {
        let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
        candidates.swap(i, j);
    }
    first_covering(candidates, slots)
}

/// The next number of SplitMix64: small, pure, and good enough to shuffle
/// a cluster's launchers.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What the launchers a shrink chose are told: a drain lets their tasks
/// finish, a preemption stops them now.
pub fn order(mode: ShrinkMode, reason: &str) -> LauncherMsg {
    let reason = reason.to_owned();
    match mode {
        ShrinkMode::Preempt => LauncherMsg::Preempt { reason },
        ShrinkMode::Drain => LauncherMsg::Drain { reason },
    }
}

/// Whether the kcm is asked to remove the chosen launchers that outstay
/// their grace: a preemption must free the slots, a drain waits for tasks.
pub fn releases(mode: ShrinkMode, victims: &[LauncherId]) -> bool {
    mode == ShrinkMode::Preempt && !victims.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<LauncherId> {
        names.iter().map(|&n| n.into()).collect()
    }

    fn candidate(id: &str, work_ms: Option<u64>) -> Candidate {
        Candidate {
            launcher: id.into(),
            slots: 1,
            work_ms,
            preempted: 0,
        }
    }

    #[test]
    fn idle_first_then_least_work_lost() {
        let candidates = vec![
            candidate("old", Some(900)),
            candidate("idle", None),
            candidate("new", Some(100)),
            candidate("mid", Some(500)),
        ];
        assert_eq!(choose_victims(candidates.clone(), 1, 3), ids(&["idle"]));
        assert_eq!(
            choose_victims(candidates.clone(), 3, 3),
            ids(&["idle", "new", "mid"])
        );
        assert_eq!(choose_victims(candidates, 10, 3).len(), 4);
    }

    #[test]
    fn a_task_preempted_often_is_spared_while_others_free_the_slots() {
        let mut churned = candidate("churned", Some(10));
        churned.preempted = 3;
        let candidates = vec![churned, candidate("long", Some(60_000))];
        assert_eq!(
            choose_victims(candidates.clone(), 1, 3),
            ids(&["long"]),
            "three preemptions: spared, though it loses less"
        );
        assert_eq!(choose_victims(candidates.clone(), 1, 4), ids(&["churned"]));
        assert_eq!(
            choose_victims(candidates, 2, 3),
            ids(&["long", "churned"]),
            "nothing else frees the second slot"
        );
    }

    #[test]
    fn a_launcher_of_many_tasks_loses_them_all() {
        let mut big = candidate("big", Some(3 * 400));
        big.slots = 3;
        let candidates = vec![big, candidate("one", Some(1000))];
        assert_eq!(choose_victims(candidates, 1, 3), ids(&["one"]));
    }

    #[test]
    fn a_random_choice_is_any_set_that_frees_the_slots_and_repeats_by_seed() {
        let candidates = vec![
            candidate("old", Some(900)),
            candidate("idle", None),
            candidate("new", Some(100)),
            candidate("mid", Some(500)),
        ];
        let mut reversed = candidates.clone();
        reversed.reverse();
        for seed in 0..20 {
            let chosen = random_victims(candidates.clone(), 2, seed);
            assert_eq!(chosen.len(), 2);
            assert_ne!(chosen[0], chosen[1]);
            assert_eq!(chosen, random_victims(reversed.clone(), 2, seed), "by seed");
        }
        // Unlike gleaner's choice, busy launchers go before idle ones.
        let firsts: std::collections::BTreeSet<LauncherId> = (0..40)
            .map(|seed| random_victims(candidates.clone(), 1, seed).remove(0))
            .collect();
        assert_eq!(firsts.len(), 4, "{firsts:?}");
        assert_eq!(random_victims(candidates.clone(), 10, 7).len(), 4);
        assert!(random_victims(candidates, 0, 7).is_empty());
    }

    #[test]
    fn multi_slot_launchers_cover_several_slots() {
        let mut big = candidate("big", None);
        big.slots = 4;
        let candidates = vec![big, candidate("one", None)];
        assert_eq!(choose_victims(candidates, 3, 3), ids(&["big"]));
    }
}
