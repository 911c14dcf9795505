//! Tables for `gleaner status`: one per thing shown.

use comfy_table::{Table, presets::NOTHING};

use gleaner_protocol::{ClusterView, JobReport};

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

/// Per cluster: where its slots are, and whether gleaner may use it.
pub fn clusters(clusters: &[ClusterView]) -> String {
    let rows = clusters.iter().map(|c| {
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
        vec![
            r.cluster.to_string(),
            r.backend.clone(),
            r.total_slots.to_string(),
            r.local_slots.to_string(),
            r.grid_slots.to_string(),
            scavenged.to_string(),
            r.idle_slots.to_string(),
            r.local_waiting.to_string(),
            state,
        ]
    });
    table(
        &[
            "CLUSTER",
            "BACKEND",
            "SLOTS",
            "LOCAL",
            "GRID",
            "SCAVENGED",
            "IDLE",
            "WAITING",
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
            format!("{:?}", j.state).to_lowercase(),
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
