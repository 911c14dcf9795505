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
    job::{Job, Kind, Ledger, Opening, Refusal, cancel, finish_unfinished, index_entry},
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
        let gather = ledger.gather_mut(CLAIM_LEVEL);
        if whole || gather.run.is_none() {
            gather.figures.placement_s = Some(seconds(gather.waiting_since, now.wall_ms));
            let first_try = (gather.level * stage_ms as f64) as u64;
            // Components that wait their turn in batch queues have until
            // it comes, and the barrier timeout after it.
            let start_by = barrier_timeout.saturating_add(start_ms);
            gather.run = Some(Claim::new(now.wall_ms, start_by, first_try));
        }
        if let Some(run) = ledger.gather_mut(CLAIM_LEVEL).run.as_mut() {
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
        let Some(run) = ledger.gather_mut(CLAIM_LEVEL).run.as_mut() else {
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
        let Some(run) = ledger.gather_mut(CLAIM_LEVEL).run.as_mut() else {
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
        let gather = ledger.gather_mut(CLAIM_LEVEL);
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
        let Some(run) = ledger.gather_mut(CLAIM_LEVEL).run.as_mut() else {
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
        if let Some(run) = ledger.gather_mut(CLAIM_LEVEL).run.as_mut() {
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
        let gather = ledger.gather_mut(CLAIM_LEVEL);
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
        let gather = ledger.gather_mut(CLAIM_LEVEL);
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
        let gather = ledger.gather_mut(CLAIM_LEVEL);
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
                let moving = ledger.gather_mut(CLAIM_LEVEL).run.as_mut().and_then(|run| {
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
            .gather_mut(CLAIM_LEVEL)
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
        let Some(run) = ledger.gather_mut(CLAIM_LEVEL).run.as_mut() else {
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
        let gather = ledger.gather_mut(CLAIM_LEVEL);
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
    let gather = ledger.gather_mut(CLAIM_LEVEL);
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
        ledger.gather_mut(CLAIM_LEVEL);
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
        let gather = ledger.gather_mut(CLAIM_LEVEL);
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
mod tests;
