//! Prometheus metrics: the figures of `gleaner status`, per cluster and per
//! job, in the text exposition format, for the admins' Grafana (RabbitMQ's
//! own `rabbitmq_prometheus` gives the queue depths beside them). Pure: a
//! status picture in, a page out; the shell serves the last page.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use gleaner_protocol::StatusReply;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SlotLabels {
    cluster: String,
    /// `local`, `grid`, `scavenged` or `idle`.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    cluster: String,
    /// `memory_mb` or `gpus`.
    resource: String,
    /// `free` or `scavenged`.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    job: String,
    owner: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    job: String,
    owner: String,
    /// `pending`, `running`, `succeeded`, `failed`, `timed_out`, `lost`, `cancelled`.
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GatheringLabels {
    job: String,
    owner: String,
    /// `at_barrier`, `claiming_tries`, `placement_seconds`,
    /// `barrier_seconds` or `start_delay_seconds`.
    figure: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The page of a standby scheduler, which knows nothing current.
pub const STANDBY: &str =
    "# gleaner: this scheduler is a standby; the active one serves the figures\n# EOF\n";

/// The page for this picture of the grid.
pub fn render(status: &StatusReply) -> String {
    let mut registry = Registry::with_prefix("gleaner");
    let slots = Family::<SlotLabels, Gauge>::default();
    registry.register(
        "cluster_slots",
        "Slots of a cluster by what holds them",
        slots.clone(),
    );
    let waiting = Family::<ClusterLabels, Gauge>::default();
    registry.register(
        "cluster_local_waiting",
        "Slots the cluster's own waiting jobs want",
        waiting.clone(),
    );
    let usable = Family::<ClusterLabels, Gauge>::default();
    registry.register(
        "cluster_usable",
        "1 if gleaner may grow on the cluster (reporting, not excluded)",
        usable.clone(),
    );
    let resources = Family::<ResourceLabels, Gauge>::default();
    registry.register(
        "cluster_resource",
        "Memory (MiB) and GPUs of a cluster, free and scavenged, where its batch system counts them",
        resources.clone(),
    );
    for view in &status.clusters {
        let r = &view.report;
        let cluster = r.cluster.to_string();
        let scavenged: gleaner_manifest::Needs = r.hosts.iter().map(|h| h.scavenged_needs).sum();
        let figures = [
            ("memory_mb", "free", r.free_memory_mb),
            ("gpus", "free", r.free_gpus.map(u64::from)),
            (
                "memory_mb",
                "scavenged",
                r.free_memory_mb.map(|_| scavenged.memory_mb),
            ),
            (
                "gpus",
                "scavenged",
                r.free_gpus.map(|_| u64::from(scavenged.gpus)),
            ),
        ];
        for (resource, kind, value) in figures {
            if let Some(value) = value {
                resources
                    .get_or_create(&ResourceLabels {
                        cluster: cluster.clone(),
                        resource: resource.to_owned(),
                        kind: kind.to_owned(),
                    })
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
        let scavenged = r.jobs.values().map(|h| u64::from(h.total())).sum::<u64>();
        for (kind, value) in [
            ("total", u64::from(r.total_slots)),
            ("local", u64::from(r.local_slots)),
            ("grid", u64::from(r.grid_slots)),
            ("scavenged", scavenged),
            ("idle", u64::from(r.idle_slots)),
        ] {
            slots
                .get_or_create(&SlotLabels {
                    cluster: cluster.clone(),
                    kind: kind.to_owned(),
                })
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
        let labels = ClusterLabels { cluster };
        waiting
            .get_or_create(&labels)
            .set(i64::from(r.local_waiting));
        usable
            .get_or_create(&labels)
            .set(i64::from(!view.stale && !view.excluded));
    }

    let tasks = Family::<TaskLabels, Gauge>::default();
    registry.register("job_tasks", "A job's tasks by state", tasks.clone());
    let launchers = Family::<JobLabels, Gauge>::default();
    registry.register(
        "job_launcher_slots",
        "Launcher slots a job holds, all clusters",
        launchers.clone(),
    );
    let throughput = Family::<JobLabels, FloatGauge>::default();
    registry.register(
        "job_tasks_per_second",
        "Tasks a job finished per second, lately",
        throughput.clone(),
    );
    let preemptions = Family::<JobLabels, Gauge>::default();
    registry.register(
        "job_preemptions",
        "Runs of a job's tasks cut short by preemption",
        preemptions.clone(),
    );
    let gathering = Family::<GatheringLabels, FloatGauge>::default();
    registry.register(
        "grid_job_gathering",
        "How a grid job gathers its components: components at the barrier, claiming tries, seconds to placement, at the barrier and from placement to start",
        gathering.clone(),
    );
    for job in &status.jobs {
        if let Some(g) = &job.gathering {
            for (figure, value) in [
                ("at_barrier", Some(f64::from(g.at_barrier))),
                ("claiming_tries", Some(f64::from(g.claiming_tries))),
                ("placement_seconds", g.placement_s),
                ("barrier_seconds", g.barrier_s),
                ("start_delay_seconds", g.start_delay_s),
            ] {
                if let Some(value) = value {
                    gathering
                        .get_or_create(&GatheringLabels {
                            job: job.job.to_string(),
                            owner: job.owner.clone(),
                            figure: figure.to_owned(),
                        })
                        .set(value);
                }
            }
        }
        let labels = JobLabels {
            job: job.job.to_string(),
            owner: job.owner.clone(),
        };
        let t = &job.tasks;
        for (state, value) in [
            ("pending", t.pending),
            ("running", t.running),
            ("succeeded", t.succeeded),
            ("failed", t.failed),
            ("timed_out", t.timed_out),
            ("lost", t.lost),
            ("cancelled", t.cancelled),
        ] {
            tasks
                .get_or_create(&TaskLabels {
                    job: labels.job.clone(),
                    owner: labels.owner.clone(),
                    state: state.to_owned(),
                })
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
        let held: u64 = job.launchers.values().map(|n| u64::from(*n)).sum();
        launchers
            .get_or_create(&labels)
            .set(i64::try_from(held).unwrap_or(i64::MAX));
        throughput.get_or_create(&labels).set(job.throughput);
        preemptions
            .get_or_create(&labels)
            .set(i64::try_from(job.preemptions).unwrap_or(i64::MAX));
    }
    let mut page = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut page, &registry);
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_figures_are_labelled_series() {
        let job: gleaner_protocol::JobReport = serde_json::from_value(serde_json::json!({
            "job": "sweep-3fa9c2d41e07b5a8", "owner": "alice", "kind": "scavenge", "priority": "super-low",
            "state": "running", "runner": "r",
            "tasks": {"total": 100, "pending": 50, "running": 10, "succeeded": 40, "failed": 0,
                      "timed_out": 0, "lost": 0, "cancelled": 0},
            "launchers": {"c1": 10}, "throughput": 2.5, "preemptions": 3, "started_at": 0,
            "results": "/r", "components": [], "max_slots": null, "problem": null
        }))
        .unwrap();
        let mut status = StatusReply {
            scheduler: "s".into(),
            policy: "site-equipartition".into(),
            clusters: Vec::new(),
            jobs: Vec::new(),
            placements: Vec::new(),
            hidden: 0,
            ended: Vec::new(),
        };
        assert_eq!(render(&status), "# EOF\n", "an empty grid");
        let mut grid = job.clone();
        grid.job = "mpi-3fa9c2d41e07b5a8".parse().unwrap();
        grid.gathering = Some(gleaner_protocol::Gathering {
            at_barrier: 2,
            claiming_tries: 1,
            placement_s: Some(0.5),
            barrier_s: None,
            start_delay_s: None,
            ..Default::default()
        });
        status.jobs.push(job);
        status.jobs.push(grid);
        let page = render(&status);
        for line in [
            "# TYPE gleaner_job_tasks gauge",
            "gleaner_job_tasks{job=\"sweep-3fa9c2d41e07b5a8\",owner=\"alice\",state=\"running\"} 10",
            "gleaner_job_launcher_slots{job=\"sweep-3fa9c2d41e07b5a8\",owner=\"alice\"} 10",
            "gleaner_job_tasks_per_second{job=\"sweep-3fa9c2d41e07b5a8\",owner=\"alice\"} 2.5",
            "gleaner_job_preemptions{job=\"sweep-3fa9c2d41e07b5a8\",owner=\"alice\"} 3",
            "gleaner_grid_job_gathering{job=\"mpi-3fa9c2d41e07b5a8\",owner=\"alice\",figure=\"at_barrier\"} 2.0",
            "gleaner_grid_job_gathering{job=\"mpi-3fa9c2d41e07b5a8\",owner=\"alice\",figure=\"placement_seconds\"} 0.5",
        ] {
            assert!(page.lines().any(|l| l == line), "{line}\n{page}");
        }
        assert!(page.ends_with("# EOF\n"), "{page}");
    }
}
