use super::*;

/// The snapshot as read, its jobs named like gleaner's not judged.
fn unjudged(xml: &str, queue: &str) -> Result<Snapshot, String> {
    let rules = [
        ("smp".to_owned(), AllocationRule::OneHost),
        ("make".to_owned(), AllocationRule::Spread),
        ("two".to_owned(), AllocationRule::PerHost(2)),
    ]
    .into();
    let consumables = Consumables {
        memory: "mem_free".into(),
        gpu: "gpu".into(),
    };
    read(xml)?.snapshot(queue, &rules, &consumables)
}

/// The snapshot as a kcm running as root with one user judges it.
fn snapshot(xml: &str, queue: &str) -> Result<Snapshot, String> {
    unjudged(xml, queue).map(|s| s.judge(|job| job.owner == "root"))
}

const SAMPLE: &str = include_str!("../../tests/data/qstat-c1.xml");

#[test]
fn the_real_output_of_a_busy_queue() {
    let s = snapshot(SAMPLE, "c1.q").unwrap();
    assert_eq!(s.total_slots(), 8);
    let running: Vec<&str> = s
        .placeholders
        .iter()
        .filter(|p| p.running())
        .map(|p| p.id.as_str())
        .collect();
    assert_eq!(
        running,
        ["3.1", "3.2", "3.3", "3.4", "3.5", "3.6", "3.7", "3.8"]
    );
    let pending: Vec<&str> = s
        .placeholders
        .iter()
        .filter(|p| !p.running())
        .map(|p| p.id.as_str())
        .collect();
    assert_eq!(pending, ["3.9", "3.10"]);
    assert!(
        s.placeholders
            .iter()
            .all(|p| p.job.as_str() == "sweep-3fa9c2d41e07b5a8")
    );
    assert_eq!(s.local_running(), 0);
    assert_eq!(
        s.waiting,
        [WaitingJob::anywhere("4", 2)],
        "the held job does not wait for slots"
    );
    assert_eq!(s.problem, None);
}

/// Bob's jobs named like gleaner's in a 4-slot queue (a running
/// placeholder, a held array of three, a running component of two
/// slots, a held one) beside root's array of two placeholders.
#[test]
fn the_real_output_of_jobs_named_like_gleaners() {
    let xml = include_str!("../../tests/data/qstat-named.xml");
    let s = unjudged(xml, "c1.q").unwrap();
    assert!(s.placeholders.is_empty() && s.components.is_empty());
    assert_eq!((s.local_running(), s.grid_running()), (0, 0));
    let named: Vec<(Vec<&str>, &str, Option<u32>, usize)> = s
        .named
        .iter()
        .map(|n| {
            (
                n.ids.iter().map(String::as_str).collect(),
                n.owner.as_str(),
                n.component,
                n.hosts.len(),
            )
        })
        .collect();
    assert_eq!(
        named,
        [
            (vec!["9"], "bob", None, 1),
            (vec!["11"], "bob", Some(0), 1),
            (vec!["13.1"], "root", None, 1),
            (vec!["13.2"], "root", None, 0),
            (vec!["10.1", "10.2", "10.3"], "bob", None, 0),
            (vec!["12"], "bob", Some(1), 0),
        ]
    );
    assert_eq!(
        s.named[3].waiting,
        Some(WaitingJob::anywhere("13", 1)),
        "were it anybody else's, it would be a waiting local job"
    );
    assert!(
        s.named[4..].iter().all(|n| n.waiting.is_none()),
        "held ones wait for nothing"
    );

    let s = s.judge(|job| job.owner == "root");
    let ids: Vec<(&str, bool)> = s
        .placeholders
        .iter()
        .map(|p| (p.id.as_str(), p.running()))
        .collect();
    assert_eq!(ids, [("13.1", true), ("13.2", false)]);
    assert!(s.components.is_empty() && s.waiting.is_empty());
    assert_eq!(
        (s.local_running(), s.grid_running()),
        (3, 0),
        "bob's placeholder and component are his local jobs"
    );
    assert_eq!(s.idle_slots(), 0, "3 local, 1 held, 1 claimed");
}

#[test]
fn someone_elses_named_jobs_are_local_and_report_nothing() {
    let xml = r#"<job_info><queue_info>
            <Queue-List><name>g1.q@n1</name><slots_total>4</slots_total>
              <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gg-mpi-00000000000beef0.0</JB_name><JB_owner>bob</JB_owner><state>r</state><slots>1</slots></job_list>
            </Queue-List>
            <Queue-List><name>g1.q@n2</name><slots_total>4</slots_total>
              <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gg-mpi-00000000000beef0.0</JB_name><JB_owner>bob</JB_owner><state>r</state><slots>3</slots></job_list>
            </Queue-List></queue_info>
            <job_info>
              <job_list state="pending"><JB_job_number>6</JB_job_number><JB_name>gl-sweep-00000000000beef0</JB_name><JB_owner>bob</JB_owner><state>qw</state><slots>2</slots><tasks>1-3:1</tasks>
                <requested_pe name="smp">2</requested_pe></job_list>
              <job_list state="pending"><JB_job_number>7</JB_job_number><JB_name>gl-sweep-00000000000beef0</JB_name><JB_owner>bob</JB_owner><state>Eqw</state><slots>1</slots></job_list>
              <job_list state="pending"><JB_job_number>8</JB_job_number><JB_name>gl-sweep-00000000000beef0</JB_name><JB_owner>root</JB_owner><state>Eqw</state><slots>1</slots></job_list>
              <job_list state="pending"><JB_job_number>9</JB_job_number><JB_name>gl-sweep-00000000000beef0</JB_name><state>qw</state><slots>1</slots></job_list>
            </job_info></job_info>"#;
    let s = snapshot(xml, "g1.q").unwrap();
    let hosts: Vec<(u32, u32)> = s.hosts.iter().map(|h| (h.local, h.grid)).collect();
    assert_eq!(hosts, [(1, 0), (3, 0)], "bob's component, where it runs");
    let ids: Vec<&str> = s.placeholders.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["8"], "root's alone; one without an owner is nobody's");
    let waiting: Vec<(&str, u32, u32)> = s
        .waiting
        .iter()
        .map(|w| (w.id.as_str(), w.slots, w.together))
        .collect();
    assert_eq!(
        waiting,
        [("6", 6, 2), ("9", 1, 1)],
        "bob's array waits as his; his job in error does not"
    );
    assert_eq!(
        s.problem.as_deref(),
        Some("placeholder job 8 is in error state Eqw"),
        "only gleaner's own placeholders' errors are reported"
    );
}

#[test]
fn grid_components_are_neither_local_nor_placeholders() {
    let xml = r#"<job_info><queue_info><Queue-List><name>c1.q@a</name><slots_total>8</slots_total>
            <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gg-mpi-00000000000beef0.0</JB_name><JB_owner>root</JB_owner><state>r</state><slots>4</slots></job_list>
            </Queue-List></queue_info>
            <job_info><job_list state="pending"><JB_job_number>6</JB_job_number><JB_name>gg-mpi-00000000000beef0.1</JB_name><JB_owner>root</JB_owner><state>qw</state><slots>2</slots></job_list></job_info></job_info>"#;
    let s = snapshot(xml, "c1.q").unwrap();
    assert_eq!((s.grid_running(), s.local_running()), (4, 0));
    assert!(s.waiting.is_empty() && s.placeholders.is_empty());
    assert_eq!(s.components.len(), 2);
    assert_eq!(
        (s.components[1].component, s.components[1].running),
        (1, false)
    );
}

#[test]
fn memory_and_gpus_left_per_host_and_asked_by_each_job() {
    let xml = r#"<?xml version='1.0'?><job_info><queue_info>
            <Queue-List><name>g1.q@node3</name><slots_total>4</slots_total>
              <resource name="mem_free" type="hc">2.441G</resource>
              <resource name="gpu" type="hc">1</resource>
              <resource name="gpu" type="qc">3</resource>
              <job_list state="running"><JB_job_number>71</JB_job_number><JB_name>gl-gpus-0123456789abcdef</JB_name>
                <JB_owner>root</JB_owner><state>r</state><slots>2</slots><tasks>3</tasks>
                <hard_request name="mem_free" resource_contribution="0.000000">750M</hard_request>
                <hard_request name="gpu" resource_contribution="0.000000">1</hard_request></job_list>
            </Queue-List>
            <Queue-List><name>g1.q@node4</name><slots_total>4</slots_total></Queue-List>
            </queue_info><job_info>
              <job_list state="pending"><JB_job_number>72</JB_job_number><JB_name>big</JB_name>
                <JB_owner>bob</JB_owner><state>qw</state><slots>2</slots>
                <requested_pe name="smp">2</requested_pe>
                <hard_request name="mem_free" resource_contribution="0.000000">1.5G</hard_request>
                <hard_request name="gpu" resource_contribution="0.000000">2</hard_request></job_list>
            </job_info></job_info>"#;
    let snapshot = snapshot(xml, "g1.q").unwrap();
    let node3 = &snapshot.hosts[0];
    assert_eq!(
        (node3.free_memory_mb, node3.free_gpus),
        (Some(2500), Some(1))
    );
    let node4 = &snapshot.hosts[1];
    assert_eq!(
        (node4.free_memory_mb, node4.free_gpus),
        (None, None),
        "not counted"
    );
    assert_eq!(
        snapshot.placeholders[0].needs,
        Needs {
            memory_mb: 1500,
            gpus: 1
        },
        "memory per slot, GPUs per job"
    );
    assert_eq!(
        snapshot.waiting[0].needs,
        Needs {
            memory_mb: 3072,
            gpus: 2
        }
    );
}

#[test]
fn hosts_of_a_real_multi_host_queue() {
    // A local `-pe make 6` on 2 slots of each of 3 hosts, and a
    // `-pe smp 5` that no 4-slot host can take.
    let s = snapshot(include_str!("../../tests/data/qstat-g1.xml"), "g1.q").unwrap();
    let hosts: Vec<(&str, u32, u32)> = s
        .hosts
        .iter()
        .map(|h| (h.name.as_str(), h.slots, h.local))
        .collect();
    assert_eq!(hosts, [("node1", 4, 2), ("node2", 4, 2), ("node3", 4, 2)]);
    assert_eq!(s.waiting, [WaitingJob::one_host("16", 5)]);
}

#[test]
fn placeholders_and_components_know_their_hosts() {
    let xml = r#"<job_info><queue_info>
            <Queue-List><name>g1.q@n1</name><slots_total>4</slots_total>
              <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gg-mpi-00000000000beef0.0</JB_name><JB_owner>root</JB_owner><state>r</state><slots>2</slots></job_list>
              <job_list state="running"><JB_job_number>7</JB_job_number><JB_name>gl-sweep-00000000000beef0</JB_name><JB_owner>root</JB_owner><state>r</state><slots>2</slots><tasks>1</tasks></job_list>
            </Queue-List>
            <Queue-List><name>g1.q@n2</name><slots_total>4</slots_total>
              <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gg-mpi-00000000000beef0.0</JB_name><JB_owner>root</JB_owner><state>r</state><slots>4</slots></job_list>
            </Queue-List></queue_info>
            <job_info>
              <job_list state="pending"><JB_job_number>8</JB_job_number><JB_name>whole</JB_name><state>qw</state><slots>1</slots>
                <hard_request name="exclusive" resource_contribution="0.0">true</hard_request></job_list>
              <job_list state="pending"><JB_job_number>9</JB_job_number><JB_name>pairs</JB_name><state>qw</state><slots>4</slots>
                <requested_pe name="two">4</requested_pe></job_list>
              <job_list state="pending"><JB_job_number>10</JB_job_number><JB_name>odd</JB_name><state>qw</state><slots>3</slots>
                <requested_pe name="unknown">3</requested_pe></job_list>
            </job_info></job_info>"#;
    let s = snapshot(xml, "g1.q").unwrap();
    assert_eq!(s.placeholders[0].host.as_deref(), Some("n1"));
    assert_eq!((s.components.len(), s.components[0].slots), (1, 6));
    assert_eq!((s.hosts[0].grid, s.hosts[1].grid), (2, 4));
    let shapes: Vec<(u32, u32, bool)> = s
        .waiting
        .iter()
        .map(|w| (w.slots, w.together, w.exclusive))
        .collect();
    assert_eq!(shapes, [(1, 1, true), (4, 2, false), (3, 1, false)]);
    assert_eq!(
        read(xml).unwrap().requested_pes(),
        ["two", "unknown"].into()
    );
}

#[test]
fn allocation_rules_read_from_qconf() {
    let pe = |rule: &str| {
        allocation_rule(&format!(
            "pe_name smp\nslots 999\nallocation_rule {rule}\ncontrol_slaves FALSE\n"
        ))
    };
    assert_eq!(pe("$pe_slots"), Some(AllocationRule::OneHost));
    assert_eq!(pe("$round_robin"), Some(AllocationRule::Spread));
    assert_eq!(pe("$fill_up"), Some(AllocationRule::Spread));
    assert_eq!(pe("4"), Some(AllocationRule::PerHost(4)));
    assert_eq!(pe("0"), None);
    assert_eq!(allocation_rule("error: no such PE"), None);
}

#[test]
fn task_ranges_expand() {
    assert_eq!(expand_tasks("9,10"), [Some(9), Some(10)]);
    assert_eq!(expand_tasks("2-8:3"), [Some(2), Some(5), Some(8)]);
    assert_eq!(expand_tasks("7"), [Some(7)]);
    assert_eq!(expand_tasks("junk"), [None]);
    assert_eq!(expand_tasks("1-1000000:1").len(), 100_000);
    let top = u64::MAX - 1;
    assert_eq!(
        expand_tasks(&format!("{top}-{}:5", u64::MAX)).len(),
        1,
        "no overflow"
    );
}

#[test]
fn start_times_and_limits_are_read_as_utc_and_seconds() {
    assert_eq!(utc_ms("1970-01-01T00:00:00"), Some(0));
    assert_eq!(utc_ms("2026-11-25T14:27:15"), Some(1_795_616_835_000));
    assert_eq!(utc_ms("2000-02-29T23:59:59.5"), Some(951_868_799_500));
    for bad in [
        "2026-13-01T00:00:00",
        "2026-11-25",
        "2026-11-25T25:00:00",
        "x",
    ] {
        assert_eq!(utc_ms(bad), None, "{bad}");
    }
    assert_eq!(sge_duration_ms("1800"), Some(1_800_000));
    assert_eq!(sge_duration_ms("1:00:00"), Some(3_600_000));
    assert_eq!(sge_duration_ms("INFINITY"), None);
    // The real output's running placeholder started then.
    let snapshot = unjudged(include_str!("../../tests/data/qstat-named.xml"), "c1.q");
    let started: Vec<Option<u64>> = snapshot
        .unwrap()
        .named
        .iter()
        .filter(|n| !n.hosts.is_empty())
        .map(|n| n.timing.start)
        .collect();
    assert!(started.contains(&Some(1_795_616_835_000)), "{started:?}");
}

#[test]
fn broken_queues_and_output_are_reported() {
    let xml = r#"<?xml version='1.0'?><job_info><queue_info><Queue-List><name>c1.q@vm</name><slots_used>0</slots_used><slots_total>8</slots_total><state>E</state></Queue-List></queue_info><job_info></job_info></job_info>"#;
    let s = snapshot(xml, "c1.q").unwrap();
    assert_eq!(s.total_slots(), 0);
    assert!(s.problem.unwrap().contains("state E"));
    assert!(snapshot(xml, "c9.q").unwrap_err().contains("no queue c9.q"));
    assert!(snapshot("<html>error</html>", "c1.q").is_err());
    assert!(snapshot("", "c1.q").is_err());
}

#[test]
fn local_jobs_and_other_names_count_as_local() {
    let xml = r#"<job_info><queue_info><Queue-List><name>c1.q@a</name><slots_total>4</slots_total>
            <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gl-not-a-job-id</JB_name><state>r</state><slots>2</slots></job_list>
            </Queue-List><Queue-List><name>c1.q@b</name><slots_total>4</slots_total></Queue-List></queue_info>
            <job_info><job_list state="pending"><JB_job_number>6</JB_job_number><JB_name>array</JB_name><state>qw</state><slots>1</slots><tasks>1-100:1</tasks></job_list></job_info></job_info>"#;
    let s = snapshot(xml, "c1.q").unwrap();
    assert_eq!((s.total_slots(), s.local_running()), (8, 2));
    assert_eq!(
        s.waiting[0].slots, 8,
        "a pending array wants at most the whole queue"
    );
}
