//! Containment by cgroup v2, for the kcm (a cgroup per local launcher) and
//! the launcher (a cgroup per task): a process and everything it starts stay
//! in the cgroup it joined before it ran anything — whatever group,
//! session or parent they move to — and are killed together when it ends.
//!
//! No controller is enabled: a cgroup here only groups processes, so the
//! process that makes the tree may live in its root (cgroup v2 forbids
//! processes beside child cgroups only where controllers are enabled).

use std::{
    io::Write,
    os::fd::{AsRawFd, RawFd},
    path::{Path, PathBuf},
};

use tracing::debug;

mod account;
pub mod shared;
mod spawn;
pub use account::{Account, set_thread_groups};
pub use spawn::{Spawn, Spawned, prompt_wakeups, spawn};

/// A directory of cgroups, one per contained process, named by the caller.
#[derive(Debug)]
pub struct Tree {
    base: PathBuf,
}

impl Tree {
    /// `relative` under this process's own cgroup, made if needed. Fails
    /// where cgroup v2 is not mounted, or not writable by this process.
    pub fn under_own(relative: &Path) -> Result<Self, String> {
        let own = own_cgroup().ok_or("cgroup v2 is not mounted")?;
        let base = own.join(relative);
        std::fs::create_dir_all(&base)
            .map_err(|e| format!("cannot make {}: {e}", base.display()))?;
        Ok(Self { base })
    }

    pub fn path(&self) -> &Path {
        &self.base
    }

    /// A cgroup for a process about to start: its directory, to start the
    /// process in ([`spawn`]), and its `cgroup.procs`, open for a process
    /// to write itself into before it runs anything ([`join`]).
    pub fn make(&self, name: &str) -> std::io::Result<Entry> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.base.join(name);
        std::fs::create_dir_all(&path)?;
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_DIRECTORY)
            .open(&path)?;
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(path.join("cgroup.procs"))?;
        let events = std::fs::File::open(path.join("cgroup.events"))?;
        Ok(Entry { dir, procs, events })
    }

    /// Hands the cgroup `name` to `account`, so that a process of theirs
    /// may make cgroups under it (its tasks'): the directory and the files
    /// a delegate writes become theirs, as systemd's `Delegate=yes` does.
    pub fn delegate(&self, name: &str, account: &Account) -> std::io::Result<()> {
        let dir = self.base.join(name);
        let (uid, gid) = (Some(account.uid.as_raw()), Some(account.gid.as_raw()));
        std::os::unix::fs::chown(&dir, uid, gid)?;
        for file in ["cgroup.procs", "cgroup.subtree_control", "cgroup.threads"] {
            std::os::unix::fs::chown(dir.join(file), uid, gid)?;
        }
        Ok(())
    }

    /// Kills everything in a cgroup (its descendants' too) and removes it;
    /// one whose processes are not all gone yet stays for a later call.
    /// Whether it is gone.
    pub fn end(&self, name: &str) -> bool {
        let dir = self.base.join(name);
        if !dir.exists() {
            return true;
        }
        kill_all(&dir);
        remove(&dir)
    }

    /// Kills everything in the tree and removes it, as [`Tree::end`] does
    /// for one cgroup.
    pub fn end_all(&self) -> bool {
        kill_all(&self.base);
        remove(&self.base)
    }

    /// The cgroups still there.
    pub fn remaining(&self) -> Vec<String> {
        subdirectories(&self.base)
            .iter()
            .filter_map(|dir| Some(dir.file_name()?.to_string_lossy().into_owned()))
            .collect()
    }

    /// Removes the tree's directory once empty, and `levels` of its parents
    /// that are empty too.
    pub fn remove_empty(&self, levels: usize) {
        let mut dir = Some(self.base.as_path());
        for _ in 0..=levels {
            match dir {
                Some(d) if std::fs::remove_dir(d).is_ok() => dir = d.parent(),
                _ => return,
            }
        }
    }
}

/// A cgroup made for a process, to be joined by it.
#[derive(Debug)]
pub struct Entry {
    dir: std::fs::File,
    procs: std::fs::File,
    events: std::fs::File,
}

impl Entry {
    /// The descriptor the child writes its pid to (see [`join`]).
    pub fn fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// The cgroup's directory, for `clone3`'s `CLONE_INTO_CGROUP`.
    fn dir_fd(&self) -> RawFd {
        self.dir.as_raw_fd()
    }

    /// Whether a process is still in the cgroup or below it (`true` when
    /// that cannot be read: the caller must then kill to be sure).
    pub fn populated(&self) -> bool {
        use std::os::unix::fs::FileExt;
        let mut events = [0u8; 256];
        let Ok(read) = self.events.read_at(&mut events, 0) else {
            return true;
        };
        !String::from_utf8_lossy(&events[..read])
            .lines()
            .any(|line| line == "populated 0")
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is open
/// as `fd`. Called between fork and exec: only async-signal-safe calls, no
/// allocation.
pub fn join(fd: RawFd) -> std::io::Result<()> {
    let mut digits = [0u8; 20];
    let mut pid = std::process::id();
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (pid % 10) as u8;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    // SAFETY: `fd` is open for as long as the parent holds its `Entry`,
    // which outlives the spawn.
    let procs = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    nix::unistd::write(procs, &digits[start..])?;
    Ok(())
}

/// SIGKILL to every process of a cgroup and its descendants: `cgroup.kill`
/// where the kernel has it (5.14), else each pid of every `cgroup.procs`,
/// a few rounds.
fn kill_all(dir: &Path) {
    let killed = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.kill"))
        .and_then(|mut kill| kill.write_all(b"1"));
    if killed.is_ok() {
        return;
    }
    for _ in 0..5 {
        let pids = pids_within(dir);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn pids_within(dir: &Path) -> Vec<i32> {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    let mut pids: Vec<i32> = procs
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    for child in subdirectories(dir) {
        pids.extend(pids_within(&child));
    }
    pids
}

/// Removes a cgroup, its descendants first (a cgroup with children cannot
/// go). Whether it is gone.
fn remove(dir: &Path) -> bool {
    for child in subdirectories(dir) {
        remove(&child);
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => true,
        Err(e) => {
            debug!(cgroup = %dir.display(), error = %e, "cgroup not empty yet");
            false
        }
    }
}

fn subdirectories(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// This process's cgroup v2 directory, if cgroup v2 is mounted.
fn own_cgroup() -> Option<PathBuf> {
    let mount = cgroup2_mount()?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(path.trim_start_matches('/')))
}

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// on a hybrid system).
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_cgroup2_mount(&mounts)
}

fn parse_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (fields, rest) = line.split_once(" - ")?;
        let fstype = rest.split_whitespace().next()?;
        let mount_point = fields.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(mount_point))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_on_hybrid_and_unified_systems() {
        let hybrid = "25 24 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      26 25 0:23 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
                      27 25 0:24 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
        assert_eq!(
            parse_cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            parse_cgroup2_mount(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            parse_cgroup2_mount("1 2 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }
}
