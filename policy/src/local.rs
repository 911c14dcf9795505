//! What a cluster manager does when the cluster's own jobs wait.
//!
//! gleaner must never make a local job wait. When one does: withdraw
//! gleaner's pending placeholders (they would compete with it), then split
//! the slots still missing between the scavenging jobs on the cluster —
//! together covering the need once, not each job the full amount — and
//! answer each waiting job once, until the answer has had time to work.

use std::collections::BTreeMap;

use gleaner_manifest::JobId;

use crate::share::split_shrink;

/// A job of the cluster's own users, waiting for slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingJob {
    pub id: String,
    pub slots: u32,
}

/// The cluster as the local policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct LocalState<'a> {
    pub waiting: &'a [WaitingJob],
    /// Slots free right now.
    pub idle: u32,
    /// gleaner's placeholders that wait in the batch system.
    pub pending_placeholders: &'a [String],
    /// Slots each scavenging job's running launchers hold.
    pub held: &'a BTreeMap<JobId, u32>,
}

/// What to do about the waiting jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalPlan {
    /// Pending placeholders to remove.
    pub withdraw: Vec<String>,
    /// Slots each scavenging job must give back now.
    pub shrink: Vec<(JobId, u32)>,
}

/// Waiting jobs already answered, and when; kept between polls.
#[derive(Debug, Clone, Default)]
pub struct Answered {
    jobs: BTreeMap<String, (u64, u32)>,
}

/// Decides, at `now` (ms), what to do for the waiting local jobs. A job
/// answered less than `settle` ms ago is not answered again: the launchers
/// told to go need that long to leave.
pub fn on_local_wait(
    state: LocalState<'_>,
    answered: &mut Answered,
    now: u64,
    settle: u64,
) -> LocalPlan {
    answered.jobs.retain(|id, (at, _)| {
        now.saturating_sub(*at) < settle && state.waiting.iter().any(|w| &w.id == id)
    });
    if state.waiting.is_empty() {
        return LocalPlan::default();
    }
    let withdraw = state.pending_placeholders.to_vec();
    // Idle slots may already have been freed for jobs answered earlier.
    let reserved: u32 = answered.jobs.values().map(|(_, slots)| slots).sum();
    let fresh: Vec<&WaitingJob> = state
        .waiting
        .iter()
        .filter(|w| !answered.jobs.contains_key(&w.id))
        .collect();
    let wanted: u32 = fresh.iter().map(|w| w.slots).sum();
    let needed = wanted.saturating_sub(state.idle.saturating_sub(reserved));
    for job in fresh {
        answered.jobs.insert(job.id.clone(), (now, job.slots));
    }
    LocalPlan {
        withdraw,
        shrink: split_shrink(needed, state.held),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str) -> JobId {
        format!("{name}-000000").parse().unwrap()
    }

    fn waiting(jobs: &[(&str, u32)]) -> Vec<WaitingJob> {
        jobs.iter()
            .map(|(id, slots)| WaitingJob {
                id: (*id).into(),
                slots: *slots,
            })
            .collect()
    }

    #[test]
    fn nothing_waits_nothing_happens() {
        let held = [(job("a"), 8)].into();
        let state = LocalState {
            waiting: &[],
            idle: 0,
            pending_placeholders: &["1.2".into()],
            held: &held,
        };
        assert_eq!(
            on_local_wait(state, &mut Answered::default(), 0, 5000),
            LocalPlan::default()
        );
    }

    #[test]
    fn pending_placeholders_go_first_and_the_need_is_split_once() {
        let held = [(job("a"), 4), (job("b"), 4)].into();
        let w = waiting(&[("7", 4)]);
        let pending = ["9.1".to_owned(), "9.2".to_owned()];
        let state = LocalState {
            waiting: &w,
            idle: 0,
            pending_placeholders: &pending,
            held: &held,
        };
        let plan = on_local_wait(state, &mut Answered::default(), 0, 5000);
        assert_eq!(plan.withdraw, pending);
        assert_eq!(
            plan.shrink,
            [(job("a"), 2), (job("b"), 2)],
            "4 slots in all, not 4 each"
        );
    }

    #[test]
    fn idle_slots_count_and_a_wait_is_answered_once() {
        let held = [(job("a"), 6)].into();
        let mut answered = Answered::default();
        let w = waiting(&[("7", 4)]);
        let state = LocalState {
            waiting: &w,
            idle: 2,
            pending_placeholders: &[],
            held: &held,
        };
        assert_eq!(
            on_local_wait(state, &mut answered, 0, 5000).shrink,
            [(job("a"), 2)]
        );
        // Still waiting a second later: the order is under way.
        let state = LocalState { idle: 4, ..state };
        assert!(
            on_local_wait(state, &mut answered, 1000, 5000)
                .shrink
                .is_empty()
        );
        // A new local job arrives; the 4 idle slots are meant for the first one.
        let w2 = waiting(&[("7", 4), ("8", 2)]);
        let state = LocalState {
            waiting: &w2,
            ..state
        };
        assert_eq!(
            on_local_wait(state, &mut answered, 1500, 5000).shrink,
            [(job("a"), 2)]
        );
        // Still waiting after the settle time: answered again.
        let state = LocalState {
            waiting: &w,
            idle: 0,
            ..state
        };
        assert_eq!(
            on_local_wait(state, &mut answered, 7000, 5000).shrink,
            [(job("a"), 4)]
        );
    }

    #[test]
    fn never_more_than_gleaner_holds() {
        let held = [(job("a"), 1)].into();
        let w = waiting(&[("7", 8)]);
        let state = LocalState {
            waiting: &w,
            idle: 0,
            pending_placeholders: &[],
            held: &held,
        };
        assert_eq!(
            on_local_wait(state, &mut Answered::default(), 0, 5000).shrink,
            [(job("a"), 1)]
        );
    }
}
