use super::*;

#[test]
fn a_followed_stream_is_printed_once_in_order_with_notes_for_gaps_and_new_runs() {
    let piece = |offset, data: &str| StreamPiece {
        offset,
        data: data.as_bytes().to_vec(),
    };
    let run = |attempt, preemptions, launcher: &str| {
        Run::of(&OutputPiece {
            task: 0,
            attempt,
            preemptions,
            launcher: launcher.into(),
            stdout: StreamPiece::default(),
            stderr: StreamPiece::default(),
            ended: false,
        })
    };
    let first = run(1, 0, "l1");
    let mut tee = Tee::default();
    assert_eq!(tee.take(&first, &piece(0, "ab")), (None, &b"ab"[..]));
    assert_eq!(
        tee.take(&first, &piece(1, "bcd")),
        (None, &b"cd"[..]),
        "what overlaps is printed once"
    );
    assert_eq!(tee.take(&first, &piece(2, "c")), (None, &b""[..]));
    let far = piece(10, "xy");
    let (note, data) = tee.take(&first, &far);
    assert!(note.unwrap().starts_with("6 bytes not shown"));
    assert_eq!(data, b"xy");
    assert!(!tee.done_with((1, 0)));
    tee.ended = true;
    assert!(tee.done_with((1, 0)));
    // Preempted, or redelivered to another launcher: the same attempt
    // runs again, from its start, after a note.
    for again in [run(1, 1, "l2"), run(1, 1, "l3")] {
        let start = piece(0, "new");
        let (note, data) = tee.take(&again, &start);
        assert!(note.unwrap().contains("runs again"));
        assert_eq!(data, b"new");
    }
    assert!(!tee.done_with((1, 1)), "that run's last piece has not come");
    assert_eq!(
        tee.take(&first, &piece(12, "late")),
        (None, &b""[..]),
        "an earlier run's late piece"
    );
    // At the end without its last piece: what the results kept of the
    // last run, less what was printed of it.
    assert_eq!(tee.rest((1, 1), b"newer"), (None, &b"er"[..]));
    assert_eq!(tee.rest((1, 1), b"ne"), (None, &b""[..]));
    let (note, data) = tee.rest((2, 1), b"third");
    assert!(note.unwrap().contains("attempt 2"));
    assert_eq!(data, b"third");
    assert_eq!(Tee::default().rest((1, 0), b"all"), (None, &b"all"[..]));
    // A long stream's kept part starts with how many bytes came before.
    let mut long = Tee::default();
    long.take(&first, &piece(100, "0123456789"));
    let kept =
        b"[gleaner: the first 104 bytes of this stream were dropped; the last 6 follow]\n456789";
    assert_eq!(long.rest((1, 0), kept), (None, &b""[..]));
    let mut behind = Tee::default();
    behind.take(&first, &piece(0, "ab"));
    let (note, data) = behind.rest((1, 0), kept);
    assert!(note.unwrap().starts_with("102 bytes"));
    assert_eq!(data, b"456789");
}

fn sweep(tasks: u64) -> Manifest {
    Manifest::from_toml(&format!(
        "name = \"s\"\n[sweep]\ncommand = \"echo {{i}}\"\nparams.i = {{ from = 0, to = {} }}\n",
        tasks - 1
    ))
    .unwrap()
}

fn ended() -> Vec<(u64, String)> {
    [
        (0, "succeeded"),
        (1, "failed"),
        (2, "timed_out"),
        (4, "failed"),
    ]
    .into_iter()
    .map(|(t, s)| (t, s.to_owned()))
    .collect()
}

#[test]
fn a_rerun_takes_the_tasks_that_ended_so_among_those_asked() {
    let m = sweep(6);
    let failed = RerunChoice {
        statuses: vec!["failed"],
        tasks: None,
    };
    assert_eq!(
        choose(&m, "s-1", &ended(), &failed).unwrap().to_string(),
        "1,4"
    );
    let some = RerunChoice {
        statuses: vec!["failed", "timed_out"],
        tasks: Some("2-5".parse().unwrap()),
    };
    assert_eq!(
        choose(&m, "s-1", &ended(), &some).unwrap().to_string(),
        "2,4"
    );
    let asked = RerunChoice {
        statuses: vec![],
        tasks: Some("3,5".parse().unwrap()),
    };
    assert_eq!(
        choose(&m, "s-1", &ended(), &asked).unwrap().to_string(),
        "3,5"
    );
    let everything = RerunChoice::default();
    assert_eq!(
        choose(&m, "s-1", &ended(), &everything)
            .unwrap()
            .to_string(),
        "0-5"
    );
}

#[test]
fn a_rerun_of_nothing_or_of_strangers_is_refused() {
    let m = sweep(6);
    let lost = RerunChoice {
        statuses: vec!["lost"],
        tasks: None,
    };
    let e = choose(&m, "s-1", &ended(), &lost).unwrap_err();
    assert!(
        e.message().unwrap().contains("no task of s-1 ended lost"),
        "{e:?}"
    );
    let beyond = RerunChoice {
        statuses: vec![],
        tasks: Some("5-6".parse().unwrap()),
    };
    let e = choose(&m, "s-1", &ended(), &beyond).unwrap_err();
    assert!(
        e.message()
            .unwrap()
            .contains("task 6 is not one of s-1's tasks (0-5)"),
        "{e:?}"
    );
}

#[test]
fn a_rerun_of_a_rerun_chooses_among_its_tasks() {
    let mut m = sweep(10);
    m.rerun = Some(Rerun {
        of: "s-1".to_owned(),
        tasks: "1,4".parse().unwrap(),
        results: None,
    });
    let choice = RerunChoice {
        statuses: vec![],
        tasks: Some("0".parse().unwrap()),
    };
    assert!(choose(&m, "s-2", &ended(), &choice).is_err());
    assert_eq!(
        choose(&m, "s-2", &ended(), &RerunChoice::default())
            .unwrap()
            .to_string(),
        "1,4"
    );
}
