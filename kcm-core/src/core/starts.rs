//! Placeholders that failed to start, or ended before their launcher spoke,
//! and GPUs found held outside gleaner.

use super::*;

impl KcmCore {
    /// A launcher of `job`'s could not claim its GPUs: `held.devices` of its
    /// host were claimed, though the batch system counted them free.
    /// Gleaner's launchers there hold what their placeholders asked for;
    /// claims beyond that are held outside gleaner (a user's process took
    /// them), and the placeholder's end is a failure of no one's: counted
    /// against its owner it would bar them, and with another victim's it
    /// would exclude the cluster, all for one squatter. Claims within
    /// gleaner's count are the cluster's miscount (its `gpus` against the
    /// batch system's), and the end counts as failed starts do. A task can
    /// send this: it is taken for its own job's placeholders only, whose
    /// launcher did not say it is up.
    pub(super) fn on_gpus_held(&mut self, job: JobId, held: GpusHeld, now: Now) {
        let Some(id) = naming::batch_id(&self.config.cluster, &held.launcher) else {
            warn!(launcher = %held.launcher, "a launcher of another cluster says its GPUs are held; ignored");
            return;
        };
        let placeholder = self.last.placeholders.iter().find(|p| p.id == id);
        let counted = self.starts.counted.get(id);
        let up = self.starts.heard.contains_key(id) || self.starts.credited.contains(id);
        if up || placeholder.is_some_and(|p| p.job != job) || counted.is_some_and(|c| c.job != job)
        {
            warn!(job = %job, launcher = %held.launcher, "GPUs said held for a placeholder that is not the job's, or whose launcher is up; ignored");
            return;
        }
        // Where the batch system ran it; the launcher's word only for one
        // the kcm has not seen run.
        let ran_on = placeholder
            .and_then(|p| p.host.clone())
            .or_else(|| counted.and_then(|c| c.host.clone()));
        let host = ran_on.clone().unwrap_or(held.host);
        let owner = placeholder
            .map(|p| p.owner.clone())
            .or_else(|| counted.map(|c| c.owner.clone()));
        let mut devices = held.devices;
        devices.sort();
        devices.dedup();
        let gleaners = self
            .last
            .placeholders
            .iter()
            .filter(|p| p.id != id && p.host.as_deref() == Some(host.as_str()))
            .fold(0, |sum: u32, p| sum.saturating_add(p.needs.gpus));
        let claimed = u32::try_from(devices.len()).unwrap_or(u32::MAX);
        let outside = claimed.saturating_sub(gleaners);
        let gpus = devices.join(",");
        if outside == 0 {
            warn!(job = %job, placeholder = id, owner = ?owner, host, gpus, gleaners, "a launcher found GPUs claimed that the batch system counted free, no more than gleaner's launchers there hold: the cluster's `gpus` and the batch system's count disagree");
            return;
        }
        warn!(job = %job, placeholder = id, owner = ?owner, host, gpus, outside, "GPUs of this host are held outside gleaner (`ss -xlp | grep gleaner-gpu` there, as root, says by whom): its launcher could not start, a failure of no one's");
        self.starts.excused.insert(id.to_owned(), now.instant);
        if let Some(counted) = self.starts.counted.remove(id) {
            self.starts.failures.forgive(&counted.owner);
            let about = format!("placeholder {id} ");
            if self
                .starts
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with(&about))
            {
                self.starts.error = None;
            }
        }
        // Shown, and not offered, where the batch system ran the
        // placeholder only: a task could send this, naming any host.
        if let Some(host) = ran_on.filter(|h| self.last.hosts.iter().any(|known| known.name == *h))
        {
            let at = now.instant;
            self.squats.insert(
                host,
                Squat {
                    devices,
                    outside,
                    at,
                },
            );
        }
    }

    /// Placeholders that left the batch system without their launcher ever
    /// reaching the broker, and not because this kcm removed them: the
    /// launcher cannot run there (a wrong path, a missing library, no
    /// route to the broker), so each is a failed start.
    pub(super) fn count_early_ends(&mut self, next: &Snapshot, now: Now) {
        if !self.adopted {
            // An earlier kcm's: their launchers told it.
            self.adopted = true;
            for placeholder in next.placeholders.iter().filter(|p| p.running()) {
                self.starts.heard.insert(
                    placeholder.id.clone(),
                    (placeholder.job.clone(), now.instant),
                );
            }
            return;
        }
        let still: BTreeSet<&str> = next.placeholders.iter().map(|p| p.id.as_str()).collect();
        let gone: Vec<Placeholder> = self
            .last
            .placeholders
            .iter()
            .filter(|p| !still.contains(p.id.as_str()))
            .cloned()
            .collect();
        for placeholder in gone {
            let heard = self
                .starts
                .heard
                .remove(&placeholder.id)
                .is_some_and(|(job, _)| job == placeholder.job);
            if self.withdrawn.remove(&placeholder.id) || heard {
                continue;
            }
            let host = placeholder.host.as_deref().unwrap_or("before it ran");
            if self.starts.excused.remove(&placeholder.id).is_some() {
                info!(job = %placeholder.job, placeholder = %placeholder.id, owner = %placeholder.owner, host, "placeholder ended: its GPUs were held outside gleaner, a failure of no one's");
                continue;
            }
            let failures = self.starts.failures.failed(&placeholder.owner, now.instant);
            self.starts.counted.insert(
                placeholder.id.clone(),
                Counted {
                    job: placeholder.job.clone(),
                    owner: placeholder.owner.clone(),
                    host: placeholder.host.clone(),
                    at: now.instant,
                },
            );
            error!(job = %placeholder.job, placeholder = %placeholder.id, owner = %placeholder.owner, host, failures, "placeholder ended before its launcher reached the broker");
            self.starts.error = Some(format!(
                "placeholder {} ({host}) ended before its launcher reached the broker; its output (log_dir) says why",
                placeholder.id
            ));
        }
        // Forgotten once gone from the batch system, components as well.
        self.withdrawn.retain(|id| {
            still.contains(id.as_str()) || next.components.iter().any(|c| &c.id == id)
        });
        // A launcher may speak before the kcm sees its placeholder; one
        // never seen at all is forgotten after a while.
        self.starts.heard.retain(|id, (_, at)| {
            still.contains(id.as_str()) || now.instant.saturating_duration_since(*at) < HEARD_KEPT
        });
        let recent = |at: &Instant| now.instant.saturating_duration_since(*at) < HEARD_KEPT;
        self.starts
            .excused
            .retain(|id, at| still.contains(id.as_str()) || recent(at));
        self.starts.counted.retain(|_, counted| recent(&counted.at));
        self.squats
            .retain(|_, squat| now.instant.saturating_duration_since(squat.at) < SQUAT_SHOWN);
    }
}
