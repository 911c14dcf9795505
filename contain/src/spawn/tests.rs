use std::{io::Read, os::unix::process::ExitStatusExt};

use super::*;

fn start(program: &str, argv: &[&str], cwd: &str) -> io::Result<Spawned> {
    start_in(None, program, argv, cwd)
}

fn start_in(
    cgroup: Option<&Entry>,
    program: &str,
    argv: &[&str],
    cwd: &str,
) -> io::Result<Spawned> {
    start_nicer(cgroup, 0, program, argv, cwd)
}

fn start_nicer(
    cgroup: Option<&Entry>,
    nice: i32,
    program: &str,
    argv: &[&str],
    cwd: &str,
) -> io::Result<Spawned> {
    let argv: Vec<&OsStr> = argv.iter().map(OsStr::new).collect();
    spawn(&Spawn {
        program: Path::new(program),
        argv: &argv,
        env: &[c"X=forty two"],
        cwd: Path::new(cwd),
        cgroup,
        nice,
    })
}

#[test]
fn a_thread_that_asks_for_prompt_wakeups_keeps_them_to_itself() {
    let slice = |sched: &str| -> Option<u64> {
        let line = sched.lines().find(|l| l.starts_with("se.slice"))?;
        line.rsplit(':').next()?.trim().parse().ok()
    };
    std::thread::spawn(move || {
        // A batch thread stays one.
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sets and reads the calling thread's policy.
        let batch = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        assert_eq!(batch, 0);
        prompt_wakeups().unwrap();
        // SAFETY: reads the calling thread's policy.
        let policy = unsafe { libc::sched_getscheduler(0) };
        assert_eq!(
            policy,
            libc::SCHED_BATCH | libc::SCHED_RESET_ON_FORK,
            "the policy kept, its children's reset"
        );
        // Kernels before 6.12 have no slice of their own to show, and
        // some no `sched` file at all.
        let own = std::fs::read_to_string("/proc/thread-self/sched").unwrap_or_default();
        let child = start("/bin/cat", &["cat", "/proc/self/sched"], "/").unwrap();
        let (childs, _, _) = ended(child);
        if let Some(own) = slice(&own) {
            assert_eq!(own, SHORTEST_SLICE_NS);
            assert_ne!(slice(&childs), Some(SHORTEST_SLICE_NS), "{childs}");
        }
    })
    .join()
    .unwrap();
}

#[test]
fn the_program_runs_as_much_nicer_as_asked() {
    // The 19th field of `stat` after the command name is the niceness.
    let nice_of = |more: i32| {
        let child = start_nicer(None, more, "/bin/cat", &["cat", "/proc/self/stat"], "/").unwrap();
        let (out, _, _) = ended(child);
        let after_name = out.rsplit_once(')').unwrap().1.to_owned();
        after_name
            .split_whitespace()
            .nth(16)
            .unwrap()
            .parse::<i32>()
            .unwrap()
    };
    // SAFETY: reads this thread's niceness.
    let own = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    assert_eq!(nice_of(0), own);
    assert_eq!(nice_of(5), (own + 5).min(19));
    assert_eq!(nice_of(100), 19, "at most the least favoured");
    assert_eq!(nice_of(-5), own, "never ahead of its starter");
}

/// Held by the tests that start children in cgroups: how a child
/// starts there is decided for the whole process.
static IN_CGROUPS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A cgroup tree of the test's own, under the test process's cgroup.
fn test_tree(test: &str) -> crate::Tree {
    let name = format!("spawn-test-{test}-{}", std::process::id());
    crate::Tree::under_own(Path::new(&name)).expect("a cgroup v2 tree under this test's own cgroup")
}

#[test]
fn the_program_starts_in_its_cgroup_whether_born_there_or_moved() {
    let _alone = IN_CGROUPS.lock().unwrap_or_else(|e| e.into_inner());
    let tree = test_tree("where");
    // Where it ran, by its own word.
    let own_cgroup = |entry: &Entry| -> io::Result<String> {
        let child = start_in(Some(entry), "/bin/cat", &["cat", "/proc/self/cgroup"], "/")?;
        let (out, _, _) = ended(child);
        Ok(out
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or_default()
            .to_owned())
    };
    let mut born = tree.make("born").unwrap();
    // Not writable: the child can only have been born in it.
    born.procs = std::fs::File::open("/dev/null").unwrap();
    let in_born = own_cgroup(&born);
    let emptied = born.populated();
    // As on a kernel without `clone3` into a cgroup: the child moves.
    MOVE_INTO_CGROUP.with(|moving| moving.set(true));
    let moved = tree.make("moved").unwrap();
    let in_moved = own_cgroup(&moved);
    MOVE_INTO_CGROUP.with(|moving| moving.set(false));
    assert!(tree.end_all(), "the test's cgroups are removed");
    let (in_born, in_moved) = (in_born.unwrap(), in_moved.unwrap());
    assert!(!emptied, "the cgroup of a child that ended is empty");
    assert!(in_born.ends_with("/born"), "{in_born}");
    assert!(in_moved.ends_with("/moved"), "{in_moved}");
}

/// Its stdout, stderr and exit status, once it ended.
fn ended(child: Spawned) -> (String, String, std::process::ExitStatus) {
    let read = |fd: OwnedFd| {
        let mut text = String::new();
        std::fs::File::from(fd).read_to_string(&mut text).unwrap();
        text
    };
    let (out, err) = (read(child.stdout), read(child.stderr));
    let mut status = 0;
    // SAFETY: reaps the child just started.
    unsafe { libc::waitpid(child.pid, &mut status, 0) };
    (out, err, std::process::ExitStatus::from_raw(status))
}

#[test]
fn a_child_starts_in_a_cgroup_that_was_killed_before() {
    let _alone = IN_CGROUPS.lock().unwrap_or_else(|e| e.into_inner());
    let tree = test_tree("killed");
    let killed = tree.make("killed").unwrap();
    crate::kill_all(&tree.path().join("killed"));
    let child = start_in(
        Some(&killed),
        "/bin/cat",
        &["cat", "/proc/self/cgroup"],
        "/",
    );
    let ran = child.map(ended);
    // Where such a child was killed at birth, children move from now
    // on: not for the other tests.
    NO_CLONE3.store(false, Ordering::Relaxed);
    assert!(tree.end_all(), "the test's cgroups are removed");
    let (out, _, status) = ran.unwrap();
    assert!(status.success(), "{status:?}");
    assert!(out.contains("/killed\n"), "{out}");
}

#[test]
fn the_program_gets_its_arguments_environment_directory_and_group() {
    let child = start(
        "/bin/sh",
        &[
            "sh",
            "-c",
            "echo \"$X\" $(pwd) $0; ps -o pgid= $$; echo oops >&2; exit 3",
        ],
        "/tmp",
    )
    .unwrap();
    let pid = child.pid;
    let (out, err, status) = ended(child);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "forty two /tmp sh");
    assert_eq!(lines[1].trim(), pid.to_string(), "its own group");
    assert_eq!(err, "oops\n");
    assert_eq!(status.code(), Some(3));
}

#[test]
fn the_program_starts_with_no_signal_blocked_and_sigpipe_at_its_default() {
    // SAFETY: blocks a signal in this test's thread, as a launcher's
    // threads may have one blocked when they spawn.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let child = start(
        "/bin/grep",
        &["grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"],
        "/",
    )
    .unwrap();
    let (out, _, _) = ended(child);
    let mask = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap()
    };
    assert_eq!(mask("SigBlk:"), 0, "{out}");
    assert_eq!(mask("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
}

#[test]
fn a_failed_start_says_which_step_failed() {
    let missing = start("/nonexistent/program", &["program"], "/tmp").unwrap_err();
    assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    assert!(
        missing.to_string().starts_with("cannot start the program"),
        "{missing}"
    );
    let nowhere = start("/bin/true", &["true"], "/nonexistent").unwrap_err();
    assert!(
        nowhere
            .to_string()
            .starts_with("cannot enter its directory"),
        "{nowhere}"
    );
}
