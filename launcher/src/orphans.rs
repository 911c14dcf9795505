//! Processes a task starts that leave its process group (`setsid`, a
//! daemon's double fork) escape the group kill at the task's end. The
//! launcher is made their subreaper: orphaned, they become its children
//! rather than init's, and whatever child of the launcher no running task
//! owns is killed (and reaped) when a task ends. With multi-slot launchers
//! this includes a process another running task moved out of its group and
//! orphaned: tasks must keep their processes in their own group.

use std::{collections::BTreeSet, io, sync::Mutex};

use nix::{
    sys::{
        signal::{Signal, kill, killpg},
        wait::{WaitPidFlag, waitpid},
    },
    unistd::Pid,
};
use tokio::process::{Child, Command};

/// Process ids of the running tasks' shells, each its own group's leader.
static RUNNING: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// Makes this process the subreaper of everything it starts; `false` where
/// the kernel refuses (strays then go to init, as before).
pub fn adopt() -> bool {
    nix::sys::prctl::set_child_subreaper(true).is_ok()
}

/// Starts a task's shell, known as running before any sweep can see it.
pub fn spawn(command: &mut Command) -> io::Result<Child> {
    let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    let child = command.spawn()?;
    if let Some(pid) = child.id() {
        running.insert(pid as i32);
    }
    Ok(child)
}

/// A task's shell has ended: kills the strays and forgets the shell.
pub fn ended(pid: Option<u32>) {
    let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(pid) = pid {
        running.remove(&(pid as i32));
    }
    kill_strays(&running);
}

/// Kills and reaps this process's children that are neither a running
/// task's shell nor in its group; their own orphans come next, so a few
/// rounds.
fn kill_strays(running: &BTreeSet<i32>) {
    let me = std::process::id() as i32;
    for _ in 0..5 {
        let strays: Vec<(i32, i32)> = children(me)
            .into_iter()
            .filter(|(pid, group)| !running.contains(pid) && !running.contains(group))
            .collect();
        if strays.is_empty() {
            return;
        }
        for (pid, group) in strays {
            if pid == group {
                let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
            }
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::__WALL));
        }
    }
}

/// `(pid, process group)` of the children of `parent`, from `/proc`.
fn children(parent: i32) -> Vec<(i32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // After the command name, which may hold anything: state, ppid, pgrp.
            let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
            let ppid: i32 = fields.next()?.parse().ok()?;
            let group: i32 = fields.next()?.parse().ok()?;
            (ppid == parent).then_some((pid, group))
        })
        .collect()
}
