//! Processes a task starts that leave its process group (`setsid`, a
//! daemon's double fork) escape the group kill at the task's end. Two nets
//! catch them. Where the launcher may make cgroups (v2) under its own, each
//! task's shell starts in a cgroup of its own, which everything it starts
//! stays in, whatever group or parent it moves to; the cgroup is killed
//! when the task ends. And the launcher is their subreaper: orphaned, they
//! become its children rather than init's, and whatever child of the
//! launcher no running task owns (by process group, or by cgroup) is killed
//! and reaped when a task ends. Without cgroups, a multi-slot launcher also
//! kills a process another running task moved out of its group and
//! orphaned.

use std::{
    collections::BTreeMap,
    ffi::{CStr, OsStr},
    io,
    os::{
        fd::{FromRawFd, OwnedFd},
        unix::process::ExitStatusExt,
    },
    path::Path,
    process::ExitStatus,
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use gleaner_contain::{Entry, Spawn, Spawned, Tree};
use nix::{
    libc,
    sys::{
        signal::{Signal, kill, killpg},
        wait::{WaitPidFlag, waitpid},
    },
    unistd::Pid,
};
use tokio::{io::unix::AsyncFd, net::unix::pipe};

/// A task cgroup in [`TASK_CGROUPS`]: its name, and its directory and
/// `cgroup.procs` kept open from task to task.
type TaskCgroup = (String, Entry);

/// The running tasks' processes, each its own group's leader, and its
/// cgroup, if it has one.
static RUNNING: Mutex<BTreeMap<i32, Option<TaskCgroup>>> = Mutex::new(BTreeMap::new());

/// This launcher's task cgroups: `<own cgroup>/tasks-<pid>/<n>`; `None`
/// where it may not make them.
static TASK_CGROUPS: OnceLock<Option<Tree>> = OnceLock::new();

/// Names the next task cgroup.
static NEXT_CGROUP: AtomicU64 = AtomicU64::new(0);

/// Task cgroups left empty by their task, for the next tasks: making and
/// removing one per task would cost more than the task's own spawn.
static FREE_CGROUPS: Mutex<Vec<TaskCgroup>> = Mutex::new(Vec::new());

/// Task cgroups whose task left processes behind: killed, and removed once
/// empty. Never reused: some kernels kill every process born into a cgroup
/// killed before.
static KILLED_CGROUPS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Whether a child was killed but not reaped yet. Orphans the launcher
/// adopts are children of its first thread, which the sweep at each task's
/// end reads; a task's own process is a child of the thread that started
/// it, so every thread's children are read only while one such is left.
static UNREAPED: AtomicBool = AtomicBool::new(false);

/// Makes this process the subreaper of everything it starts; `false` where
/// the kernel refuses (strays then go to init, as before).
pub fn adopt() -> bool {
    nix::sys::prctl::set_child_subreaper(true).is_ok()
}

/// Makes the directory of this launcher's task cgroups; why not, where it
/// cannot (then tasks are contained by group and subreaper alone).
pub fn contain() -> Result<(), String> {
    let tree = TASK_CGROUPS
        .get_or_init(|| Tree::under_own(Path::new(&format!("tasks-{}", std::process::id()))).ok());
    let Some(tree) = tree else {
        return Err("no cgroup v2 this launcher may write to".to_owned());
    };
    // What a launcher killed outright (SIGKILL) beside this one left.
    let siblings = tree.path().parent().and_then(|p| std::fs::read_dir(p).ok());
    for entry in siblings.into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let gone = name
            .strip_prefix("tasks-")
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
        if gone && let Ok(left) = Tree::under_own(Path::new(&name)) {
            left.end_all();
        }
    }
    Ok(())
}

/// Removes this launcher's task cgroups (their processes killed), when it
/// leaves.
pub fn release() {
    if let Some(Some(tree)) = TASK_CGROUPS.get() {
        tree.end_all();
    }
}

/// Starts a task's process (in a cgroup of its own where there are task
/// cgroups), known as running before any sweep can see it.
pub fn spawn(
    program: &Path,
    argv: &[&OsStr],
    env: &[&CStr],
    cwd: &Path,
    nice: i32,
) -> io::Result<TaskProcess> {
    let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    let cgroup = TASK_CGROUPS
        .get()
        .and_then(Option::as_ref)
        .and_then(|tree| {
            let free = FREE_CGROUPS.lock().ok().and_then(|mut free| free.pop());
            free.or_else(|| {
                let name = NEXT_CGROUP.fetch_add(1, Ordering::Relaxed).to_string();
                let entry = tree.make(&name).ok()?;
                Some((name, entry))
            })
        });
    let spawned = gleaner_contain::spawn(&Spawn {
        program,
        argv,
        env,
        cwd,
        cgroup: cgroup.as_ref().map(|(_, entry)| entry),
        nice,
    });
    let spawned = match spawned {
        Ok(spawned) => spawned,
        Err(e) => {
            if let Some(cgroup) = cgroup
                && let Ok(mut free) = FREE_CGROUPS.lock()
            {
                free.push(cgroup);
            }
            return Err(e);
        }
    };
    running.insert(spawned.pid, cgroup);
    TaskProcess::new(spawned)
}

/// A running task's process: its pipes, and its end awaited through a
/// pidfd. Dropped before it was reaped (its supervisor cancelled), its
/// group is killed.
pub struct TaskProcess {
    pid: i32,
    /// Readable once the process has exited; `None` on kernels without
    /// pidfds (then the end is polled).
    pidfd: Option<AsyncFd<OwnedFd>>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
    reaped: bool,
}

impl TaskProcess {
    fn new(spawned: Spawned) -> io::Result<Self> {
        // SAFETY: `pidfd_open` of our own child; a valid result is a new
        // descriptor we own.
        let pidfd = spawned.pidfd.or_else(|| unsafe {
            let fd = libc::syscall(libc::SYS_pidfd_open, spawned.pid, 0);
            (fd >= 0).then(|| OwnedFd::from_raw_fd(fd as i32))
        });
        let mut process = Self {
            pid: spawned.pid,
            pidfd: None,
            stdout: None,
            stderr: None,
            reaped: false,
        };
        // SAFETY: the pidfd is an open descriptor owned by the `AsyncFd`
        // for as long as it lives.
        process.pidfd = pidfd
            .map(|fd| unsafe { AsyncFd::register(fd) })
            .transpose()?;
        process.stdout = Some(pipe::Receiver::from_owned_fd(spawned.stdout)?);
        process.stderr = Some(pipe::Receiver::from_owned_fd(spawned.stderr)?);
        Ok(process)
    }

    /// Its pid, which is also its process group.
    pub fn id(&self) -> i32 {
        self.pid
    }

    /// Waits for the process to end, and reaps it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            let mut status = 0;
            // SAFETY: reaps our own child, if it has ended, into `status`.
            let reaped = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            match reaped {
                0 => {}
                pid if pid == self.pid => {
                    self.reaped = true;
                    return Ok(ExitStatus::from_raw(status));
                }
                _ => return Err(io::Error::last_os_error()),
            }
            match &self.pidfd {
                Some(pidfd) => pidfd.readable().await?.clear_ready(),
                None => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        }
    }
}

impl Drop for TaskProcess {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
            reap_or_remember(self.pid);
        }
    }
}

/// Reaps a killed child if it is dead already; else the next sweep reads
/// every thread's children, and reaps it then.
fn reap_or_remember(pid: i32) {
    let reaped = waitpid(
        Pid::from_raw(pid),
        Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
    );
    if !matches!(reaped, Ok(status) if status.pid().is_some()) {
        UNREAPED.store(true, Ordering::Relaxed);
    }
}

/// A task's shell has ended: its cgroup is kept for the next task if the
/// task left nothing in it, else killed and removed; then the strays are
/// killed, and the shell forgotten.
pub fn ended(pid: i32) {
    let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(tree)) = TASK_CGROUPS.get() {
        let mut killed = KILLED_CGROUPS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Some((name, entry))) = running.remove(&pid) {
            if entry.populated() {
                killed.push(name);
            } else if let Ok(mut free) = FREE_CGROUPS.lock() {
                free.push((name, entry));
            }
        }
        killed.retain(|name| !tree.end(name));
    } else {
        running.remove(&pid);
    }
    kill_strays(&running);
}

/// Bytes the processes of a running task hold in memory together (their
/// proportional set sizes: pages they share, as forked workers do, counted
/// once): those in its cgroup and the cgroups it made under it, wherever
/// they moved; without one, those of its group and its descendants.
pub fn resident_bytes(task: i32) -> u64 {
    let in_cgroup: Option<Vec<i32>> = {
        let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        let tree = TASK_CGROUPS.get().and_then(Option::as_ref);
        match (tree, running.get(&task)) {
            (Some(tree), Some(Some((name, _)))) => Some(cgroup_members(&tree.path().join(name))),
            _ => None,
        }
    };
    let members = in_cgroup.unwrap_or_else(|| group_and_descendants(task));
    members.into_iter().map(proportional_bytes).sum()
}

/// The processes of a cgroup and of the cgroups under it (a task may make
/// its own: its tree is its account's).
fn cgroup_members(dir: &Path) -> Vec<i32> {
    let mut members = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    // Bounded: a task's tree of cgroups is not the launcher's to walk forever.
    while let Some(dir) = dirs.pop().filter(|_| members.len() < 100_000) {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            members.extend(
                procs
                    .lines()
                    .filter_map(|pid| pid.trim().parse::<i32>().ok()),
            );
        }
        let children = std::fs::read_dir(&dir).into_iter().flatten().flatten();
        dirs.extend(
            children
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .take(1000),
        );
    }
    members
}

/// A process's proportional set size (`Pss` of `smaps_rollup`), or its
/// resident set where that cannot be read.
fn proportional_bytes(pid: i32) -> u64 {
    let pss = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|rollup| {
            rollup
                .lines()
                .find_map(|line| line.strip_prefix("Pss:"))
                .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        });
    pss.map(|kb| kb.saturating_mul(1024)).unwrap_or_else(|| {
        procfs::process::Process::new(pid)
            .and_then(|p| p.statm())
            .map_or(0, |statm| {
                statm.resident.saturating_mul(procfs::page_size())
            })
    })
}

/// The processes of `task`'s group, and those descended from it.
fn group_and_descendants(task: i32) -> Vec<i32> {
    let processes: BTreeMap<i32, (i32, i32)> = procfs::process::all_processes()
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| p.stat().ok().map(|stat| (p.pid, (stat.ppid, stat.pgrp))))
        .collect();
    let descends = |mut pid: i32| {
        for _ in 0..64 {
            match processes.get(&pid) {
                _ if pid == task => return true,
                Some(&(ppid, _)) if ppid > 1 => pid = ppid,
                _ => return false,
            }
        }
        false
    };
    processes
        .iter()
        .filter(|(pid, (_, group))| *group == task || descends(**pid))
        .map(|(pid, _)| *pid)
        .collect()
}

/// Kills and reaps this process's children that are neither a running
/// task's shell nor in its group; their own orphans come next, so a few
/// rounds. Reaping never waits: one not dead yet is reaped at a later end.
fn kill_strays(running: &BTreeMap<i32, Option<TaskCgroup>>) {
    let owned: Vec<String> = running
        .values()
        .flatten()
        .map(|(name, _)| format!("/tasks-{}/{name}", std::process::id()))
        .collect();
    for _ in 0..5 {
        let strays: Vec<(i32, i32)> = children(|pid| running.contains_key(&pid))
            .into_iter()
            .filter(|(pid, group)| {
                !running.contains_key(pid)
                    && !running.contains_key(group)
                    && !in_task_cgroup(*pid, &owned)
            })
            .collect();
        if strays.is_empty() {
            return;
        }
        for (pid, group) in strays {
            if pid == group {
                let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
            }
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            reap_or_remember(pid);
        }
    }
}

/// `(pid, process group)` of this process's children but those `known`
/// (running tasks: their `stat` is not read): from the first thread's
/// `/proc/self/task/<tid>/children` (a few lines, cheap at every task end),
/// which adopted orphans are children of, or from every thread's while a
/// killed child may be unreaped (see [`UNREAPED`]); where the kernel lacks
/// those files, every process's `stat`.
fn children(known: impl Fn(i32) -> bool) -> Vec<(i32, i32)> {
    let me = std::process::id() as i32;
    let pids = |text: &str| -> Vec<i32> {
        text.split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    };
    let listed: Option<Vec<i32>> = if UNREAPED.swap(false, Ordering::Relaxed) {
        std::fs::read_dir("/proc/self/task")
            .ok()
            .and_then(|threads| {
                let mut listed = Vec::new();
                for thread in threads.flatten() {
                    let text = std::fs::read_to_string(thread.path().join("children")).ok()?;
                    listed.extend(pids(&text));
                }
                Some(listed)
            })
    } else {
        first_thread_children().map(|text| pids(&text))
    };
    let candidates: Vec<i32> = match listed {
        Some(pids) => pids,
        None => std::fs::read_dir("/proc")
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default(),
    };
    candidates
        .into_iter()
        .filter(|&pid| !known(pid))
        .filter_map(|pid| {
            let (ppid, group) = parent_and_group(pid)?;
            (ppid == me).then_some((pid, group))
        })
        .collect()
}

/// The first thread's `children`, kept open from one task's end to the
/// next and read again from its start: the kernel lists them anew each
/// time.
fn first_thread_children() -> Option<String> {
    use std::os::unix::fs::FileExt;
    static FILE: OnceLock<Option<std::fs::File>> = OnceLock::new();
    let file = FILE
        .get_or_init(|| {
            std::fs::File::open(format!("/proc/self/task/{}/children", std::process::id())).ok()
        })
        .as_ref()?;
    let mut text = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match file.read_at(&mut chunk, text.len() as u64) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&chunk[..n]),
            Err(_) => return None,
        }
    }
    String::from_utf8(text).ok()
}

/// Whether a process is in one of these task cgroups (a running task's,
/// as the end of its path: `/tasks-<launcher>/<n>`).
fn in_task_cgroup(pid: i32, cgroups: &[String]) -> bool {
    if cgroups.is_empty() {
        return false;
    }
    let Ok(membership) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return false;
    };
    membership
        .lines()
        .filter_map(|l| l.strip_prefix("0::"))
        .any(|path| {
            cgroups
                .iter()
                .any(|c| path.trim_end().ends_with(c.as_str()))
        })
}

/// A process's parent and process group, from its `stat`.
fn parent_and_group(pid: i32) -> Option<(i32, i32)> {
    let stat = procfs::process::Process::new(pid).ok()?.stat().ok()?;
    Some((stat.ppid, stat.pgrp))
}
