//! Which submission of a job id a runner runs. Ids are public (`qstat`
//! shows them), so two submissions may name one job: a redelivery of the
//! job's own after its runner died, another user's, or a second one. The
//! job's claim in the broker says which is the job's
//! ([`JobClaim`]), but only to the runner that holds the job's lock, and
//! the jobs of one runner share its connection and so its lock. So a
//! runner runs one submission of an id at a time: a second waits while the
//! first has not been found to be the job's (it may be the impostor), and
//! is refused once it has.
//!
//! Where users are kept apart, one user may hold only so many of a
//! runner's jobs: the submit queue is one line for everybody, and a
//! runner runs a bounded number of jobs, so without a limit one user's
//! flood of long jobs would hold every place and the others' would wait
//! behind it. A submission a runner accepted before (its runner lost its
//! connection) is never refused for the limit; what says so is its job's
//! claim in the broker, which only a runner stakes, not the broker's
//! redelivered flag: every unacked submission has that after a runner's
//! connection breaks, those it had not even looked at included.

use std::collections::{HashMap, VecDeque};

use gleaner_manifest::JobId;
use gleaner_protocol::JobClaim;

/// The submissions this runner holds, by job id.
#[derive(Debug)]
pub struct Admissions<P> {
    jobs: HashMap<JobId, Held<P>>,
    /// Submissions (running or waiting) one owner may hold; `None`: any.
    max_per_owner: Option<usize>,
}

#[derive(Debug)]
struct Held<P> {
    claim: JobClaim,
    /// The job's claim in the broker is this submission's.
    claimed: bool,
    /// Submissions of the same id that wait for this one's fate.
    waiting: VecDeque<(JobClaim, P)>,
}

/// What is known of a submission's past when it arrives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Past {
    /// The broker delivered it before: true of every submission a runner
    /// held unacked when its connection broke, run or not.
    pub redelivered: bool,
    /// Its job's claim is in the broker, where only a runner stakes one
    /// (the shell asks only of a redelivered submission whose owner is
    /// [`Admissions::at_limit`], the one case where it matters).
    pub claimed: bool,
}

impl Past {
    /// A submission that came before and whose job a runner took on:
    /// resumed, it is not one more of its owner's.
    fn accepted_before(self) -> bool {
        self.redelivered && self.claimed
    }
}

/// What to do with a submission that arrived.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival<P> {
    /// Start the job's controller with it.
    Run(P),
    /// Hold it until the submission that holds the id is known for the
    /// job's, or has gone.
    Wait,
    /// Refuse it, for this reason.
    Refuse(P, String),
}

impl<P> Admissions<P> {
    pub fn new(max_per_owner: Option<usize>) -> Self {
        Self {
            jobs: HashMap::new(),
            max_per_owner,
        }
    }

    /// Whether a submission of `job` runs, its claim staked: another
    /// submission of the id is then refused as one of a live job's.
    pub fn is_claimed(&self, job: &JobId) -> bool {
        self.jobs.get(job).is_some_and(|held| held.claimed)
    }

    pub fn arrive(
        &mut self,
        job: &JobId,
        claim: JobClaim,
        submission: P,
        past: Past,
    ) -> Arrival<P> {
        if let Some(held) = self.jobs.get(job)
            && held.claimed
        {
            let reason = refusal(job, &claim, &held.claim);
            return Arrival::Refuse(submission, reason);
        }
        if let Some(max) = self.max_per_owner
            && !past.accepted_before()
            && self.held_by(&claim.owner) >= max
        {
            let reason = format!(
                "{} already has {max} jobs on this runner, the most one user may have (runner.max_jobs_per_user); submit it again once one has ended, or put the work in fewer jobs (a sweep of any size is one job)",
                claim.owner
            );
            return Arrival::Refuse(submission, reason);
        }
        match self.jobs.get_mut(job) {
            None => {
                self.jobs.insert(
                    job.clone(),
                    Held {
                        claim,
                        claimed: false,
                        waiting: VecDeque::new(),
                    },
                );
                Arrival::Run(submission)
            }
            Some(held) => {
                held.waiting.push_back((claim, submission));
                Arrival::Wait
            }
        }
    }

    /// Whether `owner` holds as many submissions as one may: another is
    /// refused unless it was accepted before.
    pub fn at_limit(&self, owner: &str) -> bool {
        self.max_per_owner
            .is_some_and(|max| self.held_by(owner) >= max)
    }

    /// The submissions `owner` holds, running or waiting.
    fn held_by(&self, owner: &str) -> usize {
        self.jobs
            .values()
            .map(|held| {
                usize::from(held.claim.owner == owner)
                    + held
                        .waiting
                        .iter()
                        .filter(|(c, _)| c.owner == owner)
                        .count()
            })
            .sum()
    }

    /// The running submission of `job` holds the job's claim: those that
    /// waited for it are refused.
    pub fn claimed(&mut self, job: &JobId) -> Vec<(P, String)> {
        let Some(held) = self.jobs.get_mut(job) else {
            return Vec::new();
        };
        held.claimed = true;
        let claim = held.claim.clone();
        held.waiting
            .drain(..)
            .map(|(theirs, submission)| (submission, refusal(job, &theirs, &claim)))
            .collect()
    }

    /// The running submission of `job` has gone (its job ended, or it was
    /// refused): the next one that waited runs, with its claim.
    pub fn ended(&mut self, job: &JobId) -> Option<(JobClaim, P)> {
        let mut held = self.jobs.remove(job)?;
        let (claim, next) = held.waiting.pop_front()?;
        self.jobs.insert(
            job.clone(),
            Held {
                claim: claim.clone(),
                claimed: false,
                waiting: held.waiting,
            },
        );
        Some((claim, next))
    }
}

fn refusal(job: &JobId, theirs: &JobClaim, held: &JobClaim) -> String {
    theirs
        .refusal(job.as_str(), held)
        .unwrap_or_else(|| format!("job {job} is already running"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(owner: &str, submission: u64) -> JobClaim {
        JobClaim {
            owner: owner.into(),
            submission,
        }
    }

    #[test]
    fn a_second_submission_waits_while_the_first_may_be_the_impostor() {
        let job = JobId::new("j", 1);
        let mut admissions = Admissions::new(None);
        assert_eq!(
            admissions.arrive(&job, claim("bob", 2), "bob's", Past::default()),
            Arrival::Run("bob's")
        );
        assert_eq!(
            admissions.arrive(&job, claim("alice", 1), "alice's", Past::default()),
            Arrival::Wait
        );
        // Bob's copy found the job claimed by Alice and was refused: hers runs.
        assert_eq!(admissions.ended(&job), Some((claim("alice", 1), "alice's")));
        assert!(admissions.claimed(&job).is_empty());
        // Now it is known for hers: another copy is refused at once.
        match admissions.arrive(&job, claim("bob", 3), "bob's again", Past::default()) {
            Arrival::Refuse("bob's again", reason) => {
                assert!(reason.contains("another user"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(admissions.ended(&job), None);
        assert_eq!(
            admissions.arrive(&job, claim("bob", 4), "new", Past::default()),
            Arrival::Run("new")
        );
    }

    #[test]
    fn those_waiting_are_refused_once_the_running_one_holds_the_claim() {
        let job = JobId::new("j", 1);
        let mut admissions = Admissions::new(None);
        assert_eq!(
            admissions.arrive(&job, claim("alice", 1), 'a', Past::default()),
            Arrival::Run('a')
        );
        assert_eq!(
            admissions.arrive(&job, claim("alice", 2), 'b', Past::default()),
            Arrival::Wait
        );
        assert_eq!(
            admissions.arrive(&job, claim("bob", 3), 'c', Past::default()),
            Arrival::Wait
        );
        let refused = admissions.claimed(&job);
        assert_eq!(refused.len(), 2);
        assert!(
            refused[0].1.contains("already submitted"),
            "{}",
            refused[0].1
        );
        assert!(refused[1].1.contains("another user"), "{}", refused[1].1);
        assert_eq!(admissions.ended(&job), None);
    }

    #[test]
    fn one_owner_holds_at_most_its_limit_and_a_job_accepted_before_is_spared() {
        let mut admissions = Admissions::new(Some(2));
        let (a, b, c, d) = (
            JobId::new("a", 1),
            JobId::new("b", 2),
            JobId::new("c", 3),
            JobId::new("d", 4),
        );
        assert_eq!(
            admissions.arrive(&a, claim("bob", 1), 'a', Past::default()),
            Arrival::Run('a')
        );
        // A second submission of a held id waits, and counts.
        assert_eq!(
            admissions.arrive(&a, claim("bob", 2), 'w', Past::default()),
            Arrival::Wait
        );
        match admissions.arrive(&b, claim("bob", 3), 'b', Past::default()) {
            Arrival::Refuse('b', reason) => {
                assert!(reason.contains("bob already has 2 jobs"), "{reason}");
                assert!(reason.contains("runner.max_jobs_per_user"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(admissions.at_limit("bob"));
        // Another user is not held back by bob's.
        assert!(!admissions.at_limit("alice"));
        assert_eq!(
            admissions.arrive(&c, claim("alice", 4), 'c', Past::default()),
            Arrival::Run('c')
        );
        // Delivered before is not accepted before: any submission a
        // runner held, looked at or not, comes back redelivered.
        let redelivered = Past {
            redelivered: true,
            claimed: false,
        };
        assert!(matches!(
            admissions.arrive(&d, claim("bob", 5), 'd', redelivered),
            Arrival::Refuse('d', _)
        ));
        // A job a runner accepted before (its claim is in the broker)
        // comes back whatever the count.
        let resumed = Past {
            redelivered: true,
            claimed: true,
        };
        assert_eq!(
            admissions.arrive(&d, claim("bob", 5), 'd', resumed),
            Arrival::Run('d')
        );
        // Once bob's jobs end, he may submit again.
        assert_eq!(admissions.ended(&a), Some((claim("bob", 2), 'w')));
        assert_eq!(admissions.ended(&a), None);
        assert_eq!(admissions.ended(&d), None);
        assert_eq!(
            admissions.arrive(&b, claim("bob", 6), 'b', Past::default()),
            Arrival::Run('b')
        );
    }
}
