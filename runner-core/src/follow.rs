//! Who follows which task's output (`gleaner logs --follow`), and until
//! when: the runner relays the pieces launchers send to them, and drops
//! pieces nobody follows. Each follow is a lease its follower renews; one
//! that went away costs at most a lease.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use gleaner_protocol::FOLLOW_LEASE_MS;

/// Follows of one job at once at most: each costs its launcher a message
/// every quarter second while the task prints.
pub const MOST_FOLLOWS: usize = 64;

/// Launchers asked at most for one task whose launcher is not known (it
/// started since their reports): beyond, its launcher's next report
/// names it.
pub const MOST_ASKED: usize = 64;

/// The follows of one job: for each task, its followers' direct reply-to
/// addresses and when their leases end.
#[derive(Debug, Default)]
pub struct Followers {
    by_task: BTreeMap<u64, BTreeMap<String, Instant>>,
    /// When the launchers were last asked to send each followed task's
    /// output.
    asked: BTreeMap<u64, Instant>,
}

impl Followers {
    /// `to` follows `task` for a lease from `now` (a renewal extends it);
    /// `false` if the job has [`MOST_FOLLOWS`] already.
    pub fn follow(&mut self, task: u64, to: String, now: Instant) -> bool {
        self.lapse(now);
        let known = self.by_task.get(&task).is_some_and(|f| f.contains_key(&to));
        if !known && self.count() >= MOST_FOLLOWS {
            return false;
        }
        let until = now + Duration::from_millis(FOLLOW_LEASE_MS);
        self.by_task.entry(task).or_default().insert(to, until);
        true
    }

    /// Where a piece of `task`'s output goes: its followers. A run's last
    /// piece (`ended`) ends their follows (a follower of a task that runs
    /// again renews).
    pub fn relay(&mut self, task: u64, ended: bool, now: Instant) -> Vec<String> {
        if self.by_task.is_empty() {
            return Vec::new();
        }
        self.lapse(now);
        let to = match ended {
            true => self.by_task.remove(&task).unwrap_or_default(),
            false => self.by_task.get(&task).cloned().unwrap_or_default(),
        };
        to.into_keys().collect()
    }

    /// Whether `task`'s launchers are to be asked (again) now: not within
    /// the last half lease, when they still follow it.
    pub fn ask_due(&mut self, task: u64, now: Instant) -> bool {
        let again = Duration::from_millis(FOLLOW_LEASE_MS / 2);
        let due = self
            .asked
            .get(&task)
            .is_none_or(|at| now.saturating_duration_since(*at) >= again);
        if due {
            self.asked.insert(task, now);
        }
        due
    }

    fn count(&self) -> usize {
        self.by_task.values().map(BTreeMap::len).sum()
    }

    fn lapse(&mut self, now: Instant) {
        for followers in self.by_task.values_mut() {
            followers.retain(|_, until| *until > now);
        }
        self.by_task.retain(|_, followers| !followers.is_empty());
        let by_task = &self.by_task;
        self.asked.retain(|task, _| by_task.contains_key(task));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_go_to_their_tasks_followers_while_their_leases_last() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut followers = Followers::default();
        assert!(followers.follow(3, "amq.rabbitmq.reply-to.a".into(), at(0)));
        assert!(followers.follow(3, "amq.rabbitmq.reply-to.b".into(), at(5_000)));
        assert!(
            followers.relay(4, false, at(6_000)).is_empty(),
            "nobody follows 4"
        );
        assert_eq!(followers.relay(3, false, at(6_000)).len(), 2);
        // a's lease ran out; b's did not.
        assert_eq!(
            followers.relay(3, false, at(FOLLOW_LEASE_MS + 1)),
            ["amq.rabbitmq.reply-to.b"]
        );
        // Renewed, then the run's last piece ends the follow.
        assert!(followers.follow(3, "amq.rabbitmq.reply-to.b".into(), at(12_000)));
        assert_eq!(followers.relay(3, true, at(13_000)).len(), 1);
        assert!(followers.relay(3, false, at(13_000)).is_empty());
    }

    #[test]
    fn launchers_are_asked_again_once_half_their_follow_passed() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut followers = Followers::default();
        followers.follow(3, "amq.rabbitmq.reply-to.a".into(), at(0));
        assert!(followers.ask_due(3, at(0)));
        assert!(!followers.ask_due(3, at(3_000)), "a renewal 3 s on");
        assert!(followers.ask_due(3, at(FOLLOW_LEASE_MS / 2)));
        // Once nobody follows, the next follow asks at once.
        followers.relay(3, true, at(6_000));
        followers.follow(3, "amq.rabbitmq.reply-to.a".into(), at(6_000));
        assert!(followers.ask_due(3, at(6_000)));
    }

    #[test]
    fn follows_are_bounded_and_renewals_still_count() {
        let t0 = Instant::now();
        let mut followers = Followers::default();
        for i in 0..MOST_FOLLOWS {
            assert!(followers.follow(i as u64, format!("amq.rabbitmq.reply-to.{i}"), t0));
        }
        assert!(!followers.follow(999, "amq.rabbitmq.reply-to.x".into(), t0));
        assert!(
            followers.follow(0, "amq.rabbitmq.reply-to.0".into(), t0),
            "a renewal"
        );
        let later = t0 + Duration::from_millis(FOLLOW_LEASE_MS + 1);
        assert!(
            followers.follow(999, "amq.rabbitmq.reply-to.x".into(), later),
            "lapsed ones make room"
        );
    }
}
