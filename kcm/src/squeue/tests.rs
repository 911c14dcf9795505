use super::*;

/// A busy partition in the commands' formats: three 4-CPU nodes, a
/// sweep's placeholders, a component over two nodes, others' jobs.
const SINFO: &str = "node1|gleaner*|4|4/0/0/4|allocated\n\
        node1|local|4|4/0/0/4|allocated\n\
        node2|gleaner*|4|3/1/0/4|mixed\n\
        node2|local|4|3/1/0/4|mixed\n\
        node3|gleaner*|4|3/1/0/4|mixed\n\
        node3|local|4|3/1/0/4|mixed\n\
        vm|solo|4|0/4/0/4|idle\n";

const SQUEUE: &str = "M|10_1|root|RUNNING|node1|1|1|OK|gleaner|None|0|N/A|2:00:00|N/A|1000|gl-sweep-00000000000beef0\n\
        M|10_2|root|RUNNING|node1|1|1|OK|gleaner|None|0|N/A|2:00:00|N/A|1000|gl-sweep-00000000000beef0\n\
        M|10_3|root|PENDING||1|1|OK|gleaner|Priority|0|N/A|2:00:00|N/A|1000|gl-sweep-00000000000beef0\n\
        M|11|root|RUNNING|node[2-3]|6|2|OK|gleaner|None|0|N/A|2:00:00|N/A|1000|gg-mpi-00000000000beef0.0\n\
        M|12|carol|RUNNING|node1|2|1|OK|local|None|0|N/A|2:00:00|N/A|1000|wrap\n\
        M|13|carol|PENDING||4|1|OK|local|Resources|0|N/A|2:00:00|N/A|1000|whole\n\
        M|14|carol|PENDING||6|2|OK|local|Priority|0|N/A|2:00:00|N/A|1000|spread\n\
        M|15|carol|PENDING||1|1|NO|local|Priority|0|N/A|2:00:00|N/A|1000|alone\n\
        M|16|carol|PENDING||1|1|OK|local|JobHeldUser|0|N/A|2:00:00|N/A|1000|held\n\
        M|17|carol|PENDING||1|1|OK|solo|Resources|0|N/A|2:00:00|N/A|1000|elsewhere\n\
        M|18|root|PENDING||1|1|OK|solo|Priority|0|N/A|2:00:00|N/A|1000|gl-other-00000000000beef0\n";

/// The snapshot as a kcm running as root with one user judges it.
fn judged(sinfo: &str, squeue: &str, partition: &str) -> Result<Snapshot, String> {
    snapshot(sinfo, squeue, "M", partition, "gpu").map(|s| s.judge(|job| job.owner == "root"))
}

#[test]
fn time_limits_and_start_times_are_read_for_estimates() {
    for (text, ms) in [
        ("1-02:03:04", Some(((26 * 60 + 3) * 60 + 4) * 1000)),
        ("2:00:00", Some(7_200_000)),
        ("30:00", Some(1_800_000)),
        ("45", Some(2_700_000)),
        ("UNLIMITED", None),
        ("INVALID", None),
        ("1-", None),
    ] {
        assert_eq!(slurm_duration_ms(text), ms, "{text}");
    }
    let squeue = "M|12|carol|RUNNING|node1|2|1|OK|local|None|0|N/A|1:00:00|1796295600|1000|wrap\n\
            M|13|carol|PENDING||4|1|OK|local|Resources|0|N/A|30:00|1796299200|1000|whole\n\
            M|14|carol|PENDING||4|1|OK|local|Priority|0|N/A|UNLIMITED|N/A|1000|later\n\
            M|15|carol|RUNNING|vm|4|1|OK|solo|None|0|N/A|1:00:00|1796295600|1000|elsewhere\n\
            M|11|root|PENDING||6|2|OK|gleaner|Priority|0|N/A|10:00|1796300000|1000|gg-mpi-00000000000beef0.0\n";
    let s = judged(SINFO, squeue, "gleaner").unwrap();
    let timing: Vec<(u32, bool, Option<u64>, Option<u64>)> = s
        .timing
        .iter()
        .map(|t| (t.slots, t.running, t.limit_ms, t.start))
        .collect();
    assert_eq!(
        timing,
        [
            (2, true, Some(3_600_000), Some(1_796_295_600_000)),
            (4, false, Some(1_800_000), Some(1_796_299_200_000)),
            (4, false, None, None),
        ],
        "a job on other nodes is not this cluster's"
    );
    let component = &s.components[0].timing;
    assert_eq!(
        (component.limit_ms, component.start),
        (Some(600_000), Some(1_796_300_000_000))
    );
}

#[test]
fn host_lists_expand() {
    assert_eq!(
        expand_hostlist("node[1-3,5],vm"),
        ["node1", "node2", "node3", "node5", "vm"]
    );
    assert_eq!(expand_hostlist("n[08-10]"), ["n08", "n09", "n10"]);
    assert_eq!(expand_hostlist(""), Vec::<String>::new());
    assert_eq!(expand_hostlist("a,b"), ["a", "b"]);
}

#[test]
fn placeholders_the_queue_keeps_behind_every_waiting_local_job_yield() {
    let sinfo = "node1|gleaner*|4|4/0/0/4|allocated|(null)|(null)|0|4000|1|\n\
            node1|local|4|4/0/0/4|allocated|(null)|(null)|0|4000|1|\n\
            node1|batch|4|4/0/0/4|allocated|(null)|(null)|0|4000|10|\n";
    let squeue = |small: u64| {
        format!(
            "M|20_1|root|PENDING||1|1|OK|gleaner|Priority|0|N/A|10:00|N/A|500|gl-sweep-00000000000beef0\n\
                 M|20_2|root|RUNNING|node1|1|1|OK|gleaner|None|0|N/A|10:00|N/A|500|gl-sweep-00000000000beef0\n\
                 M|21|carol|PENDING||4|1|OK|batch|Resources|0|N/A|30:00|N/A|100|wide\n\
                 M|22|carol|PENDING||1|1|OK|local|Priority|0|N/A|30:00|N/A|{small}|small\n"
        )
    };
    // A higher tier is ahead whatever its priority; in the same tier,
    // the priority decides.
    let behind = judged(sinfo, &squeue(600), "gleaner").unwrap();
    assert_eq!(behind.yielding(), BTreeSet::from(["20_1"]));
    assert_eq!(
        (behind.local_waiting(), behind.local_waiting_first()),
        (5, 4),
        "only the higher tier's job starts before any placeholder"
    );
    let level = judged(sinfo, &squeue(500), "gleaner").unwrap();
    assert!(level.yielding().is_empty(), "a tie is not behind");
    let ahead = judged(sinfo, &squeue(400), "gleaner").unwrap();
    assert!(ahead.yielding().is_empty());
    // Nothing to yield to, or an `sinfo` without tiers: none yields.
    let alone = judged(
        sinfo,
        &squeue(600).lines().take(2).collect::<Vec<_>>().join("\n"),
        "gleaner",
    )
    .unwrap();
    assert!(alone.yielding().is_empty());
    let untiered = sinfo.replace("|1|\n", "|\n").replace("|10|\n", "|\n");
    let unknown = judged(&untiered, &squeue(600), "gleaner").unwrap();
    assert!(unknown.yielding().is_empty());
    assert_eq!(unknown.local_waiting_first(), 0);
    // A stranger's job named like gleaner's, waiting, is a local job
    // like any other: behind it, a placeholder is not behind them all.
    let impostor = format!(
        "{}M|23|mallory|PENDING||1|1|OK|gleaner|Priority|0|N/A|10:00|N/A|450|gl-sweep-00000000000beef0\n",
        squeue(600)
    );
    let judged_impostor = judged(sinfo, &impostor, "gleaner").unwrap();
    assert!(judged_impostor.yielding().is_empty());
}

#[test]
fn a_busy_partition() {
    let s = judged(SINFO, SQUEUE, "gleaner").unwrap();
    let hosts: Vec<(&str, u32, u32, u32)> = s
        .hosts
        .iter()
        .map(|h| (h.name.as_str(), h.slots, h.local, h.grid))
        .collect();
    assert_eq!(
        hosts,
        [("node1", 4, 2, 0), ("node2", 4, 0, 3), ("node3", 4, 0, 3)],
        "node1: two launchers and a 2-CPU local job; the component split over two nodes"
    );
    let placeholders: Vec<(&str, Option<&str>)> = s
        .placeholders
        .iter()
        .map(|p| (p.id.as_str(), p.host.as_deref()))
        .collect();
    assert_eq!(
        placeholders,
        [
            ("10_1", Some("node1")),
            ("10_2", Some("node1")),
            ("10_3", None)
        ],
        "the other partition's placeholder is another cluster's"
    );
    assert_eq!(s.components.len(), 1);
    assert!(s.components[0].running);
    let waiting: Vec<(&str, u32, u32, bool)> = s
        .waiting
        .iter()
        .map(|w| (w.id.as_str(), w.slots, w.together, w.exclusive))
        .collect();
    assert_eq!(
        waiting,
        [("13", 4, 4, false), ("14", 6, 1, false), ("15", 1, 1, true)],
        "held jobs and other partitions' jobs are not waiting for these slots"
    );
    assert!(s.problem.is_none());
}

#[test]
fn down_nodes_offer_nothing_and_are_reported() {
    let sinfo = "node1|gleaner*|4|0/0/4/4|down*\nnode2|gleaner*|4|0/4/0/4|idle\n";
    let s = snapshot(sinfo, "", "M", "gleaner", "gpu").unwrap();
    assert_eq!(s.total_slots(), 4);
    assert_eq!(s.problem.as_deref(), Some("node node1 is down*"));
}

#[test]
fn unknown_partitions_and_garbage_are_errors() {
    assert!(
        snapshot(SINFO, "", "M", "nope", "gpu")
            .unwrap_err()
            .contains("no nodes")
    );
    assert!(snapshot("garbage", "", "M", "gleaner", "gpu").is_err());
    assert!(snapshot(SINFO, "M|1|root|RUNNING", "M", "gleaner", "gpu").is_err());
    assert!(
        snapshot(
            SINFO,
            "1|root|RUNNING|||1|1|OK|gleaner|None|0|N/A|x",
            "M",
            "gleaner",
            "gpu"
        )
        .is_err(),
        "lines start with the marker"
    );
}

#[test]
fn memory_and_gpus_free_per_node_and_asked_by_each_job() {
    let sinfo = "node1|gleaner*|4|2/2/0/4|mixed|gpu:2|gpu:1(IDX:0)|1500|4000|\n\
            node2|gleaner*|4|0/4/0/4|idle|gpu:tesla:2(S:0-1)|gpu:tesla:0|0|4000|\n\
            node3|gleaner*|4|0/4/0/4|idle|(null)|(null)|0|4000|\n";
    let squeue = "M|7_1|root|RUNNING|node1|1|1|OK|gleaner|None|1500M|gres:gpu:1|2:00:00|N/A|1000|gl-sweep-00000000000beef0\n\
            M|8|carol|PENDING||2|1|OK|gleaner|Resources|3G|gres/gpu:2,shard:1|2:00:00|N/A|1000|big\n";
    let s = snapshot(sinfo, squeue, "M", "gleaner", "gpu").unwrap();
    let free: Vec<(Option<u64>, Option<u32>)> = s
        .hosts
        .iter()
        .map(|h| (h.free_memory_mb, h.free_gpus))
        .collect();
    assert_eq!(
        free,
        [
            (Some(2500), Some(1)),
            (Some(4000), Some(2)),
            (Some(4000), Some(0))
        ]
    );
    let s = s.judge(|job| job.owner == "root");
    assert_eq!(
        s.placeholders[0].needs,
        Needs {
            memory_mb: 1500,
            gpus: 1
        }
    );
    assert_eq!(
        s.waiting[0].needs,
        Needs {
            memory_mb: 3072,
            gpus: 2
        }
    );
}

/// `squeue` and `sinfo` with bob's jobs named like gleaner's (a
/// running placeholder, a held array of two, a component on two nodes
/// and a held one), one named `odd|name`, one whose name's second line
/// looks like a waiting placeholder of root's (job 99), and root's
/// placeholders.
#[test]
fn jobs_named_like_gleaners_carry_their_owners_until_judged() {
    let sinfo = include_str!("../../tests/data/sinfo-named.txt");
    let squeue = include_str!("../../tests/data/squeue-named.txt");
    let s = snapshot(sinfo, squeue, "gleaner0123456789abcdef", "gleaner", "gpu").unwrap();
    assert!(s.placeholders.is_empty() && s.components.is_empty());
    let named: Vec<(&str, &str, Option<u32>, usize, bool)> = s
        .named
        .iter()
        .map(|n| {
            (
                n.ids[0].as_str(),
                n.owner.as_str(),
                n.component,
                n.hosts.len(),
                n.waiting.is_some(),
            )
        })
        .collect();
    assert_eq!(
        named,
        [
            ("65", "bob", Some(1), 0, false),
            ("63_1", "bob", None, 0, false),
            ("63_2", "bob", None, 0, false),
            ("62", "bob", None, 1, false),
            ("64", "bob", Some(0), 2, false),
            ("68_1", "root", None, 1, false),
            ("68_2", "root", None, 1, false),
        ],
        "held ones wait for no slots; `odd|name` and the two-line name are read whole, and are no gleaner names"
    );
    let locals = |s: &Snapshot| -> Vec<u32> { s.hosts.iter().map(|h| h.local).collect() };
    assert_eq!(locals(&s), [1, 0, 0], "only odd|name counts until judged");

    let s = s.judge(|job| job.owner == "root");
    let ids: Vec<&str> = s.placeholders.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["68_1", "68_2"], "root's only");
    assert!(s.components.is_empty() && s.waiting.is_empty());
    assert_eq!(
        locals(&s),
        [3, 1, 0],
        "bob's count where they run: a launcher and half a component on node1"
    );
    assert_eq!(s.grid_running(), 0);
}

#[test]
fn someone_elses_waiting_placeholder_is_a_waiting_local_job() {
    let squeue = "M|20|bob|PENDING||4|1|OK|gleaner|Resources|0|N/A|2:00:00|N/A|1000|gl-sweep-00000000000beef0\n\
            M|21|bob|PENDING||2|2|NO|gleaner|Priority|0|N/A|2:00:00|N/A|1000|gg-mpi-00000000000beef0.0\n\
            M|22|root|PENDING||1|1|OK|gleaner|Priority|0|N/A|2:00:00|N/A|1000|gg-mpi-00000000000beef0.0\n";
    let s = judged(SINFO, squeue, "gleaner").unwrap();
    let waiting: Vec<(&str, u32, u32, bool)> = s
        .waiting
        .iter()
        .map(|w| (w.id.as_str(), w.slots, w.together, w.exclusive))
        .collect();
    assert_eq!(waiting, [("20", 4, 4, false), ("21", 2, 1, true)]);
    assert_eq!(s.components.len(), 1);
    assert_eq!(
        (s.components[0].id.as_str(), s.components[0].running),
        ("22", false)
    );
}
