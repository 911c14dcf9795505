//! Estimated completion times (seed 002): when a job of so many slots and
//! such a walltime would start and end on a cluster, from the jobs its
//! batch system runs and queues. One free-slot [`Profile`] serves the
//! kcm's estimates (running jobs end at their walltimes, waiting ones are
//! given their reservations in queue order), the scheduler's choice of the
//! cluster of minimum completion time, and the simulator's batch
//! schedulers (first come first served, EASY and conservative
//! backfilling), so that what is estimated and what is simulated agree.

use serde::{Deserialize, Serialize};

/// Steps a profile keeps at most: past them, the closest are merged (late,
/// never early), so that however long a queue, an estimate costs a
/// bounded time.
pub const MAX_STEPS: usize = 512;

/// As good as never, in ms: a job without a time limit holds its slots
/// past any horizon an estimate looks at (ten years).
pub const NEVER_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

/// Free slots of a cluster over time, from now on: `(from ms, free)` steps,
/// ascending, the first at 0, the last lasting for ever.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    total: u32,
    steps: Vec<(u64, u32)>,
}

impl Profile {
    /// `total` slots of which each running job holds its slots until it
    /// ends (`ends_in` ms from now; one past its walltime ends now).
    pub fn new(total: u32, running: impl IntoIterator<Item = (u32, u64)>) -> Self {
        let mut profile = Self {
            total,
            steps: vec![(0, total)],
        };
        for (slots, ends_in) in running {
            profile.reserve(0, slots, ends_in);
        }
        profile
    }

    /// A profile as a report carried it: steps out of order, or not
    /// starting at 0, or above `total`, are put right rather than trusted.
    pub fn from_steps(total: u32, mut steps: Vec<(u64, u32)>) -> Self {
        steps.sort_by_key(|(at, _)| *at);
        steps.dedup_by_key(|(at, _)| *at);
        for step in &mut steps {
            step.1 = step.1.min(total);
        }
        match steps.first_mut() {
            Some(first) => first.0 = 0,
            None => steps.push((0, total)),
        }
        Self { total, steps }
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    pub fn steps(&self) -> &[(u64, u32)] {
        &self.steps
    }

    /// Free slots at `at` ms from now.
    pub fn free_at(&self, at: u64) -> u32 {
        let i = self.steps.partition_point(|(t, _)| *t <= at);
        self.steps[i.saturating_sub(1)].1
    }

    /// The earliest time from `not_before` on at which `slots` are free for
    /// `duration` ms; `None` if the cluster has fewer slots in all.
    pub fn earliest(&self, slots: u32, duration: u64, not_before: u64) -> Option<u64> {
        if slots > self.total {
            return None;
        }
        let first = self.steps.partition_point(|(t, _)| *t <= not_before) - 1;
        let candidates =
            std::iter::once(not_before).chain(self.steps[first + 1..].iter().map(|s| s.0));
        candidates.into_iter().find(|&start| {
            let end = start.saturating_add(duration.max(1));
            let from = self.steps.partition_point(|(t, _)| *t <= start) - 1;
            self.steps[from..]
                .iter()
                .take_while(|(t, _)| *t < end)
                .all(|(_, free)| *free >= slots)
        })
    }

    /// Takes `slots` from `start` for `duration` ms.
    pub fn reserve(&mut self, start: u64, slots: u32, duration: u64) {
        self.change(start, duration, |free, _| free.saturating_sub(slots));
    }

    /// Gives back `slots` from `start` for `duration` ms: a reservation
    /// that will not be used (a job moved away), up to the cluster's size.
    pub fn release(&mut self, start: u64, slots: u32, duration: u64) {
        self.change(start, duration, |free, total| {
            free.saturating_add(slots).min(total)
        });
    }

    /// Sets the free slots from `start` for `duration` ms to `f(free,
    /// total)`.
    fn change(&mut self, start: u64, duration: u64, f: impl Fn(u32, u32) -> u32) {
        let end = start.saturating_add(duration);
        if end <= start {
            return;
        }
        let from = self.split(start);
        let to = self.split(end);
        let total = self.total;
        for step in &mut self.steps[from..to] {
            step.1 = f(step.1, total);
        }
        self.steps.dedup_by(|later, earlier| later.1 == earlier.1);
        self.bound(MAX_STEPS);
    }

    /// The index of the step that starts at `at`, made if need be.
    fn split(&mut self, at: u64) -> usize {
        let i = self.steps.partition_point(|(t, _)| *t < at);
        if self.steps.get(i).is_some_and(|(t, _)| *t == at) {
            return i;
        }
        let free = self.steps[i - 1].1;
        self.steps.insert(i, (at, free));
        i
    }

    /// The same profile `by` ms later: what was due by then has happened.
    pub fn advanced(&self, by: u64) -> Self {
        let steps = self
            .steps
            .iter()
            .map(|(t, free)| (t.saturating_sub(by), *free))
            .collect::<Vec<_>>();
        let mut kept: Vec<(u64, u32)> = Vec::with_capacity(steps.len());
        for step in steps {
            match kept.last_mut() {
                Some(last) if last.0 == step.0 => last.1 = step.1,
                _ => kept.push(step),
            }
        }
        Self {
            total: self.total,
            steps: kept,
        }
    }

    /// At most `max` steps, each merged one counted at the fewest free
    /// slots it covered: an estimate may come late, never early.
    pub fn bounded(mut self, max: usize) -> Self {
        self.bound(max);
        self
    }

    fn bound(&mut self, max: usize) {
        // The first step (now) and the last (for ever) stay as they are.
        while self.steps.len() > max.max(3) {
            let inner = self.steps.len() - 3;
            let Some((i, _)) = self
                .steps
                .windows(2)
                .enumerate()
                .skip(1)
                .take(inner)
                .min_by_key(|(_, w)| w[1].0 - w[0].0)
            else {
                break;
            };
            let merged = self.steps[i].1.min(self.steps[i + 1].1);
            self.steps[i].1 = merged;
            self.steps.remove(i + 1);
        }
    }
}

/// How a batch system orders its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Discipline {
    /// In order: no job starts before one ahead of it.
    Fcfs,
    /// The first waiting job gets a reservation; any later one starts now
    /// if it fits without delaying it.
    Easy,
    /// Every waiting job gets a reservation in queue order, and a later
    /// one starts earlier only where that delays none of them.
    #[default]
    Conservative,
}

/// A job in a batch queue: its slots and the walltime it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    pub slots: u32,
    pub walltime: u64,
}

/// What a batch scheduler makes of its queue now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Of the queue, in order, the jobs that start now.
    pub start_now: Vec<usize>,
    /// Each queued job's predicted start (ms from now), by the walltimes:
    /// its reservation (for EASY, as conservative backfilling would have
    /// it); `None` for a job bigger than the cluster.
    pub starts: Vec<Option<u64>>,
    /// Free slots once every queued job has its predicted start: what a
    /// job submitted now finds.
    pub after: Profile,
}

/// Schedules `queue` (in queue order) on `profile` (the running jobs).
pub fn schedule(profile: &Profile, queue: &[Queued], discipline: Discipline) -> Plan {
    let mut after = profile.clone();
    let mut starts = Vec::with_capacity(queue.len());
    let mut start_now = Vec::new();
    // EASY: what is free now once the first job that must wait has its
    // reservation; later jobs start only within it.
    let mut easy = profile.clone();
    let mut head_reserved = false;
    let mut not_before = 0;
    for (i, job) in queue.iter().enumerate() {
        let Some(start) = after.earliest(job.slots, job.walltime, not_before) else {
            starts.push(None);
            continue;
        };
        after.reserve(start, job.slots, job.walltime);
        starts.push(Some(start));
        let now = match discipline {
            Discipline::Fcfs => {
                not_before = start;
                start == 0
            }
            Discipline::Conservative => start == 0,
            Discipline::Easy => {
                let now = easy.earliest(job.slots, job.walltime, 0) == Some(0);
                match (now, head_reserved) {
                    (true, _) => easy.reserve(0, job.slots, job.walltime),
                    (false, false) => {
                        head_reserved = true;
                        easy.reserve(start, job.slots, job.walltime);
                    }
                    (false, true) => {}
                }
                now
            }
        };
        if now {
            start_now.push(i);
            if start != 0 {
                // EASY started it ahead of its conservative reservation.
                starts[i] = Some(0);
            }
        }
    }
    Plan {
        start_now,
        starts,
        after,
    }
}

/// Where a job would complete first, and when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Its predicted start, ms from now.
    pub start: u64,
    /// Its predicted completion (start + walltime there), ms from now.
    pub completion: u64,
}

/// When a job of `slots` and `walltime` ms (on a cluster of speed 1)
/// would start and complete on a cluster of `speed` whose free slots are
/// `profile`; `None` if it has fewer slots in all.
pub fn estimate(profile: &Profile, speed: f64, slots: u32, walltime: u64) -> Option<Estimate> {
    let here = scaled(walltime, speed);
    let start = profile.earliest(slots, here, 0)?;
    Some(Estimate {
        start,
        completion: start.saturating_add(here),
    })
}

/// A walltime on a cluster of `speed` (faster: shorter).
pub fn scaled(walltime: u64, speed: f64) -> u64 {
    match speed.is_finite() && speed > 0.0 {
        true => (walltime as f64 / speed).ceil() as u64,
        false => walltime,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(slots: u32, walltime: u64) -> Queued {
        Queued { slots, walltime }
    }

    #[test]
    fn a_profile_frees_slots_as_running_jobs_end() {
        let p = Profile::new(10, [(4, 100), (3, 50)]);
        assert_eq!(p.steps(), &[(0, 3), (50, 6), (100, 10)]);
        assert_eq!(p.earliest(5, 10, 0), Some(50));
        assert_eq!(p.earliest(7, 10, 0), Some(100));
        assert_eq!(p.earliest(3, 10, 0), Some(0));
        assert_eq!(p.earliest(11, 10, 0), None);
        assert_eq!(p.free_at(75), 6);
    }

    #[test]
    fn a_job_fits_only_where_its_whole_walltime_has_room() {
        // 6 free now, but a reservation takes 5 from 20 to 80.
        let mut p = Profile::new(10, [(4, 100)]);
        p.reserve(20, 5, 60);
        assert_eq!(p.steps(), &[(0, 6), (20, 1), (80, 6), (100, 10)]);
        assert_eq!(p.earliest(3, 20, 0), Some(0));
        assert_eq!(p.earliest(3, 21, 0), Some(80));
        assert_eq!(p.earliest(1, 500, 0), Some(0));
        assert_eq!(p.earliest(2, 500, 0), Some(80));
    }

    /// A hand-computed schedule: 8 slots, a running job of 4 until 10.
    /// Queue: A(6, 20), B(2, 5), C(4, 30), D(2, 40).
    /// - FCFS: A at 10 (needs 6); B not before A: at 10 (2 left beside A);
    ///   C at 30 (after A); D not before C: at 30 (C 4 + D 2 = 6 of 8).
    /// - Conservative: A at 10; B now (4 free until 10, B ends at 5); C at
    ///   30; D now? 2 free from 0 to 10 would be B's and D's 4 — D needs 40
    ///   ms: from 0 it meets A's 6 + the running... at 10–30 A holds 6, B
    ///   is gone, 2 free: D fits 0–40 only if 2 free throughout: 0–5 4−2
    ///   (B) = 2 ✓, 5–10 4 ✓, 10–30 2 ✓, 30–40 8−4 (C) = 4 ✓: D now.
    /// - EASY: A reserved at 10; B fits now and ends before 10: now; C (4)
    ///   does not fit now (2 left); D fits now without touching A's 6: now.
    #[test]
    fn the_three_disciplines_schedule_a_small_queue_as_computed_by_hand() {
        let running = Profile::new(8, [(4, 10)]);
        let queue = [q(6, 20), q(2, 5), q(4, 30), q(2, 40)];
        let fcfs = schedule(&running, &queue, Discipline::Fcfs);
        assert_eq!(fcfs.starts, [Some(10), Some(10), Some(30), Some(30)]);
        assert!(fcfs.start_now.is_empty());
        let cbf = schedule(&running, &queue, Discipline::Conservative);
        assert_eq!(cbf.starts, [Some(10), Some(0), Some(30), Some(0)]);
        assert_eq!(cbf.start_now, [1, 3]);
        let easy = schedule(&running, &queue, Discipline::Easy);
        assert_eq!(easy.start_now, [1, 3]);
        // What a new job of 8 slots finds: everything ends by 60.
        assert_eq!(cbf.after.earliest(8, 1, 0), Some(60));
    }

    #[test]
    fn easy_starts_a_job_that_conservative_backfilling_would_hold() {
        // 4 slots, 2 held until 100. Queue: A(4, 10) reserved at 100;
        // B(2, 50) fits now and ends before A: both start it. C(2, 200)
        // would overlap A: neither starts it, EASY does not either (A's
        // reservation needs all 4 at 100).
        let running = Profile::new(4, [(2, 100)]);
        let queue = [q(4, 10), q(2, 50), q(1, 200)];
        let easy = schedule(&running, &queue, Discipline::Easy);
        let cbf = schedule(&running, &queue, Discipline::Conservative);
        assert_eq!(cbf.start_now, [1]);
        assert_eq!(easy.start_now, [1]);
        // D of one slot, 20 ms: nothing is free beside B now; both hold it
        // for 50, when B ends, where CBF has it end before A.
        let queue = [q(4, 10), q(2, 50), q(3, 500), q(1, 20)];
        let easy = schedule(&running, &queue, Discipline::Easy);
        let cbf = schedule(&running, &queue, Discipline::Conservative);
        assert_eq!(easy.start_now, [1]);
        assert_eq!(cbf.start_now, [1]);
        assert_eq!(cbf.starts[3], Some(50));
    }

    #[test]
    fn a_queue_of_any_length_keeps_the_profile_bounded_and_never_early() {
        let queue: Vec<Queued> = (0..5000)
            .map(|i| q(1 + i % 7, 1000 + (i as u64 % 13) * 100))
            .collect();
        let plan = schedule(
            &Profile::new(64, [(32, 5000)]),
            &queue,
            Discipline::Conservative,
        );
        assert!(plan.after.steps().len() <= MAX_STEPS);
        assert!(plan.starts.iter().all(Option::is_some));
        // The whole cluster is free once the last reservation ends, not
        // before: merged steps are late, never early.
        let last = plan
            .starts
            .iter()
            .zip(&queue)
            .map(|(s, q)| s.unwrap_or(0) + q.walltime)
            .max();
        assert_eq!(plan.after.earliest(64, 1, 0), last);
    }

    #[test]
    fn a_faster_cluster_completes_sooner_even_if_it_starts_later() {
        let busy_fast = Profile::new(8, [(8, 600)]);
        let idle_slow = Profile::new(8, []);
        let fast = estimate(&busy_fast, 4.0, 4, 4000).unwrap();
        let slow = estimate(&idle_slow, 1.0, 4, 4000).unwrap();
        assert_eq!((fast.start, fast.completion), (600, 1600));
        assert_eq!((slow.start, slow.completion), (0, 4000));
    }

    #[test]
    fn a_profile_from_a_report_is_put_right_and_a_bounded_one_never_promises_more() {
        let p = Profile::from_steps(8, vec![(50, 12), (10, 2), (10, 3)]);
        assert_eq!(p.steps(), &[(0, 2), (50, 8)]);
        let mut many = Profile::new(100, (1..=50).map(|i| (1, i * 10)));
        many.reserve(1000, 60, 10);
        let bounded = many.clone().bounded(8);
        assert!(bounded.steps().len() <= 8);
        for t in (0..1200).step_by(5) {
            assert!(bounded.free_at(t) <= many.free_at(t), "at {t}");
        }
        let later = Profile::new(8, [(4, 100)]).advanced(60);
        assert_eq!(later.steps(), &[(0, 4), (40, 8)]);
    }
}
