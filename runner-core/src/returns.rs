//! Whether a task the broker dead-lettered for its delivery limit was
//! lost to its launchers' deaths or only returned to its queue that often.
//!
//! A quorum queue counts every return of a message: a launcher that died
//! holding it, but also a delivery that reached a consumer just cancelled
//! (a launcher changing its prefetch), which the broker takes back itself.
//! A task bounced that way through a few launchers at once is dead-lettered
//! though nothing died. The runner tells the two apart by what it saw of
//! its launchers: a task whose last run killed its launcher is dead-lettered
//! as that launcher goes, so the runner notices a death close to the dead
//! letter, before it or within the time a death takes to be noticed (a
//! poll the launcher's queue no longer answers, or its silence). A
//! launcher's goodbye is an orderly end and counts for nothing. With no
//! death in that window the task is published again; a few times at most
//! (by one runner), so that whatever keeps returning it cannot keep it for
//! ever.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use gleaner_protocol::{TaskBundle, TaskMsg};

/// How often a task returned with no launcher leaving is published again
/// before it counts as lost all the same.
pub const REPUBLISHED_AT_MOST: u32 = 3;

/// A dead letter as the shell hands it in.
#[derive(Debug)]
pub struct DeadLetter {
    pub bundle: TaskBundle,
    /// What the shell holds it unacked by, until an
    /// [`crate::effect::Effect::SettleLost`] names it.
    pub receipt: u64,
    /// Delivered before, to a runner that died or lost the broker holding
    /// it: what that runner saw of its launchers is gone.
    pub redelivered: bool,
}

/// What becomes of a dead-lettered task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// Its launchers died running it.
    Lost,
    /// Returned by the broker only: publish it again.
    Republish,
    /// Returned with no launcher leaving, too often: lost.
    ReturnedTooOften,
}

/// A dead letter waiting for its judgement, with the receipt the shell
/// holds it unacked by: a runner that dies meanwhile gets it again.
#[derive(Debug)]
struct Waiting {
    task: TaskMsg,
    since: Instant,
    receipt: u64,
}

/// Dead-lettered tasks awaiting judgement, and the launchers' departures
/// they are judged by.
#[derive(Debug, Default)]
pub struct Returns {
    waiting: Vec<Waiting>,
    /// The last time a launcher of the job was seen dying (given up for its
    /// silence, or its queue found gone).
    last_death: Option<Instant>,
    /// Tasks published again so far, by task: few, so kept sparse.
    republished: HashMap<u64, u32>,
}

impl Returns {
    /// A launcher was found dead at `now`.
    pub fn found_dead(&mut self, now: Instant) {
        self.last_death = Some(now);
    }

    /// Whether a launcher was found dead from `window` before `at` on.
    fn died_around(&self, at: Instant, window: Duration) -> bool {
        self.last_death
            .is_some_and(|died| at.saturating_duration_since(died) <= window)
    }

    /// A task dead-lettered (with its receipt) at `now`: lost at once when
    /// a launcher was seen dying within `window` before, or when the letter
    /// comes again to a runner that cannot know (as a task that killed its
    /// launchers would be); else judged once `window` has passed.
    pub fn dead_lettered(
        &mut self,
        (task, receipt): (TaskMsg, u64),
        redelivered: bool,
        now: Instant,
        window: Duration,
    ) -> Option<(TaskMsg, u64, Judgement)> {
        if redelivered || self.died_around(now, window) {
            return Some((task, receipt, Judgement::Lost));
        }
        self.waiting.push(Waiting {
            task,
            since: now,
            receipt,
        });
        None
    }

    /// The judgements due at `now`: a launcher found dead from `window`
    /// before a dead letter to now makes its task lost.
    pub fn due(&mut self, now: Instant, window: Duration) -> Vec<(TaskMsg, u64, Judgement)> {
        let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| now.saturating_duration_since(w.since) >= window);
        self.waiting = waiting;
        due.into_iter()
            .map(|w| {
                let judgement = if self.died_around(w.since, window) {
                    Judgement::Lost
                } else {
                    let times = self.republished.entry(w.task.task).or_default();
                    *times += 1;
                    match *times > REPUBLISHED_AT_MOST {
                        true => Judgement::ReturnedTooOften,
                        false => Judgement::Republish,
                    }
                };
                (w.task, w.receipt, judgement)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(25);

    fn task(n: u64) -> TaskMsg {
        serde_json::from_value(serde_json::json!({
            "job": "sweep-3fa9c2d41e07b5a8", "task": n, "attempt": 1, "command": "true"
        }))
        .expect("a task message")
    }

    #[test]
    fn a_task_returned_with_no_launcher_leaving_is_published_again() {
        let start = Instant::now();
        let mut returns = Returns::default();
        assert_eq!(
            returns.dead_lettered((task(7), 1), false, start, WINDOW),
            None
        );
        assert!(
            returns.due(start + WINDOW / 2, WINDOW).is_empty(),
            "a death may not be noticed yet"
        );
        let judged = returns.due(start + WINDOW, WINDOW);
        assert_eq!(judged, vec![(task(7), 1, Judgement::Republish)]);
        assert!(
            returns.due(start + WINDOW * 2, WINDOW).is_empty(),
            "judged once"
        );
    }

    #[test]
    fn a_launcher_leaving_around_the_dead_letter_makes_it_lost() {
        let start = Instant::now() + WINDOW * 4;
        let mut before = Returns::default();
        before.found_dead(start - WINDOW / 2);
        assert_eq!(
            before.dead_lettered((task(1), 1), false, start, WINDOW),
            Some((task(1), 1, Judgement::Lost)),
            "a death seen just before: lost at once"
        );
        let mut after = Returns::default();
        assert_eq!(
            after.dead_lettered((task(2), 2), false, start, WINDOW),
            None
        );
        after.found_dead(start + WINDOW / 2);
        assert_eq!(
            after.due(start + WINDOW, WINDOW),
            vec![(task(2), 2, Judgement::Lost)],
            "a death noticed after the dead letter"
        );
        let mut long_before = Returns::default();
        long_before.found_dead(start - WINDOW * 2);
        assert_eq!(
            long_before.dead_lettered((task(3), 3), false, start, WINDOW),
            None
        );
        assert_eq!(
            long_before.due(start + WINDOW, WINDOW),
            vec![(task(3), 3, Judgement::Republish)],
            "a death long before says nothing of this task"
        );
        assert_eq!(
            long_before.dead_lettered((task(4), 4), true, start, WINDOW),
            Some((task(4), 4, Judgement::Lost)),
            "a runner given it again cannot know what the last one saw"
        );
    }

    #[test]
    fn a_task_returned_again_and_again_is_lost_in_the_end() {
        let mut now = Instant::now();
        let mut returns = Returns::default();
        for time in 1..=REPUBLISHED_AT_MOST + 1 {
            assert_eq!(
                returns.dead_lettered((task(5), time.into()), false, now, WINDOW),
                None
            );
            now += WINDOW;
            let expected = match time > REPUBLISHED_AT_MOST {
                true => Judgement::ReturnedTooOften,
                false => Judgement::Republish,
            };
            assert_eq!(
                returns.due(now, WINDOW),
                vec![(task(5), time.into(), expected)]
            );
        }
    }
}
