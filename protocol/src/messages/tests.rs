use super::*;

/// The serde tag of a message, as it travels in the body.
fn tag<M: Message>(msg: &M) -> String {
    let value = serde_json::to_value(msg).unwrap();
    value["type"].as_str().unwrap_or_default().to_owned()
}

fn assert_kinds<M: Message>(messages: &[M]) {
    for msg in messages {
        assert_eq!(msg.kind(), tag(msg));
    }
}

fn job() -> JobId {
    JobId::new("j", 1)
}

fn report() -> JobReport {
    JobReport {
        task_needs: Default::default(),
        job: job(),
        owner: "alice".into(),
        kind: JobKind::Scavenge,
        priority: Priority::Low,
        state: JobState::Running,
        runner: "r".into(),
        tasks: TaskCounts::default(),
        launchers: BTreeMap::new(),
        throughput: 0.0,
        preemptions: 0,
        started_at: 0,
        results: "results/j-1".into(),
        components: Vec::new(),
        max_slots: None,
        problem: None,
        gathering: None,
        avoid: Vec::new(),
        moldable: Vec::new(),
        inputs: Vec::new(),
        component_inputs: Vec::new(),
        weight: 1,
        task_slots: 1,
        open: false,
    }
}

#[test]
fn a_grid_jobs_inputs_travel_once_and_read_as_each_components() {
    let paths = |names: &[&str]| names.iter().map(|n| format!("/d/{n}")).collect::<Vec<_>>();
    let shared = paths(&["a", "b"]);
    let once = JobReport {
        kind: JobKind::Grid,
        components: vec![4, 2, 1],
        inputs: shared.clone(),
        component_inputs: vec![paths(&["own"]), Vec::new(), Vec::new()],
        ..report()
    };
    let each = once.inputs_by_component();
    assert_eq!(
        each,
        [paths(&["a", "b", "own"]), shared.clone(), shared.clone()]
    );
    // An older runner's report, each component's in full, reads alike.
    let older = JobReport {
        inputs: Vec::new(),
        component_inputs: each.clone(),
        ..once.clone()
    };
    assert_eq!(older.inputs_by_component(), each);
    let bytes = |r: &JobReport| rmp_serde::to_vec_named(r).unwrap().len();
    assert!(bytes(&once) < bytes(&older));
    let bare = once.without_inputs();
    assert!(bare.inputs.is_empty() && bare.inputs_by_component().is_empty());
    let none = JobReport {
        components: vec![1, 1],
        ..report()
    };
    assert!(none.inputs_by_component().is_empty(), "none has any");
}

#[test]
fn kinds_are_the_serde_tags() {
    assert_kinds(&[
        SchedulerMsg::JobUpdate(report()),
        SchedulerMsg::JobDone { job: job() },
        SchedulerMsg::ClusterStatus(ClusterReport::default()),
        SchedulerMsg::GrowAck {
            grant: GrantId::new(1),
            job: job(),
            cluster: "c".into(),
            accepted: 1,
        },
    ]);
    assert_kinds(&[
        RequestMsg::Status { job: None },
        RequestMsg::Cancel { job: job() },
    ]);
    let spec = ComponentSpec {
        needs: Default::default(),
        job: job(),
        component: 0,
        slots: 1,
        command: "true".into(),
        env: Vec::new(),
        walltime_ms: None,
        workdir: None,
        owner: "alice".into(),
        checkpoint: None,
        inputs: Vec::new(),
    };
    assert_kinds(&[
        KcmMsg::StartLaunchers {
            job: job(),
            grant: GrantId::new(1),
            slots: 1,
            task_slots: 1,
            task_needs: Default::default(),
            owner: "alice".into(),
            credentials: None,
        },
        KcmMsg::Release {
            job: job(),
            launchers: Vec::new(),
            grace_ms: 0,
        },
        KcmMsg::JobEnded { job: job() },
        KcmMsg::SubmitComponent(spec),
        KcmMsg::Go {
            job: job(),
            component: 0,
            hosts: vec![vec![HostSlots {
                host: "n1".into(),
                slots: 2,
            }]],
        },
        KcmMsg::WithdrawComponent {
            job: job(),
            component: 0,
        },
        KcmMsg::PreemptComponents {
            job: job(),
            signal: "TERM".into(),
            grace_ms: 0,
        },
    ]);
    assert_kinds(&[
        ControlMsg::GrowOffer {
            grant: GrantId::new(1),
            cluster: "c".into(),
            slots: 1,
        },
        ControlMsg::Shrink {
            cluster: "c".into(),
            slots: 1,
            mode: ShrinkMode::Drain,
            reason: String::new(),
            hosts: Vec::new(),
        },
        ControlMsg::LauncherUp(LauncherInfo {
            launcher: "l".into(),
            cluster: "c".into(),
            host: "h".into(),
            slots: 1,
            started_at: 0,
            deadline: None,
            heartbeat_ms: None,
        }),
        ControlMsg::LauncherStatus(LauncherStatus {
            launcher: "l".into(),
            cluster: "c".into(),
            host: "h".into(),
            running: Vec::new(),
            completed: 0,
            heartbeat_ms: None,
        }),
        ControlMsg::LauncherGone {
            launcher: "l".into(),
            cluster: "c".into(),
            reason: String::new(),
        },
        ControlMsg::Cancel {
            reason: String::new(),
        },
        ControlMsg::Place {
            clusters: Vec::new(),
            stage_ms: 0,
            start_ms: 0,
            slots: Vec::new(),
        },
        ControlMsg::Move {
            component: 0,
            from: "c1".into(),
            to: "c2".into(),
            start_ms: 0,
        },
        ControlMsg::ComponentQueued {
            component: 0,
            cluster: "c1".into(),
        },
        ControlMsg::PlacementFailed {
            reason: String::new(),
        },
        ControlMsg::ComponentEnded(ComponentOutcome {
            component: 0,
            cluster: "c".into(),
            exit_code: None,
            runtime_ms: 0,
            stdout: Captured::default(),
            stderr: Captured::default(),
            preempted: false,
        }),
        ControlMsg::ComponentWithdrawn {
            component: 0,
            cluster: "c".into(),
            reason: String::new(),
        },
        ControlMsg::ComponentStarted {
            component: 0,
            cluster: "c".into(),
            hosts: Vec::new(),
        },
        ControlMsg::StepAside {
            reason: String::new(),
        },
        ControlMsg::Follow {
            task: 0,
            reply_to: None,
        },
        ControlMsg::Output(piece()),
    ]);
    assert_kinds(&[
        LauncherMsg::Preempt {
            reason: String::new(),
        },
        LauncherMsg::Drain {
            reason: String::new(),
        },
        LauncherMsg::Poll {},
        LauncherMsg::Follow { task: 0, for_ms: 0 },
    ]);
    assert_kinds(&[
        Event::Progress(report()),
        Event::Done(report()),
        Event::Rejected {
            job: "j-1".into(),
            owner: "alice".into(),
            reason: String::new(),
            submission: Some(7),
            live_job: false,
        },
        Event::Cluster(ClusterReport::default()),
    ]);
}

fn piece() -> OutputPiece {
    OutputPiece {
        task: 3,
        attempt: 1,
        preemptions: 0,
        launcher: "c1-7".into(),
        stdout: StreamPiece {
            offset: 7,
            data: b"line\n".to_vec(),
        },
        stderr: StreamPiece::default(),
        ended: false,
    }
}

#[test]
fn a_follower_reads_the_schedulers_answer_and_the_pieces_alike() {
    for (answer, followed) in [
        (ActionReply::Accepted {}, Followed::Accepted {}),
        (ActionReply::NotRunning {}, Followed::NotRunning {}),
        (
            ActionReply::Refused {
                reason: "the job is bob's".into(),
            },
            Followed::Refused {
                reason: "the job is bob's".into(),
            },
        ),
    ] {
        let body = crate::codec::encode("scheduler", &answer).unwrap();
        assert_eq!(
            crate::codec::decode::<Followed>(&body).unwrap().msg,
            followed
        );
    }
    let body = crate::codec::encode("runner", &Followed::Output(piece())).unwrap();
    assert_eq!(
        crate::codec::decode::<Followed>(&body).unwrap().msg,
        Followed::Output(piece())
    );
}

#[test]
fn a_piece_is_what_came_since_and_no_more_than_its_bound() {
    let piece = |data: &[u8], dropped, from| {
        let p = StreamPiece::since(data, dropped, from);
        (p.offset, p.data.len())
    };
    assert_eq!(piece(b"hello", 0, 0), (0, 5));
    assert_eq!(piece(b"hello", 0, 3), (3, 2));
    assert_eq!(piece(b"hello", 0, 5), (5, 0));
    assert_eq!(piece(b"hello", 0, 9), (5, 0), "never past the end");
    assert_eq!(piece(b"hello", 100, 0), (100, 5), "from what is kept");
    assert_eq!(piece(b"hello", 100, 102), (102, 3));
    let big = vec![b'x'; MAX_PIECE_BYTES + 10];
    assert_eq!(piece(&big, 0, 0), (10, MAX_PIECE_BYTES), "the last of it");
}

#[test]
fn a_follow_never_takes_its_address_from_the_body() {
    let forged = ControlMsg::Follow {
        task: 1,
        reply_to: Some("gleaner.job.x.tasks".into()),
    };
    let body = crate::codec::encode("launcher", &forged).unwrap();
    let decoded = crate::codec::decode::<ControlMsg>(&body).unwrap().msg;
    assert!(matches!(
        decoded,
        ControlMsg::Follow {
            task: 1,
            reply_to: None
        }
    ));
}

#[test]
fn a_refusal_names_its_submission_and_one_that_does_not_still_reads() {
    let named = Event::Rejected {
        job: "j-1".into(),
        owner: "alice".into(),
        reason: "no".into(),
        submission: Some(u64::MAX),
        live_job: false,
    };
    let body = crate::codec::encode("runner", &named).unwrap();
    let read = crate::codec::decode::<Event>(&body).unwrap().msg;
    assert!(matches!(
        read,
        Event::Rejected {
            submission: Some(u64::MAX),
            ..
        }
    ));
    let before = serde_json::json!({
        "v": crate::PROTOCOL_VERSION,
        "from": "runner",
        "msg": {"type": "rejected", "job": "j-1", "owner": "alice", "reason": "no"},
    });
    let body = rmp_serde::to_vec_named(&before).unwrap();
    let read = crate::codec::decode::<Event>(&body).unwrap().msg;
    assert!(matches!(
        read,
        Event::Rejected {
            submission: None,
            ..
        }
    ));
}

#[test]
fn a_refusal_of_a_live_jobs_id_is_no_end_the_history_keeps() {
    let refusal = |live_job| Event::Rejected {
        job: "j-0000000000000001".into(),
        owner: "alice".into(),
        reason: "job j-0000000000000001 was already submitted".into(),
        submission: Some(8),
        live_job,
    };
    assert!(EndedJob::of(&refusal(true), 1).is_none());
    assert!(EndedJob::of(&refusal(false), 1).is_some());
}

#[test]
fn a_host_lists_bytes_are_counted_at_least_as_sent() {
    for name in ["a", &"n".repeat(31), &"n".repeat(253)] {
        let hosts = vec![
            HostSlots {
                host: name.to_owned(),
                slots: u32::MAX,
            };
            1000
        ];
        let go = KcmMsg::Go {
            job: JobId::new("j", 1),
            component: 0,
            hosts: vec![hosts.clone()],
        };
        let sent = rmp_serde::to_vec_named(&go).unwrap().len();
        let counted = HostSlots::listed_bytes(&hosts);
        assert!(counted >= sent - 64, "{counted} < {sent}");
        assert!(counted < sent + 2 * 1000, "close to it: {counted}, {sent}");
    }
}

#[test]
fn job_events_carry_their_owner() {
    assert_eq!(
        Event::Done(report()).routing_key(),
        "job.alice.j-0000000000000001.done"
    );
    let anonymous = Event::Rejected {
        job: "j-1".into(),
        owner: String::new(),
        reason: String::new(),
        submission: None,
        live_job: false,
    };
    assert_eq!(anonymous.routing_key(), "job._.j-1.rejected");
}

/// The messages that carry identifiers, as they were when those were
/// bare strings and integers.
mod before {
    use std::collections::BTreeMap;

    use gleaner_manifest::{JobId, JobKind, Priority};
    use serde::Serialize;

    use crate::{Holding, JobState, Millis, TaskCounts};

    #[derive(Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum ControlMsg {
        GrowOffer {
            grant: u64,
            cluster: String,
            slots: u32,
        },
        LauncherGone {
            launcher: String,
            cluster: String,
            reason: String,
        },
        Place {
            clusters: Vec<String>,
        },
    }

    #[derive(Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum KcmMsg {
        StartLaunchers {
            job: JobId,
            grant: u64,
            slots: u32,
            owner: String,
        },
        Release {
            job: JobId,
            launchers: Vec<String>,
            grace_ms: u64,
        },
    }

    #[derive(Serialize)]
    pub struct JobReport {
        pub job: JobId,
        pub owner: String,
        pub kind: JobKind,
        pub priority: Priority,
        pub state: JobState,
        pub runner: String,
        pub tasks: TaskCounts,
        pub launchers: BTreeMap<String, u32>,
        pub throughput: f64,
        pub preemptions: u64,
        pub started_at: Millis,
        pub results: String,
        pub components: Vec<u32>,
    }

    #[derive(Serialize)]
    pub struct ClusterReport {
        pub cluster: String,
        pub backend: String,
        pub total_slots: u32,
        pub idle_slots: u32,
        pub local_slots: u32,
        pub local_waiting: u32,
        pub grid_slots: u32,
        pub jobs: BTreeMap<JobId, Holding>,
        pub grid: BTreeMap<JobId, Holding>,
        pub applied_grants: Vec<u64>,
        pub error: Option<String>,
        pub failed_starts: u32,
        pub at: Millis,
    }
}

/// Asserts that `new` travels exactly as `old` did, as MessagePack and as
/// JSON, and that what `old` sent reads back as `new`.
fn assert_same_encoding<N: Serialize + DeserializeOwned, O: Serialize>(new: &N, old: &O) {
    let old_body = rmp_serde::to_vec_named(old).unwrap();
    assert_eq!(rmp_serde::to_vec_named(new).unwrap(), old_body);
    let read: N = rmp_serde::from_slice(&old_body).unwrap();
    assert_eq!(rmp_serde::to_vec_named(&read).unwrap(), old_body);
    assert_eq!(
        serde_json::to_string(new).unwrap(),
        serde_json::to_string(old).unwrap()
    );
}

/// A succeeded run of `task` that printed `stdout` and sent `outputs`.
fn run_of(task: u64, stdout: Captured, outputs: Vec<OutputFile>) -> ResultMsg {
    ResultMsg {
        peak_memory_mb: None,
        job: job(),
        task,
        attempt: 1,
        preemptions: 0,
        status: RunStatus::Succeeded,
        exit_code: Some(0),
        signal: None,
        runtime_ms: 5,
        launcher: "c1-1".into(),
        cluster: "c1".into(),
        host: "h".into(),
        stdout,
        stderr: Captured::default(),
        outputs,
        error: None,
        parted: None,
    }
}

#[test]
fn a_single_result_reads_as_a_batch_of_one() {
    let printed = Captured {
        data: b"out".to_vec(),
        dropped: 0,
    };
    let result = run_of(7, printed, Vec::new());
    let one = rmp_serde::to_vec_named(&result).unwrap();
    let read: ResultBatch = rmp_serde::from_slice(&one).unwrap();
    assert_eq!(read.results.len(), 1);
    assert_eq!(
        (read.results[0].task, &read.results[0].stdout.data[..]),
        (7, &b"out"[..])
    );
    let batch = ResultBatch {
        results: vec![result.clone(), ResultMsg { task: 8, ..result }],
        part: None,
    };
    let read: ResultBatch =
        rmp_serde::from_slice(&rmp_serde::to_vec_named(&batch).unwrap()).unwrap();
    assert_eq!(
        read.results.iter().map(|r| r.task).collect::<Vec<_>>(),
        [7, 8]
    );
}

#[test]
fn a_run_with_much_output_goes_in_parts_that_put_it_back_together() {
    let printed = Captured {
        data: (0..RESULT_PART_BYTES * 5 / 2).map(|i| i as u8).collect(),
        dropped: 9,
    };
    let file = OutputFile {
        path: "out.bin".into(),
        data: vec![7; RESULT_PART_BYTES * 3],
        dropped: 0,
    };
    let mut run = run_of(3, printed, vec![file]);
    let small = run.clone();
    let (none, same) = ResultMsg {
        outputs: Vec::new(),
        stdout: Captured::default(),
        ..small
    }
    .into_parts(1);
    assert!(
        none.is_empty() && same.parted.is_none(),
        "small runs go whole"
    );

    let whole = run.clone();
    let (parts, stripped) = run.clone().into_parts(42);
    assert_eq!(parts.len(), 3 + 3);
    assert!(
        parts
            .iter()
            .all(|p| p.data.len() <= RESULT_PART_BYTES && p.run == 42)
    );
    assert_eq!(stripped.output_bytes(), 0);
    assert_eq!(stripped.stdout.dropped, 9);
    let parted = stripped.parted.clone().unwrap();
    assert_eq!(
        parted.sizes,
        [
            RESULT_PART_BYTES as u64 * 5 / 2,
            0,
            RESULT_PART_BYTES as u64 * 3
        ]
    );
    run = stripped;
    for part in parts.iter().rev() {
        let data = match part.target {
            0 => &mut run.stdout.data,
            1 => &mut run.stderr.data,
            n => &mut run.outputs[n as usize - 2].data,
        };
        let end = part.offset as usize + part.data.len();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[part.offset as usize..end].copy_from_slice(&part.data);
    }
    assert_eq!(run.stdout, whole.stdout);
    assert_eq!(run.outputs, whole.outputs);
    let encoded = rmp_serde::to_vec_named(&ResultBatch {
        results: Vec::new(),
        part: Some(parts[0].clone()),
    })
    .unwrap();
    let read: ResultBatch = rmp_serde::from_slice(&encoded).unwrap();
    assert_eq!(
        (read.results.len(), read.part.as_ref()),
        (0, Some(&parts[0]))
    );
}

#[test]
fn identifiers_travel_as_the_bare_values_they_were() {
    assert_same_encoding(
        &ControlMsg::GrowOffer {
            grant: GrantId::new(1_700_000_000_042),
            cluster: "c1".into(),
            slots: 3,
        },
        &before::ControlMsg::GrowOffer {
            grant: 1_700_000_000_042,
            cluster: "c1".into(),
            slots: 3,
        },
    );
    assert_same_encoding(
        &ControlMsg::LauncherGone {
            launcher: "c1-4711.3".into(),
            cluster: "c1".into(),
            reason: "preempted".into(),
        },
        &before::ControlMsg::LauncherGone {
            launcher: "c1-4711.3".into(),
            cluster: "c1".into(),
            reason: "preempted".into(),
        },
    );
    assert_same_encoding(
        &ControlMsg::Place {
            clusters: vec!["c1".into(), "c2".into()],
            stage_ms: 0,
            start_ms: 0,
            slots: Vec::new(),
        },
        &before::ControlMsg::Place {
            clusters: vec!["c1".into(), "c2".into()],
        },
    );
    assert_same_encoding(
        &KcmMsg::StartLaunchers {
            job: job(),
            grant: GrantId::new(7),
            slots: 2,
            task_slots: 1,
            task_needs: Default::default(),
            owner: "alice".into(),
            credentials: None,
        },
        &before::KcmMsg::StartLaunchers {
            job: job(),
            grant: 7,
            slots: 2,
            owner: "alice".into(),
        },
    );
    assert_same_encoding(
        &KcmMsg::Release {
            job: job(),
            launchers: vec!["c1-1".into(), "c1-2".into()],
            grace_ms: 3000,
        },
        &before::KcmMsg::Release {
            job: job(),
            launchers: vec!["c1-1".into(), "c1-2".into()],
            grace_ms: 3000,
        },
    );
    let mut new_report = report();
    new_report.launchers = [("c1".into(), 4), ("c2".into(), 1)].into();
    assert_same_encoding(
        &new_report,
        &before::JobReport {
            job: job(),
            owner: "alice".into(),
            kind: JobKind::Scavenge,
            priority: Priority::Low,
            state: JobState::Running,
            runner: "r".into(),
            tasks: TaskCounts::default(),
            launchers: [("c1".to_owned(), 4), ("c2".to_owned(), 1)].into(),
            throughput: 0.0,
            preemptions: 0,
            started_at: 0,
            results: "results/j-1".into(),
            components: Vec::new(),
        },
    );
    let holding = Holding {
        running: 2,
        pending: 1,
    };
    assert_same_encoding(
        &ClusterReport {
            cluster: "c1".into(),
            backend: "sge".into(),
            total_slots: 8,
            jobs: [(job(), holding)].into(),
            applied_grants: vec![GrantId::new(7), GrantId::new(8)],
            at: 1_700_000_000_000,
            ..ClusterReport::default()
        },
        &before::ClusterReport {
            cluster: "c1".into(),
            backend: "sge".into(),
            total_slots: 8,
            idle_slots: 0,
            local_slots: 0,
            local_waiting: 0,
            grid_slots: 0,
            jobs: [(job(), holding)].into(),
            grid: BTreeMap::new(),
            applied_grants: vec![7, 8],
            error: None,
            failed_starts: 0,
            at: 1_700_000_000_000,
        },
    );
}

#[test]
fn a_claim_admits_its_own_submission_only() {
    let alice = JobClaim {
        owner: "alice".into(),
        submission: 7,
    };
    assert_eq!(alice.refusal("j-1", &alice.clone()), None);
    let bob = JobClaim {
        owner: "bob".into(),
        ..alice.clone()
    };
    assert!(bob.refusal("j-1", &alice).unwrap().contains("another user"));
    let again = JobClaim {
        submission: 8,
        ..alice.clone()
    };
    assert!(
        again
            .refusal("j-1", &alice)
            .unwrap()
            .contains("already submitted")
    );
}
