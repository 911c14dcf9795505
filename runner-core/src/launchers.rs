//! The launchers working for one job, and which of them to give up first.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use gleaner_policy::preempt::{Candidate, VictimChoice};

use crate::JobSettings;
use gleaner_protocol::{
    ClusterName, LauncherId, LauncherInfo, LauncherStatus, RunningTask, naming::same_host,
};

#[derive(Debug, Clone)]
struct Entry {
    cluster: ClusterName,
    /// Empty until it says.
    host: String,
    slots: u32,
    running: Vec<RunningTask>,
    last_seen: Instant,
    /// Told to preempt or drain; no longer counted as capacity.
    leaving: bool,
    /// Asked to report after a silence; cleared by its next message.
    polled: bool,
    /// How often it said it reports, if it said.
    heartbeat: Option<Duration>,
}

impl Entry {
    fn silent_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_seen)
    }
}

/// Every launcher that announced itself and has not left.
#[derive(Debug, Default)]
pub struct LauncherTable {
    launchers: BTreeMap<LauncherId, Entry>,
    /// The longest heartbeat a launcher said it beats at, gone ones too.
    longest_heartbeat: Option<Duration>,
}

impl LauncherTable {
    pub fn up(&mut self, info: &LauncherInfo, now: Instant) {
        self.said_heartbeat(info.heartbeat_ms);
        self.launchers.insert(
            info.launcher.clone(),
            Entry {
                cluster: info.cluster.clone(),
                host: info.host.clone(),
                slots: info.slots,
                running: Vec::new(),
                last_seen: now,
                leaving: false,
                polled: false,
                heartbeat: info.heartbeat_ms.map(Duration::from_millis),
            },
        );
    }

    /// A heartbeat. A launcher we missed the announcement of (the runner
    /// restarted) is adopted from it.
    pub fn status(&mut self, status: LauncherStatus, now: Instant) {
        self.said_heartbeat(status.heartbeat_ms);
        let entry = self
            .launchers
            .entry(status.launcher)
            .or_insert_with(|| Entry {
                cluster: status.cluster,
                host: String::new(),
                slots: 1,
                running: Vec::new(),
                last_seen: now,
                leaving: false,
                polled: false,
                heartbeat: None,
            });
        if let Some(ms) = status.heartbeat_ms {
            entry.heartbeat = Some(Duration::from_millis(ms));
        }
        if !status.host.is_empty() {
            entry.host = status.host;
        }
        entry.slots = entry.slots.max(status.running.len() as u32);
        entry.running = status.running;
        entry.last_seen = now;
        entry.polled = false;
    }

    fn said_heartbeat(&mut self, ms: Option<u64>) {
        let said = ms.map(Duration::from_millis);
        self.longest_heartbeat = self.longest_heartbeat.max(said);
    }

    /// The longest heartbeat a launcher of the job said it beats at: the
    /// slowest to be noticed dead.
    pub fn longest_heartbeat(&self) -> Option<Duration> {
        self.longest_heartbeat
    }

    /// Forgets a launcher; whether it was here.
    pub fn gone(&mut self, launcher: &LauncherId) -> bool {
        self.launchers.remove(launcher).is_some()
    }

    /// Forgets launchers silent for longer than three of their heartbeats
    /// and a margin (`heartbeat` for those that did not say theirs): they
    /// died; the broker already gave their tasks to others. Returns their ids.
    pub fn expire(
        &mut self,
        now: Instant,
        heartbeat: Duration,
    ) -> BTreeMap<ClusterName, Vec<LauncherId>> {
        let mut dead: BTreeMap<ClusterName, Vec<LauncherId>> = BTreeMap::new();
        self.launchers.retain(|id, e| {
            let silence = JobSettings::silence_after(e.heartbeat.unwrap_or(heartbeat));
            let silent = e.silent_for(now) > silence;
            if silent {
                dead.entry(e.cluster.clone()).or_default().push(id.clone());
            }
            !silent
        });
        dead
    }

    /// Launchers that missed two of their heartbeats (`heartbeat` for
    /// those that did not say theirs) and were not asked yet: they are
    /// asked now (and marked so).
    pub fn poll_silent(&mut self, now: Instant, heartbeat: Duration) -> Vec<LauncherId> {
        self.launchers
            .iter_mut()
            .filter(|(_, e)| {
                !e.polled && e.silent_for(now) > e.heartbeat.unwrap_or(heartbeat).saturating_mul(2)
            })
            .map(|(id, e)| {
                e.polled = true;
                id.clone()
            })
            .collect()
    }

    /// Slots per cluster of launchers that are staying.
    pub fn slots_by_cluster(&self) -> BTreeMap<ClusterName, u32> {
        let mut slots = BTreeMap::new();
        for entry in self.launchers.values().filter(|e| !e.leaving) {
            let total = slots.entry(entry.cluster.clone()).or_default();
            *total = entry.slots.saturating_add(*total);
        }
        slots
    }

    pub fn total_slots(&self) -> u32 {
        self.slots_by_cluster()
            .values()
            .fold(0, |all, slots| all.saturating_add(*slots))
    }

    /// The launchers that may run `task`: the one that last said it runs
    /// it, or, when none did (it started since their last reports), every
    /// one not leaving.
    pub fn may_run(&self, task: u64) -> Vec<LauncherId> {
        let running = self
            .launchers
            .iter()
            .find(|(_, e)| e.running.iter().any(|r| r.task == task));
        match running {
            Some((id, _)) => vec![id.clone()],
            None => self
                .launchers
                .iter()
                .filter(|(_, e)| !e.leaving)
                .map(|(id, _)| id.clone())
                .collect(),
        }
    }

    /// Tasks running on all launchers, as last reported.
    pub fn running_tasks(&self) -> u64 {
        self.launchers
            .values()
            .map(|e| e.running.len() as u64)
            .sum()
    }

    pub fn clusters(&self) -> impl Iterator<Item = &ClusterName> {
        self.launchers.values().map(|e| &e.cluster)
    }

    /// Picks launchers on `cluster` (on `hosts`, unless empty) to free
    /// `slots` slots and marks them leaving. Returns them and the slots
    /// they free: fewer than asked when the launchers there have not all
    /// announced themselves yet, more when a multi-slot launcher goes whole.
    /// `now_ms` is the wall clock the tasks' starts are measured against;
    /// under gleaner's `choice`, launchers running a task preempted
    /// `max_preemptions` times go last.
    pub fn pick_victims(
        &mut self,
        cluster: &ClusterName,
        slots: u32,
        hosts: &[String],
        now_ms: u64,
        max_preemptions: u32,
        choice: VictimChoice,
    ) -> (Vec<LauncherId>, u32) {
        let on_hosts = |e: &Entry| hosts.is_empty() || hosts.iter().any(|h| same_host(h, &e.host));
        let candidates = self
            .launchers
            .iter()
            .filter(|(_, e)| &e.cluster == cluster && !e.leaving && on_hosts(e))
            .map(|(id, e)| Candidate {
                launcher: id.clone(),
                slots: e.slots,
                work_ms: (!e.running.is_empty()).then(|| {
                    e.running
                        .iter()
                        .map(|t| now_ms.saturating_sub(t.started_at))
                        .sum()
                }),
                preempted: e.running.iter().map(|t| t.preemptions).max().unwrap_or(0),
            })
            .collect();
        let victims = choice.choose(candidates, slots, max_preemptions);
        let mut freed = 0;
        for id in &victims {
            if let Some(entry) = self.launchers.get_mut(id) {
                entry.leaving = true;
                freed = entry.slots.saturating_add(freed);
            }
        }
        (victims, freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_tracks_capacity_and_expires_the_silent() {
        let start = Instant::now();
        let mut table = LauncherTable::default();
        // d says it beats every minute; the others go by the default.
        for (id, cluster, beat) in [
            ("a", "c1", None),
            ("b", "c1", None),
            ("c", "c2", None),
            ("d", "c2", Some(60_000)),
        ] {
            let info = LauncherInfo {
                launcher: id.into(),
                cluster: cluster.into(),
                host: "h".into(),
                slots: 1,
                started_at: 0,
                deadline: None,
                heartbeat_ms: beat,
            };
            table.up(&info, start);
        }
        table.status(
            LauncherStatus {
                launcher: "a".into(),
                cluster: "c1".into(),
                host: "h".into(),
                running: vec![RunningTask {
                    task: 7,
                    started_at: 10,
                    preemptions: 0,
                }],
                completed: 0,
                heartbeat_ms: None,
            },
            start + Duration::from_secs(20),
        );
        assert_eq!(table.running_tasks(), 1);
        assert_eq!(
            table.pick_victims(&"c1".into(), 1, &[], 20_000, 3, VictimChoice::LeastLoss),
            (vec![LauncherId::from("b")], 1),
            "idle b goes before busy a"
        );
        assert_eq!(table.slots_by_cluster()["c1"], 1, "b is leaving");
        let later = start + Duration::from_secs(25);
        assert_eq!(
            table.poll_silent(later, Duration::from_secs(6)),
            ["b", "c"].map(LauncherId::from)
        );
        assert!(
            table.poll_silent(later, Duration::from_secs(6)).is_empty(),
            "asked once"
        );
        let dead = table.expire(later, Duration::from_secs(5));
        let dead: Vec<(String, Vec<LauncherId>)> = dead
            .into_iter()
            .map(|(cluster, launchers)| (cluster.to_string(), launchers))
            .collect();
        assert_eq!(
            dead,
            [
                ("c1".to_owned(), vec![LauncherId::from("b")]),
                ("c2".to_owned(), vec![LauncherId::from("c")])
            ],
            "by cluster, for their kcms; d is judged by its own beat"
        );
        assert_eq!(table.total_slots(), 2, "a and d");
        let much_later = start + Duration::from_secs(130);
        assert_eq!(
            table.poll_silent(much_later, Duration::from_secs(5)),
            ["a", "d"].map(LauncherId::from),
            "d asked once it missed two of its beats"
        );
    }
}
