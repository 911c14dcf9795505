//! The batch system at one moment, as plain data: what a backend reads and
//! the kcm's core decides on (a simulator builds it by hand).

use std::collections::BTreeMap;

use gleaner_manifest::JobId;
use gleaner_policy::local::{HostLoad, WaitingJob};
use gleaner_protocol::{HostReport, naming::host_key};

/// Slot counts come from the batch system: added without overflowing.
fn saturating_sum(slots: impl IntoIterator<Item = u32>) -> u32 {
    slots.into_iter().fold(0, u32::saturating_add)
}

/// A gleaner placeholder in the batch system: one launcher, running or waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    /// The batch system's id (`4711.3`); the launcher's id is
    /// [`launcher_id`](gleaner_protocol::naming::launcher_id) of it.
    pub id: String,
    pub job: JobId,
    pub slots: u32,
    /// Where it runs; `None` while it waits.
    pub host: Option<String>,
}

impl Placeholder {
    pub fn running(&self) -> bool {
        self.host.is_some()
    }
}

/// A grid job's component in the batch system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentRun {
    /// The batch system's id.
    pub id: String,
    pub job: JobId,
    pub component: u32,
    pub slots: u32,
    pub running: bool,
}

/// One execution host of the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    /// Slots gleaner's queue has here (0 when the host takes no jobs).
    pub slots: u32,
    /// Slots running jobs that are not gleaner's.
    pub local: u32,
    /// Slots running grid job components.
    pub grid: u32,
}

impl Host {
    pub fn new(name: impl Into<String>, slots: u32) -> Self {
        Self {
            name: name.into(),
            slots,
            ..Self::default()
        }
    }
}

/// The cluster's state at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub hosts: Vec<Host>,
    /// Jobs that are not gleaner's, waiting for slots of this cluster.
    pub waiting: Vec<WaitingJob>,
    pub placeholders: Vec<Placeholder>,
    /// Grid job components, running or waiting.
    pub components: Vec<ComponentRun>,
    /// Something wrong in the batch system worth reporting (a queue in error).
    pub problem: Option<String>,
}

impl Snapshot {
    pub fn total_slots(&self) -> u32 {
        saturating_sum(self.hosts.iter().map(|h| h.slots))
    }

    /// Slots of the largest host: what a job kept on one host can have.
    pub fn largest_host(&self) -> u32 {
        self.hosts.iter().map(|h| h.slots).max().unwrap_or(0)
    }

    /// Slots running jobs that are not gleaner's.
    pub fn local_running(&self) -> u32 {
        saturating_sum(self.hosts.iter().map(|h| h.local))
    }

    /// Slots running grid job components.
    pub fn grid_running(&self) -> u32 {
        saturating_sum(self.hosts.iter().map(|h| h.grid))
    }

    /// Slots nobody uses or has claimed: pending placeholders and pending
    /// grid components claim theirs (else the slots a component waits for
    /// would be offered to sweeps again).
    pub fn idle_slots(&self) -> u32 {
        let claimed = saturating_sum(
            self.placeholders.iter().map(|p| p.slots).chain(
                self.components
                    .iter()
                    .filter(|c| !c.running)
                    .map(|c| c.slots),
            ),
        );
        self.total_slots().saturating_sub(saturating_sum([
            self.local_running(),
            self.grid_running(),
            claimed,
        ]))
    }

    /// Slots asked for by the waiting local jobs.
    pub fn local_waiting(&self) -> u32 {
        saturating_sum(self.waiting.iter().map(|w| w.slots))
    }

    /// Slots each job's running placeholders hold, per host (in the
    /// snapshot's host order), in one pass over the placeholders.
    fn held_per_host(&self) -> Vec<BTreeMap<JobId, u32>> {
        let index: BTreeMap<String, usize> = self
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (host_key(&h.name), i))
            .collect();
        let mut held = vec![BTreeMap::<JobId, u32>::new(); self.hosts.len()];
        for placeholder in &self.placeholders {
            let Some(&i) = placeholder
                .host
                .as_deref()
                .and_then(|h| index.get(&host_key(h)))
            else {
                continue;
            };
            let slots = held[i].entry(placeholder.job.clone()).or_default();
            *slots = slots.saturating_add(placeholder.slots);
        }
        held
    }

    /// Each host as the local policy sees it.
    pub fn host_loads(&self) -> Vec<HostLoad> {
        self.hosts
            .iter()
            .zip(self.held_per_host())
            .map(|(host, held)| {
                let busy = saturating_sum(
                    [host.local, host.grid]
                        .into_iter()
                        .chain(held.values().copied()),
                );
                HostLoad {
                    name: host.name.clone(),
                    slots: host.slots,
                    free: host.slots.saturating_sub(busy),
                    held,
                }
            })
            .collect()
    }

    /// What the scheduler and `gleaner status` hear of each host.
    pub fn host_reports(&self) -> Vec<HostReport> {
        self.hosts
            .iter()
            .zip(self.held_per_host())
            .map(|(host, held)| HostReport {
                name: host.name.clone(),
                slots: host.slots,
                local: host.local,
                grid: host.grid,
                scavenged: saturating_sum(held.values().copied()),
                jobs: held,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placeholder(id: &str, job: &str, slots: u32, host: Option<&str>) -> Placeholder {
        Placeholder {
            id: id.into(),
            job: job.parse().unwrap(),
            slots,
            host: host.map(str::to_owned),
        }
    }

    #[test]
    fn hosts_add_up_and_placeholders_count_where_they_run() {
        let snapshot = Snapshot {
            hosts: vec![
                Host {
                    local: 1,
                    ..Host::new("n1", 4)
                },
                Host {
                    grid: 2,
                    ..Host::new("n2", 4)
                },
            ],
            placeholders: vec![
                placeholder("1.1", "a-0000000000000000", 2, Some("n1.grid.example")),
                placeholder("1.2", "a-0000000000000000", 2, None),
                placeholder("2.1", "b-0000000000000000", 1, Some("n2")),
            ],
            ..Snapshot::default()
        };
        assert_eq!(snapshot.total_slots(), 8);
        assert_eq!(
            snapshot.idle_slots(),
            8 - 1 - 2 - 5,
            "pending ones claim theirs"
        );
        let waiting_component = Snapshot {
            placeholders: Vec::new(),
            components: vec![ComponentRun {
                id: "3".into(),
                job: "g-0000000000000000".parse().unwrap(),
                component: 0,
                slots: 3,
                running: false,
            }],
            ..snapshot.clone()
        };
        assert_eq!(
            waiting_component.idle_slots(),
            8 - 1 - 2 - 3,
            "so does a pending component"
        );
        let loads = snapshot.host_loads();
        assert_eq!((loads[0].free, loads[1].free), (1, 1));
        assert_eq!(loads[0].held.values().sum::<u32>(), 2);
        let reports = snapshot.host_reports();
        assert_eq!(
            (reports[0].scavenged, reports[1].scavenged, reports[1].grid),
            (2, 1, 2)
        );
    }
}
