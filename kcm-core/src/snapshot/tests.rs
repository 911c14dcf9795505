use super::*;

fn placeholder(id: &str, job: &str, slots: u32, host: Option<&str>) -> Placeholder {
    Placeholder {
        id: id.into(),
        job: job.parse().unwrap(),
        slots,
        host: host.map(str::to_owned),
        owner: "alice".into(),
        needs: Default::default(),
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
            owner: "root".into(),
            timing: Default::default(),
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

fn timing(slots: u32, running: bool, limit_s: u64, start_s: Option<u64>) -> Timing {
    Timing {
        slots,
        running,
        limit_ms: Some(limit_s * 1000),
        start: start_s.map(|s| s * 1000),
    }
}

/// 8 slots; now is 1000 s. A local job of 6 started at 900 s with an
/// hour's limit (ends at 4500 s); one of 4 waits (2 h), with no start
/// from the batch system; gleaner's component of 4 (10 min) waits too,
/// with Slurm's start at 5000 s; another of 2 (10 min) waits, no start.
#[test]
fn the_foresight_leaves_gleaners_waiting_components_out_and_says_when_each_starts() {
    let now = 1_000_000;
    let component = |n: u32, slots: u32, start_s: Option<u64>| ComponentRun {
        id: format!("{n}"),
        job: "g-0000000000000000".parse().unwrap(),
        component: n,
        slots,
        running: false,
        owner: "root".into(),
        timing: timing(slots, false, 600, start_s),
    };
    let snapshot = Snapshot {
        hosts: vec![Host::new("n1", 8)],
        timing: vec![
            timing(6, true, 3600, Some(900)),
            timing(4, false, 7200, None),
        ],
        components: vec![component(0, 4, Some(5000)), component(1, 2, None)],
        ..Snapshot::default()
    };
    let f = snapshot.foresight(now, 2.0);
    assert_eq!(f.speed, 2.0);
    // Free: 2 until 3500 s from now; the local job of 4 then runs 2 h.
    assert_eq!(f.free, [(0, 2), (3_500_000, 4), (10_700_000, 8)]);
    let waiting: Vec<(u32, u64, EctSource)> = f
        .waiting
        .iter()
        .map(|w| (w.component, w.start_ms, w.source))
        .collect();
    assert_eq!(
        waiting,
        [
            (0, 4_000_000, EctSource::BatchSystem),
            // 2 slots are free now beside the running job.
            (1, 0, EctSource::Model),
        ]
    );
}

#[test]
fn judged_named_jobs_are_gleaners_or_their_owners_local_jobs() {
    let job: JobId = "g-0000000000000000".parse().unwrap();
    let named = |owner: &str, component, ids: &[&str], hosts: &[(&str, u32)]| NamedJob {
        job: job.clone(),
        component,
        owner: owner.into(),
        ids: ids.iter().map(|id| (*id).to_owned()).collect(),
        slots: 3,
        hosts: hosts.iter().map(|(h, s)| ((*h).to_owned(), *s)).collect(),
        waiting: hosts.is_empty().then(|| WaitingJob::anywhere(ids[0], 3)),
        problem: Some(format!("{owner}'s problem")),
        needs: Default::default(),
        timing: Default::default(),
    };
    let read = Snapshot {
        hosts: vec![Host::new("n1", 4), Host::new("n2", 4)],
        named: vec![
            named(
                "root",
                Some(0),
                &["5"],
                &[("n1", 1), ("n2.grid.example", 2)],
            ),
            named("bob", Some(1), &["6"], &[("n1", 1), ("n2", 2)]),
            named("root", None, &["7.1", "7.2"], &[]),
            named("bob", None, &["8.1", "8.2"], &[]),
            named("bob", None, &["9.1"], &[("n1", 1)]),
        ],
        problem: Some("a queue's problem".into()),
        ..Snapshot::default()
    };
    let s = read.judge(|n| n.owner == "root");
    assert!(s.named.is_empty());
    let hosts: Vec<(u32, u32)> = s.hosts.iter().map(|h| (h.local, h.grid)).collect();
    assert_eq!(hosts, [(2, 1), (2, 2)]);
    assert_eq!(
        (
            s.components.len(),
            s.components[0].slots,
            s.components[0].running
        ),
        (1, 3, true)
    );
    let ids: Vec<(&str, bool)> = s
        .placeholders
        .iter()
        .map(|p| (p.id.as_str(), p.running()))
        .collect();
    assert_eq!(ids, [("7.1", false), ("7.2", false)]);
    assert_eq!(s.waiting, [WaitingJob::anywhere("8.1", 3)]);
    assert_eq!(
        s.problem.as_deref(),
        Some("a queue's problem; root's problem; root's problem")
    );
}
