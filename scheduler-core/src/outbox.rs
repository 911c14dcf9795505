//! How the scheduler's decisions become messages: each [`Action`] goes to
//! its job's control queue as one [`ControlMsg`]. Pure, so that the service
//! and a simulator send the same.

use gleaner_manifest::JobId;
use gleaner_protocol::{ControlMsg, ShrinkMode};
use tracing::{info, warn};

use crate::state::Action;

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
