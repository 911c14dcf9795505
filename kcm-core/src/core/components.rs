//! Co-allocated components: submitting them, telling them to start,
//! preempting and withdrawing them, and judging how each ended from the
//! spool.

use super::*;

impl KcmCore {
    /// Submits a component, with no spool entry left from an earlier run.
    pub(super) fn submit_component(
        &self,
        spec: ComponentSpec,
        account: Option<String>,
    ) -> Vec<Effect> {
        vec![
            // Left over from an earlier run of the same component.
            Effect::DeleteSpoolEntry {
                job: spec.job.clone(),
                component: spec.component,
            },
            Effect::SubmitComponent {
                one_host: component_on_one_host(spec.slots, self.last.largest_host()),
                spec,
                account,
            },
            Effect::PollNow,
        ]
    }

    pub(super) fn on_component_submitted(
        &mut self,
        spec: ComponentSpec,
        result: Result<(), BackendError>,
        now: Now,
    ) -> Vec<Effect> {
        let cluster = &self.config.cluster;
        match result {
            Ok(()) => {
                info!(job = %spec.job, component = spec.component, slots = spec.slots, "grid component submitted");
                self.components.insert(
                    (spec.job.clone(), spec.component),
                    TrackedComponent {
                        since: now.instant,
                        seen: false,
                        start_told: false,
                        owner: None,
                        walltime: spec.walltime_ms.map(Duration::from_millis),
                        judged: false,
                    },
                );
                // Its job withdraws a component it moved here from where it
                // waited only once it hears this.
                vec![Effect::Tell {
                    job: spec.job,
                    message: ControlMsg::ComponentQueued {
                        component: spec.component,
                        cluster: cluster.clone(),
                    },
                }]
            }
            Err(e) => {
                error!(job = %spec.job, component = spec.component, error = %e, "cannot submit a grid component");
                self.errors.command = Some(e.to_string());
                vec![Self::unstarted(spec, cluster, &e)]
            }
        }
    }

    /// Tells a job that its component ended before it started, and why.
    pub(super) fn unstarted(
        spec: ComponentSpec,
        cluster: &ClusterName,
        error: &BackendError,
    ) -> Effect {
        let outcome = ComponentOutcome {
            component: spec.component,
            cluster: cluster.clone(),
            exit_code: None,
            runtime_ms: 0,
            stdout: Captured::default(),
            stderr: Captured {
                data: error.to_string().into_bytes(),
                dropped: 0,
            },
            preempted: false,
        };
        Effect::Tell {
            job: spec.job,
            message: ControlMsg::ComponentEnded(outcome),
        }
    }

    /// The components that left the batch system, to be reported to their
    /// jobs: those with an exit status in the spool, and those that vanished
    /// without one.
    pub(super) fn settle_components(&mut self, spooled: &[SpooledExit], now: Now) -> Vec<Effect> {
        for run in &self.last.components {
            let tracked = self
                .components
                .entry((run.job.clone(), run.component))
                .or_insert(TrackedComponent {
                    since: now.instant,
                    seen: true,
                    start_told: false,
                    owner: None,
                    walltime: None,
                    judged: false,
                });
            tracked.seen = true;
            tracked.owner = Some(run.owner.clone());
        }
        let in_batch = |job: &JobId, component: u32| {
            self.last
                .components
                .iter()
                .any(|r| &r.job == job && r.component == component)
        };
        let mut ended: BTreeSet<(JobId, u32)> = spooled
            .iter()
            .filter(|exit| !in_batch(&exit.job, exit.component))
            .map(|exit| (exit.job.clone(), exit.component))
            .collect();
        ended.extend(
            self.components
                .iter()
                .filter(|((job, component), tracked)| {
                    !in_batch(job, *component)
                        && (tracked.seen
                            || now.instant.saturating_duration_since(tracked.since)
                                > COMPONENT_VANISHED)
                })
                .map(|(key, _)| key.clone()),
        );
        ended
            .into_iter()
            .map(|(job, component)| {
                let spooled = spooled
                    .iter()
                    .find(|exit| exit.job == job && exit.component == component);
                let exit_code = spooled.and_then(|exit| exit.exit_code);
                let preempted = spooled.is_some_and(|exit| exit.preempted);
                let runtime = self
                    .components
                    .get(&(job.clone(), component))
                    .map_or(Duration::ZERO, |t| {
                        now.instant.saturating_duration_since(t.since)
                    });
                info!(job = %job, component, exit_code = ?exit_code, preempted, "grid component ended");
                if !preempted {
                    self.judge_component_end(&job, component, exit_code, runtime, now);
                }
                let outcome = ComponentOutcome {
                    component,
                    cluster: self.config.cluster.clone(),
                    exit_code,
                    runtime_ms: runtime.as_millis() as u64,
                    stdout: Captured::default(),
                    stderr: Captured::default(),
                    preempted,
                };
                Effect::ReportComponentEnd { job, outcome }
            })
            .collect()
    }

    /// A component that ran and vanished without an exit status before its
    /// walltime was killed under it (its host lost, the batch system's
    /// doing): a failure of the cluster's, counted as failed starts are
    /// (by account); one that exited ran well, whatever its code.
    pub(super) fn judge_component_end(
        &mut self,
        job: &JobId,
        component: u32,
        exit_code: Option<i32>,
        runtime: Duration,
        now: Now,
    ) {
        let Some(tracked) = self
            .components
            .get_mut(&(job.clone(), component))
            .filter(|t| !t.judged && t.seen)
        else {
            return;
        };
        tracked.judged = true;
        let owner = tracked.owner.clone().unwrap_or_default();
        let at_walltime = tracked
            .walltime
            .is_some_and(|w| runtime + WALLTIME_MARGIN >= w);
        match exit_code {
            Some(_) => self.starts.failures.started(Some(&owner)),
            None if at_walltime => {}
            None => {
                let failures = self.starts.failures.failed(&owner, now.instant);
                error!(job = %job, component, owner, failures, "grid component vanished without an exit status before its walltime: its host was lost, or the batch system killed it");
                self.starts.error = Some(format!(
                    "grid component {component} of {job} vanished without an exit status (host lost, or killed by the batch system)"
                ));
            }
        }
    }

    /// Whether a started file of this component is news: the component is
    /// this kcm's and its job has not heard it started. The shell reads
    /// no other, so an owner's made-up files cost it nothing.
    pub fn expects_start(&self, job: &JobId, component: u32) -> bool {
        self.components
            .get(&(job.clone(), component))
            .is_some_and(|t| !t.start_told)
    }

    /// Components that started since the last poll, told to their jobs
    /// once (again after a kcm restart: the runner takes a start once).
    pub(super) fn tell_starts(&mut self, started: &[SpooledStart]) -> Vec<Effect> {
        let cluster = &self.config.cluster;
        let mut effects = Vec::new();
        for start in started {
            let Some(tracked) = self
                .components
                .get_mut(&(start.job.clone(), start.component))
                .filter(|t| !t.start_told)
            else {
                continue;
            };
            tracked.start_told = true;
            let hosts = match &start.hosts {
                Ok(hosts) => hosts.clone(),
                Err(e) => {
                    warn!(job = %start.job, component = start.component, error = %e, "a started grid component's hosts cannot be read; its job hears of none");
                    Vec::new()
                }
            };
            info!(job = %start.job, component = start.component, hosts = hosts.len(), "grid component started; waiting at its barrier");
            effects.push(Effect::Tell {
                job: start.job.clone(),
                message: ControlMsg::ComponentStarted {
                    component: start.component,
                    cluster: cluster.clone(),
                    hosts,
                },
            });
        }
        effects
    }

    /// Every component of `job` started: `component`'s command may run,
    /// its ranks after those of the components before it.
    pub(super) fn release(
        &self,
        job: JobId,
        component: u32,
        hosts: &[Vec<HostSlots>],
    ) -> Vec<Effect> {
        let slots = |hosts: &[HostSlots]| {
            hosts
                .iter()
                .map(|h| h.slots)
                .fold(0u32, u32::saturating_add)
        };
        let Some(before) = hosts.get(..component as usize) else {
            warn!(job = %job, component, "a go for a component its job does not have; ignored");
            return Vec::new();
        };
        let rank = before.iter().map(|h| slots(h)).fold(0, u32::saturating_add);
        let ranks = hosts.iter().map(|h| slots(h)).fold(0, u32::saturating_add);
        info!(job = %job, component, rank, ranks, "grid component passes its barrier");
        vec![Effect::ReleaseComponent {
            job,
            component,
            go: barrier::go_text(rank, ranks, hosts.len() as u32),
            hosts: barrier::hosts_text(hosts),
        }]
    }

    /// Stops the job's components here for a job of higher priority: each
    /// one's wrapper signals its command, and kills it after the grace.
    pub(super) fn preempt_components(
        &mut self,
        job: JobId,
        signal: &str,
        grace_ms: u64,
    ) -> Vec<Effect> {
        let Some(number) = gleaner_manifest::preempt_signal_number(signal) else {
            warn!(job = %job, signal, "a stop with a signal no manifest may name; ignored");
            return Vec::new();
        };
        let grace = grace_ms.div_ceil(1000).min(MAX_PREEMPT_GRACE.as_secs());
        self.components
            .keys()
            .filter(|(j, _)| *j == job)
            .map(|(job, component)| {
                info!(job = %job, component, signal, grace_s = grace, "stopping a grid component for a job of higher priority");
                Effect::StopComponent {
                    job: job.clone(),
                    component: *component,
                    stop: format!("{number} {grace}\n"),
                }
            })
            .collect()
    }

    /// Removes one component, wherever it is, without telling its job:
    /// the job places it again.
    pub(super) fn withdraw_component(&mut self, job: JobId, component: u32) -> Vec<Effect> {
        let ids: Vec<String> = self
            .last
            .components
            .iter()
            .filter(|c| c.job == job && c.component == component)
            .map(|c| c.id.clone())
            .collect();
        info!(job = %job, component, batch_ids = ?ids, "grid component withdrawn by its job, to be placed again");
        self.components.remove(&(job.clone(), component));
        self.last
            .components
            .retain(|c| !(c.job == job && c.component == component));
        let mut effects = vec![Effect::DeleteSpoolEntry { job, component }];
        if !ids.is_empty() {
            effects.push(Effect::Remove { ids });
        }
        effects
    }
}
