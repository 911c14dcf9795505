use super::*;
use gleaner_protocol::{JobState, RunStatus, TaskCounts};
use indexmap::IndexMap;

fn entry(task: u64, status: FinalStatus) -> IndexEntry {
    IndexEntry {
        peak_memory_mb: None,
        task,
        command: format!("echo {task}"),
        params: IndexMap::new(),
        status,
        exit_code: Some(0),
        attempts: 1,
        preemptions: 0,
        runtime_s: 0.5,
        cluster: Some("local".into()),
        host: Some("h".into()),
        error: None,
        stdout: None,
        stderr: None,
    }
}

#[test]
fn a_pipe_or_a_huge_file_in_the_owners_directory_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(&dir.path().join("job.json"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    assert!(
        ResultsDir::job_file_at(dir.path(), None).is_none(),
        "no wait on a pipe"
    );
    let additions = dir.path().join(ADDITIONS_FILE);
    std::fs::File::create(&additions)
        .unwrap()
        .set_len(MAX_ADDITIONS_FILE + 1)
        .unwrap();
    assert!(read_at_most(&additions, MAX_ADDITIONS_FILE).is_err());
    nix::unistd::mkfifo(
        &dir.path().join("index.jsonl"),
        nix::sys::stat::Mode::S_IRWXU,
    )
    .unwrap();
    assert!(ResultsDir::open(dir.path(), None).is_err());
    for file in [OUTPUT_FILE, ATTEMPTS_FILE] {
        let dir = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&dir.path().join(file), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(
            ResultsDir::open(dir.path(), None).is_err(),
            "a pipe as {file}"
        );
    }
}

#[test]
fn index_survives_reopen_and_a_torn_last_line() {
    let dir = tempfile::tempdir().unwrap();
    let (mut results, finished) = ResultsDir::open(dir.path(), None).unwrap();
    assert!(finished.is_empty());
    results
        .append(vec![
            entry(0, FinalStatus::Succeeded),
            entry(1, FinalStatus::Failed),
        ])
        .unwrap();
    results.sync().unwrap();
    drop(results);
    let index = dir.path().join("index.jsonl");
    let mut file = OpenOptions::new().append(true).open(&index).unwrap();
    // Cut in the middle of a two-byte character.
    file.write_all(
        "{\"task\":2,\"command\":\"é"
            .as_bytes()
            .split_last()
            .unwrap()
            .1,
    )
    .unwrap();
    drop(file);
    let (mut results, finished) = ResultsDir::open(dir.path(), None).unwrap();
    assert_eq!(
        finished,
        [(0, FinalStatus::Succeeded), (1, FinalStatus::Failed)]
    );
    results.append(vec![entry(2, FinalStatus::Lost)]).unwrap();
    let text = std::fs::read_to_string(&index).unwrap();
    assert_eq!(text.lines().count(), 3);
    let line: serde_json::Value = serde_json::from_str(text.lines().nth(2).unwrap()).unwrap();
    assert_eq!(line["status"], "lost");
    assert_eq!(line["command"], "echo 2");
}

/// A task's run with this stdout, stderr and declared files.
fn run(task: u64, stdout: Captured, stderr: &[u8], outputs: Vec<OutputFile>) -> ResultMsg {
    ResultMsg {
        peak_memory_mb: None,
        job: "j-0000000000000000".parse().unwrap(),
        task,
        attempt: 1,
        preemptions: 0,
        status: RunStatus::Succeeded,
        exit_code: Some(0),
        signal: None,
        runtime_ms: 5,
        launcher: "l".into(),
        cluster: "c".into(),
        host: "h".into(),
        stdout,
        stderr: Captured {
            data: stderr.to_vec(),
            dropped: 0,
        },
        outputs,
        error: None,
        parted: None,
    }
}

/// The index line of `task`, and its streams read from `output.log`.
fn streams_of(root: &Path, task: u64) -> (serde_json::Value, String, String) {
    let index = std::fs::read_to_string(root.join("index.jsonl")).unwrap();
    let line: serde_json::Value = index
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["task"] == task)
        .unwrap();
    let log = std::fs::read(root.join(OUTPUT_FILE)).unwrap();
    let read = |span: &serde_json::Value| {
        let (offset, bytes) = (span["offset"].as_u64(), span["bytes"].as_u64());
        match (offset, bytes) {
            (Some(o), Some(b)) => {
                String::from_utf8_lossy(&log[o as usize..(o + b) as usize]).into_owned()
            }
            _ => String::new(),
        }
    };
    let (stdout, stderr) = (read(&line["stdout"]), read(&line["stderr"]));
    (line, stdout, stderr)
}

#[test]
fn streams_go_to_one_log_and_declared_files_are_confined() {
    let dir = tempfile::tempdir().unwrap();
    let (mut results, _) = ResultsDir::open(dir.path(), None).unwrap();
    let result = run(
        7,
        Captured {
            data: b"tail\n".to_vec(),
            dropped: 100,
        },
        b"err\n",
        vec![
            OutputFile {
                path: "plots/a.png".into(),
                data: b"png".to_vec(),
                dropped: 7,
            },
            OutputFile {
                path: "../escape".into(),
                data: b"x".to_vec(),
                dropped: 0,
            },
            OutputFile {
                path: "stdout".into(),
                data: b"x".to_vec(),
                dropped: 0,
            },
        ],
    );
    results.write_outputs(&result, false, None).unwrap();
    results
        .append(vec![entry(7, FinalStatus::Succeeded)])
        .unwrap();
    let (_, stdout, stderr) = streams_of(dir.path(), 7);
    assert!(
        stdout.starts_with("[gleaner: the first 100 bytes"),
        "{stdout}"
    );
    assert!(stdout.ends_with("tail\n"));
    assert_eq!(stderr, "err\n");
    let task = dir.path().join("tasks/7");
    assert!(!task.join("stdout").exists(), "streams are not files");
    assert_eq!(std::fs::read(task.join("plots/a.png")).unwrap(), b"png");
    assert!(
        task.join("plots/a.png.truncated").exists(),
        "truncation is marked"
    );
    assert!(!dir.path().join("tasks/escape").exists());

    let silent = run(8, Captured::default(), b"", vec![]);
    results.write_outputs(&silent, false, None).unwrap();
    results
        .append(vec![entry(8, FinalStatus::Succeeded)])
        .unwrap();
    assert!(
        !dir.path().join("tasks/8").exists(),
        "no output, no directory"
    );
    let (line, _, _) = streams_of(dir.path(), 8);
    assert!(line.get("stdout").is_none(), "{line}");
}

#[test]
fn a_parted_runs_streams_come_back_and_its_files_are_moved_into_place() {
    let dir = tempfile::tempdir().unwrap();
    let (mut results, _) = ResultsDir::open(dir.path(), None).unwrap();
    let file = OutputFile {
        path: "out.bin".into(),
        data: vec![7; 3000],
        dropped: 0,
    };
    let whole = run(
        4,
        Captured {
            data: b"printed\n".to_vec(),
            dropped: 0,
        },
        b"",
        vec![file],
    );
    let (parts, mut stripped) = whole.clone().into_parts(9);
    assert!(parts.is_empty(), "small enough to go whole");
    // As a launcher would send it with more output: in parts.
    stripped.parted = Some(gleaner_protocol::Parted {
        run: 9,
        sizes: vec![8, 0, 3000],
    });
    stripped.stdout.data.clear();
    stripped.outputs[0].data.clear();
    let part = |target, offset: usize, data: &[u8]| ResultPart {
        job: stripped.job.clone(),
        task: 4,
        run: 9,
        target,
        offset: offset as u64,
        data: data.to_vec(),
    };
    for part in [
        part(2, 1000, &whole.outputs[0].data[1000..]),
        part(0, 0, b"printed\n"),
        part(2, 0, &whole.outputs[0].data[..1000]),
        part(2, 0, &whole.outputs[0].data[..1000]),
    ] {
        results.stage_part(&part).unwrap();
    }
    let far = ResultPart {
        target: 5000,
        ..part(2, 0, b"x")
    };
    assert!(results.stage_part(&far).is_err(), "no launcher sends that");
    // Written once, and again as after a failure before the ack: the
    // parts are still there for the second time.
    let parted = stripped.clone();
    for _ in 0..2 {
        stripped = parted.clone();
        let staged = results.unpart(&mut stripped);
        results
            .write_outputs(&stripped, false, staged.as_ref())
            .unwrap();
        assert!(dir.path().join(".parts/4.0000000000000009/2").exists());
    }
    let staged = results.unpart(&mut parted.clone()).unwrap();
    results.remove_parts(staged);
    results
        .append(vec![entry(4, FinalStatus::Succeeded)])
        .unwrap();
    let (_, stdout, _) = streams_of(dir.path(), 4);
    assert_eq!(stdout, "printed\n");
    assert_eq!(
        std::fs::read(dir.path().join("tasks/4/out.bin")).unwrap(),
        whole.outputs[0].data
    );
    assert!(!dir.path().join(".parts/4.0000000000000009").exists());
}

#[test]
fn a_thousand_tasks_that_print_make_no_file_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let (mut results, _) = ResultsDir::open(dir.path(), None).unwrap();
    let files = || walk(dir.path());
    let before = files();
    for task in 0..1000 {
        let printed = Captured {
            data: format!("task {task}\n").into_bytes(),
            dropped: 0,
        };
        results
            .write_outputs(&run(task, printed, b"warn\n", vec![]), false, None)
            .unwrap();
        results
            .append(vec![entry(task, FinalStatus::Succeeded)])
            .unwrap();
    }
    results.sync().unwrap();
    assert_eq!(files(), before);
    let (_, stdout, stderr) = streams_of(dir.path(), 999);
    assert_eq!((stdout.as_str(), stderr.as_str()), ("task 999\n", "warn\n"));
}

#[test]
fn a_retried_run_is_in_the_log_and_in_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let (mut results, _) = ResultsDir::open(dir.path(), None).unwrap();
    let mut failed = run(3, Captured::default(), b"boom\n", vec![]);
    failed.exit_code = Some(2);
    results.write_retried(&failed).unwrap();
    let line = std::fs::read_to_string(dir.path().join(ATTEMPTS_FILE)).unwrap();
    let attempt: AttemptEntry = serde_json::from_str(line.trim_end()).unwrap();
    assert_eq!(
        (attempt.task, attempt.attempt, attempt.exit_code),
        (3, 1, Some(2))
    );
    assert!(attempt.stdout.is_none());
    let span = attempt.stderr.unwrap();
    let log = std::fs::read(dir.path().join(OUTPUT_FILE)).unwrap();
    assert_eq!(
        &log[span.offset as usize..][..span.bytes as usize],
        b"boom\n"
    );
}

/// Every file and directory under `root`.
fn walk(root: &Path) -> usize {
    std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| {
            1 + if e.path().is_dir() {
                walk(&e.path())
            } else {
                0
            }
        })
        .sum()
}

#[test]
fn an_addition_cut_short_is_cut_off_and_the_next_starts_its_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let (results, _) = ResultsDir::open(dir.path(), None).unwrap();
    let added = |id, first| AddedTasks {
        first,
        addition: gleaner_manifest::Addition {
            id,
            tasks: vec![gleaner_manifest::TaskDef {
                command: "true".into(),
            }],
            sweep: None,
        },
    };
    results.append_addition(&added(1, 0)).unwrap();
    let path = dir.path().join(ADDITIONS_FILE);
    let mut text = std::fs::read(&path).unwrap();
    let whole = text.len();
    text.extend_from_slice(b"{\"first\":1,\"addi");
    std::fs::write(&path, &text).unwrap();
    let read = results.read_additions().unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), whole as u64);
    results.append_addition(&added(2, 1)).unwrap();
    let read = results.read_additions().unwrap();
    assert_eq!(
        read.iter().map(|a| a.addition.id).collect::<Vec<_>>(),
        [1, 2]
    );
}

#[test]
fn job_file_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let (results, _) = ResultsDir::open(dir.path(), None).unwrap();
    assert!(results.read_job_file().is_none());
    let file = JobFile {
        job: "j-0000000000000000".into(),
        owner: "alice".into(),
        name: "j".into(),
        state: JobState::Running,
        runner: "runner@h".into(),
        results: dir.path().display().to_string(),
        submitted_at: 1,
        started_at: 2,
        finished_at: None,
        makespan_s: None,
        tasks: TaskCounts::default(),
        duplicates: 0,
        preemptions: 0,
        tasks_published: true,
        largest_bundle: 0,
        components: vec![Some("c1".into()), None],
        restarts: 1,
        final_published: false,
        final_step: None,
        closed: false,
        additions_published: 0,
        problem: None,
        gathering: Some(gleaner_runner_core::records::Gather {
            figures: gleaner_protocol::Gathering {
                at_barrier: 1,
                claiming_tries: 2,
                placement_s: Some(0.5),
                barrier_s: None,
                start_delay_s: None,
                ..Default::default()
            },
            level: 0.625,
            waiting_since: 1,
            run: Some(gleaner_runner_core::records::Claim {
                placed_at: 3,
                start_by: 600_003,
                next_try: 450_003,
                started: [(
                    0,
                    gleaner_runner_core::records::StartedComponent {
                        cluster: "c1".into(),
                        hosts: vec![gleaner_protocol::HostSlots {
                            host: "n1".into(),
                            slots: 4,
                        }],
                        at: 4,
                    },
                )]
                .into(),
                released_at: None,
                stopping: Some(5),
                stopped: [0].into(),
                avoid: Default::default(),
                moving: Default::default(),
                slots: Default::default(),
            }),
        }),
    };
    results.write_job_file(&file).unwrap();
    assert_eq!(results.read_job_file(), Some(file));
}
