//! How the scheduler's decisions become messages: each [`Action`] goes to
//! its job's control queue as one [`ControlMsg`]. Pure, so that the service
//! and a simulator send the same.

use std::time::Duration;

use gleaner_manifest::JobId;
use gleaner_protocol::{ControlMsg, ShrinkMode};
use tracing::{info, warn};

use crate::state::Action;

/// A large round goes out in chunks this big, [`POST_PAUSE`] apart: at
/// most 10,000 messages a second, so that the broker has room for the
/// scheduler's inbox.
pub const POST_CHUNK: usize = 500;
pub const POST_PAUSE: Duration = Duration::from_millis(50);

/// A round's messages as they are sent: chunks of [`POST_CHUNK`], each
/// with the pause that follows it; a round that fits in one chunk goes
/// without any.
pub fn paced<T>(round: &[T]) -> impl Iterator<Item = (&[T], Option<Duration>)> {
    let pause = (round.len() > POST_CHUNK).then_some(POST_PAUSE);
    round.chunks(POST_CHUNK).map(move |chunk| (chunk, pause))
}

/// The job an action is for, and what its runner is told.
pub fn message(action: Action) -> (JobId, ControlMsg) {
    match action {
        Action::Offer {
            job,
            grant,
            cluster,
            slots,
        } => {
            info!(job = %job, cluster = %cluster, grant = %grant, slots, "grow offer");
            (
                job,
                ControlMsg::GrowOffer {
                    grant,
                    cluster,
                    slots,
                },
            )
        }
        Action::Drain {
            job,
            cluster,
            slots,
            hosts,
        } => {
            info!(job = %job, cluster = %cluster, slots, hosts = ?hosts, "drain for fair share");
            let reason = "fair share: another job is below its share".to_owned();
            (
                job,
                ControlMsg::Shrink {
                    cluster,
                    slots,
                    mode: ShrinkMode::Drain,
                    reason,
                    hosts,
                },
            )
        }
        Action::Preempt {
            job,
            cluster,
            slots,
            reason,
            hosts,
        } => {
            info!(job = %job, cluster = %cluster, slots, reason, hosts = ?hosts, "shrink for a grid job");
            (
                job,
                ControlMsg::Shrink {
                    cluster,
                    slots,
                    mode: ShrinkMode::Preempt,
                    reason,
                    hosts,
                },
            )
        }
        Action::Place {
            job,
            clusters,
            stage_ms,
            start_ms,
            slots,
        } => {
            info!(job = %job, clusters = ?clusters, stage_ms, start_ms, slots = ?slots, "grid job placed");
            (
                job,
                ControlMsg::Place {
                    clusters,
                    stage_ms,
                    start_ms,
                    slots,
                },
            )
        }
        Action::Move {
            job,
            component,
            from,
            to,
            start_ms,
            before_ms,
            after_ms,
        } => {
            info!(job = %job, component, from = %from, to = %to, before_s = before_ms / 1000, after_s = after_ms / 1000, "reallocation: a waiting component moves where it completes earlier");
            (
                job,
                ControlMsg::Move {
                    component,
                    from,
                    to,
                    start_ms,
                },
            )
        }
        Action::StepAside { job, reason } => {
            info!(job = %job, reason, "grid job stopped for one of higher priority");
            (job, ControlMsg::StepAside { reason })
        }
        Action::Abort { job, reason } => {
            warn!(job = %job, reason, "grid job aborted");
            (job, ControlMsg::PlacementFailed { reason })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_round_goes_in_chunks_a_pause_apart_and_a_small_one_at_once() {
        let sizes = |n: usize| -> Vec<(usize, Option<Duration>)> {
            let round = vec![0u8; n];
            paced(&round).map(|(c, pause)| (c.len(), pause)).collect()
        };
        let pause = Some(POST_PAUSE);
        assert_eq!(sizes(1_200), [(500, pause), (500, pause), (200, pause)]);
        assert_eq!(sizes(500), [(500, None)]);
        assert_eq!(sizes(0), []);
    }
}
