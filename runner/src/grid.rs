//! The core of a grid job: rigid components run as ordinary batch jobs, all
//! at once, where the scheduler places them.
//!
//! It decides when the job waits for placement, which kcm gets which
//! component once placed, and what a component's end means: final when its
//! program exited (a rigid job's program is not retried); when it was lost
//! instead — it could not start, its cluster has no kcm, or it vanished
//! without an exit status before its walltime (its host died) — the job's
//! other components are stopped and the whole job is placed again, up to
//! `max_attempts` runs, as long as no component has ended. No I/O here:
//! the shell (`job.rs`) applies the effects.

use std::collections::{BTreeMap, BTreeSet};

use gleaner_protocol::{
    ActionReply, ClusterName, ComponentOutcome, ComponentSpec, ControlMsg, JobReport, JobState,
    KcmMsg, LauncherId, ResultMsg, RunStatus, SchedulerMsg, TaskBundle,
};
use indexmap::IndexMap;
use tracing::{debug, info, warn};

use crate::{
    book::FinalStatus,
    effect::{Effect, Followup, Now},
    job_core::{Job, Kind, Ledger, Opening, Refusal, cancel, finish_unfinished, index_entry},
    records::IndexEntry,
};

/// The kind of a grid job; its tasks are its components, all of whose
/// state is in the job's ledger.
#[derive(Debug)]
pub struct Grid;

impl Grid {
    pub fn open(opening: Opening<'_>, now: Now) -> Result<Job<Self>, Refusal> {
        let components = opening.submission.manifest.components.len() as u64;
        Ok(Job::new(Ledger::open(opening, components, now)?, Self))
    }

    /// The scheduler placed the job: each component still to place goes to
    /// its cluster's kcm, which submits it to the batch system.
    fn place(&mut self, ledger: &mut Ledger, clusters: Vec<ClusterName>) -> Vec<Effect> {
        let unplaced: Vec<usize> = ledger.unplaced().map(|(i, _)| i).collect();
        if ledger.file().state != JobState::Waiting || clusters.len() != unplaced.len() {
            debug!("placement ignored: already placed, or not for this job");
            return Vec::new();
        }
        info!(components = ?unplaced, clusters = ?clusters, "grid job placed");
        let env: Vec<(String, String)> = ledger
            .manifest()
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let walltime_ms = ledger.manifest().walltime.map(|w| w.as_millis() as u64);
        let workdir = ledger
            .manifest()
            .workdir
            .as_ref()
            .map(|w| w.display().to_string());
        let mut effects = Vec::with_capacity(clusters.len() + 2);
        for (i, cluster) in unplaced.into_iter().zip(clusters) {
            let component = &ledger.manifest().components[i];
            let spec = ComponentSpec {
                job: ledger.id().clone(),
                component: i as u32,
                slots: component.slots,
                needs: component.needs(),
                command: component.command.clone(),
                env: env.clone(),
                walltime_ms,
                workdir: workdir.clone(),
                owner: ledger.file().owner.clone(),
            };
            effects.push(Effect::ToKcm {
                cluster: cluster.clone(),
                msg: KcmMsg::SubmitComponent(spec),
                followup: Followup::Component {
                    component: i as u32,
                    cluster: cluster.clone(),
                },
            });
            if let Some(placed) = ledger.placements_mut().get_mut(i) {
                *placed = Some(cluster.clone());
            }
            ledger.involve(cluster);
        }
        ledger.set_state(JobState::Running);
        effects.extend([Effect::SaveJobFile, Effect::Report]);
        effects
    }

    /// A cluster withdrew a component that never started there: it waits
    /// to be placed again, with the job's other components left running.
    fn component_withdrawn(
        &mut self,
        ledger: &mut Ledger,
        component: u32,
        cluster: ClusterName,
        reason: &str,
    ) -> Vec<Effect> {
        let placed = ledger.file().components.get(component as usize);
        if placed != Some(&Some(cluster.clone())) {
            debug!(component, cluster = %cluster, "withdrawal ignored: not placed there");
            return Vec::new();
        }
        if ledger.book().is_finished(u64::from(component)) {
            debug!(component, cluster = %cluster, "withdrawal ignored: ended");
            return Vec::new();
        }
        if let Some(slot) = ledger.placements_mut().get_mut(component as usize) {
            *slot = None;
        }
        ledger.set_state(JobState::Waiting);
        warn!(component, cluster = %cluster, reason, "grid component withdrawn; waiting to be placed again");
        vec![Effect::SaveJobFile, Effect::Report]
    }

    /// A component ended. Its program's exit is final (a rigid job is not
    /// retried); a component lost without one sends the job back to
    /// placement while that can still make it whole.
    fn component_ended(&mut self, ledger: &mut Ledger, outcome: ComponentOutcome) -> Vec<Effect> {
        let task = u64::from(outcome.component);
        let placed_here = ledger
            .file()
            .components
            .get(task as usize)
            .is_some_and(|placed| placed.as_ref() == Some(&outcome.cluster));
        if ledger.book().is_finished(task) || !placed_here {
            debug!(component = task, cluster = %outcome.cluster, "component end ignored: ended before, or from an earlier run");
            return Vec::new();
        }
        if self.lost(ledger, &outcome) && self.may_restart(ledger) {
            let reason = match outcome.exit_code {
                None if outcome.runtime_ms == 0 => "could not start",
                _ => "vanished without an exit status",
            };
            return self.restart(ledger, outcome.component, &outcome.cluster, reason);
        }
        let status = match outcome.exit_code {
            Some(0) => RunStatus::Succeeded,
            _ => RunStatus::Failed,
        };
        if let Some(code) = outcome.exit_code.filter(|code| *code != 0)
            && ledger.manifest().restart_on_failure
            && self.may_restart(ledger)
        {
            let reason = format!("exited with code {code}");
            return self.restart(ledger, outcome.component, &outcome.cluster, &reason);
        }
        let result = ResultMsg {
            job: ledger.id().clone(),
            task,
            attempt: 1,
            preemptions: 0,
            status,
            exit_code: outcome.exit_code,
            signal: None,
            runtime_ms: outcome.runtime_ms,
            launcher: LauncherId::default(),
            cluster: outcome.cluster,
            host: String::new(),
            stdout: outcome.stdout,
            stderr: outcome.stderr,
            outputs: Vec::new(),
            error: None,
            peak_memory_mb: None,
        };
        info!(component = task, cluster = %result.cluster, exit_code = ?result.exit_code, "grid component ended");
        let entry = self.entry(ledger, task, status.into(), Some(&result));
        ledger.finish(task, status.into());
        let mut effects = vec![
            Effect::WriteOutputs(Box::new(result)),
            Effect::Record(vec![entry]),
        ];
        if status == RunStatus::Failed {
            // A rigid job runs whole: the others are stopped, and the job
            // ends failed with this component.
            warn!(
                component = task,
                "grid component failed: stopping the others, the job fails"
            );
            effects.push(finish_unfinished(self, ledger, FinalStatus::Cancelled));
        }
        effects
    }
}

impl Grid {
    /// Ended without an exit status, and not at its walltime (where the
    /// batch system kills it and a rerun would be killed again).
    fn lost(&self, ledger: &Ledger, outcome: &ComponentOutcome) -> bool {
        let walltime_ms = ledger.manifest().walltime.map(|w| w.as_millis() as u64);
        outcome.exit_code.is_none()
            && walltime_ms.is_none_or(|w| outcome.runtime_ms.saturating_add(WALLTIME_MARGIN_MS) < w)
    }

    /// Another run can still make the job whole: no component has ended,
    /// and runs are left.
    fn may_restart(&self, ledger: &Ledger) -> bool {
        ledger.book().counts().finished() == 0
            && ledger.file().restarts.saturating_add(1) < ledger.manifest().max_attempts
    }

    /// Stops every component still standing and sends the job back to
    /// placement: a rigid job runs whole or not at all.
    fn restart(
        &mut self,
        ledger: &mut Ledger,
        component: u32,
        cluster: &ClusterName,
        reason: &str,
    ) -> Vec<Effect> {
        let restarts = ledger.restarted();
        warn!(component, cluster = %cluster, reason, restarts, "grid component lost: stopping the others, placing the job again");
        let mut effects: Vec<Effect> = ledger
            .forget_clusters()
            .into_iter()
            .map(|cluster| Effect::ToKcm {
                cluster,
                msg: KcmMsg::JobEnded {
                    job: ledger.id().clone(),
                },
                followup: Followup::Nothing,
            })
            .collect();
        ledger
            .placements_mut()
            .iter_mut()
            .for_each(|placed| *placed = None);
        ledger.set_state(JobState::Waiting);
        effects.extend([Effect::SaveJobFile, Effect::Report]);
        effects
    }
}

/// A component ending this close to its walltime was killed for it.
const WALLTIME_MARGIN_MS: u64 = 5_000;

impl Kind for Grid {
    /// Registers the job with the scheduler: waiting to be placed, or
    /// running where it was placed before a restart.
    fn start(&mut self, ledger: &mut Ledger) -> Vec<Effect> {
        ledger.take_over();
        let components = ledger.manifest().components.len();
        ledger.placements_mut().resize(components, None);
        let placements = ledger.file().components.clone();
        for cluster in placements.iter().flatten() {
            ledger.involve(cluster.clone());
        }
        let placed = placements.iter().all(Option::is_some);
        ledger.set_state(if placed {
            JobState::Running
        } else {
            JobState::Waiting
        });
        info!(components, placed, "grid job registered");
        vec![Effect::SaveJobFile, Effect::Report]
    }

    /// Components report through their kcm, never as results.
    fn on_results(
        &mut self,
        _ledger: &mut Ledger,
        batch: impl IntoIterator<Item = ResultMsg>,
        _now: Now,
    ) -> Vec<Effect> {
        for result in batch {
            debug!(task = result.task, "result ignored: this job is a grid job");
        }
        Vec::new()
    }

    fn on_lost(&mut self, _ledger: &mut Ledger, lost: &TaskBundle) -> Vec<Effect> {
        debug!(
            tasks = lost.tasks.len(),
            "lost tasks ignored: this job is a grid job"
        );
        Vec::new()
    }

    fn on_control(&mut self, ledger: &mut Ledger, msg: ControlMsg, _now: Now) -> Vec<Effect> {
        let job = ledger.id();
        match msg {
            ControlMsg::Place { clusters } => self.place(ledger, clusters),
            ControlMsg::PlacementFailed { reason } => {
                warn!(reason, "the scheduler gave up placing the job");
                vec![finish_unfinished(self, ledger, FinalStatus::Failed)]
            }
            ControlMsg::ComponentEnded(outcome) => self.component_ended(ledger, outcome),
            ControlMsg::ComponentWithdrawn {
                component,
                cluster,
                reason,
            } => self.component_withdrawn(ledger, component, cluster, &reason),
            ControlMsg::Cancel { reason } => cancel(self, ledger, &reason),
            // Components hold their slots for good: no launchers to add.
            ControlMsg::GrowOffer { grant, cluster, .. } => {
                vec![Effect::ToScheduler(SchedulerMsg::GrowAck {
                    grant,
                    job: job.clone(),
                    cluster,
                    accepted: 0,
                })]
            }
            ControlMsg::Shrink { .. }
            | ControlMsg::LauncherUp(_)
            | ControlMsg::LauncherStatus(_)
            | ControlMsg::LauncherGone { .. } => {
                debug!("launcher message ignored: this job is a grid job");
                Vec::new()
            }
            ControlMsg::AddTasks(_) => {
                let reason = "grid jobs are never open".to_owned();
                vec![Effect::Answer(ActionReply::Refused { reason })]
            }
            ControlMsg::Close {} => {
                debug!("close ignored: grid jobs are never open");
                Vec::new()
            }
        }
    }

    fn on_delivery(
        &mut self,
        ledger: &mut Ledger,
        followup: Followup,
        arrived: bool,
    ) -> Vec<Effect> {
        match followup {
            Followup::Component { component, cluster } if !arrived && self.may_restart(ledger) => {
                self.restart(ledger, component, &cluster, "its cluster has no kcm")
            }
            Followup::Component { component, cluster } if !arrived => {
                warn!(component, cluster = %cluster, "no kcm for the cluster; component failed");
                let task = u64::from(component);
                let entry = self.entry(ledger, task, FinalStatus::Failed, None);
                ledger.finish(task, FinalStatus::Failed);
                vec![Effect::Record(vec![entry])]
            }
            _ => Vec::new(),
        }
    }

    fn poll(&mut self, _ledger: &mut Ledger, _now: Now) -> Vec<Effect> {
        Vec::new()
    }

    /// Running components are those placed and not yet ended.
    fn standing(&mut self, ledger: &mut Ledger, now: Now) -> JobReport {
        let running = ledger
            .file()
            .components
            .iter()
            .enumerate()
            .filter(|(i, placed)| placed.is_some() && !ledger.book().is_finished(*i as u64))
            .count() as u64;
        ledger.report(running, BTreeMap::new(), 0, now)
    }

    fn entry(
        &self,
        ledger: &Ledger,
        task: u64,
        status: FinalStatus,
        result: Option<&ResultMsg>,
    ) -> IndexEntry {
        let command = ledger
            .manifest()
            .components
            .get(task as usize)
            .map(|c| c.command.clone())
            .unwrap_or_default();
        index_entry(task, command, IndexMap::new(), status, result)
    }

    fn clusters(&self, ledger: &Ledger) -> BTreeSet<ClusterName> {
        ledger.clusters().clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use gleaner_protocol::{Captured, GrantId};

    use super::*;
    use crate::job_core::testing::{at, grow_ack, opening, recorded, submission, told};

    const MANIFEST: &str = "name = \"mpi\"\nkind = \"grid\"\npriority = \"high\"\n\
        env = { A = \"1\" }\nwalltime = \"1m\"\n\
        [[component]]\nslots = 4\ncommand = \"mpirun a\"\n\
        [[component]]\nslots = 2\ncommand = \"mpirun b\"\n";

    fn started(t0: Instant) -> Job<Grid> {
        let submission = submission(MANIFEST);
        let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
        grid.start();
        grid
    }

    fn placed(t0: Instant) -> Job<Grid> {
        let mut grid = started(t0);
        grid.on_control(
            ControlMsg::Place {
                clusters: vec!["c1".into(), "c2".into()],
            },
            at(t0, 1),
        );
        grid
    }

    /// Component 0 runs on c1, component 1 on c2 ([`placed`]).
    fn ended(component: u32, exit_code: Option<i32>) -> ControlMsg {
        ended_after(component, exit_code, 2000)
    }

    fn ended_after(component: u32, exit_code: Option<i32>, runtime_ms: u64) -> ControlMsg {
        ControlMsg::ComponentEnded(ComponentOutcome {
            component,
            cluster: format!("c{}", component + 1).as_str().into(),
            exit_code,
            runtime_ms,
            stdout: Captured {
                data: b"out\n".to_vec(),
                dropped: 0,
            },
            stderr: Captured::default(),
        })
    }

    #[test]
    fn a_new_grid_job_waits_to_be_placed() {
        let t0 = Instant::now();
        let submission = submission(MANIFEST);
        let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
        let effects = grid.start();
        assert!(matches!(effects[..], [Effect::SaveJobFile, Effect::Report]));
        let report = grid.standing(at(t0, 0));
        assert_eq!(report.state, JobState::Waiting);
        assert_eq!(report.components, [4, 2]);
        assert_eq!(report.tasks.running, 0);
    }

    #[test]
    fn placement_sends_each_component_to_its_clusters_kcm() {
        let t0 = Instant::now();
        let mut grid = started(t0);
        let place = ControlMsg::Place {
            clusters: vec!["c1".into(), "c2".into()],
        };
        let effects = grid.on_control(place.clone(), at(t0, 1));
        let submitted: Vec<(String, u32, u32, String)> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::ToKcm {
                    cluster,
                    msg: KcmMsg::SubmitComponent(spec),
                    followup: Followup::Component { component, .. },
                } => {
                    assert_eq!(spec.component, *component);
                    assert_eq!(spec.env, [("A".to_owned(), "1".to_owned())]);
                    assert_eq!(spec.walltime_ms, Some(60_000));
                    Some((
                        cluster.to_string(),
                        spec.component,
                        spec.slots,
                        spec.command.clone(),
                    ))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            submitted,
            [
                ("c1".to_owned(), 0, 4, "mpirun a".to_owned()),
                ("c2".to_owned(), 1, 2, "mpirun b".to_owned())
            ]
        );
        assert!(matches!(
            effects[2..],
            [Effect::SaveJobFile, Effect::Report]
        ));
        let file = grid.job_file();
        assert_eq!(file.state, JobState::Running);
        assert_eq!(
            file.components,
            [Some(ClusterName::from("c1")), Some(ClusterName::from("c2"))]
        );
        assert_eq!(grid.standing(at(t0, 2)).tasks.running, 2);
        assert!(grid.on_control(place, at(t0, 3)).is_empty(), "placed once");
        let effects = grid.wind_up(at(t0, 4));
        assert_eq!(
            told(&effects),
            [
                ("c1".to_owned(), "job_ended"),
                ("c2".to_owned(), "job_ended")
            ]
        );
    }

    #[test]
    fn a_withdrawn_component_is_placed_again_and_the_others_keep_running() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        let withdrawn = |cluster: &str| ControlMsg::ComponentWithdrawn {
            component: 1,
            cluster: cluster.into(),
            reason: "waited too long".into(),
        };
        assert!(
            grid.on_control(withdrawn("c1"), at(t0, 2)).is_empty(),
            "not where it was placed"
        );
        let effects = grid.on_control(withdrawn("c2"), at(t0, 3));
        assert!(matches!(effects[..], [Effect::SaveJobFile, Effect::Report]));
        let report = grid.standing(at(t0, 3));
        assert_eq!(report.state, JobState::Waiting);
        assert_eq!(report.components, [2], "only the withdrawn one to place");
        assert_eq!(report.tasks.running, 1, "component 0 still runs");
        assert!(grid.on_control(withdrawn("c2"), at(t0, 4)).is_empty());

        let effects = grid.on_control(
            ControlMsg::Place {
                clusters: vec!["c3".into()],
            },
            at(t0, 5),
        );
        let submitted: Vec<(String, u32)> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::ToKcm {
                    cluster,
                    msg: KcmMsg::SubmitComponent(spec),
                    ..
                } => Some((cluster.to_string(), spec.component)),
                _ => None,
            })
            .collect();
        assert_eq!(submitted, [("c3".to_owned(), 1)]);
        let file = grid.job_file();
        assert_eq!(file.state, JobState::Running);
        assert_eq!(
            file.components,
            [Some(ClusterName::from("c1")), Some(ClusterName::from("c3"))]
        );
        assert!(grid.standing(at(t0, 6)).components.is_empty());
    }

    #[test]
    fn a_placement_that_does_not_fit_the_job_is_ignored() {
        let t0 = Instant::now();
        let mut grid = started(t0);
        let place = ControlMsg::Place {
            clusters: vec!["c1".into()],
        };
        assert!(grid.on_control(place, at(t0, 1)).is_empty());
        assert_eq!(grid.job_file().state, JobState::Waiting);
    }

    #[test]
    fn a_lost_component_stops_the_others_and_the_job_is_placed_again() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        let effects = grid.on_control(ended(1, None), at(t0, 2));
        assert_eq!(
            told(&effects),
            [
                ("c1".to_owned(), "job_ended"),
                ("c2".to_owned(), "job_ended")
            ]
        );
        assert!(recorded(&effects).is_empty(), "nothing final");
        let file = grid.job_file();
        assert_eq!((file.state, file.restarts), (JobState::Waiting, 1));
        assert_eq!(file.components, [None, None]);
        let report = grid.standing(at(t0, 2));
        assert_eq!(report.components, [4, 2], "the whole job to place");
        assert_eq!(report.tasks.running, 0);
        // The stopped component's end, reported late, is not this run's.
        assert!(grid.on_control(ended(0, None), at(t0, 3)).is_empty());

        // Placed again; lost again: the third and last run, as
        // max_attempts (3) allows; then a loss is final.
        for (run, t) in [(2u32, 4u64), (3, 6)] {
            let place = ControlMsg::Place {
                clusters: vec!["c1".into(), "c2".into()],
            };
            assert_eq!(told(&grid.on_control(place, at(t0, t))).len(), 2);
            let effects = grid.on_control(ended(0, None), at(t0, t + 1));
            if run < 3 {
                assert_eq!(grid.job_file().restarts, run);
                assert!(recorded(&effects).is_empty());
            } else {
                assert_eq!(recorded(&effects)[0].status, FinalStatus::Failed);
                assert_eq!(grid.job_file().restarts, 2);
            }
        }
    }

    #[test]
    fn a_failed_component_stops_the_others_and_the_job_fails_with_it() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        let effects = grid.on_control(ended(0, Some(3)), at(t0, 2));
        let statuses: Vec<(u64, FinalStatus)> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Record(entries) => Some(entries.iter().map(|e| (e.task, e.status))),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(
            statuses,
            [(0, FinalStatus::Failed), (1, FinalStatus::Cancelled)]
        );
        assert_eq!(grid.ending(), Some(JobState::Done));
    }

    #[test]
    fn with_restart_on_failure_a_failed_component_sends_the_job_back_whole() {
        let t0 = Instant::now();
        let manifest = MANIFEST.replace(
            "walltime",
            "restart_on_failure = true\nmax_attempts = 2\nwalltime",
        );
        let submission = submission(&manifest);
        let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
        grid.start();
        let place = || ControlMsg::Place {
            clusters: vec!["c1".into(), "c2".into()],
        };
        grid.on_control(place(), at(t0, 1));
        let effects = grid.on_control(ended(0, Some(3)), at(t0, 2));
        let stopped: Vec<&ClusterName> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::ToKcm {
                    cluster,
                    msg: KcmMsg::JobEnded { .. },
                    ..
                } => Some(cluster),
                _ => None,
            })
            .collect();
        assert_eq!(
            stopped.len(),
            2,
            "both clusters stop their component: {effects:?}"
        );
        assert!(recorded(&effects).is_empty(), "nothing final yet");
        assert_eq!(grid.ending(), None);
        // The second run is the last: its failure is final.
        grid.on_control(place(), at(t0, 3));
        let effects = grid.on_control(ended(1, Some(1)), at(t0, 4));
        assert_eq!(recorded(&effects)[0].status, FinalStatus::Failed);
        assert_eq!(grid.ending(), Some(JobState::Done));
    }

    #[test]
    fn a_component_killed_at_its_walltime_is_final() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        // The manifest's walltime is one minute.
        let effects = grid.on_control(ended_after(0, None, 59_000), at(t0, 2));
        assert_eq!(recorded(&effects)[0].status, FinalStatus::Failed);
        assert_eq!(grid.job_file().restarts, 0);
    }

    #[test]
    fn a_component_for_a_cluster_without_a_kcm_sends_the_job_back() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        let effects = grid.on_delivery(
            Followup::Component {
                component: 1,
                cluster: "c2".into(),
            },
            false,
        );
        assert_eq!(told(&effects).len(), 2);
        assert_eq!(grid.job_file().state, JobState::Waiting);
    }

    #[test]
    fn a_component_for_a_cluster_without_a_kcm_fails_once_no_run_is_left() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        grid.ledger_mut().restarted();
        grid.ledger_mut().restarted();
        let effects = grid.on_delivery(
            Followup::Component {
                component: 0,
                cluster: "c1".into(),
            },
            true,
        );
        assert!(effects.is_empty());
        let effects = grid.on_delivery(
            Followup::Component {
                component: 1,
                cluster: "c2".into(),
            },
            false,
        );
        let entries = recorded(&effects);
        assert_eq!(
            entries
                .iter()
                .map(|e| (e.task, e.status, e.command.as_str()))
                .collect::<Vec<_>>(),
            [(1, FinalStatus::Failed, "mpirun b")]
        );
        assert_eq!(grid.standing(at(t0, 2)).tasks.running, 1);
    }

    #[test]
    fn component_ends_are_final_and_end_the_job() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        let effects = grid.on_control(ended(0, Some(0)), at(t0, 2));
        let [Effect::WriteOutputs(result), Effect::Record(entries)] = &effects[..] else {
            panic!("{effects:?}");
        };
        assert_eq!(
            (result.task, result.stdout.data.as_slice()),
            (0, &b"out\n"[..])
        );
        assert_eq!(
            (
                entries[0].task,
                entries[0].status,
                entries[0].runtime_s,
                entries[0].cluster.as_ref().map(ClusterName::as_str)
            ),
            (0, FinalStatus::Succeeded, 2.0, Some("c1"))
        );
        assert!(
            grid.on_control(ended(0, Some(1)), at(t0, 3)).is_empty(),
            "ended once"
        );
        assert_eq!(grid.ending(), None);
        let effects = grid.on_control(ended(1, None), at(t0, 4));
        assert_eq!(
            recorded(&effects)[0].status,
            FinalStatus::Failed,
            "lost after component 0 ended: no run could be whole"
        );
        assert_eq!(grid.ending(), Some(JobState::Done));
        let counts = grid.job_file().tasks;
        assert_eq!((counts.succeeded, counts.failed), (1, 1));
    }

    #[test]
    fn a_job_the_scheduler_cannot_place_fails() {
        let t0 = Instant::now();
        let mut grid = started(t0);
        let effects = grid.on_control(
            ControlMsg::PlacementFailed {
                reason: "too big".into(),
            },
            at(t0, 1),
        );
        assert_eq!(
            recorded(&effects)
                .iter()
                .map(|e| (e.task, e.status))
                .collect::<Vec<_>>(),
            [(0, FinalStatus::Failed), (1, FinalStatus::Failed)]
        );
        assert_eq!(grid.ending(), Some(JobState::Done));
    }

    #[test]
    fn a_resumed_placed_job_runs_where_it_was_placed() {
        let t0 = Instant::now();
        let submission = submission(MANIFEST);
        let file = placed(t0).job_file();
        let mut grid = Grid::open(
            opening(&submission, vec![(0, FinalStatus::Succeeded)], Some(file)),
            at(t0, 5),
        )
        .unwrap();
        grid.start();
        let report = grid.standing(at(t0, 6));
        assert_eq!(report.state, JobState::Running);
        assert_eq!(report.tasks.running, 1, "component 0 had ended");
        assert_eq!(
            grid.clusters()
                .iter()
                .map(ClusterName::as_str)
                .collect::<Vec<_>>(),
            ["c1", "c2"]
        );
    }

    #[test]
    fn grow_offers_are_refused() {
        let t0 = Instant::now();
        let mut grid = started(t0);
        let offer = ControlMsg::GrowOffer {
            grant: GrantId::new(1),
            cluster: "c1".into(),
            slots: 8,
        };
        let effects = grid.on_control(offer, at(t0, 1));
        assert_eq!(grow_ack(&effects), Some(0));
        assert!(told(&effects).is_empty());
    }
}
