//! Grid jobs: placing them on clusters (co-allocation, KOALA's policies),
//! reallocating those still waiting, and stopping running ones for jobs
//! of higher priority.

use super::*;

impl State {
    /// Seed 002's reallocation, when due: grid components waiting in
    /// batch queues move where they would now complete earlier. Only
    /// components of jobs still gathering, with a walltime, move; the
    /// clusters their run did not start on are barred, and failing or
    /// silent clusters take none.
    pub(super) fn reallocate(&mut self, now: Instant, config: &StateConfig) -> Vec<Action> {
        let every = config.grid.reallocate_every;
        if every.is_zero() || self.next_reallocation.is_some_and(|at| now < at) {
            return Vec::new();
        }
        let first = self.next_reallocation.is_none();
        self.next_reallocation = Some(now + every);
        if first {
            // A scheduler just up has not heard every cluster yet.
            return Vec::new();
        }
        let mut sites = Vec::new();
        let mut waiting = Vec::new();
        for (name, c) in &self.clusters {
            let usable = now.duration_since(c.seen) <= config.stale_after
                && c.report.failed_starts < config.max_consecutive_failures;
            let Some((speed, profile, here)) = c.foresight(now).filter(|_| usable) else {
                continue;
            };
            sites.push(reallocation::Site {
                name: name.clone(),
                speed,
                profile,
            });
            waiting.extend(here);
        }
        waiting.retain_mut(|w| {
            let Some(report) = self.grid.report_of(&w.job) else {
                return false;
            };
            let gathering = report.gathering.as_ref();
            w.barred = report.avoid.clone();
            w.walltime != NEVER_MS
                && gathering.is_some_and(|g| g.running_since.is_none() && g.walltime_s.is_some())
        });
        let started = |w: &Waiting| self.grid.report_of(&w.job).map_or(0, |r| r.started_at);
        waiting.sort_by_key(|w| (started(w), w.job.clone(), w.component));
        let gain = config.grid.reallocate_gain.as_millis() as u64;
        let moves = reallocation::reallocate(
            &waiting,
            &sites,
            config.grid.reallocation,
            config.grid.reallocation_heuristic,
            gain,
        );
        info!(
            waiting = waiting.len(),
            moves = moves.len(),
            algorithm = ?config.grid.reallocation,
            heuristic = ?config.grid.reallocation_heuristic,
            "reallocation"
        );
        moves
            .into_iter()
            .map(|m| Action::Move {
                job: m.job,
                component: m.component,
                from: m.from,
                to: m.to,
                start_ms: m.start,
                before_ms: m.before,
                after_ms: m.after,
            })
            .collect()
    }

    /// Places the grid jobs that can be placed, shrinking scavenging jobs
    /// where their slots are needed; counts a failed try for the others.
    pub(super) fn place_grid_jobs(&mut self, now: Instant, config: &StateConfig) -> Vec<Action> {
        let waiting = self.grid.waiting(now);
        if waiting.is_empty() {
            return Vec::new();
        }
        let sites: Vec<Site> = self
            .clusters
            .iter()
            .filter(|(_, c)| {
                now.duration_since(c.seen) <= config.stale_after
                    && c.report.failed_starts < config.max_consecutive_failures
            })
            .map(|(name, c)| Site {
                name: name.clone(),
                free: self.free_slots(name, c, now, config),
                scavenged: c
                    .report
                    .jobs
                    .iter()
                    .map(|(job, h)| (job.clone(), h.total()))
                    .collect(),
                hosts: c
                    .report
                    .hosts
                    .iter()
                    .map(|h| HostRoom {
                        name: h.name.clone(),
                        slots: h.slots,
                        free: h.free(),
                        scavenged: h.jobs.clone(),
                    })
                    .collect(),
                inputs: c.report.inputs.clone(),
                ect: c.foresight(now).map(|(speed, profile, waiting)| {
                    let mut profile = profile;
                    // Their own components wait there: a new one queues
                    // behind them.
                    for w in &waiting {
                        profile.reserve(w.start, w.slots, scaled(w.walltime, speed));
                    }
                    SiteEct { speed, profile }
                }),
            })
            .collect();
        let (mut placements, rooms) =
            placement::place_leaving(&waiting, &sites, config.grid.weights, config.grid.placement);
        let mut actions = Vec::new();
        // A job that would wait in a batch queue, behind running jobs of
        // lower priority it may stop, stops them instead (KOALA's
        // priorities come before the completion times).
        let mut stopping = None;
        // Nor does a job queue behind others before every cluster had time
        // to report: a cluster not heard yet may run it now.
        let settled = self
            .clusters
            .values()
            .map(|c| c.first_seen)
            .min()
            .is_some_and(|first| now.duration_since(first) >= config.stale_after);
        placements.retain(|placed| {
            if placed.start_ms == 0 {
                return true;
            }
            if !settled {
                return false;
            }
            if stopping.is_some() {
                return true;
            }
            let Some(job) = waiting.iter().find(|j| j.id == placed.job) else {
                return true;
            };
            let stop = self.stop_for(job, &sites, now, config);
            if stop.is_empty() {
                return true;
            }
            stopping = Some(stop);
            false
        });
        actions.extend(stopping.into_iter().flatten());
        for placed in &placements {
            for reclaim in &placed.reclaim {
                let (cluster, slots) = (&reclaim.cluster, reclaim.slots);
                let reason = match reclaim.hosts.as_slice() {
                    [] => format!("grid job {} needs slots on {cluster}", placed.job),
                    hosts => format!(
                        "grid job {} needs slots on {cluster} host {}",
                        placed.job,
                        hosts.join(", ")
                    ),
                };
                actions.push(Action::Preempt {
                    job: reclaim.job.clone(),
                    cluster: cluster.clone(),
                    slots,
                    reason,
                    hosts: reclaim.hosts.clone(),
                });
            }
            self.grid.placed(&placed.job, &placed.clusters, now);
            let stage_ms = self.stage_ms(&placed.job, &placed.clusters, &waiting, &sites);
            actions.push(Action::Place {
                job: placed.job.clone(),
                clusters: placed.clusters.clone(),
                stage_ms,
                start_ms: placed.start_ms,
                slots: placed.slots.clone(),
            });
        }
        let room: Vec<String> = sites
            .iter()
            .map(|s| {
                let scavenged: u32 = s.scavenged.values().sum();
                format!("{} has {} free and {scavenged} scavenged", s.name, s.free)
            })
            .collect();
        for job in waiting {
            if placements.iter().any(|p| p.job == job.id) {
                continue;
            }
            let because = match room.is_empty() {
                true => "no cluster reports, or every one is excluded".to_owned(),
                false => format!(
                    "components of {:?} slots do not fit: {}",
                    job.components,
                    room.join("; ")
                ),
            };
            self.grid.unplaced_because(&job.id, because);
            if actions
                .iter()
                .all(|a| !matches!(a, Action::StepAside { .. }))
            {
                actions.extend(self.stop_for(&job, &rooms, now, config));
            }
            if let Some(reason) = self.grid.failed_try(&job.id, &config.grid) {
                actions.push(Action::Abort {
                    job: job.id,
                    reason,
                });
            }
        }
        actions
    }

    /// KOALA's FTT of a placement: the longest its clusters' stagings took
    /// on average, of those that must stage a component's inputs.
    pub(super) fn stage_ms(
        &self,
        job: &JobId,
        clusters: &[ClusterName],
        waiting: &[GridJob],
        sites: &[Site],
    ) -> u64 {
        let Some(job) = waiting.iter().find(|j| &j.id == job) else {
            return 0;
        };
        clusters
            .iter()
            .zip(&job.inputs)
            .filter_map(|(cluster, inputs)| {
                let site = sites.iter().find(|s| &s.name == cluster)?;
                let stages = inputs.iter().any(|i| !site.inputs.sees(i));
                stages.then_some(site.inputs.stage_s?)
            })
            .map(|s| (s * 1000.0) as u64)
            .max()
            .unwrap_or(0)
    }

    /// Running grid jobs of lower priority that `job`, which does not fit,
    /// stops (KOALA, with seed 003's rules); none while jobs stopped
    /// before are still stepping aside: their slots are on the way.
    pub(super) fn stop_for(
        &mut self,
        job: &GridJob,
        rooms: &[Site],
        now: Instant,
        config: &StateConfig,
    ) -> Vec<Action> {
        if self.grid.stepping_aside(now) {
            return Vec::new();
        }
        let Some(report) = self.grid.report_of(&job.id) else {
            return Vec::new();
        };
        let walltime = |r: &JobReport| {
            r.gathering
                .as_ref()
                .and_then(|g| g.walltime_s)
                .map(|s| (s * 1000.0) as u64)
        };
        let (priority, walltime_ms) = (report.priority, walltime(report));
        let running: Vec<Running> = self
            .grid
            .running()
            .filter_map(|r| {
                let running_s = r.gathering.as_ref()?.running_s?;
                let holds = self
                    .clusters
                    .iter()
                    .filter_map(|(name, c)| {
                        let held = c.report.grid.get(&r.job)?.total();
                        (held > 0).then(|| (name.clone(), held))
                    })
                    .collect();
                Some(Running {
                    id: r.job.clone(),
                    priority: r.priority,
                    elapsed_ms: (running_s * 1000.0) as u64,
                    walltime_ms: walltime(r),
                    holds,
                })
            })
            .collect();
        let victims = placement::to_stop(
            job,
            priority,
            walltime_ms,
            rooms,
            &running,
            config.grid.stop,
        );
        for victim in &victims {
            if let Some(r) = running.iter().find(|r| &r.id == victim) {
                tracing::info!(job = %job.id, victim = %victim, ran_s = r.elapsed_ms / 1000, walltime_s = ?r.walltime_ms.map(|w| w / 1000), "a running grid job of lower priority is to stop");
            }
        }
        victims
            .into_iter()
            .map(|victim| {
                self.grid.ask_aside(&victim, &job.id, now);
                Action::StepAside {
                    reason: format!(
                        "grid job {} of {} priority needs its slots",
                        job.id,
                        priority.name()
                    ),
                    job: victim,
                }
            })
            .collect()
    }

    /// Slots of a cluster free for a grid job's components: idle whatever
    /// the caps on scavenging, not promised by a grant or a placement, and
    /// not wanted by waiting local jobs.
    pub(super) fn free_slots(
        &self,
        name: &ClusterName,
        cluster: &ClusterEntry,
        now: Instant,
        config: &StateConfig,
    ) -> u32 {
        let granted: u32 = self
            .grants
            .values()
            .filter(|g| &g.cluster == name)
            .map(|g| g.slots)
            .sum();
        let idle = cluster.settled_idle(now, config);
        // The caps on scavenging leave out slots a rigid job may have.
        let uncapped = cluster.report.free_slots.map_or(idle, |free| {
            free.saturating_sub(cluster.report.idle_slots.saturating_sub(idle))
        });
        uncapped
            .saturating_sub(granted)
            .saturating_sub(self.grid.reserved(name))
            .saturating_sub(cluster.report.local_waiting_ahead())
    }

    pub(super) fn held(&self, cluster: &ClusterName, job: &JobId) -> u32 {
        self.clusters
            .get(cluster)
            .and_then(|c| c.report.jobs.get(job))
            .map_or(0, |h| h.total())
    }
}
