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
    fn multi_slot_launchers_cover_several_slots() {
        let mut big = candidate("big", None);
        big.slots = 4;
        let candidates = vec![big, candidate("one", None)];
        assert_eq!(choose_victims(candidates, 3, 3), ids(&["big"]));
    }
}
