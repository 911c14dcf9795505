//! The core of a grid job: rigid components run as ordinary batch jobs, all
//! at once, where the scheduler places them.
//!
//! It decides when the job waits for placement, which kcm gets which
//! component once placed, when the components may run, and what a
//! component's end means.
//!
//! Each component is submitted as soon as it is placed; once its batch
//! system starts it, it waits at the start barrier, holding its slots,
//! until every component has started: then each is let go with where all
//! of them are. Waiting is bounded as KOALA bounds its claiming: the run
//! must gather by its Job Start Time (placement + `barrier_timeout`);
//! claiming tries at KOALA's Job Claiming Times (the first at placement,
//! each next one `L` of the way to the start time) withdraw the components
//! that have not started, to be placed again, once the fraction that did
//! reaches the job's `claim_threshold` (T); a run that has not gathered by
//! its start time is given up — its components stopped, the job placed
//! again whole, with `L` lowered.
//!
//! A component's end is final when its program exited (a rigid job's
//! program is not retried, unless `restart_on_failure`); when it was lost
//! instead — it could not start, its cluster has no kcm, or it vanished
//! without an exit status before its walltime (its host died) — the job's
//! other components are stopped and the whole job is placed again, up to
//! `max_attempts` runs, as long as no component has ended. No I/O here:
//! the shell (`job.rs`) applies the effects.

use std::collections::{BTreeMap, BTreeSet};

use gleaner_protocol::{
    ActionReply, Captured, ClusterName, ComponentOutcome, ComponentSpec, ControlMsg, HostSlots,
    JobReport, JobState, KcmMsg, LauncherId, MAX_GO_HOSTS_BYTES, Millis, ResultMsg, RunStatus,
    SchedulerMsg,
};
use indexmap::IndexMap;
use tracing::{debug, info, warn};

use crate::{
    book::FinalStatus,
    effect::{Effect, Followup, Now},
    job_core::{Job, Kind, Ledger, Opening, Refusal, cancel, finish_unfinished, index_entry},
    records::{Claim, IndexEntry, StartedComponent},
    returns::DeadLetter,
};

/// KOALA's L to begin with; each run that did not gather lowers it by
/// [`CLAIM_LEVEL_STEP`], down to [`CLAIM_LEVEL_FLOOR`].
pub const CLAIM_LEVEL: f64 = 0.75;
const CLAIM_LEVEL_STEP: f64 = 0.125;
const CLAIM_LEVEL_FLOOR: f64 = 0.25;

/// The claiming try after one at `at`: `level` of the way to the start
/// time (KOALA: JCTₙ₊₁ = JCTₙ + L·(JST − JCTₙ)); the start time itself once
/// that is less than a second away.
pub fn next_try(at: Millis, start_by: Millis, level: f64) -> Millis {
    let left = start_by.saturating_sub(at);
    let next = at.saturating_add((left as f64 * level) as u64);
    match start_by.saturating_sub(next) < 1_000 {
        true => start_by,
        false => next,
    }
}

/// What a kcm is told to submit for component `i`: a moldable one with
/// the slots the scheduler chose for this run (`GLEANER_SLOTS` in its
/// environment) and the walltime they give it.
fn component_spec(ledger: &Ledger, i: usize) -> ComponentSpec {
    let manifest = ledger.manifest();
    let component = &manifest.components[i];
    let checkpoints = std::path::Path::new(&ledger.file().results).join("checkpoints");
    let chosen = ledger
        .file()
        .gathering
        .as_ref()
        .and_then(|g| g.run.as_ref())
        .and_then(|run| run.slots.get(&(i as u32)).copied());
    let moldable = component.moldable(manifest.walltime);
    let (slots, walltime_ms) = match (&moldable, chosen) {
        (Some(m), Some(n)) if (m.min..=m.max).contains(&n) => (n, Some(m.walltime_ms(n))),
        (Some(m), _) => (m.min, Some(m.walltime_ms(m.min))),
        (None, _) => (
            component.slots.min(),
            manifest.walltime.map(|w| w.as_millis() as u64),
        ),
    };
    let mut env: Vec<(String, String)> = manifest
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if moldable.is_some() {
        env.push(("GLEANER_SLOTS".to_owned(), slots.to_string()));
    }
    ComponentSpec {
        job: ledger.id().clone(),
        component: i as u32,
        slots,
        needs: component.needs(),
        command: component.command.clone(),
        env,
        walltime_ms,
        workdir: manifest.workdir.as_ref().map(|w| w.display().to_string()),
        owner: ledger.file().owner.clone(),
        checkpoint: Some(checkpoints.join(i.to_string()).display().to_string()),
        inputs: manifest.component_inputs(i),
    }
}

fn seconds(from: Millis, to: Millis) -> f64 {
    to.saturating_sub(from) as f64 / 1000.0
}

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
    fn place(
        &mut self,
        ledger: &mut Ledger,
        clusters: Vec<ClusterName>,
        stage_ms: u64,
        start_ms: u64,
        slots: Vec<u32>,
        now: Now,
    ) -> Vec<Effect> {
        let unplaced: Vec<usize> = ledger.unplaced().map(|(i, _)| i).collect();
        if ledger.file().state != JobState::Waiting || clusters.len() != unplaced.len() {
            debug!("placement ignored: already placed, or not for this job");
            return Vec::new();
        }
        // A new run, unless components withdrawn from this one are placed
        // again: they have until its start time.
        let whole = unplaced.len() == ledger.manifest().components.len();
        let barrier_timeout = ledger.manifest().barrier_timeout().as_millis() as u64;
        let gather = ledger.gather_mut();
        if whole || gather.run.is_none() {
            gather.figures.placement_s = Some(seconds(gather.waiting_since, now.wall_ms));
            let first_try = (gather.level * stage_ms as f64) as u64;
            // Components that wait their turn in batch queues have until
            // it comes, and the barrier timeout after it.
            let start_by = barrier_timeout.saturating_add(start_ms);
            gather.run = Some(Claim::new(now.wall_ms, start_by, first_try));
        }
        if let Some(run) = ledger.gather_mut().run.as_mut() {
            for (i, n) in unplaced.iter().zip(&slots) {
                if *n > 0 {
                    run.slots.insert(*i as u32, *n);
                }
            }
        }
        info!(components = ?unplaced, clusters = ?clusters, start_ms, "grid job placed");
        let mut effects = Vec::with_capacity(clusters.len() + 2);
        for (i, cluster) in unplaced.into_iter().zip(clusters) {
            effects.push(Effect::ToKcm {
                cluster: cluster.clone(),
                msg: KcmMsg::SubmitComponent(component_spec(ledger, i)),
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

    /// A component started and waits at the barrier; once all have, each
    /// is let go, with where every one of them is.
    fn component_started(
        &mut self,
        ledger: &mut Ledger,
        component: u32,
        cluster: ClusterName,
        hosts: Vec<HostSlots>,
        now: Now,
    ) -> Vec<Effect> {
        // A component started where it was moved to before the kcm said
        // it had it queued: it has.
        let mut effects = self.component_queued(ledger, component, cluster.clone());
        effects.retain(|e| !matches!(e, Effect::SaveJobFile | Effect::Report));
        // One started where it waited while being moved: it stays.
        effects.extend(self.move_dropped(ledger, component, &cluster, "it started where it was"));
        let placed = ledger.file().components.get(component as usize);
        if placed != Some(&Some(cluster.clone())) || ledger.book().is_finished(u64::from(component))
        {
            debug!(component, cluster = %cluster, "start ignored: not placed there, or ended");
            return effects;
        }
        let components = ledger.manifest().components.len();
        let Some(run) = ledger.gather_mut().run.as_mut() else {
            debug!(component, "start ignored: no run placed");
            return Vec::new();
        };
        if run.released_at.is_some() || run.started.contains_key(&component) {
            debug!(component, "start ignored: heard before");
            return Vec::new();
        }
        // Every component's hosts go to each in its `Go`: lists their
        // owner wrote may not make one too big to send.
        let listed = run
            .started
            .values()
            .map(|s| HostSlots::listed_bytes(&s.hosts))
            .fold(HostSlots::listed_bytes(&hosts), usize::saturating_add);
        if listed > MAX_GO_HOSTS_BYTES {
            let reason = format!(
                "its {} hosts, with the other components', take {} KiB, more than the {} KiB the go that lets them run may carry",
                hosts.len(),
                listed >> 10,
                MAX_GO_HOSTS_BYTES >> 10
            );
            effects.extend(self.fail_at_start(ledger, component, cluster, reason));
            return effects;
        }
        info!(component, cluster = %cluster, hosts = hosts.len(), first = ?hosts.first().map(|h| &h.host), started = run.started.len() + 1, of = components, "grid component started; waiting at the barrier");
        run.started.insert(
            component,
            StartedComponent {
                cluster,
                hosts,
                at: now.wall_ms,
            },
        );
        if run.started.len() == components {
            effects.extend(self.release(ledger, now));
        }
        self.count_at_barrier(ledger);
        effects.extend([Effect::SaveJobFile, Effect::Report]);
        effects
    }

    /// The scheduler found a cluster where a waiting component would
    /// complete earlier: it is submitted there, and stays placed where it
    /// waits until that cluster has it queued. A component that started,
    /// is not where the scheduler thought, is being moved already, or
    /// reads input files (which the new cluster may not see) stays.
    fn move_component(
        &mut self,
        ledger: &mut Ledger,
        component: u32,
        from: ClusterName,
        to: ClusterName,
    ) -> Vec<Effect> {
        let i = component as usize;
        let placed_there = ledger.file().components.get(i) == Some(&Some(from.clone()));
        let has_inputs = !ledger.manifest().component_inputs(i).is_empty();
        let Some(run) = ledger.gather_mut().run.as_mut() else {
            debug!(component, "move ignored: no run placed");
            return Vec::new();
        };
        if !placed_there
            || from == to
            || has_inputs
            || run.released_at.is_some()
            || run.started.contains_key(&component)
            || run.moving.contains_key(&component)
        {
            debug!(component, from = %from, to = %to, "move ignored: started, moving, elsewhere, or reads inputs");
            return Vec::new();
        }
        run.moving.insert(component, to.clone());
        // Its copy there goes with the job's end or its next run.
        ledger.involve(to.clone());
        info!(component, from = %from, to = %to, "moving a waiting grid component where it would complete earlier");
        vec![
            Effect::ToKcm {
                cluster: to.clone(),
                msg: KcmMsg::SubmitComponent(component_spec(ledger, i)),
                followup: Followup::Moved {
                    component,
                    cluster: to,
                },
            },
            Effect::SaveJobFile,
        ]
    }

    /// A kcm has a component queued. Where it was moved to, the move is
    /// done: it is placed there, and withdrawn from where it waited.
    fn component_queued(
        &mut self,
        ledger: &mut Ledger,
        component: u32,
        cluster: ClusterName,
    ) -> Vec<Effect> {
        let job = ledger.id().clone();
        let gather = ledger.gather_mut();
        let Some(run) = gather.run.as_mut() else {
            return Vec::new();
        };
        if run.moving.get(&component) != Some(&cluster) {
            return Vec::new();
        }
        run.moving.remove(&component);
        gather.figures.moves = gather.figures.moves.saturating_add(1);
        let Some(from) = ledger
            .placements_mut()
            .get_mut(component as usize)
            .and_then(|placed| placed.replace(cluster.clone()))
        else {
            return Vec::new();
        };
        ledger.involve(cluster.clone());
        info!(component, from = %from, to = %cluster, "grid component moved: queued on its new cluster, withdrawn from the old");
        vec![
            Effect::ToKcm {
                cluster: from,
                msg: KcmMsg::WithdrawComponent { job, component },
                followup: Followup::Nothing,
            },
            Effect::SaveJobFile,
            Effect::Report,
        ]
    }

    /// A move is given up (the component started where it was, or the
    /// cluster it was moved to cannot take it): what was submitted there
    /// is withdrawn, when `cluster` is not that one.
    fn move_dropped(
        &mut self,
        ledger: &mut Ledger,
        component: u32,
        cluster: &ClusterName,
        reason: &str,
    ) -> Vec<Effect> {
        let job = ledger.id().clone();
        let Some(run) = ledger.gather_mut().run.as_mut() else {
            return Vec::new();
        };
        let Some(to) = run.moving.get(&component).cloned() else {
            return Vec::new();
        };
        let from_there = &to == cluster;
        let placed_here =
            ledger.file().components.get(component as usize) == Some(&Some(cluster.clone()));
        if !from_there && !placed_here {
            return Vec::new();
        }
        if let Some(run) = ledger.gather_mut().run.as_mut() {
            run.moving.remove(&component);
        }
        info!(component, to = %to, reason, "move of a grid component dropped");
        let mut effects = vec![Effect::SaveJobFile];
        if !from_there {
            effects.push(Effect::ToKcm {
                cluster: to,
                msg: KcmMsg::WithdrawComponent { job, component },
                followup: Followup::Nothing,
            });
        }
        effects
    }

    /// Every component started: each one's kcm lets it run.
    fn release(&mut self, ledger: &mut Ledger, now: Now) -> Vec<Effect> {
        let job = ledger.id().clone();
        let gather = ledger.gather_mut();
        let Some(run) = gather.run.as_mut() else {
            return Vec::new();
        };
        run.released_at = Some(now.wall_ms);
        let first = run
            .started
            .values()
            .map(|s| s.at)
            .min()
            .unwrap_or(now.wall_ms);
        let placed_at = run.placed_at;
        let hosts: Vec<Vec<HostSlots>> = run.started.values().map(|s| s.hosts.clone()).collect();
        let effects: Vec<Effect> = run
            .started
            .iter()
            .map(|(component, started)| Effect::ToKcm {
                cluster: started.cluster.clone(),
                msg: KcmMsg::Go {
                    job: job.clone(),
                    component: *component,
                    hosts: hosts.clone(),
                },
                followup: Followup::Nothing,
            })
            .collect();
        gather.figures.barrier_s = Some(seconds(first, now.wall_ms));
        gather.figures.start_delay_s = Some(seconds(placed_at, now.wall_ms));
        gather.figures.running_since = Some(now.wall_ms);
        info!(
            barrier_s = gather.figures.barrier_s,
            start_delay_s = gather.figures.start_delay_s,
            "every grid component started: all let go"
        );
        effects
    }

    fn count_at_barrier(&self, ledger: &mut Ledger) {
        let gather = ledger.gather_mut();
        gather.figures.at_barrier = gather
            .run
            .as_ref()
            .filter(|run| run.released_at.is_none())
            .map_or(0, |run| run.started.len() as u32);
    }

    /// A claiming try, when one is due: past the start time, the run is
    /// given up; before it, with the fraction of components started at
    /// the job's threshold, those not started are withdrawn, to be placed
    /// again.
    fn claim(&mut self, ledger: &mut Ledger, now: Now) -> Vec<Effect> {
        let components = ledger.manifest().components.len();
        let threshold = ledger.manifest().claim_threshold();
        let barrier_timeout = ledger.manifest().barrier_timeout();
        let gather = ledger.gather_mut();
        let level = gather.level;
        let Some(run) = gather
            .run
            .as_mut()
            .filter(|run| run.released_at.is_none() && run.next_try <= now.wall_ms)
        else {
            return Vec::new();
        };
        let started = run.started.len();
        let past_start = now.wall_ms >= run.start_by;
        run.next_try = next_try(now.wall_ms, run.start_by, level);
        let unstarted: Vec<u32> = (0..components as u32)
            .filter(|c| !run.started.contains_key(c))
            .collect();
        gather.figures.claiming_tries += 1;
        if past_start {
            gather.level = (level - CLAIM_LEVEL_STEP).max(CLAIM_LEVEL_FLOOR);
            let reason = format!(
                "did not gather within its barrier_timeout ({}s): {started} of {components} components started",
                barrier_timeout.as_secs()
            );
            if self.may_restart(ledger) {
                return self.restart(ledger, &reason, now);
            }
            warn!(reason, "grid job given up: no run left");
            return vec![finish_unfinished(self, ledger, FinalStatus::Failed)];
        }
        let fraction = started as f64 / components as f64;
        let mut effects = Vec::new();
        if fraction >= threshold {
            let job = ledger.id().clone();
            for component in unstarted {
                let Some(cluster) = ledger
                    .placements_mut()
                    .get_mut(component as usize)
                    .and_then(Option::take)
                else {
                    continue;
                };
                info!(component, cluster = %cluster, started, of = components, "claiming try: component not started, withdrawn to be placed elsewhere");
                let moving = ledger.gather_mut().run.as_mut().and_then(|run| {
                    run.avoid.insert(cluster.clone());
                    run.moving.remove(&component)
                });
                // A copy on its way elsewhere goes too: it is placed anew.
                if let Some(to) = moving {
                    effects.push(Effect::ToKcm {
                        cluster: to,
                        msg: KcmMsg::WithdrawComponent {
                            job: job.clone(),
                            component,
                        },
                        followup: Followup::Nothing,
                    });
                }
                effects.push(Effect::ToKcm {
                    cluster,
                    msg: KcmMsg::WithdrawComponent {
                        job: job.clone(),
                        component,
                    },
                    followup: Followup::Nothing,
                });
            }
            if !effects.is_empty() {
                ledger.set_state(JobState::Waiting);
            }
        }
        effects.push(Effect::SaveJobFile);
        effects
    }

    /// A job of higher priority needs the slots: a running job's
    /// components are stopped with its preemption signal and grace, and
    /// it goes back to placement once they have ended.
    fn step_aside(&mut self, ledger: &mut Ledger, reason: &str, now: Now) -> Vec<Effect> {
        let job = ledger.id().clone();
        let signal = ledger
            .manifest()
            .preempt_signal
            .clone()
            .unwrap_or_else(|| "TERM".to_owned());
        let grace_ms = ledger
            .manifest()
            .preempt_grace
            .map_or(0, |g| g.as_millis() as u64);
        let clusters = ledger.clusters().clone();
        let Some(run) = ledger
            .gather_mut()
            .run
            .as_mut()
            .filter(|run| run.released_at.is_some() && run.stopping.is_none())
        else {
            debug!(reason, "asked to step aside while not running; ignored");
            return Vec::new();
        };
        run.stopping = Some(now.wall_ms);
        info!(
            reason,
            signal, grace_ms, "stopping the grid job for one of higher priority"
        );
        let mut effects: Vec<Effect> = clusters
            .into_iter()
            .map(|cluster| Effect::ToKcm {
                cluster,
                msg: KcmMsg::PreemptComponents {
                    job: job.clone(),
                    signal: signal.clone(),
                    grace_ms,
                },
                followup: Followup::Nothing,
            })
            .collect();
        effects.push(Effect::SaveJobFile);
        effects
    }

    /// A component of a run being stopped ended; once all have (or they
    /// outlast their grace), the job goes back to placement, a preemption,
    /// not a try.
    fn stopped(&mut self, ledger: &mut Ledger, component: Option<u32>, now: Now) -> Vec<Effect> {
        let unfinished: BTreeSet<u32> = (0..ledger.manifest().components.len() as u32)
            .filter(|c| !ledger.book().is_finished(u64::from(*c)))
            .collect();
        let grace = ledger.manifest().preempt_grace.unwrap_or_default();
        let Some(run) = ledger.gather_mut().run.as_mut() else {
            return Vec::new();
        };
        let Some(since) = run.stopping else {
            return Vec::new();
        };
        if let Some(component) = component {
            run.stopped.insert(component);
        }
        let overdue = now.wall_ms.saturating_sub(since) > (grace + STOP_MARGIN).as_millis() as u64;
        if !unfinished.is_subset(&run.stopped) && !overdue {
            return match component {
                Some(_) => vec![Effect::SaveJobFile],
                None => Vec::new(),
            };
        }
        let gather = ledger.gather_mut();
        gather.figures.preemptions += 1;
        info!(
            preemptions = gather.figures.preemptions,
            overdue, "grid job stopped for one of higher priority; waiting to run again"
        );
        back_to_placement(ledger, now)
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
        let mut effects = self.move_dropped(ledger, component, &cluster, reason);
        let placed = ledger.file().components.get(component as usize);
        if placed != Some(&Some(cluster.clone())) {
            debug!(component, cluster = %cluster, "withdrawal ignored: not placed there");
            return effects;
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
        effects.extend([Effect::SaveJobFile, Effect::Report]);
        effects
    }

    /// A component ended. Its program's exit is final (a rigid job is not
    /// retried); a component lost without one sends the job back to
    /// placement while that can still make it whole.
    fn component_ended(
        &mut self,
        ledger: &mut Ledger,
        outcome: ComponentOutcome,
        now: Now,
    ) -> Vec<Effect> {
        // Ended where it was being moved to, or where it waited: the move
        // is over.
        let mut effects =
            self.move_dropped(ledger, outcome.component, &outcome.cluster, "it ended");
        effects.extend(self.component_ended_here(ledger, outcome, now));
        effects
    }

    fn component_ended_here(
        &mut self,
        ledger: &mut Ledger,
        outcome: ComponentOutcome,
        now: Now,
    ) -> Vec<Effect> {
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
        let stopping = ledger
            .file()
            .gathering
            .as_ref()
            .and_then(|g| g.run.as_ref())
            .is_some_and(|run| run.stopping.is_some());
        if stopping && (outcome.preempted || outcome.exit_code.is_none()) {
            return self.stopped(ledger, Some(outcome.component), now);
        }
        if self.lost(ledger, &outcome) && self.may_restart(ledger) {
            let reason = match outcome.exit_code {
                None if outcome.runtime_ms == 0 => "could not start",
                _ => "vanished without an exit status",
            };
            let reason = format!(
                "component {} on {} {reason}",
                outcome.component, outcome.cluster
            );
            return self.restart(ledger, &reason, now);
        }
        let status = match outcome.exit_code {
            Some(0) => RunStatus::Succeeded,
            _ => RunStatus::Failed,
        };
        if let Some(code) = outcome.exit_code.filter(|code| *code != 0)
            && ledger.manifest().restart_on_failure
            && self.may_restart(ledger)
        {
            let reason = format!(
                "component {} on {} exited with code {code}",
                outcome.component, outcome.cluster
            );
            return self.restart(ledger, &reason, now);
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
            parted: None,
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
    /// A component that started but may not run, for `reason`: it fails,
    /// with the reason in its result, and the others are stopped, as for
    /// a component that failed (its kcm stops it with the job).
    fn fail_at_start(
        &mut self,
        ledger: &mut Ledger,
        component: u32,
        cluster: ClusterName,
        reason: String,
    ) -> Vec<Effect> {
        warn!(component, cluster = %cluster, reason, "grid component cannot be let go: it fails, the others are stopped");
        let task = u64::from(component);
        let result = ResultMsg {
            job: ledger.id().clone(),
            task,
            attempt: 1,
            preemptions: 0,
            status: RunStatus::Failed,
            exit_code: None,
            signal: None,
            runtime_ms: 0,
            launcher: LauncherId::default(),
            cluster,
            host: String::new(),
            stdout: Captured::default(),
            stderr: Captured::default(),
            outputs: Vec::new(),
            error: Some(reason),
            peak_memory_mb: None,
            parted: None,
        };
        let entry = self.entry(ledger, task, FinalStatus::Failed, Some(&result));
        ledger.finish(task, FinalStatus::Failed);
        vec![
            Effect::WriteOutputs(Box::new(result)),
            Effect::Record(vec![entry]),
            finish_unfinished(self, ledger, FinalStatus::Cancelled),
        ]
    }

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
    fn restart(&mut self, ledger: &mut Ledger, reason: &str, now: Now) -> Vec<Effect> {
        let restarts = ledger.restarted();
        warn!(
            reason,
            restarts, "grid job's run given up: stopping its components, placing the job again"
        );
        back_to_placement(ledger, now)
    }
}

/// The run ends here: its components are stopped wherever they are (their
/// kcms forget them rather than report their ends), and the job waits to
/// be placed again whole.
fn back_to_placement(ledger: &mut Ledger, now: Now) -> Vec<Effect> {
    let gather = ledger.gather_mut();
    gather.run = None;
    gather.waiting_since = now.wall_ms;
    gather.figures.at_barrier = 0;
    gather.figures.running_since = None;
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

/// A component ending this close to its walltime was killed for it.
const WALLTIME_MARGIN_MS: u64 = 5_000;

/// How long past their grace stopped components may take to be reported
/// before the job goes back to placement anyway.
const STOP_MARGIN: std::time::Duration = std::time::Duration::from_secs(60);

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
        // Its figures, and its walltime for the scheduler, from the start.
        ledger.gather_mut();
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

    fn on_lost(&mut self, _ledger: &mut Ledger, letter: DeadLetter, _now: Now) -> Vec<Effect> {
        debug!(
            tasks = letter.bundle.tasks.len(),
            "lost tasks ignored: this job is a grid job"
        );
        vec![Effect::SettleLost(letter.receipt)]
    }

    fn on_control(&mut self, ledger: &mut Ledger, msg: ControlMsg, now: Now) -> Vec<Effect> {
        let job = ledger.id();
        match msg {
            ControlMsg::Place {
                clusters,
                stage_ms,
                start_ms,
                slots,
            } => self.place(ledger, clusters, stage_ms, start_ms, slots, now),
            ControlMsg::Move {
                component,
                from,
                to,
                ..
            } => self.move_component(ledger, component, from, to),
            ControlMsg::ComponentQueued { component, cluster } => {
                self.component_queued(ledger, component, cluster)
            }
            ControlMsg::PlacementFailed { reason } => {
                warn!(reason, "the scheduler gave up placing the job");
                vec![finish_unfinished(self, ledger, FinalStatus::Failed)]
            }
            ControlMsg::ComponentEnded(outcome) => self.component_ended(ledger, outcome, now),
            ControlMsg::ComponentStarted {
                component,
                cluster,
                hosts,
            } => self.component_started(ledger, component, cluster, hosts, now),
            ControlMsg::ComponentWithdrawn {
                component,
                cluster,
                reason,
            } => self.component_withdrawn(ledger, component, cluster, &reason),
            ControlMsg::Cancel { reason } => cancel(self, ledger, &reason),
            ControlMsg::StepAside { reason } => self.step_aside(ledger, &reason, now),
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
            | ControlMsg::GpusHeld(_)
            | ControlMsg::LauncherGone { .. }
            | ControlMsg::Output(_) => {
                debug!("launcher message ignored: this job is a grid job");
                Vec::new()
            }
            ControlMsg::Follow { .. } => {
                let reason = "a grid job's components' output is in its results once they end (`gleaner logs JOB`)".to_owned();
                vec![Effect::Answer(ActionReply::Refused { reason })]
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
        now: Now,
    ) -> Vec<Effect> {
        match followup {
            Followup::Component { component, cluster } if !arrived && self.may_restart(ledger) => {
                let reason = format!("component {component}: {cluster} has no kcm");
                self.restart(ledger, &reason, now)
            }
            Followup::Moved { component, cluster } if !arrived => {
                self.move_dropped(ledger, component, &cluster, "its cluster has no kcm")
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

    /// Claiming tries, when due; a job placed by a runner that kept no
    /// gathering (an older one) gathers from now.
    fn poll(&mut self, ledger: &mut Ledger, now: Now) -> Vec<Effect> {
        let placed = ledger.file().state == JobState::Running
            && ledger.file().components.iter().all(Option::is_some);
        let barrier_timeout = ledger.manifest().barrier_timeout().as_millis() as u64;
        let gather = ledger.gather_mut();
        if placed && gather.run.is_none() {
            gather.run = Some(Claim::new(now.wall_ms, barrier_timeout, 0));
        }
        let mut effects = self.stopped(ledger, None, now);
        effects.extend(self.claim(ledger, now));
        effects
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

    #[test]
    fn a_reports_inputs_are_the_jobs_once_and_watchers_get_none() {
        let t0 = Instant::now();
        let submission = submission(
            "name = \"mpi\"\nkind = \"grid\"\ninputs = [\"/data/a\", \"/data/b\"]\n\
             [[component]]\nslots = 1\ncommand = \"a\"\ninputs = [\"/data/own\"]\n\
             [[component]]\nslots = 1\ncommand = \"b\"\n\
             [[component]]\nslots = 1\ncommand = \"c\"\n",
        );
        let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
        grid.start();
        let effects = grid.report(at(t0, 1));
        let update = effects
            .iter()
            .find_map(|e| match e {
                Effect::ToScheduler(SchedulerMsg::JobUpdate(r)) => Some(r),
                _ => None,
            })
            .expect("a report");
        assert_eq!(update.inputs, ["/data/a", "/data/b"]);
        assert_eq!(
            update.component_inputs,
            [vec!["/data/own".to_owned()], Vec::new(), Vec::new()]
        );
        assert_eq!(update.inputs_by_component()[2], ["/data/a", "/data/b"]);
        let progress = effects
            .iter()
            .find_map(|e| match e {
                Effect::Event(gleaner_protocol::Event::Progress(r)) => Some(r),
                _ => None,
            })
            .expect("progress");
        assert!(progress.inputs.is_empty() && progress.component_inputs.is_empty());
    }

    fn placed(t0: Instant) -> Job<Grid> {
        let mut grid = started(t0);
        grid.on_control(
            ControlMsg::Place {
                clusters: vec!["c1".into(), "c2".into()],
                slots: Vec::new(),
                start_ms: 0,
                stage_ms: 0,
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
            preempted: false,
        })
    }

    fn started_on(component: u32, cluster: &str, host: &str) -> ControlMsg {
        ControlMsg::ComponentStarted {
            component,
            cluster: cluster.into(),
            hosts: vec![HostSlots {
                host: host.into(),
                slots: 4 - 2 * component,
            }],
        }
    }

    fn gathering(grid: &Job<Grid>) -> gleaner_protocol::Gathering {
        grid.job_file().gathering.unwrap().figures
    }

    fn grid_with(extra: &str, t0: Instant) -> Job<Grid> {
        let manifest = MANIFEST.replace("walltime", &format!("{extra}\nwalltime"));
        let submission = submission(&manifest);
        let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
        grid.start();
        grid.on_control(
            ControlMsg::Place {
                clusters: vec!["c1".into(), "c2".into()],
                slots: Vec::new(),
                start_ms: 0,
                stage_ms: 0,
            },
            at(t0, 1),
        );
        grid
    }

    fn move_to(component: u32, from: &str, to: &str) -> ControlMsg {
        ControlMsg::Move {
            component,
            from: from.into(),
            to: to.into(),
            start_ms: 0,
        }
    }

    fn queued(component: u32, cluster: &str) -> ControlMsg {
        ControlMsg::ComponentQueued {
            component,
            cluster: cluster.into(),
        }
    }

    fn placed_on(grid: &Job<Grid>) -> Vec<String> {
        let file = grid.job_file();
        file.components
            .iter()
            .map(|c| c.as_ref().map_or("-".to_owned(), |c| c.to_string()))
            .collect()
    }

    #[test]
    fn a_moldable_component_is_submitted_with_the_slots_chosen_and_their_walltime() {
        let t0 = Instant::now();
        let manifest = "name = \"m\"\nkind = \"grid\"\nwalltime = \"1h\"\n\
            [[component]]\nslots = { min = 4, max = 64 }\nspeedup = \"amdahl:0.9\"\ncommand = \"solve\"\n";
        let submission = submission(manifest);
        let mut grid = Grid::open(opening(&submission, vec![], None), at(t0, 0)).unwrap();
        grid.start();
        let report = grid.standing(at(t0, 0));
        assert_eq!(report.components, [4], "its fewest slots");
        assert!(report.moldable[0].is_some());
        let effects = grid.on_control(
            ControlMsg::Place {
                clusters: vec!["c1".into()],
                slots: vec![16],
                start_ms: 0,
                stage_ms: 0,
            },
            at(t0, 1),
        );
        let spec = effects
            .iter()
            .find_map(|e| match e {
                Effect::ToKcm {
                    msg: KcmMsg::SubmitComponent(spec),
                    ..
                } => Some(spec.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(spec.slots, 16);
        assert_eq!(spec.walltime_ms, Some(1_730_770));
        assert!(
            spec.env
                .contains(&("GLEANER_SLOTS".to_owned(), "16".to_owned()))
        );
        // Moved, it keeps them.
        let effects = grid.on_control(move_to(0, "c1", "c2"), at(t0, 2));
        assert!(effects.iter().any(|e| matches!(
            e,
            Effect::ToKcm { msg: KcmMsg::SubmitComponent(spec), .. } if spec.slots == 16
        )));
    }

    #[test]
    fn a_moved_component_is_withdrawn_where_it_waited_only_once_its_new_cluster_has_it() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        let effects = grid.on_control(move_to(1, "c2", "c3"), at(t0, 2));
        assert_eq!(told(&effects), [("c3".to_owned(), "submit_component")]);
        assert_eq!(placed_on(&grid), ["c1", "c2"], "still where it waits");
        assert!(
            told(&grid.on_control(move_to(1, "c2", "c3"), at(t0, 3))).is_empty(),
            "one move at a time"
        );
        assert!(
            told(&grid.on_control(queued(1, "c2"), at(t0, 3))).is_empty(),
            "queued where it was: nothing new"
        );
        let effects = grid.on_control(queued(1, "c3"), at(t0, 4));
        assert_eq!(told(&effects), [("c2".to_owned(), "withdraw_component")]);
        assert_eq!(placed_on(&grid), ["c1", "c3"]);
        assert_eq!(gathering(&grid).moves, 1);
        // It starts where it went, and the job gathers there.
        grid.on_control(started_on(0, "c1", "a1"), at(t0, 5));
        let effects = grid.on_control(started_on(1, "c3", "d1"), at(t0, 6));
        let go: Vec<(String, &str)> = told(&effects);
        assert_eq!(
            go,
            [("c1".to_owned(), "go"), ("c3".to_owned(), "go")],
            "{effects:?}"
        );
    }

    #[test]
    fn a_claiming_try_that_withdraws_a_moving_component_withdraws_its_copy_too() {
        let t0 = Instant::now();
        let mut grid = grid_with("claim_threshold = 0.5", t0);
        grid.on_control(started_on(0, "c1", "a1"), at(t0, 2));
        grid.on_control(move_to(1, "c2", "c3"), at(t0, 3));
        // The first try is due at once: half started, the other withdrawn.
        let effects = grid.poll(at(t0, 4));
        let mut withdrawn = told(&effects);
        withdrawn.sort();
        assert_eq!(
            withdrawn,
            [
                ("c2".to_owned(), "withdraw_component"),
                ("c3".to_owned(), "withdraw_component")
            ]
        );
        let effects = grid.on_control(queued(1, "c3"), at(t0, 5));
        assert!(told(&effects).is_empty(), "the move is over");
        assert_eq!(placed_on(&grid), ["c1", "-"]);
    }

    #[test]
    fn a_component_that_starts_where_it_waits_stays_and_its_copy_is_withdrawn() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        grid.on_control(move_to(1, "c2", "c3"), at(t0, 2));
        let effects = grid.on_control(started_on(1, "c2", "b1"), at(t0, 3));
        assert_eq!(told(&effects), [("c3".to_owned(), "withdraw_component")]);
        assert!(
            told(&grid.on_control(queued(1, "c3"), at(t0, 4))).is_empty(),
            "the move is over"
        );
        assert_eq!(placed_on(&grid), ["c1", "c2"]);
        assert_eq!(gathering(&grid).moves, 0);
        // Started: it never moves again.
        assert!(told(&grid.on_control(move_to(1, "c2", "c3"), at(t0, 5))).is_empty());
    }

    #[test]
    fn a_component_started_where_it_goes_before_it_is_said_queued_has_moved() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        grid.on_control(move_to(1, "c2", "c3"), at(t0, 2));
        let effects = grid.on_control(started_on(1, "c3", "d1"), at(t0, 3));
        assert_eq!(told(&effects), [("c2".to_owned(), "withdraw_component")]);
        assert_eq!(placed_on(&grid), ["c1", "c3"]);
        assert_eq!(grid.standing(at(t0, 3)).gathering.unwrap().at_barrier, 1);
    }

    #[test]
    fn a_move_its_new_cluster_cannot_take_is_dropped_and_the_job_goes_on() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        grid.on_control(move_to(1, "c2", "c3"), at(t0, 2));
        let refused = ControlMsg::ComponentEnded(ComponentOutcome {
            component: 1,
            cluster: "c3".into(),
            exit_code: None,
            runtime_ms: 0,
            stdout: Captured::default(),
            stderr: Captured::default(),
            preempted: false,
        });
        let effects = grid.on_control(refused, at(t0, 3));
        assert!(recorded(&effects).is_empty(), "{effects:?}");
        assert!(told(&effects).is_empty(), "{effects:?}");
        assert_eq!(placed_on(&grid), ["c1", "c2"]);
        // A kcm that is not there: dropped too, and a next move may go.
        let effects = grid.on_control(move_to(1, "c2", "c4"), at(t0, 4));
        assert_eq!(told(&effects), [("c4".to_owned(), "submit_component")]);
        let missing = Followup::Moved {
            component: 1,
            cluster: "c4".into(),
        };
        grid.on_delivery(missing, false, at(t0, 5));
        let effects = grid.on_control(move_to(1, "c2", "c3"), at(t0, 6));
        assert_eq!(told(&effects), [("c3".to_owned(), "submit_component")]);
    }

    #[test]
    fn components_wait_at_the_barrier_until_all_have_started() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        // Submitted at 1 s after the epoch; placed at 1,001 s.
        assert_eq!(gathering(&grid).placement_s, Some(1000.0));
        let effects = grid.on_control(started_on(1, "c2", "b1"), at(t0, 3));
        assert!(told(&effects).is_empty(), "the other has not started");
        assert_eq!(grid.standing(at(t0, 3)).gathering.unwrap().at_barrier, 1);
        assert!(
            grid.on_control(started_on(0, "c2", "x"), at(t0, 4))
                .is_empty(),
            "not placed there"
        );
        let effects = grid.on_control(started_on(0, "c1", "a1"), at(t0, 6));
        let released: Vec<(String, u32, Vec<Vec<HostSlots>>)> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::ToKcm {
                    cluster,
                    msg:
                        KcmMsg::Go {
                            component, hosts, ..
                        },
                    ..
                } => Some((cluster.to_string(), *component, hosts.clone())),
                _ => None,
            })
            .collect();
        let hosts = vec![
            vec![HostSlots {
                host: "a1".into(),
                slots: 4,
            }],
            vec![HostSlots {
                host: "b1".into(),
                slots: 2,
            }],
        ];
        assert_eq!(
            released,
            [
                ("c1".to_owned(), 0, hosts.clone()),
                ("c2".to_owned(), 1, hosts)
            ]
        );
        let figures = gathering(&grid);
        assert_eq!(
            (figures.at_barrier, figures.barrier_s, figures.start_delay_s),
            (0, Some(3.0), Some(5.0))
        );
        assert!(
            grid.on_control(started_on(1, "c2", "b1"), at(t0, 7))
                .is_empty(),
            "let go once"
        );
        assert!(
            grid.poll(at(t0, 3_600)).is_empty(),
            "no claiming once gathered"
        );
    }

    #[test]
    fn claiming_tries_follow_koalas_times_and_a_run_not_gathered_by_its_start_time_is_placed_again()
    {
        let t0 = Instant::now();
        let mut grid = grid_with("barrier_timeout = \"20s\"", t0);
        grid.on_control(started_on(0, "c1", "a1"), at(t0, 2));
        // Tries at placement (1 s), then L = 0.75 of the way to the start
        // time (21 s) each: 16 s, 19.75 s, then the start time itself.
        for (t, tries) in [(1, 1), (15, 1), (16, 2), (19, 2), (20, 3)] {
            assert!(told(&grid.poll(at(t0, t))).is_empty(), "at {t}s");
            assert_eq!(gathering(&grid).claiming_tries, tries, "at {t}s");
        }
        let effects = grid.poll(at(t0, 21));
        assert_eq!(
            told(&effects),
            [
                ("c1".to_owned(), "job_ended"),
                ("c2".to_owned(), "job_ended")
            ]
        );
        let file = grid.job_file();
        assert_eq!((file.state, file.restarts), (JobState::Waiting, 1));
        let gather = file.gathering.unwrap();
        assert_eq!(
            (
                gather.level,
                gather.figures.claiming_tries,
                gather.figures.at_barrier
            ),
            (0.625, 4, 0)
        );
        assert!(gather.run.is_none());
        assert_eq!(
            grid.standing(at(t0, 21)).components,
            [4, 2],
            "placed again whole"
        );
        // The next run's start time counts from its own placement.
        let place = ControlMsg::Place {
            clusters: vec!["c2".into(), "c1".into()],
            slots: Vec::new(),
            start_ms: 0,
            stage_ms: 0,
        };
        grid.on_control(place, at(t0, 30));
        assert_eq!(gathering(&grid).placement_s, Some(9.0));
        assert_eq!(
            grid.job_file().gathering.unwrap().run.unwrap().start_by,
            at(t0, 50).wall_ms
        );
    }

    #[test]
    fn with_a_threshold_a_claiming_try_places_the_components_not_started_again() {
        let t0 = Instant::now();
        let mut grid = grid_with("claim_threshold = 0.5", t0);
        grid.on_control(started_on(0, "c1", "a1"), at(t0, 2));
        let effects = grid.poll(at(t0, 2));
        assert_eq!(told(&effects), [("c2".to_owned(), "withdraw_component")]);
        let report = grid.standing(at(t0, 2));
        assert_eq!(report.state, JobState::Waiting);
        assert_eq!(report.components, [2], "only the one not started");
        assert_eq!(report.avoid, [ClusterName::from("c2")], "placed elsewhere");
        let effects = grid.on_control(
            ControlMsg::Place {
                clusters: vec!["c3".into()],
                slots: Vec::new(),
                start_ms: 0,
                stage_ms: 0,
            },
            at(t0, 4),
        );
        assert_eq!(told(&effects), [("c3".to_owned(), "submit_component")]);
        assert_eq!(gathering(&grid).at_barrier, 1, "component 0 still waits");
        let effects = grid.on_control(started_on(1, "c3", "c31"), at(t0, 5));
        assert_eq!(
            told(&effects),
            [("c1".to_owned(), "go"), ("c3".to_owned(), "go")]
        );
        assert_eq!(
            gathering(&grid).start_delay_s,
            Some(4.0),
            "from the first placement"
        );
    }

    #[test]
    fn a_running_job_steps_aside_once_its_components_stopped_and_is_placed_again() {
        let t0 = Instant::now();
        let mut grid = grid_with("preempt_signal = \"USR1\"\npreempt_grace = \"20s\"", t0);
        let aside = || ControlMsg::StepAside {
            reason: "a job of high priority".into(),
        };
        assert!(
            grid.on_control(aside(), at(t0, 2)).is_empty(),
            "not running yet"
        );
        grid.on_control(started_on(0, "c1", "a1"), at(t0, 2));
        grid.on_control(started_on(1, "c2", "b1"), at(t0, 3));
        assert_eq!(gathering(&grid).running_since, Some(at(t0, 3).wall_ms));
        let effects = grid.on_control(aside(), at(t0, 10));
        let stops: Vec<(String, String, u64)> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::ToKcm {
                    cluster,
                    msg:
                        KcmMsg::PreemptComponents {
                            signal, grace_ms, ..
                        },
                    ..
                } => Some((cluster.to_string(), signal.clone(), *grace_ms)),
                _ => None,
            })
            .collect();
        assert_eq!(
            stops,
            [
                ("c1".to_owned(), "USR1".to_owned(), 20_000),
                ("c2".to_owned(), "USR1".to_owned(), 20_000)
            ]
        );
        assert!(grid.on_control(aside(), at(t0, 11)).is_empty(), "once");
        let preempted = |component| match ended(component, None) {
            ControlMsg::ComponentEnded(outcome) => ControlMsg::ComponentEnded(ComponentOutcome {
                preempted: true,
                ..outcome
            }),
            other => other,
        };
        let effects = grid.on_control(preempted(0), at(t0, 12));
        assert!(told(&effects).is_empty() && recorded(&effects).is_empty());
        assert_eq!(grid.job_file().state, JobState::Running, "one still stops");
        let effects = grid.on_control(preempted(1), at(t0, 13));
        assert_eq!(
            told(&effects),
            [
                ("c1".to_owned(), "job_ended"),
                ("c2".to_owned(), "job_ended")
            ]
        );
        assert!(recorded(&effects).is_empty(), "nothing final");
        let file = grid.job_file();
        assert_eq!(
            (file.state, file.restarts),
            (JobState::Waiting, 0),
            "not a try"
        );
        let figures = file.gathering.unwrap().figures;
        assert_eq!((figures.preemptions, figures.running_since), (1, None));
        assert_eq!(grid.standing(at(t0, 13)).components, [4, 2]);
    }

    #[test]
    fn components_that_outlast_their_grace_are_given_up_on() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        grid.on_control(started_on(0, "c1", "a1"), at(t0, 2));
        grid.on_control(started_on(1, "c2", "b1"), at(t0, 3));
        let aside = ControlMsg::StepAside {
            reason: "high".into(),
        };
        grid.on_control(aside, at(t0, 10));
        assert!(told(&grid.poll(at(t0, 60))).is_empty());
        let effects = grid.poll(at(t0, 71));
        assert_eq!(told(&effects).len(), 2, "stopped for good: {effects:?}");
        assert_eq!(grid.job_file().state, JobState::Waiting);
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
            slots: Vec::new(),
            start_ms: 0,
            stage_ms: 0,
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
                slots: Vec::new(),
                start_ms: 0,
                stage_ms: 0,
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
            slots: Vec::new(),
            start_ms: 0,
            stage_ms: 0,
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
                slots: Vec::new(),
                start_ms: 0,
                stage_ms: 0,
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
    fn host_lists_too_big_for_a_go_fail_the_component_that_brings_them() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        let many = |n: usize| {
            let host = HostSlots {
                host: "n".repeat(253),
                slots: 1,
            };
            vec![host; n]
        };
        // Each within the bound, both beyond it.
        let half = MAX_GO_HOSTS_BYTES / 2 / 273;
        let effects = grid.on_control(
            ControlMsg::ComponentStarted {
                component: 1,
                cluster: "c2".into(),
                hosts: many(half),
            },
            at(t0, 2),
        );
        assert!(recorded(&effects).is_empty(), "waits for the other");
        let effects = grid.on_control(
            ControlMsg::ComponentStarted {
                component: 0,
                cluster: "c1".into(),
                hosts: many(half + 10),
            },
            at(t0, 3),
        );
        assert!(
            !effects.iter().any(|e| matches!(
                e,
                Effect::ToKcm {
                    msg: KcmMsg::Go { .. },
                    ..
                }
            )),
            "no go that could not be sent"
        );
        let entries = recorded(&effects);
        let statuses: Vec<(u64, FinalStatus)> =
            entries.iter().map(|e| (e.task, e.status)).collect();
        assert_eq!(
            statuses,
            [(0, FinalStatus::Failed), (1, FinalStatus::Cancelled)]
        );
        let error = entries[0].error.as_deref().unwrap_or_default();
        assert!(error.contains("more than the 8192 KiB"), "{error}");
        assert_eq!(grid.ending(), Some(JobState::Done));
    }

    #[test]
    fn host_lists_within_a_go_are_read_back_from_job_json() {
        let t0 = Instant::now();
        let mut grid = placed(t0);
        // The shortest names: the most JSON for their bytes in a message.
        let each = MAX_GO_HOSTS_BYTES / 2 / 21 - 10;
        let hosts = vec![
            HostSlots {
                host: "n".into(),
                slots: u32::MAX,
            };
            each
        ];
        for (component, cluster) in [(0, "c1"), (1, "c2")] {
            let started = ControlMsg::ComponentStarted {
                component,
                cluster: cluster.into(),
                hosts: hosts.clone(),
            };
            assert!(recorded(&grid.on_control(started, at(t0, 2))).is_empty());
        }
        let file = serde_json::to_vec_pretty(&grid.job_file()).unwrap();
        assert!(
            file.len() as u64 <= crate::records::MAX_JOB_FILE,
            "{} bytes",
            file.len()
        );
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
            slots: Vec::new(),
            start_ms: 0,
            stage_ms: 0,
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
            at(t0, 3),
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
            at(t0, 3),
        );
        assert!(effects.is_empty());
        let effects = grid.on_delivery(
            Followup::Component {
                component: 1,
                cluster: "c2".into(),
            },
            false,
            at(t0, 3),
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
