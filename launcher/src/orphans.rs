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
/// rounds. Reaping never waits: one not dead yet is reaped at a later end.
fn kill_strays(running: &BTreeSet<i32>) {
    for _ in 0..5 {
        let strays: Vec<(i32, i32)> = children()
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
            let _ = waitpid(
                Pid::from_raw(pid),
                Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
            );
        }
    }
}

/// `(pid, process group)` of this process's children: each thread's
/// `/proc/self/task/<tid>/children` (a few lines, cheap at every task end);
/// where the kernel lacks those files, every process's `stat`.
fn children() -> Vec<(i32, i32)> {
    let listed: Option<Vec<i32>> = std::fs::read_dir("/proc/self/task").ok().and_then(|tasks| {
        let mut pids = Vec::new();
        for task in tasks.flatten() {
            let text = std::fs::read_to_string(task.path().join("children")).ok()?;
            pids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
        Some(pids)
    });
    let me = std::process::id() as i32;
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
        .filter_map(|pid| {
            let (ppid, group) = parent_and_group(pid)?;
            (ppid == me).then_some((pid, group))
        })
        .collect()
}

/// A process's parent and process group, from its `stat`.
fn parent_and_group(pid: i32) -> Option<(i32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, which may hold anything: state, ppid, pgrp.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}
