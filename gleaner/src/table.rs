//! Tables for `gleaner status`: one per thing shown.

use std::time::Duration;

use comfy_table::{Table, presets::NOTHING};

use gleaner_manifest::Memory;
use gleaner_protocol::{ClusterView, GridPlacement, HostReport, JobReport};

/// Borderless columns, as terminals and `grep` like them.
fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header(header.to_vec());
    for row in rows {
        table.add_row(row);
    }
    let text: Vec<String> = table
        .to_string()
        .lines()
        .map(|line| line.trim().to_owned())
        .collect();
    text.join("\n") + "\n"
}

/// One cluster's row: where its slots are, and whether gleaner may use it.
pub fn cluster_row(c: &ClusterView) -> Vec<String> {
    let r = &c.report;
    let scavenged = r
        .jobs
        .values()
        .fold(0u32, |sum, h| sum.saturating_add(h.total()));
    let state = if c.stale {
        "no recent report".to_owned()
    } else if c.excluded {
        format!("excluded ({} failed starts)", r.failed_starts)
    } else {
        r.error
            .as_ref()
            .map_or_else(|| "ok".to_owned(), |e| format!("error: {e}"))
    };
    let state = match squatted(&r.hosts) {
        Some(squatted) => format!("{state}; {squatted}"),
        None => state,
    };
    vec![
        r.cluster.to_string(),
        r.backend.clone(),
        r.total_slots.to_string(),
        r.local_slots.to_string(),
        r.grid_slots.to_string(),
        scavenged.to_string(),
        r.idle_slots.to_string(),
        r.local_waiting.to_string(),
        memory(r.free_memory_mb),
        counted(r.free_gpus),
        state,
    ]
}

/// The GPUs a cluster's launchers found held outside gleaner, host by
/// host: the admin's to look into, nobody's failure.
fn squatted(hosts: &[HostReport]) -> Option<String> {
    let held: Vec<String> = hosts
        .iter()
        .filter(|h| !h.squatted_gpus.is_empty())
        .map(|h| format!("{}:{}", h.name, h.squatted_gpus.join(",")))
        .collect();
    (!held.is_empty()).then(|| format!("GPUs held outside gleaner {}", held.join(" ")))
}

/// Memory as manifests write it; `-` where it is not counted.
fn memory(mb: Option<u64>) -> String {
    mb.map_or_else(|| "-".to_owned(), |mb| Memory(mb).to_string())
}

/// A count; `-` where it is not counted.
fn counted(n: Option<u32>) -> String {
    n.map_or_else(|| "-".to_owned(), |n| n.to_string())
}

/// The columns of [`cluster_row`].
pub const CLUSTER_COLUMNS: [&str; 11] = [
    "CLUSTER",
    "BACKEND",
    "SLOTS",
    "LOCAL",
    "GRID",
    "SCAVENGED",
    "IDLE",
    "WAITING",
    "FREE MEM",
    "FREE GPUS",
    "STATE",
];

/// Per cluster: where its slots are, and whether gleaner may use it.
pub fn clusters(clusters: &[ClusterView]) -> String {
    table(&CLUSTER_COLUMNS, clusters.iter().map(cluster_row))
}

/// What a host is doing, as `gleaner status` counts hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostState {
    /// Takes no jobs now (down, disabled, in error).
    Closed,
    /// Every slot runs local jobs or grid components.
    Full,
    /// Some slots run launchers.
    Scavenged,
    /// Nothing runs.
    Idle,
    /// Local work on part of it, the rest free.
    Partly,
}

fn host_state(host: &HostReport) -> HostState {
    if host.slots == 0 {
        HostState::Closed
    } else if host.local.saturating_add(host.grid) >= host.slots {
        HostState::Full
    } else if host.scavenged > 0 {
        HostState::Scavenged
    } else if host.free() == host.slots {
        HostState::Idle
    } else {
        HostState::Partly
    }
}

/// Per cluster: how many hosts are full of local work, scavenged, idle.
pub fn hosts(clusters: &[ClusterView]) -> String {
    let rows = clusters.iter().map(|c| {
        let hosts = &c.report.hosts;
        let count = |state| {
            hosts
                .iter()
                .filter(|h| host_state(h) == state)
                .count()
                .to_string()
        };
        vec![
            c.report.cluster.to_string(),
            hosts.len().to_string(),
            count(HostState::Full),
            count(HostState::Partly),
            count(HostState::Scavenged),
            count(HostState::Idle),
            count(HostState::Closed),
        ]
    });
    table(
        &[
            "CLUSTER",
            "HOSTS",
            "FULL OF LOCAL WORK",
            "PARTLY LOCAL",
            "SCAVENGED",
            "IDLE",
            "CLOSED",
        ],
        rows,
    )
}

/// Every execution host of every cluster.
pub fn each_host(clusters: &[ClusterView]) -> String {
    let rows = clusters.iter().flat_map(|c| {
        c.report.hosts.iter().map(|h| {
            let state = match host_state(h) {
                HostState::Closed => "closed",
                HostState::Full => "full of local work",
                HostState::Scavenged => "scavenged",
                HostState::Idle => "idle",
                HostState::Partly => "partly local",
            };
            vec![
                c.report.cluster.to_string(),
                h.name.clone(),
                h.slots.to_string(),
                h.local.to_string(),
                h.grid.to_string(),
                h.scavenged.to_string(),
                h.free().to_string(),
                memory(h.free_memory_mb),
                counted(h.free_gpus),
                counted((h.scavenged_needs.gpus > 0).then_some(h.scavenged_needs.gpus)),
                state.to_owned(),
            ]
        })
    });
    table(
        &[
            "CLUSTER",
            "HOST",
            "SLOTS",
            "LOCAL",
            "GRID",
            "SCAVENGED",
            "FREE",
            "FREE MEM",
            "FREE GPUS",
            "SCAVENGED GPUS",
            "STATE",
        ],
        rows,
    )
}

/// Per job: how far it is, where it runs, how fast.
pub fn jobs(jobs: &[JobReport]) -> String {
    let rows = jobs.iter().map(|j| {
        let t = &j.tasks;
        let launchers = j
            .launchers
            .iter()
            .map(|(c, n)| format!("{c}:{n}"))
            .collect::<Vec<_>>()
            .join(",");
        vec![
            j.job.to_string(),
            state(j),
            format!("{}/{}", t.finished(), t.total),
            t.running.to_string(),
            t.pending.to_string(),
            (t.failed + t.timed_out + t.lost).to_string(),
            if launchers.is_empty() {
                "-".to_owned()
            } else {
                launchers
            },
            format!("{:.1}", j.throughput),
            j.preemptions.to_string(),
        ]
    });
    table(
        &[
            "JOB",
            "STATE",
            "DONE",
            "RUNNING",
            "PENDING",
            "FAILED",
            "LAUNCHERS",
            "TASKS/S",
            "PREEMPTIONS",
        ],
        rows,
    )
}

/// A job's state, with what else says where it is: open to more tasks, or
/// components waiting at the start barrier.
pub fn state(j: &JobReport) -> String {
    let state = format!("{:?}", j.state).to_lowercase();
    let at_barrier = j.gathering.as_ref().map_or(0, |g| g.at_barrier);
    match (j.open, at_barrier) {
        (true, _) => format!("{state}, open"),
        (false, 0) => state,
        (false, n) => format!("barrier {n}/{}", j.tasks.total),
    }
}

/// How a grid job gathered its components, in a line (`None` for a sweep).
pub fn gathering(j: &JobReport) -> Option<String> {
    let g = j.gathering.as_ref()?;
    let mut parts = Vec::new();
    if g.at_barrier > 0 {
        parts.push(format!(
            "{} of {} components waiting at the barrier",
            g.at_barrier, j.tasks.total
        ));
    }
    if let Some(s) = g.placement_s {
        parts.push(format!("placed after {s:.1}s"));
    }
    parts.push(match g.claiming_tries {
        1 => "1 claiming try".to_owned(),
        n => format!("{n} claiming tries"),
    });
    match g.moves {
        0 => {}
        1 => parts.push("moved 1 time to complete earlier".to_owned()),
        n => parts.push(format!("moved {n} times to complete earlier")),
    }
    if let (Some(delay), Some(barrier)) = (g.start_delay_s, g.barrier_s) {
        parts.push(format!(
            "started {delay:.1}s after placement, {barrier:.1}s at the barrier"
        ));
    }
    Some(format!("{}: {}", j.job, parts.join("; ")))
}

/// A grid job not placed yet, in a line.
pub fn placement(p: &GridPlacement) -> String {
    let tries = match p.tries {
        1 => "1 try".to_owned(),
        n => format!("{n} tries"),
    };
    let placed = p.placed_ms_ago.map_or(String::new(), |ms| {
        format!(
            "; placed {} ago, waiting for its clusters",
            humantime::format_duration(Duration::from_secs(ms / 1000))
        )
    });
    let because = p
        .unplaced_because
        .as_ref()
        .filter(|_| p.placed_ms_ago.is_none())
        .map_or(String::new(), |why| format!(": {why}"));
    format!(
        "{}: not placed after {tries}, in the {} queue{placed}{because}",
        p.job,
        p.queue.name()
    )
}

/// Index lines of `gleaner results`.
pub fn results(entries: &[serde_json::Value]) -> String {
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let rows = entries.iter().map(|e| {
        vec![
            text(&e["task"]),
            text(&e["status"]).replace('_', " "),
            text(&e["exit_code"]),
            text(&e["attempts"]),
            e["runtime_s"]
                .as_f64()
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.1}")),
            text(&e["host"]),
            text(&e["command"]),
        ]
    });
    table(
        &[
            "TASK",
            "STATUS",
            "EXIT",
            "ATTEMPTS",
            "RUNTIME_S",
            "HOST",
            "COMMAND",
        ],
        rows,
    )
}

#[cfg(test)]
mod tests {
    use gleaner_protocol::ClusterReport;

    use super::*;

    fn host(name: &str, slots: u32, local: u32, grid: u32, scavenged: u32) -> HostReport {
        HostReport {
            name: name.into(),
            slots,
            local,
            grid,
            scavenged,
            ..HostReport::default()
        }
    }

    #[test]
    fn a_placement_says_how_long_the_job_has_tried() {
        let mut waiting = GridPlacement {
            job: "rigid-0a1b2c3d4e5f6071".parse().unwrap(),
            queue: gleaner_manifest::Priority::High,
            tries: 1,
            placed_ms_ago: None,
            unplaced_because: None,
        };
        assert_eq!(
            placement(&waiting),
            "rigid-0a1b2c3d4e5f6071: not placed after 1 try, in the high queue"
        );
        waiting.tries = 31;
        waiting.placed_ms_ago = Some(12_400);
        assert_eq!(
            placement(&waiting),
            "rigid-0a1b2c3d4e5f6071: not placed after 31 tries, in the high queue; placed 12s ago, waiting for its clusters"
        );
    }

    #[test]
    fn a_grid_job_says_how_it_gathers() {
        let mut job: JobReport = serde_json::from_value(serde_json::json!({
            "job": "mpi-0a1b2c3d4e5f6071", "kind": "grid", "priority": "high",
            "state": "running", "runner": "r",
            "tasks": {"total": 3, "pending": 0, "running": 3, "succeeded": 0, "failed": 0,
                      "timed_out": 0, "lost": 0, "cancelled": 0},
            "launchers": {}, "throughput": 0.0, "preemptions": 0, "started_at": 0,
            "results": "/r",
            "gathering": {"at_barrier": 2, "claiming_tries": 1, "placement_s": 0.84}
        }))
        .unwrap();
        assert_eq!(state(&job), "barrier 2/3");
        assert_eq!(
            gathering(&job).unwrap(),
            "mpi-0a1b2c3d4e5f6071: 2 of 3 components waiting at the barrier; placed after 0.8s; 1 claiming try"
        );
        job.gathering = Some(gleaner_protocol::Gathering {
            at_barrier: 0,
            claiming_tries: 2,
            placement_s: Some(0.84),
            barrier_s: Some(10.04),
            start_delay_s: Some(10.5),
            ..Default::default()
        });
        assert_eq!(state(&job), "running");
        assert_eq!(
            gathering(&job).unwrap(),
            "mpi-0a1b2c3d4e5f6071: placed after 0.8s; 2 claiming tries; started 10.5s after placement, 10.0s at the barrier"
        );
        job.gathering = None;
        assert_eq!(gathering(&job), None);
    }

    #[test]
    fn hosts_are_counted_by_what_they_do() {
        let hosts = vec![
            host("n1", 4, 3, 1, 0),
            host("n2", 4, 1, 0, 0),
            host("n3", 4, 1, 0, 2),
            host("n4", 4, 0, 0, 0),
            host("n5", 0, 0, 0, 0),
        ];
        let states: Vec<HostState> = hosts.iter().map(host_state).collect();
        assert_eq!(
            states,
            [
                HostState::Full,
                HostState::Partly,
                HostState::Scavenged,
                HostState::Idle,
                HostState::Closed
            ]
        );
        let view = ClusterView {
            report: ClusterReport {
                cluster: "c1".into(),
                hosts,
                ..ClusterReport::default()
            },
            ..ClusterView::default()
        };
        let summary = super::hosts(std::slice::from_ref(&view));
        let row: Vec<&str> = summary.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row, ["c1", "5", "1", "1", "1", "1", "1"]);
        let each = each_host(&[view]);
        assert!(each.contains("n3") && each.contains("scavenged"), "{each}");
    }

    #[test]
    fn memory_and_gpus_show_where_they_are_counted() {
        let mut gpu_host = host("g1", 4, 0, 0, 2);
        gpu_host.free_memory_mb = Some(6144);
        gpu_host.free_gpus = Some(1);
        gpu_host.scavenged_needs.gpus = 1;
        let view = ClusterView {
            report: ClusterReport {
                cluster: "c1".into(),
                free_memory_mb: Some(6144),
                free_gpus: Some(1),
                hosts: vec![gpu_host, host("n1", 4, 0, 0, 0)],
                ..ClusterReport::default()
            },
            ..ClusterView::default()
        };
        let each = each_host(std::slice::from_ref(&view));
        let rows: Vec<Vec<&str>> = each
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[0][7..10], ["6G", "1", "1"], "{each}");
        assert_eq!(rows[1][7..10], ["-", "-", "-"], "{each}");
        let clusters = clusters(&[view]);
        assert!(
            clusters.contains("FREE GPUS") && clusters.contains("6G"),
            "{clusters}"
        );
    }

    #[test]
    fn gpus_held_outside_gleaner_are_shown_with_their_hosts() {
        let mut squatted = host("g1", 4, 0, 0, 0);
        squatted.squatted_gpus = vec!["0".into(), "1".into()];
        let view = ClusterView {
            report: ClusterReport {
                cluster: "c1".into(),
                hosts: vec![host("g0", 4, 0, 0, 0), squatted],
                ..ClusterReport::default()
            },
            ..ClusterView::default()
        };
        let row = cluster_row(&view);
        assert_eq!(
            row.last().map(String::as_str),
            Some("ok; GPUs held outside gleaner g1:0,1")
        );
    }
}
