use super::*;

fn job(name: &str) -> JobId {
    format!("{name}-0000000000000000").parse().unwrap()
}

fn host(name: &str, slots: u32, free: u32, held: &[(&str, u32)]) -> HostLoad {
    HostLoad {
        name: name.into(),
        slots,
        free,
        held: held.iter().map(|(j, n)| (job(j), *n)).collect(),
        ..HostLoad::default()
    }
}

fn order(name: &str, slots: u32, hosts: &[&str]) -> ShrinkOrder {
    ShrinkOrder {
        job: job(name),
        slots,
        hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
    }
}

fn plan(
    waiting: &[WaitingJob],
    hosts: &[HostLoad],
    answered: &mut Answered,
    now: u64,
) -> LocalPlan {
    let state = LocalState {
        waiting,
        hosts,
        pending_placeholders: &[],
        planned: &BTreeSet::new(),
    };
    on_local_wait(state, answered, now, 5000)
}

#[test]
fn nothing_waits_nothing_happens() {
    let hosts = [host("n1", 8, 0, &[("a", 8)])];
    let state = LocalState {
        waiting: &[],
        hosts: &hosts,
        pending_placeholders: &["1.2".into()],
        planned: &BTreeSet::new(),
    };
    assert_eq!(
        on_local_wait(state, &mut Answered::default(), 0, 5000),
        LocalPlan::default()
    );
}

#[test]
fn pending_placeholders_go_first_and_the_need_is_split_once() {
    let hosts = [host("n1", 8, 0, &[("a", 4), ("b", 4)])];
    let waiting = [WaitingJob::anywhere("7", 4)];
    let pending = ["9.1".to_owned(), "9.2".to_owned()];
    let state = LocalState {
        waiting: &waiting,
        hosts: &hosts,
        pending_placeholders: &pending,
        planned: &BTreeSet::new(),
    };
    let plan = on_local_wait(state, &mut Answered::default(), 0, 5000);
    assert_eq!(plan.withdraw, pending);
    assert_eq!(
        plan.shrink,
        [order("a", 2, &[]), order("b", 2, &[])],
        "4 slots in all, not 4 each"
    );
}

#[test]
fn idle_slots_count_and_a_wait_is_answered_once() {
    let mut answered = Answered::default();
    let hosts = [host("n1", 8, 2, &[("a", 6)])];
    let w = [WaitingJob::anywhere("7", 4)];
    assert_eq!(
        plan(&w, &hosts, &mut answered, 0).shrink,
        [order("a", 2, &[])]
    );
    // Still waiting a second later: the order is under way.
    let hosts = [host("n1", 8, 4, &[("a", 4)])];
    assert!(plan(&w, &hosts, &mut answered, 1000).shrink.is_empty());
    // A new local job arrives; the 4 idle slots are meant for the first one.
    let w2 = [WaitingJob::anywhere("7", 4), WaitingJob::anywhere("8", 2)];
    assert_eq!(
        plan(&w2, &hosts, &mut answered, 1500).shrink,
        [order("a", 2, &[])]
    );
    // Still waiting after the settle time: answered again.
    let hosts = [host("n1", 8, 0, &[("a", 8)])];
    assert_eq!(
        plan(&w, &hosts, &mut answered, 7000).shrink,
        [order("a", 4, &[])]
    );
}

#[test]
fn slots_taken_by_another_job_are_asked_for_again_once_the_launchers_left() {
    let mut answered = Answered::default();
    let w = [WaitingJob::anywhere("7", 4)];
    let hosts = [host("n1", 8, 2, &[("a", 6)])];
    assert_eq!(
        plan(&w, &hosts, &mut answered, 0).shrink,
        [order("a", 2, &[])]
    );
    // The launchers left, but a grid component the batch system
    // started first took their slots: the job is answered again at
    // once, not after the settle time.
    let hosts = [host("n1", 8, 0, &[("a", 4)])];
    assert_eq!(
        plan(&w, &hosts, &mut answered, 1000).shrink,
        [order("a", 4, &[])]
    );
    // Those launchers have not left yet: nothing more.
    assert!(plan(&w, &hosts, &mut answered, 2000).shrink.is_empty());
}

#[test]
fn a_planned_job_that_waits_for_the_clusters_own_jobs_too_costs_nothing_until_they_leave() {
    let w = [WaitingJob::anywhere("7", 8)];
    let planned = BTreeSet::from(["7"]);
    let plan_for = |hosts: &[HostLoad], planned: &BTreeSet<&str>, answered: &mut Answered, now| {
        let state = LocalState {
            waiting: &w,
            hosts,
            pending_placeholders: &[],
            planned,
        };
        on_local_wait(state, answered, now, 5000)
    };
    // 7 slots held by the cluster's own jobs, 1 by gleaner: gleaner
    // leaving would only leave a hole in the batch system's plan…
    let busy = [host("n1", 8, 0, &[("a", 1)])];
    let mut answered = Answered::default();
    let early = plan_for(&busy, &planned, &mut answered, 0);
    assert!(
        early.shrink.is_empty() && early.unplaceable.is_empty(),
        "{early:?}"
    );
    // …until they left 4 free: gleaner's 4 are what is missing, at once.
    let left = [host("n1", 8, 4, &[("a", 4)])];
    assert_eq!(
        plan_for(&left, &planned, &mut answered, 100).shrink,
        [order("a", 4, &[])]
    );
    // A job whose start nothing plans gets room at once, never more
    // than gleaner holds.
    let unplanned = plan_for(&busy, &BTreeSet::new(), &mut Answered::default(), 0);
    assert_eq!(unplanned.shrink, [order("a", 1, &[])]);
}

#[test]
fn a_one_host_job_empties_the_cheapest_host_only() {
    // n2 has 1 slot idle: it costs 3 preempted slots, the others 4.
    let hosts = [
        host("n1", 4, 0, &[("a", 4)]),
        host("n2", 4, 1, &[("a", 2), ("b", 1)]),
        host("n3", 4, 0, &[("b", 4)]),
    ];
    let w = [WaitingJob::one_host("7", 4)];
    let plan = plan(&w, &hosts, &mut Answered::default(), 0);
    assert_eq!(
        plan.shrink,
        [order("a", 2, &["n2"]), order("b", 1, &["n2"])]
    );
    assert!(plan.unplaceable.is_empty());
}

#[test]
fn local_work_on_a_host_rules_it_out() {
    // n1 runs a 2-slot local job: 4 slots can never be had there.
    let hosts = [host("n1", 4, 0, &[("a", 2)]), host("n2", 4, 0, &[("a", 4)])];
    let w = [WaitingJob::one_host("7", 4)];
    assert_eq!(
        plan(&w, &hosts, &mut Answered::default(), 0).shrink,
        [order("a", 4, &["n2"])]
    );
}

#[test]
fn two_one_host_jobs_empty_two_hosts_and_no_more() {
    let hosts = [
        host("n1", 4, 0, &[("a", 4)]),
        host("n2", 4, 0, &[("a", 4)]),
        host("n3", 4, 0, &[("a", 4)]),
    ];
    let w = [WaitingJob::one_host("7", 4), WaitingJob::one_host("8", 4)];
    let mut answered = Answered::default();
    assert_eq!(
        plan(&w, &hosts, &mut answered, 0).shrink,
        [order("a", 4, &["n1"]), order("a", 4, &["n2"])]
    );
    // A poll later n1 is free and its job started; n2 is being emptied.
    let hosts = [
        host("n1", 4, 0, &[]),
        host("n2", 4, 2, &[("a", 2)]),
        host("n3", 4, 0, &[("a", 4)]),
    ];
    let w = [WaitingJob::one_host("8", 4)];
    assert!(plan(&w, &hosts, &mut answered, 1000).shrink.is_empty());
}

/// A host whose launchers hold memory and GPUs beside their slots.
fn rich_host(
    name: &str,
    free_memory_mb: u64,
    free_gpus: u32,
    held: &[(&str, u32, u64, u32)],
) -> HostLoad {
    HostLoad {
        free_memory_mb: Some(free_memory_mb),
        free_gpus: Some(free_gpus),
        held_needs: held
            .iter()
            .map(|(j, _, memory_mb, gpus)| {
                let needs = Needs {
                    memory_mb: *memory_mb,
                    gpus: *gpus,
                };
                (job(j), needs)
            })
            .collect(),
        ..host(
            name,
            4,
            0,
            &held.iter().map(|(j, n, _, _)| (*j, *n)).collect::<Vec<_>>(),
        )
    }
}

fn needing(id: &str, slots: u32, memory_mb: u64, gpus: u32) -> WaitingJob {
    WaitingJob {
        needs: Needs { memory_mb, gpus },
        ..WaitingJob::anywhere(id, slots)
    }
}

#[test]
fn a_memory_bound_job_frees_memory_where_it_costs_least() {
    // n1's launchers hold all its memory; n2's hold none of theirs.
    let hosts = [
        rich_host("n1", 0, 0, &[("mem", 4, 4000, 0)]),
        rich_host("n2", 4000, 0, &[("cpu", 4, 0, 0)]),
    ];
    let big = needing("7", 1, 3000, 0);
    let p = plan(
        std::slice::from_ref(&big),
        &hosts,
        &mut Answered::default(),
        0,
    );
    assert_eq!(p.shrink, vec![order("cpu", 1, &["n2"])]);
    // Where the others' memory is taken by someone else, only n1 can.
    let hosts = [
        hosts[0].clone(),
        rich_host("n2", 1000, 0, &[("cpu", 4, 0, 0)]),
    ];
    let p = plan(&[big], &hosts, &mut Answered::default(), 0);
    assert_eq!(p.shrink, vec![order("mem", 3, &["n1"])], "3 × 1000M");
    assert!(p.unplaceable.is_empty());
}

#[test]
fn a_wide_launchers_gpu_is_freed_though_each_slot_holds_a_fraction() {
    // Launchers of 4 slots and 1 GPU: a quarter GPU per slot.
    let hosts = [rich_host("n1", 4000, 0, &[("wide", 8, 0, 2)])];
    let p = plan(
        &[needing("12", 1, 0, 1)],
        &hosts,
        &mut Answered::default(),
        0,
    );
    assert_eq!(
        p.shrink,
        vec![order("wide", 4, &["n1"])],
        "one whole launcher"
    );
    assert!(p.unplaceable.is_empty());
}

#[test]
fn slots_anywhere_come_from_launchers_without_gpus_first() {
    let hosts = [rich_host(
        "n1",
        4000,
        0,
        &[("cpu", 2, 0, 0), ("gpu", 2, 0, 2)],
    )];
    let p = plan(
        &[WaitingJob::anywhere("14", 2)],
        &hosts,
        &mut Answered::default(),
        0,
    );
    assert_eq!(p.shrink, vec![order("cpu", 2, &[])]);
    let p = plan(
        &[WaitingJob::anywhere("15", 3)],
        &hosts,
        &mut Answered::default(),
        0,
    );
    assert_eq!(p.shrink, vec![order("cpu", 2, &[]), order("gpu", 1, &[])]);
}

#[test]
fn single_slots_with_memory_may_share_a_host() {
    // Four slots anywhere, 500M each: n1 has room for all of them.
    let hosts = [
        rich_host("n1", 4000, 0, &[("cpu", 4, 0, 0)]),
        rich_host("n2", 0, 0, &[("mem", 4, 4000, 0)]),
    ];
    let p = plan(
        &[needing("11", 4, 2000, 0)],
        &hosts,
        &mut Answered::default(),
        0,
    );
    assert_eq!(p.shrink, vec![order("cpu", 4, &["n1"])]);
    assert!(p.unplaceable.is_empty());
}

#[test]
fn a_gpu_job_preempts_a_gpu_launcher_not_a_cpu_one() {
    let hosts = [rich_host(
        "n1",
        4000,
        0,
        &[("cpu", 2, 0, 0), ("gpu", 2, 0, 2)],
    )];
    let p = plan(
        &[needing("8", 1, 0, 1)],
        &hosts,
        &mut Answered::default(),
        0,
    );
    assert_eq!(p.shrink, vec![order("gpu", 1, &["n1"])]);
}

#[test]
fn a_gpu_job_goes_where_the_gpus_are_not_to_a_host_without() {
    // `cpu-only` has free slots but no GPUs; `gpus` is full.
    let cpu_only = HostLoad {
        free_gpus: None,
        ..host("cpu-only", 4, 4, &[])
    };
    let hosts = [cpu_only, rich_host("gpus", 0, 0, &[("gpu", 4, 0, 4)])];
    let p = plan(
        &[needing("13", 1, 0, 1)],
        &hosts,
        &mut Answered::default(),
        0,
    );
    assert_eq!(p.shrink, vec![order("gpu", 1, &["gpus"])]);
}

#[test]
fn more_memory_or_gpus_than_any_host_has_preempts_nothing() {
    let hosts = [
        rich_host("n1", 0, 0, &[("mem", 4, 4000, 0)]),
        rich_host("n2", 0, 2, &[("gpu", 4, 4000, 0)]),
    ];
    for job in [needing("9", 1, 5000, 0), needing("10", 1, 0, 3)] {
        let p = plan(
            std::slice::from_ref(&job),
            &hosts,
            &mut Answered::default(),
            0,
        );
        assert!(p.shrink.is_empty(), "{p:?}");
        assert_eq!(p.unplaceable, vec![job.id]);
    }
}

#[test]
fn a_job_no_host_can_take_preempts_nothing_however_often_it_is_seen() {
    let hosts = [host("n1", 4, 0, &[("a", 4)]), host("n2", 4, 0, &[("a", 4)])];
    let w = [WaitingJob::one_host("7", 5)];
    let mut answered = Answered::default();
    for (now, told) in [(0, true), (1000, false), (6000, true), (7000, false)] {
        let plan = plan(&w, &hosts, &mut answered, now);
        assert!(plan.shrink.is_empty());
        assert_eq!(plan.unplaceable.len(), usize::from(told), "once a settle");
    }
}

#[test]
fn fixed_allocations_take_a_chunk_per_host() {
    // 4 slots, 2 per host (Grid Engine allocation_rule 2).
    let hosts = [
        host("n1", 4, 2, &[("a", 2)]),
        host("n2", 4, 1, &[("a", 3)]),
        host("n3", 4, 0, &[("a", 4)]),
    ];
    let w = [WaitingJob {
        together: 2,
        ..WaitingJob::anywhere("7", 4)
    }];
    assert_eq!(
        plan(&w, &hosts, &mut Answered::default(), 0).shrink,
        [order("a", 1, &["n2"])],
        "n1's 2 idle slots, then n2 at the cost of 1"
    );
}

#[test]
fn an_exclusive_job_wants_a_host_with_nothing_else_on_it() {
    let hosts = [
        host("n1", 4, 3, &[]),
        host("n2", 4, 0, &[("a", 4)]),
        host("n3", 4, 2, &[("a", 2)]),
    ];
    // n1 has a 1-slot local job: not exclusive however free.
    let w = [WaitingJob {
        exclusive: true,
        ..WaitingJob::anywhere("7", 1)
    }];
    assert_eq!(
        plan(&w, &hosts, &mut Answered::default(), 0).shrink,
        [order("a", 2, &["n3"])]
    );
}

#[test]
fn a_one_slot_job_asks_for_one_slot_anywhere() {
    // One 4-slot launcher per host: the runner preempts one whole.
    let hosts = [host("n1", 4, 0, &[("a", 4)]), host("n2", 4, 0, &[("a", 4)])];
    let w = [WaitingJob::one_host("7", 1)];
    assert_eq!(
        plan(&w, &hosts, &mut Answered::default(), 0).shrink,
        [order("a", 1, &[])]
    );
}

#[test]
fn chunks_cover_the_slots() {
    let chunks = |slots, together| {
        WaitingJob {
            together,
            ..WaitingJob::anywhere("x", slots)
        }
        .chunks()
    };
    assert_eq!(chunks(4, 4), [4]);
    assert_eq!(chunks(4, 2), [2, 2]);
    assert_eq!(chunks(5, 2), [2, 2, 1]);
    assert_eq!(chunks(3, 8), [3]);
    assert_eq!(chunks(0, 1), [1], "a job asks for a slot at least");
}
