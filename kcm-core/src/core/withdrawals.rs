//! What the kcm takes back from the batch system: room for local jobs,
//! placeholders waiting too long, launchers past their grace, an ended
//! job's remains.

use super::*;

impl KcmCore {
    /// Local jobs wait: withdraw pending placeholders (but those the batch
    /// system keeps behind them anyway: they fill the holes its backfill
    /// finds), then order the scavenging jobs here to give back what is
    /// still missing, where the waiting jobs can use it.
    pub(super) fn make_room(&mut self, now: Now) -> Vec<Effect> {
        let snapshot = &self.last;
        let yielding = snapshot.yielding();
        let pending: Vec<String> = snapshot
            .placeholders
            .iter()
            .filter(|p| !p.running() && !yielding.contains(p.id.as_str()))
            .map(|p| p.id.clone())
            .collect();
        let hosts = snapshot.host_loads();
        let planned = snapshot.starting_first();
        let state = LocalState {
            waiting: &snapshot.waiting,
            hosts: &hosts,
            pending_placeholders: &pending,
            planned: &planned,
        };
        let plan = on_local_wait(
            state,
            &mut self.answered,
            now.wall_ms,
            self.config.local_settle.as_millis() as u64,
        );
        let cluster = &self.config.cluster;
        let waiting = snapshot.waiting.len();
        let wanted = snapshot.local_waiting();
        let mut effects = Vec::new();
        for job in &plan.unplaceable {
            if let Some(w) = snapshot.waiting.iter().find(|w| &w.id == job) {
                info!(local_job = %job, slots = w.slots, together = w.together, exclusive = w.exclusive, "a local job waits that no host could take even without gleaner: nothing preempted for it");
            }
        }
        if !plan.withdraw.is_empty() {
            info!(
                placeholders = plan.withdraw.len(),
                waiting, "local jobs wait: withdrawing pending placeholders"
            );
            self.last
                .placeholders
                .retain(|p| !plan.withdraw.contains(&p.id));
            effects.push(Effect::Remove { ids: plan.withdraw });
        }
        for order in plan.shrink {
            info!(job = %order.job, slots = order.slots, hosts = ?order.hosts, waiting, wanted, "local jobs wait: shrinking");
            let message = ControlMsg::Shrink {
                cluster: cluster.clone(),
                slots: order.slots,
                mode: ShrinkMode::Preempt,
                reason: format!("{waiting} local job(s) wait for {wanted} slot(s) on {cluster}"),
                hosts: order.hosts,
            };
            effects.push(Effect::Tell {
                job: order.job,
                message,
            });
        }
        effects
    }

    /// Placeholders and components waiting in the batch queue for longer
    /// than `max_pending` (not for local jobs: those withdraw them at once,
    /// or the batch system keeps them behind; nor components whose turn is
    /// still to come by the estimates) wait
    /// for something gleaner cannot see; they are withdrawn. Both
    /// count as failed starts, and their slots are not reported idle for a
    /// while, so that the scheduler offers or places them elsewhere and, if
    /// it keeps happening, stops using this cluster; a withdrawn component
    /// is told to its job, to be placed again.
    pub(super) fn withdraw_stuck(&mut self, now: Now) -> Vec<Effect> {
        let yielding = self.last.yielding();
        let waiting: BTreeSet<&str> = self
            .last
            .placeholders
            .iter()
            .filter(|p| !p.running() && !yielding.contains(p.id.as_str()))
            .map(|p| p.id.as_str())
            .chain(
                self.last
                    .components
                    .iter()
                    .filter(|c| !c.running)
                    .map(|c| c.id.as_str()),
            )
            .collect();
        self.pending_since
            .retain(|id, _| waiting.contains(id.as_str()));
        for id in waiting {
            self.pending_since
                .entry(id.to_owned())
                .or_insert(now.instant);
        }
        let limit = self.config.max_pending;
        let stuck = |id: &str| {
            self.pending_since
                .get(id)
                .is_some_and(|since| now.instant.saturating_duration_since(*since) > limit)
        };
        let placeholders: Vec<String> = self
            .last
            .placeholders
            .iter()
            .filter(|p| !p.running() && stuck(&p.id))
            .map(|p| p.id.clone())
            .collect();
        // A component the estimates have waiting its turn behind jobs
        // that end waits for slots, not for something unseen: it stays
        // (reallocation may move it).
        let foresight = self.last.foresight(now.wall_ms, self.config.speed);
        let in_turn: BTreeSet<(&JobId, u32)> = foresight
            .waiting
            .iter()
            .filter(|w| w.start_ms > 0 && w.start_ms < NEVER_MS / 2)
            .map(|w| (&w.job, w.component))
            .collect();
        let components: Vec<ComponentRun> = self
            .last
            .components
            .iter()
            .filter(|c| !c.running && stuck(&c.id) && !in_turn.contains(&(&c.job, c.component)))
            .cloned()
            .collect();
        if placeholders.is_empty() && components.is_empty() {
            return Vec::new();
        }
        let cluster = self.config.cluster.clone();
        self.starts.stuck += 1;
        let slots = self
            .last
            .placeholders
            .iter()
            .filter(|p| placeholders.contains(&p.id))
            .map(|p| p.slots)
            .chain(components.iter().map(|c| c.slots))
            .fold(0, u32::saturating_add);
        self.starts.blocked = Some((slots, now.instant + limit));
        let reason = format!("waited in {cluster}'s batch queue longer than {limit:?}: withdrawn");
        if !placeholders.is_empty() {
            let message = format!("{} placeholder(s) {reason}", placeholders.len());
            warn!(placeholders = ?placeholders, failures = self.starts.stuck, "{message}");
            self.errors.command = Some(message);
        }
        let mut effects = Vec::new();
        for run in &components {
            warn!(job = %run.job, component = run.component, owner = %run.owner, failures = self.starts.stuck, "grid component {reason}, to be placed again");
            self.components.remove(&(run.job.clone(), run.component));
            effects.push(Effect::Tell {
                job: run.job.clone(),
                message: ControlMsg::ComponentWithdrawn {
                    component: run.component,
                    cluster: cluster.clone(),
                    reason: reason.clone(),
                },
            });
        }
        let ids: Vec<String> = placeholders
            .into_iter()
            .chain(components.iter().map(|c| c.id.clone()))
            .collect();
        for id in &ids {
            self.pending_since.remove(id);
        }
        self.last.placeholders.retain(|p| !ids.contains(&p.id));
        self.last.components.retain(|c| !ids.contains(&c.id));
        effects.push(Effect::Remove { ids });
        effects
    }

    /// Removals whose grace has passed, of the placeholders still there.
    pub(super) fn due_removals(&mut self, now: Now) -> Vec<Effect> {
        let (due, later): (Vec<Removal>, Vec<Removal>) = std::mem::take(&mut self.removals)
            .into_iter()
            .partition(|r| r.due <= now.instant);
        self.removals = later;
        let still_there: Vec<String> = due
            .into_iter()
            .flat_map(|r| {
                let placeholders = &self.last.placeholders;
                r.ids
                    .into_iter()
                    .filter(move |id| placeholders.iter().any(|p| &p.id == id && p.job == r.job))
            })
            .collect();
        if still_there.is_empty() {
            return Vec::new();
        }
        warn!(placeholders = ?still_there, "removing launchers that outstayed their grace period");
        vec![Effect::Remove { ids: still_there }]
    }

    /// Waiting placeholders of an ended job go now; running ones get a grace
    /// period to notice the end themselves.
    pub(super) fn end_job(&mut self, job: &JobId, now: Now) -> Vec<Effect> {
        let (pending, running): (Vec<&Placeholder>, Vec<&Placeholder>) = self
            .last
            .placeholders
            .iter()
            .filter(|p| &p.job == job)
            .partition(|p| !p.running());
        let pending: Vec<String> = pending
            .iter()
            .map(|p| p.id.clone())
            .chain(
                // Components of a job that ended early (cancelled) go too.
                self.last
                    .components
                    .iter()
                    .filter(|c| &c.job == job)
                    .map(|c| c.id.clone()),
            )
            .collect();
        let running: Vec<String> = running.iter().map(|p| p.id.clone()).collect();
        // Its components are stopped, not ended: their job has stopped
        // listening for them (or will place them again).
        let stopped: Vec<u32> = self
            .components
            .keys()
            .filter(|(j, _)| j == job)
            .map(|(_, component)| *component)
            .collect();
        let mut effects: Vec<Effect> = stopped
            .into_iter()
            .map(|component| {
                self.components.remove(&(job.clone(), component));
                Effect::DeleteSpoolEntry {
                    job: job.clone(),
                    component,
                }
            })
            .collect();
        if !pending.is_empty() {
            info!(job = %job, placeholders = pending.len(), "withdrawing waiting placeholders of an ended job");
            effects.push(Effect::Remove { ids: pending });
        }
        if !running.is_empty() {
            self.removals.push(Removal {
                due: now.instant + self.config.job_end_grace,
                job: job.clone(),
                ids: running,
            });
        }
        effects
    }
}
