use super::*;

#[test]
fn a_placeholder_asks_for_its_tasks_memory_and_the_launchers_own() {
    let task = TaskShape {
        slots: 2,
        needs: Needs {
            memory_mb: 1000,
            gpus: 1,
        },
    };
    assert_eq!(
        placeholder_needs(task, 4),
        Needs {
            memory_mb: 2000 + LAUNCHER_MEMORY_MB,
            gpus: 2
        }
    );
    assert_eq!(placeholder_needs(TaskShape::slots(1), 1), Needs::default());
}

#[test]
fn an_owners_component_gets_nothing_of_roots_but_the_spool_files() {
    let spec = ComponentSpec {
        env: vec![
            ("OMP_NUM_THREADS".into(), "4".into()),
            ("X;id".into(), "y".into()),
        ],
        workdir: Some("/home/alice/run".into()),
        ..component("./mpi_app")
    };
    let alice = Account {
        name: "alice".into(),
        uid: nix::unistd::Uid::from_raw(4242),
        gid: nix::unistd::Gid::from_raw(4242),
        groups: Vec::new(),
        home: "/home/alice".into(),
    };
    let files = ComponentFiles::new(std::path::Path::new("/spool"), &spec.job, 0);
    let script = files.script(&spec, Some(&alice), ComponentHosts::ThisHost);
    assert!(!script.contains("export"), "{script}");
    assert!(!script.contains("X;id"), "{script}");
    assert!(
            script.contains("/usr/bin/setpriv --reuid=4242 --regid=4242 --init-groups --reset-env -- /usr/bin/env \"$gleaner_env0\" \"GLEANER_COMPONENT=0\"")
                && script.contains("/bin/sh -c \"$gleaner_command\" > '/spool/j-0000000000000001.0.out'"),
            "{script}"
        );
    let ran = expand(&spec, "\"$gleaner_command\" \"$(env | grep ^OMP)\"");
    assert_eq!(
        ran,
        "cd '/home/alice/run' || exit 1\n./mpi_app|OMP_NUM_THREADS=4"
    );
}

/// Runs `spec`'s script up to its command, past a barrier already
/// open, then prints the two `words` with a `|` between them.
fn expand(spec: &ComponentSpec, words: &str) -> String {
    let spool = tempfile::tempdir().expect("a spool");
    let files = ComponentFiles::new(spool.path(), &spec.job, spec.component);
    std::fs::write(&files.go, gleaner_kcm_core::barrier::go_text(0, 1, 1)).expect("go");
    let script = files.script(spec, None, ComponentHosts::ThisHost);
    let (head, _) = script.split_once("/bin/sh -c").expect("the command");
    let probe = format!("{head}printf '%s|%s' {words}");
    let out = std::process::Command::new("/bin/sh")
        .args(["-c", &probe])
        .output()
        .expect("sh");
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn no_line_of_a_component_script_comes_from_its_job() {
    let hostile = "sleep 12\n#$ -p 1000\n#SBATCH --nice=-1000\ntrue 'it''s' \\c \"$HOME\" é\n\n";
    let spec = ComponentSpec {
        env: vec![("V".into(), "a\n#$ -i /etc/shadow\n".into())],
        ..component(hostile)
    };
    let files = ComponentFiles::new(std::path::Path::new("/spool"), &spec.job, 0);
    let script = files.script(&spec, None, ComponentHosts::ThisHost);
    for line in script.lines().skip(2) {
        assert!(!line.starts_with('#'), "{line:?} in\n{script}");
        assert!(line.bytes().all(|b| (0x20..0x7f).contains(&b)), "{line:?}");
    }
    assert_eq!(
        expand(&spec, "\"$gleaner_command\" \"$V\""),
        format!("{hostile}|a\n#$ -i /etc/shadow\n"),
        "the shell gets the text back exactly"
    );
}

/// Component 0 of a job of alice's, running `command`.
pub(crate) fn component(command: &str) -> ComponentSpec {
    ComponentSpec {
        needs: Default::default(),
        job: "j-0000000000000001".parse().unwrap(),
        component: 0,
        slots: 1,
        command: command.into(),
        env: Vec::new(),
        walltime_ms: None,
        workdir: None,
        owner: "alice".into(),
        checkpoint: None,
        inputs: Vec::new(),
    }
}

#[test]
fn a_component_runs_its_command_only_once_let_past_its_barrier() {
    let spool = tempfile::tempdir().unwrap();
    let spec = ComponentSpec {
        component: 1,
        slots: 3,
        ..component(
            "echo \"$GLEANER_COMPONENT $GLEANER_COMPONENTS $GLEANER_RANK $GLEANER_RANKS\"; cat \"$GLEANER_HOSTFILE\"",
        )
    };
    let files = ComponentFiles::new(spool.path(), &spec.job, 1);
    let script = files.script(&spec, None, ComponentHosts::ThisHost);
    let mut wrapper = std::process::Command::new("/bin/sh")
        .args(["-c", &script])
        .spawn()
        .unwrap();
    let hosts = loop {
        if let Ok(text) = std::fs::read_to_string(&files.started) {
            break parse_started(&text).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    assert_eq!(
        hosts,
        [HostSlots {
            host: host.clone(),
            slots: 3
        }]
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        wrapper.try_wait().unwrap().is_none(),
        "waits at its barrier"
    );
    assert!(!files.stdout.exists(), "its command has not started");
    let all = vec![
        vec![HostSlots {
            host: "a".into(),
            slots: 2,
        }],
        hosts,
    ];
    std::fs::write(&files.hosts, gleaner_kcm_core::barrier::hosts_text(&all)).unwrap();
    std::fs::write(&files.go, gleaner_kcm_core::barrier::go_text(2, 5, 2)).unwrap();
    assert!(wrapper.wait().unwrap().success());
    assert_eq!(
        std::fs::read_to_string(&files.stdout).unwrap(),
        format!("1 2 2 5\na slots=2 # component 0\n{host} slots=3 # component 1\n")
    );
    assert_eq!(std::fs::read_to_string(&files.exit).unwrap(), "0\n");
}

#[test]
fn a_stopped_component_gets_its_signal_saves_its_state_and_ends_preempted() {
    let spool = tempfile::tempdir().unwrap();
    let checkpoint = spool.path().join("ck");
    let spec = ComponentSpec {
        checkpoint: Some(checkpoint.display().to_string()),
        ..component(
            "trap 'echo saved > \"$GLEANER_CHECKPOINT/state\"; exit 0' USR1; while true; do sleep 0.2; done",
        )
    };
    let files = ComponentFiles::new(spool.path(), &spec.job, 0);
    std::fs::write(&files.go, gleaner_kcm_core::barrier::go_text(0, 1, 1)).unwrap();
    let script = files.script(&spec, None, ComponentHosts::ThisHost);
    let mut wrapper = std::process::Command::new("/bin/sh")
        .args(["-c", &script])
        .spawn()
        .unwrap();
    while !checkpoint.exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::write(&files.stop, "10 30\n").unwrap();
    assert!(wrapper.wait().unwrap().success());
    assert_eq!(
        std::fs::read_to_string(checkpoint.join("state")).unwrap(),
        "saved\n"
    );
    assert_eq!(std::fs::read_to_string(&files.exit).unwrap(), "preempted\n");
}

#[test]
fn started_files_are_read_as_hostile_host_lists() {
    let hosts = |text: &str| {
        parse_started(text).map(|hosts| {
            hosts
                .into_iter()
                .map(|h| (h.host, h.slots))
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(
        hosts("n1.example 4 all.q@n1 UNDEFINED\nn2 2\n").unwrap(),
        [("n1.example".to_owned(), 4), ("n2".to_owned(), 2)]
    );
    assert_eq!(
        hosts("tasks-per-node 2(x2),1\nnode1\nnode2\nnode3\n").unwrap(),
        [
            ("node1".to_owned(), 2),
            ("node2".to_owned(), 2),
            ("node3".to_owned(), 1)
        ]
    );
    for bad in [
        "",
        "n1\n",
        "n1 0\n",
        "$(id) 1\n",
        "n1 x\n",
        "tasks-per-node 2(x1\nn1\n",
        "tasks-per-node 1(x99999999999)\nn1\n",
        "tasks-per-node 1\nn1\nn2\n",
    ] {
        assert!(hosts(bad).is_err(), "{bad:?}");
    }
    // Up to its bound in bytes, and refused whole past it.
    let line = format!("{} 1\n", "n".repeat(253));
    let many = line.repeat(MAX_STARTED_BYTES / line.len());
    let listed = parse_started(&many).unwrap();
    assert!(
        HostSlots::listed_bytes(&listed) < gleaner_protocol::MAX_GO_HOSTS_BYTES / 4,
        "one component's share of a go"
    );
    let over = format!("{many}{line}");
    assert!(over.len() > MAX_STARTED_BYTES);
    assert!(parse_started(&over).unwrap_err().contains("KiB"));
    let short = "a 1\n".repeat(MAX_COMPONENT_HOSTS);
    assert!(
        HostSlots::listed_bytes(&parse_started(&short).unwrap())
            < gleaner_protocol::MAX_GO_HOSTS_BYTES / 4
    );
}

#[test]
fn grants_become_arrays_of_whole_launchers_and_one_for_the_rest() {
    assert_eq!(launcher_arrays(8, 1, 1), [(8, 1)]);
    assert_eq!(launcher_arrays(8, 4, 1), [(2, 4)]);
    assert_eq!(launcher_arrays(10, 4, 1), [(2, 4), (1, 2)]);
    assert_eq!(launcher_arrays(3, 4, 1), [(1, 3)]);
    assert!(launcher_arrays(0, 4, 1).is_empty());
    assert_eq!(launcher_arrays(2, 0, 1), [(2, 1)], "0 counts as 1");
    // Tasks of 2 slots: launchers of whole tasks.
    assert_eq!(launcher_arrays(8, 1, 2), [(4, 2)], "size grows to a task");
    assert_eq!(
        launcher_arrays(11, 4, 2),
        [(2, 4), (1, 2)],
        "the odd slot is left"
    );
    assert_eq!(
        launcher_arrays(10, 5, 3),
        [(3, 3)],
        "size shrinks to whole tasks"
    );
    assert!(
        launcher_arrays(3, 8, 4).is_empty(),
        "too few slots for one task"
    );
}
