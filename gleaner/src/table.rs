//! `gleaner status` as text tables.

use std::fmt::Write;

use gleaner_protocol::StatusReply;

/// Left-aligned columns, two spaces apart.
fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

pub fn status(reply: &StatusReply, with_clusters: bool) -> String {
    let mut out = String::new();
    if with_clusters {
        let _ = writeln!(out, "scheduler {} ({})\n", reply.scheduler, reply.policy);
        let rows: Vec<Vec<String>> = reply
            .clusters
            .iter()
            .map(|c| {
                let r = &c.report;
                let scavenged: u32 = r.jobs.values().map(|h| h.total()).sum();
                let state = if c.stale {
                    "no recent report".to_owned()
                } else if c.excluded {
                    format!("excluded ({} failed starts)", r.failed_starts)
                } else {
                    r.error
                        .clone()
                        .map_or_else(|| "ok".to_owned(), |e| format!("error: {e}"))
                };
                vec![
                    r.cluster.clone(),
                    r.backend.clone(),
                    r.total_slots.to_string(),
                    r.local_slots.to_string(),
                    r.grid_slots.to_string(),
                    scavenged.to_string(),
                    r.idle_slots.to_string(),
                    r.local_waiting.to_string(),
                    state,
                ]
            })
            .collect();
        out.push_str(&render(
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
            &rows,
        ));
        out.push('\n');
    }
    let rows: Vec<Vec<String>> = reply
        .jobs
        .iter()
        .map(|j| {
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
        })
        .collect();
    out.push_str(&render(
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
        &rows,
    ));
    out
}
