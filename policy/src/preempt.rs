//! Which launchers a job gives up when it must shrink.

use gleaner_protocol::{LauncherId, LauncherMsg, ShrinkMode};

/// A launcher as the preemption policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub launcher: LauncherId,
    pub slots: u32,
    /// Start of its most recently started task; `None` when idle.
    pub newest_start: Option<u64>,
}

/// Which launchers to give up to free `slots` slots: idle ones first, then
/// those whose current task started most recently (least work lost).
pub fn choose_victims(mut candidates: Vec<Candidate>, slots: u32) -> Vec<LauncherId> {
    candidates.sort_by(|a, b| match (a.newest_start, b.newest_start) {
        (None, None) => a.launcher.cmp(&b.launcher),
        (None, Some(_)) => std::cmp::Ordering::Less,
        (Some(_), None) => std::cmp::Ordering::Greater,
        (Some(x), Some(y)) => y.cmp(&x).then_with(|| a.launcher.cmp(&b.launcher)),
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

    fn candidate(id: &str, newest: Option<u64>) -> Candidate {
        Candidate {
            launcher: id.into(),
            slots: 1,
            newest_start: newest,
        }
    }

    #[test]
    fn idle_first_then_most_recent_start() {
        let candidates = vec![
            candidate("old", Some(100)),
            candidate("idle", None),
            candidate("new", Some(900)),
            candidate("mid", Some(500)),
        ];
        assert_eq!(choose_victims(candidates.clone(), 1), ids(&["idle"]));
        assert_eq!(
            choose_victims(candidates.clone(), 3),
            ids(&["idle", "new", "mid"])
        );
        assert_eq!(choose_victims(candidates, 10).len(), 4);
    }

    #[test]
    fn multi_slot_launchers_cover_several_slots() {
        let mut big = candidate("big", None);
        big.slots = 4;
        let candidates = vec![big, candidate("one", None)];
        assert_eq!(choose_victims(candidates, 3), ids(&["big"]));
    }
}
