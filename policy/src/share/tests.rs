#[test]
fn tasks_of_several_slots_need_and_take_whole_tasks() {
    let need = super::Need {
        unfinished: 5,
        task_slots: 4,
        max_slots: None,
    };
    assert_eq!(super::demand(need, 8), 12, "5 tasks of 4, 8 slots held");
    assert_eq!(super::accepted(6, need, 8), 4, "one task's worth of 6");
    assert_eq!(super::accepted(3, need, 8), 0, "not one task's worth");
    let capped = super::Need {
        max_slots: Some(10),
        ..need
    };
    assert_eq!(
        super::accepted(20, capped, 0),
        8,
        "within max_launchers, whole tasks"
    );
}

use super::*;

fn job(name: &str) -> JobId {
    format!("{name}-0000000000000000").parse().unwrap()
}

fn cluster(name: &str, total: u32, idle: u32, others: u32, held: &[(&str, u32)]) -> ClusterInput {
    ClusterInput {
        name: name.into(),
        total,
        idle,
        others,
        held: held.iter().map(|(j, n)| (job(j), *n)).collect(),
        excluded: false,
        draining: Default::default(),
        barred: Default::default(),
        gpu_hosts: None,
    }
}

fn jobs(demands: &[(&str, u32)]) -> Vec<JobInput> {
    demands
        .iter()
        .map(|(j, d)| JobInput {
            id: job(j),
            demand: *d,
            weight: 1,
            task_slots: 1,
            gpus: 0,
        })
        .collect()
}

fn offered(plan: &Plan, j: &str, c: &str) -> u32 {
    plan.offers
        .iter()
        .filter(|o| o.job == job(j) && o.cluster.as_str() == c)
        .map(|o| o.slots)
        .sum()
}

fn gpu_host(name: &str, free_slots: u32, free_gpus: u32, held: &[(&str, u32)]) -> GpuHost {
    GpuHost {
        name: name.into(),
        free_slots,
        free_gpus,
        held: held.iter().map(|(j, n)| (job(j), *n)).collect(),
    }
}

fn gpu_job(name: &str, demand: u32) -> JobInput {
    JobInput {
        gpus: 1,
        ..jobs(&[(name, demand)]).remove(0)
    }
}

#[test]
fn gpu_jobs_get_the_slots_of_free_gpus_and_cpu_jobs_the_rest() {
    // Two hosts of 4 slots and 2 GPUs, all free.
    let mut c1 = cluster("c1", 8, 8, 0, &[]);
    c1.gpu_hosts = Some(vec![gpu_host("n1", 4, 2, &[]), gpu_host("n2", 4, 2, &[])]);
    let jobs = vec![jobs(&[("cpu", 100)]).remove(0), gpu_job("gpu", 100)];
    let shared = plan_of(&c1, &jobs);
    assert_eq!(offered(&shared, "gpu", "c1"), 4, "one slot per GPU");
    assert_eq!(offered(&shared, "cpu", "c1"), 4, "every other slot");
    // A host that counts no free GPU gives a GPU job nothing.
    c1.gpu_hosts = Some(vec![gpu_host("n1", 4, 0, &[]), gpu_host("n2", 4, 0, &[])]);
    let plan = plan_of(&c1, &jobs);
    assert_eq!(offered(&plan, "gpu", "c1"), 0);
    assert_eq!(offered(&plan, "cpu", "c1"), 8);
    // Where GPUs are not counted, all share, and the batch system
    // holds a GPU placeholder until a GPU is free.
    c1.gpu_hosts = None;
    let plan = plan_of(&c1, &jobs);
    assert_eq!(offered(&plan, "gpu", "c1"), 4);
    assert_eq!(offered(&plan, "cpu", "c1"), 4);
}

#[test]
fn cpu_launchers_on_idle_gpus_make_room_where_the_gpus_are() {
    // The CPU job holds every slot; n2's GPUs are free.
    let mut c1 = cluster("c1", 8, 0, 0, &[("cpu", 8)]);
    c1.gpu_hosts = Some(vec![
        gpu_host("n1", 0, 0, &[("cpu", 4)]),
        gpu_host("n2", 0, 2, &[("cpu", 4)]),
    ]);
    let jobs = vec![jobs(&[("cpu", 100)]).remove(0), gpu_job("gpu", 100)];
    let plan = plan_of(&c1, &jobs);
    assert_eq!(
        plan.drains,
        [Drain {
            job: job("cpu"),
            cluster: "c1".into(),
            slots: 2,
            hosts: vec!["n2".into()],
        }]
    );
    assert!(plan.offers.is_empty(), "{plan:?}");
    // Not while drains are in flight there.
    let mut draining = c1.clone();
    draining.draining.insert(job("cpu"));
    assert!(plan_of(&draining, &jobs).drains.is_empty());
    // Nor for a GPU job that gets nothing there.
    c1.barred.insert(job("gpu"));
    assert!(plan_of(&c1, &jobs).drains.is_empty());
}

fn plan_of(cluster: &ClusterInput, jobs: &[JobInput]) -> Plan {
    plan(
        std::slice::from_ref(cluster),
        jobs,
        &PolicyConfig::default(),
    )
}

#[test]
fn shares_are_whole_tasks_and_the_rest_goes_to_others() {
    // A 4-slot job beside a 1-slot one on 6 slots: one task, and 2.
    assert_eq!(whole_task_targets(6, &[40, 40], &[1, 1], &[4, 1]), [4, 2]);
    assert_eq!(whole_task_targets(6, &[40, 40], &[1, 1], &[1, 4]), [2, 4]);
    // Under half a task rounds down, and the other takes the rest.
    assert_eq!(
        whole_task_targets(9, &[40, 40, 40], &[1, 1, 1], &[8, 1, 1]),
        [0, 5, 4]
    );
    // Within what it wants and what there is.
    assert_eq!(whole_task_targets(6, &[4, 40], &[1, 1], &[4, 1]), [4, 2]);
    assert_eq!(whole_task_targets(3, &[40, 40], &[1, 1], &[4, 1]), [0, 3]);
    let jobs = vec![
        JobInput {
            task_slots: 4,
            ..jobs(&[("wide", 40)]).remove(0)
        },
        jobs(&[("narrow", 40)]).remove(0),
    ];
    let plan = plan(
        &[cluster("c1", 6, 6, 0, &[])],
        &jobs,
        &PolicyConfig::default(),
    );
    assert_eq!(offered(&plan, "wide", "c1"), 4);
    assert_eq!(offered(&plan, "narrow", "c1"), 2);
}

#[test]
fn equipartition_is_even_capped_and_complete() {
    assert_eq!(equipartition(8, &[100, 100]), [4, 4]);
    assert_eq!(equipartition(7, &[100, 100, 100]), [3, 2, 2]);
    assert_eq!(equipartition(10, &[2, 100, 100]), [2, 4, 4]);
    assert_eq!(equipartition(10, &[1, 2]), [1, 2]);
    assert_eq!(equipartition(0, &[5]), [0]);
    assert!(equipartition(5, &[]).is_empty());
}

#[test]
fn weighted_equipartition_is_proportional_capped_and_complete() {
    assert_eq!(weighted_equipartition(9, &[100, 100], &[2, 1]), [6, 3]);
    assert_eq!(
        weighted_equipartition(10, &[2, 100, 100], &[4, 1, 1]),
        [2, 4, 4]
    );
    assert_eq!(weighted_equipartition(7, &[100, 100], &[3, 1]), [5, 2]);
    assert_eq!(
        weighted_equipartition(3, &[100, 100, 100], &[5, 1, 1]),
        [2, 1, 0]
    );
    assert_eq!(weighted_equipartition(5, &[1, 1], &[2, 1]), [1, 1]);
}

#[test]
fn weights_share_under_both_policies_and_drains_restore_them() {
    let weighted = |demands: &[(&str, u32, u32)]| -> Vec<JobInput> {
        demands
            .iter()
            .map(|(j, d, w)| JobInput {
                id: job(j),
                demand: *d,
                weight: *w,
                task_slots: 1,
                gpus: 0,
            })
            .collect()
    };
    let jobs = weighted(&[("a", 100, 2), ("b", 100, 1)]);
    for policy in [CsPolicy::SiteEquipartition, CsPolicy::GridEquipartition] {
        let config = PolicyConfig {
            policy,
            ..PolicyConfig::default()
        };
        let plan = plan(&[cluster("c1", 12, 12, 0, &[])], &jobs, &config);
        assert_eq!(
            (offered(&plan, "a", "c1"), offered(&plan, "b", "c1")),
            (8, 4),
            "{policy:?}"
        );
    }
    // b came first and holds all: a drain gives a its double share.
    let plan = plan(
        &[cluster("c1", 12, 0, 0, &[("b", 12)])],
        &jobs,
        &PolicyConfig::default(),
    );
    assert_eq!(
        plan.drains.iter().map(|d| d.slots).sum::<u32>(),
        8,
        "{plan:?}"
    );
}

#[test]
fn sep_splits_each_cluster_evenly() {
    let clusters = [cluster("c1", 8, 8, 0, &[]), cluster("c2", 5, 5, 0, &[])];
    let plan = plan(
        &clusters,
        &jobs(&[("a", 100), ("b", 100)]),
        &PolicyConfig::default(),
    );
    assert_eq!(
        (offered(&plan, "a", "c1"), offered(&plan, "b", "c1")),
        (4, 4)
    );
    assert_eq!(offered(&plan, "a", "c2") + offered(&plan, "b", "c2"), 5);
    assert!(offered(&plan, "a", "c2").abs_diff(offered(&plan, "b", "c2")) <= 1);
    assert!(plan.drains.is_empty());
}

#[test]
fn odd_slots_go_to_the_job_holding_least() {
    let clusters = [cluster("c1", 8, 1, 0, &[("a", 4), ("b", 3)])];
    let plan = plan(
        &clusters,
        &jobs(&[("a", 50), ("b", 50)]),
        &PolicyConfig::default(),
    );
    assert_eq!(offered(&plan, "b", "c1"), 1);
    assert_eq!(offered(&plan, "a", "c1"), 0);
}

#[test]
fn never_more_than_a_job_can_use() {
    let clusters = [cluster("c1", 8, 8, 0, &[])];
    let plan = plan(
        &clusters,
        &jobs(&[("a", 2), ("b", 100)]),
        &PolicyConfig::default(),
    );
    assert_eq!(offered(&plan, "a", "c1"), 2);
    assert_eq!(offered(&plan, "b", "c1"), 6);
    let plan2 = super::plan(&clusters, &jobs(&[("a", 0)]), &PolicyConfig::default());
    assert!(plan2.offers.is_empty());
}

#[test]
fn load_cap_stops_growth() {
    let busy = [cluster("c1", 10, 2, 8, &[])];
    assert!(
        plan(&busy, &jobs(&[("a", 5)]), &PolicyConfig::default())
            .offers
            .is_empty()
    );
    let fine = [cluster("c1", 10, 3, 7, &[])];
    assert_eq!(
        plan(&fine, &jobs(&[("a", 5)]), &PolicyConfig::default())
            .offers
            .len(),
        1
    );
}

#[test]
fn excluded_clusters_get_no_grows() {
    let mut c = cluster("c1", 8, 8, 0, &[]);
    c.excluded = true;
    assert!(
        plan(&[c], &jobs(&[("a", 5)]), &PolicyConfig::default())
            .offers
            .is_empty()
    );
}

#[test]
fn gep_splits_the_grid_total() {
    let clusters = [cluster("c1", 6, 6, 0, &[]), cluster("c2", 2, 2, 0, &[])];
    let config = PolicyConfig {
        policy: CsPolicy::GridEquipartition,
        ..PolicyConfig::default()
    };
    let plan = plan(&clusters, &jobs(&[("a", 100), ("b", 100)]), &config);
    let a = offered(&plan, "a", "c1") + offered(&plan, "a", "c2");
    let b = offered(&plan, "b", "c1") + offered(&plan, "b", "c2");
    assert_eq!((a, b), (4, 4));
    assert_eq!(
        offered(&plan, "a", "c1"),
        4,
        "GEP may put a job on one cluster"
    );
}

fn koala_gep() -> PolicyConfig {
    PolicyConfig {
        policy: CsPolicy::KoalaGridEquipartition,
        ..PolicyConfig::default()
    }
}

#[test]
fn policies_parse_by_name_and_alias() {
    for policy in [
        CsPolicy::SiteEquipartition,
        CsPolicy::GridEquipartition,
        CsPolicy::KoalaGridEquipartition,
    ] {
        assert_eq!(policy.name().parse::<CsPolicy>(), Ok(policy));
    }
    assert_eq!(
        "koala-gep".parse::<CsPolicy>(),
        Ok(CsPolicy::KoalaGridEquipartition)
    );
    let refused = "fair".parse::<CsPolicy>().unwrap_err();
    assert!(refused.contains("koala-grid-equipartition"), "{refused}");
}

#[test]
fn koala_gep_splits_idle_slots_evenly_whatever_the_jobs_hold() {
    // a holds 30 of 50; b holds none; 20 are idle.
    let clusters = [cluster("c1", 50, 20, 0, &[("a", 30)])];
    let demands = jobs(&[("a", 100), ("b", 100)]);
    let plan = plan(&clusters, &demands, &koala_gep());
    assert_eq!(
        (offered(&plan, "a", "c1"), offered(&plan, "b", "c1")),
        (10, 10)
    );
    // gleaner's GEP fills the gap of the job holding none.
    let gep = PolicyConfig {
        policy: CsPolicy::GridEquipartition,
        ..PolicyConfig::default()
    };
    let plan = super::plan(&clusters, &demands, &gep);
    assert_eq!(
        (offered(&plan, "a", "c1"), offered(&plan, "b", "c1")),
        (0, 20)
    );
}

#[test]
fn koala_gep_takes_a_share_wherever_slots_are_idle() {
    // a's slots are all on c2; its share comes from c1, which has most.
    let clusters = [
        cluster("c1", 10, 8, 0, &[]),
        cluster("c2", 10, 2, 0, &[("a", 8)]),
    ];
    let plan = plan(&clusters, &jobs(&[("a", 100), ("b", 100)]), &koala_gep());
    assert_eq!(offered(&plan, "b", "c1") + offered(&plan, "b", "c2"), 5);
    assert_eq!(offered(&plan, "a", "c1") + offered(&plan, "a", "c2"), 5);
    assert_eq!(offered(&plan, "b", "c1"), 5, "b's from c1 first");
    // Within demand: what one cannot use goes to the other.
    let plan = super::plan(&clusters, &jobs(&[("a", 2), ("b", 100)]), &koala_gep());
    assert_eq!(offered(&plan, "a", "c1") + offered(&plan, "a", "c2"), 2);
    assert_eq!(offered(&plan, "b", "c1") + offered(&plan, "b", "c2"), 8);
}

#[test]
fn koala_gep_never_drains() {
    let full = [cluster("c1", 8, 0, 0, &[("a", 8)])];
    let plan = plan(&full, &jobs(&[("a", 50), ("b", 50)]), &koala_gep());
    assert_eq!(plan, Plan::default(), "b waits for idle slots");
    // Nor for GPU jobs kept off GPUs by CPU launchers.
    let mut c1 = cluster("c1", 8, 0, 0, &[("cpu", 8)]);
    c1.gpu_hosts = Some(vec![
        gpu_host("n1", 0, 0, &[("cpu", 4)]),
        gpu_host("n2", 0, 2, &[("cpu", 4)]),
    ]);
    let demands = vec![jobs(&[("cpu", 100)]).remove(0), gpu_job("gpu", 100)];
    assert_eq!(plan_of(&c1, &demands).drains.len(), 1, "gleaner's SEP does");
    assert_eq!(super::plan(&[c1], &demands, &koala_gep()), Plan::default());
}

#[test]
fn koala_gep_grows_nowhere_once_the_grid_is_loaded() {
    // c1 alone is loaded past the cap, the grid is not: its idle slot
    // is shared too.
    let clusters = [cluster("c1", 10, 1, 9, &[]), cluster("c2", 10, 10, 0, &[])];
    let plan = plan(&clusters, &jobs(&[("a", 100)]), &koala_gep());
    assert_eq!(offered(&plan, "a", "c1") + offered(&plan, "a", "c2"), 11);
    let loaded = [cluster("c1", 10, 1, 9, &[]), cluster("c2", 10, 3, 7, &[])];
    assert!(
        super::plan(&loaded, &jobs(&[("a", 100)]), &koala_gep())
            .offers
            .is_empty(),
        "16 of 20 used by others: 80 %"
    );
}

#[test]
fn a_late_job_gets_its_share_by_draining_the_others() {
    let full = [cluster("c1", 8, 0, 0, &[("a", 8)])];
    let plan = plan(
        &full,
        &jobs(&[("a", 50), ("b", 50)]),
        &PolicyConfig::default(),
    );
    assert_eq!(
        plan.drains,
        [Drain {
            job: job("a"),
            cluster: "c1".into(),
            slots: 4,
            hosts: Vec::new(),
        }]
    );
    let no_rebalance = PolicyConfig {
        rebalance: false,
        ..PolicyConfig::default()
    };
    assert!(
        super::plan(&full, &jobs(&[("a", 50), ("b", 50)]), &no_rebalance)
            .drains
            .is_empty()
    );
}

#[test]
fn nearly_even_holdings_are_left_alone() {
    let c = [cluster("c1", 7, 0, 0, &[("a", 4), ("b", 3)])];
    assert!(
        plan(&c, &jobs(&[("a", 50), ("b", 50)]), &PolicyConfig::default())
            .drains
            .is_empty()
    );
    let c = [cluster("c1", 8, 0, 0, &[("a", 6), ("b", 2)])];
    let plan = plan(&c, &jobs(&[("a", 50), ("b", 1)]), &PolicyConfig::default());
    assert_eq!(plan.drains[0].slots, 1, "only what the hungry job can use");
}

#[test]
fn shrinks_are_split_between_holders() {
    let held: BTreeMap<JobId, u32> = [(job("a"), 5), (job("b"), 3), (job("c"), 0)].into();
    assert_eq!(split_shrink(4, &held), [(job("a"), 2), (job("b"), 2)]);
    assert_eq!(split_shrink(5, &held), [(job("a"), 3), (job("b"), 2)]);
    assert_eq!(split_shrink(20, &held), [(job("a"), 5), (job("b"), 3)]);
    assert!(split_shrink(0, &held).is_empty());
}
