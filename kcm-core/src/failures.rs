//! Failed launcher starts, by whose they were. A start fails when the
//! batch system refuses a placeholder or one ends before its launcher
//! reaches the broker; the cause may be the cluster's (a wrong
//! `launcher_program`, no route to the broker) or one user's (an account
//! the batch system refuses, a quota, launchers that user breaks on
//! purpose). One user's failures must not exclude a cluster for everyone:
//! they count against the cluster only once they come from two accounts
//! or more with no start working in between (with one user, always), and
//! otherwise bar that account's jobs alone, for a while.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

/// How long an account's failures bar its jobs after the last one: then
/// its next grant is a trial.
pub const BARRED_FOR: Duration = Duration::from_secs(300);

#[derive(Debug, Default)]
pub struct StartFailures {
    /// Every failure is the cluster's (one user).
    single: bool,
    /// Failures since a start last worked, by account.
    streak: BTreeMap<String, u32>,
    /// Each account's consecutive failures, and when the last was.
    accounts: BTreeMap<String, (u32, Instant)>,
}

impl StartFailures {
    pub fn new(single: bool) -> Self {
        Self {
            single,
            ..Self::default()
        }
    }

    /// A start of `account`'s failed: how many of its starts have, in a row.
    pub fn failed(&mut self, account: &str, now: Instant) -> u32 {
        *self.streak.entry(account.to_owned()).or_default() += 1;
        let (count, at) = self.accounts.entry(account.to_owned()).or_insert((0, now));
        *count = count.saturating_add(1);
        *at = now;
        *count
    }

    /// A failure of `account`'s counted before it was known to be no one's
    /// (its launcher found its GPUs held outside gleaner): taken back, so
    /// that it neither bars the account nor, with another account's,
    /// excludes the cluster.
    pub fn forgive(&mut self, account: &str) {
        if let Some(n) = self.streak.get_mut(account) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.streak.remove(account);
            }
        }
        if let Some((n, _)) = self.accounts.get_mut(account) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.accounts.remove(account);
            }
        }
    }

    /// A launcher of `account`'s reached the broker: the cluster starts
    /// launchers, and this account's do.
    pub fn started(&mut self, account: Option<&str>) {
        self.streak.clear();
        if let Some(account) = account {
            self.accounts.remove(account);
        }
    }

    /// Failed starts that count against the cluster.
    pub fn cluster(&self) -> u32 {
        if self.single || self.streak.len() >= 2 {
            self.streak
                .values()
                .fold(0, |sum, n| sum.saturating_add(*n))
        } else {
            0
        }
    }

    /// `account`'s failures in a row, while they bar its jobs (the last
    /// within [`BARRED_FOR`]); 0 otherwise.
    pub fn of(&self, account: &str, now: Instant) -> u32 {
        match self.accounts.get(account) {
            Some((count, at)) if now.saturating_duration_since(*at) < BARRED_FOR => *count,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_accounts_failures_are_its_own() {
        let t0 = Instant::now();
        let mut failures = StartFailures::new(false);
        for n in 1..=5 {
            assert_eq!(failures.failed("bob", t0), n);
        }
        assert_eq!(
            failures.cluster(),
            0,
            "bob's alone do not exclude the cluster"
        );
        assert_eq!(failures.of("bob", t0), 5);
        assert_eq!(failures.of("alice", t0), 0);
        assert_eq!(failures.of("bob", t0 + BARRED_FOR), 0, "then a trial");
        // Alice's start works: the cluster does, bob's still do not.
        failures.started(Some("alice"));
        assert_eq!(failures.of("bob", t0), 5);
        failures.started(Some("bob"));
        assert_eq!(failures.of("bob", t0), 0);
    }

    #[test]
    fn a_failure_taken_back_counts_for_nothing() {
        let t0 = Instant::now();
        let mut failures = StartFailures::new(false);
        failures.failed("bob", t0);
        failures.failed("alice", t0);
        assert_eq!(failures.cluster(), 2);
        // Alice's was bob's squatting: only bob's are left, his own.
        failures.forgive("alice");
        assert_eq!(failures.cluster(), 0);
        assert_eq!((failures.of("alice", t0), failures.of("bob", t0)), (0, 1));
        failures.forgive("alice");
        assert_eq!(failures.of("alice", t0), 0, "nothing more to take back");
    }

    #[test]
    fn failures_of_two_accounts_are_the_clusters() {
        let t0 = Instant::now();
        let mut failures = StartFailures::new(false);
        failures.failed("bob", t0);
        failures.failed("bob", t0);
        failures.failed("alice", t0);
        assert_eq!(failures.cluster(), 3);
        failures.started(None);
        assert_eq!(failures.cluster(), 0);
        let mut single = StartFailures::new(true);
        single.failed("gleaner", t0);
        assert_eq!(single.cluster(), 1, "with one user, every failure");
    }
}
